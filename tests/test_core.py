"""``core.build_kernel`` on its own: a toy update family and a toy gradient
estimator, no kernel class and no model, as ``docs/adding_a_sampler.rst`` says a
family plugs in. What the core promises the family (the estimate it keeps, the
step it hands over, the counter, the potential it records, the refusal of a
non-finite move) is checked against closed forms, and a noisy toy rule's
stationary law against the law of its own scheme."""

from typing import NamedTuple

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sgbd import GradientEstimate, core
from numpyro_sgbd.kernel import family_state

MU = jnp.array([1.0, -2.0, 0.5])

#: The toy family's state type, as a sampler's module defines it.
ToyState = family_state("ToyState", module=__name__)


class Position(NamedTuple):
    z: jnp.ndarray


class Info(NamedTuple):
    noise_exceeded: jnp.ndarray


def toy_init(z, rng_key=None):
    return Position(z)


def toy_rule(rng_key, aux, z_grad, step_size, *, variant, noise_sd=None, noise=0.0):
    """Euler-Maruyama for the Langevin diffusion: z - h grad + sqrt(2 h) noise xi,
    a rule of none of the package's samplers (SGLD's is z - h^2 / 2 grad + h xi)."""
    xi = random.normal(rng_key, aux.z.shape)
    z = aux.z - step_size * z_grad + noise * jnp.sqrt(2 * step_size) * xi
    return Position(z), Info(jnp.zeros(()))


def gaussian_estimate(rng_key, z, model_args, model_kwargs, centre):
    """The exact gradient of U(z) = |z - MU|^2 / 2 (unit-variance Gaussian)."""
    return GradientEstimate(z - MU, None, 0.5 * jnp.sum((z - MU) ** 2))


def no_centre(z, model_args, model_kwargs):
    return None


def _family(noise):
    return core.Family(
        init=toy_init,
        step=core.gradient_at_end(toy_rule),
        state_type=ToyState,
        statistics=(),
        variant="vanilla",
        init_kwargs={},
        step_kwargs={"noise": noise},
        beta=0.1,
        init_noise_sd=None,
        noise_diffusion=None,
        exact_nan_allowed=False,
    )


def _adaptation(step):
    return core.Adaptation(
        num_warmup=0,
        scale_windows=(0, ()),
        step_target=step,
        sampling_fraction=1.0,
        scale_max=None,
        fixed_step=jnp.asarray(step),
        adapt_mass=False,
        preconditioner=None,
    )


def _pair(noise, step, estimate=gaussian_estimate):
    init_kernel, sample_kernel = core.build_kernel(
        _family(noise), estimate, no_centre, _adaptation(step)
    )
    return jax.jit(init_kernel, static_argnums=(2, 3)), jax.jit(
        sample_kernel, static_argnums=(1, 2)
    )


def test_the_core_moves_the_family_on_the_estimate_it_keeps():
    """Without noise the toy rule is gradient descent, z_k - MU = (1 - h)^k (z_0 -
    MU): the core must hand the family the gradient at the state's position (the
    estimate made at the end of the last step) and the fixed step, count the
    steps and record the potential at the new position."""
    h, z0 = 0.3, jnp.array([3.0, 0.0, -1.0])
    init_kernel, sample_kernel = _pair(noise=0.0, step=h)
    state = init_kernel(random.key(0), z0, (), ())
    assert int(state.i) == 0
    np.testing.assert_allclose(state.z_grad, z0 - MU, rtol=1e-6)
    for k in range(1, 6):
        state = sample_kernel(state, (), ())
        expected = MU + (1 - h) ** k * (z0 - MU)
        np.testing.assert_allclose(state.z, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state.z_grad, expected - MU, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            state.potential_energy_estimate,
            0.5 * jnp.sum((expected - MU) ** 2),
            rtol=1e-5,
        )
        assert int(state.i) == k
    assert int(state.num_nonfinite) == 0


