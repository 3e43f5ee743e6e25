"""step_size=None: the start at the mode, the preconditioner z = z_hat + L u, the
step size adapted in warmup, and the stationarity warning (issue 17)."""

import pickle
import warnings

import arviz as az
import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

import numpyro_sgbd
from numpyro_sgbd import NOGIN, SGBD, SGLD, discretisation, preconditioning
from numpyro_sgbd.evaluation.drift import drift

# Our own numerics (no ArviZ, no NumPyro contract): CI's Python 3.12 run
# skips them; the first run covers them.
pytestmark = pytest.mark.heavy

KERNELS = {"SGBD": SGBD, "SGLD": SGLD, "NOGIN": NOGIN}
N, D, PRIOR_SD = 2000, 4, 10.0


def _design():
    """Covariates whose posterior has condition number about 10^6: two nearly
    collinear columns and two of very different scales."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=N)
    x = np.stack(
        [
            base + 0.01 * rng.normal(size=N),
            base - 0.01 * rng.normal(size=N),
            20.0 * rng.normal(size=N),
            0.1 * rng.normal(size=N),
        ],
        axis=1,
    )
    y = x @ np.array([1.0, -0.5, 0.2, 2.0]) + rng.normal(size=N)
    precision = x.T @ x + np.eye(D) / PRIOR_SD**2
    cov = np.linalg.inv(precision)
    return x.astype(np.float32), y.astype(np.float32), cov @ (x.T @ y), cov


X, Y, EXACT_MEAN, EXACT_COV = _design()


def regression(x, y):
    b = numpyro.sample("b", dist.Normal(0.0, PRIOR_SD).expand([D]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ b, 1.0), obs=y[idx])


def test_the_design_is_ill_conditioned():
    assert np.linalg.cond(EXACT_COV) > 1e6


@pytest.fixture(scope="module", params=sorted(KERNELS))
def adapted_run(request):
    kernel = KERNELS[request.param](regression)
    mcmc = MCMC(
        kernel,
        num_warmup=500,
        num_samples=12_000,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(random.key(1), X, Y, extra_fields=("step_size",))
        numpyro_sgbd.check(mcmc)  # the run checks, after the run
        draws = np.asarray(mcmc.get_samples(group_by_chain=True)["b"], np.float64)
    return request.param, kernel, mcmc, draws, caught


def test_whitened_sampling_matches_the_exact_gaussian(adapted_run):
    # No step size, no init: the draws, whitened by the exact posterior
    # covariance, must be standard normal within Monte Carlo error plus the
    # discretisation bias a step of 0.5 in u allows (a few % of the variance).
    name, kernel, _, draws, _ = adapted_run
    assert kernel.preconditioner.form == "dense"
    chol = np.linalg.cholesky(EXACT_COV)
    v = np.linalg.solve(chol, (draws - EXACT_MEAN)[..., None])[..., 0]
    ess = np.asarray(az.ess(az.convert_to_dataset(v)).to_array()).ravel()
    ess_min = float(ess.min())
    assert ess_min > 200, (name, ess)
    flat = v.reshape(-1, D)
    # Means: standard error 1/sqrt(ESS) in these units.
    mcse = 1.0 / np.sqrt(ess_min)
    np.testing.assert_array_less(np.abs(flat.mean(0)), 5 * mcse + 0.05)
    # Covariance: entry standard errors about sqrt(2 / ESS); allowance 0.12 for
    # the step's variance inflation (SGLD at 0.4 in u: 1 / (1 - 0.04) - 1 = 4 %).
    cov = np.cov(flat.T)
    np.testing.assert_array_less(
        np.abs(cov - np.eye(D)), 5 * np.sqrt(2 / ess_min) + 0.12
    )


def test_the_step_is_adapted_per_chain_and_fixed_after_warmup(adapted_run):
    name, kernel, mcmc, _, caught = adapted_run
    steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["step_size"])
    assert steps.shape == (2, 12_000)
    assert np.all(steps == steps[:, :1]), "the step changed after warmup"
    assert np.all((steps > 0) & (steps <= kernel.spec.step_target))
    np.testing.assert_array_equal(np.asarray(mcmc.last_state.step_size), steps[:, -1])
    # A linear-Gaussian model: control variates leave no gradient noise, so warmup
    # ends at the target and sampling runs at the step the run's length asks
    # for (2 chains x 12,000 steps; below the target for SGBD and SGLD).
    # (The control variates' float32 rounding leaves a little noise, which can
    # only lower the step.)
    planned = discretisation.run_step(kernel.bias_law(), 0.0, 2 * 12_000)
    expected = min(kernel.spec.step_target, float(planned))
    np.testing.assert_allclose(steps[:, 0], expected, rtol=1e-2)
    assert np.all(steps[:, 0] <= expected * (1 + 1e-6))
    assert kernel.adaptation_info["sampling_fraction"] == kernel.spec.sampling_fraction
    info = kernel.adaptation_info
    assert info["preconditioner"] == "dense" and info["mode_search"]["converged"]
    assert info["seconds"] > 0 and info["preconditioner_bytes"] == (2 * D * D + D) * 4
    # The control variates' centre is the mode the adaptation found: one search,
    # whose last evaluation gives U and grad U there (pulled back to u as a pass
    # over the data would give them).
    assert kernel.centre_info["source"] == "Newton-CG"
    estimator = kernel.estimator
    potential, grad = estimator.full_data_fn((X, Y))(estimator.centre)
    np.testing.assert_allclose(estimator.centre_potential, potential, rtol=1e-6)
    np.testing.assert_allclose(
        estimator.centre_grad, grad, atol=1e-4 * float(jnp.max(jnp.abs(grad)))
    )
    assert not [w for w in caught if "drifting" in str(w.message)]
    assert not [w for w in caught if "held the adapted step" in str(w.message)]


def test_a_resumed_run_keeps_the_adapted_step(adapted_run):
    _, _, mcmc, _, _ = adapted_run
    before = np.asarray(mcmc.last_state.step_size)
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, X, Y, extra_fields=("step_size",))
    steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["step_size"])
    np.testing.assert_array_equal(steps, np.broadcast_to(before[:, None], steps.shape))
    mcmc.post_warmup_state = None


def test_an_adapted_kernel_pickles_and_runs_again():
    kernel = SGLD(regression)
    mcmc = MCMC(kernel, num_warmup=50, num_samples=50, progress_bar=False)
    mcmc.run(random.key(0), X, Y)
    again = pickle.loads(pickle.dumps(mcmc))
    again.run(random.key(1), X, Y)
    assert np.all(np.isfinite(np.asarray(again.get_samples()["b"])))
    assert again.sampler.preconditioner.form == "dense"


@pytest.mark.parametrize("form", ["lowrank", "diagonal"])
def test_other_forms_start_at_the_mode_and_sample(form):
    kernel = SGBD(regression, preconditioner=form)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=2000, progress_bar=False)
    mcmc.run(random.key(2), X, Y)
    draws = np.asarray(mcmc.get_samples()["b"], np.float64)
    assert kernel.preconditioner.form == form
    assert (
        kernel.adaptation_info["preconditioner_bytes"] < 2 * D * D * 4
        or form == "lowrank"
    )
    # Near the posterior from the first draw (a start at the mode), even where
    # the diagonal form mixes slowly along the collinear pair.
    sd = np.sqrt(np.diag(EXACT_COV))
    assert np.all(np.abs(draws[0] - EXACT_MEAN) / sd < 6)


def test_a_given_step_size_keeps_the_old_path():
    kernel = SGBD(regression, step_size=1e-3)
    assert kernel.variant == "vanilla"
    mcmc = MCMC(kernel, num_warmup=0, num_samples=3, progress_bar=False)
    mcmc.run(random.key(0), X, Y)
    assert kernel.preconditioner is None and kernel.adaptation_info is None
    assert mcmc.last_state.step_size is None
    assert kernel.config.gradient == "minibatch"


def test_a_dense_preconditioner_past_the_memory_limit_is_an_error_before_work():
    def wide(y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([20_000]).to_event(1))
        with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
            numpyro.sample("y", dist.Normal(w[0], 1.0), obs=y[idx])

    mcmc = MCMC(SGBD(wide, preconditioner="dense"), num_warmup=5, num_samples=5)
    with pytest.raises(ValueError, match="preconditioner='dense' needs 3.0 GiB"):
        mcmc.run(random.key(0), jnp.ones(100))


def test_several_subsample_plates_fall_back_to_vanilla_with_a_warning():
    def two_plates(a, b):
        mu = numpyro.sample("mu", dist.Normal(0, 10))
        with numpyro.plate("a", a.shape[0], subsample_size=10) as i:
            numpyro.sample("ya", dist.Normal(mu, 1), obs=a[i])
        with numpyro.plate("b", b.shape[0], subsample_size=10) as j:
            numpyro.sample("yb", dist.Normal(mu, 1), obs=b[j])

    kernel = SGBD(two_plates)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.warns(UserWarning, match="runs variant='vanilla'"):
        mcmc.run(random.key(0), jnp.ones(50), jnp.ones(60))
    assert kernel.variant == "vanilla" and kernel.config.gradient == "minibatch"


def test_the_stationarity_warning_fires_on_a_drifting_chain():
    # A step far too small for the scale, started 30 posterior sds away: the
    # chain is still travelling when sampling begins.
    kernel = SGLD(regression, step_size=1e-4, variant="corrected")
    mcmc = MCMC(kernel, num_warmup=100, num_samples=4200, progress_bar=False)
    start = {
        "b": jnp.asarray(EXACT_MEAN + 30 * np.sqrt(np.diag(EXACT_COV)), jnp.float32)
    }
    with pytest.warns(
        RuntimeWarning, match=r"still drifting.*mean of b\[\d\] moved"
    ) as caught:
        mcmc.run(random.key(3), X, Y, init_params=start)
        numpyro_sgbd.check(mcmc)
    assert "drift" in kernel.run_warnings
    # A given step: adapting it is a remedy not yet in force, and so is NUTS here.
    (text,) = [str(w.message) for w in caught if "drifting" in str(w.message)]
    assert "step_size=None" in text and "num_warmup (now 100)" in text
    assert "NUTS over all rows is affordable" in text


def tiny_batches(x, y):
    b = numpyro.sample("b", dist.Normal(0.0, PRIOR_SD).expand([D]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=2) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ b, 1.0), obs=y[idx])


def test_a_step_held_down_by_the_noise_is_reported():
    # Two rows of 2,000 per step without control variates: the noise sd in u is
    # about sqrt(N / n) ~ 30, so the tolerance holds the step near 0.04 of 0.5.
    kernel = SGBD(tiny_batches, gradient="minibatch")
    mcmc = MCMC(kernel, num_warmup=200, num_samples=300, progress_bar=False)
    with pytest.warns(
        UserWarning, match=r"held the adapted step to .*\(target 0\.5"
    ) as caught:
        mcmc.run(random.key(0), X, Y)
        numpyro_sgbd.check(mcmc)
    assert kernel.run_warnings[0] == "step"
    (text,) = [str(w.message) for w in caught if "held the" in str(w.message)]
    assert "gradient='control_variates'" in text
    assert "from 2 towards 8" in text
    # The smallest move in u: the windows shrink s where the chain cannot move,
    # which raises the step in v = u / s but not the move.
    state = mcmc.last_state
    assert float(state.step_size * np.min(state.scale.scale)) < 0.05


def test_drift_flags_a_trend_and_not_noise():
    rng = np.random.default_rng(5)
    misses = sum(drift(rng.normal(size=(64, 10))) is not None for _ in range(200))
    assert misses <= 2  # alpha = 1e-3 per test
    trend = rng.normal(size=(64, 10))
    trend[:, 7] += np.linspace(0, 3, 64)
    assert drift(trend)[0] == 7


def test_dense_and_lowrank_maps_whiten_the_hessian():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(6, 6))
    h = a @ a.T + np.diag(np.exp(rng.uniform(-4, 4, 6)))
    loc = jnp.asarray(rng.normal(size=6), jnp.float32)
    eye = jnp.eye(6, dtype=jnp.float32)
    for pre in (
        preconditioning.dense(loc, h),
        preconditioning.lowrank(
            loc, np.diag(h), lambda v: v @ jnp.asarray(h, jnp.float32), rank=6
        ),
    ):
        lmat = np.stack([np.asarray(pre.move(e), np.float64) for e in eye], axis=1)
        # L L' = H^-1 (not H, and not L' L: the map is not symmetric).
        np.testing.assert_allclose(lmat @ lmat.T @ h, np.eye(6), atol=1e-4)
        np.testing.assert_allclose(np.asarray(pre.pull(eye)), lmat, atol=1e-5)
        u = jnp.asarray(rng.normal(size=6), jnp.float32)
        np.testing.assert_allclose(pre.to_u(pre.to_z(u)), u, atol=1e-4)
    with pytest.raises(ValueError, match="not positive definite"):
        preconditioning.dense(loc, -np.eye(6))


# A spike-and-slab prior on a mean and weak data: the mode sits on the spike, so
# the Laplace approximation's sd (0.49) is a quarter of the posterior's (1.8).
SPIKE, SLAB, NOISE, ROWS = 0.5, 3.0, 100.0, 1000
Y_MIX = (1.0 + NOISE * np.random.default_rng(0).normal(size=ROWS)).astype(np.float32)


def spike_and_slab(y):
    mixing = dist.Categorical(jnp.array([0.5, 0.5]))
    prior = dist.MixtureSameFamily(mixing, dist.Normal(0.0, jnp.array([SPIKE, SLAB])))
    mu = numpyro.sample("mu", prior)
    with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(mu, NOISE), obs=y[idx])


def _spike_and_slab_posterior():
    """Exact mean and sd: each component's conjugate update, reweighted by its
    marginal likelihood of the data's mean."""
    from scipy.stats import norm

    se2, ybar = NOISE**2 / ROWS, float(np.mean(Y_MIX, dtype=np.float64))
    var = 1 / (1 / np.array([SPIKE, SLAB]) ** 2 + 1 / se2)
    means = var * ybar / se2
    weights = norm.pdf(ybar, 0, np.sqrt(np.array([SPIKE, SLAB]) ** 2 + se2))
    weights /= weights.sum()
    mean = weights @ means
    return mean, np.sqrt(weights @ (var + means**2) - mean**2)


