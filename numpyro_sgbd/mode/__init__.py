"""Full-data posterior modes: one search, used by every caller.

:func:`posterior_mode`, the control-variate centre of ``SGBD(...,
gradient="control_variates")`` and the Laplace-preconditioned reference
(``reference_posterior(..., laplace=True)``) all minimise the model's full-data
potential with :func:`find_mode`: Newton's method with Levenberg-Marquardt damping,
its steps solved by conjugate gradients (Nocedal & Wright 2006, Algorithm 5.2 and
Section 7.1) over the chunked full-data gradient. Nothing of size d x d is formed during
the search: the curvature comes from Hessian-vector products (forward mode over the
chunked gradient), and the Hessian's diagonal is computed once at the end, d products
in blocks. On a hierarchical model (the ridge between a scale and the effects it
multiplies is curved) L-BFGS took over 1,000 iterations to get within 0.1 sd where
Newton-CG took 60 steps.

The model's potential becomes an :class:`~numpyro_sgbd.mode.objective.Objective`
in :mod:`numpyro_sgbd.mode.objective`; the Hessian's rows, diagonal and dense
form are in :mod:`numpyro_sgbd.mode.hessian`. Here what the search found is
checked and reported (:func:`check_mode`, :func:`posterior_mode`,
:func:`search_centre`). The search itself knows nothing of models: it is in
:mod:`numpyro_sgbd.mode.search`, with why it judges convergence by the gradient
and not by the potential's value.
"""

from typing import NamedTuple
import warnings

import jax.numpy as jnp
import numpy as np
from numpyro.infer.util import constrain_fn

from numpyro_sgbd.estimators import as_jax_arrays
from numpyro_sgbd.handlers import full_batch
from numpyro_sgbd.mode.hessian import hessian, mode_hessian
from numpyro_sgbd.mode.objective import (
    LOCAL_SITES_REASON,
    Objective,
    full_data_objective,
    kept_programs,
    local_sites_reason,
    model_local_sites,
    model_plates,
)
from numpyro_sgbd.mode.search import MAX_SECONDS, find_mode, hessian_diagonal
from numpyro_sgbd.validation import check_plate_data

__all__ = [
    "LOCAL_SITES_REASON",
    "Objective",
    "PosteriorMode",
    "check_mode",
    "find_mode",
    "full_data_objective",
    "hessian",
    "hessian_diagonal",
    "kept_programs",
    "local_sites_reason",
    "mode_hessian",
    "model_local_sites",
    "model_plates",
    "posterior_mode",
    "public_info",
    "search_centre",
]


def public_info(info):
    """:func:`find_mode`'s report without its arrays (the Hessian's diagonal, the
    gradient and Hessian at the point) and the flat index ``worst``: what the
    kernels and :func:`posterior_mode` report."""
    private = ("hessian_diag", "worst", "gradient", "hessian")
    return {k: v for k, v in info.items() if k not in private}


def _site_of(index, unravel, d):
    """``"site[j]"`` for the flat index ``index``."""
    marker = np.zeros(d)
    marker[index] = 1.0
    for name, value in unravel(jnp.asarray(marker)).items():
        flat = np.ravel(np.asarray(value))
        if flat.size and flat.max() == 1.0:
            return f"{name}[{int(np.argmax(flat))}]" if flat.size > 1 else name
    return f"coordinate {index}"


def _figure(value, spec, otherwise, prefix=""):
    """``value`` formatted by ``spec`` after ``prefix``, or the words
    ``otherwise`` where it is not finite: no message says "inf" or "nan"."""
    return prefix + format(value, spec) if np.isfinite(value) else otherwise


