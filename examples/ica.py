"""
Example: independent component analysis (SGBD paper, Section 4.4)
=================================================================

Mauri & Zanella (2024), Section 4.4 (Figure 5) and supplement D.5 (eqs. 44-45), fit
the ICA model of Amari et al. (1995), as in Welling & Teh (2011): each observation
:math:`x_i \\in \\mathbb R^p` is :math:`W^{-1} s_i` with independent logistic sources,

.. math::

    \\log p(x_i \\mid W) = \\log|\\det W|
        - 2 \\sum_{k=1}^p \\log\\cosh\\big(\\tfrac12 w_k^\\top x_i\\big) - p \\log 4,
    \\qquad w_{kj} \\sim N(0, 1),

where :math:`\\cosh(s/2)^{-2} / 4` is the standard logistic density (its integral
is :math:`[2\\tanh(s/2)]_{-\\infty}^{\\infty} = 4`), so the held-out log-likelihoods
are proper. The paper used ten MEG channels (N = 17,730). Here the data are a real
recording that ships inside a wheel: the Daphnet freezing-of-gait excerpt S06R02E0
(Roggen, Plotnik & Hausdorff, UCI, doi:10.24432/C56K78) bundled with ``aeon``
(``aeon/datasets/data/Daphnet_S06R02E0/S06R02E0.csv``, aeon 1.0 to 1.6; deprecated
in 1.6 and due to be removed in 1.7), 7,040 time points at 64 Hz of three
three-axis accelerometers (ankle, thigh, trunk): p = 9, 81 parameters. The channels
are heavy tailed (excess kurtosis 1.5 to 54), which suits super-Gaussian sources.
The time points are split 80/20 at random (a fixed split: 5,632 train, 1,408 test),
centred and whitened (ZCA, :math:`C^{-1/2}`) with the training mean and covariance,
so ``W = I`` is the whitening alone. The file is read directly; aeon is located,
not imported.

The model is one NumPyro function: ``W`` a sample site and the per-datum
log-likelihood a ``numpyro.factor`` in ``numpyro.plate("data", N,
subsample_size=n)``. The six samplers (vanilla, corrected and extreme SGBD and
SGLD) run it through ``numpyro.infer.MCMC`` with n = 100 for T = 40,000 steps, one
chain each, from ``W = I`` with no burn-in (the paper's ergodic averages start at
the first step), keeping every 10th draw. The held-out mean log-likelihood of each
kept draw is s-L (eq. 44), and that of the running mean of the kept draws is e-L
(eq. 45).

**Step sizes.** The paper's :math:`\\sigma` is our ``step_size`` for both kernels
(SGBD's increments have scale :math:`\\sigma`; SGLD drifts by
:math:`\\sigma^2/2` times the gradient). Its choices for MEG were 0.0063 to 0.011.
As the paper did, each sampler's step is the one of a grid, here 0.0025, 0.005,
0.01 and 0.02 (``--step-grid``), with the highest e-L at T, so the full run is 24
chains. ``--quick`` runs corrected SGBD and vanilla SGLD only, at 0.01, for 3,000
steps. With n = 100 of N = 5,632 the minibatch noise is large: from a step of 0.01
the corrected variants' noise tolerance fails in every coordinate, where corrected
SGBD falls back to the sign rule and corrected SGLD injects no noise, so each moves
as its extreme variant (stochastic gradient descent, for SGLD); at 0.005 it fails
in about 66 % (SGBD) and 15 % (SGLD) of the coordinates. The grid prints the
fraction.

The paper's claim: with the best (very small) steps SGBD and SGLD differ little,
and corrected SGBD's ergodic averages give the highest held-out log-likelihood.
``claim_holds`` reads it as: corrected SGBD's e-L at T is the highest of the six,
and the best SGBD and the best SGLD differ by less than a tenth of the gap between
the posterior mode's held-out log-likelihood and that of ``W = I`` (both printed as
baselines; the mode is found by natural-gradient ascent on the full training set).

Run ``python examples/ica.py`` (6 to 9 minutes on 2 busy, shared CPU cores) or with
``--quick`` (about 20 s). It prints the grid, the table at the chosen steps and
whether the run shows the claim, and writes ``OUT/ica.png``: s-L and e-L against
the iteration at the chosen steps (Figure 5a, b) and e-L at T over the grid.
"""

import argparse
import importlib.util
from pathlib import Path
import time

import jax
from jax import lax, random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, init_to_value

from numpyro_sgbd import SGBD, SGLD

