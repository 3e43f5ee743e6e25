r"""The set-up of a model with local sites (latent sites inside the subsample
plate, :mod:`~numpyro_sgbd.local_sites`) for ``step_size=None``: a start, a
preconditioner of the global sites and a start for every row, without the joint
mode, which per-row latents under a scale parameter do not have (the funnel:
Gelman et al. 2013, *Bayesian Data Analysis*, 3rd ed., Section 13.3).

**The global sites' mode** is the mode of their marginal posterior with each
row's local sites integrated out by Laplace's method, row by row (Tierney &
Kadane 1986, JASA 81; the per-group form of Rue, Martino & Chopin 2009, JRSS B
71, Section 3.1):

.. math::

    \log \tilde p(\theta \mid y) = \log p(\theta) + \sum_i \Big[
    \log p(\hat u_i, y_i \mid \theta) - \tfrac12 \log\det C_i \Big],
    \qquad C_i = -\nabla^2_{u_i} \log p(u_i, y_i \mid \theta)\big|_{\hat u_i},

with :math:`\hat u_i(\theta)` row i's conditional mode (in the unconstrained
coordinates the chains move in). Each row's mode is found by Newton's method on
its own few coordinates, every row of a chunk at once (their Hessians are block
diagonal: k forward passes over the chunk's gradient give all k x k blocks).
Its gradient needs :math:`d\hat u_i / d\theta`: one Newton step from the
converged mode, :math:`\hat u + C^{-1} g`, differentiated with the mode held
fixed, has exactly the implicit function's derivative there. The log
determinant keeps the scale away from the neck of the funnel, where the
profile (local sites at their conditional modes, no determinant) runs off.

**The preconditioner** is built from the Hessian, in the global sites, of the
*conditional* potential :math:`-\log p(\theta \mid u, y)` at that mode with every
row drawn from its Laplace approximation :math:`N(\hat u_i, C_i^{-1})`: the
global sites move given the rows (the kernels' Gibbs scheme), so the step must
suit that conditional's curvature, not the wider marginal's; and a draw, not the
conditional modes, which shrink the rows and understate the curvature in the
scales (by :math:`\tau^2 / (\tau^2 + \sigma^2)` for a normal random effect).
The chains' rows start from such draws.
"""

from typing import Any, NamedTuple

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.estimators.compiled import median_start_program, split_arrays
from numpyro_sgbd.handlers import full_batch
from numpyro_sgbd.mode import kept_programs

__all__ = [
    "LocalLaplace",
    "ROW_NEWTON_STEPS",
    "conditional_objective",
    "draw_rows",
    "marginal_objective",
    "row_laplace",
]

#: Newton steps per row and evaluation (each no longer than
#: :data:`ROW_MAX_MOVE` in the row's curvature units).
ROW_NEWTON_STEPS = 25
#: The longest Newton step of a row, in its conditional sds: far from the mode
#: (a Poisson row started at 0 with a count of 10^4) the steps are cut to this.
ROW_MAX_MOVE = 8.0


class LocalLaplace(NamedTuple):
    """Every row's Laplace approximation at the global sites' mode: the
    conditional modes ``mean`` (flat, shape (N, k)) and ``scale_tril`` (N, k,
    k), the Cholesky factors of the inverse curvatures; a row is ``mean +
    scale_tril @ e``."""

    mean: Any
    scale_tril: Any


def _row_layout(sites, c):
    """``(to_flat, from_flat)`` between the local sites' rows (a dict, c rows on
    each site's plate axis) and an array (c, k), k the row's coordinates."""
    names = sorted(sites)

    def to_flat(rows):
        parts = [jnp.moveaxis(rows[k], sites[k].axis, 0).reshape(c, -1) for k in names]
        return jnp.concatenate(parts, axis=1)

    sizes = [
        int(np.prod(sites[k].shape)) // sites[k].shape[sites[k].axis] for k in names
    ]
    bounds = np.cumsum([0] + sizes)

    def from_flat(flat):
        out = {}
        for k, a, b in zip(names, bounds[:-1], bounds[1:]):
            shape = list(sites[k].shape)
            del shape[sites[k].axis]
            out[k] = jnp.moveaxis(flat[:, a:b].reshape(c, *shape), 0, sites[k].axis)
        return out

    return to_flat, from_flat, int(bounds[-1])


def _curvature(hess, floor=1e-6):
    """``(eigenvalues, eigenvectors)`` of the rows' curvatures ``-hess`` (c, k,
    k), symmetrised, with |eigenvalue| floored: a row where the conditional is
    not concave gets the saddle-free step (Dauphin et al. 2014)."""
    curv = -0.5 * (hess + jnp.swapaxes(hess, -1, -2))
    w, v = jnp.linalg.eigh(curv)
    top = jnp.max(jnp.abs(w), axis=-1, keepdims=True)
    return jnp.maximum(jnp.abs(w), floor * top + 1e-30), v


