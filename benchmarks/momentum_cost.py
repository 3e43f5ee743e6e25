"""Per-step cost of the momentum samplers SGHMC and SGNHT against BlackJAX's and
against the minibatch-gradient floor, with the other kernels for comparison.

Logistic regression (``run.model``, covariates scaled by 1/sqrt(d) so that the
logits are of order 1), N = 10^5 rows, d = 100, minibatch n = 100 (defaults)::

    python benchmarks/momentum_cost.py [--num-data 100000] [--dim 100]
        [--subsample-size 100] [--num-steps 2000] [--repeats 3]
    python benchmarks/momentum_cost.py --only-existing   # floor, SGBD, SGLD, NOGIN

Rows, each the microseconds of one step (one minibatch gradient):

- ``SGHMC(model, step_size=1e-3, friction=1, variant="vanilla")``,
  ``SGNHT(model, step_size=1e-3, diffusion=1, variant="vanilla")``, ``SGBD`` and
  ``SGLD`` (vanilla, step 1e-3) and ``NOGIN(step_size=0.1, mass=1e3,
  covariance="diag")``, all with ``preconditioner="none"`` and
  ``gradient="minibatch"`` (indices drawn with replacement, as the default chooses
  for n <= N/100), run by NumPyro's ``MCMC`` with the progress bar off and
  ``jit_model_args=True``, as in ``run.py``.
- BlackJAX: the gradient of
  ``blackjax.sgmcmc.gradients.grad_estimator(logprior_fn, loglikelihood_fn, N)``
  of the same log density on a minibatch of ``random.randint`` indices, in a
  jitted ``lax.scan`` that keeps every position (as ``MCMC`` keeps every draw):
  ``blackjax.sgnht``, a fresh minibatch per step; ``blackjax.sghmc`` with
  ``num_integration_steps=10``, its time per call / 10; and "sghmc, integrator
  loop": BlackJAX's SGHMC integrator (``sgmcmc.diffusions.sghmc``, the body of
  ``blackjax.sghmc``'s inner loop) with the momentum carried and a fresh minibatch
  per step, which is our step's work and SGHMC's reference.
- the floor: a jitted ``lax.scan`` that draws the indices and evaluates the
  minibatch gradient of the same potential, and nothing else (its carry
  ``w - 1e-9 * grad`` only keeps the gradient from being optimised away).

Every row is a marginal time, (T(6k) - T(k)) / 5k from one run of each length: the
scans compiled beforehand, the ``MCMC`` runs (which compile their loop on every
call) less the time JAX reports compiling in them, as in ``run.kernel_seconds``.
Each kernel is timed ``--repeats`` times; every round times, kernel by kernel, the
floor, the kernel's BlackJAX rows, then the kernel, so each ratio is of times taken
seconds apart (the load of a shared machine drifts). Printed: the median time and
the median of the paired ratios.

Equivalent hyperparameters. BlackJAX's integrators (``sgmcmc/diffusions.py``),
temperature 1, g the minibatch gradient of the log density (-grad U)::

    sghmc:  x <- x + h p;  p <- (1 - alpha h) p + h g + sqrt(h (2 alpha - h beta)) n
    sgnht:  x <- x + h p;  p <- (1 - xi h) p + h g + sqrt(h (2 alpha - h beta)) n;
            xi <- xi + h (p'.p' / d - 1)

Ours (recipe paper, eqs. 12 and 15, vanilla, mass 1) are the same with h = eps
(``step_size``), alpha = C (SGHMC's ``friction``) or A (SGNHT's ``diffusion``),
beta = 0 (vanilla: no noise estimate subtracted) and BlackJAX's thermostat started
at xi = A, as ours is. One difference at equal cost: BlackJAX updates xi from the
new momentum p', ours (eq. 15) from the old one. ``blackjax.sghmc`` draws a fresh
momentum on every call and makes ``num_integration_steps`` steps on one
minibatch. With 1 step per call it never uses the gradient (the position moves
with the fresh momentum; the updated one is thrown away), and XLA drops the
gradient altogether: the output does not depend on the data, and its compiled
step has no dot product. Hence 10 steps per call, divided by 10: one minibatch
(index draw and gather) per ten steps, and the last of the ten gradients is
unused, so that row is below the floor and is not a like-for-like reference.

Measured 2026-11-25 on the 2-core development machine (CPU only, jax 0.10.2,
numpyro 0.22.0, blackjax 1.7.1), defaults. Quiet spell (load average 0.1 at the
start), 1.7 minutes::

    row                               us/step  / floor  / BlackJAX
    floor (indices + gradient)           13.2
    BlackJAX sghmc, integrator loop      16.8     1.24
    BlackJAX sghmc, 10 steps/call         8.3     0.61
    BlackJAX sgnht                       16.9     1.30
    SGHMC vanilla                        22.0     1.70        1.34
    SGNHT vanilla                        22.4     1.84        1.28
    SGBD vanilla                         24.4     1.98
    SGLD vanilla                         23.6     1.92
    NOGIN diag                           33.5     2.18
    SGHMC vanilla / BlackJAX sghmc, 10 steps/call: 2.64

Two runs on the busy machine (load average 3 and 2, shared with other work; 3.1 and
2 minutes, the times 1.5 to 2.5 times the quiet ones) gave SGHMC / integrator loop
1.30 and 1.05, SGNHT / sgnht 1.44 and 1.57, and the kernels 1.4 to 2.5 times the
floor. Target SGHMC, SGNHT <= 1.0 x BlackJAX: missed by about a third. Where the
third goes (bare ``lax.scan`` loops of the pieces, fastest of 12 calls, load 3, in
us/step): floor 25.7; our minibatch estimator alone 26.1 (NumPyro's model-based
gradient costs what the hand-written one does); our estimator + the pure
``sghmc_step`` 33.7 against BlackJAX's integrator loop 32.1 (1.05; SGNHT 37.5
against 34.7, 1.08); the kernel's ``sample`` (adapter: key splits, the non-finite
check and guard, its statistics) 37.5; under ``MCMC`` 42.8 to 47.1 (collecting six
fields a step, the host-clock callback, NumPyro's loop).

Before/after the refactor that introduced the shared non-finite guard
(``_guard``; commit 9282062): ``--only-existing`` from a worktree of 169ce5d (the
commit before it) and from the working tree, alternately, three rounds each::

    git -C /work/main worktree add /tmp/headtree 169ce5d
    PYTHONPATH=/tmp/headtree python benchmarks/momentum_cost.py --only-existing
    python benchmarks/momentum_cost.py --only-existing
    git -C /work/main worktree remove --force /tmp/headtree

(The script prints which ``numpyro_sgbd`` it imported.) Medians of the three
rounds' medians, load average 1.1 to 1.6, 50 s a run; in us/step and / floor::

    kernel          before           after
    SGBD vanilla    29.4   1.89      26.5   2.05
    SGLD vanilla    22.9   1.71      21.9   1.62
    NOGIN diag      32.7   2.42      33.2   2.76

The rounds scatter by 20 %; a second comparison, NOGIN and SGLD only, six paired
repeats a process, three processes each, gave NOGIN 2.47, 2.57, 2.47 x floor
before and 2.47, 2.50, 2.36 after, SGLD 1.81, 1.74, 1.73 before and 1.63, 1.82,
1.64 after: no change that these measurements can resolve.
"""

