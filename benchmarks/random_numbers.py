"""Random numbers at d = 10^5: JAX's counter-based generators on this machine.

    python benchmarks/random_numbers.py [--steps]

Times, per draw of d values inside a compiled loop, the standard normal that SGLD
and the momentum samplers make, the uniform, and SGBD's pair (a normal increment
and a uniform for the flip) under each ``jax.random`` implementation
(``threefry2x32``, JAX's default; ``rbg`` and ``unsafe_rbg``, built on XLA's
RngBitGenerator), and SGBD's pair drawn as one ``random.bits`` call of 2d words
split into the two. Every figure is also given as a ratio to threefry's normal,
measured in the same run. All of them are reproducible draw for draw from a key
on a given backend.

On a CPU, threefry's draws are timed twice: with JAX's own CPU lowering (up to
JAX 0.10 a loop of five iterations, "rolled") and unrolled, as
``numpyro_sgbd.unroll_threefry_on_cpu()`` lowers it when a program calls it (the
same bits). Each timing sets its lowering itself, so this script compares both
and opts in to neither beforehand. ``--steps``
adds what that is worth to a whole step: per-step time of the hand-written
floor, BlackJAX's SGLD and our vanilla and corrected SGBD and SGLD (bar off;
N = 10^6, d = 10, n = 100 and 1000), under each lowering, alternating, in one
process.
"""

import argparse
import os
import sys
import time

import jax
from jax import random
import jax.numpy as jnp

from numpyro_sgbd import unroll_threefry_on_cpu
from numpyro_sgbd._threefry import _threefry_module

DRAWS_PER_CALL = 20


def per_draw_ms(draw, key, d, repeats):
    """Milliseconds per ``draw(key)`` of d values, in a jitted loop of 20 draws
    (compiled on a first call; the fastest of ``repeats`` timed calls)."""

    @jax.jit
    def run(key):
        def body(i, acc):
            return acc + draw(random.fold_in(key, i), d)

        return jax.lax.fori_loop(0, DRAWS_PER_CALL, body, jnp.zeros(d))

    jax.block_until_ready(run(key))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(key))
        best = min(best, time.perf_counter() - start)
    return 1e3 * best / DRAWS_PER_CALL


def normal(key, d):
    return random.normal(key, (d,))


def uniform(key, d):
    return random.uniform(key, (d,))


def sgbd_pair(key, d):
    key_w, key_b = random.split(key)
    return random.normal(key_w, (d,)) * (random.uniform(key_b, (d,)) < 0.5)


def sgbd_pair_one_draw(key, d):
    # One call for 2d words: the top 23 bits of each as a uniform in [1, 2).
    words = random.bits(key, (2, d))
    u = jax.lax.bitcast_convert_type((words >> 9) | 0x3F800000, jnp.float32) - 1.0
    eps = jnp.sqrt(2.0) * jax.scipy.special.erfinv(2.0 * u[0] - 1.0 + 1e-7)
    return eps * (u[1] < 0.5)


def _lowerings():
    """(label, unrolled) for threefry's lowerings this JAX can compile here."""
    if jax.default_backend() != "cpu" or _threefry_module() is None:
        return [("", True)]  # one lowering: JAX's own
    return [(" rolled", False), (" unrolled", True)]


def _use(unrolled):
    unroll_threefry_on_cpu(unrolled)
    jax.clear_caches()  # compiled programs keep their lowering


def steps(repeats):
    """Per-step seconds of whole steps under each threefry lowering, alternating
    (``--steps``)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from run import (
        KERNELS,
        _make,
        blackjax_seconds,
        floor_seconds,
        kernel_seconds,
        make_data,
    )

    X, y = make_data(1_000_000, 10)
    lowerings = _lowerings()
    methods = [("floor", None), ("BlackJAX sgld", None)] + [
        (name, (cls, variant))
        for name, cls, variant in KERNELS
        if variant in ("vanilla", "corrected")
    ]
    print(f"\nWhole steps, us (N = 1e6, d = 10, bar off; best of {repeats} rounds)")
    for n in (100, 1000):
        num_steps = max(4000, int(2.0 / floor_seconds(X, y, n, 24_000) / 5))
        best = {}
        for _ in range(repeats):
            for label, unrolled in lowerings:
                _use(unrolled)
                for name, spec in methods:
                    if spec is None:
                        fn = floor_seconds if name == "floor" else blackjax_seconds
                        t = fn(X, y, n, 6 * num_steps)
                    else:
                        t = kernel_seconds(_make(*spec), X, y, n, num_steps, False, 1)
                    key = (name, label)
                    best[key] = min(best.get(key, float("inf")), t)
        header = "".join(f"{'us' + label:>14s}" for label, _ in lowerings)
        print(f"n = {n}: {'method':16s}{header}   / floor, / BlackJAX (each lowering)")
        for name, _ in methods:
            cells = "".join(f"{1e6 * best[(name, lab)]:14.1f}" for lab, _ in lowerings)
            ratios = "   ".join(
                f"{best[(name, lab)] / best[('floor', lab)]:.2f}, "
                f"{best[(name, lab)] / best[('BlackJAX sgld', lab)]:.2f}"
                for lab, _ in lowerings
            )
            print(f"        {name:16s}{cells}   {ratios}")
    _use(True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--steps",
        action="store_true",
        help="also time whole SG steps under each threefry lowering",
    )
    parser.add_argument(
        "--step-rounds",
        type=int,
        default=2,
        help="--steps: alternating rounds (each lowering's best is kept)",
    )
    args = parser.parse_args(argv)
    print(f"d = {args.dim}, jax {jax.__version__}, backend {jax.default_backend()}")
    print(f"{'implementation':24s} {'draw':22s} {'ms':>8s} {'/ threefry normal':>18s}")
    base = None
    draws = [("normal", normal), ("uniform", uniform), ("SGBD pair", sgbd_pair)]
    impls = [("threefry2x32" + label, "threefry2x32", u) for label, u in _lowerings()]
    for label, impl, unrolled in impls + [(i, i, True) for i in ("rbg", "unsafe_rbg")]:
        _use(unrolled)
        key = random.key(0, impl=impl)
        rows = draws + (
            [("SGBD pair, one bits", sgbd_pair_one_draw)]
            if impl == "threefry2x32"
            else []
        )
        for name, draw in rows:
            ms = per_draw_ms(draw, key, args.dim, args.repeats)
            base = ms if base is None else base
            print(f"{label:24s} {name:22s} {ms:8.3f} {ms / base:18.2f}")
    if args.steps:
        steps(args.step_rounds)


if __name__ == "__main__":
    main()
