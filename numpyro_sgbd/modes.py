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

Why these choices, for 10^4-10^8 rows in float32: the potential is a sum of N terms,
so its float32 value carries an absolute rounding error of about ``eps * |U|``, which
for large N exceeds the decrease a step near the mode can make (a step that moves
0.1 sd lowers U by about 0.005). A search that compares values, as a damped Newton
loop does, stalls far from the mode. The gradient's rounding error, measured in
posterior sds, stays near ``eps * sqrt(N)``, so convergence is judged by the
gradient: the squared Newton decrement ``g' H^-1 g`` (from the CG solution), about
the squared distance to the mode in posterior sds, and, at the end, the
gradient of each coordinate in its own curvature units ``|g_j| / sqrt(H_jj)``.
"""

import logging
import time
from typing import Callable, NamedTuple
import warnings

import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
from numpyro.infer.util import constrain_fn, potential_energy

from numpyro_sgbd.estimators import (
    MinibatchEstimator,
    as_jax_arrays,
    median_start,
    split_arrays,
)
from numpyro_sgbd.handlers import (
    SubsamplePlates,
    full_batch,
    sample_trace,
    subsample_plates,
)
from numpyro_sgbd.sharding import data_sharding

__all__ = [
    "Objective",
    "PosteriorMode",
    "find_mode",
    "full_data_objective",
    "hessian_diagonal",
    "posterior_mode",
    "search_centre",
]

_log = logging.getLogger("numpyro_sgbd")

#: A search is converged when the squared Newton decrement g' H^-1 g (about the
#: squared distance to the mode in posterior sds) is below this.
TOLERANCE = 1e-4
#: Where it stops otherwise (iterations spent, or no step improves), a point this
#: close (0.1 sd) is at the float precision of the gradient: accepted, silently.
CLOSE = 1e-2
_LOG_EVERY_S = 5.0
#: The search's default wall-clock budget in seconds: where it is spent, the search
#: stops with ``stop = "time budget"`` and the caller raises or warns with the numbers.
MAX_SECONDS = 600.0
# Times the search goes on with a new diagonal preconditioner (d Hessian-vector
# products each) when the exact diagonal says it stopped short.
_REFRESHES = 3
# Below this damping (relative to unit curvature in the scaled coordinates) a
# solved step is tested for convergence.
_NEWTON_DAMPING = 1e-2
# Up to this many parameters the scaling is the exact Hessian diagonal, renewed
# every step; above, Hutchinson's estimate, renewed every ten steps.
_EXACT_BELOW = 64


class Objective(NamedTuple):
    """A model's full-data potential as functions of a flat unconstrained vector."""

    #: NumPyro's ``init_to_median`` point, flattened (``ravel_pytree`` order).
    x0: jax.Array
    #: The inverse of the flattening: a dict of unconstrained values by site.
    unravel: Callable
    #: ``x -> (U(x), grad U(x))``, compiled, the data passed as arguments.
    value_and_grad: Callable
    #: ``(x, V) -> H(x) V^T`` rows: one Hessian-vector product per row of ``V``
    #: (shape ``(k, d)``), forward mode over the (chunked) gradient.
    hvp: Callable
    #: Rows in the chunked plate, or ``None`` where the potential is one pass.
    num_data: int = None
    #: ``(x, V) -> (U(x), grad U(x), H(x) V^T rows)`` in one pass, the program
    #: ``hvp`` runs (``None``: the search calls ``value_and_grad`` and ``hvp``).
    value_grad_hvp: Callable = None


def _subsample_plates(model, model_args, model_kwargs):
    """``{name: (size, subsample_size)}`` of the plates that subsample, from an
    abstract trace (:func:`jax.eval_shape`: op by op, it compiled some twenty
    one-operation programs)."""
    found = {}

    def trace():  # only the static plate sizes leave
        found.update(
            subsample_plates(
                sample_trace(SubsamplePlates(model), model_args, model_kwargs)
            )
        )

    jax.eval_shape(trace)
    return found


