"""What a sampler is: a :class:`SamplerSpec`, the declarative value that the one
kernel class (:class:`numpyro_sgbd.kernel.SGKernel`) runs, as NumPyro's ``NUTS``
is ``HMC`` with another algorithm. A sampler's class sets only ``spec``; its
constructor's arguments, their defaults and checks, its update family, its
variants and what its step needs from the gradient estimator are fields here.

The shared arguments every sampler takes are declared once (:data:`SHARED`); a
spec names its own hyperparameters, changes a shared default
(``defaults``), drops a shared argument (``not_taken``) or fixes one
(``fixed``). :func:`arguments` resolves a constructor call against it, naming
the closest valid keyword where one is misspelt, and :func:`signature` gives
``help()`` the sampler's whole signature.
"""

import difflib
import inspect
from typing import Any, Callable, NamedTuple

from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
from numpyro.infer.initialization import init_to_uniform

from numpyro_sgbd import core
from numpyro_sgbd.options import _per_site

__all__ = [
    "REQUIRED",
    "SHARED",
    "SOURCES",
    "RunChecks",
    "SamplerSpec",
    "arguments",
    "signature",
]

#: The default of a hyperparameter the constructor requires.
REQUIRED = inspect.Parameter.empty

#: The keyword arguments every sampler takes, with their defaults (the guide's
#: ``docs/usage.rst`` and :class:`~numpyro_sgbd.SGBD`'s docstring say what
#: each does).
SHARED = {
    "step_size": None,
    "variant": None,
    "beta": 0.1,
    "init_noise_sd": None,
    "preconditioner": None,
    "adapt_mass_matrix": None,
    "gradient": None,
    "centre": None,
    "recentre_every": None,
    "replace": None,
    "init_strategy": init_to_uniform,
    "log_likelihood_size": None,
    "chunk_size": 4096,
    "num_steps": 1,
}
#: What a sampler runs on, one of them given: its positional arguments.
SOURCES = ("model", "potential_fn", "gradient_fn")


class RunChecks(NamedTuple):
    """A sampler's own run checks, beside the kernel's (NOGIN's stall and noise
    checks), over a record in the state's ``fields``, which the kernel keeps
    out of the step as it does the convergence check's. ``start(state, shape)
    -> state`` adds the record to the initial state; ``after(kept, state,
    new_state, shape, warn) -> new_state`` writes it after each sample
    (``kept``: the record's fields by name, ``warn(kind, *values)``: the
    warning, from the host); ``recorded(state, take, shape, warn) ->
    [(iteration, kind, check)]`` reads it after the run (see
    :func:`~numpyro_sgbd.monitoring.check_run`). ``shape`` is the kernel's
    :class:`~numpyro_sgbd.kernel.RunShape`; ``warnings`` the warnings by kind,
    ``warning(shape, *values)``."""

    fields: tuple
    start: Callable
    after: Callable
    recorded: Callable
    warnings: dict


