"""Compiled functions of a model's data: the data passed as arguments, not
embedded as constants (:func:`split_arrays`, :func:`as_jax_arrays`), a one-off
program compiled quickly (:func:`jit_once`), and NumPyro's median start as one
such program (:func:`median_start`)."""

from functools import wraps

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.initialization import init_to_median

__all__ = ["as_jax_arrays", "jit_once", "median_start", "split_arrays"]


def split_arrays(tree):
    """``(arrays, rebuild, key)``: the array leaves of ``tree``, a function that puts
    (possibly traced) arrays back among its other leaves, and a hashable key of
    everything but the arrays' values (for caching compiled functions; ``None``
    where a leaf is unhashable).

    Data passed to a jitted function as arguments stay out of the compiled program;
    embedded as constants, a large dataset makes XLA compile slowly, and anew for
    every function that closes over it.
    """
    leaves, treedef = jax.tree.flatten(tree)
    is_array = tuple(isinstance(x, (np.ndarray, jax.Array)) for x in leaves)
    static = tuple(None if a else x for a, x in zip(is_array, leaves))
    arrays = [x for a, x in zip(is_array, leaves) if a]

    def rebuild(arrays):
        it = iter(arrays)
        return jax.tree.unflatten(
            treedef, [next(it) if a else x for a, x in zip(is_array, static)]
        )

    key = (treedef, is_array, static)
    try:
        hash(key)
    except TypeError:
        key = None
    return arrays, rebuild, key


def jit_once(fn):
    """``jax.jit(fn)`` for a program that runs once per set-up (the search's
    start, a kernel's initial state): called on a CPU with concrete arguments, it
    is compiled at XLA's lowest backend optimisation level, where LLVM's passes
    take most of a small program's compile time (about half of it for the
    start's threefry draws) and running it once costs little.
    Inside a trace (``pmap``, ``vmap`` or another ``jit``: a nested ``jit`` takes
    no compiler options of its own) or on an accelerator, plain ``jax.jit``."""
    plain = jax.jit(fn)
    if jax.default_backend() != "cpu":
        return plain
    quick = jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0})

    @wraps(fn)
    def call(*args):
        traced = not _top_level() or any(
            isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)
        )
        return (plain if traced else quick)(*args)

    return call


def _top_level():
    """Whether no JAX trace is active (a ``jit`` called now is a program of its
    own). JAX keeps this private; where it is missing, say no (plain ``jit``)."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover - a JAX that moved it
        return False
    return trace_state_clean()


def median_start(model, arrays, rebuild, rng_key=None):
    """NumPyro's ``init_to_median`` point, unconstrained, by site: one compiled
    function of the data ``arrays`` (``rebuild`` as from :func:`split_arrays`);
    traced op by op, as ``initialize_model`` does, it costs about a hundred small
    compilations."""
    rng_key = random.key(0) if rng_key is None else rng_key
    return median_start_program(model, rebuild)(arrays, rng_key)


def median_start_program(model, rebuild):
    """:func:`median_start` as a compiled function ``(arrays, rng_key) -> z``,
    to keep and call again on other data of the same structure."""

    @jit_once
    def start(arrays, rng_key):
        args, kwargs = rebuild(arrays)
        seeded = handlers.seed(model, rng_key)
        fixed = handlers.substitute(seeded, substitute_fn=init_to_median)
        trace = handlers.trace(fixed).get_trace(*args, **kwargs)
        return {
            name: biject_to(site["fn"].support).inv(site["value"])
            for name, site in trace.items()
            if site["type"] == "sample"
            and not site["is_observed"]
            and not site["fn"].support.is_discrete  # summed out, not sampled
        }

    return start


def as_jax_arrays(tree):
    """NumPy arrays in ``tree`` as JAX arrays, so that traced indices can index them
    (``X[idx]``); other leaves unchanged."""
    return jax.tree.map(
        lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, tree
    )
