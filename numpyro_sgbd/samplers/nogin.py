"""NOGIN, the noisy gradient integrator, as a family of the core: its A-B-O-B-A
step on the flat position, its state and the choice of the noise covariance's
form."""

from collections import namedtuple
from functools import partial
import warnings

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import monitoring
from numpyro_sgbd.discretisation import BiasLaw
from numpyro_sgbd.kernel import SGKernel
from numpyro_sgbd.options import _check_positive, _check_positive_tree
from numpyro_sgbd.samplers.nogin_forms import choose_rank, noise_form
from numpyro_sgbd.spec import RunChecks, SamplerSpec, flat_per_site
from numpyro_sgbd.updates import (
    COVARIANCES,
    nogin_damp,
)
from numpyro_sgbd.updates.nogin import (
    NOGINUpdateState,
    NoiseAverage,
    nogin_init,
    nogin_step,
)
from numpyro_sgbd.validation import check_step_size

__all__ = ["NOGIN", "NOGINState"]

NOGINState = namedtuple(
    "NOGINState",
    [
        "i",
        "z",
        "p",
        "potential_energy_estimate",
        "mean_noise_sd",
        "noise_damping",
        "num_nonfinite",
        "centre",
        "rng_key",
        "step_size",
        "scale",
        "trace",
        "setup",
        "local",
        "stall_damping",
        "sampling_damping",
        "noise_average",
    ],
    defaults=(None, None, None, None, None, None, None, None),
)
NOGINState.__doc__ = """
State of :class:`NOGIN`. The scalar fields can be collected with
``MCMC.run(..., extra_fields=(...))``; ``potential_energy_estimate``,
``mean_noise_sd``, ``noise_damping`` and ``num_nonfinite`` are collected by default.

 - **i** - iteration number.
 - **z** - position in unconstrained space (dict of sites for a model).
 - **p** - momentum, a flat vector over z raveled by
   :func:`jax.flatten_util.ravel_pytree`.
 - **potential_energy_estimate** - the minibatch estimate of the potential at the
   half-step position where the last step evaluated its force.
 - **mean_noise_sd** - the mean over coordinates of the noise sd
   :math:`\\sqrt{\\Sigma_{jj}}` of the last force (0 with exact gradients;
   with ``"lowrank+diag"``, of the running estimate the O-step damped by).
 - **noise_damping** - :math:`\\frac{\\beta h^2}{4}\\rho(\\Sigma M^{-1})`, the largest
   eigenvalue of the noise term of the last O-step (0 with exact gradients). The
   damping factor's smallest eigenvalue is
   :math:`(1-\\lambda^2-x)/(1+\\lambda^2+x)` at this value x; near 1 or above,
   gradient noise rather than the step size limits exploration (see :class:`NOGIN`).
 - **num_nonfinite** - number of refused non-finite steps (see :class:`SGState`).
 - **centre** - the control variates' centre while re-centring (see
   :class:`SGState`), else ``None``.
 - **rng_key** - random key.
 - **step_size**, **scale** - as for :class:`SGState`; with ``scale`` the mass in
   u is ``mass / s**2``.
 - **trace** - the convergence check's draws (see :class:`SGState`).
 - **setup** - the preconditioner and centre the step reads (see
   :class:`SGState`).
 - **local** - the local sites' step (see :class:`SGState`), else ``None``.
 - **stall_damping** - where the run checks are made after the run (the
   default, see :mod:`numpyro_sgbd.monitoring`): ``noise_damping`` at the end of
   the sample that reached iteration ``max(num_warmup, 100)``, which the stall
   check reads (NaN before it); ``None`` otherwise.
 - **sampling_damping** - likewise: the mean of ``noise_damping`` at the end of
   each sample after warmup (0 before), which the noise check reads.
 - **noise_average** - with ``covariance="lowrank+diag"``, the running
   estimate of the noise covariance the O-step damps by
   (:class:`~numpyro_sgbd.updates.NoiseAverage`, in u's coordinates with a
   preconditioner); ``None`` otherwise.
"""

