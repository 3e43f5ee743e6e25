"""Minibatch indices: which rows a step reads (:func:`draw_indices`, with or
without replacement as :func:`resolve_replace` chooses), drawn from one threefry
block per index, and the noise variance that scheme gives a minibatch sum
(:func:`noise_variance_factor`)."""

from functools import partial

import jax
from jax import random
from jax.extend.random import threefry2x32_p
import jax.numpy as jnp
import numpy as np

__all__ = [
    "AUTO_REPLACE_RATIO",
    "draw_indices",
    "gather_local",
    "in_random_order",
    "noise_variance_factor",
    "resolve_replace",
]

#: ``replace=None`` draws with replacement when n <= N / AUTO_REPLACE_RATIO.
AUTO_REPLACE_RATIO = 100


def resolve_replace(replace, size, subsample_size):
    """Whether ``replace`` (``True``, ``False`` or ``None``) draws with replacement
    from ``range(size)``.

    ``None`` (the kernels' default) chooses: with replacement when
    ``subsample_size <= size / 100``. There the two schemes differ by at most 1 % in
    gradient-noise variance (:func:`noise_variance_factor`), while a draw without
    replacement costs a sort of the n indices, which on a CPU takes longer than the
    minibatch gradient of a small model (about 2.5 times, n = 1000). Above it,
    without replacement, as :class:`~numpyro.primitives.plate` subsamples: its noise
    is smaller by the factor 1 - n/N.

    >>> resolve_replace(None, 1_000_000, 1000), resolve_replace(None, 1000, 100)
    (True, False)
    """
    if replace is None:
        return AUTO_REPLACE_RATIO * subsample_size <= size
    return bool(replace)


def in_random_order(replace, size, subsample_size):
    """Whether :func:`draw_indices` returns its indices in random order, so that
    any first m of them are a random sample of the data: drawn with replacement
    (i.i.d.) or as a permutation (n > N/2); not the sorted draw without
    replacement between."""
    return resolve_replace(replace, size, subsample_size) or 2 * subsample_size > size


def _mul_wide(a, b):
    """The high and low 32-bit words of the 64-bit products of the uint32 arrays
    ``a`` and ``b`` (from 16-bit halves: JAX's default types stop at 32 bits)."""
    lo16 = np.uint32(0xFFFF)
    a0, a1 = a & lo16, a >> 16
    b0, b1 = b & lo16, b >> 16
    p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
    middle = (p00 >> 16) + (p01 & lo16) + (p10 & lo16)
    high = a1 * b1 + (p01 >> 16) + (p10 >> 16) + (middle >> 16)
    return high, (middle << 16) | (p00 & lo16)


def _threefry_words(rng_key):
    """The two uint32 words of a threefry2x32 key (typed or raw), or None for a key
    of another implementation."""
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        if str(random.key_impl(rng_key)) != "threefry2x32":
            return None
        return random.key_data(rng_key)
    if jax.config.jax_default_prng_impl != "threefry2x32" or rng_key.shape != (2,):
        return None
    return rng_key


def _index_words(rng_key, n):
    """Two random uint32 words for each of ``n`` indices: for a threefry key the two
    output words of one hash block of the counter pair ``(0, i)`` (``random.bits``
    would hash a block for each word, under JAX's default
    ``jax_threefry_partitionable``); otherwise ``random.bits``."""
    words = _threefry_words(rng_key)
    if words is None:
        return random.bits(rng_key, (2, n), jnp.uint32)
    count = jnp.arange(n, dtype=jnp.uint32)
    return threefry2x32_p.bind(words[0], words[1], jnp.zeros_like(count), count)


def _randint(rng_key, n, size):
    """``n`` i.i.d. uniform indices in ``range(size)``, ``0 < size < 2**31``.

    Two random 32-bit words make a 64-bit fraction ``u / 2**64``, and the index is
    ``floor(u * size / 2**64)`` (the multiply-shift map of Lemire 2019, "Fast
    random integer generation in an interval", without its rejection step). Each
    index then has probability within ``size / 2**64`` (relative) of ``1 / size``.
    ``random.randint`` is not so close: for ``size > 2**16`` its multiplier
    ``2**32 mod size``, formed in 32 bits, wraps to zero, the index is one word
    modulo ``size``, and the first ``2**32 mod size`` indices are more likely by
    ``1 / floor(2**32 / size)``: 2.4 % at ``size = 10**8``, a biased minibatch
    gradient. Draw for draw reproducible from ``rng_key``.

    Cost: one threefry block per index, whose two output words are the two
    words (``random.bits`` hashes a block per word under JAX's default
    ``jax_threefry_partitionable``). In compiled loops of vanilla SGBD steps
    (n = 1000, d = 10, a CPU) a step with this draw cost the same whatever the
    loop around it; with ``random.randint`` it cost up to twice as much, by how
    XLA:CPU fused its hash into the arithmetic, and three times with the words
    from ``random.bits`` (``benchmarks/random_numbers.py``).
    """
    words = _index_words(rng_key, n)
    span = np.uint32(size)
    high, low = _mul_wide(words[0], span)
    carry_in, _ = _mul_wide(words[1], span)
    # floor((words[0] * 2**32 + words[1]) * size / 2**64): the high word of the
    # first product, plus the carry out of adding the second product's high word
    # to the first product's low word.
    # The remainder changes nothing (the index is below size already), but XLA
    # deems it expensive and so computes the indices once, in their own loop,
    # instead of fusing the hash and this arithmetic into each gather of a row,
    # where they ran once per element of the row (a step 1.7 times slower,
    # n = 1000, d = 10).
    return ((high + ((low + carry_in) < low)) % span).astype(jnp.int32)


