"""Whether a chain's draws still drift: the kernels' check at the end of a run."""

from typing import NamedTuple, Optional

import numpy as np

__all__ = ["Drift", "drift"]


class Drift(NamedTuple):
    """What :func:`drift` found, for one coordinate.

    :ivar int index: the coordinate.
    :ivar t: the Welch t statistic of the shift, or ``None`` where the
        coordinate held still within both quarters (no spread to measure it by).
    :ivar shift: the shift in posterior sds (the pooled sd of both quarters),
        ``None`` likewise.
    :ivar float before: the coordinate's mean over the first quarter.
    :ivar float after: its mean over the last quarter.
    """

    index: int
    t: Optional[float]
    shift: Optional[float]
    before: float
    after: float


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

    A coordinate that holds still within each quarter (zero sd in both: one that
    moves rarely, as a local site's row, which moves only when its datum is
    drawn) but whose value differs between them has no spread to measure a shift
    by; where no coordinate is flagged by the test, the first such one is
    returned, with ``t`` and ``shift`` ``None``: its draws are too few moves to
    represent its posterior.

    :param points: array ``(m, d)``, rows in time order (m >= 8).
    :return: ``None`` when nothing drifts, else a :class:`Drift` for the
        flagged coordinate with the largest ``|t|``, or for a coordinate that
        held still within both quarters.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> drift(rng.normal(size=(64, 3))) is None
    True
    >>> drifting = rng.normal(size=(64, 3)) + np.linspace(0, 4, 64)[:, None]
    >>> drift(drifting).index in (0, 1, 2)
    True
    >>> stuck = np.repeat([[0.0], [1.0]], 32, axis=0)  # one move, mid-run
    >>> drift(stuck)
    Drift(index=0, t=None, shift=None, before=0.0, after=1.0)
    """
    from scipy import stats

    points = np.asarray(points, float)
    m, d = points.shape
    q = m // 4
    first, last = points[:q], points[-q:]
    var_f, var_l = first.var(0, ddof=1), last.var(0, ddof=1)
    before, after = first.mean(0), last.mean(0)
    diff = after - before
    se = np.sqrt((var_f + var_l) / q)
    sd = np.sqrt(0.5 * (var_f + var_l))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, diff / se, 0.0)
        shift = np.where(sd > 0, np.abs(diff) / sd, 0.0)
    bound = stats.t.ppf(1 - alpha / (2 * d), df=2 * q - 2)
    flagged = (np.abs(t) > bound) & (shift >= min_shift)
    if flagged.any():
        j = int(np.argmax(np.where(flagged, np.abs(t), -1)))
        return Drift(j, float(t[j]), float(shift[j]), float(before[j]), float(after[j]))
    still = (se == 0) & np.isfinite(diff) & (diff != 0)
    if still.any():
        j = int(np.argmax(still))
        return Drift(j, None, None, float(before[j]), float(after[j]))
    return None
