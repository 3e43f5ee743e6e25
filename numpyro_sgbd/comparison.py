"""Deprecated: moved to :mod:`numpyro_sgbd.evaluation.comparison`. Importing this
module warns; its public names are the new module's own objects."""

import warnings

from numpyro_sgbd.evaluation.comparison import Comparison, compare, plot_marginals

__all__ = ["Comparison", "compare", "plot_marginals"]

warnings.warn(
    "numpyro_sgbd.comparison is deprecated: import from "
    "numpyro_sgbd.evaluation.comparison, or the public names from numpyro_sgbd.",
    DeprecationWarning,
    stacklevel=2,  # the importer (Python skips importlib's frames)
)
