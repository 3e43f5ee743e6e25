"""The n per-datum gradients of a minibatch, as rows: streamed a chunk at a time
(:class:`StreamedRows`), or sparse where each datum reads its own slice of a
parameter (:class:`GatheredRows`, :func:`gathered_stream`); their moments by
coordinate, the noise statistics of a minibatch sum made from them
(:func:`noise_statistics`), and the rows in a preconditioner's coordinates
(:func:`pulled_rows`)."""

from functools import partial
import math

import jax
import jax.numpy as jnp

from numpyro_sgbd.estimators.gathered import (
    gather_of,
    gathered_rows,
    several_slices,
    trace_gathers,
)
from numpyro_sgbd.estimators.indices import in_random_order

__all__ = [
    "GatheredRows",
    "StreamedRows",
    "default_row_budget",
    "first_rows",
    "gathered_stream",
    "noise_statistics",
    "noise_subset",
    "parts_difference",
    "pulled_rows",
    "rows_per_chunk",
]


def _flat_size(tree):
    return sum(int(jnp.size(x)) for x in jax.tree.leaves(tree))


def _largest_divisor(n, at_most):
    """The largest divisor of ``n`` that is at most ``at_most`` (at least 1)."""
    return max(k for k in range(1, max(1, min(n, at_most)) + 1) if n % k == 0)


def _row_moments(rows):
    """``(mean, m2)`` by coordinate of a chunk of per-datum gradients: a tree of
    dense rows (leading axis the data) or a :class:`GatheredRows`."""
    if isinstance(rows, GatheredRows):
        return rows.moments()
    mean = jax.tree.map(lambda r: jnp.mean(r, axis=0), rows)
    m2 = jax.tree.map(lambda r, m: jnp.sum(jnp.square(r - m), axis=0), rows, mean)
    return mean, m2


