"""Pytree plumbing shared by the coordinate-wise update rules."""

import jax
from jax import random
import jax.numpy as jnp


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