def check_mode(info, unravel, what, fix, stacklevel=3):
    """Raise or warn as ``info`` from :func:`find_mode` says: a ValueError when the
    search diverged, stopped a posterior sd or more from a mode, or ended where the
    curvature is not positive; a warning when it stopped between 0.1 and 1 sd away.
    ``fix`` ends each message (what the user can do)."""
    diag = info["hessian_diag"]
    d = diag.shape[0]
    numbers = (
        f"{info['iterations']} Newton-CG steps, "
        f"U = {_figure(info['potential'], '.8g', 'not finite')}, g'H^-1g = "
        f"{_figure(info['newton_decrement'], '.3g', 'not finite')}, largest "
        "gradient in curvature units "
        f"{_figure(info['max_scaled_grad'], '.3g', 'unbounded (no curvature)')} at "
        f"{_site_of(info['worst'], unravel, d) if d else '-'}"
    )
    if not (np.isfinite(info["potential"]) and np.isfinite(info["newton_decrement"])):
        raise ValueError(
            f"{what}: the search diverged, the potential falling without reaching "
            f"a mode; the posterior may be improper ({numbers}). {fix}"
        )
    bad = np.flatnonzero(~(diag > 0))
    if bad.size:
        raise ValueError(
            f"{what}: the potential's curvature at the point found is not positive "
            f"at {_site_of(int(bad[0]), unravel, d)} (H_jj = {diag[bad[0]]:.3g}): not "
            f"a mode; the posterior may be improper ({numbers}). {fix}"
        )
    if info["distance"] >= 1:
        raise ValueError(
            f"{what}: the search stopped ({info['stop']}) "
            f"{_figure(info['distance'], '.3g', 'an unbounded number of', 'about ')} "
            f"posterior sds from a mode ({numbers}). {fix}"
        )
    if not info["converged"]:
        warnings.warn(
            f"{what}: the search stopped ({info['stop']}) about "
            f"{info['distance']:.2g} posterior sds from the mode ({numbers}). {fix}",
            UserWarning,
            stacklevel=stacklevel,
        )


def local_sites_hint(names):
    """What to tell a user whose mode search failed on a model with the local
    sites ``names`` (empty: nothing): the joint mode of per-row latents under a
    scale parameter is degenerate (Gelman et al. 2013, *Bayesian Data
    Analysis*, 3rd ed., Chapter 13), and the non-centred form has one."""
    if not names:
        return ""
    quoted = ", ".join(f"'{k}'" for k in names)
    first = names[0]
    return (
        f"The site(s) {quoted} are per-row latents inside the subsample plate: "
        "where a parameter scales them (a random effect eps_i ~ N(0, s)), the "
        "joint density grows without bound as the scale and the effects shrink "
        "together (a funnel), so no joint mode exists. Write them non-centred "
        "(numpyro.handlers.reparam(model, config={"
        f"'{first}': LocScaleReparam(0)}}) from numpyro.infer.reparam), whose "
        "joint mode exists; the kernels need no mode (give step_size=, or "
        "init_params from a short SGBD run). "
    )


class PosteriorMode(NamedTuple):
    """Result of :func:`posterior_mode`."""

    #: The mode, constrained values by site: pass to ``init_to_value(values=...)``.
    params: dict
    #: The diagonal of the Hessian of the full-data potential at the mode, on the
    #: unconstrained scale, by site (shapes of the unconstrained sites).
    hessian_diag: dict
    #: How the search went: ``iterations``, ``num_evaluations``, ``num_hvp``,
    #: ``potential``,
    #: ``newton_decrement``, ``max_scaled_grad``, ``distance``, ``converged``,
    #: ``stop`` and ``seconds`` (see :func:`find_mode`).
    info: dict


