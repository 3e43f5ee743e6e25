"""Deprecated: moved to :mod:`numpyro_sgbd.evaluation.criticism`. Importing this
module warns; its public names are the new module's own objects."""

import warnings

from numpyro_sgbd.evaluation.criticism import (
    LOG_LIKELIHOOD_ROWS,
    from_numpyro,
    full_data_log_likelihood,
)

__all__ = ["LOG_LIKELIHOOD_ROWS", "from_numpyro", "full_data_log_likelihood"]

warnings.warn(
    "numpyro_sgbd.criticism is deprecated: import from "
    "numpyro_sgbd.evaluation.criticism, or the public functions from numpyro_sgbd.",
    DeprecationWarning,
    stacklevel=2,  # the importer (Python skips importlib's frames)
)
