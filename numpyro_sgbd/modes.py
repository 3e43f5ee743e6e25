"""Full-data posterior modes: one search, used by every caller.

:func:`posterior_mode`, the control-variate centre of ``SGBD(...,
gradient="control_variates")`` and the Laplace-preconditioned reference
(``reference_posterior(..., laplace=True)``) all minimise the model's full-data
potential with :func:`find_mode`: Newton's method with Levenberg-Marquardt damping,
its steps solved by conjugate gradients (Nocedal & Wright 2006, Algorithm 5.2 and
Section 7.1) over the chunked full-data gradient. Nothing of size d x d is formed during
the search: the curvature comes from Hessian-vector products (forward mode over the
chunked gradient), and the Hessian's diagonal is computed once at the end, d products
in blocks. On a hierarchical model (the ridge between a scale and the effects it
multiplies is curved) L-BFGS took over 1,000 iterations to get within 0.1 sd where
Newton-CG took 60 steps.

Here the model's potential becomes an :class:`Objective`
(:func:`full_data_objective`), and what the search found is checked and reported
(:func:`check_mode`, :func:`posterior_mode`, :func:`search_centre`). The search
itself knows nothing of models: it is in :mod:`numpyro_sgbd.mode_search`, with why
it judges convergence by the gradient and not by the potential's value.
"""

import collections
from typing import Callable, NamedTuple
import warnings

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
from numpyro.infer.util import constrain_fn, potential_energy

from numpyro_sgbd.enumeration import enumeration_dim
from numpyro_sgbd.estimators import (
    MinibatchEstimator,
    as_jax_arrays,
    median_start_program,
    split_arrays,
)
from numpyro_sgbd.handlers import (
    SubsamplePlates,
    full_batch,
    sample_trace,
    subsample_plates,
)
from numpyro_sgbd.hessian import hessian_rows, symmetric
from numpyro_sgbd.local_sites import local_sites_of
from numpyro_sgbd.mode_search import (
    CLOSE,  # noqa: F401 (public here as before the search moved)
    MAX_SECONDS,
    TOLERANCE,  # noqa: F401
    find_mode,
    hessian_diagonal,
)
from numpyro_sgbd.sharding import data_sharding
from numpyro_sgbd.validation import check_plate_data

__all__ = [
    "Objective",
    "PosteriorMode",
    "find_mode",
    "full_data_objective",
    "hessian_diagonal",
    "kept_programs",
    "posterior_mode",
    "search_centre",
]


class Objective(NamedTuple):
    """A model's full-data potential as functions of a flat unconstrained vector."""

    #: NumPyro's ``init_to_median`` point, flattened (``ravel_pytree`` order).
    x0: jax.Array
    #: The inverse of the flattening: a dict of unconstrained values by site.
    unravel: Callable
    #: ``x -> (U(x), grad U(x))``, compiled, the data passed as arguments.
    value_and_grad: Callable
    #: ``(x, V) -> H(x) V^T`` rows: one Hessian-vector product per row of ``V``
    #: (shape ``(k, d)``), forward mode over the (chunked) gradient.
    hvp: Callable
    #: Rows in the chunked plate, or ``None`` where the potential is one pass.
    num_data: int = None
    #: ``(x, V) -> (U(x), grad U(x), H(x) V^T rows)`` in one pass, the program
    #: ``hvp`` runs (``None``: the search calls ``value_and_grad`` and ``hvp``).
    value_grad_hvp: Callable = None
    #: The latent sites inside the subsample plate (local sites, one value per
    #: row: :mod:`~numpyro_sgbd.local_sites`), whose N rows x holds.
    local: tuple = ()


def _subsample_plates(model, model_args, model_kwargs):
    """``{name: (size, subsample_size)}`` of the plates that subsample, from an
    abstract trace (:func:`jax.eval_shape`: op by op, it compiled some twenty
    one-operation programs)."""
    return _model_facts(model, model_args, model_kwargs)[0]


