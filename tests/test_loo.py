"""ArviZ's ``log_likelihood`` of a kernel's run holds every data row (issue 58,
item 3): ``az.loo(az.from_numpyro(mcmc))`` on a stochastic-gradient run is
NUTS's over all rows, and a subset, where N makes every row too costly, says
so."""

import warnings

import arviz as az
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import log_likelihood
import pytest

from numpyro_sgbd import SGBD, SGLD, from_numpyro, full_batch
from numpyro_sgbd import prepare as prepare_module
from numpyro_sgbd.evaluation import _arviz

SUBSET = "az.from_numpyro evaluates"  # in the warning of a default subset

# The short runs here are not meant to converge.
pytestmark = pytest.mark.filterwarnings(
    "ignore::numpyro_sgbd.monitoring.ConvergenceWarning"
)


def logistic(X, y, n=500):
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=n) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=a + X[idx] @ b), obs=y[idx])


def gaussian(y, n=20):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def random_effects(y, n=10):
    """A local site: a latent effect per row, two replicates a row."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
        u = numpyro.sample("u", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(u[:, None], sigma).to_event(1), obs=y[idx])


def _loo(data):
    """``(elpd, n_data_points)`` of ``az.loo(data)`` (``elpd_loo`` under ArviZ
    0.x, ``elpd`` under 1.x)."""
    result = az.loo(data)
    elpd = getattr(result, "elpd_loo", None)
    elpd = result.elpd if elpd is None else elpd
    return float(elpd), int(result.n_data_points)


def _mcse_elpd_loo(data):
    r"""The Monte Carlo standard error of the elpd_loo of ``data``'s draws, by the
    delta method: elpd_loo = -sum_i log mean_s u_is with u_is = 1 / p(y_i |
    theta_s) (the importance ratios of Vehtari, Gelman & Gabry 2017, eq. 10,
    before smoothing), whose linearisation is -mean_s g_s with
    g_s = sum_i u_is / mean_s u_is; its MCSE is ArviZ's MCSE of the mean of g
    over the chains and draws (their autocorrelation included)."""
    ll = np.asarray(_arviz.group(data, "log_likelihood")["y"], np.float64)
    log_u = -ll.reshape(-1, ll.shape[-1])
    log_mean = np.logaddexp.reduce(log_u, axis=0) - np.log(log_u.shape[0])
    g = np.exp(log_u - log_mean).sum(-1).reshape(ll.shape[:2])
    with warnings.catch_warnings():  # ArviZ 0.x warns of one chain
        warnings.simplefilter("ignore")
        return float(az.mcse(az.convert_to_dataset({"g": g}))["g"])


def test_arviz_loo_of_an_sg_run_is_nuts_loo_over_every_row():
    """``az.loo(az.from_numpyro(mcmc))`` on SGLD's default run of a 10,000-row
    logistic regression (n = 500) equals ``az.loo`` of NUTS on ``full_batch`` of
    the same model, within four Monte Carlo standard errors of the difference
    (the two runs' MCSEs of elpd_loo in quadrature, :func:`_mcse_elpd_loo`;
    fixed keys, a failure rate below 1e-4 for exact draws); both over all
    10,000 rows. Before issue 58 ArviZ read the plate's 500 evaluation rows
    (elpd_loo about a twentieth of NUTS's): the test failed there (checked);
    with SGLD's noise sd too large by sqrt(2) it fails (elpd_loo -5,817.8
    against -5,814.2, 7 MCSEs; checked)."""
    N = 10_000
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 2)).astype(np.float32)
    p = 1.0 / (1.0 + np.exp(-(0.3 + X @ np.array([1.0, -0.5]))))
    y = jnp.asarray((rng.random(N) < p).astype(np.float32))
    X = jnp.asarray(X)
    # 1,000 draws kept of 2,000 (PSIS's cost is draws x rows); ESS about 100.
    sg = MCMC(
        SGLD(logistic),
        num_warmup=1000,
        num_samples=2000,
        thinning=2,
        progress_bar=False,
    )
    sg.run(random.key(1), X, y)
    nuts = MCMC(
        NUTS(full_batch(logistic)), num_warmup=500, num_samples=500, progress_bar=False
    )
    nuts.run(random.key(2), X, y)
    # ArviZ 1.x builds the group only when asked; 0.x by default.
    sg_data = az.from_numpyro(sg, log_likelihood=True)
    nuts_data = az.from_numpyro(nuts, log_likelihood=True)
    (sg_elpd, sg_rows), (nuts_elpd, nuts_rows) = _loo(sg_data), _loo(nuts_data)
    assert sg_rows == nuts_rows == N
    mcse = np.hypot(_mcse_elpd_loo(sg_data), _mcse_elpd_loo(nuts_data))
    assert abs(sg_elpd - nuts_elpd) < 4 * mcse, (sg_elpd, nuts_elpd, mcse)


@pytest.fixture(scope="module")
def y300():
    return 1.0 + random.normal(random.key(0), (300,))


def _run(kernel, *args, num_samples=40):
    mcmc = MCMC(kernel, num_warmup=40, num_samples=num_samples, progress_bar=False)
    mcmc.run(random.key(1), *args)
    return mcmc


def _subset_warnings(record):
    return [str(w.message) for w in record if SUBSET in str(w.message)]


def test_log_likelihood_and_observed_data_hold_every_row_by_default(y300):
    """The default: ArviZ's ``log_likelihood`` is NumPyro's of ``full_batch``
    over all 300 rows, in order, and ``observed_data`` every datum, with no
    warning. Before issue 58 they held the plate's 20 evaluation rows
    (failed there: checked). ``log_likelihood_size=30`` holds 30 rows,
    sorted, and the same draws (the rows are no part of the chain)."""
    mcmc = _run(SGLD(gaussian, step_size=0.02), y300)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        data = az.from_numpyro(mcmc, log_likelihood=True)
    assert not _subset_warnings(record)
    draws = mcmc.get_samples(group_by_chain=True)
    exact = log_likelihood(full_batch(gaussian), draws, y300, batch_ndims=2)["y"]
    group = _arviz.group(data, "log_likelihood")
    np.testing.assert_allclose(group["y"].values, exact, rtol=1e-6)
    observed = _arviz.group(data, "observed_data")["y"].values
    np.testing.assert_array_equal(observed, np.asarray(y300))

    kernel = SGLD(gaussian, step_size=0.02, log_likelihood_size=30)
    subset = _run(kernel, y300)
    np.testing.assert_array_equal(subset.get_samples()["mu"], draws["mu"][0])
    rows = np.asarray(kernel.log_likelihood_indices["data"])
    assert len(rows) == 30 and np.all(np.diff(rows) > 0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = az.from_numpyro(subset, log_likelihood=True)
    assert not _subset_warnings(record)  # asked for: no warning
    got = _arviz.group(got, "log_likelihood")["y"].values
    np.testing.assert_allclose(got, exact[..., rows], rtol=1e-6)


def test_a_subset_above_the_size_limit_warns_and_names_the_fix(y300):
    """Above :data:`~numpyro_sgbd.prepare.LOG_LIKELIHOOD_ALL_ROWS` rows (lowered
    here to 50) the default rows are a random 50, and ArviZ's call warns with
    the count and the argument that changes it; ``numpyro_sgbd.from_numpyro``
    still holds every row, without the warning, and its ``"subset"`` group says
    it is one. With the limit not applied (every row kept) the test fails
    (checked)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prepare_module, "LOG_LIKELIHOOD_ALL_ROWS", 50)
        mcmc = _run(SGLD(gaussian, step_size=0.02), y300, num_samples=20)
    with pytest.warns(UserWarning, match=SUBSET) as record:
        data = az.from_numpyro(mcmc, log_likelihood=True)
    # ArviZ 1.x reads kernel.model more than once: one message, maybe repeated.
    (message,) = set(_subset_warnings(record))
    assert "50 of the 300 rows of plate 'data'" in message
    assert "log_likelihood_size=300 to SGLD" in message
    assert _arviz.group(data, "log_likelihood")["y"].shape == (1, 20, 50)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        every = from_numpyro(mcmc)
    assert not _subset_warnings(record)
    group = _arviz.group(every, "log_likelihood")
    assert group["y"].shape == (1, 20, 300)
    assert group.attrs["log_likelihood_rows"] == "all"
    with pytest.warns(UserWarning, match=SUBSET):
        subset = from_numpyro(mcmc, log_likelihood="subset")
    attrs = _arviz.group_attrs(subset, "log_likelihood")
    assert attrs["log_likelihood_rows"] == "subset"
    assert attrs["log_likelihood_size"] == 50 and attrs["data_size"] == 300


def test_local_sites_give_each_rows_likelihood_at_its_own_draw():
    """A latent effect per row: ArviZ's ``log_likelihood`` of row i at draw s
    is log N(y_i | u_si, sigma_s) over every row (the draws hold every row's
    u). Before issue 58 it held the minibatch's 10 rows, and with each row's u
    read from another row (the rows reversed) it fails (both checked)."""
    rng = np.random.default_rng(2)
    y = jnp.asarray(rng.normal(1.0, 1.0, (40, 1)) + rng.normal(0, 0.5, (40, 2)))
    mcmc = _run(SGBD(random_effects, step_size=0.01), y, num_samples=10)
    data = az.from_numpyro(mcmc, log_likelihood=True)
    got = _arviz.group(data, "log_likelihood")["y"].values[0]
    draws = mcmc.get_samples()
    expected = dist.Normal(draws["u"][..., None], draws["sigma"][:, None, None])
    expected = expected.to_event(1).log_prob(y)
    assert got.shape == (10, 40)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "all"])
def test_log_likelihood_size_is_checked_when_the_kernel_is_built(bad):
    with pytest.raises(ValueError, match="log_likelihood_size must be a positive"):
        SGLD(gaussian, step_size=0.02, log_likelihood_size=bad)
