"""The exact full-data potential and its gradient of a model whose data sit in
one subsample plate, summed a chunk of rows at a time (memory O(chunk x d), never
O(N x d)), on one device or shard by shard; where the model has latent sites
inside the plate (:mod:`~numpyro_sgbd.local_sites`), each chunk reads and
differentiates its own rows of them. What
:meth:`~numpyro_sgbd.estimators.MinibatchEstimator.full_data` runs, and so the
mode search, the Laplace map and the kernels' set-up."""

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from numpyro_sgbd.estimators.indices import gather_local

__all__ = [
    "chunked_full_data",
    "shard_sites",
    "sharded_local_run",
    "split_local",
    "summed_over_shards",
]


def split_local(z, sites):
    """``(z without its local sites, their N rows)``; ``(z, None)`` without."""
    if not sites:
        return z, None
    return {k: v for k, v in z.items() if k not in sites}, {k: z[k] for k in sites}


def shard_sites(sites, local_size):
    """The local sites ``{name: LocalSite}`` of one shard: ``local_size`` rows
    on each site's plate axis."""
    out = {}
    for name, site in (sites or {}).items():
        shape = list(site.shape)
        shape[site.axis] = local_size
        out[name] = site._replace(shape=tuple(shape))
    return out


def sharded_local_run(local_run, sharding, sites):
    """:meth:`MinibatchEstimator.full_data_parts`' ``run`` on sharded data with
    local sites: each shard reads its own rows of them (split over the mesh
    axis on their plate axis, as the data are), sums its data in chunks
    (``local_run``, the shard's estimator's), and one all-reduce adds the
    potentials and the global sites' gradients; the local sites' gradients
    stay split, each shard's rows its own. Without a pullback."""
    axis = sharding.axis

    def row_spec(name):
        return PartitionSpec(*([None] * sites[name].axis), axis)

    def on_shard(z, rows, arrays):
        value, grad = local_run({**z, **rows}, arrays)
        rest = {k: v for k, v in grad.items() if k not in sites}
        value, rest = jax.lax.psum((value, rest), axis)
        return value, {**rest, **{k: grad[k] for k in sites}}

    @jax.jit
    def run(z, arrays):
        z, rows = split_local(z, sites)
        row_specs = {k: row_spec(k) for k in rows}
        grad_specs = {**{k: PartitionSpec() for k in z}, **row_specs}
        return jax.shard_map(
            on_shard,
            mesh=sharding.mesh,
            in_specs=(PartitionSpec(), row_specs, list(sharding.specs)),
            out_specs=(PartitionSpec(), grad_specs),
            check_vma=False,
        )(z, rows, arrays)

    return run


def summed_over_shards(run, sharding, sites=None):
    """One shard's full-data ``run(z, arrays)`` (each shard's own rows, the prior
    weighted 1/K) as the whole data's: the shards' potentials and gradients
    summed in one all-reduce; with local sites ``sites`` each shard's rows of
    them stay on it (:func:`sharded_local_run`)."""
    if sites:
        return sharded_local_run(run, sharding, sites)

    def on_shard(z, arrays):
        return jax.lax.psum(run(z, arrays), sharding.axis)

    return jax.jit(sharding.map(on_shard))


def chunked_full_data(terms, name, size, rebuild, chunk_size, pull, sites=None):
    """:meth:`MinibatchEstimator.full_data_parts`' ``run`` on one device: the
    full-data potential and its gradient as a scan over chunks of ``chunk_size``
    rows of the plate ``name`` (``size`` rows; the last chunk padded and masked),
    from ``terms`` (:meth:`MinibatchEstimator.terms`), the gradient passed
    through ``pull`` (:meth:`MinibatchEstimator.pull`: ``grad -> (grad, _)``).

    ``sites``: ``{name: LocalSite}`` of the local sites, whose N rows z holds
    (:mod:`~numpyro_sgbd.local_sites`). Each chunk substitutes its own rows of
    them, differentiates the chunk's log-likelihood with respect to those rows
    and adds their gradients into its rows of the result (a scatter of the
    chunk's size, not of N). The rest of the potential (prior, Jacobian, data
    outside the plate) does not involve them: each row's density is in the
    plate's terms."""
    sites = sites or {}
    c = int(min(chunk_size, size))
    num_chunks = -(-size // c)

    def parts(z, rows, start, model_args, model_kwargs):
        idx = start + jnp.arange(c)
        mask = idx < size
        idx = jnp.minimum(idx, size - 1)  # the last chunk is padded
        z = {**z, **rows} if sites else z
        value, h = terms(z, {name: idx}, model_args, model_kwargs, with_terms=True)
        # h_i = (N / c) log p(u_i, y_i | z): the prior, Jacobian and any data
        # outside the plate are value + sum(h); the chunk's log-likelihood (with
        # its local rows' densities) sum(h) c / N.
        rest = value + jnp.sum(h)
        loglik = jnp.sum(jnp.where(mask, h, 0.0)) * (c / size)
        return rest, loglik

    def rows_of(local, start):
        idx = jnp.minimum(start + jnp.arange(c), size - 1)
        return gather_local(local, sites, idx)

    @jax.jit
    def run(z, arrays):
        args = rebuild(arrays)
        z, local = split_local(z, sites)
        rest_and_grad = jax.value_and_grad(
            lambda z: parts(z, rows_of(local, 0), 0, *args)[0]
        )
        loglik_and_grad = jax.value_and_grad(
            lambda z, rows, start: parts(z, rows, start, *args)[1], argnums=(0, 1)
        )

        def body(carry, start):
            value, (grad, grad_rows) = loglik_and_grad(z, rows_of(local, start), start)
            total, total_grad, local_grad = carry
            # Padded rows repeat the last one, with a zero gradient (masked).
            local_grad = _add_rows(local_grad, grad_rows, sites, start + jnp.arange(c))
            return (total + value, _tree_add(total_grad, grad), local_grad), None

        zeros = partial(jax.tree.map, jnp.zeros_like)
        zero = (jnp.zeros(()), zeros(z), zeros(local or {}))
        starts = jnp.arange(num_chunks) * c
        (loglik, loglik_grad, local_grad), _ = jax.lax.scan(body, zero, starts)
        rest, rest_grad = rest_and_grad(z)
        grad = jax.tree.map(jnp.subtract, rest_grad, loglik_grad)
        grad = {**grad, **jax.tree.map(jnp.negative, local_grad)} if sites else grad
        return rest - loglik, pull(grad)[0]

    return run


def _tree_add(a, b):
    return jax.tree.map(jnp.add, a, b)


def _add_rows(local_grad, grad_rows, sites, idx):
    """``local_grad`` (the local sites' N rows) plus ``grad_rows`` (the rows
    ``idx`` of each site, on its plate axis) at those rows; indices past the
    end are dropped."""
    out = {}
    for k, g in local_grad.items():
        index = (slice(None),) * sites[k].axis + (idx,)
        out[k] = g.at[index].add(grad_rows[k], mode="drop")
    return out
