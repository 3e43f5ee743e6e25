r"""The complete recipe for stochastic-gradient MCMC: one update for any D(z) and Q(z).

Ma, Chen & Fox (2015) write every continuous Markov process with invariant density
:math:`\propto e^{-H(z)}` as an SDE whose drift is fixed by a positive semi-definite
diffusion matrix :math:`D(z)` and a skew-symmetric curl matrix :math:`Q(z)`. This
module discretises it once, for any choice of the two: SGLD, SGHMC, SGRLD and
SGRHMC are all calls of :func:`recipe_step` with different ``diffusion`` and
``curl`` functions. Nothing here imports NumPyro.
"""

from typing import NamedTuple

import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.updates.shared import flat_unit_normals

__all__ = ["RecipeInfo", "check_recipe", "recipe_moments", "recipe_step"]


class RecipeInfo(NamedTuple):
    r"""Diagnostics of one :func:`recipe_step`.

    :ivar noise_clipped: fraction (a scalar in [0, 1]) of the eigenvalues of
        :math:`2D - \varepsilon\hat B` (of its diagonal entries when the matrix is
        diagonal) that were negative beyond rounding and were set to 0: where it is
        positive, the gradient noise alone carries more variance than the step
        should inject, and the chain is hotter than the recipe intends.
    """

    noise_clipped: jnp.ndarray


def _value_and_jacobian(fn, x):
    # jacfwd with the value as auxiliary output: fn is traced once.
    jac, value = jax.jacfwd(lambda y: (fn(y), fn(y)), has_aux=True)(x)
    return value, jac


def _row_divergence(jac):
    r""":math:`\Gamma_i = \sum_j \partial_j M_{ij}` from ``jac[i, j, k]`` =
    :math:`\partial_k M_{ij}` (for a diagonal given as a vector, ``jac[i, k]``)."""
    if jac.ndim == 2:
        return jnp.diagonal(jac)
    return jnp.einsum("ijj->i", jac)


def _flatten_inputs(z, z_grad, diffusion, curl, noise_var):
    x, unravel = ravel_pytree(z)
    if jax.tree.structure(z_grad) != jax.tree.structure(z):
        raise ValueError("z_grad must be a pytree with the structure of z.")
    g = ravel_pytree(z_grad)[0].astype(x.dtype)
    m = x.size
    d, d_jac = _value_and_jacobian(diffusion, x)
    if jnp.shape(d) not in ((m,), (m, m)):
        raise ValueError(
            f"diffusion(x) must return shape ({m},) (a diagonal D) or ({m}, {m}) for "
            f"the flat z of size {m}, got {jnp.shape(d)}."
        )
    q = q_jac = None
    if curl is not None:
        q, q_jac = _value_and_jacobian(curl, x)
        if jnp.shape(q) != (m, m):
            raise ValueError(
                f"curl(x) must return shape ({m}, {m}) for the flat z of size {m}, "
                f"got {jnp.shape(q)}."
            )
    if noise_var is not None and jnp.shape(noise_var) != (m,):
        raise ValueError(
            f"noise_var must be the flat variance of z_grad, shape ({m},), got "
            f"{jnp.shape(noise_var)}; put zeros on auxiliary coordinates such as "
            "the momentum."
        )
    return x, unravel, g, (d, d_jac), (q, q_jac)


def _recipe_parts(z, z_grad, step_size, diffusion, curl, noise_var):
    """Flat mean, and the noise covariance over the step size, ``2 D - eps B``:
    a vector when that matrix is diagonal, else a symmetric matrix."""
    x, unravel, g, (d, d_jac), (q, q_jac) = _flatten_inputs(
        z, z_grad, diffusion, curl, noise_var
    )
    diagonal_d = jnp.ndim(d) == 1
    force = d * g if diagonal_d else d @ g
    gamma = _row_divergence(d_jac)
    if q is not None:
        force = force + q @ g
        gamma = gamma + _row_divergence(q_jac)
    # Eq. (3): the drift is -(D + Q) grad H + Gamma; its Euler step is eq. (9) with
    # the sign of Gamma as in eq. (3) (eq. (9)'s "+ Gamma" inside the bracket is a
    # sign slip: Algorithm 1 adds + eps grad(G^{-1/2}), i.e. + eps Gamma).
    mean = x - step_size * force + step_size * gamma
    if diagonal_d and (q is None or noise_var is None):
        # Diagonal: 2D alone without V; with V and Q = 0, B = D diag(V) D = D^2 V.
        cov = 2.0 * d
        if noise_var is not None:
            cov = cov - step_size * d**2 * noise_var
    else:
        d_mat = jnp.diag(d) if diagonal_d else d
        cov = 2.0 * d_mat
        if noise_var is not None:
            a = d_mat if q is None else d_mat + q
            cov = cov - step_size * (a * noise_var) @ a.T
        cov = 0.5 * (cov + cov.T)
    return x.dtype, unravel, mean.astype(x.dtype), cov.astype(x.dtype)