INSTALL_HINT = (
    "examples/ica.py reads the Daphnet recording bundled with aeon (< 1.7) and draws "
    "with matplotlib: pip install -e '.[examples]'"
)
DATA_FILE = ("datasets", "data", "Daphnet_S06R02E0", "S06R02E0.csv")
CHANNELS = [
    "ankle_horiz_fwd",
    "ankle_vert",
    "ankle_horiz_lateral",
    "leg_horiz_fwd",
    "leg_vert",
    "leg_horiz_lateral",
    "trunk_horiz_fwd",
    "trunk_vert",
    "trunk_horiz_lateral",
]
SPLIT_SEED = 0  # the train/test split is the same whatever --seed
#: (label, kernel class, variant): the six samplers of Figure 5.
SAMPLERS = (
    ("SGBD vanilla", SGBD, "vanilla"),
    ("SGBD corrected", SGBD, "corrected"),
    ("SGBD extreme", SGBD, "extreme"),
    ("SGLD vanilla", SGLD, "vanilla"),
    ("SGLD corrected", SGLD, "corrected"),
    ("SGLD extreme", SGLD, "extreme"),
)
STEP_GRID = (0.0025, 0.005, 0.01, 0.02)
QUICK_SAMPLERS = ("SGBD corrected", "SGLD vanilla")
QUICK_STEP = 0.01
LOG4 = float(np.log(4.0))


def data_path():
    """Path of the Daphnet CSV inside the installed aeon, or None without aeon.
    (aeon is located, not imported: the file is all this example needs.)"""
    spec = importlib.util.find_spec("aeon")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*DATA_FILE)
    return path if path.is_file() else None


def load_data(path, test_fraction=0.2):
    """Train and test arrays ``(N, 9)`` of the :data:`CHANNELS` (the 9 readings
    of three three-axis accelerometers): a random 80/20 split of the 7,040 time
    points (seed ``SPLIT_SEED``), centred and whitened (ZCA, ``C^{-1/2}``) with the
    training set's mean and covariance."""
    with open(path) as f:
        header = f.readline().strip().split(",")
    columns = [header.index(name) for name in CHANNELS]
    X = np.loadtxt(path, delimiter=",", skiprows=1, usecols=columns)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(X))
    num_test = int(round(test_fraction * len(X)))
    train, test = X[order[num_test:]], X[order[:num_test]]
    mean = train.mean(0)
    values, vectors = np.linalg.eigh(np.cov(train, rowvar=False))
    whiten = vectors @ np.diag(values**-0.5) @ vectors.T
    return (
        jnp.asarray((train - mean) @ whiten, jnp.float32),
        jnp.asarray((test - mean) @ whiten, jnp.float32),
    )


def log_likelihood(W, X):
    """``log p(x_i | W)`` for each row of ``X``: the density of ``x = W^{-1} s`` with
    independent logistic sources, ``p(s) = cosh(s / 2)^{-2} / 4``."""
    s = 0.5 * X @ W.T
    log_cosh = jnp.logaddexp(s, -s) - jnp.log(2.0)
    return jnp.linalg.slogdet(W)[1] - 2.0 * log_cosh.sum(-1) - W.shape[0] * LOG4


def model(X, subsample_size=None):
    """ICA with logistic sources: ``w_kj ~ N(0, 1)``, and the data's log-likelihood
    as one factor per row in the subsample plate."""
    p = X.shape[1]
    W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([p, p]).to_event(2))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.factor("x", log_likelihood(W, X[idx]))


@jax.jit
def mode(X, W0):
    """The posterior mode of ``W`` on the full training set ``X``, by Amari's
    natural-gradient ascent from ``W0`` (500 steps of 0.5): the gradient ``G`` of
    the mean log posterior times ``W^T W``, ``G W^T W = (I - E[tanh(y / 2) y^T] -
    W W^T / N) W`` with ``y = W x``. Returns the mode and the largest entry of
    ``G W^T W`` there (about 0 at convergence)."""
    N, p = X.shape

    def direction(W):
        Y = X @ W.T
        return (jnp.eye(p) - jnp.tanh(0.5 * Y).T @ Y / N - W @ W.T / N) @ W

    W = lax.fori_loop(0, 500, lambda _, W: W + 0.5 * direction(W), W0)
    return W, jnp.max(jnp.abs(direction(W)))


@jax.jit
def held_out(draws, X_test):
    """Mean held-out log-likelihood of each draw (s-L, eq. 44) and of the running
    average of the draws (e-L, eq. 45), for draws ``(T, p, p)``."""
    running = jnp.cumsum(draws, 0) / jnp.arange(1, draws.shape[0] + 1)[:, None, None]

    def mean_ll(W):
        return log_likelihood(W, X_test).mean()

    return lax.map(mean_ll, draws), lax.map(mean_ll, running)


