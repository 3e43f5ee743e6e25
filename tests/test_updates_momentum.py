"""Tests for the pure momentum update rules: SGHMC and SGNHT.

Every random quantity comes from a fixed key, so each test is deterministic. For the
statistical tests the docstring states the tolerance and the probability that a
*correct* implementation would fail it for a random key (its failure rate).

Common-random-number tests rebuild the unit draws the rules make: one key per leaf of
``z`` from ``random.split(rng_key, num_leaves)``, and ``random.normal(leaf_key,
leaf.shape, leaf.dtype)`` per leaf, both for the momentum noise of a step and for the
momentum drawn by ``sghmc_init`` / ``sgnht_init``.
"""

from functools import partial

from _trees import tree_like, tree_z
import jax
from jax import lax, random
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import linalg, optimize

from numpyro_sgbd.updates.sghmc import (
    SGHMCInfo,
    SGHMCState,
    sghmc_init,
    sghmc_step,
)
from numpyro_sgbd.updates.sgnht import (
    SGNHTInfo,
    SGNHTState,
    sgnht_init,
    sgnht_step,
)

# Our own numerics (no ArviZ, no NumPyro contract): CI's Python 3.12 run
# skips them; the first run covers them.
pytestmark = pytest.mark.heavy

VARIANTS = ("vanilla", "corrected")


# --------------------------------------------------------------------------------------
# helpers


def _spread(lo, hi):
    """A leaf-shaped ramp from lo to hi, one value per coordinate."""
    return lambda x: jnp.linspace(lo, hi, x.size).reshape(x.shape)


def _unit_draws(rng_key, z):
    keys = random.split(rng_key, len(jax.tree.leaves(z)))
    return [
        random.normal(key, jnp.shape(x), x.dtype)
        for key, x in zip(keys, jax.tree.leaves(z))
    ]


def _pytree_problem():
    z = tree_z()
    z["e"] = jnp.array([0.5, -0.5], jnp.float16)  # a leaf of another dtype
    p = tree_like(z, lambda x: 0.5 - x)
    z_grad = tree_like(z, lambda x: 0.3 * x + 0.1)
    noise_sd = tree_like(z, lambda x: jnp.full(jnp.shape(x), 0.8))
    return z, p, z_grad, noise_sd


def _steps(rng_key, z, p, z_grad, step_size, noise_sd):
    """Every rule and variant on one problem, as (state, info) pairs."""
    out = []
    for variant in VARIANTS:
        out.append(
            sghmc_step(
                rng_key,
                SGHMCState(z, p),
                z_grad,
                step_size,
                friction=1.5,
                mass=2.0,
                variant=variant,
                noise_sd=noise_sd,
            )
        )
        out.append(
            sgnht_step(
                rng_key,
                SGNHTState(z, p, jnp.float32(1.2)),
                z_grad,
                step_size,
                diffusion=1.5,
                variant=variant,
                noise_sd=noise_sd,
            )
        )
    return out


CASES = [(rule, v) for v in VARIANTS for rule in ("sghmc", "sgnht")]


def _tree_equal(a, b):
    return jax.tree.all(jax.tree.map(jnp.array_equal, a, b))


# --------------------------------------------------------------------------------------
# 1. pytrees, dtypes, jit, vmap over step sizes, init


_steps_jit = jax.jit(_steps)


def _assert_close(a, b, err_msg=""):
    """Equal up to float32 rounding (float16 leaves: up to their own rounding)."""
    tol = 1e-3 if jnp.result_type(a) == jnp.float16 else 1e-5
    np.testing.assert_allclose(
        np.asarray(a, np.float32),
        np.asarray(b, np.float32),
        rtol=tol,
        atol=tol,
        err_msg=err_msg,
    )


