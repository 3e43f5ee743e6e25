"""The switch that compiles the run checks in or out (see
:mod:`numpyro_sgbd.monitoring`)."""

import contextlib
import contextvars

__all__ = ["enabled", "off"]

_ENABLED = contextvars.ContextVar("numpyro_sgbd_monitoring", default=True)


def enabled():
    """Whether kernels traced now compile their checks in (see
    :mod:`numpyro_sgbd.monitoring`).

    >>> with off():
    ...     enabled()
    False
    >>> enabled()
    True
    """
    return _ENABLED.get()


@contextlib.contextmanager
def off():
    """Compile the kernels' runs inside this block without their checks: no host
    call, no convergence record (see :mod:`numpyro_sgbd.monitoring`)."""
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)
