"""The subsample size of :func:`~numpyro_sgbd.tune`'s arms as a traced value, so
that one compiled program runs a sampler's arms at every size
(:class:`SizedEstimator`).

A kernel's estimator has its minibatch size n fixed when it is traced: n
indices are drawn, n per-datum terms formed. Here n is an argument of the
compiled program. The rows are formed ``chunk`` at a time in a loop of
``ceil(n / chunk)`` passes, a traced count, so a step costs what n rows cost
(rounded up to a whole pass, :func:`pass_rows`), not what the largest size of
the grid costs: a fixed-size buffer with the rows past n masked would charge a
small minibatch the time of the largest, and time is what MAMBA ranks the sizes
by. Rows past n in the last pass are masked.

The estimate is the kernel's for n rows: the mean of the n one-datum potentials
:math:`U_i = -\\log p(\\theta) - N \\log p(y_i \\mid \\theta)` (NumPyro's plate
scales a one-datum model by N, so the mean is the minibatch potential with its
N/n), their gradients pulled back to u, the noise sd of that mean from the n
rows (:func:`~numpyro_sgbd.estimators.noise_variance_factor` times their sample
variance), its covariance in the form the estimator names, and with control
variates the same around the centre. What differs from a kernel given that n:
every pass draws ``chunk`` indices i.i.d. uniform from its own key
(``fold_in(key, pass)``), so the rows are a draw with replacement of the same
law as the kernel's with ``replace=True``, not the kernel's rows; a kernel
whose n exceeds N / 100 draws without replacement, whose noise is smaller by
the factor 1 - n/N. The arms are compared on one scheme, and the sizes of one
step share their first rows (common random numbers).
"""

from functools import partial
import math
from typing import NamedTuple

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.estimators import (
    ControlVariateEstimator,
    GradientEstimate,
    MinibatchEstimator,
    draw_indices,
    noise_variance_factor,
)
from numpyro_sgbd.estimators.rows import default_row_budget

__all__ = ["Rows", "SizedEstimator", "pass_rows", "rows_of", "sized_supported"]


class Rows(NamedTuple):
    """A subsample size as the compiled programs take it (traced scalars)."""

    #: n, the rows of the minibatch.
    n: object
    #: ceil(n / chunk), the passes that form them.
    passes: object
    #: :func:`~numpyro_sgbd.estimators.noise_variance_factor` of n rows drawn
    #: with replacement.
    factor: object


