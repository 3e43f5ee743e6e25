r"""Convergence diagnostics on the host: rank-normalised R-hat, bulk and tail ESS.

These are the statistics ArviZ (0.x) reports as ``az.rhat(method="rank")``,
``az.ess(method="bulk")`` and ``az.ess(method="tail")``, computed with NumPy alone so
that a kernel can check its draws after sampling without importing ArviZ or SciPy.
Every function takes ``draws`` of shape ``(chains, draws, *coords)``; trailing axes
are coordinates, and the work is vectorised over them (one sort and one batch of FFTs
per block of coordinates).

**References**

1. Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), *Rank-normalization,
   folding, and localization: an improved* :math:`\widehat{R}` *for assessing
   convergence of MCMC*, Bayesian Analysis 16(2), 667-718: split R-hat
   (Section 3), ESS of several chains with Geyer's truncation (Section 3.2),
   rank normalisation, folding and tail ESS (Section 4). Section numbers follow
   the published version; equation numbers are deliberately not cited, as they
   differ between the arXiv (1903.08008) and journal versions.
2. Geyer (1992), *Practical Markov chain Monte Carlo*, Statistical Science 7(4),
   Section 3.3: the initial positive and initial monotone sequence estimators.
3. Blom (1958), *Statistical estimates and transformed beta-variables*: the
   offset 3/8 of the normal scores.
4. Hyndman & Fan (1996), *Sample quantiles in statistical packages*, The American
   Statistician 50(4): definition 7, the quantile used for the tail indicators.
"""

from statistics import NormalDist
from typing import NamedTuple

import numpy as np

__all__ = [
    "ConvergenceSummary",
    "Worst",
    "ess_bulk",
    "ess_tail",
    "rhat",
    "rhat_text",
    "sd_error",
    "summary",
]

#: Blom's offset in the normal scores (rank - 3/8) / (S - 3/4 + 1) (Reference 3).
_BLOM = 3.0 / 8.0
#: Tail probabilities of ``ess_tail`` (Vehtari et al. 2021, Section 4).
_TAIL_PROBS = (0.05, 0.95)
#: Fewer draws per chain than this and every statistic is NaN (as ArviZ).
_MIN_DRAWS = 4
#: Work on blocks of about this many values, so the FFT buffers stay in cache.
_BLOCK_VALUES = 1 << 21


def rhat_text(value):
    """An R-hat as a message prints it: four decimals below 2, so that a value
    just over a threshold of 1.01 does not read as 1.01 (``1.0101``), three
    significant figures above; words where it is not finite (too few draws).

    >>> rhat_text(1.0101), rhat_text(1.53), rhat_text(12.345)
    ('1.0101', '1.5300', '12.3')
    >>> rhat_text(float("nan"))
    'not computed'
    """
    if not np.isfinite(value):
        return "not computed"
    return f"{value:.4f}" if value < 2 else f"{value:.3g}"


class Worst(NamedTuple):
    """The worst coordinate for one statistic.

    :ivar float value: its value (NaN when any coordinate is NaN).
    :ivar tuple index: its index into the coordinate shape ``draws.shape[2:]``.
    :ivar name: its entry of ``names`` when given, else None.
    """

    value: float
    index: tuple
    name: object


class ConvergenceSummary(NamedTuple):
    """What :func:`summary` returns.

    :ivar numpy.ndarray ess_bulk: bulk ESS, shape ``draws.shape[2:]``.
    :ivar numpy.ndarray ess_tail: tail ESS, same shape.
    :ivar numpy.ndarray rhat: rank-normalised split R-hat, same shape.
    :ivar Worst min_ess_bulk: the coordinate with the smallest bulk ESS.
    :ivar Worst min_ess_tail: the coordinate with the smallest tail ESS.
    :ivar Worst max_rhat: the coordinate with the largest R-hat.
    """

    ess_bulk: np.ndarray
    ess_tail: np.ndarray
    rhat: np.ndarray
    min_ess_bulk: Worst
    min_ess_tail: Worst
    max_rhat: Worst


# ----------------------------------------------------------------- building blocks
def _normal_scores(size):
    """Normal scores of every possible average rank among ``size`` values.

    Entry ``c`` is for the rank ``c / 2 + 1`` (ties give half-integer ranks), so the
    table has ``2 size - 1`` entries: the inverse normal CDF runs once per possible
    rank, not once per draw, which is what makes the pure-Python quantile fast.
    """
    ranks = np.arange(2 * size - 1) / 2.0 + 1.0
    probs = (ranks - _BLOM) / (size - 2 * _BLOM + 1)
    return np.vectorize(NormalDist().inv_cdf, otypes=[float])(probs)


