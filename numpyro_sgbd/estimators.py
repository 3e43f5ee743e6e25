"""Gradient estimates and their noise: the one layer between models and update rules.

An estimator is a callable ``estimator(rng_key, z, model_args, model_kwargs)`` that
returns a :class:`GradientEstimate` at the unconstrained position ``z``. Three sources
exist: a NumPyro model whose data sit in a subsample plate
(:class:`MinibatchEstimator`), an exact potential (:class:`PotentialEstimator`), and a
user-supplied stochastic gradient (:class:`CustomEstimator`).
"""

from collections import namedtuple
from functools import partial, wraps
from typing import Any, NamedTuple

import jax
from jax import random
from jax.extend.random import threefry2x32_p
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.handlers import substitute
from numpyro.infer.initialization import init_to_median
from numpyro.infer.util import _unconstrain_reparam, log_density

from numpyro_sgbd._gathered import gather_of, gathered_rows, trace_gathers
from numpyro_sgbd.handlers import fix_plates, shard_local

__all__ = [
    "Centre",
    "ControlVariateEstimator",
    "CustomEstimator",
    "Estimator",
    "GatheredRows",
    "GradientEstimate",
    "MinibatchEstimator",
    "PotentialEstimator",
    "StreamedRows",
    "draw_indices",
    "median_start",
    "noise_variance_factor",
    "split_arrays",
    "unconstrained_centre",
]


class GradientEstimate(NamedTuple):
    """A stochastic estimate of the potential's gradient at one position.

    :param z_grad: estimate of :math:`\\nabla U(z)`, the gradient of the potential
        (negative log density), a pytree like ``z``.
    :param noise_sd: per-coordinate standard deviation :math:`\\tau` of the noise in
        ``z_grad`` (pytree like ``z``), or ``None`` where it is unknown. The corrected
        variants need it.
    :param potential_energy: the matching estimate of :math:`U(z)`, or ``None``.
    :param noise_cov: the covariance :math:`\\Sigma` of the noise in ``z_grad`` over
        ``z`` flattened by :func:`jax.flatten_util.ravel_pytree`, in the form
        :class:`~numpyro_sgbd.NOGIN`'s ``covariance`` names: a ``(d, k)`` factor
        :math:`C` with :math:`\\Sigma = CC^\\top` (``"lowrank"``), the ``(d, d)``
        matrix (``"full"``) or its diagonal ``(d,)`` (``"diag"``). ``None`` where it
        is unknown or not asked for.
    """

    z_grad: Any
    noise_sd: Any = None
    potential_energy: Any = None
    noise_cov: Any = None


#: ``replace=None`` draws with replacement when n <= N / AUTO_REPLACE_RATIO.
AUTO_REPLACE_RATIO = 100


