"""The step of a mixture written with an enumerated component against the same
mixture written by hand as a log-sum-exp (issue 46: 1.3 at most).

    python benchmarks/enumerated_cost.py    # K = 3, N = 10^5, n = 1000; ~3 min
    python benchmarks/enumerated_cost.py --components 10

A K-component 1-D Gaussian mixture, written twice: with ``@config_enumerate``
and ``c = sample("c", Categorical(w))`` inside the data plate (the kernels sum
c out datum by datum, :mod:`numpyro_sgbd.enumeration`), and with
``MixtureSameFamily`` (NumPyro's own log-sum-exp). Printed: microseconds a step
of each for SGLD (vanilla), SGBD corrected (per-datum gradients for the noise)
and SGBD corrected with control variates, all with a fixed step size from the
same start, each the difference of two ``MCMC.run`` lengths with
``jit_model_args=True`` less XLA's compile seconds, the runs alternating (the
fastest of ``--repeats``), and beside it the kernel's own step alone, the
fastest of three calls of one compiled loop of 1,000 steps
(``sparse_model.loop_step_seconds``); and enumerated / by hand for each.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from sparse_model import loop_step_seconds, run_seconds  # benchmarks/sparse_model.py

from numpyro_sgbd import SGBD, SGLD, config_enumerate


def _priors(k):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(k)))
    mu = numpyro.sample("mu", dist.Normal(jnp.linspace(-3, 3, k), 1.0).to_event(1))
    sd = numpyro.sample("sd", dist.LogNormal(0.0, 1.0).expand([k]).to_event(1))
    return w, mu, sd


def make_models(k, n):
    @config_enumerate
    def enumerated(y):
        w, mu, sd = _priors(k)
        with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
            c = numpyro.sample("c", dist.Categorical(w))
            numpyro.sample("y", dist.Normal(mu[c], sd[c]), obs=y[idx])

    def by_hand(y):
        w, mu, sd = _priors(k)
        with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
            mixture = dist.MixtureSameFamily(dist.Categorical(w), dist.Normal(mu, sd))
            numpyro.sample("y", mixture, obs=y[idx])

    return {"enumerated": enumerated, "by hand": by_hand}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--components", type=int, default=3)
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--subsample-size", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=4000, help="runs of s and 6s")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    k, n = args.components, args.subsample_size
    rng = np.random.default_rng(0)
    c = rng.integers(0, k, args.num_data)
    y = jnp.asarray(np.linspace(-3, 3, k)[c] + rng.normal(0, 0.5, args.num_data))
    # Unconstrained, as init_params are (the simplex's k - 1 coordinates).
    init = {"w": jnp.zeros(k - 1), "mu": jnp.linspace(-3, 3, k), "sd": jnp.zeros(k)}
    samplers = {
        "SGLD": lambda m: SGLD(m, step_size=1e-5, variant="vanilla"),
        "SGBD corrected": lambda m: SGBD(m, step_size=1e-3, variant="corrected"),
        "SGBD corrected CV": lambda m: SGBD(
            m, step_size=1e-3, variant="corrected", gradient="control_variates"
        ),
    }
    models = make_models(k, n)
    best = {(s, m): [float("inf")] * 2 for s in samplers for m in models}
    for _ in range(args.repeats):
        for (s, m), b in best.items():
            for j, steps in enumerate((args.steps, 6 * args.steps)):
                kernel = samplers[s](models[m])
                b[j] = min(b[j], run_seconds(kernel, (y,), init, steps))
    loop = {
        (s, m): loop_step_seconds(samplers[s](models[m]), (y,), init, 1000, 3)
        for s in samplers
        for m in models
    }
    print(f"K = {k}, N = {args.num_data}, n = {n}; jax {jax.__version__}")
    print("microseconds a step: in MCMC.run | the kernel's step alone, compiled loop")
    for s in samplers:
        t = {
            m: (b6 - b1) / (5 * args.steps)
            for (s2, m), (b1, b6) in best.items()
            if s2 == s
        }
        a, b = t["enumerated"], t["by hand"]
        la, lb = loop[s, "enumerated"], loop[s, "by hand"]
        print(
            f"{s:<18} enumerated {1e6 * a:7.1f} | {1e6 * la:7.1f}   by hand "
            f"{1e6 * b:7.1f} | {1e6 * lb:7.1f}   ratio {a / b:5.2f} | {la / lb:5.2f}"
        )


if __name__ == "__main__":
    main()
