"""The checks of a kernel's run, in one place: a chain that stopped on a
non-finite value, an adapted step the gradient noise held down, draws that
still drift, NOGIN's noise damping, and the convergence check (bulk and tail
ESS, split R-hat) with its :class:`ConvergenceWarning`.

**Where they run.** By default the compiled step calls no host function: the
state keeps what the checks need (the convergence check's thinned draws in
``state.trace``, see :mod:`~numpyro_sgbd.monitoring.trace`; ``num_nonfinite``,
``i``, the step and scales fixed from warmup's end; NOGIN's ``stall_damping``),
and the host checks it after the run
(:mod:`~numpyro_sgbd.monitoring.checks`). NumPyro's compiled loop then has no
host callback in it, so JAX's persistent compilation cache keeps it, and a run
with the progress bar pays nothing for the checks. They are made

- with NumPyro's progress bar on (its default), one chain or sequential chains:
  by the kernel itself, at the run's last sample (NumPyro hands each sample to
  ``get_diagnostics_str``); sequential chains pool into one convergence check;
- with the bar off, vectorized or parallel chains: by
  ``numpyro_sgbd.check(mcmc)`` (:func:`check`) after ``mcmc.run``, which
  :func:`~numpyro_sgbd.compare` and :func:`~numpyro_sgbd.from_numpyro` call
  for their runs. It warns once per run however often it is called, and
  returns ``kernel.convergence``.

Two switches, read when NumPyro traces the kernel's step (inside ``mcmc.run``;
the draws are the same in all three modes)::

    with numpyro_sgbd.monitoring.per_step():
        mcmc.run(rng_key, X, y)

compiles the live notes (:mod:`~numpyro_sgbd.monitoring.notes`): the step calls
the host at a few iterations (1, 2, 4, ... of warmup and of sampling, then
about 16 per doubling of the run), where the kernel's :class:`Monitor` notes
the time for :func:`wall_time` with the bar off and warns while the run goes
(the convergence check at its last sample). Its cost: a few percent of a step
(``benchmarks/convergence_check.py``), more with the bar on (each call waits
for NumPyro's Python loop), and no persistent cache for the loop::

    with numpyro_sgbd.monitoring.off():
        mcmc.run(rng_key, X, y)

compiles the run without any check: no host call and no record in the state,
so no warning (not even from :func:`check`), no ``kernel.convergence`` and no
clock for ``wall_time``.

:func:`wall_time` needs the clock: under :func:`per_step`, or with the bar on
(noted every 100 samples and at the last); elsewhere it returns ``None``.
"""

from numpyro_sgbd.monitoring.checks import check, check_run
from numpyro_sgbd.monitoring.notes import Monitor, call_host, clock_due, wall_time
from numpyro_sgbd.monitoring.switch import enabled, mode, off, per_step
from numpyro_sgbd.monitoring.trace import (
    MAX_RHAT,
    MIN_ESS,
    TRACE_COORDS,
    TRACE_ROWS,
    ConvergenceCheck,
    ConvergenceWarning,
    Trace,
    TracePlan,
    driving_mcmc,
    empty_trace,
    plan,
    record,
    report,
    run_ends,
)

__all__ = [
    "ConvergenceCheck",
    "ConvergenceWarning",
    "MAX_RHAT",
    "MIN_ESS",
    "Monitor",
    "TRACE_COORDS",
    "TRACE_ROWS",
    "Trace",
    "TracePlan",
    "call_host",
    "check",
    "check_run",
    "clock_due",
    "driving_mcmc",
    "empty_trace",
    "enabled",
    "mode",
    "off",
    "per_step",
    "plan",
    "record",
    "report",
    "run_ends",
    "wall_time",
]