def rows_of(n, chunk, size):
    """The :class:`Rows` of subsample size ``n`` of a plate of ``size`` rows
    (host values)."""
    factor = noise_variance_factor(size, n, replace=True)
    return Rows(
        np.asarray(n, np.int32),
        np.asarray(-(-n // chunk), np.int32),
        np.asarray(factor, jnp.result_type(float)),
    )


def pass_rows(sizes, estimator=None, d=None):
    """Rows a pass forms: the smallest size of the grid with at least 64 rows
    and a hundredth of the largest. Each pass costs its rows and some loop
    overhead (a few microseconds, and the merge of its moments): passes of a
    few rows would cost the large sizes mostly overhead, passes of many rows
    would cost the small sizes as much as that many rows. With the default
    grid n/10, n, 10 n (n >= 64) a pass is n rows; with 0.1 %, 1 % and 10 % of
    N it is 0.1 % of N. Given the kernel's ``estimator`` and the dimension
    ``d``, no more rows than its row budget allows (its ``row_budget`` floats
    of per-datum gradients at once, as the kernel streams them) where it
    estimates the noise; without, a pass forms one gradient of its rows' sum
    and holds no per-datum gradients."""
    largest = max(sizes)
    floor = min(largest, max(64, largest / 100))
    rows = min(n for n in sizes if n >= floor)
    if estimator is not None and d is not None and _needs_rows(estimator):
        plain = _plain(estimator)
        budget = plain.row_budget or default_row_budget()
        rows = max(1, min(rows, budget // max(d, 1)))
    return rows


def _needs_rows(estimator):
    """Whether ``estimator`` estimates the noise (per-datum gradients)."""
    plain = _plain(estimator)
    return bool(plain.noise or plain.covariance is not None)


def _plain(estimator):
    if isinstance(estimator, ControlVariateEstimator):
        return estimator.estimator
    return estimator


def sized_supported(estimator):
    """Whether :class:`SizedEstimator` can run this kernel estimator: one
    subsample plate, a pullback (the arms run in u), neither local sites,
    sharding nor enumerated sites."""
    plain = _plain(estimator)
    return (
        type(plain) is MinibatchEstimator
        and len(plain.plates) == 1
        and plain.pullback is not None
        and plain.sharding is None
        and not plain.local
        and plain.enumerate_dim is None
    )


class SizedEstimator:
    """A kernel's estimator with the subsample size a traced value.

    :param source: the kernel's estimator bound to a chain's set-up
        (:func:`~numpyro_sgbd.estimators.with_setup`): a
        :class:`~numpyro_sgbd.estimators.MinibatchEstimator`, or a
        :class:`~numpyro_sgbd.estimators.ControlVariateEstimator` around one
        with a fixed centre; :func:`sized_supported`.
    :param Rows rows: the subsample size (traced).
    :param int chunk: rows a pass forms (static).
    :param int columns: the low-rank noise factor's columns (static, at least
        the largest n; only for ``covariance="lowrank"``).
    :param noise: whether to return the noise sd (``None``: as ``source``).
    :param covariance: the noise covariance's form (``None``: as ``source``).
    """

    def __init__(self, source, rows, chunk, columns=None, noise=None, covariance=""):
        self.source = source
        self.plain = (
            source.estimator if isinstance(source, ControlVariateEstimator) else source
        )
        self.rows, self.chunk, self.columns = rows, chunk, columns
        self.noise = self.plain.noise if noise is None else noise
        self.covariance = self.plain.covariance if covariance == "" else covariance
        if self.covariance == "rows":
            raise ValueError(
                "A traced subsample size forms the noise from the arm's own rows: "
                "NOGIN's covariance='lowrank+diag' draws others. Tune NOGIN with "
                "covariance='per_step' (tune's default for it)."
            )

    def initial_centre(self, z, model_args=(), model_kwargs=None):
        return self.source.initial_centre(z, model_args, model_kwargs)

    def estimate(self, rng_key, z, model_args=(), model_kwargs=None, centre=None):
        """The :class:`~numpyro_sgbd.GradientEstimate` of n rows at z, in u."""
        model_kwargs = {} if model_kwargs is None else model_kwargs
        cv = isinstance(self.source, ControlVariateEstimator)
        centre_z = self.source.centre if cv else None
        total = self._passes(rng_key, z, centre_z, model_args, model_kwargs)
        value, mean, noise_sd, cov = self._summary(total)
        if cv:
            mean = mean + self.source.centre_grad
            value = value + self.source.centre_potential
        return GradientEstimate(mean, noise_sd, value, cov)

    # -------------------------------------------------------------- the passes
    def _one(self, z, i, model_args, model_kwargs):
        """U_i, the one-datum potential of datum ``i`` at z (NumPyro's plate
        scales the one-datum model by N)."""
        ((_, (size, _, _)),) = self.plain.plates.items()
        return -size * self.plain.datum_log_density(z, i, model_args, model_kwargs)

    def _potentials(self, z, centre_z, idx, model_args, model_kwargs):
        """``(U_i, rows)``: the one-datum potentials of ``idx`` at z (less those
        at the centre) and their gradients in u, flat."""
        one = partial(self._one, model_args=model_args, model_kwargs=model_kwargs)

        def datum(i):
            value, grad = jax.value_and_grad(one)(z, i)
            if centre_z is not None:  # both points on one datum's rows
                value_c, grad_c = jax.value_and_grad(one)(centre_z, i)
                value = value - value_c
                grad = jax.tree.map(jnp.subtract, grad, grad_c)
            return value, ravel_pytree(grad)[0]

        values, grads = jax.vmap(datum)(idx)
        return values, self.plain.pullback(grads)

    def _summed(self, z, centre_z, idx, mask, model_args, model_kwargs):
        """``(count, sum of U_i, gradient of the sum in u)`` over the rows of
        ``idx`` that ``mask`` keeps (less the centre's): one reverse pass, no
        per-datum gradients, for an estimate without noise. At d = 79,510 (a
        network) a per-datum gradient costs about a third of a 600-row
        gradient, and the rows' pass held three: tune's 6,000-row arms took
        1.2 s a step."""
        w = mask.astype(jnp.result_type(float))
        one = partial(self._one, model_args=model_args, model_kwargs=model_kwargs)

        def total(z):
            return jnp.sum(w * jax.vmap(one, (None, 0))(z, idx))

        value, grad = jax.value_and_grad(total)(z)
        if centre_z is not None:
            value_c, grad_c = jax.value_and_grad(total)(centre_z)
            value = value - value_c
            grad = jax.tree.map(jnp.subtract, grad, grad_c)
        return jnp.sum(w), value, self.plain.pullback(ravel_pytree(grad)[0])

    def _passes(self, rng_key, z, centre_z, model_args, model_kwargs):
        """The sums over the n rows, merged pass by pass."""
        ((name, (size, _, _)),) = self.plain.plates.items()
        c, rows = self.chunk, self.rows
        d = jax.eval_shape(lambda z: ravel_pytree(z)[0], z).shape[0]
        dtype = jnp.result_type(float)
        full = self.covariance == "full"
        total = _Moments(
            count=jnp.zeros((), dtype),
            value=jnp.zeros((), dtype),
            mean=jnp.zeros((d,), dtype),
            m2=jnp.zeros((d, d) if full else (d,), dtype),
            kept=None
            if self.covariance != "lowrank"
            else jnp.zeros((_ceil_to(self.columns, c), d), dtype),
        )

        summed = not self.noise and self.covariance is None

        def one_pass(j, total):
            key = random.fold_in(rng_key, j)
            idx = draw_indices(key, size=size, subsample_size=c, replace=True)
            mask = (j * c + jnp.arange(c)) < rows.n
            if summed:
                args = (z, centre_z, idx, mask, model_args, model_kwargs)
                return _add_sum(total, *self._summed(*args))
            values, grads = self._potentials(z, centre_z, idx, model_args, model_kwargs)
            # Formed once: without the barrier XLA fuses the rows' computation
            # into each reduction of the merge and forms them several times.
            values, grads = jax.lax.optimization_barrier((values, grads))
            return _merge(total, j * c, mask, values, grads, full)

        return jax.lax.fori_loop(0, rows.passes, one_pass, total)

    def _summary(self, total):
        """``(potential, gradient, noise sd, covariance)`` of the n rows."""
        n = total.count
        value = total.value / n
        if not self.noise:
            return value, total.mean, None, None
        # The noise of a mean of n rows: factor * (sample variance) / n^2.
        scale = self.rows.factor / ((n - 1.0) * n**2)
        m2 = total.m2
        variance = jnp.diagonal(m2) if m2.ndim == 2 else m2
        noise_sd = jnp.sqrt(scale * variance)
        if self.covariance is None:
            cov = None
        elif self.covariance == "diag":
            cov = scale * variance
        elif self.covariance == "full":
            cov = scale * m2
        else:  # the factor C, (d, columns): centred active rows, zeros past n
            kept = total.kept[: self.columns]
            active = (jnp.arange(self.columns) < n)[:, None]
            cov = jnp.sqrt(scale) * jnp.where(active, total.mean - kept, 0.0).T
        return value, total.mean, noise_sd, cov


class _Moments(NamedTuple):
    count: object
    value: object
    mean: object
    m2: object
    kept: object


def _ceil_to(m, c):
    return int(math.ceil(m / c) * c)


def _add_sum(total, count, value, grad_sum):
    """``total`` with one pass's summed rows added (no second moments: an
    estimate without noise)."""
    merged = total.count + count
    mean = total.mean + (grad_sum - count * total.mean) / jnp.maximum(merged, 1.0)
    return total._replace(count=merged, value=total.value + value, mean=mean)


def _merge(total, start, mask, values, rows, full):
    """``total`` with one pass's masked rows added: their count, the sum of the
    potentials, and the mean and centred second moments of the rows (Chan,
    Golub & LeVeque's pairwise update, as
    :meth:`~numpyro_sgbd.estimators.StreamedRows.moments`)."""
    w = mask.astype(rows.dtype)
    count = jnp.sum(w)
    seen = total.count
    merged = seen + count
    mean_b = jnp.sum(w[:, None] * rows, 0) / jnp.maximum(count, 1.0)
    dev = w[:, None] * (rows - mean_b)
    delta = mean_b - total.mean
    weight = count / jnp.maximum(merged, 1.0)
    mean = total.mean + delta * weight
    if full:
        m2 = total.m2 + dev.T @ dev + jnp.outer(delta, delta) * seen * weight
    else:
        m2 = total.m2 + jnp.sum(dev * dev, 0) + delta**2 * seen * weight
    kept = total.kept
    if kept is not None:  # the rows themselves, for the low-rank factor
        part = jnp.where(mask[:, None], rows, 0.0)
        kept = jax.lax.dynamic_update_slice_in_dim(kept, part, start, 0)
    return _Moments(merged, total.value + jnp.sum(w * values), mean, m2, kept)
