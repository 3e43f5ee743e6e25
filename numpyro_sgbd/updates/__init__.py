"""Pure stochastic-gradient update rules over pytrees (no NumPyro imports)."""

from numpyro_sgbd.updates.baoab import BAOABInfo, baoab_step
from numpyro_sgbd.updates.barker import (
    BARKER_TOLERANCE,
    VARIANTS,
    barker_step,
    flip_probability,
)
from numpyro_sgbd.updates.langevin import langevin_step
from numpyro_sgbd.updates.nogin import (
    COVARIANCES,
    NOGINInfo,
    NOGINUpdateState,
    NoiseAverage,
    nogin_damp,
    nogin_drift,
    nogin_init,
    nogin_kick,
    nogin_lambda,
    nogin_step,
    noise_average_init,
    noise_average_update,
)
from numpyro_sgbd.updates.position import (
    PositionInfo,
    PositionState,
    barker_update,
    langevin_update,
    position_init,
)
from numpyro_sgbd.updates.recipe import check_recipe, recipe_moments, recipe_step
from numpyro_sgbd.updates.sghmc import SGHMCState, sghmc_init, sghmc_step
from numpyro_sgbd.updates.sgnht import SGNHTState, sgnht_init, sgnht_step
from numpyro_sgbd.updates.sgrld import expanded_mean_metric, sgrld_step

__all__ = [
    "BAOABInfo",
    "baoab_step",
    "BARKER_TOLERANCE",
    "COVARIANCES",
    "VARIANTS",
    "NOGINInfo",
    "NOGINUpdateState",
    "NoiseAverage",
    "PositionInfo",
    "PositionState",
    "SGHMCState",
    "SGNHTState",
    "barker_step",
    "barker_update",
    "check_recipe",
    "expanded_mean_metric",
    "flip_probability",
    "langevin_step",
    "langevin_update",
    "nogin_damp",
    "nogin_drift",
    "nogin_init",
    "noise_average_init",
    "noise_average_update",
    "nogin_kick",
    "nogin_lambda",
    "nogin_step",
    "position_init",
    "recipe_moments",
    "recipe_step",
    "sghmc_init",
    "sghmc_step",
    "sgnht_init",
    "sgnht_step",
    "sgrld_step",
]
