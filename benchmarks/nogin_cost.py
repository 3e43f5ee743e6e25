"""Per-iteration cost of NOGIN (lowrank, diag, full) relative to SGLD.

Logistic regression with d = 1000 features, minibatch n = 100 (defaults; the
issue's setting), N = 10,000 rows. Every ratio printed is of times measured in this
one process, each the marginal time per step of ``MCMC.run`` (see
``run.kernel_seconds``):

    python benchmarks/nogin_cost.py [--dim 1000] [--subsample-size 100]

The full form costs tens of milliseconds a step at d = 1000 (an eigenvalue
decomposition and a d x d solve), so it is timed over ``--full-steps`` steps
rather than ``--num-steps``; both are long enough that the difference of two runs
removes compile time.

SGLD vanilla needs one minibatch gradient per step; SGLD corrected and NOGIN also
need the n per-datum gradients (for the noise sd, resp. the covariance), so the
"corrected" row separates their cost from that of NOGIN's O-step.

On the 2-core development machine (CPU, jax 0.10.2), defaults: SGLD vanilla
0.053 ms a step; SGLD corrected 2.7x that, NOGIN diag 3.4x, lowrank 20x, full
690x (36.8 ms: the 1000 x 1000 covariance and its eigendecomposition). With
``--dim 21 --subsample-size 1000 --num-steps 30 --full-steps 300`` (n > d) the
order turns: lowrank 45 ms a step (the 1000 x 1000 Woodbury solve), full 0.23 ms,
diag 0.18 ms, SGLD vanilla 0.18 ms; NOGIN's default covariance="auto" picks the
cheaper of lowrank and full.
"""

import argparse

from run import kernel_seconds as time_kernel
from run import make_data

from numpyro_sgbd import NOGIN, SGLD


def main(args):
    X, y = make_data(args.num_data, args.dim)
    X = X / args.dim**0.5  # logits of order 1
    n = args.subsample_size
    kernels = [
        ("SGLD vanilla", lambda m: SGLD(m, step_size=1e-3)),
        ("SGLD corrected", lambda m: SGLD(m, step_size=1e-3, variant="corrected")),
    ] + [
        (
            f"NOGIN {cov}",
            lambda m, cov=cov: NOGIN(m, step_size=0.1, mass=1e3, covariance=cov),
        )
        for cov in ("lowrank", "diag", "full")
    ]
    times = {
        name: time_kernel(
            make, X, y, n, args.full_steps if "full" in name else args.num_steps, False
        )
        for name, make in kernels
    }
    base = times["SGLD vanilla"]
    print(f"N={args.num_data} d={args.dim} n={n}")
    print(f"{'kernel':<18}{'ms/step':>10}{'vs SGLD':>10}")
    for name, t in times.items():
        print(f"{name:<18}{1e3 * t:>10.2f}{t / base:>10.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=1000)
    parser.add_argument("--subsample-size", type=int, default=100)
    parser.add_argument("--num-steps", type=int, default=3000)
    parser.add_argument("--full-steps", type=int, default=40)
    main(parser.parse_args())
