"""Preparing a kernel from a model and its data, as values (issue 44: set-up as
a value).

:func:`prepare` traces the model once (:func:`trace_model`), finds the set-up
its options ask for (:func:`find_setup`: the full-data mode and the
preconditioner there; :func:`control_variates`: the centre) and builds the
gradient estimator, and returns them as one immutable :class:`Prepared`, which
the kernels (:mod:`numpyro_sgbd.prepared_model`) keep and :func:`~numpyro_sgbd.tune`
shares between its arms through the :class:`~numpyro_sgbd.setup.Setup` in it.
The chains' start is :mod:`numpyro_sgbd.prepared_model`'s; the compiled programs
that run once per set-up are kept in :class:`Programs`.
"""

import contextlib
from typing import Any, NamedTuple
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.distributions.transforms import biject_to

from numpyro_sgbd import preconditioning
from numpyro_sgbd.enumeration import enumeration_dim, is_enumerated
from numpyro_sgbd.estimators import (
    ControlVariateEstimator,
    MinibatchEstimator,
    as_jax_arrays,
    jit_once,
    split_arrays,
)
from numpyro_sgbd.estimators.minibatch import STREAMED_NOISE_ROWS
from numpyro_sgbd.handlers import SubsamplePlates, sample_trace, subsample_plates
from numpyro_sgbd.local_sites import local_site
from numpyro_sgbd.mode.network import NetworkWarning, warn_network
from numpyro_sgbd.setup import (
    Setup,
    dimension,
    find_centre,
    find_local_preconditioner,
    find_network_preconditioner,
    find_preconditioner,
)
from numpyro_sgbd.sharding import data_sharding
from numpyro_sgbd.updates.nogin import NOISE_ROWS_PER_STEP
from numpyro_sgbd.validation import check_plate_data

__all__ = [
    "LOG_LIKELIHOOD_ALL_ROWS",
    "LogLikelihoodSubsetWarning",
    "ModelInfo",
    "NetworkWarning",
    "Prepared",
    "Programs",
    "Request",
    "build_estimator",
    "control_variates",
    "data_key",
    "evaluation_indices",
    "find_setup",
    "has_tracer",
    "model_rows",
    "network_modules",
    "prepare",
    "trace_model",
]


