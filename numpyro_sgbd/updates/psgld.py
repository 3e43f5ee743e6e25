"""Preconditioned SGLD (Li, Chen, Carlson & Carin, 2016): Langevin moves scaled
per coordinate by an RMSprop estimate of the gradient's size, as
``init``/``step`` of a position family. Nothing here imports NumPyro.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from numpyro_sgbd.updates.langevin import langevin_step
from numpyro_sgbd.updates.position import PositionInfo
from numpyro_sgbd.updates.shared import broadcast_tree, fraction

__all__ = ["PSGLDState", "psgld_init", "psgld_update", "rms_preconditioner"]


class PSGLDState(NamedTuple):
    """State of :func:`psgld_update`: **z**, the position; **v**, the moving
    average of the squared gradient (z's structure); **t**, the number of
    gradients averaged."""

    z: Any
    v: Any
    t: Any


def psgld_init(z, rng_key=None):
    """The :class:`PSGLDState` at ``z``, no gradient averaged yet (the key is
    unused: nothing is drawn).

    >>> import jax.numpy as jnp
    >>> psgld_init(jnp.ones(2)).v
    Array([0., 0.], dtype=float32)
    """
    del rng_key
    v = jax.tree.map(jnp.zeros_like, z)
    return PSGLDState(z, v, jnp.zeros((), jnp.int32))


def rms_preconditioner(v, t, decay, eps):
    r"""The diagonal :math:`G = 1 / (\lambda + \sqrt{\hat V})` of pSGLD (Li et al.,
    2016, eq. 5, Algorithm 1), :math:`\hat V = V / (1 - \alpha^t)` the moving
    average ``v`` of ``t`` squared gradients corrected for its start at 0 (as
    Adam corrects its moments): the paper's average starts at 0 uncorrected,
    so that its first steps are scaled by :math:`1/\sqrt{1-\alpha}` times the
    gradient's size, 10 to 30 times too far at the usual 0.99 to 0.999.

    >>> import jax.numpy as jnp
    >>> float(rms_preconditioner(jnp.array(0.0004), 1, 0.99, 0.0))
    5.0
    """
    return 1.0 / (eps + jnp.sqrt(v / (1.0 - decay**t)))


def psgld_update(
    rng_key, state, z_grad, step_size, *, variant, noise_sd=None, decay, eps
):
    r"""One pSGLD move (Li, Chen, Carlson & Carin, 2016, Algorithm 1): the moving
    average :math:`V \leftarrow \alpha V + (1 - \alpha)\,\hat g \odot \hat g` of the
    minibatch gradient :math:`\hat g = \nabla\hat U`, then per coordinate the
    Langevin move of :func:`~numpyro_sgbd.updates.langevin.langevin_step` with
    step :math:`\sigma\sqrt{G}`,

    .. math::

        z \leftarrow z - \frac{\sigma^2}{2} G \nabla\hat U(z) + \sqrt{G}\,\varepsilon,
        \qquad G = \frac{1}{\lambda + \sqrt{\hat V}},

    (:func:`rms_preconditioner`), so that the variants of SGLD (vanilla,
    corrected, extreme) carry over coordinate by coordinate. The paper's
    correction term :math:`\Gamma` (the divergence of G) is dropped, as the
    paper does: G changes slowly for :math:`\alpha` near 1.

    :param rng_key: random key.
    :param PSGLDState state: position and moving average.
    :param z_grad: the minibatch gradient of the potential at ``state.z``.
    :param step_size: :math:`\sigma`, scalar or pytree matching z.
    :param str variant: ``"vanilla"``, ``"corrected"`` or ``"extreme"``.
    :param noise_sd: the gradient noise sd, for ``"corrected"``.
    :param float decay: :math:`\alpha` in [0, 1).
    :param float eps: :math:`\lambda > 0`.
    :return: ``(PSGLDState, PositionInfo)``.

    >>> import jax, jax.numpy as jnp
    >>> state = psgld_init(jnp.zeros(2))
    >>> new, _ = psgld_update(jax.random.key(0), state, jnp.array([1.0, 4.0]), 0.1,
    ...                       variant="extreme", decay=0.99, eps=0.0)
    >>> new.z  # G = 1 / |g| at first: each coordinate moves sigma^2 / 2 downhill
    Array([-0.005, -0.005], dtype=float32)
    """
    t = state.t + 1
    v = jax.tree.map(lambda old, g: decay * old + (1.0 - decay) * g**2, state.v, z_grad)
    steps = jax.tree.map(
        lambda sigma, x: sigma * jnp.sqrt(rms_preconditioner(x, t, decay, eps)),
        broadcast_tree(step_size, v, "step_size"),
        v,
    )
    z, exceeded = langevin_step(
        rng_key, state.z, z_grad, steps, variant=variant, noise_sd=noise_sd
    )
    return PSGLDState(z, v, t), PositionInfo(fraction(exceeded))
