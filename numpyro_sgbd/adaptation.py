"""The warmup adaptation of every kernel as pure functions of a chain's state:
:class:`Adaptation` (what warmup adapts and how, fixed before compiling), the
step size (:func:`adapt_step`: the step the noise allows, then fixed for
sampling) and the scales of the whitened coordinates u (:func:`adapt_scale`),
and the step the gradient noise allows (:func:`step_allowed`). The core
(:func:`numpyro_sgbd.core.build_kernel`) calls them each step; ``docs/maths.rst``,
"Warmup: whitening and the step", gives the mathematics.
"""

from typing import Any, NamedTuple

import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp

from numpyro_sgbd import discretisation, preconditioning
from numpyro_sgbd.local_sites import global_sites

__all__ = [
    "Adaptation",
    "adapt_scale",
    "adapt_step",
    "initial_scale",
    "noise_step_bound",
    "step_allowed",
    "step_size",
]


class Adaptation(NamedTuple):
    """What warmup adapts and how, fixed before compiling.

    :ivar int num_warmup: warmup steps (SG steps, not samples).
    :ivar tuple scale_windows: ``(start, ends)`` of the scale windows
        (:func:`~numpyro_sgbd.preconditioning.scale_windows`); ``ends`` empty
        when the scales are not re-estimated.
    :ivar float step_target: the step in u that an adapted step starts from and
        never exceeds.
    :ivar float sampling_fraction: the sampling step as a fraction of the step
        warmup ends with, where the run's length or the rule's bias law is not
        known (``bias_law`` or ``run_steps`` ``None``).
    :ivar scale_max: the largest scale s the windows may set (``None``: no bound).
    :ivar fixed_step: the given step size (per site without a preconditioner, a
        scalar in u with one), or ``None`` when the step is adapted (it is then
        the state's ``step_size``).
    :ivar bool adapt_mass: whether the state carries re-estimated scales.
    :ivar preconditioner: the
        :class:`~numpyro_sgbd.preconditioning.Preconditioner`, or ``None``.
    :ivar bias_law: the rule's :class:`~numpyro_sgbd.discretisation.BiasLaw`,
        or ``None``.
    :ivar run_steps: the sampling steps of the whole run (every chain's), or
        ``None`` (a kernel driven by hand): with a bias law, the sampling step
        is the smaller of warmup's and
        :func:`~numpyro_sgbd.discretisation.run_step` for this many steps.
    """

    num_warmup: int
    scale_windows: tuple
    step_target: float
    sampling_fraction: float
    scale_max: Any
    fixed_step: Any
    adapt_mass: bool
    preconditioner: Any
    bias_law: Any = None
    run_steps: Any = None


def step_size(adaptation, state):
    """The step size of this chain's next move: the given one, or the state's."""
    return adaptation.fixed_step if state.step_size is None else state.step_size


def initial_scale(adaptation, flat):
    """The state's :class:`~numpyro_sgbd.preconditioning.ScaleAdaptation` at the
    start (s = 1), or ``None`` when the scales are not re-estimated."""
    if not adaptation.adapt_mass:
        return None
    return preconditioning.scale_init(flat.shape[-1], flat.dtype)


def adapt_step(adaptation, state, allowed):
    """The chain's next step size: during the first half of warmup (or until the
    scale windows close, if later) the step the noise allows now,
    ``allowed(state)``; then the smallest such step seen since; at the end of
    warmup that step times the sampling fraction, fixed from then on, so the
    sampling chain is time-homogeneous. Where the rule's bias law and the run's
    length are known, the sampling step is instead the smaller of that step and
    the one the run's length asks for
    (:func:`~numpyro_sgbd.discretisation.sampling_step`). A given step is left
    alone."""
    if state.step_size is None:
        return state
    num_warmup = adaptation.num_warmup
    now = allowed(state)
    half = max(num_warmup // 2, max(adaptation.scale_windows[1], default=0))
    step = jnp.where(
        state.i <= half,
        now,
        jnp.where(
            state.i <= num_warmup,
            jnp.minimum(state.step_size, now),
            state.step_size,
        ),
    )
    if adaptation.bias_law is not None and adaptation.run_steps is not None:
        step = jnp.where(
            state.i == num_warmup,
            discretisation.sampling_step(
                adaptation.bias_law, adaptation.run_steps, state, step
            ),
            step,
        )
    elif adaptation.sampling_fraction != 1.0:  # once, as warmup's last state forms
        step = jnp.where(
            state.i == num_warmup, step * adaptation.sampling_fraction, step
        )
    return state._replace(step_size=step.astype(state.step_size.dtype))


def adapt_scale(adaptation, state, local_names=()):
    """Add this draw, in u, to the open scale window and re-estimate s where a
    window closes (:func:`~numpyro_sgbd.preconditioning.scale_update`); past the
    last window nothing is computed (for one chain: vectorized chains evaluate
    both branches). ``local_names``: z's local sites, which u leaves out."""
    start, ends = adaptation.scale_windows
    if state.scale is None or not ends:
        return state
    pre, scale_max = adaptation.preconditioner, adaptation.scale_max

    def update(adapt, z, i):
        u = pre.to_u(ravel_pytree(z)[0])
        new = preconditioning.scale_update(adapt, u, i, start, ends)
        if scale_max is None:
            return new
        return new._replace(scale=jnp.minimum(new.scale, scale_max))

    scale = jax.lax.cond(
        state.i <= ends[-1],
        update,
        lambda adapt, z, i: adapt,
        state.scale,
        global_sites(state.z, local_names),
        state.i,
    )
    return state._replace(scale=scale)


# ------------------------------------------------------------ the noise bound
def noise_step_bound(family, largest):
    """The largest step the corrected variant allows at the largest noise sd
    ``largest``: its injected variance ``eps (2 D - eps tau^2)`` keeps a fifth of
    its margin (recipe paper, eq. 9: ``2 D >= eps B``); no bound without a named
    diffusion. SGBD and SGLD bound ``tau * step`` instead (their own
    ``step_allowed``)."""
    if family.noise_diffusion is None:
        return jnp.inf
    diffusion = jnp.min(
        jnp.stack(
            [
                jnp.min(x)
                for x in jax.tree.leaves(family.step_kwargs[family.noise_diffusion])
            ]
        )
    )
    return 1.6 * diffusion / largest**2


def step_allowed(family, adaptation, state, bound=noise_step_bound):
    """The step target, lowered to ``bound(family, largest noise sd)`` (in
    v = u / s with re-estimated scales)."""
    target = jnp.asarray(adaptation.step_target, jnp.result_type(float))
    if state.noise_sd is None:
        return target
    noise_sd = state.noise_sd
    if state.scale is not None:  # the noise sd in v = u / s
        noise_sd = noise_sd * state.scale.scale
    largest = jnp.max(jnp.stack([jnp.max(x) for x in jax.tree.leaves(noise_sd)]))
    return jnp.minimum(target, bound(family, largest)).astype(target.dtype)