# noise_damping above which the gradient noise, not the step, sets the
# autocorrelation time (Matthews & Weare, Section 4.3).
_STALL_DAMPING = 1.0
# The mean noise_damping over the sampling draws above which a run whose noise
# covariance comes from the force's own minibatch (noise_estimate="same", or
# "auto" with control variates) warns that the O-step's damping may bias the
# means. The damping is a function of the estimated covariance, and so of the
# force's error where the per-datum gradients are skewed: a large error comes
# with a large estimate, the first half-kick's error is damped and the
# second's not, and the mean drifts (Matthews & Weare's exactness takes Sigma
# as known). Measured (benchmarks/local_sites.py, issue 60), the covariance
# from the force's own minibatch: NOGIN's default on the four local-site models
# and medpar (plain minibatches, n = 100), means 0.24-1.08 posterior sd off,
# every run's mean damping above the threshold (the Student-t one's 0.27);
# control variates on adaptation_accuracy's default, Fertility and cv1e6
# problems, 0.023, 0.003, 0.003. Below it the check is blind: the Student-t
# model with its precisions fixed, on plain minibatches, damped by 0.047 and
# sat 1.9 sd off (its 'step' and 'convergence' warnings fire). With the
# covariance from an independent minibatch (noise_estimate="auto" on plain
# minibatches) the local-site models' means are 0.04-0.23 sd off.
_NOISE_BIAS_DAMPING = 0.1
# Check the damping once, at this iteration or at the end of warmup if later.
_STALL_CHECK_ITERATION = 100


def _warn_stall(shape, i, damping):
    warnings.warn(
        f"NOGIN: noise_damping = {float(np.max(damping)):.3g} at iteration "
        f"{int(np.max(i))}. The momentum damping that cancels the gradient noise "
        "multiplies the autocorrelation time by about 1 + noise_damping (Matthews & "
        "Weare, Section 4.3): below this subsample size fewer data per step no longer "
        "buy more effective draws per data pass. Increase subsample_size (the noise "
        "variance falls like 1/n) or otherwise reduce the gradient noise. Far from "
        "the posterior the noise is larger still and can freeze the chain: start "
        "NOGIN near the posterior (init_to_value(values=posterior_mode(model, "
        "*args).params), or init_params from a short SGBD run). See "
        "state.noise_damping / sample_stats.",
        UserWarning,
        stacklevel=2,
    )


def _mean_noise_sd(noise, covariance, dtype):
    """The mean over coordinates of the noise sd in a covariance of the given form
    (0 for exact gradients, ``noise`` None)."""
    if noise is None:
        return jnp.zeros((), dtype)
    if covariance == "diag":
        var = noise
    elif covariance == "full":
        var = jnp.diagonal(noise)
    else:
        var = jnp.sum(noise**2, axis=1)
    return jnp.mean(jnp.sqrt(var)) if var.size else jnp.zeros((), noise.dtype)


def _nogin_family_step(
    rng_key, aux, estimate_fn, step_size, *, estimate, variant, noise_sd, **kwargs
):
    """:func:`~numpyro_sgbd.updates.nogin.nogin_step` as a family step: it
    estimates the force itself, at the half step, and returns that estimate."""
    del estimate, variant, noise_sd  # NOGIN damps by the force's own covariance
    aux, info = nogin_step(rng_key, aux, estimate_fn, step_size, **kwargs)
    estimate = info.estimate
    if aux.average is not None and estimate.noise_cov is not None:
        # The state's noise statistic from the average the O-step damped by.
        estimate = estimate._replace(noise_cov=aux.average)
    return aux, estimate, info


def _nogin_mean_noise_sd(covariance, estimate, x):
    noise = estimate.noise_cov
    if isinstance(noise, NoiseAverage):  # after a step: the running estimate's
        return jnp.mean(jnp.sqrt(noise.diagonal))
    form = "lowrank" if covariance == "lowrank+diag" else covariance  # B, (d, m)
    return _mean_noise_sd(noise, form, x.dtype)


def _three_keys(rng_key):
    """NOGIN's initial keys: the chain's, the momentum's and the estimate's."""
    rng_key, key_p, key_est = random.split(rng_key, 3)
    return rng_key, key_p, key_est


def _nogin_in_scale(step_size, step_kwargs, scale):
    """With re-estimated scales s NOGIN runs in v = u / s with the given mass:
    in u the mass is ``mass / s**2`` and the step unchanged."""
    return step_size, {**step_kwargs, "mass": step_kwargs["mass"] / scale**2}


