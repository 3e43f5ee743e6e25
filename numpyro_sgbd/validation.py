"""Checks of what a user passes, made before anything is compiled.

Bad input that JAX accepts silently or reports far from its cause:
:func:`check_plate_data` finds data arrays that a subsample plate's indices read
but whose length is not the plate's size (JAX clamps an index past the end of an
array to its last row, so a ``y`` 100 rows short is misread rather than
refused), data of the plate's full size used without its indices (JAX's
"Incompatible shapes for broadcasting") and NaN or infinity in the data's rows;
:func:`check_step_size` and :func:`check_real` refuse hyperparameters that NumPy
would convert from a string; :func:`warn_unadapted` says when ``step_size=None``
gets no warmup to adapt in.
"""

from contextlib import contextmanager, suppress
import contextvars
import inspect
from itertools import product
import logging
import warnings
import weakref

import jax
from jax import tree_util
import jax.numpy as jnp
import numpy as np
from numpyro.distributions.distribution import MaskedDistribution
from numpyro.primitives import _PYRO_STACK, Messenger, plate

from numpyro_sgbd.finite_data import check_finite_rows
from numpyro_sgbd.handlers import sample_trace
from numpyro_sgbd.host import HostArray
from numpyro_sgbd.index_reads import IndexedReads, plate_index_p, reading_site

try:  # public from JAX 0.4.30
    from jax.extend.core import Literal
except ImportError:  # pragma: no cover - older JAX
    from jax.core import Literal

__all__ = [
    "check_plate_data",
    "check_real",
    "check_step_size",
    "warmup_elsewhere",
    "warn_unadapted",
]

logger = logging.getLogger(__name__)

# ------------------------------------------------------------ plate data lengths


class _DataLengthError(ValueError):
    """Raised from inside the trace; let through where other errors are not."""


