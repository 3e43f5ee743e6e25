"""NumPyro's kernel-generic MCMC contract, checked against our kernels.

The cases follow NumPyro's own ``test/infer/test_mcmc.py`` and ``test/test_pickle.py``
(the tests that any ``MCMCKernel`` should pass), rewritten for stochastic-gradient
kernels: the data sit in a subsample plate and each kernel gets a step on the
posterior's scale. Every case runs for every kernel in ``KERNELS``; a kernel added
to the package joins by adding its factory there.

Cases of NumPyro's file that cannot hold for stochastic-gradient kernels (step-size
and mass-matrix adaptation, divergences, the functional ``hmc()`` API, enumerated
discrete sites) are listed with the reason in the docs' "Differences from NUTS"
(``docs/usage.rst``), not here.
"""

from functools import partial
import itertools
import os
import pickle
import subprocess
import sys
import textwrap
import time

from _cases import one_kernel, some_cases
import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
from numpyro.infer.mcmc import MCMCKernel
from numpyro.infer.util import ParamInfo
import pytest

from numpyro_sgbd import (
    BAOAB,
    NOGIN,
    PSGLD,
    SGBD,
    SGHMC,
    SGLD,
    SGNHT,
    SGRLD,
    CyclicalSGLD,
    Recipe,
    monitoring,
    samplers,
)
from numpyro_sgbd.kernel import wall_time

# Kernel factories given the posterior sd ``sd`` of the model's coordinates (a
# scalar, or a dict by site): SGBD and SGLD step a fifth of it; NOGIN takes the
# precision as its mass, so that its step h = 0.5 is in sd units.


def _scaled(sd, factor):
    if isinstance(sd, dict):
        return {k: factor * v for k, v in sd.items()}
    return factor * sd


def _min_sd(sd):
    return min(sd.values()) if isinstance(sd, dict) else sd


def _min_inverse(sd):
    return 1.0 / _min_sd(sd)


def _precision(sd):
    if isinstance(sd, dict):
        return {k: v**-2 for k, v in sd.items()}
    return sd**-2


KERNELS = {
    "SGBD": lambda model=None, sd=1.0, **kw: SGBD(
        model, step_size=_scaled(sd, 0.2), **kw
    ),
    "SGLD": lambda model=None, sd=1.0, **kw: SGLD(
        model, step_size=_scaled(sd, 0.2), **kw
    ),
    # pSGLD scales the step by G = 1 / sqrt(E g^2), which the minibatch noise
    # holds at about a third of the sd on these models (E g^2 = N + N^2 / n):
    # a step of sqrt(sd) moves about half an sd. decay 0.99 lets G settle
    # within the short warmups here.
    "PSGLD": lambda model=None, sd=1.0, **kw: PSGLD(
        model, step_size=jax.tree.map(np.sqrt, sd), decay=0.99, **kw
    ),
    # Cyclical SGLD: SGLD's step at each cycle's start, a short cycle.
    "CyclicalSGLD": lambda model=None, sd=1.0, **kw: CyclicalSGLD(
        model, step_size=_scaled(sd, 0.3), cycle_length=50, **kw
    ),
    "NOGIN": lambda model=None, sd=1.0, **kw: NOGIN(
        model, step_size=0.5, mass=_precision(sd), covariance="full", **kw
    ),
    # Momentum samplers: mass = precision puts the step in sd units (0.2: the
    # explicit update's variance is 1.125 times the target's at friction 2 in
    # those units); SGNHT has unit mass, so its step is a fifth of the sd and its
    # thermostat starts at 1 / sd (friction 1 per unit of the posterior's time).
    "SGHMC": lambda model=None, sd=1.0, **kw: SGHMC(
        model,
        step_size=0.2,
        mass=_precision(sd),
        friction=_scaled(_precision(sd), 2.0),
        **kw,
    ),
    # BAOAB in the same units: its law of z is exact for a Gaussian at any
    # stable step, so the step can be longer than SGHMC's.
    "BAOAB": lambda model=None, sd=1.0, **kw: BAOAB(
        model,
        step_size=0.5,
        mass=_precision(sd),
        friction=_scaled(_precision(sd), 2.0),
        **kw,
    ),
    "SGNHT": lambda model=None, sd=1.0, **kw: SGNHT(
        model, step_size=0.2 * _min_sd(sd), diffusion=_min_inverse(sd), **kw
    ),
    # The recipe with D = I: SGLD with step sqrt(2 eps); SGRLD with the unit
    # metric is the same rule.
    "Recipe": lambda model=None, sd=1.0, **kw: Recipe(
        model, step_size=_min_sd(sd) ** 2 / 50, diffusion=jnp.ones_like, **kw
    ),
    "SGRLD": lambda model=None, sd=1.0, **kw: SGRLD(
        model,
        step_size=_min_sd(sd) ** 2 / 50,
        inverse_metric=partial(jax.tree.map, jnp.ones_like),
        **kw,
    ),
}
# Every sampler the package exports meets every case with -m slow
# (test_every_sampler_meets_the_contract keeps KERNELS complete; the eight
# before pSGLD on each case's default parameters were 301 runs, 18 minutes on 2
# cores). The
# default run gives each case one sampler, taking them all in turn down the
# file, so each meets about a ninth of the cases there (all of them on every case
# would add some 14 minutes to a 22-minute suite); they share the adapter the
# contract exercises.
_IN_TURN = sorted(KERNELS)
_turn = itertools.count()


def _one_in_turn(names):
    """Parametrize ``kernel_name`` over ``names``, all but one of them (the next
    of ``_IN_TURN`` that is in ``names``) marked slow."""

    def decorate(fn):
        while True:
            keep = _IN_TURN[next(_turn) % len(_IN_TURN)]
            if keep in names:
                return one_kernel(names, keep)(fn)

    return decorate


