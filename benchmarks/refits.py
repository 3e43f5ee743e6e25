"""Repeated fits on new data of the same shapes (cross-validation folds,
simulation-based calibration, a bootstrap): the seconds of each fit, the
programs XLA compiled within them, and each fit's answer against its own data.

    python benchmarks/refits.py                 # SGLD, SGBD and NOGIN, 5 fits each
    python benchmarks/refits.py --fits 10 --samplers SGLD
    python benchmarks/refits.py --cache /tmp/jax-cache --checks-off
    python benchmarks/refits.py --bar           # NumPyro's progress bar on

A logistic regression (N = 2,000 rows, d = 3, n = 100, N(0, 1) priors); each
fit simulates new coefficients and labels on the same covariates and runs the
default path (``step_size=None``) for 500 + 2,000 samples with
``jit_model_args=True``, either on one ``MCMC`` object for every fit (the
default) or on a new one each time (``--new-mcmc``). Printed per fit: wall
seconds, the programs XLA compiled within them (:class:`CompiledPrograms`) and
their compile seconds, and the largest distance of the posterior mean from the
full-data mode of that fit's data (searched separately), in posterior sds and
in Monte Carlo standard errors (the draws' sd over the square root of their
ESS): a fit that sampled another data set's posterior shows there. The last
line gives the mean of the fits after the first / the first (issue 45's and
59's target: 1/5 or less).

The kernel compiles its set-up's programs and its initial state once per data
shape (the state carries L and the centre). With the bar off NumPyro 0.22
compiles its sampling loop on every ``run`` (``fori_collect`` jits a new
function each time); with the bar on it steps a loop it compiled once.
``--cache`` names a directory for JAX's persistent compilation cache, which
then serves that loop to the later fits; JAX stores no program that calls the
host, so with the run checks on (the default) the loop is compiled every fit
all the same: ``--checks-off`` runs the fits inside
``numpyro_sgbd.monitoring.off()`` (no warnings, no convergence check), the
pattern docs/usage.rst gives for simulation-based calibration.
``--json PATH`` writes every fit's numbers (tests/test_refits.py reads them).
"""

import argparse
import contextlib
import json
import time
import warnings

import jax
from jax import monitoring, random
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.diagnostics import effective_sample_size
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgbd import NOGIN, SGBD, SGLD, posterior_mode
from numpyro_sgbd.monitoring import off as monitoring_off

SAMPLERS = {"SGLD": SGLD, "SGBD": SGBD, "NOGIN": NOGIN}

_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


class CompiledPrograms:
    """Counts the programs XLA compiles while it is entered: JAX's backend
    compile events less its persistent cache's hits (a program the cache serves
    is loaded under the same event, in some 0.07 s). ``programs`` is that
    count, ``hits`` the programs loaded from the cache, ``seconds`` the backend
    compile seconds, hits included; ``clear()`` starts again. A jit whose
    program is in memory emits neither event."""

    def __init__(self):
        self.compiles, self.hits, self.seconds = 0, 0, 0.0

    @property
    def programs(self):
        return self.compiles - self.hits

    def clear(self):
        self.compiles, self.hits, self.seconds = 0, 0, 0.0

    def _duration(self, event, duration, **kwargs):
        if event == _COMPILE:
            self.compiles += 1
            self.seconds += duration

    def _event(self, event, **kwargs):
        if event == _CACHE_HIT:
            self.hits += 1

    def __enter__(self):
        monitoring.register_event_duration_secs_listener(self._duration)
        monitoring.register_event_listener(self._event)
        return self

    def __exit__(self, *exc):
        monitoring.unregister_event_duration_listener(self._duration)
        monitoring.unregister_event_listener(self._event)


