"""reference_posterior on ill-conditioned posteriors: the ladder of Laplace maps
(factored in float64 on the host), the words the choice is reported in, and the
advice of a reference that failed its checks."""

import json

import arviz as az
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_sgbd import reference_posterior
from numpyro_sgbd.evaluation import laplace
from numpyro_sgbd.evaluation.comparison import _warn_untrusted
from numpyro_sgbd.evaluation.laplace import (
    AUTO_CONDITION,
    _dense_map,
    _laplace_choice,
    _NotUsable,
    _triggers,
)
from numpyro_sgbd.evaluation.reference import _advice

EPS32 = np.finfo(np.float32).eps


def hessian_of(eigval, scales, seed=0):
    """A float64 Hessian ``scales``^-1 V diag(eigval) V' ``scales``^-1 with a random
    rotation V: units spanning the ``scales`` and correlations whose spectrum is
    ``eigval`` (before :func:`_dense_map` rescales H by its own diagonal)."""
    rng = np.random.default_rng(seed)
    v, _ = np.linalg.qr(rng.normal(size=(len(eigval), len(eigval))))
    s = v @ np.diag(eigval) @ v.T
    d = np.asarray(scales, np.float64) ** -1
    return d[:, None] * s * d


def scaled(h):
    s = np.diag(h) ** -0.5
    return s[:, None] * h * s


def test_a_spectrum_float32_cannot_resolve_but_float64_can_is_used_as_it_is():
    # Smallest eigenvalue 1e-9 of the largest, 1/300 of a float32 Hessian's
    # resolution (4 eps32 = 4.8e-7); positive definite in float64. Today's check
    # refused it and left plain NUTS.
    h = hessian_of([1e-9, 0.5, 1.0, 2.0], [1e-3, 1.0, 2e3, 5.0])
    loc = np.zeros(4, np.float32)
    eig = np.linalg.eigvalsh(scaled(h))
    assert 4 * np.finfo(np.float64).eps < eig[0] / eig[-1] < 4 * EPS32 / 100
    whitening, form, sds, condition, note = _dense_map(loc, h)
    assert (form, note) == ("dense", "")
    np.testing.assert_allclose(condition, eig[-1] / eig[0], rtol=1e-6)
    np.testing.assert_allclose(sds, np.sqrt(np.diag(np.linalg.inv(h))), rtol=1e-6)
    # W W' = H^-1: W' H W = I, to float32's rounding of W (about eps32 times the
    # square root of the condition number, 2e-3 here).
    w = np.asarray(whitening.matrix, np.float64)
    np.testing.assert_allclose(w.T @ h @ w, np.eye(4), atol=2e-2)


def test_an_eigenvalue_rounding_made_negative_is_floored_at_the_resolution():
    # S's smallest eigenvalue -1e-8 (relative to the largest, 2): inside a float32
    # Hessian's rounding, so floored at 4 eps32 * 2; the rest is kept.
    h = hessian_of([-1e-8, 0.5, 1.0, 2.0], [1e-3, 1.0, 2e3, 5.0], seed=1)
    loc = np.zeros(4, np.float32)
    eig, vec = np.linalg.eigh(scaled(h))
    floor = 4 * EPS32 * eig[-1]
    assert -floor < eig[0] < 0 < eig[1]
    whitening, form, sds, condition, note = _dense_map(loc, h)
    assert form == "dense" and "floored" in note and "float32" in note
    np.testing.assert_allclose(condition, eig[-1] / floor, rtol=1e-6)
    # W W' is the inverse of the floored H: D^-1/2 V max(Lambda, floor)^-1 V' D^-1/2.
    d = np.diag(h) ** -0.5
    cov = d[:, None] * (vec / np.maximum(eig, floor)) @ vec.T * d
    w = np.asarray(whitening.matrix, np.float64)
    np.testing.assert_allclose(w @ w.T, cov, rtol=1e-4, atol=1e-6 * np.abs(cov).max())
    np.testing.assert_allclose(sds, np.sqrt(np.diag(cov)), rtol=1e-6)


def test_a_negative_eigenvalue_beyond_rounding_falls_to_the_diagonal_map():
    # -0.05: not rounding (a saddle); no dense map, but the diagonal exists.
    h = hessian_of([-0.05, 0.5, 1.0, 2.0], [1e-3, 1.0, 2e3, 5.0], seed=2)
    whitening, form, sds, condition, note = _dense_map(np.zeros(4, np.float32), h)
    assert form == "diagonal" and condition is None and "not a mode" in note
    np.testing.assert_allclose(np.asarray(whitening.scale), np.diag(h) ** -0.5, 1e-6)
    np.testing.assert_allclose(sds, np.diag(h) ** -0.5, rtol=1e-12)
    # Non-finite entries off the diagonal: no eigendecomposition, the diagonal.
    h[0, 1] = h[1, 0] = np.nan
    assert _dense_map(np.zeros(4, np.float32), h)[1] == "diagonal"