@pytest.fixture(scope="module")
def spike_runs():
    runs = {}
    for adapt in (False, True):
        kernel = SGBD(spike_and_slab, adapt_mass_matrix=adapt)
        mcmc = MCMC(
            kernel,
            num_warmup=2000,
            num_samples=10_000,
            num_chains=2,
            chain_method="vectorized",
            progress_bar=False,
        )
        mcmc.run(random.key(0), Y_MIX)
        numpyro_sgbd.check(mcmc)
        draws = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"], np.float64)
        runs[adapt] = (kernel, mcmc, draws, float(az.ess(draws)))
    return runs


def test_adapted_scales_fix_a_laplace_approximation_that_is_too_narrow(spike_runs):
    # Measured (seed 0): ESS 528 with the windows against 87 without (sampling
    # at 0.34 in u, the run-length step of 20,000 steps; 507 against fewer than
    # 51 at the old 0.35: the ESS of this two-scale posterior without the
    # windows swings with the step), s 3.2-3.3 per chain (posterior sd /
    # Laplace sd = 3.7; the windows' shrinkage towards 1 keeps it below). With
    # s applied inversely (steps step / s) the ESS falls below the unadapted
    # one.
    mean, sd = _spike_and_slab_posterior()
    kernel, mcmc, draws, ess = spike_runs[True]
    _, _, _, ess_fixed = spike_runs[False]
    assert kernel.adaptation_info["adapt_mass_matrix"]
    scale = np.asarray(mcmc.last_state.scale.scale)
    assert scale.shape == (2, 1) and np.all((scale > 2) & (scale < 5)), scale
    assert ess > 4 * ess_fixed, (ess, ess_fixed)
    # The convergence check after sampling sees it too: the unadapted run's
    # ESS of 50 warns, the adapted one's does not (issue 43: slow mixing
    # without drift was silent).
    unadapted = spike_runs[False][0]
    assert "convergence" in unadapted.run_warnings
    assert unadapted.convergence["min_ess_bulk"] < 100
    assert "convergence" not in kernel.run_warnings, kernel.convergence
    assert abs(draws.mean() - mean) < 5 * sd / np.sqrt(ess)
    assert abs(draws.std() / sd - 1) < 0.06 + 5 / np.sqrt(2 * ess)


