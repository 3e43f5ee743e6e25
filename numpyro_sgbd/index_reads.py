"""Which arrays a traced model reads at a subsample plate's indices: the jaxpr
walk behind :func:`~numpyro_sgbd.validation.check_plate_data`.

The model is traced (:func:`jax.make_jaxpr`) with each subsample plate's indices
the output of :data:`plate_index_p`, a primitive of our own; :class:`IndexedReads`
follows the values that hold those indices through the program and records the
arrays they index, by model argument, axis and plate.
"""

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from numpyro_sgbd.estimators.gathered import UNARY

try:  # public from JAX 0.4.30
    from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, Primitive
except ImportError:  # pragma: no cover - older JAX
    from jax.core import ClosedJaxpr, Jaxpr, Literal, Primitive

__all__ = ["IndexedReads", "plate_index_p", "reading_site"]

#: The indices of a subsample plate in the traced model: a primitive of our own,
#: so that the jaxpr says which values are a plate's indices. It is only ever
#: traced (:func:`jax.make_jaxpr`), never evaluated or compiled. Its operand, an
#: input of the traced program, keeps it in that trace where the kernel is set up
#: under ``jax.ensure_compile_time_eval`` (a primitive without operands would be
#: evaluated there).
plate_index_p = Primitive("sgbd_plate_index")
plate_index_p.def_abstract_eval(
    lambda anchor, *, name, size, n: jax.core.ShapedArray((n,), jnp.int32)
)


def _never_evaluated(*args, **params):
    raise RuntimeError("sgbd_plate_index is traced by check_plate_data only.")


plate_index_p.def_impl(_never_evaluated)

#: Operations whose integer output holds the same indices as an input (in
#: another dtype, shape or order): ``jnp.take``'s handling of negative indices
#: (``select_n(i < 0, i, i + len)``, whose plain branch carries the index), a
#: clamp or wrap, reshapes and slices. Arithmetic that moves an index (``idx +
#: 1``, ``2 * idx``) is left out: the array it reads may rightly be longer than
#: the plate (the next time step of a series).
_SAME_VALUES = {
    "clamp",
    "convert_element_type",
    "copy",
    "copy_p",
    "max",
    "min",
    "reduce_precision",
    "rem",
    "select_n",
}
_SAME_VALUES_MOVED = {
    "broadcast_in_dim",
    "dynamic_slice",
    "expand_dims",
    "reshape",
    "slice",
    "squeeze",
}
#: Arithmetic that moves an index by a constant (``idx + 1``): the array it
#: reads may rightly be longer than the plate (a series read at ``y[idx]`` and
#: ``y[idx + 1]``), so it is only required to be no shorter.
_MOVES = {"add", "sub"}
#: Operations after which an array still has its input's rows (for naming the
#: model argument that a gather reads): dtype casts and elementwise maps.
_SAME_ROWS = UNARY | {"copy", "copy_p", "reduce_precision"}


@dataclass(frozen=True)
class _Moved:
    """The tag of an index moved by a constant (``idx + c``) of the plate
    ``name``."""

    name: str


def _is_index(tag):
    """Whether ``tag`` is a whole array's: a plate's index or a moved one."""
    return isinstance(tag, (str, _Moved))


def _carry(sources, targets, source_maps, target_maps):
    """Copy what each map in ``source_maps`` holds for ``sources[k]`` into the
    matching map in ``target_maps`` under ``targets[k]`` (a call's arguments into
    its body, or its results back out); literals hold nothing."""
    for source, target in zip(sources, targets):
        if isinstance(source, Literal):
            continue
        for held, into in zip(source_maps, target_maps):
            if source in held:
                into[target] = held[source]


class IndexedReads:
    """One pass over a jaxpr: which values hold a plate's indices, and the arrays
    they index, by (argument leaf, axis, plate): ``problems`` (a length other
    than the plate's: the shape and the top-level equation that reads it) and
    ``moved`` (read at moved indices)."""

    def __init__(self, plates):
        self.size = {name: size for name, (size, _) in plates.items()}
        self.problems = {}
        self.moved = set()
        self.read = set()  # (leaf, axis, plate) read at the plate's indices
        self.nan_aware = set()  # leaves the model tests for NaN or infinity

    def walk(self, jaxpr, tags, origins, top=None):
        """``tags``: variable -> a plate's name (every entry is that plate's
        index), a :class:`_Moved`, or a tuple over the last axis of them or
        ``None``; ``origins``: variable -> (argument leaf, the leaf's axis or
        ``None`` for each of its axes), for arrays that hold a leaf's rows."""
        for k, eqn in enumerate(jaxpr.eqns):
            where = k if top is None else top
            ins = [None if isinstance(v, Literal) else tags.get(v) for v in eqn.invars]
            if eqn.primitive is plate_index_p:
                tags[eqn.outvars[0]] = eqn.params["name"]
                continue
            inner = _sub_jaxpr(eqn)
            if inner is not None:
                self._call(eqn, inner, tags, origins, where)
                continue
            name = eqn.primitive.name
            if name == "is_finite" or (name == "ne" and _same(*eqn.invars)):
                held = eqn.invars[0]
                if not isinstance(held, Literal) and held in origins:
                    self.nan_aware.add(origins[held][0])
            if name == "gather" and ins[1] is not None:
                starts = eqn.params["dimension_numbers"].start_index_map
                self._check(eqn.invars[0], ins[1], starts, origins, where)
            elif name == "dynamic_slice":
                for axis, t in enumerate(ins[1:]):
                    if _is_index(t):
                        self._check(eqn.invars[0], t, (axis,), origins, where)
            if eqn.primitive.multiple_results:
                continue
            (out,) = eqn.outvars
            tag = _index_tag(eqn, ins)
            if tag is not None and jnp.issubdtype(out.aval.dtype, jnp.integer):
                tags[out] = tag
            origin = _origin(eqn, origins)
            if origin is not None:
                origins[out] = origin

    def _call(self, eqn, inner, tags, origins, where):
        """A call (``jit``, ``custom_jvp_call``, ...): its body walked with the
        caller's tags and origins on its inputs, and its outputs' brought back."""
        inner_tags, inner_origins = {}, {}
        _carry(eqn.invars, inner.invars, (tags, origins), (inner_tags, inner_origins))
        self.walk(inner, inner_tags, inner_origins, where)
        _carry(inner.outvars, eqn.outvars, (inner_tags, inner_origins), (tags, origins))

    def _check(self, operand, tag, axes, origins, where):
        """Record the reads of ``operand`` along each axis that an index position
        (``axes``, a gather's ``start_index_map``) reads."""
        if isinstance(operand, Literal):
            return
        shape = operand.aval.shape
        leaf, leaf_axes = origins.get(operand, (operand, range(len(shape))))
        for position, axis in enumerate(axes):
            entry = tag if _is_index(tag) else tag[position]
            if entry is None or leaf_axes[axis] is None:
                continue
            if isinstance(entry, _Moved):
                self.moved.add((leaf, leaf_axes[axis], entry.name))
                continue
            key = (leaf, leaf_axes[axis], entry)
            self.read.add(key)
            if shape[axis] != self.size[entry]:
                self.problems.setdefault(key, (shape, where))


