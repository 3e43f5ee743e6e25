"""BAOAB, the splitting integrator added on the family protocol (issue 44).

Its step evaluates the gradient estimator between its second drift and its last
kick, which a protocol handing the step one precomputed gradient could not
express. On a Gaussian target with Gaussian gradient noise the chain is linear in
(x, p, e), e the noise of the force it keeps, so its stationary law is the
solution of a discrete Lyapunov equation: the kernel's draws are tested against
that law, with tolerances from the Monte Carlo error of independent chains, and
the same statistic is shown to reject an injected bug.
"""

from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

from numpyro_sgbd import BAOAB, GradientEstimate
from numpyro_sgbd.updates import baoab as baoab_module
from numpyro_sgbd.updates.sghmc import SGHMCState

STEP, FRICTION, NOISE = 0.5, 1.0, 2.0
NUM_CHAINS, NUM_STEPS = 4000, 300


def stationary_law(h, gamma, sigma):
    """The stationary covariance of (x, p) for U = x^2 / 2, unit mass, force
    noise sd ``sigma``: the chain is ``s' = A s + B w`` over s = (x, p, e), w =
    (the O step's normal, the new force's noise)."""
    c = np.exp(-gamma * h)
    kick = np.array([[1, 0, 0], [-h / 2, 1, -h / 2 * sigma], [0, 0, 1]])
    drift = np.array([[1, h / 2, 0], [0, 1, 0], [0, 0, 1]])
    ou = np.diag([1.0, c, 1.0])
    renew = np.diag([1.0, 1.0, 0.0])
    A = kick @ renew @ drift @ ou @ drift @ kick
    B = np.zeros((3, 2))
    B[1, 0] = np.sqrt(1 - c**2)  # O's normal, then a drift and the kick
    B = kick @ renew @ drift @ B
    B[:, 1] += kick @ np.array([0.0, 0.0, 1.0])  # the new force's noise
    S = np.zeros((3, 3))
    for _ in range(5000):  # spectral radius < 1: converges geometrically
        S = A @ S @ A.T + B @ B.T
    return S[:2, :2]


def _noisy_force(rng_key, z):
    return GradientEstimate(z + NOISE * random.normal(rng_key, jnp.shape(z)))


