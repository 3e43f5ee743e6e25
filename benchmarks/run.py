"""Speed of the kernels: every figure is a ratio of times measured in this process.

    python benchmarks/run.py            # the full table (about 26 minutes on 2 cores)
    python benchmarks/run.py --quick    # smaller N and fewer steps (about 12 minutes)

Prints the table and writes it as Markdown to ``--output`` (default
``benchmarks/results.md`` when every part runs; ``--parts`` alone writes nothing,
so a partial run never overwrites the full table). ``--kernels`` narrows section
(g) to the named kernels. Sections, each on logistic regression with N(0, 1)
covariates:

(a) per-step time of ``MCMC(SGBD(model))`` and ``MCMC(SGLD(model))``, every variant,
    progress bar off and on with one step per sample (``num_steps=1``; (g) times the
    default under the bar), / the floor: a hand-written jitted ``lax.scan`` of
    minibatch gradients of the same potential with O(n) index draws
    (``random.randint``) and a Langevin move; N = 10^6, d = 10, n = 1000 and 100.
(b) the same kernels / BlackJAX's ``sgld`` run in a jitted ``lax.scan`` on the same
    data and batch size (the same index draws).
(c) N-scaling: per-step time at N = 10^6 / at N = 10^4, n = 100; for contrast the
    same ratio for a hand-written loop whose minibatch comes from NumPyro's own
    ``plate(subsample_size=n)`` (which draws a permutation of N per step).
(d) corrected (and extreme) / vanilla, whose noise estimate needs the n per-datum
    gradients: n = 100, d = 100.
(e) time to accuracy on the 10^6-row regression: wall time of a whole run (from
    the model to the draws: mode search, compilation and sampling) until SGBD and
    SGLD, corrected with control-variate gradients and the best of a step-size grid,
    reach xi <= 0.1 and standardised mean bias <= 0.25 against NUTS's draws, / the
    wall time of NUTS's 500 warmup + 1000 draws.
(f) memory: peak resident memory of a run at N = 10^7 (and 10^6), d = 10, above
    the resident memory once the data are loaded.
(g) the progress bar: per-sample time of every sampler with ``progress_bar=True``
    / with the bar off, the same chain (one step a sample, the default), and with
    the bar on and ``num_steps=100`` per step / the bar off (the bar's Python
    loop paid once per 100 steps: another chain, every 100th step kept);
    N = 10^6, d = 10, n = 1000.
(i) the default path part by part: per-step time of SGBD and SGLD with control
    variates, the corrected variant, the preconditioner found at the mode, each
    added in turn, and of ``step_size=None`` (all three, the step adapted),
    / vanilla with a given step; N = 10^6, n = 1000, d = 10 and 100, bar off,
    the cases' runs alternating.
(h) high dimension: the matrix-factorisation example on MovieLens (d = 194,820,
    n = 800): ms per step of vanilla and corrected SGBD and NOGIN with a diagonal
    noise covariance, the working memory XLA allocates for a compiled loop of
    steps, and the growth of the peak resident memory while it runs (each kernel
    in a subprocess).

Per-step times of MCMC runs are marginal, (T(6k) - T(k)) / 5k, each T the fastest
of ``--repeats`` runs less the seconds JAX reports compiling in it (NumPyro's
``MCMC.run`` compiles its sampling loop again on every call), with
``jit_model_args=True`` when the bar is off; the scans take the data as arguments
and are compiled once and timed on later calls (median of three).
"""

import argparse
import contextlib
import functools
import gc
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS, init_to_value
from numpyro.infer.util import log_density

from numpyro_sgbd import (
    NOGIN,
    SGBD,
    SGHMC,
    SGLD,
    SGNHT,
    full_batch,
    posterior_mode,
    unroll_threefry_on_cpu,
)
from numpyro_sgbd.estimators import MinibatchEstimator

KERNELS = [
    (f"{cls.__name__} {variant}", cls, variant)
    for cls in (SGBD, SGLD)
    for variant in ("vanilla", "corrected", "extreme")
]