def has_tracer(tree):
    """Whether any leaf of ``tree`` is a JAX tracer (abstract, inside a transform)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def eager_if_traced(tree):
    """``jax.ensure_compile_time_eval()`` where ``tree`` holds a tracer (the
    kernel set up inside a transform), else a context that does nothing."""
    return (
        jax.ensure_compile_time_eval() if has_tracer(tree) else contextlib.nullcontext()
    )


def data_key(model_args, model_kwargs):
    """``(key, arrays)``: the identity of the model arguments, for caching what
    was computed from them (the arrays' ids, kept alive by ``arrays`` so they are
    not reused, and the other leaves' values)."""
    leaves, treedef = jax.tree.flatten((model_args, model_kwargs))
    arrays = tuple(x for x in leaves if isinstance(x, (np.ndarray, jax.Array)))
    ids = tuple(id(x) if isinstance(x, (np.ndarray, jax.Array)) else x for x in leaves)
    return (treedef, ids), arrays


class Programs:
    """Compiled programs that run once per set-up (the initial search, the
    initial state, the constrained values NumPyro sizes its buffers with, the
    Laplace start), kept for the last argument structure; a pickled copy keeps
    none. ``once=False`` for a program that runs many times (a sample's steps):
    plain ``jax.jit``, never XLA's lowest optimisation level."""

    def __init__(self, once=True):
        self._key, self._fn, self._once = None, None, once

    def get(self, key, build):
        """The program for ``key``: kept, or ``jit_once(build())``."""
        if self._fn is None or key is None or key != self._key:
            jit = jit_once if self._once else jax.jit
            self._key, self._fn = key, jit(build())
        return self._fn

    def over_data(self, make, *trees):
        """``(fn, arrays)``: ``make(rebuild)`` compiled, whose last argument is
        the array leaves of ``trees`` (the model arguments, and what else the
        program reads from the data), and those arrays. The arrays are passed as
        arguments (data embedded as constants makes XLA compile slowly, and anew
        for every kernel); the other leaves (ints such as a subsample size) stay
        static, put back by ``rebuild``."""
        arrays, rebuild, key = split_arrays(trees)
        return self.get(key, lambda: make(rebuild)), arrays

    def clear(self):
        self._key, self._fn = None, None

    def __getstate__(self):
        return {"_key": None, "_fn": None, "_once": self._once}


class ModelInfo(NamedTuple):
    """What one trace of the model shows (:func:`trace_model`).

    :ivar dict plates: ``{name: (size, n, dim)}`` of each subsample plate: its
        size, subsample size and the batch dim of its observed sites.
    :ivar dict shapes: the unconstrained shape of each latent site.
    :ivar tuple deterministic: the deterministic sites inside a subsample plate
        (left out of the draws: they have a minibatch's shape).
    :ivar int enumerate_dim: where the model has discrete sites marked for
        enumeration, the first enumeration dimension (left of its plates); they
        are summed out datum by datum (:mod:`~numpyro_sgbd.enumeration`).
        ``None`` otherwise.
    :ivar dict local: ``{name: LocalSite}`` of the latent sites inside the
        subsample plate, sampled row by row (:mod:`~numpyro_sgbd.local_sites`);
        not in ``shapes``.
    :ivar tuple modules: the names of the neural networks the model builds with
        ``numpyro.contrib.module``'s random modules (:func:`network_modules`).
    """

    plates: dict
    shapes: dict
    deterministic: tuple
    enumerate_dim: Any = None
    local: Any = None
    modules: tuple = ()


def network_modules(trace, shapes):
    """The names of the networks ``numpyro.contrib.module``'s random modules
    (``random_flax_module``, ``random_nnx_module``, ``random_eqx_module``) build
    in ``trace``: each registers its parameters as a param site
    ``'<name>$params'`` and samples them as latent sites ``'<name>/...'``."""
    names = []
    for site_name, site in trace.items():
        if site["type"] != "param" or not site_name.endswith("$params"):
            continue
        prefix = site_name[: -len("$params")]
        if any(latent.startswith(prefix + "/") for latent in shapes):
            names.append(prefix)
    return tuple(names)


def _read_sites(trace, plates):
    """``(dims, shapes, deterministic, enumerate_dim, local)`` from a traced
    model; raises on a discrete latent site the kernels cannot sum out
    (:func:`~numpyro_sgbd.enumeration.check_enumerated`) or a continuous latent
    site inside a subsample plate that cannot be sampled row by row
    (:func:`~numpyro_sgbd.local_sites.local_site`)."""
    enumerate_dim = enumeration_dim(trace, plates)
    dims, shapes, deterministic, local = {}, {}, [], {}
    for name, site in trace.items():
        in_plates = [f for f in site.get("cond_indep_stack", []) if f.name in plates]
        if site["type"] == "deterministic" and in_plates:
            deterministic.append(name)
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            for frame in in_plates:
                dims[frame.name] = frame.dim
            continue
        if is_enumerated(site):  # summed out (checked above)
            continue
        if in_plates:
            local[name] = _local_site(name, site, in_plates, plates, enumerate_dim)
            continue
        unconstrained = biject_to(site["fn"].support).inv(site["value"])
        shapes[name] = tuple(jnp.shape(unconstrained))
    return dims, shapes, tuple(deterministic), enumerate_dim, local


def _local_site(name, site, in_plates, plates, enumerate_dim):
    """The :class:`~numpyro_sgbd.local_sites.LocalSite` of a continuous latent
    site inside the subsample plate, where the kernels can sample it row by row
    (one subsample plate, no enumerated sites)."""
    plate = in_plates[0].name
    if len(plates) > 1 or enumerate_dim is not None:
        why = (
            f"the model subsamples {sorted(plates)}"
            if len(plates) > 1
            else "the model also has enumerated discrete sites"
        )
        raise ValueError(
            f"Site '{name}' is a latent variable inside the subsample plate "
            f"'{plate}'. Local sites are sampled row by row with one subsample "
            f"plate and no enumerated sites, but {why}: subsample a single "
            "plate, or marginalise the site."
        )
    return local_site(name, site, in_plates[0], plates)


def trace_model(model, model_args, model_kwargs):
    """The :class:`ModelInfo` of ``model`` from one trace with ``init_to_sample``
    values, validated (NumPyro's plate check as NUTS runs it; no discrete latent
    site, none inside a subsample plate). Warns when nothing is subsampled.

    The trace is abstract (:func:`jax.eval_shape`): run op by op, it compiled
    some twenty one-operation programs, about a second of a fresh process. Only
    static facts leave it."""
    found = {}
    # NumPy data indexed by the plate's traced indices (X[idx]) must be JAX arrays.
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))

    def structure():
        trace = sample_trace(SubsamplePlates(model), model_args, model_kwargs)
        # NumPyro's own check of the model's plates, as NUTS runs it (it warns
        # when a batch dimension has no plate). Private in NumPyro: skipped where
        # a version lacks it.
        validate = getattr(numpyro.util, "_validate_model", None)
        if validate is not None:
            validate(trace, plate_warning="loose")
        plates = subsample_plates(trace)
        sites = _read_sites(trace, plates)
        found["out"] = (plates, *sites, network_modules(trace, sites[1]))

    jax.eval_shape(structure)
    plates, dims, shapes, deterministic, enumerate_dim, local, modules = found["out"]
    if not plates:
        warnings.warn(
            "The model has no subsampled plate, so every step uses the full data "
            "(exact gradients: the unadjusted dynamics). For minibatches "
            "write numpyro.plate(name, N, subsample_size=n).",
            UserWarning,
            stacklevel=5,
        )
    plates = {name: (size, n, dims.get(name)) for name, (size, n) in plates.items()}
    return ModelInfo(plates, shapes, deterministic, enumerate_dim, local, modules)


