"""The kernel Stein discrepancy: sample quality from draws and scores alone.

The Stein discrepancies come twice: a pure, jittable core (:func:`imq_ksd` here,
:func:`~numpyro_sgbd.evaluation.fssd.fssd_opt`) that takes JAX arrays, an
optional row mask, and returns a JAX scalar (NaN or inf for non-finite input,
never an exception), so that a tuner can ``jit`` and ``vmap`` it over arms; and a
validating wrapper (:func:`ksd`, :func:`~numpyro_sgbd.evaluation.fssd.fssd`)
that returns a Python float. :func:`posterior_ksd` is :func:`ksd` of a run's
draws, with the model's exact scores.
"""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

__all__ = ["imq_ksd", "ksd", "posterior_ksd", "unconstrained_draws_and_scores"]


def _row_mask(mask, m):
    """The boolean ``(m,)`` row mask (all rows when ``mask`` is None)."""
    if mask is None:
        return jnp.ones(m, bool)
    mask = jnp.asarray(mask, bool)
    if mask.shape != (m,):
        raise ValueError(f"mask must have shape ({m},), got {mask.shape}.")
    return mask


def _masked_centred(samples, scores, mask):
    """Draws centred at the mean of the rows in ``mask``, scores, row weights and
    their count, in a common floating dtype. Rows outside the mask are set to zero
    (so that whatever fills them, NaN included, never reaches the sums)."""
    x, s = jnp.asarray(samples), jnp.asarray(scores)
    dtype = jnp.result_type(x.dtype, s.dtype, float)
    x, s = x.astype(dtype), s.astype(dtype)
    keep = _row_mask(mask, x.shape[0])
    weight = keep.astype(dtype)
    count = jnp.sum(weight)
    x = jnp.where(keep[:, None], x, 0.0)
    s = jnp.where(keep[:, None], s, 0.0)
    x = jnp.where(keep[:, None], x - (weight @ x) / count, 0.0)
    return x, s, weight, count


def _imq_stein_kernel(x_block, s_block, x, s, *, c, beta):
    """The IMQ Stein kernel k_p(x_i, x_j) for the rows i of the block and all j,
    shape (block, m), through inner products only (no (block, m, d) array)."""
    d = x.shape[1]
    r_sq = jnp.maximum(
        jnp.sum(x_block * x_block, axis=1)[:, None]
        + jnp.sum(x * x, axis=1)[None, :]
        - 2.0 * x_block @ x.T,
        0.0,
    )
    u = c**2 + r_sq
    # (s_i - s_j) . (x_i - x_j), expanded.
    s_r = (
        jnp.sum(s_block * x_block, axis=1)[:, None]
        - s_block @ x.T
        - x_block @ s.T
        + jnp.sum(s * x, axis=1)[None, :]
    )
    # One power, then u^(beta - 1) and u^(beta - 2) by division.
    u_beta = u**beta
    u_beta1 = u_beta / u
    u_beta2 = u_beta1 / u
    return (
        (s_block @ s.T) * u_beta
        - 2.0 * beta * u_beta1 * s_r
        - 2.0 * beta * d * u_beta1
        - 4.0 * beta * (beta - 1.0) * u_beta2 * r_sq
    )


