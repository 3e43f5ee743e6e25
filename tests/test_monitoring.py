"""The convergence check after sampling (numpyro_sgbd.monitoring): thinned draws
kept in the state, bulk and tail ESS and rank-normalised split R-hat on the host
once the run ends (issue 43)."""

import re
import warnings

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

import numpyro_sgbd
from numpyro_sgbd import SGLD, monitoring
from numpyro_sgbd.convergence import ess_bulk
from numpyro_sgbd.evaluation.drift import drift

pytestmark = pytest.mark.heavy

Y = jnp.asarray(1.0 + np.random.default_rng(0).normal(size=1000), jnp.float32)
MEAN = float(np.mean(np.asarray(Y, np.float64)))


def normal_mean(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def two_modes(y):
    """mu and -mu explain the data alike: modes at +-1, 0.03 sd wide."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
        numpyro.sample("y", dist.Normal(jnp.abs(mu), 1.0), obs=y[idx])


def _run(model, step_size, start, *, num_samples=4000, seed=0, chains=2):
    kernel = SGLD(model, step_size=step_size)
    mcmc = MCMC(
        kernel,
        num_warmup=100,
        num_samples=num_samples,
        num_chains=chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(random.key(seed), Y, init_params={"mu": jnp.asarray(start)})
    return kernel, mcmc, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def slow_mixing():
    """Started at the posterior mean with a step a hundredth of the posterior sd:
    the chain wanders without a trend (ESS of a few)."""
    return _run(normal_mean, 3e-4, [MEAN, MEAN])


def test_a_slowly_mixing_chain_that_does_not_drift_warns(slow_mixing):
    """The drift check is quiet and the convergence check speaks, naming the
    coordinate and its ESS, from all 4,000 draws of each chain (1,000 thinned
    ones before issue 58)."""
    kernel, mcmc, caught = slow_mixing
    assert kernel.run_warnings == ("convergence",), caught
    (text,) = [m for m in caught if "ESS" in m]
    assert "at mu" in text and "raise num_samples from 4,000" in text
    assert "2 chain(s) of 4000 draws, all the run keeps" in text
    found = kernel.convergence
    assert found["min_ess_bulk"] < monitoring.MIN_ESS
    assert found["num_chains"] == 2 and found["num_draws"] == 4000


def test_the_warnings_ess_is_compares(slow_mixing):
    """One ESS for a run: the figure in the ConvergenceWarning is the one
    :func:`~numpyro_sgbd.compare` reports for the same run (the same draws, the
    same estimator), and the ESS of all the draws returned. Before issue 58 the
    warning's came from 1,000 of the 4,000 draws of each chain and compare's
    from ArviZ: 24 against 46 on the issue's run."""
    kernel, mcmc, caught = slow_mixing
    (text,) = [m for m in caught if "ESS" in m]
    reference = {"mu": np.random.default_rng(1).normal(MEAN, 0.03, size=2000)}
    table = numpyro_sgbd.compare({"sgld": mcmc}, reference, ksd_draws=0)
    figure = table.summary.loc["sgld", "min_ess_bulk"]
    assert kernel.convergence["min_ess_bulk"] == pytest.approx(figure, rel=1e-9)
    assert f"a bulk ESS of {figure:.0f} and a tail ESS of" in text
    tail = table.per_parameter.loc[("sgld", "mu"), "ess_tail"]
    assert kernel.convergence["min_ess_tail"] == pytest.approx(tail, rel=1e-9)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"], np.float64)
    assert float(ess_bulk(draws)) == pytest.approx(figure, rel=1e-9)


def test_the_record_keeps_the_draws_the_run_keeps(monkeypatch):
    """With NumPyro's thinning the record holds exactly the draws that
    ``get_samples`` returns; a run too long for the record's bound is thinned
    further, evenly, and its warning says so."""
    kernel = SGLD(normal_mean, step_size=3e-4)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=300, thinning=3, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(random.key(0), Y, init_params={"mu": jnp.asarray(MEAN)})
    rows = np.asarray(mcmc.last_state.trace.rows)[:, 0]
    np.testing.assert_array_equal(rows, np.asarray(mcmc.get_samples()["mu"]))
    assert kernel.convergence["num_draws"] == 100
    bound = monitoring.TRACE_ROWS * monitoring.TRACE_COORDS
    wide = monitoring.plan(mcmc, dim=10_000)  # 256 coordinates checked
    assert (wide.every, wide.rows) == (3, 100) and wide.thinning == 3
    mcmc.num_samples = 3 * (bound // 256 + 1)  # one kept draw too many
    wide = monitoring.plan(mcmc, dim=10_000)
    assert (wide.every, wide.rows * len(wide.coords)) == (6, bound // 2)
    monkeypatch.setattr(monitoring.trace, "TRACE_ROWS", 1)  # room for 256 rows
    with pytest.warns(monitoring.ConvergenceWarning) as caught:
        MCMC(kernel, num_warmup=10, num_samples=300, progress_bar=False).run(
            random.key(0), Y, init_params={"mu": jnp.asarray(MEAN)}
        )
    assert kernel.convergence["num_draws"] == 150
    text = str(caught[0].message)
    assert "150 evenly spaced draws of the 300 it keeps" in text


def test_chains_stuck_in_different_modes_warn_with_rhat():
    """Two chains, one in each of two modes 60 sds apart, each stationary there:
    R-hat is large and the warning says the chains disagree."""
    kernel, _, caught = _run(two_modes, 0.01, [MEAN, -MEAN])
    assert "convergence" in kernel.run_warnings, caught
    assert "drift" not in kernel.run_warnings
    assert kernel.convergence["max_rhat"] > 1.5
    (text,) = [m for m in caught if "an R-hat of" in m]
    assert "at mu" in text and "the chains disagree" in text


def test_one_chains_split_rhat_is_recorded_not_checked():
    """One chain: its split R-hat (halves compared) is kept in the record but
    does not fail the check, as the issue asks R-hat only of several chains; a
    shift between halves that one chain shows as R-hat 1.02 fails it when the
    halves are two chains."""
    rng = np.random.default_rng(1)
    draws = rng.normal(size=(1024, 3))
    draws[512:, 0] += 0.3  # split R-hat 1.02 on coordinate 0, ESS about 570
    one = monitoring.trace.report(draws[None], np.arange(3))
    assert one["max_rhat"] > monitoring.MAX_RHAT and not one["rhat_checked"]
    assert one["min_ess_bulk"] > monitoring.MIN_ESS and one["converged"]
    two = monitoring.trace.report(draws.reshape(2, 512, 3), np.arange(3))
    assert two["rhat_checked"] and not two["converged"]


@pytest.mark.slow
def test_converged_runs_do_not_warn():
    """False alarms: 50 seeds of a converged two-chain run (a step near the
    posterior sd: ESS in the thousands) give at most one warning (the issue's
    bound is 2 %). One MCMC object: its compiled loop is reused, and `init`
    starts each run's check. (A step of a third of this, ESS about 200, warned
    in 6 of 8 seeds, rightly: R-hat <= 1.01 needs a few hundred effective draws
    per chain.)"""
    kernel = SGLD(normal_mean, step_size=0.03)
    mcmc = MCMC(
        kernel,
        num_warmup=100,
        num_samples=2000,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    alarms, ess = 0, []
    for seed in range(50):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(random.key(seed), Y, init_params={"mu": jnp.full(2, MEAN)})
            jax.block_until_ready(mcmc.get_samples())
        alarms += "convergence" in kernel.run_warnings
        assert not [w for w in caught if "ESS" in str(w.message)] or alarms
        ess.append(kernel.convergence["min_ess_bulk"])
    assert alarms <= 1, alarms
    assert np.median(ess) > 10 * monitoring.MIN_ESS


def test_a_kernel_run_by_hand_keeps_no_record():
    """Outside NumPyro's MCMC the kernel cannot know where a run ends: no record
    in the state, no check."""
    kernel = SGLD(normal_mean, step_size=0.01)
    state = kernel.init(random.key(0), 10, None, (Y,), {})
    assert state.trace is None and kernel.convergence is None
    state = kernel.sample(state, (Y,), {})
    assert state.trace is None


def test_rows_are_evenly_spaced_draws_of_the_run():
    """``record`` keeps the last draw of each block of ``every`` samples: with
    draws equal to their sample number, the rows are every, 2 every, ..."""
    plan = monitoring.TracePlan(10, 1, 2, 5, (0, 2))
    trace = monitoring.empty_trace(plan, jnp.float32)
    for sample in range(-3, 11):  # warmup samples first, written to row 0
        z = {"a": jnp.full(3, float(sample))}
        trace = monitoring.record(trace, plan, z, jnp.asarray(sample))
    np.testing.assert_array_equal(trace.rows[:, 0], [2, 4, 6, 8, 10])
    assert monitoring.run_ends(plan, jnp.asarray(9), jnp.asarray(10))
    assert not monitoring.run_ends(plan, jnp.asarray(10), jnp.asarray(11))


def test_monitoring_off_compiles_no_check_and_keeps_the_draws():
    """``monitoring.off()`` around ``mcmc.run``: the slowly mixing chain of the
    first test draws exactly the same, but no host call is made (the clock holds
    only the starts), nothing is recorded and nothing warns."""
    quiet = SGLD(normal_mean, step_size=3e-4)
    mcmc = MCMC(quiet, num_warmup=100, num_samples=4000, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught, monitoring.off():
        warnings.simplefilter("always")
        mcmc.run(random.key(0), Y, init_params={"mu": jnp.asarray(MEAN)})
    assert monitoring.enabled()
    assert [str(w.message) for w in caught] == []
    assert all(i is None for i, _ in quiet._monitor.clock)
    assert quiet.convergence is None and quiet.run_warnings == ()
    assert mcmc.last_state.trace is None  # no record kept in the state either
    loud, on, messages = _run(normal_mean, 3e-4, MEAN, chains=1)
    assert any(i is not None for i, _ in loud._monitor.clock)
    assert any("ESS" in m for m in messages)
    np.testing.assert_array_equal(
        np.asarray(mcmc.get_samples()["mu"]), np.asarray(on.get_samples()["mu"])
    )


def test_a_coordinate_that_holds_still_is_not_said_to_move_inf_sds():
    """A local site's row moves only when its datum is drawn: within each
    quarter of the thinned draws it may not move at all (zero sd) and yet differ
    between them. The warning read "moved inf posterior sds ... (inf standard
    errors)"; it now says what happened, with no "inf"; a coordinate that
    drifts the test's way still comes first."""
    rng = np.random.default_rng(0)
    rows = np.concatenate(
        [np.repeat([[0.5], [1.5]], 16, axis=0), rng.normal(size=(32, 2))], axis=1
    )
    found = drift(rows)
    assert (found.index, found.t, found.shift) == (0, None, None)
    assert (found.before, found.after) == (0.5, 1.5)
    trending = rows.copy()
    trending[:, 2] += np.linspace(0.0, 8.0, 32)
    assert drift(trending).index == 2 and drift(trending).t > 0
    kernel = SGLD(normal_mean, step_size=0.01)
    kernel.init(random.key(0), 10, None, (Y,), {})
    with pytest.warns(RuntimeWarning, match="not mixing") as caught:
        kernel._monitor.check_drift(
            kernel, kernel._num_warmup + 3200, list(rows[:, None, :1]), 100
        )
    (text,) = [str(w.message) for w in caught]
    assert not re.search(r"\binf\b", text)
    assert "mu held still within the first quarter" in text
    assert "from 0.5 to 1.5" in text and "raise num_samples" in text
