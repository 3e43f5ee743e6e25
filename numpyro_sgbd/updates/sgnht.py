"""Stochastic gradient Nosé-Hoover thermostat: the pure update.

Nothing here imports NumPyro. The momentum move is SGHMC's
(:mod:`numpyro_sgbd.updates.sghmc`) with unit mass and the thermostat as friction.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from numpyro_sgbd.updates.sghmc import momentum_update, sghmc_init
from numpyro_sgbd.updates.shared import accumulator

__all__ = ["SGNHTInfo", "SGNHTState", "sgnht_init", "sgnht_step"]


class SGNHTState(NamedTuple):
    """State of :func:`sgnht_step`.

    - **z** - position (pytree of arrays).
    - **p** - momentum, a pytree of the same structure, shapes and dtypes as ``z``.
    - **thermostat** - :math:`\\xi`, a scalar: the friction, adapted so that the
      kinetic energy per coordinate stays at 1/2.
    """

    z: Any
    p: Any
    thermostat: Any


class SGNHTInfo(NamedTuple):
    """Statistics of one :func:`sgnht_step` (scalars).

    - **kinetic_energy** - :math:`\\tfrac12 p'^T p'` at the new momentum.
    - **thermostat** - the new :math:`\\xi'`.
    - **noise_exceeded** - the fraction of coordinates where
      :math:`\\epsilon \\hat\\tau^2 \\ge 2A` (the corrected variant then injects no
      noise); 0 when ``noise_sd`` is not given.
    """

    kinetic_energy: Any
    thermostat: Any
    noise_exceeded: Any


def _check_scalar(value, name):
    if not (
        jax.tree_util.treedef_is_leaf(jax.tree.structure(value))
        and value is not None
        and jnp.ndim(value) == 0
    ):
        raise ValueError(
            f"{name} must be a scalar for SGNHT (its thermostat is one scalar)."
        )


def sgnht_init(z, rng_key=None, *, diffusion=1.0):
    r"""The :class:`SGNHTState` at position ``z``.

    The momentum is drawn from :math:`N(0, I)` when ``rng_key`` is given (the unit
    draws of :func:`~numpyro_sgbd.updates.sghmc.sghmc_init`: per leaf
    ``random.normal(leaf_key, leaf.shape, leaf.dtype)`` with
    ``leaf_keys = random.split(rng_key, num_leaves)``) and is zero otherwise; the
    thermostat starts at the diffusion A, its stationary mean with exact gradients.

    :param z: initial position (pytree of arrays).
    :param jax.random.PRNGKey rng_key: random key for the momentum, or ``None``.
    :param float diffusion: :math:`A`, a scalar.
    :return: :class:`SGNHTState`.

    >>> import jax, jax.numpy as jnp
    >>> state = sgnht_init(jnp.zeros(3), jax.random.key(0), diffusion=2.0)
    >>> float(state.thermostat), state.p.shape
    (2.0, (3,))
    """
    _check_scalar(diffusion, "diffusion")
    z, p = sghmc_init(z, rng_key)
    leaves = jax.tree.leaves(z)
    dtype = accumulator(jnp.result_type(*leaves) if leaves else jnp.float32)
    return SGNHTState(z, p, jnp.asarray(diffusion, dtype))


def sgnht_step(
    rng_key,
    state,
    z_grad,
    step_size,
    *,
    diffusion=1.0,
    variant="vanilla",
    noise_sd=None,
):
    r"""One stochastic gradient Nosé-Hoover thermostat update of ``(z, p, xi)``.

    With d the total number of coordinates and every line from the old state
    (explicit Euler):

    .. math::

        z' &= z + \epsilon p, \\
        p' &= p - \epsilon \nabla\tilde U(z) - \epsilon \xi p + \eta, \qquad
        \eta \sim \begin{cases}
            N(0, 2 \epsilon A) & \text{vanilla} \\
            N\!\left(0, \epsilon \max(0, 2A - \epsilon \hat\tau^2)\right)
                & \text{corrected,}
        \end{cases} \\
        \xi' &= \xi + \epsilon \left(p^T p / d - 1\right).

    The thermostat raises the friction while the kinetic temperature
    :math:`p^T p / d` is above 1 and lowers it while below. It therefore absorbs
    gradient noise the sampler is not told of, as long as it is the same for every
    coordinate: noise of variance :math:`\tau^2` adds :math:`\epsilon^2\tau^2` to
    the :math:`2\epsilon A` injected into each :math:`p_j`, a total diffusion of
    :math:`A + \epsilon\tau^2/2`, and :math:`\xi` settles there (up to
    :math:`O(\epsilon)`) with :math:`z` still distributed as the target. The
    momentum move is :func:`~numpyro_sgbd.updates.sghmc.sghmc_step`'s with unit
    mass and friction :math:`\xi`, including its unit draws and the convention for
    ``noise_sd`` and clipping.

    :param jax.random.PRNGKey rng_key: random key.
    :param SGNHTState state: current position, momentum and thermostat.
    :param z_grad: gradient of the (estimated) potential at ``state.z``, same pytree.
    :param float step_size: :math:`\epsilon`, a scalar (the thermostat is shared by
        all coordinates).
    :param float diffusion: :math:`A`, a scalar.
    :param str variant: ``"vanilla"`` or ``"corrected"``.
    :param noise_sd: :math:`\hat\tau`, the noise sd of ``z_grad`` per coordinate, a
        scalar or a pytree matching ``z``; required for ``"corrected"``.
    :return: ``(state, info)``: the new :class:`SGNHTState` and an
        :class:`SGNHTInfo` with the new kinetic energy, the new thermostat and the
        fraction of coordinates where :math:`\epsilon\hat\tau^2 \ge 2A` (for every
        variant when ``noise_sd`` is given, 0 without it).

    **References**

    1. Ma, Chen & Fox (2015), *A complete recipe for stochastic gradient MCMC*,
       NIPS: Section 3.1, eq. (15); the noise correction, eq. (9).
    2. Ding, Fang, Babbush, Chen, Skeel & Neven (2014), *Bayesian sampling using
       stochastic gradient thermostats*, NIPS (the recipe paper's ref. [6]).

    >>> import jax, jax.numpy as jnp
    >>> state = SGNHTState(z=jnp.zeros(4), p=jnp.full(4, 2.0), thermostat=1.0)
    >>> new, info = sgnht_step(jax.random.key(0), state, jnp.zeros(4), 0.5)
    >>> float(info.thermostat)  # 1 + 0.5 * (16 / 4 - 1), from the old momentum
    2.5
    >>> bool(jnp.allclose(new.z, 1.0))
    True
    """
    _check_scalar(step_size, "step_size")
    _check_scalar(diffusion, "diffusion")
    leaves = jax.tree.leaves(state.p)
    d = max(sum(int(jnp.size(x)) for x in leaves), 1)
    two_kinetic = sum(
        jnp.sum(jnp.square(x.astype(accumulator(jnp.result_type(x))))) for x in leaves
    )
    xi = state.thermostat
    z_new, p_new, kinetic, exceeded = momentum_update(
        rng_key,
        state.z,
        state.p,
        z_grad,
        step_size,
        drag=xi,
        diffusion=diffusion,
        mass=1.0,
        variant=variant,
        noise_sd=noise_sd,
    )
    # The old momentum, as in eq. (15).
    xi_new = (xi + step_size * (two_kinetic / d - 1.0)).astype(jnp.result_type(xi))
    return SGNHTState(z_new, p_new, xi_new), SGNHTInfo(kinetic, xi_new, exceeded)
