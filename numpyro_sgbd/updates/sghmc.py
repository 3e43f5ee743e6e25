"""Stochastic gradient Hamiltonian Monte Carlo: the pure update.

Nothing here imports NumPyro: the functions act on pytrees of arrays so that a test
can feed them exact gradients with injected noise. The momentum update is shared with
:mod:`numpyro_sgbd.updates.sgnht`, whose thermostat plays the part of the friction.
"""

from typing import Any, NamedTuple

import jax
from jax import random
import jax.numpy as jnp

from numpyro_sgbd.updates.shared import accumulator, broadcast_tree, leaf_keys

__all__ = [
    "MOMENTUM_VARIANTS",
    "SGHMCInfo",
    "SGHMCState",
    "momentum_update",
    "sghmc_init",
    "sghmc_step",
]

#: The variants of the momentum samplers (``"extreme"`` has no momentum analogue).
MOMENTUM_VARIANTS = ("vanilla", "corrected")


class SGHMCState(NamedTuple):
    """State of :func:`sghmc_step`.

    - **z** - position (pytree of arrays).
    - **p** - momentum, a pytree of the same structure, shapes and dtypes as ``z``.
    """

    z: Any
    p: Any


class SGHMCInfo(NamedTuple):
    """Statistics of one :func:`sghmc_step` (scalars).

    - **kinetic_energy** - :math:`\\tfrac12 \\sum_j p_j'^2 / m_j` at the new momentum.
    - **noise_exceeded** - the fraction of coordinates where the gradient noise alone
      carries at least the variance the step should inject
      (:math:`\\epsilon \\hat\\tau^2 \\ge 2C`; the corrected variant then injects
      none); 0 when ``noise_sd`` is not given.
    """

    kinetic_energy: Any
    noise_exceeded: Any


def sghmc_init(z, rng_key=None, *, mass=1.0):
    r"""The :class:`SGHMCState` at position ``z``.

    The momentum is drawn from its stationary law :math:`p_j \sim N(0, m_j)` when
    ``rng_key`` is given, and is zero otherwise. The unit draws are
    ``random.normal(leaf_key, leaf.shape, leaf.dtype)`` per leaf of ``z``, with
    ``leaf_keys = random.split(rng_key, num_leaves)`` in the order of
    :func:`jax.tree.leaves`.

    :param z: initial position (pytree of arrays).
    :param jax.random.PRNGKey rng_key: random key for the momentum, or ``None``.
    :param mass: the diagonal :math:`m` of the mass matrix M, a scalar or a pytree
        matching ``z``.
    :return: :class:`SGHMCState`.

    >>> import jax, jax.numpy as jnp
    >>> state = sghmc_init({"a": jnp.zeros(3)})
    >>> bool(jnp.all(state.p["a"] == 0.0))
    True
    """
    leaves, treedef = jax.tree.flatten(z)
    if rng_key is None:
        return SGHMCState(z, jax.tree.map(jnp.zeros_like, z))
    masses = treedef.flatten_up_to(broadcast_tree(mass, z, "mass"))
    p = [
        (jnp.sqrt(m) * random.normal(key, jnp.shape(x), jnp.result_type(x))).astype(
            jnp.result_type(x)
        )
        for key, x, m in zip(leaf_keys(rng_key, len(leaves)), leaves, masses)
    ]
    return SGHMCState(z, treedef.unflatten(p))


def momentum_update(
    rng_key,
    z,
    p,
    z_grad,
    step_size,
    *,
    drag,
    diffusion,
    mass,
    variant,
    noise_sd,
):
    r"""The explicit Euler move shared by SGHMC and SGNHT, from the old state:

    .. math::

        z' = z + \epsilon M^{-1} p, \qquad
        p' = p - \epsilon \nabla\tilde U(z) - \epsilon \gamma M^{-1} p
            + N\big(0, \epsilon \max(0, 2D - \epsilon \hat B)\big),

    with :math:`\gamma` = ``drag`` (SGHMC's friction C, SGNHT's thermostat),
    :math:`D` = ``diffusion`` and :math:`\hat B = \hat\tau^2` (corrected) or 0
    (vanilla). Every hyperparameter is a scalar or a pytree matching ``z``. Returns
    ``(z_new, p_new, kinetic_energy, noise_exceeded)``; see :func:`sghmc_step`.
    """
    if variant not in MOMENTUM_VARIANTS:
        raise ValueError(
            f"variant must be one of {MOMENTUM_VARIANTS}, got {variant!r}."
        )
    if variant == "corrected" and noise_sd is None:
        raise ValueError("variant='corrected' needs noise_sd (the noise sd tau).")
    leaves, treedef = jax.tree.flatten(z)
    trees = [treedef.flatten_up_to(p), treedef.flatten_up_to(z_grad)] + [
        treedef.flatten_up_to(broadcast_tree(value, z, name))
        for value, name in (
            (step_size, "step_size"),
            (drag, "friction"),
            (diffusion, "diffusion"),
            (mass, "mass"),
            (noise_sd, "noise_sd"),
        )
    ]
    z_new, p_new = [], []
    kinetic = jnp.zeros((), jnp.float32)
    num_exceeded = jnp.zeros((), jnp.int32)
    keys = leaf_keys(rng_key, len(leaves))
    for key, x, *args in zip(keys, leaves, *trees):
        mom, grad, eps, gamma, dif, m, tau = args
        shape, dtype = jnp.shape(x), jnp.result_type(x)
        if tau is not None:
            # The gradient noise puts (eps tau)^2 into p; it alone is at least the
            # 2 eps D the step should inject when eps tau^2 >= 2 D.
            exceeded = jnp.broadcast_to(eps * tau**2 >= 2.0 * dif, shape)
            num_exceeded = num_exceeded + jnp.sum(exceeded, dtype=jnp.int32)
        # One expression for both variants, so that tau = 0 gives vanilla exactly.
        b_hat = 0.0 if variant == "vanilla" else tau**2
        var = eps * jnp.maximum(2.0 * dif - eps * b_hat, 0.0)
        unit = random.normal(key, shape, dtype)
        z_new.append((x + eps * mom / m).astype(dtype))
        mom = mom - eps * grad - eps * gamma * mom / m + jnp.sqrt(var) * unit
        mom = jnp.broadcast_to(mom, shape).astype(dtype)
        p_new.append(mom)
        acc = accumulator(dtype)
        kinetic = kinetic + 0.5 * jnp.sum(
            jnp.broadcast_to(jnp.square(mom.astype(acc)) / m, shape)
        )
    d = sum(int(jnp.size(x)) for x in leaves)
    noise_exceeded = num_exceeded.astype(jnp.float32) / max(d, 1)
    return treedef.unflatten(z_new), treedef.unflatten(p_new), kinetic, noise_exceeded


