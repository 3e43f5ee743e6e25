"""Tests for the pure SGBD and SGLD update rules in :mod:`numpyro_sgbd.updates`.

Every random quantity comes from a fixed key, so each test is deterministic. For the
statistical tests the docstring states the tolerance and the probability that a
*correct* implementation would fail it for a random key (its failure rate).

Common-random-number tests rebuild the unit draws the update rules make: one key per
leaf of ``z`` from ``random.split(rng_key, num_leaves)`` (``_tree.map_coordinates``);
SGLD draws ``random.normal(leaf_key, shape, dtype)``; SGBD splits the leaf key into
``(key_w, key_b)`` for the increment's unit normal and the coin's uniform.
"""

from functools import partial

from _trees import tree_like, tree_z
import jax
from jax import lax, random
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from numpyro_sgbd.updates import (
    BARKER_TOLERANCE,
    VARIANTS,
    barker_step,
    flip_probability,
    langevin_step,
)

# Our own numerics (no ArviZ, no NumPyro contract): CI's Python 3.12 run
# skips them; the first run covers them.
pytestmark = pytest.mark.heavy

INCREMENTS = ("bimodal", "gaussian")
BARKER_CASES = [(v, inc) for v in VARIANTS for inc in INCREMENTS]

# Monte Carlo size for expectations of a flip probability. A mean of M values in
# [0, 1] has standard deviation at most 0.5 / sqrt(M) whatever their law.
NUM_NOISE_DRAWS = 200_000
MC_SD_BOUND = 0.5 / np.sqrt(NUM_NOISE_DRAWS)
# Corollary 1 of Mauri & Zanella (2024).
COROLLARY1_BOUND = 0.019


# --------------------------------------------------------------------------------------
# helpers


def leaf_keys(rng_key, z):
    return random.split(rng_key, len(jax.tree.leaves(z)))


def _barker_unit_draws(rng_key, z, step_size, increment):
    """The increments ``w`` and coin uniforms ``u`` barker_step draws, as leaf lists."""
    ws, us = [], []
    sigmas = jax.tree.leaves(step_size) if not np.isscalar(step_size) else None
    for i, (key, x) in enumerate(zip(leaf_keys(rng_key, z), jax.tree.leaves(z))):
        sigma = step_size if sigmas is None else sigmas[i]
        key_w, key_b = random.split(key)
        eps = random.normal(key_w, jnp.shape(x), x.dtype)
        w = sigma * (1.0 + 0.1 * eps) if increment == "bimodal" else sigma * eps
        ws.append(w)
        us.append(random.uniform(key_b, jnp.shape(x), x.dtype))
    return ws, us


def _sgld_unit_draws(rng_key, z):
    return [
        random.normal(key, jnp.shape(x), x.dtype)
        for key, x in zip(leaf_keys(rng_key, z), jax.tree.leaves(z))
    ]


def _step(rule, variant, increment=None):
    if rule == "barker":
        return partial(barker_step, variant=variant, increment=increment)
    return partial(langevin_step, variant=variant)


ALL_RULE_CASES = [("barker", v, inc) for v, inc in BARKER_CASES] + [
    ("langevin", v, None) for v in VARIANTS
]


# --------------------------------------------------------------------------------------
# 1. pytrees, dtypes, jit, per-coordinate step sizes


def _pytree_problem():
    z = tree_z()
    z["e"] = jnp.array([0.5, -0.5], jnp.float16)  # a leaf of another dtype
    z_grad = tree_like(z, lambda x: 0.3 * x + 0.1)
    noise_sd = tree_like(z, lambda x: jnp.full(jnp.shape(x), 0.8))
    return z, z_grad, noise_sd


def _all_rule_steps(rng_key, z, z_grad, step_size, noise_sd):
    return [
        _step(rule, variant, increment)(
            rng_key, z, z_grad, step_size, noise_sd=noise_sd
        )
        for rule, variant, increment in ALL_RULE_CASES
    ]


