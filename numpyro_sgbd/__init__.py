"""Stochastic-gradient MCMC for any NumPyro model with a subsampled plate."""

from numpyro_sgbd.diagnostics import ksd
from numpyro_sgbd.estimators import GradientEstimate
from numpyro_sgbd.kernels import SGBD, SGLD, SGState
from numpyro_sgbd.reference import full_batch

__version__ = "0.1.0"

__all__ = [
    "SGBD",
    "SGLD",
    "GradientEstimate",
    "SGState",
    "full_batch",
    "ksd",
    "__version__",
]
