"""The NumPyro adapter end to end: posteriors, chains, resume, pickling, ArviZ.

Every adapter test runs for each kernel family (``KERNELS``): SGBD and SGLD (the
first-order kernels) and NOGIN (momentum state, noise covariance).
"""

import pickle
import warnings

from _cases import one_kernel
import arviz as az
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

import numpyro_sgbd
from numpyro_sgbd import NOGIN, SGBD, SGLD, ConvergenceWarning, GradientEstimate

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


# Kernel factories, given the scale ``sd`` of the posterior (the Gaussian model's
# is about 0.03): SGBD and SGLD (corrected, so the noise statistics are
# defined) step 0.2 sd; NOGIN's mass is the precision 1/sd^2,
# so that its step is in sd units.
KERNELS = {
    "SGBD": lambda model, sd=0.03, **kw: SGBD(
        model, step_size=0.2 * sd, variant="corrected", **kw
    ),
    "SGLD": lambda model, sd=0.03, **kw: SGLD(
        model, step_size=0.2 * sd, variant="corrected", **kw
    ),
    "NOGIN": lambda model, sd=0.03, h=0.5, **kw: NOGIN(
        model, step_size=h, mass=sd**-2, **kw
    ),
}
ALL_KERNELS = pytest.mark.parametrize("kernel_name", sorted(KERNELS))


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
        (NOGIN, "full", 0.5),
        (NOGIN, "diag", 0.5),
        (NOGIN, "lowrank+diag", 0.5),
    ],
)
def test_conjugate_gaussian_posterior(y_data, kernel_cls, variant, rel_step):
    # Gradient noise here: tau ~ sqrt(n (1 - n/N)) * N/n ~ 95, so tau * step < 1.7.
    # NOGIN (mass = posterior precision, step 0.5 sd): noise_damping ~ 0.56. NOGIN
    # runs the form covariance="auto" picks at d = 1, n = 100 ("full"): the
    # low-rank form solves an n x n system per step, about 100 times the cost here
    # (this case took 28.6 s idle and over 10 minutes on an oversubscribed CPU);
    # it equals the full form to rounding (tests/test_nogin.py).
    mean, sd = _gaussian_posterior(y_data)
    if kernel_cls is NOGIN:
        kernel = NOGIN(
            gaussian_model, step_size=rel_step, mass=sd**-2, covariance=variant
        )
    else:
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


@ALL_KERNELS
def test_positive_constrained_parameter(y_data, kernel_name):
    y = y_data - 1.5  # N(0, 1) data: posterior of the variance v is InverseGamma
    a, b = 3.0 + N_DATA / 2, 2.0 + float(jnp.sum(y**2)) / 2
    mean, sd = b / (a - 1), b / ((a - 1) * np.sqrt(a - 2))
    # sd of log v is 0.045. NOGIN's second-order bias in the mean of v is -0.21 sd
    # at h = 0.5 and -0.08 sd at h = 0.25 (8 x 6000 draws): h = 0.2 here.
    kw = {"h": 0.2} if kernel_name == "NOGIN" else {}
    kernel = KERNELS[kernel_name](variance_model, sd=0.045, **kw)
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


