"""Discretisation bias against ESS per second: each default sampler's step target
in the whitened coordinates u, on the problems of ``adaptation_accuracy.py``.

    python benchmarks/step_targets.py                   # about 25 minutes on 2 cores
    python benchmarks/step_targets.py --samplers SGBD SGLD --targets 0.5 0.35 \
        --seeds 1 2                                     # more seeds, chosen targets

``step_size=None`` adapts each kernel's step in warmup from a target in u (SGBD
0.5, SGLD 0.4, NOGIN 0.5), lowered only where the gradient noise demands it. A
smaller target shrinks the discretisation bias and the effective draws per step
together. For each problem and sampler this runs the default path
(``SGBD(model)``, ...) with the target replaced by each of ``--targets`` (a
subclass whose spec has another ``step_target``; nothing else changes), 3,000 +
30,000 steps as ``adaptation_accuracy.py``, and prints xi (the relative error of
the sds), the largest mean bias in sds, the smallest bulk ESS, ESS per second,
and the Monte Carlo floor: the xi and bias that exact draws with the run's and
the reference's ESS would show on average. What the run adds above that floor
is its bias. References are NUTS on the full data, cached under ``--cache`` as
in ``adaptation_accuracy.py``.
"""

import argparse
import itertools
from pathlib import Path
import sys
import warnings

from jax import random
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import adaptation_accuracy as accuracy  # noqa: E402

from numpyro_sgbd import (  # noqa: E402
    NOGIN,
    SGBD,
    SGLD,
    unroll_threefry_on_cpu,
)

SAMPLERS = {"SGBD": SGBD, "SGLD": SGLD, "NOGIN": NOGIN}
TARGETS = {"SGBD": (0.5, 0.4, 0.35), "SGLD": (0.4, 0.3), "NOGIN": (0.5, 0.35)}


def with_target(sampler, target, fraction=None):
    """``sampler`` with its step target in u replaced by ``target`` (and, given,
    the fraction of it it samples at, the spec's ``sampling_fraction``)."""
    spec = sampler.spec._replace(step_target=target)
    if fraction is not None:
        spec = spec._replace(sampling_fraction=fraction)
    return type(f"{sampler.__name__}_{target}_{fraction}", (sampler,), {"spec": spec})


def run(spec, sampler, target, key, args, fraction=None):
    kernel = with_target(sampler, target, fraction)(spec["model"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc, seconds = accuracy.timed_run(
            kernel, key, spec, args.num_warmup, args.num_samples
        )
    return mcmc, seconds, kernel.run_warnings, len(caught)


def main(argv=None):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=accuracy.PROBLEMS)
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument("--num-warmup", type=int, default=3000)
    parser.add_argument("--num-samples", type=int, default=30_000)
    parser.add_argument(
        "--targets", nargs="+", type=float, help="targets for every sampler"
    )
    parser.add_argument(
        "--fractions",
        nargs="+",
        type=float,
        default=[None],
        help="sampling fractions of the target (default: each sampler's own)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/refs"))
    args = parser.parse_args(argv)
    # The references' own seed stays 0 (adaptation_accuracy.py's cache).
    args.quick, args.seed = False, 0
    rng = np.random.default_rng(0)
    header = (
        "| problem | sampler | target | xi | max mean bias | min ESS | ESS/s | "
        "MC floor xi / bias | wall s | warnings |"
    )
    header = header.replace("| target |", "| target | seed |")
    print(header + "\n|" + "---|" * 11, flush=True)
    for name in args.problems:
        spec = accuracy.problem(name, False)
        ref = accuracy.reference(name, spec, args)
        for s, sampler_name in enumerate(args.samplers):
            targets = args.targets or TARGETS[sampler_name]
            cells = itertools.product(targets, args.fractions, args.seeds)
            for target, fraction, seed in cells:
                key = random.fold_in(random.key(seed), s)
                mcmc, seconds, kinds, _ = run(
                    spec, SAMPLERS[sampler_name], target, key, args, fraction
                )
                if fraction is None:
                    fraction = SAMPLERS[sampler_name].spec.sampling_fraction
                summary, floor_xi, floor_bias = accuracy.scored(mcmc, ref, rng)
                ess = float(summary["min_ess_bulk"])
                print(
                    f"| {name} | {sampler_name} | {target} x {fraction} | {seed} | "
                    f"{summary['xi']:.3f} | "
                    f"{summary['max_bias_mean']:.3f} | {ess:.0f} | "
                    f"{ess / seconds:.0f} | {floor_xi:.3f} / {floor_bias:.3f} | "
                    f"{seconds:.0f} | {', '.join(kinds) or 'none'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