def test_without_a_positive_diagonal_there_is_no_map():
    h = hessian_of([0.5, 1.0, 2.0], [1.0, 1.0, 1.0])
    h[1, 1] = -1.0
    with pytest.raises(_NotUsable, match="diagonal entry 1 is -1"):
        _dense_map(np.zeros(3, np.float32), h)


def test_ill_conditioned_is_said_only_from_the_condition_number_threshold():
    sds = np.array([1.0, 2.0])
    # A condition number of 10 is not ill-conditioned, whatever else whitens.
    (reason,) = _triggers(np.array([1e-3, 1.0]), "Laplace sds", 10.0, 0.0)
    assert "ill-conditioned" not in reason and "ratio of 1e+03 > 100" in reason
    (reason,) = _triggers(sds, "Laplace sds", 10.0, 0.5)
    assert "ill-conditioned" not in reason and "0.5 > 0.1" in reason
    assert _triggers(sds, "Laplace sds", AUTO_CONDITION / 2, 0.0) == []
    (reason,) = _triggers(sds, "Laplace sds", AUTO_CONDITION, 0.0)
    assert "ill-conditioned" in reason and ">= 1000" in reason
    assert _triggers(sds, "conditional Laplace sds", None, 0.0) == []


def failed(**changes):
    """The attributes of a failed reference: plain NUTS (laplace=False), a
    diagonal mass matrix, well mixed unless ``changes`` say otherwise."""
    settings = dict(laplace=False, target_accept_prob=0.8, num_warmup=1000)
    settings.update(changes.pop("settings", {}))
    attrs = dict(
        max_rhat=1.0,
        min_ess_bulk=1000.0,
        min_ess_tail=1000.0,
        num_divergent=0,
        frac_max_tree_depth=0.0,
        max_tree_depth=10,
        num_chains=2,
        num_warmup=settings["num_warmup"],
        step_size=0.5,
        laplace="none",
        laplace_reason="laplace=False: plain NUTS",
        dense_mass=0,
        settings=json.dumps(settings),
    )
    attrs.update(changes)
    return attrs


def test_the_advice_names_the_settings_that_fit_what_was_measured():
    # Saturated trees (item 1 of issue 58: 99 % at the maximal depth): whiten.
    deep = _advice(failed(frac_max_tree_depth=0.99, max_rhat=1.53, step_size=1e-3))
    for tip in ("laplace=True", "dense_mass=True", "max_tree_depth=12", "99%"):
        assert tip in deep, deep
    assert "num_warmup=" not in deep and "target_accept_prob=" not in deep
    # A step far below the metric's scale says the same without saturation.
    small = _advice(failed(step_size=1e-3, max_rhat=1.2))
    assert "laplace=True" in small and "max_tree_depth=" not in small
    # What it already used is not advised again.
    used = _advice(
        failed(
            frac_max_tree_depth=0.5,
            laplace="dense",
            dense_mass=1,
            settings=dict(laplace=True),
        )
    )
    assert "dense_mass=True" not in used and "laplace=True" not in used
    assert "far from Gaussian" in used and "max_tree_depth=12" in used
    # Divergences: a higher acceptance target, not whitening.
    divergent = _advice(failed(num_divergent=7))
    assert "target_accept_prob=0.9 (was 0.8)" in divergent
    assert "laplace=True" not in divergent and "dense_mass" not in divergent
    # Slow mixing alone: longer warmup.
    slow = _advice(failed(max_rhat=1.05, min_ess_bulk=90.0))
    assert "num_warmup=2000" in slow and "laplace=True" not in slow


def test_compare_points_at_what_would_work_not_back_at_the_default():
    # Issue 58: compare's warning sent users back to laplace='auto' (the default,
    # which had just failed them), never to what worked.
    with pytest.warns(UserWarning, match="not trustworthy") as record:
        _warn_untrusted("max R-hat 1.53", strict=False)
    message = str(record[0].message)
    assert "laplace=True" in message and "dense_mass=True" in message
    assert "laplace='auto'" not in message


