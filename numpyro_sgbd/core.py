"""The functional core of the SG kernels: pure, jittable ``(init_kernel,
sample_kernel)`` built from an update family, a gradient estimator and the warmup
adaptation, as NumPyro's ``hmc()`` builds its pair under the ``HMC`` class and
BlackJAX's ``build_kernel`` takes its gradient estimator as a function.

The pieces are values, fixed before compiling:

- :class:`Family`: the pure rule of :mod:`numpyro_sgbd.updates` (its ``init`` and
  ``step``), its state type, variant and hyperparameters;
- ``estimate(rng_key, z, model_args, model_kwargs, centre)`` and
  ``initial_centre(z, model_args, model_kwargs)``: the gradient estimator
  (:mod:`numpyro_sgbd.estimators`);
- :class:`~numpyro_sgbd.adaptation.Adaptation`: the warmup schedule of the step
  size and of the scales of the whitened coordinates u, with the preconditioner
  ``z = z_hat + L u`` (:mod:`numpyro_sgbd.preconditioning`) or ``None``; its
  pure functions (:func:`~numpyro_sgbd.adaptation.adapt_step`,
  :func:`~numpyro_sgbd.adaptation.adapt_scale`) are in
  :mod:`numpyro_sgbd.adaptation` and re-exported here.

:func:`build_kernel` closes over them; the one
:class:`~numpyro.infer.mcmc.MCMCKernel` class (:class:`numpyro_sgbd.kernel.SGKernel`)
is the glue that prepares these values from a model and hands NumPyro the pair.
The non-finite :func:`guard` serves every sampler, NOGIN's included.
"""

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp

from numpyro_sgbd.adaptation import (
    Adaptation,
    adapt_scale,
    adapt_step,
    initial_scale,
    noise_step_bound,
    step_allowed,
    step_size,
)
from numpyro_sgbd.estimators import _finite_tree
from numpyro_sgbd.estimators.base import GradientEstimate
from numpyro_sgbd.local_sites import global_sites
from numpyro_sgbd.updates.shared import tree_mean

__all__ = [
    "Adaptation",
    "Family",
    "adapt_scale",
    "adapt_step",
    "aux_field",
    "build_kernel",
    "global_sites",
    "gradient_at_end",
    "scale_steps",
    "split_init_key",
    "guard",
    "repeat",
    "potential_ok",
    "step_size",
]


