"""The mode search: damped Newton-CG on a flat potential, and the Hessian's rows.

:func:`find_mode` minimises the potential of an
:class:`~numpyro_sgbd.mode.Objective` (``value_and_grad``, Hessian-vector
products ``hvp`` and, where the model is small, ``value_grad_hvp``): Newton's
method with Levenberg-Marquardt damping, its steps solved by conjugate gradients
(Nocedal & Wright 2006, Algorithm 5.2 and Section 7.1). It knows nothing of
models: :mod:`numpyro_sgbd.mode` builds the objective from one, and checks and
reports what the search found.

It runs in stages, each a function of the values before it: the start, Newton-CG
steps until they stop, the distance to the mode by the exact diagonal, the report.
Where it stands is a :class:`_Search` value; :class:`_Passes` counts the passes
over the data and keeps the Hessians a small search formed.

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
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.mode.hessian import hessian_diagonal, symmetric

__all__ = ["find_mode", "hessian_diagonal"]

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


# ------------------------------------------------ the passes over the data
class _Passes:
    """The objective's passes over the data, counted (``gradients``: evaluations,
    ``hvp``: Hessian-vector products), on float64 host copies of its points.

    Up to :data:`_EXACT_BELOW` parameters (``small``) every evaluation also forms
    the Hessian (d products in the same pass over the data and the same program):
    the scaling needs its diagonal every step, and CG's products are then matrix
    products on the host instead of a pass over the data each (and a program of
    their own). The Hessians are kept for the last two points (the current one and
    a rejected trial)."""

    def __init__(self, objective):
        self.objective = objective
        self.dtype = objective.x0.dtype
        self.d = objective.x0.shape[0]
        self.small = self.d <= _EXACT_BELOW and objective.value_grad_hvp is not None
        # NumPy's eye: jnp.eye compiles five programs. Only where small: d x d.
        self.basis = (
            jnp.asarray(np.eye(self.d, dtype=self.dtype)) if self.small else None
        )
        self.memo = {}
        self.counts = {"gradients": 0, "hvp": 0}

    def evaluate(self, x):
        """``(U(x), grad U(x))`` as a float and a float64 array (and, where small,
        the Hessian at ``x`` into the memo)."""
        self.counts["gradients"] += 1
        if not self.small:
            value, grad = self.objective.value_and_grad(jnp.asarray(x, self.dtype))
            return float(value), np.asarray(grad, np.float64)
        value, grad, rows = self.objective.value_grad_hvp(
            jnp.asarray(x, self.dtype), self.basis
        )
        self.counts["hvp"] += self.d
        if len(self.memo) > 1:
            del self.memo[next(iter(self.memo))]
        self.memo[x.tobytes()] = symmetric(np.asarray(rows, np.float64))
        return float(value), np.asarray(grad, np.float64)

    def hessian_at(self, x):
        """The Hessian at ``x``: kept where ``evaluate`` saw it last or the one
        before (several rejected trials in a row evict the current point)."""
        key = x.tobytes()
        if key not in self.memo:
            self.counts["hvp"] += self.d
            rows = self.objective.value_grad_hvp(
                jnp.asarray(x, self.dtype), self.basis
            )[2]
            self.memo[key] = symmetric(np.asarray(rows, np.float64))
        return self.memo[key]

    def curvature_at(self, x):
        """A positive diagonal scaling at ``x``: the Hessian's diagonal where
        small, else Hutchinson's estimate."""
        if self.small:
            return _positive_diagonal(np.diag(self.hessian_at(x)))
        return _curvature_estimate(self.objective.hvp, jnp.asarray(x, self.dtype))

    def hvp_at(self, x):
        """``v -> H(x) v`` on the host: a matrix product where small, else one
        Hessian-vector product (a pass over the data) per call."""
        if self.small:
            return self.hessian_at(x).__matmul__
        x = jnp.asarray(x, self.dtype)

        def product(v):
            self.counts["hvp"] += 1
            out = self.objective.hvp(x, jnp.asarray(v[None], self.dtype))[0]
            return np.asarray(out, np.float64)

        return product

    def diagonal_at(self, x):
        """The Hessian's exact diagonal at ``x`` (d products where not small)."""
        if self.small:
            return np.diag(self.hessian_at(x))
        diag = hessian_diagonal(self.objective.hvp, jnp.asarray(x, self.dtype))
        self.counts["hvp"] += self.d
        return diag


