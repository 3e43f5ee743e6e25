"""Deprecated: moved to :mod:`numpyro_sgbd.evaluation.ksd` (the kernel Stein
discrepancy), :mod:`numpyro_sgbd.evaluation.fssd` (the finite-set one) and
:mod:`numpyro_sgbd.evaluation.drift`. Importing this module warns; its public
names are the new modules' own objects."""

import warnings

from numpyro_sgbd.evaluation.drift import drift
from numpyro_sgbd.evaluation.fssd import fssd, fssd_opt
from numpyro_sgbd.evaluation.ksd import (
    imq_ksd,
    ksd,
    posterior_ksd,
    unconstrained_draws_and_scores,
)

__all__ = [
    "drift",
    "fssd",
    "fssd_opt",
    "imq_ksd",
    "ksd",
    "posterior_ksd",
    "unconstrained_draws_and_scores",
]

warnings.warn(
    "numpyro_sgbd.diagnostics is deprecated: import from numpyro_sgbd.evaluation.ksd "
    "(imq_ksd, ksd, posterior_ksd, unconstrained_draws_and_scores), "
    "numpyro_sgbd.evaluation.fssd (fssd, fssd_opt) or "
    "numpyro_sgbd.evaluation.drift (drift), or the public functions from "
    "numpyro_sgbd.",
    DeprecationWarning,
    stacklevel=2,  # the importer (Python skips importlib's frames)
)
