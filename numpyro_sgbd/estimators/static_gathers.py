"""Indexing by a value known when tracing, rewritten as a reshape, so that the
per-datum gradients of a model with enumerated sites do not scatter.

Under :mod:`~numpyro_sgbd.enumeration` a mixture's component ``c`` holds all
its values at once, ``arange(K)`` along a dimension of its own, and the model
reads ``mu[c]``: a gather whose indices are fixed when the program is traced.
It picks ``mu`` itself, laid along that dimension. Its transpose in the
per-datum gradients (``vmap`` of ``grad`` over the minibatch) is a scatter-add
per datum, which cost XLA on the CPU about as much as the rest of the datum's
term. :func:`without_static_gathers` traces a function to a jaxpr, folds the
integer operations whose inputs are all known (the enumeration's ``iota`` and
the bounds arithmetic on it), and evaluates the jaxpr with every gather whose
indices are then known and select the operand's elements in order, each once,
broadcast over some axes, replaced by that reshape and broadcast. Other gathers
are left as they are. Op by op the values are the same numbers (a gather and
a reshape pick the same elements), and so are the gradients (each element of
the operand receives the same sum of cotangents); compiled, XLA may fuse the
two programs differently, which moves results by float rounding.
"""

import jax
from jax import lax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np

__all__ = ["without_static_gathers"]

#: Known arrays up to this size are folded (the enumeration's values are
#: small; a large known array is left to XLA).
_FOLD_SIZE = 1 << 16


def without_static_gathers(fn):
    """``fn`` (arrays in, arrays out, any pytrees) evaluated with every gather
    by indices known at trace time that amounts to a reshape and broadcast of
    its operand written as one; the same values and gradients, and no
    scatter-add in their transposes. Traces ``fn`` once more on each call."""

    def rewritten(*args):
        leaves, tree = jax.tree.flatten(args)

        def flat(*leaves):
            return fn(*jax.tree.unflatten(tree, leaves))

        closed, shape = jax.make_jaxpr(flat, return_shape=True)(*leaves)
        outs = _evaluate(closed.jaxpr, closed.consts, leaves)
        return jax.tree.unflatten(jax.tree.structure(shape), outs)

    return rewritten


def _evaluate(jaxpr, consts, args):
    """``jaxpr`` on ``consts`` and ``args``, as ``jax.core.eval_jaxpr`` runs it,
    with known integer values folded, nested ``jit`` calls inlined and static
    gathers rewritten (:func:`_gather`). ``known``: the variables whose values
    are concrete arrays."""
    env, known = {}, set()

    def read(v):
        return v.val if isinstance(v, jax_core.Literal) else env[v]

    def is_known(v):
        return isinstance(v, jax_core.Literal) or v in known

    for v, x in [*zip(jaxpr.constvars, consts), *zip(jaxpr.invars, args)]:
        env[v] = x
        if not isinstance(x, jax.core.Tracer):
            known.add(v)
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive.name in ("jit", "pjit"):
            inner = eqn.params["jaxpr"]
            outs = _evaluate(inner.jaxpr, inner.consts, invals)
        elif eqn.primitive.name == "gather" and is_known(eqn.invars[1]):
            outs = _gather(eqn, *invals)
        elif all(map(is_known, eqn.invars)) and _foldable(eqn):
            with jax.ensure_compile_time_eval():
                outs = _bind(eqn, invals)
        else:
            outs = _bind(eqn, invals)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            if isinstance(v, jax_core.DropVar):
                continue
            env[v] = x
            if not isinstance(x, jax.core.Tracer):
                known.add(v)
    return [read(v) for v in jaxpr.outvars]


def _foldable(eqn):
    """Whether ``eqn``, its inputs known, is evaluated now: integer or boolean
    results of modest size and no effects (float arithmetic is left to XLA,
    whose results it stays bit for bit)."""
    if eqn.effects:
        return False
    for v in eqn.outvars:
        aval = v.aval
        integral = jnp.issubdtype(aval.dtype, jnp.integer) or aval.dtype == bool
        if not integral or np.prod(aval.shape, dtype=int) > _FOLD_SIZE:
            return False
    return True


def _bind(eqn, invals):
    """``eqn``'s primitive applied to ``invals``, as ``eval_jaxpr`` applies it
    (``get_bind_params`` returned ``(subfuns, params)`` before JAX 0.7)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns = ()
    if isinstance(params, tuple):
        subfuns, params = params
    with eqn.ctx.manager:
        return eqn.primitive.bind(*subfuns, *invals, **params)


def _gather(eqn, operand, indices):
    """The gather ``eqn`` of ``operand`` by the known ``indices``: where it
    takes the operand's elements in order, each once, broadcast over some of
    the result's axes, that reshape and broadcast; else the gather."""
    size = int(np.prod(eqn.invars[0].aval.shape, dtype=int))
    shape = tuple(eqn.outvars[0].aval.shape)
    if not 0 < size <= _FOLD_SIZE or not 0 < np.prod(shape, dtype=int) <= _FOLD_SIZE:
        return _bind(eqn, [operand, indices])
    params = dict(eqn.params)
    params["fill_value"] = -1  # an index out of bounds, where the mode fills
    with jax.ensure_compile_time_eval():
        positions = jnp.arange(size).reshape(eqn.invars[0].aval.shape)
        source = np.asarray(
            lax.gather_p.bind(positions, jnp.asarray(indices), **params)
        )
    # The axes along which the source position varies keep their length.
    varying = [
        (np.take(source, [0], axis) != source).any() for axis in range(len(shape))
    ]
    kept = tuple(n if v else 1 for n, v in zip(shape, varying))
    if np.prod(kept, dtype=int) != size:
        return _bind(eqn, [operand, indices])
    if (source != np.broadcast_to(np.arange(size).reshape(kept), shape)).any():
        return _bind(eqn, [operand, indices])
    return jnp.broadcast_to(jnp.reshape(operand, kept), shape)