#: Rows of a subsample plate up to which a kernel's :attr:`~numpyro_sgbd.SGBD.model`
#: (and so ArviZ's ``log_likelihood``) holds every row by default: ArviZ keeps
#: draws x rows log-densities, 4 bytes each (200 MB for 1,000 draws at this size).
LOG_LIKELIHOOD_ALL_ROWS = 50_000


class LogLikelihoodSubsetWarning(UserWarning):
    """A kernel's :attr:`~numpyro_sgbd.SGBD.model` holds a subset of a plate's
    rows by default (a plate above :data:`LOG_LIKELIHOOD_ALL_ROWS` rows), so
    ``az.loo`` and ``az.waic`` on ``az.from_numpyro`` cover only those rows."""


def _draw_rows(plates, sizes):
    """``{plate: sorted int32 indices}``: ``sizes[plate]`` rows of each plate,
    all of them in order where that is its size, else drawn without replacement
    by NumPy (seed 0, in the plates' order): a compiled draw was a compilation of
    its own in every run."""
    rng = np.random.default_rng(0)
    rows = {}
    for name, (size, _, _) in plates.items():
        m = min(sizes[name], size)
        if m == size:
            rows[name] = jnp.asarray(np.arange(size, dtype=np.int32))
            continue
        rows[name] = jnp.asarray(
            np.sort(rng.choice(size, m, replace=False)).astype(np.int32)
        )
    return rows


def evaluation_indices(plates, log_likelihood_size):
    """The fixed rows of each subsample plate that a kernel's
    :attr:`~numpyro_sgbd.SGBD.model` evaluates, and so ArviZ's
    ``log_likelihood`` and ``observed_data`` hold: ``log_likelihood_size`` of
    them (all, where it is at least the plate's size); by default (``None``)
    every row of a plate of up to :data:`LOG_LIKELIHOOD_ALL_ROWS` rows, and that
    many rows drawn at random from a larger one."""
    size = log_likelihood_size or LOG_LIKELIHOOD_ALL_ROWS
    return _draw_rows(plates, {name: size for name in plates})


def model_rows(plates):
    """The fixed rows (the plate's subsample size of them) on which a kernel
    traces its model for the chains' start and the constrained values: only the
    global sites are read there, so a minibatch's worth of rows will do."""
    return _draw_rows(plates, {name: n for name, (_, n, _) in plates.items()})


def build_estimator(
    model,
    plates,
    noise_form,
    *,
    replace,
    preconditioner,
    sharding,
    enumerate_dim,
    local=None,
):
    """The minibatch estimator over ``plates``, with the noise the sampler needs
    (``noise_form``: ``None``, ``"sd"`` or a covariance form), summing out the
    enumerated sites from ``enumerate_dim`` (``None``: none), reading the
    ``local`` sites' rows from z."""
    rows = None
    if len(plates) == 1 and preconditioner is not None:
        ((_, n, _),) = plates.values()
        if sharding is not None:
            n = sharding.local_subsample_size
        rows = preconditioning.noise_rows(
            preconditioner, n, preconditioner.loc.shape[0]
        )
    covariance, covariance_rows = noise_form, None
    if noise_form in (None, "sd"):
        covariance = None
    elif noise_form == "lowrank+diag":  # NOGIN's running estimate, its own rows
        ((size, _, _),) = plates.values()
        covariance, covariance_rows = "rows", min(NOISE_ROWS_PER_STEP, size)
    return MinibatchEstimator(
        model,
        plates,
        noise=noise_form == "sd",
        covariance=covariance,
        covariance_rows=covariance_rows,
        replace=replace,
        pullback=None if preconditioner is None else preconditioner.pull,
        sharding=sharding,
        noise_rows=rows,
        enumerate_dim=enumerate_dim,
        local=local,
        streamed_noise_rows=STREAMED_NOISE_ROWS,
    )


