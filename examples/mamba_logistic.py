"""
Example: MAMBA tuning on a simulated 10^6-row logistic regression (Table 1)
==========================================================================

The shape of the tuning paper's Table 1 (Coullon, South & Nemeth, Section 4.1 and
Appendix C.1) with this package's samplers, on our own simulation: N = 1,000,000
rows of d = 10 standard normal covariates, fixed coefficients (one seeded
N(0, 1) draw), labels y_i ~ Bernoulli(sigmoid(x_i' theta)), and the prior
theta ~ N(0, 10 I) of Appendix C.1. The data sit in
``numpyro.plate("data", N, subsample_size=n)`` with n = 1 % of N.

**Rows**: each of SGLD, SGBD, NOGIN, SGHMC and SGNHT, with plain minibatch
gradients (``gradient="minibatch"``) and with control variates around the mode
(``gradient="control_variates"``). **Columns**, three ways to set a row's
hyperparameters:

- ``MAMBA-KSD``: :func:`numpyro_sgbd.tuning.tune` with ``samplers=[row's
  sampler]``, ``gradients=[row's gradient]``, subsample sizes 0.1 %, 1 % and 10 %
  of N (the paper's grid without 100 %), tune's default step sizes (twice the
  sampler's ``step_size=None`` target in the whitened coordinates u, the target,
  and a geometric grid below it; see :func:`~numpyro_sgbd.tuning.tune`), eta = 3 and
  the kernel Stein discrepancy as the metric, under a budget of ``--tune-budget``
  seconds (default 160: at N = 10^6 an arm at 10 % of N needs about a second
  for its 10 draws in each round, and tune names minimums of 50 to 70 s on two
  cores; where tune refuses a budget as too small the run retries with 1.5
  times the budget it names, recorded in ``tune_budget``); then
  ``result.kernel``, the winner, is run for
  ``--sample-seconds`` (default 10, as the paper).
- ``MAMBA-FSSD``: the same with ``metric="fssd"`` (FSSD with optimised test
  locations).
- ``default``: ``Sampler(model, gradient=g)`` with ``step_size=None``: the
  kernel finds the mode, whitens with the Hessian there and adapts its step size
  during 1,000 warmup steps (SGBD's default is the corrected variant, as in
  tune), at the declared n = 1 % of N; then it samples for ``--sample-seconds``.

**What is timed.** A run warms up (``mcmc.warmup``: 100 steps for a MAMBA
winner, which starts from tune's mode and preconditioner; ``--num-warmup`` for a
default kernel, which finds them itself), then samples in stretches that continue
one chain: the first as long as the warmup's rate allows for ``--sample-seconds``
(an underestimate: the warmup's time includes the setup), each next one at the
rate just measured for the seconds left, until 90 % of ``--sample-seconds`` are
spent. Every ``mcmc.run`` compiles its loop anew; the seconds JAX spent tracing
and compiling (read from ``jax.monitoring``) are subtracted, so
``sample_seconds`` is the sampling alone, and ``num_samples`` the steps taken in
it (all kept, no thinning). The table also gives tune's own phases
(``tune_seconds``, its total; ``tune_setup``, ``tune_compile``,
``tune_sampling``, ``tune_scoring``), the steps tune predicted
(``result.num_samples(--sample-seconds)``, at its tuning rate) and, for a default
kernel, its warmup's wall time (mode search and compilation included) in
``tune_seconds``.

**Accuracy**, from :func:`numpyro_sgbd.compare` against NUTS on all N rows
(:func:`numpyro_sgbd.reference_posterior`, two chains of ``--nuts-samples`` after
``--nuts-warmup``, cached on disk in ``--cache-dir``):

- ``xi`` = ||sd - sd_NUTS||_2 / ||sd_NUTS||_2, the paper's relative error of the
  posterior sds, from all the timed run's draws;
- ``xi_mcse``: the Monte Carlo error of that xi, sqrt(sum_j se_j^2) /
  ||sd_NUTS||, se_j = sd_j / sqrt(2 ESS_j) the standard error of coordinate j's sd
  from its bulk ESS. By the triangle inequality the error in xi is at most
  ||error in sd|| / ||sd_NUTS||, so this bounds xi's standard error (the bulk ESS
  of x_j is at most the ESS of (x_j - mean)^2 for an autoregressive chain, so the
  bound is conservative); an xi within about 2 xi_mcse of 0 is Monte Carlo noise.
  ``xi_ref_mcse`` is the same for NUTS's own draws, NUTS's error in xi: about
  0.5 % for its 2 x 10,000 draws;
- ``ksd``: the IMQ kernel Stein discrepancy of 500 equally spaced draws with
  full-data scores, in coordinates standardised by NUTS's posterior sds (the
  ``ksd`` of :func:`~numpyro_sgbd.compare` with ``ksd_draws=500``; the paper's
  Table 1 uses raw coordinates, whose KSD at N = 10^6 measures mostly the size of
  the scores). ``ksd_ref`` is NUTS's own value, the floor for 500 exact draws;
- ``min_ess_bulk``: the smallest bulk ESS over the ten coefficients.

Usage::

    # The full table: about 1 h 45 min on 2 quiet cores (measured at N = 10^6:
    # about 7.5 minutes a row, two tunes of 160 s budget and 40 s of setup,
    # compiling and scoring each, three timed runs; NUTS's 2 x 11,000 steps about
    # half an hour, from 2 x 2,000 in 323 s, cached in --cache-dir for reruns).
    python examples/mamba_logistic.py --out out/mamba_logistic
    # The paper's 10 s tune budget: every tune returns within 10 s on 2 cores on a
    # grid of a tenth of the paper's subsample sizes (0.01, 0.1 and 1 % of N)
    python examples/mamba_logistic.py --tune-budget 10 \\
        --subsample-fractions 0.0001 0.001 0.01 --out out/table1_10s
    # N = 20,000, SGLD-minibatch and SGBD-control-variates only, budgets of 2 s:
    # 4 to 6 minutes on 2 busy cores (tune's fixed costs dominate)
    python examples/mamba_logistic.py --quick --out /tmp/mamba_logistic

``--rows SGLD:minibatch,SGNHT:control_variates`` runs a subset of the rows;
``--num-data`` changes N (the subsample sizes stay at the same fractions).

It prints the table and writes, to ``--out``: ``mamba_logistic.csv`` (one row per
row and method), ``mamba_logistic_arms.csv`` (every arm of every tune in every
round, ``result.table`` with the row and method added),
``mamba_logistic.png`` (xi and KSD per row and method) and
``mamba_logistic_tune.png`` (``result.plot()`` of the first row's MAMBA-KSD tune).

**References**

1. Coullon, J., South, L. & Nemeth, C. (2023). *Efficient and generalizable tuning
   strategies for stochastic gradient MCMC.* Statistics and Computing. Section 4.1,
   Table 1, Appendix C.1.
2. Gorham, J. & Mackey, L. (2017). *Measuring sample quality with kernels.* ICML.
3. Jitkrittum, W., Xu, W., Szabo, Z., Fukumizu, K. & Gretton, A. (2017). *A
   linear-time kernel goodness-of-fit test.* NeurIPS.
"""

