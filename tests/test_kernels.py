"""The NumPyro adapter end to end: posteriors, chains, resume, pickling, ArviZ."""

import pickle
import warnings

import arviz as az
import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

from numpyro_sgbd import SGBD, SGLD, GradientEstimate

N_DATA, SUBSAMPLE = 1000, 100
PRIOR_SD = 10.0


def gaussian_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def variance_model(y):
    v = numpyro.sample("v", dist.InverseGamma(3.0, 2.0))
    numpyro.deterministic("sd", jnp.sqrt(v))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE):
        obs = numpyro.subsample(y, event_dim=0)
        numpyro.deterministic("residual", obs)  # in the plate: dropped from samples
        numpyro.sample("y", dist.Normal(0.0, jnp.sqrt(v)), obs=obs)


@pytest.fixture(scope="module")
def y_data():
    return 1.5 + random.normal(random.key(11), (N_DATA,))


def _gaussian_posterior(y):
    precision = 1.0 / PRIOR_SD**2 + y.shape[0]
    return float(jnp.sum(y) / precision), float(1.0 / np.sqrt(precision))


def _mcse_check(draws, mean, sd, k=4.0):
    """Posterior mean and sd of ``draws`` (chains, draws) within k MCSE of the truth."""
    draws = np.asarray(draws)
    ess = float(az.ess(draws))
    se_mean = sd / np.sqrt(ess)
    se_sd = sd / np.sqrt(2 * ess)
    got_mean, got_sd = draws.mean(), draws.std()
    assert abs(got_mean - mean) < k * se_mean, (got_mean, mean, se_mean, ess)
    assert abs(got_sd - sd) < k * se_sd, (got_sd, sd, se_sd, ess)