class CentreRequest(NamedTuple):
    """What the control variates' centre is asked to be: ``centre``, the given
    ``{site: value}`` or ``None`` (searched); ``recentre_every``, warmup steps
    between re-centrings or ``None``; ``chunk_size``, rows per full-data chunk."""

    centre: Any
    recentre_every: Any
    chunk_size: int


def control_variates(plain, setup, request, model, shapes, model_args, model_kwargs):
    """``(estimator, setup)``: the control-variate estimator around the given or
    searched centre, with the full-data potential and gradient there computed
    once in chunks (:func:`~numpyro_sgbd.setup.find_centre`), and the set-up
    with the centre kept per dataset."""
    if len(plain.plates) != 1:
        raise ValueError(
            "gradient='control_variates' needs exactly one subsample plate; the "
            f"model subsamples {sorted(plain.plates) or 'none'}."
        )
    if request.centre is None and request.recentre_every is not None:
        # Re-centring from each chain's initial position: no search; the centres
        # live in the state.
        setup = setup._replace(
            centre_info={"centre": None, "source": "initial position"}
        )
        centre = potential = grad = None
    else:
        key, arrays = data_key(model_args, model_kwargs)
        cached = setup.centre
        if cached is not None and cached[0] == key:
            centre, potential, grad = cached[2]
        else:
            setup, (centre, potential, grad) = _new_centre(
                plain, setup, request, model, shapes, model_args, model_kwargs
            )
    estimator = ControlVariateEstimator(
        plain,
        centre=centre,
        centre_potential=potential,
        centre_grad=grad,
        recentre_every=request.recentre_every,
        chunk_size=request.chunk_size,
    )
    return estimator, setup


def _new_centre(plain, setup, request, model, shapes, model_args, model_kwargs):
    """Find the centre for these data, and keep it in the set-up unless it is
    abstract (a kernel set up inside a transform)."""
    if request.centre is None and has_tracer((model_args, model_kwargs)):
        raise ValueError(
            "gradient='control_variates' searches for its centre with "
            "the data in hand, but the model arguments are traced (the "
            "kernel runs inside jax.jit or another transform). Pass "
            "centre={site: value} (e.g. posterior_mode(model, "
            "*args).params) or run MCMC outside the transform."
        )
    centre, potential, grad, info = find_centre(
        setup,
        plain,
        model,
        model_args,
        model_kwargs,
        shapes,
        request.centre,
        request.chunk_size,
    )
    setup = setup._replace(centre_info=info)
    found = (centre, potential, grad)
    if not has_tracer((potential, grad)):
        key, arrays = data_key(model_args, model_kwargs)
        setup = setup._replace(centre=(key, arrays, found))
    return setup, found


class Request(NamedTuple):
    """What a kernel asks :func:`prepare` for.

    :ivar str preconditioner: ``"none"``, ``"auto"`` or a form of
        :data:`~numpyro_sgbd.preconditioning.FORMS`.
    :ivar CentreRequest centre: the control variates' centre, as asked.
    :ivar replace: draw minibatch indices with replacement (``None``: the
        estimator's default).
    :ivar log_likelihood_size: the evaluation rows per plate, or ``None``.
    :ivar str who: the sampler's name, for messages.
    :ivar dict adaptation: the kernel's step target, sampling fraction and
        whether it re-estimates scales, for the set-up's report.
    """

    preconditioner: str
    centre: CentreRequest
    replace: Any
    log_likelihood_size: Any
    who: str
    adaptation: dict


class Prepared(NamedTuple):
    """A kernel prepared from a model and its data (:func:`prepare`).

    :ivar ModelInfo info: the model's subsample plates, latent shapes and
        deterministic sites inside a plate.
    :ivar Setup setup: the full-data mode, the preconditioner and the centre.
    :ivar estimator: the gradient estimator (:mod:`numpyro_sgbd.estimators`).
    :ivar dict log_likelihood_indices: the fixed evaluation rows per plate
        (:func:`evaluation_indices`).
    """

    info: ModelInfo
    setup: Setup
    estimator: Any
    log_likelihood_indices: dict


