"""``tune``'s budget as wall time (issues 45 and 59): the wall time of
``tune(model, X, y, budget=T)`` from the call to the result, against the bound
``1.25 T + 5`` s, with the seconds by phase, what compiled, the chosen arm and
the accuracy of its draws.

Logistic regression (``run.make_data``, d = 10, N(0, 1) prior, the data plate
declared with n = ``--declared``, 100 by default), the default search: five
samplers, control variates, n in {n/10, n, 10 n}, five step sizes each (75 arms,
three rounds, five sampler families). For each N and T it prints:

- ``wall``: seconds from the call to the result (or to the refusal), and the
  bound 1.25 T + 5;
- ``setup``, ``compile``, ``sampling``, ``scoring``: ``result.seconds``;
- ``xla_s``, ``programs``: seconds XLA spent compiling and the programs it
  compiled during the call (``jax.monitoring``'s compile events), and ``steps``,
  the step programs among them (JAX's compile log names them ``run``: one per
  sampler family since issue 59, one per sampler, estimator and size before);
- the winner and its discrepancy;
- ``xi``: with ``--sample-seconds`` S > 0, the winner run for S seconds
  (``result.num_samples(S)`` steps after 100 of warmup) against NUTS on all N
  rows (:func:`numpyro_sgbd.reference_posterior`, two chains of
  ``--nuts-samples`` after as many warmup steps, cached in ``--cache-dir``),
  ``xi = ||sd - sd_NUTS|| / ||sd_NUTS||`` (:func:`numpyro_sgbd.compare`) and its
  Monte Carlo error ``xi_mcse`` (as ``examples/mamba_logistic.py``).

``--table1`` then reruns the tuning paper's Table 1 (Section 4.1) with
``examples/mamba_logistic.py``: each row's sampler and estimator tuned with
``--budgets``'s first budget and run for ``--sample-seconds`` (xi in %, its
Monte Carlo error, per row); its own options follow ``--table1-args``.

    python benchmarks/tune_budget.py                       # N = 1e5, 1e6; T = 10
    python benchmarks/tune_budget.py --num-data 100000 --budgets 10 30 \\
        --sample-seconds 0                                  # no NUTS
    python benchmarks/tune_budget.py --num-data 1000000 --table1 \\
        --table1-args "--rows SGNHT:control_variates,SGLD:control_variates"
"""

import argparse
import logging
from pathlib import Path
import sys
import time

import jax
import numpy as np
from numpyro.infer import MCMC
from run import make_data
from tune_vectorize import make_model

from numpyro_sgbd import compare, reference_posterior, tune

_COMPILE = "/jax/core/compile/backend_compile_duration"
_PHASES = ("setup", "compile", "sampling", "scoring")


class _Programs(logging.Handler):
    """The names of the programs JAX lowers for XLA during a block (its
    ``jax_log_compiles`` log) and the seconds XLA spent compiling
    (``jax.monitoring``)."""

    def __init__(self):
        super().__init__()
        self.names, self.seconds = [], 0.0

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling ") and " with global shapes" in message:
            self.names.append(message.split(" ")[1])

    def on_event(self, event, duration, **kwargs):
        if event == _COMPILE:
            self.seconds += duration

    def __enter__(self):
        self._level = logging.getLogger("jax").level
        logger = logging.getLogger("jax")
        logger.addHandler(self)
        # The log is on WARNING with jax_log_compiles; keep it off the console.
        self._propagate, logger.propagate = logger.propagate, False
        jax.monitoring.register_event_duration_secs_listener(self.on_event)
        self._log = jax.log_compiles(True)
        self._log.__enter__()
        return self

    def __exit__(self, *exc):
        self._log.__exit__(*exc)
        jax.monitoring.unregister_event_duration_listener(self.on_event)
        logger = logging.getLogger("jax")
        logger.removeHandler(self)
        logger.propagate = self._propagate


def sample_winner(result, seconds, X, y, rng_key):
    """The winner's draws of ``w`` over about ``seconds`` (its tuning rate)."""
    mcmc = MCMC(
        result.kernel,
        num_warmup=100,
        num_samples=result.num_samples(seconds),
        progress_bar=False,
    )
    t0 = time.perf_counter()
    mcmc.run(rng_key, X, y)
    draws = np.asarray(mcmc.get_samples()["w"], np.float64)
    return draws, time.perf_counter() - t0


