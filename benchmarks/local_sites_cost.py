"""The step of a model with a latent site inside the subsample plate against the
same model with the latents as an indexed global vector (issue 46: 1.3 at most).

    python benchmarks/local_sites_cost.py                 # N = 10^5, n = 1000; ~2 min
    python benchmarks/local_sites_cost.py --num-data 10000

A random effect per row (four replicates a row), written twice: with
``u = sample("u", Normal(mu, tau))`` inside the data plate (a local site: each
step moves the minibatch's rows by a Metropolis-adjusted Barker step on their
own conditional, :mod:`numpyro_sgbd.local_sites`, then the global sites), and
with ``u`` a global vector of N sampled outside the plate and indexed
``u[idx]`` inside (every step then moves all N coordinates by the sampler's rule,
with the prior of all N rows). Printed: microseconds a step of each for SGLD
(vanilla) and SGBD corrected (per-datum gradients for the noise), each the
fastest of ``--repeats`` timed calls of one compiled loop of ``--steps`` steps
of the kernel's own step (``kernel.sample_kernel``; no draws collected), the
models alternating, and local / indexed.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from sparse_model import loop_step_seconds  # benchmarks/sparse_model.py

from numpyro_sgbd import SGBD, SGLD


def make_models(n):
    def globals_():
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfNormal(2))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2))
        return mu, tau, sigma

    def local(y):
        mu, tau, sigma = globals_()
        with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
            u = numpyro.sample("u", dist.Normal(mu, tau))
            numpyro.sample("y", dist.Normal(u[:, None], sigma).to_event(1), obs=y[idx])

    def indexed(y):
        mu, tau, sigma = globals_()
        u = numpyro.sample("u", dist.Normal(mu, tau).expand([y.shape[0]]).to_event(1))
        with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
            numpyro.sample(
                "y", dist.Normal(u[idx][:, None], sigma).to_event(1), obs=y[idx]
            )

    return {"local": local, "indexed": indexed}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--subsample-size", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    u = rng.normal(1.0, 1.0, args.num_data)
    y = jnp.asarray(u[:, None] + rng.normal(0, 0.5, (args.num_data, 4)), jnp.float32)
    samplers = {
        "SGLD": lambda m: SGLD(m, step_size=1e-3, variant="vanilla"),
        "SGBD corrected": lambda m: SGBD(m, step_size=1e-3, variant="corrected"),
    }
    models = make_models(args.subsample_size)
    print(
        f"N = {args.num_data}, n = {args.subsample_size}, {args.steps} steps; "
        f"jax {jax.__version__}, {jax.devices()[0].platform}"
    )
    for s, make in samplers.items():
        init = {"mu": jnp.array(1.0), "tau": jnp.array(0.0), "sigma": jnp.array(-0.7)}
        init["u"] = jnp.ones(y.shape[0])
        t = {
            m: loop_step_seconds(make(models[m]), (y,), init, args.steps, args.repeats)
            for m in models
        }
        a, b = t["local"], t["indexed"]
        print(
            f"{s:<15} local {1e6 * a:8.1f} us   indexed {1e6 * b:8.1f} us   "
            f"ratio {a / b:5.2f}"
        )


if __name__ == "__main__":
    main()
