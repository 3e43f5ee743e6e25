"""BAOAB, the splitting integrator of underdamped Langevin dynamics: the pure step.

Leimkuhler & Matthews split the dynamics into a kick B (the force), a drift A
(the velocity) and the exact Ornstein-Uhlenbeck flow O of the friction and
noise, and order them B-A-O-A-B; for a Gaussian target with exact forces the
position's stationary law is then exact at any stable step. With minibatch
forces the scheme is still one force a step: the force at the end of a step is
the next step's first kick, so the step takes the gradient estimator as a
function and evaluates it between its second drift and last kick.

Nothing here imports NumPyro; the functions act on pytrees of arrays and reuse
SGHMC's ``(z, p)`` state and momentum draw.
"""

from typing import Any, NamedTuple

import jax
from jax import random
import jax.numpy as jnp

from numpyro_sgbd.updates.sghmc import SGHMCState
from numpyro_sgbd.updates.shared import accumulator, broadcast_tree, leaf_keys

__all__ = ["BAOABInfo", "baoab_step"]


class BAOABInfo(NamedTuple):
    """Statistics of one :func:`baoab_step`.

    - **kinetic_energy** - :math:`\\tfrac12 \\sum_j p_j^2 / m_j` at the new
      momentum.
    - **noise_exceeded** - 0: the scheme has no noise tolerance.
    """

    kinetic_energy: Any
    noise_exceeded: Any


def _kick(p, z_grad, step_size):
    """B: half a step of the force, ``p - (h / 2) grad U``, per leaf."""
    return jax.tree.map(
        lambda mom, g, h: (mom - 0.5 * h * g).astype(jnp.result_type(mom)),
        p,
        z_grad,
        step_size,
    )


def _drift(z, p, step_size, mass):
    """A: half a step of the velocity, ``z + (h / 2) p / m``, per leaf."""
    return jax.tree.map(
        lambda x, mom, h, m: (x + 0.5 * h * mom / m).astype(jnp.result_type(x)),
        z,
        p,
        step_size,
        mass,
    )


def _ornstein_uhlenbeck(rng_key, p, step_size, friction, mass):
    """O: the exact flow of ``dp = -gamma p / m dt + sqrt(2 gamma) dW`` over h,
    ``p <- c p + sqrt((1 - c^2) m) xi`` with ``c = exp(-gamma h / m)``; one
    unit normal per leaf from ``random.split(rng_key, num_leaves)``."""
    leaves, treedef = jax.tree.flatten(p)
    keys = leaf_keys(rng_key, len(leaves))
    args = [treedef.flatten_up_to(t) for t in (step_size, friction, mass)]
    new = []
    for key, mom, h, gamma, m in zip(keys, leaves, *args):
        dtype = jnp.result_type(mom)
        decay = jnp.exp(-gamma * h / m)
        unit = random.normal(key, jnp.shape(mom), dtype)
        mom = decay * mom + jnp.sqrt((1.0 - decay**2) * m) * unit
        new.append(jnp.broadcast_to(mom, jnp.shape(unit)).astype(dtype))
    return treedef.unflatten(new)


def _kinetic_energy(p, mass):
    leaves = jax.tree.leaves(
        jax.tree.map(
            lambda mom, m: (
                0.5
                * jnp.sum(
                    jnp.broadcast_to(
                        jnp.square(mom.astype(accumulator(jnp.result_type(mom)))) / m,
                        jnp.shape(mom),
                    )
                )
            ),
            p,
            mass,
        )
    )
    return sum(leaves, jnp.zeros((), jnp.float32))


def baoab_step(
    rng_key,
    state,
    estimate_fn,
    step_size,
    *,
    estimate,
    friction=1.0,
    mass=1.0,
    variant="vanilla",
    noise_sd=None,
):
    r"""One BAOAB step of underdamped Langevin dynamics with diagonal mass M and
    friction :math:`\gamma` (Leimkuhler & Matthews, 2013, Section 2 and eq. (2.7)
    of the BAOAB scheme), in the family form of :class:`numpyro_sgbd.core.Family`:

    .. math::

        p &\leftarrow p - \tfrac h2 \nabla\tilde U(z), \qquad
        z \leftarrow z + \tfrac h2 M^{-1} p, \\
        p &\leftarrow c\,p + \sqrt{(1 - c^2) M}\,\xi, \quad
            c = e^{-\gamma h M^{-1}}, \\
        z &\leftarrow z + \tfrac h2 M^{-1} p, \qquad
        p \leftarrow p - \tfrac h2 \nabla\tilde U(z).

    The first kick uses ``estimate``, the force the last step ended with; the last
    kick the one ``estimate_fn`` gives at the new position, which the step
    returns for the next. One force a step, as SGHMC; unlike SGHMC's explicit
    Euler update the friction and noise act by their exact flow, so with exact
    forces a Gaussian target's law of z is exact at any stable step. The gradient
    noise is not corrected for (``variant="vanilla"`` only): for a Gaussian target
    with Gaussian noise the chain is linear and its stationary law follows from a
    Lyapunov equation (``tests/test_baoab.py``).

    :param jax.random.PRNGKey rng_key: the key of the O step's normals.
    :param SGHMCState state: position and momentum.
    :param estimate_fn: ``estimate_fn(z) -> estimate`` with ``z_grad``, the
        gradient of the potential's estimate at z (same pytree).
    :param step_size: h, a scalar or a pytree matching z.
    :param estimate: the estimate at ``state.z`` (its ``z_grad``).
    :param friction: :math:`\gamma`, a scalar or a pytree matching z.
    :param mass: the diagonal of M, a scalar or a pytree matching z.
    :param str variant: ``"vanilla"``.
    :param noise_sd: unused (no correction).
    :return: ``(state, estimate, info)``: the new :class:`SGHMCState`, the
        estimate at its position and a :class:`BAOABInfo`.

    **References**

    1. Leimkuhler, B. & Matthews, C. (2013). *Rational construction of
       stochastic numerical methods for molecular sampling.* AMRX.

    >>> import jax, jax.numpy as jnp
    >>> from numpyro_sgbd import GradientEstimate
    >>> exact = lambda z: GradientEstimate(z)  # a standard normal
    >>> state = SGHMCState(jnp.ones(2), jnp.zeros(2))
    >>> state, est, info = baoab_step(
    ...     jax.random.key(0), state, exact, 0.5, estimate=exact(state.z),
    ...     friction=0.0)  # no friction: the leapfrog step, p = 0 at the start
    >>> bool(jnp.allclose(est.z_grad, state.z))
    True
    """
    del noise_sd
    if variant != "vanilla":
        raise ValueError(f"BAOAB has variant 'vanilla' only, got {variant!r}.")
    z = state.z
    steps, frictions, masses = (
        broadcast_tree(value, z, name)
        for value, name in (
            (step_size, "step_size"),
            (friction, "friction"),
            (mass, "mass"),
        )
    )
    p = _kick(state.p, estimate.z_grad, steps)
    z = _drift(z, p, steps, masses)
    p = _ornstein_uhlenbeck(rng_key, p, steps, frictions, masses)
    z = _drift(z, p, steps, masses)
    estimate = estimate_fn(z)
    p = _kick(p, estimate.z_grad, steps)
    info = BAOABInfo(_kinetic_energy(p, masses), jnp.zeros((), jnp.float32))
    return SGHMCState(z, p), estimate, info