def _nogin_rescale(moved, state):
    """The momentum's law in v is unchanged by a new s: in u, p ~ N(0, mass /
    (beta s^2)), so p moves with s_old / s_new."""
    return moved._replace(p=moved.p * state.scale.scale / moved.scale.scale)


def _nogin_state_of(aux):
    return {"p": aux.p, "noise_average": aux.average}


def _nogin_aux_of(state, x):
    return NOGINUpdateState(x, state.p, state.noise_average)


def _check_nogin(args):
    """NOGIN's own arguments, checked before anything is traced."""
    step_size, mass, covariance = args["step_size"], args["mass"], args["covariance"]
    check_step_size(step_size, "a positive float, or None to adapt it in warmup")
    if step_size is not None and (
        isinstance(step_size, dict) or np.ndim(step_size) != 0
    ):
        raise ValueError(
            "NOGIN's step_size must be a positive scalar; for per-coordinate "
            f"scales set mass= (the diagonal of M). Got {step_size!r}."
        )
    _check_positive(args["friction"], "friction")
    _check_positive(args["inverse_temperature"], "inverse_temperature")
    _check_positive_tree(mass, "mass")
    if covariance not in COVARIANCES + ("auto", "per_step"):
        raise ValueError(
            f"covariance must be 'auto', 'per_step' or one of {COVARIANCES}, got "
            f"{covariance!r}."
        )
    noise_estimate = args["noise_estimate"]
    if noise_estimate not in ("auto", "same", "independent"):
        raise ValueError(
            "noise_estimate must be 'auto', 'same' or 'independent', got "
            f"{noise_estimate!r}."
        )
    if noise_estimate == "same" and covariance == "lowrank+diag":
        raise ValueError(
            "covariance='lowrank+diag' estimates the noise from rows drawn apart "
            "from the force's; noise_estimate='same' needs a per-minibatch form: "
            "covariance='lowrank', 'full' or 'diag'."
        )
    rank = args["rank"]
    if rank is not None and (
        isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1
    ):
        raise ValueError(
            "rank, the number of leading directions covariance='lowrank+diag' "
            f"keeps, must be a positive int or None (min(d, 32)); got {rank!r}."
        )
    if noise_estimate != "auto" and args["model"] is None:
        raise ValueError(
            f"noise_estimate={noise_estimate!r} chooses which minibatch the "
            "noise covariance comes from: a model's; with gradient_fn the "
            "function returns it. Leave noise_estimate='auto'."
        )
    if covariance == "auto" and args["gradient_fn"] is not None:
        raise ValueError(
            "With gradient_fn, name the form of the noise covariance your "
            f"function returns: covariance= one of {COVARIANCES}."
        )
    preconditioner = args["preconditioner"]
    if preconditioner is None:
        preconditioner = "auto" if step_size is None else "none"
    if preconditioner != "none" and not (
        np.ndim(mass) == 0 and not isinstance(mass, dict) and float(mass) == 1.0
    ):
        raise ValueError(
            "with a preconditioner (step_size=None, or preconditioner=...) the "
            "mass is the identity in the whitened coordinates u, M = H at the "
            "mode in z: leave mass=1.0, or pass preconditioner='none' with a "
            "step_size and your own mass."
        )
    names = ("friction", "mass", "inverse_temperature", "covariance", "rank")
    names += ("noise_estimate",)
    return {name: args[name] for name in names}


def _resolve(hyper, shapes, one_z, preconditioned, args):
    """The friction and temperature as numbers, the mass as one flat vector."""
    mass = flat_per_site(hyper["mass"], shapes, one_z, "mass")
    return {
        "friction": float(hyper["friction"]),
        "mass": mass,
        "inverse_temperature": float(hyper["inverse_temperature"]),
        "rank": choose_rank(mass.shape[0], hyper["rank"]),
    }


