"""Per-datum gradients of parameters that a datum reads through one gather.

A datum's log-likelihood usually touches a large parameter only through an
index: a user's row of a factor matrix (``U[users[i]]``), a group's effect
(``alpha[group[i]]``). Its gradient in that parameter is then zero outside one
slice, and the noise statistics the corrected kernels need (per-coordinate
mean and sum of squared deviations over the n data of a minibatch,
``docs/maths.rst``, "Gradient noise") follow from the slices' gradients and where
they sit: O(n times the slice) work plus a few passes over the parameter, where
forming each datum's dense gradient costs O(n d).

:func:`trace_gathers` finds such parameters in the program of one datum's term
(JAX's jaxpr); :func:`gathered_rows` evaluates that program with each of their
gathers cut open, so that reverse mode gives the gradient of the gathered slice
instead of the whole parameter; elementwise operations of the parameter alone
before the gather (its constraint's transform) run on the slice. Anything else
(a parameter read twice, reshaped or combined with another array first, or read
at indices that depend on the parameters) keeps its dense per-datum gradient.
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
    its live equations, per qualifying parameter leaf the one gather that reads
    it (``cuts``: equation index -> leaf index) and the elementwise operations
    between the leaf and that gather (``chains``: leaf index -> (equation index,
    the leaf's operand position) pairs, in order)."""

    def __init__(self, closed, live, cuts, chains):
        self.closed = closed
        self.live = live
        self.cuts = cuts
        self.chains = chains
        self.gathers = {j: closed.jaxpr.eqns[k] for k, j in cuts.items()}
        #: Equations not evaluated on the whole leaf: they run on its slices.
        self.on_slices = {k for j in cuts.values() for k, _ in chains[j]}


#: Elementwise operations of one array that may stand between a leaf and its
#: gather (a constrained parameter's transform: ``exp`` for a positive one, the
#: logistic for a unit interval); they commute with taking a slice.
UNARY = {
    "abs",
    "convert_element_type",
    "cos",
    "exp",
    "exp2",
    "expm1",
    "integer_pow",
    "log",
    "log1p",
    "logistic",
    "neg",
    "rsqrt",
    "sin",
    "sqrt",
    "square",
    "tanh",
}
#: Elementwise operations of the leaf and a scalar (an affine transform's
#: constants, or a scalar parameter: its gradient then flows through the slice).
_WITH_SCALAR = {"add", "sub", "mul", "div", "max", "min"}


