""":func:`~numpyro_sgbd.tuning.tune`'s arguments, checked and resolved before
anything compiles: the scalar settings, the samplers with their step grids, and
the gradient estimators and subsample sizes the model's subsample plates allow.

Each check raises the ``ValueError`` that names the argument, in the order
:func:`~numpyro_sgbd.tuning.tune` makes them, so a call with several bad
arguments is told about the first.
"""

import functools
import inspect
from typing import NamedTuple

import numpy as np

from numpyro_sgbd.mode import model_plates
from numpyro_sgbd.samplers import NOGIN, SGBD, SGHMC, SGLD, SGNHT

#: The samplers :func:`~numpyro_sgbd.tuning.tune` knows by name, and its default set.
SAMPLERS = {"SGBD": SGBD, "SGLD": SGLD, "SGHMC": SGHMC, "SGNHT": SGNHT, "NOGIN": NOGIN}
METRICS = ("ksd", "fssd")
SCORES = ("auto", "full", "subset", "minibatch")
#: Draws an arm must be able to record in round 0 for its discrepancy to mean
#: anything; a budget that allows fewer is refused.
MIN_DRAWS = 10
_GRADIENTS = ("minibatch", "control_variates")
_PRECONDITIONERS = ("auto", "dense", "lowrank", "diagonal")


class Arm(NamedTuple):
    """One configuration: the sampler (by name), the gradient estimator, the
    subsample size n of the plate and the step size in the whitened coordinates u
    (unit posterior scale; see :mod:`numpyro_sgbd.preconditioning`)."""

    sampler: str
    gradient: str
    subsample_size: int
    step_size: float


class Settings(NamedTuple):
    """:func:`~numpyro_sgbd.tuning.tune`'s scalar arguments (see there), as
    given or as :func:`check_settings` returns them."""

    budget: float
    metric: str
    scores: str
    eta: int
    num_draws: int
    thinning: int
    chunk_size: int
    vectorize: bool
    preconditioner: str


class PlateChoice(NamedTuple):
    """What the model's subsample plates allow the arms to vary."""

    #: The one subsample plate whose size the arms set (``None`` with several).
    plate: str
    #: The gradient estimators, a tuple of names.
    gradients: tuple
    #: The subsample sizes, sorted (``[None]``: the declared sizes).
    subsample_sizes: list


def _positive_number(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"{name} must be a positive number, got {value!r}.")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}.")
    return float(value)


