"""Whether a chain's draws still drift: the kernels' check at the end of a run."""

import numpy as np

__all__ = ["drift"]


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
