"""The checks a kernel makes while it runs and after, in one place.

- **Notes** (:mod:`~numpyro_sgbd.monitoring.notes`): the compiled step calls the
  host at a few iterations (1, 2, 4, ... of warmup and of sampling, then at evenly
  spaced ones, about 16 per doubling of the run). There a kernel's
  :class:`~numpyro_sgbd.monitoring.notes.Monitor` notes the time
  (:func:`~numpyro_sgbd.monitoring.notes.wall_time`), warns once when a chain
  stops on a non-finite value, checks the adapted step when sampling starts, and
  keeps thinned draws for the drift check.
- **The convergence check** (:mod:`~numpyro_sgbd.monitoring.trace`): thinned
  sampling draws kept in the state and, when the run ends, the bulk and tail ESS
  and split R-hat of the chains, with a :class:`ConvergenceWarning` when they
  fall short.

All of it costs a few percent of a step (``benchmarks/convergence_check.py``).
Where even that is too much, or where host callbacks are not wanted (a program
exported or run where the host cannot be called),

    with numpyro_sgbd.monitoring.off():
        mcmc.run(rng_key, X, y)

compiles the run without any of them: no host call and no record in the state,
so no warning, no ``kernel.convergence`` and no clock for ``wall_time``. The
switch is read when NumPyro traces the kernel's step, that is inside
``mcmc.run``; the draws are the same either way.
"""

from numpyro_sgbd.monitoring.notes import Monitor, call_host, clock_due, wall_time
from numpyro_sgbd.monitoring.switch import enabled, off
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
    "clock_due",
    "driving_mcmc",
    "empty_trace",
    "enabled",
    "off",
    "plan",
    "record",
    "report",
    "run_ends",
    "wall_time",
]
