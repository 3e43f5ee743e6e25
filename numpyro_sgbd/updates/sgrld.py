r"""Stochastic gradient Riemannian Langevin dynamics with a diagonal metric.

The complete recipe's eq. (14) with :math:`D(z) = G(z)^{-1}` diagonal and
:math:`Q = 0`, written leafwise over pytrees; the expanded-mean parametrisation of
Patterson & Teh (2013) samples a Dirichlet on the simplex with it. Nothing here
imports NumPyro.
"""

import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp

from numpyro_sgbd.updates.shared import flat_unit_normals

__all__ = ["expanded_mean_metric", "sgrld_step"]


def sgrld_step(rng_key, z, z_grad, step_size, *, inverse_metric, reflect=False):
    r"""One stochastic gradient Riemannian Langevin update with a diagonal metric.

    With :math:`D(z) = G(z)^{-1}` the diagonal inverse metric, per coordinate,

    .. math::

        z_i \leftarrow z_i - \varepsilon\big[D_i(z)\,\partial_i\tilde U(z)
            - \Gamma_i(z)\big] + \sqrt{2\varepsilon D_i(z)}\;\eta_i,
        \qquad \Gamma_i(z) = \frac{\partial D_i(z)}{\partial z_i},
        \quad \eta \sim N(0, I),

    and with ``reflect=True`` the result is mirrored at 0, :math:`z \leftarrow |z|`,
    as Patterson & Teh do to keep the expanded mean :math:`\phi` positive.
    :math:`\Gamma` is the diagonal of the Jacobian of the raveled
    ``inverse_metric`` (``jax.jacfwd``); under ``jit`` XLA reduces it to
    :math:`O(m)` work when each :math:`D_i` depends on :math:`z_i` alone (checked at
    :math:`m = 10^5`), and it costs :math:`m` forward passes otherwise. The sign of
    :math:`\Gamma`
    is that of the recipe's drift, eq. (3) (see
    :func:`~numpyro_sgbd.updates.recipe.recipe_step`).

    Without reflection this is :func:`~numpyro_sgbd.updates.recipe.recipe_step` with
    ``diffusion`` the raveled ``inverse_metric``, ``curl=None`` and
    ``noise_var=None``, draw for draw: the unit draws :math:`\eta` are those of
    :func:`~numpyro_sgbd.updates.langevin_step` (one key per leaf of ``z`` from
    ``random.split(rng_key, num_leaves)``, a standard normal of the leaf's shape and
    dtype).

    Step-size convention: Patterson & Teh write the step as
    :math:`\frac{\epsilon}{2}\mu(z) + G^{-1/2}\xi`, :math:`\xi \sim N(0, \epsilon I)`;
    their :math:`\epsilon` is :math:`2\varepsilon` here (the recipe's convention, as
    for BlackJAX's SGLD step size against the SGBD paper's :math:`\sigma^2`). For a
    diagonal metric their drift :math:`\mu_i = D_i\partial_i\log\pi + \partial_i D_i`
    (since :math:`\partial G_{ii} = -D_i^{-2}\partial D_i`) is the recipe's
    :math:`-D_i\partial_i U + \Gamma_i`.

    :param jax.random.PRNGKey rng_key: random key.
    :param z: current position (pytree of arrays).
    :param z_grad: gradient of the (estimated) potential :math:`\tilde U` at ``z``,
        same pytree.
    :param float step_size: :math:`\varepsilon`, a scalar.
    :param inverse_metric: function mapping a pytree like ``z`` to a pytree of the
        same structure holding the positive diagonal :math:`D(z) = G(z)^{-1}`, e.g.
        :func:`expanded_mean_metric`.
    :param bool reflect: return :math:`|z|` (for a positive parameter), default
        ``False``.
    :return: ``z_new``, with the structure and dtypes of ``z``.

    **References**

    1. Patterson & Teh (2013), *Stochastic gradient Riemannian Langevin dynamics on
       the probability simplex*, NIPS 26: the SGRLD update and the expanded-mean
       parametrisation with its mirrored update.
    2. Ma, Chen & Fox (2015), *A complete recipe for stochastic gradient MCMC*:
       eq. (14) and reference [12]; eq. (3) for :math:`\Gamma`.

    >>> import jax, jax.numpy as jnp
    >>> from numpyro_sgbd.updates.recipe import recipe_step
    >>> phi, a = jnp.array([0.2, 3.0, 7.0]), jnp.array([0.5, 3.0, 7.0])
    >>> grad = 1.0 - (a - 1.0) / phi  # U = sum(phi - (a - 1) log phi)
    >>> key = jax.random.key(0)
    >>> new = sgrld_step(key, phi, grad, 0.01, inverse_metric=expanded_mean_metric)
    >>> ref, _ = recipe_step(key, phi, grad, 0.01, diffusion=expanded_mean_metric)
    >>> bool(jnp.allclose(new, ref))
    True
    """
    x, unravel = ravel_pytree(z)
    if jax.tree.structure(z_grad) != jax.tree.structure(z):
        raise ValueError("z_grad must be a pytree with the structure of z.")
    g = ravel_pytree(z_grad)[0].astype(x.dtype)

    def flat_inverse_metric(y):
        d = inverse_metric(unravel(y))
        if jax.tree.structure(d) != jax.tree.structure(z):
            raise ValueError(
                "inverse_metric(z) must return a pytree with the structure of z "
                "(the diagonal of G(z)^-1, one entry per coordinate)."
            )
        return ravel_pytree(d)[0].astype(y.dtype)

    jac, d = jax.jacfwd(
        lambda y: (flat_inverse_metric(y), flat_inverse_metric(y)), has_aux=True
    )(x)
    gamma = jnp.diagonal(jac)
    eta = flat_unit_normals(rng_key, z).astype(x.dtype)
    x_new = (
        x
        - step_size * (d * g - gamma)
        + jnp.sqrt(step_size * jnp.maximum(2.0 * d, 0.0)) * eta
    )
    if reflect:
        x_new = jnp.abs(x_new)
    return unravel(x_new.astype(x.dtype))