import argparse
import contextlib
from pathlib import Path
import re
import time
import traceback

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pandas as pd

from numpyro_sgbd import (
    NOGIN,
    SGBD,
    SGHMC,
    SGLD,
    SGNHT,
    compare,
    reference_posterior,
)
from numpyro_sgbd.tuning import tune

SAMPLERS = {"SGLD": SGLD, "SGBD": SGBD, "NOGIN": NOGIN, "SGHMC": SGHMC, "SGNHT": SGNHT}
GRADIENTS = ("minibatch", "control_variates")
ROWS = [(name, gradient) for name in SAMPLERS for gradient in GRADIENTS]
QUICK_ROWS = [("SGLD", "minibatch"), ("SGBD", "control_variates")]
METHODS = ("MAMBA-KSD", "MAMBA-FSSD", "default")
METRICS = {"MAMBA-KSD": "ksd", "MAMBA-FSSD": "fssd"}
#: tune's subsample sizes, as fractions of N (the paper's grid, less 100 %).
SUBSAMPLE_FRACTIONS = (0.001, 0.01, 0.1)
#: The --quick run tunes the step size alone, at the declared n.
QUICK_SUBSAMPLE_FRACTIONS = (0.01,)
PRIOR_VARIANCE = 10.0
#: Warmup of a MAMBA winner: it starts at a draw of tune's Laplace approximation.
MAMBA_WARMUP = 100
#: Tries of tune per cell, raising the budget where it is refused as too small.
TUNE_ATTEMPTS = 3
#: Draws per run in the KSD.
KSD_DRAWS = 500
#: Stretches of sampling at most, to reach --sample-seconds (each compiles anew).
MAX_STRETCHES = 4
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def model(X, y, subsample_size=None):
    """Logistic regression, theta ~ N(0, 10 I) (the tuning paper's Appendix C.1)."""
    theta = numpyro.sample(
        "theta",
        dist.Normal(0.0, np.sqrt(PRIOR_VARIANCE)).expand([X.shape[1]]).to_event(1),
    )
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ theta), obs=y[idx])


