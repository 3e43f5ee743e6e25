"""Pytree fixtures shared by the update-rule tests."""

import jax
import jax.numpy as jnp


def tree_z():
    """A nested dict of leaves of mixed shapes (a scalar, a vector, a matrix)."""
    return {
        "a": jnp.asarray(0.25, jnp.float32),
        "b": jnp.array([1.0, -2.0, 0.5], jnp.float32),
        "c": {"d": jnp.arange(8, dtype=jnp.float32).reshape(2, 4) / 4.0 - 1.0},
    }


def tree_like(z, fn):
    """``fn`` applied to every leaf of ``z``, keeping each leaf's dtype."""
    return jax.tree.map(lambda x: fn(x).astype(x.dtype), z)
