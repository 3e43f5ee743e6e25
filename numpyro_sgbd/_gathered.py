"""Per-datum gradients of parameters that a datum reads through one gather.

A datum's log-likelihood usually touches a large parameter only through an
index: a user's row of a factor matrix (``U[users[i]]``), a group's effect
(``alpha[group[i]]``). Its gradient in that parameter is then zero outside one
slice, and the noise statistics the corrected kernels need (per-coordinate
mean and sum of squared deviations over the n data of a minibatch, SPEC.md,
noise estimation) follow from the slices' gradients and where they sit: O(n
times the slice) work plus a few passes over the parameter, where forming each
datum's dense gradient costs O(n d).

:func:`trace_gathers` finds such parameters in the program of one datum's term
(JAX's jaxpr); :func:`gathered_rows` evaluates that program with each of their
gathers cut open, so that reverse mode gives the gradient of the gathered slice
instead of the whole parameter. Anything else (a parameter read twice, through
another operation, or at indices that depend on the parameters) keeps its dense
per-datum gradient.
"""

from contextlib import nullcontext
import math

import jax
import jax.numpy as jnp

try:  # public from JAX 0.4.30
    from jax.extend.core import DropVar, Literal
except ImportError:  # pragma: no cover - older JAX
    from jax.core import DropVar, Literal


class GatherPlan:
    """What :func:`trace_gathers` found: the closed program of one datum's term,
    its live equations, and, per parameter leaf, the index of the one gather
    that reads it (``None`` for a leaf whose per-datum gradient stays dense)."""

    def __init__(self, closed, live, cuts):
        self.closed = closed
        self.live = live
        self.cuts = cuts  # {equation index: leaf index}
        self.gathers = {j: closed.jaxpr.eqns[k] for k, j in cuts.items()}


def _live_equations(jaxpr):
    """Indices of the equations that the outputs depend on (or that have
    effects), found backwards from the outputs."""
    needed = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    live = set()
    for k in reversed(range(len(jaxpr.eqns))):
        eqn = jaxpr.eqns[k]
        outs = [v for v in eqn.outvars if not isinstance(v, DropVar)]
        if eqn.effects or any(v in needed for v in outs):
            live.add(k)
            needed.update(v for v in eqn.invars if not isinstance(v, Literal))
    return live


def trace_gathers(term, leaves, index):
    """The :class:`GatherPlan` of ``term(leaves, index)`` (a scalar: one datum's
    likelihood term as a function of the flat parameter leaves), or ``None`` when
    no leaf qualifies.

    A leaf qualifies when the term reads it in exactly one place, as the operand
    of a ``gather`` that takes one slice (one start index: the datum's row), at
    start indices that do not depend on any parameter. A slice's entries are
    distinct coordinates, so the datum's gradient in that leaf is the slice's
    gradient scattered there and nothing else.
    """
    closed = jax.make_jaxpr(term)(leaves, index)
    jaxpr = closed.jaxpr
    leaf_vars = jaxpr.invars[: len(leaves)]
    live = _live_equations(jaxpr)
    depends = set(leaf_vars)  # variables computed from the parameters
    uses = {v: [] for v in leaf_vars}
    for k in sorted(live):
        eqn = jaxpr.eqns[k]
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        for position, v in enumerate(eqn.invars):
            if not isinstance(v, Literal) and v in uses:
                uses[v].append((k, position))
        if any(v in depends for v in ins):
            depends.update(v for v in eqn.outvars if not isinstance(v, DropVar))
    outputs = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    cuts = {}
    for j, v in enumerate(leaf_vars):
        if v in outputs or len(uses[v]) != 1:
            continue
        k, position = uses[v][0]
        eqn = jaxpr.eqns[k]
        if eqn.primitive.name != "gather" or position != 0:
            continue
        start = eqn.invars[1]
        if not isinstance(start, Literal) and start in depends:
            continue
        dims = eqn.params["dimension_numbers"]
        if getattr(dims, "operand_batching_dims", ()):
            continue
        if math.prod(start.aval.shape[:-1]) != 1:  # one slice only
            continue
        cuts[k] = j
    return GatherPlan(closed, live, cuts) if cuts else None


def _evaluate(plan, leaves, index, deltas):
    """The term at ``(leaves, index)`` with ``deltas[j]`` added to the output of
    leaf j's gather, and each such gather's start indices: ``(value, starts)``.
    The gradient in ``deltas`` at zero is the gradient in the gathered slices."""
    jaxpr = plan.closed.jaxpr
    env = dict(zip(jaxpr.constvars, plan.closed.consts))
    env.update(zip(jaxpr.invars, [*leaves, index]))

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    starts = {}
    for k, eqn in enumerate(jaxpr.eqns):
        if k not in plan.live:
            continue
        ins = [read(v) for v in eqn.invars]
        params = eqn.primitive.get_bind_params(eqn.params)
        # JAX < 0.5 returns (subfunctions, params); later JAX the params alone.
        subfuns, params = params if isinstance(params, tuple) else ((), params)
        with getattr(getattr(eqn, "ctx", None), "manager", nullcontext()):
            outs = eqn.primitive.bind(*subfuns, *ins, **params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        if k in plan.cuts:
            j = plan.cuts[k]
            outs = [outs[0] + deltas[j]]
            starts[j] = ins[1]
        for v, x in zip(eqn.outvars, outs):
            if not isinstance(v, DropVar):
                env[v] = x
    (value,) = [read(v) for v in jaxpr.outvars]
    return value, starts


def gathered_rows(plan, leaves, indices):
    """Each datum's term gradient for the n data ``indices``: ``(dense, local,
    starts)``, three lists over the leaves. A gathered leaf j has ``dense[j]``
    None, ``local[j]`` the n slices' gradients and ``starts[j]`` their start
    indices; any other leaf has its dense rows ``dense[j]`` (n, *leaf shape)."""
    cut = set(plan.gathers)
    zeros = {
        j: jnp.zeros(eqn.outvars[0].aval.shape, eqn.outvars[0].aval.dtype)
        for j, eqn in plan.gathers.items()
    }

    def one(index):
        def value(dense, deltas):
            full = [leaves[j] if j in cut else dense[j] for j in range(len(leaves))]
            return _evaluate(plan, full, index, deltas)

        dense = [None if j in cut else x for j, x in enumerate(leaves)]
        grads, starts = jax.grad(value, argnums=(0, 1), has_aux=True)(dense, zeros)
        return grads, starts

    (dense, local), starts = jax.vmap(one)(indices)
    n = len(leaves)
    return (
        [dense[j] if j not in cut else None for j in range(n)],
        [local.get(j) for j in range(n)],
        [starts.get(j) for j in range(n)],
    )


def gather_of(eqn):
    """``fn(operand, start)``: the equation's gather, of any operand of its
    operand's shape."""

    def fn(operand, start):
        return eqn.primitive.bind(operand, start, **eqn.params)

    return fn
