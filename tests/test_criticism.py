"""The log-likelihood of every data row, in chunks, and ArviZ data that carry it."""

import arviz as az
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
from numpyro.infer.util import log_likelihood
import pytest

from numpyro_sgbd import (
    SGLD,
    from_numpyro,
    full_batch,
    full_data_log_likelihood,
)
from numpyro_sgbd.evaluation import _arviz

N = 37  # rows; the chunks below do not divide it
SUBSAMPLE = 5


def regression_model(X, y, z, total):
    """Every kind of observed site: one datum per row (``y``), several per row in a
    plate nested inside the subsample plate at dim -2 (``z``), and one outside it
    (``total``); a per-row deterministic site, whose draws must not be substituted."""
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    numpyro.sample("total", dist.Normal(w.sum(), 1.0), obs=total)
    with numpyro.plate("data", X.shape[0], subsample_size=SUBSAMPLE, dim=-2) as idx:
        mean = numpyro.deterministic("mean", X[idx] @ w)
        numpyro.sample("y", dist.Normal(mean[:, None], s), obs=y[idx, None])
        with numpyro.plate("features", z.shape[1], dim=-1):
            numpyro.sample("z", dist.Normal(mean[:, None], 2 * s), obs=z[idx])


def gaussian_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 2))  # NumPy data, indexed by traced chunk indices
    args = (X, rng.normal(size=N), rng.normal(size=(N, 3)), 0.3)
    draws = {  # (chain, draw, ...)
        "w": jnp.asarray(rng.normal(size=(2, 4, 2))),
        "s": jnp.asarray(rng.uniform(0.5, 2.0, size=(2, 4))),
    }
    draws["mean"] = jnp.zeros((2, 4, N))  # stale per-row values: ignored
    return args, draws


def test_chunks_agree_with_the_unchunked_full_batch_log_likelihood(regression):
    args, draws = regression
    ll = full_data_log_likelihood(
        regression_model, draws, *args, batch_ndims=2, chunk_size=10
    )
    latent = {k: draws[k] for k in ("w", "s")}
    exact = log_likelihood(full_batch(regression_model), latent, *args, batch_ndims=2)
    assert set(ll) == {"y", "z", "total"}
    assert ll["y"].shape == (2, 4, N, 1) and ll["z"].shape == (2, 4, N, 3)
    assert ll["total"].shape == (2, 4)
    for name in exact:
        np.testing.assert_allclose(ll[name], exact[name], rtol=1e-6, atol=1e-6)
    # Row i is datum i (not a minibatch's, not scaled by N/n), as by hand.
    X, y, _, _ = args
    w, s = np.asarray(draws["w"][1, 2]), float(draws["s"][1, 2])
    by_hand = dist.Normal(X @ w, s).log_prob(y)
    np.testing.assert_allclose(ll["y"][1, 2, :, 0], by_hand, rtol=1e-5)


def test_one_draw_in_chunks_of_one_row():
    y = jnp.arange(25.0)
    draw = {"mu": jnp.array(1.5)}
    ll = full_data_log_likelihood(gaussian_model, draw, y, batch_ndims=0, chunk_size=1)
    expected = dist.Normal(1.5, 1.0).log_prob(y)
    np.testing.assert_allclose(ll["y"], expected, rtol=1e-6)


def test_model_without_a_subsample_plate_is_evaluated_whole():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y, draws = jnp.arange(4.0), {"mu": jnp.array([0.0, 2.0])}
    ll = full_data_log_likelihood(model, draws, y, chunk_size=3)
    np.testing.assert_allclose(ll["y"], log_likelihood(model, draws, y)["y"])


