"""Stochastic-gradient MCMC for any NumPyro model with a subsampled plate."""

import importlib

# First: execute numpyro before any of its submodules is imported. ArviZ 1.x
# (arviz_base), if the user imported it first, leaves a lazy module in numpyro's
# place; a first import of a submodule (``from numpyro.infer import MCMC``, as
# this package's modules do) would then execute numpyro.infer twice, and the copy
# kept lacks ``initialization`` (``az.from_numpyro`` then fails). An attribute
# access executes a lazy module; with numpyro already loaded it is a no-op.
import numpyro

numpyro.__version__

from numpyro_sgbd._threefry import unroll_threefry_on_cpu, unrolled_threefry  # noqa: E402
from numpyro_sgbd.enumeration import config_enumerate  # noqa: E402
from numpyro_sgbd.estimators import GradientEstimate  # noqa: E402
from numpyro_sgbd.handlers import full_batch  # noqa: E402
from numpyro_sgbd.host import host_data  # noqa: E402
from numpyro_sgbd.kernel import Centre, SGState  # noqa: E402
from numpyro_sgbd.mode import PosteriorMode, posterior_mode  # noqa: E402
from numpyro_sgbd.monitoring import ConvergenceWarning, check  # noqa: E402
from numpyro_sgbd.samplers import PUBLIC as _SAMPLERS  # noqa: E402
from numpyro_sgbd.samplers.momentum import *  # noqa: E402
from numpyro_sgbd.samplers.nogin import *  # noqa: E402
from numpyro_sgbd.samplers.position import *  # noqa: E402
from numpyro_sgbd.samplers.recipe import *  # noqa: E402
from numpyro_sgbd.sharding import shard_data  # noqa: E402
from numpyro_sgbd.tuning import TuneResult, tune  # noqa: E402

__version__ = "0.1.0"

#: The evaluation side's public names, by the module that holds each: loaded on
#: first use (PEP 562), so that sampling needs neither ArviZ nor xarray.
_EVALUATION = {
    "Comparison": "comparison",
    "compare": "comparison",
    "plot_marginals": "comparison",
    "from_numpyro": "criticism",
    "full_data_log_likelihood": "criticism",
    "fssd": "fssd",
    "ksd": "ksd",
    "posterior_ksd": "ksd",
    "full_batch_scores": "reference",
    "reference_posterior": "reference",
}


def __getattr__(name):
    if name in _EVALUATION:
        module = importlib.import_module(f"numpyro_sgbd.evaluation.{_EVALUATION[name]}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'numpyro_sgbd' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EVALUATION))


# Importing the package changes nothing in JAX: the threefry backport
# (numpyro_sgbd._threefry) runs only when a program calls it.

__all__ = [
    *_SAMPLERS,
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