def imq_ksd(samples, scores, *, c=1.0, beta=-0.5, block_size=256, mask=None):
    r"""Kernel Stein discrepancy with the IMQ kernel, as a pure, jittable function.

    The V-statistic of the Stein kernel built on the inverse multiquadric base
    kernel :math:`k(x, y) = (c^2 + \|x - y\|^2)^\beta` (tuning paper, eq. 3),
    over the rows :math:`i \in M` selected by ``mask`` (all rows by default),
    :math:`m = |M|`:

    .. math::

        \mathrm{KSD} = \frac{1}{m}\Big(\sum_{i, j \in M} k_p(x_i, x_j)\Big)^{1/2},
        \qquad
        k_p(x, y) = s_x^\top s_y\, u^\beta - 2\beta u^{\beta-1} (s_x - s_y)^\top r
        - 2\beta d\, u^{\beta-1} - 4\beta(\beta-1) u^{\beta-2}\|r\|^2,

    with :math:`r = x - y`, :math:`u = c^2 + \|r\|^2`, :math:`s = \nabla\log\pi
    = -\nabla U` the target's score at each draw and d the dimension. The sum is
    translation invariant; the draws are centred at their (masked) mean first,
    which keeps single-precision distances accurate far from the origin.

    Rows are taken ``block_size`` at a time under :func:`jax.lax.map`: O(m^2 d)
    time, O(``block_size`` x m) memory, and no host synchronisation, so the
    function can be wrapped in :func:`jax.jit` (``block_size`` static) and
    :func:`jax.vmap` (over a leading axis of ``samples``, ``scores`` and
    ``mask``). The rows are padded up to a multiple of the block size; padded
    rows, like rows outside ``mask``, are zeroed and left out of the sum, so any
    m works with static shapes and a fixed-size buffer whose unfilled rows hold
    anything (NaN included) gives the statistic of its filled rows.

    :param samples: draws, shape ``(m, d)``.
    :param scores: :math:`\nabla\log\pi` at each draw, shape ``(m, d)``.
    :param float c: IMQ scale, c > 0 (default 1). May be traced.
    :param float beta: IMQ exponent in (-1, 0) (default -1/2). May be traced.
    :param int block_size: rows per block (static under ``jit``); the block is
        ``min(block_size, m)`` rows.
    :param mask: ``None`` or a boolean array of shape ``(m,)``, the rows that
        count.
    :return: the discrepancy, a JAX scalar; NaN or inf where a counted row is
        not finite, NaN when no row counts. Nothing is validated here (see
        :func:`ksd`).

    **References**

    1. Coullon, J., South, L. & Nemeth, C. (2023). *Efficient and generalizable
       tuning strategies for stochastic gradient MCMC.*
       Eq. (3).
    2. Gorham, J. & Mackey, L. (2017). *Measuring sample quality with kernels.*
       ICML. (The IMQ kernel with c > 0, beta in (-1, 0) detects
       non-convergence.)

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> shifts = jnp.array([0.0, 0.5, 1.0])[:, None, None]
    >>> xs = jax.random.normal(jax.random.key(0), (3, 400, 2)) + shifts
    >>> values = jax.jit(jax.vmap(imq_ksd))(xs, -xs)  # target N(0, I)
    >>> bool(values[0] < values[1] < values[2])
    True
    >>> first = jnp.arange(400) < 250
    >>> masked = imq_ksd(xs[1], -xs[1], mask=first)
    >>> bool(jnp.isclose(masked, imq_ksd(xs[1, :250], -xs[1, :250]), rtol=1e-5))
    True
    """
    x, s, weight, count = _masked_centred(samples, scores, mask)
    m = x.shape[0]
    block = max(1, min(int(block_size), m))
    num_blocks = -(-m // block)
    pad = num_blocks * block - m

    def blocks(a):
        a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
        return a.reshape((num_blocks, block) + a.shape[1:])

    def block_sum(rows):
        x_block, s_block, w_block = rows
        k = _imq_stein_kernel(x_block, s_block, x, s, c=c, beta=beta)
        return w_block @ (k @ weight)

    total = jnp.sum(lax.map(block_sum, (blocks(x), blocks(s), blocks(weight))))
    return jnp.sqrt(jnp.maximum(total, 0.0)) / count


_imq_ksd = jax.jit(imq_ksd, static_argnames="block_size")


def _check_draws(samples, scores, what):
    """``samples`` and ``scores`` as NumPy arrays of shape (m, d), or a ValueError
    that says what is wrong; ``what`` names the statistic in the message."""
    x = np.asarray(samples)
    s = np.asarray(scores)
    if x.ndim == 1:
        x = x[:, None]
    if s.ndim == 1:
        s = s[:, None]
    if x.ndim != 2 or x.shape != s.shape:
        raise ValueError(
            "samples and scores must have the same shape (m, d) or (m,); got "
            f"{np.shape(samples)} and {np.shape(scores)}."
        )
    if x.shape[0] == 0:
        raise ValueError("samples is empty: need at least one draw.")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(s))):
        which = "samples" if not np.all(np.isfinite(x)) else "scores"
        raise ValueError(f"{which} contain non-finite values; the {what} is undefined.")
    return x, s