# ------------------------------------------------------------- the search
class _Settings(NamedTuple):
    """What a search is given and fixed at its start."""

    max_iter: int
    max_cg: int
    tol: float
    max_seconds: float
    what: str
    #: ``time.perf_counter()`` at the start.
    start: float
    #: The relative rounding of the potential: below ``100 * noise * |U|`` a
    #: predicted decrease is checked against the gradients instead.
    noise: float
    #: Steps between new estimates of the scaling (1 where small, else 10).
    rescale_every: int


class _Search(NamedTuple):
    """Where the search stands between steps."""

    #: The point (float64), its potential and gradient.
    x: np.ndarray
    value: float
    grad: np.ndarray
    #: The diagonal scaling: a unit of ``x / scale`` is about a posterior sd.
    scale: np.ndarray
    #: Levenberg-Marquardt's damping, in the scaled coordinates.
    damping: float
    #: Newton-CG steps taken (each a pass over the data).
    iterations: int
    #: The last undamped squared Newton decrement ``g' H^-1 g`` (``inf``: none).
    decrement: float
    #: Why the steps stopped: ``"converged"``, ``"max_iter"``, ``"time budget"``
    #: or ``"no step improves"``.
    stop: str
    #: ``time.perf_counter()`` at the last progress report.
    last_log: float


class _Closeness(NamedTuple):
    """How far the search's point is from the mode, by the exact diagonal."""

    #: The Hessian's diagonal at the point (float64).
    diag: np.ndarray
    #: The flat index of the largest gradient in curvature units, and that value.
    worst: int
    max_scaled: float
    #: The squared Newton decrement (``inf`` where not finite or negative).
    decrement: float
    #: ``max(sqrt(decrement), max_scaled)``: about the distance in posterior sds.
    distance: float


def _finite(value, grad):
    return bool(np.isfinite(value) and np.all(np.isfinite(grad)))


def _start(passes, what, last_mode=None):
    """The search at its start, scaled by the curvature there: ``last_mode``
    where the potential is finite and lower there than at ``init_to_median``'s
    point (or where that point's is not finite), else that point; raises where
    the potential or its gradient is finite at none of them."""
    objective = passes.objective
    last = None
    if last_mode is not None:
        # Evaluated by the search's own program (no other is compiled for it).
        x = np.asarray(last_mode, np.float64)
        last = (x, *passes.evaluate(x))
        if not _finite(*last[1:]):
            last = None
    x = np.asarray(objective.x0, np.float64)
    value, grad = passes.evaluate(x)
    if not _finite(value, grad):
        # As NumPyro's initialisation retries: the origin of the unconstrained
        # space keeps a GLM's linear predictor at 0 where the prior's median
        # draws on raw covariates make a rate underflow (a NaN gradient).
        origin = np.zeros_like(x)
        at_origin = passes.evaluate(origin)
        if not (_finite(*at_origin) or last is not None):
            bad = int(np.sum(~np.isfinite(grad)))
            raise ValueError(
                f"{what}: the potential or its gradient is not finite at the "
                f"init_to_median start (U = {value}, {bad} of {x.size} gradient "
                "coordinates not finite) nor at the origin of the unconstrained "
                "space: check the model's priors and data (a rate or probability "
                "that underflows for large covariates gives a NaN gradient: "
                "standardise the covariates)."
            )
        if _finite(*at_origin):
            _log.info(
                "%s: the gradient is not finite at init_to_median's point; the "
                "search starts at the origin of the unconstrained space.",
                what,
            )
            x, (value, grad) = origin, at_origin
    if last is not None and not (_finite(value, grad) and value <= last[1]):
        _log.info("%s: the search starts at the last mode found.", what)
        x, value, grad = last
    rows = f", N = {objective.num_data}" if objective.num_data else ""
    message = "%s: damped Newton-CG on the full-data potential, d = %d%s"
    _log.info(message, what, passes.d, rows)
    scale = 1.0 / np.sqrt(passes.curvature_at(x))
    return _Search(x, value, grad, scale, 1.0, 0, np.inf, "max_iter", 0.0)