@pytest.mark.parametrize(
    "kernel_cls, variant, rel_step",
    [
        (SGBD, "corrected", 0.2),
        (SGBD, "vanilla", 0.2),
        (SGLD, "corrected", 0.3),
        (SGLD, "vanilla", 0.2),
    ],
)
def test_conjugate_gaussian_posterior(y_data, kernel_cls, variant, rel_step):
    # Gradient noise here: tau ~ sqrt(n (1 - n/N)) * N/n ~ 95, so tau * step < 1.7.
    mean, sd = _gaussian_posterior(y_data)
    kernel = kernel_cls(gaussian_model, step_size=rel_step * sd, variant=variant)
    mcmc = MCMC(
        kernel,
        num_warmup=1000,
        num_samples=6000,
        num_chains=8,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(random.key(1), y_data, init_params={"mu": jnp.full(8, mean)})
    _mcse_check(mcmc.get_samples(group_by_chain=True)["mu"], mean, sd)


def test_positive_constrained_parameter(y_data):
    y = y_data - 1.5  # N(0, 1) data: posterior of the variance v is InverseGamma
    a, b = 3.0 + N_DATA / 2, 2.0 + float(jnp.sum(y**2)) / 2
    mean, sd = b / (a - 1), b / ((a - 1) * np.sqrt(a - 2))
    # Posterior sd of log v is about 0.045: a step of 0.2 sd.
    kernel = SGBD(variance_model, step_size=0.009, variant="corrected")
    mcmc = MCMC(
        kernel,
        num_warmup=1000,
        num_samples=6000,
        num_chains=8,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(random.key(2), y)
    samples = mcmc.get_samples(group_by_chain=True)
    assert set(samples) == {"v", "sd"}  # in-plate deterministic site dropped
    assert np.all(samples["v"] > 0)
    np.testing.assert_allclose(samples["sd"], np.sqrt(samples["v"]), rtol=1e-6)
    _mcse_check(samples["v"], mean, sd)


def test_chain_methods_agree(y_data):
    draws = {}
    for method in ("sequential", "vectorized", "parallel"):
        mcmc = MCMC(
            SGBD(gaussian_model, step_size=0.01, variant="corrected"),
            num_warmup=50,
            num_samples=100,
            num_chains=2,
            chain_method=method,
            progress_bar=False,
        )
        mcmc.run(random.key(3), y_data)
        draws[method] = mcmc.get_samples(group_by_chain=True)["mu"]
        assert draws[method].shape == (2, 100)
    np.testing.assert_allclose(draws["sequential"], draws["vectorized"], atol=1e-5)
    np.testing.assert_allclose(draws["sequential"], draws["parallel"], atol=1e-5)
    assert not np.allclose(draws["sequential"][0], draws["sequential"][1])


def test_resume_equals_one_long_run(y_data):
    long = MCMC(
        SGLD(gaussian_model, step_size=0.005),
        num_warmup=50,
        num_samples=200,
        progress_bar=False,
    )
    long.run(random.key(4), y_data)
    split = MCMC(
        SGLD(gaussian_model, step_size=0.005),
        num_warmup=50,
        num_samples=100,
        progress_bar=False,
    )
    split.run(random.key(4), y_data)
    first = split.get_samples()["mu"]
    split.post_warmup_state = split.last_state
    split.run(split.post_warmup_state.rng_key, y_data)
    second = split.get_samples()["mu"]
    np.testing.assert_allclose(
        np.concatenate([first, second]), long.get_samples()["mu"], rtol=1e-6
    )


def test_pickling_kernel_and_mcmc(y_data):
    kernel = SGBD(variance_model, step_size=0.02, variant="corrected")
    pickle.loads(pickle.dumps(kernel))
    mcmc = MCMC(kernel, num_warmup=20, num_samples=50, progress_bar=False)
    mcmc.run(random.key(5), y_data)
    restored = pickle.loads(pickle.dumps(mcmc))
    np.testing.assert_array_equal(restored.get_samples()["v"], mcmc.get_samples()["v"])
    for m in (mcmc, restored):
        m.post_warmup_state = m.last_state
        m.run(m.post_warmup_state.rng_key, y_data)
    np.testing.assert_allclose(
        restored.get_samples()["v"], mcmc.get_samples()["v"], rtol=1e-6
    )


def test_arviz_default_arguments_and_sample_stats(y_data):
    fields = (
        "potential_energy_estimate",
        "mean_noise_sd",
        "tolerance_exceeded",
        "num_nonfinite",
    )
    kernel = SGBD(gaussian_model, step_size=0.005, variant="corrected")
    mcmc = MCMC(
        kernel,
        num_warmup=20,
        num_samples=30,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(random.key(6), y_data)  # the statistics are default fields
    idata = az.from_numpyro(mcmc)
    for name in fields:
        assert idata.sample_stats[name].shape == (2, 30)
    assert "lp" not in idata.sample_stats  # a minibatch estimate is not the full lp
    tau = idata.sample_stats["mean_noise_sd"].values
    # tau of the minibatch gradient: sqrt(n (1 - n/N)) * (N / n) * sd(y - mu) ~ 95
    assert np.all((tau > 60) & (tau < 130)), tau
    assert idata.log_likelihood["y"].shape == (2, 30, SUBSAMPLE)
    idx = kernel.log_likelihood_indices["data"]
    np.testing.assert_allclose(idata.observed_data["y"].values, y_data[idx])
    assert len(np.unique(idx)) == SUBSAMPLE
    summary = az.summary(idata)
    assert "mu" in summary.index
    assert az.ess(idata)["mu"].shape == () and az.rhat(idata)["mu"].shape == ()
    import matplotlib

    matplotlib.use("Agg")
    axes = az.plot_trace(idata)
    assert axes.shape == (1, 2)
    matplotlib.pyplot.close("all")


def test_vanilla_stats_are_nan_not_zero(y_data):
    mcmc = MCMC(
        SGLD(gaussian_model, step_size=0.005),
        num_warmup=0,
        num_samples=5,
        progress_bar=False,
    )
    mcmc.run(
        random.key(7), y_data, extra_fields=("mean_noise_sd", "tolerance_exceeded")
    )
    extra = mcmc.get_extra_fields()
    assert np.all(np.isnan(extra["mean_noise_sd"]))
    assert np.all(np.isnan(extra["tolerance_exceeded"]))


def test_per_coordinate_step_size_dict():
    def model(y):
        loc = numpyro.sample("loc", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", y.shape[0], subsample_size=50) as idx:
            numpyro.sample(
                "y", dist.Normal(loc, jnp.array([1.0, 100.0])).to_event(1), obs=y[idx]
            )

    y = random.normal(random.key(8), (500, 2)) * jnp.array([1.0, 100.0])
    with pytest.raises(ValueError, match=r"step_size\['loc'\]"):
        SGBD(model, step_size={"loc": jnp.array([1e-3, 0.0])})
    mcmc = MCMC(
        SGBD(model, step_size={"loc": jnp.array([1e-3, 1e-1])}),
        num_warmup=0,
        num_samples=200,
        progress_bar=False,
    )
    mcmc.run(random.key(0), y, init_params={"loc": jnp.zeros(2)})
    steps = np.abs(np.diff(mcmc.get_samples()["loc"], axis=0))
    # Bimodal increments are sigma * (1 + 0.1 xi): each coordinate moves on its scale.
    assert np.all((steps[:, 0] > 0.5e-3) & (steps[:, 0] < 1.5e-3))
    assert np.all((steps[:, 1] > 0.5e-1) & (steps[:, 1] < 1.5e-1))


def _run_scalar_chains(kernel, rng_key, num_chains=16):
    """Draws (chains, draws) of a one-dimensional potential_fn/gradient_fn kernel."""
    mcmc = MCMC(
        kernel,
        num_warmup=100,
        num_samples=2000,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(rng_key, init_params=jnp.zeros((num_chains, 1)))
    return mcmc.get_samples(group_by_chain=True)[..., 0]


def test_potential_fn_gives_unadjusted_dynamics():
    sigma = 0.8
    kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z**2), step_size=sigma)
    draws = _run_scalar_chains(kernel, random.key(9))
    exact_var = 1.0 / (1.0 - sigma**2 / 4)  # unadjusted Langevin on N(0, 1)
    _mcse_check(draws, 0.0, np.sqrt(exact_var))


@pytest.mark.parametrize("variant, inflate", [("corrected", False), ("vanilla", True)])
def test_gradient_fn_with_injected_noise(variant, inflate):
    sigma, tau = 0.8, 1.5

    def gradient_fn(rng_key, z):
        noise = tau * random.normal(rng_key, jnp.shape(z))
        return GradientEstimate(z + noise, noise_sd=jnp.full(jnp.shape(z), tau))

    kernel = SGLD(gradient_fn=gradient_fn, step_size=sigma, variant=variant, beta=0.5)
    draws = _run_scalar_chains(kernel, random.key(10))
    # Corrected SGLD removes the gradient noise's variance: the exact-gradient law.
    extra = (sigma**2 / 2) ** 2 * tau**2 if inflate else 0.0
    exact_var = (sigma**2 + extra) / (1.0 - (1.0 - sigma**2 / 2) ** 2)
    _mcse_check(draws, 0.0, np.sqrt(exact_var))


def test_nonfinite_chain_stops_and_warns(y_data):
    kernel = SGLD(gaussian_model, step_size=1.0)  # drift ~ N / 2 * mu: explodes
    mcmc = MCMC(kernel, num_warmup=0, num_samples=60, progress_bar=False)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        mcmc.run(random.key(12), y_data, extra_fields=("num_nonfinite",))
        jax.block_until_ready(mcmc.get_samples())
        jax.effects_barrier()
    mu = mcmc.get_samples()["mu"]
    counts = mcmc.get_extra_fields()["num_nonfinite"]
    assert np.all(np.isfinite(mu))
    assert counts[-1] > 0 and np.all(np.diff(counts) >= 0)
    stopped = counts > 0
    assert np.all(mu[stopped] == mu[stopped][0])  # it stopped moving


def test_no_subsample_plate_runs_full_batch_with_warning():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0, 10))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1), obs=y)

    y = jnp.ones(20)
    mcmc = MCMC(
        SGBD(model, step_size=0.05, variant="corrected"),
        num_warmup=0,
        num_samples=10,
        progress_bar=False,
    )
    with pytest.warns(UserWarning, match="no subsampled plate"):
        mcmc.run(random.key(0), y, extra_fields=("mean_noise_sd",))
    assert np.all(mcmc.get_extra_fields()["mean_noise_sd"] == 0)