def test_adapted_scales_are_fixed_after_warmup_and_kept_on_resume(spike_runs):
    _, mcmc, _, _ = spike_runs[True]
    before = np.asarray(mcmc.last_state.scale.scale)
    step = np.asarray(mcmc.last_state.step_size)
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, Y_MIX)
    np.testing.assert_array_equal(np.asarray(mcmc.last_state.scale.scale), before)
    # ... and so is the sampling step: its fraction is applied once, in warmup.
    np.testing.assert_array_equal(np.asarray(mcmc.last_state.step_size), step)
    mcmc.post_warmup_state = None


@pytest.mark.parametrize("name", ["SGLD", "NOGIN"])
def test_langevin_kernels_adapt_scales_only_on_request_and_never_above_one(name):
    assert KERNELS[name](spike_and_slab).adaptation_info is None
    kernel = KERNELS[name](spike_and_slab)
    assert not kernel.config.options.adapt_mass
    kernel = KERNELS[name](spike_and_slab, adapt_mass_matrix=True)
    mcmc = MCMC(kernel, num_warmup=400, num_samples=10, progress_bar=False)
    mcmc.run(random.key(0), Y_MIX)
    # The posterior is wider than L says (SGBD's windows find s > 2): capped at 1.
    scale = np.asarray(mcmc.last_state.scale.scale)
    assert scale.shape == (1,) and 0 < scale[0] <= 1.0, scale


