"""A model's full-data potential as a flat objective for the mode search.

:func:`full_data_objective` turns a model with subsample plates into an
:class:`Objective`: the potential of ``full_batch(model)`` over the flat
unconstrained parameters, its gradient summed over the data a chunk of rows at a
time, and Hessian-vector products by forward mode over that gradient. Its
compiled programs are kept per model and data shapes (:func:`kept_programs`), so
a second search on new data of the same shapes compiles nothing. Also here: what
the model is (its subsample plates, its local sites, :func:`model_local_sites`).
"""

import collections
from typing import Callable, NamedTuple

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
from numpyro.infer.util import potential_energy

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
from numpyro_sgbd.local_sites import local_sites_of
from numpyro_sgbd.sharding import data_sharding

__all__ = [
    "LOCAL_SITES_REASON",
    "Objective",
    "full_data_objective",
    "kept_programs",
    "local_sites_reason",
    "model_local_sites",
    "model_plates",
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


def model_plates(model, model_args, model_kwargs):
    """``{name: (size, subsample_size)}`` of the plates that subsample, from an
    abstract trace (:func:`jax.eval_shape`: op by op, it compiled some twenty
    one-operation programs)."""
    return _model_facts(model, model_args, model_kwargs)[0]


def _model_facts(model, model_args, model_kwargs):
    """``(plates, enumerate_dim, local)``: :func:`model_plates`' plates,
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