@partial(jax.jit, static_argnames=("size", "subsample_size", "replace"))
def draw_indices(rng_key, size, subsample_size, *, replace=False):
    """Draw ``subsample_size`` indices from ``range(size)`` in O(subsample_size).

    With ``replace=True`` the indices are i.i.d. uniform (``None``: as
    :func:`resolve_replace` chooses), each ``floor(u * size / 2**64)`` for a 64-bit
    ``u`` made of the two words of one threefry block: every index has probability
    within ``size / 2**64`` (relative) of ``1 / size``, where ``random.randint``
    favours the first ``2**32 mod size`` indices by ``1 / floor(2**32 / size)``
    for ``size > 2**16`` (2.4 % at ``10**8``). Without replacement (as
    :class:`~numpyro.primitives.plate` itself subsamples), indices are
    drawn with replacement and the duplicates redrawn until all are distinct. The set of
    distinct values of an i.i.d. uniform sequence is a uniform random subset whatever
    the stopping rule that looks only at coincidences, so the result is a uniform
    subset; it comes back sorted. For ``2 * subsample_size > size`` a permutation of
    ``range(size)`` is cheaper and is used instead. Expected cost: one sort of
    ``subsample_size`` integers plus, with probability about
    ``1 - exp(-subsample_size**2 / (2 * size))``, a few more.

    :param rng_key: random key.
    :param int size: population size N.
    :param int subsample_size: n.
    :param bool replace: whether to draw with replacement.

    >>> import jax
    >>> idx = draw_indices(jax.random.key(0), size=1000, subsample_size=100)
    >>> len(set(idx.tolist()))
    100
    """
    if not 0 < size < 2**31:
        raise ValueError(
            f"draw_indices: size must be between 1 and 2**31 - 1 (int32 indices), "
            f"got {size}; split larger data into several plates."
        )
    n = subsample_size
    if resolve_replace(replace, size, n):
        return _randint(rng_key, n, size)
    if 2 * n > size:
        return random.permutation(rng_key, size)[:n]

    def duplicated(idx):
        return jnp.concatenate([jnp.zeros((1,), bool), idx[1:] == idx[:-1]])

    def body(carry):
        key, idx = carry
        key, sub = random.split(key)
        idx = jnp.where(duplicated(idx), _randint(sub, n, size), idx)
        return key, jnp.sort(idx)

    key, sub = random.split(rng_key)
    idx = jnp.sort(_randint(sub, n, size))
    _, idx = jax.lax.while_loop(
        lambda carry: jnp.any(duplicated(carry[1])), body, (key, idx)
    )
    return idx


def noise_variance_factor(size, subsample_size, *, replace=False):
    """Variance of a minibatch sum per unit of per-term sample variance.

    The minibatch gradient is :math:`\\sum_{i\\in S} \\nabla h_i` where
    :math:`h_i = (N/n) \\log p(y_i\\mid\\theta)` is the term as NumPyro's plate scales
    it. Its variance is :math:`n (1 - n/N) s^2` for indices drawn without replacement
    and :math:`n s^2` with replacement, :math:`s^2` the population variance of the
    :math:`\\nabla h_i` (estimated by the minibatch sample variance, ddof = 1). Written
    with the unscaled per-datum gradients :math:`f_i` this is the factor
    :math:`c = N(N-n)/n` (resp. :math:`N^2/n`) times :math:`\\mathrm{Var}(f_i)`.

    ``replace=None`` resolves as :func:`resolve_replace` does.

    >>> noise_variance_factor(100, 10)
    9.0
    """
    n = subsample_size
    return float(n) if resolve_replace(replace, size, n) else n * (1.0 - n / size)


def gather_local(local, sites, idx):
    """``{name: the rows idx of local[name]}``, each on its site's plate axis
    (``sites``: ``{name: LocalSite}``, :mod:`~numpyro_sgbd.local_sites`)."""
    return {k: jnp.take(local[k], idx, axis=sites[k].axis) for k in sites}
