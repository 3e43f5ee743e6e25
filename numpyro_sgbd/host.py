"""Data kept in host memory and read a minibatch of rows at a time.

NumPyro's sampling loop hands the model's arguments back as new buffers when it
ends (``jax.jit`` returns fresh outputs for every argument it passes through, and
NumPyro donates none of them), so a run whose data travel through it holds them
twice for a moment; closed over instead (``jit_model_args=False``), they are
compiled into the program as constants. :func:`host_data` keeps each array where
it is, in one NumPy buffer, and gives the model an object that it indexes as
before (``X[idx]``): every read is a host callback that gathers the requested
rows, so the compiled programs hold only the rows of a step or of a full-data
pass's chunk. See the docs' "Big data" page.
"""

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["HostArray", "host_data"]


class _Reads:
    """The arrays of one :func:`host_data` call, read together: a model reads
    ``X[idx]`` and ``y[idx]`` with the same indices, and one host callback gathers
    the rows of all of them (a callback's cost hardly depends on what it moves,
    so two reads cost twice one; ``benchmarks/big_data.py`` measures it)."""

    def __init__(self, arrays):
        self.arrays = arrays
        self._last = None  # (index tracer, rows of every array) of the last read

    def read(self, member, index):
        last = self._last
        if last is not None and last[0] is index:
            return last[1][member]  # the same indices in the same trace
        out = tuple(
            jax.ShapeDtypeStruct(jnp.shape(index) + a.shape[1:], a.dtype)
            for a in self.arrays
        )
        # expand_dims: under vmap the indices arrive with the batch axes in front,
        # and a NumPy gather by them returns the rows with the same axes in front.
        rows = jax.pure_callback(
            self._rows, out, jnp.asarray(index), vmap_method="expand_dims"
        )
        if isinstance(index, jax.core.Tracer):
            # Only a tracer is known to stand for one value within one trace.
            self._last = (index, rows)
        return rows[member]

    def _rows(self, index):
        index = np.asarray(index)
        return tuple(np.asarray(a.array[index], a.dtype) for a in self.arrays)

    def __getstate__(self):
        return {"arrays": self.arrays, "_last": None}


class HostArray:
    """A data array in host memory, read by rows (see :func:`host_data`).

    ``X[idx]``, for an integer array ``idx`` of row indices (the plate's
    indices), is a :class:`jax.Array` of shape ``idx.shape + X.shape[1:]``, read
    through :func:`jax.pure_callback` inside compiled code and under
    :func:`jax.vmap`; the arrays of one :func:`host_data` call read by the same
    indices share one callback. ``shape``, ``dtype``, ``ndim`` and ``len`` are the
    array's. Nothing else reads it: any other use (arithmetic, ``jnp.asarray``)
    raises a TypeError, since it would copy the whole array into the program.

    It is a pytree without leaves (the object itself is its static part), so it
    passes through :func:`jax.jit` and NumPyro's ``MCMC`` under either value of
    ``jit_model_args`` without its rows entering the program.
    """

    def __init__(self, array, reads=None, member=0):
        self.array = np.asarray(array)
        if self.array.ndim == 0:
            raise ValueError(
                "host_data keeps arrays of one row per datum; got a scalar. Pass "
                "scalars to the model as they are."
            )
        self.shape = self.array.shape
        # The dtype JAX computes in (float32 for float64 data unless x64 is on):
        # the rows are cast as they are read, the kept array is not copied.
        self.dtype = jax.dtypes.canonicalize_dtype(self.array.dtype)
        self.ndim = self.array.ndim
        self._reads = _Reads((self,)) if reads is None else reads
        self._member = member

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"HostArray(shape={self.shape}, dtype={self.dtype})"

    def __getitem__(self, index):
        if isinstance(index, tuple) or index is None or isinstance(index, slice):
            raise TypeError(
                "A HostArray (numpyro_sgbd.host_data) is read by rows only: index it "
                "with an integer array of row indices, X[idx] with idx the plate's "
                f"indices; got X[{index!r}]."
            )
        dtype = jnp.result_type(index)
        if not jnp.issubdtype(dtype, jnp.integer):
            raise TypeError(
                "A HostArray (numpyro_sgbd.host_data) is read by rows only: index it "
                f"with integer row indices, got an array of dtype {dtype}."
            )
        return self._reads.read(self._member, index)

    def _whole(self, *args, **kwargs):
        raise TypeError(
            "A HostArray (numpyro_sgbd.host_data) is read by rows only, X[idx] with "
            "idx the plate's indices; using it whole would copy every row into the "
            "program. Pass this argument as an ordinary array instead, or read the "
            "rows you need by index."
        )

    __array__ = __jax_array__ = _whole
    # Arithmetic on the whole array, in a model that forgot to index it first.
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _whole
    __truediv__ = __rtruediv__ = __matmul__ = __rmatmul__ = __pow__ = _whole
    __neg__ = __iter__ = _whole


jax.tree_util.register_pytree_node(
    HostArray, lambda x: ((), x), lambda static, _: static
)


def host_data(*arrays):
    """Keep data arrays in host memory, read a minibatch of rows at a time.

    For data larger than you want twice in memory: the model indexes the result
    as it indexed the arrays (``X[idx]`` inside its subsample plate), and each
    step reads only its n rows (each full-data pass, a chunk of rows at a time)
    through a host callback. No compiled program holds the data, NumPyro's
    sampling loop does not return a copy of them at its end, and
    ``jit_model_args`` makes no difference. The cost is one callback per read
    (the arrays of one call read by the same indices share it), whatever it
    moves, so a small model's step takes several times longer
    (``benchmarks/big_data.py``), and on an accelerator a transfer of the step's
    rows from the host besides.

    :param arrays: NumPy (or JAX) arrays with the plate's rows along their first
        axis. NumPy arrays are kept without a copy.
    :return: a :class:`HostArray` (a tuple of them for several arrays).

    The model must read these arguments only by row indices, ``X[idx]``; any
    other use raises a TypeError naming this function. Not for sharded data
    (:func:`~numpyro_sgbd.shard_data` places rows on devices; this keeps them on
    the host).

    >>> import numpy as np
    >>> X, y = host_data(np.arange(12.0).reshape(6, 2), np.arange(6.0))
    >>> X
    HostArray(shape=(6, 2), dtype=float32)
    >>> X[np.array([4, 1])].tolist()
    [[8.0, 9.0], [2.0, 3.0]]
    """
    if not arrays:
        raise ValueError("host_data needs at least one array.")
    reads = _Reads(())
    out = tuple(HostArray(x, reads, member) for member, x in enumerate(arrays))
    reads.arrays = out
    return out[0] if len(out) == 1 else out