ALL_KERNELS = _one_in_turn(KERNELS)
EVERY_KERNEL = pytest.mark.parametrize("kernel_name", sorted(KERNELS))


def test_every_sampler_meets_the_contract():
    """Every sampler class the package exports is in KERNELS, so every case
    below runs it (with -m slow): a sampler added to the package joins here."""
    exported = {
        name
        for name in samplers.__all__
        if isinstance(getattr(samplers, name), type)
        and issubclass(getattr(samplers, name), MCMCKernel)
    }
    assert exported == set(KERNELS)


@pytest.fixture(autouse=True, scope="module")
def _fast_compile():
    """XLA's cheaper compile (``jax_disable_most_optimizations``) for this file: its
    cases check NumPyro's API over short runs, each compiling NumPyro's loop anew,
    and compiling is most of their time (21 test_chain* cases: 205 s, 158 s with
    it; test_kernels and test_adaptation, long statistical runs, gained 5 %). The
    numerics of the optimized programs are tested in the other files."""
    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", before)


N, SUBSAMPLE = 200, 20


def normal_model(y):
    """mu ~ N(0, 10), y ~ N(mu, 1) in a subsample plate: posterior sd 1/sqrt(N)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


MU_SD = 1 / np.sqrt(N)


@pytest.fixture(scope="module")
def y():
    return 1.0 + random.normal(random.key(0), (N,))


def _posterior_mu(y):
    precision = 1 / 100 + y.shape[0]
    return float(jnp.sum(y) / precision)


def _run(kernel, *args, num_warmup=50, num_samples=50, key=0, **kwargs):
    run_kwargs = {
        k: kwargs.pop(k) for k in ("init_params", "extra_fields") if k in kwargs
    }
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        progress_bar=kwargs.pop("progress_bar", False),
        **kwargs,
    )
    mcmc.run(random.key(key), *args, **run_kwargs)
    return mcmc


def _no_tracers(obj, depth=2):
    """Assert that nothing ``obj`` keeps (and, ``depth`` levels down, nothing the
    objects it keeps keep) is a JAX tracer."""
    leaves = jax.tree.leaves(
        {k: v for k, v in vars(obj).items() if not callable(v)},
        is_leaf=lambda x: isinstance(x, jax.core.Tracer),
    )
    leaked = [x for x in leaves if isinstance(x, jax.core.Tracer)]
    assert not leaked, leaked
    if depth:
        for x in leaves:
            if hasattr(x, "__dict__") and not isinstance(x, (type, jax.Array)):
                _no_tracers(x, depth - 1)


# --------------------------------------------------------------------- chains
@ALL_KERNELS
@some_cases(
    "chain_method, use_init_params",
    list(itertools.product(["parallel", "sequential", "vectorized"], [False, True])),
    keep=[("parallel", True), ("sequential", False), ("vectorized", True)],
)
def test_chain(kernel_name, use_init_params, chain_method):
    # NumPyro's test_chain: logistic regression, two chains, a deterministic site.
    num_data, dim, num_chains = 2000, 3, 2
    data = random.normal(random.key(0), (num_data, dim))
    true_coefs = jnp.arange(1.0, dim + 1.0)
    labels = dist.Bernoulli(logits=data @ true_coefs).sample(random.key(1))

    def model(labels):
        coefs = numpyro.sample("coefs", dist.Normal(jnp.zeros(dim), jnp.ones(dim)))
        numpyro.deterministic("norm", jnp.linalg.norm(coefs))
        with numpyro.plate("data", num_data, subsample_size=200) as idx:
            numpyro.sample(
                "obs", dist.Bernoulli(logits=data[idx] @ coefs), obs=labels[idx]
            )

    num_samples = 400
    init_params = {"coefs": jnp.ones((num_chains, dim))} if use_init_params else None
    mcmc = _run(
        KERNELS[kernel_name](model, sd=0.1),
        labels,
        num_warmup=600,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method=chain_method,
        init_params=init_params,
    )
    flat = mcmc.get_samples()
    assert flat["coefs"].shape == (num_chains * num_samples, dim)
    assert flat["norm"].shape == (num_chains * num_samples,)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["coefs"].shape == (num_chains, num_samples, dim)
    # NumPyro's own tolerance against the true coefficients (posterior sds ~0.1).
    np.testing.assert_allclose(flat["coefs"].mean(0), true_coefs, atol=0.35)
    jax.device_get(flat["coefs"].reshape(-1))
    _no_tracers(mcmc.sampler)


@ALL_KERNELS
@pytest.mark.parametrize("chain_method", ["sequential", "vectorized"])
def test_chain_inside_jit(y, kernel_name, chain_method):
    # NumPyro's test_chain_inside_jit and test_mcmc_inside_jit_no_tracer_leak: the
    # kernel built and run inside jit; nothing traced leaks into caches.
    @jax.jit
    def get_samples(rng_key, y):
        mcmc = MCMC(
            KERNELS[kernel_name](normal_model, sd=MU_SD),
            num_warmup=100,
            num_samples=200,
            num_chains=2,
            chain_method=chain_method,
            progress_bar=False,
        )
        mcmc.run(rng_key, y)
        return mcmc.get_samples()

    samples = get_samples(random.key(2), y)
    assert samples["mu"].shape == (400,)
    assert abs(float(samples["mu"].mean()) - _posterior_mu(y)) < 6 * MU_SD
    from numpyro.infer.mcmc import _collect_and_postprocess
    from numpyro.util import fori_collect

    for cached in (_collect_and_postprocess, fori_collect):
        cache = getattr(cached, "_cache", {})
        for leaf in jax.tree.leaves(list(cache.keys()) + list(cache.values())):
            assert not isinstance(leaf, jax.core.Tracer)


@ALL_KERNELS
def test_kernel_built_outside_jit_runs_inside_it_and_again_outside(y, kernel_name):
    # With control variates around a given centre the kernel keeps the full-data
    # gradient there; computed inside jit it is a tracer, which a later resume
    # outside jit must not use.
    kernel = KERNELS[kernel_name](
        normal_model, sd=MU_SD, gradient="control_variates", centre={"mu": 1.0}
    )
    outside = _run(kernel, y, key=3, num_samples=100)

    @jax.jit
    def draws(rng_key, y):
        mcmc = MCMC(kernel, num_warmup=50, num_samples=100, progress_bar=False)
        mcmc.run(rng_key, y)
        return mcmc.get_samples()["mu"]

    inside = draws(random.key(3), y)
    np.testing.assert_allclose(outside.get_samples()["mu"], inside, rtol=1e-5)
    # Resume outside jit in a new MCMC (so NumPyro traces the step anew).
    resumed = MCMC(kernel, num_warmup=50, num_samples=60, progress_bar=False)
    resumed.post_warmup_state = outside.last_state
    resumed.run(outside.last_state.rng_key, y)
    assert resumed.get_samples()["mu"].shape == (60,)
    _no_tracers(kernel)


@ALL_KERNELS
@some_cases(
    "jit_model_args, chain_method",
    list(itertools.product([False, True], ["sequential", "parallel", "vectorized"])),
    keep=[(False, "sequential"), (True, "parallel"), (True, "vectorized")],
)
def test_chain_jit_args_smoke(y, kernel_name, chain_method, jit_model_args):
    # NumPyro's test_chain_jit_args_smoke: warmup, run, then run on new data.
    y2 = y[::-1] - 2.0
    mcmc = MCMC(
        KERNELS[kernel_name](normal_model, sd=MU_SD),
        num_warmup=2,
        num_samples=5,
        num_chains=2,
        chain_method=chain_method,
        jit_model_args=jit_model_args,
        progress_bar=False,
    )
    mcmc.warmup(random.key(0), y)
    mcmc.run(random.key(1), y)
    mcmc.run(random.key(2), y2)
    assert mcmc.get_samples(group_by_chain=True)["mu"].shape == (2, 5)
    _no_tracers(mcmc.sampler)


# -------------------------------------------------- parallel chains end to end
@ALL_KERNELS
@some_cases("jit_model_args", [(False,), (True,)], keep=[(True,)])
def test_parallel_chains_end_to_end(y, kernel_name, jit_model_args):
    """The issue's reproducer: parallel chains, then ArviZ, a second run, a resume
    and compare, with nothing the kernel keeps being a tracer."""
    import arviz as az

    from numpyro_sgbd import compare

    assert jax.device_count() >= 2  # conftest simulates two CPU devices
    mcmc = _run(
        KERNELS[kernel_name](normal_model, sd=MU_SD),
        y,
        num_warmup=100,
        num_samples=300,
        num_chains=2,
        chain_method="parallel",
        jit_model_args=jit_model_args,
    )
    _no_tracers(mcmc.sampler)
    idata = az.from_numpyro(mcmc)
    assert idata.posterior["mu"].shape == (2, 300)
    mcmc.run(random.key(1), y)
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, y)
    az.from_numpyro(mcmc)
    # Exact posterior: y's conjugate normal; 4000 draws of it as the reference.
    mean = _posterior_mu(y)
    ref = {"mu": mean + MU_SD * random.normal(random.key(9), (4000,))}
    table = compare({"run": mcmc}, ref)
    assert np.isfinite(table.summary.loc["run", "max_bias_mean"])
    _no_tracers(mcmc.sampler)


@ALL_KERNELS
def test_parallel_control_variates_end_to_end(y, kernel_name):
    mcmc = _run(
        KERNELS[kernel_name](normal_model, sd=MU_SD, gradient="control_variates"),
        y,
        num_warmup=50,
        num_samples=100,
        num_chains=2,
        chain_method="parallel",
    )
    _no_tracers(mcmc.sampler)
    assert mcmc.sampler.centre_info["source"] == "Newton-CG"
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, y)
    assert mcmc.get_samples(group_by_chain=True)["mu"].shape == (2, 100)


# ------------------------------------------------- step_size=None (adapted)
ADAPTED = {"SGBD": SGBD, "SGLD": SGLD, "NOGIN": NOGIN, "SGHMC": SGHMC, "SGNHT": SGNHT}
ADAPTED_KERNELS = _one_in_turn(ADAPTED)


@ADAPTED_KERNELS
@pytest.mark.parametrize("chain_method", ["parallel", "vectorized"])
def test_adapted_chains_end_to_end(y, kernel_name, chain_method):
    """No step size: each chain adapts its own step, fixed after warmup; ArviZ; a
    second run on the same data reuses the mode and L; a resume keeps the step;
    nothing the kernel keeps is a tracer; the answer is the conjugate posterior."""
    import arviz as az

    mcmc = _run(
        ADAPTED[kernel_name](normal_model),
        y,
        num_warmup=100,
        num_samples=300,
        num_chains=2,
        chain_method=chain_method,
        extra_fields=("step_size",),
    )
    _no_tracers(mcmc.sampler)
    steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["step_size"])
    assert steps.shape == (2, 300) and np.all(steps == steps[:, :1])
    assert az.from_numpyro(mcmc).posterior["mu"].shape == (2, 300)
    info = mcmc.sampler.adaptation_info
    mcmc.run(random.key(1), y)
    assert mcmc.sampler.adaptation_info is info  # same data: no second search
    last = np.asarray(mcmc.last_state.step_size)
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, y, extra_fields=("step_size",))
    again = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["step_size"])
    np.testing.assert_array_equal(again, np.broadcast_to(last[:, None], again.shape))
    _no_tracers(mcmc.sampler)
    # 600 draws in all, whitened: the mean's Monte Carlo error is well under a
    # posterior sd; 0.5 sd allows an ESS down to about 20.
    mu = np.asarray(mcmc.get_samples()["mu"])
    assert abs(mu.mean() - _posterior_mu(y)) < 0.5 * MU_SD


@ADAPTED_KERNELS
@some_cases(
    "jit_model_args, size",
    [(False, 50), (True, 50), (True, 100)],
    keep=[(True, 50), (True, 100)],
)
def test_adapted_reuse_mcmc_run(kernel_name, jit_model_args, size):
    # NumPyro's test_reuse_mcmc_run as NumPyro wrote it, with no init_params:
    # step_size=None finds each data set's mode and scale, as NUTS's warmup does.
    # With y2 of y1's shape and jit_model_args=True, NumPyro reuses the loop it
    # compiled for y1 (the data are its arguments): the kernel's step, traced
    # with y1's centre, returned y1's posterior until a changed set-up made the
    # loop trace again (issue 45).
    y1 = np.random.default_rng(0).normal(3, 0.1, (100,))
    y2 = np.random.default_rng(1).normal(-3, 0.1, (size,))

    def model(y_obs):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(3.0))
        with numpyro.plate("data", y_obs.shape[0], subsample_size=25) as idx:
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y_obs[idx])

    mcmc = MCMC(
        ADAPTED[kernel_name](model),
        num_warmup=300,
        num_samples=500,
        jit_model_args=jit_model_args,
        progress_bar=False,
    )
    mcmc.run(random.key(32), y1)
    assert abs(float(mcmc.get_samples()["mu"].mean()) - 3.0) < 0.1
    mcmc.run(random.key(32), y2)
    assert abs(float(mcmc.get_samples()["mu"].mean()) + 3.0) < 0.1


# ------------------------------------------------------------ runs and re-runs
@ALL_KERNELS
@some_cases(
    "jit_model_args, shape",
    list(itertools.product([False, True], [50, 100])),
    keep=[(False, 50), (True, 100)],
)
def test_reuse_mcmc_run(kernel_name, jit_model_args, shape):
    # NumPyro's test_reuse_mcmc_run: run, then run again on new data of another
    # size; the second answer is the new data's. Both posteriors have sds of
    # about 0.01 (mu) and 0.07 (log sigma); the steps are set for that scale.
    y1 = np.random.default_rng(0).normal(3, 0.1, (100,))
    y2 = np.random.default_rng(1).normal(-3, 0.1, (shape,))

    def model(y_obs):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(3.0))
        with numpyro.plate("data", y_obs.shape[0], subsample_size=25) as idx:
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y_obs[idx])

    sd = {"mu": 0.012, "sigma": 0.08}
    kernel = KERNELS[kernel_name](model, sd=sd)
    # Start at the data's summaries, as warmup's mode search will (NumPyro's test
    # relies on NUTS's adaptation for this).
    init = {"mu": jnp.mean(y1), "sigma": jnp.log(jnp.std(y1))}
    mcmc = MCMC(
        kernel,
        num_warmup=300,
        num_samples=500,
        jit_model_args=jit_model_args,
        progress_bar=False,
    )
    mcmc.run(random.key(32), y1, init_params=init)
    assert abs(float(mcmc.get_samples()["mu"].mean()) - 3.0) < 0.1
    init = {"mu": jnp.mean(y2), "sigma": jnp.log(jnp.std(y2))}
    mcmc.run(random.key(32), y2, init_params=init)
    assert abs(float(mcmc.get_samples()["mu"].mean()) + 3.0) < 0.1


@ALL_KERNELS
@some_cases("jit_model_args", [(False,), (True,)], keep=[(False,)])
def test_model_with_multiple_exec_paths(kernel_name, jit_model_args):
    # NumPyro's test: the latent sites change with the arguments between runs.
    rng = np.random.default_rng(0)
    a, b = np.exp(rng.normal(size=40)), np.exp(rng.normal(size=40))
    z = rng.normal(size=40)

    # Unlike NumPyro's version, the data sit in a subsample plate and the global
    # sites outside it.
    def model(a=None, b=None, z=None):
        mu = numpyro.sample("a", dist.Normal(0.0, 0.2))
        x = numpyro.sample("x", dist.HalfNormal(0.5)) if a is not None else None
        y = numpyro.sample("y", dist.HalfNormal(0.5)) if b is not None else None
        sigma = numpyro.sample("sigma", dist.Exponential(1.0))
        with numpyro.plate("data", 40, subsample_size=10) as idx:
            loc = mu
            if x is not None:
                loc = loc + a[idx] * x
            if y is not None:
                loc = loc + b[idx] * y
            numpyro.sample("obs", dist.Normal(loc, sigma), obs=z[idx])

    mcmc = MCMC(
        KERNELS[kernel_name](model, sd=0.1),
        num_warmup=20,
        num_samples=10,
        jit_model_args=jit_model_args,
        progress_bar=False,
    )
    mcmc.run(random.key(1), a, b=None, z=z)
    assert set(mcmc.get_samples()) == {"a", "x", "sigma"}
    mcmc.run(random.key(2), a=None, b=b, z=z)
    assert set(mcmc.get_samples()) == {"a", "y", "sigma"}
    mcmc.run(random.key(3), a=a, b=b, z=z)
    assert set(mcmc.get_samples()) == {"a", "x", "y", "sigma"}


@ALL_KERNELS
@some_cases(
    "num_chains, chain_method",
    [(1, "sequential"), (2, "sequential"), (2, "vectorized"), (2, "parallel")],
    keep=[(1, "sequential"), (2, "vectorized")],
)
def test_compile_warmup_run(y, kernel_name, num_chains, chain_method):
    # NumPyro's test_compile_warmup_run: _compile, then warmup and run, equals one
    # run; chain 0 of two equals one chain run from the first split key.
    kernel = KERNELS[kernel_name](normal_model, sd=MU_SD)
    mcmc = MCMC(
        kernel,
        num_warmup=10,
        num_samples=10,
        num_chains=num_chains,
        chain_method=chain_method,
        progress_bar=False,
    )
    rng_key = random.key(0)
    mcmc.run(rng_key, y)
    expected = mcmc.get_samples()["mu"]
    mcmc._compile(rng_key, y)
    mcmc.warmup(rng_key, y)
    mcmc.run(mcmc.last_state.rng_key, y)
    np.testing.assert_allclose(mcmc.get_samples()["mu"], expected, rtol=1e-6)
    if num_chains > 1:
        single = MCMC(
            KERNELS[kernel_name](normal_model, sd=MU_SD),
            num_warmup=10,
            num_samples=10,
            progress_bar=False,
        )
        single.run(random.split(rng_key)[0], y)
        np.testing.assert_allclose(
            expected[:10], single.get_samples()["mu"], rtol=1e-5, atol=1e-6
        )


def _with_bar(mcmc, bar):
    """``mcmc`` with its progress bar ``bar``: NumPyro switches the bar off
    under pytest-xdist and on CI (``MCMC.__init__``); a user's run has it."""
    mcmc.progress_bar = bar
    return mcmc