def _model_facts(model, model_args, model_kwargs):
    """``(plates, enumerate_dim, local)``: :func:`_subsample_plates`' plates,
    the first enumeration dimension where the model has discrete sites to sum
    out (checked: :func:`~numpyro_sgbd.enumeration.check_enumerated`), else
    ``None``, and the ``{name: LocalSite}`` of its latent sites inside its one
    subsample plate (:func:`~numpyro_sgbd.local_sites.local_sites_of`; ``None``
    where one cannot be held row by row, and the data are then evaluated in one
    pass)."""
    found = {}

    def trace():  # only static facts leave
        traced = sample_trace(SubsamplePlates(model), model_args, model_kwargs)
        plates = subsample_plates(traced)
        found["plates"], found["dim"] = plates, enumeration_dim(traced, plates)
        try:
            found["local"] = local_sites_of(traced, plates)
        except ValueError:  # e.g. a support whose bounds depend on other sites
            found["local"] = None

    jax.eval_shape(trace)
    return found["plates"], found["dim"], found["local"]


def model_local_sites(model, model_args=(), model_kwargs=None):
    """The names, sorted, of ``model``'s latent sites inside its one subsample
    plate (local sites: :func:`~numpyro_sgbd.local_sites.local_sites_of`), from
    an abstract trace; ``()`` where it has none or several plates."""
    model_kwargs = {} if model_kwargs is None else model_kwargs
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    found = {}

    def trace():  # only names leave
        traced = sample_trace(SubsamplePlates(model), model_args, model_kwargs)
        plates = subsample_plates(traced)
        found["names"] = local_sites_of(traced, plates, check=False)

    jax.eval_shape(trace)
    return tuple(sorted(found["names"]))


#: The start of a reference's ``laplace_reason`` where ``laplace="auto"`` kept
#: plain NUTS, by choice, on a model with local sites.
LOCAL_SITES_REASON = "plain NUTS: the model has latent sites inside its subsample plate"


def local_sites_reason(model, model_args=(), model_kwargs=None):
    """Why ``reference_posterior(laplace="auto")`` keeps plain NUTS on ``model``
    (starting with :data:`LOCAL_SITES_REASON`), where it has local sites: the
    Laplace approximation at the joint mode of per-row latents and the sites
    that scale them is degenerate or far from the bulk (Gelman et al. 2013,
    *Bayesian Data Analysis*, 3rd ed., Chapter 13); ``None`` without."""
    local = model_local_sites(model, model_args, model_kwargs)
    if not local:
        return None
    quoted = ", ".join(f"'{k}'" for k in local)
    return (
        f"{LOCAL_SITES_REASON} ({quoted}): the Laplace approximation at the joint "
        "mode of per-row latents and the sites that scale them does not describe "
        "their posterior (that mode is degenerate, a funnel's neck, or far from "
        "the bulk), so no whitening; laplace=True whitens at it"
    )


def full_data_objective(
    model, model_args=(), model_kwargs=None, *, chunk_size=4096, rng_key=None
):
    """The full-data potential of ``model`` (its subsample plates widened) as an
    :class:`Objective`.

    With one subsample plate the potential and its gradient are summed over the data
    in chunks of ``chunk_size`` rows (memory O(chunk_size x d), see
    :meth:`~numpyro_sgbd.estimators.MinibatchEstimator.full_data`); with none or
    several, ``full_batch(model)`` is evaluated in one pass.

    :param model: a NumPyro model.
    :param tuple model_args: its positional arguments.
    :param dict model_kwargs: its keyword arguments.
    :param int chunk_size: rows per chunk.
    :param rng_key: for ``init_to_median``'s draws (default ``random.key(0)``).
    """
    if not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}.")
    model_kwargs = {} if model_kwargs is None else model_kwargs
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    arrays, rebuild, key = split_arrays((model_args, model_kwargs))
    plates, enumerate_dim, local = _model_facts(model, model_args, model_kwargs)
    sharding = None
    if len(plates) == 1 and local is not None:
        ((name, (size, n)),) = plates.items()
        sharding = data_sharding({name: (size, n, None)}, model_args, model_kwargs)
    if sharding is not None:
        key = None  # the programs hold the data's mesh: not kept

    def build():
        return _objective_programs(
            model,
            (plates, sharding, enumerate_dim, local),
            model_args,
            model_kwargs,
            rebuild,
            chunk_size,
        )

    if key is not None:  # the programs' static sizes: shapes, plates, chunks
        shapes = tuple((jnp.shape(x), jnp.result_type(x)) for x in arrays)
        key = (key, shapes, tuple(sorted(plates.items())), chunk_size)
    programs = kept_programs(model, key, build)
    start, unravel, value_and_grad, value_grad_hvp, num_data = programs
    rng_key = random.key(0) if rng_key is None else rng_key
    x0 = ravel_pytree(start(arrays, rng_key))[0]
    return Objective(
        x0,
        unravel,
        lambda x: value_and_grad(x, arrays),
        lambda x, vectors: value_grad_hvp(x, vectors, arrays)[2],
        num_data,
        lambda x, vectors: value_grad_hvp(x, vectors, arrays),
        tuple(sorted(local or ())),
    )


