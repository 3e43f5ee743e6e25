"""Repeated fits on new data of the same shapes (cross-validation folds,
simulation-based calibration, a bootstrap): the seconds of each fit, how many of
them XLA spent compiling, and each fit's answer against its own data.

    python benchmarks/refits.py                 # SGLD and SGBD, 5 fits each
    python benchmarks/refits.py --fits 10 --samplers SGLD

A logistic regression (N = 2,000 rows, d = 3, n = 100, N(0, 1) priors); each
fit simulates new coefficients and labels on the same covariates and runs the
default path (``step_size=None``) for 500 + 2,000 samples with
``jit_model_args=True``, either on one ``MCMC`` object for every fit
(``--same-mcmc``, the default) or on a new one each time. Printed per fit: wall
seconds, XLA's backend compile seconds within them, and the largest distance of
the posterior mean from the full-data mode of that fit's data (searched
separately), in posterior sds: a fit that sampled another data set's posterior
shows there. The last line gives the mean of the fits after the first / the
first (issue 45's target: 1/5 or less).

The kernel compiles its set-up's programs and its initial state once per data
shape (the state carries L and the centre), but NumPyro compiles its sampling
loop on every ``run``. ``--cache`` names a directory for JAX's persistent
compilation cache, which then serves that loop to the later fits; JAX stores no
program that calls the host, so with the run checks on (the default) the loop is
compiled every fit all the same: ``--checks-off`` runs the fits inside
``numpyro_sgbd.monitoring.off()`` (no warnings, no convergence check), the
pattern docs/usage.rst gives for simulation-based calibration.

    python benchmarks/refits.py --cache /tmp/jax-cache --checks-off
"""

import argparse
import contextlib
import time
import warnings

import jax
from jax import monitoring, random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgbd import SGBD, SGLD, posterior_mode
from numpyro_sgbd.monitoring import off as monitoring_off

SAMPLERS = {"SGLD": SGLD, "SGBD": SGBD}


def model(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def data_sets(num_fits, num_data=2000, dim=3):
    X = random.normal(random.key(0), (num_data, dim))
    for fit in range(num_fits):
        w = random.normal(random.key(100 + fit), (dim,))
        p = jax.nn.sigmoid(X @ w)
        yield X, random.bernoulli(random.key(200 + fit), p).astype(jnp.float32)


def fits(cls, num_fits, same_mcmc):
    compiling = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiling.append(duration)

    def fitted(X, y):  # a model of its own: nothing compiled for it yet
        return model(X, y)

    monitoring.register_event_duration_secs_listener(listener)
    kernel, mcmc, rows = cls(fitted), None, []
    try:
        for fit, (X, y) in enumerate(data_sets(num_fits)):
            mode = posterior_mode(model, X, y)  # outside the timing, not shared
            if mcmc is None or not same_mcmc:
                mcmc = MCMC(
                    kernel,
                    num_warmup=500,
                    num_samples=2000,
                    progress_bar=False,
                    jit_model_args=True,
                )
            compiling.clear()
            start = time.perf_counter()
            mcmc.run(random.key(fit), X, y)
            draws = np.asarray(jax.block_until_ready(mcmc.get_samples())["w"])
            seconds = time.perf_counter() - start
            sd = np.sqrt(1.0 / np.asarray(mode.hessian_diag["w"]))
            off = np.max(np.abs(draws.mean(0) - np.asarray(mode.params["w"])) / sd)
            rows.append((seconds, sum(compiling), off))
            print(
                f"{cls.__name__} fit {fit}: {seconds:.2f} s, compiling "
                f"{sum(compiling):.2f} s, mean - mode {off:.2f} sd",
                flush=True,
            )
    finally:
        monitoring.unregister_event_duration_listener(listener)
    later = np.mean([r[0] for r in rows[1:]])
    print(
        f"{cls.__name__}: fits after the first {later:.2f} s / the first "
        f"{rows[0][0]:.2f} s = {later / rows[0][0]:.2f}"
    )
    return rows


def add_pattern_options(parser):
    """``--cache DIR`` and ``--checks-off``: the repeated-fit pattern of
    docs/usage.rst (also for benchmarks/sbc_simuk.py)."""
    parser.add_argument(
        "--cache", help="a new directory for JAX's persistent compilation cache"
    )
    parser.add_argument(
        "--checks-off",
        action="store_true",
        help="run the fits inside numpyro_sgbd.monitoring.off()",
    )


def pattern(args):
    """Turn on the persistent cache where ``args.cache`` names one; a context
    in which the fits run (without the run checks with ``args.checks_off``)."""
    if args.cache:
        jax.config.update("jax_compilation_cache_dir", args.cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    return monitoring_off() if args.checks_off else contextlib.nullcontext()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--fits", type=int, default=5)
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument(
        "--new-mcmc", action="store_true", help="a new MCMC object for each fit"
    )
    add_pattern_options(parser)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # short runs: the convergence check speaks
    with pattern(args):
        for name in args.samplers:
            fits(SAMPLERS[name], args.fits, same_mcmc=not args.new_mcmc)


if __name__ == "__main__":
    main()
