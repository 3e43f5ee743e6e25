"""Sample-quality diagnostics that need only draws and scores."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ksd", "posterior_ksd"]


@partial(jax.jit, static_argnames=("c", "beta"))
def _stein_kernel_block_sum(x_block, s_block, x, s, *, c, beta):
    """Sum of the IMQ Stein kernel k_p(x_i, x_j) over i in the block and all j.

    Every term is written through inner products so that memory is
    O(block x m), never O(block x m x d): with r = x_i - x_j and
    u = c^2 + |r|^2, k_p = (s_i . s_j) u^b - 2 b u^(b-1) (s_i - s_j) . r
    - 2 b d u^(b-1) - 4 b (b - 1) u^(b-2) |r|^2.
    """
    d = x.shape[1]
    x_sq = jnp.sum(x * x, axis=1)
    xb_sq = jnp.sum(x_block * x_block, axis=1)
    r_sq = jnp.maximum(xb_sq[:, None] + x_sq[None, :] - 2.0 * x_block @ x.T, 0.0)
    u = c**2 + r_sq
    s_dot = s_block @ s.T
    # (s_i - s_j) . (x_i - x_j), expanded.
    s_r = (
        jnp.sum(s_block * x_block, axis=1)[:, None]
        - s_block @ x.T
        - x_block @ s.T
        + jnp.sum(s * x, axis=1)[None, :]
    )
    k = (
        s_dot * u**beta
        - 2.0 * beta * u ** (beta - 1.0) * s_r
        - 2.0 * beta * d * u ** (beta - 1.0)
        - 4.0 * beta * (beta - 1.0) * u ** (beta - 2.0) * r_sq
    )
    return jnp.sum(k)


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

    Draws are centred before the sum (the discrepancy is translation invariant),
    which keeps the single-precision distances accurate for posteriors far from 0.

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
        raise ValueError(f"{which} contain non-finite values; the KSD is undefined.")
    if not c > 0 or not -1 < beta < 0:
        raise ValueError(
            f"The IMQ kernel needs c > 0 and -1 < beta < 0; got c={c}, beta={beta}."
        )
    if not (isinstance(block_size, int) and block_size > 0):
        raise ValueError(f"block_size must be a positive int, got {block_size!r}.")
    dtype = jnp.result_type(float)
    x = jnp.asarray(x - x.mean(axis=0), dtype)
    s = jnp.asarray(s, dtype)
    m = x.shape[0]
    total = 0.0
    for start in range(0, m, block_size):
        stop = min(start + block_size, m)
        total += float(
            _stein_kernel_block_sum(
                x[start:stop], s[start:stop], x, s, c=float(c), beta=float(beta)
            )
        )
    return float(np.sqrt(max(total, 0.0)) / m)


def unconstrained_draws_and_scores(
    model, samples, *model_args, num_draws=1000, chunk_size=None, **model_kwargs
):
    """``num_draws`` equally spaced draws in unconstrained space and the full-data
    scores there, each flattened to shape ``(num_draws, d)``: the inputs of
    :func:`ksd` for a run. Arguments as :func:`posterior_ksd`."""
    from numpyro_sgbd.reference import full_batch_scores

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


def drift(points, *, alpha=1e-3, min_shift=0.25):
    """Whether a chain's draws still drift: the mean of the last quarter against
    the first's, per coordinate, in standard errors and in posterior sds.

    A Welch t statistic between the first and last quarters of ``points`` (draws
    in time order, thinned far enough apart to be nearly independent; several
    chains' draws at one time may share a row block), flagged where it passes the
    Bonferroni bound for ``alpha`` over the coordinates *and* the shift is at least
    ``min_shift`` posterior sds (the pooled sd of both quarters): a shift both
    unlikely under stationarity and large enough to matter. The two-quarter
    comparison is Geweke's (1992) diagnostic with plain variances in place of
    spectral ones, which the thinning makes adequate.

    :param points: array ``(m, d)``, rows in time order (m >= 8).
    :return: ``None`` when nothing drifts, else ``(j, t, shift)`` for the
        coordinate with the largest ``|t|``: its index, t statistic and shift in
        sds.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> drift(rng.normal(size=(64, 3))) is None
    True
    >>> drifting = rng.normal(size=(64, 3)) + np.linspace(0, 4, 64)[:, None]
    >>> drift(drifting)[0] in (0, 1, 2)
    True
    """
    from scipy import stats

    points = np.asarray(points, float)
    m, d = points.shape
    q = m // 4
    first, last = points[:q], points[-q:]
    var_f, var_l = first.var(0, ddof=1), last.var(0, ddof=1)
    diff = last.mean(0) - first.mean(0)
    se = np.sqrt((var_f + var_l) / q)
    sd = np.sqrt(0.5 * (var_f + var_l))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, diff / se, np.where(diff != 0, np.inf, 0.0))
        shift = np.where(sd > 0, np.abs(diff) / sd, np.where(diff != 0, np.inf, 0.0))
    bound = stats.t.ppf(1 - alpha / (2 * d), df=2 * q - 2)
    flagged = (np.abs(t) > bound) & (shift >= min_shift)
    if not flagged.any():
        return None
    j = int(np.argmax(np.where(flagged, np.abs(t), -1)))
    return j, float(t[j]), float(shift[j])