def _proposal(scaled_hvp, scaled_grad, damping, max_cg):
    """The trial step in scaled coordinates: ``(step, residual, status,
    descent)``, the damped CG solution or, where CG found no direction, steepest
    descent (``descent`` true)."""
    step, residual, status = _damped_cg(scaled_hvp, scaled_grad, damping, max_cg)
    descent = status == "negative" and not step.any()
    if descent:
        # CG found no direction: the curvature along the gradient is not
        # positive, or not finite (a far point's float32 Hessian overflows).
        # Steepest descent instead (Nocedal & Wright 2006, Algorithm 7.1 returns
        # -g there), the damping as the curvature of the model, at most one scaled
        # unit long: the ratio test then governs it like any step, so the damping
        # cap ends it too.
        step = -scaled_grad * min(
            1.0 / max(damping, 1e-3), 1.0 / np.sqrt(scaled_grad @ scaled_grad)
        )
    return step, residual, status, descent


def _undamped_decrement(scaled_hvp, scaled_grad, max_cg):
    """``g' H^-1 g`` from an undamped CG solve in scaled coordinates, or ``None``
    where the solve does not converge."""
    exact, _, status = _damped_cg(scaled_hvp, scaled_grad, 0.0, max_cg)
    return -(scaled_grad @ exact) if status == "solved" else None


def _gain_ratio(passes, search, trial, scaled_grad, proposal, noise):
    """The ratio of the actual to the predicted decrease of the potential by the
    step ``proposal`` to ``trial = (x, value, grad)``; ``-inf`` where the trial's
    value, gradient or (where small) Hessian is not finite."""
    step, residual, _, descent = proposal
    damping = search.damping
    new_x, new_value, new_grad = trial
    if descent:  # m(p) = g'p + damping p'p / 2
        predicted = -(scaled_grad @ step) - 0.5 * damping * (step @ step)
    else:  # m(p) = g'p + p'Hp / 2 with the residual r = g + (H + damping) p
        predicted = -0.5 * (
            scaled_grad @ step + residual @ step - damping * (step @ step)
        )
    if not (
        np.isfinite(new_value)
        and np.all(np.isfinite(new_grad))
        and (not passes.small or np.all(np.isfinite(passes.hessian_at(new_x))))
    ):
        # A point whose curvature overflows is no place to go on from.
        return -np.inf
    if predicted <= 100 * noise * abs(search.value):
        # The decrease is near the potential's rounding: take it from the
        # gradients instead, by the trapezoidal rule along the step (error
        # O(|s|^3)), which rounding does not swamp.
        s = search.scale * step
        return -0.5 * ((search.grad + new_grad) @ s) / predicted
    return (search.value - new_value) / predicted


def _new_damping(damping, ratio):
    """Levenberg-Marquardt's rule for the damping (Nocedal & Wright 2006, Section
    10.3, with the ratio test of their Algorithm 4.1)."""
    if ratio < 0.25:
        return max(4.0 * damping, 1e-3)
    if ratio > 0.75:
        return damping / 3.0 if damping > 1e-9 else 0.0
    return damping


