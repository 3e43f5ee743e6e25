"""The Laplace map of :func:`~numpyro_sgbd.reference_posterior`: NUTS runs in
coordinates u with z = loc + W u, W W' the inverse Hessian at the mode, where
``laplace=True`` asks for it or ``laplace="auto"`` finds that NUTS needs it
(:data:`AUTO_SD_RATIO`, :data:`AUTO_CONDITION`, :data:`AUTO_SHRINKAGE`).

W is factored in float64 on the host, on a ladder: dense up to
:data:`LAPLACE_DENSE_MAX_DIM` parameters (eigenvalues that rounding made zero or
negative floored at the Hessian's resolution), low-rank plus diagonal above, and
the diagonal D^-1/2 where neither factor exists. Plain NUTS is left only where no
map does: the mode search failed, or the Hessian's diagonal is not positive."""

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.hmc_util import build_adaptation_schedule
from numpyro.infer.util import constrain_fn

from numpyro_sgbd.enumeration import potential_energy, valued
from numpyro_sgbd.estimators import split_arrays
from numpyro_sgbd.mode import (
    check_mode,
    find_mode,
    full_data_objective,
    local_sites_reason,
    mode_hessian,
)
from numpyro_sgbd.preconditioning import Preconditioner, diagonal, lowrank

__all__ = [
    "AUTO_CONDITION",
    "AUTO_SD_RATIO",
    "AUTO_SHRINKAGE",
    "LAPLACE_DENSE_MAX_DIM",
]

#: ``laplace="auto"`` whitens when the Laplace sds (sqrt of diag H^-1) span more
#: than this ratio: NUTS then starts with an identity mass matrix that fits none of
#: them, and its first adaptation windows run at the maximal tree depth.
AUTO_SD_RATIO = 100.0
#: ... or when the scaled Hessian D^-1/2 H D^-1/2 (the correlations of the Laplace
#: approximation) has a condition number of at least this (the only case called
#: ill-conditioned): a diagonal mass matrix cannot remove correlations, and NUTS's
#: trajectories grow with its square root.
AUTO_CONDITION = 1e3
#: ... or when NumPyro's mass adaptation would inflate the smallest Laplace
#: variance by more than this fraction: it adds about 5e-3 / (n + 5) to each
#: adapted variance for a window of n draws.
AUTO_SHRINKAGE = 0.1
#: Up to this many parameters the Laplace map is dense (the d x d Hessian from d
#: Hessian-vector products, a few passes over the data, and an eigendecomposition);
#: above, low-rank plus diagonal (O(d k) memory). Higher than the kernels' limit
#: (:data:`~numpyro_sgbd.preconditioning.DENSE_MAX_DIM`), which is set by the cost
#: of per-datum gradients: NUTS applies the map once per full-data gradient.
LAPLACE_DENSE_MAX_DIM = 1000


def _flat_potential(model, model_args, model_kwargs, unravel):
    """``(potential, arrays)``: the model's potential ``potential(z, arrays)`` of a
    flat unconstrained vector, and the array leaves of the model arguments (passed
    to compiled functions as arguments, not embedded in them)."""
    arrays, rebuild, _ = split_arrays((model_args, model_kwargs))

    def potential(z, arrays):
        args, kwargs = rebuild(arrays)
        return potential_energy(model, args, kwargs, unravel(z))

    return potential, arrays


class _NotUsable(ValueError):
    """No Laplace map can be built (the Hessian's diagonal is not positive):
    ``laplace=True`` raises, ``"auto"`` falls back to plain NUTS."""


def _check_diagonal(diag):
    """Raise :class:`_NotUsable` unless the Hessian's diagonal is finite and
    positive: without it there is no map at all."""
    if not np.all(np.isfinite(diag) & (diag > 0)):
        j = int(np.argmin(np.where(np.isfinite(diag), diag, -np.inf)))
        raise _NotUsable(
            "the Hessian at the mode is not positive definite (diagonal entry "
            f"{j} is {diag[j]:.3g})"
        )


def _diagonal_map(loc, diag, note):
    """``(map, form, sds, condition, note)`` of the last resort z = loc + D^-1/2 u:
    the conditional sds 1 / sqrt(H_jj), no condition number (``None``)."""
    whitening = diagonal(loc, diag)  # diag is positive and finite here
    return whitening, "diagonal", diag**-0.5, None, note