def model(X, y, subsample_size=None):
    """Logistic regression, N(0, 1) prior on each coefficient."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def make_data(num_data, dim, seed=0):
    """N(0, 1) covariates, coefficients N(0, 1), labels from the model (float32)."""
    kx, kw, ky = random.split(random.key(seed), 3)
    X = random.normal(kx, (num_data, dim))
    w = random.normal(kw, (dim,))
    y = random.bernoulli(ky, jax.nn.sigmoid(X @ w)).astype(jnp.float32)
    return X, y


def _loglik(w, x, y):
    logits = x @ w
    return jnp.sum(y * logits - jnp.logaddexp(0.0, logits))


def _scan_seconds(run, num_steps, X, y, repeats=3):
    """Seconds per step of a jitted ``run(key, X, y)`` (the data as arguments, as in
    the kernels' runs): compiled on a first call, then the median of ``repeats``
    timed calls."""
    jax.block_until_ready(run(random.key(0), X, y))
    times = []
    for seed in range(1, repeats + 1):
        start = time.perf_counter()
        jax.block_until_ready(run(random.key(seed), X, y))
        times.append((time.perf_counter() - start) / num_steps)
    return statistics.median(times)


def floor_seconds(X, y, n, num_steps):
    """The floor: minibatch gradient of a hand-written potential, randint indices
    and a Langevin move, in a jitted ``lax.scan`` that keeps every draw."""
    N = X.shape[0]

    def potential(w, x, y):
        return 0.5 * jnp.sum(w**2) - (N / n) * _loglik(w, x, y)

    @jax.jit
    def run(key, X, y):
        def step(w, key):
            k_idx, k_noise = random.split(key)
            idx = random.randint(k_idx, (n,), 0, N)
            w = w - 0.5e-6 * jax.grad(potential)(w, X[idx], y[idx])
            w = w + 1e-3 * random.normal(k_noise, w.shape)
            return w, w

        return jax.lax.scan(
            step, jnp.full(X.shape[1], 0.1), random.split(key, num_steps)
        )

    return _scan_seconds(run, num_steps, X, y)


def blackjax_seconds(X, y, n, num_steps):
    """BlackJAX's ``sgld`` (its ``grad_estimator`` over a minibatch) in a jitted
    ``lax.scan``, with the floor's index draws."""
    import blackjax
    from blackjax.sgmcmc.gradients import grad_estimator

    N = X.shape[0]
    estimator = grad_estimator(
        lambda w: dist.Normal(0.0, 1.0).log_prob(w).sum(),
        lambda w, batch: _loglik(w, batch[0], batch[1]),
        N,
    )
    sgld = blackjax.sgld(estimator)

    @jax.jit
    def run(key, X, y):
        def step(w, key):
            k_idx, k_move = random.split(key)
            idx = random.randint(k_idx, (n,), 0, N)
            w = sgld.step(k_move, w, (X[idx], y[idx]), 1e-6)
            return w, w

        return jax.lax.scan(
            step, jnp.full(X.shape[1], 0.1), random.split(key, num_steps)
        )

    return _scan_seconds(run, num_steps, X, y)


def numpyro_plate_seconds(X, y, n, num_steps):
    """A hand-written loop whose minibatch is drawn by NumPyro's own subsample
    plate (``handlers.seed``): the cost NumPyro's plate subsampling sets."""

    def potential(w, key, X, y):
        seeded = numpyro.handlers.seed(model, key)
        return -log_density(seeded, (X, y, n), {}, {"w": w})[0]

    @jax.jit
    def run(key, X, y):
        def step(w, key):
            k_idx, k_noise = random.split(key)
            w = w - 0.5e-6 * jax.grad(potential)(w, k_idx, X, y)
            w = w + 1e-3 * random.normal(k_noise, w.shape)
            return w, w

        return jax.lax.scan(
            step, jnp.full(X.shape[1], 0.1), random.split(key, num_steps)
        )

    return _scan_seconds(run, num_steps, X, y)


@contextlib.contextmanager
def compile_seconds():
    """Yields a list that ends up holding the seconds JAX spent tracing, lowering
    and compiling inside the block (the union of its compile-event time spans,
    so that nested compilations count once)."""
    spans, total = [], []

    def listener(event, start, end, **kwargs):
        if event.startswith("/jax/core/compile/"):
            spans.append((start, end))

    jax.monitoring.register_event_time_span_listener(listener)
    try:
        yield total
    finally:
        jax.monitoring.unregister_event_time_span_listener(listener)
        total.append(_covered(spans))
        total.append(spans)  # (start, end) in time.time() seconds


def _covered(spans):
    """Seconds covered by the union of ``(start, end)`` spans."""
    covered, last = 0.0, -np.inf
    for start, end in sorted(spans):
        covered += max(0.0, end - max(start, last))
        last = max(last, end)
    return covered


def _run_seconds(kernel, X, y, num_samples, progress_bar):
    """Wall seconds of one ``MCMC.run`` less the time spent compiling in it."""
    mcmc = MCMC(
        kernel,
        num_warmup=0,
        num_samples=num_samples,
        # Bar off: the data as arguments of the loop, as for the floor; as
        # constants (the default), each run's compilation copied them and the
        # per-step times of identical runs varied by up to a half. Bar on: the
        # default, since with jit_model_args=True NumPyro's per-step dispatch
        # returns the data from every step, a copy (15 ms a step at N = 10^6).
        jit_model_args=not progress_bar,
    )
    mcmc.progress_bar = progress_bar  # (NumPyro's MCMC turns it off where CI is set)
    init = {"w": jnp.full(X.shape[1], 0.1)}
    start = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()), compile_seconds() as compiling:
        # (redirected: the bars would flood the table)
        mcmc.run(random.key(0), X, y, init_params=init)
        jax.block_until_ready(mcmc.get_samples())
    return time.perf_counter() - start - compiling[0]