def _to_device(x, s):
    """Draws centred in their own precision (float64 for NumPy input), then both
    arrays in JAX's default float dtype."""
    dtype = jnp.result_type(float)
    return jnp.asarray(x - x.mean(axis=0), dtype), jnp.asarray(s, dtype)


def ksd(samples, scores, *, c=1.0, beta=-0.5, block_size=1024):
    r"""Kernel Stein discrepancy of draws from the target whose score is given.

    .. math::

        \mathrm{KSD} = \Big(\frac{1}{m^2}\sum_{i,j=1}^m k_p(x_i, x_j)\Big)^{1/2},

    the V-statistic of the Stein kernel :math:`k_p` built on the inverse
    multiquadric base kernel :math:`k(x, y) = (c^2 + \|x - y\|^2)^\beta`, with
    :math:`s = \nabla\log\pi = -\nabla U` the score of the target at each draw. It
    is zero in the limit of exact draws and detects non-convergence for
    :math:`c > 0,\ \beta\in(-1, 0)` (Gorham & Mackey). The double sum runs over
    blocks of ``block_size`` rows, so memory is O(``block_size`` x m).

    This validates its input and evaluates :func:`imq_ksd` (which writes out
    :math:`k_p`) in one compiled call. Draws are centred before the sum (the
    discrepancy is translation invariant), in their own precision, which keeps
    the single-precision distances accurate for posteriors far from 0.

    :param samples: draws, shape ``(m, d)`` (or ``(m,)`` for a scalar parameter),
        in the space where ``scores`` were taken (unconstrained, for a model).
    :param scores: :math:`\nabla\log\pi` at each draw, the same shape.
    :param float c: IMQ scale (default 1).
    :param float beta: IMQ exponent in (-1, 0) (default -1/2).
    :param int block_size: rows per block of the double sum.
    :return: the discrepancy, a float.

    **References**

    1. Coullon, J., South, L. & Nemeth, C. (2023). *Efficient and generalizable
       tuning strategies for stochastic gradient MCMC.* Eq. (3).
    2. Gorham, J. & Mackey, L. (2017). *Measuring sample quality with kernels.* ICML.

    **Example**

    >>> import jax
    >>> x = jax.random.normal(jax.random.key(0), (2000, 2))
    >>> exact, shifted = ksd(x, -x), ksd(x + 1.0, -(x + 1.0))
    >>> bool(exact < 0.1 < shifted)
    True
    """
    x, s = _check_draws(samples, scores, "KSD")
    if not c > 0 or not -1 < beta < 0:
        raise ValueError(
            f"The IMQ kernel needs c > 0 and -1 < beta < 0; got c={c}, beta={beta}."
        )
    if not (isinstance(block_size, int) and block_size > 0):
        raise ValueError(f"block_size must be a positive int, got {block_size!r}.")
    x, s = _to_device(x, s)
    return float(_imq_ksd(x, s, c=float(c), beta=float(beta), block_size=block_size))


def unconstrained_draws_and_scores(
    model, samples, *model_args, num_draws=1000, chunk_size=None, **model_kwargs
):
    """``num_draws`` equally spaced draws in unconstrained space and the full-data
    scores there, each flattened to shape ``(num_draws, d)``: the inputs of
    :func:`ksd` for a run. Arguments as :func:`posterior_ksd`."""
    from numpyro_sgbd.evaluation.reference import full_batch_scores

    if not (isinstance(num_draws, int) and num_draws > 0):
        raise ValueError(f"num_draws must be a positive int, got {num_draws!r}.")
    sizes = {np.shape(v)[0] for v in samples.values() if np.ndim(v)}
    if len(sizes) != 1:
        raise ValueError(
            "every site in samples needs the same number of draws on its leading "
            f"axis; got { {k: np.shape(v) for k, v in samples.items()} }."
        )
    (m,) = sizes
    keep = np.unique(np.linspace(0, m - 1, min(num_draws, m)).round().astype(int))
    thinned = {k: np.asarray(v)[keep] for k, v in samples.items() if np.ndim(v)}
    z, scores = full_batch_scores(
        model, thinned, *model_args, chunk_size=chunk_size, **model_kwargs
    )

    def flat(tree):
        leaves = [np.asarray(v).reshape(len(keep), -1) for v in jax.tree.leaves(tree)]
        return np.concatenate(leaves, axis=1)

    return flat(z), flat(scores)