def posterior_mode(
    model,
    *model_args,
    rng_key=None,
    max_iter=200,
    max_seconds=MAX_SECONDS,
    chunk_size=4096,
    **model_kwargs,
):
    """The full-data posterior mode, and the potential's curvature there.

    Minimises the potential of ``full_batch(model)`` (every subsample plate widened
    to the full data) on the unconstrained scale by damped Newton-CG from
    NumPyro's
    ``init_to_median``, summing the data in chunks of ``chunk_size`` rows when the
    model has one subsample plate (:func:`find_mode`: no d x d array is formed, so
    thousands of parameters and 10^8 rows are fine). The potential includes the
    Jacobians of the constraining transforms, so this is the mode of the
    unconstrained density, which the kernels sample.

    Convergence is judged by the gradient in posterior-sd units, not by the value:
    the point returned is within 0.1 posterior sd of the mode (a warning says so
    when it is within 1 sd only), or a ValueError gives the numbers.

    Its use is to start and precondition an SG chain. NOGIN with
    ``mass=hessian_diag`` moves in posterior-sd units (a step of 0.1 to 0.5 is then
    reasonable), and must start near the posterior (see :class:`NOGIN`); for SGBD
    and SGLD, ``step_size={site: c / sqrt(h)}`` with ``h = hessian_diag[site]``
    gives every coordinate the step c in its own sd.

    :param model: a NumPyro model (its subsample plates are widened).
    :param model_args, model_kwargs: the model's arguments.
    :param rng_key: for ``init_to_median``'s draws (default ``random.key(0)``).
    :param int max_iter: Newton-CG steps at most.
    :param float max_seconds: the search's wall-clock budget.
    :param int chunk_size: data rows per chunk of the full-data potential.
    :return: :class:`PosteriorMode` ``(params, hessian_diag, info)``.
    :raises ValueError: if the search stops a posterior sd or more from a mode, or
        where a diagonal entry of the Hessian is not positive (not a mode; the
        model may be improper).

    >>> import numpyro, numpyro.distributions as dist
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=numpyro.subsample(y, 0))
    >>> y = jnp.arange(100.0) / 10  # mean 4.95; the prior moves the mode 0.0005
    >>> mode = posterior_mode(model, y, chunk_size=32)
    >>> bool(abs(mode.params["mu"] - 4.95 * 100 / (100 + 0.01)) < 1e-3)
    True
    >>> round(float(mode.hessian_diag["mu"]), 2)  # N / 1 + 1 / 10^2
    100.01
    """
    check_plate_data(model, model_args, model_kwargs)
    objective = full_data_objective(
        model, model_args, model_kwargs, chunk_size=chunk_size, rng_key=rng_key
    )
    mode, info = find_mode(
        objective, max_iter=max_iter, max_seconds=max_seconds, what="posterior_mode"
    )
    check_mode(
        info,
        objective.unravel,
        "posterior_mode",
        local_sites_hint(objective.local)
        + "Raise max_iter or max_seconds, check the model's priors (an improper "
        "posterior has no mode), or enable float64 "
        "(jax.config.update('jax_enable_x64', True)).",
    )
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    widened = full_batch(model)
    params = constrain_fn(widened, model_args, model_kwargs, objective.unravel(mode))
    diag = objective.unravel(jnp.asarray(info["hessian_diag"], mode.dtype))
    return PosteriorMode(params, diag, public_info(info))


def search_centre(model, model_args, model_kwargs, chunk_size):
    """The full-data mode by :func:`~numpyro_sgbd.mode.find_mode` (Newton-CG on the
    chunked potential, from ``init_to_median``): ``(centre, info)``. Raises if the
    search diverged or stopped a posterior sd or more from a mode, warns if it
    stopped closer than that without converging; logs its report."""
    objective = full_data_objective(
        model, model_args, model_kwargs, chunk_size=chunk_size
    )
    x, info = find_mode(objective, what="control variates' centre")
    centre = objective.unravel(x)
    check_mode(
        info,
        objective.unravel,
        "control variates' centre",
        "The estimate stays unbiased, but its noise grows away from the mode: pass "
        "centre={site: value} (e.g. posterior_mode(model, *args).params), or check "
        "the model's priors.",
        stacklevel=6,
    )
    return centre, {"centre": centre, "source": "Newton-CG", **public_info(info)}