def _dense_map(loc, hess):
    """``(map, form, sds, condition, note)``: the dense Laplace map z = loc + W u,
    W W' = H^-1, or the next rung of the ladder below it.

    W comes from the eigendecomposition of the scaled Hessian S = D^-1/2 H D^-1/2
    (D = diag H) in float64 on the host, W = D^-1/2 V Lambda^-1/2: the scaling takes
    the covariates' units out, so a Hessian whose entries are accurate to their own
    size gives S to that precision, whatever H's own condition number. Where S is
    positive definite in float64 it is used as it is, however far its smallest
    eigenvalue lies below the resolution of ``loc``'s dtype (a float32 S resolves
    eigenvalues down to about d eps32 of the largest; the kernels' Cholesky factor
    of :func:`~numpyro_sgbd.preconditioning.dense` does the same). Eigenvalues that
    rounding made zero or negative (no lower than minus that resolution) are
    floored at it: NUTS then sees sds above 1 along them and adapts its step to
    them. An eigenvalue further below zero is not rounding (the point is not a
    mode), and a Hessian with non-finite entries has no eigendecomposition: both
    fall to the diagonal map D^-1/2. ``note`` says which rung was taken ("" for
    the first); the condition number is that of the S whitened by.
    """
    dtype = np.dtype(loc.dtype)
    d = loc.shape[0]
    hess = np.asarray(hess, np.float64)
    hess = 0.5 * (hess + hess.T)
    diag = np.diag(hess)
    _check_diagonal(diag)
    if not np.all(np.isfinite(hess)):
        return _diagonal_map(loc, diag, " (the Hessian has non-finite entries)")
    s = diag**-0.5
    eigval, eigvec = np.linalg.eigh(s[:, None] * hess * s)
    # What an eigendecomposition in float64 resolves, and what the Hessian's own
    # rounding (loc's dtype) leaves unresolved.
    exact = d * np.finfo(np.float64).eps * eigval[-1]
    resolution = d * np.finfo(dtype).eps * eigval[-1]
    note = ""
    if not eigval[0] > exact:
        if eigval[0] < -resolution:
            return _diagonal_map(
                loc,
                diag,
                f" (the scaled Hessian has the eigenvalue {eigval[0]:.3g}, below "
                f"its {dtype.name} rounding -{resolution:.3g}: not a mode)",
            )
        floored = int(np.sum(eigval < resolution))
        note = (
            f" (the scaled Hessian is not positive definite in float64, smallest "
            f"eigenvalue {eigval[0]:.3g}: its {floored} eigenvalue(s) below its "
            f"{dtype.name} resolution floored at {resolution:.3g})"
        )
        eigval = np.maximum(eigval, resolution)
    w = s[:, None] * eigvec / np.sqrt(eigval)
    ones = np.ones(d, dtype)
    # Cast on the host: a device-side cast compiles a program of its own.
    whitening = Preconditioner(
        "dense", jnp.asarray(loc), jnp.asarray(ones), jnp.asarray(w.astype(dtype))
    )
    sds = np.sqrt(np.sum(w**2, axis=1))
    return whitening, "dense", sds, eigval[-1] / eigval[0], note


def _lowrank_map(objective, loc, info):
    """``(map, form, sds, condition, note)``: :func:`~numpyro_sgbd.preconditioning.
    lowrank`'s map; the sds are the conditional ones, 1 / sqrt(H_jj), and the
    condition number is that of the scaled Hessian on the Lanczos space (unit
    curvature outside it, as the map assumes). Where a Ritz value is not positive,
    the diagonal map D^-1/2."""
    diag = np.asarray(info["hessian_diag"], np.float64)
    _check_diagonal(diag)
    try:
        whitening = lowrank(loc, diag, lambda vectors: objective.hvp(loc, vectors))
    except ValueError:
        note = " (a Lanczos Ritz value of the scaled Hessian is not positive)"
        return _diagonal_map(loc, diag, note)
    theta = (np.asarray(whitening.values, np.float64) + 1.0) ** -2
    condition = max(theta.max(), 1.0) / min(theta.min(), 1.0)
    return whitening, "lowrank", diag**-0.5, condition, ""


# The start of laplace_reason where "auto" kept plain NUTS on a posterior it found
# well conditioned (the advice differs from a fallback after a failure).
_WELL_CONDITIONED = "plain NUTS: the posterior is well conditioned at the mode"


def _laplace_map(objective, what):
    """``(map, form, sds, label, condition, note)`` at the mode of ``objective``:
    dense up to :data:`LAPLACE_DENSE_MAX_DIM` parameters, low-rank plus diagonal
    above, each falling to the diagonal map where its own factor fails (see
    :func:`_dense_map`). A ``ValueError`` where the mode search failed,
    :class:`_NotUsable` where the Hessian's diagonal is not positive."""
    mode, info = find_mode(objective, what=what)
    check_mode(
        info,
        objective.unravel,
        what,
        "Use laplace=False, or check the model's priors.",
        stacklevel=5,  # check_mode, here, _laplace_choice, reference_posterior
    )
    if mode.shape[0] <= LAPLACE_DENSE_MAX_DIM:
        hess = mode_hessian(objective, mode, info)
        whitening, form, sds, condition, note = _dense_map(mode, hess)
    else:
        whitening, form, sds, condition, note = _lowrank_map(objective, mode, info)
    label = "Laplace sds" if form == "dense" else "conditional Laplace sds"
    return whitening, form, sds, label, condition, note


