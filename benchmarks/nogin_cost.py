"""Per-iteration cost of NOGIN (lowrank, diag, full) relative to SGLD.

Logistic regression with d = 1000 features, minibatch n = 100 (defaults; the
issue's setting), N = 10,000 rows. Every ratio printed is of times measured in this
one process, each the marginal time per step of ``MCMC.run`` (see
``run.kernel_seconds``):

    python benchmarks/nogin_cost.py [--dim 1000] [--subsample-size 100]
    python benchmarks/nogin_cost.py --o-step   # what bounds the low-rank form

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

``--o-step`` times the low-rank O-step's parts in one process (d = 1000, k = 100;
its first run): the k x k Gram 199 us (4.2 x SGLD vanilla's 47 us step,
2 x 10^7 flops at about 100 GFLOP/s, near what two cores do), its eigendecomposition
522 us (11 x), the whole O-step 1.34 ms (28 x). The Gram alone is past 3 x SGLD.
"""

import argparse
import time

import jax
from jax import random
import jax.numpy as jnp
from run import kernel_seconds as time_kernel
from run import make_data

from numpyro_sgbd import NOGIN, SGLD, unroll_threefry_on_cpu
from numpyro_sgbd.updates import nogin_damp


def main(args):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
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


def _microseconds(f, args, reps=2000, rounds=5):
    """Microseconds per call of ``f(*args)`` (a scalar), the fastest of
    ``rounds`` compiled loops of ``reps`` calls; each call's input depends on the
    last result, so that XLA cannot hoist it out of the loop."""

    @jax.jit
    def run(args):
        def body(_, acc):
            return acc + f(*(a + acc * 1e-12 for a in args))

        return jax.lax.fori_loop(0, reps, body, 0.0)

    run(args).block_until_ready()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run(args).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 1e6 * best / reps


def o_step(args):
    """The parts of the low-rank O-step (``nogin_damp``, covariance="lowrank") at
    d = ``--dim``, k = ``--subsample-size``: the k x k Gram C'M^-1 C, its
    symmetric eigendecomposition, and the whole O-step, against SGLD vanilla's
    step timed in the same process."""
    d, k = args.dim, args.subsample_size
    C = random.normal(random.key(0), (d, k)) / k
    p = random.normal(random.key(1), (d,))
    G = C.T @ C
    parts = {
        "Gram C'M^-1 C": (lambda C: jnp.sum(C.T @ (C / 1e3)), (C,)),
        "eigh of k x k": (lambda G: jnp.sum(jnp.linalg.eigh(G)[1][0]), (G,)),
        "whole O-step": (
            lambda C, p: jnp.sum(
                nogin_damp(p, C, 0.1, 0.5, covariance="lowrank", mass=1e3)[0]
            ),
            (C, p),
        ),
    }
    X, y = make_data(args.num_data, d)
    X = X / d**0.5
    sgld = 1e6 * time_kernel(
        lambda m: SGLD(m, step_size=1e-3), X, y, k, args.num_steps, False
    )
    print(f"O-step parts, d = {d}, k = {k}; SGLD vanilla {sgld:.1f} us a step")
    for name, (f, f_args) in parts.items():
        us = _microseconds(f, f_args)
        print(f"{name:<18}{us:>10.1f} us{us / sgld:>8.2f} x SGLD")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=1000)
    parser.add_argument("--subsample-size", type=int, default=100)
    parser.add_argument("--num-steps", type=int, default=3000)
    parser.add_argument("--full-steps", type=int, default=40)
    parser.add_argument(
        "--o-step",
        action="store_true",
        help="time the parts of the low-rank O-step instead of whole kernels",
    )
    parsed = parser.parse_args()
    if parsed.o_step:
        o_step(parsed)
    else:
        main(parsed)