class Family(NamedTuple):
    """A pure update family and its hyperparameters, fixed before compiling.

    The protocol (see ``docs/adding_a_sampler.rst``): the family moves a position
    x (z's pytree without a preconditioner, the flat u with one; always flat when
    ``flat``) and takes the gradient estimator as a function, so a splitting
    integrator evaluates it where its scheme needs (NOGIN at the half step, BAOAB
    between its drifts) and a rule that moves on the gradient at its start
    (SGBD, SGLD, SGHMC, ...) is lifted by :func:`gradient_at_end`.

    :ivar init: ``init(x, rng_key, **init_kwargs) -> aux``, the family's state at
        position x, which it keeps in its field ``z``.
    :ivar step: ``step(rng_key, aux, estimate_fn, step_size, *, estimate,
        variant, noise_sd, **step_kwargs) -> (aux, estimate, info)``, one move.
        ``estimate_fn(x)`` is the :class:`~numpyro_sgbd.GradientEstimate` at x (in
        x's form) from this step's minibatch; ``estimate`` is the one the state
        keeps from the last step, at ``aux.z`` (``None`` when the state keeps
        none, ``keeps_gradient=False``). The step returns the last estimate it
        made, whose potential the state reports (and whose gradient it keeps).
        ``info.noise_exceeded`` is the fraction of coordinates outside the
        corrected variant's tolerance, and ``info`` holds the sampler's
        statistics by name.
    :ivar state_type: the kernel's state (:func:`~numpyro_sgbd.kernel.family_state`,
        or one with the family's own fields, as :class:`~numpyro_sgbd.NOGINState`).
    :ivar tuple statistics: the sampler's own per-draw statistics, by name.
    :ivar str variant: ``"vanilla"``, ``"corrected"`` or ``"extreme"``.
    :ivar dict init_kwargs: the hyperparameters ``init`` takes.
    :ivar dict step_kwargs: the hyperparameters ``step`` takes.
    :ivar float beta: the weight of a new noise estimate in the moving average.
    :ivar init_noise_sd: the noise sd to start from (a scalar, a dict of sites,
        or ``None``: the first estimate's).
    :ivar noise_diffusion: the name of the hyperparameter D whose injected
        variance ``eps (2 D - eps tau^2)`` the corrected variant keeps positive
        (recipe paper, eq. 9), or ``None``.
    :ivar bool exact_nan_allowed: whether a NaN potential estimate is acceptable
        (a ``gradient_fn`` that gives none).
    :ivar bool keeps_gradient: whether the state keeps the last estimate's
        gradient and noise sd (``z_grad``, ``noise_sd``, ``tolerance_exceeded``);
        otherwise ``mean_noise_sd`` summarises each estimate by itself.
    :ivar mean_noise_sd: ``mean_noise_sd(estimate, x)``, the state's
        ``mean_noise_sd`` where it keeps no gradient.
    :ivar bool flat: whether x is the flat vector also without a preconditioner.
    :ivar split_init_key: ``rng_key -> (rng_key, key_init, key_estimate)`` of
        ``init_kernel``.
    :ivar in_scale: ``(step_size, step_kwargs, s) -> (step_size, step_kwargs)``,
        the rule with re-estimated scales s of u (:func:`scale_steps`: steps
        ``step_size * s`` for the coordinate-wise rules).
    :ivar rescale: ``(moved, state) -> moved``, the family's state after the
        scales moved from ``state.scale`` to ``moved.scale``, or ``None``.
    :ivar state_of: ``aux -> dict`` of the state's fields that hold the family's
        state (:func:`aux_field`: the field ``aux``, without the position when
        it is z itself).
    :ivar aux_of: ``(state, x) -> aux``, the family's state back from the
        kernel's.
    :ivar tuple checked: statistics whose non-finite values refuse the step.
    :ivar bool independent_noise: whether the estimate's noise covariance
        comes from a second minibatch, drawn independently of the force's, at
        the same position (NOGIN on plain minibatches: its O-step damps by the
        covariance, and one estimated from the force's own minibatch moves with
        the force's error and biases the means).
    :ivar bool rows_first: with local sites, move the minibatch's rows at the
        start of the step, given the chain's position, instead of where the
        family estimates: for a family that estimates between its drifts
        (NOGIN), whose midpoint is no state of the chain, so rows moved given it
        would not be a Gibbs step (:mod:`~numpyro_sgbd.local_sites`).
    """

    init: Callable
    step: Callable
    state_type: type
    statistics: tuple
    variant: str
    init_kwargs: dict
    step_kwargs: dict
    beta: float
    init_noise_sd: Any
    noise_diffusion: Any
    exact_nan_allowed: bool
    keeps_gradient: bool = True
    mean_noise_sd: Any = None
    flat: bool = False
    split_init_key: Any = None
    in_scale: Any = None
    rescale: Any = None
    state_of: Any = None
    aux_of: Any = None
    checked: tuple = ()
    independent_noise: bool = False
    rows_first: bool = False


def _step_at_end(rule, rng_key, aux, estimate_fn, step_size, *, estimate, **kwargs):
    aux, info = rule(rng_key, aux, estimate.z_grad, step_size, **kwargs)
    return aux, estimate_fn(aux.z), info


def gradient_at_end(rule):
    """The family step of a ``rule(rng_key, aux, z_grad, step_size, **kwargs) ->
    (aux, info)`` that moves on the gradient at its start: it moves on the
    estimate the state keeps, then estimates at the new position for the next
    step (one evaluation a step, as SGBD paper, Algorithm 2). A
    :func:`functools.partial`, so a kernel holding it pickles."""
    return partial(_step_at_end, rule)


def split_init_key(rng_key):
    """The default keys of ``init_kernel``: the chain's, the family's (folded
    from the estimate's) and the first estimate's."""
    rng_key, key_est = random.split(rng_key)
    return rng_key, random.fold_in(key_est, 1), key_est


def scale_steps(step_size, step_kwargs, scale):
    """The coordinate-wise rules in v = u / s are the rules in u with steps
    ``step_size * s``: the Barker and Langevin moves act coordinate by
    coordinate, and the tolerance |w| < 1.702 / tau is the same statement in u
    and in v."""
    return step_size * scale, step_kwargs