def test_adapt_mass_matrix_bad_input():
    with pytest.raises(ValueError, match="adapt_mass_matrix .* needs a"):
        SGBD(spike_and_slab, step_size=0.1, adapt_mass_matrix=True)
    with pytest.raises(ValueError, match="adapt_mass_matrix must be True, False"):
        SGBD(spike_and_slab, adapt_mass_matrix="yes")
    # A given step size with a preconditioner may adapt the scales.
    assert SGBD(
        spike_and_slab, step_size=0.5, preconditioner="dense", adapt_mass_matrix=True
    ).config.options.adapt_mass


@pytest.mark.parametrize("kernel_name", ["SGBD"])
def test_a_second_init_on_the_same_data_compiles_nothing(kernel_name, caplog):
    """Issue 21, item 1: the default set-up (mode search, preconditioner, control
    variates, the Laplace start, the initial state) is compiled once; a second
    ``init`` of the same kernel on data of the same shapes reuses every program.
    Also a draw from a new key: the start takes its key as an argument."""
    kernel = KERNELS[kernel_name](regression)
    first = kernel.init(random.key(0), 50, None, (X, Y), {})
    with jax.log_compiles(True), caplog.at_level("WARNING", logger="jax"):
        again = kernel.init(random.key(1), 50, None, (X, Y), {})
        jax.block_until_ready(again)
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert compiled == []
    assert not np.array_equal(np.asarray(first.z["b"]), np.asarray(again.z["b"]))


