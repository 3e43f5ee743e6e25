"""Neural networks from ``numpyro.contrib.module`` as models (issue 62): a Flax
linen, a Flax NNX and an Equinox network whose parameters are the model's
latent sites, with the data in a subsample plate, run under every kernel's
default path, and their draws predict through the same model code.

A network's default set-up is Adam's MAP fit and a diagonal L from the Fisher
information there (:mod:`numpyro_sgbd.mode.network`), checked here against a
regression whose curvature is known. On a network small enough for NUTS, the
default path's predictive is compared with NUTS's within its Monte Carlo error
(slow): NOGIN's chains agree; SGLD's, SGBD's and SGHMC's do not yet mix
(strict xfails), which ``NetworkWarning`` says.
"""

from functools import partial
import warnings

import arviz as az
import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.contrib.module import (
    random_eqx_module,
    random_flax_module,
    random_nnx_module,
)
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS, Predictive, log_likelihood
import pytest

from numpyro_sgbd import NOGIN, SGBD, SGHMC, SGLD, check
from numpyro_sgbd.mode import full_data_objective
from numpyro_sgbd.mode.network import fit_network, network_start
from numpyro_sgbd.monitoring import ConvergenceWarning
from numpyro_sgbd.monitoring.predictive import PROBE_ROWS
from numpyro_sgbd.prepare import NetworkWarning, trace_model

eqx = pytest.importorskip("equinox")
linen = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")

WIDTH = 4  # 2 inputs, 4 tanh units, 1 output: 17 weights
N, N_TEST = 1000, 8
NOISE = 0.3


class LinenMLP(linen.Module):
    @linen.compact
    def __call__(self, x):
        return linen.Dense(1)(jnp.tanh(linen.Dense(WIDTH)(x)))[..., 0]


class NNXMLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(2, WIDTH, rngs=rngs)
        self.out = nnx.Linear(WIDTH, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x)))[..., 0]


def _linen(prior):
    return random_flax_module("net", LinenMLP(), prior, input_shape=(1, 2))


def _nnx(prior):
    return random_nnx_module("net", NNXMLP(nnx.Rngs(0)), prior)


def _eqx(prior):
    mlp = eqx.nn.MLP(2, "scalar", WIDTH, 1, activation=jnp.tanh, key=random.key(0))
    net = random_eqx_module("net", mlp, prior)
    return jax.vmap(net)


LIBRARIES = {"flax.linen": _linen, "flax.nnx": _nnx, "equinox": _eqx}


def network_model(library):
    """A regression on a 2-4-1 tanh network built by ``library``'s random
    module, N(0, 1) weights, its data in a subsample plate."""
    build = LIBRARIES[library]

    def model(X, y=None, subsample_size=100):
        net = build(dist.Normal(0.0, 1.0))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size):
            x = numpyro.subsample(X, event_dim=1)
            mu = numpyro.deterministic("mu", net(x))
            obs = None if y is None else numpyro.subsample(y, event_dim=0)
            numpyro.sample("y", dist.Normal(mu, NOISE), obs=obs)

    return model


@pytest.fixture(scope="module")
def data():
    k1, k2, k3 = random.split(random.key(0), 3)
    X = random.normal(k1, (N + N_TEST, 2))
    y = jnp.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + NOISE * random.normal(k2, (N + N_TEST,))
    X, y = np.asarray(X, np.float32), np.asarray(y, np.float32)
    return X[:N], y[:N], X[N:]


def _vectorized(kernel, num_warmup, num_samples, chains=4, thinning=1):
    return MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        thinning=thinning,
        num_chains=chains,
        chain_method="vectorized",
        progress_bar=False,
    )


def _run(kernel, X, y, num_warmup, num_samples, seed=1):
    mcmc = MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(random.key(seed), X, y)
    return mcmc, caught


KERNELS = {"SGLD": SGLD, "SGBD": SGBD, "SGHMC": SGHMC, "NOGIN": NOGIN}
# The default run keeps one kernel a library; every pair runs with -m slow.
DEFAULT_PAIRS = {("flax.linen", "SGLD"), ("flax.nnx", "NOGIN"), ("equinox", "SGBD")}