def sghmc_step(
    rng_key,
    state,
    z_grad,
    step_size,
    *,
    friction=1.0,
    mass=1.0,
    variant="vanilla",
    noise_sd=None,
):
    r"""One stochastic gradient Hamiltonian Monte Carlo update of ``(z, p)``.

    The explicit (Euler) discretisation of second-order Langevin dynamics with
    friction C and diagonal mass matrix M, both lines from the old state:

    .. math::

        z' = z + \epsilon M^{-1} p, \qquad
        p' = p - \epsilon \nabla\tilde U(z) - \epsilon C M^{-1} p + \eta,
        \qquad \eta \sim \begin{cases}
            N(0, 2 \epsilon C) & \text{vanilla} \\
            N\!\left(0, \epsilon \max(0, 2C - \epsilon \hat\tau^2)\right)
                & \text{corrected.}
        \end{cases}

    The corrected variant takes :math:`\hat B = \hat\tau^2` in the recipe's
    :math:`N(0, \epsilon(2C - \epsilon\hat B))`: gradient noise of variance
    :math:`\hat\tau^2` puts :math:`\epsilon^2\hat\tau^2` into :math:`p'`, so the total
    is :math:`2\epsilon C` again. Where :math:`\epsilon\hat\tau^2 \ge 2C` the gradient
    noise alone carries at least that much and nothing is injected. With
    ``z_grad`` the gradient of the potential (the negative log density) and no
    gradient noise, the continuous-time limit leaves :math:`\pi(z) N(p; 0, M)`
    invariant; the discretised chain is :math:`O(\epsilon)` off.

    The unit normal of a leaf is ``random.normal(leaf_key, leaf.shape, leaf.dtype)``
    with ``leaf_keys = random.split(rng_key, num_leaves)`` in the order of
    :func:`jax.tree.leaves` (as :func:`~numpyro_sgbd.updates.langevin_step` draws
    them), so a test can rebuild it from the key.

    :param jax.random.PRNGKey rng_key: random key.
    :param SGHMCState state: current position and momentum.
    :param z_grad: gradient of the (estimated) potential at ``state.z``, same pytree.
    :param step_size: :math:`\epsilon`, a scalar or a pytree matching ``z``.
    :param friction: :math:`C`, a scalar or a pytree matching ``z``.
    :param mass: the diagonal :math:`m` of M, a scalar or a pytree matching ``z``.
    :param str variant: ``"vanilla"`` or ``"corrected"``.
    :param noise_sd: :math:`\hat\tau`, the noise sd of ``z_grad`` per coordinate, a
        scalar or a pytree matching ``z``; required for ``"corrected"``.
    :return: ``(state, info)``: the new :class:`SGHMCState` and an
        :class:`SGHMCInfo` with the new kinetic energy and the fraction of
        coordinates where :math:`\epsilon\hat\tau^2 \ge 2C` (computed for every
        variant when ``noise_sd`` is given, 0 without it).

    **References**

    1. Ma, Chen & Fox (2015), *A complete recipe for stochastic gradient MCMC*,
       NIPS: Section 3.1, eq. (12); the noise correction :math:`-\epsilon\hat B`,
       eq. (9).
    2. Chen, Fox & Guestrin (2014), *Stochastic gradient Hamiltonian Monte Carlo*,
       ICML (the recipe paper's ref. [5]).

    >>> import jax, jax.numpy as jnp
    >>> state = SGHMCState(z=jnp.zeros(2), p=jnp.ones(2))
    >>> new, info = sghmc_step(jax.random.key(0), state, jnp.zeros(2), 0.1,
    ...                        friction=0.0)
    >>> bool(jnp.allclose(new.z, 0.1)), bool(jnp.allclose(new.p, 1.0))
    (True, True)
    >>> float(info.kinetic_energy)
    1.0
    """
    z_new, p_new, kinetic, exceeded = momentum_update(
        rng_key,
        state.z,
        state.p,
        z_grad,
        step_size,
        drag=friction,
        diffusion=friction,
        mass=mass,
        variant=variant,
        noise_sd=noise_sd,
    )
    return SGHMCState(z_new, p_new), SGHMCInfo(kinetic, exceeded)