def simulate(num_data, dim, seed):
    """``(X, y, theta)``: N(0, 1) covariates, coefficients one N(0, 1) draw, labels
    from the model."""
    k_theta, k_x, k_y = random.split(random.key(seed), 3)
    theta = random.normal(k_theta, (dim,))
    X = random.normal(k_x, (num_data, dim))
    y = random.bernoulli(k_y, jax.nn.sigmoid(X @ theta)).astype(jnp.float32)
    return X, y, np.asarray(theta)


@contextlib.contextmanager
def stopwatch():
    """``{"wall": seconds, "compile": seconds JAX spent tracing and compiling}``
    of the block, filled in when it ends."""
    times = {"compile": 0.0}

    def listener(event, duration, **kwargs):
        if event in _COMPILE_EVENTS:
            times["compile"] += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    start = time.perf_counter()
    try:
        yield times
    finally:
        times["wall"] = time.perf_counter() - start
        jax.monitoring.unregister_event_duration_listener(listener)


def sample_for(kernel, seconds, num_warmup, rng_key, model_args):
    """Warm ``kernel`` up, then sample for about ``seconds``, compilation excluded.

    The first stretch takes as many steps as the warmup's rate allows (a low
    guess: the warmup's time includes the kernel's setup); while the sampling has
    taken under 90 % of ``seconds``, another stretch continues the chain at the rate
    just measured. Returns the draws of theta (all stretches, one chain) and the
    timings."""
    k_warmup, k_run = random.split(rng_key)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=1, progress_bar=False)
    with stopwatch() as warmup:
        mcmc.warmup(k_warmup, *model_args)
        jax.block_until_ready(mcmc.post_warmup_state)
    rate = num_warmup / max(warmup["wall"] - warmup["compile"], 1e-3)
    parts, steps, spent, compiled = [], 0, 0.0, 0.0
    for stretch in range(MAX_STRETCHES):
        mcmc.num_samples = max(100, int(rate * (seconds - spent)))
        with stopwatch() as run:
            mcmc.run(random.fold_in(k_run, stretch), *model_args)
            parts.append(np.asarray(mcmc.get_samples()["theta"], np.float64))
        mcmc.post_warmup_state = mcmc.last_state
        pure = max(run["wall"] - run["compile"], 1e-3)
        rate = mcmc.num_samples / pure
        steps += mcmc.num_samples
        spent += pure
        compiled += run["compile"]
        if spent >= 0.9 * seconds:
            break
    step_size = np.asarray(mcmc.last_state.step_size, np.float64)
    return np.concatenate(parts), dict(
        num_samples=steps,
        sample_seconds=spent,
        sample_compile=compiled,
        stretches=len(parts),
        warmup_seconds=warmup["wall"],
        final_step_size=float(np.mean(step_size)),
    )