@one_kernel(KERNELS, "NOGIN")
def test_chain_methods_agree(y_data, kernel_name):
    draws = {}
    for method in ("sequential", "vectorized", "parallel"):
        mcmc = MCMC(
            KERNELS[kernel_name](gaussian_model),
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


@one_kernel(KERNELS, "SGLD")
def test_resume_equals_one_long_run(y_data, kernel_name):
    long = MCMC(
        KERNELS[kernel_name](gaussian_model),
        num_warmup=50,
        num_samples=200,
        progress_bar=False,
    )
    long.run(random.key(4), y_data)
    split = MCMC(
        KERNELS[kernel_name](gaussian_model),
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


@one_kernel(KERNELS, "SGBD")
def test_pickling_kernel_and_mcmc(y_data, kernel_name):
    kernel = KERNELS[kernel_name](variance_model, sd=0.045)
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


@ALL_KERNELS
def test_arviz_default_arguments_and_sample_stats(y_data, kernel_name):
    kernel = KERNELS[kernel_name](gaussian_model)
    fields = [f for f in kernel.default_fields if f != "z"]
    assert "mean_noise_sd" in fields and "num_nonfinite" in fields
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
    if kernel_name == "NOGIN":  # (h^2 / 4) tau^2 / mass with mass = 1 / 0.03^2
        damping = idata.sample_stats["noise_damping"].values
        np.testing.assert_allclose(damping, 0.25**2 * 0.03**2 * tau**2, rtol=0.35)
    # ArviZ 0.x adds log_likelihood by default, 1.x only on request.
    with_ll = az.from_numpyro(mcmc, log_likelihood=True)
    # Every row by default (issue 58): az.loo estimates the elpd of all the data.
    assert with_ll.log_likelihood["y"].shape == (2, 30, N_DATA)
    np.testing.assert_allclose(idata.observed_data["y"].values, y_data)
    summary = az.summary(idata)
    assert "mu" in summary.index
    assert az.ess(idata)["mu"].shape == () and az.rhat(idata)["mu"].shape == ()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # 0.x returns an array of axes (trace and density), 1.x a PlotCollection of
    # the trace: either way a figure with a panel for mu.
    az.plot_trace(idata)
    assert "mu" in {ax.get_title() for ax in plt.gcf().axes}
    plt.close("all")


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


def _run_chains(kernel, rng_key, dim=1, num_chains=16, **kwargs):
    """Draws (chains, draws, dim) of a potential_fn/gradient_fn kernel."""
    mcmc = MCMC(
        kernel,
        num_warmup=100,
        num_samples=2000,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(rng_key, init_params=jnp.zeros((num_chains, dim)), **kwargs)
    return mcmc


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_nogin_potential_fn_is_exact_for_a_gaussian(beta):
    # Lemma 4.2 with Sigma = 0: theta ~ N(0, 1 / beta) exactly at h = 1.5, where
    # unadjusted Langevin (SGLD) at the same step has variance 1 / (1 - h^2 / 4) = 2.3.
    kernel = NOGIN(
        potential_fn=lambda z: 0.5 * jnp.sum(z**2),
        step_size=1.5,
        inverse_temperature=beta,
    )
    draws = _run_chains(kernel, random.key(13)).get_samples(group_by_chain=True)
    _mcse_check(draws[..., 0], 0.0, 1 / np.sqrt(beta))


@pytest.mark.parametrize("covariance", ["diag", "full", "lowrank"])
def test_nogin_gradient_fn_with_known_covariance(covariance):
    # N(0, I) target in 2-D with Gaussian force noise of covariance C C^T
    # (correlated, except for "diag"): Lemma 4.2 makes theta exact at h = 1.2.
    factor = jnp.array([[1.0, 0.0], [0.0, 1.2]])
    if covariance != "diag":
        factor = jnp.array([[1.0, 0.0], [0.9, 0.7]])
    noise_cov = {
        "diag": jnp.diag(factor @ factor.T),
        "full": factor @ factor.T,
        "lowrank": factor,
    }[covariance]

    def gradient_fn(rng_key, z):
        noise = factor @ random.normal(rng_key, (2,))
        return GradientEstimate(z + noise, noise_cov=noise_cov)

    kernel = NOGIN(gradient_fn=gradient_fn, step_size=1.2, covariance=covariance)
    mcmc = _run_chains(kernel, random.key(14), dim=2)
    draws = mcmc.get_samples(group_by_chain=True)
    for j in range(2):
        _mcse_check(draws[..., j], 0.0, 1.0)
    damping = mcmc.get_extra_fields()["noise_damping"]
    top = 1.2**2 / 4 * np.linalg.eigvalsh(np.asarray(factor @ factor.T))[-1]
    np.testing.assert_allclose(damping, top, rtol=1e-5)


def test_nogin_warns_when_noise_damping_stalls_exploration():
    def gradient_fn(scale):
        def fn(rng_key, z):
            noise = scale * random.normal(rng_key, jnp.shape(z))
            return GradientEstimate(
                z + noise, noise_cov=jnp.full(jnp.shape(z), scale**2)
            )

        return fn

    # h = 1: noise_damping = scale^2 / 4, checked once at iteration 100.
    kernel = NOGIN(gradient_fn=gradient_fn(4.0), step_size=1.0, covariance="diag")
    mcmc = MCMC(kernel, num_warmup=0, num_samples=120, progress_bar=False)
    with pytest.warns(UserWarning, match=r"noise_damping = 4 at iteration 100"):
        mcmc.run(random.key(0), init_params=jnp.zeros(1))
        numpyro_sgbd.check(mcmc)
    kernel = NOGIN(gradient_fn=gradient_fn(1.0), step_size=1.0, covariance="diag")
    mcmc = MCMC(kernel, num_warmup=0, num_samples=120, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # 120 draws: the convergence check rightly finds fewer than 100
        # effective ones; this test is about the stall warning alone.
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        mcmc.run(random.key(0), init_params=jnp.zeros(1))
        numpyro_sgbd.check(mcmc)


def test_nogin_noise_estimate_is_checked_before_compiling():
    """``noise_estimate`` names one of its three values, and a model's: with
    ``gradient_fn`` the function returns the covariance itself."""
    with pytest.raises(ValueError, match="noise_estimate must be 'auto', 'same'"):
        NOGIN(lambda: None, noise_estimate="other")

    def gradient_fn(rng_key, z):
        return GradientEstimate(z, noise_cov=jnp.ones(jnp.shape(z)))

    with pytest.raises(ValueError, match="with gradient_fn the function returns"):
        NOGIN(
            gradient_fn=gradient_fn,
            step_size=1.0,
            covariance="diag",
            noise_estimate="independent",
        )


def test_nogin_mass_per_site():
    # Two sites on very different scales; mass = precision puts both on unit scale.
    def model(y):
        a = numpyro.sample("a", dist.Normal(0, 1))
        b = numpyro.sample("b", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", y.shape[0], subsample_size=50) as idx:
            numpyro.sample("ya", dist.Normal(a, 0.01), obs=y[idx, 0])
            numpyro.sample("yb", dist.Normal(b, 1.0).to_event(1), obs=y[idx, 1:])

    y = random.normal(random.key(15), (500, 3)) * jnp.array([0.01, 1.0, 1.0])
    sd = {"a": 0.01 / np.sqrt(500), "b": 1 / np.sqrt(500)}
    kernel = NOGIN(
        model, step_size=0.5, mass={k: v**-2 for k, v in sd.items()}, covariance="full"
    )
    mcmc = MCMC(
        kernel,
        num_warmup=200,
        num_samples=3000,
        num_chains=4,
        chain_method="vectorized",
        progress_bar=False,
    )
    means = {"a": jnp.full(4, y[:, 0].mean()), "b": jnp.tile(y[:, 1:].mean(0), (4, 1))}
    mcmc.run(random.key(16), y, init_params=means)
    samples = mcmc.get_samples()
    ratio_a = float(samples["a"].std()) / sd["a"]
    ratio_b = np.asarray(samples["b"].std(0)) / sd["b"]
    assert 0.8 < ratio_a < 1.25 and np.all((ratio_b > 0.8) & (ratio_b < 1.25))


def full_data_gaussian_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize("kernel_name", ["NOGIN", "SGLD"])  # SGBD cannot explode
def test_nonfinite_chain_stops_and_warns(y_data, kernel_name):
    # Told the posterior sd is 1 rather than 0.03, both step far beyond stability
    # (SGLD's drift ~ N sigma^2 / 2 = 20 > 2; NOGIN's h^2 = 0.25 > 4 sd^2 m = 0.004).
    # With minibatch noise NOGIN does not explode but freezes: the noise grows with
    # |mu|, and the damping reverses the momentum. Without noise it explodes.
    model = full_data_gaussian_model if kernel_name == "NOGIN" else gaussian_model
    kernel = KERNELS[kernel_name](model, sd=1.0)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=60, progress_bar=False)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        mcmc.run(random.key(12), y_data, extra_fields=("num_nonfinite",))
        numpyro_sgbd.check(mcmc)
    mu = mcmc.get_samples()["mu"]
    counts = mcmc.get_extra_fields()["num_nonfinite"]
    assert np.all(np.isfinite(mu))
    assert counts[-1] > 0 and np.all(np.diff(counts) >= 0)
    stopped = counts > 0
    assert np.all(mu[stopped] == mu[stopped][0])  # it stopped moving


@ALL_KERNELS
def test_no_subsample_plate_runs_full_batch_with_warning(kernel_name):
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0, 10))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1), obs=y)

    y = jnp.ones(20)
    mcmc = MCMC(
        KERNELS[kernel_name](model, sd=0.2),
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
    with pytest.raises(ValueError, match="variant='corrected'.*single plate"):
        mcmc.run(random.key(0), a, b)
    mcmc = MCMC(NOGIN(model, step_size=0.1), num_warmup=0, num_samples=10)
    with pytest.raises(ValueError, match="NOGIN estimates the gradient noise"):
        mcmc.run(random.key(0), a, b)


# ----------------------------------------------------------------- bad input


def _latent_in_plate(y):
    """A latent site in the plate whose support depends on another site: local
    sites are sampled row by row (tests/test_local_sites.py), but not these."""
    top = numpyro.sample("top", dist.Exponential(1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=5):
        z = numpyro.sample("z", dist.Uniform(0.0, top))
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
        (_latent_in_plate, "'z' inside the subsample plate 'data' has a support"),
        (_discrete_latent, "'k' is a discrete latent variable"),
        (_too_large_subsample, "subsample_size must be smaller"),
    ],
)
@ALL_KERNELS
def test_bad_models_raise_before_sampling(model, match, kernel_name):
    mcmc = MCMC(
        KERNELS[kernel_name](model), num_warmup=0, num_samples=5, progress_bar=False
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
        ({"preconditioner": "full"}, "preconditioner must be one of"),
        ({"preconditioner": "none"}, "with preconditioner='none' give step_size"),
        ({"step_size": {"mu": 0.1}, "preconditioner": "dense"}, "no sites"),
        ({"step_size": 0.1, "centre": {"mu": 0.0}}, "centre is the control"),
        ({"step_size": {"mu": 0.0}}, r"step_size\['mu'\] must be positive"),
        ({"step_size": 0.1, "variant": "fancy"}, "variant must be one of"),
        ({"step_size": 0.1, "beta": 1.0}, "beta must be"),
        ({"step_size": 0.1, "init_noise_sd": -1.0}, "init_noise_sd"),
        ({"step_size": 0.1, "increment": "uniform"}, "increment must be one of"),
        ({"step_size": 0.1, "replace": "yes"}, "replace must be True"),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SGBD(gaussian_model, **kwargs)


def test_adaptation_needs_a_model():
    def potential(z):
        return 0.5 * jnp.sum(z**2)

    with pytest.raises(ValueError, match="step_size is required with potential_fn"):
        SGLD(potential_fn=potential)
    with pytest.raises(ValueError, match="it needs a model"):
        SGLD(potential_fn=potential, step_size=0.1, preconditioner="diagonal")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mass": 2.0}, "mass is the identity in the whitened"),
        ({"step_size": {"mu": 0.1}}, "NOGIN's step_size must be a positive scalar"),
        ({"step_size": -0.1}, "step_size must be positive"),
        ({"step_size": 0.1, "friction": 0.0}, "friction must be positive"),
        ({"step_size": 0.1, "mass": -1.0}, "mass must be positive"),
        ({"step_size": 0.1, "mass": {"mu": 0.0}}, r"mass\['mu'\] must be positive"),
        ({"step_size": 0.1, "inverse_temperature": 0}, "inverse_temperature must"),
        ({"step_size": 0.1, "covariance": "dense"}, "covariance must be"),
    ],
)
def test_nogin_bad_arguments_raise_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NOGIN(gaussian_model, **kwargs)


