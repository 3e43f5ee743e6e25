"""full_batch: the exact full-data potential and posterior of the same model code."""

import json
import logging
from pathlib import Path
import shutil
import warnings

import arviz as az
import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import potential_energy
import pytest

from numpyro_sgbd import (
    full_batch,
    full_batch_scores,
    posterior_mode,
    reference_posterior,
)
from numpyro_sgbd.evaluation import _arviz, laplace
from numpyro_sgbd.evaluation.cache import _cache_key


def scale_model(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 2.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=7) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, sigma), obs=y[idx])


def test_full_batch_potential_is_the_full_data_potential():
    kx, ky = random.split(random.key(0))
    X = random.normal(kx, (50, 3))
    y = random.normal(ky, (50,))
    z = {"w": jnp.array([0.3, -1.0, 2.0]), "sigma": jnp.array(0.4)}  # unconstrained
    got = potential_energy(full_batch(scale_model), (X, y), {}, z)
    # Hand-written: priors, the log-transform's Jacobian, all 50 terms, no N/n.
    w, log_sigma = z["w"], z["sigma"]
    sigma = jnp.exp(log_sigma)
    expected = -(
        dist.Normal(0.0, 2.0).log_prob(w).sum()
        + dist.HalfNormal(1.0).log_prob(sigma)
        + log_sigma
        + dist.Normal(X @ w, sigma).log_prob(y).sum()
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_nuts_on_full_batch_matches_the_conjugate_posterior():
    prior_sd = 10.0

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, prior_sd))
        with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    y = 1.5 + random.normal(random.key(1), (400,))
    precision = 1.0 / prior_sd**2 + y.shape[0]
    mean, sd = float(jnp.sum(y) / precision), float(precision**-0.5)
    mcmc = MCMC(
        NUTS(full_batch(model)),
        num_warmup=500,
        num_samples=2000,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(random.key(2), y)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])
    ess = float(az.ess(draws))
    # 4 MCSE: a false alarm about once in 10^4 runs. A plate left at 10 of the 400
    # points (scaled by 40) fails both checks by far; tried by hand.
    assert abs(draws.mean() - mean) < 4 * sd / np.sqrt(ess)
    assert abs(draws.std() - sd) < 4 * sd / np.sqrt(2 * ess)


# ----------------------------------------------------------------------------------
# full_batch_scores


def test_full_batch_scores_are_the_unconstrained_full_data_score():
    kx, ky, kw = random.split(random.key(3), 3)
    X = random.normal(kx, (40, 3))
    y = random.normal(ky, (40,))
    theta = {
        "w": random.normal(kw, (5, 3)),
        "sigma": jnp.array([0.3, 0.5, 1.0, 2.0, 4.0]),
    }

    def log_density(z):  # hand-written, unconstrained sigma = exp(z["sigma"])
        sigma = jnp.exp(z["sigma"])
        return (
            dist.Normal(0.0, 2.0).log_prob(z["w"]).sum()
            + dist.HalfNormal(1.0).log_prob(sigma)
            + z["sigma"]
            + dist.Normal(X @ z["w"], sigma).log_prob(y).sum()
        )

    z_expected = {"w": theta["w"], "sigma": jnp.log(theta["sigma"])}
    s_expected = jax.vmap(jax.grad(log_density))(z_expected)
    for chunk_size in (None, 1, 2):  # 2 leaves a short, padded last chunk
        z, s = full_batch_scores(scale_model, theta, X, y, chunk_size=chunk_size)
        for name in theta:
            np.testing.assert_allclose(z[name], z_expected[name], rtol=1e-5)
            np.testing.assert_allclose(s[name], s_expected[name], rtol=1e-4, atol=1e-4)


def test_full_batch_scores_bad_input():
    X, y = jnp.ones((10, 3)), jnp.ones(10)
    with pytest.raises(ValueError, match="lacks the latent site"):
        full_batch_scores(scale_model, {"w": jnp.ones((2, 3))}, X, y)
    with pytest.raises(ValueError, match="chunk_size"):
        full_batch_scores(
            scale_model,
            {"w": jnp.ones((2, 3)), "sigma": jnp.ones(2)},
            X,
            y,
            chunk_size=0,
        )