class SamplerSpec(NamedTuple):
    """A sampler, declared.

    :ivar str name: the sampler's name, in messages.
    :ivar init: the update family's ``init(x, rng_key, **init_kwargs) -> aux``
        (``docs/adding_a_sampler.rst``).
    :ivar step: its ``step(rng_key, aux, estimate_fn, step_size, *, estimate,
        variant, noise_sd, **step_kwargs) -> (aux, estimate, info)``.
    :ivar state_type: the kernel's state (:func:`~numpyro_sgbd.state.family_state`
        or the family's own, as :class:`~numpyro_sgbd.NOGINState`).
    :ivar dict hyperparameters: the constructor's own arguments by name, with
        their defaults (:data:`REQUIRED` where none).
    :ivar dict defaults: shared arguments whose default this sampler changes.
    :ivar tuple not_taken: shared arguments this sampler does not take.
    :ivar dict fixed: shared arguments this sampler sets itself.
    :ivar check: ``check(args) -> hyper``: the arguments (every one, by name)
        checked before anything is traced, and the hyperparameters the step
        takes (numbers or dicts of sites, validated against z at ``init``;
        strings and functions pass as they are). ``None``: the own
        hyperparameters as given.
    :ivar family: ``family(args) -> (init, step)`` where the arguments choose
        the family (the recipe's ``momentum``), or ``None``.
    :ivar tuple variants: the family's variants.
    :ivar tuple init_args: which hyperparameters ``init`` takes (all go to
        ``step``).
    :ivar noise_diffusion: the hyperparameter D whose injected variance
        ``eps (2 D - eps tau^2)`` the corrected variant keeps positive, by name.
    :ivar noise_step_bound: ``bound(largest) -> step``, the largest step the
        noise allows at the largest noise sd (SGBD, SGLD: ``tau * step``); by
        default :func:`~numpyro_sgbd.adaptation.noise_step_bound` over
        ``noise_diffusion``.
    :ivar float step_target: the step in the whitened coordinates u (unit
        posterior scale) that ``step_size=None`` starts from and never exceeds.
    :ivar float sampling_fraction: the sampling step as a fraction of warmup's
        last, where the run's length or the bias law is unknown.
    :ivar scale_max: the largest scale s ``adapt_mass_matrix`` may set (``None``:
        no bound, and the option is on by default with ``step_size=None``).
    :ivar dict bias_laws: the rule's discretisation bias law in u by variant
        (:class:`~numpyro_sgbd.discretisation.BiasLaw`).
    :ivar dict bias_law_at: the hyperparameters the laws were measured at.
    :ivar resolve: ``resolve(hyper, shapes, one_z, preconditioned, args) ->
        step_kwargs`` at ``init``, where a hyperparameter needs z's structure
        (NOGIN's flat mass, SGRLD's metric); by default each number per site.
    :ivar noise_form: ``noise_form(hyper, variant, shapes, plates, source) ->
        form``, what the estimator returns besides the gradient (``None``,
        ``"sd"`` or a covariance form); ``shapes`` and ``plates`` ``None``
        before the model is traced (or without one), ``source`` ``"model"``,
        ``"potential_fn"`` or ``"gradient_fn"``. By default ``"sd"`` for the
        corrected variant.
    :ivar check_probe: ``check_probe(probe, one_z, noise_form, source)``, a
        user's gradient estimate's shapes checked before compiling.
    :ivar family_options: ``family_options(step_kwargs, noise_form,
        independent) -> dict`` of further :class:`core.Family` fields (and the
        step's arguments, where the noise form is one), ``independent`` whether
        the noise covariance comes from a second minibatch.
    :ivar allowed: ``allowed(target, state) -> step``, the step the noise
        allows now where the sampler bounds it by its own statistic.
    :ivar run_checks: the sampler's own :class:`RunChecks`, or ``None``.
    """

    name: str
    init: Callable
    step: Callable
    state_type: type
    hyperparameters: dict = {}
    defaults: dict = {}
    not_taken: tuple = ()
    fixed: dict = {}
    check: Any = None
    family: Any = None
    variants: tuple = ("vanilla", "corrected")
    init_args: tuple = ()
    noise_diffusion: Any = None
    noise_step_bound: Any = None
    step_target: float = 0.5
    sampling_fraction: float = 1.0
    scale_max: Any = 1.0
    bias_laws: dict = {}
    bias_law_at: dict = {}
    resolve: Any = None
    noise_form: Any = None
    check_probe: Any = None
    family_options: Any = None
    allowed: Any = None
    run_checks: Any = None


def _names(spec):
    """The keyword names a sampler's constructor takes, in ``help()``'s order,
    with their defaults."""
    out = {"step_size": spec.defaults.get("step_size", SHARED["step_size"])}
    out.update(spec.hyperparameters)
    for name, default in SHARED.items():
        if name not in out and name not in spec.not_taken and name not in spec.fixed:
            out[name] = spec.defaults.get(name, default)
    return out