class _SlowClock:
    """A clock on which every reading is a second after the last: a step timed
    on it looks a thousand times slower than any real one."""

    def __init__(self):
        self.now = time.perf_counter()

    def __call__(self):
        self.now += 1.0
        return self.now


@pytest.mark.parametrize("kernel_name", ["SGBD", "NOGIN"])
def test_a_run_is_a_function_of_its_seed_with_the_bar_on_or_off(
    y, kernel_name, monkeypatch
):
    # The default kernels (adapted, with their set-up): the same draws with the
    # progress bar on, off, and on a clock made slow; nothing in the chain
    # reads the clock, so the machine's speed and load cannot change them.
    cls = {"SGBD": SGBD, "NOGIN": NOGIN}[kernel_name]

    def draws(bar):
        mcmc = _with_bar(MCMC(cls(normal_model), num_warmup=20, num_samples=10), bar)
        mcmc.run(random.key(1), y, extra_fields=("i",))
        assert mcmc.sampler.num_steps == 1
        np.testing.assert_array_equal(
            mcmc.get_extra_fields()["i"], 20 + np.arange(1, 11)
        )
        return np.asarray(mcmc.get_samples()["mu"])

    off, on = draws(False), draws(True)
    np.testing.assert_array_equal(on, off)
    for name in ("perf_counter", "monotonic", "time"):
        monkeypatch.setattr(time, name, _SlowClock())
    np.testing.assert_array_equal(draws(True), off)


