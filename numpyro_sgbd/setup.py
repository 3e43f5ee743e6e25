"""Set-up as a value: what a kernel computes from the model and its data before
compiling (the full-data mode, the preconditioner built there, the control
variates' centre), held in one immutable :class:`Setup`.

Kernels of one model that differ only in the sampler, its hyperparameters or a
plate's subsample size need the same set-up: the full-data mode and gradient do
not depend on those. ``other.use_setup(kernel.setup)`` hands one kernel's set-up
to another, whose ``init`` on the same data then searches for none of it again
(:func:`~numpyro_sgbd.tune` runs every arm on one set-up this way).
"""

import logging
import time
from typing import Any, NamedTuple

import jax
from jax import random
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import local_laplace, preconditioning
from numpyro_sgbd.estimators import MinibatchEstimator, unconstrained_centre
from numpyro_sgbd.estimators.compiled import as_jax_arrays
from numpyro_sgbd.handlers import sample_trace
from numpyro_sgbd.mode import (
    Objective,
    check_mode,
    find_mode,
    full_data_objective,
    hessian,
    mode_hessian,
    public_info,
    search_centre,
)
from numpyro_sgbd.mode.network import fit_network
from numpyro_sgbd.mode.search import hessian_diagonal

__all__ = [
    "Setup",
    "find_centre",
    "find_local_preconditioner",
    "find_network_preconditioner",
    "find_preconditioner",
]

logger = logging.getLogger("numpyro_sgbd")


class Setup(NamedTuple):
    """A kernel's set-up, found by its ``init`` (every field ``None`` before).

    :ivar data: ``(key, arrays)``: which data the mode and preconditioner were
        found on (``init`` on other data searches again); ``None`` after pickling.
    :ivar preconditioner: the
        :class:`~numpyro_sgbd.preconditioning.Preconditioner` ``z = z_hat + L u``.
    :ivar mode: the full-data mode z_hat, unconstrained, by site.
    :ivar mode_value_grad: the full-data potential and its gradient (by site) at
        the mode, from the search's last evaluation.
    :ivar adaptation_info: the mode search's report, L's form, memory and cost
        (a kernel's :attr:`adaptation_info`).
    :ivar centre: ``(key, arrays, (centre, potential, grad))``: the control
        variates' centre with the full-data potential and gradient there, and the
        data they belong to; ``None`` after pickling.
    :ivar centre_info: how the centre was found (a kernel's :attr:`centre_info`).
    :ivar local_rows: with local sites, their rows' Laplace approximations at
        the mode (:class:`~numpyro_sgbd.local_laplace.LocalLaplace`), which the
        chains' rows start from; ``None`` without.
    """

    data: Any = None
    preconditioner: Any = None
    mode: Any = None
    mode_value_grad: Any = None
    adaptation_info: Any = None
    centre: Any = None
    centre_info: Any = None
    local_rows: Any = None

    def for_pickling(self):
        """This set-up without the data it holds references to (``init`` checks
        the data again, and searches again, after unpickling)."""
        return self._replace(data=None, centre=None)


def find_preconditioner(
    model, model_args, model_kwargs, d, form, *, who, chunk_size, last_mode=None
):
    """Find the full-data mode and build L from the Hessian there (before
    compiling): ``(preconditioner, mode, mode_value_grad, info)``, ``info`` with
    the form chosen and why, L's memory, the search's report and what each part
    cost. ``form`` is ``"auto"`` (by d,
    :func:`~numpyro_sgbd.preconditioning.choose_preconditioner`), ``"dense"``,
    ``"lowrank"`` or ``"diagonal"``; ``who`` names the kernel in messages.
    ``last_mode``, the mode found on earlier data of the same shapes (a refit),
    is where the search starts if the potential is lower there than at the
    usual start (:func:`~numpyro_sgbd.mode.search.find_mode`)."""
    form, why = _form(form, d)
    start = time.perf_counter()
    objective = full_data_objective(
        model, model_args, model_kwargs, chunk_size=chunk_size
    )
    mode, info = _searched(objective, who, last_mode)
    searched = time.perf_counter()
    pre = _built(form, objective, mode, info)
    # U and grad U at the mode, from the search's last evaluation: the control
    # variates' centre is this mode, and needs no pass of its own.
    value_grad = (
        jnp.asarray(info["potential"], mode.dtype),
        objective.unravel(jnp.asarray(info["gradient"], mode.dtype)),
    )
    report = _report(who, form, why, pre, info, start, searched)
    return pre, objective.unravel(mode), value_grad, report