class _PlateIndices(Messenger):
    """Gives each subsample plate its marked indices (``plate_index_p``), records
    the plates, and checks ``numpyro.subsample`` as NumPyro does, naming the
    argument."""

    def __init__(self, fn, labels, anchor, full=False):
        self.labels = labels  # id(tracer of an argument array) -> its label
        self.anchor = anchor
        self.full = full  # indices of the plate's full size (see _unindexed)
        self.plates = {}  # name -> (size, n)
        self.masked = False  # an observed site under a mask (missing data)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "subsample":
            self._check_subsample(msg)
            return
        if msg["type"] == "sample" and msg["is_observed"]:
            self.masked |= _is_masked(msg["fn"])
            if not self.full:
                self._check_observed(msg)
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
        msg["value"] = plate_index_p.bind(
            self.anchor, name=msg["name"], size=size, n=size if self.full else n
        )

    def _check_observed(self, msg):
        """An observed value with the full size of a subsample plate along the
        plate's axis: the data were not indexed by the plate's indices."""
        shape = jnp.shape(msg["value"])
        event_dim = len(getattr(msg["fn"], "event_shape", ()))
        for frame in msg["cond_indep_stack"]:
            size, n = self.plates.get(frame.name, (None, None))
            axis = frame.dim - event_dim
            if size is None or n >= size or len(shape) < -axis:
                continue
            if shape[axis] == size:
                label = self.labels.get(id(msg["value"]))
                of = f" ({label})" if label else ""
                raise _DataLengthError(
                    f"the value observed at site '{msg['name']}'{of}: "
                    + _unindexed_message(shape, len(shape) + axis, frame.name, n)
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


def _is_masked(fn):
    """Whether the distribution ``fn`` is masked (``obs_mask``,
    :class:`numpyro.handlers.mask`), under any wrappers."""
    while fn is not None:
        if isinstance(fn, MaskedDistribution):
            return True
        fn = getattr(fn, "base_dist", None)
    return False


def _unindexed_message(shape, axis, name, n):
    """The error's core and its fix, for data of ``shape`` whose ``axis`` has the
    full size of the subsample plate ``name`` drawing ``n`` rows, used without
    the plate's indices."""
    size = shape[axis]
    take = "x[idx]" if axis == 0 else f"jnp.take(x, idx, axis={axis})"
    return (
        f"it has {size} entries along axis {axis} (shape {tuple(shape)}), the full "
        f"size of the subsample plate '{name}', but is used without the plate's "
        f"indices, so it meets the plate's {n} subsampled rows (in JAX: "
        f"'Incompatible shapes for broadcasting: ({n},), ({size},)'). Index it "
        f"with the plate's indices: with numpyro.plate('{name}', {size}, "
        f"subsample_size={n}) as idx, use {take} (obs=y[idx] for an observed "
        "site), or numpyro.subsample(x, event_dim=...)."
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
    """Raise if the model reads its data wrongly through a subsample plate: an
    array that the plate's indices read without the plate's size along the
    indexed axis, an array or observed value of the plate's full size used
    without its indices, or a non-finite entry in a row of the data.

    The model runs once as a :func:`jax.make_jaxpr` trace, on abstract arrays of
    the data's shapes (nothing is computed on the data), with each subsample
    plate's indices an input of the program. Values that hold those indices
    (through ``jnp.take``'s negative-index handling, casts, reshapes, slices,
    clamps) are followed through the program and the calls inside it; every
    ``gather`` (``X[idx]``, ``jnp.take``, ``numpyro.subsample``) and
    ``dynamic_slice`` that they index must read an array with the plate's size
    along the axes they index. What a gather returns is not an index: in
    ``effect[group[idx]]`` ``group`` must have the plate's size, ``effect`` may
    have any. An observed value with the plate's full size along the plate's
    axis (``obs=y`` for ``obs=y[idx]``) is refused; where the trace fails on
    shapes that do not broadcast, the model is traced again with indices of the
    plate's full size, and the arguments of that size that no index reads are
    named. Last, the rows of every concrete floating-point argument with an
    axis of a plate's size are checked on the host for NaN and infinity, unless
    the model tests them itself (``jnp.isnan``, ``jnp.isfinite``) or masks an
    observed site (``obs_mask``, :class:`numpyro.handlers.mask`), as a model of
    missing data does. A model that cannot be traced this way (Python control
    flow on the data's values) is not checked.

    :param model: a NumPyro model.
    :param tuple model_args: its positional arguments.
    :param dict model_kwargs: its keyword arguments.
    :raises ValueError: naming the argument (by the model's parameter name where
        its signature gives one), its length, the site that reads it where one
        can be found, the plate's name and size, and the fix; for a non-finite
        value, the argument, its first bad row and the fix.
    """
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    with_paths, treedef = tree_util.tree_flatten_with_path(
        (tuple(model_args), model_kwargs), is_leaf=lambda x: isinstance(x, HostArray)
    )
    leaves = [leaf for _, leaf in with_paths]
    data = [j for j, leaf in enumerate(leaves) if _is_data(leaf)]
    if not data:
        return
    labels = _argument_labels(model, [with_paths[j][0] for j in data])
    traced = _Traced(model, leaves, treedef, data, labels)
    try:
        closed, found = traced.trace()
    except _DataLengthError as error:
        raise ValueError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - the kernels' own trace reports it
        traced.diagnose(error)  # raises where it finds the unindexed argument
        logger.debug("check_plate_data: the model was not traced (%r)", error)
        return
    if not found["plates"]:
        return
    reads = traced.walk(closed, found["plates"])
    problems = []
    for (j, axis, name), (shape, top) in reads.problems.items():
        size = reads.size[name]
        if shape[axis] > size and (j, axis, name) in reads.moved:
            continue  # also read at idx + c: a series, rightly longer
        if isinstance(j, int):
            label, shape = labels[j], tuple(leaves[data[j]].shape)
        else:
            label = f"an array of shape {shape} computed in the model"
        site = reading_site(closed.jaxpr, top, found["sites"])
        at = f" (read by the model's site '{site}')" if site else ""
        problems.append(f"{label}{at}: " + _mismatch(shape, axis, name, size))
    if problems:
        raise ValueError("\n".join(problems))
    if not found["masked"]:
        sizes = {size for size, _ in found["plates"].values()}
        for j, label in enumerate(labels):
            if j not in reads.nan_aware:
                check_finite_rows(leaves[data[j]], label, sizes)


class _Traced:
    """The model over abstract arrays of its data (the array leaves ``data`` of
    ``leaves``, the flat ``(model_args, model_kwargs)``), as
    :func:`check_plate_data` traces it."""

    def __init__(self, model, leaves, treedef, data, labels):
        self.model, self.leaves, self.treedef = model, leaves, treedef
        self.data, self.labels = data, labels
        self.plates = {}  # the plates found by the last trace, failed or not

    def trace(self, full=False):
        """``(closed jaxpr, found)``: the program, with the data and an anchor as
        inputs, whose outputs are the sites' values and distributions' leaves;
        ``found`` has the ``plates``, the ``sites`` of the outputs and whether an
        observed site is ``masked``. ``full``: indices of the plates' full
        sizes."""
        found = {}

        def run(arrays, anchor):
            full_leaves = list(self.leaves)
            for j, x in zip(self.data, arrays):
                full_leaves[j] = x
            args, kwargs = tree_util.tree_unflatten(self.treedef, full_leaves)
            names = {id(x): s for x, s in zip(arrays, self.labels)}
            marker = _PlateIndices(self.model, names, anchor, full=full)
            self.plates = marker.plates
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
            found.update(plates=marker.plates, sites=sites, masked=marker.masked)
            return outs

        closed = jax.make_jaxpr(run)(
            [_abstract(self.leaves[j]) for j in self.data],
            jax.ShapeDtypeStruct((), jnp.int32),
        )
        return closed, found

    def walk(self, closed, plates):
        """The :class:`IndexedReads` of the program ``closed``."""
        jaxpr = closed.jaxpr
        reads = IndexedReads(plates)
        reads.walk(
            jaxpr,
            {},
            {
                v: (j, tuple(range(v.aval.ndim)))
                for j, v in enumerate(jaxpr.invars[:-1])
            },
        )
        return reads

    def diagnose(self, error):
        """After the trace failed with ``error``: where shapes did not broadcast
        and a subsample plate draws fewer rows than its size, trace again with
        indices of the plates' full sizes, and raise naming the arguments of a
        plate's size that the model uses but no index reads."""
        plates = {k: (size, n) for k, (size, n) in self.plates.items() if n < size}
        if not plates or "incompatible shapes" not in str(error).lower():
            return
        try:
            closed, _ = self.trace(full=True)
        except Exception:  # noqa: BLE001 - not a matter of indices, then
            return
        reads = self.walk(closed, plates)
        used = _used_inputs(closed.jaxpr)
        problems = []
        for j in sorted(used & set(range(len(self.data)))):
            shape = tuple(self.leaves[self.data[j]].shape)
            for axis, (name, (size, n)) in product(range(len(shape)), plates.items()):
                if shape[axis] == size and (j, axis, name) not in reads.read:
                    message = _unindexed_message(shape, axis, name, n)
                    problems.append(f"{self.labels[j]}: {message}")
        if problems:
            raise ValueError("\n".join(problems)) from error


def _used_inputs(jaxpr):
    """The positions of the inputs of ``jaxpr`` that some equation or output
    reads."""
    read = {v for eqn in jaxpr.eqns for v in eqn.invars if not isinstance(v, Literal)}
    read |= {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    return {j for j, v in enumerate(jaxpr.invars) if v in read}


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