import argparse
import functools
import gc
import statistics
import time
import warnings

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.infer import MCMC
from run import _loglik, compile_seconds, make_data, model

import numpyro_sgbd
from numpyro_sgbd import NOGIN, SGBD, SGLD, unroll_threefry_on_cpu


def existing_kernels(args):
    """The kernels that predate the momentum samplers, by row name."""
    common = dict(preconditioner="none", gradient="minibatch")
    return {
        "SGBD vanilla": lambda m: SGBD(
            m, step_size=args.sgbd_step_size, variant="vanilla", **common
        ),
        "SGLD vanilla": lambda m: SGLD(
            m, step_size=args.sgld_step_size, variant="vanilla", **common
        ),
        "NOGIN diag": lambda m: NOGIN(
            m,
            step_size=args.nogin_step_size,
            mass=args.nogin_mass,
            covariance="diag",
            **common,
        ),
    }


def momentum_kernels(args):
    """SGHMC and SGNHT, vanilla (imported here, so that ``--only-existing``
    runs on commits that have neither)."""
    from numpyro_sgbd import SGHMC, SGNHT

    common = dict(variant="vanilla", preconditioner="none", gradient="minibatch")
    return {
        "SGHMC vanilla": lambda m: SGHMC(
            m, step_size=args.step_size, friction=args.friction, **common
        ),
        "SGNHT vanilla": lambda m: SGNHT(
            m, step_size=args.step_size, diffusion=args.diffusion, **common
        ),
    }