def find_local_preconditioner(
    model, model_args, model_kwargs, facts, form, *, who, chunk_size, last_mode=None
):
    """:func:`find_preconditioner` for a model with local sites
    (:mod:`~numpyro_sgbd.local_laplace`): the mode of the global sites' marginal
    with each row's local sites integrated out by Laplace's method, and L from
    the Hessian there of their conditional with the rows drawn from their
    Laplace approximations. ``facts``: the model's ``(plates, enumerate_dim,
    local)``. Returns ``(preconditioner, mode, mode_value_grad, info,
    rows)``, ``rows`` the rows' :class:`~numpyro_sgbd.local_laplace.LocalLaplace`
    (the chains start from draws of it); the mode and its gradient are the
    global sites'."""
    plates, enumerate_dim, sites = facts
    ((name, (size, n, _)),) = plates.items()
    estimator = MinibatchEstimator(
        model, {name: (size, n, None)}, enumerate_dim=enumerate_dim, local=sites
    )
    args, kwargs = as_jax_arrays((model_args, model_kwargs))
    start = time.perf_counter()
    x0, unravel, value_and_grad, value_grad_hvp, laplace = (
        local_laplace.marginal_objective(
            estimator, sites, model, args, kwargs, chunk_size
        )
    )
    d = x0.shape[0]
    form, why = _form(form, d)
    marginal = Objective(
        x0,
        unravel,
        value_and_grad,
        lambda x, v: value_grad_hvp(x, v)[2],
        size,
        value_grad_hvp,
    )
    mode, info = _searched(marginal, who, last_mode)
    searched = time.perf_counter()
    rows = local_laplace.row_laplace(*laplace(mode))
    drawn = local_laplace.draw_rows(random.key(0), rows, sites)
    run, arrays = estimator.full_data_parts(args, kwargs, chunk_size)
    cond_value_and_grad, cond_hvp = local_laplace.conditional_objective(
        run, arrays, unravel, drawn
    )
    conditional = Objective(mode, unravel, cond_value_and_grad, cond_hvp, size)
    if form == "dense":  # d products once: the matrix, and its diagonal
        full = hessian(cond_hvp, mode)
        found = {"hessian": full, "hessian_diag": np.diag(full)}
    else:
        found = {"hessian_diag": np.asarray(hessian_diagonal(cond_hvp, mode))}
    pre = _built(form, conditional, mode, found)
    value, grad = cond_value_and_grad(mode)
    report = _report(who, form, why, pre, info, start, searched)
    report["local_sites"] = "Laplace-marginal mode; conditional curvature at a draw"
    return pre, unravel(mode), (value, unravel(grad)), report, rows


def find_network_preconditioner(
    model, model_args, model_kwargs, facts, *, who, chunk_size, last_mode=None
):
    """:func:`find_preconditioner` for a model that builds a neural network with
    ``numpyro.contrib.module`` (``preconditioner="auto"`` or ``"diagonal"``):
    the start is a MAP fit by Adam on minibatch gradients and L is diagonal,
    from the empirical Fisher information there plus the prior's curvature
    (:func:`~numpyro_sgbd.mode.network.fit_network`): no Newton-CG search, whose
    mode and Hessian a network's non-convex potential does not give. ``facts``:
    the model's ``(plates, modules)``; ``last_mode``, a refit's last fit, where
    Adam starts instead of a prior draw. Returns ``(preconditioner, mode,
    mode_value_grad, info)``, the mode being the fit's end and its potential and
    gradient one full-data pass."""
    plates, modules = facts
    start = time.perf_counter()
    objective = full_data_objective(
        model, model_args, model_kwargs, chunk_size=chunk_size
    )
    args, kwargs = as_jax_arrays((model_args, model_kwargs))
    last = _flat_last_mode(objective, last_mode)
    fit = fit_network(model, args, kwargs, plates, objective, modules, start=last)
    value, grad = objective.value_and_grad(fit.x)
    searched = time.perf_counter()
    pre = preconditioning.diagonal(fit.x, fit.curvature)
    info = {
        "method": "adam",
        "steps": fit.steps,
        "potential": float(value),
        "gradient_norm": float(jnp.linalg.norm(grad)),
        "floored": fit.floored,
    }
    why = (
        f"a network ({', '.join(modules)}): Adam's MAP fit and the Fisher "
        "information's diagonal there"
    )
    report = _report(who, "diagonal", why, pre, info, start, searched)
    value_grad = (jnp.asarray(value, fit.x.dtype), objective.unravel(grad))
    return pre, objective.unravel(fit.x), value_grad, report


def _form(form, d):
    """``(form, why)``: the preconditioner's form, chosen by d for ``"auto"``,
    checked for memory where dense."""
    why = "as given"
    if form == "auto":
        form, why = preconditioning.choose_preconditioner(d)
    if form == "dense":
        preconditioning.check_dense(d)
    return form, why


