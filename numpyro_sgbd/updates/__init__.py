"""Pure stochastic-gradient update rules over pytrees (no NumPyro imports)."""

from numpyro_sgbd.updates.barker import (
    BARKER_TOLERANCE,
    VARIANTS,
    barker_step,
    flip_probability,
)
from numpyro_sgbd.updates.langevin import langevin_step

__all__ = [
    "BARKER_TOLERANCE",
    "VARIANTS",
    "barker_step",
    "flip_probability",
    "langevin_step",
]
