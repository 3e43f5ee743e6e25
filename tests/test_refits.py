"""Repeated fits on new data of the same shapes (issue 59, item 4): one ``MCMC``
with ``jit_model_args=True`` fitted to three data sets of
``benchmarks/refits.py`` (a 2,000-row logistic regression, 500 + 2,000 samples,
each sampler's default path). Every fit after the first compiles no program
(counted as that benchmark counts: :class:`CompiledPrograms`, JAX's backend
compiles less its persistent cache's hits), and each fit's draws centre on its
own data's posterior, far from the earlier data's.

The harness is the benchmark's own ``fits`` (imported from its file), so that
the test and the benchmark count and fit alike; no test here reads a clock.
"""

import importlib.util
import json
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "refits.py"
_spec = importlib.util.spec_from_file_location("refits_benchmark", SCRIPT)
refits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refits)

NUM_FITS = 3
#: A coordinate's mean passes within this many Monte Carlo standard errors
#: (the draws' sd over the square root of their ESS) of its reference. 27
#: comparisons (3 samplers x 3 fits x 3 coefficients): with exact standard
#: errors a correct run fails one with probability 2e-5; with ESS estimated
#: from 2,000 draws of a chain (ESS 20 to 400) off by a third, below 1%. The
#: keys are fixed: the run is the same each time (largest |z| 2.1).
Z = 5.0


def _posterior(X, y, mode, num_draws=40_000):
    """The posterior mean and sd of ``w`` in ``refits.model`` (N(0, 1) priors,
    Bernoulli-logit likelihood on every row), by importance sampling from the
    Laplace approximation at ``mode`` in float64 NumPy: a reference that shares
    no code with the kernels (importance ESS above 39,000 of 40,000 here)."""
    X, y, mode = (np.asarray(a, np.float64) for a in (X, y, mode))

    def log_density(w):  # (k, d) -> (k,)
        logits = w @ X.T
        prior = -0.5 * np.sum(w**2, -1)
        return np.sum(y * logits - np.logaddexp(0.0, logits), -1) + prior

    p = 1.0 / (1.0 + np.exp(-X @ mode))
    hessian = X.T @ (X * (p * (1 - p))[:, None]) + np.eye(X.shape[1])
    chol = np.linalg.cholesky(np.linalg.inv(hessian))
    noise = np.random.default_rng(0).standard_normal((num_draws, X.shape[1]))
    w = mode + noise @ chol.T
    log_weights = log_density(w) + 0.5 * np.sum(noise**2, -1)
    weights = np.exp(log_weights - log_weights.max())
    weights /= weights.sum()
    mean = weights @ w
    return mean, np.sqrt(weights @ (w - mean) ** 2)


def check_centres(rows):
    """Each fit's posterior mean within :data:`Z` Monte Carlo standard errors
    of its own data's posterior mean on every coefficient, and beyond that on
    some coefficient from every earlier data set's (whose posteriors are
    checked to lie apart first, so that the test can tell)."""
    refs = [
        _posterior(X, y, row["mode"])
        for (X, y), row in zip(refits.data_sets(len(rows)), rows)
    ]
    for fit, row in enumerate(rows):
        mcse = np.asarray(row["sd"]) / np.sqrt(row["ess"])
        own = np.abs(np.asarray(row["mean"]) - refs[fit][0]) / mcse
        assert np.all(own < Z), (fit, own)
        for earlier in range(fit):
            apart = np.abs(refs[fit][0] - refs[earlier][0]) / refs[fit][1]
            assert np.max(apart) > 3, (fit, earlier, apart)
            other = np.abs(np.asarray(row["mean"]) - refs[earlier][0]) / mcse
            assert np.max(other) > Z, (fit, earlier, other)


@pytest.mark.parametrize("name", ["SGBD", "SGLD", "NOGIN"])
def test_refits_with_the_bar_compile_nothing_and_sample_their_own_data(name):
    """With NumPyro's progress bar on, the fits after the first compile no
    program and load none from the persistent cache (conftest.py turns it on
    for the session): everything they run was compiled in memory by the first,
    the mode search's programs included."""
    rows = refits.fits(refits.SAMPLERS[name], NUM_FITS, progress_bar=True)
    assert rows[0]["programs"] + rows[0]["loaded"] > 0
    assert [(r["programs"], r["loaded"]) for r in rows[1:]] == [(0, 0)] * (NUM_FITS - 1)
    check_centres(rows)


def test_refits_without_the_bar_compile_nothing_under_the_persistent_cache(
    tmp_path,
):
    """With the bar off NumPyro 0.22 compiles its sampling loop on every run
    (``fori_collect`` jits a new function each time): JAX's persistent cache in
    a new directory serves it to the later fits, which then compile no program.
    In a subprocess (the benchmark's command line), so that the cache setting
    does not reach other tests; inside ``numpyro_sgbd.monitoring.off()``
    (``--checks-off``), since JAX caches no program that calls the host."""
    out = tmp_path / "fits.json"
    command = [sys.executable, str(SCRIPT), "--fits", str(NUM_FITS)]
    command += ["--cache", str(tmp_path / "cache"), "--checks-off", "--json", str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    assert sorted(results) == ["NOGIN", "SGBD", "SGLD"]
    for name, rows in results.items():
        assert rows[0]["programs"] > 0, name
        assert [r["programs"] for r in rows[1:]] == [0] * (NUM_FITS - 1), (
            name,
            done.stdout,
        )
        check_centres(rows)
