"""Deprecated: moved to :mod:`numpyro_sgbd.evaluation.reference`, the Laplace
settings to :mod:`numpyro_sgbd.evaluation.laplace`. Importing this module warns;
its public names are the new modules' own objects."""

import warnings

from numpyro_sgbd.evaluation.laplace import (
    AUTO_CONDITION,
    AUTO_SD_RATIO,
    AUTO_SHRINKAGE,
    LAPLACE_DENSE_MAX_DIM,
)
from numpyro_sgbd.evaluation.reference import (
    ESS_PER_CHAIN_MIN,
    RHAT_MAX,
    PosteriorMode,
    full_batch,
    full_batch_scores,
    posterior_mode,
    reference_posterior,
)

__all__ = [
    "AUTO_CONDITION",
    "AUTO_SD_RATIO",
    "AUTO_SHRINKAGE",
    "ESS_PER_CHAIN_MIN",
    "LAPLACE_DENSE_MAX_DIM",
    "PosteriorMode",
    "RHAT_MAX",
    "full_batch",
    "full_batch_scores",
    "posterior_mode",
    "reference_posterior",
]

warnings.warn(
    "numpyro_sgbd.reference is deprecated: import from "
    "numpyro_sgbd.evaluation.reference (the Laplace settings from "
    "numpyro_sgbd.evaluation.laplace), or the public functions from numpyro_sgbd.",
    DeprecationWarning,
    stacklevel=2,  # the importer (Python skips importlib's frames)
)
