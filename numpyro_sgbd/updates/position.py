"""The position-only families: Barker (SGBD) and Langevin (SGLD) as ``init``/``step``.

:func:`~numpyro_sgbd.updates.barker.barker_step` and
:func:`~numpyro_sgbd.updates.langevin.langevin_step` move a position and return a
pytree of per-coordinate flags. Here they take the family form every sampler of
:mod:`numpyro_sgbd.updates` shares, ``init(z, rng_key) -> state`` and
``step(rng_key, state, z_grad, step_size, *, variant, noise_sd, ...) ->
(state, info)``, whose ``info.noise_exceeded`` is the fraction of flagged
coordinates. Nothing here imports NumPyro.
"""

from typing import Any, NamedTuple

from numpyro_sgbd.updates.barker import barker_step
from numpyro_sgbd.updates.langevin import langevin_step
from numpyro_sgbd.updates.shared import fraction

__all__ = [
    "PositionInfo",
    "PositionState",
    "barker_update",
    "langevin_update",
    "position_init",
]


class PositionState(NamedTuple):
    """State of a position-only family: **z**, the position (pytree of arrays)."""

    z: Any


class PositionInfo(NamedTuple):
    """Statistics of one position-only step: **noise_exceeded**, the fraction of
    coordinates flagged by the rule (outside the corrected variant's tolerance);
    0 when ``noise_sd`` is not given, NaN for an empty position."""

    noise_exceeded: Any


def position_init(z, rng_key=None):
    """The :class:`PositionState` at ``z`` (the key is unused: nothing is drawn).

    >>> import jax.numpy as jnp
    >>> position_init(jnp.zeros(2)).z.shape
    (2,)
    """
    del rng_key
    return PositionState(z)


def barker_update(
    rng_key, state, z_grad, step_size, *, variant, noise_sd=None, increment="bimodal"
):
    """:func:`~numpyro_sgbd.updates.barker.barker_step` on a :class:`PositionState`
    (SGBD paper, Algorithms 2-4): ``(PositionState, PositionInfo)``, the same
    draws for the same key."""
    z, exceeded = barker_step(
        rng_key,
        state.z,
        z_grad,
        step_size,
        variant=variant,
        noise_sd=noise_sd,
        increment=increment,
    )
    return PositionState(z), PositionInfo(fraction(exceeded))


def langevin_update(rng_key, state, z_grad, step_size, *, variant, noise_sd=None):
    """:func:`~numpyro_sgbd.updates.langevin.langevin_step` on a
    :class:`PositionState` (Welling & Teh, 2011, eq. 4; the corrected noise of the
    SGBD paper's supplement, Algorithm 6): ``(PositionState, PositionInfo)``, the
    same draws for the same key."""
    z, exceeded = langevin_step(
        rng_key, state.z, z_grad, step_size, variant=variant, noise_sd=noise_sd
    )
    return PositionState(z), PositionInfo(fraction(exceeded))
