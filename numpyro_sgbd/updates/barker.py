"""Stochastic gradient Barker dynamics: the pure per-coordinate update.

Nothing here imports NumPyro: the functions act on pytrees of arrays so that a test
can feed them exact gradients with injected noise.
"""

import jax
from jax import random
import jax.numpy as jnp

from numpyro_sgbd.updates.shared import map_coordinates

__all__ = ["BARKER_TOLERANCE", "VARIANTS", "barker_step", "flip_probability"]

#: The constant of the logistic/normal CDF approximation F(x) ~ Phi(x / 1.702) behind
#: the corrected and extreme estimators (SGBD paper, Remark 3).
BARKER_TOLERANCE = 1.702

VARIANTS = ("vanilla", "corrected", "extreme")
INCREMENTS = ("bimodal", "gaussian")


def _sign_probability(wg):
    # 1(w g > 0), with a fair coin at the tie w g == 0: with the default positive
    # (bimodal-by-symmetry) increment a tie broken towards -w would be a drift.
    return jnp.where(wg > 0, 1.0, jnp.where(wg < 0, 0.0, 0.5)).astype(wg.dtype)


def flip_probability(w, force, *, variant="vanilla", noise_sd=None):
    r"""Probability of moving along ``+w`` in one Barker coordinate update.

    With :math:`\hat g = -\nabla \hat U` the (noisy) force and :math:`\hat\tau` the
    noise standard deviation,

    .. math::

        p_{\rm vanilla} = \mathrm{sigmoid}(w \hat g), \qquad
        p_{\rm extreme} = \mathbf 1(w \hat g > 0),

        p_{\rm corrected} = \begin{cases}
            \mathrm{sigmoid}(\alpha w \hat g), &
                \alpha = 1.702 / \sqrt{1.702^2 - \hat\tau^2 w^2}
                \quad\text{if } |w| < 1.702/\hat\tau, \\
            \mathbf 1(w \hat g > 0) & \text{otherwise.}
        \end{cases}

    The sigmoid is evaluated stably for any :math:`|w\hat g|`. At an exact tie
    :math:`w\hat g = 0` the sign rule returns 1/2.

    :param w: increments (any shape).
    :param force: the force :math:`\hat g = -\nabla\hat U`, broadcastable to ``w``.
    :param str variant: ``"vanilla"``, ``"corrected"`` or ``"extreme"``.
    :param noise_sd: :math:`\hat\tau`, required by ``"corrected"``.
    :return: ``(p, exceeded)``: the probability and a boolean array, true where
        :math:`|w| \ge 1.702/\hat\tau` (for every variant when ``noise_sd`` is
        given; all false without it).

    **References**

    1. Mauri & Zanella (2024), *Robust SGMCMC with Barker dynamics*: Algorithm 2
       (vanilla), eq. (8) and Algorithm 3 (corrected), Algorithm 4 (extreme).

    >>> import jax.numpy as jnp
    >>> p, _ = flip_probability(jnp.array(1.0), jnp.array(0.0))
    >>> float(p)
    0.5
    """
    wg = w * force
    if noise_sd is None:
        exceeded = jnp.zeros(jnp.shape(wg), bool)
    else:
        exceeded = jnp.abs(noise_sd * w) >= BARKER_TOLERANCE
    if variant == "vanilla":
        return jax.nn.sigmoid(wg), exceeded
    if variant == "extreme":
        return _sign_probability(wg), exceeded
    if variant != "corrected":
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}.")
    if noise_sd is None:
        raise ValueError("variant='corrected' needs noise_sd (the noise sd tau).")
    # Evaluate alpha only inside the tolerance, so neither branch is NaN or inf.
    t = jnp.where(exceeded, 0.0, noise_sd * w)
    alpha = BARKER_TOLERANCE / jnp.sqrt(BARKER_TOLERANCE**2 - t**2)
    p = jnp.where(exceeded, _sign_probability(wg), jax.nn.sigmoid(alpha * wg))
    return p, jnp.broadcast_to(exceeded, jnp.shape(wg))


def barker_step(
    rng_key,
    z,
    z_grad,
    step_size,
    *,
    variant="vanilla",
    noise_sd=None,
    increment="bimodal",
):
    r"""One stochastic gradient Barker update of every coordinate of ``z``.

    Per coordinate :math:`j` with step size :math:`\sigma_j`:

    .. math::

        w_j \sim \mu_{\sigma_j}, \quad
        b_j = \pm 1 \text{ with } P(b_j = 1) = p(w_j, \hat g_j), \quad
        z_j \leftarrow z_j + b_j w_j,

    where :math:`\hat g = -` ``z_grad`` and :math:`p` is :func:`flip_probability`.
    The increment law :math:`\mu_\sigma` is :math:`N(\sigma, (0.1\sigma)^2)` for
    ``increment="bimodal"``, which by the symmetry of the move is the same chain as the
    bimodal mixture :math:`\tfrac12 N(-\sigma, (0.1\sigma)^2) + \tfrac12 N(\sigma,
    (0.1\sigma)^2)` the paper recommends, or :math:`N(0, \sigma^2)` for
    ``increment="gaussian"``.

    :param jax.random.PRNGKey rng_key: random key.
    :param z: current position (pytree of arrays).
    :param z_grad: gradient of the (estimated) potential at ``z``, same pytree.
    :param step_size: :math:`\sigma`, a scalar or a pytree matching ``z`` whose leaves
        broadcast to the leaves of ``z``.
    :param str variant: ``"vanilla"``, ``"corrected"`` or ``"extreme"``.
    :param noise_sd: pytree of :math:`\hat\tau` (noise sd of ``z_grad`` per
        coordinate), required for ``"corrected"``.
    :param str increment: ``"bimodal"`` (default) or ``"gaussian"``.
    :return: ``(z_new, exceeded)`` where ``exceeded`` is a pytree of booleans, true
        where the increment is outside the tolerance :math:`|w| < 1.702/\hat\tau`
        (all false when ``noise_sd`` is not given).

    **References**

    1. Mauri & Zanella (2024), *Robust SGMCMC with Barker dynamics*: Algorithms 2-4,
       eq. (8); bimodal increment, Section 2.

    >>> import jax, jax.numpy as jnp
    >>> z = {"a": jnp.zeros(3)}
    >>> z_new, _ = barker_step(jax.random.key(0), z, {"a": jnp.ones(3)}, 0.1)
    >>> bool(jnp.all(jnp.abs(z_new["a"]) < 0.2))
    True
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}.")
    if increment not in INCREMENTS:
        raise ValueError(f"increment must be one of {INCREMENTS}, got {increment!r}.")

    def one(key, x, grad, sigma, tau):
        key_w, key_b = random.split(key)
        shape = jnp.shape(x)
        eps = random.normal(key_w, shape, jnp.result_type(x))
        if increment == "bimodal":
            w = sigma * (1.0 + 0.1 * eps)
        else:
            w = sigma * eps
        # z_grad is the potential's gradient; the force is its negative (flip once).
        p, exceeded = flip_probability(w, -grad, variant=variant, noise_sd=tau)
        b = jnp.where(random.uniform(key_b, shape, p.dtype) < p, 1.0, -1.0)
        return x + (b * w).astype(jnp.result_type(x)), jnp.broadcast_to(exceeded, shape)

    return map_coordinates(one, rng_key, z, z_grad, step_size, noise_sd)