def test_a_non_finite_estimate_is_refused_and_counted():
    """An estimate that turns non-finite past |z| = 10: the core keeps the last
    finite state and counts the refusal, and a chain that is refused stays
    where it was (the guard selects between whole states)."""

    def blows_up(rng_key, z, model_args, model_kwargs, centre):
        est = gaussian_estimate(rng_key, z, model_args, model_kwargs, centre)
        bad = jnp.max(jnp.abs(z)) > 10.0
        return est._replace(z_grad=jnp.where(bad, jnp.nan, est.z_grad))

    # A step of 2.5 overshoots: z - MU multiplies by -1.5 a step.
    init_kernel, sample_kernel = _pair(noise=0.0, step=2.5, estimate=blows_up)
    state = init_kernel(random.key(0), jnp.array([3.0, 0.0, -1.0]), (), ())
    zs = []
    for _ in range(8):
        state = sample_kernel(state, (), ())
        zs.append(np.asarray(state.z))
    assert int(state.num_nonfinite) > 0
    assert np.all(np.isfinite(zs))
    assert np.all(np.abs(zs[-1]) <= 10.0 * 1.5 + np.abs(MU).max())
    assert np.array_equal(zs[-1], zs[-2])  # refused: it stays


def test_the_noisy_toy_rule_samples_its_own_schemes_law():
    """With noise the toy rule is the unadjusted Langevin algorithm, whose law on
    N(MU, I) is exactly N(MU, I / (1 - h / 2)) (an AR(1) with coefficient 1 - h
    and innovation variance 2 h). Four chains, vectorized by ``jax.vmap`` as the
    kernels do, checked against that law within Monte Carlo error (the sample
    variance's, from the AR(1)'s known autocorrelation: no ESS of the chain's
    own can widen the tolerance). Fails with the core's step doubled."""
    h, num_chains, num_steps = 0.5, 4, 4000
    init_kernel, sample_kernel = core.build_kernel(
        _family(1.0), gaussian_estimate, no_centre, _adaptation(h)
    )
    init = jax.vmap(init_kernel, in_axes=(0, 0, None, None))
    step = jax.vmap(sample_kernel, in_axes=(0, None, None))

    @jax.jit
    def run(keys, z0):
        state = init(keys, z0, (), ())

        def body(state, _):
            state = step(state, (), ())
            return state, state.z

        return jax.lax.scan(body, state, None, length=num_steps)[1]

    z0 = jnp.broadcast_to(MU, (num_chains, 3))
    draws = np.asarray(run(random.split(random.key(1), num_chains), z0))
    draws = draws[200:].reshape(-1, 3)
    exact_var = 1.0 / (1.0 - h / 2.0)
    rho = 1.0 - h
    # Var of the sample variance of an AR(1): 2 var^2 (1 + rho^2) / (1 - rho^2) / n.
    n = draws.shape[0]
    se_var = exact_var * np.sqrt(2 * (1 + rho**2) / (1 - rho**2) / n)
    se_mean = np.sqrt(exact_var * (1 + rho) / (1 - rho) / n)
    np.testing.assert_array_less(np.abs(draws.mean(0) - MU), 4 * se_mean)
    np.testing.assert_array_less(np.abs(draws.var(0) - exact_var), 4 * se_var)
    # The bias the check can see: the variance of the continuous-time law (1).
    assert np.all(np.abs(exact_var - 1.0) > 8 * se_var)


@pytest.mark.parametrize("num_steps", [1, 3])
def test_repeat_runs_a_sample_of_steps(num_steps):
    """``core.repeat``: a sample of ``num_steps`` steps is that many steps."""
    h, z0 = 0.2, jnp.array([3.0, 0.0, -1.0])
    init_kernel, sample_kernel = core.build_kernel(
        _family(0.0), gaussian_estimate, no_centre, _adaptation(h)
    )
    steps = jax.jit(core.repeat(sample_kernel, num_steps), static_argnums=(1, 2))
    state = steps(init_kernel(random.key(0), z0, (), ()), (), ())
    assert int(state.i) == num_steps
    np.testing.assert_allclose(
        state.z, MU + (1 - h) ** num_steps * (z0 - MU), rtol=1e-5, atol=1e-6
    )