def test_a_given_num_steps_is_kept_with_the_bar_on_or_off(y):
    runs = {}
    for bar in (True, False):
        kernel = KERNELS["SGBD"](normal_model, sd=MU_SD, num_steps=3)
        mcmc = _with_bar(MCMC(kernel, num_warmup=10, num_samples=10), bar)
        mcmc.run(random.key(2), y)
        assert kernel.num_steps == 3
        runs[bar] = mcmc.get_samples()["mu"]
    np.testing.assert_array_equal(runs[True], runs[False])


@pytest.mark.parametrize("kernel_name", ["NOGIN", "SGBD", "adapted SGBD"])
def test_num_steps_runs_the_thinned_chain_inside_one_sample(y, kernel_name):
    # num_steps=k: each sample is k steps, warmup included: the same chain as
    # one step per sample with k times the warmup, every k-th draw kept.
    k = 5

    def make(**kw):
        if kernel_name == "adapted SGBD":  # the schedule of warmup adaptation
            return SGBD(normal_model, **kw)
        return KERNELS[kernel_name](normal_model, sd=MU_SD, **kw)

    fields = ("i", "potential_energy_estimate")
    # 40 warmup samples: 200 steps, enough for adapt_mass_matrix's windows.
    warmup = 40
    inner = MCMC(
        make(num_steps=k), num_warmup=warmup, num_samples=8, progress_bar=False
    )
    with monitoring.per_step():  # the live notes: wall_time's clock, bar off
        inner.run(random.key(1), y, extra_fields=fields)
    outer = MCMC(make(), num_warmup=warmup * k, num_samples=8 * k, progress_bar=False)
    outer.run(random.key(1), y, extra_fields=fields)
    np.testing.assert_allclose(
        inner.get_samples()["mu"], outer.get_samples()["mu"][k - 1 :: k], rtol=1e-5
    )
    extra, every = inner.get_extra_fields(), outer.get_extra_fields()
    np.testing.assert_array_equal(extra["i"], warmup * k + k * np.arange(1, 9))
    np.testing.assert_allclose(
        extra["potential_energy_estimate"],
        every["potential_energy_estimate"][k - 1 :: k],
        rtol=1e-5,
    )
    assert wall_time(inner.sampler, inner) is not None