def _searched(objective, who, last_mode):
    """The mode of ``objective`` and the search's report, checked."""
    what = f"{who}'s start and preconditioner"
    # A refit's data are often like the last (folds, a bootstrap): its search
    # then ends in a few steps. A simulation's may not: the usual start is kept
    # where the potential is lower there.
    mode, info = find_mode(
        objective, what=what, last_mode=_flat_last_mode(objective, last_mode)
    )
    check_mode(
        info,
        objective.unravel,
        what,
        "Pass init_params and a step_size (without a preconditioner), or "
        "check the model's priors.",
        stacklevel=9,
    )
    return mode, info


def _built(form, objective, mode, info):
    """L of ``form`` from the Hessian of ``objective`` at ``mode``."""
    if form == "dense":
        return preconditioning.dense(mode, mode_hessian(objective, mode, info))
    if form == "lowrank":
        return preconditioning.lowrank(
            mode, info["hessian_diag"], lambda v: objective.hvp(mode, v)
        )
    return preconditioning.diagonal(mode, info["hessian_diag"])


def _report(who, form, why, pre, info, start, searched):
    """The set-up's report (its ``adaptation_info``), logged."""
    seconds = time.perf_counter() - start
    logger.info(
        "%s: preconditioner=%r (%s), %.1f MiB, mode search %.2f s, L %.2f s.",
        who,
        form,
        why,
        pre.nbytes / 2**20,
        searched - start,
        seconds - (searched - start),
    )
    return {
        "preconditioner": form,
        "why": why,
        "preconditioner_bytes": pre.nbytes,
        "mode_seconds": searched - start,
        "preconditioner_seconds": seconds - (searched - start),
        "seconds": seconds,
        "mode_search": public_info(info),
    }


def _flat_last_mode(objective, last_mode):
    """``last_mode`` (unconstrained, by site) as a flat float64 NumPy point in
    the objective's order, or ``None`` where it has another structure or other
    shapes (the search then starts where it always does). On the host: nothing
    is compiled for it (``eval_shape`` gives the objective's structure)."""
    if last_mode is None:
        return None
    sites = jax.eval_shape(objective.unravel, objective.x0)
    if jax.tree.structure(last_mode) != jax.tree.structure(sites):
        return None
    leaves = jax.tree.leaves(last_mode)
    if any(jnp.shape(a) != b.shape for a, b in zip(leaves, jax.tree.leaves(sites))):
        return None
    return np.concatenate(
        [np.ravel(np.asarray(a, np.float64)) for a in leaves] or [np.zeros(0)]
    )


def find_centre(
    setup, plain, model, model_args, model_kwargs, shapes, given, chunk_size
):
    """``(centre, potential, grad, centre_info)``: the control variates' centre
    (unconstrained, by site) with the full-data potential and gradient there.

    The centre is ``given`` (constrained values by site), else the set-up's mode
    (whose potential and gradient the search already evaluated), else found by
    :func:`~numpyro_sgbd.mode.search_centre`. ``plain`` is the minibatch
    estimator (its full-data pass and its pull-back of gradients into u)."""

    def full(centre):  # a pass over the data at the centre, compiled
        return plain.full_data_fn(model_args, model_kwargs, chunk_size=chunk_size)(
            centre
        )

    if given is not None:
        # A concrete trace: the sites' supports, which may hold arrays.
        trace = sample_trace(model, model_args, model_kwargs)
        centre = unconstrained_centre(given, trace, shapes)
        start = time.perf_counter()
        potential, grad = full(centre)
        info = {
            "centre": centre,
            "source": "given",
            "seconds": time.perf_counter() - start,
        }
        return centre, potential, grad, info
    if setup.mode is not None:  # found for the preconditioner
        info = {
            "centre": setup.mode,
            "source": _mode_source(setup),
            **setup.adaptation_info["mode_search"],
        }
        potential, grad = setup.mode_value_grad
        return setup.mode, potential, plain.pull(grad)[0], info
    centre, info = search_centre(model, model_args, model_kwargs, chunk_size)
    potential, grad = full(centre)
    return centre, potential, grad, info


def _mode_source(setup):
    """How the set-up's mode was found, for the centre's report."""
    method = setup.adaptation_info["mode_search"].get("method")
    return "Adam (a network's MAP fit)" if method == "adam" else "Newton-CG"


def dimension(shapes):
    """The number of unconstrained coordinates of latent sites of ``shapes``."""
    return sum(int(np.prod(shape)) for shape in shapes.values())
