"""The run checks after the run (the default; see :mod:`numpyro_sgbd.monitoring`):
the host reads a run's final state, whose record holds what the checks need,
and makes the non-finite, step, drift, sampler (NOGIN's stall) and convergence
checks there, with the warnings the live notes of
:func:`~numpyro_sgbd.monitoring.per_step` give.

What the final state holds for them: ``num_nonfinite`` and ``i`` (a stopped
chain counts every later refused step, so its first refusal was at iteration
``i - num_nonfinite + 1``); ``step_size`` and ``scale``, fixed from the end of
warmup; ``trace``, the convergence check's evenly spaced draws, on which the
drift check replays the live notes' schedule
(:func:`~numpyro_sgbd.monitoring.notes.drift_schedule`) over the checked
coordinates; and a sampler's own fields (NOGIN's ``stall_damping``).

Where they run: :func:`on_progress` when NumPyro's progress bar hands the run's
last sample to the kernel (one chain, or each of sequential chains), and
:func:`check` for any ``MCMC`` run, which :func:`~numpyro_sgbd.compare` and
:func:`~numpyro_sgbd.from_numpyro` call. :func:`check_run` is idempotent: the
chains it has read are kept by their final iteration and key, and a chain read
again warns no more.
"""

from functools import partial
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import advice, discretisation
from numpyro_sgbd.monitoring import convergence
from numpyro_sgbd.monitoring.notes import (
    _DRIFT_MIN_POINTS,
    _warn_nonfinite,
    drift_schedule,
    smallest_step,
)
from numpyro_sgbd.monitoring.run import Monitored, _on_run_end
from numpyro_sgbd.monitoring.switch import AFTER

__all__ = ["check", "check_run", "on_progress"]

# With the progress bar the host reads the state's iteration (a device sync)
# every this many samples, and at the sample it expects to end the run.
_BAR_READ_EVERY = 100


def check(mcmc):
    """Make the run checks of an ``MCMC`` run of one of this package's kernels
    on the host, from its final state (``mcmc.last_state``, chains leading where
    it ran several), and return the convergence check's numbers (as
    ``kernel.convergence``), or ``None``.

    By default the compiled step calls no host function, so NumPyro's compiled
    loop has no host callback in it (JAX's persistent compilation cache keeps
    it, and the progress bar costs nothing extra): the checks read what the
    state records after the run. With NumPyro's progress bar on and one chain,
    or sequential chains, the kernel checks by itself at the last sample; with
    the bar off, vectorized or parallel chains, NumPyro does not return to
    Python before ``run`` returns, so call this (or
    :func:`~numpyro_sgbd.compare` or :func:`~numpyro_sgbd.from_numpyro`, which
    do). It warns as the checks do during the run (a ``RuntimeWarning`` when a
    chain stopped on a non-finite value, a ``UserWarning`` when the gradient
    noise held the adapted step down, a ``RuntimeWarning`` when the draws still
    drift, NOGIN's ``UserWarning`` when its noise damping stalls it, a
    :class:`~numpyro_sgbd.monitoring.ConvergenceWarning`), records their kinds in
    ``kernel.run_warnings``, and warns once per run however often it is called.
    After a run under :func:`~numpyro_sgbd.monitoring.per_step` (checked as it
    went) or :func:`~numpyro_sgbd.monitoring.off` it warns of nothing.

    :param mcmc: a :class:`~numpyro.infer.MCMC` that has run a kernel of this
        package.
    :return: the dict of :func:`~numpyro_sgbd.monitoring.report`, or ``None``
        (a run too short to check, or one without the checks).
    :raises TypeError: for another sampler (NUTS, ...).
    :raises ValueError: for an ``MCMC`` that has not run.

    >>> import jax, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sgbd import SGLD
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = 1.0 + jax.random.normal(jax.random.key(0), (200,))
    >>> mcmc = MCMC(SGLD(model, step_size=0.02), num_warmup=200, num_samples=2000,
    ...             num_chains=2, chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.key(1), y)
    >>> found = check(mcmc)
    >>> found["num_chains"], found["converged"], mcmc.sampler.run_warnings
    (2, True, ())
    """
    kernel = getattr(mcmc, "sampler", None)
    if not isinstance(kernel, Monitored):
        raise TypeError(
            "numpyro_sgbd.check reads the run checks of numpyro_sgbd's kernels "
            f"(SGBD, SGLD, NOGIN, ...); this MCMC runs {type(kernel).__name__}."
        )
    state = getattr(mcmc, "_last_state", None)
    if state is None:
        raise ValueError(
            "numpyro_sgbd.check needs an MCMC that has run: call mcmc.run(...) first."
        )
    return check_run(kernel, state)


