"""The unadjusted rules' discretisation bias, the default sampling step that
serves a run's length, and a run's own error estimate (the user guide's "How
exact is a run"; measurements in ``benchmarks/results.md``, "Issue 60").

An unadjusted rule does not sample the posterior: at a step h in the whitened
coordinates u, where a well-set-up posterior is close to N(0, I), its
stationary variances are about ``1 + (c + b tau^2) h^p``, with tau the gradient
noise's sd in u (:class:`BiasLaw`, measured by ``benchmarks/bias_laws.py``:
Barker's rule, SGBD paper Algorithm 2, and Langevin's are second order, p = 2;
SGHMC's and SGNHT's Euler-type updates, recipe paper eq. 9 and Ding et al. 2014
Algorithm 2, first order). The sds come out about ``(c + b tau^2) h^p / 2``
too wide, whatever the run's length. The Monte Carlo error does shrink with the
run: at a bulk ESS of ``a h^q`` per step, N steps estimate an sd with a relative
error of about ``1 / sqrt(2 a N h^q)`` (the independent-draws formula with the
bulk ESS, as :func:`~numpyro_sgbd.compare`'s Monte Carlo floor takes it).

So a run of N steps samples at the step where the predicted bias is half the
predicted Monte Carlo error (:func:`run_step`), or at warmup's step where that
is smaller: a run five times longer samples at a step about ``5^(-1/6)`` as
large (p = 2, q = 2) and its error keeps falling, which a fixed fraction of
warmup's step cannot give (the bias of a fixed step is a floor the run never
passes). After the run, :func:`estimate` puts the law's bias at the step the run
sampled at beside the Monte Carlo error of the run's own sds: the ``estimated
xi`` that needs no reference. That error comes from the ESS of the squared
deviations (:func:`~numpyro_sgbd.monitoring.convergence.sd_error`), about twice the bulk
ESS in a diffusive chain, so a default run reports its bias at about 0.7 of its
Monte Carlo error, not half.

Every function takes JAX or NumPy scalars (:func:`run_step` runs inside the
step, at the end of warmup, with the run's noise sd traced).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "BiasLaw",
    "NoiseParts",
    "estimate",
    "mc_sd_error",
    "noise_sq",
    "run_step",
    "sampling_step",
    "sd_bias",
]

#: The predicted bias of the default sampling step as a fraction of the
#: predicted Monte Carlo error (issue 60: "at most about half").
BIAS_SHARE = 0.5


class BiasLaw(NamedTuple):
    """A rule's stationary variance on N(0, I) at step h in u with gradient
    noise of sd tau, ``1 + (c + b tau^2) h^order``, and its bulk ESS per step,
    ``ess_rate h^ess_order`` (the median over coordinates). Measured by
    ``benchmarks/bias_laws.py`` (results in ``benchmarks/results.md``).

    :ivar float c: the coefficient with exact gradients (its magnitude: SGNHT's
        sds come out narrow).
    :ivar float b: the gradient noise's share, per unit of (tau h)^order.
    :ivar int order: p, 2 for Barker and Langevin, 1 for SGHMC and SGNHT.
    :ivar float ess_rate: a in the bulk ESS per step a h^q.
    :ivar float ess_order: q.
    """

    c: float
    b: float
    order: int
    ess_rate: float
    ess_order: float


def sd_bias(law, step, tau2=0.0):
    """The predicted relative error of the sds at ``step`` in u, with the mean
    squared gradient noise sd ``tau2`` in u: ``(|c| + b tau^2) h^p / 2``."""
    return 0.5 * (abs(law.c) + law.b * tau2) * step**law.order


def mc_sd_error(ess):
    """The relative Monte Carlo error of an sd estimated from draws of bulk ESS
    ``ess``, ``1 / sqrt(2 ess)``."""
    return 1.0 / np.sqrt(2.0 * np.asarray(ess, float))


def run_step(law, tau2, num_steps, share=BIAS_SHARE):
    """The step in u whose predicted sd bias (:func:`sd_bias`) is ``share`` of
    the Monte Carlo error of ``num_steps`` steps at that step: ``C h^p = share
    / sqrt(2 a N h^q)``, so ``h = (share / (C sqrt(2 a N)))^(1 / (p + q / 2))``
    with ``C = (|c| + b tau^2) / 2``. ``tau2`` may be traced."""
    coef = 0.5 * (abs(law.c) + law.b * tau2)
    scale = coef * jnp.sqrt(2.0 * law.ess_rate * num_steps)
    return (share / scale) ** (1.0 / (law.order + law.ess_order / 2.0))


class NoiseParts(NamedTuple):
    """The fields :func:`noise_sq` reads, for a state's fields taken apart."""

    noise_sd: Any
    scale: Any


def noise_sq(state):
    """The mean over coordinates of the squared gradient noise sd where the
    step acts (in v = u / s with re-estimated scales), 0 where the state keeps
    none (exact gradients)."""
    noise_sd = getattr(state, "noise_sd", None)
    if noise_sd is None:
        return jnp.zeros((), jnp.result_type(float))
    if state.scale is not None:
        noise_sd = noise_sd * state.scale.scale
    leaves = jax.tree.leaves(noise_sd)
    total = sum(jnp.sum(jnp.square(x)) for x in leaves)
    return total / sum(jnp.size(x) for x in leaves)


def sampling_step(law, num_steps, state, step):
    """The sampling step of a run of ``num_steps`` steps, in the step (traced,
    at the end of warmup): the smaller of warmup's ``step`` and the step whose
    predicted sd bias is half the run's predicted Monte Carlo error, at the
    state's own gradient noise (:func:`run_step`, :func:`noise_sq`)."""
    planned = run_step(law, noise_sq(state), num_steps)
    return jnp.minimum(step, planned.astype(step.dtype))


def estimate(law, step, tau2, mc_errors, weights=None):
    """A run's own error in its sds, without a reference: the law's bias at the
    step it sampled at beside the Monte Carlo errors ``mc_errors`` of the sds
    (relative, per coordinate,
    :func:`~numpyro_sgbd.monitoring.convergence.sd_error`), as a dict:

    - ``sd_bias``: the predicted relative bias of the sds, :func:`sd_bias`;
    - ``mc_error``: the Monte Carlo errors' root mean square, weighted by
      ``weights`` (the coordinates' variances, as xi weights them; default
      equal);
    - ``xi``: the expected relative error of the sds against the posterior's,
      ``sqrt(sd_bias^2 + mc_error^2)`` (what ``compare``'s xi measures against
      an exact reference; with one coordinate far wider than the others xi is
      that coordinate's error alone, and varies from run to run as it does);
    - ``step_for_mc``: the step at which the bias would be half this Monte
      Carlo error (what to pass as ``step_size`` to make the bias a small part
      of the error).
    """
    mc_errors = np.asarray(mc_errors, float).ravel()
    weights = np.ones_like(mc_errors) if weights is None else np.ravel(weights)
    ok = np.isfinite(mc_errors) & np.isfinite(weights) & (weights > 0)
    bias = float(sd_bias(law, float(step), float(tau2)))
    if ok.any():
        share = weights[ok] / weights[ok].sum()
        mc = float(np.sqrt(np.sum(share * mc_errors[ok] ** 2)))
    else:
        mc = np.nan
    coef = 0.5 * (abs(law.c) + law.b * float(tau2))
    step_for = (BIAS_SHARE * mc / coef) ** (1.0 / law.order) if coef > 0 else np.inf
    return {
        "sd_bias": bias,
        "mc_error": mc,
        "xi": float(np.hypot(bias, mc)),
        "step_for_mc": float(step_for),
    }
