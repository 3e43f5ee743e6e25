"""Checks of what a user passes, made before anything is compiled.

Bad input that JAX accepts silently: :func:`check_plate_data` finds data arrays
that a subsample plate's indices read but whose length is not the plate's size
(JAX clamps an index past the end of an array to its last row, so a ``y`` 100 rows
short is misread rather than refused); :func:`check_step_size` and
:func:`check_real` refuse hyperparameters that NumPy would convert from a string;
:func:`warn_unadapted` says when ``step_size=None`` gets no warmup to adapt in.
"""

from contextlib import contextmanager, suppress
import contextvars
from dataclasses import dataclass
import inspect
import logging
import warnings
import weakref

import jax
from jax import tree_util
import jax.numpy as jnp
import numpy as np
from numpyro.primitives import _PYRO_STACK, Messenger, plate

from numpyro_sgbd._gathered import _UNARY
from numpyro_sgbd.handlers import sample_trace
from numpyro_sgbd.host import HostArray

try:  # public from JAX 0.4.30
    from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, Primitive
except ImportError:  # pragma: no cover - older JAX
    from jax.core import ClosedJaxpr, Jaxpr, Literal, Primitive

__all__ = [
    "check_plate_data",
    "check_real",
    "check_step_size",
    "warmup_elsewhere",
    "warn_unadapted",
]

logger = logging.getLogger(__name__)

# ------------------------------------------------------------ plate data lengths

#: The indices of a subsample plate in the traced model: a primitive of our own,
#: so that the jaxpr says which values are a plate's indices. It is only ever
#: traced (:func:`jax.make_jaxpr`), never evaluated or compiled. Its operand, an
#: input of the traced program, keeps it in that trace where the kernel is set up
#: under ``jax.ensure_compile_time_eval`` (a primitive without operands would be
#: evaluated there).
_plate_index_p = Primitive("sgbd_plate_index")
_plate_index_p.def_abstract_eval(
    lambda anchor, *, name, size, n: jax.core.ShapedArray((n,), jnp.int32)
)


def _never_evaluated(*args, **params):
    raise RuntimeError("sgbd_plate_index is traced by check_plate_data only.")


_plate_index_p.def_impl(_never_evaluated)

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
_SAME_ROWS = _UNARY | {"copy", "copy_p", "reduce_precision"}


class _DataLengthError(ValueError):
    """Raised from inside the trace; let through where other errors are not."""


class _PlateIndices(Messenger):
    """Gives each subsample plate its marked indices (``_plate_index_p``), records
    the plates, and checks ``numpyro.subsample`` as NumPyro does, naming the
    argument."""

    def __init__(self, fn, labels, anchor):
        self.labels = labels  # id(tracer of an argument array) -> its label
        self.anchor = anchor
        self.plates = {}  # name -> (size, n)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "subsample":
            self._check_subsample(msg)
            return
        if msg["type"] != "plate" or msg["value"] is not None:
            return
        size, n = msg["args"]
        try:
            size, n = int(size), int(n)
        except (TypeError, jax.errors.ConcretizationTypeError):
            return  # a traced plate size: nothing to compare with
        if n < 1:
            return
        # n > size is reported by the kernels' own plate check (marked all the
        # same: left to NumPyro, the plate would warn about it first).
        self.plates[msg["name"]] = (size, n)
        msg["value"] = _plate_index_p.bind(
            self.anchor, name=msg["name"], size=size, n=n
        )

    def _check_subsample(self, msg):
        # NumPyro's plate checks this too, after us and without naming the data.
        data = msg["value"]
        event_dim = msg["kwargs"].get("event_dim")
        shape = jnp.shape(data)
        for frame in _PYRO_STACK:
            if not isinstance(frame, plate) or frame.name not in self.plates:
                continue
            axis = frame.dim - event_dim
            if len(shape) < -axis or shape[axis] in (1, frame.size):
                continue
            label = self.labels.get(id(data), f"an array of shape {shape}")
            raise _DataLengthError(
                f"numpyro.subsample(..., event_dim={event_dim}) of {label}: "
                + _mismatch(shape, len(shape) + axis, frame.name, frame.size)
            )


def _mismatch(shape, axis, name, size):
    """The error's core and its fix, for data of ``shape`` read along ``axis`` by
    the plate ``name`` of ``size``."""
    return (
        f"it has {shape[axis]} entries along axis {axis} (shape {tuple(shape)}), "
        f"but the subsample plate '{name}' that indexes it has size {size}. JAX "
        "clamps indices past the end of an array, so the rows would be misread "
        f"without an error. Pass {size} entries along axis {axis}, one per datum "
        f"of the plate, or, if the data are right, declare the plate with their "
        f"length: numpyro.plate('{name}', {shape[axis]}, subsample_size=...)."
    )


