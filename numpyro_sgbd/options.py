"""The arguments every SG kernel shares, checked once at construction, before
anything is traced or compiled: :func:`kernel_options` resolves the defaults that
depend on other arguments (``step_size=None`` turns on the preconditioner, the
control variates and, for SGBD, the scale windows) and raises a clear error
naming the argument and the fix.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import preconditioning
from numpyro_sgbd.validation import check_real, check_step_size

__all__ = [
    "GRADIENTS",
    "KernelOptions",
    "check_noise_options",
    "kernel_options",
]


def _check_positive(value, where):
    check_real(value, where)
    arr = np.asarray(value, dtype=float)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or not np.all(arr > 0):
        raise ValueError(f"{where} must be positive and finite, got {value!r}.")
    return arr


def _check_positive_tree(value, name):
    if isinstance(value, dict):
        for site, v in value.items():
            _check_positive(v, f"{name}[{site!r}]")
    else:
        _check_positive(value, name)


#: Gradient estimators of the SG kernels' ``gradient`` argument.
GRADIENTS = ("minibatch", "control_variates")


def _positive_int(value):
    """Whether ``value`` is a positive Python or NumPy int (not a bool)."""
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, bool)
        and value > 0
    )


def _per_site(value, shapes, name):
    """A hyperparameter (``step_size``, ``mass``) as a pytree matching z, validated
    against z's shapes: a scalar stays a scalar array; a dict names every site."""
    if not isinstance(value, dict):
        arr = jnp.asarray(value, jnp.result_type(float))
        if isinstance(shapes, dict):
            if arr.ndim:
                raise ValueError(
                    f"{name} has shape {arr.shape}, but z is a dict of sites "
                    f"{sorted(shapes)}: give a scalar, or a dict "
                    "{site name: value} for per-coordinate values."
                )
            return arr
        try:
            np.broadcast_shapes(arr.shape, shapes)
        except ValueError:
            raise ValueError(
                f"{name} has shape {arr.shape}, which does not broadcast to "
                f"the shape {shapes} of z."
            ) from None
        return arr
    if not isinstance(shapes, dict):
        raise ValueError(
            f"{name} is a dict, but z is not a dict of sites; give a scalar or "
            "an array broadcastable to z."
        )
    unknown = sorted(set(value) - set(shapes))
    missing = sorted(set(shapes) - set(value))
    if unknown or missing:
        raise ValueError(
            f"{name} dict must name every latent site exactly: "
            + (f"unknown {unknown}; " if unknown else "")
            + (f"missing {missing}; " if missing else "")
            + f"the sites are {sorted(shapes)}."
        )
    out = {}
    for site, shape in shapes.items():
        arr = jnp.asarray(value[site], jnp.result_type(float))
        try:
            out[site] = jnp.broadcast_to(arr, shape)
        except ValueError:
            raise ValueError(
                f"{name}[{site!r}] has shape {arr.shape}, which does not "
                f"broadcast to the site's unconstrained shape {shape}."
            ) from None
    return out


class KernelOptions(NamedTuple):
    """The shared arguments once their defaults are resolved (see
    :func:`kernel_options`)."""

    #: ``"auto"``, ``"none"`` or a form of :data:`~numpyro_sgbd.preconditioning.FORMS`.
    preconditioner: str
    #: Whether the scale windows re-estimate u's scales in warmup.
    adapt_mass: bool
    #: ``"auto"`` (decided once the plates are known), ``"minibatch"`` or
    #: ``"control_variates"``.
    gradient: str
    #: Warmup steps between re-centrings of the control variates, or ``None``.
    recentre_every: Any
    #: SG steps per sample.
    num_steps: int


def kernel_options(
    *,
    model,
    potential_fn,
    gradient_fn,
    step_size,
    replace,
    log_likelihood_size,
    gradient,
    centre,
    chunk_size,
    recentre_every,
    preconditioner,
    adapt_mass_matrix,
    num_steps,
    scale_bounded,
):
    """Check the arguments the SG kernels share and resolve their defaults:
    a :class:`KernelOptions`. ``scale_bounded`` says whether the kernel bounds
    the scales it re-estimates (SGLD, NOGIN: the windows are then off by
    default); the other arguments are the constructors' own."""
    sources = [s for s in (model, potential_fn, gradient_fn) if s is not None]
    if len(sources) != 1:
        raise ValueError(
            "Give exactly one of model, potential_fn or gradient_fn "
            f"(got {len(sources)})."
        )
    preconditioner, adapt_mass_matrix = _preconditioner_options(
        model, step_size, preconditioner, adapt_mass_matrix, scale_bounded
    )
    if log_likelihood_size is not None and not _positive_int(log_likelihood_size):
        raise ValueError(
            "log_likelihood_size must be a positive int (the rows of each "
            "subsample plate that the kernel's model, and so ArviZ's "
            "log_likelihood, holds; at least N for every row) or None (every row "
            f"up to 50,000), got {log_likelihood_size!r}."
        )
    gradient, recentre_every = _gradient_options(
        model, step_size, gradient, replace, centre, recentre_every
    )
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
    if not _positive_int(num_steps):
        raise ValueError(
            "num_steps must be a positive int (SG steps per sample, run in one "
            "compiled loop; 1, the default, is one step per sample as NumPyro's "
            f"kernels take), got {num_steps!r}."
        )
    return KernelOptions(
        preconditioner,
        bool(adapt_mass_matrix),
        gradient,
        recentre_every,
        int(num_steps),
    )


