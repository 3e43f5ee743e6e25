"""Tests for the complete recipe (:mod:`numpyro_sgbd.updates.recipe`) and SGRLD
(:mod:`numpyro_sgbd.updates.sgrld`).

Every random quantity comes from a fixed key, so each test is deterministic. For the
statistical tests the docstring states the tolerance and the probability that a
*correct* implementation would fail it for a random key (its failure rate).

The recipe's drift is :math:`-(D+Q)\\nabla H + \\Gamma` (Ma, Chen & Fox, eq. (3)), so
its step adds :math:`+\\varepsilon\\Gamma`; eq. (9) as printed subtracts it. The
tests below pin the sign: the hand-computed means, and the Dirichlet test, which
fails with the sign flipped or with Gamma dropped.
"""

from functools import partial

from _trees import tree_like, tree_z
import jax
from jax import lax, random
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats
from scipy.linalg import solve_discrete_lyapunov

from numpyro_sgbd.updates import langevin_step
from numpyro_sgbd.updates.recipe import (
    RecipeInfo,
    check_recipe,
    recipe_moments,
    recipe_step,
)
from numpyro_sgbd.updates.sgrld import expanded_mean_metric, sgrld_step

# Our own numerics (no ArviZ, no NumPyro contract): CI's Python 3.12 run
# skips them; the first run covers them.
pytestmark = pytest.mark.heavy


# --------------------------------------------------------------------------------------
# helpers


def _unit_draws(rng_key, z):
    """The unit normals of langevin_step (one key per leaf), as a list of leaves."""
    leaves = jax.tree.leaves(z)
    keys = random.split(rng_key, len(leaves))
    return [random.normal(k, jnp.shape(x), x.dtype) for k, x in zip(keys, leaves)]


def _ones(x):
    return jnp.ones_like(x)


def _assert_trees_close(a, b, **kwargs):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(x, y, **kwargs)


# --------------------------------------------------------------------------------------
# 1. the recipe with D = I is SGLD, draw for draw


@jax.jit
def _recipe_and_sgld(key, z, z_grad, sigma):
    z_new, info = recipe_step(key, z, z_grad, sigma**2 / 2, diffusion=_ones)
    z_sgld, _ = langevin_step(key, z, z_grad, sigma, variant="vanilla")
    return z_new, info, z_sgld


def test_recipe_with_unit_diffusion_is_vanilla_sgld():
    """recipe_step(eps = sigma^2/2, D = 1, Q = 0) == langevin_step(sigma, vanilla),
    same key, on a multi-leaf pytree with mixed dtypes; jitted and vmapped over the
    step size (a traced call argument). The doctest runs it eagerly."""
    z = tree_z()
    z["e"] = jnp.array([0.5, -0.5], jnp.float16)
    z_grad = tree_like(z, lambda x: 3.0 * x - 0.2)
    key = random.key(4)
    sigmas = jnp.array([0.1, 0.7, 1.5], jnp.float32)
    z_grid, info, z_sgld = jax.vmap(_recipe_and_sgld, (None, None, None, 0))(
        key, z, z_grad, sigmas
    )
    _assert_trees_close(z_grid, z_sgld, rtol=1e-6, atol=1e-6)
    assert isinstance(info, RecipeInfo)
    np.testing.assert_array_equal(info.noise_clipped, 0.0)
    for x, x_new in zip(jax.tree.leaves(z), jax.tree.leaves(z_grid)):
        assert x_new.shape == (3,) + x.shape and x_new.dtype == x.dtype
        assert bool(jnp.all(x_new != x))  # it moved