def full_data_objective(
    model, model_args=(), model_kwargs=None, *, chunk_size=4096, rng_key=None
):
    """The full-data potential of ``model`` (its subsample plates widened) as an
    :class:`Objective`.

    With one subsample plate the potential and its gradient are summed over the data
    in chunks of ``chunk_size`` rows (memory O(chunk_size x d), see
    :meth:`~numpyro_sgbd.estimators.MinibatchEstimator.full_data`); with none or
    several, ``full_batch(model)`` is evaluated in one pass.

    :param model: a NumPyro model.
    :param tuple model_args: its positional arguments.
    :param dict model_kwargs: its keyword arguments.
    :param int chunk_size: rows per chunk.
    :param rng_key: for ``init_to_median``'s draws (default ``random.key(0)``).
    """
    if not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}.")
    model_kwargs = {} if model_kwargs is None else model_kwargs
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    arrays, rebuild, _ = split_arrays((model_args, model_kwargs))
    plates = _subsample_plates(model, model_args, model_kwargs)
    widened = full_batch(model)
    x0, unravel = ravel_pytree(median_start(widened, arrays, rebuild, rng_key))
    if len(plates) == 1:
        ((name, (size, n)),) = plates.items()
        estimator = MinibatchEstimator(
            model,
            {name: (size, n, None)},
            sharding=data_sharding({name: (size, n, None)}, model_args, model_kwargs),
        )
        run, arrays = estimator.full_data_parts(model_args, model_kwargs, chunk_size)

        def flat_value_and_grad(x, arrays):
            value, grad = run(unravel(x), arrays)
            return value, ravel_pytree(grad)[0]

        num_data = size
    else:

        def flat_value_and_grad(x, arrays):
            args, kwargs = rebuild(arrays)

            def potential(x):
                return potential_energy(widened, args, kwargs, unravel(x))

            return jax.value_and_grad(potential)(x)

        num_data = None

    value_and_grad = jax.jit(flat_value_and_grad)

    @jax.jit
    def value_grad_hvp(x, vectors, arrays):
        # The primal (U, grad U) does not depend on v: computed once, unbatched.
        def one(v):
            return jax.jvp(lambda x: flat_value_and_grad(x, arrays), (x,), (v,))

        (value, grad), (_, products) = jax.vmap(one, out_axes=((None, None), 0))(
            vectors
        )
        return value, grad, products

    return Objective(
        x0,
        unravel,
        lambda x: value_and_grad(x, arrays),
        lambda x, vectors: value_grad_hvp(x, vectors, arrays)[2],
        num_data,
        lambda x, vectors: value_grad_hvp(x, vectors, arrays),
    )


def public_info(info):
    """:func:`find_mode`'s report without its arrays (the Hessian's diagonal, the
    gradient and Hessian at the point) and the flat index ``worst``: what the
    kernels and :func:`posterior_mode` report."""
    private = ("hessian_diag", "worst", "gradient", "hessian")
    return {k: v for k, v in info.items() if k not in private}


def mode_hessian(objective, x, info):
    """The symmetrised Hessian at ``find_mode``'s point ``x``: the one the search
    formed there (up to 64 parameters), else d Hessian-vector products."""
    if info.get("hessian") is not None:
        return info["hessian"]
    return hessian(objective.hvp, x)


def _hessian_rows(hvp, x, *, block=64):
    """Yields ``(start, rows)``: rows ``start..start+b`` of the Hessian at ``x``, b
    Hessian-vector products at a time (the last block padded with zero rows, so
    one compilation serves every block)."""
    d = x.shape[0]
    block = max(1, min(block, d))
    for start in range(0, d, block):
        stop = min(start + block, d)
        basis = np.zeros((block, d), np.dtype(x.dtype))
        basis[np.arange(stop - start), np.arange(start, stop)] = 1.0
        rows = np.asarray(hvp(x, jnp.asarray(basis)), np.float64)
        yield start, rows[: stop - start]


def hessian_diagonal(hvp, x, *, block=64):
    """The Hessian's diagonal at ``x`` from ``d`` Hessian-vector products, ``block``
    at a time: memory O(block x d), never d x d.

    :param hvp: ``(x, V) -> rows H v`` as :attr:`Objective.hvp`.
    :param x: the flat point.
    :return: a float64 NumPy array of length d.

    >>> import jax, jax.numpy as jnp
    >>> grad = jax.grad(lambda x: 0.5 * jnp.sum(jnp.arange(3.0) * x**2))
    >>> def hvp(x, vectors):  # H = diag(0, 1, 2)
    ...     return jax.vmap(lambda v: jax.jvp(grad, (x,), (v,))[1])(vectors)
    >>> hessian_diagonal(hvp, jnp.ones(3), block=2).tolist()
    [0.0, 1.0, 2.0]
    """
    diag = np.empty(x.shape[0])
    for start, rows in _hessian_rows(hvp, x, block=block):
        diag[start : start + rows.shape[0]] = rows[
            np.arange(rows.shape[0]), start + np.arange(rows.shape[0])
        ]
    return diag