def _tune(name, gradient, method, args, data, budget, rng_key):
    X, y = data
    return tune(
        model,
        X,
        y,
        args.subsample_size,
        budget=budget,
        samplers=[name],
        gradients=[gradient],
        subsample_sizes=args.tune_subsample_sizes,
        metric=METRICS[method],
        eta=args.eta,
        rng_key=rng_key,
    )


def run_inference(name, gradient, method, args, data, rng_key):
    """One cell of the table: ``(draws, record, tune result or None)``."""
    X, y = data
    n = args.subsample_size
    record = dict(row=f"{name} {gradient}", sampler=name, gradient=gradient)
    record["method"] = method
    k_tune, k_run = random.split(rng_key)
    if method == "default":
        kernel = SAMPLERS[name](model, gradient=gradient)
        draws, timing = sample_for(
            kernel, args.sample_seconds, args.num_warmup, k_run, (X, y, n)
        )
        record.update(
            subsample_size=n,
            step_size=timing["final_step_size"],
            tune_seconds=timing["warmup_seconds"],
            **timing,
        )
        return draws, record, None
    budget = args.tune_budget
    for attempt in range(TUNE_ATTEMPTS):
        try:
            result = _tune(name, gradient, method, args, data, budget, k_tune)
            break
        except ValueError as err:
            # A budget too small for round 0 is refused, naming the budget that
            # would do (measured, so noisy on a busy machine): a long run goes on
            # with more, recorded in tune_budget.
            match = re.search(r"budget >= ([0-9.]+) s", str(err))
            if match is None or attempt == TUNE_ATTEMPTS - 1:
                raise
            budget = 1.5 * float(match.group(1))
            print(f"    {err}\n    Retrying with budget={budget:.3g} s.", flush=True)
    draws, timing = sample_for(
        result.kernel, args.sample_seconds, MAMBA_WARMUP, k_run, (X, y, n)
    )
    record.update(
        subsample_size=result.arm.subsample_size,
        step_size=result.arm.step_size,
        tune_budget=budget,
        tune_seconds=result.seconds["total"],
        tune_setup=result.seconds["setup"],
        tune_compile=result.seconds["compile"],
        tune_sampling=result.seconds["sampling"],
        tune_scoring=result.seconds["scoring"],
        tune_rounds=result.rounds,
        tune_arms=int(result.table.groupby(["subsample_size", "step_size"]).ngroups),
        tune_predicted_samples=result.num_samples(args.sample_seconds),
        **timing,
    )
    return draws, record, result


def accuracy(records, draws, ref, data, n):
    """Add ``xi``, ``xi_mcse``, ``ksd``, ``min_ess_bulk`` (and the reference's
    ``ksd_ref``, ``xi_ref_mcse``) to the records, by one :func:`compare`."""
    X, y = data
    runs = {f"{row} | {method}": {"theta": d} for (row, method), d in draws.items()}
    table = compare(
        runs,
        ref,
        model=model,
        model_args=(X, y, n),
        ksd_draws=KSD_DRAWS,
        reference_name="NUTS",
    )
    per = table.per_parameter

    def floor(run):
        rows = per.loc[run]
        se = rows["sd"] / np.sqrt(2.0 * rows["ess_bulk"])
        return float(np.sqrt(np.sum(se**2)) / np.linalg.norm(rows["ref_sd"]))

    ksd_ref, xi_ref_mcse = float(table.summary.loc["NUTS", "ksd"]), floor("NUTS")
    for record in records:
        key = (record["row"], record["method"])
        record.update(ksd_ref=ksd_ref, xi_ref_mcse=xi_ref_mcse)
        if key not in draws:
            continue
        label = f"{key[0]} | {key[1]}"
        summary = table.summary.loc[label]
        record.update(
            xi=float(summary["xi"]),
            xi_mcse=floor(label),
            ksd=float(summary["ksd"]),
            min_ess_bulk=float(summary["min_ess_bulk"]),
        )
    return table