def test_unsupported_models_and_arguments_are_clear_errors():
    def two_plates(a, b):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("a", a.shape[0], subsample_size=2) as i:
            numpyro.sample("a_obs", dist.Normal(mu, 1.0), obs=a[i])
        with numpyro.plate("b", b.shape[0], subsample_size=2) as j:
            numpyro.sample("b_obs", dist.Normal(mu, 1.0), obs=b[j])

    draws = {"mu": jnp.zeros(3)}
    with pytest.raises(ValueError, match=r"subsamples \['a', 'b'\].*subsample_size"):
        full_data_log_likelihood(two_plates, draws, jnp.ones(5), jnp.ones(6))
    y = jnp.ones(30)
    with pytest.raises(ValueError, match=r"lacks the latent site\(s\) \['mu'\]"):
        full_data_log_likelihood(gaussian_model, {"nu": jnp.zeros(3)}, y)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="chunk_size must be a positive int"):
            full_data_log_likelihood(gaussian_model, draws, y, chunk_size=bad)
    with pytest.raises(ValueError, match="same 2 leading batch axes"):
        full_data_log_likelihood(gaussian_model, draws, y, batch_ndims=2)


@pytest.fixture(scope="module")
def run():
    y = 1.0 + random.normal(random.key(5), (101,))
    mcmc = MCMC(
        SGLD(
            gaussian_model, step_size=0.02, variant="corrected", log_likelihood_size=20
        ),
        num_warmup=50,
        num_samples=60,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(random.key(6), y)
    return mcmc, y


def test_from_numpyro_holds_every_row(run, tmp_path):
    mcmc, y = run
    data = from_numpyro(mcmc, chunk_size=30)
    assert _arviz.is_inference_data(data)
    group = _arviz.group(data, "log_likelihood")
    assert group["y"].dims == ("chain", "draw", "y_dim_0")
    assert group["y"].shape == (2, 60, 101)
    assert group.attrs["log_likelihood_rows"] == "all"
    assert group.attrs["log_likelihood_size"] == group.attrs["data_size"] == 101
    assert group.attrs["log_likelihood_plate"] == "data"
    samples = mcmc.get_samples(group_by_chain=True)
    exact = log_likelihood(full_batch(gaussian_model), samples, y, batch_ndims=2)
    np.testing.assert_allclose(group["y"].values, exact["y"], rtol=1e-6)
    np.testing.assert_array_equal(
        _arviz.group(data, "posterior")["mu"].values, samples["mu"]
    )
    assert az.loo(data).n_data_points == 101
    # The attributes travel with the group through netCDF.
    back = _arviz.from_netcdf(_arviz.to_netcdf(data, tmp_path / "run.nc"))
    assert _arviz.group(back, "log_likelihood").attrs["log_likelihood_rows"] == "all"


def test_from_numpyro_keeps_the_subset_when_asked(run):
    mcmc, _ = run
    data = from_numpyro(mcmc, log_likelihood="subset")
    group = _arviz.group(data, "log_likelihood")
    assert group["y"].shape == (2, 60, 20)  # the kernel's log_likelihood_size
    assert group.attrs["log_likelihood_rows"] == "subset"
    assert group.attrs["log_likelihood_size"] == 20
    assert group.attrs["data_size"] == 101
    assert az.loo(data).n_data_points == 20
    none = from_numpyro(mcmc, log_likelihood=False)
    assert "log_likelihood" not in _arviz.group_names(none)
    assert "posterior" in _arviz.group_names(none)


@pytest.mark.parametrize("bad", [True, None, "full", "ALL"])
def test_from_numpyro_checks_log_likelihood_before_any_work(bad):
    # Not an MCMC: any work would fail with another error.
    with pytest.raises(ValueError, match=r"log_likelihood must be 'all'.*'subset'"):
        from_numpyro(object(), log_likelihood=bad)
    with pytest.raises(ValueError, match="chunk_size"):
        from_numpyro(object(), chunk_size=-1)


def test_from_numpyro_needs_a_model():
    kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z**2), step_size=0.1)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=5, progress_bar=False)
    for rows in ("all", "subset"):  # raised before az.from_numpyro: no run needed
        with pytest.raises(ValueError, match="from a model.*log_likelihood=False"):
            from_numpyro(mcmc, log_likelihood=rows)