@pytest.mark.parametrize(
    "mass, match",
    [
        ({"nu": 1.0}, r"mass dict must name every latent site.*unknown \['nu'\]"),
        ({"mu": jnp.ones(3)}, r"mass\['mu'\] has shape \(3,\)"),
        (jnp.ones(2), "mass has shape"),
    ],
)
def test_nogin_bad_mass_raises_at_init(y_data, mass, match):
    mcmc = MCMC(
        NOGIN(gaussian_model, step_size=0.1, mass=mass), num_warmup=0, num_samples=5
    )
    with pytest.raises(ValueError, match=match):
        mcmc.run(random.key(0), y_data)


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


@pytest.mark.parametrize("kernel_cls", [NOGIN, SGBD])
def test_sources_must_be_exactly_one(kernel_cls):
    with pytest.raises(ValueError, match="exactly one of model"):
        kernel_cls(step_size=0.1)
    with pytest.raises(ValueError, match="exactly one of model"):
        kernel_cls(gaussian_model, potential_fn=lambda z: z, step_size=0.1)


@pytest.mark.parametrize("kernel_cls", [NOGIN, SGBD])
def test_potential_fn_needs_init_params(kernel_cls):
    mcmc = MCMC(
        kernel_cls(potential_fn=lambda z: jnp.sum(z**2), step_size=0.1),
        num_warmup=0,
        num_samples=5,
        progress_bar=False,
    )
    with pytest.raises(ValueError, match="init_params is required"):
        mcmc.run(random.key(0))