def _newton_move(g, w, v, max_move=ROW_MAX_MOVE):
    """The rows' Newton steps C^-1 g (C = v diag(w) v'), each cut to
    ``max_move`` in its curvature's norm (``None``: not cut, and
    differentiable everywhere)."""
    proj = jnp.einsum("ckj,ck->cj", v, g) / w
    if max_move is None:
        return jnp.einsum("ckj,cj->ck", v, proj)
    norm = jnp.sqrt(jnp.sum(proj**2 * w, axis=-1, keepdims=True))
    proj = proj * jnp.minimum(1.0, max_move / jnp.maximum(norm, 1e-30))
    return jnp.einsum("ckj,cj->ck", v, proj)


class _Chunk(NamedTuple):
    """The chunk-level pieces of the marginal, for one chunk of rows."""

    loglik: Any  # (theta, R) -> sum_j mask_j log p(u_j, y_j | theta)
    grad_hess: Any  # (theta, R) -> (g (c, k), H (c, k, k))


def _chunk_parts(terms, name, size, c, sites, model_args, model_kwargs, start):
    """``(chunk, mask)``: the :class:`_Chunk` of the ``c`` rows from ``start``
    of the plate ``name`` (``size`` rows; the last chunk padded, ``mask``
    false on its padding), from ``terms``
    (:meth:`~numpyro_sgbd.estimators.MinibatchEstimator.terms`)."""
    idx = start + jnp.arange(c)
    mask = idx < size
    idx = jnp.minimum(idx, size - 1)
    _, from_flat, k = _row_layout(sites, c)

    def loglik(theta, flat):
        z = {**theta, **from_flat(flat)}
        _, h = terms(z, {name: idx}, model_args, model_kwargs, with_terms=True)
        return jnp.sum(jnp.where(mask, h, 0.0)) * (c / size)

    def grad_hess(theta, flat):
        grad_fn = jax.grad(loglik, argnums=1)
        g, lin = jax.linearize(lambda r: grad_fn(theta, r), flat)
        eye = jnp.eye(k, dtype=flat.dtype)
        cols = jax.vmap(lambda e: lin(jnp.broadcast_to(e, flat.shape)))(eye)
        hess = jnp.moveaxis(cols, 0, -1)  # H[j, :, m] = d g_j / d r_jm
        # The last chunk's padding rows: no term, so a unit curvature and no
        # gradient (a zero curvature's floored eigenvalue, 1e-30, made the
        # derivatives of their masked log-determinants NaN).
        hess = jnp.where(mask[:, None, None], hess, -eye)
        return jnp.where(mask[:, None], g, 0.0), hess

    return _Chunk(loglik, grad_hess), mask


def _row_modes(chunk, theta, flat):
    """The rows' conditional modes by :data:`ROW_NEWTON_STEPS` Newton steps."""

    def body(_, r):
        g, h = chunk.grad_hess(theta, r)
        w, v = _curvature(h)
        return r + _newton_move(g, w, v)

    return jax.lax.fori_loop(0, ROW_NEWTON_STEPS, body, flat)


def _rest(terms, name, size, theta, model_args, model_kwargs, sites, c):
    """-log p(theta) (prior, Jacobians, data outside the plate): the chunk's
    potential plus its scaled terms, at any rows."""
    _, from_flat, k = _row_layout(sites, c)
    z = {**theta, **from_flat(jnp.zeros((c, k)))}
    idx = jnp.arange(c)
    value, h = terms(z, {name: idx}, model_args, model_kwargs, with_terms=True)
    return value + jnp.sum(h)


def marginal_objective(estimator, sites, model, model_args, model_kwargs, chunk_size):
    """The global sites' Laplace-marginal potential (module docstring) as
    ``(x0, unravel, value_and_grad, value_grad_hvp, laplace)``: ``x0`` the
    global sites' ``init_to_median`` start, flat; ``value_and_grad(x)`` and
    ``value_grad_hvp(x, V)`` compiled, with the data as arguments; ``laplace(x)
    -> (mean, curvature)`` the rows' conditional modes (N, k) and curvatures
    (N, k, k) at x. ``estimator``: a
    :class:`~numpyro_sgbd.estimators.MinibatchEstimator` of the model's one
    subsample plate with its local ``sites``. The compiled programs are kept
    for the model and the data's shapes (:func:`~numpyro_sgbd.mode.kept_programs`):
    a refit on data of the same shapes compiles none of them again."""
    arrays, rebuild, key = split_arrays((model_args, model_kwargs))
    ((name, (size, _, _)),) = estimator.plates.items()
    if key is not None:
        shapes = tuple((jnp.shape(x), jnp.result_type(x)) for x in arrays)
        key = ("local_laplace", key, shapes, tuple(sorted(sites)), chunk_size)

    def build():
        return _marginal_programs(
            estimator, sites, model, rebuild, arrays, name, size, chunk_size
        )

    start_fn, unravel, value_and_grad, value_grad_hvp, laplace = kept_programs(
        model, key, build
    )
    z0 = start_fn(arrays, random.key(0))
    x0 = ravel_pytree({k: v for k, v in z0.items() if k not in sites})[0]
    return (
        x0,
        unravel,
        lambda x: value_and_grad(x, arrays),
        lambda x, vectors: value_grad_hvp(x, vectors, arrays),
        lambda x: laplace(x, arrays),
    )


