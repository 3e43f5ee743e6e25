"""Everything that differs between ArviZ 0.x and 1.x, in one place.

ArviZ 0.x keeps a run in its own :class:`arviz.InferenceData`; ArviZ 1.x (the
``arviz-base``, ``arviz-stats`` and ``arviz-plots`` packages) keeps it in an
:class:`xarray.DataTree` with one child node per group. The rest of the package
asks this module instead of branching on the version:

- :func:`is_inference_data`, :func:`group_names`, :func:`group`: read either
  container, whichever ArviZ is installed (the checks go by type, not version).
- :func:`from_dict`: build the installed version's container from arrays
  (0.x takes the groups as keywords, 1.x as one dict of groups).
- :func:`dict_to_dataset`, :func:`set_group`, :func:`group_attrs`: build one
  group as ArviZ would (its dimension names and attributes), put it in either
  container, and reach a group's live attributes.
- :func:`ess`, :func:`rhat`: per-variable diagnostics of draws shaped
  ``(chain, draw, ...)``, passed as an :class:`xarray.Dataset`, the one input
  both versions take and return alike (on bare arrays 1.x needs ``prob`` for the
  tail ESS; on containers it returns a tree where 0.x returns a dataset).
- :func:`to_netcdf`, :func:`from_netcdf`: ArviZ's netCDF layout (one HDF5 group
  per ArviZ group, the global attributes on the root), written and read with
  xarray and h5netcdf directly, so a file written under either version reads
  under the other (0.x's ``az.from_netcdf`` and 1.x's ``xarray.open_datatree``
  read it too).
"""

import os
from pathlib import Path

import arviz as az
import numpy as np
import numpyro
import xarray as xr

# ArviZ 1.x (arviz_base) imports numpyro lazily. Imported before numpyro, arviz puts
# a lazy module in its place; if numpyro's first import is then of a submodule
# (``from numpyro.infer import MCMC``, as this package's modules do), numpyro.infer
# is executed twice and the copy kept lacks its ``initialization`` attribute, so
# ``az.from_numpyro`` fails with an AttributeError. numpyro_sgbd/__init__.py
# executes numpyro before anything else for that reason; this module does it too
# for whoever imports it directly. Under ArviZ 0.x, or with numpyro already
# loaded, it is a no-op.
numpyro.__version__  # an attribute access executes a lazy module

__all__ = [
    "ARVIZ_MAJOR",
    "dict_to_dataset",
    "ess",
    "from_dict",
    "from_netcdf",
    "group",
    "group_attrs",
    "group_names",
    "is_inference_data",
    "rhat",
    "set_group",
    "to_netcdf",
]

#: The installed ArviZ's major version: 0 for the InferenceData line, 1 for
#: DataTree.
ARVIZ_MAJOR = int(az.__version__.split(".", 1)[0])

# xarray.DataTree exists from xarray 2024.10 (ArviZ 1.x requires it; 0.x may run
# with an older xarray). ``az.InferenceData`` is only touched under 0.x: under 1.x
# the name is a deprecated alias of DataTree that warns.
_DATATREE = getattr(xr, "DataTree", None)
_CONTAINERS = tuple(
    t
    for t in (_DATATREE, az.InferenceData if ARVIZ_MAJOR < 1 else None)
    if t is not None
)
_ENGINE = "h5netcdf"


def is_inference_data(value):
    """Whether ``value`` is an ArviZ container: a 0.x InferenceData or a DataTree."""
    return isinstance(value, _CONTAINERS)


def group_names(data):
    """The names of the groups of ``data`` (``["posterior", "sample_stats"]``)."""
    if _DATATREE is not None and isinstance(data, _DATATREE):
        return list(data.children)
    return list(data.groups())


def _node(data, name):
    """The group's own object: its ``attrs`` are the live attributes."""
    if _DATATREE is not None and isinstance(data, _DATATREE):
        return data[name]
    return getattr(data, name)


def group(data, name):
    """Group ``name`` of ``data`` as an :class:`xarray.Dataset`, or ``None``."""
    if name not in group_names(data):
        return None
    node = _node(data, name)
    return node if isinstance(node, xr.Dataset) else node.to_dataset()


def from_dict(groups, *, attrs=None):
    """The installed ArviZ's container from ``{group: {variable: array}}``.

    :param dict groups: arrays shaped ``(chain, draw, ...)`` by group and variable.
    :param dict attrs: ``{group: {name: value}}``, added to the groups' attributes.
    :return: an :class:`arviz.InferenceData` (ArviZ 0.x) or an
        :class:`xarray.DataTree` (ArviZ 1.x).
    """
    if ARVIZ_MAJOR < 1:
        data = az.from_dict(**groups)
    else:
        data = az.from_dict(groups)
    for name, values in (attrs or {}).items():
        _node(data, name).attrs.update(values)
    return data


