"""Set-up as a value (issue 44): ``prepare`` traces the model once, finds what
the set-up lacks for these data and builds the estimator, returning one
immutable record; handed back, a set-up that holds the mode for these data is
not searched again."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_sgbd import prepare as prepare_module
from numpyro_sgbd.estimators import ControlVariateEstimator, MinibatchEstimator
from numpyro_sgbd.prepare import CentreRequest, Prepared, Request, prepare
from numpyro_sgbd.setup import Setup


def logistic(X, y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([X.shape[1]]))
    with numpyro.plate("N", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ theta), obs=y[idx])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(500, 2)), jnp.float32)
    y = jnp.asarray(rng.random(500) < 0.5, jnp.float32)
    return X, y


def _request(preconditioner="auto"):
    return Request(
        preconditioner=preconditioner,
        centre=CentreRequest(None, None, 4096),
        replace=None,
        log_likelihood_size=None,
        who="test",
        adaptation={"step_target": 0.5},
    )


def test_prepare_returns_one_record_and_reuses_its_setup(data, monkeypatch):
    searches = []
    find = prepare_module.find_preconditioner

    def counted(*args, **kwargs):
        searches.append(1)
        return find(*args, **kwargs)

    monkeypatch.setattr(prepare_module, "find_preconditioner", counted)

    def choose(plates, shapes, local):
        return "sd", "control_variates"

    prepared = prepare(logistic, data, {}, _request(), Setup(), choose)
    assert isinstance(prepared, Prepared)
    assert prepared.info.plates == {"N": (500, 50, -1)}
    assert prepared.info.shapes == {"theta": (2,)}
    assert isinstance(prepared.estimator, ControlVariateEstimator)
    assert prepared.setup.preconditioner is not None
    assert prepared.setup.centre is not None
    assert prepared.log_likelihood_indices["N"].shape == (500,)  # every row
    with pytest.raises(AttributeError):
        prepared.setup = Setup()  # a value, not a holder
    assert searches == [1]

    again = prepare(logistic, data, {}, _request(), prepared.setup, choose)
    assert searches == [1]  # the mode and L for these data were in the set-up
    assert again.setup.preconditioner is prepared.setup.preconditioner
    assert again.setup.centre is prepared.setup.centre  # nor the centre


def test_prepare_without_a_preconditioner_finds_no_mode(data):
    prepared = prepare(
        logistic,
        data,
        {},
        _request("none"),
        Setup(),
        lambda plates, shapes, local: (None, "minibatch"),
    )
    assert isinstance(prepared.estimator, MinibatchEstimator)
    assert prepared.setup == Setup()