def _newton_step(passes, search, settings):
    """One damped Newton-CG step: the search after it, with ``stop`` set to
    ``"converged"`` (tested before the step, which is then not taken) or ``"no
    step improves"`` (the damping ran away) where the steps end."""
    x = search.x
    hvp = passes.hvp_at(x)
    scale = search.scale
    if search.iterations and search.iterations % settings.rescale_every == 0:
        # The curvature changes as the search moves (a scale parameter's by
        # orders of magnitude from a far start): re-estimate it.
        scale = 1.0 / np.sqrt(passes.curvature_at(x))
        search = search._replace(scale=scale)

    def scaled_hvp(v):
        return scale * hvp(scale * v)

    scaled_grad = scale * search.grad
    proposal = _proposal(scaled_hvp, scaled_grad, search.damping, settings.max_cg)
    if proposal[2] == "solved" and search.damping <= _NEWTON_DAMPING:
        # Damping lowers g'(H + damping)^-1 g: undamped, it is the decrement.
        decrement = _undamped_decrement(scaled_hvp, scaled_grad, settings.max_cg)
        if decrement is not None:
            search = search._replace(decrement=decrement)
            if decrement <= settings.tol and np.max(scaled_grad**2) <= settings.tol:
                return search._replace(stop="converged")
    new_x = x + scale * proposal[0]
    trial = (new_x, *passes.evaluate(new_x))
    ratio = _gain_ratio(passes, search, trial, scaled_grad, proposal, settings.noise)
    damping = _new_damping(search.damping, ratio)
    search = search._replace(damping=damping, iterations=search.iterations + 1)
    if ratio > 1e-4:
        search = search._replace(x=trial[0], value=trial[1], grad=trial[2])
    if damping > 1e12:
        return search._replace(stop="no step improves")
    return search


def _newton_steps(passes, search, settings):
    """Newton-CG steps until converged, ``max_iter`` steps in all, the time
    budget spent, or the damping runs away; progress to the log every few
    seconds."""
    search = search._replace(stop="max_iter", decrement=np.inf)
    while search.iterations < settings.max_iter:
        if time.perf_counter() - settings.start > settings.max_seconds:
            return search._replace(stop="time budget")
        search = _newton_step(passes, search, settings)
        if search.stop != "max_iter":
            return search
        if time.perf_counter() - search.last_log > _LOG_EVERY_S:
            search = search._replace(last_log=time.perf_counter())
            _log.info(
                "%s: step %d, U = %.8g, g'H^-1g = %.3g, damping %.2g, %.0f s",
                settings.what,
                search.iterations,
                search.value,
                search.decrement,
                search.damping,
                search.last_log - settings.start,
            )
    return search


def _closeness(passes, search, max_cg):
    """The distance of the search's point from the mode: the undamped decrement
    (solved again unless the steps converged) and the largest gradient in
    curvature units by the Hessian's exact diagonal there."""
    decrement = search.decrement
    if search.stop != "converged":  # the decrement where it stopped, undamped
        hvp, scale = passes.hvp_at(search.x), search.scale
        step, _, status = _damped_cg(
            lambda v: scale * hvp(scale * v), scale * search.grad, 0.0, max_cg
        )
        decrement = -((scale * search.grad) @ step) if status == "solved" else np.inf
    diag = passes.diagonal_at(search.x)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(diag > 0, np.abs(search.grad) / np.sqrt(diag), np.inf)
    d = passes.d
    worst = int(np.argmax(scaled)) if d else 0
    max_scaled = float(scaled[worst]) if d else 0.0
    if not np.isfinite(decrement) or decrement < 0:
        decrement = np.inf
    distance = max(float(np.sqrt(decrement)), max_scaled)
    return _Closeness(diag, worst, max_scaled, decrement, distance)


def _finished(search, closeness, refreshes, max_iter):
    """Whether the search ends here: close enough, out of steps, time or
    refreshes, or at a point that is no mode (a value or curvature not finite
    or not positive)."""
    return (
        closeness.distance**2 <= CLOSE
        or search.iterations >= max_iter
        or search.stop == "time budget"
        or refreshes == _REFRESHES
        or not np.isfinite(search.value)
        or not np.all(closeness.diag > 0)
    )