def test_multiple_subsample_plates():
    def model(a, b):
        mu = numpyro.sample("mu", dist.Normal(0, 10))
        with numpyro.plate("a", a.shape[0], subsample_size=10) as i:
            numpyro.sample("ya", dist.Normal(mu, 1), obs=a[i])
        with numpyro.plate("b", b.shape[0], subsample_size=10) as j:
            numpyro.sample("yb", dist.Normal(mu, 1), obs=b[j])

    a, b = jnp.ones(100), jnp.ones(200)
    mcmc = MCMC(
        SGBD(model, step_size=0.01), num_warmup=0, num_samples=10, progress_bar=False
    )
    mcmc.run(random.key(0), a, b)
    assert mcmc.get_samples()["mu"].shape == (10,)
    mcmc = MCMC(
        SGBD(model, step_size=0.01, variant="corrected"),
        num_warmup=0,
        num_samples=10,
        progress_bar=False,
    )
    with pytest.raises(ValueError, match="single plate"):
        mcmc.run(random.key(0), a, b)


# ----------------------------------------------------------------- bad input


def _latent_in_plate(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", y.shape[0], subsample_size=5):
        z = numpyro.sample("z", dist.Normal(mu, 1))
        numpyro.sample("y", dist.Normal(z, 1), obs=numpyro.subsample(y, event_dim=0))


def _discrete_latent(y):
    k = numpyro.sample("k", dist.Bernoulli(0.5))
    with numpyro.plate("data", y.shape[0], subsample_size=5):
        numpyro.sample("y", dist.Normal(k, 1), obs=numpyro.subsample(y, event_dim=0))


def _too_large_subsample(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", y.shape[0], subsample_size=y.shape[0] + 1):
        numpyro.sample("y", dist.Normal(mu, 1), obs=y)


@pytest.mark.parametrize(
    "model, match",
    [
        (_latent_in_plate, "'z' is a latent variable inside the subsample plate"),
        (_discrete_latent, "'k' is a discrete latent variable"),
        (_too_large_subsample, "subsample_size must be smaller"),
    ],
)
def test_bad_models_raise_before_sampling(model, match):
    mcmc = MCMC(
        SGBD(model, step_size=0.1), num_warmup=0, num_samples=5, progress_bar=False
    )
    with pytest.raises(ValueError, match=match):
        mcmc.run(random.key(0), jnp.ones(20))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"step_size": 0.0}, "step_size must be positive"),
        ({"step_size": -1.0}, "step_size must be positive"),
        ({"step_size": float("nan")}, "step_size must be positive"),
        ({"step_size": float("inf")}, "step_size must be positive"),
        ({}, "step_size is required"),
        ({"step_size": {"mu": 0.0}}, r"step_size\['mu'\] must be positive"),
        ({"step_size": 0.1, "variant": "fancy"}, "variant must be one of"),
        ({"step_size": 0.1, "beta": 1.0}, "beta must be"),
        ({"step_size": 0.1, "init_noise_sd": -1.0}, "init_noise_sd"),
        ({"step_size": 0.1, "increment": "uniform"}, "increment must be one of"),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SGBD(gaussian_model, **kwargs)


