"""Data sharded along a subsample plate, over the devices of one process or many.

The user places the model's data on a :class:`jax.sharding.Mesh` with
:func:`shard_data` (or ``jax.device_put(X, NamedSharding(mesh, P("data")))``
themselves); the kernels see it in ``init`` (:func:`data_sharding`) and from then on
evaluate every minibatch gradient, its noise statistics and every full-data pass
shard by shard inside :func:`jax.shard_map`, with one all-reduce per step (see
:meth:`~numpyro_sgbd.estimators.MinibatchEstimator.map_shards`). Across processes
and hosts the same code runs once :func:`jax.distributed.initialize` has joined
them: a mesh then spans every process's devices.
"""

from typing import Any, NamedTuple

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
import numpy as np

from numpyro_sgbd.estimators import split_arrays
from numpyro_sgbd.host import HostArray

__all__ = ["DataSharding", "data_sharding", "shard_data"]


class DataSharding(NamedTuple):
    """How the model's data are split along its subsample plate.

    :param mesh: the :class:`~jax.sharding.Mesh` the data live on.
    :param str axis: the mesh axis the plate's rows are split over.
    :param tuple specs: one :class:`~jax.sharding.PartitionSpec` per array leaf of
        the model arguments (in :func:`~numpyro_sgbd.estimators.split_arrays`'
        order): ``P(axis)`` for the plate's data, ``P()`` for replicated arrays.
    :param str plate: the subsample plate's name.
    :param int num_shards: K, the size of ``axis``.
    :param int size: N, the plate's rows in all.
    :param int subsample_size: n, the minibatch in all; n / K rows per shard.
    """

    mesh: Any
    axis: str
    specs: tuple
    plate: str
    num_shards: int
    size: int
    subsample_size: int

    @property
    def local_size(self):
        """N_k = N / K, the rows of one shard."""
        return self.size // self.num_shards

    @property
    def local_subsample_size(self):
        """n_k = n / K, the minibatch rows drawn from one shard."""
        return self.subsample_size // self.num_shards

    def map(self, fn):
        """``fn(*replicated, arrays)`` run on every shard by :func:`jax.shard_map`:
        the leading arguments and the result replicated, ``arrays`` (the array
        leaves of the model arguments) split as :attr:`specs` says."""

        def mapped(*args):
            *replicated, arrays = args
            replicated_specs = tuple(PartitionSpec() for _ in replicated)
            return jax.shard_map(
                fn,
                mesh=self.mesh,
                in_specs=(*replicated_specs, list(self.specs)),
                out_specs=PartitionSpec(),
                check_vma=False,
            )(*args)

        return mapped


def shard_data(*arrays, mesh=None, axis="data"):
    """Place arrays on a mesh, split along their first axis (the plate's rows).

    :param arrays: the model's data arrays, NumPy or JAX, all with the same number
        of rows. In a run of several processes (after
        :func:`jax.distributed.initialize`) each process passes its own rows; the
        result is one global array whose rows are the processes' rows in process
        order.
    :param mesh: a :class:`~jax.sharding.Mesh` (default: a one-axis mesh over
        every device, ``jax.make_mesh((jax.device_count(),), (axis,),
        axis_types=(AxisType.Auto,))``).
    :param str axis: the mesh axis to split the rows over.
    :return: the sharded :class:`jax.Array` (a tuple of them for several arrays).

    >>> import numpy as np
    >>> X = shard_data(np.ones((8, 3)))
    >>> X.sharding.spec[0]
    'data'
    """
    if not arrays:
        raise ValueError("shard_data needs at least one array.")
    if mesh is None:
        mesh = jax.make_mesh(
            (jax.device_count(),), (axis,), axis_types=(AxisType.Auto,)
        )
    if not isinstance(mesh, Mesh):
        raise ValueError(
            f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}; build "
            "one with jax.make_mesh((num_devices,), ('data',))."
        )
    if axis not in mesh.axis_names:
        raise ValueError(
            f"axis {axis!r} is not an axis of the mesh, whose axes are "
            f"{mesh.axis_names}; pass axis= one of them."
        )
    k = mesh.shape[axis]
    multi = jax.process_count() > 1
    rows = {np.shape(x)[0] if np.ndim(x) else None for x in arrays}
    if len(rows) != 1 or None in rows:
        raise ValueError(
            "shard_data splits arrays along their first axis, the plate's rows; "
            f"they must all have the same number of rows, got {sorted(map(str, rows))}."
        )
    (local,) = rows
    total = local * jax.process_count() if multi else local
    if total % k:
        raise ValueError(
            f"{total} rows do not split evenly over the {k} devices of mesh axis "
            f"{axis!r}: drop {total % k} rows, or pad the data to "
            f"{total + k - total % k} rows (with zero weight in the model), or use "
            "a mesh of a divisor of the rows."
        )
    out = []
    for x in arrays:
        spec = PartitionSpec(axis, *([None] * (np.ndim(x) - 1)))
        sharding = NamedSharding(mesh, spec)
        if multi:
            out.append(jax.make_array_from_process_local_data(sharding, np.asarray(x)))
        else:
            out.append(jax.device_put(x, sharding))
    return out[0] if len(out) == 1 else tuple(out)