def resolve_replace(replace, size, subsample_size):
    """Whether ``replace`` (``True``, ``False`` or ``None``) draws with replacement
    from ``range(size)``.

    ``None`` (the kernels' default) chooses: with replacement when
    ``subsample_size <= size / 100``. There the two schemes differ by at most 1 % in
    gradient-noise variance (:func:`noise_variance_factor`), while a draw without
    replacement costs a sort of the n indices, which on a CPU takes longer than the
    minibatch gradient of a small model (31 us against 12 us for n = 1000). Above it,
    without replacement, as :class:`~numpyro.primitives.plate` subsamples: its noise
    is smaller by the factor 1 - n/N.

    >>> resolve_replace(None, 1_000_000, 1000), resolve_replace(None, 1000, 100)
    (True, False)
    """
    if replace is None:
        return AUTO_REPLACE_RATIO * subsample_size <= size
    return bool(replace)


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
    ``jax_threefry_partitionable``). Measured in compiled loops of vanilla SGBD
    steps (n = 1000, d = 10, two cores): 21 us a step with this draw whatever the
    loop around the step; 28 to 43 us with ``random.randint``, by how XLA:CPU
    fused its hash into the arithmetic (21 in one lucky loop, NumPyro's); 67 us
    with the words from ``random.bits``.
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
    # where they ran once per element of the row (36 against 21 us a step,
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


def _finite_tree(tree):
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _flat_size(tree):
    return sum(int(jnp.size(x)) for x in jax.tree.leaves(tree))


def _largest_divisor(n, at_most):
    """The largest divisor of ``n`` that is at most ``at_most`` (at least 1)."""
    return max(k for k in range(1, max(1, min(n, at_most)) + 1) if n % k == 0)


def _row_moments(rows):
    """``(mean, m2)`` by coordinate of a chunk of per-datum gradients: a tree of
    dense rows (leading axis the data) or a :class:`GatheredRows`."""
    if isinstance(rows, GatheredRows):
        return rows.moments()
    mean = jax.tree.map(lambda r: jnp.mean(r, axis=0), rows)
    m2 = jax.tree.map(lambda r, m: jnp.sum(jnp.square(r - m), axis=0), rows, mean)
    return mean, m2


class StreamedRows:
    """The n per-datum gradients of a minibatch, formed ``chunk`` rows at a time
    and never held all at once: ``fn(indices[j:j + chunk])`` gives those rows
    (a tree with leading axis ``chunk``, or a :class:`GatheredRows`).
    :meth:`moments` reduces them in one pass; ``a - b`` is the rows of the
    difference (control variates: the same indices at two points).
    """

    def __init__(self, fn, indices, chunk):
        self.fn = fn
        self.indices = indices
        self.chunk = chunk

    def __sub__(self, other):
        def fn(idx):
            rows, other_rows = self.fn(idx), other.fn(idx)
            if isinstance(rows, GatheredRows):
                return rows - other_rows
            return jax.tree.map(jnp.subtract, rows, other_rows)

        return StreamedRows(fn, self.indices, self.chunk)

    def moments(self):
        """``(mean, m2)`` of the rows by coordinate: their mean and sum of squared
        deviations from it, merged chunk by chunk (Chan, Golub & LeVeque's pairwise
        update, stable where the mean is large against the spread): memory two
        trees of the gradient's size plus one chunk of rows."""
        n, c = jnp.shape(self.indices)[0], self.chunk
        if c == n:  # one chunk: nothing to merge
            return _row_moments(self.fn(self.indices))
        chunks = self.indices.reshape(n // c, c)
        first = jax.eval_shape(lambda idx: _row_moments(self.fn(idx))[0], chunks[0])

        def body(carry, idx_and_seen):
            mean, m2 = carry
            idx, seen = idx_and_seen
            mean_b, m2_b = _row_moments(self.fn(idx))
            total = seen + c
            delta = jax.tree.map(jnp.subtract, mean_b, mean)
            mean = jax.tree.map(lambda m, d: m + d * (c / total), mean, delta)
            m2 = jax.tree.map(
                lambda a, b, d: a + b + jnp.square(d) * (seen * c / total),
                m2,
                m2_b,
                delta,
            )
            return (mean, m2), None

        zeros = jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), first)
        seen = jnp.arange(n // c, dtype=jnp.result_type(float)) * c
        (mean, m2), _ = jax.lax.scan(body, (zeros, zeros), (chunks, seen))
        return mean, m2


class GatheredRows:
    """A chunk of per-datum gradients (in a :class:`StreamedRows`) where some
    parameter leaves are read by each datum through one gather (a row of an
    embedding or factor matrix, a group's effect;
    :func:`~numpyro_sgbd._gathered.trace_gathers`): such a leaf keeps each
    datum's slice gradient and start index, every other leaf its dense rows.
    :meth:`moments` and ``a - b`` take O(rows x slice + d) memory and work,
    where dense rows cost O(rows x d).
    """

    def __init__(self, treedef, shapes, gathers, dense, local, starts):
        self.treedef = treedef
        self.shapes = shapes  # ShapeDtypeStructs of the leaves
        self.gathers = gathers  # {leaf index: gather equation}
        self.dense, self.local, self.starts = dense, local, starts

    def __sub__(self, other):
        def minus(a, b):
            return None if a is None else a - b

        return GatheredRows(
            self.treedef,
            self.shapes,
            self.gathers,
            [minus(a, b) for a, b in zip(self.dense, other.dense)],
            [minus(a, b) for a, b in zip(self.local, other.local)],
            self.starts,  # the same data, so the same slices
        )

    def moments(self):
        """``(mean, m2)`` of the rows by coordinate, as
        :meth:`StreamedRows.moments`. For a gathered leaf, with c_j the number of
        data whose slice holds coordinate j and S_j the sum of their gradients
        there: mean_j = S_j / n, and m2_j sums the squared deviations of those
        c_j data from the mean plus (n - c_j) mean_j**2 for the data whose
        gradient is zero there (two passes, no cancellation)."""
        means, m2s = [], []
        for j, shape in enumerate(self.shapes):
            if j not in self.gathers:
                mean, m2 = _row_moments(self.dense[j])  # one leaf's rows
                means.append(mean)
                m2s.append(m2)
                continue
            local, starts = self.local[j], self.starts[j]
            n = local.shape[0]
            gather = gather_of(self.gathers[j])

            def slices(operand, gather=gather, starts=starts):
                return jax.vmap(gather, (None, 0))(operand, starts)

            scatter = jax.linear_transpose(slices, shape)
            (total,) = scatter(local)
            (count,) = scatter(jnp.ones_like(local))
            mean = total / n
            (m2,) = scatter(jnp.square(local - slices(mean)))
            means.append(mean)
            m2s.append(m2 + (n - count) * jnp.square(mean))
        unflatten = partial(jax.tree.unflatten, self.treedef)
        return unflatten(means), unflatten(m2s)


Centre = namedtuple("Centre", ["z", "potential", "grad", "z_sum"])
Centre.__doc__ = """
The control variates' centre as the kernels keep it in their state when they
re-centre during warmup (``recentre_every``).

 - **z** - the centre :math:`\\hat z`, unconstrained, like the state's ``z``.
 - **potential** - the full-data potential :math:`U(\\hat z)`.
 - **grad** - the full-data gradient :math:`\\nabla U(\\hat z)`.
 - **z_sum** - the sum of the positions since the last re-centring; the next
   centre is their mean.
"""


class Estimator:
    """The protocol the kernels call: ``estimate`` at a position, around the
    chain's :class:`Centre` where the estimator keeps one in the state
    (control variates with ``recentre_every``; ``None`` for every other
    estimator), ``initial_centre`` and ``recentre``."""

    #: Every how many warmup steps the centre moves (``None``: it never does).
    recentre_every = None

    def initial_centre(self, z, model_args=(), model_kwargs=None):
        """The chain's :class:`Centre` at ``z``, or ``None`` (no centre in the
        state)."""
        return None

    def estimate(self, rng_key, z, model_args=(), model_kwargs=None, centre=None):
        """The :class:`GradientEstimate` at ``z`` (around ``centre`` if given)."""
        return self(rng_key, z, model_args, model_kwargs)

    def recentre(
        self,
        centre,
        z,
        i,
        num_warmup,
        model_args=(),
        model_kwargs=None,
        *,
        batched=False,
    ):
        """The chain's centre after its draw ``z`` at iteration ``i``."""
        return centre


class PotentialEstimator(Estimator):
    """Exact gradients of a potential function: full-batch unadjusted dynamics.

    :param potential_fn: ``potential_fn(z) -> U(z)``, the negative log density.
    """

    def __init__(self, potential_fn):
        self.potential_fn = potential_fn

    def __call__(self, rng_key, z, model_args=(), model_kwargs=None):
        value, grad = jax.value_and_grad(self.potential_fn)(z)
        noise = jax.tree.map(jnp.zeros_like, grad)
        return GradientEstimate(grad, noise, value)


class CustomEstimator(Estimator):
    """A user-supplied stochastic gradient ``gradient_fn(rng_key, z)``.

    ``gradient_fn`` returns a :class:`GradientEstimate` (``z_grad`` the noisy gradient
    of the potential, ``noise_sd`` its per-coordinate noise sd if known), or just the
    gradient pytree. This is how the SGBD paper's injected-noise experiments (Section
    4.1, supplement C) run through the same update rules.
    """

    def __init__(self, gradient_fn):
        self.gradient_fn = gradient_fn

    def __call__(self, rng_key, z, model_args=(), model_kwargs=None):
        out = self.gradient_fn(rng_key, z)
        if not isinstance(out, GradientEstimate):
            out = GradientEstimate(out)
        if out.potential_energy is None:
            out = out._replace(potential_energy=jnp.array(jnp.nan))
        return out


def split_arrays(tree):
    """``(arrays, rebuild, key)``: the array leaves of ``tree``, a function that puts
    (possibly traced) arrays back among its other leaves, and a hashable key of
    everything but the arrays' values (for caching compiled functions; ``None``
    where a leaf is unhashable).

    Data passed to a jitted function as arguments stay out of the compiled program;
    embedded as constants, a large dataset makes XLA compile slowly (about 1 s more
    for 10^6 x 10 float32 on two cores), and anew for every function that closes
    over it.
    """
    leaves, treedef = jax.tree.flatten(tree)
    is_array = tuple(isinstance(x, (np.ndarray, jax.Array)) for x in leaves)
    static = tuple(None if a else x for a, x in zip(is_array, leaves))
    arrays = [x for a, x in zip(is_array, leaves) if a]

    def rebuild(arrays):
        it = iter(arrays)
        return jax.tree.unflatten(
            treedef, [next(it) if a else x for a, x in zip(is_array, static)]
        )

    key = (treedef, is_array, static)
    try:
        hash(key)
    except TypeError:
        key = None
    return arrays, rebuild, key


def jit_once(fn):
    """``jax.jit(fn)`` for a program that runs once per set-up (the search's
    start, a kernel's initial state): called on a CPU with concrete arguments, it
    is compiled at XLA's lowest backend optimisation level, where LLVM's passes
    take most of a small program's compile time (the start's 15 threefry draws
    compiled in 0.2 s instead of 0.45 s) and running it once costs little.
    Inside a trace (``pmap``, ``vmap`` or another ``jit``: a nested ``jit`` takes
    no compiler options of its own) or on an accelerator, plain ``jax.jit``."""
    plain = jax.jit(fn)
    if jax.default_backend() != "cpu":
        return plain
    quick = jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0})

    @wraps(fn)
    def call(*args):
        traced = not _top_level() or any(
            isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)
        )
        return (plain if traced else quick)(*args)

    return call


