"""Random numbers at d = 10^5: JAX's counter-based generators on this machine.

    python benchmarks/random_numbers.py

Times, per draw of d values inside a compiled loop, the standard normal that SGLD
and the momentum samplers make, the uniform, and SGBD's pair (a normal increment
and a uniform for the flip) under each ``jax.random`` implementation
(``threefry2x32``, JAX's default; ``rbg`` and ``unsafe_rbg``, built on XLA's
RngBitGenerator), and SGBD's pair drawn as one ``random.bits`` call of 2d words
split into the two. Every figure is also given as a ratio to threefry's normal,
measured in the same run. All of them are reproducible draw for draw from a key
on a given backend.
"""

import argparse
import time

import jax
from jax import random
import jax.numpy as jnp

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    print(f"d = {args.dim}, jax {jax.__version__}, backend {jax.default_backend()}")
    print(f"{'implementation':14s} {'draw':22s} {'ms':>8s} {'/ threefry normal':>18s}")
    base = None
    draws = [("normal", normal), ("uniform", uniform), ("SGBD pair", sgbd_pair)]
    for impl in ("threefry2x32", "rbg", "unsafe_rbg"):
        key = random.key(0, impl=impl)
        rows = draws + (
            [("SGBD pair, one bits", sgbd_pair_one_draw)]
            if impl == "threefry2x32"
            else []
        )
        for name, draw in rows:
            ms = per_draw_ms(draw, key, args.dim, args.repeats)
            base = ms if base is None else base
            print(f"{impl:14s} {name:22s} {ms:8.3f} {ms / base:18.2f}")


if __name__ == "__main__":
    main()