def _tie_codes(sorted_values):
    """For rows sorted ascending, ``2 (average rank - 1)`` of each position (int).

    Ties are rare (and the folded draws have exactly one, at the median), so the
    tie groups are found as runs in one flat pass and only their entries rewritten.
    """
    k, size = sorted_values.shape
    codes = 2 * np.arange(size)
    tied = sorted_values[:, 1:] == sorted_values[:, :-1]
    if not tied.any():
        return np.broadcast_to(codes, (k, size))
    # Column j of `padded` flags a tie between positions j - 1 and j; the False
    # columns at both ends keep runs from crossing rows once flattened.
    padded = np.zeros((k, size + 1), np.int8)
    padded[:, 1:size] = tied
    step = np.diff(padded.reshape(-1))
    first = np.flatnonzero(step == 1) + 1
    last = np.flatnonzero(step == -1)
    row, start = np.divmod(first, size + 1)
    start -= 1
    end = last % (size + 1)
    lengths = end - start + 1
    # Flat positions of every member of every tie group, and its group's code.
    offsets = np.arange(lengths.sum()) - np.repeat(
        np.cumsum(lengths) - lengths, lengths
    )
    members = np.repeat(row * size + start, lengths) + offsets
    codes = np.tile(codes, k)
    codes[members] = np.repeat(start + end, lengths)
    return codes.reshape(k, size)


def _scatter(order, sorted_scores):
    """Put the scores of the sorted positions back at the original positions."""
    out = np.empty(sorted_scores.shape)
    np.put_along_axis(out, order, sorted_scores, axis=1)
    return out


def _rhat_of(x):
    """R-hat of (coords, chains, n) already split draws (Ref. 1, Section 3)."""
    n = x.shape[-1]
    between = n * np.var(x.mean(axis=-1), axis=-1, ddof=1)
    within = np.var(x, axis=-1, ddof=1).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((between / within + n - 1) / n)