def run_inference(kernel, rng_key, X, subsample_size, num_samples, thinning):
    """One chain from ``W = I`` (the whitening), no burn-in (the paper's ergodic
    averages start at the first step); returns the kept draws of ``W``, the wall
    time in seconds (compilation included) and the mean fraction of coordinates
    outside the corrected variants' noise tolerance."""
    mcmc = MCMC(
        kernel,
        num_warmup=0,
        num_samples=num_samples,
        thinning=thinning,
        progress_bar=False,
    )
    start = time.perf_counter()
    mcmc.run(rng_key, X, subsample_size)
    draws = mcmc.get_samples()["W"].block_until_ready()
    seconds = time.perf_counter() - start
    # The fraction of coordinates outside the noise tolerance, over the kept
    # steps (NaN for the vanilla and extreme variants, which estimate no noise).
    exceeded = float(np.mean(mcmc.get_extra_fields()["tolerance_exceeded"]))
    return draws, seconds, exceeded


def make_kernel(kernel_cls, variant, step_size, p):
    """An SGBD or SGLD kernel on :func:`model`, started at ``W = I``."""
    init = init_to_value(values={"W": jnp.eye(p)})
    return kernel_cls(model, step_size=step_size, variant=variant, init_strategy=init)


def run_experiment(X_train, X_test, samplers, grid, num_samples, thinning, n, seed):
    """Every sampler at every step size of ``grid``; returns three dicts keyed by
    ``(label, step)``: the held-out curves ``(s-L, e-L)`` at the kept draws, the
    run times and the fractions outside the noise tolerance."""
    p = X_train.shape[1]
    curves, seconds, exceeded = {}, {}, {}
    keys = random.split(random.key(seed), len(samplers))
    for key, (label, kernel_cls, variant) in zip(keys, samplers):
        for step in grid:
            kernel = make_kernel(kernel_cls, variant, step, p)
            draws, seconds[label, step], exceeded[label, step] = run_inference(
                kernel, key, X_train, n, num_samples, thinning
            )
            s_l, e_l = held_out(draws, X_test)
            curves[label, step] = (np.asarray(s_l), np.asarray(e_l))
            print(
                f"  {label:15s} step {step:<7g} e-L(T) {float(e_l[-1]):9.4f}"
                f"  outside tolerance {exceeded[label, step]:5.2f}"
                f"  ({seconds[label, step]:.1f} s)",
                flush=True,
            )
    return curves, seconds, exceeded


def best_steps(curves, labels, grid):
    """Per sampler, the step of the grid with the highest e-L at the last step (the
    paper's choice, supplement D.5)."""
    return {
        label: max(grid, key=lambda step: curves[label, step][1][-1])
        for label in labels
    }


def summarise(curves, steps, tail):
    """``{label: (step, s-L averaged over the last `tail` kept draws, e-L(T))}``."""
    return {
        label: (
            step,
            float(curves[label, step][0][-tail:].mean()),
            float(curves[label, step][1][-1]),
        )
        for label, step in steps.items()
    }


def claim_holds(summary, mode_ll, identity_ll):
    """The paper's claim (Section 4.4), checked on this run at the chosen steps:
    corrected SGBD's e-L at the last step is the highest of all samplers, and the
    best SGBD and the best SGLD differ by less than a tenth of the gap between the
    posterior mode's held-out log-likelihood and that of ``W = I``."""
    e_l = {label: row[2] for label, row in summary.items()}
    top = max(e_l, key=e_l.get) == "SGBD corrected"
    best = {
        m: max(v for k, v in e_l.items() if k.startswith(m)) for m in ("SGBD", "SGLD")
    }
    limited = abs(best["SGBD"] - best["SGLD"]) < 0.1 * (mode_ll - identity_ll)
    return top and limited


