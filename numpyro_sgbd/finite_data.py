"""The host check of a model's data for NaN and infinity, made before anything
is compiled (:func:`~numpyro_sgbd.validation.check_plate_data` calls it): a NaN
in a covariate makes the potential NaN at every position, which the kernels
report as a potential that is not finite and NumPyro's distributions as an
invalid parameter, neither naming the data."""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.host import HostArray

__all__ = ["check_finite_rows"]

#: Rows checked at a time, about this many values each (bounds the host memory
#: of the check on data that NumPy memory-maps or :func:`host_data` keeps).
_BLOCK_VALUES = 1 << 22


def _first_bad(x, axis):
    """``(row, index, count)``: the first index along ``axis`` of ``x`` whose
    slice holds a non-finite value, the full index of its first such entry and
    the number of such rows; ``None`` where every value is finite."""
    if isinstance(x, jax.Array):
        if bool(jnp.all(jnp.isfinite(x))):
            return None
    x = np.moveaxis(np.asarray(x), axis, 0)
    rows = x.shape[0]
    step = max(1, _BLOCK_VALUES // max(1, x[:1].size))
    first, count = None, 0
    for start in range(0, rows, step):
        bad = ~np.isfinite(x[start : start + step])
        flags = bad.reshape(bad.shape[0], -1).any(axis=1)
        count += int(flags.sum())
        if first is None and flags.any():
            entry = np.unravel_index(int(np.argmax(bad)), bad.shape)
            first = (start + int(entry[0]),) + tuple(int(k) for k in entry[1:])
    if first is None:
        return None
    index = list(first[1:])
    index.insert(axis, first[0])
    return first[0], tuple(index), count


def check_finite_rows(leaf, label, sizes):
    """Raise if the concrete floating-point array ``leaf`` (a model argument,
    called ``label`` in the message) holds a NaN or an infinity along its first
    axis whose length is in ``sizes`` (the subsample plates' sizes: the axis of
    the data's rows). Traced arrays, integer arrays, scalars and arrays with no
    such axis are not checked.

    :raises ValueError: naming the argument, the first bad row, the entry and
        its value, how many rows are affected, and the fixes.
    """
    array = leaf.array if isinstance(leaf, HostArray) else leaf
    if isinstance(array, jax.core.Tracer) or not hasattr(array, "dtype"):
        return
    if np.dtype(array.dtype).kind not in "fc" or np.ndim(array) == 0:
        return
    axes = [a for a, length in enumerate(np.shape(array)) if length in sizes]
    if not axes:
        return
    found = _first_bad(array, axes[0])
    if found is None:
        return
    row, index, count = found
    value = np.asarray(array)[index]
    where = f"row {row}" if axes[0] == 0 else f"index {row} along axis {axes[0]}"
    total = np.shape(array)[axes[0]]
    rows = f"{count} of {total} rows hold" if count > 1 else f"1 row of {total} holds"
    raise ValueError(
        f"{label} has a non-finite value at {where} (entry {index} is {value}; "
        f"{rows} NaN or infinity). The potential is then NaN wherever that "
        "row is read, which no sampler can move on. Drop or impute those rows "
        "before sampling (e.g. keep = np.isfinite(X).all(axis=1), then pass "
        "X[keep] and y[keep]), or, for missing observations, model them: "
        "numpyro.sample(..., obs=y[idx], obs_mask=np.isfinite(y)[idx])."
    )