def _argument_labels(model, paths):
    """A readable name for each array leaf of ``(model_args, model_kwargs)``:
    the model's parameter name where its signature gives one."""
    fn = model
    while isinstance(fn, Messenger) and fn.fn is not None:
        fn = fn.fn  # a handler around the model: its signature is (*args)
    try:
        params = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    labels = []
    for path in paths:
        (group,), rest = path[:1], path[1:]
        key, inner = rest[0], tree_util.keystr(rest[1:])
        if group.idx == 0:  # positional: (SequenceKey(i), ...)
            i = key.idx
            name = f"'{params[i]}' " if i < len(params) else ""
            label = f"model argument {name}(positional argument {i})"
        else:
            label = f"model keyword argument '{key.key}'"
        labels.append(label + (f", leaf {inner}" if inner else ""))
    return labels


def _abstract(leaf):
    return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype)


def _is_data(leaf):
    if isinstance(leaf, HostArray):
        return True
    return isinstance(leaf, (np.ndarray, jax.Array)) and leaf.dtype.kind in "biufc"


def check_plate_data(model, model_args=(), model_kwargs=None):
    """Raise if an array that the model indexes with a subsample plate's indices
    does not have the plate's size along the indexed axis.

    The model runs once as a :func:`jax.make_jaxpr` trace, on abstract arrays of
    the data's shapes (nothing is computed on the data), with each subsample
    plate's indices an input of the program. Values that hold those indices
    (through ``jnp.take``'s negative-index handling, casts, reshapes, slices,
    clamps) are followed through the program and the calls inside it; every
    ``gather`` (``X[idx]``, ``jnp.take``, ``numpyro.subsample``) and
    ``dynamic_slice`` that they index must read an array with the plate's size
    along the axes they index. What a gather returns is not an index: in
    ``effect[group[idx]]`` ``group`` must have the plate's size, ``effect`` may
    have any. A model that cannot be traced this way (Python control flow on the
    data's values) is not checked.

    :param model: a NumPyro model.
    :param tuple model_args: its positional arguments.
    :param dict model_kwargs: its keyword arguments.
    :raises ValueError: naming the argument (by the model's parameter name where
        its signature gives one), its length, the site that reads it where one
        can be found, the plate's name and size, and the fix.
    """
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    tree = (tuple(model_args), model_kwargs)
    with_paths, treedef = tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: isinstance(x, HostArray)
    )
    leaves = [leaf for _, leaf in with_paths]
    data = [j for j, leaf in enumerate(leaves) if _is_data(leaf)]
    if not data:
        return
    labels = _argument_labels(model, [with_paths[j][0] for j in data])
    found = {}

    def run(arrays, anchor):
        full = list(leaves)
        for j, x in zip(data, arrays):
            full[j] = x
        args, kwargs = tree_util.tree_unflatten(treedef, full)
        names = {id(x): s for x, s in zip(arrays, labels)}
        marker = _PlateIndices(model, names, anchor)
        trace = sample_trace(marker, args, kwargs)
        outs, sites = [], []
        for name, site in trace.items():
            if site["type"] not in ("sample", "deterministic"):
                continue
            parts = [site["value"]]
            if site["type"] == "sample":
                # The distribution's parameters: X[idx] @ w reaches them (a
                # distribution that is no pytree has none to give).
                with suppress(Exception):
                    parts += jax.tree.leaves(site["fn"])
            for x in parts:
                if isinstance(x, jax.core.Tracer):
                    outs.append(x)
                    sites.append(name)
        found.update(plates=marker.plates, sites=sites)
        return outs

    try:
        closed = jax.make_jaxpr(run)(
            [_abstract(leaves[j]) for j in data], jax.ShapeDtypeStruct((), jnp.int32)
        )
    except _DataLengthError:
        raise
    except Exception as error:  # noqa: BLE001 - the kernels' own trace reports it
        logger.debug("check_plate_data: the model was not traced (%r)", error)
        return
    if not found["plates"]:
        return
    jaxpr = closed.jaxpr
    reads = _IndexedReads(found["plates"])
    reads.walk(
        jaxpr,
        {},
        {v: (j, tuple(range(v.aval.ndim))) for j, v in enumerate(jaxpr.invars[:-1])},
    )
    problems = []
    for (j, axis, name), (shape, top) in reads.problems.items():
        size = reads.size[name]
        if shape[axis] > size and (j, axis, name) in reads.moved:
            continue  # also read at idx + c: a series, rightly longer
        if isinstance(j, int):
            label, shape = labels[j], tuple(leaves[data[j]].shape)
        else:
            label = f"an array of shape {shape} computed in the model"
        site = _reading_site(jaxpr, top, found["sites"])
        at = f" (read by the model's site '{site}')" if site else ""
        problems.append(f"{label}{at}: " + _mismatch(shape, axis, name, size))
    if problems:
        raise ValueError("\n".join(problems))


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