def check_run(kernel, state):
    """The run checks on the host (see :func:`check`) for ``kernel``'s run that
    ended at ``state`` (one chain's, or several with the chains leading):
    warnings in the order the live notes give them, each kind once per run,
    and the convergence check once every chain of the run is in. Returns
    ``kernel.convergence``."""
    monitor = kernel.monitor
    if monitor.mode != AFTER:  # checked as it went, or not at all
        return monitor.convergence
    prints = _fingerprints(state)
    new = [c for c, p in enumerate(prints) if p not in monitor.checked]
    if not new:
        return monitor.convergence
    monitor.checked.update(prints[c] for c in new)
    take = partial(_chains, len(prints), np.shape(state.i), new)
    i = take(state.i)
    i_end, k = int(np.max(i)), kernel.num_steps
    num_warmup = kernel.run_shape().num_warmup
    found = [*_nonfinite(kernel, i, take(state.num_nonfinite))]
    if i_end > num_warmup:
        scale = None if state.scale is None else state.scale.scale
        step = smallest_step((len(new),), take(state.step_size), take(scale))
        check_step = partial(monitor.check_step, kernel, step)
        found.append((num_warmup + k, "step", check_step))
    found += kernel.recorded_checks(state, take)
    trace_plan = monitor.trace_plan
    rows = None if state.trace is None else take(state.trace.rows)
    ended = trace_plan is not None and rows is not None
    ended = ended and (i_end - num_warmup) // k == trace_plan.num_samples
    ended = ended and rows.shape[1:] == (trace_plan.rows, trace_plan.width)
    if ended:
        found += _drift(kernel, rows, i_end - num_warmup)
    for _, kind, run_check in sorted(found, key=lambda event: event[0]):
        if kind not in monitor.run_warnings:
            run_check()
    if ended:
        _on_run_end(kernel, rows)
        _error_estimate(kernel, state, take)
    return monitor.convergence


def on_progress(kernel, state):
    """What the kernel does when NumPyro's progress bar hands it a sample
    (``get_diagnostics_str``, after every sample of one chain and of each of
    sequential chains): where the step checks after the run, note the clock
    for :func:`~numpyro_sgbd.monitoring.wall_time` every
    ``_BAR_READ_EVERY`` samples and :func:`check_run` at the run's last sample.

    Reading the state waits for the device, so it is read only at the first
    sample of a loop, every ``_BAR_READ_EVERY`` samples after and at the one
    that should end the run (from the last reading: ``num_steps`` iterations a
    sample), where its iteration says whether it does."""
    monitor = kernel.monitor
    if monitor.mode != AFTER or monitor.num_samples is None:
        return
    monitor.bar_calls += 1
    if monitor.bar_calls < monitor.bar_next_read:
        return
    i = int(np.max(np.asarray(state.i)))
    monitor.tick(i)
    k = kernel.num_steps
    i_end = kernel.run_shape().num_warmup + monitor.num_samples * k
    if i == i_end:
        check_run(kernel, state)
    ahead = (i_end - i) // k if i < i_end else _BAR_READ_EVERY
    monitor.bar_next_read = monitor.bar_calls + max(1, min(ahead, _BAR_READ_EVERY))


def _fingerprints(state):
    """Each chain's ``(i, key bytes)``: the final state of a chain's run."""
    i = np.asarray(state.i).reshape(-1)
    key = state.rng_key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    key = np.asarray(key).reshape(i.shape[0], -1)
    return [(int(i[c]), key[c].tobytes()) for c in range(i.shape[0])]


def _chains(num_chains, batch_shape, chains, value):
    """``value``, a field of the state (chains leading as ``batch_shape``
    says), on the host for the chains ``chains`` only (``None`` stays)."""
    if value is None:
        return None
    value = np.asarray(value)
    flat = value.reshape((num_chains,) + value.shape[len(batch_shape) :])
    return flat[chains]