def _spec_axes(spec, ndim):
    """The mesh axis names that split each dimension (a tuple per dimension)."""
    out = []
    for j in range(ndim):
        entry = spec[j] if j < len(spec) else None
        if entry is None:
            out.append(())
        elif isinstance(entry, tuple):
            out.append(entry)
        else:
            out.append((entry,))
    return out


def _split_over_devices(x):
    """Whether ``x`` is a concrete :class:`jax.Array` split over devices."""
    return (
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and not x.sharding.is_fully_replicated
    )


def any_sharded(tree):
    """Whether a concrete :class:`jax.Array` in ``tree`` is split over devices."""
    return any(_split_over_devices(x) for x in jax.tree.leaves(tree))


def check_untransformed(traced, data):
    """A ``ValueError`` where ``data`` (the model's arguments) are sharded over
    devices and the kernel runs inside a transform (``traced``: its key is a
    tracer), which cannot take arrays that span devices."""
    if traced and any_sharded(data):
        raise ValueError(
            "The model's data are sharded over devices, and this kernel runs "
            "inside a transform (chain_method='parallel' maps chains onto the "
            "devices the data occupy, or the user's jax.jit): use "
            "chain_method='vectorized' (or 'sequential') and call MCMC.run "
            "outside jax.jit."
        )


def _sharded_arrays(arrays):
    """``[(position, array, mesh axes per dimension)]`` of the ``arrays`` split over
    more than one device; a ``ValueError`` for one split by anything but a
    :class:`~jax.sharding.NamedSharding` (whose axes the kernels cannot read)."""
    found = []
    for j, x in enumerate(arrays):
        if not _split_over_devices(x):
            continue
        sharding = x.sharding
        if not isinstance(sharding, NamedSharding):
            raise ValueError(
                f"A data argument of shape {x.shape} is split over devices by a "
                f"{type(sharding).__name__}; the kernels read a NamedSharding: "
                "place it with numpyro_sgbd.shard_data(X) or jax.device_put(X, "
                "NamedSharding(mesh, P('data')))."
            )
        found.append((j, x, _spec_axes(sharding.spec, x.ndim)))
    return found


def _check_none_on_host(model_args, model_kwargs):
    """A ``ValueError`` where some data are kept on the host
    (:class:`~numpyro_sgbd.host.HostArray`) beside sharded ones: a shard reads
    only its own rows, which a host-kept array cannot follow."""
    on_host = jax.tree.leaves(
        (model_args, model_kwargs), is_leaf=lambda x: isinstance(x, HostArray)
    )
    if any(isinstance(x, HostArray) for x in on_host):
        raise ValueError(
            "Some data arguments are sharded over devices and others kept on the "
            "host (numpyro_sgbd.host_data); a shard reads only its own rows, which "
            "host-kept arrays cannot follow. Shard them all "
            "(numpyro_sgbd.shard_data(X, y)) or keep them all on the host."
        )


def _one_plate(plates):
    """``(name, size, subsample_size)`` of the model's one subsample plate, the
    rows sharded data are split along; a ``ValueError`` for none or several."""
    if len(plates) != 1:
        raise ValueError(
            "Sharded data are split along the rows of one subsample plate; the "
            f"model subsamples {sorted(plates) or 'none'}. Write its data in one "
            "numpyro.plate(name, N, subsample_size=n)."
        )
    ((name, (size, n, _)),) = plates.items()
    return name, size, n


