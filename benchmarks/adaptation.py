"""Cost of ``step_size=None``'s adaptation: its time within a default run, and the
memory of each preconditioner form.

    python benchmarks/adaptation.py            # about 4 minutes on 2 cores
    python benchmarks/adaptation.py --quick    # a smoke run, under a minute

Prints Markdown tables (and writes nothing):

(1) Time. ``MCMC(SGBD(model), num_warmup=W, num_samples=S, progress_bar=False)``
    with no step size, the default path (variant ``"corrected"``, control-variate
    gradients centred at the mode, ``preconditioner="auto"``: dense at d = 10), on a
    simulated logistic regression as in ``examples/control_variates.py``: N = 10^6
    rows, d = 10 N(0, 1) covariates, N(0, 10^2) prior, minibatches of n = 1000;
    with NumPyro's default ``jit_model_args=False`` and with ``True`` (which
    ``docs/usage.rst`` advises for large data). Each setting runs in a fresh process,
    after the imports and the data: the wall time of the first ``mcmc.run``
    (compilation included: what a user waits for), the adaptation's share of it
    (``kernel.adaptation_info["seconds"]``: the full-data mode search and L), their
    ratio (the target is at most 0.2), the seconds JAX reports compiling inside the
    run and inside the adaptation, and the wall time of a second ``mcmc.run`` on the
    same data (the adaptation is cached; NumPyro compiles its loop again). The
    headline length, 1,000 warmup + 20,000 draws, is the run of ``docs/usage.rst``'s
    first example (``--repeats`` fresh processes each); a five-times longer run
    shows how the share falls with the run's length, and the two second runs give
    a sampling step's marginal cost. For context: the adaptation's full-data
    gradients and Hessian-vector products at their compiled cost (each timed after
    the runs, median of five).
(2) Memory. The ``nbytes`` of the Preconditioner that ``preconditioning.dense``,
    ``lowrank`` (rank 20) and ``diagonal`` build at d = 10^3 and 10^5, the seconds
    each takes and the peak resident memory of building it, each in a fresh process
    (VmHWM, reset after the set-up), from a synthetic Hessian ``H = D^1/2 (I + U
    diag(lambda - 1) U') D^1/2`` (U: 10 orthonormal columns, lambda from 0.01 to
    100, D log-normal) whose Hessian-vector product costs O(d) and is compiled
    before the measurement. Each form is built as the kernel builds it from the
    mode search's output: dense from the d x d Hessian of d products
    (``numpyro_sgbd.mode.hessian``), low-rank from the Hessian's diagonal and 20
    products,
    diagonal from the diagonal alone. The dense form at d = 10^5 (80 GB with its
    inverse) is not built: ``preconditioning.check_dense`` refuses it, and its
    message is printed.

``--quick``: N = 10^5, 200 + 2,000 steps, one process, d = 10^3 and 2 x 10^4.
"""

import argparse
import datetime
import json
import logging
import os
import platform
import statistics
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
from run import _rss_mb, compile_seconds  # noqa: E402

from numpyro_sgbd import (  # noqa: E402
    SGBD,
    preconditioning,
    unroll_threefry_on_cpu,
)
from numpyro_sgbd.mode import full_data_objective, hessian  # noqa: E402

SUBSAMPLE = 1000
SPIKES = 10  # directions of the synthetic Hessian the diagonal misses


def logistic_model(X, y):
    """Logistic regression, N(0, 10^2) prior on each coefficient (as in
    ``examples/control_variates.py``), minibatches of ``SUBSAMPLE`` rows."""
    theta = numpyro.sample(
        "theta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1)
    )
    with numpyro.plate("data", X.shape[0], subsample_size=SUBSAMPLE) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ theta), obs=y[idx])


def simulate(num_rows, dim, seed=0):
    """N(0, 1) covariates, coefficients from N(0, 1), labels from the model."""
    k_theta, k_x, k_y = random.split(random.key(seed), 3)
    theta = random.normal(k_theta, (dim,))
    X = random.normal(k_x, (num_rows, dim))
    y = random.bernoulli(k_y, jax.nn.sigmoid(X @ theta)).astype(jnp.float32)
    return X, y