def _marginal_programs(estimator, sites, model, rebuild, arrays, name, size, chunk):
    """:func:`marginal_objective`'s compiled programs, the data their last
    argument: ``(start, unravel, value_and_grad, value_grad_hvp, laplace)``."""
    c = int(min(chunk, size))
    num_chunks = -(-size // c)
    terms = estimator.terms
    start_fn = median_start_program(full_batch(model), rebuild)
    z0 = jax.eval_shape(start_fn, arrays, random.key(0))
    theta0 = {k: jnp.zeros(v.shape, v.dtype) for k, v in z0.items() if k not in sites}
    unravel = ravel_pytree(theta0)[1]
    k = _row_layout(sites, c)[2]

    def potential(x, arrays):
        args, kwargs = rebuild(arrays)
        theta = unravel(x)
        rest = _rest(terms, name, size, theta, args, kwargs, sites, c)

        def body(total, start):
            chunk, mask = _chunk_parts(terms, name, size, c, sites, args, kwargs, start)
            fixed = jax.lax.stop_gradient(theta)
            init = jnp.zeros((c, k), x.dtype)
            r_hat = jax.lax.stop_gradient(_row_modes(chunk, fixed, init))
            g, h = chunk.grad_hess(theta, r_hat)
            w, v = _curvature(h)
            r = r_hat + _newton_move(g, w, v, None)  # d r / d theta exact
            _, h_at = chunk.grad_hess(theta, r)
            logdet = jnp.sum(jnp.log(_curvature(h_at)[0]), axis=-1)
            value = chunk.loglik(theta, r) - 0.5 * jnp.sum(jnp.where(mask, logdet, 0))
            return total + value, None

        total, _ = jax.lax.scan(
            body, jnp.zeros((), x.dtype), jnp.arange(num_chunks) * c
        )
        return rest - total

    @jax.jit
    def value_grad_hvp(x, vectors, arrays):
        def one(v):
            return jax.jvp(
                lambda x: jax.value_and_grad(potential)(x, arrays), (x,), (v,)
            )

        (value, grad), (_, products) = jax.vmap(one, out_axes=((None, None), 0))(
            vectors
        )
        return value, grad, products

    @jax.jit
    def laplace(x, arrays):
        args, kwargs = rebuild(arrays)
        theta = unravel(x)

        def body(_, start):
            chunk, _ = _chunk_parts(terms, name, size, c, sites, args, kwargs, start)
            r_hat = _row_modes(chunk, theta, jnp.zeros((c, k), x.dtype))
            _, h = chunk.grad_hess(theta, r_hat)
            w, v = _curvature(h)
            return None, (r_hat, jnp.einsum("ckj,cj,cmj->ckm", v, w, v))

        _, (mean, curv) = jax.lax.scan(body, None, jnp.arange(num_chunks) * c)
        return mean.reshape(-1, k)[:size], curv.reshape(-1, k, k)[:size]

    value_and_grad = jax.jit(jax.value_and_grad(potential))
    return start_fn, unravel, value_and_grad, value_grad_hvp, laplace


def row_laplace(mean, curvature):
    """:class:`LocalLaplace` from the rows' modes and curvatures."""
    cov = jnp.linalg.inv(curvature)
    cov = 0.5 * (cov + jnp.swapaxes(cov, -1, -2))
    return LocalLaplace(mean, jnp.linalg.cholesky(cov))


def draw_rows(rng_key, laplace, sites, batch_shape=()):
    """The local sites' N rows drawn from their Laplace approximations
    (unconstrained, by site, with ``batch_shape`` chains in front)."""
    size, k = laplace.mean.shape
    _, from_flat, _ = _row_layout(sites, size)
    e = random.normal(rng_key, tuple(batch_shape) + (size, k), laplace.mean.dtype)
    flat = laplace.mean + jnp.einsum("nkm,...nm->...nk", laplace.scale_tril, e)
    one = from_flat
    for _ in batch_shape:
        one = jax.vmap(one)
    return one(flat)


def conditional_objective(run, arrays, unravel, rows):
    """``(value_and_grad, hvp)`` of the conditional potential of the global
    sites (flat x) with the local sites fixed at ``rows`` (by site, all N):
    ``run`` is :meth:`~numpyro_sgbd.estimators.MinibatchEstimator.full_data_parts`'
    function of z (every site) and the data ``arrays``."""

    def value_and_grad(x):
        theta = unravel(x)
        value, grad = run({**theta, **rows}, arrays)
        return value, ravel_pytree({k: grad[k] for k in theta})[0]

    @jax.jit
    def hvp(x, vectors):
        def one(v):
            return jax.jvp(lambda x: value_and_grad(x)[1], (x,), (v,))[1]

        return jax.vmap(one)(vectors)

    return jax.jit(value_and_grad), hvp