@pytest.mark.parametrize(
    "noise_cov, match",
    [
        (None, r"NOGIN needs the covariance.*noise_cov="),
        (jnp.ones(2), r"noise_cov: covariance='lowrank' needs noise of shape \(d, k\)"),
    ],
)
def test_nogin_gradient_fn_needs_noise_cov_of_the_right_shape(noise_cov, match):
    def gradient_fn(rng_key, z):
        return GradientEstimate(z, noise_cov=noise_cov)

    mcmc = MCMC(
        NOGIN(gradient_fn=gradient_fn, step_size=0.1, covariance="lowrank"),
        num_warmup=0,
        num_samples=5,
    )
    with pytest.raises(ValueError, match=match):
        mcmc.run(random.key(0), init_params=jnp.zeros(2))


def test_corrected_gradient_fn_needs_noise_sd():
    kernel = SGBD(gradient_fn=lambda key, z: z, step_size=0.1, variant="corrected")
    mcmc = MCMC(kernel, num_warmup=0, num_samples=5, progress_bar=False)
    with pytest.raises(ValueError, match="noise_sd"):
        mcmc.run(random.key(0), init_params=jnp.zeros(2))


@ALL_KERNELS
def test_init_params_with_wrong_sites(y_data, kernel_name):
    mcmc = MCMC(
        KERNELS[kernel_name](gaussian_model),
        num_warmup=0,
        num_samples=5,
        progress_bar=False,
    )
    with pytest.raises(ValueError, match="init_params must be a dict"):
        mcmc.run(random.key(0), y_data, init_params={"sigma": 1.0})


