"""Pure stochastic-gradient update rules over pytrees (no NumPyro imports)."""

from numpyro_sgbd.updates.barker import (
    BARKER_TOLERANCE,
    VARIANTS,
    barker_step,
    flip_probability,
)
from numpyro_sgbd.updates.langevin import langevin_step
from numpyro_sgbd.updates.nogin import (
    COVARIANCES,
    nogin_damp,
    nogin_drift,
    nogin_kick,
    nogin_lambda,
)

__all__ = [
    "BARKER_TOLERANCE",
    "COVARIANCES",
    "VARIANTS",
    "barker_step",
    "flip_probability",
    "langevin_step",
    "nogin_damp",
    "nogin_drift",
    "nogin_kick",
    "nogin_lambda",
]