def _timed(call):
    """Wall seconds of ``call()`` less the time JAX reports compiling in it, with
    the garbage collector paused."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        with compile_seconds() as compiling:
            call()
        return time.perf_counter() - start - compiling[0]
    finally:
        gc.enable()


def mcmc_timer(make, X, y, n, num_steps):
    """A function that returns the marginal seconds per step of
    ``MCMC(make(model_n))``, (T(6k) - T(k)) / 5k, from one run of each length,
    each less the time JAX reports compiling in it (as ``run.kernel_seconds``).
    The kernel and the two MCMC objects are built and run once here and run again
    on every call: ``MCMC.run`` still compiles its loop each time, but later runs
    compile in a third of the time of the first. Each long run's draws are checked
    to be finite and to move (a chain stopped by the non-finite guard would time
    something else)."""
    kernel = make(functools.partial(model, subsample_size=n))
    runs = [
        MCMC(
            kernel,
            num_warmup=0,
            num_samples=length,
            progress_bar=False,
            jit_model_args=True,  # the data as arguments, as in run.py
        )
        for length in (num_steps, 6 * num_steps)
    ]
    init = {"w": jnp.full(X.shape[1], 0.1)}

    def call(mcmc):
        mcmc.run(random.key(0), X, y, init_params=init)
        jax.block_until_ready(mcmc.get_samples())

    for mcmc in runs:
        call(mcmc)

    def seconds():
        times = [_timed(lambda: call(mcmc)) for mcmc in runs]
        w = np.asarray(runs[1].get_samples()["w"])
        assert np.all(np.isfinite(w)) and np.ptp(w[:, 0]) > 0, "the chain stopped"
        return (times[1] - times[0]) / (5 * num_steps)

    return seconds


def scan_timer(build, X, y, num_steps, per_call=1):
    """A function that returns the marginal seconds per step of the jitted scan
    ``build(length)(key, X, y)`` of ``per_call`` steps per iteration,
    (T(6k) - T(k)) / 5k, from one call of each length; both compiled here."""
    runs = [build(length // per_call) for length in (num_steps, 6 * num_steps)]
    for run in runs:
        jax.block_until_ready(run(random.key(0), X, y))

    def seconds():
        times = [
            _timed(lambda: jax.block_until_ready(run(random.key(1), X, y)))
            for run in runs
        ]
        return (times[1] - times[0]) / (5 * num_steps)

    return seconds


def floor_scan(n, dim, num_data):
    """Index draws and the minibatch gradient of the potential, nothing else."""

    def potential(w, x, y):
        return 0.5 * jnp.sum(w**2) - (num_data / n) * _loglik(w, x, y)

    def build(length):
        @jax.jit
        def run(key, X, y):
            def step(w, key):
                idx = random.randint(key, (n,), 0, num_data)
                return w - 1e-9 * jax.grad(potential)(w, X[idx], y[idx]), None

            w0 = jnp.full(dim, 0.1)
            return jax.lax.scan(step, w0, random.split(key, length))[0]

        return run

    return build


def _estimator(num_data):
    from blackjax.sgmcmc.gradients import grad_estimator

    return grad_estimator(
        lambda w: dist.Normal(0.0, 1.0).log_prob(w).sum(),
        lambda w, datum: _loglik(w, datum[0], datum[1]),
        num_data,
    )


def blackjax_sghmc_scan(n, dim, num_data, args, integration_steps):
    """``blackjax.sghmc`` (alpha = C, beta = 0, h = eps): per call a fresh
    minibatch, a fresh momentum and ``integration_steps`` Euler steps on that
    minibatch; every position kept."""
    import blackjax

    sghmc = blackjax.sghmc(
        _estimator(num_data),
        num_integration_steps=integration_steps,
        alpha=args.friction,
        beta=0.0,
    )

    def build(length):
        @jax.jit
        def run(key, X, y):
            def step(w, key):
                k_idx, k_move = random.split(key)
                idx = random.randint(k_idx, (n,), 0, num_data)
                w = sghmc.step(k_move, w, (X[idx], y[idx]), args.step_size)
                return w, w

            w0 = sghmc.init(jnp.full(dim, 0.1))
            return jax.lax.scan(step, w0, random.split(key, length))[1]

        return run

    return build


def blackjax_integrator_scan(n, dim, num_data, args):
    """BlackJAX's SGHMC integrator (``sgmcmc.diffusions.sghmc``, the body of
    ``blackjax.sghmc``'s inner loop) with the momentum carried from step to step
    and a fresh minibatch per step: our SGHMC step's work exactly."""
    from blackjax.sgmcmc.diffusions import sghmc

    integrator = sghmc(alpha=args.friction, beta=0.0)
    estimator = _estimator(num_data)

    def build(length):
        @jax.jit
        def run(key, X, y):
            def step(carry, key):
                w, p = carry
                k_idx, k_move = random.split(key)
                idx = random.randint(k_idx, (n,), 0, num_data)
                g = estimator(w, (X[idx], y[idx]))
                w, p = integrator(k_move, w, p, g, args.step_size)
                return (w, p), w

            k_init, key = random.split(key)
            carry = (jnp.full(dim, 0.1), random.normal(k_init, (dim,)))
            return jax.lax.scan(step, carry, random.split(key, length))[1]

        return run

    return build