def crash_model(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 100.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=256) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def crash_data(n=26_216, seed=0):
    """A stand-in for a crash-fatality regression on raw covariates (issue 58):
    an intercept, speed in km/h (50 to 120), four 0/1 indicators, age in years,
    and the calendar years of the accident (1997 to 2002) and of the vehicle, raw;
    about 7 % deaths."""
    rng = np.random.default_rng(seed)
    indicators = rng.integers(0, 2, (n, 4)).astype(float)
    age = np.clip(rng.normal(37.0, 18.0, n), 16.0, 97.0).round()
    year = rng.integers(1997, 2003, n).astype(float)
    vehicle = np.clip(year - rng.poisson(6.0, n), 1953.0, None)
    speed = rng.uniform(50.0, 120.0, n)
    X = np.column_stack([np.ones(n), speed, indicators, age, year, vehicle])
    beta = np.array([0.0, 0.04, -0.3, -1.0, -0.5, 0.3, 0.03, -0.02, -0.03])
    eta = X @ beta
    eta += -3.0 - eta.mean()
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-eta))).astype(float)
    return X, y


def scaled_condition_at_mode(X, y, prior_sd=100.0):
    """The condition number of the scaled Hessian at the mode, in float64 (Newton)."""
    w = np.zeros(X.shape[1])
    for _ in range(30):
        p = 1.0 / (1.0 + np.exp(-X @ w))
        grad = X.T @ (p - y) + w / prior_sd**2
        h = (X * (p * (1 - p))[:, None]).T @ X + np.eye(X.shape[1]) / prior_sd**2
        w -= np.linalg.solve(h, grad)
    eig = np.linalg.eigvalsh(scaled(h))
    return eig[-1] / eig[0]


@pytest.mark.slow
def test_the_default_reference_whitens_a_raw_covariate_regression():
    # Issue 58: on the real data the default fell back to plain NUTS, "not positive
    # definite to float32 precision", and ran plain NUTS to R-hat 1.53.
    X, y = crash_data()
    rms = np.sqrt(np.mean(X[:, 1:] ** 2, axis=0))  # raw units: 0/1 to years
    assert rms.max() / rms.min() > 2e3, rms
    condition = scaled_condition_at_mode(X, y)
    assert condition >= 1e6, condition
    # Below what float32 resolves: the map the old check refused.
    assert 1.0 / condition < X.shape[1] * EPS32, condition
    X, y = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)
    # The choice first (seconds; the old check fails here, not after plain NUTS).
    _, form, reason, _ = _laplace_choice(
        crash_model, (X, y), {}, random.split(random.key(0))[0], "auto", 1000
    )
    assert form == "dense" and "ill-conditioned" in reason, reason
    idata = reference_posterior(crash_model, X, y)
    attrs = idata.posterior.attrs
    assert attrs["laplace"] != "none", attrs["laplace_reason"]
    assert "ill-conditioned" in attrs["laplace_reason"]
    assert attrs["max_rhat"] <= 1.01 and attrs["min_ess_bulk"] >= 400, attrs
    assert attrs["trustworthy"] == 1, attrs


def test_where_the_lanczos_factor_fails_the_diagonal_map_whitens(monkeypatch):
    # Above the dense limit (lowered to 1) with a Ritz value rounding made
    # negative: the last rung, D^-1/2, still takes out the sds' span of 1e4.
    def failing(*args, **kwargs):
        raise ValueError("a Ritz value of the scaled Hessian is -1e-09")

    monkeypatch.setattr(laplace, "LAPLACE_DENSE_MAX_DIM", 1)
    monkeypatch.setattr(laplace, "lowrank", failing)

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 100.0).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])

    rng = np.random.default_rng(3)
    X = rng.normal(size=(500, 2)) * np.array([1e-2, 1e2])
    y = X @ np.array([50.0, 0.01]) + rng.normal(size=500)
    X, y = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)
    idata = reference_posterior(model, X, y, num_warmup=300, num_samples=500)
    attrs = idata.posterior.attrs
    assert attrs["laplace"] == "diagonal", attrs["laplace_reason"]
    assert "Ritz value" in attrs["laplace_reason"]
    assert attrs["trustworthy"] == 1, attrs
    # Independent covariates: the exact posterior is Gaussian with precision
    # X'X + I/100^2; its means within 4 MCSE (a false alarm about once in 10^4).
    Xd, yd = np.asarray(X, np.float64), np.asarray(y, np.float64)
    exact = np.linalg.solve(Xd.T @ Xd + np.eye(2) / 1e4, Xd.T @ yd)
    draws = idata.posterior["w"].values
    mcse = np.asarray(az.mcse(az.convert_to_dataset({"w": draws}))["w"])
    assert np.all(np.abs(draws.mean((0, 1)) - exact) < 4 * mcse), (exact, mcse)