def group_attrs(data, name):
    """The live attributes of group ``name`` of ``data`` (a dict to update)."""
    return _node(data, name).attrs


def set_group(data, name, dataset):
    """Put ``dataset`` in ``data`` (either container) as group ``name``, in place,
    replacing a group of that name."""
    if _DATATREE is not None and isinstance(data, _DATATREE):
        data[name] = _DATATREE(dataset)
        return data
    if name in data.groups():
        delattr(data, name)
    data.add_groups({name: dataset})
    return data


def dict_to_dataset(data, *, coords=None, dims=None, index_origin=None, library=None):
    """One group from ``{variable: array shaped (chain, draw, ...)}``, with the
    dimension names and attributes ArviZ gives the groups of ``az.from_numpyro``
    (``<variable>_dim_0``... where ``dims`` names none; names in ``dims`` beyond a
    variable's own dimensions are dropped, as ArviZ does for ``log_likelihood``).

    :param dict coords: ``{dimension: values}``; only those of the dimensions used.
    :param dict dims: ``{variable: [dimension name, ...]}`` after chain and draw.
    :param int index_origin: the first index of the generated coordinates.
    :param library: the inference library's module (``numpyro``), named in the
        attributes.
    :return: an :class:`xarray.Dataset`.
    """
    # 0.x calls the library argument ``library``, 1.x ``inference_library``.
    key = "library" if ARVIZ_MAJOR < 1 else "inference_library"
    return az.dict_to_dataset(
        data,
        coords=coords,
        dims=dims,
        index_origin=index_origin,
        skip_event_dims=True,
        **{key: library},
    )


def _container(datasets, attrs):
    if ARVIZ_MAJOR < 1:
        return az.InferenceData(attrs=dict(attrs), **datasets)
    tree = _DATATREE.from_dict(datasets)
    tree.attrs = dict(attrs)
    return tree


def _as_dataset(draws):
    if isinstance(draws, xr.Dataset):
        return draws
    draws = np.asarray(draws)
    dims = ("chain", "draw") + tuple(f"dim_{i}" for i in range(draws.ndim - 2))
    return xr.Dataset({"x": (dims, draws)})


def _diagnostic(fn, draws, **kwargs):
    result = fn(_as_dataset(draws), **kwargs)
    return result if isinstance(draws, xr.Dataset) else np.asarray(result["x"])


def ess(draws, *, method="bulk"):
    """ArviZ's effective sample size of draws shaped ``(chain, draw, ...)``.

    :param draws: an array or an :class:`xarray.Dataset` with dimensions ``chain``
        and ``draw``.
    :param str method: ``"bulk"`` or ``"tail"`` (or any method ArviZ knows).
    :return: an array of the trailing shape, or a dataset for a dataset.
    """
    return _diagnostic(az.ess, draws, method=method)


def rhat(draws):
    """ArviZ's rank-normalised split R-hat; arguments and result as :func:`ess`."""
    return _diagnostic(az.rhat, draws)


def to_netcdf(data, path):
    """Write ``data`` (either container) to ``path`` in ArviZ's netCDF layout.

    The file is written next to ``path`` and renamed into place, so an
    interrupted write leaves no partial file under ``path``.

    :raises ImportError: without h5netcdf.
    """
    import h5netcdf  # noqa: F401 (the engine; a clear error before writing)

    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        mode = "w"
        if data.attrs:
            xr.Dataset(attrs=data.attrs).to_netcdf(partial, mode=mode, engine=_ENGINE)
            mode = "a"
        for name in group_names(data):
            group(data, name).to_netcdf(partial, mode=mode, group=name, engine=_ENGINE)
            mode = "a"
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def from_netcdf(path):
    """Read a file in ArviZ's netCDF layout, written by either major version.

    Every group is loaded into memory and the file closed, so the file can be
    replaced afterwards.

    :return: the installed ArviZ's container (see :func:`from_dict`).
    :raises ImportError: without h5netcdf.
    :raises OSError: when the file is not netCDF/HDF5.
    """
    import h5netcdf

    with h5netcdf.File(path, "r") as f:
        names = list(f.groups)
    with xr.open_dataset(path, engine=_ENGINE) as root:
        attrs = dict(root.attrs)
    datasets = {}
    for name in names:
        with xr.open_dataset(path, group=name, engine=_ENGINE) as dataset:
            datasets[name] = dataset.load()
    return _container(datasets, attrs)