def hessian(hvp, x, *, block=64):
    """The full d x d Hessian at ``x`` (symmetrised), d Hessian-vector products
    ``block`` at a time. For the Laplace map of a reference, not for the search."""
    d = x.shape[0]
    out = np.empty((d, d))
    for start, rows in _hessian_rows(hvp, x, block=block):
        out[start : start + rows.shape[0]] = rows
    return _symmetric(out)


def _symmetric(rows):
    """The symmetric part of a square matrix of Hessian rows."""
    return 0.5 * (rows + rows.T)


def _curvature_estimate(hvp, x, *, probes=16, seed=0):
    """A positive diagonal preconditioner: Hutchinson's estimate E[v * Hv] of the
    Hessian's diagonal with ``probes`` Rademacher vectors (its error only slows the
    search)."""
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(probes, x.shape[0]))
    rows = np.asarray(hvp(x, jnp.asarray(signs, x.dtype)), np.float64)
    return _positive_diagonal(np.mean(signs * rows, axis=0))


def _positive_diagonal(diag):
    """``|diag|`` raised to 1e-8 times its largest entry, with entries that are
    zero or not finite set to the median of the others (all ones where none is
    finite and positive)."""
    diag = np.abs(diag)
    ok = np.isfinite(diag) & (diag > 0)
    if not np.any(ok):
        return np.ones_like(diag)
    floor = 1e-8 * np.max(diag[ok])
    return np.where(ok, np.maximum(diag, floor), np.median(diag[ok]))


def _damped_cg(hvp, grad, damping, max_cg):
    """Solve ``(H + damping I) p = -grad`` by conjugate gradients (Nocedal & Wright
    2006, Algorithm 5.2), to the relative residual ``min(0.1, sqrt(|g|))`` (their
    eq. 7.3 with 0.1 for 0.5: a looser solve made steps little better than the
    gradient's on badly scaled starts). Returns ``(p, residual, status)``: ``status`` is
    ``"solved"``, ``"max_cg"`` (p is still a descent direction) or ``"negative"``
    when a direction of non-positive curvature of ``H + damping I`` was met."""
    g_norm = np.sqrt(grad @ grad)
    tol = min(0.1, np.sqrt(g_norm)) * g_norm
    p, r = np.zeros_like(grad), grad.copy()
    direction = -r
    # Overflow (a far start's huge curvatures) shows as a non-finite curvature,
    # which ends the solve: NumPy need not warn about it.
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(max_cg):
            hd = hvp(direction) + damping * direction
            curvature = direction @ hd
            if not (np.isfinite(curvature) and curvature > 0):
                return p, r, "negative"
            alpha = (r @ r) / curvature
            p, r_new = p + alpha * direction, r + alpha * hd
            if np.sqrt(r_new @ r_new) <= tol:
                return p, r_new, "solved"
            direction = -r_new + ((r_new @ r_new) / (r @ r)) * direction
            r = r_new
    return p, r, "max_cg"