@pytest.mark.parametrize(
    "library, kernel",
    [
        pytest.param(
            lib,
            k,
            marks=() if (lib, k) in DEFAULT_PAIRS else pytest.mark.slow,
        )
        for lib in LIBRARIES
        for k in KERNELS
    ],
)
def test_a_module_network_runs_under_the_default_path(data, library, kernel):
    X, y, X_test = data
    model = network_model(library)
    mcmc, caught = _run(KERNELS[kernel](model), X, y, 200, 200)
    samples = mcmc.get_samples()
    weights = {k: v for k, v in samples.items() if k.startswith("net/")}
    assert sum(int(np.prod(v.shape[1:])) for v in weights.values()) == 17
    for v in weights.values():
        assert np.all(np.isfinite(np.asarray(v)))
    # The draws make predictions through the same model code.
    pred = Predictive(model, weights, return_sites=["mu"])(
        random.key(2), X_test, subsample_size=None
    )["mu"]
    assert pred.shape == (200, N_TEST) and np.all(np.isfinite(np.asarray(pred)))

    # The default path says that it samples around one mode of the network.
    assert any(issubclass(w.category, NetworkWarning) for w in caught)


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_a_network_is_recognised_and_a_chosen_step_is_not_warned_about(data, library):
    """The random module's sites are found in every library; a user's own step
    without the mode's preconditioner is not the default path and is not
    warned about."""
    X, y, _ = data
    model = network_model(library)
    info = trace_model(model, (X, y), {})
    assert info.modules == ("net",)
    assert all(name.startswith("net/") for name in info.shapes)
    kernel = SGLD(model, step_size=1e-3, preconditioner="none")
    mcmc, caught = _run(kernel, X, y, 10, 10)
    assert not any(issubclass(w.category, NetworkWarning) for w in caught)


def test_the_default_path_fits_a_network_by_adam_and_the_fisher_diagonal(data):
    """On a network the default set-up is Adam's MAP fit and a diagonal L from
    the Fisher information there, said in ``adaptation_info``; the chain starts
    at the fit, whose full-data potential is below the prior draws'."""
    X, y, _ = data
    model = network_model("equinox")
    mcmc, _ = _run(SGLD(model), X, y, 50, 50)
    info = mcmc.sampler.adaptation_info
    assert info["preconditioner"] == "diagonal"
    assert info["mode_search"]["method"] == "adam"
    assert "network (net)" in info["why"]
    assert mcmc.sampler.centre_info["source"].startswith("Adam")
    objective = full_data_objective(model, (X, y), {})
    fitted = info["mode_search"]["potential"]
    starts = [objective.value_and_grad(objective.x0)[0]]
    for seed in range(3):  # draws of the prior, shrunk as the fit's start is
        x = network_start(model, (X, y), {}, objective, ("net",), random.key(seed))
        starts.append(objective.value_and_grad(x)[0])
    assert fitted < min(float(s) for s in starts)


def test_an_explicit_diagonal_preconditioner_gets_the_network_set_up(data):
    """``preconditioner="diagonal"`` (what ``tune``'s winning kernel names) fits
    a network as the default does; ``"dense"`` keeps the Newton-CG search."""
    X, y, _ = data
    model = network_model("flax.linen")
    mcmc, _ = _run(SGLD(model, preconditioner="diagonal"), X, y, 20, 20)
    assert mcmc.sampler.adaptation_info["mode_search"]["method"] == "adam"
    mcmc, _ = _run(SGLD(model, preconditioner="dense"), X, y, 20, 20)
    assert "method" not in mcmc.sampler.adaptation_info["mode_search"]