def _top_level():
    """Whether no JAX trace is active (a ``jit`` called now is a program of its
    own). JAX keeps this private; where it is missing, say no (plain ``jit``)."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover - a JAX that moved it
        return False
    return trace_state_clean()


def median_start(model, arrays, rebuild, rng_key=None):
    """NumPyro's ``init_to_median`` point, unconstrained, by site: one compiled
    function of the data ``arrays`` (``rebuild`` as from :func:`split_arrays`);
    traced op by op, as ``initialize_model`` does, it costs about a hundred small
    compilations."""
    rng_key = random.key(0) if rng_key is None else rng_key

    @jit_once
    def start(arrays, rng_key):
        args, kwargs = rebuild(arrays)
        seeded = handlers.seed(model, rng_key)
        fixed = handlers.substitute(seeded, substitute_fn=init_to_median)
        trace = handlers.trace(fixed).get_trace(*args, **kwargs)
        return {
            name: biject_to(site["fn"].support).inv(site["value"])
            for name, site in trace.items()
            if site["type"] == "sample" and not site["is_observed"]
        }

    return start(arrays, rng_key)


def as_jax_arrays(tree):
    """NumPy arrays in ``tree`` as JAX arrays, so that traced indices can index them
    (``X[idx]``); other leaves unchanged."""
    return jax.tree.map(
        lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, tree
    )


class MinibatchEstimator(Estimator):
    """Minibatch gradient of a NumPyro model whose data sit in subsample plates.

    Each call draws its own indices for every subsample plate (O(n), see
    :func:`draw_indices`), substitutes them into the plates, and evaluates NumPyro's
    potential of the substituted model in unconstrained space (prior, Jacobian and the
    plate's N/n-scaled likelihood: the N/n factor is NumPyro's own, applied nowhere
    else). With ``noise=True`` it also forms the n per-datum gradients of the scaled
    likelihood terms (forward or reverse mode, whichever needs fewer passes) and
    returns their noise sd (:func:`noise_variance_factor`); the prior and Jacobian
    terms are exact and add no noise. With ``covariance`` it also returns the noise
    covariance (the sample covariance of the minibatch: :math:`\\Sigma = CC^\\top` with
    :math:`C = \\sqrt{c/(n-1)}\\,(G - \\bar G)^\\top`, G the n x d per-datum gradients
    of the scaled terms and c the factor of :func:`noise_variance_factor`), as the
    factor C, the matrix, or its diagonal.

    :param model: the NumPyro model.
    :param dict plates: ``{name: (size, subsample_size, dim)}`` of its subsample plates
        (``dim`` may be ``None`` when no observed site was found in the plate).
    :param bool noise: whether to estimate the noise sd (needs exactly one plate).
    :param replace: draw indices with replacement (``None``: as
        :func:`resolve_replace` chooses for each plate).
    :param str covariance: ``None`` (default), ``"lowrank"``, ``"diag"`` or
        ``"full"``: also return the noise covariance in that form (implies
        ``noise``).
    :param str per_datum: how the per-datum gradients are formed: ``"vmap"``
        (default) runs the model on each datum of the minibatch alone, vectorized,
        at the cost of about one minibatch gradient plus n evaluations of the
        model's parts outside the plate; ``"jacobian"`` takes one Jacobian of the
        n terms, min(n, d) times the cost of a minibatch gradient, but evaluates
        the parts outside the plate once (for a model whose prior costs more
        than its likelihood). Either way, where n x d floats would pass
        :attr:`row_budget` and the noise form needs only variances (the sd, or
        ``covariance="diag"``), the gradients of the likelihood terms alone are
        formed a chunk of rows at a time and reduced as they come
        (:class:`StreamedRows`): memory O(chunk x d + d), never n x d.
    :param pullback: ``None``, or a linear map ``g -> L' g`` on flat gradients of
        shape (..., d) (a :class:`~numpyro_sgbd.preconditioning.Preconditioner`'s
        ``pull``): the gradient, the per-datum gradients behind the noise
        statistics, and :meth:`full_data`'s gradient are then returned flat, in the
        coordinates u of ``z = z_hat + L u`` (positions stay in z).
    :param sharding: ``None``, or the
        :class:`~numpyro_sgbd.sharding.DataSharding` of the model's data: every
        estimate and full-data pass then runs shard by shard
        (:meth:`map_shards`).
    """

    def __init__(
        self,
        model,
        plates,
        *,
        noise=False,
        replace=False,
        covariance=None,
        per_datum="vmap",
        pullback=None,
        sharding=None,
    ):
        if per_datum not in ("vmap", "jacobian"):
            raise ValueError(
                f"per_datum must be 'vmap' or 'jacobian', got {per_datum!r}."
            )
        if covariance not in (None, "lowrank", "diag", "full"):
            raise ValueError(
                "covariance must be None, 'lowrank', 'diag' or 'full', "
                f"got {covariance!r}."
            )
        noise = noise or covariance is not None
        if noise and len(plates) > 1:
            raise ValueError(
                "Estimating the gradient noise needs exactly one subsample plate; "
                f"the model has {sorted(plates)}."
            )
        self.model = model
        self.plates = dict(plates)
        self.noise = noise
        self.replace = replace
        self.covariance = covariance
        self.per_datum = per_datum
        self.pullback = pullback
        self.sharding = sharding
        #: The estimator on one shard (``None`` without sharding).
        self.local = None
        if sharding is not None:
            ((name, (_, _, dim)),) = self.plates.items()
            self.local = MinibatchEstimator(
                shard_local(model, name, sharding.local_size, sharding.num_shards),
                {name: (sharding.local_size, sharding.local_subsample_size, dim)},
                noise=noise,
                replace=resolve_replace(
                    replace, sharding.size, sharding.subsample_size
                ),
                covariance=covariance,
                per_datum=per_datum,
                pullback=pullback,
            )

    def _pull(self, grad, per_datum_grads=None):
        """Gradients in u (flat) where there is a pullback; unchanged otherwise."""
        if self.pullback is None:
            return grad, per_datum_grads
        grad = self.pullback(ravel_pytree(grad)[0])
        if isinstance(per_datum_grads, StreamedRows):
            rows = per_datum_grads
            per_datum_grads = StreamedRows(
                lambda idx: self._pull_rows(rows.fn(idx)), rows.indices, rows.chunk
            )
        elif per_datum_grads is not None:
            per_datum_grads = self._pull_rows(per_datum_grads)
        return grad, per_datum_grads

    def _pull_rows(self, rows):
        leaves = jax.tree.leaves(rows)
        n = leaves[0].shape[0]
        return self.pullback(jnp.concatenate([g.reshape(n, -1) for g in leaves], 1))

    #: Per-datum gradients are formed in chunks of at most this many floats
    #: (``chunk x d``), where the covariance form does not need them all
    #: (``covariance`` None or ``"diag"``). ``None``, the default, picks by JAX's
    #: default backend: 2**18 (1 MiB of float32) on a CPU, where one row at a
    #: time is fastest at large d (XLA:CPU's batched scatter), and 2**22
    #: (16 MiB) on an accelerator, where every chunk costs a kernel launch: on
    #: one H100, matrix factorisation (d = 194,820, n = 800) took 14.6 ms a
    #: corrected step at 2**18 and 1.31 ms at 2**22 (``benchmarks/results-gpu.md``).
    #: Set an int, on the class or an instance, to choose.
    row_budget = None

    def _row_budget(self):
        if self.row_budget is not None:
            return self.row_budget
        return 2**18 if jax.default_backend() == "cpu" else 2**22

    def _rows_per_chunk(self, z, n):
        """Rows per chunk of the per-datum gradients: ``n`` (all at once, as
        rows) or fewer (a :class:`StreamedRows`)."""
        if self.covariance in ("lowrank", "full"):
            return n  # the factor or the matrix needs every row
        return _largest_divisor(n, self._row_budget() // max(_flat_size(z), 1))

    def draw(self, rng_key):
        """Fresh indices ``{plate name: indices}`` for every subsample plate."""
        keys = random.split(rng_key, max(len(self.plates), 1))
        return {
            name: draw_indices(key, size=size, subsample_size=n, replace=self.replace)
            for key, (name, (size, n, _)) in zip(keys, self.plates.items())
        }

    def _terms(self, z, indices, model_args, model_kwargs, with_terms=None):
        """(potential estimate, scaled per-datum log-likelihood terms h_i or None).

        ``indices`` fixes every subsample plate (``{name: indices}``); an index
        array of any length m gives its plate the scale N / m. The terms are formed
        where ``with_terms`` (default: where the noise is estimated).
        """
        model = fix_plates(self.model, indices)
        model = substitute(model, substitute_fn=partial(_unconstrain_reparam, z))
        log_joint, trace = log_density(model, model_args, model_kwargs, {})
        with_terms = self.noise if with_terms is None else with_terms
        if not with_terms or not self.plates:
            return -log_joint, None
        ((name, _),) = self.plates.items()
        n = jnp.shape(indices[name])[0]
        per_datum = jnp.zeros((n,))
        for site in trace.values():
            if site["type"] != "sample" or not site["is_observed"]:
                continue
            frame = next((f for f in site["cond_indep_stack"] if f.name == name), None)
            if frame is None:
                continue
            lp = site["fn"].log_prob(site["value"])
            if site["scale"] is not None:
                lp = site["scale"] * lp
            axis = jnp.ndim(lp) + frame.dim
            if axis < 0 or jnp.shape(lp)[axis] != n:
                raise ValueError(
                    f"Observed site '{site['name']}' in plate '{name}' has log-density "
                    f"shape {jnp.shape(lp)} without the plate's dimension {frame.dim}; "
                    "cannot form per-datum gradients."
                )
            lp = jnp.moveaxis(lp, axis, 0).reshape(n, -1).sum(-1)
            per_datum = per_datum + lp
        return -log_joint, per_datum

    def __call__(self, rng_key, z, model_args=(), model_kwargs=None):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        # NumPy data cannot be indexed by the traced minibatch indices (X[idx]);
        # as JAX arrays they can, and jit embeds them as it would anyway.
        model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
        return self.map_shards(
            lambda est, idx, z, args, kwargs: est.evaluate(z, idx, args, kwargs),
            rng_key,
            z,
            model_args,
            model_kwargs,
        )

    def map_shards(self, local, rng_key, operand, model_args, model_kwargs):
        """The :class:`GradientEstimate` of ``local(estimator, indices, operand,
        model_args, model_kwargs) -> (value, grad, per_datum_grads)`` (as
        :meth:`evaluate` returns) on minibatch indices drawn from ``rng_key``.

        Without sharding this is ``local`` on this estimator's indices, summarised.
        With it, each shard k runs ``local`` on the per-shard estimator
        (:attr:`local`: its own N/K rows, the prior weighted 1/K) with n/K indices
        drawn by the key ``fold_in(rng_key, k)``, inside :func:`jax.shard_map`;
        the shards' potentials, gradients and noise statistics are summed in one
        all-reduce (:meth:`summarise`). The estimate is stratified, n/K rows from
        each shard, so its noise variance is the sum of the shards' (docs: Big
        data). ``operand`` (positions) and the result are replicated.
        """
        if self.sharding is None:
            parts = local(self, self.draw(rng_key), operand, model_args, model_kwargs)
            return self.summarise(*parts)
        sharding = self.sharding
        arrays, rebuild, _ = split_arrays((model_args, model_kwargs))
        axis = sharding.axis

        def on_shard(rng_key, operand, arrays):
            args, kwargs = rebuild(arrays)
            est = self.local
            key = random.fold_in(rng_key, jax.lax.axis_index(axis))
            parts = local(est, est.draw(key), operand, args, kwargs)
            return est.summarise(*parts, axis_name=axis)

        return sharding.map(on_shard)(rng_key, operand, arrays)

    def evaluate(self, z, indices, model_args, model_kwargs):
        """``(potential, its gradient, per-datum gradients or None)`` at ``z`` on
        the minibatch ``indices`` (from :meth:`draw`); the gradients in u where
        there is a pullback. The per-datum gradients (rows) are formed where the
        noise is estimated."""
        value, grad, per_datum_grads = self._at_z(z, indices, model_args, model_kwargs)
        return (value, *self._pull(grad, per_datum_grads))

    def _at_z(self, z, indices, model_args, model_kwargs):
        fn = partial(
            self._terms,
            indices=indices,
            model_args=model_args,
            model_kwargs=model_kwargs,
        )
        if not self.noise or not self.plates:
            value, grad = jax.value_and_grad(lambda z: fn(z)[0])(z)
            return value, grad, None
        ((name, (_, n, _)),) = self.plates.items()
        # Checks, while tracing only, that every observed site in the plate has
        # one log-density per datum (raises a ValueError naming the site if not).
        jax.eval_shape(fn, z)
        chunk = self._rows_per_chunk(z, n)
        if chunk < n:
            # Large d: the minibatch gradient as without noise, and the gradients
            # of the likelihood terms alone (the prior and Jacobian are exact: no
            # noise), a chunk of rows at a time (memory O(chunk x d), never n x d).

            def term(z, i):
                # h_i = (N / n) log p(y_i | z): the one-datum model weights its
                # datum by N.
                one = self._terms(z, {name: i[None]}, model_args, model_kwargs, True)
                return one[1][0] / n

            value, grad = jax.value_and_grad(lambda z: fn(z, with_terms=False)[0])(z)
            gathered = self._gathered_rows(term, z, indices[name], chunk)
            if gathered is not None:
                return value, grad, gathered

            def rows(idx):
                return jax.vmap(jax.grad(term), (None, 0))(z, idx)

            return value, grad, StreamedRows(rows, indices[name], chunk)
        if self.per_datum == "jacobian":

            def with_value(z):
                out = fn(z)
                return out, out[0]

            # One Jacobian of (potential, h_1..h_n): d forward passes or n + 1
            # reverse, each costing a minibatch gradient.
            jac = jax.jacfwd if _flat_size(z) <= n else jax.jacrev
            (grad, per_datum_grads), value = jac(with_value, has_aux=True)(z)
            return value, grad, per_datum_grads

        def one(z, i):
            # The model on the single datum i: U_i = -log prior - N log p(y_i | z).
            return self._terms(z, {name: i[None]}, model_args, model_kwargs, False)[0]

        # The n one-datum potentials, vmapped: O(n d) work, as one minibatch
        # gradient, where a Jacobian costs min(n, d) of them. Their mean is the
        # minibatch potential (and gradient); grad U_i / n is minus the gradient of
        # the scaled term h_i up to the prior's gradient / n, a shift common to all
        # rows that the noise statistics (variances, centred covariances,
        # differences between two points on the same indices) do not see.
        values, grads = jax.vmap(jax.value_and_grad(one), (None, 0))(z, indices[name])
        grad = jax.tree.map(lambda g: jnp.mean(g, 0), grads)
        per_datum_grads = jax.tree.map(lambda g: -g / n, grads)
        return jnp.mean(values), grad, per_datum_grads

    def _gathered_rows(self, term, z, indices, chunk):
        """``term``'s gradients on the data ``indices`` as :class:`StreamedRows`
        whose chunks are :class:`GatheredRows`, as many rows a chunk as
        :attr:`row_budget` allows; or ``None`` where that does not apply: no leaf
        is read through one gather, a chunk would be no larger than ``chunk``
        (the dense rows'), or a pullback mixes the coordinates (then the
        gradients in u are dense)."""
        if self.pullback is not None:
            return None
        leaves, treedef = jax.tree.flatten(z)
        plan = trace_gathers(
            lambda leaves, i: term(jax.tree.unflatten(treedef, leaves), i),
            leaves,
            indices[0],
        )
        if plan is None:
            return None
        per_row = _flat_size(
            [x for j, x in enumerate(leaves) if j not in plan.gathers]
        ) + sum(2 * eqn.outvars[0].aval.size for eqn in plan.gathers.values())
        rows = _largest_divisor(jnp.shape(indices)[0], self._row_budget() // per_row)
        if rows <= chunk:
            return None
        shapes = [
            jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves
        ]

        def fn(idx):
            parts = gathered_rows(plan, leaves, idx)
            return GatheredRows(treedef, shapes, plan.gathers, *parts)

        try:  # the program re-evaluated equation by equation, as traced
            jax.eval_shape(partial(gathered_rows, plan, leaves), indices[:rows])
        except Exception:  # an equation that cannot be re-bound: dense rows
            return None
        return StreamedRows(fn, indices, rows)

    def summarise(self, value, grad, per_datum_grads, axis_name=None):
        """The :class:`GradientEstimate` of :meth:`evaluate`'s parts, with the
        noise statistics of the n per-datum gradients (rows of
        ``per_datum_grads``) where asked for.

        ``axis_name``: inside :func:`jax.shard_map`, these are one shard's parts;
        the potentials, gradients and noise variances (per coordinate, or the
        covariance) of the shards are summed over that mesh axis, and a low-rank
        factor's columns gathered from every shard (its n/K centred rows each).
        """
        if axis_name is None:
            total = gather = lambda x: x  # noqa: E731
        else:
            total = partial(jax.lax.psum, axis_name=axis_name)
            gather = partial(
                jax.lax.all_gather, axis_name=axis_name, axis=1, tiled=True
            )
        value, grad = total((value, grad))
        if not self.noise:
            return GradientEstimate(grad, None, value)
        if not self.plates:
            return GradientEstimate(grad, jax.tree.map(jnp.zeros_like, grad), value)
        ((size, n, _),) = self.plates.values()
        factor = noise_variance_factor(size, n, replace=self.replace)
        if isinstance(per_datum_grads, StreamedRows):
            _, m2 = per_datum_grads.moments()
            variance = jax.tree.map(lambda v: v / (n - 1), m2)
        else:
            variance = jax.tree.map(lambda g: jnp.var(g, 0, ddof=1), per_datum_grads)
        variance = total(jax.tree.map(lambda v: factor * v, variance))
        noise_sd = jax.tree.map(jnp.sqrt, variance)
        if self.covariance is None:
            return GradientEstimate(grad, noise_sd, value)
        if self.covariance == "diag":
            # In ravel_pytree's order, as the rows' columns.
            cov = jnp.concatenate([v.reshape(-1) for v in jax.tree.leaves(variance)])
        else:
            flat = jnp.concatenate(
                [g.reshape(n, -1) for g in jax.tree.leaves(per_datum_grads)], axis=1
            )  # (n, d), columns in ravel_pytree's order
            cov = jnp.sqrt(factor / (n - 1)) * (flat - flat.mean(0)).T  # C, (d, n)
            if self.covariance == "full":
                cov = total(cov @ cov.T)
            else:
                cov = gather(cov)
        return GradientEstimate(grad, noise_sd, value, cov)

    def full_data(self, z, model_args=(), model_kwargs=None, *, chunk_size=4096):
        """The exact full-data potential and its gradient at ``z``, summed over the
        data in chunks of ``chunk_size`` rows: memory O(chunk_size x d), never
        O(N x d). Needs exactly one subsample plate.

        :return: ``(U(z), grad U(z))``.
        """
        return self.full_data_fn(model_args, model_kwargs, chunk_size=chunk_size)(z)

    def full_data_fn(self, model_args=(), model_kwargs=None, *, chunk_size=4096):
        """:meth:`full_data` as a jitted function of z, compiled once for these
        model arguments (for an optimiser's repeated calls); the data are
        arguments of the compiled function, not constants in it."""
        run, arrays = self.full_data_parts(model_args, model_kwargs, chunk_size)
        return lambda z: run(z, arrays)

    def full_data_parts(self, model_args=(), model_kwargs=None, chunk_size=4096):
        """``(run, arrays)``: :meth:`full_data` is ``run(z, arrays)``, jitted, with
        the array leaves of the model arguments as its second argument (so that a
        caller's own jitted function can pass them through).

        With sharding, each shard sums its own rows in chunks and one all-reduce
        adds the shards' sums (the prior counted once, :class:`~numpyro_sgbd.
        handlers.shard_local`)."""
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if self.sharding is not None:
            local_run, arrays = self.local.full_data_parts(
                model_args, model_kwargs, chunk_size
            )
            axis = self.sharding.axis

            def on_shard(z, arrays):
                return jax.lax.psum(local_run(z, arrays), axis)

            return jax.jit(self.sharding.map(on_shard)), arrays
        arrays, rebuild, _ = split_arrays(as_jax_arrays((model_args, model_kwargs)))
        ((name, (size, _, _)),) = self.plates.items()
        c = int(min(chunk_size, size))
        num_chunks = -(-size // c)

        def parts(z, start, model_args, model_kwargs):
            idx = start + jnp.arange(c)
            mask = idx < size
            idx = jnp.minimum(idx, size - 1)  # the last chunk is padded
            value, h = self._terms(
                z, {name: idx}, model_args, model_kwargs, with_terms=True
            )
            # h_i = (N / c) log p(y_i | z): the prior, Jacobian and any data outside
            # the plate are value + sum(h); the chunk's log-likelihood sum(h) c / N.
            rest = value + jnp.sum(h)
            loglik = jnp.sum(jnp.where(mask, h, 0.0)) * (c / size)
            return rest, loglik

        @jax.jit
        def run(z, arrays):
            args = rebuild(arrays)
            rest_and_grad = jax.value_and_grad(lambda z: parts(z, 0, *args)[0])
            loglik_and_grad = jax.value_and_grad(
                lambda z, start: parts(z, start, *args)[1]
            )

            def body(carry, start):
                value, grad = loglik_and_grad(z, start)
                return jax.tree.map(jnp.add, carry, (value, grad)), None

            zero = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, z))
            starts = jnp.arange(num_chunks) * c
            (loglik, loglik_grad), _ = jax.lax.scan(body, zero, starts)
            rest, rest_grad = rest_and_grad(z)
            grad = jax.tree.map(jnp.subtract, rest_grad, loglik_grad)
            return rest - loglik, self._pull(grad)[0]

        return run, arrays


class ControlVariateEstimator(Estimator):
    r"""Minibatch gradient with control variates around a centre :math:`\hat z`.

    .. math::

        \hat g(z) = \nabla U(\hat z) + \nabla\hat U_S(z) - \nabla\hat U_S(\hat z),

    :math:`\hat U_S` the minibatch potential of :class:`MinibatchEstimator` on the
    indices S drawn for this step and :math:`U` the full-data potential (tuning
    paper, Coullon, South & Nemeth, App. D.3). The prior and Jacobian
    terms of the two minibatch potentials cancel at :math:`\hat z` and are exact at
    z; the likelihood part is
    :math:`\frac{N}{n}\sum_{i\in S}[\nabla\ell_i(z) - \nabla\ell_i(\hat z)]` around
    the exact full-data gradient at the centre, so the estimate is unbiased and its
    noise vanishes as z approaches :math:`\hat z`. Noise statistics (sd and
    covariance) come from the per-datum differences
    :math:`\nabla\ell_i(z) - \nabla\ell_i(\hat z)`. The potential estimate is
    :math:`U(\hat z) + \hat U_S(z) - \hat U_S(\hat z)`. A step costs two minibatch
    gradients (with per-datum gradients where the noise is needed).

    It wraps any minibatch estimator: one with ``plates`` (exactly one subsample
    plate), ``evaluate(z, indices, ...)`` and ``map_shards`` (which draws the
    indices and summarises, shard by shard where the data are sharded), such as
    :class:`MinibatchEstimator` or a subclass, evaluating it at z and at the
    centre on the same indices.

    :param estimator: the estimator to wrap; or a NumPyro model, for which the
        wrapped estimator is ``MinibatchEstimator(model, plates, noise=noise,
        replace=replace, covariance=covariance, per_datum=per_datum,
        pullback=pullback)``.
    :param dict plates, noise, replace, covariance, per_datum, pullback: as
        :class:`MinibatchEstimator`, given only with a model.
    :param centre: :math:`\hat z`, unconstrained values by site (``None`` with
        ``recentre_every``: each chain starts at its initial position).
    :param centre_potential: :math:`U(\hat z)`, the full-data potential.
    :param centre_grad: :math:`\nabla U(\hat z)`, like ``centre``.
    :param int recentre_every: ``None`` (the centre stays), or move each chain's
        centre to the mean of its last ``recentre_every`` warmup draws (the
        chain's :class:`Centre` then lives in its state; see :meth:`recentre`).
    :param int chunk_size: rows per chunk of the full-data gradient at a new
        centre.
    """

    def __init__(
        self,
        estimator,
        plates=None,
        centre=None,
        centre_potential=None,
        centre_grad=None,
        *,
        noise=False,
        replace=False,
        covariance=None,
        per_datum="vmap",
        pullback=None,
        recentre_every=None,
        chunk_size=4096,
    ):
        if isinstance(estimator, Estimator):
            if plates is not None:
                raise ValueError(
                    "ControlVariateEstimator wraps the given estimator, whose "
                    "plates are its own: pass plates= only with a model."
                )
        else:
            estimator = MinibatchEstimator(
                estimator,
                plates,
                noise=noise,
                replace=replace,
                covariance=covariance,
                per_datum=per_datum,
                pullback=pullback,
            )
        if len(estimator.plates) != 1:
            raise ValueError(
                "Control-variate gradients need exactly one subsample plate; the "
                f"model subsamples {sorted(estimator.plates) or 'none'}."
            )
        #: The wrapped estimator.
        self.estimator = estimator
        self.centre = centre
        self.centre_potential = centre_potential
        self.centre_grad = centre_grad
        self.recentre_every = recentre_every
        self.chunk_size = chunk_size

    # What the kernels and the mode search ask of an estimator, from the wrapped one.
    model = property(lambda self: self.estimator.model)
    plates = property(lambda self: self.estimator.plates)
    noise = property(lambda self: self.estimator.noise)
    covariance = property(lambda self: self.estimator.covariance)
    pullback = property(lambda self: self.estimator.pullback)
    sharding = property(lambda self: self.estimator.sharding)

    def full_data(self, z, model_args=(), model_kwargs=None, *, chunk_size=4096):
        """The wrapped estimator's exact full-data potential and gradient."""
        return self.estimator.full_data(
            z, model_args, model_kwargs, chunk_size=chunk_size
        )

    def full_data_fn(self, model_args=(), model_kwargs=None, *, chunk_size=4096):
        """The wrapped estimator's :meth:`~MinibatchEstimator.full_data_fn`."""
        return self.estimator.full_data_fn(
            model_args, model_kwargs, chunk_size=chunk_size
        )

    def full_data_parts(self, model_args=(), model_kwargs=None, chunk_size=4096):
        """The wrapped estimator's :meth:`~MinibatchEstimator.full_data_parts`."""
        return self.estimator.full_data_parts(model_args, model_kwargs, chunk_size)

    def __call__(self, rng_key, z, model_args=(), model_kwargs=None):
        centre = (self.centre, self.centre_potential, self.centre_grad)
        return self.around(rng_key, z, centre, model_args, model_kwargs)

    def around(self, rng_key, z, centre, model_args=(), model_kwargs=None):
        """The estimate at ``z`` around another centre: ``centre`` is
        ``(z_hat, U(z_hat), grad U(z_hat))`` (the kernels' re-centring keeps it in
        their state)."""
        centre, centre_potential, centre_grad = centre
        model_kwargs = {} if model_kwargs is None else model_kwargs
        model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))

        def difference(est, indices, points, args, kwargs):
            # The minibatch parts at z minus those at the centre, same indices.
            z, centre = points
            value, grad, per_datum = est.evaluate(z, indices, args, kwargs)
            value_c, grad_c, per_datum_c = est.evaluate(centre, indices, args, kwargs)
            if isinstance(per_datum, StreamedRows):
                per_datum = per_datum - per_datum_c
            elif per_datum is not None:
                per_datum = jax.tree.map(jnp.subtract, per_datum, per_datum_c)
            return value - value_c, jax.tree.map(jnp.subtract, grad, grad_c), per_datum

        est = self.estimator.map_shards(
            difference, rng_key, (z, centre), model_args, model_kwargs
        )
        return est._replace(
            z_grad=jax.tree.map(jnp.add, est.z_grad, centre_grad),
            potential_energy=est.potential_energy + centre_potential,
        )

    def estimate(self, rng_key, z, model_args=(), model_kwargs=None, centre=None):
        if centre is None:
            return self(rng_key, z, model_args, model_kwargs)
        return self.around(
            rng_key,
            z,
            (centre.z, centre.potential, centre.grad),
            model_args,
            model_kwargs,
        )

    def initial_centre(self, z, model_args=(), model_kwargs=None):
        """With ``recentre_every``: the chain's :class:`Centre`, at the given or
        searched centre, else at the chain's initial position ``z`` (its full-data
        potential and gradient computed in chunks). ``None`` otherwise."""
        if self.recentre_every is None:
            return None
        if self.centre is None:
            centre = z
            potential, grad = self.full_data(
                z, model_args, model_kwargs, chunk_size=self.chunk_size
            )
        else:
            centre = self.centre
            potential, grad = self.centre_potential, self.centre_grad
        potential = jnp.asarray(potential, jnp.result_type(float))
        return Centre(centre, potential, grad, jax.tree.map(jnp.zeros_like, z))

    def recentre(
        self,
        centre,
        z,
        i,
        num_warmup,
        model_args=(),
        model_kwargs=None,
        *,
        batched=False,
    ):
        """Add the draw ``z`` to the window's sum; every ``recentre_every`` warmup
        iterations move the centre to the window's mean, with the full-data
        potential and gradient there (in chunks). A non-finite result keeps the old
        centre. ``batched``: ``centre`` and ``z`` carry a leading axis of
        vectorized chains, which share ``i``, so the O(N) branch runs only when
        due."""
        every = self.recentre_every
        if every is None:
            return centre
        z_sum = jax.tree.map(jnp.add, centre.z_sum, z)
        i = jnp.ravel(i)[0]
        due = (i % every == 0) & (i <= num_warmup)

        def move(centre, z_sum):
            z = jax.tree.map(lambda x: x / every, z_sum)
            potential, grad = self.full_data(
                z, model_args, model_kwargs, chunk_size=self.chunk_size
            )
            zeros = jax.tree.map(jnp.zeros_like, z_sum)
            new = Centre(z, potential.astype(centre.potential.dtype), grad, zeros)
            ok = _finite_tree(new)
            old = centre._replace(z_sum=zeros)
            return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)

        return jax.lax.cond(
            due,
            jax.vmap(move) if batched else move,
            lambda centre, z_sum: centre._replace(z_sum=z_sum),
            centre,
            z_sum,
        )


def unconstrained_centre(centre, trace, shapes):
    """A user's centre (constrained values by site) on the unconstrained scale,
    checked against the model's latent sites."""
    missing = sorted(set(shapes) - set(centre))
    extra = sorted(set(centre) - set(shapes))
    if missing or extra:
        raise ValueError(
            "centre must give a value for every latent site "
            f"{sorted(shapes)}: missing {missing}, unknown {extra}."
        )
    out = {}
    for name, value in centre.items():
        support = trace[name]["fn"].support
        value = jnp.asarray(value, dtype=jnp.result_type(float))
        want = jnp.shape(trace[name]["value"])
        if jnp.shape(value) != want:
            raise ValueError(
                f"centre['{name}'] has shape {jnp.shape(value)}; the site's value has "
                f"shape {want}."
            )
        if not bool(jnp.all(jnp.isfinite(value))):
            raise ValueError(f"centre['{name}'] = {value} is not finite.")
        if not bool(jnp.all(support(value))):
            raise ValueError(
                f"centre['{name}'] = {value} is outside the site's support "
                f"{support}; give constrained values."
            )
        z = biject_to(support).inv(value)
        if not bool(jnp.all(jnp.isfinite(z))):
            raise ValueError(
                f"centre['{name}'] = {value} is not finite on the unconstrained scale."
            )
        out[name] = z
    return out
