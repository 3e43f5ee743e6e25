"""The host side of the run checks: when the compiled step calls the host (a
"note", under :func:`~numpyro_sgbd.monitoring.per_step`), the clock
:func:`wall_time` reads, the step, drift and non-finite checks a
:class:`Monitor` makes there, and the drift check's schedule that the check
after the run replays on the state's record (:func:`drift_schedule`; see
:mod:`numpyro_sgbd.monitoring`)."""

import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import advice
from numpyro_sgbd.evaluation.drift import drift

__all__ = ["Monitor", "call_host", "clock_due", "drift_schedule", "wall_time"]


def call_host(pred, warn, i, *args):
    """Call ``warn(i, *args)`` on the host where ``pred`` holds; return ``i``.

    A :func:`jax.pure_callback` whose result is passed on as the iteration count,
    so XLA cannot drop it. Not :func:`jax.debug.callback`: a computation with an
    effect loses jit's C++ dispatch path, and NumPyro's progress bar dispatches the
    compiled step once per iteration from Python, which made a step with the bar on
    about ten times slower.

    ``warn`` gets NumPy arrays. JAX hands a callback its operands as JAX arrays,
    and every NumPy function applied to one dispatches a JAX operation (compiled
    the first time): converting them once here makes our Python in a call a small
    part of the call's own cost (see `_CLOCK_EVERY`).
    """

    def on_host(i, *args):
        i, args = np.asarray(i), jax.tree.map(np.asarray, args)
        warn(i, *args)
        return i

    def call(i, *args):
        shape = jax.ShapeDtypeStruct(jnp.shape(i), jnp.result_type(i))
        return jax.pure_callback(on_host, shape, i, *args)

    return jax.lax.cond(pred, call, lambda i, *args: i, i, *args)


def _flat_draws(batch_shape, leaves):
    """The chains' positions, one row each (as ``ravel_pytree`` orders them), on
    the host, float64: ``leaves`` are the position's leaves, each with the leading
    ``batch_shape`` (vectorized chains) or none."""
    rows = int(np.prod(batch_shape))
    return np.concatenate(
        [np.asarray(leaf, np.float64).reshape(rows, -1) for leaf in leaves]
        or [np.zeros((rows, 0))],
        axis=1,
    )


def smallest_step(batch_shape, step_size, scale):
    """Each chain's smallest step in u, on the host: the step in v times the
    smallest scale (where the noise holds the chain still, its windows shrink the
    scale and the step in v grows to the target while the move in u stays as
    small); NaN without an adapted step."""
    if step_size is None:
        return np.full(batch_shape, np.nan)
    step = np.asarray(step_size, np.float64)
    if scale is not None:
        step = step * np.min(np.asarray(scale), axis=-1)
    return step


def _warn_nonfinite(i, remedies):
    warnings.warn(
        f"A chain produced a non-finite value at iteration {int(np.max(i))} and has "
        "stopped there (state.num_nonfinite counts the refused steps). "
        f"{advice.join(remedies)}",
        RuntimeWarning,
        stacklevel=2,
    )


# The step calls the host (a "note") for `wall_time`'s clock, the stationarity
# check's thinned draws and the step check. Warmup is noted at iterations 1, 2, 4,
# 8, ...; sampling at its own steps t = 1, 2, 4, ... and at the multiples of a
# spacing that grows with t: `_CLOCK_EVERY` (or `_CLOCK_SAMPLES` samples where
# that is more) until t holds 2 * `_NOTES_PER_OCTAVE` spacings, after which the
# spacing doubles with each doubling of t (see `_spacing`). So a long run calls the
# host about 16 times per doubling (past 8,192 sampling steps at num_steps=1) and
# keeps 16 to 32 evenly spaced draws for the check.
# Each call costs far more than its Python (JAX's callback places the operands
# on the device, and the XLA thread pool's idle workers spin against it), tens of
# steps' worth at n = 100, so notes are hundreds of steps apart
# (`benchmarks/convergence_check.py` measures it; history in benchmarks/results.md).
# With the progress bar each call also waits for NumPyro's Python loop to let go
# of the interpreter: hence every `_CLOCK_SAMPLES` samples at most with
# num_steps > 16 (docs/benchmarks.rst, (g)).
_CLOCK_EVERY = 256
_CLOCK_SAMPLES = 16
_NOTES_PER_OCTAVE = 16
_CLOCK_EVENTS = 8192  # kept per kernel, newest last
# The stationarity check needs this many thinned sampling draws per run.
_DRIFT_MIN_POINTS = 16
#: The step check warns when warmup ends with an adapted step below this
#: fraction of the kernel's target in u.
STEP_WARN_FRACTION = 0.1