def model(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def data_sets(num_fits, num_data=2000, dim=3):
    """``(X, y)`` per fit: the same covariates, new coefficients (N(0, 1), so
    that two fits' posteriors, some 0.06 wide, lie many sds apart) and labels."""
    X = random.normal(random.key(0), (num_data, dim))
    for fit in range(num_fits):
        w = random.normal(random.key(100 + fit), (dim,))
        p = jax.nn.sigmoid(X @ w)
        yield X, random.bernoulli(random.key(200 + fit), p).astype(jnp.float32)


def fits(cls, num_fits, same_mcmc=True, progress_bar=False, samples=(500, 2000)):
    """Fit ``cls(model)``'s default path to ``num_fits`` data sets: a dict per
    fit with its ``seconds``, the ``programs`` compiled in it, those ``loaded``
    from the persistent cache, their ``compile_seconds``, the posterior
    ``mean``, ``sd`` and ``ess`` of ``w``, and the full-data ``mode`` of its
    data (searched outside the timing and the counts)."""

    def fitted(X, y):  # a model of its own: nothing compiled for it yet
        return model(X, y)

    kernel, mcmc, rows = cls(fitted), None, []
    with CompiledPrograms() as compiled:
        for fit, (X, y) in enumerate(data_sets(num_fits)):
            mode = posterior_mode(model, X, y).params["w"]  # not the kernel's
            if mcmc is None or not same_mcmc:
                mcmc = MCMC(
                    kernel,
                    num_warmup=samples[0],
                    num_samples=samples[1],
                    progress_bar=progress_bar,
                    jit_model_args=True,
                )
                # NumPyro turns the bar off on CI and under pytest-xdist; a
                # user's is on, and the bar's loop is the one measured here.
                mcmc.progress_bar = progress_bar
            compiled.clear()
            start = time.perf_counter()
            mcmc.run(random.key(fit), X, y)
            draws = np.asarray(jax.block_until_ready(mcmc.get_samples())["w"])
            seconds = time.perf_counter() - start
            row = {
                "fit": fit,
                "seconds": seconds,
                "programs": compiled.programs,
                "loaded": compiled.hits,
                "compile_seconds": compiled.seconds,
                "mean": draws.mean(0).tolist(),
                "sd": draws.std(0).tolist(),
                "ess": np.asarray(effective_sample_size(draws[None])).tolist(),
                "mode": np.asarray(mode).tolist(),
            }
            rows.append(row)
            gap = np.abs(np.subtract(row["mean"], row["mode"]))
            mcse = np.divide(row["sd"], np.sqrt(row["ess"]))
            print(
                f"{cls.__name__} fit {fit}: {seconds:.2f} s, {compiled.programs} "
                f"programs compiled in {compiled.seconds:.2f} s, mean - mode "
                f"{np.max(gap / row['sd']):.2f} sd = {np.max(gap / mcse):.1f} MCSE",
                flush=True,
            )
    later = np.mean([r["seconds"] for r in rows[1:]])
    first = rows[0]["seconds"]
    print(
        f"{cls.__name__}: fits after the first {later:.2f} s / the first "
        f"{first:.2f} s = {later / first:.2f}; programs compiled per fit "
        f"{[r['programs'] for r in rows]}",
        flush=True,
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


def persistent_cache(directory):
    """Turn on JAX's persistent compilation cache in ``directory`` for every
    program, however small or quick to compile (before the first compile)."""
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pattern(args):
    """Turn on the persistent cache where ``args.cache`` names one; a context
    in which the fits run (without the run checks with ``args.checks_off``)."""
    if args.cache:
        persistent_cache(args.cache)
    return monitoring_off() if args.checks_off else contextlib.nullcontext()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--fits", type=int, default=5)
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument(
        "--new-mcmc", action="store_true", help="a new MCMC object for each fit"
    )
    parser.add_argument("--bar", action="store_true", help="NumPyro's progress bar")
    parser.add_argument("--json", help="write every fit's numbers to this file")
    add_pattern_options(parser)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # short runs: the convergence check speaks
    results = {}
    with pattern(args):
        for name in args.samplers:
            results[name] = fits(
                SAMPLERS[name],
                args.fits,
                same_mcmc=not args.new_mcmc,
                progress_bar=args.bar,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