def _report(passes, search, closeness, settings):
    """:func:`find_mode`'s ``info`` dict, logged."""
    value, diag, distance = search.value, closeness.diag, closeness.distance
    converged = bool(np.isfinite(value) and np.all(diag > 0) and distance**2 <= CLOSE)
    seconds = time.perf_counter() - settings.start
    counts = passes.counts
    info = {
        "iterations": search.iterations,
        "num_evaluations": counts["gradients"],
        "num_hvp": counts["hvp"],
        "potential": value,
        "newton_decrement": float(closeness.decrement),
        "max_scaled_grad": closeness.max_scaled,
        "worst": closeness.worst,
        "hessian_diag": diag,
        "distance": distance,
        "converged": converged,
        "stop": search.stop,
        "seconds": seconds,
        # Private (see `mode.public_info`): the gradient at x, so that a control
        # variate centred there needs no pass of its own, and the Hessian there
        # where it was formed (up to _EXACT_BELOW parameters).
        "gradient": search.grad,
        "hessian": passes.hessian_at(search.x) if passes.small else None,
    }
    _log.info(
        "%s: %s after %d Newton-CG steps (%d full-data gradients, %d Hessian-vector "
        "products), U = %.8g, "
        "g'H^-1g = %.2g, max |g_j|/sqrt(H_jj) = %.2g, %.1f s",
        settings.what,
        "converged" if converged else f"stopped ({search.stop})",
        search.iterations,
        counts["gradients"],
        counts["hvp"],
        value,
        closeness.decrement,
        closeness.max_scaled,
        seconds,
    )
    return info


def find_mode(
    objective,
    *,
    max_iter=200,
    max_cg=250,
    tol=TOLERANCE,
    max_seconds=MAX_SECONDS,
    what="mode",
    last_mode=None,
):
    """Minimise ``objective``'s potential from its start (or from ``last_mode``,
    where the potential is lower there) by damped Newton-CG: above 64 parameters
    no d x d array is formed.

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

    :param Objective objective: from :func:`~numpyro_sgbd.mode.full_data_objective`.
    :param int max_iter: Newton-CG steps at most.
    :param int max_cg: Hessian-vector products per step at most.
    :param float tol: the target squared Newton decrement.
    :param float max_seconds: the wall-clock budget (default :data:`MAX_SECONDS`).
    :param str what: what is searched for, in messages.
    :param last_mode: a flat point of ``objective.x0``'s shape, the mode found on
        earlier data of the same shapes (a refit): the search starts there where
        the potential is finite and lower than at ``objective.x0``. Both are
        evaluated by the search's own program, and the evaluations count.
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
    passes = _Passes(objective)
    search = _start(passes, what, last_mode)
    settings = _Settings(
        max_iter,
        max_cg,
        tol,
        max_seconds,
        what,
        start,
        noise=16 * float(jnp.finfo(passes.dtype).eps),
        rescale_every=1 if passes.small else 10,
    )
    search = search._replace(last_log=time.perf_counter())
    refreshes = 0
    while True:
        search = _newton_steps(passes, search, settings)
        closeness = _closeness(passes, search, max_cg)
        if _finished(search, closeness, refreshes, max_iter):
            break
        # Not there yet by the exact diagonal: go on with it as the scaling (the
        # curvature near the mode, where the start's estimate may be far off).
        refreshes += 1
        search = search._replace(
            scale=1.0 / np.sqrt(closeness.diag), damping=max(search.damping, 1e-3)
        )
        _log.info(
            "%s: %d steps, largest gradient %.2g in curvature units: going on with "
            "the Hessian's diagonal there as the scaling",
            what,
            search.iterations,
            closeness.max_scaled,
        )
    info = _report(passes, search, closeness, settings)
    return jnp.asarray(search.x, passes.dtype), info
