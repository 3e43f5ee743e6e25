"""Cost of the full-data mode search on a hierarchical model, in its own process.

    python benchmarks/mode_search.py                 # d = 2,000, N = 10^5
    python benchmarks/mode_search.py --groups 400 --rows 20000

The model: y_i ~ Normal(mu + tau * effect[g_i], sigma), effect ~ Normal(0, 1) per
group (non-centred), one subsample plate over the rows; d = groups + 3. Prints the
wall time of ``posterior_mode`` (its compilation included), the number of full-data
gradients and Hessian-vector products it took, that time over the time of one
compiled full-data gradient (a ratio measured in this run), the peak resident memory
of the process, and what a d x d float32 matrix would take. No d x d array is formed
during the search (``tests/test_modes.py`` checks the compiled functions); the
Hessian's diagonal at the end is d products, 64 at a time.
"""

import argparse
import logging
import os
import resource
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

from numpyro_sgbd import posterior_mode, unroll_threefry_on_cpu  # noqa: E402
from numpyro_sgbd.mode import full_data_objective  # noqa: E402


def model(group, y, num_groups):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        effect = numpyro.sample("effect", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=1000) as idx:
        loc = mu + tau * effect[group[idx]]
        numpyro.sample("y", dist.Normal(loc, sigma), obs=y[idx])


def main(argv=None):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1997)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--chunk-size", type=int, default=4096)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    # Unequal groups (sizes ~ 1 + Poisson-like spread), effects sd 0.5, noise sd 1.
    weights = rng.gamma(2.0, size=args.groups)
    group = rng.choice(args.groups, size=args.rows, p=weights / weights.sum())
    effects = 0.5 * rng.normal(size=args.groups)
    y = (1.0 + effects[group] + rng.normal(size=args.rows)).astype(np.float32)
    data = (jnp.asarray(group, jnp.int32), jnp.asarray(y), args.groups)
    d = args.groups + 3
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    mode = posterior_mode(model, *data, chunk_size=args.chunk_size)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    objective = full_data_objective(model, data, chunk_size=args.chunk_size)
    x = objective.x0
    jax.block_until_ready(objective.value_and_grad(x))  # compile
    times = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(objective.value_and_grad(x))
        times.append(time.perf_counter() - t)
    gradient = float(np.median(times))
    info = mode.info
    print(f"d = {d}, N = {args.rows}, chunk {args.chunk_size}")
    print(
        f"posterior_mode: {seconds:.1f} s, converged={info['converged']} "
        f"({info['stop']}), {info['iterations']} Newton-CG steps, "
        f"{info['num_evaluations']} full-data gradients, {info['num_hvp']} "
        f"Hessian-vector products, distance {info['distance']:.2g} sd"
    )
    print(f"one full-data gradient: {1e3 * gradient:.1f} ms")
    print(f"search / one gradient: {seconds / gradient:.0f}")
    print(
        f"peak resident memory: {rss:.0f} MiB ({rss0:.0f} MiB before the search); "
        f"a d x d float32 matrix: {d * d * 4 / 2**20:.0f} MiB"
    )


if __name__ == "__main__":
    main()