def _one_mesh(found):
    """The one mesh the sharded arrays ``found`` live on."""
    meshes = {x.sharding.mesh for _, x, _ in found}
    if len(meshes) > 1:
        raise ValueError(
            "The data arguments are sharded over different meshes; place them all "
            "on one (numpyro_sgbd.shard_data(X, y, mesh=mesh))."
        )
    (mesh,) = meshes
    return mesh


def _row_axis(found, name, size):
    """The one mesh axis that splits the rows of every sharded array ``found``:
    each must be the plate ``name``'s data (``size`` rows), split along its first
    dimension only, and all along the same single axis."""
    axes = set()
    for _, x, per_dim in found:
        later = [(d, a) for d, a in enumerate(per_dim) if d > 0 and a]
        if later:
            d, a = later[0]
            raise ValueError(
                f"A data argument of shape {x.shape} is sharded along its "
                f"dimension {d} (mesh axes {a}), but the kernels split data along "
                f"the rows of plate '{name}', dimension 0: shard it with "
                "P('data') (numpyro_sgbd.shard_data(X)), or replicate it."
            )
        if x.shape[0] != size:
            raise ValueError(
                f"A data argument of shape {x.shape} is sharded along its first "
                f"dimension, but plate '{name}' has {size} rows: only the plate's "
                "data can be sharded; replicate the others."
            )
        axes.add(per_dim[0])
    if len(axes) > 1:
        raise ValueError(
            f"The plate's data are split over different mesh axes {sorted(axes)}; "
            "shard them all along one axis (numpyro_sgbd.shard_data(X, y))."
        )
    (axis,) = axes
    if len(axis) != 1:
        raise ValueError(
            f"The plate's data are split over several mesh axes {axis}; shard them "
            "along one axis of the mesh."
        )
    (axis,) = axis
    return axis


def _check_plate_data_sharded(arrays, sharded, name, size, axis):
    """A ``ValueError`` where an array with the plate's ``size`` rows is not among
    the ``sharded`` positions: a shard would pair its own rows of the others with
    the wrong rows of this one."""
    for j, x in enumerate(arrays):
        if j not in sharded and np.ndim(x) and np.shape(x)[0] == size:
            raise ValueError(
                f"A data argument of shape {np.shape(x)} has the plate '{name}''s "
                f"{size} rows but is not sharded, while others are split over mesh "
                f"axis {axis!r}: shard all the plate's data alike "
                "(numpyro_sgbd.shard_data(X, y))."
            )


def _check_even_split(name, size, n, k, axis):
    """A ``ValueError`` unless the plate's ``size`` rows and its subsample size
    ``n`` both split evenly over the ``k`` shards (each shard draws n / k of its
    own N / k rows)."""
    if size % k:
        raise ValueError(
            f"Plate '{name}''s {size} rows do not split evenly over the {k} shards "
            f"of mesh axis {axis!r}: drop {size % k} rows or pad the data."
        )
    if n < k or n % k:
        near = max(k, round(n / k) * k)
        raise ValueError(
            f"subsample_size {n} of plate '{name}' must be a multiple of the {k} "
            f"shards (each shard draws n / {k} of its own rows): use "
            f"subsample_size={near}."
        )


def data_sharding(plates, model_args, model_kwargs):
    """The :class:`DataSharding` of the model's data, or ``None`` when no data
    argument is split over more than one device.

    Raises a ``ValueError`` naming the fix, before anything is compiled, when the
    data are sharded in a way the kernels cannot use: along another axis than the
    plate's rows, over several meshes or mesh axes, some of the plate's arrays
    sharded and others not, rows or the subsample size that do not split evenly
    over the shards, or a model with other than one subsample plate.

    :param dict plates: ``{name: (size, subsample_size, dim)}`` of the model's
        subsample plates.
    """
    arrays, _, _ = split_arrays((model_args, model_kwargs))
    found = _sharded_arrays(arrays)
    if not found:
        return None
    _check_none_on_host(model_args, model_kwargs)
    name, size, n = _one_plate(plates)
    mesh = _one_mesh(found)
    axis = _row_axis(found, name, size)
    sharded = {j for j, _, _ in found}
    _check_plate_data_sharded(arrays, sharded, name, size, axis)
    k = mesh.shape[axis]
    _check_even_split(name, size, n, k, axis)
    specs = tuple(
        PartitionSpec(axis) if j in sharded else PartitionSpec()
        for j in range(len(arrays))
    )
    return DataSharding(mesh, axis, specs, name, k, size, n)
