"""The size and speed of one kernel step, without NumPyro's loop around it.

    python benchmarks/step_program.py                 # this checkout
    PYTHONPATH=/tmp/old python benchmarks/step_program.py   # another commit's

For a refactor of the adapter, timings of whole ``MCMC`` runs on a shared 2-core
machine scatter by 20 % and more, which hides a change of a few per cent. This
script prints, per kernel, two figures to compare between commits:

- ``instructions``: the number of HLO instructions XLA compiles for one
  ``kernel.sample`` (the adapter's work and the update together). It does not
  depend on the machine's load: a refactor that adds work shows here.
- ``us/step`` and ``/ floor``: the fastest of ``--repeats`` timings of a jitted
  ``lax.fori_loop`` of ``--num-steps`` calls of ``kernel.sample``, and its ratio to
  the floor timed the same way in the same process (the index draw and the
  minibatch gradient of the same potential, and nothing else).

Logistic regression (``run.model``), N = 10^5, d = 100, n = 100; every kernel
vanilla with a fixed step, ``preconditioner="none"``, ``gradient="minibatch"``
(NOGIN ``covariance="diag"``), as in ``momentum_cost.py``.
"""

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from jax import random  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from run import _loglik, make_data, model  # noqa: E402

import numpyro_sgbd  # noqa: E402


def _instructions(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    return sum(1 for line in text.splitlines() if re.match(r"\s+(ROOT )?\S+ = ", line))


def _fastest(fn, arg, repeats):
    jax.block_until_ready(fn(arg))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    # (Older commits' packages lack the call: those that unrolled did so on
    # import.)
    if hasattr(numpyro_sgbd, "unroll_threefry_on_cpu"):
        numpyro_sgbd.unroll_threefry_on_cpu()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--subsample-size", type=int, default=100)
    parser.add_argument("--num-steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    N, n, k = args.num_data, args.subsample_size, args.num_steps
    X, y = make_data(N, args.dim)
    print(f"numpyro_sgbd from {numpyro_sgbd.__file__}")
    print(f"N={N} d={args.dim} n={n} steps={k} repeats={args.repeats}")

    def floor_step(i, carry):
        w, key = carry
        key, key_idx = random.split(key)
        idx = random.randint(key_idx, (n,), 0, N)
        grad = jax.grad(lambda w: -N / n * _loglik(w, X[idx], y[idx]).sum())(w)
        return w - 1e-9 * grad, key

    start = (jnp.zeros(args.dim), random.key(0))
    floor = _fastest(
        jax.jit(lambda c: jax.lax.fori_loop(0, k, floor_step, c)), start, args.repeats
    )
    print(f"{'row':<8}{'instructions':>14}{'us/step':>10}{'/ floor':>9}")
    print(f"{'floor':<8}{'':>14}{floor / k * 1e6:>10.1f}")
    kernels = {
        "SGBD": numpyro_sgbd.SGBD(
            model,
            step_size=1e-3,
            variant="vanilla",
            preconditioner="none",
            gradient="minibatch",
        ),
        "SGLD": numpyro_sgbd.SGLD(
            model,
            step_size=1e-3,
            variant="vanilla",
            preconditioner="none",
            gradient="minibatch",
        ),
        "NOGIN": numpyro_sgbd.NOGIN(
            model,
            step_size=0.1,
            mass=1e3,
            covariance="diag",
            preconditioner="none",
            gradient="minibatch",
        ),
    }
    for name in ("SGHMC", "SGNHT"):  # absent from commits before them
        if hasattr(numpyro_sgbd, name):
            kernels[name] = getattr(numpyro_sgbd, name)(
                model,
                step_size=1e-3,
                variant="vanilla",
                preconditioner="none",
                gradient="minibatch",
            )
    data = (X, y, n)
    for name, kernel in kernels.items():
        state = kernel.init(random.key(1), 0, None, data, {})
        count = _instructions(lambda s: kernel.sample(s, data, {}), state)
        loop = jax.jit(
            lambda s: jax.lax.fori_loop(
                0, k, lambda i, s: kernel.sample(s, data, {}), s
            )
        )
        seconds = _fastest(loop, state, args.repeats)
        print(f"{name:<8}{count:>14}{seconds / k * 1e6:>10.1f}{seconds / floor:>9.2f}")


if __name__ == "__main__":
    main()