def _note_every(num_steps):
    """The sampling notes' first spacing, in steps, for a kernel taking
    ``num_steps`` steps a sample: ``_CLOCK_EVERY``, or ``_CLOCK_SAMPLES`` samples
    where that is more."""
    return max(_CLOCK_EVERY, _CLOCK_SAMPLES * num_steps)


def _spacing(t, num_steps):
    """Steps between two sampling notes at sampling step ``t >= 1`` (host ints):
    the first spacing ``_note_every(num_steps)``, doubled once for each doubling
    of ``t`` past ``2 * _NOTES_PER_OCTAVE`` first spacings. So ``t`` holds 16 to
    32 spacings once it holds 16, and each spacing's multiples are multiples of
    the one before."""
    base = _note_every(num_steps)
    return base << (t // (2 * _NOTES_PER_OCTAVE * base)).bit_length()


def _traced_spacing(t, num_steps):
    """:func:`_spacing` of traced integer steps ``t >= 1``."""
    base = _note_every(num_steps)
    octaves = t // (2 * _NOTES_PER_OCTAVE * base)
    bits = jnp.iinfo(octaves.dtype).bits - jax.lax.clz(octaves)
    return jnp.left_shift(jnp.asarray(base, t.dtype), bits.astype(t.dtype))


def _crossed(before, after, every):
    """Whether ``(before, after]`` holds a multiple of ``every``."""
    return after // every != before // every


def _two_power_crossed(before, after):
    """Whether ``(before, after]`` (``0 <= before < after``) holds a power of two:
    exactly when ``after`` has more bits than ``before``, ``after ^ before >
    before``."""
    return (after ^ before) > before


def drift_schedule(t_end, num_steps):
    """The drift checks the live notes make over ``t_end`` sampling steps, in
    order, as ``(t, points, every)``: the sampling step ``t`` of the check, the
    sampling steps of the draws it reads (16 to 32 of them) and their spacing.
    The same rule as :meth:`Monitor.note`: a draw at each sample that crosses a
    multiple of :func:`_spacing`, the ones off the new spacing dropped when it
    doubles; a check at the 16th draw and at each power of two of ``t`` after.

    >>> [(t, len(points), every) for t, points, every in drift_schedule(9000, 1)]
    [(4096, 16, 256), (8192, 32, 256)]
    """
    k, base = num_steps, _note_every(num_steps)
    points = []
    for m in range(1, t_end // base + 1):
        t = k * -(-m * base // k)  # the sample that crosses m * base
        every = _spacing(t, k)
        if t > t_end or not _crossed(t - k, t, every):
            continue
        points.append(t)
        if len(points) >= _DRIFT_MIN_POINTS and (
            len(points) == _DRIFT_MIN_POINTS or _two_power_crossed(max(t - k, 0), t)
        ):
            yield t, list(points), _spacing(max(t - k, 1), k)
        points = [p for p in points if _crossed(p - k, p, every)]


def clock_due(before, after, num_warmup, num_steps):
    """Whether one sample's steps ``(before, after]`` end with a note: at a power
    of two of the warmup iteration or of the sampling step ``t = i - num_warmup``,
    or at a multiple of :func:`_spacing` of ``t``."""
    sampling = after > num_warmup
    t0 = jnp.where(sampling, jnp.maximum(before - num_warmup, 0), before)
    t1 = jnp.where(sampling, after - num_warmup, after)
    spaced = sampling & _crossed(t0, t1, _traced_spacing(jnp.maximum(t1, 1), num_steps))
    return jnp.any(_two_power_crossed(t0, t1) | spaced)


def wall_time(kernel, mcmc):
    """Seconds the last ``mcmc.run`` of ``kernel`` took, compilation included, from
    the host times the kernel noted; ``None`` when they do not cover that run.

    The kernel notes a start when ``init`` runs and when NumPyro traces ``sample``
    (each ``run`` compiles its loop anew), and, under
    :func:`~numpyro_sgbd.monitoring.per_step`, the end of warmup iterations 1,
    2, 4, ... and of sampling iterations 1, 2, 4, ... and every 256th (every
    ``16 num_steps``-th where that is more; the spacing doubles with each doubling
    of the run past 32 spacings); by default, with NumPyro's progress bar on, the
    end of the first sample of each loop, of every 100th after and of the run's
    last. Without the bar the default notes no end: ``None``. The run's
    iterations are ``(i_end - steps, i_end]``, ``i_end`` the last state's
    iteration count and ``steps`` the warmup (unless the run resumed from
    ``post_warmup_state``) plus ``num_samples``, times the kernel's
    ``num_steps``; the steps after the last note are timed at the rate between
    the last two.
    Sequential chains run one after another, each a pass of its own: their times
    add up. What NumPyro does before ``init`` and after the last step (collecting
    the draws) is not counted: a few percent of a short run.
    """
    monitor = getattr(kernel, "monitor", None)
    events = list(monitor.clock) if monitor is not None else []
    last = getattr(mcmc, "last_state", None)
    if not events or last is None or not hasattr(last, "i"):
        return None
    i_end = int(np.max(np.asarray(last.i)))
    resumed = getattr(mcmc, "_warmup_state", None) is not None
    steps = (mcmc.num_samples + (0 if resumed else mcmc.num_warmup)) * getattr(
        kernel, "num_steps", 1
    )
    i_start = i_end - steps
    passes = []
    for i, t in events:
        if i is None:  # a start: a new pass unless this one has no ticks yet
            if not passes or passes[-1]["ticks"]:
                passes.append({"start": t, "ticks": {}})
        elif passes:
            ticks = passes[-1]["ticks"]
            ticks[i] = max(t, ticks.get(i, t))  # chains on several devices
    sequential = mcmc.num_chains > 1 and mcmc.chain_method == "sequential"
    total = 0.0
    for one in passes[-(mcmc.num_chains if sequential else 1) :]:
        ticks = sorted(one["ticks"].items())
        if len(ticks) < 2 or not i_start < ticks[-1][0] <= i_end:
            return None
        (i_a, t_a), (i_b, t_b) = ticks[-2:]
        rate = (t_b - t_a) / (i_b - i_a)
        if ticks[0][0] <= i_start:
            # The pass began before this run: the run noted no start of its own
            # (a resumed run whose step NumPyro did not trace again), and its
            # compilation time is unknown.
            return None
        total += t_b - one["start"] + (i_end - i_b) * rate
    return total


def flat_name(shapes, j):
    """``"site[k]"`` for flat coordinate ``j`` of z with site ``shapes`` (sites in
    ``ravel_pytree``'s order, which sorts dict keys); ``"z[j]"`` without sites."""
    if not shapes:
        return f"z[{j}]"
    for name in sorted(shapes):
        size = int(np.prod(shapes[name]))
        if j < size:
            return f"{name}[{j}]" if shapes[name] else name
        j -= size
    return f"z[{j}]"


class Monitor:
    """One kernel's host-side record of its runs: the clock (``(iteration or
    None at a start, host seconds)``, newest last), the thinned sampling draws
    the drift check reads, and which checks have run. The checks read the
    kernel's facts (its warmup, ``num_steps``, step target, site names) and
    record their warnings on it."""

    def __init__(self):
        self.clock = []
        self.drift_points = []
        self.drift_warned = False
        self.step_checked = True
        #: The kinds of warning the last run gave ("nonfinite", "step", "drift",
        #: "stall", "noise", "convergence", "bias"), in order; reset when a run starts.
        self.run_warnings = ()
        #: The convergence check's numbers after a run (see
        #: :func:`~numpyro_sgbd.monitoring.report`), or ``None``.
        self.convergence = None
        #: The run's own error estimate after a run (see
        #: :func:`~numpyro_sgbd.discretisation.estimate`), or ``None``.
        self.error_estimate = None
        #: The run's :class:`~numpyro_sgbd.monitoring.TracePlan` and the check's
        #: pool of chains (:class:`~numpyro_sgbd.monitoring.ConvergenceCheck`).
        self.trace_plan = None
        self.check = None
        #: Where the step NumPyro compiled last makes its checks
        #: (:func:`~numpyro_sgbd.monitoring.mode`), and the run's samples.
        self.mode = None
        self.num_samples = None
        #: The chains whose final states the check after the run has read
        #: (``(i, key bytes)`` each), and the progress bar's count of samples
        #: and the count at which it next reads the state.
        self.checked = set()
        self.bar_calls, self.bar_next_read = 0, 1

    def new_record(self):
        """Forget the last run's warnings and checked chains: a run starts."""
        self.run_warnings, self.checked = (), set()
        self.drift_warned, self.error_estimate = False, None

    def record_warning(self, kind):
        """Note that this run warned (``kind``: "step", "drift", ...), for the
        kernel's ``run_warnings`` and :func:`~numpyro_sgbd.compare`."""
        if kind not in self.run_warnings:
            self.run_warnings = (*self.run_warnings, kind)

    def start(self):
        """Note a start: ``init``, or NumPyro tracing ``sample`` (a run)."""
        self.clock.append((None, time.perf_counter()))
        del self.clock[:-_CLOCK_EVENTS]

    def tick(self, i):
        """Note the host time at the end of iteration ``i``."""
        self.clock.append((i, time.perf_counter()))
        del self.clock[:-_CLOCK_EVENTS]

    def new_run(self, mode=None):
        """Forget the last run's drift draws and checks; the step NumPyro is
        tracing makes its checks as ``mode`` says."""
        self.drift_points, self.drift_warned = [], False
        self.step_checked = False
        self.mode = mode

    def for_pickling(self):
        """A copy with the clock but no draws (the drift check starts afresh)."""
        other = Monitor()
        other.clock = list(self.clock)
        other.run_warnings, other.convergence = self.run_warnings, self.convergence
        other.error_estimate = self.error_estimate
        other.trace_plan, other.mode = self.trace_plan, self.mode
        other.num_samples, other.checked = self.num_samples, set(self.checked)
        return other

    def note(self, kernel, i, first_stop, leaves, step_size, scale):
        """What the step sends the host (see :func:`clock_due`): the non-finite
        warning once a chain stops, the clock, the step check at the first note of
        sampling and the drift check's draws."""
        if first_stop:
            self.record_warning("nonfinite")
            _warn_nonfinite(i, advice.nonfinite_remedies(advice.run_facts(kernel)))
        batch_shape = np.shape(i)
        i = int(np.max(i))
        self.tick(i)
        num_warmup, k = kernel.run_shape()[:2]
        if i > num_warmup and not self.step_checked:
            self.step_checked = True
            self.check_step(kernel, smallest_step(batch_shape, step_size, scale))
        t = i - num_warmup
        if t <= 0:
            return
        every, drawn_every = _spacing(t, k), _spacing(max(t - k, 1), k)
        if _crossed(t - k, t, every):
            points = self.drift_points
            points.append((t, _flat_draws(batch_shape, leaves)))
            if len(points) >= _DRIFT_MIN_POINTS and (
                len(points) == _DRIFT_MIN_POINTS or _two_power_crossed(max(t - k, 0), t)
            ):
                self.check_drift(kernel, i, [row for _, row in points], drawn_every)
            # Kept: the draws at the new spacing's multiples (when the spacing
            # doubles, every other one goes).
            self.drift_points = [p for p in points if _crossed(p[0] - k, p[0], every)]

    def check_step(self, kernel, step):
        """Warn when the adapted step of some chain ended warmup far below its
        target (below ``STEP_WARN_FRACTION`` of it): the gradient noise,
        not the posterior, then sets the step, and the chain needs many more
        iterations per independent draw."""
        if np.all(np.isnan(step)):
            return
        smallest = float(np.nanmin(step))
        target = kernel.step_target()
        if smallest >= STEP_WARN_FRACTION * target:
            return
        self.record_warning("step")
        remedies = advice.step_remedies(advice.run_facts(kernel))
        warnings.warn(
            f"{type(kernel).__name__}: the gradient noise held the adapted step to "
            f"{smallest:.3g} in the whitened coordinates (target "
            f"{target}) at the end of warmup, so each independent draw "
            f"takes some {(target / smallest) ** 2:.0f} times more "
            f"iterations (see mcmc.last_state.step_size). {advice.join(remedies)}",
            UserWarning,
            stacklevel=2,
        )

    def check_drift(self, kernel, i, rows, every, coords=None):
        """Warn, once per run, when the sampling draws noted so far (``rows``, 16
        to 32 blocks of rows, ``every`` iterations apart) still drift
        (:func:`~numpyro_sgbd.evaluation.drift.drift`). Checked when their number
        reaches 16 and at each power of two of the sampling iterations after that:
        once for each doubling of the run. ``coords``: the flat coordinates of the
        rows' columns, where they are not all of z's (the state's record)."""
        if self.drift_warned:
            return
        found = drift(np.concatenate(rows))
        if found is None:
            return
        self.drift_warned = True
        self.record_warning("drift")
        remedies = advice.drift_remedies(advice.run_facts(kernel))
        j = found.index if coords is None else int(coords[found.index])
        shapes, trace_plan = kernel.prepared.draw_shapes, self.trace_plan
        name = flat_name(shapes, j) if coords is None else trace_plan.name(shapes, j)
        t = i - kernel.run_shape().num_warmup
        so_far = f"over the {t} sampling iterations so far"
        if found.t is None:
            what = (
                f"The chain is not mixing: {so_far}, {name} held still within the "
                "first quarter of its draws and within the last (zero sd in both; "
                f"draws every {every} iterations) but moved between them, from "
                f"{found.before:.3g} to {found.after:.3g}: it moves too rarely for "
                "its draws to represent its posterior (a local site's row moves "
                "only when its datum is drawn and its move is accepted)."
            )
        else:
            what = (
                f"The chain is still drifting: {so_far}, the mean of {name} moved "
                f"{found.shift:.2g} posterior sds between the first and last quarter "
                f"({abs(found.t):.1f} standard errors; draws every {every} "
                "iterations). The draws do not yet come from the stationary law."
            )
        warnings.warn(
            f"{what} {advice.join(remedies)}",
            RuntimeWarning,
            stacklevel=2,
        )
