"""The helpers the update rules share, in one public module: pytree plumbing
(:func:`broadcast_tree`, :func:`map_coordinates`, :func:`tree_mean`,
:func:`fraction`), one key per leaf (:func:`leaf_keys`), the unit normals of
the coordinate-wise rules raveled (:func:`flat_unit_normals`) and the dtype
their sums accumulate in (:func:`accumulator`). Nothing here imports NumPyro."""

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp

__all__ = [
    "accumulator",
    "broadcast_tree",
    "flat_unit_normals",
    "fraction",
    "leaf_keys",
    "map_coordinates",
    "tree_mean",
]


def broadcast_tree(value, tree, name):
    """``value`` as a pytree matching ``tree``: a scalar is repeated on every leaf."""
    if value is None:
        return jax.tree.map(lambda _: None, tree)
    if jax.tree.structure(value) == jax.tree.structure(tree):
        return value
    if jax.tree_util.treedef_is_leaf(jax.tree.structure(value)) and not jnp.ndim(value):
        return jax.tree.map(lambda _: value, tree)
    raise ValueError(f"{name} must be a scalar or a pytree matching z.")


def map_coordinates(fn, rng_key, z, z_grad, step_size, noise_sd):
    """Apply ``fn(key, x, grad, sigma, tau) -> (x_new, exceeded)`` leaf by leaf.

    Each leaf gets its own key; ``step_size`` and ``noise_sd`` may be scalars (or
    ``None`` for the noise). Returns the pair of pytrees ``(z_new, exceeded)``.
    """
    step_size = broadcast_tree(step_size, z, "step_size")
    noise_sd = broadcast_tree(noise_sd, z, "noise_sd")
    leaves, treedef = jax.tree.flatten(z)
    keys = random.split(rng_key, max(len(leaves), 1))[: len(leaves)]
    out = [
        fn(key, x, grad, sigma, tau)
        for key, x, grad, sigma, tau in zip(
            keys,
            leaves,
            treedef.flatten_up_to(z_grad),
            treedef.flatten_up_to(step_size),
            treedef.flatten_up_to(noise_sd),
        )
    ]
    return (
        treedef.unflatten([o[0] for o in out]),
        treedef.unflatten([o[1] for o in out]),
    )


def tree_mean(tree):
    """The mean of every entry of every leaf of ``tree`` (NaN when it holds
    none, e.g. a model with no latent sites)."""
    leaves = jax.tree.leaves(tree)
    size = sum(jnp.size(x) for x in leaves)
    if size == 0:
        return jnp.array(jnp.nan, jnp.result_type(float))
    return sum(jnp.sum(x) for x in leaves) / size


def fraction(flags):
    """The fraction of true leaves' entries in a pytree of booleans, as a float
    (NaN when the tree holds no entries)."""
    dtype = jnp.result_type(float)
    return tree_mean(jax.tree.map(lambda x: x.astype(dtype), flags))


def leaf_keys(rng_key, num_leaves):
    """One key per leaf, as :func:`map_coordinates` splits them."""
    return random.split(rng_key, max(num_leaves, 1))[:num_leaves]


def accumulator(dtype):
    """The dtype sums over coordinates accumulate in: at least float32 (a
    float16 leaf would overflow)."""
    return jnp.promote_types(dtype, jnp.float32)


def flat_unit_normals(rng_key, z):
    """The unit normals of :func:`~numpyro_sgbd.updates.langevin_step`, raveled:
    one key per leaf of ``z`` (:func:`leaf_keys`) and a standard normal of the
    leaf's shape and dtype, as :func:`map_coordinates` draws them."""
    leaves = jax.tree.leaves(z)
    keys = leaf_keys(rng_key, len(leaves))
    draws = [
        random.normal(key, jnp.shape(x), jnp.result_type(x))
        for key, x in zip(keys, leaves)
    ]
    return ravel_pytree(draws)[0]