def test_num_steps_notes_the_host_every_16_samples_at_most(y):
    # Each host note (wall_time's clock, the stationarity check's thinned draws)
    # of monitoring.per_step() is a callback; with the progress bar each waits
    # for NumPyro's Python loop. At num_steps=k > 16 sampling notes come every
    # 16k steps (and at powers of two of the sampling steps), not every 256;
    # warmup's at powers of two only.
    k = 20
    kernel = KERNELS["SGBD"](normal_model, sd=MU_SD, num_steps=k)
    mcmc = MCMC(kernel, num_warmup=4, num_samples=60, progress_bar=False)
    with monitoring.per_step():
        mcmc.run(random.key(2), y)
    noted = [i for i, _ in kernel.monitor.clock if i is not None]
    warmup = [20, 40, 80]  # crossing 1-16, 32, 64
    t_end = k * np.arange(1, 61)
    t_start = t_end - k
    due = (t_end // (16 * k) != t_start // (16 * k)) | ((t_end ^ t_start) > t_start)
    assert noted == warmup + list(80 + t_end[due])
    # 320, 640, 960; crossing 1-16, 32, 64, 128, 256, 512, 1024
    assert len(noted) == 3 + 3 + 7


def test_sampling_notes_thin_out_as_the_run_grows(y):
    # The spacing of the sampling notes doubles with each doubling of the run
    # past 32 spacings, so a long run calls the host some 16 times per doubling,
    # and the stationarity check keeps 16 to 32 evenly spaced draws (under
    # monitoring.per_step(); by default the check after the run replays it).
    kernel = KERNELS["SGBD"](normal_model, sd=MU_SD)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=20_000, progress_bar=False)
    with monitoring.per_step():
        mcmc.run(random.key(2), y)
    noted = [i for i, _ in kernel.monitor.clock if i is not None]
    t = np.arange(1, 20_001)
    spacing = np.select([t < 8192, t < 16384], [256, 512], 1024)
    due = (t % spacing == 0) | ((t & (t - 1)) == 0)
    assert noted == [1, 2, 4, 8] + list(10 + t[due])
    kept = [t for t, _ in kernel.monitor.drift_points]
    assert kept == list(range(1024, 20_001, 1024))
    assert kernel.monitor.drift_points[-1][1].shape == (1, 1)