def posterior_ksd(
    model,
    samples,
    *model_args,
    num_draws=1000,
    scale=None,
    chunk_size=None,
    **model_kwargs,
):
    r"""Kernel Stein discrepancy of a run's draws from the model's exact posterior.

    Takes ``num_draws`` equally spaced draws (all of them if fewer), moves them to
    NumPyro's unconstrained space and evaluates the full-data score there with
    :func:`~numpyro_sgbd.full_batch_scores` (chunked over draws), then returns
    :func:`ksd` of the flattened draws and scores. The discrepancy shrinks like
    ``num_draws ** -0.5`` even for exact draws, so compare runs at the same
    ``num_draws``.

    **Scale.** The IMQ kernel with c = 1 has unit length scale. Where posterior sds
    are far below 1 (large N), the V-statistic is dominated by its diagonal,
    :math:`(\tfrac1m \mathbb E\|\nabla\log\pi\|^2 + d)^{1/2}` for draws
    concentrated anywhere near the mode, and no longer ranks runs by accuracy: a
    point mass at the mode can score lower than exact draws. Pass ``scale``, a
    per-coordinate scale of the unconstrained draws (the reference posterior's sds,
    as :func:`~numpyro_sgbd.compare` does), to compute the discrepancy of the
    standardised draws :math:`x / \text{scale}` with scores :math:`s \cdot
    \text{scale}` (the same target, in coordinates where c = 1 fits).

    :param model: the NumPyro model, with its data in subsample plates.
    :param dict samples: ``{site: draws}`` with the draws on the leading axis (as
        :meth:`MCMC.get_samples() <numpyro.infer.mcmc.MCMC.get_samples>` returns
        them), for every latent sample site.
    :param model_args: the model's positional arguments (the data).
    :param int num_draws: how many draws enter the discrepancy.
    :param scale: ``None`` (raw coordinates, as the tuning paper) or an array of
        shape ``(d,)``, d the number of unconstrained coordinates (sites in sorted
        order, each flattened).
    :param int chunk_size: passed to :func:`~numpyro_sgbd.full_batch_scores`.
    :param model_kwargs: the model's keyword arguments.
    :return: the discrepancy, a float.

    **References**

    1. Coullon, J., South, L. & Nemeth, C. (2023). *Efficient and generalizable
       tuning strategies for stochastic gradient MCMC.* Eq. (3) and Section 4.1.

    **Example**

    >>> import jax, numpyro, numpyro.distributions as dist
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=5):
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> y = jax.random.normal(jax.random.key(0), (100,))
    >>> exact = y.mean() + 0.1 * jax.random.normal(jax.random.key(1), (500,))
    >>> good = posterior_ksd(model, {"mu": exact}, y, scale=[0.1])
    >>> bad = posterior_ksd(model, {"mu": exact + 0.1}, y, scale=[0.1])
    >>> bool(good < bad)
    True
    """
    x, s = unconstrained_draws_and_scores(
        model,
        samples,
        *model_args,
        num_draws=num_draws,
        chunk_size=chunk_size,
        **model_kwargs,
    )
    if scale is not None:
        scale = np.asarray(scale, np.float64)
        if scale.shape != (x.shape[1],) or not np.all(scale > 0):
            raise ValueError(
                f"scale must hold {x.shape[1]} positive values (one per "
                f"unconstrained coordinate), got shape {scale.shape}."
            )
        x, s = x / scale, s * scale
    return ksd(x, s)
