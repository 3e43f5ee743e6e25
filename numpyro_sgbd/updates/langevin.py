"""Stochastic gradient Langevin dynamics: the pure update."""

from jax import random
import jax.numpy as jnp

from numpyro_sgbd.updates.barker import VARIANTS
from numpyro_sgbd.updates.shared import map_coordinates

__all__ = ["langevin_step"]


def langevin_step(rng_key, z, z_grad, step_size, *, variant="vanilla", noise_sd=None):
    r"""One stochastic gradient Langevin update of ``z``.

    In the SGBD paper's parameterisation, per coordinate with step size :math:`\sigma`,

    .. math::

        z \leftarrow z - \frac{\sigma^2}{2} \nabla \hat U(z) + \varepsilon,
        \qquad \varepsilon \sim \begin{cases}
            N(0, \sigma^2) & \text{vanilla} \\
            N\!\left(0, \max(0, \sigma^2 - \hat\tau^2 \sigma^4 / 4)\right)
                & \text{corrected} \\
            0 & \text{extreme (stochastic gradient descent on } \hat U).
        \end{cases}

    The corrected variant removes from the injected noise the variance that the
    gradient noise already contributes, :math:`(\sigma^2/2)^2 \hat\tau^2`. BlackJAX's
    ``sgld`` writes the same update as :math:`z + \epsilon \nabla \log \pi +
    \sqrt{2\epsilon}\,\xi`, so its step size is :math:`\epsilon = \sigma^2 / 2`.

    :param jax.random.PRNGKey rng_key: random key.
    :param z: current position (pytree of arrays).
    :param z_grad: gradient of the (estimated) potential at ``z``, same pytree.
    :param step_size: :math:`\sigma`, scalar or pytree matching ``z``.
    :param str variant: ``"vanilla"``, ``"corrected"`` or ``"extreme"``.
    :param noise_sd: pytree of :math:`\hat\tau`, required for ``"corrected"``.
    :return: ``(z_new, exceeded)``; ``exceeded`` is true where the gradient noise alone
        carries at least the variance the step should inject
        (:math:`\hat\tau\sigma \ge 2`; the corrected variant then injects none), for
        every variant when ``noise_sd`` is given, all false without it.

    **References**

    1. Welling & Teh (2011), *Bayesian learning via stochastic gradient Langevin
       dynamics*.
    2. Mauri & Zanella (2024), *Robust SGMCMC with Barker dynamics*: supplement,
       Algorithms 5 (vanilla/corrected SGLD) and 6 (extreme SGLD).

    >>> import jax, jax.numpy as jnp
    >>> z_new, _ = langevin_step(jax.random.key(0), jnp.zeros(2), jnp.ones(2), 0.2,
    ...                          variant="extreme")
    >>> bool(jnp.allclose(z_new, -0.02))
    True
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}.")
    if variant == "corrected" and noise_sd is None:
        raise ValueError("variant='corrected' needs noise_sd (the noise sd tau).")

    def one(key, x, grad, sigma, tau):
        shape = jnp.shape(x)
        drift = -0.5 * sigma**2 * grad
        if tau is None:
            exceeded = jnp.zeros(shape, bool)
        else:
            # Gradient noise alone carries (sigma^2/2)^2 tau^2 >= sigma^2 of variance.
            exceeded = jnp.broadcast_to(tau * sigma >= 2.0, shape)
        if variant == "vanilla":
            var = jnp.broadcast_to(sigma**2, shape)
        elif variant == "corrected":
            var = jnp.maximum(sigma**2 - 0.25 * tau**2 * sigma**4, 0.0)
        else:
            var = jnp.zeros(shape)
        noise = jnp.sqrt(var) * random.normal(key, shape, jnp.result_type(x))
        return (x + drift + noise).astype(jnp.result_type(x)), exceeded

    return map_coordinates(one, rng_key, z, z_grad, step_size, noise_sd)