def accuracy(draws, ref):
    """``(xi, xi_mcse)`` of the draws against the reference."""
    table = compare({"tuned": {"w": draws}}, ref, reference_name="NUTS")
    rows = table.per_parameter.loc["tuned"]
    se = rows["sd"] / np.sqrt(2.0 * rows["ess_bulk"])
    mcse = float(np.sqrt(np.sum(se**2)) / np.linalg.norm(rows["ref_sd"]))
    return float(table.summary.loc["tuned", "xi"]), mcse


def one_tune(model, X, y, budget, args):
    """One call of tune, measured: ``(line, result or None)``."""
    num_data = X.shape[0]
    with _Programs() as programs:
        started = time.perf_counter()
        try:
            result = tune(model, X, y, budget=budget, rng_key=jax.random.key(0))
        except ValueError as err:  # refused: the fixed costs leave too little
            result, refusal = None, str(err)
        wall = time.perf_counter() - started
    steps = programs.names.count("jit(run)")
    head = (
        f"{num_data:>9}{budget:>6g}{wall:>8.1f}{1.25 * budget + 5:>7.1f}"
        if result is None
        else f"{num_data:>9}{budget:>6g}{wall:>8.1f}{1.25 * budget + 5:>7.1f}"
        + "".join(f"{result.seconds[p]:>9.1f}" for p in _PHASES)
    )
    counts = f"{programs.seconds:>7.1f}{len(programs.names):>9}{steps:>6}"
    if result is None:
        minimum = refusal.split("Pass ")[1].split(",")[0]
        pad = " " * (9 * len(_PHASES))
        return f"{head}{pad}{counts}  refused before sampling: {minimum}", None
    arm, table = result.arm, result.table
    best = table[table["status"] == "winner"]["discrepancy"].iloc[0]
    return (
        f"{head}{counts}  {arm.sampler} n={arm.subsample_size} "
        f"h={arm.step_size:.3g}: {result.metric} {best:.3f}",
        result,
    )


def main(args):
    model = make_model(args.dim, prior_sd=1.0, subsample_size=args.declared)
    header = (
        f"{'N':>9}{'T':>6}{'wall':>8}{'bound':>7}"
        + "".join(f"{p:>9}" for p in _PHASES)
        + f"{'xla_s':>7}{'programs':>9}{'steps':>6}"
        + "  winner (sampler, n, h): its discrepancy"
        + ("  | xi, xi_mcse (%)" if args.sample_seconds > 0 else "")
    )
    lines = [header]
    print(header, flush=True)
    for num_data in args.num_data:
        X, y = make_data(num_data, args.dim)
        jax.block_until_ready((X, y))
        ref = None
        if args.sample_seconds > 0:
            ref = reference_posterior(
                model,
                X,
                y,
                num_warmup=args.nuts_samples,
                num_samples=args.nuts_samples,
                num_chains=2,
                rng_key=jax.random.key(1),
                cache_dir=args.cache_dir,
            )
        for budget in args.budgets:
            line, result = one_tune(model, X, y, budget, args)
            if result is not None and ref is not None:
                draws, _ = sample_winner(
                    result, args.sample_seconds, X, y, jax.random.key(2)
                )
                xi, mcse = accuracy(draws, ref)
                line += f"  | {100 * xi:.2f}, {100 * mcse:.2f}"
            lines.append(line)
            print(line, flush=True)
    if args.table1:
        lines += table1(args)
    return lines


def table1(args):
    """The tuning paper's Table 1 rerun by ``examples/mamba_logistic.py``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import mamba_logistic

    argv = [
        "--num-data",
        str(args.num_data[-1]),
        "--tune-budget",
        str(args.budgets[0]),
        "--sample-seconds",
        str(args.sample_seconds or 10),
        "--out",
        str(args.out),
    ] + args.table1_args.split()
    results = mamba_logistic.main(argv)
    lines = ["Table 1 rerun (xi, xi_mcse in %):"]
    for _, row in results.iterrows():
        lines.append(
            f"  {row['row']:<26}{row['method']:<11} n={row['subsample_size']:<8g}"
            f" xi {100 * row['xi']:6.2f} +- {100 * row['xi_mcse']:.2f}"
            f"  tune budget {row.get('tune_budget', float('nan')):g} s"
        )
    print("\n".join(lines), flush=True)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-data", type=int, nargs="+", default=[10**5, 10**6])
    parser.add_argument("--budgets", type=float, nargs="+", default=[10.0])
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--declared", type=int, default=100, help="declared n")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--nuts-samples", type=int, default=2500)
    parser.add_argument("--cache-dir", type=Path, default=Path("out/tune_budget"))
    parser.add_argument("--table1", action="store_true")
    parser.add_argument("--table1-args", default="")
    parser.add_argument("--out", type=Path, default=Path("out/tune_budget_table1"))
    main(parser.parse_args())
