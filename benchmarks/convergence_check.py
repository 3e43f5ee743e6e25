"""What the convergence check costs a step: the kernels' per-step time with the
state's record of thinned draws (``numpyro_sgbd.monitoring``) against without it,
measured in alternating rounds of one process.

    python benchmarks/convergence_check.py            # about 2 minutes on 2 cores
    python benchmarks/convergence_check.py --dim 1000 --subsample-size 1000

Without the record is the kernel as NumPyro's MCMC would run it if ``init`` found
no MCMC to plan for (``monitoring.plan`` returning ``None``): no ``trace`` in the
state, no host call at the end. The model is a linear regression with N = 10^5
rows; each timed run is a second ``mcmc.run`` (compiled), bar off.
"""

import argparse
import os
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

from numpyro_sgbd import (  # noqa: E402
    NOGIN,
    SGBD,
    SGLD,
    monitoring,
    unroll_threefry_on_cpu,
)


def regression(X, y, subsample_size):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


def main(argv=None):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--subsample-size", type=int, default=100)
    parser.add_argument("--num-samples", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100_000, args.dim)) / np.sqrt(args.dim)
    y = X @ np.ones(args.dim) + rng.normal(size=100_000)
    X, y = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)
    plan = monitoring.plan
    kernels = {
        "SGBD vanilla": lambda: SGBD(regression, step_size=0.003),
        "SGLD vanilla": lambda: SGLD(regression, step_size=0.003),
        "SGBD default": lambda: SGBD(regression),
        "NOGIN default": lambda: NOGIN(regression),
    }
    print(
        f"d = {args.dim}, n = {args.subsample_size}, {args.num_samples:,} samples, "
        f"best of {args.rounds} alternating rounds, us a step"
    )
    print("| kernel | with the record | without | ratio |\n|---|---|---|---|")
    warnings.simplefilter("ignore")
    for name, make in kernels.items():
        best = {True: np.inf, False: np.inf}
        runs = {}
        for on in (True, False):
            monitoring.plan = plan if on else (lambda *a: None)
            mcmc = MCMC(
                make(), num_warmup=200, num_samples=args.num_samples, progress_bar=False
            )
            mcmc.run(jax.random.key(0), X, y, args.subsample_size)
            jax.block_until_ready(mcmc.get_samples())
            runs[on] = mcmc
        for _ in range(args.rounds):
            for on in (True, False):
                monitoring.plan = plan if on else (lambda *a: None)
                mcmc = runs[on]
                start = time.perf_counter()
                mcmc.run(jax.random.key(1), X, y, args.subsample_size)
                jax.block_until_ready(mcmc.get_samples())
                seconds = time.perf_counter() - start
                steps = mcmc.num_warmup + mcmc.num_samples
                best[on] = min(best[on], seconds / steps * 1e6)
        monitoring.plan = plan
        assert runs[True].last_state.trace is not None
        assert runs[False].last_state.trace is None
        print(
            f"| {name} | {best[True]:.2f} | {best[False]:.2f} | "
            f"{best[True] / best[False]:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