def _clipped_square_root(cov):
    """Symmetric square root of the PSD part of ``cov`` and the clipped fraction."""
    lam, vecs = jnp.linalg.eigh(cov)
    # Negative eigenvalues within tol of 0 are rounding of a PSD matrix: clipped,
    # but not counted.
    tol = jnp.finfo(cov.dtype).eps * cov.shape[0] * jnp.max(jnp.abs(lam), initial=0)
    clipped = jnp.sum(lam < -tol) / max(lam.size, 1)
    root = (vecs * jnp.sqrt(jnp.maximum(lam, 0.0))) @ vecs.T
    return root, clipped


def recipe_moments(z, z_grad, step_size, *, diffusion, curl=None, noise_var=None):
    r"""Mean and covariance of one :func:`recipe_step` from ``z``, flat.

    With :math:`x` the raveled ``z``, :math:`g` the raveled ``z_grad``
    (:math:`\nabla\tilde H(x)`) and :math:`\varepsilon` the step size,

    .. math::

        \mu = x - \varepsilon\,[D(x) + Q(x)]\,g + \varepsilon\,\Gamma(x), \qquad
        \Sigma = \varepsilon\,\big(2D(x) - \varepsilon\hat B(x)\big)_+ ,

        \Gamma_i(x) = \sum_j \partial_j \big(D_{ij}(x) + Q_{ij}(x)\big), \qquad
        \hat B = (D + Q)\,\mathrm{diag}(V)\,(D + Q)^\top,

    where :math:`(\cdot)_+` sets negative eigenvalues to 0 and :math:`\hat B = 0`
    without ``noise_var``. :math:`\Gamma` comes from automatic differentiation
    (``jax.jacfwd``), so it is 0 when neither :math:`D` nor :math:`Q` depends on
    :math:`x`. Under ``jit`` a diagonal :math:`D` whose entries each depend on one
    coordinate costs :math:`O(m)`; a matrix-valued :math:`D` or :math:`Q` costs an
    :math:`m \times m \times m` Jacobian and an :math:`m \times m`
    eigendecomposition per step, so keep those for small :math:`m`.

    :param z: current position (pytree of arrays), raveled with
        :func:`jax.flatten_util.ravel_pytree` to :math:`x` of size :math:`m`.
    :param z_grad: :math:`\nabla\tilde H(z)`, the (estimated) gradient of the
        Hamiltonian (the potential, plus e.g. the kinetic energy), same pytree.
    :param float step_size: :math:`\varepsilon`, a scalar.
    :param diffusion: function of the flat :math:`x` returning :math:`D(x)`, either
        a vector of shape ``(m,)`` (a diagonal :math:`D`) or a PSD ``(m, m)`` matrix.
    :param curl: function of the flat :math:`x` returning a skew-symmetric
        ``(m, m)`` :math:`Q(x)`, or ``None`` for :math:`Q = 0`.
    :param noise_var: flat ``(m,)`` variance :math:`V` of the noise in ``z_grad``
        per coordinate (zeros on auxiliary coordinates such as momentum), or
        ``None`` for :math:`\hat B = 0`.
    :return: ``(mean, cov)``, flat arrays of shapes ``(m,)`` and ``(m, m)``.

    **References**

    1. Ma, Chen & Fox (2015), *A complete recipe for stochastic gradient MCMC*:
       eq. (3) (drift and :math:`\Gamma`), eq. (9) (the update).

    >>> import jax.numpy as jnp
    >>> z, r = jnp.array([1.0]), jnp.array([2.0])
    >>> mean, cov = recipe_moments(
    ...     (z, r), (jnp.array([0.5]), r), 0.1,
    ...     diffusion=lambda x: jnp.array([0.0, 1.0]),
    ...     curl=lambda x: jnp.array([[0.0, -1.0], [1.0, 0.0]]))
    >>> bool(jnp.allclose(mean, jnp.array([1.2, 1.75])))  # SGHMC, eq. (12)
    True
    >>> bool(jnp.allclose(cov, jnp.array([[0.0, 0.0], [0.0, 0.2]])))
    True
    """
    _, _, mean, cov = _recipe_parts(z, z_grad, step_size, diffusion, curl, noise_var)
    if cov.ndim == 1:
        return mean, jnp.diag(step_size * jnp.maximum(cov, 0.0))
    root, _ = _clipped_square_root(cov)
    return mean, step_size * root @ root.T