def test_pytree_shapes_dtypes_and_jit():
    """Every rule and variant keeps z's pytree, shapes and dtypes (a float16 leaf
    included) in z and p, returns scalar statistics, and traced in one jitted
    function (the step size a traced argument) gives the eager result."""
    z, p, z_grad, noise_sd = _pytree_problem()
    key, step_size = random.key(1), jnp.float32(0.1)
    eager = _steps(key, z, p, z_grad, step_size, noise_sd)
    jitted = _steps_jit(key, z, p, z_grad, step_size, noise_sd)
    for case, (state, info), out_j in zip(CASES, eager, jitted):
        for field in (state.z, state.p):
            assert jax.tree.structure(field) == jax.tree.structure(z), case
            for x, x_new in zip(jax.tree.leaves(z), jax.tree.leaves(field)):
                assert x_new.shape == x.shape and x_new.dtype == x.dtype, case
                assert bool(jnp.all(jnp.isfinite(x_new))), case
        assert not _tree_equal(state.p, p), case  # it moved
        assert isinstance(info, SGHMCInfo if case[0] == "sghmc" else SGNHTInfo)
        assert all(jnp.shape(stat) == () for stat in info), case
        if case[0] == "sgnht":
            assert state.thermostat.shape == ()
            assert state.thermostat.dtype == jnp.float32
        assert jax.tree.structure(out_j) == jax.tree.structure((state, info)), case
        for a, b in zip(jax.tree.leaves(out_j), jax.tree.leaves((state, info))):
            assert a.dtype == b.dtype, case
            _assert_close(a, b, str(case))


def test_vmap_over_step_sizes():
    """A vector of step sizes through vmap gives, row by row, the scalar calls."""
    z = jnp.array([0.5, -1.0, 2.0])
    p, z_grad = jnp.array([1.0, 0.3, -0.2]), 2.0 * z
    key = random.key(2)
    step_sizes = jnp.array([0.01, 0.1, 0.5], jnp.float32)
    batched = jax.jit(jax.vmap(lambda eps: _steps(key, z, p, z_grad, eps, 0.8)))(
        step_sizes
    )
    for i, eps in enumerate(step_sizes):
        single = _steps(key, z, p, z_grad, eps, 0.8)
        for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(single)):
            _assert_close(a[i], b)


def test_array_z_and_scalar_z():
    """A bare array and a bare scalar are pytrees too."""
    for z in (jnp.zeros(5), jnp.zeros(())):
        state, info = sghmc_step(random.key(1), sghmc_init(z), jnp.ones_like(z), 0.1)
        assert state.z.shape == state.p.shape == z.shape
        state, info = sgnht_step(random.key(1), sgnht_init(z), jnp.ones_like(z), 0.1)
        assert state.z.shape == state.p.shape == z.shape


def test_init_draws_momentum_from_the_key():
    """p = sqrt(m) * unit draw per leaf with the step's key convention; zeros without
    a key; SGNHT's thermostat starts at the diffusion A."""
    z, _, _, _ = _pytree_problem()
    mass = tree_like(z, _spread(0.5, 4.0))
    key = random.key(4)
    state = sghmc_init(z, key, mass=mass)
    assert _tree_equal(state.z, z)
    for x, m, xi, p in zip(
        jax.tree.leaves(z),
        jax.tree.leaves(mass),
        _unit_draws(key, z),
        jax.tree.leaves(state.p),
    ):
        assert p.dtype == x.dtype and p.shape == x.shape
        np.testing.assert_allclose(
            np.asarray(p, np.float32), np.asarray(jnp.sqrt(m) * xi, np.float32)
        )
    assert _tree_equal(sghmc_init(z).p, tree_like(z, jnp.zeros_like))
    state = sgnht_init(z, key, diffusion=2.5)
    assert _tree_equal(state.p, sghmc_init(z, key).p)
    assert float(state.thermostat) == 2.5
    assert _tree_equal(sgnht_init(z).p, tree_like(z, jnp.zeros_like))


# --------------------------------------------------------------------------------------
# 2. common random numbers: the update, the clipping and the statistics exactly