def test_bare_array_and_scalar():
    """A bare array and a scalar are pytrees too."""
    for z in (jnp.zeros(5), jnp.zeros(())):
        z_new, _, z_sgld = _recipe_and_sgld(random.key(1), z, jnp.ones_like(z), 0.3)
        assert z_new.shape == z.shape and z_new.dtype == z.dtype
        np.testing.assert_allclose(z_new, z_sgld, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------
# 2. SGHMC, eq. (12)


def _sghmc_problem():
    theta = jnp.array([0.3, -1.2], jnp.float32)
    r = jnp.array([0.8, 0.4], jnp.float32)
    grad_u = jnp.array([1.5, -0.7], jnp.float32)
    v = jnp.array([2.0, 0.5], jnp.float32)  # gradient-noise variance on theta
    return theta, r, grad_u, v


def _sghmc_curl(x):
    p = x.size // 2
    eye, zero = jnp.eye(p), jnp.zeros((p, p))
    return jnp.block([[zero, -eye], [eye, zero]])


def test_sghmc_moments_are_eq12():
    """z = (theta, r), H = U + r'r/2, D = diag(0, C), Q = ((0, -I), (I, 0)) and
    noise_var = (V, 0): the mean is (theta + eps r, r - eps grad U - eps C r) and the
    covariance blockdiag(0, eps (2C - eps V)), eq. (12) with B = V. C is a full PSD
    matrix here."""
    theta, r, grad_u, v = _sghmc_problem()
    c = jnp.array([[1.0, 0.3], [0.3, 0.6]], jnp.float32)
    eps = 0.2
    d_full = jnp.zeros((4, 4)).at[2:, 2:].set(c)
    mean, cov = recipe_moments(
        (theta, r),
        (grad_u, r),
        eps,
        diffusion=lambda x: d_full,
        curl=_sghmc_curl,
        noise_var=jnp.concatenate([v, jnp.zeros(2)]),
    )
    expected_mean = np.concatenate([theta + eps * r, r - eps * grad_u - eps * c @ r])
    expected_cov = np.zeros((4, 4))
    expected_cov[2:, 2:] = eps * (2 * c - eps * np.diag(v))
    np.testing.assert_allclose(mean, expected_mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(cov, expected_cov, rtol=1e-5, atol=1e-6)


def test_sghmc_step_common_random_numbers():
    """With a diagonal C the SGHMC step is theta + eps r exactly, and
    r - eps grad U - eps C r + sqrt(eps (2C - eps V)) * xi_r, xi_r the unit draw of
    the r leaf (through the eigendecomposition path: D a vector, Q and V given)."""
    theta, r, grad_u, v = _sghmc_problem()
    c = jnp.array([1.0, 0.6], jnp.float32)
    eps, key = 0.2, random.key(8)
    (theta_new, r_new), info = recipe_step(
        key,
        (theta, r),
        (grad_u, r),
        eps,
        diffusion=lambda x: jnp.concatenate([jnp.zeros(2), c]),
        curl=_sghmc_curl,
        noise_var=jnp.concatenate([v, jnp.zeros(2)]),
    )
    _, xi_r = _unit_draws(key, (theta, r))
    np.testing.assert_allclose(theta_new, theta + eps * r, rtol=1e-6, atol=1e-6)
    expected = r - eps * grad_u - eps * c * r + jnp.sqrt(eps * (2 * c - eps * v)) * xi_r
    np.testing.assert_allclose(r_new, expected, rtol=1e-5, atol=1e-6)
    assert float(info.noise_clipped) == 0.0  # the zero block is not "clipped"


# --------------------------------------------------------------------------------------
# 3. Gamma by automatic differentiation against hand-computed values


def _curl_cubic(x):
    # Q_ij = x_i x_j^2 - x_j x_i^2 (skew-symmetric)
    return x[:, None] * x[None, :] ** 2 - x[None, :] * x[:, None] ** 2


def _gamma_curl_cubic(x):
    # sum_j d_j Q_ij = sum_{j != i} (2 x_i x_j - x_i^2); the j = i term is 0
    return 2 * x * (x.sum() - x) - (x.size - 1) * x**2


X_GAMMA = jnp.array([0.5, -1.0, 2.0], jnp.float32)
G_GAMMA = jnp.array([0.3, 1.1, -0.4], jnp.float32)


@pytest.mark.parametrize(
    "diffusion,curl,d_matrix,q_matrix,gamma",
    [
        # D = diag(1 + x^2): Gamma_i = 2 x_i
        (lambda x: 1 + x**2, None, lambda x: jnp.diag(1 + x**2), None, lambda x: 2 * x),
        # D = I + x x^T: Gamma_i = sum_j d_j (x_i x_j) = (m + 1) x_i
        (
            lambda x: jnp.eye(x.size) + jnp.outer(x, x),
            None,
            lambda x: jnp.eye(x.size) + jnp.outer(x, x),
            None,
            lambda x: (x.size + 1) * x,
        ),
        # constant D, position-dependent Q
        (_ones, _curl_cubic, lambda x: jnp.eye(x.size), _curl_cubic, _gamma_curl_cubic),
        # both
        (
            lambda x: 1 + x**2,
            _curl_cubic,
            lambda x: jnp.diag(1 + x**2),
            _curl_cubic,
            lambda x: 2 * x + _gamma_curl_cubic(x),
        ),
    ],
    ids=["diag-D", "full-D", "Q", "D-and-Q"],
)
def test_gamma_by_autodiff_matches_hand(diffusion, curl, d_matrix, q_matrix, gamma):
    """mean = x - eps (D + Q) g + eps Gamma, Gamma_i = sum_j d_j (D + Q)_ij computed
    by hand; with g = 0 the mean moves by eps Gamma alone. Also check_recipe accepts
    these D and Q."""
    x, g, eps = X_GAMMA, G_GAMMA, 0.3
    check_recipe(diffusion, curl, x)
    m = d_matrix(x) + (0.0 if q_matrix is None else q_matrix(x))
    mean, _ = recipe_moments(x, g, eps, diffusion=diffusion, curl=curl)
    np.testing.assert_allclose(
        mean, x - eps * m @ g + eps * gamma(x), rtol=1e-5, atol=1e-6
    )
    mean0, _ = recipe_moments(x, jnp.zeros(3), eps, diffusion=diffusion, curl=curl)
    np.testing.assert_allclose((mean0 - x) / eps, gamma(x), rtol=1e-5, atol=1e-5)


def test_constant_diffusion_has_no_gamma():
    """A constant full D and constant Q give Gamma = 0 through autodiff."""
    d = jnp.array([[2.0, 0.5], [0.5, 1.0]])
    q = jnp.array([[0.0, 1.0], [-1.0, 0.0]])
    x = jnp.array([0.4, -0.3])
    mean0, _ = recipe_moments(
        x, jnp.zeros(2), 0.5, diffusion=lambda y: d, curl=lambda y: q
    )
    np.testing.assert_array_equal(mean0, x)


# --------------------------------------------------------------------------------------
# 4. clipping of the injected noise


def test_noise_clipped_fraction_and_zero_noise():
    """Where eps V D^2 > 2D the injected variance is clipped to 0: the coordinate
    moves by its mean alone, and noise_clipped is the clipped fraction (diagonal
    path, and the eigendecomposition path through a zero curl)."""
    x = jnp.array([0.1, 0.2, 0.3, 0.4], jnp.float32)
    g = jnp.array([1.0, -1.0, 2.0, 0.5], jnp.float32)
    v = jnp.array([0.0, 1.0, 50.0, 100.0], jnp.float32)  # eps v > 2 on the last two
    eps = 0.1
    for curl in (None, lambda y: jnp.zeros((4, 4))):
        x_new, info = recipe_step(
            random.key(0), x, g, eps, diffusion=_ones, curl=curl, noise_var=v
        )
        np.testing.assert_allclose(info.noise_clipped, 0.5)
        np.testing.assert_allclose(x_new[2:], (x - eps * g)[2:], rtol=1e-6, atol=1e-6)
        _, cov = recipe_moments(x, g, eps, diffusion=_ones, curl=curl, noise_var=v)
        np.testing.assert_allclose(
            cov, np.diag([2 * eps, eps * (2 - eps), 0, 0]), rtol=1e-5, atol=1e-6
        )


# --------------------------------------------------------------------------------------
# 5. exact law: a constant full D on a Gaussian target is a linear-Gaussian chain

LYAP_SIGMA = np.array([[1.0, 0.6], [0.6, 2.0]])  # target covariance
LYAP_D = np.array([[1.0, 0.5], [0.5, 1.5]])
LYAP_Q = np.array([[0.0, 0.5], [-0.5, 0.0]])
LYAP_V = np.array([3.0, 1.5])  # gradient-noise variance (noisy case)
LYAP_EPS = 0.4
LYAP_CHAINS, LYAP_STEPS = 10_000, 60


@partial(jax.jit, static_argnames="noisy")
def _recipe_gaussian_final(key, *, noisy):
    """Final states of chains on N(0, LYAP_SIGMA) from (3, -3): exact gradients,
    D = LYAP_D, Q = 0 (noisy=False); or gradient + N(0, diag(V)) noise, Q = LYAP_Q,
    noise_var = V (noisy=True)."""
    prec = jnp.asarray(np.linalg.inv(LYAP_SIGMA), jnp.float32)
    d = jnp.asarray(LYAP_D, jnp.float32)
    q = jnp.asarray(LYAP_Q, jnp.float32)
    v = jnp.asarray(LYAP_V, jnp.float32)
    kwargs = dict(curl=lambda y: q, noise_var=v) if noisy else {}

    def chain(k):
        def body(x, kk):
            k_step, k_noise = random.split(kk)
            z_grad = prec @ x
            if noisy:
                z_grad = z_grad + jnp.sqrt(v) * random.normal(k_noise, (2,))
            x, _ = recipe_step(
                k_step, x, z_grad, LYAP_EPS, diffusion=lambda y: d, **kwargs
            )
            return x, None

        x, _ = lax.scan(body, jnp.array([3.0, -3.0]), random.split(k, LYAP_STEPS))
        return x

    return jax.vmap(chain)(random.split(key, LYAP_CHAINS))


def _cov_z_scores(x, p):
    """(S - P) / sd(S) entrywise for the sample covariance of Gaussian draws."""
    n = x.shape[0]
    s = np.cov(x.T)
    sd = np.sqrt((np.outer(np.diag(p), np.diag(p)) + p**2) / (n - 1))
    return (s - p) / sd


@pytest.mark.parametrize("noisy", [False, True], ids=["exact-grad", "noisy-grad"])
def test_full_diffusion_stationary_covariance_is_lyapunov(noisy):
    """x' = A x + w, A = I - eps (D + Q) Sigma^-1: the stationary covariance P solves
    P = A P A^T + W. With exact gradients W = 2 eps D; with gradient noise N(0, V) and
    noise_var = V the injected eps (2D - eps B) plus the gradient's eps^2 B is 2 eps D
    again (B = (D+Q) diag(V) (D+Q)^T), so P is the same equation's solution.

    m = 10000 chains, 60 steps from (3, -3) (|eig A| <= 0.70, 0.70^60 ~ 1e-9): the
    final states are exactly Gaussian, so each entry of the sample covariance has sd
    sqrt((P_ii P_jj + P_ij^2)/(m-1)). Accepted within 4 sd per entry (failure rate
    below 2e-4 for the three entries); the target Sigma (and, in the noisy case, the
    law without the B correction) must be rejected by more than 4 sd somewhere.
    """
    d = LYAP_D
    q = LYAP_Q if noisy else np.zeros((2, 2))
    a = np.eye(2) - LYAP_EPS * (d + q) @ np.linalg.inv(LYAP_SIGMA)
    assert np.max(np.abs(np.linalg.eigvals(a))) ** LYAP_STEPS < 1e-8
    p = solve_discrete_lyapunov(a, 2 * LYAP_EPS * d)
    b = (d + q) @ np.diag(LYAP_V) @ (d + q).T
    assert np.linalg.eigvalsh(2 * d - LYAP_EPS * b).min() > 0  # nothing clipped

    x = np.asarray(_recipe_gaussian_final(random.key(31), noisy=noisy), np.float64)
    z = _cov_z_scores(x, p)
    assert np.all(np.abs(z) < 4), (np.cov(x.T), p)
    assert np.max(np.abs(_cov_z_scores(x, LYAP_SIGMA))) > 4
    if noisy:
        p_uncorrected = solve_discrete_lyapunov(a, 2 * LYAP_EPS * d + LYAP_EPS**2 * b)
        assert np.max(np.abs(_cov_z_scores(x, p_uncorrected))) > 4


# --------------------------------------------------------------------------------------
# 6. SGRLD


def _metric_mixed(z):
    return {"phi": z["phi"], "w": 1.0 + z["w"] ** 2}


def _flat_metric_mixed(x):
    # the raveled _metric_mixed: leaves in key order, phi (3,) then w (2, 2)
    return jnp.concatenate([x[:3], 1.0 + x[3:] ** 2])


@partial(jax.jit, static_argnames="reflect")
def _sgrld_and_recipe(key, z, z_grad, eps, *, reflect):
    z_new = sgrld_step(
        key, z, z_grad, eps, inverse_metric=_metric_mixed, reflect=reflect
    )
    z_ref, info = recipe_step(key, z, z_grad, eps, diffusion=_flat_metric_mixed)
    return z_new, z_ref, info


@pytest.mark.parametrize("reflect", [False, True])
def test_sgrld_is_recipe_with_diagonal_diffusion(reflect):
    """sgrld_step == recipe_step(diffusion = raveled inverse metric), same key, on a
    two-leaf pytree with a position-dependent metric (Gamma = (1, 1, 1, 2w)), under
    jit; reflect=True is its absolute value."""
    z = {
        "phi": jnp.array([0.02, 1.0, 3.0], jnp.float32),
        "w": jnp.array([[0.5, -1.0], [2.0, 0.0]], jnp.float32),
    }
    z_grad = tree_like(z, lambda x: 1.0 - 0.5 * x)
    key, eps = random.key(12), 0.05
    z_new, z_ref, info = _sgrld_and_recipe(key, z, z_grad, eps, reflect=reflect)
    if reflect:
        z_ref = jax.tree.map(jnp.abs, z_ref)
        assert bool(jnp.all(z_new["phi"] >= 0))
    _assert_trees_close(z_new, z_ref, rtol=1e-6, atol=1e-6)
    assert float(info.noise_clipped) == 0.0


def test_expanded_mean_update_is_patterson_teh():
    """With D = phi and U = sum(phi - (a - 1) log phi) the update is
    |phi + eps (a - phi) + sqrt(2 eps phi) xi| (Gamma = 1)."""
    phi = jnp.array([0.05, 1.0, 4.0], jnp.float32)
    a = jnp.array([0.5, 3.0, 7.0], jnp.float32)
    key, eps = random.key(5), 0.02
    new = sgrld_step(
        key,
        phi,
        1.0 - (a - 1.0) / phi,
        eps,
        inverse_metric=expanded_mean_metric,
        reflect=True,
    )
    (xi,) = _unit_draws(key, phi)
    expected = jnp.abs(phi + eps * (a - phi) + jnp.sqrt(2 * eps * phi) * xi)
    np.testing.assert_allclose(new, expected, rtol=1e-5, atol=1e-6)


DIR_ALPHA = np.array([0.5, 1.0, 2.0])
DIR_COUNTS = np.array([0, 2, 5])
DIR_A = DIR_ALPHA + DIR_COUNTS  # (0.5, 3, 7): a_1 < 1, density infinite at 0
DIR_EPS = 0.01
DIR_CHAINS, DIR_STEPS = 4000, 1000


@jax.jit
def _sgrld_dirichlet_final(key, tau, drop_gamma):
    """theta = phi / sum(phi) at the end of expanded-mean SGRLD chains from phi = 1,
    gradient of U(phi) = sum(phi - (a - 1) log phi) plus N(0, tau^2) noise.

    With drop_gamma true the metric is the same D = phi hidden from autodiff
    (stop_gradient), so Gamma = 0: an injected bug, in the same compiled function.
    """
    a = jnp.asarray(DIR_A, jnp.float32)

    def metric(phi):
        return jnp.where(drop_gamma, lax.stop_gradient(phi), expanded_mean_metric(phi))

    def chain(k):
        def body(phi, kk):
            k_step, k_noise = random.split(kk)
            z_grad = 1.0 - (a - 1.0) / phi + tau * random.normal(k_noise, (3,))
            phi = sgrld_step(
                k_step, phi, z_grad, DIR_EPS, inverse_metric=metric, reflect=True
            )
            return phi, None

        phi, _ = lax.scan(body, jnp.ones(3), random.split(k, DIR_STEPS))
        return phi / phi.sum()

    return jax.vmap(chain)(random.split(key, DIR_CHAINS))


def _dirichlet_moments(a):
    a0 = a.sum()
    return a / a0, a * (a0 - a) / (a0**2 * (a0 + 1))


def _gamma_ratio_moments(shape, scale):
    """E theta_k and Var theta_k for theta = phi / sum(phi), phi_k independent
    Gamma(shape_k, scale_k), by quadrature: 1/S = int e^{-tS} dt and
    1/S^2 = int t e^{-tS} dt with the Gamma Laplace transforms."""
    s, c = np.asarray(shape, float), np.asarray(scale, float)
    mean, var = [], []
    for k in range(s.size):

        def others(t, k=k):
            return np.prod(np.delete((1 + c * t) ** (-s), k))

        sk, ck = s[k], c[k]
        e1 = integrate.quad(
            lambda t: sk * ck * (1 + ck * t) ** (-sk - 1) * others(t), 0, np.inf
        )[0]
        e2 = integrate.quad(
            lambda t: t * sk * (sk + 1) * ck**2 * (1 + ck * t) ** (-sk - 2) * others(t),
            0,
            np.inf,
        )[0]
        mean.append(e1)
        var.append(e2 - e1**2)
    return np.array(mean), np.array(var)


def _reflection_constant(a):
    """K(a) = int_0^inf u^(a-1) E[(u + a + sqrt(2u) eta)^-] du, eta ~ N(0, 1)."""

    def f(u):
        mu, s = u + a, np.sqrt(2 * u)
        if s == 0:
            return 0.0
        neg = s * stats.norm.pdf(mu / s) - mu * stats.norm.cdf(-mu / s)
        return u ** (a - 1) * neg

    return integrate.quad(f, 0, np.inf, limit=200)[0]


def _predicted_theta_moments(a, eps, tau):
    """Moments of theta under the discretised chain, to first order (see the test).

    Per coordinate, with Y the unreflected update, phi' = |Y| = Y + 2 Y^- gives the
    exact stationary identity E phi = a + (2/eps) E[Y^-]; near 0 the law of phi is
    close to Gamma(a), so (2/eps) E[Y^-] ~ 2 K(a) eps^a / Gamma(a) (O(sqrt(eps)) for
    a = 1/2). |Y|^2 = Y^2 gives the second moment exactly from the first:
    E phi^2 = (E phi (2 (1 - eps) a + 2) + eps a^2) / (2 - eps - eps tau^2).
    theta's moments follow by matching each phi to a Gamma with these two moments.
    """
    m1 = a + 2 * np.array([_reflection_constant(x) for x in a]) / special.gamma(a) * (
        eps**a
    )
    m2 = (m1 * (2 * (1 - eps) * a + 2) + eps * a**2) / (2 - eps - eps * tau**2)
    var = m2 - m1**2
    return _gamma_ratio_moments(m1**2 / var, var / m1)


def _dirichlet_check(theta, tau):
    """(ok, details): E theta and Var theta against Dirichlet(a), within 4 MCSE plus
    1.5 times the predicted discretisation bias."""
    n = theta.shape[0]
    exact_mean, exact_var = _dirichlet_moments(DIR_A)
    pred_mean, pred_var = _predicted_theta_moments(DIR_A, DIR_EPS, tau)
    mean, var = theta.mean(0), theta.var(0, ddof=1)
    se_mean = theta.std(0) / np.sqrt(n)
    se_var = ((theta - mean) ** 2).std(0) / np.sqrt(n)
    tol_mean = 4 * se_mean + 1.5 * np.abs(pred_mean - exact_mean)
    tol_var = 4 * se_var + 1.5 * np.abs(pred_var - exact_var)
    ok = np.all(np.abs(mean - exact_mean) < tol_mean) and np.all(
        np.abs(var - exact_var) < tol_var
    )
    details = dict(mean=mean, exact_mean=exact_mean, tol_mean=tol_mean, var=var)
    return ok, details | dict(exact_var=exact_var, tol_var=tol_var)


def test_gamma_ratio_quadrature_gives_dirichlet():
    """Guard for the prediction: equal scales give the Dirichlet moments."""
    for got, want in zip(
        _gamma_ratio_moments(DIR_A, np.ones(3)), _dirichlet_moments(DIR_A)
    ):
        np.testing.assert_allclose(got, want, rtol=1e-7)


@pytest.mark.parametrize("tau", [0.0, 1.0], ids=["exact-grad", "noisy-grad"])
def test_sgrld_samples_dirichlet_posterior(tau):
    """Expanded-mean SGRLD (reflect=True, eps = 0.01) samples Dirichlet(alpha + n)
    with alpha = (0.5, 1, 2), n = (0, 2, 5): a = (0.5, 3, 7).

    m = 4000 chains, 1000 steps (time 10: the CIR relaxes at rate 1, so the start
    phi = 1 is forgotten to e^-10). E theta_k and Var theta_k must match the
    Dirichlet moments within 4 MCSE (sd/sqrt(m) for the mean, sd of
    (theta - mean)^2 / sqrt(m) for the variance) plus 1.5 times the predicted bias
    of the discretised chain (_predicted_theta_moments; it matched simulations at
    eps = 0.01, 0.04 and 0.1 within their MCSE). The bias is not O(eps): the
    reflection at 0 shifts E phi_1 by ~0.44 sqrt(eps) for a_1 = 1/2 (E theta_1 by
    ~9% at eps = 0.01, 4 MCSE); Var theta_k moves by O(eps) relative (eps/2 from the
    discretisation, eps tau^2 (a + 1)/2 from unsubtracted gradient noise). Failure
    rate of a correct rule: about 4e-4 (six comparisons at 4 MCSE).
    """
    theta = np.asarray(_sgrld_dirichlet_final(random.key(41), tau, False), np.float64)
    assert np.all(np.isfinite(theta))
    ok, details = _dirichlet_check(theta, tau)
    assert ok, details


def test_sgrld_without_gamma_misses_dirichlet():
    """The same chain with Gamma dropped (D = phi hidden from autodiff by
    stop_gradient: the drift becomes eps (a - 1 - phi)) fails the check above."""
    theta = np.asarray(
        _sgrld_dirichlet_final(random.key(41), 0.0, True),
        np.float64,
    )
    ok, details = _dirichlet_check(theta, 0.0)
    assert not ok, details


# --------------------------------------------------------------------------------------
# 7. validation


def test_check_recipe_raises():
    x = jnp.zeros(3)
    good_q = lambda y: jnp.array([[0.0, 1, 0], [-1, 0, 2], [0, -2, 0]])  # noqa: E731
    check_recipe(_ones, good_q, x)
    check_recipe(lambda y: jnp.eye(3), None, {"a": jnp.zeros(2), "b": jnp.zeros(())})
    cases = [
        (lambda y: jnp.array([1.0, -0.1, 1.0]), None, "positive semi-definite"),
        (lambda y: jnp.diag(jnp.array([1.0, -0.1, 1.0])), None, "positive semi"),
        (lambda y: jnp.array([[1.0, 2, 0], [2, 1, 0], [0, 0, 1]]), None, "positive"),
        (lambda y: jnp.array([[1.0, 0.5, 0], [0, 1, 0], [0, 0, 1]]), None, "symmetric"),
        (lambda y: jnp.ones(4), None, r"diffusion\(x\) must return shape"),
        (lambda y: jnp.ones((3, 2)), None, r"diffusion\(x\) must return shape"),
        (_ones, lambda y: jnp.eye(3), "skew-symmetric"),
        (_ones, lambda y: jnp.zeros((2, 2)), r"curl\(x\) must return shape"),
    ]
    for diffusion, curl, match in cases:
        with pytest.raises(ValueError, match=match):
            check_recipe(diffusion, curl, x)


def test_step_shape_errors_raise_under_trace():
    """Shapes are static, so recipe_step names the argument even under jit."""
    x = jnp.zeros(3)
    bad = [
        dict(diffusion=lambda y: jnp.ones(2)),
        dict(diffusion=_ones, curl=lambda y: jnp.zeros((3, 2))),
        dict(diffusion=_ones, noise_var=jnp.ones(2)),
    ]
    for kwargs, match in zip(bad, ["diffusion", "curl", "noise_var"]):
        with pytest.raises(ValueError, match=match):
            jax.jit(partial(recipe_step, **kwargs))(random.key(0), x, x, 0.1)
    with pytest.raises(ValueError, match="z_grad"):
        recipe_step(random.key(0), {"a": x}, {"b": x}, 0.1, diffusion=_ones)