class _IndexedReads:
    """One pass over a jaxpr: which values hold a plate's indices, and the arrays
    they index, by (argument leaf, axis, plate): ``problems`` (a length other
    than the plate's: the shape and the top-level equation that reads it) and
    ``moved`` (read at moved indices)."""

    def __init__(self, plates):
        self.size = {name: size for name, (size, _) in plates.items()}
        self.problems = {}
        self.moved = set()

    def walk(self, jaxpr, tags, origins, top=None):
        """``tags``: variable -> a plate's name (every entry is that plate's
        index), a :class:`_Moved`, or a tuple over the last axis of them or
        ``None``; ``origins``: variable -> (argument leaf, the leaf's axis or
        ``None`` for each of its axes), for arrays that hold a leaf's rows."""
        for k, eqn in enumerate(jaxpr.eqns):
            where = k if top is None else top
            ins = [None if isinstance(v, Literal) else tags.get(v) for v in eqn.invars]
            if eqn.primitive is _plate_index_p:
                tags[eqn.outvars[0]] = eqn.params["name"]
                continue
            inner = _sub_jaxpr(eqn)
            if inner is not None:
                self._call(eqn, inner, tags, origins, where)
                continue
            name = eqn.primitive.name
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
            elif shape[axis] != self.size[entry]:
                key = (leaf, leaf_axes[axis], entry)
                self.problems.setdefault(key, (shape, where))


def _origin(eqn, origins):
    """``(leaf, axes)`` of the output of ``eqn`` where it holds a leaf's rows along
    some axes (see :meth:`_IndexedReads.walk`): an elementwise map keeps them, a
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
    :meth:`_IndexedReads.walk`), or ``None``."""
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


def _reading_site(jaxpr, top, sites):
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


# --------------------------------------------------------------- hyperparameters

#: What ``step_size`` takes, for its error messages.
STEP_SIZE_TAKES = (
    "a positive float, a dict {site name: positive float or array}, or None to "
    "adapt it during warmup"
)


def check_real(value, name, takes="a positive number (or an array of them)"):
    """Raise a TypeError unless ``value`` is a real number or an array of them:
    ``np.asarray('0.05', float)`` is 0.05, so a string would pass a check of the
    value alone; a bool is refused too."""
    kind = None
    if not isinstance(value, (str, bytes, bool, np.bool_)):
        try:
            kind = np.asarray(value).dtype.kind
        except Exception:  # noqa: BLE001 - any object NumPy cannot take
            kind = None
    if kind in ("i", "u", "f"):
        return
    hint = ""
    if isinstance(value, str):
        hint = f" (a string: write {name}={value}, without quotes)"
    raise TypeError(
        f"{name} must be {takes}; got the {type(value).__name__} {value!r}{hint}."
    )


def check_step_size(step_size, takes=STEP_SIZE_TAKES):
    """The type check of a sampler's ``step_size`` (its value is checked with the
    other hyperparameters): ``None``, a real scalar or array, or a dict of them by
    site. ``takes`` says what the sampler takes, for the message."""
    if step_size is None:
        return
    if isinstance(step_size, dict):
        for site, value in step_size.items():
            check_real(value, f"step_size[{site!r}]", takes)
    else:
        check_real(step_size, "step_size", takes)


# -------------------------------------------------------------------- warmup

#: Kernels once initialised with warmup: an ``init`` without warmup then belongs
#: to a run that resumes from their adapted state (NumPyro's
#: ``post_warmup_state``), which ``init``'s own state does not replace.
_warmed_up = weakref.WeakSet()
_adapting_elsewhere = contextvars.ContextVar("adapting_elsewhere", default=False)


@contextmanager
def warmup_elsewhere():
    """Inside, :func:`warn_unadapted` says nothing: for callers that initialise a
    kernel without warmup and set its step themselves (:func:`~numpyro_sgbd.tune`)."""
    token = _adapting_elsewhere.set(True)
    try:
        yield
    finally:
        _adapting_elsewhere.reset(token)


def warn_unadapted(kernel, num_warmup, step_size):
    """Warn when ``step_size=None`` (adapt in warmup) meets ``num_warmup=0``: the
    step then stays where it starts and no scale is adapted."""
    if num_warmup > 0:
        _warmed_up.add(kernel)
        return
    if step_size is not None or kernel in _warmed_up or _adapting_elsewhere.get():
        return
    warnings.warn(
        f"{type(kernel).__name__}(step_size=None) adapts its step size (and the "
        "scales of its preconditioner) during warmup, but num_warmup=0: nothing is "
        "adapted, the step stays at its starting value and no scale is estimated. "
        "Give num_warmup > 0 (a few hundred steps), or a step_size.",
        UserWarning,
        stacklevel=3,
    )