@pytest.mark.parametrize("rule,variant,increment", ALL_RULE_CASES)
def test_pytree_shapes_and_dtypes(rule, variant, increment):
    z, z_grad, noise_sd = _pytree_problem()
    step = _step(rule, variant, increment)
    z_new, exceeded = step(random.key(0), z, z_grad, 0.3, noise_sd=noise_sd)
    assert jax.tree.structure(z_new) == jax.tree.structure(z)
    assert jax.tree.structure(exceeded) == jax.tree.structure(z)
    for x, x_new, ex in zip(
        jax.tree.leaves(z), jax.tree.leaves(z_new), jax.tree.leaves(exceeded)
    ):
        assert x_new.shape == x.shape and x_new.dtype == x.dtype
        assert ex.shape == x.shape and ex.dtype == jnp.bool_
        assert bool(jnp.all(jnp.isfinite(x_new)))
        if not (rule == "langevin" and variant == "extreme"):
            assert bool(jnp.any(x_new != x))  # it moved


def test_all_rules_under_jit_match_eager():
    """Every rule/variant/increment traced in one jitted function (one compilation),
    with the step size as a traced argument, gives the eager result."""
    z, z_grad, noise_sd = _pytree_problem()
    key = random.key(0)
    # The same step-size dtype on both sides: with a float16 leaf the dtype of the
    # coin's uniform draw follows the promoted dtype of w, hence of step_size.
    step_size = jnp.float32(0.3)
    eager = _all_rule_steps(key, z, z_grad, step_size, noise_sd)
    jitted = jax.jit(_all_rule_steps)(key, z, z_grad, step_size, noise_sd)
    for case, (z_e, ex_e), (z_j, ex_j) in zip(ALL_RULE_CASES, eager, jitted):
        assert jax.tree.structure(z_j) == jax.tree.structure(z), case
        for a, b in zip(jax.tree.leaves(z_j), jax.tree.leaves(z_e)):
            assert a.dtype == b.dtype, case
            np.testing.assert_allclose(
                np.asarray(a, np.float32),
                np.asarray(b, np.float32),
                rtol=1e-3,
                atol=1e-3,
                err_msg=str(case),
            )
        assert jax.tree.all(jax.tree.map(jnp.array_equal, ex_j, ex_e)), case


def test_array_z_and_scalar_z():
    """A bare array and a bare scalar are pytrees too."""
    for z in (jnp.zeros(5), jnp.zeros(())):
        for step in (barker_step, langevin_step):
            z_new, exceeded = step(random.key(1), z, jnp.ones_like(z), 0.1)
            assert z_new.shape == z.shape and z_new.dtype == z.dtype
            assert exceeded.shape == z.shape