@pytest.mark.parametrize("kernel_name", ["SGLD", "NOGIN"])
def test_new_data_of_the_same_shapes_reuse_the_compiled_init_and_step(
    kernel_name, caplog
):
    """Issue 45, item 3: a refit. ``init`` on new data of the same shapes
    compiles only the mode search's objective (new data, so a new mode, L and
    centre, which the state carries), and the step jitted for the first data's
    state serves the second's: reading L and the centre from the state, not
    from constants, it gives the step of the new set-up (a step that closed
    over the first set-up would move the second chain by the first data's
    gradient at their centre)."""
    kernel = KERNELS[kernel_name](regression)
    first = kernel.init(random.key(0), 50, None, (X, Y), {})
    step = jax.jit(kernel.sample_kernel)
    jax.block_until_ready(step(first, (X, Y), {}))
    y2 = Y + 3.0 * X[:, 0]  # b[0] moves by 3: another mode, L and centre
    with jax.log_compiles(True), caplog.at_level("WARNING", logger="jax"):
        again = kernel.init(random.key(1), 50, None, (X, y2), {})
        moved = jax.block_until_ready(step(again, (X, y2), {}))
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert not [c for c in compiled if "init_from_arrays" in c or "start" in c]
    assert not [c for c in compiled if "sample" in c], compiled
    mode = np.asarray(kernel.setup.mode["b"])
    assert np.allclose(np.asarray(again.setup.preconditioner.loc), mode)
    assert not np.allclose(np.asarray(first.setup.preconditioner.loc), mode)
    # The jitted step on the new state is the new kernel's step, eagerly.
    eager = kernel.sample_kernel(again, (X, y2), {})
    np.testing.assert_allclose(
        np.asarray(moved.z["b"]), np.asarray(eager.z["b"]), rtol=1e-4, atol=1e-5
    )