#: The compiled programs of the last few full-data objectives, by model and
#: structure of its arguments: a search on other data of the same shapes (a
#: second ``MCMC.run``, cross-validation folds, simulation-based calibration)
#: calls them again instead of compiling anew. At most :data:`_KEPT_MAX`, the
#: least recently used dropped (the programs hold the model: a cache keyed
#: weakly by it would never let go of it).
_KEPT = collections.OrderedDict()
_KEPT_MAX = 8


def kept_programs(model, key, build):
    """``build()``'s programs, or those kept for ``(model, key)``."""
    if key is None:
        return build()
    key = (model, key)
    try:
        programs = _KEPT.pop(key, None)
    except TypeError:  # an unhashable model
        return build()
    if programs is None:
        programs = build()
    _KEPT[key] = programs
    while len(_KEPT) > _KEPT_MAX:
        _KEPT.popitem(last=False)
    return programs


def _objective_programs(model, facts, model_args, model_kwargs, rebuild, chunk_size):
    """``(start, unravel, value_and_grad, value_grad_hvp, num_data)`` of
    :func:`full_data_objective`: compiled functions whose last argument is the
    array leaves of the model's arguments, so that they serve any data of the
    same structure. ``facts``: the subsample plates, the data's sharding and
    the first enumeration dimension and the local sites (:func:`_model_facts`)."""
    plates, sharding, enumerate_dim, local = facts
    widened = full_batch(model)
    start = median_start_program(widened, rebuild)
    shapes = jax.eval_shape(
        lambda: start(split_arrays((model_args, model_kwargs))[0], random.key(0))
    )
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    unravel = ravel_pytree(zeros)[1]
    if len(plates) == 1 and local is not None:
        ((name, (size, n)),) = plates.items()
        estimator = MinibatchEstimator(
            model,
            {name: (size, n, None)},
            sharding=sharding,
            enumerate_dim=enumerate_dim,
            local=local,
        )
        run, _ = estimator.full_data_parts(model_args, model_kwargs, chunk_size)

        def flat_value_and_grad(x, arrays):
            value, grad = run(unravel(x), arrays)
            return value, ravel_pytree(grad)[0]

        num_data = size
    else:

        def flat_value_and_grad(x, arrays):
            args, kwargs = rebuild(arrays)

            def potential(x):
                return potential_energy(widened, args, kwargs, unravel(x))

            return jax.value_and_grad(potential)(x)

        num_data = None

    @jax.jit
    def value_grad_hvp(x, vectors, arrays):
        # The primal (U, grad U) does not depend on v: computed once, unbatched.
        def one(v):
            return jax.jvp(lambda x: flat_value_and_grad(x, arrays), (x,), (v,))

        (value, grad), (_, products) = jax.vmap(one, out_axes=((None, None), 0))(
            vectors
        )
        return value, grad, products

    return start, unravel, jax.jit(flat_value_and_grad), value_grad_hvp, num_data


def public_info(info):
    """:func:`find_mode`'s report without its arrays (the Hessian's diagonal, the
    gradient and Hessian at the point) and the flat index ``worst``: what the
    kernels and :func:`posterior_mode` report."""
    private = ("hessian_diag", "worst", "gradient", "hessian")
    return {k: v for k, v in info.items() if k not in private}


def hessian(hvp, x, *, block=64):
    """The full d x d Hessian at ``x`` (symmetrised), d Hessian-vector products
    ``block`` at a time. For the Laplace map of a reference, not for the search."""
    d = x.shape[0]
    out = np.empty((d, d))
    for start, rows in hessian_rows(hvp, x, block=block):
        out[start : start + rows.shape[0]] = rows
    return symmetric(out)


def mode_hessian(objective, x, info):
    """The symmetrised Hessian at ``find_mode``'s point ``x``: the one the search
    formed there (up to 64 parameters), else d Hessian-vector products."""
    if info.get("hessian") is not None:
        return info["hessian"]
    return hessian(objective.hvp, x)