class StreamedRows:
    """The n per-datum gradients of a minibatch, formed ``chunk`` rows at a time
    and never held all at once: ``fn(indices[j:j + chunk])`` gives those rows
    (a tree with leading axis ``chunk``, or a :class:`GatheredRows`).
    :meth:`moments` reduces them in one pass; ``a - b`` is the rows of the
    difference (control variates: the same indices at two points).
    """

    def __init__(self, fn, indices, chunk):
        self.fn = fn
        self.indices = indices
        self.chunk = chunk

    def __sub__(self, other):
        def fn(idx):
            rows, other_rows = self.fn(idx), other.fn(idx)
            if isinstance(rows, GatheredRows):
                return rows - other_rows
            return jax.tree.map(jnp.subtract, rows, other_rows)

        return StreamedRows(fn, self.indices, self.chunk)

    def moments(self):
        """``(mean, m2)`` of the rows by coordinate: their mean and sum of squared
        deviations from it, merged chunk by chunk (Chan, Golub & LeVeque's pairwise
        update, stable where the mean is large against the spread): memory two
        trees of the gradient's size plus one chunk of rows."""
        n, c = jnp.shape(self.indices)[0], self.chunk
        if c == n:  # one chunk: nothing to merge
            return _row_moments(self.fn(self.indices))
        chunks = self.indices.reshape(n // c, c)
        first = jax.eval_shape(lambda idx: _row_moments(self.fn(idx))[0], chunks[0])

        def body(carry, idx_and_seen):
            mean, m2 = carry
            idx, seen = idx_and_seen
            mean_b, m2_b = _row_moments(self.fn(idx))
            total = seen + c
            delta = jax.tree.map(jnp.subtract, mean_b, mean)
            mean = jax.tree.map(lambda m, d: m + d * (c / total), mean, delta)
            m2 = jax.tree.map(
                lambda a, b, d: a + b + jnp.square(d) * (seen * c / total),
                m2,
                m2_b,
                delta,
            )
            return (mean, m2), None

        zeros = jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), first)
        seen = jnp.arange(n // c, dtype=jnp.result_type(float)) * c
        (mean, m2), _ = jax.lax.scan(body, (zeros, zeros), (chunks, seen))
        return mean, m2


class GatheredRows:
    """A chunk of per-datum gradients (in a :class:`StreamedRows`) where some
    parameter leaves are read by each datum through one gather (a row of an
    embedding or factor matrix, a group's effect;
    :func:`~numpyro_sgbd.estimators.gathered.trace_gathers`): such a leaf keeps each
    datum's slice gradient and start index, every other leaf its dense rows.
    :meth:`moments` and ``a - b`` take O(rows x slice + d) memory and work,
    where dense rows cost O(rows x d).
    """

    def __init__(self, treedef, shapes, gathers, dense, local, starts):
        self.treedef = treedef
        self.shapes = shapes  # ShapeDtypeStructs of the leaves
        self.gathers = gathers  # {leaf index: gather equation}
        self.dense, self.local, self.starts = dense, local, starts

    def __sub__(self, other):
        def minus(a, b):
            return None if a is None else a - b

        return GatheredRows(
            self.treedef,
            self.shapes,
            self.gathers,
            [minus(a, b) for a, b in zip(self.dense, other.dense)],
            [minus(a, b) for a, b in zip(self.local, other.local)],
            self.starts,  # the same data, so the same slices
        )

    def moments(self):
        """``(mean, m2)`` of the rows by coordinate, as
        :meth:`StreamedRows.moments`. For a gathered leaf, with c_j the number of
        data whose slice holds coordinate j and S_j the sum of their gradients
        there: mean_j = S_j / n, and m2_j sums the squared deviations of those
        c_j data from the mean plus (n - c_j) mean_j**2 for the data whose
        gradient is zero there (two passes, no cancellation)."""
        means, m2s = [], []
        for j, shape in enumerate(self.shapes):
            if j not in self.gathers:
                mean, m2 = _row_moments(self.dense[j])  # one leaf's rows
                means.append(mean)
                m2s.append(m2)
                continue
            local, starts = self.local[j], self.starts[j]
            n = local.shape[0]
            gather = gather_of(self.gathers[j])

            def slices(operand, gather=gather, starts=starts):
                return jax.vmap(gather, (None, 0))(operand, starts)

            scatter = jax.linear_transpose(slices, shape)
            (total,) = scatter(local)
            mean = total / n
            # A datum that reads a coordinate through several of its slices
            # counts once there, with the sum of those slices' gradients.
            local, first = _merged(self.gathers[j], shape.shape, local, starts)
            (count,) = scatter(first * jnp.ones_like(local))
            (m2,) = scatter(first * jnp.square(local - slices(mean)))
            means.append(mean)
            m2s.append(m2 + (n - count) * jnp.square(mean))
        unflatten = partial(jax.tree.unflatten, self.treedef)
        return unflatten(means), unflatten(m2s)


def _merged(eqn, shape, local, starts):
    """``(local, first)`` for the moments of a gathered leaf: where the gather
    ``eqn`` reads several single entries per datum (``w[cols[i]]``), each
    slice's gradient replaced by the sum over the datum's slices that start at
    the same (clipped) index, and ``first`` 1 at the first of them, 0 at the
    others (broadcast over the slices); ``(local, 1.0)`` for one slice per
    datum."""
    if not several_slices(eqn):
        return local, 1.0
    numbers = eqn.params["dimension_numbers"]
    n, k, width = local.shape[0], math.prod(starts.shape[1:-1]), starts.shape[-1]
    highest = jnp.array([shape[d] - 1 for d in numbers.start_index_map])
    at = jnp.clip(starts.reshape(n, k, width), 0, highest)
    same = jnp.all(at[:, :, None] == at[:, None, :], -1)  # (n, k, k)
    flat = local.reshape(n, k, -1)
    merged = jnp.einsum("nab,nbs->nas", same.astype(flat.dtype), flat)
    first = ~jnp.any(jnp.tril(same, -1), -1)  # no earlier slice at that index
    first = jnp.broadcast_to(first[:, :, None], flat.shape).astype(flat.dtype)
    return merged.reshape(local.shape), first.reshape(local.shape)


def gathered_stream(term, z, indices, chunk, row_budget):
    """``term``'s gradients on the data ``indices`` as :class:`StreamedRows`
    whose chunks are :class:`GatheredRows`, as many rows a chunk as
    ``row_budget`` floats allow; or ``None`` where that does not apply: no leaf
    is read through one gather, or a chunk would be no larger than ``chunk``
    (the dense rows')."""
    leaves, treedef = jax.tree.flatten(z)
    plan = trace_gathers(
        lambda leaves, i: term(jax.tree.unflatten(treedef, leaves), i),
        leaves,
        indices[0],
    )
    if plan is None:
        return None
    per_row = _flat_size(
        [x for j, x in enumerate(leaves) if j not in plan.gathers]
    ) + sum(2 * eqn.outvars[0].aval.size for eqn in plan.gathers.values())
    rows = _largest_divisor(jnp.shape(indices)[0], row_budget // per_row)
    if rows <= chunk:
        return None
    shapes = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves]

    def fn(idx):
        parts = gathered_rows(plan, leaves, idx)
        return GatheredRows(treedef, shapes, plan.gathers, *parts)

    try:  # the program re-evaluated equation by equation, as traced
        jax.eval_shape(partial(gathered_rows, plan, leaves), indices[:rows])
    except Exception:  # an equation that cannot be re-bound: dense rows
        return None
    return StreamedRows(fn, indices, rows)


def parts_difference(parts, parts_c):
    """``(value, gradient, rows)`` of one evaluation minus those of another on
    the same indices (control variates: at z and at the centre); the rows dense
    (a tree), a :class:`StreamedRows` or ``None``."""
    (value, grad, rows), (value_c, grad_c, rows_c) = parts, parts_c
    if isinstance(rows, StreamedRows):
        rows = rows - rows_c
    elif rows is not None:
        rows = jax.tree.map(jnp.subtract, rows, rows_c)
    return value - value_c, jax.tree.map(jnp.subtract, grad, grad_c), rows


def _pulled_dense(pullback, rows):
    """Dense rows (a tree with leading axis n) through ``pullback``, flat:
    (n, d) in ravel_pytree's order, mapped."""
    leaves = jax.tree.leaves(rows)
    n = leaves[0].shape[0]
    return pullback(jnp.concatenate([g.reshape(n, -1) for g in leaves], 1))


def _pulled_chunk(pullback, fn, idx):
    """The chunk ``fn(idx)`` of a :class:`StreamedRows` through ``pullback``."""
    return _pulled_dense(pullback, fn(idx))


def pulled_rows(pullback, rows):
    """The per-datum gradients ``rows`` (a tree with leading axis n, or a
    :class:`StreamedRows` of dense chunks) through the linear map ``pullback``
    (``g -> L' g`` on flat gradients), as flat rows: the rows of the gradients
    in the whitened coordinates u of ``z = z_hat + L u``. Streamed rows stay
    streamed, each chunk mapped as it is formed."""
    if isinstance(rows, StreamedRows):
        fn = partial(_pulled_chunk, pullback, rows.fn)
        return StreamedRows(fn, rows.indices, rows.chunk)
    return _pulled_dense(pullback, rows)


def default_row_budget():
    """:attr:`MinibatchEstimator.row_budget`'s default for JAX's default
    backend: 2**18 floats a chunk on a CPU, 2**22 on an accelerator."""
    return 2**18 if jax.default_backend() == "cpu" else 2**22


def rows_per_chunk(z, n, covariance, budget):
    """Rows per chunk of the n per-datum gradients at ``z``: ``n`` (all at
    once, as rows) where the noise form ``covariance`` needs every row
    (``"lowrank"``, ``"full"``: the factor or the matrix) or they fit ``budget``
    floats, else the largest divisor of n that does (a :class:`StreamedRows`)."""
    if covariance in ("lowrank", "full"):
        return n
    return _largest_divisor(n, budget // max(_flat_size(z), 1))


def noise_subset(rows, m, plates, replace):
    """The first ``m`` of the dense per-datum gradients ``rows`` of the one
    subsample plate in ``plates`` (``{name: (size, n, ...)}``) where they are a
    random sample (:func:`~numpyro_sgbd.estimators.indices.in_random_order`):
    enough for a noise sd, which the kernels average over steps (a covariance,
    NOGIN's, is used as it is at each step: its caller passes ``m=None``);
    ``rows`` otherwise (``m`` None or at least n, streamed rows, several
    plates)."""
    if len(plates) != 1 or isinstance(rows, StreamedRows):
        return rows
    ((size, n, *_),) = plates.values()
    if first_rows(m, size, n, replace) == n:
        return rows
    return jax.tree.map(lambda r: r[:m], rows)


def first_rows(m, size, n, replace):
    """How many of a minibatch's n rows a noise estimate from its first ``m``
    uses: ``m`` where that is fewer and the draw's indices come in random order
    (:func:`~numpyro_sgbd.estimators.indices.in_random_order`, so that they are
    a random sample of the plate's ``size`` rows), else n (``m`` None: n)."""
    if m is None or m >= n or not in_random_order(replace, size, n):
        return n
    return m


def noise_statistics(rows, n, factor, covariance, total, gather):
    """``(noise sd, noise covariance or None)`` of a minibatch sum from its ``n``
    per-datum gradients ``rows`` (a tree with leading axis n, or a
    :class:`StreamedRows`): ``factor`` (:func:`~numpyro_sgbd.estimators.
    noise_variance_factor`) times their sample variance, and the covariance in
    the form ``covariance`` names (``None``, ``"diag"``, ``"lowrank"`` or
    ``"full"``; see :class:`~numpyro_sgbd.estimators.MinibatchEstimator`).
    ``total`` sums a variance or a full covariance over shards and ``gather``
    joins a low-rank factor's columns (both the identity on one device)."""
    if isinstance(rows, StreamedRows):  # its own count: all n, or a subset
        _, m2 = rows.moments()
        count = jnp.shape(rows.indices)[0]
        variance = jax.tree.map(lambda v: v / (count - 1), m2)
    else:
        variance = jax.tree.map(lambda g: jnp.var(g, 0, ddof=1), rows)
    variance = total(jax.tree.map(lambda v: factor * v, variance))
    noise_sd = jax.tree.map(jnp.sqrt, variance)
    if covariance is None:
        return noise_sd, None
    if covariance == "diag":
        # In ravel_pytree's order, as the rows' columns.
        cov = jnp.concatenate([v.reshape(-1) for v in jax.tree.leaves(variance)])
    else:
        flat = jnp.concatenate(
            [g.reshape(n, -1) for g in jax.tree.leaves(rows)], axis=1
        )  # (n, d), columns in ravel_pytree's order
        cov = jnp.sqrt(factor / (n - 1)) * (flat - flat.mean(0)).T  # C, (d, n)
        if covariance == "full":
            cov = total(cov @ cov.T)
        else:
            cov = gather(cov)
    return noise_sd, cov