@pytest.mark.parametrize("variant,increment", BARKER_CASES)
def test_barker_common_random_numbers(variant, increment):
    """z_new = z + b w with b = +1 iff u < p(w, -z_grad), p from flip_probability.

    The increments, the uniforms, the step sizes (one per coordinate, spanning four
    orders of magnitude) and the noise sd (one per coordinate, some beyond the
    tolerance) are all rebuilt here from the same key.
    """
    z = tree_z()
    z_grad = tree_like(z, lambda x: 2.0 * x - 0.3)
    step_size = {
        "a": jnp.asarray(1e-3, jnp.float32),
        "b": jnp.array([1e-2, 0.5, 3.0], jnp.float32),
        "c": {"d": jnp.geomspace(1e-3, 10.0, 8, dtype=jnp.float32).reshape(2, 4)},
    }
    noise_sd = tree_like(z, lambda x: jnp.linspace(0.0, 4.0, x.size).reshape(x.shape))
    key = random.key(3)
    z_new, exceeded = barker_step(
        key,
        z,
        z_grad,
        step_size,
        variant=variant,
        noise_sd=noise_sd,
        increment=increment,
    )
    ws, us = _barker_unit_draws(key, z, step_size, increment)
    leaves = zip(
        jax.tree.leaves(z),
        jax.tree.leaves(z_grad),
        jax.tree.leaves(noise_sd),
        ws,
        us,
        jax.tree.leaves(z_new),
        jax.tree.leaves(exceeded),
    )
    for x, grad, tau, w, u, x_new, ex in leaves:
        p, ex_expected = flip_probability(w, -grad, variant=variant, noise_sd=tau)
        expected = x + jnp.where(u < p, 1.0, -1.0) * w
        np.testing.assert_allclose(x_new, expected, rtol=1e-6, atol=1e-7)
        # |z_new - z| = |w|: the step size really is per coordinate.
        np.testing.assert_allclose(jnp.abs(x_new - x), jnp.abs(w), rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(ex, ex_expected)
    if variant == "corrected":
        assert bool(jax.tree.reduce(jnp.logical_or, jax.tree.map(jnp.any, exceeded)))


def test_scalar_leaves_of_step_size_broadcast_per_leaf():
    """A step_size pytree whose leaves are scalars gives one step size per leaf."""
    z = {"a": jnp.zeros(4), "b": jnp.zeros(4)}
    z_grad = {"a": jnp.ones(4), "b": jnp.ones(4)}
    z_new, _ = langevin_step(
        random.key(0), z, z_grad, {"a": 0.1, "b": 2.0}, variant="extreme"
    )
    np.testing.assert_allclose(z_new["a"], -0.005, rtol=1e-6)
    np.testing.assert_allclose(z_new["b"], -2.0, rtol=1e-6)
    with pytest.raises(ValueError, match="step_size"):
        langevin_step(random.key(0), z, z_grad, {"a": 0.1, "c": 2.0})
    with pytest.raises(ValueError, match="step_size"):
        langevin_step(random.key(0), z, z_grad, {"a": jnp.ones(4)})


def test_mismatched_one_leaf_step_size_raises():
    z = {"a": jnp.zeros(4), "b": jnp.zeros(4)}
    with pytest.raises(ValueError, match="step_size"):
        langevin_step(random.key(0), z, z, {"a": 0.1})


# --------------------------------------------------------------------------------------
# 2-3. SGBD theorems on the flip probability under Gaussian gradient noise


def _expected_flip(variant):
    """E p(w, g + tau xi) for xi ~ N(0, 1), over a list of (g, w, tau), by Monte Carlo.

    The same M noise draws serve every grid point (common random numbers). The mean is
    taken in two stages so that float32 summation error stays far below 1e-5.
    """
    xi = random.normal(random.key(2024), (NUM_NOISE_DRAWS,))

    @jax.jit
    def run(grid):
        def one(gwt):
            g, w, tau = gwt[0], gwt[1], gwt[2]
            p, _ = flip_probability(w, g + tau * xi, variant=variant, noise_sd=tau)
            return p.reshape(400, -1).mean(axis=1).mean()

        return lax.map(one, grid)

    return lambda grid: np.asarray(run(jnp.asarray(grid, jnp.float32)), np.float64)


def _corollary1_grid():
    grid = [
        (g, w, tau)
        for g in (-4.0, -1.5, -0.5, 0.0, 0.3, 1.0, 2.5, 5.0)
        for w in (-0.8, 0.1, 0.4, 0.8, 1.2, 2.0)
        for tau in (0.0, 0.3, 1.0, 1.5, 2.5, 4.0)
        if abs(w) * tau < BARKER_TOLERANCE
    ]
    # right at the edge of the tolerance, where alpha is large
    grid += [(g, 1.0, 1.69) for g in (-2.0, 0.5, 3.0)]
    return np.array(grid)


def test_corollary1_corrected_flip_probability_is_nearly_unbiased():
    """SGBD Corollary 1: |E p_corrected(g + tau xi, w) - sigmoid(w g)| < 0.019.

    For every grid point inside the tolerance |w| < 1.702/tau. Each E p is a mean of
    M = 200k values in [0, 1] (sd <= 0.5/sqrt(M) = 0.0011), so the test allows
    0.019 + 5 sd; its failure rate for a correct rule is below 1e-6 per point (the
    exact worst error over a fine grid, by quadrature, is about 0.011). The same check
    for vanilla SGBD must fail somewhere, or the test could not tell them apart.
    """
    grid = _corollary1_grid()
    g, w = grid[:, 0], grid[:, 1]
    p_true = 1.0 / (1.0 + np.exp(-w * g))
    tol = COROLLARY1_BOUND + 5 * MC_SD_BOUND

    err_corrected = np.abs(_expected_flip("corrected")(grid) - p_true)
    worst = int(np.argmax(err_corrected))
    assert err_corrected.max() < tol, (grid[worst], err_corrected[worst])

    err_vanilla = np.abs(_expected_flip("vanilla")(grid) - p_true)
    assert err_vanilla.max() > COROLLARY1_BOUND + 5 * MC_SD_BOUND
    # ... and it is the noise that breaks vanilla: at tau = 0 the two agree.
    no_noise = grid[:, 2] == 0.0
    np.testing.assert_allclose(
        err_vanilla[no_noise], err_corrected[no_noise], rtol=0, atol=1e-6
    )


PROPOSITION1_POINTS = [
    # (g, w, tau): exact shrinkage |p - .5| - |E p_hat - .5| from 0.010 to 0.15
    (1.0, 1.0, 1.0),
    (2.0, 0.5, 2.0),
    (-1.5, 1.0, 0.5),
    (0.5, 2.0, 1.0),
    (3.0, 1.0, 3.0),
    (-2.0, 0.7, 1.5),
    (0.4, -1.5, 2.0),
    (4.0, 0.3, 4.0),
    (1.0, 1.0, 0.5),
]


def test_proposition1_vanilla_is_shrunk_toward_half():
    """SGBD Proposition 1: vanilla E p_hat lies strictly between 1/2 and p.

    Asserted as |E p_hat - 1/2| + 4 sd < |p - 1/2| with sd <= 0.5/sqrt(M) = 0.0011
    (the smallest exact shrinkage at these points is 0.010, about 9 sd); and E p_hat is
    on the same side of 1/2 as p. Failure rate for a correct rule: below 1e-4.
    """
    grid = np.array(PROPOSITION1_POINTS)
    p_true = 1.0 / (1.0 + np.exp(-grid[:, 1] * grid[:, 0]))
    e_hat = _expected_flip("vanilla")(grid)
    assert np.all(np.abs(e_hat - 0.5) + 4 * MC_SD_BOUND < np.abs(p_true - 0.5))
    assert np.all((e_hat - 0.5) * (p_true - 0.5) > 0)


# --------------------------------------------------------------------------------------
# 4. the extreme (sign) rule


def test_sign_rule_flip_probability():
    w = jnp.array([-2.0, -0.5, 0.0, 0.5, 2.0, 1.0, 1.0, 1.0, 3.0])
    force = jnp.array([1.0, -3.0, 5.0, 0.0, 7.0, -1e-6, 1e-6, 1e30, -1e30])
    expected = jnp.array([0.0, 1.0, 0.5, 0.5, 1.0, 0.0, 1.0, 1.0, 0.0])
    p, exceeded = flip_probability(w, force, variant="extreme")
    np.testing.assert_array_equal(p, expected)
    assert not bool(jnp.any(exceeded))  # no noise_sd given: nothing to exceed
    # corrected outside the tolerance falls back to the sign rule (and says so)
    outside = jnp.abs(w) * 3.0 >= BARKER_TOLERANCE
    assert 0 < int(outside.sum()) < w.size
    p, exceeded = flip_probability(w, force, variant="corrected", noise_sd=3.0)
    np.testing.assert_array_equal(p[outside], expected[outside])
    assert not bool(jnp.any((p == expected)[~outside & (w * force != 0)]))
    np.testing.assert_array_equal(exceeded, outside)
    # with noise_sd, every variant reports the same tolerance check
    for variant in ("vanilla", "extreme"):
        _, exceeded = flip_probability(w, force, variant=variant, noise_sd=3.0)
        np.testing.assert_array_equal(exceeded, outside)
    # vanilla is the stable sigmoid (no NaN at |w g| >> 1)
    p, exceeded = flip_probability(w, force, variant="vanilla")
    assert not bool(jnp.any(exceeded))
    assert bool(jnp.all(jnp.isfinite(p)))
    np.testing.assert_allclose(p, jax.nn.sigmoid(w * force))
    np.testing.assert_array_equal(p[-2:], jnp.array([1.0, 0.0]))


@pytest.mark.parametrize("increment", INCREMENTS)
def test_extreme_barker_moves_along_the_force(increment):
    """Extreme SGBD: z_new - z = sign(force) |w| deterministically, force = -z_grad."""
    z = tree_z()
    z_grad = tree_like(z, lambda x: 2.0 * x - 0.3)  # both signs, never 0
    key = random.key(7)
    z_new, _ = barker_step(key, z, z_grad, 0.4, variant="extreme", increment=increment)
    ws, _ = _barker_unit_draws(key, z, 0.4, increment)
    for x, grad, w, x_new in zip(
        jax.tree.leaves(z), jax.tree.leaves(z_grad), ws, jax.tree.leaves(z_new)
    ):
        np.testing.assert_allclose(
            x_new - x, jnp.sign(-grad) * jnp.abs(w), rtol=1e-5, atol=1e-6
        )
    # only the sign of the force matters: scaling it leaves the move unchanged
    z_scaled, _ = barker_step(
        key,
        z,
        jax.tree.map(lambda g: 1e3 * g, z_grad),
        0.4,
        variant="extreme",
        increment=increment,
    )
    assert jax.tree.all(jax.tree.map(jnp.array_equal, z_scaled, z_new))


# --------------------------------------------------------------------------------------
# 5. limits


@pytest.mark.parametrize("increment", INCREMENTS)
def test_zero_noise_corrected_barker_is_vanilla(increment):
    z = tree_z()
    z_grad = tree_like(z, lambda x: 3.0 * x - 0.2)
    zero = tree_like(z, jnp.zeros_like)
    args = (random.key(5), z, z_grad, 0.7)
    z_van, _ = barker_step(*args, variant="vanilla", increment=increment)
    z_cor, exceeded = barker_step(
        *args, variant="corrected", noise_sd=zero, increment=increment
    )
    assert jax.tree.all(jax.tree.map(jnp.array_equal, z_van, z_cor))
    assert not any(bool(jnp.any(e)) for e in jax.tree.leaves(exceeded))


def test_zero_noise_corrected_langevin_is_vanilla():
    z = tree_z()
    z_grad = tree_like(z, lambda x: 3.0 * x - 0.2)
    args = (random.key(5), z, z_grad, 0.7)
    z_van, _ = langevin_step(*args, variant="vanilla")
    z_cor, exceeded = langevin_step(*args, variant="corrected", noise_sd=0.0)
    assert jax.tree.all(jax.tree.map(jnp.array_equal, z_van, z_cor))
    assert not any(bool(jnp.any(e)) for e in jax.tree.leaves(exceeded))


@pytest.mark.parametrize("variant,increment", BARKER_CASES)
def test_zero_gradient_barker_move_is_symmetric(variant, increment):
    """With zero force every variant flips a fair coin: the mean move is 0.

    Over n = 100k coordinates: |mean move| < 4 se (se = sd of the moves / sqrt(n)) and
    the fraction of moves along +w is 1/2 within 4 * 0.5/sqrt(n). Failure rate of a
    correct rule: about 1e-4. A tie broken towards one side (with the default
    positive increment) fails both.
    """
    n = 100_000
    z = jnp.zeros(n)
    key = random.key(11)
    z_new, _ = barker_step(
        key, z, jnp.zeros(n), 0.5, variant=variant, noise_sd=1.0, increment=increment
    )
    (w,), _ = _barker_unit_draws(key, z, 0.5, increment)
    move = np.asarray(z_new - z, np.float64)
    assert abs(move.mean()) < 4 * move.std() / np.sqrt(n)
    frac_plus = np.mean(move * np.asarray(w) > 0)
    assert abs(frac_plus - 0.5) < 4 * 0.5 / np.sqrt(n)


def test_extreme_langevin_is_gradient_descent():
    z = tree_z()
    z_grad = tree_like(z, lambda x: 3.0 * x - 0.2)
    step_size = tree_like(z, lambda x: jnp.linspace(0.1, 2.0, x.size).reshape(x.shape))
    z_new, exceeded = langevin_step(
        random.key(0), z, z_grad, step_size, variant="extreme"
    )
    expected = jax.tree.map(lambda x, g, s: x - s**2 / 2 * g, z, z_grad, step_size)
    for a, b in zip(jax.tree.leaves(z_new), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not any(bool(jnp.any(e)) for e in jax.tree.leaves(exceeded))


# --------------------------------------------------------------------------------------
# 6. SGLD: common random numbers


@pytest.mark.parametrize("variant", ["vanilla", "corrected"])
def test_langevin_common_random_numbers(variant):
    """z_new - (z - sigma^2/2 z_grad) = scale * xi, xi the unit normal of the same key.

    scale = sigma (vanilla) or sqrt(max(0, sigma^2 - tau^2 sigma^4 / 4)) (corrected);
    tau sigma runs from 0 to 3 across the coordinates, so some are clipped to zero.
    """
    z = tree_z()
    z_grad = tree_like(z, lambda x: 3.0 * x - 0.2)
    step_size = tree_like(z, lambda x: jnp.linspace(0.2, 1.5, x.size).reshape(x.shape))
    noise_sd = tree_like(z, lambda x: jnp.linspace(0.0, 2.0, x.size).reshape(x.shape))
    key = random.key(9)
    z_new, exceeded = langevin_step(
        key, z, z_grad, step_size, variant=variant, noise_sd=noise_sd
    )
    leaves = zip(
        jax.tree.leaves(z),
        jax.tree.leaves(z_grad),
        jax.tree.leaves(step_size),
        jax.tree.leaves(noise_sd),
        _sgld_unit_draws(key, z),
        jax.tree.leaves(z_new),
        jax.tree.leaves(exceeded),
    )
    num_clipped = 0
    for x, grad, sigma, tau, xi, x_new, ex in leaves:
        # exceeded: the gradient noise alone carries >= sigma^2 (tau sigma >= 2)
        np.testing.assert_array_equal(ex, tau * sigma >= 2.0)
        if variant == "vanilla":
            var = sigma**2
        else:
            var = sigma**2 - tau**2 * sigma**4 / 4
            num_clipped += int(jnp.sum(var <= 0))
        scale = jnp.sqrt(jnp.maximum(var, 0.0))
        np.testing.assert_allclose(
            x_new - (x - sigma**2 / 2 * grad), scale * xi, rtol=1e-5, atol=1e-6
        )
    if variant == "corrected":
        assert num_clipped > 0


# --------------------------------------------------------------------------------------
# 7. exact law of the discretised SGLD chain on a Gaussian target


def _sgld_final_states(variant, s, sigma, tau, num_chains, num_steps, seed):
    """Final states of independent SGLD chains on N(0, s^2), started at 3 s.

    The gradient estimate is theta / s^2 + tau * eta, eta ~ N(0, 1) fresh each step
    (tau = 0: exact gradient); the rule is told the true tau.
    """

    def chain(key):
        def body(theta, k):
            k_step, k_noise = random.split(k)
            z_grad = theta / s**2 + tau * random.normal(k_noise)
            theta, _ = langevin_step(
                k_step, theta, z_grad, sigma, variant=variant, noise_sd=tau
            )
            return theta, None

        theta, _ = lax.scan(body, jnp.asarray(3.0 * s), random.split(key, num_steps))
        return theta

    keys = random.split(random.key(seed), num_chains)
    return np.asarray(jax.jit(jax.vmap(chain))(keys), np.float64)


S, SIGMA = 0.7, 0.7  # sigma = s: the drift contracts by a = 1 - sigma^2/(2 s^2) = 1/2
A = 1.0 - SIGMA**2 / (2 * S**2)


def _stationary_var(noise_var):
    # theta' = a theta + N(0, noise_var): Var = noise_var / (1 - a^2)
    return noise_var / (1.0 - A**2)


V_EXACT = S**2 / (1.0 - SIGMA**2 / (4 * S**2))  # = 4/3 s^2


@pytest.mark.parametrize(
    "variant,tau_sigma,expected,wrong",
    [
        # exact gradients: s^2/(1 - sigma^2/(4 s^2)); the target s^2 must be rejected
        ("vanilla", 0.0, V_EXACT, S**2),
        # injected noise, corrected: gradient noise + injected noise = sigma^2 again;
        # without the correction it would be the vanilla law of the next case
        ("corrected", 1.2, V_EXACT, _stationary_var(SIGMA**2 * (1 + 1.2**2 / 4))),
        # injected noise, vanilla: total noise sigma^2 + sigma^4 tau^2 / 4
        ("vanilla", 1.2, _stationary_var(SIGMA**2 * (1 + 1.2**2 / 4)), V_EXACT),
        # corrected with tau sigma > 2: injected noise clipped to 0, only the
        # gradient noise sigma^4 tau^2 / 4 is left
        ("corrected", 2.5, _stationary_var(SIGMA**2 * 2.5**2 / 4), V_EXACT),
    ],
    ids=["vanilla-exact", "corrected-noisy", "vanilla-noisy", "corrected-clipped"],
)
def test_sgld_stationary_variance_is_exact(variant, tau_sigma, expected, wrong):
    """Discretised SGLD on N(0, s^2) is an AR(1) chain with a known Gaussian law.

    theta' = a theta + (sigma^2/2) tau eta + eps, a = 1 - sigma^2/(2 s^2), so the
    stationary variance is (total noise variance) / (1 - a^2); for exact gradients this
    is s^2 / (1 - sigma^2/(4 s^2)). m = 10000 independent chains (vmap), 60 steps from
    3 s (a^60 ~ 1e-18). The sample variance of the final states has sd
    V sqrt(2/(m-1)) = 1.4% of V; the test accepts within 4 sd (failure rate 6e-5) and
    requires the stated wrong variance (the target s^2 for exact gradients) to be
    rejected at 4 sd; a KS test against N(0, V) checks the shape (failure rate 1e-4).
    """
    m = 10_000
    theta = _sgld_final_states(variant, S, SIGMA, tau_sigma / SIGMA, m, 60, seed=17)
    v_hat = theta.var(ddof=1)
    se = lambda v: v * np.sqrt(2.0 / (m - 1))  # noqa: E731
    assert abs(v_hat - expected) < 4 * se(expected), (v_hat, expected)
    assert abs(v_hat - wrong) > 4 * se(wrong), (v_hat, wrong)
    assert stats.kstest(theta, "norm", args=(0.0, np.sqrt(expected))).pvalue > 1e-4


def test_sgld_exact_variance_differs_from_target():
    """Guard for the test above: with sigma = s the exact chain is 4/3 s^2, not s^2."""
    assert _stationary_var(SIGMA**2) == pytest.approx(V_EXACT)
    assert V_EXACT / S**2 == pytest.approx(4.0 / 3.0)


# --------------------------------------------------------------------------------------
# 8. SGBD on a standard normal: approximately right for a small step


def _sgbd_final_states(variant, sigma, tau, num_chains, num_steps, seed, increment):
    """Final states of SGBD chains on N(0, 1) from N(0, 1), gradient z + tau eta."""

    @jax.jit
    def run(key):
        key_init, key_run = random.split(key)

        def body(z, k):
            k_step, k_noise = random.split(k)
            z_grad = z + tau * random.normal(k_noise, z.shape)
            z, _ = barker_step(
                k_step,
                z,
                z_grad,
                sigma,
                variant=variant,
                noise_sd=tau,
                increment=increment,
            )
            return z, None

        z0 = random.normal(key_init, (num_chains,))
        z, _ = lax.scan(body, z0, random.split(key_run, num_steps))
        return z

    return np.asarray(run(random.key(seed)), np.float64)


@pytest.mark.parametrize("increment,bias_coef", [("bimodal", 1.0), ("gaussian", 2.0)])
def test_sgbd_vanilla_variance_small_step(increment, bias_coef):
    """Vanilla SGBD with exact gradients on N(0, 1), sigma = 0.2: variance ~ 1.

    No exact law is known; unadjusted Barker has an O(sigma^2) bias in the stationary
    variance, measured at about 0.27 sigma^2 (bimodal) and 0.6 sigma^2 (gaussian
    increment) for sigma in [0.1, 1]. Tolerance: bias_coef * sigma^2 (3-4 times the
    measured bias) + 4 sd of the sample variance of m = 20000 chains (1000 steps).
    A flipped force sign diverges; a step that ignores the gradient diffuses away.
    """
    m, sigma = 20_000, 0.2
    z = _sgbd_final_states("vanilla", sigma, 0.0, m, 1000, 23, increment)
    tol = bias_coef * sigma**2 + 4 * np.sqrt(2.0 / (m - 1))
    assert abs(z.var(ddof=1) - 1.0) < tol, z.var(ddof=1)
    assert abs(z.mean()) < 4 * np.sqrt(1.0 / m) + bias_coef * sigma**2


def test_sgbd_corrected_reduces_noise_inflation():
    """With injected gradient noise (tau = 5, sigma = 0.2, |w| tau ~ 1 < 1.702) vanilla
    SGBD inflates the variance of N(0, 1) (measured 1.24) and corrected SGBD removes
    most of it (measured 1.07). Asserted: the corrected excess is smaller than the
    vanilla excess by more than 4 sd of their difference (sd <= 0.0125 sqrt(2)), and
    vanilla's excess is more than 4 sd above 1 (so the noise really matters).
    """
    m, sigma, tau = 20_000, 0.2, 5.0
    var_van = _sgbd_final_states("vanilla", sigma, tau, m, 1000, 29, "bimodal").var()
    var_cor = _sgbd_final_states("corrected", sigma, tau, m, 1000, 29, "bimodal").var()
    sd = 1.25 * np.sqrt(2.0 / (m - 1))
    assert var_van - 1.0 > 4 * sd
    assert abs(var_cor - 1.0) + 4 * np.sqrt(2) * sd < var_van - 1.0, (var_cor, var_van)


# --------------------------------------------------------------------------------------
# 9. bad input


def test_unknown_variant_raises():
    z = {"a": jnp.zeros(2)}
    for call in (
        lambda: flip_probability(jnp.ones(2), jnp.ones(2), variant="metropolis"),
        lambda: barker_step(random.key(0), z, z, 0.1, variant="metropolis"),
        lambda: langevin_step(random.key(0), z, z, 0.1, variant="metropolis"),
    ):
        with pytest.raises(ValueError, match="variant"):
            call()


def test_unknown_increment_raises():
    z = {"a": jnp.zeros(2)}
    with pytest.raises(ValueError, match="increment"):
        barker_step(random.key(0), z, z, 0.1, increment="uniform")


def test_corrected_without_noise_sd_raises():
    z = {"a": jnp.zeros(2)}
    for call in (
        lambda: flip_probability(jnp.ones(2), jnp.ones(2), variant="corrected"),
        lambda: barker_step(random.key(0), z, z, 0.1, variant="corrected"),
        lambda: langevin_step(random.key(0), z, z, 0.1, variant="corrected"),
    ):
        with pytest.raises(ValueError, match="noise_sd"):
            call()


@pytest.mark.parametrize("variant", VARIANTS)
def test_position_families_are_the_rules_draw_for_draw(variant):
    """The family form (``position_init`` / ``barker_update`` /
    ``langevin_update``), which the kernels run, moves exactly as
    ``barker_step`` / ``langevin_step`` with the same key, and reports the
    fraction of flagged coordinates."""
    from numpyro_sgbd.updates import barker_update, langevin_update, position_init

    z = tree_z()
    grad = tree_like(z, lambda x: 3.0 * jnp.cos(4.0 * x))
    noise = tree_like(z, lambda x: 1.0 + 4.0 * jnp.abs(x))  # some flagged, not all
    key = random.key(7)
    pairs = ((barker_step, barker_update), (langevin_step, langevin_update))
    for rule, family in pairs:
        new, flags = rule(key, z, grad, 0.5, variant=variant, noise_sd=noise)
        state, info = family(
            key, position_init(z), grad, 0.5, variant=variant, noise_sd=noise
        )
        for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state.z)):
            np.testing.assert_array_equal(a, b)
        leaves = jax.tree.leaves(flags)
        expected = sum(float(np.sum(x)) for x in leaves) / sum(x.size for x in leaves)
        assert float(info.noise_exceeded) == pytest.approx(expected)
        if variant == "corrected":
            assert 0 < expected < 1
