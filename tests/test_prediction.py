"""Prediction over all the rows: ``Predictive(full_batch(model), draws)``."""

import jax
from jax import random
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import Predictive

from numpyro_sgbd import full_batch


def model(X, y=None):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=20) as idx:
        numpyro.sample(
            "y", dist.Normal(X[idx] @ w, 0.1), obs=None if y is None else y[idx]
        )


def test_predictive_over_full_batch_predicts_every_row_in_order():
    rng = np.random.default_rng(0)
    X_test = rng.normal(size=(137, 3))  # NumPy data, indexed by the plate
    draws = {"w": jax.numpy.asarray(rng.normal(size=(50, 3)))}
    # As written, the model's plate draws 20 of the 137 rows.
    minibatch = Predictive(model, draws)(random.key(0), jax.numpy.asarray(X_test))
    minibatch = minibatch["y"]
    assert minibatch.shape == (50, 20)
    full = Predictive(full_batch(model), draws)(random.key(0), X_test)["y"]
    assert full.shape == (50, 137)
    # Row i is the prediction for X_test[i]: residuals are the 0.1 noise.
    residual = np.asarray(full) - np.asarray(draws["w"]) @ X_test.T
    assert np.abs(residual).max() < 0.6  # 6 sd of the noise over 6850 values
    assert 0.08 < residual.std() < 0.12