def _site_of(index, unravel, d):
    """``"site[j]"`` for the flat index ``index``."""
    marker = np.zeros(d)
    marker[index] = 1.0
    for name, value in unravel(jnp.asarray(marker)).items():
        flat = np.ravel(np.asarray(value))
        if flat.size and flat.max() == 1.0:
            return f"{name}[{int(np.argmax(flat))}]" if flat.size > 1 else name
    return f"coordinate {index}"


def _figure(value, spec, otherwise, prefix=""):
    """``value`` formatted by ``spec`` after ``prefix``, or the words
    ``otherwise`` where it is not finite: no message says "inf" or "nan"."""
    return prefix + format(value, spec) if np.isfinite(value) else otherwise


def check_mode(info, unravel, what, fix, stacklevel=3):
    """Raise or warn as ``info`` from :func:`find_mode` says: a ValueError when the
    search diverged, stopped a posterior sd or more from a mode, or ended where the
    curvature is not positive; a warning when it stopped between 0.1 and 1 sd away.
    ``fix`` ends each message (what the user can do)."""
    diag = info["hessian_diag"]
    d = diag.shape[0]
    numbers = (
        f"{info['iterations']} Newton-CG steps, "
        f"U = {_figure(info['potential'], '.8g', 'not finite')}, g'H^-1g = "
        f"{_figure(info['newton_decrement'], '.3g', 'not finite')}, largest "
        "gradient in curvature units "
        f"{_figure(info['max_scaled_grad'], '.3g', 'unbounded (no curvature)')} at "
        f"{_site_of(info['worst'], unravel, d) if d else '-'}"
    )
    if not (np.isfinite(info["potential"]) and np.isfinite(info["newton_decrement"])):
        raise ValueError(
            f"{what}: the search diverged, the potential falling without reaching "
            f"a mode; the posterior may be improper ({numbers}). {fix}"
        )
    bad = np.flatnonzero(~(diag > 0))
    if bad.size:
        raise ValueError(
            f"{what}: the potential's curvature at the point found is not positive "
            f"at {_site_of(int(bad[0]), unravel, d)} (H_jj = {diag[bad[0]]:.3g}): not "
            f"a mode; the posterior may be improper ({numbers}). {fix}"
        )
    if info["distance"] >= 1:
        raise ValueError(
            f"{what}: the search stopped ({info['stop']}) "
            f"{_figure(info['distance'], '.3g', 'an unbounded number of', 'about ')} "
            f"posterior sds from a mode ({numbers}). {fix}"
        )
    if not info["converged"]:
        warnings.warn(
            f"{what}: the search stopped ({info['stop']}) about "
            f"{info['distance']:.2g} posterior sds from the mode ({numbers}). {fix}",
            UserWarning,
            stacklevel=stacklevel,
        )


def local_sites_hint(names):
    """What to tell a user whose mode search failed on a model with the local
    sites ``names`` (empty: nothing): the joint mode of per-row latents under a
    scale parameter is degenerate (Gelman et al. 2013, *Bayesian Data
    Analysis*, 3rd ed., Chapter 13), and the non-centred form has one."""
    if not names:
        return ""
    quoted = ", ".join(f"'{k}'" for k in names)
    first = names[0]
    return (
        f"The site(s) {quoted} are per-row latents inside the subsample plate: "
        "where a parameter scales them (a random effect eps_i ~ N(0, s)), the "
        "joint density grows without bound as the scale and the effects shrink "
        "together (a funnel), so no joint mode exists. Write them non-centred "
        "(numpyro.handlers.reparam(model, config={"
        f"'{first}': LocScaleReparam(0)}}) from numpyro.infer.reparam), whose "
        "joint mode exists; the kernels need no mode (give step_size=, or "
        "init_params from a short SGBD run). "
    )


class PosteriorMode(NamedTuple):
    """Result of :func:`posterior_mode`."""

    #: The mode, constrained values by site: pass to ``init_to_value(values=...)``.
    params: dict
    #: The diagonal of the Hessian of the full-data potential at the mode, on the
    #: unconstrained scale, by site (shapes of the unconstrained sites).
    hessian_diag: dict
    #: How the search went: ``iterations``, ``num_evaluations``, ``num_hvp``,
    #: ``potential``,
    #: ``newton_decrement``, ``max_scaled_grad``, ``distance``, ``converged``,
    #: ``stop`` and ``seconds`` (see :func:`find_mode`).
    info: dict