def aux_field(preconditioned):
    """``(state_of, aux_of)`` keeping the family's state in the field ``aux``;
    without a preconditioner the position is z itself, kept once (``aux.z`` is
    ``None`` in the state), so the loop carries and guards no copy."""

    def state_of(aux):
        return {"aux": aux if preconditioned else aux._replace(z=None)}

    def aux_of(state, x):
        return state.aux if preconditioned else state.aux._replace(z=x)

    return state_of, aux_of


def guard(ok, moved, state, rng_key):
    """The one non-finite guard of every kernel: ``moved`` where ``ok``; else the
    chain stays at ``state``, counts the refused step in ``num_nonfinite`` and
    takes the new key (a stopped chain stays stopped: ``ok`` includes
    ``state.num_nonfinite == 0``)."""
    stopped = state._replace(
        i=state.i + 1, num_nonfinite=state.num_nonfinite + 1, rng_key=rng_key
    )
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), moved, stopped)


def potential_ok(potential, exact_nan_allowed):
    """A potential estimate is acceptable when finite, or NaN from a
    ``gradient_fn`` that gives none."""
    return jnp.isfinite(potential) | jnp.isnan(potential) & exact_nan_allowed


def _initial_noise(family, z, estimate_noise):
    """The state's noise sd at the start: ``init_noise_sd`` where given (a
    scalar, or per site without a preconditioner), else the first estimate's."""
    given = family.init_noise_sd
    if estimate_noise is None:
        return None
    if given is None:
        return estimate_noise
    if isinstance(given, dict):
        return {
            k: jnp.broadcast_to(
                jnp.asarray(given[k], jnp.result_type(float)), jnp.shape(v)
            )
            for k, v in z.items()
        }
    return jax.tree.map(
        lambda x: jnp.full(jnp.shape(x), given, jnp.result_type(float)),
        estimate_noise,
    )


def _estimate_in_x(
    parts, key, like, model_args, model_kwargs, centre, local=None, moved=None
):
    """``estimate_fn(x)``: the estimator at x through ``key`` and the chain's
    centre, with its gradient in x's form. ``like`` is the chain's z, with the
    local sites' rows; ``local``, ``(key_move, LocalState, i)`` where the rows of
    this minibatch move first, given x (the estimate then carries them);
    ``moved``, ``(rows, LocalState)`` where they moved before (``like`` holds
    them), for the estimate to carry."""

    def estimate_fn(x):
        z = _z_at(parts, x, like)
        if local is not None:
            z, step = parts.local.update(key, *local, z, model_args, model_kwargs)
            rows = ({k: z[k] for k in parts.local.names}, step)
        else:
            rows = moved
        est = parts.estimate(key, z, model_args, model_kwargs, centre)
        if parts.family.independent_noise:  # the covariance from other rows
            other = parts.estimate(
                random.fold_in(key, 2), z, model_args, model_kwargs, centre
            )
            est = est._replace(noise_cov=other.noise_cov)
        if parts.family.flat:
            est = est._replace(z_grad=ravel_pytree(est.z_grad)[0])
        return est._replace(local=rows)

    return estimate_fn


def _z_at(parts, x, like):
    names = parts.local and parts.local.names  # z at x, with like's local sites
    z = to_z(
        parts.adaptation.preconditioner, x, global_sites(like, names), parts.family.flat
    )
    return {**like, **z} if names else z


def to_x(pre, z, flat=False):
    """The family's position at z: u with a preconditioner, z (raveled when
    ``flat``) without."""
    if pre is not None:
        return pre.to_u(ravel_pytree(z)[0])
    return ravel_pytree(z)[0] if flat else z


def to_z(pre, x, like, flat=False):
    """z, with ``like``'s structure, at the family's position x."""
    if pre is not None:
        return ravel_pytree(like)[1](pre.to_z(x))
    return ravel_pytree(like)[1](x) if flat else x