def plot(curves, steps, grid, thinning, mode_ll, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"SGBD": "tab:blue", "SGLD": "tab:red"}
    styles = {"vanilla": ":", "corrected": "--", "extreme": "-."}
    shades = {"vanilla": 0.55, "corrected": 0.8, "extreme": 1.0}
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    tails = []
    for label, step in steps.items():
        method, variant = label.split()
        s_l, e_l = curves[label, step]
        t = thinning * np.arange(1, len(s_l) + 1)
        for ax, values in zip(axes[:2], (s_l, e_l)):
            ax.plot(
                t,
                values,
                styles[variant],
                color=colours[method],
                alpha=shades[variant],
                lw=0.8,
                label=f"{label}, step {step:g}",
            )
        tails.append(s_l[len(s_l) // 2 :])
    low = min(np.quantile(tail, 0.01) for tail in tails)
    for ax, title in zip(
        axes[:2], ("per sample (s-L, eq. 44)", "ergodic average (e-L, eq. 45)")
    ):
        ax.axhline(mode_ll, color="k", lw=0.8, label="posterior mode")
        ax.set_ylim(low - 0.3 * (mode_ll - low), mode_ll + 0.3 * (mode_ll - low))
        ax.set_xlabel("iteration")
        ax.set_ylabel("held-out mean log-likelihood")
        ax.set_title(f"held-out log-likelihood, {title}")
    axes[0].legend(fontsize=7)
    for label in steps:
        method, variant = label.split()
        axes[2].plot(
            grid,
            [curves[label, step][1][-1] for step in grid],
            styles[variant],
            marker="o",
            color=colours[method],
            alpha=shades[variant],
            label=label,
        )
    axes[2].axhline(mode_ll, color="k", lw=0.8, label="posterior mode")
    axes[2].set_xscale("log")
    axes[2].set_xlabel("step size sigma")
    axes[2].set_ylabel("e-L at the last step")
    axes[2].set_title("step-size grid")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    path = data_path()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        path = None
    if path is None:
        print(INSTALL_HINT)
        return None
    X_train, X_test = load_data(path)
    p = X_train.shape[1]
    samplers = [s for s in SAMPLERS if not args.quick or s[0] in QUICK_SAMPLERS]
    grid = (QUICK_STEP,) if args.quick else tuple(args.step_grid)
    print(
        f"Daphnet S06R02E0 (aeon): {p} accelerometer channels, whitened; "
        f"N = {X_train.shape[0]} train / {X_test.shape[0]} test points; "
        f"{p * p} parameters; n = {args.subsample_size}, T = {args.num_samples} "
        f"steps from W = I; step grid {grid}; {jax.default_backend()}"
    )
    start = time.perf_counter()
    W_mode, residual = mode(X_train, jnp.eye(p))
    mode_ll = float(log_likelihood(W_mode, X_test).mean())
    identity_ll = float(log_likelihood(jnp.eye(p), X_test).mean())
    print(
        f"baselines, held-out mean log-likelihood: W = I (whitening only) "
        f"{identity_ll:.4f}; posterior mode (natural gradient, residual "
        f"{float(residual):.1e}) {mode_ll:.4f} ({time.perf_counter() - start:.1f} s)"
    )
    curves, seconds, exceeded = run_experiment(
        X_train,
        X_test,
        samplers,
        grid,
        args.num_samples,
        args.thinning,
        args.subsample_size,
        args.seed,
    )
    steps = best_steps(curves, [s[0] for s in samplers], grid)
    tail = max(1, args.num_samples // (4 * args.thinning))
    summary = summarise(curves, steps, tail)
    print(
        f"\nat the chosen steps (highest e-L at T over the grid): s-L averaged over "
        f"the last {tail * args.thinning} steps, e-L at T; mode {mode_ll:.4f}, "
        f"W = I {identity_ll:.4f}"
    )
    print(f"{'sampler':16s} {'step':>7s} {'s-L':>9s} {'e-L':>9s}")
    for label, (step, s_l, e_l) in summary.items():
        print(f"{label:16s} {step:7g} {s_l:9.4f} {e_l:9.4f}")
    holds = claim_holds(summary, mode_ll, identity_ll)
    print(
        "\nclaim (corrected SGBD's e-L the highest; best SGBD and best SGLD within a "
        f"tenth of the mode-to-identity gap): {'shown' if holds else 'NOT shown'}"
        + (" (--quick: two samplers, one step, short chains)" if args.quick else "")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    figure = args.out / "ica.png"
    plot(curves, steps, grid, args.thinning, mode_ll, figure)
    print(f"wrote {figure}")
    return {
        "summary": summary,
        "mode": mode_ll,
        "identity": identity_ll,
        "grid": {key: float(value[1][-1]) for key, value in curves.items()},
        "seconds": seconds,
        "tolerance_exceeded": exceeded,
        "claim": holds,
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[1])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="corrected SGBD and vanilla SGLD only, one step size, 3,000 steps",
    )
    parser.add_argument(
        "--num-samples",
        type=int,
        default=None,
        help="steps T per chain (default 40,000; 3,000 with --quick)",
    )
    parser.add_argument("--thinning", type=int, default=10)
    parser.add_argument(
        "--subsample-size", type=int, default=100, help="minibatch size n"
    )
    parser.add_argument("--step-grid", type=float, nargs="+", default=list(STEP_GRID))
    parser.add_argument("--seed", "--rng-seed", type=int, default=0, dest="seed")
    parser.add_argument("--out", type=Path, default=Path("out"))
    args = parser.parse_args(argv)
    if args.num_samples is None:
        args.num_samples = 3000 if args.quick else 40_000
    return args


if __name__ == "__main__":
    main()