def prepare(model, model_args, model_kwargs, request, setup, choose):
    """Prepare a kernel from ``model`` and its data: validate the data against
    the plates, trace the model once, let the kernel ``choose(plates, shapes,
    local) -> (noise_form, gradient)`` the noise its rule needs and the
    estimator, find what ``setup`` lacks for these data, and build the
    estimator. A :class:`Prepared`."""
    check_plate_data(model, model_args, model_kwargs)
    info = trace_model(model, model_args, model_kwargs)
    noise_form, gradient = choose(info.plates, info.shapes, info.local)
    traced = has_tracer((model_args, model_kwargs))
    sharding = None if traced else data_sharding(info.plates, model_args, model_kwargs)
    if info.local:
        check_local(info.local, gradient, sharding, request.who)
    if request.preconditioner != "none":
        setup = find_setup(
            setup, model, model_args, model_kwargs, info, request, traced
        )
    estimator = build_estimator(
        model,
        info.plates,
        noise_form,
        replace=request.replace,
        preconditioner=setup.preconditioner,
        sharding=sharding,
        enumerate_dim=info.enumerate_dim,
        local=info.local,
    )
    if gradient == "control_variates":
        estimator, setup = control_variates(
            estimator,
            setup,
            request.centre,
            model,
            info.shapes,
            model_args,
            model_kwargs,
        )
    indices = evaluation_indices(info.plates, request.log_likelihood_size)
    return Prepared(info, setup, estimator, indices)


def check_local(local, gradient, sharding, who):
    """Raise where a kernel's options need what local sites do not have: a
    centre the data's terms concentrate around (control variates) or one
    device's rows. (Their preconditioner and start come from the global sites'
    Laplace marginal: :func:`~numpyro_sgbd.setup.find_local_preconditioner`.)"""
    names = ", ".join(f"'{k}'" for k in sorted(local))
    (plate,) = {s.plate for s in local.values()}
    where = f"{who}: the model's site(s) {names} inside the subsample plate "
    where += f"'{plate}' are local sites, sampled row by row"
    if gradient == "control_variates":
        raise ValueError(
            f"{where}; control variates need every datum's term near one centre, "
            "but each row's local value moves with its own datum. Use "
            "gradient='minibatch'."
        )
    if sharding is not None:
        raise ValueError(
            f"{where} from the state on one device; the data are sharded over "
            "devices. Keep the data on one device for a model with local sites."
        )


def _network_setup(info):
    """Whether the model gets a network's set-up
    (:func:`~numpyro_sgbd.setup.find_network_preconditioner`): it builds a
    network, and its data sit in one subsample plate with no local or
    enumerated sites (the minibatch estimator the fit runs on)."""
    plain = not info.local and info.enumerate_dim is None
    return bool(info.modules) and len(info.plates) == 1 and plain


def find_setup(setup, model, model_args, model_kwargs, info, request, traced):
    """``setup`` with the full-data mode and the preconditioner built from the
    Hessian there (:func:`~numpyro_sgbd.setup.find_preconditioner`; with local
    sites, the global sites' Laplace-marginal mode:
    :func:`~numpyro_sgbd.setup.find_local_preconditioner`), unless it holds them
    for these data already. ``info``: the model's :class:`ModelInfo`."""
    key, arrays = data_key(model_args, model_kwargs)
    if setup.data is not None and setup.data[0] == key:
        return setup
    if traced:
        raise ValueError(
            "step_size=None (or a preconditioner) searches for the mode with "
            "the data in hand, but the model arguments are traced (the kernel "
            "runs inside jax.jit or another transform). Give step_size with "
            "preconditioner='none', or run MCMC outside the transform."
        )
    if info.modules:
        warn_network(request.who, info.modules)
    options = dict(
        who=request.who, chunk_size=request.centre.chunk_size, last_mode=setup.mode
    )
    rows = None
    # "diagonal" too: the form the network set-up builds, which tune's winning
    # kernel names and whose refits would otherwise search by Newton-CG.
    if request.preconditioner in ("auto", "diagonal") and _network_setup(info):
        pre, mode, value_grad, report = find_network_preconditioner(
            model,
            model_args,
            model_kwargs,
            (info.plates, info.modules),
            **options,
        )
    elif info.local:
        facts = (info.plates, info.enumerate_dim, info.local)
        pre, mode, value_grad, report, rows = find_local_preconditioner(
            model, model_args, model_kwargs, facts, request.preconditioner, **options
        )
    else:
        pre, mode, value_grad, report = find_preconditioner(
            model,
            model_args,
            model_kwargs,
            dimension(info.shapes),
            request.preconditioner,
            **options,
        )
    info = {k: v for k, v in report.items() if k != "mode_search"}
    info.update(request.adaptation, mode_search=report["mode_search"])
    return Setup(
        data=(key, arrays),
        preconditioner=pre,
        mode=mode,
        mode_value_grad=value_grad,
        adaptation_info=info,
        local_rows=rows,
    )