# ----------------------------------------------------------------------------------
# reference_posterior


def collinear_model(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=10) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


def test_reference_posterior_laplace_on_an_ill_conditioned_posterior():
    # Two nearly collinear covariates: posterior sds about 3 and 0.003 along the
    # two diagonals (condition number ~1e6, as far as float32 allows). The exact
    # posterior is Gaussian: precision X'X + I/100, mean its inverse times X'y.
    kx, ke, ky = random.split(random.key(4), 3)
    x = random.normal(kx, (2000,))
    X = jnp.stack([x, x + 1e-3 * random.normal(ke, (2000,))], axis=1)
    y = X @ jnp.array([1.0, 2.0]) + random.normal(ky, (2000,))
    Xd, yd = np.asarray(X, np.float64), np.asarray(y, np.float64)
    cov = np.linalg.inv(Xd.T @ Xd + np.eye(2) / 100.0)
    mean = cov @ Xd.T @ yd
    idata = reference_posterior(
        collinear_model,
        X,
        y,
        laplace=True,
        num_warmup=300,
        num_samples=1000,
        rng_key=random.key(5),
    )
    attrs = idata.posterior.attrs
    assert attrs["trustworthy"] == 1, attrs
    # Whitened by the Laplace covariance, the posterior is ~N(0, I): a few
    # leapfrog steps per draw, not the 1023 of a saturated tree.
    assert float(idata.sample_stats["n_steps"].mean()) < 8
    draws = idata.posterior["w"].values.reshape(-1, 2)
    # Along the eigenvectors of the covariance, the draws' means and variances
    # match within 4 MCSE (bulk ESS of each projection).
    eigval, eigvec = np.linalg.eigh(cov)
    proj = (draws - mean) @ eigvec / np.sqrt(eigval)  # ~N(0, I) if exact
    chains = proj.reshape(2, -1, 2)
    ess = np.asarray(az.ess(az.convert_to_dataset({"p": chains}))["p"])
    assert np.all(np.abs(proj.mean(0)) < 4 / np.sqrt(ess)), (proj.mean(0), ess)
    assert np.all(np.abs(proj.var(0) - 1) < 4 * np.sqrt(2 / ess)), proj.var(0)


def raw_scale_model(X, y):
    b = numpyro.sample("b", dist.Normal(0.0, 100.0))
    w = numpyro.sample("w", dist.Normal(0.0, 100.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(b + X[idx] @ w, 1.0), obs=y[idx])


def raw_scale_data(n=1000):
    """Covariates in raw units, as a user passes them: scales 1e-2, 1 and 1e2 with
    offsets of three sds, so the posterior sds span 1e4 and the intercept is
    correlated with every slope."""
    rng = np.random.default_rng(0)
    scales = np.array([1e-2, 1.0, 1e2])
    X = scales * (3.0 + rng.normal(size=(n, 3)))
    y = 1.0 + (X / scales) @ np.array([0.5, -1.0, 0.3]) + rng.normal(size=n)
    return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)


def test_the_default_whitens_an_ill_conditioned_posterior_and_is_trustworthy():
    # Plain NUTS (laplace=False, the default before "auto") with these settings
    # ends at R-hat 3.0, bulk ESS 2 and a quarter of the draws at the maximal tree
    # depth (tried by hand).
    X, y = raw_scale_data()
    idata = reference_posterior(raw_scale_model, X, y, num_warmup=300, num_samples=500)
    attrs = idata.posterior.attrs
    assert attrs["laplace"] == "dense", attrs["laplace_reason"]
    # Whitened for the sds' span (1e4); its condition number is below 1e3, so it
    # is not called ill-conditioned (issue 58, item 5).
    assert "span a ratio of 1e+04" in attrs["laplace_reason"]
    assert "ill-conditioned" not in attrs["laplace_reason"]
    assert attrs["trustworthy"] == 1, attrs
    assert float(idata.sample_stats["n_steps"].mean()) < 8
    # The posterior is Gaussian: each coefficient's mean within 4 MCSE of the
    # exact one (a false alarm about once in 10^4 per coefficient).
    Xd = np.column_stack([np.ones(X.shape[0]), np.asarray(X, np.float64)])
    precision = Xd.T @ Xd + np.eye(4) / 100.0**2
    exact = np.linalg.solve(precision, Xd.T @ np.asarray(y, np.float64))
    draws = np.concatenate(
        [idata.posterior["b"].values[..., None], idata.posterior["w"].values], -1
    )
    mcse = np.asarray(az.mcse(az.convert_to_dataset({"t": draws}))["t"])
    assert np.all(np.abs(draws.mean((0, 1)) - exact) < 4 * mcse), (
        draws.mean((0, 1)) - exact,
        mcse,
    )