def kernel_seconds(make_kernel, X, y, n, num_steps, progress_bar, repeats=3):
    """Marginal seconds per step of ``MCMC(make_kernel(model_n))``, ``model_n`` the
    model with ``subsample_size=n`` bound: (T(6k steps) -
    T(k steps)) / 5k, each T the fastest of ``repeats`` runs (interference only
    adds time) less its compilation time (``MCMC.run`` compiles its loop on every
    call; its variation would swamp the steps), with the garbage collector paused.
    The difference removes the rest of the per-run set-up."""
    return paired_kernel_seconds(
        [(make_kernel, num_steps, progress_bar)], X, y, n, repeats
    )[0]


def paired_kernel_seconds(cases, X, y, n, repeats=3):
    """:func:`kernel_seconds` of several ``(make_kernel, num_steps, progress_bar)``
    cases, their runs alternating: each round runs every case once, and each T is
    the fastest of ``repeats`` rounds. This machine has slow spells of seconds to
    minutes (the same program ran 1.5 times slower); alternating puts the cases
    compared in a ratio through the same spells."""
    best = [[float("inf")] * 2 for _ in cases]
    for _ in range(repeats):
        for c, (make_kernel, num_steps, progress_bar) in enumerate(cases):
            for j, num_samples in enumerate((num_steps, 6 * num_steps)):
                gc.collect()
                gc.disable()
                try:
                    t = _run_seconds(
                        make_kernel(functools.partial(model, subsample_size=n)),
                        X,
                        y,
                        num_samples,
                        progress_bar,
                    )
                finally:
                    gc.enable()
                best[c][j] = min(best[c][j], t)
    # Every MCMC.run leaves a compiled loop in JAX's caches; hundreds of them
    # exhaust the process's memory maps.
    jax.clear_caches()
    return [
        (b6 - b1) / (5 * num_steps) for (b1, b6), (_, num_steps, _) in zip(best, cases)
    ]


def _make(cls, variant, **kwargs):
    # One step a sample, with the bar too (section (g) times the default).
    return lambda model_n: cls(
        model_n, step_size=1e-3, variant=variant, num_steps=1, **kwargs
    )


class Table:
    """Rows printed as they come and kept for the Markdown file."""

    def __init__(self):
        self.sections = []

    def section(self, title, columns):
        self.sections.append((title, columns, []))
        print(f"\n{title}")
        print("  ".join(f"{c:>14}" if i else f"{c:<30}" for i, c in enumerate(columns)))

    def row(self, *cells):
        text = [c if isinstance(c, str) else f"{c:.3g}" for c in cells]
        self.sections[-1][2].append(text)
        print("  ".join(f"{c:>14}" if i else f"{c:<30}" for i, c in enumerate(text)))
        sys.stdout.flush()

    def markdown(self):
        out = []
        for title, columns, rows in self.sections:
            out += [f"**{title}**", "", "| " + " | ".join(columns) + " |"]
            out.append("|" + "|".join(["---"] * len(columns)) + "|")
            out += ["| " + " | ".join(row) + " |" for row in rows]
            out.append("")
        return "\n".join(out)


def _steps_for(args, seconds_per_step):
    """k such that the timed difference, 5k steps, lasts about
    ``args.timed_seconds`` (at least ``args.num_steps``)."""
    return max(args.num_steps, int(args.timed_seconds / seconds_per_step / 5))


def per_step(table, args):
    """Sections (a), (b), (c)."""
    X, y = make_data(args.num_data, 10)
    results, floors = {}, {}
    for n in (1000, 100):
        probe = floor_seconds(X, y, n, 6 * args.num_steps)
        steps = _steps_for(args, probe)
        floors[n] = floor = floor_seconds(X, y, n, 6 * steps)
        bj = blackjax_seconds(X, y, n, 6 * steps)
        table.section(
            f"(a), (b) N = {args.num_data:.0e}, d = 10, n = {n}: floor "
            f"{1e6 * floor:.1f} us/step, BlackJAX sgld {1e6 * bj:.1f} us/step",
            ["kernel", "bar", "us/step", "/ floor", "/ BlackJAX"],
        )
        for name, cls, variant in KERNELS:
            for bar in (False, True):
                # With the bar a step costs about 0.1 ms: fewer steps suffice.
                k = steps if not bar else _steps_for(args, 1e-4)
                t = kernel_seconds(_make(cls, variant), X, y, n, k, bar, args.repeats)
                results[(name, n, bar)] = t
                table.row(name, "on" if bar else "off", 1e6 * t, t / floor, t / bj)
    small_N = args.small_data
    Xs, ys = make_data(small_N, 10)
    steps = _steps_for(args, floors[100])
    small_floor = floor_seconds(Xs, ys, 100, 6 * steps)
    floor_ratio = floors[100] / small_floor
    table.section(
        f"(c) per-step time at N = {args.num_data:.0e} / at N = {small_N:.0e}, "
        "n = 100, bar off",
        ["method", f"us/step N={small_N:.0e}", "ratio", "ratio / floor's"],
    )
    table.row("floor (randint)", 1e6 * small_floor, floor_ratio, 1.0)
    for name, cls, variant in KERNELS:
        t = kernel_seconds(_make(cls, variant), Xs, ys, 100, steps, False, args.repeats)
        ratio = results[(name, 100, False)] / t
        table.row(name, 1e6 * t, ratio, ratio / floor_ratio)
    k = _steps_for(args, 2e-4)
    big = numpyro_plate_seconds(X, y, 100, k)
    small = numpyro_plate_seconds(Xs, ys, 100, k)
    table.row(
        "NumPyro plate subsampling loop",
        1e6 * small,
        big / small,
        big / small / floor_ratio,
    )


