"""The switch that says where the run checks are made (see
:mod:`numpyro_sgbd.monitoring`): after the run (the default), at the steps
themselves (:func:`per_step`), or nowhere (:func:`off`)."""

import contextlib
import contextvars

__all__ = ["AFTER", "OFF", "PER_STEP", "enabled", "mode", "off", "per_step"]

#: The default: the step records, the host checks after the run.
AFTER = "after"
#: The live notes: the compiled step calls the host (:func:`per_step`).
PER_STEP = "per_step"
#: No check at all (:func:`off`).
OFF = "off"

_MODE = contextvars.ContextVar("numpyro_sgbd_monitoring", default=AFTER)


def mode():
    """Where kernels traced now make their run checks: :data:`AFTER`,
    :data:`PER_STEP` or :data:`OFF`.

    >>> with per_step():
    ...     mode()
    'per_step'
    >>> mode()
    'after'
    """
    return _MODE.get()


def enabled():
    """Whether kernels traced now compile their checks in (see
    :mod:`numpyro_sgbd.monitoring`).

    >>> with off():
    ...     enabled()
    False
    >>> enabled()
    True
    """
    return _MODE.get() != OFF


@contextlib.contextmanager
def _set(value):
    token = _MODE.set(value)
    try:
        yield
    finally:
        _MODE.reset(token)


def off():
    """Compile the kernels' runs inside this block without their checks: no host
    call, no record in the state, no warning (see :mod:`numpyro_sgbd.monitoring`)."""
    return _set(OFF)


def per_step():
    """Compile the kernels' runs inside this block with the live notes: the
    compiled step calls the host at a few iterations, for the clock of
    :func:`~numpyro_sgbd.monitoring.wall_time` and for warnings while the run
    goes (see :mod:`numpyro_sgbd.monitoring`)."""
    return _set(PER_STEP)