def plot(path, results):
    """xi (with a mark at twice its Monte Carlo error) and KSD per row, one bar
    per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys(results["row"]))
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 1.3 * len(rows)), 7), sharex=True)
    width = 0.8 / len(METHODS)
    for k, method in enumerate(METHODS):
        part = results[results["method"] == method].set_index("row").reindex(rows)
        x = np.arange(len(rows)) + (k - (len(METHODS) - 1) / 2) * width
        axes[0].bar(x, part["xi"], width, label=method, color=f"C{k}")
        # Where xi is below twice its Monte Carlo error it is mostly noise.
        axes[0].plot(
            x,
            2 * part["xi_mcse"],
            "k_",
            ms=10,
            mew=1.5,
            label="2 x Monte Carlo error" if k == 0 else None,
        )
        axes[1].bar(x, part["ksd"], width, label=method, color=f"C{k}")
    ref = results["ksd_ref"].iloc[0]
    axes[1].axhline(ref, color="k", lw=0.8, ls="--", label="NUTS (500 draws)")
    axes[0].set(yscale="log", ylabel="xi = ||sd - sd_NUTS|| / ||sd_NUTS||")
    axes[1].set(yscale="log", ylabel="KSD (standardised, 500 draws)")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    axes[1].set_xticks(np.arange(len(rows)))
    axes[1].set_xticklabels(rows, rotation=30, ha="right")
    fig.suptitle("Logistic regression: MAMBA against the default adaptation")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_tune(path, result, title):
    """``result.plot()`` of one tune."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    result.plot(ax=ax)
    ax.set_title(f"{title}\n{ax.get_title()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


COLUMNS = [
    "row",
    "method",
    "subsample_size",
    "step_size",
    "xi",
    "xi_mcse",
    "ksd",
    "min_ess_bulk",
    "num_samples",
    "sample_seconds",
    "tune_seconds",
]


def run(args):
    X, y, _ = simulate(args.num_data, args.dim, args.seed)
    data = (X, y)
    n = args.subsample_size
    print(
        f"N = {args.num_data}, d = {args.dim}, n = {n}; tune budget "
        f"{args.tune_budget:g} s, subsample sizes {args.tune_subsample_sizes}, "
        f"eta = {args.eta}; {args.sample_seconds:g} s of sampling per run"
    )
    with stopwatch() as nuts:
        ref = reference_posterior(
            model,
            X,
            y,
            n,
            num_warmup=args.nuts_warmup,
            num_samples=args.nuts_samples,
            num_chains=2,
            rng_key=random.key(args.seed + 1),
            cache_dir=args.cache_dir,
        )
    attrs = ref.posterior.attrs
    print(
        f"NUTS: {nuts['wall']:.0f} s (sampled in {float(attrs['sampling_time']):.0f} "
        f"s when first run), max R-hat {float(attrs['max_rhat']):.4f}, min bulk ESS "
        f"{float(attrs['min_ess_bulk']):.0f}, trustworthy "
        f"{bool(attrs['trustworthy'])}"
    )

    records, draws, arms = [], {}, []
    first_tune = None
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "mamba_logistic.csv"
    for i, (name, gradient) in enumerate(args.rows):
        for j, method in enumerate(METHODS):
            key = random.fold_in(random.key(args.seed + 2), 10 * i + j)
            label = f"{name} {gradient}"
            print(f"{label} | {method} ...", flush=True)
            try:
                chain, record, result = run_inference(
                    name, gradient, method, args, data, key
                )
            except Exception as err:  # keep the other cells of a long run
                traceback.print_exc()
                records.append(
                    dict(
                        row=label,
                        sampler=name,
                        gradient=gradient,
                        method=method,
                        error=f"{type(err).__name__}: {err}",
                    )
                )
                continue
            draws[(label, method)] = chain
            records.append(record)
            print(
                f"    n = {record['subsample_size']}, step {record['step_size']:.3g}, "
                f"{record['num_samples']} steps in {record['sample_seconds']:.1f} s; "
                f"tune {record['tune_seconds']:.1f} s",
                flush=True,
            )
            if result is not None:
                table = result.table.copy()
                table.insert(0, "method", method)
                table.insert(0, "row", label)
                arms.append(table)
                if first_tune is None and method == "MAMBA-KSD":
                    first_tune = (result, f"{label}, {method}")
            # So far, without the accuracy (a long run's progress, overwritten at
            # the end).
            pd.DataFrame(records).to_csv(partial, index=False)

    accuracy(records, draws, ref, data, n)
    results = pd.DataFrame(records)
    for column in COLUMNS + ["xi_ref_mcse", "ksd_ref", "error"]:
        if column not in results:
            results[column] = np.nan
    order = COLUMNS + [c for c in results if c not in COLUMNS]
    results = results[order]
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(results[COLUMNS].to_string(index=False, float_format="%.4g"))
    print(
        f"NUTS ({2 * args.nuts_samples} draws): its own error in xi "
        f"{results['xi_ref_mcse'].iloc[0]:.4f}; its KSD of {KSD_DRAWS} draws "
        f"{results['ksd_ref'].iloc[0]:.4g}"
    )

    path = args.out / "mamba_logistic.csv"
    results.to_csv(path, index=False)
    print(f"wrote {path}")
    if arms:
        path = args.out / "mamba_logistic_arms.csv"
        pd.concat(arms, ignore_index=True).to_csv(path, index=False)
        print(f"wrote {path}")
    path = args.out / "mamba_logistic.png"
    plot(path, results)
    print(f"wrote {path}")
    if first_tune is not None:
        path = args.out / "mamba_logistic_tune.png"
        plot_tune(path, *first_tune)
        print(f"wrote {path}")
    return results


def _rows(text):
    rows = []
    for item in text.split(","):
        name, _, gradient = item.strip().partition(":")
        if name not in SAMPLERS or gradient not in GRADIENTS:
            raise argparse.ArgumentTypeError(
                f"{item!r}: rows are SAMPLER:GRADIENT, SAMPLER one of "
                f"{list(SAMPLERS)}, GRADIENT one of {list(GRADIENTS)}."
            )
        rows.append((name, gradient))
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="N = 20,000, two rows, n = 1%% only, eta = 2, tiny budgets",
    )
    parser.add_argument("--num-data", type=int, default=None, help="N")
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument(
        "--subsample-size", type=int, default=None, help="declared n (1%% of N)"
    )
    parser.add_argument(
        "--rows",
        type=_rows,
        default=None,
        help="e.g. SGLD:minibatch,SGBD:control_variates",
    )
    parser.add_argument("--tune-budget", type=float, default=None, help="seconds")
    parser.add_argument(
        "--subsample-fractions",
        type=float,
        nargs="+",
        default=None,
        help="tune's subsample sizes as fractions of N (default 0.001 0.01 0.1)",
    )
    parser.add_argument("--sample-seconds", type=float, default=None)
    parser.add_argument("--eta", type=int, default=None)
    parser.add_argument(
        "--num-warmup", type=int, default=None, help="warmup of the default kernels"
    )
    parser.add_argument("--nuts-warmup", type=int, default=None)
    parser.add_argument(
        "--nuts-samples", type=int, default=None, help="NUTS draws per chain (2 chains)"
    )
    parser.add_argument("--rng-seed", dest="seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="NUTS cache (default OUT/cache)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = dict(
        num_data=20_000 if quick else 1_000_000,
        rows=QUICK_ROWS if quick else ROWS,
        tune_budget=2.0 if quick else 160.0,
        sample_seconds=2.0 if quick else 10.0,
        eta=2 if quick else 3,
        num_warmup=300 if quick else 1000,
        nuts_warmup=200 if quick else 1000,
        nuts_samples=500 if quick else 10_000,
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.subsample_size is None:
        args.subsample_size = max(2, args.num_data // 100)
    fractions = args.subsample_fractions or (
        QUICK_SUBSAMPLE_FRACTIONS if quick else SUBSAMPLE_FRACTIONS
    )
    args.tune_subsample_sizes = [max(2, int(f * args.num_data)) for f in fractions]
    if args.cache_dir is None:
        args.cache_dir = args.out / "cache"
    return args


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
