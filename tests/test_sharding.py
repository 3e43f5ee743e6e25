"""Data sharded over devices and processes (docs: Big data).

The checks run in subprocesses (tests/sharded_checks.py) on 4 simulated CPU
devices, and as two processes of 2 devices joined by ``jax.distributed``; these
tests read their results. Tolerances are Monte Carlo standard errors: a mean of M
draws within 4 standard errors, a variance of M draws within 4 of its relative
standard error sqrt(2 / (M - 1)).
"""

import json
import os
import socket
import subprocess
import sys
import warnings

from _agreement import ESS_FLOOR
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

from numpyro_sgbd import SGLD
from numpyro_sgbd.monitoring import run as monitoring_run

SCRIPT = os.path.join(os.path.dirname(__file__), "sharded_checks.py")


def _run(out, *args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(out), *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc, out):
    log, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, log[-4000:]
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The single-process checks' results: from one subprocess, or with
    ``NUMPYRO_SGBD_SHARDED_SIDE_BY_SIDE=1`` from its two parts side by side.
    That took the fixture from 100 to 64 s where nothing else runs (CI's second
    run, which sets it); beside another busy test worker it did not pay."""
    folder = tmp_path_factory.mktemp("sharded")
    side_by_side = os.environ.get("NUMPYRO_SGBD_SHARDED_SIDE_BY_SIDE") == "1"
    parts = ("estimators", "mcmc") if side_by_side else ("all",)
    procs = [(_run(folder / f"{p}.json", p), folder / f"{p}.json") for p in parts]
    merged = {}
    for proc, out in procs:
        merged.update(_finish(proc, out))
    return merged


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_data_are_split_over_four_devices(results):
    assert results["devices"] == 4
    assert results["spec"][0] == "data"


@pytest.mark.parametrize("plate_size", ["local_size", "global_size"])
def test_full_data_pass_counts_the_prior_once(results, plate_size):
    """The sharded full-data potential and gradient are the unsharded ones, for a
    plate that declares len(X) (a shard's rows inside shard_map) or the global N.
    Counting the prior on every shard (4x) moves the potential by 3 x 3/2 |w|^2
    and the gradient by 3 w, far beyond float32 rounding."""
    full = results[f"full_{plate_size}"]
    u0, u1 = full["potential"]
    g0, g1 = map(np.asarray, full["grad"])
    assert abs(u1 - u0) <= 1e-5 * abs(u0)
    np.testing.assert_allclose(g1, g0, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("covariance", [None, "lowrank"])
def test_sharded_minibatch_gradient_is_unbiased_with_the_stratified_noise(
    results, covariance
):
    """Over M draws: the mean gradient is the exact full-data gradient within 4
    MCSE; the variance of the draws is the stratified formula sum_k n_k (1 -
    n_k/N_k) (N_k/n_k)^2 Var_k(grad l_i); the estimated noise variance (the mean
    of noise_sd^2, and of the low-rank factor's row sums of squares) is it too."""
    r = results[f"estimator_{covariance}"]
    M = r["draws"]
    mean, var = np.asarray(r["mean"]), np.asarray(r["var"])
    exact, formula = np.asarray(r["full_grad"]), np.asarray(r["stratified"])
    assert np.all(np.abs(mean - exact) <= 4 * np.sqrt(var / M))
    rel = 4 * np.sqrt(2 / (M - 1))
    np.testing.assert_allclose(var, formula, rtol=rel)
    # Each draw's estimate is a sample variance of n_k = 100 rows per shard;
    # their mean over M draws is within a few percent of its expectation.
    np.testing.assert_allclose(r["noise_var"], formula, rtol=0.05)
    if covariance == "lowrank":
        assert r["factor_shape"] == [M, 3, 400]
        np.testing.assert_allclose(r["factor_diag"], r["noise_var"], rtol=1e-4)


def test_sharded_control_variates_are_unbiased(results):
    r = results["control_variates"]
    mean, var = np.asarray(r["mean"]), np.asarray(r["var"])
    assert np.all(var > 0)
    assert np.all(
        np.abs(mean - np.asarray(r["full_grad"])) <= 4 * np.sqrt(var / r["draws"])
    )


@pytest.mark.parametrize("name", ["SGBD", "SGLD", "NOGIN"])
def test_sharded_and_unsharded_runs_agree_on_a_conjugate_posterior(results, name):
    """Posterior means of a sharded and an unsharded run agree within 4 combined
    MCSE (sd / sqrt(ESS) each), and each is the exact posterior mean within 4
    MCSE; the sds are within 25 % of the exact sd."""
    exact = results["exact"]
    runs = [results[f"mcmc_{name}_{w}"] for w in ("unsharded", "sharded")]
    for r in runs:  # the tolerances shrink like 1 / sqrt(ESS): a floor on it
        assert np.min(r["ess"]) >= ESS_FLOOR, r["ess"]
    se = [np.asarray(r["sd"]) / np.sqrt(np.asarray(r["ess"])) for r in runs]
    means = [np.asarray(r["mean"]) for r in runs]
    assert np.all(np.abs(means[1] - means[0]) <= 4 * np.hypot(*se))
    for m, s, r in zip(means, se, runs):
        assert np.all(np.abs(m - np.asarray(exact["mean"])) <= 4 * s), (m, s)
        np.testing.assert_allclose(r["sd"], exact["sd"], rtol=0.25)


def test_vectorized_chains_on_sharded_data(results):
    """chain_method='vectorized' gives, chain for chain, the sequential draws."""
    seq = np.asarray(results["chains_sequential"])
    vec = np.asarray(results["chains_vectorized"])
    assert seq.shape == (2, 100, 2)
    np.testing.assert_allclose(vec, seq, rtol=1e-5, atol=1e-6)


def test_two_processes_give_the_one_process_draws(results, tmp_path):
    """Two processes of 2 devices each, joined by jax.distributed (gloo on
    localhost), each holding half the rows: the draws are the one-process
    4-device run's with the same key (up to the all-reduce's summation order)."""
    port = _free_port()
    outs = [tmp_path / f"p{i}.json" for i in range(2)]
    procs = [_run(outs[i], i, 2, port) for i in range(2)]
    draws = [np.asarray(_finish(p, o)["draws"]) for p, o in zip(procs, outs)]
    one = np.asarray(results["draws"])
    assert one.shape == (200, 3)
    for d in draws:
        np.testing.assert_allclose(d, one, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "case, words",
    [
        ("unsharded_rows", "shard all the plate's data alike"),
        ("subsample_size", "use subsample_size=400"),
        ("small_subsample", "use subsample_size=4"),
        ("other_axis", "dimension 1"),
        ("two_meshes", "different meshes"),
        ("uneven_rows", "do not split evenly"),
        ("two_plates", "one subsample plate"),
        ("host_data", "kept on the host (numpyro_sgbd.host_data)"),
        ("jit_model_args", "jit_model_args=True"),
        ("parallel", "chain_method='vectorized'"),
    ],
)
def test_bad_sharding_is_a_clear_error(results, case, words):
    message = results["errors"][case]
    assert message is not None, f"{case}: no error"
    assert words in message, message


def _model(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=20) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def test_large_closed_over_data_warn_and_jit_model_args_does_not(monkeypatch):
    """Data NumPyro's loop would compile in as constants (jit_model_args=False)
    above the threshold draw a warning naming jit_model_args=True; passed as
    arguments they do not."""
    monkeypatch.setattr(monitoring_run, "CONSTANT_DATA_WARN_BYTES", 100)
    X = jnp.asarray(np.random.default_rng(0).normal(size=(200, 2)), jnp.float32)
    y = (X[:, 0] > 0).astype(jnp.float32)
    for jit_args in (False, True):
        m = MCMC(
            SGLD(_model, step_size=1e-3),
            num_warmup=5,
            num_samples=5,
            progress_bar=False,
            jit_model_args=jit_args,
        )
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            m.run(jax.random.key(0), X, y)
        hits = [w for w in seen if "jit_model_args=True" in str(w.message)]
        assert bool(hits) == (not jit_args), [str(w.message) for w in seen]