def per_datum(table, args):
    """Section (d)."""
    X, y = make_data(args.wide_data, 100)
    steps = _steps_for(args, floor_seconds(X, y, 100, 6 * args.num_steps))
    table.section(
        f"(d) N = {args.wide_data:.0e}, d = 100, n = 100, bar off: per-datum "
        "gradients / vanilla",
        ["kernel", "us/step", "/ vanilla"],
    )
    for cls in (SGBD, SGLD):
        vanilla = kernel_seconds(
            _make(cls, "vanilla"), X, y, 100, steps, False, args.repeats
        )
        table.row(f"{cls.__name__} vanilla", 1e6 * vanilla, 1.0)
        for variant in ("corrected", "extreme"):
            t = kernel_seconds(
                _make(cls, variant), X, y, 100, steps, False, args.repeats
            )
            table.row(f"{cls.__name__} {variant}", 1e6 * t, t / vanilla)


def _errors(draws, ref_mean, ref_sd):
    sd = draws.std(axis=0, ddof=1)
    xi = np.linalg.norm(sd - ref_sd) / np.linalg.norm(ref_sd)
    bias = np.max(np.abs(draws.mean(axis=0) - ref_mean) / ref_sd)
    return xi, bias


def accuracy_child(spec):
    """Run in a fresh subprocess (so that nothing compiled by an earlier run is
    reused): one NUTS or SG run on the regression, timed from the model (after the
    imports and the data), printed as JSON. NUTS saves its draws to ``spec["ref"]``;
    an SG run compares its draws with them."""
    X, y = make_data(spec["num_data"], 10, seed=1)
    jax.block_until_ready((X, y))
    start = time.perf_counter()
    with compile_seconds() as compiling:
        draws, phases = _accuracy_draws(spec, X, y)
    seconds = time.perf_counter() - start
    out = {"seconds": seconds, "compile_seconds": compiling[0]}
    if phases:
        # The default kernels: compiling before NumPyro traces the sampling loop
        # (mode search, Hessian, centre, initial state) and after (the loop).
        started, end = phases
        out["setup_compile"] = _covered([s for s in compiling[1] if s[0] < end])
        out["loop_compile"] = _covered([s for s in compiling[1] if s[0] >= end])
        out["setup_seconds"] = end - started
    if spec["method"] == "NUTS":
        np.save(spec["ref"], draws)
    else:
        ref = np.load(spec["ref"])
        out["xi"], out["bias"] = _errors(draws, ref.mean(0), ref.std(0, ddof=1))
    print(json.dumps(out))