def _final_draws(kernel):
    """(x, p) of independent chains after ``NUM_STEPS`` steps from 0."""
    mcmc = MCMC(
        kernel,
        num_warmup=0,
        num_samples=NUM_STEPS,
        num_chains=NUM_CHAINS,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(random.key(3), init_params=jnp.zeros((NUM_CHAINS, 1)))
    x = np.asarray(mcmc.last_state.z)[:, 0]
    p = np.asarray(mcmc.last_state.aux.p)[:, 0]
    return x, p


def _z_scores(x, p, law):
    """How many Monte Carlo standard errors var(x), var(p) and cov(x, p) are
    from ``law`` (Gaussian draws: Var(s_xx) = 2 S_xx^2 / n, Var(s_xp) = (S_xx
    S_pp + S_xp^2) / n)."""
    n = len(x)
    sxx, spp, sxp = law[0, 0], law[1, 1], law[0, 1]
    return np.array(
        [
            (np.var(x) - sxx) / (sxx * np.sqrt(2 / n)),
            (np.var(p) - spp) / (spp * np.sqrt(2 / n)),
            (np.mean(x * p) - sxp) / np.sqrt((sxx * spp + sxp**2) / n),
        ]
    )


def _stale_last_kick(rng_key, state, estimate_fn, step_size, *, estimate, **kw):
    """An injected bug: the last kick reuses the force the step started with."""
    new, fresh, info = baoab_module.baoab_step(
        rng_key, state, estimate_fn, step_size, estimate=estimate, **kw
    )
    p = new.p + 0.5 * step_size * (fresh.z_grad - estimate.z_grad)
    return SGHMCState(new.z, p), fresh, info


@pytest.fixture(scope="module")
def law():
    return stationary_law(STEP, FRICTION, NOISE)


def test_stationary_law_is_the_noise_free_one_at_zero_noise():
    """With exact forces BAOAB's x-marginal is exact (variance 1) at any stable
    step, its momentum at the end of a step has variance 1 - h^2 / 4."""
    S = stationary_law(STEP, FRICTION, 0.0)
    np.testing.assert_allclose(S, np.diag([1.0, 1 - STEP**2 / 4]), atol=1e-9)


def test_baoab_matches_the_exact_law_of_its_chain_with_gradient_noise(law):
    x, p = _final_draws(
        BAOAB(gradient_fn=_noisy_force, step_size=STEP, friction=FRICTION)
    )
    z = _z_scores(x, p, law)
    assert np.all(np.abs(z) < 4.5), z
    # The test has power: the noise-free law is far outside the tolerance.
    assert np.max(np.abs(_z_scores(x, p, stationary_law(STEP, FRICTION, 0.0)))) > 10


def test_the_exact_law_test_rejects_a_stale_last_kick(law, monkeypatch):
    monkeypatch.setattr(BAOAB, "spec", BAOAB.spec._replace(step=_stale_last_kick))
    x, p = _final_draws(
        BAOAB(gradient_fn=_noisy_force, step_size=STEP, friction=FRICTION)
    )
    assert np.max(np.abs(_z_scores(x, p, law))) > 4.5


def test_without_friction_the_step_is_leapfrog():
    """friction = 0: B-A-A-B is one leapfrog step, deterministic."""
    z0, p0, h = jnp.array([1.0, -2.0]), jnp.array([0.5, 0.0]), 0.3

    def exact(z):
        return GradientEstimate(2.0 * z)  # U = z^2

    state, est, info = baoab_module.baoab_step(
        random.key(0), SGHMCState(z0, p0), exact, h, estimate=exact(z0), friction=0.0
    )
    p_half = p0 - h / 2 * 2.0 * z0
    z1 = z0 + h * p_half
    p1 = p_half - h / 2 * 2.0 * z1
    np.testing.assert_allclose(state.z, z1, rtol=1e-6)
    np.testing.assert_allclose(state.p, p1, rtol=1e-6)
    np.testing.assert_allclose(est.z_grad, 2.0 * z1, rtol=1e-6)
    np.testing.assert_allclose(info.kinetic_energy, 0.5 * jnp.sum(p1**2), rtol=1e-6)


def test_baoab_runs_a_model_on_the_default_path():
    """BAOAB(model): mode, preconditioner, adapted step, per-draw statistics,
    as every family on the adapter; the mean lands near the data's."""
    y = 1.0 + random.normal(random.key(0), (2000,))

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("N", y.shape[0], subsample_size=100) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    kernel = BAOAB(model)
    assert kernel.variant == "vanilla"
    mcmc = MCMC(kernel, num_warmup=500, num_samples=2000, progress_bar=False)
    mcmc.run(random.key(1), y)
    mu = np.asarray(mcmc.get_samples()["mu"])
    se = 1 / np.sqrt(len(y))  # the posterior sd; draws are autocorrelated
    assert abs(mu.mean() - float(y.mean())) < 5 * se
    assert 0.7 < mu.std() / se < 1.4
    assert "kinetic_energy" in mcmc.get_extra_fields()


def test_bad_baoab_arguments_raise_at_construction():
    with pytest.raises(ValueError, match="friction"):
        BAOAB(potential_fn=lambda z: 0.0, step_size=0.1, friction=-1.0)
    with pytest.raises(ValueError, match="variant"):
        BAOAB(potential_fn=lambda z: 0.0, step_size=0.1, variant="corrected")
    with pytest.raises(TypeError, match="frictoin"):
        BAOAB(potential_fn=lambda z: 0.0, step_size=0.1, frictoin=1.0)