def blackjax_sgnht_scan(n, dim, num_data, args):
    """``blackjax.sgnht`` (alpha = A, beta = 0, h = eps, xi starting at A), a
    fresh minibatch per step, every position kept."""
    import blackjax

    sgnht = blackjax.sgnht(_estimator(num_data), alpha=args.diffusion, beta=0.0)

    def build(length):
        @jax.jit
        def run(key, X, y):
            def step(state, key):
                k_idx, k_move = random.split(key)
                idx = random.randint(k_idx, (n,), 0, num_data)
                state = sgnht.step(k_move, state, (X[idx], y[idx]), args.step_size)
                return state, state.position

            k_init, key = random.split(key)
            state = sgnht.init(jnp.full(dim, 0.1), k_init, args.diffusion)
            return jax.lax.scan(step, state, random.split(key, length))[1]

        return run

    return build


FLOOR = "floor (indices + gradient)"
BJ_SGHMC = "BlackJAX sghmc, 10 steps/call"
BJ_LOOP = "BlackJAX sghmc, integrator loop"
BJ_SGNHT = "BlackJAX sgnht"
#: The BlackJAX rows timed just before each kernel; the first is its reference.
BLACKJAX = {"SGHMC vanilla": (BJ_LOOP, BJ_SGHMC), "SGNHT vanilla": (BJ_SGNHT,)}


def main(args):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
    # Short chains from w = 0.1 still drift: the kernels' warning says so each run.
    warnings.filterwarnings("ignore", "The chain is still drifting")
    X, y = make_data(args.num_data, args.dim)
    X = X / args.dim**0.5  # logits of order 1
    N, d, n, k = args.num_data, args.dim, args.subsample_size, args.num_steps
    print(f"numpyro_sgbd from {numpyro_sgbd.__file__}")
    print(f"N={N} d={d} n={n} k={k} repeats={args.repeats}", flush=True)
    start = time.perf_counter()
    timers = {FLOOR: scan_timer(floor_scan(n, d, N), X, y, k)}
    kernels = existing_kernels(args)
    if not args.only_existing:
        timers[BJ_LOOP] = scan_timer(blackjax_integrator_scan(n, d, N, args), X, y, k)
        timers[BJ_SGHMC] = scan_timer(
            blackjax_sghmc_scan(n, d, N, args, 10), X, y, k, per_call=10
        )
        timers[BJ_SGNHT] = scan_timer(blackjax_sgnht_scan(n, d, N, args), X, y, k)
        kernels = {**momentum_kernels(args), **kernels}
    for name, make in kernels.items():
        timers[name] = mcmc_timer(make, X, y, n, k)
    # Paired and interleaved: every round times, for each kernel in turn, the
    # floor, the kernel's BlackJAX rows and the kernel; each ratio is of times
    # taken within seconds of each other (the load of the machine drifts).
    times = {name: [] for name in timers}
    ratios = {name: {} for name in timers}
    for _ in range(args.repeats):
        for kernel in kernels:
            group = {}
            for name in (FLOOR, *BLACKJAX.get(kernel, ()), kernel):
                t = timers[name]()
                times[name].append(t)
                for other, t_other in group.items():
                    ratios[name].setdefault(other, []).append(t / t_other)
                group[name] = t
        print(".", end="", flush=True)
    print(f" {time.perf_counter() - start:.0f} s")

    def ratio(name, other):
        found = ratios[name].get(other)
        return f"{statistics.median(found):.2f}" if found else ""

    print(f"{'row':<32}{'us/step':>9}{'/ floor':>9}{'/ BlackJAX':>12}  all us/step")
    for name, found in times.items():
        us = 1e6 * statistics.median(found)
        versus = ratio(name, BLACKJAX[name][0]) if name in BLACKJAX else ""
        spread = ", ".join(f"{1e6 * t:.0f}" for t in found)
        print(f"{name:<32}{us:>9.1f}{ratio(name, FLOOR):>9}{versus:>12}  {spread}")
    if BJ_SGHMC in times:
        print(f"SGHMC vanilla / {BJ_SGHMC}: {ratio('SGHMC vanilla', BJ_SGHMC)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--subsample-size", type=int, default=100)
    parser.add_argument(
        "--num-steps", type=int, default=2000, help="k: timed as 6k - k steps"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only-existing",
        action="store_true",
        help="only the floor, SGBD, SGLD and NOGIN (runs on HEAD too)",
    )
    parser.add_argument("--step-size", type=float, default=1e-3, help="SGHMC/SGNHT")
    parser.add_argument("--friction", type=float, default=1.0, help="SGHMC's C")
    parser.add_argument("--diffusion", type=float, default=1.0, help="SGNHT's A")
    parser.add_argument("--sgbd-step-size", type=float, default=1e-3)
    parser.add_argument("--sgld-step-size", type=float, default=1e-3)
    parser.add_argument("--nogin-step-size", type=float, default=0.1)
    parser.add_argument("--nogin-mass", type=float, default=1e3)
    main(parser.parse_args())