def _family_options(step_kwargs, noise_form, independent):
    """NOGIN's A-B-O-B-A as a family of the core (:class:`core.Family`): on the
    flat position (u with a preconditioner, where M = I), its force estimated
    at the half step through ``estimate_fn``; the state keeps the momentum
    ``p`` (and with ``"lowrank+diag"`` the noise's running estimate, from
    rows the estimator draws apart from the force's: no second minibatch) and
    no gradient."""
    averaged = noise_form == "lowrank+diag"
    init_kwargs = {k: step_kwargs[k] for k in ("mass", "inverse_temperature")}
    if averaged:
        init_kwargs["rank"] = step_kwargs["rank"]
    return {
        "init_kwargs": init_kwargs,
        # rank sizes the state at init; the step reads it from there.
        "step_kwargs": {
            **{k: v for k, v in step_kwargs.items() if k != "rank"},
            "covariance": noise_form,
        },
        "keeps_gradient": False,
        "independent_noise": independent and not averaged,
        "rows_first": True,
        "mean_noise_sd": partial(_nogin_mean_noise_sd, noise_form),
        "flat": True,
        "split_init_key": _three_keys,
        "in_scale": _nogin_in_scale,
        "rescale": _nogin_rescale,
        "state_of": _nogin_state_of,
        "aux_of": _nogin_aux_of,
        "checked": ("noise_damping",),
    }


def _check_probe(probe, one_z, noise_form, source):
    """A gradient_fn's noise covariance, in the form ``covariance`` names."""
    if probe.noise_cov is None:
        if source == "gradient_fn":
            raise ValueError(
                "NOGIN needs the covariance of the gradient noise: gradient_fn "
                "must return GradientEstimate(z_grad, noise_cov=...) in the form "
                f"covariance={noise_form!r} names (zeros for exact gradients)."
            )
        return
    d = ravel_pytree(one_z)[0].shape[0]
    if noise_form == "lowrank+diag":  # a factor B of one estimate, averaged
        noise_form = "lowrank"
    try:
        jax.eval_shape(
            partial(nogin_damp, covariance=noise_form),
            jax.ShapeDtypeStruct((d,), jnp.result_type(float)),
            probe.noise_cov,
            1.0,
            0.5,
        )
    except ValueError as err:
        raise ValueError(f"The gradient estimate's noise_cov: {err}") from None


# An adapted step's first move, as a fraction of the target: its damping sets
# the next (see _allowed).
_FIRST_STEP = 0.01


def _allowed(target, state):
    """The step where the noise term's damping would be 1 (it grows like h^2),
    at most the target; the first move a hundredth of the target. Going back to
    the target wherever the damping was below 1, and making the first move at
    it, swung the step between the target and the damped step, and on a
    79,510-weight network the target's moves (damping 7.5 at the first, 10^5
    later) threw the chain off its fit within warmup."""
    target = jnp.asarray(target, jnp.result_type(float))
    if state.step_size is None:  # the first move, before any noise is known
        return target * _FIRST_STEP
    damping = state.noise_damping
    allowed = jnp.where(damping > 0.0, state.step_size / jnp.sqrt(damping), jnp.inf)
    return jnp.minimum(target, allowed).astype(target.dtype)


# ---------------------------------------------------------- the run checks
def _start_record(state, shape):
    """Where the run checks are made after the run: the stall check's and the
    noise check's records in the initial state."""
    if monitoring.mode() != monitoring.switch.AFTER:
        return state
    dtype = jnp.result_type(state.noise_damping)
    return state._replace(
        stall_damping=jnp.full(jnp.shape(state.i), jnp.nan, dtype),
        sampling_damping=jnp.zeros(jnp.shape(state.i), dtype),
    )


def _record(kept, state, new_state, shape, warn):
    """After a sample: ``noise_damping`` where the chain crossed the stall
    check's iteration, and the running mean over the sampling draws; under
    :func:`~numpyro_sgbd.monitoring.per_step`, the stall check itself."""
    stall, mean = kept["stall_damping"], kept["sampling_damping"]
    check_at = max(shape.num_warmup, _STALL_CHECK_ITERATION)
    crossed = (state.i < check_at) & (new_state.i >= check_at)
    if monitoring.mode() != monitoring.switch.PER_STEP:
        if stall is not None and monitoring.enabled():
            stall = jnp.where(crossed, new_state.noise_damping, stall)
            # The running mean over the samples after warmup.
            t = (new_state.i - shape.num_warmup) // shape.num_steps
            step = (new_state.noise_damping - mean) / jnp.maximum(t, 1)
            mean = jnp.where(t >= 1, mean + step, mean).astype(mean.dtype)
        return new_state._replace(stall_damping=stall, sampling_damping=mean)
    stalled = jnp.any(crossed & (new_state.noise_damping > _STALL_DAMPING))
    return new_state._replace(
        stall_damping=stall,
        i=monitoring.call_host(
            stalled, partial(warn, "stall"), new_state.i, new_state.noise_damping
        ),
    )