def expanded_mean_metric(phi):
    r"""The inverse metric of the expanded-mean parametrisation: :math:`D = \phi`.

    A point :math:`\theta` of the simplex is written :math:`\theta = \phi/\sum_k
    \phi_k` with independent :math:`\phi_k \sim \mathrm{Gamma}(\alpha_k, 1)`, so
    that :math:`\theta \sim \mathrm{Dirichlet}(\alpha)`. Patterson & Teh take the
    metric :math:`G(\phi) = \mathrm{diag}(\phi)^{-1}`, whence :math:`D = \phi` and
    :math:`\Gamma = 1`.

    With counts :math:`n_k` and the potential of independent
    :math:`\mathrm{Gamma}(a_k, 1)` laws, :math:`a = \alpha + n`,

    .. math::

        U(\phi) = \sum_k \big[\phi_k - (a_k - 1)\log\phi_k\big], \qquad
        \partial_k U = 1 - \frac{a_k - 1}{\phi_k},

    :func:`sgrld_step` with ``reflect=True`` is

    .. math::

        \phi_k \leftarrow \big|\phi_k + \varepsilon(a_k - \phi_k)
            + \sqrt{2\varepsilon\phi_k}\,\eta_k\big|,

    Patterson & Teh's expanded-mean update with their step :math:`2\varepsilon`;
    the drift is an Euler step of the Cox-Ingersoll-Ross diffusion with stationary
    law :math:`\mathrm{Gamma}(a_k, 1)`, so :math:`\phi/\sum\phi \sim
    \mathrm{Dirichlet}(\alpha + n)` as :math:`\varepsilon \to 0`. Their multinomial
    likelihood in :math:`\theta = \phi/\sum\phi` gives the drift
    :math:`\alpha_k + n_k - \theta_k\sum_j n_j - \phi_k` instead: a different law of
    :math:`\sum\phi`, the same law of :math:`\theta`.

    :param phi: the expanded mean (a pytree of positive arrays).
    :return: ``phi`` itself, the diagonal of :math:`G(\phi)^{-1}`.

    **References**

    1. Patterson & Teh (2013), *Stochastic gradient Riemannian Langevin dynamics on
       the probability simplex*, NIPS 26: the expanded-mean parametrisation.

    >>> import jax.numpy as jnp
    >>> phi = jnp.array([0.5, 2.0])
    >>> bool(jnp.all(expanded_mean_metric(phi) == phi))
    True
    """
    return phi