def _crn_problem():
    z = tree_z()
    p = tree_like(z, lambda x: 1.0 - 0.7 * x)
    z_grad = tree_like(z, lambda x: 2.0 * x - 0.3)
    # eps tau^2 / (2 D) runs from 0 to 2.25 over the coordinates: some are clipped.
    noise_sd = tree_like(z, _spread(0.0, 3.0))
    return z, p, z_grad, noise_sd


@pytest.mark.parametrize("variant", VARIANTS)
def test_sghmc_common_random_numbers(variant):
    """z' = z + eps p / m and p' - (p - eps g - eps C p / m) = scale * xi exactly.

    scale^2 = 2 eps C (vanilla) or eps max(0, 2C - eps tau^2) (corrected), xi the
    unit draw of the same key; every hyperparameter is one value per coordinate.
    """
    z, p, z_grad, noise_sd = _crn_problem()
    step_size = tree_like(z, _spread(0.2, 0.5))
    friction = tree_like(z, _spread(0.5, 1.5))
    mass = tree_like(z, _spread(2.0, 0.5))
    key = random.key(9)
    state, info = sghmc_step(
        key,
        SGHMCState(z, p),
        z_grad,
        step_size,
        friction=friction,
        mass=mass,
        variant=variant,
        noise_sd=noise_sd,
    )
    num_exceeded, num_coords, kinetic = 0, 0, 0.0
    leaves = zip(
        *(
            jax.tree.leaves(t)
            for t in (z, p, z_grad, step_size, friction, mass, noise_sd)
        ),
        _unit_draws(key, z),
        jax.tree.leaves(state.z),
        jax.tree.leaves(state.p),
    )
    for x, mom, g, eps, c, m, tau, xi, x_new, p_new in leaves:
        if variant == "vanilla":
            var = 2 * eps * c
        else:
            var = jnp.maximum(eps * (2 * c - eps * tau**2), 0.0)
        expected = mom - eps * g - eps * c * mom / m + jnp.sqrt(var) * xi
        np.testing.assert_allclose(x_new, x + eps * mom / m, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(p_new, expected, rtol=1e-5, atol=1e-6)
        num_exceeded += int(jnp.sum(eps * tau**2 >= 2 * c))
        num_coords += x.size
        kinetic += float(jnp.sum(p_new**2 / m)) / 2
    assert 0 < num_exceeded < num_coords
    np.testing.assert_allclose(info.noise_exceeded, num_exceeded / num_coords)
    np.testing.assert_allclose(info.kinetic_energy, kinetic, rtol=1e-5)
    # without noise_sd nothing can be exceeded
    _, info = sghmc_step(key, SGHMCState(z, p), z_grad, 0.3)
    assert float(info.noise_exceeded) == 0.0


@pytest.mark.parametrize("variant", VARIANTS)
def test_sgnht_common_random_numbers(variant):
    """z' = z + eps p, p' = p - eps g - eps xi p + scale * xi_unit, and the thermostat
    xi' = xi + eps (p^T p / d - 1) with the OLD momentum (d = 12 coordinates)."""
    z, p, z_grad, noise_sd = _crn_problem()
    eps, a, xi = 0.5, 1.0, 1.7
    key = random.key(10)
    state, info = sgnht_step(
        key,
        SGNHTState(z, p, jnp.float32(xi)),
        z_grad,
        eps,
        diffusion=a,
        variant=variant,
        noise_sd=noise_sd,
    )
    leaves = zip(
        *(jax.tree.leaves(t) for t in (z, p, z_grad, noise_sd)),
        _unit_draws(key, z),
        jax.tree.leaves(state.z),
        jax.tree.leaves(state.p),
    )
    for x, mom, g, tau, unit, x_new, p_new in leaves:
        if variant == "vanilla":
            var = 2 * eps * a
        else:
            var = jnp.maximum(eps * (2 * a - eps * tau**2), 0.0)
        expected = mom - eps * g - eps * xi * mom + jnp.sqrt(var) * unit
        np.testing.assert_allclose(x_new, x + eps * mom, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(p_new, expected, rtol=1e-5, atol=1e-6)
    p_old = np.concatenate([np.ravel(x) for x in jax.tree.leaves(p)])
    p_new = np.concatenate([np.ravel(x) for x in jax.tree.leaves(state.p)])
    d = p_old.size
    expected_xi = xi + eps * (p_old @ p_old / d - 1.0)
    # the new momentum would give another thermostat
    assert abs(expected_xi - (xi + eps * (p_new @ p_new / d - 1.0))) > 0.02
    np.testing.assert_allclose(state.thermostat, expected_xi, rtol=1e-6)
    np.testing.assert_allclose(info.thermostat, expected_xi, rtol=1e-6)
    np.testing.assert_allclose(info.kinetic_energy, p_new @ p_new / 2, rtol=1e-5)
    tau = np.concatenate([np.ravel(x) for x in jax.tree.leaves(noise_sd)])
    np.testing.assert_allclose(info.noise_exceeded, np.mean(eps * tau**2 >= 2 * a))
    assert 0 < float(info.noise_exceeded) < 1


# --------------------------------------------------------------------------------------
# 3. limits


def test_zero_noise_corrected_is_vanilla():
    """noise_sd = 0: the corrected variants are the vanilla ones, bit for bit."""
    z, p, z_grad, _ = _crn_problem()
    zero = tree_like(z, jnp.zeros_like)
    key = random.key(5)
    for noise_sd in (zero, 0.0):
        van = sghmc_step(key, SGHMCState(z, p), z_grad, 0.3, friction=0.8)
        cor = sghmc_step(
            key,
            SGHMCState(z, p),
            z_grad,
            0.3,
            friction=0.8,
            variant="corrected",
            noise_sd=noise_sd,
        )
        assert _tree_equal(van, cor)
        state = SGNHTState(z, p, jnp.float32(1.1))
        van = sgnht_step(key, state, z_grad, 0.3, diffusion=0.8)
        cor = sgnht_step(
            key, state, z_grad, 0.3, diffusion=0.8, variant="corrected", noise_sd=0.0
        )
        assert _tree_equal(van, cor)


def test_zero_friction_is_explicit_euler_hamiltonian_flow():
    """C = 0 (SGHMC) or A = xi = 0 (SGNHT) injects nothing: the deterministic
    explicit Euler step z' = z + eps p / m, p' = p - eps z_grad."""
    z, p, z_grad, _ = _crn_problem()
    state, _ = sghmc_step(
        random.key(0), SGHMCState(z, p), z_grad, 0.3, friction=0.0, mass=2.0
    )
    for x, mom, g, x_new, p_new in zip(
        *(jax.tree.leaves(t) for t in (z, p, z_grad, state.z, state.p))
    ):
        np.testing.assert_allclose(x_new, x + 0.3 * mom / 2.0, rtol=1e-6)
        np.testing.assert_allclose(p_new, mom - 0.3 * g, rtol=1e-6, atol=1e-7)
    nht, _ = sgnht_step(
        random.key(0), SGNHTState(z, p, jnp.float32(0.0)), z_grad, 0.3, diffusion=0.0
    )
    hmc, _ = sghmc_step(random.key(0), SGHMCState(z, p), z_grad, 0.3, friction=0.0)
    assert _tree_equal((nht.z, nht.p), tuple(hmc))


# --------------------------------------------------------------------------------------
# 4. exact law of the discretised SGHMC chain on a Gaussian target

# Two independent coordinates with their own target sd s, step eps, friction C and
# mass m. Per coordinate (z, p) is linear-Gaussian: x' = T x + noise with
# T = [[1, eps/m], [-eps/s^2, 1 - eps C/m]], whose eigenvalues have modulus
# sqrt(1 - eps C/m + eps^2/(m s^2)) = 0.954 and 0.977 here (checked in the test).
TARGET_SD = np.array([1.0, 0.5])
EPS = np.array([0.1, 0.05])
FRICTION = np.array([1.0, 2.0])
MASS = np.array([1.0, 2.0])
NUM_CHAINS, NUM_STEPS = 10_000, 400


def _transition(eps, friction, mass, s):
    return np.array([[1.0, eps / mass], [-eps / s**2, 1.0 - eps * friction / mass]])


def _stationary_cov(eps, friction, mass, s, noise_var):
    """Sigma = T Sigma T^T + diag(0, noise_var): the discretised chain's exact law."""
    t = _transition(eps, friction, mass, s)
    assert np.max(np.abs(np.linalg.eigvals(t))) < 1.0
    return linalg.solve_discrete_lyapunov(t, np.diag([0.0, noise_var]))


def _momentum_noise_var(eps, friction, tau, b_hat):
    """Per step variance put into p: the injected eps (2C - eps B)_+ plus the gradient
    noise (eps tau)^2."""
    return eps * np.maximum(2 * friction - eps * b_hat, 0.0) + (eps * tau) ** 2


@partial(jax.jit, static_argnames=("variant", "num_chains", "num_steps"))
def _sghmc_final_states(
    key, eps, friction, mass, s, tau, *, variant, num_chains, num_steps
):
    """Final (z, p) of independent SGHMC chains on N(0, diag(s^2)), from z = 3 s and
    p ~ N(0, m); the gradient estimate is z / s^2 + tau * eta, eta ~ N(0, 1) fresh
    each step, and the rule is told tau as noise_sd."""

    def chain(key):
        key_init, key_run = random.split(key)
        state = sghmc_init(3.0 * s, key_init, mass=mass)

        def body(state, k):
            k_step, k_noise = random.split(k)
            z_grad = state.z / s**2 + tau * random.normal(k_noise, s.shape)
            state, _ = sghmc_step(
                k_step,
                state,
                z_grad,
                eps,
                friction=friction,
                mass=mass,
                variant=variant,
                noise_sd=tau,
            )
            return state, None

        state, _ = lax.scan(body, state, random.split(key_run, num_steps))
        return state

    return jax.vmap(chain)(random.split(key, num_chains))


def _law_deviations(z, p, cov):
    """|statistic - exact| / se for Var z, Var p and Cov(z, p) of each coordinate,
    se being the sd of the statistic over m independent Gaussian draws."""
    m = z.shape[0]
    out = []
    for j in range(z.shape[1]):
        c = cov[j]
        stats_ = (
            z[:, j].var(ddof=1),
            p[:, j].var(ddof=1),
            np.cov(z[:, j], p[:, j])[0, 1],
        )
        exact = (c[0, 0], c[1, 1], c[0, 1])
        se = (
            c[0, 0] * np.sqrt(2 / (m - 1)),
            c[1, 1] * np.sqrt(2 / (m - 1)),
            np.sqrt((c[0, 0] * c[1, 1] + c[0, 1] ** 2) / (m - 1)),
        )
        out += [abs(a - b) / e for a, b, e in zip(stats_, exact, se)]
    return np.array(out)


def _law(b_hat_ratio, tau_ratio):
    """Exact covariances, one per coordinate, for B = ratio * 2C / eps, tau likewise."""
    tau = np.sqrt(tau_ratio * 2 * FRICTION / EPS)
    b_hat = b_hat_ratio * 2 * FRICTION / EPS
    noise_var = _momentum_noise_var(EPS, FRICTION, tau, b_hat)
    return [
        _stationary_cov(*args)
        for args in zip(EPS, FRICTION, MASS, TARGET_SD, noise_var)
    ]


# (variant, r) with eps tau^2 = r * 2C on every coordinate; "expected" and "wrong"
# give the (B-hat, tau) ratios of the exact law and of a wrong one.
SGHMC_LAW_CASES = {
    # exact gradients: the discretised law, O(eps) off the target (wrong: target)
    "vanilla-exact": ("vanilla", 0.0, (0.0, 0.0), None),
    # corrected: injected + gradient noise = 2 eps C again: the noise-free law;
    # wrong: the same noise without the -eps B correction
    "corrected-noisy": ("corrected", 0.45, (0.45, 0.45), (0.0, 0.45)),
    # vanilla, told tau but not using it: inflated; wrong: the corrected law
    "vanilla-noisy": ("vanilla", 0.45, (0.0, 0.45), (0.45, 0.45)),
    # corrected with eps tau^2 > 2C: nothing injected, only the gradient noise;
    # wrong: the noise-free law the correction aims at
    "corrected-clipped": ("corrected", 1.25, (1.25, 1.25), (0.0, 0.0)),
}


@pytest.mark.parametrize("case", list(SGHMC_LAW_CASES))
def test_sghmc_stationary_law_is_exact(case):
    """Discretised SGHMC on a diagonal Gaussian has an exact Gaussian law.

    Per coordinate x = (z, p) follows x' = T x + (0, noise) with noise variance
    eps (2C - eps B)_+ + eps^2 tau^2, so the stationary covariance solves the discrete
    Lyapunov equation Sigma = T Sigma T^T + diag(0, noise variance). m = 10000
    independent chains (vmap over lax.scan), 400 steps from z = 3 s (the transient
    decays as 0.977^800 ~ 1e-8). Var z, Var p and Cov(z, p) of each of the two
    coordinates are each within 4 se of Sigma (se: sd of the statistic for m Gaussian
    draws; failure rate about 6 x 6e-5 = 4e-4 per case), and the stated wrong law
    (for exact gradients the target itself, diag(s^2) and diag(m)) is more than
    4 se away in at least one of them.
    """
    variant, r, expected, wrong = SGHMC_LAW_CASES[case]
    tau = np.sqrt(r * 2 * FRICTION / EPS)
    state = _sghmc_final_states(
        random.key(17),
        *(jnp.asarray(v, jnp.float32) for v in (EPS, FRICTION, MASS, TARGET_SD, tau)),
        variant=variant,
        num_chains=NUM_CHAINS,
        num_steps=NUM_STEPS,
    )
    z, p = np.asarray(state.z, np.float64), np.asarray(state.p, np.float64)
    dev = _law_deviations(z, p, _law(*expected))
    assert np.all(dev < 4.0), dev
    if wrong is None:
        wrong_law = [np.diag([s**2, m]) for s, m in zip(TARGET_SD, MASS)]
    else:
        wrong_law = _law(*wrong)
    assert np.max(_law_deviations(z, p, wrong_law)) > 4.0


# --------------------------------------------------------------------------------------
# 5. SGNHT's thermostat absorbs gradient noise it is not told of

# N(0, I_d), gradient z + tau eta with tau unknown to the samplers (vanilla);
# eps tau^2 / 2 = 1 = A, so the total diffusion is twice the injected one.
NHT_EPS, NHT_A, NHT_TAU, NHT_D = 0.02, 1.0, 10.0, 32
NHT_CHAINS, NHT_BURN, NHT_KEEP = 500, 600, 1000


@jax.jit
def _sgnht_time_averages(key, eps, diffusion, tau):
    """Per chain, the averages over NHT_KEEP steps (after NHT_BURN) of the thermostat
    and of z^T z / d. Starts at z, p ~ N(0, I) and the thermostat at A, which reaches
    its stationary mean within about 400 steps."""

    def step(state, k):
        k_step, k_noise = random.split(k)
        z_grad = state.z + tau * random.normal(k_noise, (NHT_D,))
        state, _ = sgnht_step(k_step, state, z_grad, eps, diffusion=diffusion)
        return state

    def chain(key):
        key_init, key_burn, key_keep = random.split(key, 3)
        z = random.normal(random.fold_in(key_init, 1), (NHT_D,))
        state = sgnht_init(z, key_init, diffusion=diffusion)
        keys = random.split(key_burn, NHT_BURN)
        state, _ = lax.scan(lambda s, k: (step(s, k), None), state, keys)

        def keep(carry, k):
            state, sum_xi, sum_z2 = carry
            state = step(state, k)
            return (
                state,
                sum_xi + state.thermostat,
                sum_z2 + jnp.mean(state.z**2),
            ), None

        init = (state, jnp.float32(0.0), jnp.float32(0.0))
        keys = random.split(key_keep, NHT_KEEP)
        (_, sum_xi, sum_z2), _ = lax.scan(keep, init, keys)
        return sum_xi / NHT_KEEP, sum_z2 / NHT_KEEP

    return jax.vmap(chain)(random.split(key, NHT_CHAINS))


def _mean_and_se(x):
    x = np.asarray(x, np.float64)
    return x.mean(), x.std(ddof=1) / np.sqrt(x.size)


@pytest.fixture(scope="module")
def sgnht_run():
    """Mean and se of the per-chain time averages of xi and of z^T z / d."""
    averages = _sgnht_time_averages(random.key(31), NHT_EPS, NHT_A, NHT_TAU)
    return [_mean_and_se(x) for x in averages]


def _frozen_thermostat():
    """xi* with Var p = 1 for the linear chain at friction fixed to xi*, and the
    Var z of that chain."""
    noise_var = _momentum_noise_var(NHT_EPS, NHT_A, NHT_TAU, 0.0)

    def cov(xi):
        return _stationary_cov(NHT_EPS, xi, 1.0, 1.0, noise_var)

    xi_star = optimize.brentq(lambda xi: cov(xi)[1, 1] - 1.0, 0.5, 10.0)
    return xi_star, cov(xi_star)[0, 0]


def test_sgnht_thermostat_settles_at_the_total_diffusion(sgnht_run):
    """The long-run mean of xi is A + eps tau^2 / 2 (= 2 here), not A (= 1).

    Why: per step each p_j gets the injected 2 eps A plus the unknown gradient noise's
    eps^2 tau^2, a diffusion A + eps tau^2 / 2 per unit time; at stationarity
    E xi' = E xi forces E[p^T p / d] = 1 exactly, and friction xi with that diffusion
    holds the temperature at (A + eps tau^2/2) / xi, hence xi ~ A + eps tau^2 / 2.
    In discrete time, freezing xi and solving the Lyapunov equation for Var p = 1
    gives xi* = A + eps tau^2/2 + eps (1 + xi*^2 / 2) + O(eps^2) = 2.062. What the
    freezing neglects is O(eps / d): stationarity of E xi^2 gives
    Cov(xi, p^T p / d) = -(eps / 2) Var(p^T p / d) ~ -eps / d.

    Statistic: mean over 500 chains of each chain's average of xi over 1000 steps
    (after 600), se from the spread of the chain averages (about 0.003). Asserted:
    |mean - xi*| < 4 se + 2 eps / d, and |mean - (A + eps tau^2 / 2)| < 4 se +
    2 eps (1 + xi*^2 / 2) (twice the O(eps) term); A alone is outside that band.
    Failure rate of a correct rule: about 1e-4.
    """
    (xi_bar, se), _ = sgnht_run
    xi_star, _ = _frozen_thermostat()
    heat = NHT_A + NHT_EPS * NHT_TAU**2 / 2
    assert abs(xi_bar - xi_star) < 4 * se + 2 * NHT_EPS / NHT_D, (xi_bar, xi_star)
    tol = 4 * se + 2 * NHT_EPS * (1 + xi_star**2 / 2)
    assert abs(xi_bar - heat) < tol, (xi_bar, heat)
    assert abs(xi_bar - NHT_A) > tol


def test_sgnht_variance_is_right_where_sghmc_inflates(sgnht_run):
    """With the same unknown noise SGNHT keeps Var z ~ 1; SGHMC with C = A does not.

    SGNHT: the identities E z'^2 = E z^2 and E z'p' = E zp of the stationary chain give
    Var z = E p^2 (1 - eps E xi / 2 + eps^2 / 2) + O(eps / d), and E p^2 = 1 exactly
    (previous test), so |Var z - 1| <= eps E xi / 2 + eps^2 / 2 + 2 eps / d = 0.022,
    the O(eps) allowance; the statistic is the mean of z^T z / d over the 500 chains'
    1000 kept steps, se (about 0.003) from the spread of the chain averages.

    SGHMC with friction C = A on the same noise (vanilla, tau unknown) is linear: its
    exact Var z from the Lyapunov equation (noise 2 eps C + eps^2 tau^2) is 2.04,
    far outside SGNHT's band around 1. The sampled SGHMC (the runner of the exact-law
    test: 10000 chains x 2 independent coordinates, 400 steps from z = 3, a transient
    of 0.003) matches it within 4 se, se = 2.04 sqrt(2 / 20000) = 0.02. Failure rate
    of a correct rule: about 2e-4 (two 4-se checks).
    """
    (xi_bar, _), (v_nht, se_nht) = sgnht_run
    allowance = NHT_EPS * xi_bar / 2 + NHT_EPS**2 / 2 + 2 * NHT_EPS / NHT_D
    assert abs(v_nht - 1.0) < 4 * se_nht + allowance, v_nht

    noise_var = _momentum_noise_var(NHT_EPS, NHT_A, NHT_TAU, 0.0)
    v_exact = _stationary_cov(NHT_EPS, NHT_A, 1.0, 1.0, noise_var)[0, 0]
    assert v_exact - 1.0 > 10 * (4 * se_nht + allowance)
    state = _sghmc_final_states(
        random.key(37),
        *(jnp.full(2, v, jnp.float32) for v in (NHT_EPS, NHT_A, 1.0, 1.0, NHT_TAU)),
        variant="vanilla",
        num_chains=NUM_CHAINS,
        num_steps=NUM_STEPS,
    )
    z = np.asarray(state.z, np.float64)
    v_hmc = np.mean(z**2)
    assert abs(v_hmc - v_exact) < 4 * v_exact * np.sqrt(2 / z.size), (v_hmc, v_exact)


# --------------------------------------------------------------------------------------
# 6. bad input


def test_unknown_variant_raises():
    z = {"a": jnp.zeros(2)}
    with pytest.raises(ValueError, match="variant"):
        sghmc_step(random.key(0), sghmc_init(z), z, 0.1, variant="extreme")
    with pytest.raises(ValueError, match="variant"):
        sgnht_step(random.key(0), sgnht_init(z), z, 0.1, variant="extreme")


def test_corrected_without_noise_sd_raises():
    z = {"a": jnp.zeros(2)}
    with pytest.raises(ValueError, match="noise_sd"):
        sghmc_step(random.key(0), sghmc_init(z), z, 0.1, variant="corrected")
    with pytest.raises(ValueError, match="noise_sd"):
        sgnht_step(random.key(0), sgnht_init(z), z, 0.1, variant="corrected")


def test_mismatched_hyperparameters_raise():
    z = {"a": jnp.zeros(4), "b": jnp.zeros(4)}
    state = sghmc_init(z)
    for name in ("friction", "mass"):
        with pytest.raises(ValueError, match=name):
            sghmc_step(random.key(0), state, z, 0.1, **{name: {"a": 1.0}})
    with pytest.raises(ValueError, match="step_size"):
        sghmc_step(random.key(0), state, z, {"a": 0.1, "c": 0.2})
    # SGNHT's thermostat is one scalar, so are its step size and diffusion
    with pytest.raises(ValueError, match="step_size"):
        sgnht_step(random.key(0), sgnht_init(z), z, {"a": 0.1, "b": 0.2})
    with pytest.raises(ValueError, match="diffusion"):
        sgnht_step(random.key(0), sgnht_init(z), z, 0.1, diffusion=jnp.ones(2))