def _same(*operands):
    """Whether the operands are one variable (``x != x``: ``jnp.isnan``)."""
    return len(operands) == 2 and operands[0] is operands[1]


def _origin(eqn, origins):
    """``(leaf, axes)`` of the output of ``eqn`` where it holds a leaf's rows along
    some axes (see :meth:`IndexedReads.walk`): an elementwise map keeps them, a
    gather keeps the axes it takes whole."""
    name = eqn.primitive.name
    (out,) = eqn.outvars
    sources = [v for v in eqn.invars if not isinstance(v, Literal)]
    if not sources or sources[0] not in origins:
        return None
    leaf, axes = origins[sources[0]]
    if name in _SAME_ROWS and len(sources) == 1:
        return (leaf, axes) if out.aval.shape == sources[0].aval.shape else None
    if name != "gather":
        return None
    # The output's offset dims are the operand's axes that are neither collapsed
    # nor batched, in order; an axis sliced whole keeps the leaf's entries.
    numbers = eqn.params["dimension_numbers"]
    operand = eqn.invars[0].aval.shape
    dropped = set(numbers.collapsed_slice_dims) | set(
        getattr(numbers, "operand_batching_dims", ())
    )
    kept = [a for a in range(len(operand)) if a not in dropped]
    out_axes = [None] * out.aval.ndim
    for out_axis, a in zip(numbers.offset_dims, kept):
        if eqn.params["slice_sizes"][a] == operand[a]:
            out_axes[out_axis] = axes[a]
    return (leaf, tuple(out_axes))


def _sub_jaxpr(eqn):
    """The body of a call whose inputs and outputs are the body's, one to one
    (``jit``, ``remat``, ``custom_jvp_call``, ``custom_vjp_call``), else
    ``None`` (a loop or a branch, whose indices are not followed)."""
    bodies = [p for p in eqn.params.values() if isinstance(p, (ClosedJaxpr, Jaxpr))]
    if len(bodies) != 1:
        return None
    body = bodies[0].jaxpr if isinstance(bodies[0], ClosedJaxpr) else bodies[0]
    if len(body.invars) != len(eqn.invars) or len(body.outvars) != len(eqn.outvars):
        return None
    return body


def _index_tag(eqn, ins):
    """The plate index the output of ``eqn`` holds (see
    :meth:`IndexedReads.walk`), or ``None``."""
    name = eqn.primitive.name
    (out,) = eqn.outvars
    if name in _SAME_VALUES:
        cases = ins[1:] if name == "select_n" else ins
        if name == "clamp":
            cases = ins[1:2]
        tagged = {t for t in cases if _is_index(t)}
        # jnp.take's select_n(i < 0, i, i + len): the plain branch's tag.
        plain = {t for t in tagged if isinstance(t, str)}
        tagged = plain or tagged
        return tagged.pop() if len(tagged) == 1 else None
    if name in _MOVES:
        tagged = [t for t in ins if t is not None]
        if len(tagged) == 1 and _is_index(tagged[0]):
            return _Moved(getattr(tagged[0], "name", tagged[0]))
        return None
    if name in _SAME_VALUES_MOVED:
        return ins[0] if _is_index(ins[0]) else None
    if name == "concatenate":
        if eqn.params["dimension"] != out.aval.ndim - 1:
            tagged = set(ins)
            return ins[0] if len(tagged) == 1 and _is_index(ins[0]) else None
        entries = ()
        for v, t in zip(eqn.invars, ins):
            entries += (
                t
                if isinstance(t, tuple) and not _is_index(t)
                else (t,) * (v.aval.shape[-1])
            )
        if all(e is None for e in entries):
            return None
        return entries[0] if len(set(entries)) == 1 else entries
    return None


def reading_site(jaxpr, top, sites):
    """The first site (in the model's order) whose value or distribution depends
    on the outputs of the top-level equation ``top``, or ``None``."""
    reached = set(jaxpr.eqns[top].outvars)
    for eqn in jaxpr.eqns[top + 1 :]:
        if any(not isinstance(v, Literal) and v in reached for v in eqn.invars):
            reached.update(eqn.outvars)
    for v, site in zip(jaxpr.outvars, sites):
        if not isinstance(v, Literal) and v in reached:
            return site
    return None