@ALL_KERNELS
def test_progress_bar_diagnostics(y_data, kernel_name):
    kernel = KERNELS[kernel_name](gaussian_model)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(random.key(0), y_data)
    text = kernel.get_diagnostics_str(mcmc.last_state)
    kernel._diagnostics = (0, "")
    text = kernel.get_diagnostics_str(mcmc.last_state)
    assert text.startswith("U_hat ")
    expected = {
        "SGBD": ["tau_hat ", "over tolerance"],
        "SGLD": [],  # vanilla: no noise estimate
        "NOGIN": ["noise_damping "],
    }[kernel_name]
    assert all(part in text for part in expected), text


@ALL_KERNELS
def test_numpy_data_is_accepted(y_data, kernel_name):
    # NumPy arrays cannot be indexed by traced minibatch indices; the kernel must
    # convert them rather than fail inside jit.
    mcmc = MCMC(
        KERNELS[kernel_name](gaussian_model),
        num_warmup=0,
        num_samples=20,
        progress_bar=False,
    )
    mcmc.run(random.key(0), np.asarray(y_data))
    assert np.all(np.isfinite(mcmc.get_samples()["mu"]))
    idata = az.from_numpyro(mcmc, log_likelihood=True)  # by default under ArviZ 0.x
    assert idata.log_likelihood["y"].shape == (1, 20, N_DATA)