def _kept_noise(family, state, est, info, x):
    """The state's noise fields after an estimate: the moving average of the
    noise sd, its mean and the fraction over tolerance (kept gradients); or the
    family's summary of this estimate alone."""
    if not family.keeps_gradient:
        return {"mean_noise_sd": family.mean_noise_sd(est, x)}
    noise_sd, mean_noise_sd = state.noise_sd, state.mean_noise_sd
    exceeded = state.tolerance_exceeded
    if noise_sd is not None:
        beta = family.beta
        noise_sd = jax.tree.map(
            lambda old, new: (1 - beta) * old + beta * new, noise_sd, est.noise_sd
        )
        mean_noise_sd = tree_mean(noise_sd)
        exceeded = jnp.asarray(info.noise_exceeded, exceeded.dtype)
    return {
        "z_grad": est.z_grad,
        "noise_sd": noise_sd,
        "mean_noise_sd": mean_noise_sd,
        "tolerance_exceeded": exceeded,
    }


def _initial_fields(family, z, est, x):
    """The state's estimate fields at the start."""
    nan = jnp.array(jnp.nan, jnp.result_type(float))
    stats = {name: nan for name in family.statistics}
    if not family.keeps_gradient:
        return {"mean_noise_sd": family.mean_noise_sd(est, x), **stats}
    noise_sd = _initial_noise(family, z, est.noise_sd)
    return {
        "z_grad": est.z_grad,
        "noise_sd": noise_sd,
        "mean_noise_sd": nan if noise_sd is None else tree_mean(noise_sd),
        "tolerance_exceeded": nan,
        **stats,
    }


class _Parts(NamedTuple):
    """What :func:`build_kernel` closes over, resolved once."""

    family: Family
    estimate: Callable
    initial_centre: Callable
    adaptation: Adaptation
    allowed: Callable
    state_of: Callable
    aux_of: Callable
    local: Any = None


def _default_allowed(family, adaptation, bound, state):
    return step_allowed(family, adaptation, state, bound)


def _init_kernel(parts, rng_key, z, model_args, model_kwargs):
    """The chain's state at z: the first estimate, the family's state, the
    scales at 1 and, with an adapted step, the step the noise allows."""
    family, adaptation = parts.family, parts.adaptation
    rng_key, key_init, key_est = (family.split_init_key or split_init_key)(rng_key)
    centre = parts.initial_centre(z, model_args, model_kwargs)
    est = parts.estimate(key_est, z, model_args, model_kwargs, centre)
    z_global = global_sites(z, parts.local and parts.local.names)
    x = to_x(adaptation.preconditioner, z_global, family.flat)
    aux = family.init(x, key_init, **family.init_kwargs)
    local = {} if parts.local is None else {"local": parts.local.init()}
    state = family.state_type(
        i=jnp.array(0),
        z=z,
        potential_energy_estimate=jnp.asarray(
            est.potential_energy, jnp.result_type(float)
        ),
        **_initial_fields(family, z_global, est, x),
        num_nonfinite=jnp.array(0),
        centre=centre,
        rng_key=rng_key,
        scale=initial_scale(adaptation, ravel_pytree(z_global)[0]),
        **parts.state_of(aux),
        **local,
    )
    if adaptation.fixed_step is None:
        state = state._replace(step_size=parts.allowed(state))
    return state


def _move(parts, state, key_move, key_est, model_args, model_kwargs):
    """The family's step from ``state``: ``(aux, estimate, info)``."""
    family, adaptation = parts.family, parts.adaptation
    pre, names = adaptation.preconditioner, parts.local and parts.local.names
    step, step_kwargs = step_size(adaptation, state), family.step_kwargs
    if state.scale is not None:
        in_scale = family.in_scale or scale_steps
        step, step_kwargs = in_scale(step, step_kwargs, state.scale.scale)
    local, like, moved = None, state.z, None
    if parts.local is not None:
        local = (key_move, state.local, state.i)
        if family.rows_first:  # the rows move given the chain's position
            like, step_state = parts.local.update(
                key_est, *local, state.z, model_args, model_kwargs
            )
            local, moved = None, ({k: like[k] for k in parts.local.names}, step_state)
    estimate_fn = _estimate_in_x(
        parts, key_est, like, model_args, model_kwargs, state.centre, local, moved
    )

    held = noise_sd = None
    if family.keeps_gradient:
        held = GradientEstimate(state.z_grad, noise_sd=state.noise_sd)
        noise_sd = state.noise_sd
    return family.step(
        key_move,
        parts.aux_of(state, to_x(pre, global_sites(state.z, names), family.flat)),
        estimate_fn,
        step,
        estimate=held,
        variant=family.variant,
        noise_sd=noise_sd,
        **step_kwargs,
    )


