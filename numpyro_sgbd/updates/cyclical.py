"""Cyclical SGLD (Zhang, Li, Zhang, Chen & Wilson, 2020): Langevin moves whose
step follows a cosine schedule restarted every cycle, large steps at a cycle's
start to leave a mode and small ones at its end to sample it, as ``init``/``step``
of a position family. Nothing here imports NumPyro.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from numpyro_sgbd.updates.langevin import langevin_step
from numpyro_sgbd.updates.shared import broadcast_tree, fraction

__all__ = [
    "CyclicalInfo",
    "CyclicalState",
    "cyclical_init",
    "cyclical_schedule",
    "cyclical_update",
]


class CyclicalState(NamedTuple):
    """State of :func:`cyclical_update`: **z**, the position, and **k**, the
    steps taken (the schedule's clock)."""

    z: Any
    k: Any


class CyclicalInfo(NamedTuple):
    """Statistics of one step: **noise_exceeded** as for SGLD, and
    **cycle_position**, where in its cycle the step was, in [0, 1)."""

    noise_exceeded: Any
    cycle_position: Any


def cyclical_init(z, rng_key=None):
    """The :class:`CyclicalState` at ``z``, at the start of a cycle (the key is
    unused: nothing is drawn).

    >>> import jax.numpy as jnp
    >>> int(cyclical_init(jnp.zeros(2)).k)
    0
    """
    del rng_key
    return CyclicalState(z, jnp.zeros((), jnp.int32))


def cyclical_schedule(k, cycle_length):
    r"""``(factor, position)`` of step ``k`` (from 0): its place in its cycle,
    :math:`r = (k \bmod L) / L`, and the factor of the step-size parameter,
    :math:`\alpha_k / \alpha_0 = (\cos(\pi r) + 1) / 2` (Zhang et al., 2020,
    eq. 1, with their :math:`\lceil K/M \rceil` the cycle length L).

    >>> f, r = cyclical_schedule(5, 10)
    >>> round(float(f), 6), float(r)
    (0.5, 0.5)
    """
    position = jnp.mod(k, cycle_length) / cycle_length
    return 0.5 * (jnp.cos(jnp.pi * position) + 1.0), position


def cyclical_update(
    rng_key,
    state,
    z_grad,
    step_size,
    *,
    variant,
    noise_sd=None,
    cycle_length,
    explore,
):
    r"""One step of cyclical SGLD (Zhang et al., 2020, Algorithm 1): the Langevin
    move of :func:`~numpyro_sgbd.updates.langevin.langevin_step` with step
    :math:`\sigma\sqrt{c_k}`, :math:`c_k` the schedule's factor
    (:func:`cyclical_schedule`): SGLD's :math:`\epsilon = \sigma^2/2` is the
    paper's :math:`\alpha`, which the schedule scales. In the first ``explore``
    fraction of each cycle (the paper's exploration stage, its :math:`\beta`)
    the move has no noise (SGLD's ``"extreme"`` variant: gradient descent with
    learning rate :math:`\alpha_k`); after it, ``variant``'s.

    :param rng_key: random key.
    :param CyclicalState state: position and clock.
    :param z_grad: the minibatch gradient of the potential at ``state.z``.
    :param step_size: :math:`\sigma` at a cycle's start, scalar or pytree
        matching z.
    :param str variant: ``"vanilla"``, ``"corrected"`` or ``"extreme"``.
    :param noise_sd: the gradient noise sd, for ``"corrected"``.
    :param cycle_length: L, steps per cycle (1: plain SGLD).
    :param float explore: the exploration fraction :math:`\beta` in [0, 1), a
        Python number (the step computes the descent only where it is > 0).
    :return: ``(CyclicalState, CyclicalInfo)``; with ``cycle_length=1`` and
        ``explore=0`` SGLD's draws for the same key (to float rounding).
    """
    factor, position = cyclical_schedule(state.k, cycle_length)
    steps = jax.tree.map(
        lambda sigma, x: sigma * jnp.sqrt(factor),
        broadcast_tree(step_size, state.z, "step_size"),
        state.z,
    )
    z, exceeded = langevin_step(
        rng_key, state.z, z_grad, steps, variant=variant, noise_sd=noise_sd
    )
    if explore > 0:  # a number, not traced: no exploration stage, no descent
        descent, _ = langevin_step(rng_key, state.z, z_grad, steps, variant="extreme")
        exploring = position < explore
        z = jax.tree.map(lambda a, b: jnp.where(exploring, a, b), descent, z)
    info = CyclicalInfo(fraction(exceeded), position)
    return CyclicalState(z, state.k + 1), info
