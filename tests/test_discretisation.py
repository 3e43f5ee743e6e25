"""The default sampling step that serves the run's length and each run's own error
estimate (issue 60, items 1 and 2; :mod:`numpyro_sgbd.discretisation`).

The model is a Gaussian linear regression, whose posterior is exactly Gaussian:
whitened by its Laplace approximation it is N(0, I) in u, where each rule's bias
law was measured, and its exact sds are known, so a run's xi needs no NUTS."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

import numpyro_sgbd
from numpyro_sgbd import BAOAB, NOGIN, SGBD, SGHMC, SGLD, SGNHT, discretisation
from numpyro_sgbd.discretisation import BiasLaw
from numpyro_sgbd.evaluation import _arviz

pytestmark = pytest.mark.heavy

N, D, PRIOR_SD = 2000, 16, 10.0


def _design():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, D))
    y = x @ rng.normal(size=D) + rng.normal(size=N)
    cov = np.linalg.inv(x.T @ x + np.eye(D) / PRIOR_SD**2)
    return x.astype(np.float32), y.astype(np.float32), cov @ (x.T @ y), cov


X, Y, EXACT_MEAN, EXACT_COV = _design()
EXACT_SD = np.sqrt(np.diag(EXACT_COV))


def regression(x, y):
    b = numpyro.sample("b", dist.Normal(0.0, PRIOR_SD).expand([D]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ b, 1.0), obs=y[idx])


def _run(kernel, num_samples, seed=0, num_warmup=2000):
    mcmc = MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.key(seed), X, Y)
        numpyro_sgbd.check(mcmc)
    return mcmc, caught


def _xi(mcmc):
    sd = np.asarray(mcmc.get_samples()["b"]).std(axis=0, ddof=1)
    return np.linalg.norm(sd - EXACT_SD) / np.linalg.norm(EXACT_SD)


LAWS = [BiasLaw(0.26, 0.04, 2, 0.25, 2.0), BiasLaw(1.3, 0.0, 1, 0.42, 1.0)]


@pytest.mark.parametrize("law", LAWS, ids=["second order", "first order"])
@pytest.mark.parametrize("num_steps", [10_000, 10**6])
def test_the_run_step_puts_the_bias_at_half_the_monte_carlo_error(law, num_steps):
    tau2 = 0.3
    h = float(discretisation.run_step(law, tau2, num_steps))
    ess = law.ess_rate * num_steps * h**law.ess_order
    bias = discretisation.sd_bias(law, h, tau2)
    assert bias == pytest.approx(0.5 * float(discretisation.mc_sd_error(ess)), 1e-5)
    # and a longer run samples at a smaller step, with a smaller error
    longer = float(discretisation.run_step(law, tau2, 4 * num_steps))
    power = 1.0 / (2 * law.order + law.ess_order)
    assert longer / h == pytest.approx(4.0**-power, 1e-5)


def test_a_law_without_bias_leaves_the_step_alone():
    assert np.isinf(discretisation.run_step(BiasLaw(0.0, 0.0, 1, 0.4, 1.0), 0.1, 1e4))


@pytest.fixture(scope="module")
def sgbd_runs():
    """The default SGBD on the same warmup (same key), sampling 8,000 and
    64,000 draws."""
    kernel, runs = SGBD(regression), {}
    for n in (8_000, 64_000):
        mcmc = _run(kernel, n)[0]
        runs[n] = (mcmc, kernel.error_estimate, _xi(mcmc))
    return runs


def test_the_default_sampling_step_falls_with_the_run(sgbd_runs):
    short, long = (float(sgbd_runs[n][0].last_state.step_size) for n in sgbd_runs)
    # Both below warmup's step, the same warmup (and so the same noise): the
    # step scales as the run's length to the power -1 / (2 p + q) = -1 / 6.
    assert short < 0.5
    assert long / short == pytest.approx(8.0 ** (-1 / 6), rel=1e-4)


def test_the_default_run_states_its_error_and_it_is_about_right(sgbd_runs):
    for n, (mcmc, found, xi) in sgbd_runs.items():
        assert found["step"] == pytest.approx(float(mcmc.last_state.step_size))
        # Planned as half: the bias sits near half the Monte Carlo error.
        assert 0.25 < found["sd_bias"] / found["mc_error"] < 1.0
        assert 0.5 < found["xi"] / xi < 2.0, n


def test_a_given_step_is_used_as_given():
    kernel = SGBD(regression, step_size=0.3, variant="corrected")
    short, _ = _run(kernel, 500)
    long, _ = _run(kernel, 4000)
    first = np.asarray(long.get_samples()["b"])[:500]
    np.testing.assert_array_equal(np.asarray(short.get_samples()["b"]), first)


def test_a_refit_with_another_warmup_is_not_the_first_fits_program():
    kernel = SGBD(regression)
    _run(kernel, 200, num_warmup=50)
    again = _run(kernel, 200, num_warmup=400)[0]
    fresh = _run(SGBD(regression), 200, num_warmup=400)[0]
    np.testing.assert_array_equal(
        np.asarray(again.get_samples()["b"]), np.asarray(fresh.get_samples()["b"])
    )


#: Each sampler's default, and a given step twice its target in u (about three
#: times the default's sampling step at 40,000 draws; the laws were measured up
#: to twice the target; a given scalar step acts in u where a preconditioner is
#: asked for; control variates as the default's, so that the noise stays in the
#: range the laws were measured over, tau h <= 1), where the bias, which the
#: law predicts, is most of the error.
IN_U = {"preconditioner": "dense", "gradient": "control_variates"}
SAMPLERS = {
    "SGBD": (SGBD, {"variant": "corrected", **IN_U}),
    "SGLD": (SGLD, {"variant": "corrected", **IN_U}),
    "SGHMC": (SGHMC, IN_U),
    "SGNHT": (SGNHT, IN_U),
    "NOGIN": (NOGIN, {}),
    "BAOAB": (BAOAB, {}),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_the_estimated_xi_is_within_a_factor_two_of_the_exact_one(name):
    sampler, options = SAMPLERS[name]
    default, caught = _run(sampler(regression), 40_000)
    found = default.sampler.error_estimate
    assert 0.5 < found["xi"] / _xi(default) < 2.0
    assert "bias" not in default.sampler.run_warnings, [str(w.message) for w in caught]
    if not sampler(regression).bias_law().c:
        return  # no bias to predict: the estimate is the Monte Carlo error
    step = 2 * sampler.step_target()
    biased, caught = _run(sampler(regression, step_size=step, **options), 40_000)
    found = biased.sampler.error_estimate
    assert found["sd_bias"] > found["mc_error"]
    assert 0.5 < found["xi"] / _xi(biased) < 2.0
    assert biased.sampler.run_warnings == ("bias",)
    (warning,) = [w for w in caught if "bias law" in str(w.message)]
    assert f"step_size={found['step_for_mc']:.2g}" in str(warning.message)


def test_the_noise_enters_where_the_step_acts():
    state = discretisation.NoiseParts(jnp.full(4, 2.0), None)
    assert float(discretisation.noise_sq(state)) == pytest.approx(4.0)
    assert float(discretisation.noise_sq(discretisation.NoiseParts(None, None))) == 0.0


def test_compare_shows_the_estimated_xi_beside_the_measured_one(sgbd_runs):
    rng = np.random.default_rng(0)
    exact = rng.multivariate_normal(EXACT_MEAN, EXACT_COV, size=(2, 20_000))
    reference = _arviz.from_dict({"posterior": {"b": exact}})
    mcmc = sgbd_runs[64_000][0]  # the kernel holds its last run's estimate
    table = numpyro_sgbd.compare({"SGBD": mcmc}, reference, ksd_draws=0)
    row = table.summary.loc["SGBD"]
    assert 0.5 < row["est_xi"] / row["xi"] < 2.0
    assert np.isnan(table.summary.loc["reference", "est_xi"])
    assert "est_xi" in str(table)


def test_no_law_away_from_the_hyperparameters_it_was_measured_at():
    def potential(z):
        return 0.5 * jnp.sum(z**2)

    def law(sampler, **options):
        return sampler(potential_fn=potential, step_size=0.1, **options).bias_law()

    assert law(SGBD) is not None and law(SGBD, increment="gaussian") is None
    assert law(SGHMC) is not None and law(SGHMC, friction=2.0) is None
    assert law(SGHMC, mass={"x": 1.0}) is None  # per site: not the scalar default
    assert law(BAOAB) is not None and law(BAOAB, mass=2.0) is None
    assert law(SGNHT) is not None and law(SGNHT, diffusion=3.0) is None