@pytest.mark.parametrize(
    "step_size, match",
    [
        ({"nu": 0.1}, r"unknown \['nu'\]"),
        ({}, r"missing \['mu'\]"),
        ({"mu": jnp.ones(3)}, "does not broadcast"),
        (jnp.full(2, 0.1), "z is a dict of sites"),
    ],
)
def test_bad_step_size_raises_at_init(y_data, step_size, match):
    # An empty dict is rejected as missing every site, not taken as "default".
    mcmc = MCMC(
        SGBD(gaussian_model, step_size=step_size),
        num_warmup=0,
        num_samples=5,
        progress_bar=False,
    )
    with pytest.raises(ValueError, match=match):
        mcmc.run(random.key(0), y_data)


def test_sources_must_be_exactly_one():
    with pytest.raises(ValueError, match="exactly one of model"):
        SGBD(step_size=0.1)
    with pytest.raises(ValueError, match="exactly one of model"):
        SGBD(gaussian_model, potential_fn=lambda z: z, step_size=0.1)


def test_potential_fn_needs_init_params():
    mcmc = MCMC(
        SGBD(potential_fn=lambda z: jnp.sum(z**2), step_size=0.1),
        num_warmup=0,
        num_samples=5,
        progress_bar=False,
    )
    with pytest.raises(ValueError, match="init_params is required"):
        mcmc.run(random.key(0))


def test_corrected_gradient_fn_needs_noise_sd():
    kernel = SGBD(gradient_fn=lambda key, z: z, step_size=0.1, variant="corrected")
    mcmc = MCMC(kernel, num_warmup=0, num_samples=5, progress_bar=False)
    with pytest.raises(ValueError, match="noise_sd"):
        mcmc.run(random.key(0), init_params=jnp.zeros(2))


def test_init_params_with_wrong_sites(y_data):
    mcmc = MCMC(
        SGBD(gaussian_model, step_size=0.1),
        num_warmup=0,
        num_samples=5,
        progress_bar=False,
    )
    with pytest.raises(ValueError, match="init_params must be a dict"):
        mcmc.run(random.key(0), y_data, init_params={"sigma": 1.0})


def test_progress_bar_diagnostics(y_data, capsys):
    kernel = SGBD(gaussian_model, step_size=0.005, variant="corrected")
    mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(random.key(0), y_data)
    text = kernel.get_diagnostics_str(mcmc.last_state)
    kernel._diagnostics = (0, "")
    text = kernel.get_diagnostics_str(mcmc.last_state)
    assert text.startswith("U_hat ") and "tau_hat " in text
    assert "over tolerance" in text


def test_numpy_data_is_accepted(y_data):
    # NumPy arrays cannot be indexed by traced minibatch indices; the kernel must
    # convert them rather than fail inside jit.
    mcmc = MCMC(
        SGBD(gaussian_model, step_size=0.005, variant="corrected"),
        num_warmup=0,
        num_samples=20,
        progress_bar=False,
    )
    mcmc.run(random.key(0), np.asarray(y_data))
    assert np.all(np.isfinite(mcmc.get_samples()["mu"]))
    assert az.from_numpyro(mcmc).log_likelihood["y"].shape == (1, 20, SUBSAMPLE)
