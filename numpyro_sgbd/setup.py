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
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import preconditioning
from numpyro_sgbd.estimators import unconstrained_centre
from numpyro_sgbd.estimators.minibatch import pulled
from numpyro_sgbd.handlers import sample_trace
from numpyro_sgbd.modes import (
    check_mode,
    find_mode,
    full_data_objective,
    mode_hessian,
    public_info,
    search_centre,
)

__all__ = ["Setup", "find_centre", "find_preconditioner"]

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
    """

    data: Any = None
    preconditioner: Any = None
    mode: Any = None
    mode_value_grad: Any = None
    adaptation_info: Any = None
    centre: Any = None
    centre_info: Any = None

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
    usual start (:func:`~numpyro_sgbd.mode_search.find_mode`)."""
    why = "as given"
    if form == "auto":
        form, why = preconditioning.choose_preconditioner(d)
    if form == "dense":
        preconditioning.check_dense(d)
    start = time.perf_counter()
    objective = full_data_objective(
        model, model_args, model_kwargs, chunk_size=chunk_size
    )
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
        stacklevel=8,
    )
    searched = time.perf_counter()
    if form == "dense":
        pre = preconditioning.dense(mode, mode_hessian(objective, mode, info))
    elif form == "lowrank":
        pre = preconditioning.lowrank(
            mode, info["hessian_diag"], lambda v: objective.hvp(mode, v)
        )
    else:
        pre = preconditioning.diagonal(mode, info["hessian_diag"])
    seconds = time.perf_counter() - start
    # U and grad U at the mode, from the search's last evaluation: the control
    # variates' centre is this mode, and needs no pass of its own.
    value_grad = (
        jnp.asarray(info["potential"], mode.dtype),
        objective.unravel(jnp.asarray(info["gradient"], mode.dtype)),
    )
    report = {
        "preconditioner": form,
        "why": why,
        "preconditioner_bytes": pre.nbytes,
        "mode_seconds": searched - start,
        "preconditioner_seconds": seconds - (searched - start),
        "seconds": seconds,
        "mode_search": public_info(info),
    }
    logger.info(
        "%s: preconditioner=%r (%s), %.1f MiB, mode search %.2f s, L %.2f s.",
        who,
        form,
        why,
        pre.nbytes / 2**20,
        searched - start,
        seconds - (searched - start),
    )
    return pre, objective.unravel(mode), value_grad, report


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
    :func:`~numpyro_sgbd.modes.search_centre`. ``plain`` is the minibatch
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
            "source": "Newton-CG",
            **setup.adaptation_info["mode_search"],
        }
        potential, grad = setup.mode_value_grad
        return setup.mode, potential, pulled(plain, grad)[0], info
    centre, info = search_centre(model, model_args, model_kwargs, chunk_size)
    potential, grad = full(centre)
    return centre, potential, grad, info


def dimension(shapes):
    """The number of unconstrained coordinates of latent sites of ``shapes``."""
    return sum(int(np.prod(shape)) for shape in shapes.values())