def _positive_int(value, name, minimum=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
    return int(value)


def check_settings(given):
    """``given`` (a :class:`Settings` of :func:`~numpyro_sgbd.tuning.tune`'s
    scalar arguments as passed) checked and converted, or the ``ValueError`` of
    the first that is not valid."""
    budget = _positive_number(given.budget, "budget")
    if given.metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {given.metric!r}.")
    if given.scores not in SCORES:
        raise ValueError(f"scores must be one of {SCORES}, got {given.scores!r}.")
    eta = _positive_int(given.eta, "eta", 2)
    num_draws = _positive_int(given.num_draws, "num_draws", MIN_DRAWS)
    thinning = _positive_int(given.thinning, "thinning")
    chunk_size = _positive_int(given.chunk_size, "chunk_size")
    if not isinstance(given.vectorize, (bool, np.bool_)):
        raise ValueError(f"vectorize must be True or False, got {given.vectorize!r}.")
    if given.preconditioner not in _PRECONDITIONERS:
        raise ValueError(
            "preconditioner must be 'auto', 'dense', 'lowrank' or 'diagonal' (tune "
            "takes step sizes in the whitened coordinates), got "
            f"{given.preconditioner!r}."
        )
    return given._replace(
        budget=budget,
        eta=eta,
        num_draws=num_draws,
        thinning=thinning,
        chunk_size=chunk_size,
    )


def _sampler_entry(entry):
    """``(name, factory)`` of a ``samplers`` entry: a name, a sampler class or a
    ``functools.partial`` of one; NOGIN without a ``covariance`` gets
    ``"per_step"`` (the arms' traced subsample sizes form each estimate's noise
    from its own rows, :class:`~numpyro_sgbd.tuning.sizes.SizedEstimator`)."""
    name, factory = _named_entry(entry)
    keywords = factory.keywords if isinstance(factory, functools.partial) else {}
    if name == "NOGIN" and "covariance" not in keywords:
        factory = functools.partial(factory, covariance="per_step")
    return name, factory


def _named_entry(entry):
    if isinstance(entry, str):
        if entry not in SAMPLERS:
            raise ValueError(
                f"samplers: unknown sampler {entry!r}; the names are "
                f"{sorted(SAMPLERS)}, or pass a sampler class (or a "
                "functools.partial of one)."
            )
        return entry, SAMPLERS[entry]
    cls = entry.func if isinstance(entry, functools.partial) else entry
    if not (inspect.isclass(cls) and issubclass(cls, tuple(SAMPLERS.values()))):
        raise ValueError(
            f"samplers: {entry!r} is not one of {sorted(SAMPLERS)} (as a name, a "
            "class or a functools.partial of a class)."
        )
    return cls.__name__, entry


def _step_grid(step_sizes, name, factory):
    """The step sizes of one sampler: given (a sequence, or a dict by sampler
    name), or ``target`` times 2, 1, 1/4, 1/16 and 1/64, from the sampler's step
    target."""
    if isinstance(step_sizes, dict):
        step_sizes = step_sizes.get(name)
    if step_sizes is None:
        cls = factory.func if isinstance(factory, functools.partial) else factory
        target = float(cls.step_target())
        return tuple(float(target * f) for f in (2.0, 1.0, 0.25, 0.0625, 0.015625))
    grid = tuple(np.atleast_1d(np.asarray(step_sizes, dtype=float)).tolist())
    if not grid or not all(np.isfinite(h) and h > 0 for h in grid):
        raise ValueError(
            f"step_sizes for {name} must be positive numbers (in the whitened "
            f"coordinates u, where the posterior has unit scale), got {step_sizes!r}."
        )
    return grid


def sampler_grids(samplers, step_sizes):
    """``(entries, grids)``: the samplers as ``(name, factory)`` pairs, and each
    one's step sizes by name. Names must be distinct: one configuration of each
    sampler class is compared."""
    if isinstance(samplers, (str, type, functools.partial)):
        samplers = [samplers]
    entries = [_sampler_entry(s) for s in samplers]
    if not entries:
        raise ValueError("samplers is empty: give at least one sampler.")
    names = [name for name, _ in entries]
    if len(set(names)) != len(names):
        raise ValueError(
            f"samplers names {names} twice; tune compares one configuration of "
            "each sampler class (fix other options with functools.partial)."
        )
    if isinstance(step_sizes, dict):
        unknown = set(step_sizes) - set(names)
        if unknown:
            raise ValueError(
                f"step_sizes names {sorted(unknown)}, which are not among the "
                f"samplers {names}."
            )
    return entries, {name: _step_grid(step_sizes, name, f) for name, f in entries}


def constructor_accepts(factory, name):
    """Whether the sampler of ``factory`` (a class or a partial of one) takes the
    constructor argument ``name``."""
    cls = factory.func if isinstance(factory, functools.partial) else factory
    return name in inspect.signature(cls.__init__).parameters


def _gradient_choice(gradients, plates):
    """The gradient estimators as a tuple of names: by default what
    ``step_size=None`` chooses (control variates with one subsample plate, plain
    minibatches with several); control variates need exactly one plate."""
    one_plate = len(plates) == 1
    if gradients is None:  # as step_size=None chooses
        gradients = ("control_variates",) if one_plate else ("minibatch",)
    if isinstance(gradients, str):
        gradients = (gradients,)
    gradients = tuple(gradients)
    bad = [g for g in gradients if g not in _GRADIENTS]
    if bad or not gradients:
        raise ValueError(
            "gradients must be a non-empty subset of ('minibatch', "
            f"'control_variates'), got {gradients!r}."
        )
    if "control_variates" in gradients and not one_plate:
        raise ValueError(
            "gradients='control_variates' needs exactly one subsample plate; the "
            f"model subsamples {sorted(plates)}. Pass gradients=['minibatch']."
        )
    return gradients


def _subsample_choice(plates, subsample_sizes):
    """``(plate, sizes)``: with one subsample plate, the sizes sorted and in
    ``[1, N)`` (by default the declared n, n / 10 and 10 n, within [2, N));
    with several, ``(None, [None])``, their declared sizes."""
    if len(plates) != 1:
        if subsample_sizes is not None:
            raise ValueError(
                f"subsample_sizes needs one subsample plate; the model subsamples "
                f"{sorted(plates)}: leave subsample_sizes=None (the declared sizes)."
            )
        return None, [None]
    ((plate, (size, declared)),) = plates.items()
    if subsample_sizes is None:
        subsample_sizes = sorted(
            {max(2, declared // 10), declared, min(10 * declared, size - 1)}
        )
    subsample_sizes = [int(n) for n in np.atleast_1d(subsample_sizes)]
    if not subsample_sizes or not all(1 <= n < size for n in subsample_sizes):
        raise ValueError(
            f"subsample_sizes must be ints in [1, {size}) for plate "
            f"'{plate}' (N = {size}), got {subsample_sizes!r}."
        )
    return plate, sorted(set(subsample_sizes))


def plate_choice(model, model_args, model_kwargs, gradients, subsample_sizes):
    """The :class:`PlateChoice` of a model (its arguments as JAX arrays): tune
    compares minibatch samplers, so the model must have a subsample plate."""
    plates = model_plates(model, model_args, model_kwargs)
    if not plates:
        raise ValueError(
            "tune compares minibatch samplers, but the model has no subsample "
            "plate: write numpyro.plate(name, N, subsample_size=n) around its data."
        )
    gradients = _gradient_choice(gradients, plates)
    plate, subsample_sizes = _subsample_choice(plates, subsample_sizes)
    return PlateChoice(plate, gradients, subsample_sizes)