def _triggers(sds, label, condition, inflation):
    """What makes ``"auto"`` whiten, each with its figure and threshold: an empty
    list for a posterior NUTS handles as it is. Only a condition number of at
    least :data:`AUTO_CONDITION` is called ill-conditioned."""
    ratio = sds.max() / sds.min()
    triggers = []
    if condition is not None and condition >= AUTO_CONDITION:
        triggers.append(
            "the posterior is ill-conditioned (condition number of the scaled "
            f"Hessian {condition:.2g} >= {AUTO_CONDITION:g})"
        )
    if ratio > AUTO_SD_RATIO:
        triggers.append(f"the {label} span a ratio of {ratio:.2g} > {AUTO_SD_RATIO:g}")
    if inflation > AUTO_SHRINKAGE:
        triggers.append(
            f"NumPyro's mass adaptation would add {inflation:.2g} > "
            f"{AUTO_SHRINKAGE:g} times the smallest variance"
        )
    return triggers


def _laplace_choice(model, model_args, model_kwargs, rng_key, laplace, num_warmup):
    """``(map, form, reason, unravel)``: the Laplace map z = loc + L u to run NUTS
    in (a :class:`~numpyro_sgbd.preconditioning.Preconditioner`, or ``None`` for
    plain NUTS), its form (``"dense"``, ``"lowrank"``, ``"diagonal"`` or
    ``"none"``), why, with the measured numbers, and the flat vector's
    unflattening. ``laplace=True`` raises where ``"auto"`` falls back: only where
    the mode search failed or the Hessian's diagonal is not positive (no map)."""
    what = f"reference_posterior(laplace={laplace!r})"
    if laplace == "auto":  # local sites: plain NUTS by choice (no search)
        reason = local_sites_reason(model, model_args, model_kwargs)
        if reason is not None:
            return None, "none", reason, None
    objective = full_data_objective(model, model_args, model_kwargs, rng_key=rng_key)
    try:
        whitening, form, sds, label, condition, note = _laplace_map(objective, what)
    except ValueError as err:
        if laplace is True:
            if isinstance(err, _NotUsable):
                raise ValueError(
                    f"laplace=True: {err}; the posterior may be improper, or the "
                    "mode search failed. Use laplace=False, or check the model's "
                    "priors."
                ) from None
            raise
        return None, "none", f"plain NUTS: {err}", objective.unravel
    # The last slow window of NumPyro's mass adaptation: its shrinkage is what the
    # sampling phase keeps.
    windows = build_adaptation_schedule(num_warmup)[1:-1]
    n = windows[-1].end - windows[-1].start + 1 if windows else 0
    inflation = 5e-3 / (n + 5) / sds.min() ** 2
    figures = (
        f"d = {sds.shape[0]}, {label} {sds.min():.2g} to {sds.max():.2g} (ratio "
        f"{sds.max() / sds.min():.2g}), "
        + (
            "no condition number (diagonal map)"
            if condition is None
            else f"condition number of the scaled Hessian {condition:.2g}"
        )
        + f", the mass adaptation's shrinkage {inflation:.2g} times the smallest "
        "variance"
    )
    if laplace is True:
        reason = f"laplace=True: {form}{note} ({figures})"
        return whitening, form, reason, objective.unravel
    triggers = _triggers(sds, label, condition, inflation)
    if form == "diagonal":  # the Hessian is not positive definite: no scale to trust
        triggers.append("the Hessian at the mode is not positive definite")
    if triggers:
        reason = (
            f"NUTS whitened by the {form} Laplace map{note}: "
            + "; ".join(triggers)
            + f" (d = {sds.shape[0]}, {label} {sds.min():.2g} to {sds.max():.2g})"
        )
        return whitening, form, reason, objective.unravel
    return None, "none", f"{_WELL_CONDITIONED} ({figures})", objective.unravel


def _whitened_nuts(widened, model_args, model_kwargs, whitening, unravel):
    """``(potential_fn, to_posterior)`` of NUTS in u, z = L(u): the potential of u
    (a linear map: no Jacobian) and the map of u draws (chain, draw, d) to
    constrained values by site (deterministic sites included)."""
    flat_potential, arrays = _flat_potential(widened, model_args, model_kwargs, unravel)

    def potential_fn(u):
        return flat_potential(whitening.to_z(u), arrays)

    model = valued(widened, model_args, model_kwargs)  # enumerated sites valued

    def constrain(u):
        z = unravel(whitening.to_z(u))
        return constrain_fn(
            model, model_args, model_kwargs, z, return_deterministic=True
        )

    def to_posterior(u):
        flat = u.reshape(-1, u.shape[-1])
        values = jax.jit(lambda us: jax.lax.map(constrain, us, batch_size=64))(flat)
        return jax.tree.map(lambda v: v.reshape(u.shape[:2] + v.shape[1:]), values)

    return potential_fn, to_posterior