def _recorded(state, take, shape, warn):
    """The stall check after the run: ``stall_damping`` above 1 in some chain
    warns, at the iteration the live check would; and the noise check:
    ``sampling_damping`` above :data:`_NOISE_BIAS_DAMPING` in some chain warns
    at the run's end, where the stall check did not and the covariance comes
    from the force's own minibatch."""
    found = []
    k = shape.num_steps
    damping = take(state.stall_damping)
    if damping is not None and np.any(damping > _STALL_DAMPING):
        at = k * -(-max(shape.num_warmup, _STALL_CHECK_ITERATION) // k)
        found.append((at, "stall", partial(warn, "stall", at, np.nanmax(damping))))
    mean = take(state.sampling_damping)
    # A stalled run says more already; under monitoring.per_step the field is
    # not kept, and this check is not made; a gradient_fn's covariance need
    # not be estimated from its force's own draws.
    own = shape.has_model and not shape.independent_noise
    noisy = mean is not None and np.any(mean > _NOISE_BIAS_DAMPING)
    if not found and own and noisy:
        at = int(np.max(take(state.i)))
        found.append((at, "noise", partial(warn, "noise", float(np.max(mean)))))
    return found


def _warn_noise(shape, damping):
    gradient = "plain minibatches" if shape.gradient == "minibatch" else None
    why = f" (the gradient is estimated on {gradient})" if gradient else ""
    warnings.warn(
        f"NOGIN: the O-step damped the momentum by {damping:.2g} on average "
        f"over the sampling draws{why}. It damps by each minibatch's own "
        "estimate of the gradient noise, which moves with the force's own "
        "error where the per-datum gradients are skewed: at this noise level "
        "the means can be off by a posterior sd or more (benchmarks/"
        "local_sites.py). Pass noise_estimate='independent' (the covariance "
        "from a second minibatch), a larger subsample_size (the noise "
        "variance falls like 1/n), or use SGLD.",
        RuntimeWarning,
        stacklevel=2,
    )


NOGIN_SPEC = SamplerSpec(
    name="NOGIN",
    init=nogin_init,
    step=_nogin_family_step,
    state_type=NOGINState,
    hyperparameters={
        "friction": 1.0,
        "mass": 1.0,
        "inverse_temperature": 1.0,
        "covariance": "auto",
        "noise_estimate": "auto",
        "rank": None,
    },
    not_taken=("variant", "beta", "init_noise_sd"),
    check=_check_nogin,
    variants=("vanilla",),
    init_args=("mass", "inverse_temperature"),
    # Exact for a Gaussian target with Gaussian noise whatever h < 2 in units of
    # the posterior sd (Matthews & Weare, Lemma 4.2); 0.5 in u keeps the
    # second-order bias of non-Gaussian targets (their Theorem 4.1) small. The
    # noise term's damping grows like h^2: the step is kept where it is <= 1
    # (Section 4.3: beyond it the momentum is cancelled every step).
    step_target=0.5,
    # The integrator samples a Gaussian's variances without a measurable bias:
    # var - 1 = -0.002 +- 0.001 h on N(0, I) with exact gradients; median bulk
    # ESS 0.42 h per step (benchmarks/bias_laws.py). The run's error estimate
    # is then its Monte Carlo error.
    bias_laws={"vanilla": BiasLaw(0.0, 0.0, 1, 0.415, 1.0)},
    resolve=_resolve,
    noise_form=noise_form,
    check_probe=_check_probe,
    family_options=_family_options,
    allowed=_allowed,
    run_checks=RunChecks(
        fields=("stall_damping", "sampling_damping"),
        start=_start_record,
        after=_record,
        recorded=_recorded,
        warnings={"stall": _warn_stall, "noise": _warn_noise},
    ),
)


class NOGIN(SGKernel):
    r"""NOGIN, the noisy gradient integrator (Matthews & Weare).

    Underdamped Langevin dynamics in (z, p), integrated by A-B-O-B-A steps whose
    O-step damps the momentum by the covariance :math:`\Sigma` of the minibatch force
    :math:`\tilde F = -\nabla\hat U` (Algorithm 2). With
    :math:`\lambda = \sqrt{(1-e^{-\gamma h})/(1+e^{-\gamma h})}` and one draw
    :math:`R\sim N(0, M/\beta)` per step:

    .. math::

        z &\leftarrow z + \tfrac h2 M^{-1}p, \qquad
        p \leftarrow p + \tfrac h2\tilde F(z) + \lambda R, \\
        p &\leftarrow \Big((1-\lambda^2)I - \tfrac{\beta h^2}{4}\Sigma M^{-1}\Big)
            \Big((1+\lambda^2)I + \tfrac{\beta h^2}{4}\Sigma M^{-1}\Big)^{-1}p, \\
        p &\leftarrow p + \tfrac h2\tilde F(z) + \lambda R, \qquad
        z \leftarrow z + \tfrac h2 M^{-1}p.

    The O-step damps by :math:`\beta\Sigma M^{-1}`, not the paper's
    :math:`M\Sigma/\beta`, which is exact only for :math:`M = I`, :math:`\beta = 1`
    (see :func:`~numpyro_sgbd.updates.nogin_damp`).
    For a Gaussian target with Gaussian gradient noise the z-marginal is exact at any
    stable step (:math:`h^2 < 4\rho(\Omega)` in the scale M sets; Lemma 4.2); for
    smooth targets the bias is :math:`O(h^2)` (Theorem 4.1), where SGLD's is
    :math:`O(h)` plus the gradient noise's share.

    By default :math:`\Sigma` is a running estimate
    (``covariance="lowrank+diag"``): every step adds
    :math:`BB^\top`, B = :math:`\sqrt{c/(m-1)}(G_m-\bar G_m)^\top` from the
    per-datum gradients :math:`G_m` of m = 8 rows drawn apart from the force's
    minibatch (c for the force's n), to a moving average over about 500 steps,
    kept as its exact diagonal plus its ``rank`` leading directions
    (:func:`~numpyro_sgbd.updates.noise_average_update`); the O-step solves by
    the Woodbury identity. A step costs a minibatch gradient, 8 per-datum ones
    and :math:`O(d(r+8)^2)`: no d x d matrix, where the other forms estimate
    :math:`\Sigma` afresh from a whole minibatch's per-datum gradients each
    step and factor it, as the d x n factor :math:`C = \sqrt{c/(n-1)}(G-\bar
    G)^\top` (``"lowrank"``, by the Woodbury identity), the d x d matrix
    (``"full"``) or its diagonal (``"diag"``, an approximation)
    (:func:`~numpyro_sgbd.samplers.choose_covariance`,
    :func:`~numpyro_sgbd.samplers.per_step_covariance`). ``noise_damping`` in the
    state is :math:`\frac{\beta h^2}{4}\rho(\Sigma M^{-1})`: the
    autocorrelation time is about :math:`(4/h^2)(1 + \text{noise\_damping})`
    steps (Section 4.3), and the kernel warns once when it exceeds 1 at
    iteration ``max(num_warmup, 100)``. The guide's NOGIN section
    (``docs/usage.rst``) says how to choose the mass, the form and the start.

    :param model: a NumPyro model with its data in
        ``numpyro.plate(name, N, subsample_size=n)``, as for :class:`SGBD`; the
        noise covariance needs a single subsample plate. A model without one runs
        full batch with :math:`\Sigma = 0`.
    :param potential_fn: instead of a model, a potential :math:`U(z)`: exact
        gradients, :math:`\Sigma = 0`. Needs ``init_params``.
    :param gradient_fn: instead of a model, ``gradient_fn(rng_key, z)`` returning a
        :class:`~numpyro_sgbd.GradientEstimate` with ``noise_cov`` in the form
        ``covariance`` names (over z raveled by
        :func:`~jax.flatten_util.ravel_pytree`). Needs ``init_params``.
    :param float step_size: h, a positive scalar (precondition with ``mass``).
        Default ``None``: adapted in warmup in the whitened coordinates u of the
        full-data Hessian H at the mode, where the mass is the identity (M = H in
        z; dense where the preconditioner is): target 0.5, lowered while
        ``noise_damping`` exceeds 1, fixed from the end of warmup (see
        :ref:`adaptation`). Needs a model and ``mass=1.0``.
    :param str preconditioner: as for :class:`SGBD`.
    :param bool adapt_mass_matrix: as for :class:`SGBD` (the mass in u becomes
        ``1 / s**2``), but off by default and with s at most 1: the windows may
        shorten the steps where the posterior is narrower than L says, never
        lengthen them past what the curvature at the mode allows (unadjusted
        Langevin rules are unstable beyond it).
    :param float friction: :math:`\gamma > 0`. Default 1.
    :param mass: the diagonal of M: a positive scalar, an array broadcastable to z,
        or a dict ``{site: value}`` broadcastable to each site's unconstrained shape.
    :param float inverse_temperature: :math:`\beta > 0` (Algorithm 2); the chain
        targets :math:`\pi^\beta`. Default 1.
    :param str covariance: ``"auto"`` (default: ``"lowrank+diag"`` with
        gradient noise, ``"diag"`` without; with ``noise_estimate="same"``
        :func:`~numpyro_sgbd.samplers.per_step_covariance`'s choice),
        ``"per_step"`` (that choice; ``tune`` uses it: its arms of traced
        subsample sizes estimate the noise from each arm's own rows),
        ``"lowrank+diag"``, ``"lowrank"``, ``"full"`` or ``"diag"``. With
        ``gradient_fn`` name the form it returns (for ``"lowrank+diag"``, a
        factor B, shape ``(d, m)``, of an estimate drawn apart from the
        force's noise, which the kernel averages).
    :param int rank: the leading directions ``"lowrank+diag"`` keeps (default
        ``None``: ``min(d, 32)``, exact where d <= 32).
    :param str noise_estimate: for the per-minibatch forms, where
        :math:`\Sigma` is estimated from:
        ``"same"``, the force's own minibatch; ``"independent"``, a second
        minibatch drawn independently (twice the per-datum gradients a step);
        ``"auto"`` (default), independent on plain minibatches, the same with
        control variates. The O-step damps by :math:`\Sigma`; estimated from the
        force's own rows it moves with the force's error where the per-datum
        gradients are skewed (a large error, a large estimate: the first
        half-kick damped, the second not), and the means drift: on plain
        minibatches 0.24-1.08 posterior sds on ``benchmarks/local_sites.py``'s
        models, 0.04-0.23 with ``"independent"``. A run that damps by more than
        0.1 on average with ``"same"`` warns ("noise"). ``"lowrank+diag"``
        always reads rows apart from the force's (``"same"`` is refused). A
        model only.
    :param bool replace: draw minibatch indices with replacement (as :class:`SGBD`).
    :param init_strategy: a NumPyro init strategy (default ``init_to_uniform``).
    :param int log_likelihood_size: as for :class:`SGBD`.
    :param str gradient: ``"minibatch"`` or ``"control_variates"``, as for
        :class:`SGBD` (with control variates, :math:`\Sigma` comes from the
        per-datum differences).
    :param dict centre: as for :class:`SGBD`.
    :param int chunk_size: as for :class:`SGBD`.
    :param int num_steps: as for :class:`SGBD`.
    :param int recentre_every: as for :class:`SGBD`.

    **References**

    1. Matthews, C. & Weare, J. (2018). *Langevin Markov chain Monte Carlo with
       stochastic gradients.* Algorithms 1-2, eq. (4), Lemma 4.2, Theorem 4.1,
       Section 4.3.

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sgbd import GradientEstimate
    >>> def gradient_fn(rng_key, z):  # N(0, 1) target, force noise of variance 1
    ...     noise = jax.random.normal(rng_key, z.shape)
    ...     return GradientEstimate(z + noise, noise_cov=jnp.ones(z.shape))
    >>> kernel = NOGIN(gradient_fn=gradient_fn, step_size=1.5, covariance="diag")
    >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=4000, num_chains=8,
    ...             chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.zeros((8, 1)))
    >>> bool(abs(mcmc.get_samples().var() - 1.0) < 0.1)  # SGLD: about 3.6
    True
    """

    spec = NOGIN_SPEC
