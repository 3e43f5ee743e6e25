"""Deprecated: 0.1.0's home of :func:`~numpyro_sgbd.full_batch` (now in
:mod:`numpyro_sgbd.handlers`). Importing this module warns; it holds 0.1.0's
one name, the new module's own object."""

import warnings

from numpyro_sgbd.handlers import full_batch

__all__ = ["full_batch"]

warnings.warn(
    "numpyro_sgbd.reference is deprecated: import full_batch from numpyro_sgbd "
    "(numpyro_sgbd.handlers); the reference posterior is "
    "numpyro_sgbd.reference_posterior (numpyro_sgbd.evaluation.reference).",
    DeprecationWarning,
    stacklevel=2,  # the importer (Python skips importlib's frames)
)
