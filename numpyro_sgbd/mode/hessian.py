"""The Hessian of a flat potential from Hessian-vector products, a block of rows
at a time: its rows (:func:`hessian_rows`), its diagonal
(:func:`hessian_diagonal`), never more than ``block x d`` numbers at once."""

import jax.numpy as jnp
import numpy as np

__all__ = ["hessian", "hessian_diagonal", "hessian_rows", "mode_hessian", "symmetric"]


def hessian_rows(hvp, x, *, block=64):
    """Yields ``(start, rows)``: rows ``start..start+b`` of the Hessian at ``x``, b
    Hessian-vector products at a time (the last block padded with zero rows, so
    one compilation serves every block)."""
    d = x.shape[0]
    block = max(1, min(block, d))
    for start in range(0, d, block):
        stop = min(start + block, d)
        basis = np.zeros((block, d), np.dtype(x.dtype))
        basis[np.arange(stop - start), np.arange(start, stop)] = 1.0
        rows = np.asarray(hvp(x, jnp.asarray(basis)), np.float64)
        yield start, rows[: stop - start]


def hessian_diagonal(hvp, x, *, block=64):
    """The Hessian's diagonal at ``x`` from ``d`` Hessian-vector products, ``block``
    at a time: memory O(block x d), never d x d.

    :param hvp: ``(x, V) -> rows H v`` as :attr:`~numpyro_sgbd.mode.Objective.hvp`.
    :param x: the flat point.
    :return: a float64 NumPy array of length d.

    >>> import jax, jax.numpy as jnp
    >>> grad = jax.grad(lambda x: 0.5 * jnp.sum(jnp.arange(3.0) * x**2))
    >>> def hvp(x, vectors):  # H = diag(0, 1, 2)
    ...     return jax.vmap(lambda v: jax.jvp(grad, (x,), (v,))[1])(vectors)
    >>> hessian_diagonal(hvp, jnp.ones(3), block=2).tolist()
    [0.0, 1.0, 2.0]
    """
    diag = np.empty(x.shape[0])
    for start, rows in hessian_rows(hvp, x, block=block):
        diag[start : start + rows.shape[0]] = rows[
            np.arange(rows.shape[0]), start + np.arange(rows.shape[0])
        ]
    return diag


def symmetric(rows):
    """The symmetric part of a square matrix of Hessian rows."""
    return 0.5 * (rows + rows.T)


def hessian(hvp, x, *, block=64):
    """The full d x d Hessian at ``x`` (symmetrised), d Hessian-vector products
    ``block`` at a time. For the Laplace map of a reference, not for the search."""
    d = x.shape[0]
    out = np.empty((d, d))
    for start, rows in hessian_rows(hvp, x, block=block):
        out[start : start + rows.shape[0]] = rows
    return symmetric(out)


def mode_hessian(objective, x, info):
    """The symmetrised Hessian at ``find_mode``'s point ``x``: the one the search
    formed there (up to 64 parameters), else d Hessian-vector products."""
    if info.get("hessian") is not None:
        return info["hessian"]
    return hessian(objective.hvp, x)
