"""Data kept in host memory (numpyro_sgbd.host_data): the same chain as the same
data on the device, whatever MCMC is told, and clear errors for any use other
than reading rows."""

import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

from numpyro_sgbd import NOGIN, SGBD, SGLD, host, host_data
from numpyro_sgbd.host import HostArray
from numpyro_sgbd.monitoring import run as monitoring_run

N, D = 2000, 3
_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, D)).astype(np.float32)
Y = (_rng.random(N) < 1 / (1 + np.exp(-X @ np.array([1.0, -1.0, 0.5])))).astype(
    np.float32
)


def logistic(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def _draws(make, data, **kwargs):
    m = MCMC(
        make(),
        num_warmup=kwargs.pop("num_warmup", 100),
        num_samples=kwargs.pop("num_samples", 200),
        progress_bar=False,
        **kwargs,
    )
    m.run(jax.random.key(0), *data)
    return np.asarray(m.get_samples(group_by_chain=True)["w"])


@pytest.mark.parametrize(
    "make, jit_model_args",
    [
        # The default path: adapted step, mode search, preconditioner, control
        # variates, per-datum noise statistics (every full-data pass reads rows).
        pytest.param(lambda: SGBD(logistic), False, id="SGBD-default"),
        pytest.param(
            lambda: NOGIN(logistic),
            True,
            id="NOGIN-jit_model_args",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_host_data_give_the_device_datas_draws(make, jit_model_args):
    """Every read returns the rows the device array would, so the chain is the
    same draw for draw (a wrong row, e.g. an off-by-one gather, moves the
    minibatch gradient and with it every draw after the first)."""
    on_device = _draws(
        make, (jnp.asarray(X), jnp.asarray(Y)), jit_model_args=jit_model_args
    )
    on_host = _draws(make, host_data(X, Y), jit_model_args=jit_model_args)
    np.testing.assert_allclose(on_host, on_device, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_vectorized_chains_read_host_data():
    """Under chain_method='vectorized' the reads are vmapped: chain for chain the
    device data's draws."""
    kwargs = dict(num_chains=2, chain_method="vectorized", num_samples=50)
    make = lambda: SGLD(logistic, step_size=1e-3)  # noqa: E731
    on_device = _draws(make, (jnp.asarray(X), jnp.asarray(Y)), **kwargs)
    on_host = _draws(make, host_data(X, Y), **kwargs)
    assert on_host.shape == (2, 50, D)
    np.testing.assert_allclose(on_host, on_device, rtol=1e-5, atol=1e-6)


def test_host_data_are_not_compiled_in(monkeypatch):
    """Closed over by NumPyro's loop (jit_model_args=False), device arrays draw
    the warning that they become constants; host-kept data are no leaves, so
    nothing of them enters the program and no warning comes."""
    monkeypatch.setattr(monitoring_run, "CONSTANT_DATA_WARN_BYTES", 100)
    for data, warned in [
        ((jnp.asarray(X), jnp.asarray(Y)), True),
        (host_data(X, Y), False),
    ]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _draws(lambda: SGLD(logistic, step_size=1e-3), data, num_samples=5)
        hits = [w for w in seen if "jit_model_args=True" in str(w.message)]
        assert bool(hits) == warned, [str(w.message) for w in seen]
    assert jax.tree.leaves(host_data(X)) == []


def test_host_array_reads_rows_and_nothing_else():
    Xh = host_data(X)
    assert isinstance(Xh, HostArray)
    assert (Xh.shape, Xh.ndim, len(Xh), Xh.dtype) == (X.shape, 2, N, np.float32)
    idx = jnp.array([[3, 0], [N - 1, 7]])
    np.testing.assert_array_equal(Xh[idx], X[np.asarray(idx)])
    np.testing.assert_array_equal(jax.jit(lambda i: Xh[i])(idx), X[np.asarray(idx)])
    # float64 data are read in JAX's dtype (float32 without x64), not copied whole.
    wide = host_data(X.astype(np.float64))
    assert wide.dtype == np.float32 and wide[jnp.array([1])].dtype == jnp.float32
    for use in (
        lambda: Xh + 1.0,
        lambda: jnp.asarray(Xh),
        lambda: np.asarray(Xh),
        lambda: jnp.sum(Xh),
    ):
        with pytest.raises(TypeError, match="host_data"):
            use()
    for index in (slice(0, 3), (0, 1), jnp.array([0.5])):
        with pytest.raises(TypeError, match="read by rows only"):
            Xh[index]
    with pytest.raises(ValueError, match="needs at least one array"):
        host_data()
    with pytest.raises(ValueError, match="scalar"):
        host_data(np.float32(1.0))


def test_arrays_read_by_the_same_indices_share_one_callback(monkeypatch):
    """A host callback costs a fixed 0.3 ms or so on a CPU: X[idx] and y[idx] in
    one trace are one callback (an injected second read makes two); pickled, the
    arrays still read the same rows."""
    calls = []
    rows = host._Reads._rows
    monkeypatch.setattr(
        host._Reads, "_rows", lambda self, i: calls.append(1) or rows(self, i)
    )
    Xh, yh = host_data(X, Y)
    idx = jnp.array([5, 1, 9])
    got = jax.jit(lambda i: (Xh[i], yh[i]))(idx)
    assert len(calls) == 1
    np.testing.assert_array_equal(got[0], X[np.asarray(idx)])
    np.testing.assert_array_equal(got[1], Y[np.asarray(idx)])
    Xp, yp = pickle.loads(pickle.dumps((Xh, yh)))
    np.testing.assert_array_equal(yp[idx], Y[np.asarray(idx)])
    np.testing.assert_array_equal(Xp[idx], X[np.asarray(idx)])
