"""The run checks as a kernel's ``init`` and ``sample`` wire them in: the
convergence record given to the state, what each sample adds to it and, under
:func:`~numpyro_sgbd.monitoring.per_step`, the host calls after each sample
(the notes of :class:`~numpyro_sgbd.monitoring.notes.Monitor` and, when the run
ends, the convergence check with its warning), and the check of data that
NumPyro would compile into its loop as constants. The checks after the run are
in :mod:`~numpyro_sgbd.monitoring.checks`.

Each function takes the kernel whose :class:`Monitor` (``kernel.monitor``)
holds the record of its runs: the warnings given, the convergence check's pool
of chains and its result.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import advice
from numpyro_sgbd.monitoring.convergence import rhat_text
from numpyro_sgbd.monitoring.notes import call_host, clock_due
from numpyro_sgbd.monitoring.predictive import probe_fn, probe_rows
from numpyro_sgbd.monitoring.switch import PER_STEP, enabled, mode
from numpyro_sgbd.monitoring.trace import (
    MAX_RHAT,
    MIN_ESS,
    ConvergenceCheck,
    ConvergenceWarning,
    driving_mcmc,
    empty_trace,
    plan,
    record,
    run_ends,
)

__all__ = [
    "CONSTANT_DATA_WARN_BYTES",
    "Monitored",
    "after_sample",
    "check_closed_over",
    "start_trace",
]

#: Data larger than this, compiled into NumPyro's sampling loop as constants
#: (``jit_model_args=False``), draw a warning naming ``jit_model_args=True``.
CONSTANT_DATA_WARN_BYTES = 64 * 2**20


class Monitored:
    """What a kernel's run checks found, on the kernel: a base of the kernel
    class, whose :class:`~numpyro_sgbd.monitoring.notes.Monitor` is
    ``_monitor``."""

    @property
    def monitor(self):
        """The host side of the run checks
        (:class:`~numpyro_sgbd.monitoring.notes.Monitor`)."""
        return self._monitor

    @property
    def run_warnings(self):
        """The kinds of warning the last run gave (``"nonfinite"``, ``"step"``,
        ``"drift"``, ``"stall"``, ``"noise"``, ``"convergence"``, ``"bias"``),
        in order."""
        return self._monitor.run_warnings

    @run_warnings.setter
    def run_warnings(self, kinds):
        self._monitor.run_warnings = tuple(kinds)

    @property
    def error_estimate(self):
        """After an ``MCMC`` run and its check, where the rule has a bias law
        (:meth:`bias_law`): the run's own error in its sds, without a reference,
        as a dict: ``step`` (the sampling step, in u with a preconditioner),
        ``noise_sq`` (the mean squared gradient noise sd there), ``law``,
        ``sd_bias`` (the law's predicted relative bias of the sds), ``mc_error``
        (their relative Monte Carlo error, from the ESS of the squared
        deviations in the run's record of draws,
        :func:`~numpyro_sgbd.monitoring.convergence.sd_error`), ``xi`` (the expected
        relative error of the sds, both together:
        :func:`~numpyro_sgbd.compare`'s xi without a reference) and
        ``step_for_mc`` (the step whose bias would be half that Monte Carlo
        error). See :mod:`numpyro_sgbd.discretisation`. ``None`` before a run or
        without a law."""
        return self._monitor.error_estimate

    @property
    def convergence(self):
        """After an ``MCMC`` run and its check (at the bar's last sample, by
        :func:`~numpyro_sgbd.check`, or live under
        :func:`~numpyro_sgbd.monitoring.per_step`): the convergence check's
        numbers (see :func:`~numpyro_sgbd.monitoring.report`), or ``None``."""
        return self._monitor.convergence


def _global_coords(one_z, local):
    """The flat indices (``ravel_pytree`` order) of ``one_z``'s sites other
    than the ``local`` ones; none without local sites."""
    if not local or not isinstance(one_z, dict):
        return ()
    out, at = [], 0
    for name in sorted(one_z):  # ravel_pytree's order of a dict's keys
        size = int(np.size(one_z[name]))
        if name not in local:
            out.extend(range(at, at + size))
        at += size
    return tuple(out)


def start_trace(kernel, state, one_z):
    """``state`` with the convergence check's record when NumPyro's ``MCMC`` is
    running the kernel (none with :func:`~numpyro_sgbd.monitoring.off`)."""
    monitor = kernel.monitor
    leaves = jax.tree.leaves(one_z)
    dim = sum(int(np.size(x)) for x in leaves)
    mcmc = driving_mcmc(kernel) if enabled() else None
    first = _global_coords(one_z, kernel.prepared.local)
    trace_plan = plan(mcmc, dim, first, probe_rows(kernel.prepared))
    check = monitor.check
    # Sequential and parallel chains each call `init`: a run starts, and the
    # check's pool of chains with it, only where no chain is pending.
    if check is None or check.plan != trace_plan or not check.pending:
        monitor.new_record()
        check = None if trace_plan is None else ConvergenceCheck(trace_plan)
    monitor.check, monitor.trace_plan = check, trace_plan
    # The progress bar's count starts with each chain's loop (see checks.py).
    monitor.num_samples = None if mcmc is None else int(mcmc.num_samples)
    monitor.bar_calls, monitor.bar_next_read = 0, 1
    if trace_plan is None:
        return state
    dtype = jnp.result_type(*leaves) if leaves else jnp.float32
    return state._replace(trace=empty_trace(trace_plan, dtype, jnp.shape(state.i)))


def after_sample(kernel, state, new_state, trace, model_args, model_kwargs):
    """``new_state`` with the sample in the convergence check's record (the
    default: no host call; the host checks the record after the run) and, under
    :func:`~numpyro_sgbd.monitoring.per_step`, after the host calls of one
    sample: a note when the first chain stops or the clock is due (see
    :func:`clock_due`), and the check of the record when the run ends."""
    if mode() != PER_STEP:
        if trace is not None and enabled():
            trace = _recorded(kernel, new_state, trace, model_args, model_kwargs)
        return new_state if trace is None else new_state._replace(trace=trace)
    return _noted(kernel, state, new_state, trace, model_args, model_kwargs)


def _recorded(kernel, new_state, trace, model_args, model_kwargs):
    """``trace`` with the draw of ``new_state`` written in (and, for a network,
    its log-likelihood at the probed rows)."""
    num_warmup, num_steps = kernel.run_shape()[:2]
    after = (new_state.i - num_warmup) // num_steps
    trace_plan = kernel.monitor.trace_plan
    probe = None
    if trace_plan.probes:
        probe = probe_fn(
            kernel.prepared,
            trace_plan.plate,
            trace_plan.probes,
            model_args,
            model_kwargs,
        )
    return record(trace, trace_plan, new_state.z, after, probe)


def _noted(kernel, state, new_state, trace, model_args, model_kwargs):
    """``new_state`` after the live notes of one sample (see
    :func:`after_sample`): the host calls and the record."""
    num_warmup, num_steps = kernel.run_shape()[:2]
    # Once per run: when the first chain stops (vectorized chains share a call).
    first_stop = jnp.any(new_state.num_nonfinite > 0) & jnp.all(
        state.num_nonfinite == 0
    )
    due = first_stop | clock_due(state.i, new_state.i, num_warmup, num_steps)
    # The drift check's draws and the step check's smallest step are formed on
    # the host, from what the state holds: formed here, as operands of the host
    # call's branch, they were computed every step though read once in hundreds.
    scale = None if new_state.scale is None else new_state.scale.scale
    i = call_host(
        due,
        lambda *args: kernel.monitor.note(kernel, *args),
        new_state.i,
        first_stop,
        jax.tree.leaves(new_state.z),
        new_state.step_size,
        scale,
    )
    if trace is None:
        return new_state._replace(i=i)
    before = (state.i - num_warmup) // num_steps
    after = (new_state.i - num_warmup) // num_steps
    trace = _recorded(kernel, new_state, trace, model_args, model_kwargs)
    ends = run_ends(kernel.monitor.trace_plan, before, after)
    i = call_host(ends, lambda i, rows: _on_run_end(kernel, rows), i, trace.rows)
    return new_state._replace(i=i, trace=trace)


def _on_run_end(kernel, rows):
    """The convergence check, once every chain's run has ended; a
    :class:`ConvergenceWarning` naming the worst coordinate and the remedies
    when it falls short."""
    monitor = kernel.monitor
    if monitor.check is None:  # unpickled mid-run: no pool to add to
        return
    found = monitor.check.add(rows)
    if found is None:
        return
    monitor.convergence = found
    if found["converged"]:
        return
    monitor.record_warning("convergence")
    shapes, trace_plan = kernel.prepared.draw_shapes, monitor.trace_plan
    ess = min(found["min_ess_bulk"], found["min_ess_tail"])
    parts = []
    if ess < MIN_ESS:
        parts.append(
            f"a bulk ESS of {found['min_ess_bulk']:.0f} and a tail ESS of "
            f"{found['min_ess_tail']:.0f} (smallest, at "
            f"{trace_plan.name(shapes, found['worst_ess'])})"
        )
    rhat = found["max_rhat"] if found["rhat_checked"] else 1.0
    if rhat > MAX_RHAT:
        parts.append(
            f"an R-hat of {rhat_text(found['max_rhat'])} at "
            f"{trace_plan.name(shapes, found['worst_rhat'])}"
        )
    remedies = advice.convergence_remedies(
        advice.run_facts(kernel),
        ess=ess,
        rhat=rhat,
        num_samples=monitor.trace_plan.num_samples,
        warned=monitor.run_warnings,
    )
    if trace_plan.every == trace_plan.thinning:
        draws = f"{found['num_draws']} draws, all the run keeps"
    else:
        draws = (
            f"{found['num_draws']} evenly spaced draws of the "
            f"{trace_plan.num_samples // trace_plan.thinning} it keeps, so "
            "compare's ESS of all of them may differ"
        )
    judged = ""
    if trace_plan.probes:
        judged = (
            f" (a network's run is judged by its predictions, the log-likelihood "
            f"of {len(trace_plan.probes)} fixed rows at each draw: its weights "
            "need not mix, the network's symmetries give many copies of one "
            "function)"
        )
    warnings.warn(
        f"{type(kernel).__name__}: the sampling draws have "
        f"{' and '.join(parts)}{judged} (rank-normalised, over "
        f"{found['num_chains']} "
        f"chain(s) of {draws}; the check "
        f"wants ESS >= {MIN_ESS} and R-hat <= {MAX_RHAT})"
        ": means and sds carry Monte Carlo errors too large to trust. "
        f"{advice.join(remedies)} See kernel.convergence.",
        ConvergenceWarning,
        stacklevel=2,
    )


def check_closed_over(sharded, model_args, model_kwargs):
    """While NumPyro traces its sampling loop with concrete data
    (``jit_model_args=False``, NumPyro's default, closes over them): they become
    constants of the compiled program, a copy of the data in it and compile
    time that grows with them. Sharded data cannot work so (each process would
    need every row); large data draw a warning."""
    if sharded:
        raise ValueError(
            "The model's data are sharded over devices, but NumPyro's MCMC "
            "compiles data it closes over into its sampling loop as constants "
            "(jit_model_args=False, its default), which would gather every "
            "shard into one program: pass MCMC(..., jit_model_args=True, "
            "progress_bar=False), which passes the data as arguments and keeps "
            "each shard on its device (with the bar on, NumPyro passes them "
            "through a compiled call every step, a copy of the data each)."
        )
    arrays = [
        x
        for x in jax.tree.leaves((model_args, model_kwargs))
        if isinstance(x, (np.ndarray, jax.Array))
    ]
    nbytes = sum(int(np.size(x)) * np.dtype(x.dtype).itemsize for x in arrays)
    if nbytes > CONSTANT_DATA_WARN_BYTES:
        warnings.warn(
            f"The model's data ({nbytes / 2**20:.0f} MiB) are compiled into "
            "NumPyro's sampling loop as constants (MCMC's jit_model_args=False, "
            "its default): compilation takes longer and the program holds a "
            "copy of the data. Pass MCMC(..., jit_model_args=True, "
            "progress_bar=False), with the data as JAX arrays (jnp.asarray(X)), "
            "to pass them as arguments (with the bar on, NumPyro passes them "
            "through a compiled call every step, a copy of the data each).",
            UserWarning,
            stacklevel=2,
        )