def _sample_kernel(parts, state, model_args, model_kwargs):
    """One step: the family's move, its estimate recorded, the scales and the
    step adapted, a non-finite move refused."""
    family, adaptation = parts.family, parts.adaptation
    rng_key, key_move, key_est = random.split(state.rng_key, 3)
    aux, est, info = _move(parts, state, key_move, key_est, model_args, model_kwargs)
    z, local = _z_at(parts, aux.z, state.z), {}
    if est.local is not None:  # the rows the last estimate moved and read
        z, local = {**z, **est.local[0]}, {"local": est.local[1]}
    noise = _kept_noise(family, state, est, info, aux.z)
    stat_dtype = noise["mean_noise_sd"].dtype
    potential = jnp.asarray(est.potential_energy, jnp.result_type(float))
    kept = parts.state_of(aux)
    checked = [getattr(info, name) for name in family.checked]
    ok = (
        _finite_tree((z, kept, noise.get("z_grad"), noise.get("noise_sd"), checked))
        & potential_ok(potential, family.exact_nan_allowed)
        & (state.num_nonfinite == 0)
    )
    moved = state._replace(
        i=state.i + 1,
        z=z,
        potential_energy_estimate=potential,
        **noise,
        **{
            name: jnp.asarray(getattr(info, name), stat_dtype)
            for name in family.statistics
        },
        rng_key=rng_key,
        **kept,
        **local,
    )
    moved = adapt_scale(adaptation, moved, parts.local and parts.local.names)
    if family.rescale is not None and state.scale is not None:
        moved = family.rescale(moved, state)
    moved = adapt_step(adaptation, moved, parts.allowed)
    return guard(ok, moved, state, rng_key)


def build_kernel(
    family,
    estimate,
    initial_centre,
    adaptation,
    bound=noise_step_bound,
    allowed=None,
    local=None,
):
    """``(init_kernel, sample_kernel)`` for one chain of ``family``'s rule with
    gradients from ``estimate`` and warmup by ``adaptation``.

    ``init_kernel(rng_key, z, model_args, model_kwargs) -> state`` and
    ``sample_kernel(state, model_args, model_kwargs) -> state`` are pure and
    jittable (``jax.vmap`` them for vectorized chains). Each step splits the
    chain's key into the family's and the estimator's, hands the family
    ``estimate_fn`` (:class:`Family`), records the estimate it returns, adapts
    the scales and the step (:func:`adapt_scale`, :func:`adapt_step`) and
    refuses a non-finite move (:func:`guard`). ``allowed(state)`` is the step
    the noise allows now; by default :func:`step_allowed` with ``bound(family,
    largest noise sd)`` (:func:`noise_step_bound`). ``local``: the local sites'
    :class:`~numpyro_sgbd.local_sites.LocalUpdate` (run as a step estimates).
    """
    if allowed is None:
        allowed = partial(_default_allowed, family, adaptation, bound)
    if family.state_of is None:
        state_of, aux_of = aux_field(adaptation.preconditioner is not None)
    else:
        state_of, aux_of = family.state_of, family.aux_of
    parts = _Parts(
        family, estimate, initial_centre, adaptation, allowed, state_of, aux_of, local
    )
    return partial(_init_kernel, parts), partial(_sample_kernel, parts)


def repeat(sample_kernel, num_steps, recentre=None):
    """``sample_kernel`` run ``num_steps`` times in one compiled loop (one sample
    of ``num_steps`` steps: NumPyro's per-sample costs, the progress bar's Python
    dispatch and collecting ``extra_fields``, are paid once for them), with
    ``recentre(state, model_args, model_kwargs) -> centre`` after each step where
    the control variates re-centre in warmup. ``num_steps`` may be traced (a
    loop of a variable length)."""

    def one(state, model_args, model_kwargs):
        new = sample_kernel(state, model_args, model_kwargs)
        if recentre is None:
            return new
        return new._replace(centre=recentre(new, model_args, model_kwargs))

    if isinstance(num_steps, int) and num_steps == 1:
        return one

    def steps(state, model_args, model_kwargs):
        return jax.lax.fori_loop(
            0, num_steps, lambda _, s: one(s, model_args, model_kwargs), state
        )

    return steps
