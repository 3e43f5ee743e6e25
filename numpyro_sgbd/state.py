"""The state of the family kernels: :class:`SGState` and :func:`family_state`
for a sampler's own (with its statistics and its family's state)."""

from collections import namedtuple
from typing import Any, NamedTuple

__all__ = ["SGState", "SetupArrays", "family_state"]


class SetupArrays(NamedTuple):
    """The arrays of a kernel's set-up that its step reads, carried in each
    chain's state (its ``setup`` field) rather than closed over: a step compiled
    once serves every data set of the same shapes (a refit, a fold, a simulation
    of simulation-based calibration), and NumPyro's compiled loop with it.

    :ivar preconditioner: the
        :class:`~numpyro_sgbd.preconditioning.Preconditioner` z = z_hat + L u
        (its form a static part of the tree), or ``None``.
    :ivar centre: ``(z_hat, U(z_hat), grad U(z_hat))``: the control variates'
        fixed centre (unconstrained, by site), the full-data potential there and
        its gradient (flat in u with a preconditioner), or ``None`` (no control
        variates, or centres that move with ``recentre_every``: then in the
        state's ``centre``).
    """

    preconditioner: Any = None
    centre: Any = None


#: The fields every family kernel's state has, in order; a
#: sampler's own statistics (``kinetic_energy``, ``thermostat``, ...) go between
#: ``tolerance_exceeded`` and ``num_nonfinite`` (see :func:`family_state`).
_FAMILY_HEAD = (
    "i",
    "z",
    "z_grad",
    "potential_energy_estimate",
    "noise_sd",
    "mean_noise_sd",
    "tolerance_exceeded",
)
_FAMILY_TAIL = (
    "num_nonfinite",
    "centre",
    "rng_key",
    "step_size",
    "scale",
    "aux",
    "trace",
    "setup",
    "local",
)


def family_state(name, statistics=(), *, module=None):
    """The state type of a sampler (its spec's ``state_type``): :class:`SGState`'s
    fields, the sampler's own per-draw ``statistics`` (scalars, collected by
    default) before ``num_nonfinite``, and last ``aux``, the update family's own
    state (e.g. position and momentum) over the flat position in u with a
    preconditioner, over z's pytree without. Assign it to a module-level name
    equal to ``name`` in ``module`` (the caller's ``__name__``) so that it
    pickles."""
    return namedtuple(
        name,
        _FAMILY_HEAD + tuple(statistics) + _FAMILY_TAIL,
        defaults=(None, None, None, None, None, None),
        module=module,
    )


SGState = family_state("SGState", module=__name__)
SGState.__doc__ = """
State of the stochastic-gradient kernels; every field but ``z``, ``noise_sd`` and
``rng_key`` is a scalar that ``MCMC.run(..., extra_fields=(...))`` can collect. The
four sampler statistics ``potential_energy_estimate``, ``mean_noise_sd``,
``tolerance_exceeded`` and ``num_nonfinite`` are collected by default
(:attr:`default_fields`), so they reach ``az.from_numpyro(mcmc).sample_stats`` and
:func:`~numpyro_sgbd.compare` without being asked for.

 - **i** - iteration number.
 - **z** - position in unconstrained space (dict of sites for a model).
 - **z_grad** - the minibatch estimate of the potential's gradient at ``z``, from the
   minibatch that the next step uses.
 - **potential_energy_estimate** - the minibatch estimate of the potential at ``z``
   (prior + Jacobian + N/n-scaled minibatch likelihood). It is *not* the full-data
   potential, so it is named differently from NUTS's ``potential_energy`` (which
   ArviZ turns into ``lp``).
 - **noise_sd** - :math:`\\hat\\tau`, the moving average of the per-coordinate noise
   sd of ``z_grad``; ``None`` where the noise is not estimated.
 - **mean_noise_sd** - the mean of :math:`\\hat\\tau` over coordinates (NaN where the
   noise is not estimated).
 - **tolerance_exceeded** - the fraction of coordinates whose last move was outside
   the noise tolerance: :math:`|w| \\ge 1.702/\\hat\\tau` for SGBD,
   :math:`\\hat\\tau\\sigma \\ge 2` for SGLD (NaN where the noise is not estimated).
 - **num_nonfinite** - number of steps refused because they produced a non-finite
   value. Once it is positive the chain has stopped where it was.
 - **centre** - with ``gradient="control_variates"`` and ``recentre_every``, the
   control variates' current centre (a :class:`Centre`); ``None`` otherwise.
 - **rng_key** - random key.
 - **step_size** - with ``step_size=None`` (adapted in warmup), this chain's step
   size in the whitened coordinates u, fixed from the end of warmup; ``None`` when
   the step size was given.
 - **scale** - with ``adapt_mass_matrix`` (SGBD's default with ``step_size=None``),
   this chain's re-estimated per-coordinate sds of u
   (:class:`~numpyro_sgbd.preconditioning.ScaleAdaptation`; its ``scale`` is s,
   fixed from 60 % of warmup): the rule then runs in v = u / s, so each
   coordinate of u moves by ``step_size * s``. ``None`` otherwise.
 - **aux** - the update family's own state
   (:class:`~numpyro_sgbd.updates.position.PositionState` for SGBD and SGLD). Its
   position ``aux.z`` is the flat u with a preconditioner, and ``None`` without
   one (the position is then ``z``, kept once).
 - **trace** - when NumPyro's ``MCMC`` runs the kernel, the thinned sampling
   draws its convergence check reads at the end of the run
   (:class:`~numpyro_sgbd.monitoring.Trace`); ``None`` otherwise.
 - **setup** - the preconditioner and the control variates' centre the step
   reads (:class:`SetupArrays`), found by ``init`` from the data: kept in the
   state so that the compiled step and NumPyro's compiled loop serve a later run
   on new data of the same shapes without compiling again.
 - **local** - where the model has latent sites inside its subsample plate, the
   step size and last acceptance rate of their Metropolis-adjusted rows
   (:class:`~numpyro_sgbd.local_sites.LocalState`; the sites themselves, all N
   rows, are in ``z``); ``None`` otherwise.

With a preconditioner (``z = z_hat + L u``, see :mod:`numpyro_sgbd.preconditioning`)
``z`` stays in the model's unconstrained space while ``z_grad`` and ``noise_sd`` are
flat arrays in u.
"""