def recipe_step(rng_key, z, z_grad, step_size, *, diffusion, curl=None, noise_var=None):
    r"""One step of the complete recipe for stochastic-gradient MCMC.

    .. math::

        x \leftarrow x - \varepsilon\,\big[(D(x) + Q(x))\,\nabla\tilde H(x)
            - \Gamma(x)\big] + \sqrt{\varepsilon}\,
            \big(2D(x) - \varepsilon\hat B(x)\big)_+^{1/2}\,\eta,
        \qquad \eta \sim N(0, I),

    with :math:`\Gamma`, :math:`\hat B` and :math:`(\cdot)_+` as in
    :func:`recipe_moments`. Sign convention: the drift of the paper's eq. (3) is
    :math:`-(D+Q)\nabla H + \Gamma`, and the Euler step :math:`x + \varepsilon f(x)`
    adds :math:`\varepsilon\Gamma`; eqs. (6) and (9) print
    :math:`-\varepsilon[(D+Q)\nabla H + \Gamma]`, a sign slip that Algorithm 1
    (:math:`+\varepsilon\nabla_\theta G^{-1/2}`) and the SGRLD of Patterson & Teh
    do not make. Only a position-dependent :math:`D` or :math:`Q` is affected.

    Special cases (section 3.1): SGLD, eq. (13), is ``diffusion=lambda x:
    jnp.ones_like(x)`` (or any constant :math:`D`); SGHMC, eq. (12), is
    :math:`x = (\theta, r)`, ``z_grad`` :math:`= (\nabla\tilde U, r)`,
    :math:`D = \mathrm{diag}(0, C)`, :math:`Q = ((0, -I), (I, 0))`, ``noise_var``
    :math:`= (V, 0)`; SGRLD, eq. (14), is a position-dependent :math:`D = G^{-1}`
    (see :func:`~numpyro_sgbd.updates.sgrld.sgrld_step`).

    The noise is exact and elementwise, :math:`\sqrt{\varepsilon\,c}\odot\eta`, when
    :math:`2D - \varepsilon\hat B = \mathrm{diag}(c)` is diagonal (``diffusion``
    returns a vector and ``curl`` or ``noise_var`` is ``None``); otherwise the
    symmetric square root comes from an eigendecomposition. The unit draws
    :math:`\eta` are those of :func:`~numpyro_sgbd.updates.langevin_step` (one key
    per leaf of ``z`` from ``random.split(rng_key, num_leaves)``, a standard normal
    of the leaf's shape and dtype, then raveled), so with the same key
    ``recipe_step(key, z, g, sigma**2 / 2, diffusion=lambda x: jnp.ones_like(x))``
    is ``langevin_step(key, z, g, sigma, variant="vanilla")[0]`` draw for draw.

    Validate ``diffusion`` and ``curl`` once with :func:`check_recipe` before
    compiling: under ``jit`` only their shapes can be checked.

    :param jax.random.PRNGKey rng_key: random key.
    :param z: current position (pytree of arrays).
    :param z_grad: :math:`\nabla\tilde H(z)`, same pytree.
    :param float step_size: :math:`\varepsilon`, a scalar (traced, so it can be
        vmapped over).
    :param diffusion: function of the flat ``z`` returning :math:`D`: shape ``(m,)``
        (diagonal) or ``(m, m)`` (PSD).
    :param curl: function of the flat ``z`` returning a skew-symmetric ``(m, m)``
        :math:`Q`, or ``None`` for :math:`Q = 0`.
    :param noise_var: flat ``(m,)`` variance of the noise in ``z_grad``, or ``None``.
    :return: ``(z_new, info)``: ``z_new`` with the structure and dtypes of ``z``, and
        a :class:`RecipeInfo`.

    **References**

    1. Ma, Chen & Fox (2015), *A complete recipe for stochastic gradient MCMC*:
       eqs. (3) and (9), section 3.1 (eqs. (12)-(14)), Algorithm 1.
    2. Welling & Teh (2011), *Bayesian learning via stochastic gradient Langevin
       dynamics*.

    >>> import jax, jax.numpy as jnp
    >>> from numpyro_sgbd.updates import langevin_step
    >>> key, z, g = jax.random.key(0), {"a": jnp.ones(3)}, {"a": jnp.ones(3)}
    >>> z_new, info = recipe_step(key, z, g, 0.5**2 / 2,
    ...                           diffusion=lambda x: jnp.ones_like(x))
    >>> z_sgld, _ = langevin_step(key, z, g, 0.5)
    >>> bool(jnp.allclose(z_new["a"], z_sgld["a"])), float(info.noise_clipped)
    (True, 0.0)
    """
    dtype, unravel, mean, cov = _recipe_parts(
        z, z_grad, step_size, diffusion, curl, noise_var
    )
    eta = flat_unit_normals(rng_key, z).astype(dtype)
    if cov.ndim == 1:
        clipped = jnp.sum(cov < 0) / max(cov.size, 1)
        noise = jnp.sqrt(step_size * jnp.maximum(cov, 0.0)) * eta
    else:
        root, clipped = _clipped_square_root(cov)
        noise = jnp.sqrt(step_size) * (root @ eta)
    x_new = (mean + noise).astype(dtype)
    return unravel(x_new), RecipeInfo(noise_clipped=clipped.astype(dtype))


