"""Per-iteration cost of MCMC(SGBD(model)) against a hand-written minibatch loop.

Logistic regression, N = 10**6 rows, d = 10, minibatch n = 1000 (defaults). Every
figure printed is a ratio of times measured in this one process:

    python benchmarks/adapter_overhead.py [--num-data 1000000] [--num-steps 10000]

The floor is a jitted ``lax.scan`` of minibatch gradients of a hand-written potential
with O(n) index draws (``random.randint``) and a Langevin update.
"""

import argparse
import contextlib
import io
import statistics
import time

import jax
from jax import random
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgbd import SGBD, SGLD


def model(X, y=None, subsample_size=1000):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def make_data(num_data, dim, seed=0):
    kx, kw, ky = random.split(random.key(seed), 3)
    X = random.normal(kx, (num_data, dim))
    w = random.normal(kw, (dim,))
    y = random.bernoulli(ky, jax.nn.sigmoid(X @ w)).astype(jnp.float32)
    return X, y


def floor_loop(X, y, n, num_steps, step_size):
    """The hand-written floor: minibatch gradient + Langevin step in a jitted scan."""
    N = X.shape[0]

    def potential(w, idx):
        logits = X[idx] @ w
        loglik = jnp.sum(y[idx] * logits - jnp.logaddexp(0.0, logits))
        return 0.5 * jnp.sum(w**2) - (N / n) * loglik

    @jax.jit
    def run(key, w):
        def step(w, key):
            k_idx, k_noise = random.split(key)
            idx = random.randint(k_idx, (n,), 0, N)
            g = jax.grad(potential)(w, idx)
            w = w - 0.5 * step_size**2 * g
            w = w + step_size * random.normal(k_noise, w.shape)
            return w, w

        return jax.lax.scan(step, w, random.split(key, num_steps))

    return run


def time_floor(X, y, n, num_steps):
    run = floor_loop(X, y, n, num_steps, 1e-3)
    w0 = jnp.zeros(X.shape[1]) + 0.1
    jax.block_until_ready(run(random.key(0), w0))
    times = []
    for seed in range(1, 4):
        t = time.perf_counter()
        jax.block_until_ready(run(random.key(seed), w0))
        times.append((time.perf_counter() - t) / num_steps)
    return statistics.median(times)


def _run_seconds(kernel, X, y, n, num_samples, progress_bar):
    mcmc = MCMC(
        kernel, num_warmup=0, num_samples=num_samples, progress_bar=progress_bar
    )
    init = {"w": jnp.full(X.shape[1], 0.1)}
    t = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):  # the bars would flood the table
        mcmc.run(random.key(0), X, y, n, init_params=init)
        jax.block_until_ready(mcmc.get_samples())
    return time.perf_counter() - t


def time_kernel(make_kernel, X, y, n, num_steps, progress_bar, repeats=3):
    """Marginal seconds per step: (T(6k steps) - T(k steps)) / 5k, median of repeats.

    NumPyro's ``MCMC.run`` compiles its sampling loop on every call, so the
    difference of a long and a short run removes compilation (and set-up) time;
    compile time varies by tenths of a second, hence k in the thousands and the
    median over repeats.
    """
    times = []
    for _ in range(repeats):
        short = _run_seconds(make_kernel(), X, y, n, num_steps, progress_bar)
        long = _run_seconds(make_kernel(), X, y, n, 6 * num_steps, progress_bar)
        times.append((long - short) / (5 * num_steps))
    return statistics.median(times)


def main(args):
    X, y = make_data(args.num_data, args.dim)
    n = args.subsample_size
    floor = time_floor(X, y, n, args.num_steps)
    print(
        f"N={args.num_data} d={args.dim} n={n}; floor {1e6 * floor:.1f} us/step "
        f"(jitted scan, randint indices, hand-written gradient)"
    )
    print(f"{'kernel':<28}{'bar':>5}{'us/step':>10}{'ratio':>8}")
    for name, make in [
        ("SGBD vanilla", lambda: SGBD(model, step_size=1e-3)),
        ("SGBD corrected", lambda: SGBD(model, step_size=1e-3, variant="corrected")),
        ("SGLD vanilla", lambda: SGLD(model, step_size=1e-3)),
        (
            "SGBD vanilla, replace=True",
            lambda: SGBD(model, step_size=1e-3, replace=True),
        ),
    ]:
        for bar in (False, True):
            if bar and name != "SGBD vanilla":
                continue
            t = time_kernel(make, X, y, n, args.num_steps, bar)
            shown = "on" if bar else "off"
            print(f"{name:<28}{shown:>5}{1e6 * t:>10.1f}{t / floor:>8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--subsample-size", type=int, default=1000)
    parser.add_argument("--num-steps", type=int, default=10000)
    main(parser.parse_args())