def _default_warmup(num_samples):
    """Warmup of the default kernels' runs in section (e')."""
    return max(200, num_samples // 10)


def _accuracy_draws(spec, X, y):
    """``(draws, phases)``: ``phases`` is ``(start, end of set-up)`` in
    ``time.time()`` seconds for the default kernels, else ``None``."""
    n = 1000
    if spec["method"] == "NUTS":
        mcmc = MCMC(
            NUTS(full_batch(model)),
            num_warmup=spec["num_warmup"],
            num_samples=spec["num_samples"],
            progress_bar=False,
        )
        mcmc.run(random.key(1), X, y, n)
        return np.asarray(mcmc.get_samples()["w"], np.float64), None
    if spec["method"].endswith("default"):
        # What a user writes: the kernel with its defaults (warmup adaptation:
        # mode search, preconditioner, control variates, adapted step).
        cls = {"SGBD default": SGBD, "SGLD default": SGLD}[spec["method"]]
        kernel = cls(functools.partial(model, subsample_size=n))
        mcmc = MCMC(
            kernel,
            num_warmup=_default_warmup(spec["num_samples"]),
            num_samples=spec["num_samples"],
            progress_bar=False,
            jit_model_args=True,
        )
        started = time.time()
        mcmc.run(random.key(2), X, y)
        draws = np.asarray(mcmc.get_samples()["w"], np.float64)
        # The kernel notes (None, perf_counter()) at init and when NumPyro
        # traces its step: the second is where the sampling loop's compilation
        # begins.
        traced = [t for i, t in kernel._monitor.clock if i is None][1]
        return draws, (started, traced - time.perf_counter() + time.time())
    # The whole pipeline a user runs: the mode (centre, start, per-coordinate
    # scales), then the kernel, compiled and run.
    cls = {"SGBD": SGBD, "SGLD": SGLD}[spec["method"]]
    mode = posterior_mode(model, X, y, n)
    kernel = cls(
        functools.partial(model, subsample_size=n),
        step_size={"w": spec["c"] / jnp.sqrt(mode.hessian_diag["w"])},
        variant="corrected",
        gradient="control_variates",
        centre=mode.params,
        init_strategy=init_to_value(values=mode.params),
    )
    mcmc = MCMC(
        kernel,
        num_warmup=spec["num_samples"] // 10,
        num_samples=spec["num_samples"],
        progress_bar=False,
        jit_model_args=True,  # the data as arguments of the loop, not constants
    )
    mcmc.run(random.key(2), X, y)
    return np.asarray(mcmc.get_samples()["w"], np.float64), None


def _child(flag, spec, env=None):
    command = [sys.executable, __file__, flag, json.dumps(spec)]
    out = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if out.returncode != 0:
        raise RuntimeError(f"{flag} {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_to_accuracy(table, args, grid=True):
    """Section (e): every run in a fresh process (``grid=False``: NUTS and the
    default kernels only)."""
    N = args.accuracy_data
    with tempfile.TemporaryDirectory() as tmp:
        ref = os.path.join(tmp, "nuts.npy")
        base = {"num_data": N, "ref": ref}
        nuts = _child(
            "--accuracy-child",
            {
                **base,
                "method": "NUTS",
                "num_warmup": args.nuts_warmup,
                "num_samples": args.nuts_samples,
            },
        )
        nuts_seconds = nuts["seconds"]
        table.section(
            f"(e) time to xi <= 0.1 and bias <= 0.25, N = {N:.0e}, d = 10, "
            f"n = 1000: NUTS {args.nuts_warmup} + {args.nuts_samples} took "
            f"{nuts_seconds:.1f} s ({nuts['compile_seconds']:.1f} s compiling)",
            ["method", "step c", "steps", "seconds", "compiling s", "xi", "bias"]
            + ["/ NUTS"],
        )
        for method in ("SGBD", "SGLD") if grid else ():
            best = None
            for c in args.step_grid:
                # The shortest run of the length grid that is accurate at this c.
                for num_samples in args.length_grid:
                    spec = {**base, "method": method, "c": c}
                    out = _child(
                        "--accuracy-child", {**spec, "num_samples": num_samples}
                    )
                    if out["xi"] <= 0.1 and out["bias"] <= 0.25:
                        if best is None or out["seconds"] < best[2]["seconds"]:
                            best = (c, num_samples, out)
                        break
            name = f"{method} corrected, CV"
            if best is None:
                table.row(name, "-", "-", "not reached", "-", "-", "-", "-")
            else:
                c, num_samples, out = best
                table.row(
                    name,
                    c,
                    f"{num_samples // 10}+{num_samples}",
                    out["seconds"],
                    out["compile_seconds"],
                    out["xi"],
                    out["bias"],
                    out["seconds"] / nuts_seconds,
                )

        default_rows(table, args, base, nuts_seconds)


def default_rows(table, args, base, nuts_seconds):
    """Section (e), the default kernels: the shortest run of the length grid that
    is accurate, in a fresh process; then the same run in a second fresh process
    that finds JAX's persistent compilation cache filled by the first."""
    table.section(
        "(e') the same with the kernels' defaults (SGBD(model), SGLD(model): "
        "warmup adaptation), fresh process; compile seconds before the sampling "
        "loop (mode search, Hessian, centre, initial state) and of the loop",
        ["method", "steps", "seconds", "setup s", "setup compile s"]
        + ["loop compile s", "xi", "bias", "/ NUTS", "2nd process s"],
    )
    for method in ("SGBD default", "SGLD default"):
        found = None
        for num_samples in args.length_grid:
            spec = {**base, "method": method, "num_samples": num_samples}
            out = _child("--accuracy-child", spec)
            if out["xi"] <= 0.1 and out["bias"] <= 0.25:
                found = (num_samples, out)
                break
        if found is None:
            table.row(method, "-", "not reached", *["-"] * 7)
            continue
        num_samples, out = found
        with tempfile.TemporaryDirectory() as cache:
            env = {
                "JAX_COMPILATION_CACHE_DIR": cache,
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            }
            spec = {**base, "method": method, "num_samples": num_samples}
            _child("--accuracy-child", spec, env)  # fills the cache
            second = _child("--accuracy-child", spec, env)
        table.row(
            method,
            f"{_default_warmup(num_samples)}+{num_samples}",
            out["seconds"],
            out["setup_seconds"],
            out["setup_compile"],
            out["loop_compile"],
            out["xi"],
            out["bias"],
            out["seconds"] / nuts_seconds,
            second["seconds"],
        )


def _rss_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(num_data, n, num_steps, jit_model_args):
    """Run in a subprocess: data, then the resident memory before and at the peak of
    one ``MCMC(SGBD(model, variant='corrected'))`` run."""
    # Build the data in chunks so that making it never holds more than the data.
    chunks, rows = [], 1_000_000
    for i, lo in enumerate(range(0, num_data, rows)):
        Xc, yc = make_data(min(rows, num_data - lo), 10, seed=i)
        chunks.append((np.asarray(Xc), np.asarray(yc)))
        del Xc, yc
    X = jnp.asarray(np.concatenate([c[0] for c in chunks]))
    y = jnp.asarray(np.concatenate([c[1] for c in chunks]))
    del chunks
    jax.block_until_ready((X, y))
    data_mb = (X.nbytes + y.nbytes) / 2**20
    before = _rss_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM)
        f.write("5")
    kernel = SGBD(
        functools.partial(model, subsample_size=n), step_size=1e-3, variant="corrected"
    )
    mcmc = MCMC(
        kernel,
        num_warmup=0,
        num_samples=num_steps,
        progress_bar=False,
        jit_model_args=jit_model_args,
    )
    mcmc.run(random.key(0), X, y, init_params={"w": jnp.full(10, 0.1)})
    jax.block_until_ready(mcmc.get_samples())
    peak = _rss_mb("VmHWM")
    print(json.dumps({"data_mb": data_mb, "before_mb": before, "peak_mb": peak}))


def memory(table, args):
    """Section (f)."""
    table.section(
        "(f) peak resident memory of a run above the memory with the data loaded "
        f"(SGBD corrected, d = 10, n = 1000, {args.memory_steps} steps, bar off)",
        ["N", "jit_model_args", "data MB", "RSS with data MB", "peak - RSS MB"],
    )
    for num_data in args.memory_data:
        for jit_model_args in (False, True):
            command = [sys.executable, __file__, "--memory-child", str(num_data)]
            command += ["--memory-steps", str(args.memory_steps)]
            command += ["--memory-jit-model-args"] if jit_model_args else []
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            m = json.loads(out.stdout.strip().splitlines()[-1])
            table.row(
                f"{num_data:.0e}",
                str(jit_model_args),
                m["data_mb"],
                m["before_mb"],
                m["peak_mb"] - m["before_mb"],
            )


def _bar_kernels():
    """(name, make(num_steps) -> make_kernel) for section (g): every sampler at a
    fixed step (no adaptation, so that runs without warmup time its steps), on
    minibatch gradients."""

    def of(cls, **kwargs):
        def make(num_steps):
            return lambda model_n: cls(model_n, num_steps=num_steps, **kwargs)

        return make

    return [
        ("SGBD vanilla", of(SGBD, step_size=1e-3, variant="vanilla")),
        ("SGBD corrected", of(SGBD, step_size=1e-3, variant="corrected")),
        ("SGLD vanilla", of(SGLD, step_size=1e-3, variant="vanilla")),
        ("SGLD corrected", of(SGLD, step_size=1e-3, variant="corrected")),
        ("NOGIN", of(NOGIN, step_size=1e-3)),
        ("SGHMC", of(SGHMC, step_size=1e-3)),
        ("SGNHT", of(SGNHT, step_size=1e-3)),
    ]


#: Section (g)'s steps per sample for the bar's fast path.
_BAR_STEPS = 100


def progress_bar(table, args):
    """Section (g)."""
    X, y = make_data(args.num_data, 10)
    n = 1000
    steps = _steps_for(args, floor_seconds(X, y, n, 6 * args.num_steps))
    table.section(
        f"(g) N = {args.num_data:.0e}, d = 10, n = {n}: progress bar on / off, "
        f"per step; the same chain (num_steps=1), and with num_steps={_BAR_STEPS} "
        "under the bar",
        [
            "kernel",
            "off us/step",
            "on us/step",
            "on / off",
            f"on, k={_BAR_STEPS}, us/step",
            f"on, k={_BAR_STEPS} / off",
        ],
    )
    kernels = [k for k in _bar_kernels() if not args.kernels or k[0] in args.kernels]
    for name, make in kernels:
        off, on, on_k = paired_kernel_seconds(
            [
                (make(1), steps, False),
                (make(1), steps, True),
                (make(_BAR_STEPS), max(1, steps // _BAR_STEPS), True),
            ],
            X,
            y,
            n,
            args.repeats,
        )
        on_k /= _BAR_STEPS
        table.row(name, 1e6 * off, 1e6 * on, on / off, 1e6 * on_k, on_k / off)


def high_dim_child(spec):
    """Run in a subprocess: the kernels ``spec["kernels"]`` on the
    matrix-factorisation example's full MovieLens data (d = 194,820, n = 800),
    each a compiled loop of ``spec["num_steps"]`` steps. Per kernel: the working
    memory XLA allocates for it (temporaries, beyond its arguments: data, state
    and parameters), the growth of the resident memory's peak while it first
    runs (after the kernels before it), and seconds per step, the fastest of
    ``spec["repeats"]`` rounds that run the kernels in turn (so that this
    machine's slow spells meet them all alike)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from examples.matrix_factorisation import load_data
    from examples.matrix_factorisation import model as bpmf

    num_steps = spec["num_steps"]
    if spec.get("row_budget"):
        MinibatchEstimator.row_budget = spec["row_budget"]
    train, _, num_users, num_movies = load_data()
    n = train[0].shape[0] // 100
    model_n = functools.partial(
        bpmf, num_users=num_users, num_movies=num_movies, subsample_size=n
    )
    fixed = {"preconditioner": "none", "gradient": "minibatch"}
    make = {
        "SGBD vanilla": lambda: SGBD(model_n, step_size=0.011, **fixed),
        "SGBD corrected": lambda: SGBD(
            model_n, step_size=0.011, variant="corrected", **fixed
        ),
        "NOGIN diag": lambda: NOGIN(
            model_n, step_size=0.01, covariance="diag", **fixed
        ),
    }
    device = jax.local_devices()[0]
    on_device = device.platform != "cpu"
    runs, rows = {}, {}
    for name in spec["kernels"]:
        kernel = make[name]()
        state = kernel.init(random.key(0), 0, None, train, {})

        def loop(state, args, kernel=kernel):
            return jax.lax.fori_loop(
                0, num_steps, lambda _, s: kernel.sample(s, args, {}), state
            )

        compiled = jax.jit(loop).lower(state, train).compile()
        jax.block_until_ready(compiled(state, train))
        if on_device:  # the accelerator's memory: its peak beyond what is held now
            held = device.memory_stats()["bytes_in_use"]
        before = _rss_mb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM)
            f.write("5")
        jax.block_until_ready(compiled(state, train))
        peak_mb = _rss_mb("VmHWM") - before
        if on_device:
            peak_mb = (device.memory_stats()["peak_bytes_in_use"] - held) / 2**20
        runs[name] = functools.partial(compiled, state, train)
        rows[name] = {
            "seconds": float("inf"),
            "temp_mb": compiled.memory_analysis().temp_size_in_bytes / 2**20,
            "peak_mb": peak_mb,
            "d": sum(int(np.size(x)) for x in jax.tree.leaves(state.z)),
            "n": n,
        }
    for _ in range(spec["repeats"]):
        for name, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            seconds = (time.perf_counter() - start) / num_steps
            rows[name]["seconds"] = min(rows[name]["seconds"], seconds)
    print(json.dumps(rows))


def high_dim(table, args):
    """Section (h)."""
    names = ("SGBD vanilla", "SGBD corrected", "NOGIN diag")
    spec = {"kernels": names, "num_steps": args.high_dim_steps}
    spec.update(row_budget=args.row_budget, repeats=args.repeats)
    rows = _child("--high-dim-child", spec)
    # Memory beyond the data and state: the resident set's growth on a CPU, the
    # allocator's peak above what it held before the timed run on an accelerator;
    # each kernel in a process of its own, where no other kernel's freed memory
    # can be reused.
    for name in names:
        alone = _child("--high-dim-child", {**spec, "kernels": [name], "repeats": 0})
        rows[name]["peak_mb"] = alone[name]["peak_mb"]
    peak = "peak RSS +MB" if jax.default_backend() == "cpu" else "peak device +MB"
    m = rows["SGBD vanilla"]
    floats = 4 * (m["n"] + m["d"])
    table.section(
        f"(h) matrix factorisation, d = {m['d']:,}, n = {m['n']}, "
        f"{args.high_dim_steps} steps in one compiled loop, fastest of "
        f"{args.repeats} alternating rounds"
        + (f", row_budget {args.row_budget}" if args.row_budget else "")
        + f"; target: working memory <= 4 (n + d) floats = "
        f"{4 * floats / 2**20:.1f} MB",
        ["kernel", "ms/step", "/ vanilla", "XLA temp MB", peak],
    )
    for name in names:
        r = rows[name]
        table.row(
            name,
            1e3 * r["seconds"],
            r["seconds"] / m["seconds"],
            r["temp_mb"],
            r["peak_mb"],
        )


def _default_path_cases(cls, centre):
    """(label, make_kernel) of :func:`default_path`: vanilla, then each part of
    the default path added in turn, then the default itself."""
    given = dict(step_size=1e-3)
    cv = dict(gradient="control_variates", centre=centre)
    parts = [
        ("vanilla", dict(given, variant="vanilla")),
        ("+ control variates", dict(given, variant="vanilla", **cv)),
        ("corrected alone", dict(given, variant="corrected")),
        ("+ corrected", dict(given, variant="corrected", **cv)),
        (
            "+ preconditioner",
            dict(given, variant="corrected", preconditioner="auto", **cv),
        ),
        ("default (step_size=None)", {}),
    ]
    return [(label, lambda model_n, kw=kw: cls(model_n, **kw)) for label, kw in parts]


def default_path(table, args):
    """Section (i)."""
    import warnings

    for d in (10, 100):
        X, y = make_data(args.num_data, d)
        centre = {"w": jnp.zeros(d)}
        n = 1000
        steps = _steps_for(args, 3e-4 if d == 10 else 2e-3)
        for cls in (SGBD, SGLD):
            cases = _default_path_cases(cls, centre)
            with warnings.catch_warnings():
                # num_warmup=0 with step_size=None: nothing adapted (the step's
                # cost is the same); 1e-3 in u is a tiny step (its cost too).
                warnings.simplefilter("ignore")
                times = paired_kernel_seconds(
                    [(make, steps, False) for _, make in cases],
                    X,
                    y,
                    n,
                    args.repeats,
                )
            table.section(
                f"(i) {cls.__name__}, N = {args.num_data:.0e}, d = {d}, n = {n}, "
                "bar off: the default path's parts / vanilla",
                ["kernel", "us/step", "/ vanilla"],
            )
            for (label, _), t in zip(cases, times):
                table.row(label, 1e6 * t, t / times[0])


def main(args):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
    if args.accuracy_child:
        accuracy_child(json.loads(args.accuracy_child))
        return
    if args.high_dim_child:
        high_dim_child(json.loads(args.high_dim_child))
        return
    if args.memory_child:
        memory_child(
            args.memory_child, 1000, args.memory_steps, args.memory_jit_model_args
        )
        return
    if args.quick:
        args.num_data, args.small_data, args.wide_data = 100_000, 10_000, 20_000
        args.num_steps, args.repeats, args.timed_seconds = 1000, 2, 0.1
        args.accuracy_data, args.nuts_warmup, args.nuts_samples = 20_000, 200, 400
        args.memory_data, args.memory_steps = [100_000, 1_000_000], 500
        args.length_grid = args.length_grid[:3]
    table = Table()
    started = time.perf_counter()
    print(
        f"numpyro-sgbd benchmarks: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, jax {jax.__version__}, numpyro "
        f"{numpyro.__version__}, backend {jax.default_backend()}"
        + (" (--quick)" if args.quick else "")
    )
    for part in args.parts:
        {
            "abc": per_step,
            "d": per_datum,
            "e": time_to_accuracy,
            "e'": functools.partial(time_to_accuracy, grid=False),
            "f": memory,
            "g": progress_bar,
            "h": high_dim,
            "i": default_path,
        }[part](table, args)
    elapsed = time.perf_counter() - started
    print(f"\n{elapsed / 60:.1f} minutes")
    if not args.output:
        print("not written: pass --output FILE to keep a run of some parts")
    else:
        header = (
            f"Command: `python benchmarks/run.py{getattr(args, 'command_line', '')}`; "
            f"{os.cpu_count()} CPU cores, jax {jax.__version__}, numpyro "
            f"{numpyro.__version__}; {elapsed / 60:.1f} minutes.\n\n"
        )
        with open(args.output, "w") as f:
            f.write(header + table.markdown())
        print(f"wrote {args.output}")


#: What ``python benchmarks/run.py`` runs by default ("e'" is within "e").
_ALL_PARTS = ("abc", "d", "e", "f", "g", "h", "i")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, fast")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=list(_ALL_PARTS),
        choices=[*_ALL_PARTS, "e'"],
    )
    parser.add_argument("--high-dim-steps", type=int, default=20)
    parser.add_argument(
        "--row-budget",
        type=int,
        default=0,
        help="section (h): MinibatchEstimator.row_budget, floats per chunk of "
        "per-datum gradients (0: the default)",
    )
    parser.add_argument("--high-dim-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--num-data", type=int, default=1_000_000)
    parser.add_argument("--small-data", type=int, default=10_000)
    parser.add_argument("--wide-data", type=int, default=100_000)
    parser.add_argument(
        "--num-steps",
        type=int,
        default=4000,
        help="k: MCMC runs of k and 6k steps give the marginal cost",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--timed-seconds",
        type=float,
        default=2.0,
        help="about how long the timed difference of two MCMC runs lasts",
    )
    parser.add_argument("--accuracy-data", type=int, default=1_000_000)
    parser.add_argument("--nuts-warmup", type=int, default=500)
    parser.add_argument("--nuts-samples", type=int, default=1000)
    parser.add_argument(
        "--step-grid",
        type=float,
        nargs="+",
        default=[0.5, 1.0, 2.0],
        help="SG step sizes c / sqrt(H_jj) at the posterior mode",
    )
    parser.add_argument(
        "--length-grid",
        type=int,
        nargs="+",
        default=[1000, 2000, 4000, 8000, 16000, 32000],
        help="sampling steps tried in turn (warmup: a tenth)",
    )
    parser.add_argument(
        "--memory-data", type=int, nargs="+", default=[1_000_000, 10_000_000]
    )
    parser.add_argument("--memory-steps", type=int, default=2000)
    parser.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--memory-jit-model-args", action="store_true", help=argparse.SUPPRESS
    )
    parser.add_argument("--accuracy-child", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--output",
        default=None,
        help="Markdown file for the table (default: benchmarks/results.md when "
        "every part runs; a run of some parts writes only where this is given, "
        "so that it does not overwrite the full table)",
    )
    parser.add_argument(
        "--kernels",
        nargs="+",
        default=None,
        help="(g): only these kernels (names as in its table, e.g. 'SGBD vanilla')",
    )
    args = parser.parse_args(argv)
    names = [name for name, _ in _bar_kernels()]
    unknown = sorted(set(args.kernels or ()) - set(names))
    if unknown:
        parser.error(f"--kernels: unknown {unknown}; section (g) times {names}")
    if args.output is None and set(args.parts) == set(_ALL_PARTS):
        args.output = os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results.md"
        )
    return args


if __name__ == "__main__":
    arguments = parse_args()
    arguments.command_line = "".join(f" {a}" for a in sys.argv[1:])
    main(arguments)