def find_mode(
    objective,
    *,
    max_iter=200,
    max_cg=250,
    tol=TOLERANCE,
    max_seconds=MAX_SECONDS,
    what="mode",
):
    """Minimise ``objective``'s potential from its start by damped Newton-CG: above
    64 parameters no d x d array is formed.

    Each step solves ``(H + damping I) p = -g`` by conjugate gradients on
    Hessian-vector products (Nocedal & Wright 2006, Algorithm 5.2), in coordinates
    scaled by the Hessian's diagonal, so that a unit is about a posterior sd. Up to
    64 parameters the Hessian itself is formed with every evaluation (d products
    in the same pass over the data), its diagonal is the scaling and CG
    multiplies by it on the host; above, each CG product is a pass of its own
    and the scaling is Hutchinson's estimate from 16 products, renewed every ten
    steps. The damping follows Levenberg-Marquardt's rule on the ratio of actual
    to predicted decrease (their Section 10.3 with the test of Algorithm 4.1);
    near the mode, where float32 cannot resolve a step's decrease in the
    potential, the actual decrease is taken from the gradients by the
    trapezoidal rule. Where CG meets non-positive or non-finite curvature before
    any progress, the step is steepest descent instead (their Algorithm 7.1),
    tested by the same ratio; a trial point whose value, gradient or (up to 64
    parameters) Hessian is not finite is rejected. Every pass counts as a step.
    It stops when an undamped CG solve
    gives a squared Newton decrement ``g' H^-1 g`` and squared scaled gradients
    below ``tol``, after ``max_iter`` steps, after ``max_seconds``, or when the
    damping runs away. Then it
    takes the Hessian's diagonal at the point (d Hessian-vector products) and the
    largest gradient in curvature units ``max_j |g_j| / sqrt(H_jj)``; if that says
    the point is not yet within 0.1 sd, it goes on with that diagonal as the scaling
    (at most three times). Reports progress through the ``numpyro_sgbd`` logger
    (INFO) every few seconds and at the end.

    :param Objective objective: from :func:`full_data_objective`.
    :param int max_iter: Newton-CG steps at most.
    :param int max_cg: Hessian-vector products per step at most.
    :param float tol: the target squared Newton decrement.
    :param float max_seconds: the wall-clock budget (default :data:`MAX_SECONDS`).
    :param str what: what is searched for, in messages.
    :return: ``(x, info)``: the flat point and a dict with ``iterations``,
        ``num_evaluations`` (full-data gradients), ``num_hvp`` (Hessian-vector
        products), ``potential``, ``newton_decrement`` (g' H^-1 g),
        ``max_scaled_grad``, ``worst`` (the flat index of that coordinate),
        ``hessian_diag`` (flat, float64), ``distance`` (the larger of
        sqrt(g' H^-1 g) and ``max_scaled_grad``: about how many posterior sds the
        point is from the mode), ``converged``, ``stop`` (why it stopped) and
        ``seconds``.
    """
    start = time.perf_counter()
    dtype = objective.x0.dtype
    counts = {"gradients": 0, "hvp": 0}

    d = objective.x0.shape[0]
    # Up to _EXACT_BELOW parameters every evaluation also forms the Hessian (d
    # products in the same pass over the data and the same program): the scaling
    # needs its diagonal every step, and CG's products are then matrix products
    # on the host instead of a pass over the data each (and a program of their
    # own). Kept for the last two points (the current one and a rejected trial).
    small = d <= _EXACT_BELOW and objective.value_grad_hvp is not None
    # NumPy's eye: jnp.eye compiles five programs. Only where small: d x d.
    basis = jnp.asarray(np.eye(d, dtype=dtype)) if small else None
    memo = {}

    def evaluate(x):
        counts["gradients"] += 1
        if not small:
            value, grad = objective.value_and_grad(jnp.asarray(x, dtype))
            return float(value), np.asarray(grad, np.float64)
        value, grad, rows = objective.value_grad_hvp(jnp.asarray(x, dtype), basis)
        counts["hvp"] += d
        if len(memo) > 1:
            del memo[next(iter(memo))]
        memo[x.tobytes()] = _symmetric(np.asarray(rows, np.float64))
        return float(value), np.asarray(grad, np.float64)

    def hessian_at(x):
        """The Hessian at ``x``: kept where ``evaluate`` saw it last or the one
        before (several rejected trials in a row evict the current point)."""
        key = x.tobytes()
        if key not in memo:
            counts["hvp"] += d
            rows = objective.value_grad_hvp(jnp.asarray(x, dtype), basis)[2]
            memo[key] = _symmetric(np.asarray(rows, np.float64))
        return memo[key]

    def curvature_at(x):
        if small:
            return _positive_diagonal(np.diag(hessian_at(x)))
        return _curvature_estimate(objective.hvp, jnp.asarray(x, dtype))

    def hvp_at(x):
        if small:
            return hessian_at(x).__matmul__
        x = jnp.asarray(x, dtype)

        def product(v):
            counts["hvp"] += 1
            out = objective.hvp(x, jnp.asarray(v[None], dtype))[0]
            return np.asarray(out, np.float64)

        return product

    x = np.asarray(objective.x0, np.float64)
    value, grad = evaluate(x)
    if not (np.isfinite(value) and np.all(np.isfinite(grad))):
        raise ValueError(
            f"{what}: the potential or its gradient is not finite at the "
            f"init_to_median start (U = {value}): check the model's priors and data."
        )
    rows = f", N = {objective.num_data}" if objective.num_data else ""
    _log.info(
        "%s: damped Newton-CG on the full-data potential, d = %d%s", what, d, rows
    )
    scale = 1.0 / np.sqrt(curvature_at(x))
    noise = 16 * float(jnp.finfo(dtype).eps)
    damping, iterations, refreshes = 1.0, 0, 0
    rescale_every = 1 if small else 10
    last_log = time.perf_counter()
    while True:
        stop, decrement = "max_iter", np.inf
        while iterations < max_iter:
            if time.perf_counter() - start > max_seconds:
                stop = "time budget"
                break
            hvp = hvp_at(x)
            if iterations and iterations % rescale_every == 0:
                # The curvature changes as the search moves (a scale parameter's
                # by orders of magnitude from a far start): re-estimate it.
                scale = 1.0 / np.sqrt(curvature_at(x))

            def scaled_hvp(v):
                return scale * hvp(scale * v)

            scaled_grad = scale * grad
            step, residual, status = _damped_cg(
                scaled_hvp, scaled_grad, damping, max_cg
            )
            descent = status == "negative" and not step.any()
            if descent:
                # CG found no direction: the curvature along the gradient is not
                # positive, or not finite (a far point's float32 Hessian
                # overflows). Steepest descent instead (Nocedal & Wright 2006,
                # Algorithm 7.1 returns -g there), the damping as the curvature of
                # the model, at most one scaled unit long: the ratio test below
                # then governs it like any step, so the damping cap ends it too.
                step = -scaled_grad * min(
                    1.0 / max(damping, 1e-3), 1.0 / np.sqrt(scaled_grad @ scaled_grad)
                )
            if status == "solved" and damping <= _NEWTON_DAMPING:
                # Damping lowers g'(H + damping)^-1 g: undamped, it is the decrement.
                exact, _, exact_status = _damped_cg(
                    scaled_hvp, scaled_grad, 0.0, max_cg
                )
                if exact_status == "solved":
                    decrement = -(scaled_grad @ exact)
                    if decrement <= tol and np.max(scaled_grad**2) <= tol:
                        stop = "converged"
                        break
            iterations += 1
            new_x = x + scale * step
            new_value, new_grad = evaluate(new_x)
            if descent:  # m(p) = g'p + damping p'p / 2
                predicted = -(scaled_grad @ step) - 0.5 * damping * (step @ step)
            else:  # m(p) = g'p + p'Hp / 2 with the residual r = g + (H + damping) p
                predicted = -0.5 * (
                    scaled_grad @ step + residual @ step - damping * (step @ step)
                )
            if not (
                np.isfinite(new_value)
                and np.all(np.isfinite(new_grad))
                and (not small or np.all(np.isfinite(hessian_at(new_x))))
            ):
                # A point whose curvature overflows is no place to go on from.
                ratio = -np.inf
            elif predicted <= 100 * noise * abs(value):
                # The decrease is near the potential's rounding: take it from the
                # gradients instead, by the trapezoidal rule along the step
                # (error O(|s|^3)), which rounding does not swamp.
                s = scale * step
                ratio = -0.5 * ((grad + new_grad) @ s) / predicted
            else:
                ratio = (value - new_value) / predicted
            # Levenberg-Marquardt's rule for the damping (Nocedal & Wright 2006,
            # Section 10.3, with the ratio test of their Algorithm 4.1).
            if ratio < 0.25:
                damping = max(4.0 * damping, 1e-3)
            elif ratio > 0.75:
                damping = damping / 3.0 if damping > 1e-9 else 0.0
            if ratio > 1e-4:
                x, value, grad = new_x, new_value, new_grad
            if damping > 1e12:
                stop = "no step improves"
                break
            if time.perf_counter() - last_log > _LOG_EVERY_S:
                last_log = time.perf_counter()
                _log.info(
                    "%s: step %d, U = %.8g, g'H^-1g = %.3g, damping %.2g, %.0f s",
                    what,
                    iterations,
                    value,
                    decrement,
                    damping,
                    last_log - start,
                )
        if stop != "converged":  # the decrement where it stopped, undamped
            hvp = hvp_at(x)
            step, _, status = _damped_cg(
                lambda v: scale * hvp(scale * v), scale * grad, 0.0, max_cg
            )
            decrement = -((scale * grad) @ step) if status == "solved" else np.inf
        if small:
            diag = np.diag(hessian_at(x))
        else:
            diag = hessian_diagonal(objective.hvp, jnp.asarray(x, dtype))
            counts["hvp"] += d
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.where(diag > 0, np.abs(grad) / np.sqrt(diag), np.inf)
        worst = int(np.argmax(scaled)) if d else 0
        max_scaled = float(scaled[worst]) if d else 0.0
        if not np.isfinite(decrement) or decrement < 0:
            decrement = np.inf
        distance = max(float(np.sqrt(decrement)), max_scaled)
        # Not there yet by the exact diagonal: go on with it as the scaling (the
        # curvature near the mode, where the start's estimate may be far off).
        if (
            distance**2 <= CLOSE
            or iterations >= max_iter
            or stop == "time budget"
            or refreshes == _REFRESHES
            or not np.isfinite(value)
            or not np.all(diag > 0)
        ):
            break
        refreshes += 1
        scale, damping = 1.0 / np.sqrt(diag), max(damping, 1e-3)
        _log.info(
            "%s: %d steps, largest gradient %.2g in curvature units: going on with "
            "the Hessian's diagonal there as the scaling",
            what,
            iterations,
            max_scaled,
        )
    converged = bool(np.isfinite(value) and np.all(diag > 0) and distance**2 <= CLOSE)
    seconds = time.perf_counter() - start
    info = {
        "iterations": iterations,
        "num_evaluations": counts["gradients"],
        "num_hvp": counts["hvp"],
        "potential": value,
        "newton_decrement": float(decrement),
        "max_scaled_grad": max_scaled,
        "worst": worst,
        "hessian_diag": diag,
        "distance": distance,
        "converged": converged,
        "stop": stop,
        "seconds": seconds,
        # Private (see `public_info`): the gradient at x, so that a control
        # variate centred there needs no pass of its own, and the Hessian there
        # where it was formed (up to _EXACT_BELOW parameters).
        "gradient": grad,
        "hessian": hessian_at(x) if small else None,
    }
    _log.info(
        "%s: %s after %d Newton-CG steps (%d full-data gradients, %d Hessian-vector "
        "products), U = %.8g, "
        "g'H^-1g = %.2g, max |g_j|/sqrt(H_jj) = %.2g, %.1f s",
        what,
        "converged" if converged else f"stopped ({stop})",
        iterations,
        counts["gradients"],
        counts["hvp"],
        value,
        decrement,
        max_scaled,
        seconds,
    )
    return jnp.asarray(x, dtype), info


