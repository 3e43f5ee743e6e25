"""The on-disk cache of :func:`~numpyro_sgbd.reference_posterior`: a key from the
model's source, closures and data, the settings and the NumPyro and JAX versions,
and the ArviZ netCDF file read back (or sampled again) and written (or not, with a
warning)."""

import hashlib
import inspect
import warnings

import jax
import numpy as np
import numpyro

from numpyro_sgbd.evaluation import _arviz

# The posterior attributes reference._report reads back from a cached reference.
_CACHED_ATTRS = (
    "num_chains",
    "max_rhat",
    "min_ess_bulk",
    "min_ess_tail",
    "num_divergent",
    "frac_max_tree_depth",
    "max_tree_depth",
)


def _hash_leaf(h, leaf):
    if isinstance(leaf, (jax.Array, np.ndarray)):
        arr = np.asarray(leaf)
        h.update(f"{arr.dtype}{arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    else:
        h.update(repr(leaf).encode())


def _model_fingerprint(h, fn, depth=0):
    """Source, defaults and closure values of ``fn`` (and functions it closes over)."""
    fn = inspect.unwrap(fn)
    try:
        h.update(inspect.getsource(fn).encode())
    except (OSError, TypeError):
        h.update(repr(fn).encode())
    values = list(getattr(fn, "__defaults__", None) or ())
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            values.append(None)
    for value in values:
        if callable(value) and depth < 3:
            _model_fingerprint(h, value, depth + 1)
        else:
            for leaf in jax.tree.leaves(value):
                _hash_leaf(h, leaf)


def _cache_key(model, model_args, model_kwargs, settings):
    h = hashlib.sha256()
    _model_fingerprint(h, model)
    for leaf in jax.tree.leaves((model_args, sorted(model_kwargs.items()))):
        _hash_leaf(h, leaf)
    h.update(repr(sorted(settings.items())).encode())
    h.update(f"numpyro {numpyro.__version__} jax {jax.__version__}".encode())
    return h.hexdigest()[:20]


def _load_cached(path):
    """The cached reference at ``path``, or ``None`` to sample (with a warning when
    a file is there but cannot be used)."""
    if not path.exists():
        return None
    try:
        idata = _arviz.from_netcdf(path)
        groups = _arviz.group_names(idata)
        for name in ("posterior", "sample_stats"):
            if name not in groups:
                raise ValueError(f"it has no {name} group")
        missing = [k for k in _CACHED_ATTRS if k not in idata.posterior.attrs]
        if missing:
            raise ValueError(f"its posterior lacks the attributes {missing}")
    except Exception as err:
        # Whatever stops the file from loading (no h5netcdf, not HDF5, truncated,
        # another layout), sampling again is the answer: say why, and go on.
        warnings.warn(
            f"The cached reference posterior {path} cannot be read "
            f"({type(err).__name__}: {err}); sampling again and overwriting it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return idata


def _save_cached(idata, path):
    """Write the cache; a failure costs the cache, not the result."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _arviz.to_netcdf(idata, path)
    except Exception as err:
        # The result is in hand: no failure to store it (no h5netcdf, a full disk,
        # a read-only folder, an attribute HDF5 cannot hold) may lose it.
        warnings.warn(
            f"The reference posterior could not be cached at {path} "
            f"({type(err).__name__}: {err}); it is returned but will be sampled "
            "again next time.",
            RuntimeWarning,
            stacklevel=3,
        )