def posterior_mode(
    model,
    *model_args,
    rng_key=None,
    max_iter=200,
    max_seconds=MAX_SECONDS,
    chunk_size=4096,
    **model_kwargs,
):
    """The full-data posterior mode, and the potential's curvature there.

    Minimises the potential of ``full_batch(model)`` (every subsample plate widened
    to the full data) on the unconstrained scale by damped Newton-CG from
    NumPyro's
    ``init_to_median``, summing the data in chunks of ``chunk_size`` rows when the
    model has one subsample plate (:func:`find_mode`: no d x d array is formed, so
    thousands of parameters and 10^8 rows are fine). The potential includes the
    Jacobians of the constraining transforms, so this is the mode of the
    unconstrained density, which the kernels sample.

    Convergence is judged by the gradient in posterior-sd units, not by the value:
    the point returned is within 0.1 posterior sd of the mode (a warning says so
    when it is within 1 sd only), or a ValueError gives the numbers.

    Its use is to start and precondition an SG chain. NOGIN with
    ``mass=hessian_diag`` moves in posterior-sd units (a step of 0.1 to 0.5 is then
    reasonable), and must start near the posterior (see :class:`NOGIN`); for SGBD
    and SGLD, ``step_size={site: c / sqrt(h)}`` with ``h = hessian_diag[site]``
    gives every coordinate the step c in its own sd.

    :param model: a NumPyro model (its subsample plates are widened).
    :param model_args, model_kwargs: the model's arguments.
    :param rng_key: for ``init_to_median``'s draws (default ``random.key(0)``).
    :param int max_iter: Newton-CG steps at most.
    :param float max_seconds: the search's wall-clock budget.
    :param int chunk_size: data rows per chunk of the full-data potential.
    :return: :class:`PosteriorMode` ``(params, hessian_diag, info)``.
    :raises ValueError: if the search stops a posterior sd or more from a mode, or
        where a diagonal entry of the Hessian is not positive (not a mode; the
        model may be improper).

    >>> import numpyro, numpyro.distributions as dist
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=numpyro.subsample(y, 0))
    >>> y = jnp.arange(100.0) / 10  # mean 4.95; the prior moves the mode 0.0005
    >>> mode = posterior_mode(model, y, chunk_size=32)
    >>> bool(abs(mode.params["mu"] - 4.95 * 100 / (100 + 0.01)) < 1e-3)
    True
    >>> round(float(mode.hessian_diag["mu"]), 2)  # N / 1 + 1 / 10^2
    100.01
    """
    check_plate_data(model, model_args, model_kwargs)
    objective = full_data_objective(
        model, model_args, model_kwargs, chunk_size=chunk_size, rng_key=rng_key
    )
    mode, info = find_mode(
        objective, max_iter=max_iter, max_seconds=max_seconds, what="posterior_mode"
    )
    check_mode(
        info,
        objective.unravel,
        "posterior_mode",
        local_sites_hint(objective.local)
        + "Raise max_iter or max_seconds, check the model's priors (an improper "
        "posterior has no mode), or enable float64 "
        "(jax.config.update('jax_enable_x64', True)).",
    )
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    widened = full_batch(model)
    params = constrain_fn(widened, model_args, model_kwargs, objective.unravel(mode))
    diag = objective.unravel(jnp.asarray(info["hessian_diag"], mode.dtype))
    return PosteriorMode(params, diag, public_info(info))


def search_centre(model, model_args, model_kwargs, chunk_size):
    """The full-data mode by :func:`~numpyro_sgbd.modes.find_mode` (Newton-CG on the
    chunked potential, from ``init_to_median``): ``(centre, info)``. Raises if the
    search diverged or stopped a posterior sd or more from a mode, warns if it
    stopped closer than that without converging; logs its report."""
    objective = full_data_objective(
        model, model_args, model_kwargs, chunk_size=chunk_size
    )
    x, info = find_mode(objective, what="control variates' centre")
    centre = objective.unravel(x)
    check_mode(
        info,
        objective.unravel,
        "control variates' centre",
        "The estimate stays unbiased, but its noise grows away from the mode: pass "
        "centre={site: value} (e.g. posterior_mode(model, *args).params), or check "
        "the model's priors.",
        stacklevel=6,
    )
    return centre, {"centre": centre, "source": "Newton-CG", **public_info(info)}