def test_the_run_checks_judge_a_network_by_its_predictions(data):
    """A network's record keeps, after its coordinates, the log-likelihood of
    fixed rows of its plate at each kept draw (the same numbers NumPyro's
    ``log_likelihood`` gives for the draws ``get_samples`` returns), and the
    convergence check reads and names those rows, not weights. Checked once
    against injected bugs: the probe on the rows shifted by one, and on the
    draw before the kept one: both fail the equality."""
    X, y, _ = data
    model = network_model("flax.linen")
    kernel = SGLD(model, step_size=3e-3, preconditioner="none")
    mcmc = _vectorized(kernel, 10, 40, chains=2, thinning=2)
    mcmc.run(random.key(3), X, y)
    plan = kernel.monitor.trace_plan
    assert plan.plate == "data" and len(plan.probes) == PROBE_ROWS
    assert plan.probes[0] == 0 and plan.probes[-1] == N - 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = check(mcmc)
    recorded = np.asarray(mcmc.last_state.trace.rows)[..., len(plan.coords) :]
    samples = mcmc.get_samples(group_by_chain=True)
    expected = log_likelihood(kernel.model, samples, X, y, batch_ndims=2)["y"]
    expected = np.asarray(expected)[..., np.asarray(plan.probes)]
    assert recorded.shape == expected.shape == (2, 20, PROBE_ROWS)
    np.testing.assert_allclose(recorded, expected, rtol=1e-5, atol=1e-4)

    assert found["checked"] == "rows" and set(found["coords"]) <= set(plan.probes)
    assert not found["converged"]  # 20 draws a chain: ESS below 100
    (message,) = [str(w.message) for w in caught if w.category is ConvergenceWarning]
    assert "the log-likelihood of row" in message and "net/" not in message


def _regression(X, y, noise, prior_sd, n):
    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, prior_sd).expand([X.shape[1]]))
        with numpyro.plate("data", X.shape[0], subsample_size=n):
            x = numpyro.subsample(X, event_dim=1)
            obs = numpyro.subsample(y, event_dim=0)
            numpyro.sample("y", dist.Normal(x @ w, noise), obs=obs)

    return model


def test_the_fisher_diagonal_from_gradient_noise_matches_a_regressions_curvature():
    """A linear regression's Fisher information is its likelihood's Hessian,
    ``sum_i x_ij^2 / sigma^2`` on the diagonal: the estimate from the minibatch
    gradients' noise at the fit agrees within its sampling error (8 minibatch
    variances of n = 200 rows: relative sd about sqrt(2 / (8 (n - 1))) = 0.035
    of a coordinate's, plus the n/N-scaled squared mean gradient, O(1/N)), and
    the prior's curvature is 1 / prior_sd^2 exactly (one Rademacher probe of a
    factorised prior)."""
    rng = np.random.default_rng(3)
    N, d, noise, prior_sd = 4000, 5, 0.5, 2.0
    X = rng.normal(size=(N, d)) * np.array([0.3, 1.0, 2.0, 1.0, 0.5])
    w_true = rng.normal(size=d)
    y = X @ w_true + noise * rng.normal(size=N)
    X, y = X.astype(np.float32), y.astype(np.float32)
    model = _regression(X, y, noise, prior_sd, 200)
    info = trace_model(model, (X, y), {})
    objective = full_data_objective(model, (X, y), {})
    fit = fit_network(model, (X, y), {}, info.plates, objective, ())
    exact = np.sum(X.astype(np.float64) ** 2, 0) / noise**2
    np.testing.assert_allclose(fit.fisher, exact, rtol=4 * 0.035)
    np.testing.assert_allclose(fit.prior, 1 / prior_sd**2, rtol=1e-4)
    # The fit is the MAP to within a fraction of a posterior sd (Adam's last
    # steps are minibatch steps of a decayed rate).
    precision = X.T.astype(np.float64) @ X / noise**2 + np.eye(d) / prior_sd**2
    map_ = np.linalg.solve(precision, X.T.astype(np.float64) @ y / noise**2)
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    assert np.all(np.abs(np.asarray(fit.x) - map_) < 0.5 * sd)