def check_recipe(diffusion, curl, x):
    r"""Check ``diffusion`` and ``curl`` at a point, eagerly, before compiling.

    :param diffusion: the ``diffusion`` of :func:`recipe_step`.
    :param curl: the ``curl`` of :func:`recipe_step`, or ``None``.
    :param x: a position, flat or a pytree (it is raveled).
    :raises ValueError: when :math:`D(x)` has neither shape ``(m,)`` nor ``(m, m)``,
        is a non-symmetric matrix, or is not positive semi-definite (a negative
        diagonal entry, or an eigenvalue below :math:`-10^{-6}` times the largest
        absolute entry); when :math:`Q(x)` is not ``(m, m)`` or not skew-symmetric
        (:math:`|Q + Q^\top|` above :math:`10^{-6}` times its largest entry).

    >>> import jax.numpy as jnp
    >>> check_recipe(lambda x: jnp.ones_like(x), None, jnp.zeros(3))
    >>> try:
    ...     check_recipe(lambda x: -jnp.ones_like(x), None, jnp.zeros(3))
    ... except ValueError as e:
    ...     "positive semi-definite" in str(e)
    True
    """
    x = np.asarray(ravel_pytree(x)[0])
    m = x.size
    d = np.asarray(diffusion(jnp.asarray(x)), np.float64)
    if d.shape not in ((m,), (m, m)):
        raise ValueError(
            f"diffusion(x) must return shape ({m},) (the diagonal of D) or "
            f"({m}, {m}) for the flat z of size {m}, got {d.shape}: return one "
            "entry per coordinate of the raveled z."
        )
    if not np.all(np.isfinite(d)):
        raise ValueError("diffusion(x) returned non-finite values at x.")
    scale = max(float(np.max(np.abs(d), initial=0.0)), np.finfo(np.float32).tiny)
    if d.ndim == 1:
        if np.any(d < 0):
            raise ValueError(
                "diffusion(x) must be positive semi-definite, but the diagonal D has "
                f"negative entries at indices {np.flatnonzero(d < 0).tolist()}: use "
                "non-negative entries (e.g. exp or softplus of a free parameter)."
            )
    else:
        if np.max(np.abs(d - d.T)) > 1e-6 * scale:
            raise ValueError(
                "diffusion(x) must be a symmetric matrix, but D differs from D.T by "
                f"{np.max(np.abs(d - d.T)):.3g}: return (A + A.T) / 2, or move the "
                "antisymmetric part into curl."
            )
        lam_min = float(np.linalg.eigvalsh(0.5 * (d + d.T)).min())
        if lam_min < -1e-6 * scale:
            raise ValueError(
                "diffusion(x) must be positive semi-definite, but D has the "
                f"eigenvalue {lam_min:.3g}: return e.g. A @ A.T for a square A."
            )
    if curl is None:
        return
    q = np.asarray(curl(jnp.asarray(x)), np.float64)
    if q.shape != (m, m):
        raise ValueError(
            f"curl(x) must return shape ({m}, {m}) for the flat z of size {m}, "
            f"got {q.shape}; use curl=None for Q = 0."
        )
    if not np.all(np.isfinite(q)):
        raise ValueError("curl(x) returned non-finite values at x.")
    q_scale = max(float(np.max(np.abs(q), initial=0.0)), np.finfo(np.float32).tiny)
    asym = float(np.max(np.abs(q + q.T), initial=0.0))
    if asym > 1e-6 * q_scale:
        raise ValueError(
            f"curl(x) must be skew-symmetric, but Q + Q.T is {asym:.3g} away from 0: "
            "return (A - A.T) / 2, or move the symmetric part into diffusion."
        )