def _nonfinite(kernel, i, num_nonfinite):
    """The non-finite check: where a chain stopped, at the end of the sample in
    which the first did (where the live notes warn)."""
    stopped = num_nonfinite > 0
    if not stopped.any():
        return []
    k = kernel.num_steps
    first = int(np.min((i - num_nonfinite + 1)[stopped]))
    at = k * -(-first // k)
    monitor = kernel.monitor

    def warn():
        monitor.record_warning("nonfinite")
        _warn_nonfinite(at, advice.nonfinite_remedies(advice.run_facts(kernel)))

    return [(at, "nonfinite", warn)]


def _drift(kernel, rows, t_end):
    """The drift check's first finding over the record ``rows`` (``(chains,
    rows, coords)``) of ``t_end`` sampling steps, as ``[(iteration, "drift",
    check)]``, or ``[]``: the live notes' checks replayed on the rows nearest
    the draws they keep (the same rows where the record keeps every sample's)."""
    from numpyro_sgbd.evaluation.drift import drift

    monitor, k = kernel.monitor, kernel.num_steps
    trace_plan = monitor.trace_plan
    rows, ids = trace_plan.checked(rows)
    for t, points, every in drift_schedule(t_end, k):
        # Row r holds the draw of sample (r + 1) * trace_plan.every.
        slots = np.unique([t_point // k // trace_plan.every - 1 for t_point in points])
        slots = slots[(slots >= 0) & (slots < trace_plan.rows)]
        if len(slots) < _DRIFT_MIN_POINTS:
            continue
        blocks = list(np.swapaxes(rows[:, slots], 0, 1))
        if drift(np.concatenate(blocks)) is None:
            continue
        i = kernel.run_shape().num_warmup + t
        check_drift = partial(monitor.check_drift, kernel, i, blocks, every, ids)
        return [(i, "drift", check_drift)]
    return []


def _sampling_step(kernel, state, take):
    """Each checked chain's sampling step (in u with a preconditioner): the
    state's, or the given scalar step; ``None`` for a step per site."""
    if state.step_size is not None:
        return np.asarray(take(state.step_size), float).reshape(-1)
    given = kernel.run_shape().fixed_step
    if given is None or isinstance(given, dict) or np.ndim(given):
        return None
    return np.full(1, float(given))


def _noise_sq(state, take):
    """Each checked chain's mean squared gradient noise sd where its step acts
    (:func:`~numpyro_sgbd.discretisation.noise_sq`)."""
    parts = (getattr(state, "noise_sd", None), state.scale)
    if parts[0] is None:
        return np.zeros(1)
    chains = jax.tree.map(take, parts)
    return np.asarray(
        jax.vmap(discretisation.noise_sq)(discretisation.NoiseParts(*chains))
    )


def _error_estimate(kernel, state, take):
    """The run's own error estimate once every chain of the run is in
    (:func:`~numpyro_sgbd.discretisation.estimate`: the rule's bias law at the step
    it sampled at, beside the Monte Carlo error of the checked coordinates' sds in
    the record, weighted by their variances as xi weights them), kept as
    ``kernel.error_estimate``; a warning when the predicted bias exceeds the Monte
    Carlo error (nothing where a chain stopped at a non-finite value: its own
    warning says more). The record keeps at most ``TRACE_ROWS`` draws a chain: where
    a coordinate's squared deviations reach an ESS near that many, the chain mixes
    faster than the record resolves, and its error is taken from the law's ESS at
    the run's length (a h^q per step, twice that for the squares of a diffusive
    chain) where that is smaller."""
    monitor, law = kernel.monitor, kernel.bias_law()
    found = monitor.convergence
    check_pool = monitor.check
    if law is None or found is None or check_pool is None or check_pool.pending:
        return
    if np.any(take(state.num_nonfinite) > 0):  # a stopped chain: said already
        return
    step = _sampling_step(kernel, state, take)
    rows = check_pool.draws
    if step is None or rows is None:
        return
    tau2 = float(np.mean(_noise_sq(state, take)))
    h = float(np.max(step))
    errors, ess = convergence.sd_error(rows)
    steps = monitor.trace_plan.num_samples * kernel.num_steps * rows.shape[0]
    by_law = 1.0 / np.sqrt(4.0 * law.ess_rate * steps * h**law.ess_order)
    capped = ess >= 0.5 * rows.shape[0] * rows.shape[1]
    errors = np.where(capped, np.minimum(errors, by_law), errors)
    weights = rows.reshape(-1, rows.shape[-1]).var(axis=0)
    found_now = discretisation.estimate(law, h, tau2, errors, weights)
    monitor.error_estimate = {"step": h, "noise_sq": tau2, "law": law, **found_now}
    if found_now["sd_bias"] <= found_now["mc_error"]:
        return
    monitor.record_warning("bias")
    warnings.warn(
        f"{type(kernel).__name__} sampled at a step of {h:.3g} in the whitened "
        f"coordinates, where its rule's bias law predicts sds "
        f"{100 * found_now['sd_bias']:.1f} % wide: more than the run's Monte "
        f"Carlo error of {100 * found_now['mc_error']:.1f} %, so the sds are off "
        "by more than the draws can tell (estimated xi "
        f"{found_now['xi']:.3f}). Pass step_size="
        f"{found_now['step_for_mc']:.2g} (the bias then half the Monte Carlo "
        "error), leave step_size=None, or use NOGIN, whose rule has no "
        "measurable bias on a Gaussian.",
        RuntimeWarning,
        stacklevel=2,
    )