def test_above_the_dense_limit_the_laplace_map_is_low_rank(monkeypatch):
    # The same posterior with the dense limit lowered below its d = 4: the Lanczos
    # space holds all of it, so the low-rank map whitens it as well.
    monkeypatch.setattr(laplace, "LAPLACE_DENSE_MAX_DIM", 2)
    X, y = raw_scale_data()
    idata = reference_posterior(raw_scale_model, X, y, num_warmup=300, num_samples=500)
    attrs = idata.posterior.attrs
    assert attrs["laplace"] == "lowrank", attrs["laplace_reason"]
    assert attrs["trustworthy"] == 1, attrs
    assert float(idata.sample_stats["n_steps"].mean()) < 8


def well_conditioned_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y[idx])


def test_the_default_keeps_plain_nuts_on_a_well_conditioned_posterior():
    y = 0.5 + random.normal(random.key(7), (20,))
    settings = dict(num_warmup=500, num_samples=1000)
    auto = reference_posterior(well_conditioned_model, y, **settings)
    attrs = auto.posterior.attrs
    assert attrs["laplace"] == "none", attrs["laplace_reason"]
    assert "well conditioned" in attrs["laplace_reason"]
    assert attrs["trustworthy"] == 1, attrs
    # The same draws as plain NUTS with the same key: the reference is unchanged.
    plain = reference_posterior(well_conditioned_model, y, laplace=False, **settings)
    for name in ("mu", "sigma"):
        np.testing.assert_array_equal(auto.posterior[name], plain.posterior[name])
    # And it agrees with plain NUTS run from another key: means within 4 combined
    # MCSE (a false alarm about once in 10^4 per site).
    other = reference_posterior(
        well_conditioned_model, y, laplace=False, rng_key=random.key(1), **settings
    )
    for name in ("mu", "sigma"):
        a, b = auto.posterior[name].values, other.posterior[name].values
        mcse = [float(az.mcse(az.convert_to_dataset({"t": v}))["t"]) for v in (a, b)]
        assert abs(a.mean() - b.mean()) < 4 * np.hypot(*mcse), (name, mcse)


