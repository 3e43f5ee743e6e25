"""NOGIN's choice of the noise covariance's form and rank, from d, the minibatch
size n and the data size (:class:`~numpyro_sgbd.NOGIN`'s ``covariance="auto"``)."""

from numpyro_sgbd.kernel import logger
from numpyro_sgbd.setup import dimension
from numpyro_sgbd.updates.nogin import NOISE_ROWS_PER_STEP, NOISE_WINDOW

__all__ = [
    "MAX_COVARIANCE_BYTES",
    "MAX_RANK",
    "choose_covariance",
    "choose_rank",
    "noise_form",
    "per_step_covariance",
]

#: Largest noise-covariance matrix (d x d for "full", n x n inside "lowrank") that
#: ``covariance="auto"`` forms per chain, in bytes of float32.
MAX_COVARIANCE_BYTES = 2**30


#: The rank of ``"lowrank+diag"``'s running estimate at most (``rank=None``).
MAX_RANK = 32


def choose_rank(d, rank=None):
    """The rank of ``"lowrank+diag"``'s average over ``d`` coordinates: the
    given ``rank``, else ``min(d, MAX_RANK)`` (exact where d <= MAX_RANK)."""
    return min(d, MAX_RANK) if rank is None else min(int(rank), d)


def choose_covariance(d, n, size=None):
    """NOGIN's covariance form for ``d`` coordinates, minibatches of ``n`` of
    ``size`` data: ``(form, reason)``.

    ``"lowrank+diag"`` where there is noise: a running estimate averaged over
    the last :data:`~numpyro_sgbd.updates.nogin.NOISE_WINDOW` steps from
    :data:`~numpyro_sgbd.updates.nogin.NOISE_ROWS_PER_STEP` per-datum
    gradients a step drawn apart from the force's minibatch, kept as its
    exact diagonal and its ``min(d, 32)`` leading directions. A step costs a
    minibatch gradient, those few per-datum gradients and
    :math:`O(d (r + m)^2)`, where a per-minibatch covariance costs n per-datum
    gradients and a factorisation (:func:`per_step_covariance`). Without
    subsampling (n = 0) the noise is zero: ``"diag"``.

    >>> choose_covariance(21, 1000, 10**5)[0], choose_covariance(5000, 100)[0]
    ('lowrank+diag', 'lowrank+diag')
    """
    if n == 0:
        return "diag", "no subsample plate: exact gradients, no noise"
    if size is not None and size < 2:
        return per_step_covariance(d, n)
    rank = choose_rank(d)
    what = "exact" if rank == d else f"its diagonal and {rank} leading directions"
    return "lowrank+diag", (
        f"d = {d}, n = {n}: the covariance averaged over {NOISE_WINDOW} steps of "
        f"{NOISE_ROWS_PER_STEP} rows apart from the force's ({what}): "
        f"O(d (r + m)^2) a step, no d x d factorisation"
    )


def per_step_covariance(d, n):
    """The covariance form estimated afresh from each minibatch, for ``d``
    coordinates and minibatches of ``n`` (``noise_estimate="same"``):
    ``(form, reason)``.

    A step costs :math:`O(dn^2 + n^3)` in the ``"lowrank"`` form (the d x n factor
    and an n x n solve) and :math:`O(d^2 n + d^3)` in the ``"full"`` form (the d x d
    matrix and its eigendecomposition), so the low-rank form is the cheaper exactly
    when n < d. Where the cheaper form's square matrix would pass
    :data:`MAX_COVARIANCE_BYTES`, ``"diag"`` (:math:`O(dn)`, an approximation) is
    chosen instead. Without subsampling (n = 0) the noise is zero: ``"diag"``.

    >>> per_step_covariance(21, 1000)[0], per_step_covariance(1000, 100)[0]
    ('full', 'lowrank')
    """
    if n == 0:
        return "diag", "no subsample plate: exact gradients, no noise"
    form, side = ("lowrank", n) if n < d else ("full", d)
    if 4 * side**2 > MAX_COVARIANCE_BYTES:
        return "diag", (
            f"d = {d}, n = {n}: the {form} form's {side} x {side} matrix would take "
            f"{4 * side**2 / 2**30:.1f} GiB per chain; the diagonal approximation "
            "instead"
        )
    return form, f"d = {d}, n = {n}: O(d n^2 + n^3) against O(d^2 n + d^3) a step"


def noise_form(hyper, variant, shapes, plates, source):
    """The covariance form: as given; with ``"auto"``, ``"diag"`` for exact
    gradients (a potential), else chosen by d and n once the model is traced
    (``"auto"`` before): :func:`choose_covariance`, or with
    ``noise_estimate="same"`` (or ``covariance="per_step"``)
    :func:`per_step_covariance`."""
    covariance = hyper["covariance"]
    if covariance not in ("auto", "per_step"):
        return covariance
    if source != "model":
        return "diag"
    if shapes is None:
        return covariance
    n = max((plate[1] for plate in plates.values()), default=0)
    size = min((plate[0] for plate in plates.values()), default=None)
    if (covariance == "per_step" or hyper["noise_estimate"] == "same") and n:
        covariance, why = per_step_covariance(dimension(shapes), n)
    else:
        covariance, why = choose_covariance(dimension(shapes), n, size)
    logger.info("NOGIN: covariance=%r (%s).", covariance, why)
    return covariance
