"""The names this module held before the adapter (:mod:`numpyro_sgbd.kernel`) and
the samplers (:mod:`numpyro_sgbd.samplers`) were split apart; kept so that
``from numpyro_sgbd.kernels import SGBD`` goes on working."""

from numpyro_sgbd.kernel import Centre, SGState, family_state, wall_time
from numpyro_sgbd.samplers import (
    NOGIN,
    SGBD,
    SGLD,
    NOGINState,
    choose_covariance,
)

__all__ = [
    "Centre",
    "NOGIN",
    "NOGINState",
    "SGBD",
    "SGLD",
    "SGState",
    "choose_covariance",
    "family_state",
    "wall_time",
]