@pytest.fixture(scope="module")
def well_posed():
    """The network's data where NUTS converges (4 chains: R-hat of the
    predictions 1.000-1.003): N = 2,000 inputs uniform on [-2, 2]^2 and 8
    held-out inputs inside [-1.5, 1.5]^2, with NUTS's predictions there."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (2000, 2)).astype(np.float32)
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    y = (f + NOISE * rng.standard_normal(2000)).astype(np.float32)
    X_test = rng.uniform(-1.5, 1.5, (8, 2)).astype(np.float32)
    model = network_model("equinox")
    nuts = _vectorized(NUTS(partial(model, subsample_size=None)), 1000, 1000)
    nuts.run(random.key(0), X, y)
    return X, y, X_test, _predictions(model, nuts, X_test, 4)


def _predictions(model, mcmc, X_test, chains):
    """The network's predictions at ``X_test``, ``(chains, draws, 8)``."""
    weights = {k: v for k, v in mcmc.get_samples().items() if k.startswith("net/")}
    mu = Predictive(model, weights, return_sites=["mu"])(
        random.key(2), X_test, subsample_size=None
    )["mu"]
    return np.asarray(mu).reshape(chains, -1, X_test.shape[0])


def _agreement(sg, nuts):
    """``(z of the means, z of the sds)`` of the SG predictions against NUTS's,
    each difference over its Monte Carlo standard error from the multi-chain
    bulk ESS (a sd's relative se is about 1 / sqrt(2 ESS) for near-normal
    predictions), and the SG predictions' R-hat."""
    out = []
    for draws in (sg, nuts):
        ds = az.convert_to_dataset(draws)
        flat = draws.reshape(-1, draws.shape[-1])
        ess = np.asarray(az.ess(ds)["x"].values)
        out.append(
            (flat.mean(0), flat.std(0), ess, np.asarray(az.rhat(ds)["x"].values))
        )
    (m1, s1, e1, rhat), (m2, s2, e2, _) = out
    z_mean = (m1 - m2) / np.sqrt(s1**2 / e1 + s2**2 / e2)
    z_sd = (s1 / s2 - 1) / np.sqrt(1 / (2 * e1) + 1 / (2 * e2))
    return z_mean, z_sd, rhat


# On this network NOGIN's chains mix within 4 x 150,000 steps (R-hat of the
# predictions 1.01-1.03). The others' fixed diagonal L leaves directions the
# data barely identify (eigenvalues of the whitened curvature 1e-4 to 5.6) to
# be crossed by diffusion: after as many steps R-hat is up to 1.15-1.32 and
# means are off by up to 5.5 se (SGLD: 0.5 NUTS sds); after 16 times as many,
# R-hat is under 1.06 but means are still off by up to 4.5 se; a dense L from
# the Fisher information is worse, the posterior bending away from the fit
# (benchmarks/results.md, issue 62).
SLOW_TO_MIX = pytest.mark.xfail(
    strict=True,
    reason="a fixed preconditioner does not mix on this posterior in 150,000 "
    "steps: R-hat of the predictions up to 1.15-1.32, means off by up to 5.5 se",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kernel",
    [
        "NOGIN",
        pytest.param("SGLD", marks=SLOW_TO_MIX),
        pytest.param("SGBD", marks=SLOW_TO_MIX),
        pytest.param("SGHMC", marks=SLOW_TO_MIX),
    ],
)
def test_the_default_predictive_agrees_with_nuts_on_a_network(well_posed, kernel):
    """The default path's posterior predictive (mean and sd of the predictions
    at 8 held-out inputs) against NUTS's on the full data: every difference
    within 3.5 Monte Carlo standard errors (16 of them: under agreement one
    exceeds that with probability under 16 x 4.7e-4 = 0.0075), with the SG
    chains' R-hat under 1.05. Checked once against an injected bug: the SG
    run's likelihood noise 0.33 instead of 0.3 (sds about 10 % wide) gave a
    mean's z of 3.61 and a sd's of 3.81, and failed."""
    X, y, X_test, nuts = well_posed
    model = network_model("equinox")
    mcmc = _vectorized(KERNELS[kernel](model), 2000, 150_000, thinning=75)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NetworkWarning)
        mcmc.run(random.key(1), X, y)
    z_mean, z_sd, rhat = _agreement(_predictions(model, mcmc, X_test, 4), nuts)
    assert np.all(rhat < 1.05), rhat
    assert np.all(np.abs(z_mean) < 3.5), z_mean
    assert np.all(np.abs(z_sd) < 3.5), z_sd