def _preconditioner_options(
    model, step_size, preconditioner, adapt_mass_matrix, scale_bounded
):
    """``(preconditioner, adapt_mass_matrix)`` resolved and checked against the
    step size and the source (see :func:`kernel_options`)."""
    allowed = (None, "auto", "none") + preconditioning.FORMS
    if preconditioner not in allowed:
        raise ValueError(
            f"preconditioner must be one of {allowed}, got {preconditioner!r}."
        )
    if preconditioner is None:
        preconditioner = "auto" if step_size is None else "none"
    if adapt_mass_matrix is None:
        adapt_mass_matrix = step_size is None and not scale_bounded
    if not isinstance(adapt_mass_matrix, (bool, np.bool_)):
        raise ValueError(
            "adapt_mass_matrix must be True, False or None (the kernel's "
            f"default), got {adapt_mass_matrix!r}."
        )
    if step_size is None:
        if model is None:
            raise ValueError(
                "step_size is required with potential_fn or gradient_fn: "
                "step_size=None adapts the step in the coordinates of the "
                "model's full-data Hessian at its mode, which needs a model. "
                "Give a positive scalar, or a dict {site name: positive value}."
            )
        if preconditioner == "none":
            raise ValueError(
                "step_size=None adapts the step in the whitened coordinates of "
                "a preconditioner; with preconditioner='none' give step_size."
            )
    else:
        check_step_size(step_size)
        _check_positive_tree(step_size, "step_size")
    if adapt_mass_matrix and preconditioner == "none":
        raise ValueError(
            "adapt_mass_matrix re-estimates the scales of the whitened "
            "coordinates u = L^-1 (z - mode) from warmup draws, so it needs a "
            "preconditioner: use step_size=None, or pass preconditioner= "
            "('dense', 'lowrank' or 'diagonal'), or adapt_mass_matrix=False."
        )
    if preconditioner != "none" and model is None:
        raise ValueError(
            f"preconditioner={preconditioner!r} comes from the model's full-data "
            "Hessian at its mode: it needs a model (with potential_fn or "
            "gradient_fn use preconditioner='none')."
        )
    if preconditioner != "none" and isinstance(step_size, dict):
        raise ValueError(
            "with a preconditioner step_size is in the whitened coordinates u, "
            "which have no sites: give a positive scalar (about 0.5), or "
            "step_size=None to adapt it."
        )
    return preconditioner, adapt_mass_matrix


def _gradient_options(model, step_size, gradient, replace, centre, recentre_every):
    """``(gradient, recentre_every)`` resolved and checked, with ``replace`` and
    ``centre`` (see :func:`kernel_options`)."""
    if gradient is not None and gradient not in GRADIENTS:
        raise ValueError(
            f"gradient must be one of {GRADIENTS} or None, got {gradient!r}."
        )
    if gradient is None:
        # Adapting: control variates around the mode the adaptation finds
        # anyway, where the model allows them (resolved by `_build`).
        gradient = "auto" if step_size is None else "minibatch"
    if replace is not None and not isinstance(replace, (bool, np.bool_)):
        raise ValueError(
            "replace must be True (with replacement), False (without) or None "
            f"(choose by n/N), got {replace!r}."
        )
    if gradient == "control_variates" and model is None:
        raise ValueError(
            "gradient='control_variates' needs a model (its per-datum terms and "
            "full-data gradient); with potential_fn or gradient_fn build the "
            "control variates into the function you pass."
        )
    if centre is not None and gradient == "minibatch":
        raise ValueError(
            "centre is the control variates' centre: pass "
            "gradient='control_variates' with it."
        )
    if centre is not None and not isinstance(centre, dict):
        raise ValueError(
            "centre must be a dict {site: constrained value} (as "
            f"mcmc.get_samples() or posterior_mode(...).params give), got "
            f"{type(centre).__name__}."
        )
    if recentre_every is not None:
        if gradient == "minibatch":
            raise ValueError(
                "recentre_every moves the control variates' centre: pass "
                "gradient='control_variates' with it."
            )
        if not _positive_int(recentre_every):
            raise ValueError(
                "recentre_every must be a positive int (warmup steps between "
                f"re-centrings), got {recentre_every!r}."
            )
        recentre_every = int(recentre_every)
    return gradient, recentre_every


def check_noise_options(beta, init_noise_sd):
    """Check the options of the noise estimate of the family kernels: the moving
    average's rate ``beta`` in (0, 1) and the initial noise sd (``None``, or
    non-negative and finite, a scalar or a dict of sites)."""
    if not (isinstance(beta, (int, float)) and 0 < beta < 1):
        raise ValueError(f"beta must be a number in (0, 1), got {beta!r}.")
    if init_noise_sd is None:
        return
    leaves = jax.tree.leaves(init_noise_sd)
    for leaf in leaves:
        check_real(leaf, "init_noise_sd", "a non-negative number (or dict)")
    if not leaves or not all(
        np.all(np.isfinite(np.asarray(x, float))) and np.all(np.asarray(x, float) >= 0)
        for x in leaves
    ):
        raise ValueError(
            "init_noise_sd must be non-negative and finite (a scalar or a "
            f"dict of sites), got {init_noise_sd!r}."
        )