def test_the_advice_leaves_out_what_is_in_force():
    """The warnings' remedies come from the run: with control variates, adaptation
    and a large N on (the default path), the step warning advises neither control
    variates nor step_size=None, nor NUTS; the drift warning does not advise
    step_size=None. The kernel's own warning paths are driven with the numbers
    that trigger them."""
    kernel = SGBD(regression)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=20, progress_bar=False)
    mcmc.run(random.key(0), X, Y)
    numpyro_sgbd.check(mcmc)
    # 20 draws: the convergence check rightly warns; the other kinds are quiet.
    assert kernel.config.gradient == "control_variates"
    assert kernel.run_warnings in ((), ("convergence",))
    kernel.run_warnings = ()
    kernel.prepared.plates = {"data": (2_000_000, 100, None)}  # as if N were large
    with pytest.warns(UserWarning, match="held the adapted step") as caught:
        kernel.monitor.check_step(kernel, np.array([0.001]))
    text = str(caught[0].message)
    assert "control_variates'" not in text and "step_size=None" not in text
    assert "far from Gaussian" in text and "NUTS" not in text
    assert "from 100 towards 400" in text
    rows = np.random.default_rng(0).normal(size=(32, D))
    rows[:, 2] += np.linspace(0.0, 5.0, 32)
    with pytest.warns(RuntimeWarning, match="still drifting") as caught:
        kernel.monitor.check_drift(
            kernel, kernel.run_shape().num_warmup + 3200, list(rows[:, None]), 100
        )
    text = str(caught[0].message)
    assert "b[2]" in text and "step_size=None" not in text
    assert "num_warmup (now 20)" in text
    assert kernel.run_warnings == ("step", "drift")
