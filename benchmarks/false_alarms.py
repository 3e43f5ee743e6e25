"""How often a default run warns of its own bias, and whether a deliberately
biased one does (issue 60, item 2: the run's own error estimate).

    python benchmarks/false_alarms.py                 # 50 seeds x 2 samplers, ~25 min
    python benchmarks/false_alarms.py --problem cv1e6 --samplers SGBD --seeds 20

For each sampler, ``--seeds`` default runs (``SGBD(model)``, ...: no step given,
``--num-warmup`` warmup and ``--num-samples`` draws, one chain) on
``adaptation_accuracy.problem(--problem)``; each run's warnings are read with
:func:`~numpyro_sgbd.check` (as ``compare`` and ``from_numpyro`` read them).
Printed: the fraction of default runs that warn "bias" (the target: at most 2 %),
then ``--biased-seeds`` runs with the step given as 3 x the sampling step the
first default run chose (in the whitened coordinates u), and the fraction of
those that warn "bias" with their estimated xi. No reference is needed: the
warning is the run's own statement.
"""

import argparse
from pathlib import Path
import sys
import warnings

from jax import random
import numpy as np
from numpyro.infer import MCMC

sys.path.insert(0, str(Path(__file__).resolve().parent))

import adaptation_accuracy as accuracy  # noqa: E402

from numpyro_sgbd import SGBD, SGHMC, SGLD, SGNHT, check  # noqa: E402

SAMPLERS = {"SGBD": SGBD, "SGLD": SGLD, "SGHMC": SGHMC, "SGNHT": SGNHT}


def one_run(kernel, spec, seed, args):
    """``(run_warnings, error_estimate)`` of one run of ``kernel``."""
    mcmc = MCMC(
        kernel,
        num_warmup=args.num_warmup,
        num_samples=args.num_samples,
        progress_bar=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(random.key(seed), *spec["args"])
        check(mcmc)
    return kernel.run_warnings, kernel.error_estimate


def _span(values):
    """``"lo-hi"`` of the finite ``values``, or ``"none"`` (no estimate: a
    chain that stopped on a non-finite value has none)."""
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    return f"{values.min():.3f}-{values.max():.3f}" if values.size else "none"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--problem", default="default")
    parser.add_argument("--samplers", nargs="+", default=["SGBD", "SGLD"])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--biased-seeds", type=int, default=5)
    parser.add_argument("--num-warmup", type=int, default=3000)
    parser.add_argument("--num-samples", type=int, default=30_000)
    args = parser.parse_args(argv)
    spec = accuracy.problem(args.problem, False)
    for name in args.samplers:
        sampler = SAMPLERS[name]
        warned, steps, estimates = 0, [], []
        for seed in range(args.seeds):
            kinds, found = one_run(sampler(spec["model"]), spec, seed, args)
            warned += "bias" in kinds
            if found is not None:
                steps.append(found["step"])
                estimates.append(found["xi"])
        print(
            f"{args.problem} {name}: default runs warning 'bias' {warned} of "
            f"{args.seeds} ({100 * warned / args.seeds:.0f} %); sampling step "
            f"{np.min(steps):.3f}-{np.max(steps):.3f}, estimated xi "
            f"{_span(estimates)}",
            flush=True,
        )
        biased_step = 3.0 * steps[0]
        warned, estimates, kinds_seen = 0, [], set()
        for seed in range(args.biased_seeds):
            # In u, as the default's step: with the default's preconditioner.
            kernel = sampler(
                spec["model"], step_size=biased_step, preconditioner="auto"
            )
            kinds, found = one_run(kernel, spec, 1000 + seed, args)
            warned += "bias" in kinds
            kinds_seen.update(kinds)
            estimates.append(np.nan if found is None else found["xi"])
        print(
            f"{args.problem} {name}: step {biased_step:.3f} (3 x the default's): "
            f"runs warning 'bias' {warned} of {args.biased_seeds}; estimated xi "
            f"{_span(estimates)}; warnings seen {sorted(kinds_seen)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