def test_num_steps_must_be_a_positive_int():
    for bad in (0, -1, 2.5, True, "5"):
        with pytest.raises(ValueError, match="num_steps must be a positive int"):
            SGBD(normal_model, num_steps=bad)


# ------------------------------------------------------- fields and sites
@EVERY_KERNEL
def test_extra_fields(y, kernel_name):
    kernel = KERNELS[kernel_name](normal_model, sd=MU_SD)
    mcmc = _run(
        kernel,
        y,
        num_samples=40,
        extra_fields=("i", "num_nonfinite", "z.mu"),
    )
    extra = mcmc.get_extra_fields(group_by_chain=True)
    assert extra["i"].shape == (1, 40)
    np.testing.assert_array_equal(extra["i"][0], np.arange(51, 91))
    for name in kernel.default_fields[1:]:
        assert extra[name].shape == (1, 40)
    # Unconstrained draws of an unconstrained site are the draws.
    np.testing.assert_allclose(extra["z.mu"][0], mcmc.get_samples()["mu"])


@ALL_KERNELS
def test_unconstrained_draws_as_extra_fields(kernel_name):
    # NumPyro's test_extra_fields_include_unconstrained_samples.
    def model(y):
        x = numpyro.sample("x", dist.HalfNormal(1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
            numpyro.sample("y", dist.Normal(0.0, x), obs=y[idx])

    y = random.normal(random.key(4), (100,))
    mcmc = _run(KERNELS[kernel_name](model, sd=0.07), y, extra_fields=("z.x",))
    np.testing.assert_allclose(
        mcmc.get_samples()["x"], jnp.exp(mcmc.get_extra_fields()["z.x"]), rtol=1e-5
    )


@ALL_KERNELS
@pytest.mark.parametrize("remove_sites", [("~z.a", "~z.b"), ("~z.a", "~z.a")])
def test_remove_sites(kernel_name, remove_sites):
    def model(y):
        a = numpyro.sample("a", dist.Normal())
        b = numpyro.sample("b", dist.Normal())
        with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
            numpyro.sample("y", dist.Normal(a + b, 1.0), obs=y[idx])

    y = random.normal(random.key(5), (100,))
    mcmc = _run(KERNELS[kernel_name](model, sd=0.1), y, extra_fields=remove_sites)
    samples = mcmc.get_samples()
    assert all(site[3:] not in samples for site in remove_sites)
    assert set(samples) | {s[3:] for s in remove_sites} == {"a", "b"}


@ALL_KERNELS
def test_prior_with_sample_shape(kernel_name):
    # NumPyro's eight-schools case, theta drawn with sample_shape=(J,); its data
    # in a subsample plate of the schools.
    y_obs = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

    def schools_model():
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfCauchy(5))
        theta = numpyro.sample("theta", dist.Normal(mu, tau), sample_shape=(8,))
        with numpyro.plate("schools", 8, subsample_size=4) as idx:
            numpyro.sample("obs", dist.Normal(theta[idx], sigma[idx]), obs=y_obs[idx])

    mcmc = _run(KERNELS[kernel_name](schools_model, sd=1.0), num_samples=30)
    assert mcmc.get_samples()["theta"].shape == (30, 8)


@ALL_KERNELS
def test_vectorized_sampling_zero_sized(kernel_name):
    # NumPyro's test: a latent site of size zero (sample_shape (0,)), vectorized
    # chains; here the scores are observed through a subsample plate.
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    y_obs = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])

    def eight_schools(J, sigma, y_obs):
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfCauchy(5))
        with numpyro.plate("J", J):
            theta = numpyro.sample("theta", dist.Normal(mu, tau))
            numpyro.sample("scores", dist.Normal(theta, sigma), sample_shape=(0,))
        with numpyro.plate("schools", J, subsample_size=4) as idx:
            numpyro.sample("obs", dist.Normal(theta[idx], sigma[idx]), obs=y_obs[idx])

    mcmc = _run(
        KERNELS[kernel_name](eight_schools, sd=1.0),
        8,
        sigma,
        y_obs,
        num_chains=2,
        chain_method="vectorized",
        num_samples=10,
    )
    samples = mcmc.get_samples()
    assert samples["scores"].shape == (20, 0, 8)
    assert samples["theta"].shape == (20, 8)


