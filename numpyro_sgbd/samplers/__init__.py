"""The samplers users construct: SGBD, SGLD, NOGIN, BAOAB and the complete
recipe's SGHMC, SGNHT, SGRLD and any (D, Q) sampler.

Each is a class of the one kernel, :class:`~numpyro_sgbd.kernel.SGKernel`, that
sets only its :class:`~numpyro_sgbd.spec.SamplerSpec`: a pure update family of
:mod:`numpyro_sgbd.updates`, its state type, arguments and their checks. The
hyperparameters stay call arguments of the pure step (so that tuning can vmap
over them). By family:
:mod:`~numpyro_sgbd.samplers.position` (SGBD, SGLD),
:mod:`~numpyro_sgbd.samplers.nogin`, :mod:`~numpyro_sgbd.samplers.momentum`
(SGHMC, SGNHT, BAOAB) and :mod:`~numpyro_sgbd.samplers.recipe` (Recipe, SGRLD).
"""

from numpyro_sgbd.samplers.momentum import (
    BAOAB,
    SGHMC,
    SGNHT,
    BAOABKernelState,
    SGHMCKernelState,
    SGNHTKernelState,
)
from numpyro_sgbd.samplers.nogin import (
    MAX_COVARIANCE_BYTES,
    NOGIN,
    NOGINState,
    choose_covariance,
)
from numpyro_sgbd.samplers.position import SGBD, SGLD
from numpyro_sgbd.samplers.recipe import SGRLD, Recipe, RecipeKernelState

__all__ = [
    "BAOAB",
    "BAOABKernelState",
    "NOGIN",
    "NOGINState",
    "SGBD",
    "SGHMC",
    "SGLD",
    "SGNHT",
    "SGRLD",
    "Recipe",
    "choose_covariance",
    "BAOABKernelState",
    "MAX_COVARIANCE_BYTES",
    "RecipeKernelState",
    "SGHMCKernelState",
    "SGNHTKernelState",
]