def _child(flag, spec):
    command = [sys.executable, os.path.abspath(__file__), flag, json.dumps(spec)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{flag} {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_seconds(f, repeats=5):
    jax.block_until_ready(f())  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class _Records(logging.Handler):
    """Keeps the package's log records (their ``created`` is ``time.time()``, the
    clock of JAX's compile events)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def _overlap(spans, lo, hi):
    """Seconds of the union of ``spans`` inside ``[lo, hi]``."""
    covered, last = 0.0, lo
    for start, end in sorted(spans):
        start, end = max(start, last), min(end, hi)
        if end > start:
            covered += end - start
            last = end
    return covered


def time_child(spec):
    """One setting of part (1) in this fresh process; prints JSON."""
    X, y = simulate(spec["num_data"], spec["dim"])
    jax.block_until_ready((X, y))
    records = _Records()
    logger = logging.getLogger("numpyro_sgbd")
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    spans = []

    def listener(event, start, end, **kwargs):
        if event.startswith("/jax/core/compile/"):
            spans.append((start, end))

    jax.monitoring.register_event_time_span_listener(listener)
    kernel = SGBD(logistic_model)
    mcmc = MCMC(
        kernel,
        num_warmup=spec["num_warmup"],
        num_samples=spec["num_samples"],
        progress_bar=False,
        jit_model_args=spec["jit_model_args"],
    )
    out = {}
    for run in (1, 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with compile_seconds() as compiling:
                start = time.perf_counter()
                mcmc.run(random.key(run), X, y)
                jax.block_until_ready(mcmc.get_samples())
                seconds = time.perf_counter() - start
        out[f"run{run}_seconds"] = seconds
        out[f"run{run}_compile_seconds"] = compiling[0]
        out[f"run{run}_warnings"] = sorted({str(w.message)[:100] for w in caught})
        if run == 1:
            info = kernel.adaptation_info
    out["cached"] = kernel.adaptation_info is info
    # The adaptation ends with its one-line report: its window is the `seconds`
    # before that record.
    (end,) = [r.created for r in records.records if "preconditioner=" in r.getMessage()]
    out["adaptation_compile_seconds"] = _overlap(spans, end - info["seconds"], end)
    out["info"] = {k: v for k, v in info.items() if k != "mode_search"}
    search = info["mode_search"]
    out["search"] = {
        k: search[k]
        for k in ("iterations", "num_evaluations", "num_hvp", "converged", "seconds")
    }
    out["variant"], out["gradient"] = kernel.variant, kernel.config.gradient
    out["step_size"] = float(np.max(mcmc.last_state.step_size))
    stats = mcmc.get_samples(group_by_chain=False)
    out["num_draws"] = int(stats["theta"].shape[0])
    # The compiled cost of what the search does (after the runs: no interference).
    objective = full_data_objective(logistic_model, (X, y))
    x, row = objective.x0, jnp.ones((1, spec["dim"]), objective.x0.dtype)
    out["gradient_seconds"] = _median_seconds(lambda: objective.value_and_grad(x))
    out["hvp_seconds"] = _median_seconds(lambda: objective.hvp(x, row))
    print(json.dumps(out))


def synthetic_hessian(d, seed=0):
    """``(hvp, hessian_diag)`` of ``H = D^1/2 (I + U diag(lam - 1) U') D^1/2``:
    ``hvp(x, V)`` gives the rows ``H v`` (as ``Objective.hvp``), O(d) each."""
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.normal(0.0, 2.0, size=d))  # D: curvatures over e^(+-4)
    u, _ = np.linalg.qr(rng.normal(size=(d, SPIKES)))
    c = np.geomspace(0.01, 100.0, SPIKES) - 1.0
    hessian_diag = scale * (1.0 + (u**2) @ c)
    root = jnp.asarray(np.sqrt(scale), jnp.float32)
    u32, c32 = jnp.asarray(u, jnp.float32), jnp.asarray(c, jnp.float32)

    @jax.jit
    def hvp(x, vectors):
        w = vectors * root
        return (w + ((w @ u32) * c32) @ u32.T) * root

    return hvp, hessian_diag


def memory_child(spec):
    """One form of part (2) in this fresh process; prints JSON."""
    d, form = spec["dim"], spec["form"]
    hvp, hessian_diag = synthetic_hessian(d)
    loc = jnp.zeros(d, jnp.float32)
    # Compile the products the form uses before measuring (blocks of 64 rows for
    # the dense Hessian, one row for Lanczos).
    if form == "dense":
        jax.block_until_ready(hvp(loc, jnp.zeros((min(64, d), d), jnp.float32)))
    elif form == "lowrank":
        jax.block_until_ready(hvp(loc, jnp.zeros((1, d), jnp.float32)))
    before = _rss_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM)
        f.write("5")
    start = time.perf_counter()
    if form == "dense":
        pre = preconditioning.dense(loc, hessian(hvp, loc))
        products = d
    elif form == "lowrank":
        pre = preconditioning.lowrank(loc, hessian_diag, lambda v: hvp(loc, v))
        products = preconditioning.LOWRANK_RANK
    else:
        pre = preconditioning.diagonal(loc, hessian_diag)
        products = 0
    jax.block_until_ready(pre)
    seconds = time.perf_counter() - start
    peak = _rss_mb("VmHWM")
    out = {"nbytes": pre.nbytes, "seconds": seconds, "products": products}
    print(json.dumps({**out, "before_mb": before, "peak_mb": peak}))


def _cells(*cells):
    return "| " + " | ".join(c if isinstance(c, str) else f"{c:.3g}" for c in cells)


def _table(title, columns):
    print(f"\n**{title}**\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join(["---"] * len(columns)) + "|")


def _row(*cells):
    print(_cells(*cells) + " |", flush=True)


def timing(args):
    """Part (1)."""
    _table(
        f"(1) adaptation within a default run: SGBD(model) with no step size, "
        f"N = {args.num_data:.0e}, d = {args.dim}, n = {SUBSAMPLE}, bar off; "
        "each row a fresh process",
        [
            "warmup + draws",
            "jit_model_args",
            "run 1 s",
            "compiling s",
            "adaptation s",
            "mode search s",
            "L s",
            "adaptation compiling s",
            "adaptation / run 1",
            "run 2 s",
            "run 2 adapted again",
        ],
    )
    results = {}
    for i, (warmup, samples) in enumerate(args.lengths):
        for jit_model_args in args.jit_model_args:
            spec = {
                "num_data": args.num_data,
                "dim": args.dim,
                "num_warmup": warmup,
                "num_samples": samples,
                "jit_model_args": jit_model_args,
            }
            for _ in range(args.repeats if i == 0 else 1):
                out = _child("--time-child", spec)
                results.setdefault((warmup, samples, jit_model_args), []).append(out)
                info = out["info"]
                _row(
                    f"{warmup:,} + {samples:,}",
                    str(jit_model_args),
                    out["run1_seconds"],
                    out["run1_compile_seconds"],
                    info["seconds"],
                    info["mode_seconds"],
                    info["preconditioner_seconds"],
                    out["adaptation_compile_seconds"],
                    info["seconds"] / out["run1_seconds"],
                    out["run2_seconds"],
                    "no" if out["cached"] else "yes",
                )
    print()
    for (warmup, samples, jit_model_args), outs in results.items():
        ratios = [o["info"]["seconds"] / o["run1_seconds"] for o in outs]
        ratio = statistics.median(ratios)
        print(
            f"- adaptation / run 1 at {warmup:,} + {samples:,}, jit_model_args="
            f"{jit_model_args}: median {ratio:.2f} of {len(outs)}; target <= 0.2 "
            f"{'holds' if ratio <= 0.2 else 'missed'}."
        )
    # The marginal cost of a sampling step, from the second runs (no adaptation)
    # at the shortest and longest length.
    if len(args.lengths) > 1:
        (w0, s0), (w1, s1) = args.lengths[0], args.lengths[-1]
        for jit_model_args in args.jit_model_args:
            short = min(o["run2_seconds"] for o in results[(w0, s0, jit_model_args)])
            long = min(o["run2_seconds"] for o in results[(w1, s1, jit_model_args)])
            steps = w1 + s1 - w0 - s0
            print(
                f"- a step of the default path, jit_model_args={jit_model_args}: "
                f"{1e6 * (long - short) / steps:.0f} us (run 2's wall time at "
                f"{w1 + s1:,} steps less at {w0 + s0:,}, fastest of each, "
                f"over the {steps:,} steps between)."
            )
    out = results[(*args.lengths[0], args.jit_model_args[0])][0]
    search, info = out["search"], out["info"]
    floor = (
        search["num_evaluations"] * out["gradient_seconds"]
        + search["num_hvp"] * out["hvp_seconds"]
    )
    print(
        f"\nThe default path: variant {out['variant']!r}, gradient "
        f"{out['gradient']!r}, preconditioner {info['preconditioner']!r} "
        f"({info['why']}, {info['preconditioner_bytes']} bytes), step size "
        f"{out['step_size']:.3g} after warmup (target {info['step_target']}). "
        f"The mode search (first row): {search['iterations']} Newton-CG steps, "
        f"{search['num_evaluations']} full-data gradients and {search['num_hvp']} "
        f"Hessian-vector products (converged: {search['converged']}); one compiled "
        f"gradient {1e3 * out['gradient_seconds']:.1f} ms, one product "
        f"{1e3 * out['hvp_seconds']:.1f} ms, so {floor:.2f} s of the "
        f"adaptation's {info['seconds']:.2f} s at their compiled cost."
    )
    warned = set()
    for outs in results.values():
        for o in outs:
            warned.update(o["run1_warnings"] + o["run2_warnings"])
    for message in sorted(warned):
        print(f"Warning in a run: {message}")


def memory(args):
    """Part (2)."""
    _table(
        "(2) memory of each preconditioner form (synthetic Hessian, products "
        "compiled beforehand); each row a fresh process",
        [
            "d",
            "form",
            "auto picks",
            "nbytes MB",
            "d x d float32 MB",
            "Hessian-vector products",
            "build s",
            "RSS before MB",
            "peak RSS MB",
            "peak - before MB",
        ],
    )
    refused = []
    for d in args.dims:
        auto = preconditioning.choose_preconditioner(d)[0]
        square = d * d * 4 / 1e6
        for form in preconditioning.FORMS:
            if form == "dense":
                try:
                    preconditioning.check_dense(d)
                except ValueError as error:
                    need = preconditioning.dense_bytes(d) / 1e6
                    _row(f"{d:.0e}", form, auto, f"{need:.3g} (not built)", square)
                    refused.append((d, need, str(error)))
                    continue
            out = _child("--memory-child", {"dim": d, "form": form})
            _row(
                f"{d:.0e}",
                form,
                auto,
                out["nbytes"] / 1e6,
                square,
                str(out["products"]),
                out["seconds"],
                out["before_mb"],
                out["peak_mb"],
                out["peak_mb"] - out["before_mb"],
            )
    for d, need, message in refused:
        print(
            f"\nd = {d:.0e}, dense: L alone would take {d * d * 4 / 1e9:.3g} GB "
            f"(float32), L and its inverse {need / 1e3:.3g} GB, and building them "
            f"holds the float64 Hessian ({d * d * 8 / 1e9:.3g} GB) besides. "
            f"check_dense({d}) refuses it: ValueError: {message}"
        )


def main(argv=None):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, < 1 min")
    parser.add_argument("--parts", nargs="+", default=["time", "memory"])
    parser.add_argument("--num-data", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument(
        "--lengths",
        nargs="+",
        default=["1000:20000", "1000:100000"],
        help="warmup:draws of the timed runs; the first is the headline",
    )
    parser.add_argument(
        "--jit-model-args",
        nargs="+",
        default=["False", "True"],
        choices=["False", "True"],
        help="MCMC(jit_model_args=...) of the timed runs (NumPyro's default False)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="fresh processes per setting of the first length (others: one)",
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--time-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--memory-child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.time_child:
        time_child(json.loads(args.time_child))
        return
    if args.memory_child:
        memory_child(json.loads(args.memory_child))
        return
    if args.quick:
        args.num_data, args.lengths = 100_000, ["200:2000"]
        args.jit_model_args, args.dims = ["False"], [1000, 20_000]
        args.repeats = 1
    args.lengths = [tuple(int(k) for k in s.split(":")) for s in args.lengths]
    args.jit_model_args = [s == "True" for s in args.jit_model_args]
    started = time.perf_counter()
    print(
        f"Command: `python benchmarks/adaptation.py{' --quick' if args.quick else ''}`"
        f"; {datetime.date.today()}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU cores, jax {jax.__version__}, numpyro "
        f"{numpyro.__version__}, backend {jax.default_backend()}; load average "
        f"{os.getloadavg()[0]:.1f} at the start."
    )
    if "time" in args.parts:
        timing(args)
    if "memory" in args.parts:
        memory(args)
    print(
        f"\n{(time.perf_counter() - started) / 60:.1f} minutes; load average "
        f"{os.getloadavg()[0]:.1f} at the end."
    )


if __name__ == "__main__":
    main()
