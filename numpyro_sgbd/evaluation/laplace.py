"""The Laplace map of :func:`~numpyro_sgbd.reference_posterior`: NUTS runs in
coordinates u with z = loc + W u, W W' the inverse Hessian at the mode (dense, or
low-rank plus diagonal above :data:`LAPLACE_DENSE_MAX_DIM` parameters), where
``laplace=True`` asks for it or ``laplace="auto"`` finds the posterior
ill-conditioned (:data:`AUTO_SD_RATIO`, :data:`AUTO_CONDITION`,
:data:`AUTO_SHRINKAGE`)."""

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.hmc_util import build_adaptation_schedule
from numpyro.infer.util import constrain_fn

from numpyro_sgbd.enumeration import potential_energy, valued
from numpyro_sgbd.estimators import split_arrays
from numpyro_sgbd.modes import check_mode, find_mode, full_data_objective, mode_hessian
from numpyro_sgbd.preconditioning import Preconditioner, lowrank

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
#: approximation) has a larger condition number: a diagonal mass matrix cannot
#: remove correlations, and NUTS's trajectories grow with its square root.
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
    """The Laplace map cannot be built: ``laplace=True`` raises, ``"auto"`` falls
    back to plain NUTS."""


def _dense_map(loc, hess):
    """``(map, sds, condition)``: the dense Laplace map z = loc + W u, W W' = H^-1.

    W comes from the eigendecomposition of the scaled Hessian S = D^-1/2 H D^-1/2
    (D = diag H) in float64, W = D^-1/2 V Lambda^-1/2: the scaling takes the
    covariates' units out, so a float32 Hessian whose entries are accurate to their
    own size gives S to float32 precision, whatever H's own condition number. An S
    whose smallest eigenvalue is within d eps of its largest is not resolved: the
    rounding of H could have made it, or made it negative.
    """
    dtype = np.dtype(loc.dtype)
    d = loc.shape[0]
    hess = np.asarray(hess, np.float64)
    hess = 0.5 * (hess + hess.T)
    diag = np.diag(hess)
    if not (np.all(np.isfinite(hess)) and np.all(diag > 0)):
        j = int(np.argmin(np.where(np.isfinite(diag), diag, -np.inf)))
        raise _NotUsable(
            "the Hessian at the mode is not positive definite (diagonal entry "
            f"{j} is {diag[j]:.3g})"
        )
    s = diag**-0.5
    eigval, eigvec = np.linalg.eigh(s[:, None] * hess * s)
    if not eigval[0] > d * np.finfo(dtype).eps * eigval[-1]:
        raise _NotUsable(
            "the Hessian at the mode is not positive definite to "
            f"{dtype.name} precision (smallest eigenvalue of the scaled Hessian "
            f"{eigval[0]:.3g}, largest {eigval[-1]:.3g})"
        )
    w = s[:, None] * eigvec / np.sqrt(eigval)
    ones = np.ones(d, dtype)
    # Cast on the host: a device-side cast compiles a program of its own.
    whitening = Preconditioner(
        "dense", jnp.asarray(loc), jnp.asarray(ones), jnp.asarray(w.astype(dtype))
    )
    return whitening, np.sqrt(np.sum(w**2, axis=1)), eigval[-1] / eigval[0]


def _lowrank_map(objective, loc, info):
    """``(map, sds, condition)``: :func:`~numpyro_sgbd.preconditioning.lowrank`'s
    map; the sds are the conditional ones, 1 / sqrt(H_jj), and the condition number
    is that of the scaled Hessian on the Lanczos space (unit curvature outside it,
    as the map assumes)."""
    diag = np.asarray(info["hessian_diag"], np.float64)
    try:
        whitening = lowrank(loc, diag, lambda vectors: objective.hvp(loc, vectors))
    except ValueError:
        raise _NotUsable(
            "the Hessian at the mode is not positive definite (a diagonal entry or "
            "a Lanczos Ritz value of the scaled Hessian is not positive)"
        ) from None
    theta = (np.asarray(whitening.values, np.float64) + 1.0) ** -2
    condition = max(theta.max(), 1.0) / min(theta.min(), 1.0)
    return whitening, diag**-0.5, condition


# The start of laplace_reason where "auto" kept plain NUTS on a posterior it found
# well conditioned (the advice differs from a fallback after a failure).
_WELL_CONDITIONED = "plain NUTS: the posterior is well conditioned at the mode"


def _laplace_choice(model, model_args, model_kwargs, rng_key, laplace, num_warmup):
    """``(map, form, reason, unravel)``: the Laplace map z = loc + L u to run NUTS
    in (a :class:`~numpyro_sgbd.preconditioning.Preconditioner`, or ``None`` for
    plain NUTS), its form (``"dense"``, ``"lowrank"`` or ``"none"``), why, with the
    measured numbers, and the flat vector's unflattening. ``laplace=True`` raises
    where ``"auto"`` falls back."""
    what = f"reference_posterior(laplace={laplace!r})"
    objective = full_data_objective(model, model_args, model_kwargs, rng_key=rng_key)
    try:
        mode, info = find_mode(objective, what=what)
        check_mode(
            info,
            objective.unravel,
            what,
            "Use laplace=False, or check the model's priors.",
            stacklevel=5,
        )
        d = mode.shape[0]
        if d <= LAPLACE_DENSE_MAX_DIM:
            form, label = "dense", "Laplace sds"
            whitening, sds, condition = _dense_map(
                mode, mode_hessian(objective, mode, info)
            )
        else:
            form, label = "lowrank", "conditional Laplace sds"
            whitening, sds, condition = _lowrank_map(objective, mode, info)
    except ValueError as err:
        if laplace is True:
            if isinstance(err, _NotUsable):
                raise ValueError(
                    f"laplace=True: {err}; the posterior may be improper, or the "
                    "mode search failed. Use laplace=False, or enable float64 for "
                    "ill-conditioned models "
                    "(jax.config.update('jax_enable_x64', True))."
                ) from None
            raise
        return None, "none", f"plain NUTS: {err}", objective.unravel
    # The last slow window of NumPyro's mass adaptation: its shrinkage is what the
    # sampling phase keeps.
    windows = build_adaptation_schedule(num_warmup)[1:-1]
    n = windows[-1].end - windows[-1].start + 1 if windows else 0
    inflation = 5e-3 / (n + 5) / sds.min() ** 2
    ratio = sds.max() / sds.min()
    figures = (
        f"d = {d}, {label} {sds.min():.2g} to {sds.max():.2g} (ratio {ratio:.2g}), "
        f"condition number of the scaled Hessian {condition:.2g}, the mass "
        f"adaptation's shrinkage {inflation:.2g} times the smallest variance"
    )
    if laplace is True:
        return whitening, form, f"laplace=True: {form} ({figures})", objective.unravel
    if (
        ratio > AUTO_SD_RATIO
        or condition > AUTO_CONDITION
        or inflation > AUTO_SHRINKAGE
    ):
        reason = (
            f"NUTS whitened by the {form} Laplace map: the posterior is "
            f"ill-conditioned ({figures}; whitened above {AUTO_SD_RATIO:g}, "
            f"{AUTO_CONDITION:g}, {AUTO_SHRINKAGE:g})"
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
