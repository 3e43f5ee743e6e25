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

from numpyro_sgbd.samplers import momentum, nogin, position, recipe
from numpyro_sgbd.samplers.momentum import *  # noqa: F403
from numpyro_sgbd.samplers.momentum import (
    BAOABKernelState,
    SGHMCKernelState,
    SGNHTKernelState,
)
from numpyro_sgbd.samplers.nogin import *  # noqa: F403
from numpyro_sgbd.samplers.nogin_forms import (
    MAX_COVARIANCE_BYTES,
    MAX_RANK,
    choose_covariance,
    choose_rank,
    per_step_covariance,
)
from numpyro_sgbd.samplers.position import *  # noqa: F403
from numpyro_sgbd.samplers.recipe import *  # noqa: F403
from numpyro_sgbd.samplers.recipe import RecipeKernelState

#: The names the package exports: each sampler module's ``__all__`` (its
#: samplers), so that a sampler added to a module is exported with nothing else
#: to edit.
PUBLIC = [*position.__all__, *nogin.__all__, *momentum.__all__, *recipe.__all__]

__all__ = [
    *PUBLIC,
    "BAOABKernelState",
    "MAX_COVARIANCE_BYTES",
    "MAX_RANK",
    "RecipeKernelState",
    "SGHMCKernelState",
    "SGNHTKernelState",
    "choose_covariance",
    "choose_rank",
    "per_step_covariance",
]