def arguments(spec, sources, kwargs):
    """Every argument of a constructor call, by name: ``sources`` (the model,
    ``potential_fn``, ``gradient_fn``) and ``kwargs`` against ``spec``'s names
    and defaults. An unknown or misspelt keyword, or a missing required one,
    raises a ``TypeError`` naming the closest valid name and all of them."""
    names = _names(spec)
    unknown = [k for k in kwargs if k not in names]
    if unknown:
        valid = [*SOURCES, *names]
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(
            f"{spec.name} got an unexpected keyword argument {unknown[0]!r}{hint}. "
            f"Its arguments are: {', '.join(valid)}."
        )
    args = {**SHARED, **names, **spec.fixed, **kwargs, **sources}
    missing = [k for k, v in args.items() if v is REQUIRED]
    if missing:
        raise TypeError(
            f"{spec.name} is missing a required keyword argument {missing[0]!r}."
        )
    return args


def signature(spec):
    """The signature ``help()`` shows for the sampler's constructor."""
    kinds = inspect.Parameter
    params = [kinds(s, kinds.POSITIONAL_OR_KEYWORD, default=None) for s in SOURCES]
    params += [
        kinds(name, kinds.KEYWORD_ONLY, default=default)
        for name, default in _names(spec).items()
    ]
    return inspect.Signature(params)


class SpecSignature:
    """``cls.__signature__``, so that ``inspect.signature(SGBD)`` and ``help``
    show the constructor's arguments as the spec declares them."""

    def __get__(self, obj, cls):
        spec = getattr(cls, "spec", None)
        return None if obj is not None or spec is None else signature(spec)


# --------------------------------------------------- what the defaults are
def own_hyperparameters(spec, args):
    """The hyperparameters the step takes: ``spec.check``'s, else the own
    arguments as given."""
    if spec.check is not None:
        return spec.check(args)
    return {name: args[name] for name in spec.hyperparameters}


def default_noise_form(hyper, variant, shapes, plates, source):
    """The family samplers' noise: the corrected variant needs the per-coordinate
    noise sd, the others none."""
    return "sd" if variant == "corrected" else None


def default_check_probe(probe, one_z, noise_form, source):
    """The corrected variant needs the noise sd of a user's gradient."""
    if noise_form == "sd" and probe.noise_sd is None:
        raise ValueError(
            "variant='corrected' needs the noise sd of the gradient: gradient_fn "
            "must return GradientEstimate(z_grad, noise_sd=...)."
        )


def per_site(hyper, shapes, one_z, preconditioned, args=None):
    """Each number per site (a scalar in u with a preconditioner); strings,
    functions and ``None`` as they are."""
    resolved = {}
    for name, value in hyper.items():
        if value is None or callable(value) or isinstance(value, str):
            resolved[name] = value
        elif preconditioned and isinstance(value, dict):
            raise ValueError(
                f"with a preconditioner {name} is in the whitened coordinates "
                "u, which have no sites: give a positive scalar."
            )
        elif preconditioned:
            resolved[name] = jnp.asarray(value, jnp.result_type(float))
        else:
            resolved[name] = _per_site(value, shapes, name)
    return resolved


def flat_per_site(value, shapes, one_z, name):
    """A number, array or dict of sites as one flat vector over z raveled by
    :func:`~jax.flatten_util.ravel_pytree` (NOGIN's mass)."""
    value = _per_site(value, shapes, name)
    flat_z, _ = ravel_pytree(one_z)
    if isinstance(value, dict):  # ravel_pytree orders both dicts by key
        value = ravel_pytree(value)[0]
    elif isinstance(shapes, dict):  # one scalar for every site
        value = jnp.broadcast_to(value, flat_z.shape)
    else:  # z is one array
        value = jnp.broadcast_to(value, shapes).ravel()
    return jnp.asarray(value, flat_z.dtype)


def step_bound(spec):
    """``bound(family, largest)`` for :func:`core.build_kernel`."""
    if spec.noise_step_bound is None:
        return core.noise_step_bound
    return lambda family, largest: spec.noise_step_bound(largest)