@ALL_KERNELS
def test_improper_prior(kernel_name):
    # NumPyro's test_improper_prior: a masked prior and an ImproperUniform site.
    def model(data):
        mean = numpyro.sample("mean", dist.Normal(0, 1).mask(False))
        std = numpyro.sample(
            "std", dist.ImproperUniform(dist.constraints.positive, (), ())
        )
        with numpyro.plate("data", data.shape[0], subsample_size=200) as idx:
            numpyro.sample("obs", dist.Normal(mean, std), obs=data[idx])

    data = dist.Normal(1.0, 2.0).sample(random.key(1), (2000,))
    sd = {"mean": 2 / np.sqrt(2000), "std": 1 / np.sqrt(4000)}
    init = {"mean": jnp.mean(data), "std": jnp.log(jnp.std(data))}
    mcmc = _run(
        KERNELS[kernel_name](model, sd=sd),
        data,
        num_warmup=200,
        num_samples=2000,
        init_params=init,
    )
    samples = mcmc.get_samples()
    # NumPyro's tolerance: 5 % of the truth (mean 1, std 2); posterior sds 0.045
    # and 0.03.
    np.testing.assert_allclose(samples["mean"].mean(), 1.0, rtol=0.1)
    np.testing.assert_allclose(samples["std"].mean(), 2.0, rtol=0.05)


@ALL_KERNELS
def test_beta_bernoulli(kernel_name):
    # NumPyro's beta-Bernoulli: two probabilities on (0, 1); conjugate posterior.
    data = dist.Bernoulli(jnp.array([0.9, 0.1])).sample(random.key(1), (1000,))

    def model(data):
        p = numpyro.sample("p_latent", dist.Beta(1.1, 1.1).expand([2]).to_event(1))
        with numpyro.plate("data", data.shape[0], subsample_size=100) as idx:
            numpyro.sample("obs", dist.Bernoulli(p).to_event(1), obs=data[idx])

    # logit p has posterior sd 1/sqrt(N p (1 - p)) = 0.105 at p = 0.9.
    mcmc = _run(
        KERNELS[kernel_name](model, sd=0.105),
        data,
        num_warmup=500,
        num_samples=3000,
        num_chains=2,
        chain_method="vectorized",
    )
    post_mean = (1.1 + data.sum(0)) / (2.2 + data.shape[0])
    draws = mcmc.get_samples()["p_latent"]
    assert np.all((draws > 0) & (draws < 1))
    # Posterior sd of p is 0.0095: within 4 sd (SG bias and MCSE included).
    np.testing.assert_allclose(draws.mean(0), post_mean, atol=0.035)