def _fft_length(n):
    """The smallest 5-smooth integer >= 2 n: zero padding that makes the circular
    autocorrelation linear, at a length pocketfft transforms fast."""
    target = 2 * n
    best = 1 << (target - 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            length = p35
            while length < target:
                length *= 2
            best = min(best, length)
            p35 *= 3
        p5 *= 5
    return best


def _ess_of(x):
    """ESS of (coords, chains, n) already split (and transformed) draws.

    The within-chain autocovariances come from one FFT per chain; only their mean
    over chains enters the estimator (Ref. 1, Section 3.2), so the power spectra
    are averaged before the single inverse FFT per coordinate.
    """
    k, m, n = x.shape
    total = m * n
    centred = x - x.mean(axis=-1, keepdims=True)
    nfft = _fft_length(n)
    spectrum = np.fft.rfft(centred, n=nfft, axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).mean(axis=1)
    acov = np.fft.irfft(power, n=nfft, axis=-1)[:, :n] / n
    # Eqs. (10)-(11): var+ = (n-1)/n W + B/n, rho_t = 1 - (W - mean acov_t) / var+,
    # with W the mean unbiased within-chain variance.
    mean_var = acov[:, 0] * n / (n - 1.0)
    var_plus = acov[:, 0] + np.var(x.mean(axis=-1), axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var[:, None] - acov) / var_plus[:, None]
    tau = _geyer_tau(rho)
    tau = np.maximum(tau, 1.0 / np.log10(total))
    ess = total / tau
    # A constant series has no autocorrelation to estimate; ArviZ (and so we)
    # report the number of draws.
    spread = x.max(axis=(1, 2)) - x.min(axis=(1, 2))
    return np.where(spread < np.finfo(float).resolution, float(total), ess)


def _geyer_tau(rho):
    r"""Integrated autocorrelation time :math:`\hat\tau = -1 + 2 \sum_t \hat P_t`.

    Pairs :math:`P_m = \hat\rho_{2m} + \hat\rho_{2m+1}` (with :math:`\hat\rho_0 = 1`)
    are summed up to the first non-positive pair (initial positive sequence), after
    replacing each by the running minimum (initial monotone sequence), Ref. 2 and
    Section 3.2 of Ref. 1. The last even lag is added when it is positive, and the
    number of pairs is capped where the series runs out, as Stan and ArviZ do.
    """
    k, n = rho.shape
    last_pair = max((n - 3) // 2, 0)
    even = rho[:, 0 : 2 * last_pair + 1 : 2].copy()
    odd = rho[:, 1 : 2 * last_pair + 2 : 2]
    even[:, 0] = 1.0
    pairs = even + odd
    # A leading False column keeps argmax defined when there is only the first pair.
    nonpositive = np.concatenate([np.zeros((k, 1), bool), pairs[:, 1:] <= 0], axis=1)
    stop = np.where(nonpositive.any(axis=1), nonpositive.argmax(axis=1), last_pair)
    stop = np.where(pairs[:, 0] > 0, stop, 0)
    monotone = np.minimum.accumulate(pairs, axis=1)
    kept = np.arange(last_pair + 1) < stop[:, None]
    head = np.where(kept, monotone, 0.0).sum(axis=1)
    rows = np.arange(k)
    stop_even = even[rows, stop]
    tail = np.where(
        (pairs[rows, stop] >= 0) | (stop_even > 0) | (stop == 0), stop_even, 0.0
    )
    return -1.0 + 2.0 * head + tail


def _type7_quantiles(values, probs, is_sorted=False):
    """Hyndman & Fan's definition 7 of rows of ``values`` (Ref. 4), in the form
    R and SciPy's ``mquantiles`` evaluate it, so the tail indicators below agree
    with ArviZ draw for draw."""
    size = values.shape[-1]
    probs = np.asarray(probs, float)
    h = size * probs + (1.0 - probs)
    lower = np.floor(np.clip(h, 1, size - 1)).astype(int)
    gamma = np.clip(h - lower, 0, 1)
    if is_sorted:
        part = values
    else:
        part = np.partition(values, np.unique(np.r_[lower - 1, lower]), axis=-1)
    return (1.0 - gamma) * part[:, lower - 1] + gamma * part[:, lower]


# ---------------------------------------------------------------------- the driver
def _coordinates(draws):
    draws = np.asarray(draws, dtype=float)
    if draws.ndim < 2:
        raise ValueError(
            f"draws must have shape (chains, draws, *coords), got shape {draws.shape}."
        )
    chains, n = draws.shape[:2]
    return draws.reshape(chains, n, -1), draws.shape[2:]


def _split(x):
    """Split each chain into its first and last halves (Ref. 1, Section 3);
    the middle draw of an odd-length chain is dropped, as Stan and ArviZ do."""
    half = x.shape[-1] // 2
    return np.concatenate([x[..., :half], x[..., x.shape[-1] - half :]], axis=1)


def _block_statistics(x, which, scores):
    """The statistics named in ``which`` for a block x of shape (coords, chains, n)."""
    k, chains, n = x.shape
    split = _split(x)
    flat = split.reshape(k, -1)
    out = {}
    ordered = None
    if {"ess_bulk", "rhat"} & set(which):
        order = np.argsort(flat, axis=1)
        ordered = np.take_along_axis(flat, order, axis=1)
        z = _scatter(order, scores[_tie_codes(ordered)]).reshape(split.shape)
        if "ess_bulk" in which:
            out["ess_bulk"] = _ess_of(z)
        if "rhat" in which:
            folded = _folded_rhat(ordered, order, scores, split)
            out["rhat"] = np.fmax(_rhat_of(z), folded)
    if "ess_tail" in which:
        # The quantiles are of all draws; with an even n the split keeps them all,
        # so the sort above serves.
        if ordered is not None and n % 2 == 0:
            q = _type7_quantiles(ordered, _TAIL_PROBS, is_sorted=True)
        else:
            q = _type7_quantiles(x.reshape(k, -1), _TAIL_PROBS)
        # ESS is unchanged by an affine map of the series, so I(x <= q_0.95) gives
        # the ESS of I(x > q_0.95) too.
        out["ess_tail"] = np.minimum(
            _ess_of((split <= q[:, 0, None, None]).astype(float)),
            _ess_of((split <= q[:, 1, None, None]).astype(float)),
        )
    return out


def _folded_rhat(ordered, order, scores, split):
    """R-hat of the rank-normalised |x - median| (Ref. 1, Section 4).

    Sorted x gives |x - median| as a decreasing run then an increasing one, so the
    folded order comes from a stable (run-merging) sort of the two runs, far cheaper
    than sorting afresh.
    """
    size = ordered.shape[1]
    mid = size // 2  # the split array always has an even number of values
    median = (ordered[:, mid - 1] + ordered[:, mid]) / 2.0
    folded = np.abs(ordered - median[:, None])
    runs = np.concatenate([folded[:, mid - 1 :: -1], folded[:, mid:]], axis=1)
    where = np.concatenate([order[:, mid - 1 :: -1], order[:, mid:]], axis=1)
    order2 = np.argsort(runs, axis=1, kind="stable")
    runs_sorted = np.take_along_axis(runs, order2, axis=1)
    z = _scatter(
        np.take_along_axis(where, order2, axis=1), scores[_tie_codes(runs_sorted)]
    )
    return _rhat_of(z.reshape(split.shape))


def _statistics(draws, which):
    x, coord_shape = _coordinates(draws)
    chains, n, k = x.shape
    out = {name: np.full(k, np.nan) for name in which}
    if n < _MIN_DRAWS or k == 0:
        return {name: v.reshape(coord_shape) for name, v in out.items()}
    finite = np.isfinite(x).all(axis=(0, 1))
    scores = _normal_scores(2 * chains * (n // 2))
    block = max(1, _BLOCK_VALUES // (chains * n))
    for start in range(0, k, block):
        idx = np.arange(start, min(start + block, k))
        idx = idx[finite[idx]]
        if idx.size == 0:
            continue
        # (coords, chains, draws), contiguous along the draws that get sorted and
        # transformed.
        part = np.ascontiguousarray(np.moveaxis(x[:, :, idx], 2, 0))
        for name, value in _block_statistics(part, which, scores).items():
            out[name][idx] = value
    return {name: v.reshape(coord_shape) for name, v in out.items()}


# ------------------------------------------------------------------- public API
def ess_bulk(draws):
    r"""Bulk effective sample size of each coordinate.

    The ESS (Ref. 1, Section 3.2, with Geyer's initial monotone sequence) of
    the split chains after rank normalisation (Section 4): all split draws of one
    coordinate are ranked together (ties get their average rank :math:`r`) and
    replaced by :math:`z = \Phi^{-1}((r - 3/8) / (S + 1/4))`, :math:`S` the number
    of draws. This is ``az.ess(..., method="bulk")`` of ArviZ 0.x.

    :param draws: array of shape ``(chains, draws, *coords)``; one chain is fine.
    :return: array of shape ``draws.shape[2:]``. NaN where a coordinate has a
        non-finite draw or where there are fewer than 4 draws per chain; a
        constant coordinate gets the number of split draws, as in ArviZ.

    **References**

    1. Vehtari et al. (2021), *Rank-normalization, folding, and localization*,
       Bayesian Analysis 16(2): Sections 3 (split chains), 3.2 (ESS) and 4
       (rank normalisation, bulk ESS).
    2. Geyer (1992), Statistical Science 7(4), Section 3.3.

    >>> import numpy as np
    >>> draws = np.random.default_rng(0).normal(size=(4, 1000, 2))
    >>> ess = ess_bulk(draws)
    >>> ess.shape, bool(np.all((ess > 3000) & (ess < 5000)))
    ((2,), True)
    """
    return _statistics(draws, ("ess_bulk",))["ess_bulk"]


def sd_error(draws):
    """The relative Monte Carlo error of each coordinate's sd estimated from
    ``draws`` (``(chains, draws, *coords)``), and the ESS it rests on:
    ``(errors, ess)``. The variance is the mean of the squared deviations
    d = (x - mean)^2, whose Monte Carlo sd is sd(d) / sqrt(ESS(d)) (the ESS
    of d itself over the split chains, Vehtari et al. 2021, Section 3.2,
    without rank normalisation: d's own scale matters); the sd's relative
    error is half the variance's. For a Gaussian that is 1 / sqrt(2 ESS(d)),
    and ESS(d) is about twice the bulk ESS of a diffusive chain, whose
    autocorrelation the square roughly squares.

    >>> import numpy as np
    >>> errors, ess = sd_error(np.random.default_rng(0).normal(size=(4, 5000, 1)))
    >>> bool(abs(errors[0] - 1 / np.sqrt(2 * 20000)) < 0.001)
    True
    """
    x, shape = _coordinates(draws)
    flat = x.reshape(-1, x.shape[-1])
    dev = (x - flat.mean(axis=0)) ** 2  # (chains, n, K)
    var = dev.reshape(-1, x.shape[-1]).mean(axis=0)
    spread = dev.reshape(-1, x.shape[-1]).std(axis=0, ddof=1)
    ess = _ess_of(_split(np.moveaxis(dev, -1, 0)))
    with np.errstate(divide="ignore", invalid="ignore"):
        errors = 0.5 * spread / (var * np.sqrt(ess))
    return errors.reshape(shape), ess.reshape(shape)


def ess_tail(draws):
    r"""Tail effective sample size of each coordinate.

    The smaller of the ESS of the split-chain indicators :math:`I(x \le q_{0.05})`
    and :math:`I(x \le q_{0.95})` (the latter has the ESS of
    :math:`I(x > q_{0.95})`), with :math:`q_p` the quantile of all draws of the
    coordinate (Section 4 of Ref. 1). This is ``az.ess(..., method="tail")`` of
    ArviZ 0.x.

    :param draws: array of shape ``(chains, draws, *coords)``; one chain is fine.
    :return: array of shape ``draws.shape[2:]``; NaN as in :func:`ess_bulk`.

    **References**

    1. Vehtari et al. (2021), Bayesian Analysis 16(2): Sections 3.2 (ESS) and 4
       (tail ESS).
    2. Hyndman & Fan (1996), The American Statistician 50(4): definition 7.

    >>> import numpy as np
    >>> draws = np.random.default_rng(0).normal(size=(4, 1000))
    >>> bool(1000 < ess_tail(draws) < 5000)
    True
    """
    return _statistics(draws, ("ess_tail",))["ess_tail"]


def rhat(draws):
    r"""Rank-normalised split :math:`\widehat R` of each coordinate.

    The larger of the split R-hat (Ref. 1, Section 3) of the rank-normalised
    draws and of the rank-normalised folded draws :math:`|x -
    \mathrm{median}(x)|` (Section 4). This is ``az.rhat(..., method="rank")`` of
    ArviZ 0.x, except that one chain is accepted: its two halves are compared,
    where ArviZ 0.23 returns NaN for fewer than two chains.

    :param draws: array of shape ``(chains, draws, *coords)``.
    :return: array of shape ``draws.shape[2:]``. NaN where a coordinate is constant
        (no within-chain variance), has a non-finite draw, or has fewer than 4
        draws per chain.

    **References**

    1. Vehtari et al. (2021), Bayesian Analysis 16(2): Section 3 (split R-hat)
       and Section 4 (rank normalisation, folding, and their maximum).

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> stuck = np.stack([rng.normal(size=500), 3.0 + rng.normal(size=500)])
    >>> bool(rhat(stuck) > 1.5), bool(rhat(rng.normal(size=(4, 500))) < 1.01)
    (True, True)
    """
    return _statistics(draws, ("rhat",))["rhat"]


def _worst(values, pick, names):
    flat = values.reshape(-1)
    if flat.size == 0:
        return Worst(np.nan, (), None)
    nan = np.isnan(flat)
    # A NaN (a non-finite or constant coordinate) is never hidden behind a finite
    # extreme: it is reported as the worst.
    i = int(nan.argmax()) if nan.any() else int(pick(flat))
    name = None if names is None else names[i]
    return Worst(
        float(flat[i]), tuple(int(j) for j in np.unravel_index(i, values.shape)), name
    )


def summary(draws, names=None):
    """Bulk ESS, tail ESS and R-hat of every coordinate, and the worst of each.

    One pass shares the sort of each coordinate between bulk ESS and R-hat.

    :param draws: array of shape ``(chains, draws, *coords)``.
    :param names: optional sequence of one name per coordinate, in the C order of
        the flattened ``draws.shape[2:]``, used to label the worst coordinates.
    :return: a :class:`ConvergenceSummary`.

    **References**

    1. Vehtari et al. (2021), Bayesian Analysis 16(2): Sections 3-4.

    >>> import numpy as np
    >>> draws = np.random.default_rng(0).normal(size=(4, 500, 3))
    >>> draws[1, :, 2] += 5.0  # chain 1 stuck elsewhere in coordinate 2
    >>> s = summary(draws, names=["a", "b", "c"])
    >>> s.max_rhat.name, s.max_rhat.index, s.max_rhat.value > 1.5
    ('c', (2,), True)
    """
    stats = _statistics(draws, ("ess_bulk", "ess_tail", "rhat"))
    k = int(np.prod(stats["rhat"].shape))
    if names is not None and len(names) != k:
        raise ValueError(f"names has {len(names)} entries for {k} coordinates.")
    return ConvergenceSummary(
        ess_bulk=stats["ess_bulk"],
        ess_tail=stats["ess_tail"],
        rhat=stats["rhat"],
        min_ess_bulk=_worst(stats["ess_bulk"], np.argmin, names),
        min_ess_tail=_worst(stats["ess_tail"], np.argmin, names),
        max_rhat=_worst(stats["rhat"], np.argmax, names),
    )
