"""Stochastic-gradient MCMC for any NumPyro model with a subsampled plate."""

# First: numpyro_sgbd.evaluation._arviz loads numpyro before any of its submodules
# (see there; numpyro_sgbd.evaluation itself imports nothing).
from numpyro_sgbd.evaluation import _arviz  # noqa: F401  # isort: skip
from numpyro_sgbd._threefry import unroll_threefry_on_cpu, unrolled_threefry
from numpyro_sgbd.enumeration import config_enumerate
from numpyro_sgbd.estimators import GradientEstimate
from numpyro_sgbd.evaluation.comparison import Comparison, compare, plot_marginals
from numpyro_sgbd.evaluation.criticism import from_numpyro, full_data_log_likelihood
from numpyro_sgbd.evaluation.fssd import fssd
from numpyro_sgbd.evaluation.ksd import ksd, posterior_ksd
from numpyro_sgbd.evaluation.reference import full_batch_scores, reference_posterior
from numpyro_sgbd.handlers import full_batch
from numpyro_sgbd.host import host_data
from numpyro_sgbd.kernel import Centre, SGState
from numpyro_sgbd.modes import PosteriorMode, posterior_mode
from numpyro_sgbd.monitoring import ConvergenceWarning, check
from numpyro_sgbd.samplers import (
    BAOAB,
    NOGIN,
    SGBD,
    SGHMC,
    SGLD,
    SGNHT,
    SGRLD,
    NOGINState,
    Recipe,
)
from numpyro_sgbd.sharding import shard_data
from numpyro_sgbd.tuning import TuneResult, tune

__version__ = "0.1.0"

# Importing the package changes nothing in JAX: the threefry backport
# (numpyro_sgbd._threefry) runs only when a program calls it.

__all__ = [
    "BAOAB",
    "NOGIN",
    "NOGINState",
    "SGBD",
    "SGLD",
    "SGHMC",
    "SGNHT",
    "SGRLD",
    "Recipe",
    "GradientEstimate",
    "SGState",
    "Centre",
    "Comparison",
    "check",
    "compare",
    "config_enumerate",
    "ConvergenceWarning",
    "from_numpyro",
    "full_batch",
    "full_batch_scores",
    "host_data",
    "full_data_log_likelihood",
    "fssd",
    "ksd",
    "plot_marginals",
    "posterior_ksd",
    "PosteriorMode",
    "posterior_mode",
    "reference_posterior",
    "shard_data",
    "tune",
    "TuneResult",
    "unroll_threefry_on_cpu",
    "unrolled_threefry",
    "__version__",
]