def _site_of(index, unravel, d):
    """``"site[j]"`` for the flat index ``index``."""
    marker = np.zeros(d)
    marker[index] = 1.0
    for name, value in unravel(jnp.asarray(marker)).items():
        flat = np.ravel(np.asarray(value))
        if flat.size and flat.max() == 1.0:
            return f"{name}[{int(np.argmax(flat))}]" if flat.size > 1 else name
    return f"coordinate {index}"


def check_mode(info, unravel, what, fix, stacklevel=3):
    """Raise or warn as ``info`` from :func:`find_mode` says: a ValueError when the
    search diverged, stopped a posterior sd or more from a mode, or ended where the
    curvature is not positive; a warning when it stopped between 0.1 and 1 sd away.
    ``fix`` ends each message (what the user can do)."""
    diag = info["hessian_diag"]
    d = diag.shape[0]
    numbers = (
        f"{info['iterations']} Newton-CG steps, U = {info['potential']:.8g}, "
        f"g'H^-1g = {info['newton_decrement']:.3g}, largest gradient in curvature "
        f"units {info['max_scaled_grad']:.3g} at "
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
            f"{what}: the search stopped ({info['stop']}) about "
            f"{info['distance']:.3g} posterior sds from a mode ({numbers}). {fix}"
        )
    if not info["converged"]:
        warnings.warn(
            f"{what}: the search stopped ({info['stop']}) about "
            f"{info['distance']:.2g} posterior sds from the mode ({numbers}). {fix}",
            UserWarning,
            stacklevel=stacklevel,
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
        "Raise max_iter or max_seconds, check the model's priors (an improper "
        "posterior has no mode), or enable float64 "
        "(jax.config.update('jax_enable_x64', True)).",
    )
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    widened = full_batch(model)
    params = constrain_fn(widened, model_args, model_kwargs, objective.unravel(mode))
    diag = objective.unravel(jnp.asarray(info["hessian_diag"], mode.dtype))
    return PosteriorMode(params, diag, public_info(info))


def search_centre(model, model_args, model_kwargs, chunk_size):
    """The full-data mode by :func:`~numpyro_sgbd.modes.find_mode` (Newton-CG on the
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
