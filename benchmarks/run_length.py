"""The default sampling step that serves the run's length, and each run's own error
estimate, against NUTS (issue 60, items 1 and 2).

    python benchmarks/run_length.py                      # about 30 minutes on 2 cores
    python benchmarks/run_length.py --samplers SGBD --num-samples 30000 200000 \\
        --seeds 0 1 2 3 4 5 6 7

On the problems of ``adaptation_accuracy.py`` (``--problems``: also ``chem97``,
random intercepts on mlmRev's Chem97, and ``illcond``, a 10^5-row logistic
regression with covariate scales over three orders; references: NUTS on the
full data, cached under ``--cache`` as there), each sampler's default path
(``SGBD(model)``, ...; 3,000 warmup steps) runs at each ``--num-samples``,
under the new rule (the sampling step is the smaller of warmup's and the step
whose predicted sd bias is half the run's predicted Monte Carlo error,
:mod:`numpyro_sgbd.discretisation`) and, with ``--before``, under the fixed
sampling fraction it replaces (a subclass whose ``bias_law()`` is ``None``:
warmup's step times the spec's ``sampling_fraction``, the draws of the commit before).
Printed per run: the sampling step in u, xi and the largest mean bias in sds
against NUTS, the run's own estimated xi
(``kernel.error_estimate["xi"]``, no reference) and its ratio to the measured xi,
the smallest bulk ESS, ESS per second of the run, the Monte Carlo floor of xi
(``adaptation_accuracy.mc_floor``: exact draws with the run's and the reference's
ESS) and the run's warnings.
"""

import argparse
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
    SGHMC,
    SGLD,
    SGNHT,
    unroll_threefry_on_cpu,
)

SAMPLERS = {"SGBD": SGBD, "SGLD": SGLD, "NOGIN": NOGIN, "SGHMC": SGHMC, "SGNHT": SGNHT}


def fixed_fraction(sampler):
    """``sampler`` sampling at its fixed fraction of warmup's step (the rule
    before issue 60)."""
    spec = sampler.spec._replace(bias_laws={})
    return type(f"{sampler.__name__}Before", (sampler,), {"spec": spec})


def main(argv=None):
    unroll_threefry_on_cpu()  # as step_targets.py: like for like with its figures
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=accuracy.PROBLEMS)
    parser.add_argument("--samplers", nargs="+", default=["SGBD", "SGLD", "NOGIN"])
    parser.add_argument("--num-warmup", type=int, default=3000)
    parser.add_argument("--num-samples", nargs="+", type=int, default=[30_000, 200_000])
    parser.add_argument("--before", action="store_true", help="also the old rule")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/refs"))
    parser.add_argument(
        "--exact",
        action="store_true",
        help="also score against importance-sampled Laplace moments "
        "(adaptation_accuracy.exact_moments; single-site problems)",
    )
    args = parser.parse_args(argv)
    args.quick, args.seed = False, 0  # the references' own seed stays 0
    rng = np.random.default_rng(0)
    print(
        "| problem | sampler | rule | draws | seed | step | xi | max mean bias | "
        "estimated xi (ratio) | exact xi / bias (ratio) | min ESS | ESS/s | "
        "MC floor xi | warnings |\n|" + "---|" * 14,
        flush=True,
    )
    rules = ["run length"] + (["fraction"] if args.before else [])
    for name in args.problems:
        spec = accuracy.problem(name, False)
        ref = accuracy.reference(name, spec, args)
        exact = accuracy.exact_moments(name, spec, args) if args.exact else None
        for s, sampler_name in enumerate(args.samplers):
            for num_samples in args.num_samples:
                for rule in rules:
                    for seed in args.seeds:
                        sampler = SAMPLERS[sampler_name]
                        if rule == "fraction":
                            sampler = fixed_fraction(sampler)
                        kernel = sampler(spec["model"])
                        key = random.fold_in(random.key(seed), s)
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            mcmc, seconds = accuracy.timed_run(
                                kernel, key, spec, args.num_warmup, num_samples
                            )
                        summary, floor_xi, _ = accuracy.scored(mcmc, ref, rng)
                        xi, ess = float(summary["xi"]), float(summary["min_ess_bulk"])
                        found = kernel.error_estimate
                        est = "-" if found is None else f"{found['xi']:.3f}"
                        if found is not None:
                            est += f" ({found['xi'] / xi:.2f})"
                        step = float(np.max(np.asarray(mcmc.last_state.step_size)))
                        against = "-"
                        if exact is not None:
                            draws = np.asarray(mcmc.get_samples()[spec["site"]])
                            sd, ex = draws.std(0), exact["sd"]
                            xi_exact = np.linalg.norm(sd - ex) / np.linalg.norm(ex)
                            bias = np.max(np.abs(draws.mean(0) - exact["mean"]) / ex)
                            against = f"{xi_exact:.3f} / {bias:.3f}"
                            if found is not None:
                                against += f" ({found['xi'] / xi_exact:.2f})"
                        print(
                            f"| {name} | {sampler_name} | {rule} | {num_samples} | "
                            f"{seed} | {step:.3f} | {xi:.3f} | "
                            f"{summary['max_bias_mean']:.3f} | {est} | {against} | "
                            f"{ess:.0f} | "
                            f"{ess / seconds:.0f} | {floor_xi:.3f} | "
                            f"{', '.join(kernel.run_warnings) or 'none'} |",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
