"""Deprecated: 0.1.0's home of the kernels (now :mod:`numpyro_sgbd.samplers`,
their state in :mod:`numpyro_sgbd.kernel`). Importing this module warns; it holds
0.1.0's names, the new modules' own objects."""

import warnings

from numpyro_sgbd.kernel import SGState
from numpyro_sgbd.samplers import SGBD, SGLD

__all__ = ["SGBD", "SGLD", "SGState"]

warnings.warn(
    "numpyro_sgbd.kernels is deprecated: import SGBD, SGLD and SGState from "
    "numpyro_sgbd (numpyro_sgbd.samplers).",
    DeprecationWarning,
    stacklevel=2,  # the importer (Python skips importlib's frames)
)