@ALL_KERNELS
def test_dirichlet_categorical(kernel_name):
    # NumPyro's Dirichlet-categorical: a simplex site, its draws on the simplex.
    true_probs = jnp.array([0.1, 0.6, 0.3])
    data = dist.Categorical(true_probs).sample(random.key(1), (2000,))

    def model(data):
        p = numpyro.sample("p_latent", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("data", data.shape[0], subsample_size=200) as idx:
            numpyro.sample("obs", dist.Categorical(p), obs=data[idx])

    mcmc = _run(
        KERNELS[kernel_name](model, sd=0.05),
        data,
        num_warmup=500,
        num_samples=2000,
    )
    draws = mcmc.get_samples()["p_latent"]
    np.testing.assert_allclose(draws.sum(-1), 1.0, rtol=1e-5)
    counts = np.bincount(np.asarray(data), minlength=3)
    np.testing.assert_allclose(draws.mean(0), (1 + counts) / (3 + 2000), atol=0.03)


@pytest.mark.parametrize("kernel_name", ["NOGIN", "SGBD", "SGLD"])
@pytest.mark.parametrize("num_chains", [1, 2])
def test_potential_fn_with_init_params(kernel_name, num_chains):
    # NumPyro's test_unnormalized_normal: a potential function, init_params with a
    # leading chain dimension when there are several chains. (The recipe's
    # samplers run potential_fn and gradient_fn in their doctests and in
    # test_samplers.py, against their exact laws.)
    true_mean, true_std = 1.0, 2.0

    def potential_fn(z):
        return 0.5 * jnp.sum(((z - true_mean) / true_std) ** 2)

    init = jnp.zeros((num_chains,)) if num_chains > 1 else jnp.array(0.0)
    kernel_cls = {"SGBD": SGBD, "SGLD": SGLD, "NOGIN": NOGIN}[kernel_name]
    step = 1.0 if kernel_cls is NOGIN else 0.8
    mcmc = MCMC(
        kernel_cls(potential_fn=potential_fn, step_size=step),
        num_warmup=200,
        num_samples=4000,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(random.key(0), init_params=init)
    draws = mcmc.get_samples()
    assert draws.shape == (4000 * num_chains,)
    # Unadjusted dynamics: within 15 % (SGLD's variance inflation at this step is
    # 1 / (1 - 0.16 / 16) ~ 1 %).
    np.testing.assert_allclose(draws.mean(), true_mean, atol=0.3)
    np.testing.assert_allclose(draws.std(), true_std, rtol=0.15)


@ALL_KERNELS
def test_init_params_for_constrained_sites(y, kernel_name):
    # init_params are unconstrained values (as for NUTS), a dict or NumPyro's
    # ParamInfo(z, potential_energy, z_grad), for every chain.
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        s = numpyro.sample("s", dist.LogNormal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
            numpyro.sample("y", dist.Normal(mu, s), obs=y[idx])

    z = {"mu": jnp.array([1.0, 1.1]), "s": jnp.array([0.0, 0.1])}
    for init in (z, ParamInfo(z, None, None)):
        mcmc = MCMC(
            KERNELS[kernel_name](model, sd=0.07),
            num_warmup=0,
            num_samples=1,
            num_chains=2,
            chain_method="vectorized",
            progress_bar=False,
        )
        mcmc.run(random.key(0), y, init_params=init, extra_fields=("z.s",))
        # One step of size ~0.2 sd from the given start.
        s = mcmc.get_extra_fields(group_by_chain=True)["z.s"][:, 0]
        np.testing.assert_allclose(s, z["s"], atol=0.1)


@ALL_KERNELS
def test_loose_warning_for_missing_plate(kernel_name):
    # NumPyro's own check of the model's plates runs as under NUTS.
    def model(y):
        x = numpyro.sample("x", dist.Normal(0, 1))
        with numpyro.plate("N", 10, subsample_size=5) as idx:
            numpyro.sample("obs", dist.Normal(x, 1), obs=y[:, idx])

    with pytest.warns(UserWarning, match="Missing a plate statement"):
        _run(
            KERNELS[kernel_name](model), jnp.ones((5, 10)), num_warmup=2, num_samples=2
        )


# ------------------------------------------------------- no latent sites
@ALL_KERNELS
@pytest.mark.parametrize(
    "num_chains, chain_method",
    [(1, "sequential"), (2, "sequential"), (2, "vectorized"), (2, "parallel")],
)
def test_empty_model(kernel_name, num_chains, chain_method):
    # NumPyro's test_empty_model and test_all_deterministic: nothing to sample.
    def model():
        numpyro.deterministic("x", jnp.array([1.0, 2.0]))

    with pytest.warns(UserWarning, match="no subsampled plate"):
        mcmc = _run(
            KERNELS[kernel_name](model),
            num_warmup=5,
            num_samples=10,
            num_chains=num_chains,
            chain_method=chain_method,
        )
    samples = mcmc.get_samples()
    assert samples["x"].shape == (10 * num_chains, 2)
    mcmc.print_summary()


# ---------------------------------------------------------------- pickling
@EVERY_KERNEL
def test_pickle_mcmc_and_resume(y, kernel_name):
    # NumPyro's test_pickle_hmc and test_mcmc_pickle_post_warmup.
    mcmc = _run(KERNELS[kernel_name](normal_model, sd=MU_SD), y)
    restored = pickle.loads(pickle.dumps(mcmc))
    np.testing.assert_array_equal(
        restored.get_samples()["mu"], mcmc.get_samples()["mu"]
    )
    restored.post_warmup_state = restored.last_state
    restored.run(random.key(1), y)
    assert restored.get_samples()["mu"].shape == (50,)


_BINARY = random.choice(random.PRNGKey(0), jnp.array([0, 1]), (10,))


def logistic_regression():
    x = numpyro.sample("x", dist.Normal(0, 1))
    with numpyro.plate("N", 10, subsample_size=2):
        batch = numpyro.subsample(_BINARY, 0)
        numpyro.sample("obs", dist.Bernoulli(logits=x), obs=batch)


@EVERY_KERNEL
def test_pickle_with_subsample_statement(kernel_name):
    # NumPyro's test_pickle_hmcecs model: numpyro.subsample inside the plate, the
    # data closed over, a legacy uint32 PRNGKey.
    mcmc = MCMC(
        KERNELS[kernel_name](logistic_regression, sd=0.6),
        num_warmup=10,
        num_samples=10,
        progress_bar=False,
    )
    mcmc.run(random.PRNGKey(0))
    restored = pickle.loads(pickle.dumps(mcmc))
    np.testing.assert_array_equal(restored.get_samples()["x"], mcmc.get_samples()["x"])


def test_parallel_reproducer_in_a_fresh_process(tmp_path):
    """The issue's reproducer as a user runs it: numpyro.set_host_device_count(2)
    before JAX starts, parallel chains, then az.from_numpyro."""
    script = textwrap.dedent(
        """
        import numpyro
        numpyro.set_host_device_count(2)
        import arviz as az, jax, numpyro.distributions as dist
        from numpyro.infer import MCMC
        from numpyro_sgbd import SGBD

        def model(y):
            mu = numpyro.sample("mu", dist.Normal(0, 10))
            with numpyro.plate("data", y.shape[0], subsample_size=50) as idx:
                numpyro.sample("y", dist.Normal(mu, 1), obs=y[idx])

        y = 3.0 + jax.random.normal(jax.random.key(1), (2000,))
        mcmc = MCMC(SGBD(model, step_size=0.01), num_warmup=100, num_samples=200,
                    num_chains=2, chain_method="parallel", progress_bar=False)
        mcmc.run(jax.random.key(0), y)
        az.from_numpyro(mcmc)
        mcmc.run(jax.random.key(1), y)
        print("ok", jax.device_count())
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["ok", "2"]