@pytest.mark.parametrize(
    "kernel_cls, kwargs", [(SGBD, {"variant": "corrected"}), (NOGIN, {})]
)
def test_jit_model_args_gives_the_same_draws(y_data, kernel_cls, kwargs):
    # With jit_model_args=True the data are traced arguments of NumPyro's loop,
    # not constants; the chain must not change.
    draws = []
    for jit_model_args in (False, True):
        kernel = kernel_cls(gaussian_model, step_size=0.05, **kwargs)
        mcmc = MCMC(
            kernel,
            num_warmup=20,
            num_samples=50,
            progress_bar=False,
            jit_model_args=jit_model_args,
        )
        mcmc.run(random.key(3), y_data, init_params={"mu": jnp.array(1.0)})
        draws.append(np.asarray(mcmc.get_samples()["mu"]))
    np.testing.assert_allclose(draws[0], draws[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "d, n, form",
    [
        (21, 1000, "full"),
        (1000, 100, "lowrank"),
        (5, 0, "diag"),
        (20_000, 30_000, "diag"),
    ],
)
def test_nogin_per_step_form_is_the_cheaper_one(d, n, form):
    from numpyro_sgbd.samplers import per_step_covariance

    assert per_step_covariance(d, n)[0] == form


def test_nogin_default_form_is_the_running_estimate_with_noise():
    from numpyro_sgbd.samplers import choose_covariance, choose_rank

    assert choose_covariance(5, 0)[0] == "diag"  # exact gradients
    for d, n in [(3, 100), (501, 300), (5000, 500)]:
        form, why = choose_covariance(d, n, 10**4)
        assert form == "lowrank+diag" and "no d x d" in why
    assert "exact" in choose_covariance(20, 100)[1]
    assert (choose_rank(20), choose_rank(501), choose_rank(501, 8)) == (20, 32, 8)


def test_nogin_auto_covariance_is_resolved_at_init_and_logged(y_data, caplog):
    import logging

    kernel = NOGIN(gaussian_model, step_size=0.5, mass=0.03**-2)
    assert kernel.noise_form == "auto"
    mcmc = MCMC(kernel, num_warmup=0, num_samples=5, progress_bar=False)
    with caplog.at_level(logging.INFO, logger="numpyro_sgbd"):
        mcmc.run(random.key(0), y_data)
    assert kernel.noise_form == "lowrank+diag"
    assert "covariance='lowrank+diag'" in caplog.text
    with pytest.raises(ValueError, match="name the form"):
        NOGIN(gradient_fn=lambda key, z: None, step_size=0.5)
