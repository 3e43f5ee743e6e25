"""The corrected step on a sparse linear model whose data read k weights each.

    python benchmarks/sparse_model.py            # d = 10^5, N = 2 x 10^5, k = 20
    python benchmarks/sparse_model.py --dim 20000 --num-data 40000

Each datum reads k of d weights, ``mu = sum(w[cols[i]] * vals[i])`` (a sparse
GLM, a bag of words), n = 500 a minibatch. The corrected variants and NOGIN's
diagonal covariance need each datum's gradient for the noise statistics: dense,
that is n x d floats a step, formed a few rows at a time; read through the one
gather of k weights (``numpyro_sgbd.estimators.gathered``), n x k. Printed: ms per step
of SGBD vanilla and corrected and NOGIN with ``covariance="diag"`` (fixed steps,
no preconditioner), each the difference of two ``MCMC.run`` lengths with
``jit_model_args=True`` less the seconds XLA spent compiling, the runs of the
kernels alternating (the fastest of ``--repeats``), and corrected / vanilla,
NOGIN / vanilla (issue 45's target: 2 at most).
"""

import argparse
import contextlib
import io
import time
import warnings

import jax
from jax import monitoring, random
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgbd import NOGIN, SGBD


def model(cols, vals, y, num_weights, subsample_size):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([num_weights]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
        mu = jnp.sum(w[cols[idx]] * vals[idx], -1)
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y[idx])


def make_data(num_data, num_weights, k, seed=0):
    kc, kv, kw, ky = random.split(random.key(seed), 4)
    cols = random.randint(kc, (num_data, k), 0, num_weights)
    vals = random.normal(kv, (num_data, k))
    w = random.normal(kw, (num_weights,))
    y = jnp.sum(w[cols] * vals, -1) + 0.5 * random.normal(ky, (num_data,))
    return cols, vals, y


def seconds(make_kernel, data, num_samples):
    """Wall seconds of one run less XLA's compile seconds in it."""
    init = {"w": jnp.zeros(data[-1]), "sigma": jnp.array(0.5)}
    return run_seconds(make_kernel(), data[:3], init, num_samples)


def run_seconds(kernel, model_args, init, num_samples):
    """Wall seconds of ``MCMC(kernel).run(key, *model_args, init_params=init)``
    (no warmup, ``num_samples`` draws, ``jit_model_args=True``, bar off) less
    XLA's compile seconds in it (also for benchmarks/enumerated_cost.py)."""
    compiling = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiling.append(duration)

    mcmc = MCMC(
        kernel,
        num_warmup=0,
        num_samples=num_samples,
        progress_bar=False,
        jit_model_args=True,
    )
    monitoring.register_event_duration_secs_listener(listener)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            mcmc.run(random.key(0), *model_args, init_params=init)
            jax.block_until_ready(mcmc.get_samples())
    finally:
        monitoring.unregister_event_duration_listener(listener)
    return time.perf_counter() - start - sum(compiling)


def loop_step_seconds(kernel, model_args, init, steps, repeats):
    """Seconds a step of ``kernel``'s own pure step (``kernel.sample_kernel``,
    no draws collected, no NumPyro loop): the fastest of ``repeats`` calls of
    one compiled loop of ``steps`` steps from ``init``, after a call that
    compiles it (also for enumerated_cost.py and local_sites_cost.py)."""
    state = kernel.init(random.key(0), 0, init, model_args, {})
    step = kernel.sample_kernel

    @jax.jit
    def run(state, model_args):
        return jax.lax.fori_loop(0, steps, lambda i, s: step(s, model_args, {}), state)

    jax.block_until_ready(run(state, model_args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(state, model_args))
        best = min(best, time.perf_counter() - start)
    return best / steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--num-data", type=int, default=200_000)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--subsample-size", type=int, default=500)
    parser.add_argument("--steps", type=int, default=20, help="k: runs of k and 6k")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    d, n = args.dim, args.subsample_size
    cols, vals, y = make_data(args.num_data, d, args.k)
    data = (cols, vals, y, d)

    def m(cols, vals, y):
        return model(cols, vals, y, d, n)

    kernels = {
        "SGBD vanilla": lambda: SGBD(m, step_size=1e-3, variant="vanilla"),
        "SGBD corrected": lambda: SGBD(m, step_size=1e-3, variant="corrected"),
        "NOGIN diag": lambda: NOGIN(m, step_size=1e-3, covariance="diag"),
    }
    best = {name: [float("inf")] * 2 for name in kernels}
    for _ in range(args.repeats):
        for name, make in kernels.items():
            for j, steps in enumerate((args.steps, 6 * args.steps)):
                best[name][j] = min(best[name][j], seconds(make, data, steps))
    per_step = {name: (b6 - b1) / (5 * args.steps) for name, (b1, b6) in best.items()}
    print(f"d = {d}, N = {args.num_data}, k = {args.k}, n = {n}; jax {jax.__version__}")
    base = per_step["SGBD vanilla"]
    for name, t in per_step.items():
        print(f"{name:<16} {1e3 * t:9.2f} ms a step   / vanilla {t / base:6.2f}")


if __name__ == "__main__":
    main()