def test_auto_falls_back_to_plain_nuts_only_where_no_laplace_map_exists(caplog):
    # b has a flat prior and no data: its curvature is 0, so the mode search ends
    # "not a mode" and no map exists (not even the diagonal).
    def model(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        numpyro.sample("b", dist.ImproperUniform(dist.constraints.real, (), ()))
        with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
            numpyro.sample("y", dist.Normal(a, 1.0), obs=y[idx])

    y = 4.0 + random.normal(random.key(8), (20,))
    settings = dict(num_warmup=100, num_samples=100)
    with caplog.at_level(logging.INFO, logger="numpyro_sgbd"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # whether NUTS converged is not tested
            idata = reference_posterior(model, y, **settings)
    attrs = idata.posterior.attrs
    assert attrs["laplace"] == "none"
    assert attrs["laplace_reason"].startswith("plain NUTS: ")
    assert "not positive" in attrs["laplace_reason"]
    assert any(
        r.levelno == logging.WARNING and "plain NUTS" in r.getMessage()
        for r in caplog.records
    )
    with pytest.raises(ValueError, match="not positive"):
        reference_posterior(model, y, laplace=True, **settings)


def test_a_hessian_rounding_made_singular_is_whitened_with_floored_eigenvalues():
    # Only a + b is identified: along a - b the curvature is the prior's, 1e-8 of
    # the data's, below what a float32 Hessian resolves (it rounds to singular).
    # The old float32 check left plain NUTS here; the floored dense map whitens,
    # and NUTS in u adapts to the sd along a - b the floor leaves above 1.
    def model(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1e4))
        b = numpyro.sample("b", dist.Normal(0.0, 1e4))
        with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
            numpyro.sample("y", dist.Normal(a + b, 1.0), obs=y[idx])

    y = 4.0 + random.normal(random.key(8), (20,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # whether NUTS converged is not tested
        idata = reference_posterior(model, y, num_warmup=100, num_samples=100)
    attrs = idata.posterior.attrs
    assert attrs["laplace"] == "dense", attrs["laplace_reason"]
    assert "floored" in attrs["laplace_reason"]
    assert "ill-conditioned" in attrs["laplace_reason"]


def test_the_advice_fits_what_was_used():
    X, y = raw_scale_data(200)
    settings = dict(num_warmup=0, num_samples=30, max_tree_depth=1)
    with pytest.warns(RuntimeWarning, match="not trustworthy") as record:
        reference_posterior(raw_scale_model, X, y, laplace=True, **settings)
    (message,) = [str(w.message) for w in record if "trustworthy" in str(w.message)]
    assert "far from Gaussian" in message and "laplace=True" not in message
    with pytest.warns(RuntimeWarning, match="not trustworthy") as record:
        reference_posterior(raw_scale_model, X, y, laplace=False, **settings)
    (message,) = [str(w.message) for w in record if "trustworthy" in str(w.message)]
    assert "laplace='auto'" in message and "far from Gaussian" not in message
    assert "dense_mass=True" in message and "max_tree_depth=3" in message


def test_reference_posterior_warns_and_strict_raises_when_not_converged():
    y = jnp.ones(20)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    settings = dict(num_warmup=0, num_samples=30, max_tree_depth=1)
    with pytest.warns(RuntimeWarning, match="not trustworthy.*ESS") as record:
        idata = reference_posterior(model, y, **settings)
    # Well conditioned: the advice is not to whiten (auto found no need).
    (message,) = [str(w.message) for w in record if "trustworthy" in str(w.message)]
    assert "well conditioned" in message
    assert idata.posterior.attrs["trustworthy"] == 0
    assert idata.posterior.attrs["frac_max_tree_depth"] > 0
    with pytest.raises(RuntimeError, match="not trustworthy"):
        reference_posterior(model, y, strict=True, **settings)


def test_reference_posterior_bad_input_is_refused_before_sampling():
    calls = []

    def model(y):
        calls.append(1)

    for kwargs, match in [
        (dict(num_chains=0), "num_chains"),
        (dict(num_samples=1.5), "num_samples"),
        (dict(target_accept_prob=1.0), "target_accept_prob"),
        (dict(chain_method="threads"), "chain_method"),
    ]:
        with pytest.raises(ValueError, match=match):
            reference_posterior(model, jnp.ones(3), **kwargs)
    assert not calls


_TRACES = []  # global, so not part of the cache key (closure values are)


def test_reference_posterior_cache_hit_and_miss_on_new_data(tmp_path):
    calls = _TRACES
    calls.clear()

    def model(y):
        _TRACES.append(1)  # once per trace: sampling traces the model
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    settings = dict(num_warmup=300, num_samples=500, cache_dir=tmp_path)
    y = random.normal(random.key(6), (30,))
    first = reference_posterior(model, y, **settings)
    assert calls and len(list(tmp_path.glob("*.nc"))) == 1
    calls.clear()
    second = reference_posterior(model, y, **settings)
    assert not calls  # loaded, not sampled
    np.testing.assert_array_equal(first.posterior["mu"], second.posterior["mu"])
    assert (
        second.posterior.attrs["sampling_time"]
        == first.posterior.attrs["sampling_time"]
    )
    third = reference_posterior(model, y.at[0].add(1.0), **settings)
    assert calls and len(list(tmp_path.glob("*.nc"))) == 2
    assert not np.array_equal(first.posterior["mu"], third.posterior["mu"])
    calls.clear()
    reference_posterior(model, y, **{**settings, "num_samples": 501})
    assert calls  # the settings are part of the key too


def test_a_cached_reference_records_its_settings_and_what_auto_chose(tmp_path):
    y = random.normal(random.key(6), (30,))
    settings = dict(num_warmup=300, num_samples=500, cache_dir=tmp_path)
    first = reference_posterior(_traced_model, y, **settings)
    _TRACES.clear()
    loaded = reference_posterior(_traced_model, y, **settings)
    assert not _TRACES  # loaded, not sampled
    attrs = loaded.posterior.attrs
    recorded = json.loads(attrs["settings"])
    assert recorded["laplace"] == "auto"
    assert recorded["num_samples"] == 500 and recorded["num_warmup"] == 300
    assert attrs["laplace"] == first.posterior.attrs["laplace"] == "none"
    assert attrs["laplace_reason"] == first.posterior.attrs["laplace_reason"]
    # "auto" is part of the key: forced off is another file, though it samples the
    # same draws here.
    plain = reference_posterior(_traced_model, y, laplace=False, **settings)
    assert len(list(tmp_path.glob("*.nc"))) == 2
    assert json.loads(plain.posterior.attrs["settings"])["laplace"] is False


def _traced_model(y):
    _TRACES.append(1)
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def _cached_reference(tmp_path, **settings):
    """Sample a small reference into tmp_path; return (its cache file, settings).

    Too short to be trusted: the callers ignore that warning."""
    settings = dict(num_warmup=50, num_samples=50, cache_dir=tmp_path, **settings)
    reference_posterior(_traced_model, jnp.ones(30), **settings)
    (path,) = tmp_path.glob("*.nc")
    return path, settings


@pytest.mark.filterwarnings("ignore:The NUTS reference posterior is not trustworthy")
@pytest.mark.parametrize("written_by", ["arviz0", "arviz1"])
def test_a_cache_written_under_either_arviz_version_loads(tmp_path, written_by):
    # reference-arviz0.nc: InferenceData.to_netcdf of the code before ArviZ 1.x
    # support, under ArviZ 0.23; reference-arviz1.nc: this code under ArviZ 1.3.
    path, settings = _cached_reference(tmp_path)
    fixture = Path(__file__).parent / "data" / f"reference-{written_by}.nc"
    shutil.copy(fixture, path)
    _TRACES.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # neither unreadable nor bad
        idata = reference_posterior(_traced_model, jnp.ones(30), **settings)
    assert not _TRACES  # loaded, not sampled
    assert _arviz.is_inference_data(idata)
    assert idata.posterior["mu"].shape == (2, 1000)  # the fixture's draws
    assert idata.posterior.attrs["trustworthy"] == 1
    assert float(idata.sample_stats["n_steps"].mean()) >= 1


@pytest.mark.filterwarnings("ignore:The NUTS reference posterior is not trustworthy")
@pytest.mark.parametrize("content", ["not netCDF", "no attributes"])
def test_an_unusable_cache_file_is_sampled_again_with_a_warning(tmp_path, content):
    path, settings = _cached_reference(tmp_path)
    if content == "not netCDF":
        path.write_bytes(b"half a file")
    else:
        draws = {"mu": np.zeros((2, 50))}
        stats = {"diverging": np.zeros((2, 50), bool)}
        _arviz.to_netcdf(
            _arviz.from_dict({"posterior": draws, "sample_stats": stats}), path
        )
    _TRACES.clear()
    with pytest.warns(RuntimeWarning, match="cannot be read.*sampling again"):
        idata = reference_posterior(_traced_model, jnp.ones(30), **settings)
    assert _TRACES and idata.posterior["mu"].shape == (2, 50)
    _TRACES.clear()
    again = _arviz.from_netcdf(path)  # overwritten with the new draws
    np.testing.assert_array_equal(again.posterior["mu"], idata.posterior["mu"])


@pytest.mark.filterwarnings("ignore:The NUTS reference posterior is not trustworthy")
def test_a_failed_cache_write_warns_and_returns_the_result(tmp_path, monkeypatch):
    def no_engine(data, path):
        raise ImportError("No module named 'h5netcdf'")

    monkeypatch.setattr(_arviz, "to_netcdf", no_engine)
    with pytest.warns(RuntimeWarning, match="could not be cached.*h5netcdf"):
        idata = reference_posterior(
            _traced_model, jnp.ones(30), num_samples=50, cache_dir=tmp_path
        )
    assert idata.posterior["mu"].shape == (2, 50)
    assert not list(tmp_path.glob("*.nc"))


def test_cache_key_sees_closure_values_not_only_source():
    def make_model(prior_sd):
        def model(y):
            numpyro.sample("mu", dist.Normal(0.0, prior_sd))

        return model

    y = jnp.ones(3)
    keys = {
        _cache_key(make_model(sd), (y,), {}, {"num_samples": 10}) for sd in (1.0, 2.0)
    }
    assert len(keys) == 2
    same = _cache_key(make_model(1.0), (y,), {}, {"num_samples": 10})
    assert same in keys


def test_posterior_mode_is_the_full_data_mode_with_its_curvature():
    """Normal mean and a variance: both modes and curvatures in closed form.

    mu: y ~ N(mu, 1), mu ~ N(0, 10^2): mode sum(y) / (N + 0.01), curvature
    N + 0.01. v: z ~ N(0, v), v ~ InverseGamma(3, 2); on u = log v (the
    unconstrained scale, Jacobian included) the potential is a u + b exp(-u) with
    a = 3 + N/2 - 1 + 1, b = 2 + sum(z^2)/2: mode v = b / a, curvature a. The plate
    subsamples 10 of 400 rows; unwidened, the mode would follow one minibatch.
    """
    n_data = 400
    y = 1.5 + random.normal(random.key(1), (n_data,))
    z = 2.0 * random.normal(random.key(2), (n_data,))

    def model(y, z):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        v = numpyro.sample("v", dist.InverseGamma(3.0, 2.0))
        with numpyro.plate("data", n_data, subsample_size=10) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
            numpyro.sample("z", dist.Normal(0.0, jnp.sqrt(v)), obs=z[idx])

    mode = posterior_mode(model, y, z)
    assert set(mode.params) == {"mu", "v"}
    precision = n_data + 0.01
    np.testing.assert_allclose(mode.params["mu"], jnp.sum(y) / precision, rtol=1e-4)
    np.testing.assert_allclose(mode.hessian_diag["mu"], precision, rtol=1e-3)
    a, b = 3.0 + n_data / 2, 2.0 + float(jnp.sum(z**2)) / 2
    np.testing.assert_allclose(mode.params["v"], b / a, rtol=1e-4)
    np.testing.assert_allclose(mode.hessian_diag["v"], a, rtol=1e-3)


def test_full_batch_scores_on_an_improper_ordered_site():
    """ImproperUniform sites cannot be sampled to trace the model; their score is
    still the unconstrained one (ordered transform: x_0 = z_0, x_i = x_{i-1} +
    exp(z_i), log-Jacobian sum z_{1:})."""
    y = random.normal(random.key(4), (30,))

    def model(y):
        mu = numpyro.sample(
            "mu", dist.ImproperUniform(dist.constraints.ordered_vector, (), (3,))
        )
        numpyro.factor("mu_prior", dist.Normal(0.0, 10.0).log_prob(mu).sum())
        with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
            numpyro.sample("y", dist.Normal(mu.sum(), 1.0), obs=y[idx])

    def log_density(z):
        mu = z[0] + jnp.concatenate([jnp.zeros(1), jnp.cumsum(jnp.exp(z[1:]))])
        return (
            dist.Normal(0.0, 10.0).log_prob(mu).sum()
            + z[1:].sum()
            + dist.Normal(mu.sum(), 1.0).log_prob(y).sum()
        )

    mu = jnp.array([[-1.0, 0.5, 2.0], [0.0, 0.1, 0.3]])
    z, s = full_batch_scores(model, {"mu": mu}, y)
    z_expected = jnp.concatenate([mu[:, :1], jnp.log(jnp.diff(mu, axis=1))], axis=1)
    np.testing.assert_allclose(z["mu"], z_expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        s["mu"], jax.vmap(jax.grad(log_density))(z_expected), rtol=1e-4, atol=1e-4
    )