def _commutes_with_slicing(eqn, position):
    """Whether ``eqn`` is elementwise in its operand ``position`` alone, so that
    applying it to a slice gives the slice of its output."""
    name = eqn.primitive.name
    (out,) = eqn.outvars
    if out.aval.shape != eqn.invars[position].aval.shape:
        return False
    if name in UNARY:
        return len(eqn.invars) == 1
    if name in _WITH_SCALAR and len(eqn.invars) == 2:
        return eqn.invars[1 - position].aval.shape == ()
    return False


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
    of a ``gather`` that takes one slice (one start index: the datum's row), or
    single entries at several start indices (``w[cols[i]]``), at start indices
    that do not depend on any parameter; elementwise operations of the leaf
    alone (its constraining transform) may come between, each with one use. The
    datum's gradient in that leaf is its slices' gradients scattered to where
    they sit (added where two of its slices start at the same index) and
    nothing else.
    """
    closed = jax.make_jaxpr(term)(leaves, index)
    jaxpr = closed.jaxpr
    leaf_vars = jaxpr.invars[: len(leaves)]
    live = _live_equations(jaxpr)
    depends = set(leaf_vars)  # variables computed from the parameters
    uses = {}  # variable -> [(equation index, operand position)], live ones
    for k in sorted(live):
        eqn = jaxpr.eqns[k]
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        for position, v in enumerate(eqn.invars):
            if not isinstance(v, Literal):
                uses.setdefault(v, []).append((k, position))
        if any(v in depends for v in ins):
            depends.update(v for v in eqn.outvars if not isinstance(v, DropVar))
    outputs = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    cuts, chains = {}, {}
    for j, v in enumerate(leaf_vars):
        chain = []
        while v not in outputs and len(uses.get(v, ())) == 1:
            ((k, position),) = uses[v]
            eqn = jaxpr.eqns[k]
            if eqn.primitive.name == "gather":
                if position == 0 and _slices_at_data_indices(eqn, depends):
                    cuts[k], chains[j] = j, chain
                break
            if not _commutes_with_slicing(eqn, position):
                break
            chain.append((k, position))
            (v,) = eqn.outvars
    return GatherPlan(closed, live, cuts, chains) if cuts else None


def _slices_at_data_indices(eqn, depends):
    """Whether a gather reads at start indices that do not depend on the
    parameters, either one slice (one start index: the datum's row) or single
    entries along the indexed dimensions at several (the k weights a datum of a
    sparse or bag-of-words model reads, ``w[cols[i]]``), their slices laid out
    after the indices in the output (NumPy's indexing), so that two of a datum's
    slices overlap only where their start indices are equal."""
    start = eqn.invars[1]
    if not isinstance(start, Literal) and start in depends:
        return False
    numbers = eqn.params["dimension_numbers"]
    if getattr(numbers, "operand_batching_dims", ()):
        return False
    batch = start.aval.shape[:-1]
    if math.prod(batch) == 1:
        return True
    sizes = eqn.params["slice_sizes"]
    out_rank = len(eqn.outvars[0].aval.shape)
    return all(sizes[d] == 1 for d in numbers.start_index_map) and tuple(
        numbers.offset_dims
    ) == tuple(range(len(batch), out_rank))


def several_slices(eqn):
    """Whether a gather that :func:`trace_gathers` cut reads several slices (so
    a datum may read one coordinate more than once)."""
    return math.prod(eqn.invars[1].aval.shape[:-1]) > 1


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
        if k not in plan.live or k in plan.on_slices:
            continue
        if k in plan.cuts:
            # The leaf's slice, moved by delta, then the operations between the
            # leaf and the gather applied to the slice alone.
            j = plan.cuts[k]
            start = read(eqn.invars[1])
            x = _bind(eqn, [leaves[j], start]) + deltas[j]
            for c, position in plan.chains[j]:
                op = jaxpr.eqns[c]
                ins = [x if p == position else read(v) for p, v in enumerate(op.invars)]
                x = _bind(op, ins)
            starts[j] = start
            env[eqn.outvars[0]] = x
            continue
        outs = _bind(eqn, [read(v) for v in eqn.invars])
        if not eqn.primitive.multiple_results:
            outs = [outs]
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
    zeros = {  # the slice's shape, the leaf's dtype
        j: jnp.zeros(eqn.outvars[0].aval.shape, jnp.result_type(leaves[j]))
        for j, eqn in plan.gathers.items()
    }

    def one(index):
        def value(dense, deltas):
            full = [leaves[j] if j in cut else dense[j] for j in range(len(leaves))]
            return _evaluate(plan, full, index, deltas)

        dense = [None if j in cut else x for j, x in enumerate(leaves)]
        grads, starts = jax.grad(value, argnums=(0, 1), has_aux=True)(dense, zeros)
        return grads, starts

    (dense, local), starts = jax.vmap(one)(indices)  # dense: None where cut
    n = len(leaves)
    return dense, [local.get(j) for j in range(n)], [starts.get(j) for j in range(n)]


def _bind(eqn, ins):
    """The equation's operation on the values ``ins`` (as JAX's own evaluator
    binds it)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    # JAX < 0.5 returns (subfunctions, params); later JAX the params alone.
    subfuns, params = params if isinstance(params, tuple) else ((), params)
    with getattr(getattr(eqn, "ctx", None), "manager", nullcontext()):
        return eqn.primitive.bind(*subfuns, *ins, **params)


def gather_of(eqn):
    """``fn(operand, start)``: the equation's gather, of any operand of its
    operand's shape."""

    def fn(operand, start):
        return _bind(eqn, [operand, start])

    return fn
