"""MAMBA: choosing the sampler, its step size and the minibatch size for a
wall-clock budget, by successive halving scored with a Stein discrepancy.

:func:`tune` runs every combination of the given samplers, gradient estimators,
subsample sizes and step sizes (the *arms*) for a short time, scores each by the
kernel Stein discrepancy (or FSSD) of its thinned draws against the full-data score,
keeps the best third and gives the survivors three times as long, until one is left
(Coullon, South & Nemeth, Algorithm 1). It returns the winner as a kernel ready for
:class:`~numpyro.infer.MCMC`, with a table of every arm in every round.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
import functools
import logging
import math
import os
import time
from typing import NamedTuple

import jax
from jax import lax, random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.estimators import as_jax_arrays, split_arrays
from numpyro_sgbd.evaluation.fssd import fssd_opt
from numpyro_sgbd.evaluation.ksd import imq_ksd
from numpyro_sgbd.handlers import subsample_size
from numpyro_sgbd.modes import full_data_objective
from numpyro_sgbd.samplers import SGLD
from numpyro_sgbd.tuning.arguments import (  # noqa: F401 (public here as before)
    METRICS,
    MIN_DRAWS,
    SAMPLERS,
    SCORES,
    check_settings,
    constructor_accepts,
    plate_choice,
    sampler_grids,
)
from numpyro_sgbd.validation import warmup_elsewhere

__all__ = ["Arm", "TuneResult", "tune"]

logger = logging.getLogger("numpyro_sgbd")

#: Records kept per arm before its stride doubles (memory O(this x d) per arm).
_KEEP_FACTOR = 8
#: Records per compiled call at most.
_BUFFER = 256


class Arm(NamedTuple):
    """One configuration: the sampler (by name), the gradient estimator, the
    subsample size n of the plate and the step size in the whitened coordinates u
    (unit posterior scale; see :mod:`numpyro_sgbd.preconditioning`)."""

    sampler: str
    gradient: str
    subsample_size: int
    step_size: float


@dataclass
class TuneResult:
    """What :func:`tune` found.

    :ivar kernel: the winning arm as a kernel ready for
        ``MCMC(result.kernel, num_warmup=..., num_samples=...)``: its sampler with
        the winning ``step_size`` in u, the same preconditioner and gradient
        estimator, on the model with the winning subsample size. It carries the
        mode, preconditioner and centre :func:`tune` computed, so its ``init``
        searches for none of them again.
    :ivar Arm arm: the winning configuration.
    :ivar table: a :class:`pandas.DataFrame`, one row per arm and round it ran in:
        ``round``, ``sampler``, ``gradient``, ``subsample_size``, ``step_size``,
        ``seconds`` and ``steps`` (cumulative, charged to the arm), ``draws``
        (scored), ``discrepancy`` (the metric; ``inf`` for an arm that blew up or
        broke its sampler's noise bound), ``status`` (``"kept"``, ``"pruned"``,
        ``"non-finite"``, ``"noise bound"``, ``"winner"``).
    :ivar str metric: ``"ksd"`` or ``"fssd"``.
    :ivar float budget: the sampling budget in seconds (what the arms were charged,
        summed over arms and rounds).
    :ivar int rounds: the number of rounds, ``floor(log_eta M)`` (at least 1).
    :ivar dict seconds: wall-clock seconds by phase: ``"setup"`` (mode search,
        preconditioner, control-variate centre, the full-data score function),
        ``"compile"`` (each group's kernel ``init``, its compiled program, two timed
        records, and the programs for fewer chains after pruning), ``"sampling"``
        (what the arms were charged, plus overruns), ``"scoring"`` (full-data scores
        and discrepancies), ``"total"``.
    :ivar float steps_per_second: the winner's steps per charged second.
    """

    kernel: object
    arm: Arm
    table: object
    metric: str
    budget: float
    rounds: int
    seconds: dict = field(default_factory=dict)
    steps_per_second: float = float("nan")

    def num_samples(self, seconds):
        """The number of steps the winner runs in ``seconds`` at the rate it had
        during tuning (vectorised arms ran at a different rate than one chain:
        time a short run to be sure)."""
        return max(1, int(seconds * self.steps_per_second))

    def plot(self, ax=None):
        """The rounds: each arm's discrepancy against the seconds charged to it so
        far (log scale), the winner highlighted. Needs matplotlib.

        :return: the matplotlib ``Axes``.
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ImportError(
                "TuneResult.plot needs matplotlib: pip install matplotlib."
            ) from err
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        table = self.table
        finite = table[np.isfinite(table["discrepancy"])]
        for arm, rows in finite.groupby(
            ["sampler", "gradient", "subsample_size", "step_size"], sort=False
        ):
            winner = Arm(*arm) == self.arm
            ax.plot(
                rows["seconds"],
                rows["discrepancy"],
                "o-" if winner else ".-",
                color="C3" if winner else "0.6",
                lw=2 if winner else 0.8,
                zorder=3 if winner else 1,
                label=_arm_label(self.arm) if winner else None,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("seconds charged to the arm")
        ax.set_ylabel(self.metric.upper())
        ax.set_title(
            f"MAMBA: {table.groupby(list(Arm._fields)).ngroups} arms, "
            f"{self.rounds} rounds, budget {self.budget:g} s"
        )
        ax.legend(loc="best")
        return ax


def _arm_label(arm):
    return f"{arm.sampler} {arm.gradient} n={arm.subsample_size} h={arm.step_size:.3g}"


def _num_rounds(num_arms, eta):
    """``floor(log_eta M)``, at least 1, in integers."""
    rounds, m = 0, num_arms
    while m >= eta:
        m //= eta
        rounds += 1
    return max(rounds, 1)


class _Draws:
    """An arm's recorded draws (and minibatch scores), every ``stride``-th record,
    the stride doubling whenever more than ``limit`` are kept."""

    def __init__(self, limit):
        self.limit = limit
        self.stride = 1
        self.count = 0
        self.index = np.zeros(0, np.int64)
        self.rows = []
        self.grads = []

    def add(self, rows, grads):
        idx = self.count + np.arange(len(rows))
        self.count += len(rows)
        keep = idx % self.stride == 0
        self.index = np.concatenate([self.index, idx[keep]])
        self.rows.append(rows[keep])
        if grads is not None:
            self.grads.append(grads[keep])
        if len(self.index) > self.limit:
            self._thin()

    def _thin(self):
        self.stride *= 2
        keep = self.index % self.stride == 0
        self.index = self.index[keep]
        self.rows = [np.concatenate(self.rows)[keep]]
        if self.grads:
            self.grads = [np.concatenate(self.grads)[keep]]

    def take(self, num):
        """``num`` records equally spaced over the run so far (all if fewer)."""
        rows = np.concatenate(self.rows)
        grads = np.concatenate(self.grads) if self.grads else None
        m = len(rows)
        pick = np.unique(np.linspace(0, m - 1, min(num, m)).round().astype(int))
        return rows[pick], None if grads is None else grads[pick]


class _Group:
    """Arms that share a sampler, gradient estimator and subsample size: one
    kernel, its chains vectorised over the step sizes (or one arm each when
    ``vectorize=False``)."""

    def __init__(self, kernel, arms, state):
        self.kernel = kernel
        self.arms = list(arms)
        self.state = state
        self.compiled = {}


def _slice_state(state, keep):
    keep = jnp.asarray(keep)
    return jax.tree.map(lambda x: x[keep], state)


def tune(
    model,
    *model_args,
    budget,
    samplers=("SGBD", "SGLD", "SGHMC", "SGNHT", "NOGIN"),
    step_sizes=None,
    subsample_sizes=None,
    gradients=None,
    metric="ksd",
    eta=3,
    rng_key=None,
    num_draws=100,
    thinning=10,
    scores="full",
    vectorize=True,
    preconditioner="auto",
    chunk_size=4096,
    **model_kwargs,
):
    r"""Choose the sampler, step size, minibatch size and gradient estimator for a
    wall-clock budget: MAMBA, successive halving scored by a Stein discrepancy.

    The arms are every combination of ``samplers`` x ``gradients`` x
    ``subsample_sizes`` x the step sizes (``M`` in all). In each of
    :math:`R = \lfloor \log_\eta M \rfloor` rounds every surviving arm runs for
    :math:`r_i = T / (|S_i| R)` more seconds, continuing its chain; then each is
    scored by the discrepancy of ``num_draws`` of its draws (equally spaced over its
    whole run, kept every ``thinning`` steps) and only the best
    :math:`\lfloor |S_i| / \eta \rfloor` go on. The charged time of all arms sums
    to ``budget``; the winner is the best arm of the last round.

    **Coordinates.** Every arm runs with the preconditioner of
    ``step_size=None`` (the full-data mode :math:`\hat z` and
    :math:`z = \hat z + L u` from the Hessian there, found once and shared), starts
    from one draw of the Laplace approximation (the same for every arm) and
    takes its step size in u, where the posterior has unit scale. The discrepancy is
    taken in u as well, with the score :math:`L^\top \nabla_z \log\pi`, so the IMQ
    kernel's unit length fits every model. Default step sizes are the sampler's
    ``step_size=None`` target times 2, 1, 1/4, 1/16 and 1/64; default subsample
    sizes are the plate's declared n, n / 10 and 10 n (within [2, N)).

    **Time.** In round 0 the arms of one sampler, estimator and subsample size run
    as vectorised chains, one per step size, in one compiled program
    (``vectorize=True``); each is charged the program's wall time divided by the
    number of its chains. From round 1 on every surviving arm runs alone on its
    group's one-chain program and is charged its own wall time (re-vectorising the
    survivors would compile a program for each new number of chains). Compile time,
    the setup (mode search, preconditioner, centre) and scoring are measured and
    reported apart, not charged to the arms.

    **Failures.** An arm whose chain meets a non-finite value (the kernel's guard
    stops it) is scored ``inf`` and pruned, and so is an SGHMC or SGNHT arm whose
    step breaks the corrected variant's bound :math:`\epsilon \tau^2 \le 2 D` at
    the start (the kernel would refuse it); neither stops the tuning.

    :param model: the NumPyro model, its data in one subsample plate
        ``numpyro.plate(name, N, subsample_size=n)`` (several subsample plates: the
        declared sizes only, minibatch gradients only).
    :param model_args: the model's positional arguments (the data).
    :param float budget: seconds of sampling, summed over arms and rounds (T).
    :param samplers: names (``"SGBD"``, ``"SGLD"``, ``"SGHMC"``, ``"SGNHT"``,
        ``"NOGIN"``), sampler classes, or ``functools.partial`` of a class with
        fixed options (``partial(SGHMC, friction=2.0)``); ``step_size``,
        ``gradient`` and ``preconditioner`` are set by ``tune``.
    :param step_sizes: step sizes in u: a sequence for every sampler, a dict
        ``{sampler name: sequence}``, or ``None`` for each sampler's default grid.
    :param subsample_sizes: ints in ``[1, N)``, or ``None`` for the default.
    :param gradients: a subset of ``("minibatch", "control_variates")``; default
        ``step_size=None``'s choice: control variates with one subsample plate,
        plain minibatches with several.
    :param str metric: ``"ksd"`` (IMQ kernel Stein discrepancy, O(m^2 d)) or
        ``"fssd"`` (FSSD with optimised test locations, O(m d)).
    :param int eta: the pruning rate: the best ``1/eta`` of the arms survive.
    :param rng_key: a JAX random key (default ``random.key(0)``).
    :param int num_draws: draws per arm in its discrepancy (at least 10).
    :param int thinning: steps between recorded draws.
    :param str scores: ``"full"`` (the full-data score at each scored draw,
        computed in chunks of ``chunk_size`` rows) or ``"minibatch"`` (the
        stochastic KSD of the tuning paper's Appendix B.2: a minibatch estimate at
        each recorded draw; cheaper, noisier).
    :param bool vectorize: run an estimator's step sizes as vectorised chains.
    :param str preconditioner: ``"auto"``, ``"dense"``, ``"lowrank"`` or
        ``"diagonal"`` (see :class:`~numpyro_sgbd.SGBD`).
    :param int chunk_size: data rows per chunk of full-data passes.
    :param model_kwargs: the model's keyword arguments.
    :return: a :class:`TuneResult`.
    :raises ValueError: for bad arguments (before any compiling), and when the
        budget gives the slowest arm fewer than 10 recorded draws in round 0 (after
        compiling, which measures the step time; the message names the budget that
        would do).

    **References**

    1. Coullon, J., South, L. & Nemeth, C. (2023). *Efficient and generalizable
       tuning strategies for stochastic gradient MCMC.* Statistics and Computing:
       Algorithm 1 (successive halving), eqs. (3)-(4) (KSD, FSSD), Appendix B.2
       (stochastic KSD).
    2. Karnin, Z., Koren, T. & Somekh, O. (2013). *Almost optimal exploration in
       multi-armed bandits.* ICML.

    >>> import jax, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=32) as idx:
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = 1.0 + jax.random.normal(jax.random.key(0), (2000,))
    >>> result = tune(model, y, budget=2.0, samplers=["SGLD"],
    ...               gradients=["minibatch"], subsample_sizes=[32],
    ...               step_sizes=[0.4, 1e-3, 1e-5])
    >>> result.arm.step_size  # 1e-3 barely moves; 1e-5 not at all
    0.4
    >>> mcmc = MCMC(result.kernel, num_warmup=100, num_samples=1000,
    ...             progress_bar=False)
    >>> mcmc.run(jax.random.key(1), y)
    >>> bool(abs(mcmc.get_samples()["mu"].mean() - y.mean()) < 0.05)
    True
    """
    # ------------------------------------------------ arguments, before compiling
    (
        budget,
        metric,
        scores,
        eta,
        num_draws,
        thinning,
        chunk_size,
        vectorize,
        preconditioner,
    ) = check_settings(
        budget,
        metric,
        scores,
        eta,
        num_draws,
        thinning,
        chunk_size,
        vectorize,
        preconditioner,
    )
    entries, grids = sampler_grids(samplers, step_sizes)
    rng_key = random.key(0) if rng_key is None else rng_key
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    plate, gradients, subsample_sizes = plate_choice(
        model, model_args, model_kwargs, gradients, subsample_sizes
    )

    arms = [
        Arm(name, g, n, h)
        for name, _ in entries
        for g in gradients
        for n in subsample_sizes
        for h in grids[name]
    ]
    rounds = _num_rounds(len(arms), eta)
    factories = dict(entries)
    started = time.perf_counter()
    seconds = {"setup": 0.0, "compile": 0.0, "sampling": 0.0, "scoring": 0.0}

    # ---------------------------------------------- the shared mode and centre
    t0 = time.perf_counter()
    source = SGLD(
        model,
        preconditioner=preconditioner,
        gradient=(
            "control_variates" if "control_variates" in gradients else "minibatch"
        ),
        chunk_size=chunk_size,
    )
    with warmup_elsewhere():  # the arms' steps are set below
        source.init(rng_key, 0, None, model_args, model_kwargs)
    form = source.adaptation_info["preconditioner"]
    pre = source.preconditioner
    d = int(pre.loc.shape[0])
    arrays, rebuild, _ = split_arrays((model_args, model_kwargs))
    if scores == "full":
        objective = full_data_objective(
            model, model_args, model_kwargs, chunk_size=chunk_size
        )
    seconds["setup"] = time.perf_counter() - t0

    def full_scores(xs):
        return _full_scores(objective, pre, xs)

    # ------------------------------------------------------------- the groups
    t0 = time.perf_counter()
    key_init, key_score = random.split(rng_key)
    groups = []
    kernels = {}
    table_rows = []
    status = {}
    for name, g, n in {(a.sampler, a.gradient, a.subsample_size): None for a in arms}:
        members = [
            a for a in arms if (a.sampler, a.gradient, a.subsample_size) == (name, g, n)
        ]
        factory = factories[name]
        options = dict(
            step_size=None, gradient=g, preconditioner=form, chunk_size=chunk_size
        )
        if constructor_accepts(factory, "adapt_mass_matrix"):
            options["adapt_mass_matrix"] = False
        arm_model = model if n is None else subsample_size(model, {plate: n})
        kernel = factory(arm_model, **options)
        kernel.use_setup(source.setup)
        for a in members:
            kernels[a] = kernel
        programs = {}  # by number of chains, shared by the kernel's groups
        for part in [members] if vectorize else [[a] for a in members]:
            # One key for every chain: each arm starts from the same draw of
            # the Laplace approximation (common random numbers).
            keys = jnp.broadcast_to(key_init, (len(part),) + key_init.shape)
            with warmup_elsewhere():  # the arms' steps are set below
                state = kernel.init(keys, 0, None, model_args, model_kwargs)
            steps = jnp.asarray([a.step_size for a in part], state.step_size.dtype)
            state = state._replace(step_size=steps)
            ok = _within_noise_bound(kernel, state, steps)
            for a, fine in zip(part, ok):
                if not fine:
                    status[a] = "noise bound"
            alive = [i for i, fine in enumerate(ok) if fine]
            if not alive:
                continue
            group = _Group(kernel, [part[i] for i in alive], _slice_state(state, alive))
            group.compiled = programs
            groups.append(group)

    record_grads = scores == "minibatch"

    def chunk_fn(group):
        """``run(state, num_records, arrays) -> (state, xs, gs)``: the group's
        chains advance ``num_records * thinning`` steps; ``xs`` holds the draws in
        u every ``thinning`` steps (rows past ``num_records`` unused), ``gs`` the
        minibatch scores there with ``scores="minibatch"``."""
        kernel = group.kernel
        sample = kernel.sample_kernel

        def to_u(z):
            return pre.to_u(ravel_pytree(z)[0])

        def run(state, num_records, arrays):
            args, kwargs = rebuild(arrays)
            k = jnp.shape(state.i)[0]
            xs = jnp.zeros((_BUFFER, k, d), pre.loc.dtype)
            gs = jnp.zeros((_BUFFER, k, d), pre.loc.dtype) if record_grads else None

            def minibatch_score(key, z, centre):
                est = kernel.estimator.estimate(
                    random.fold_in(key, 7), z, args, kwargs, centre
                )
                return -ravel_pytree(est.z_grad)[0]

            def record(j, carry):
                state, xs, gs = carry
                state = lax.fori_loop(
                    0, thinning, lambda _, s: sample(s, args, kwargs), state
                )
                xs = xs.at[j].set(jax.vmap(to_u)(state.z))
                if gs is not None:
                    g = jax.vmap(minibatch_score)(state.rng_key, state.z, state.centre)
                    gs = gs.at[j].set(g)
                return state, xs, gs

            return lax.fori_loop(0, num_records, record, (state, xs, gs))

        return run

    def compile_all():
        """Compile what the groups need for their current number of chains, in
        threads (XLA compiles outside Python's lock, one program per core)."""
        todo = {}  # one per program: single-arm groups share their parent's
        for g in groups:
            if len(g.arms) not in g.compiled:
                todo.setdefault((id(g.compiled), len(g.arms)), g)
        todo = list(todo.values())
        if not todo:
            return
        t0 = time.perf_counter()
        lowered = [jax.jit(chunk_fn(g)).lower(g.state, 1, arrays) for g in todo]
        workers = min(len(todo), os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            fns = list(pool.map(lambda low: low.compile(), lowered))
        for g, fn in zip(todo, fns):
            g.compiled[len(g.arms)] = fn
        seconds["compile"] += time.perf_counter() - t0

    # Compile every group and time four records of each (uncharged), so a budget
    # too small for round 0 is refused before any arm runs.
    compile_all()
    per_record = {}
    for group in groups:
        fn = group.compiled[len(group.arms)]
        t1 = time.perf_counter()
        jax.block_until_ready(fn(group.state, 4, arrays))
        per_record[id(group)] = (time.perf_counter() - t1) / 4
    seconds["compile"] = time.perf_counter() - t0
    num_alive = sum(len(g.arms) for g in groups)
    if not num_alive:
        raise ValueError(
            "Every arm breaks its sampler's noise bound at the start (step_size * "
            "tau^2 > 2 * friction): give smaller step_sizes, larger subsample_sizes "
            "or control variates."
        )
    r0 = budget / (num_alive * rounds)
    slowest = max(per_record[id(g)] / len(g.arms) for g in groups)
    needed = MIN_DRAWS * slowest
    if r0 < needed:
        # Timed on four records: ask for half as much again, so that a retry on
        # a machine whose load changes is not refused again.
        minimum = 1.5 * needed * num_alive * rounds
        raise ValueError(
            f"budget={budget:g} s gives each of the {num_alive} arms {r0:.3g} s in "
            f"round 0 of {rounds}, but the slowest arm needs {needed:.3g} s for "
            f"{MIN_DRAWS} draws {thinning} steps apart. Pass budget >= "
            f"{math.ceil(minimum * 10) / 10:g} s, or fewer arms (samplers, "
            "step_sizes, subsample_sizes, gradients)."
        )

    draws = {a: _Draws(_KEEP_FACTOR * num_draws) for g in groups for a in g.arms}
    charged = {a: 0.0 for a in draws}
    steps = {a: 0 for a in draws}
    stopped = set()
    score_fn = _score_function(metric)

    for i in range(rounds):
        alive = [a for g in groups for a in g.arms]
        # Round i's share: T / (|S_i| R) seconds for each of the S_i arms.
        r = budget / (len(alive) * rounds)
        compile_all()  # the groups' new sizes after pruning
        t_round = time.perf_counter()
        for group in groups:
            fn = group.compiled[len(group.arms)]
            _run_group(
                group, r, fn, arrays, per_record, draws, charged, steps, thinning
            )
            num_bad = np.asarray(group.state.num_nonfinite) > 0
            for a, bad in zip(group.arms, num_bad):
                if bad:
                    stopped.add(a)
        seconds["sampling"] += time.perf_counter() - t_round

        t_score = time.perf_counter()
        values = {}
        for a in alive:
            if a in stopped:
                values[a] = math.inf
                continue
            x, s = draws[a].take(num_draws)
            # Padded to num_draws rows (masked out), so one compiled function
            # scores every arm.
            m = len(x)
            pad = np.repeat(x[-1:], num_draws - m, axis=0)
            x = jnp.asarray(np.concatenate([x, pad]))
            if s is None:
                s = full_scores(x)
            else:
                s = jnp.asarray(np.concatenate([s, np.repeat(s[-1:], len(pad), 0)]))
            mask = jnp.arange(num_draws) < m
            key = random.fold_in(key_score, arms.index(a))
            v = float(score_fn(key, x, s, mask))
            values[a] = v if np.isfinite(v) else math.inf
        seconds["scoring"] += time.perf_counter() - t_score

        ranked = sorted(alive, key=lambda a: values[a])
        survivors = (
            ranked[: max(1, len(alive) // eta)] if i < rounds - 1 else ranked[:1]
        )
        for a in alive:
            if a in stopped:
                how = "non-finite"
            elif a in survivors:
                how = "winner" if i == rounds - 1 else "kept"
            else:
                how = "pruned"
            table_rows.append(
                dict(
                    round=i,
                    **a._asdict(),
                    seconds=charged[a],
                    steps=steps[a],
                    draws=min(num_draws, len(draws[a].index)),
                    discrepancy=values[a],
                    status=how,
                )
            )
        logger.info(
            "tune: round %d of %d, %d arms of %.3g s; best %s %s = %.4g.",
            i + 1,
            rounds,
            len(alive),
            r,
            _arm_label(ranked[0]),
            metric,
            values[ranked[0]],
        )
        # From round 1 on each survivor runs alone, on its group's one-chain
        # program (compiled once per group): re-vectorising the survivors would
        # compile a program for every new number of chains.
        keep = set(survivors)
        alone = []
        for group in groups:
            for j, a in enumerate(group.arms):
                if a in keep:
                    single = _Group(group.kernel, [a], _slice_state(group.state, [j]))
                    single.compiled = group.compiled
                    k = len(group.arms)
                    per_record[id(single)] = per_record[id(group)] / k
                    alone.append(single)
        groups = alone

    for a, how in status.items():
        table_rows.append(
            dict(
                round=0,
                **a._asdict(),
                seconds=0.0,
                steps=0,
                draws=0,
                discrepancy=math.inf,
                status=how,
            )
        )
    import pandas as pd

    table = pd.DataFrame(table_rows)
    best = ranked[0]
    if not np.isfinite(values[best]):
        raise RuntimeError(
            "tune: every arm blew up (non-finite draws) or broke its noise bound; "
            "see the arms' table in the logs. Give smaller step_sizes."
        )
    kernel = _winner_kernel(
        factories[best.sampler], best, kernels[best], model, plate, form, chunk_size
    )
    seconds["total"] = time.perf_counter() - started
    return TuneResult(
        kernel=kernel,
        arm=best,
        table=table,
        metric=metric,
        budget=budget,
        rounds=rounds,
        seconds=seconds,
        steps_per_second=steps[best] / charged[best] if charged[best] else math.nan,
    )


def _full_scores(objective, pre, xs):
    """Full-data scores in u at draws ``xs`` (rows of u), in one batched pass over
    the data chunks: ``L' grad_z log pi(z)`` at ``z = z_hat + L u``."""
    zs = jax.vmap(pre.to_z)(xs)
    _, grads = jax.vmap(objective.value_and_grad)(zs)
    return -pre.pull(grads)  # score = -grad U, pulled back to u


def _within_noise_bound(kernel, state, steps):
    """Per chain: whether its step keeps the corrected variant's injected variance
    positive at the start, the check a kernel given that step makes in ``init``;
    always true for samplers without such a bound."""
    bound = getattr(kernel, "noise_bound", None)
    bound = None if bound is None else bound(state.noise_sd, batch_ndim=1)
    if bound is None:
        return [True] * len(steps)
    tau, value = bound
    return list(np.asarray(steps) * tau**2 <= 2 * value)


def _run_group(group, r, fn, arrays, per_record, draws, charged, steps, thinning):
    """Run the group's chains until each arm has been charged ``r`` more seconds
    (the wall time of each call divided by the number of chains)."""
    k = len(group.arms)
    spent = 0.0
    t_rec = per_record[id(group)]
    while spent < r:
        want = (r - spent) * k / max(t_rec, 1e-9)
        num = int(min(_BUFFER, max(1, math.ceil(want))))
        t0 = time.perf_counter()
        state, xs, gs = fn(group.state, num, arrays)
        xs = np.asarray(xs[:num])
        gs = None if gs is None else np.asarray(gs[:num])
        wall = time.perf_counter() - t0
        group.state = state
        t_rec = wall / num
        spent += wall / k
        for j, a in enumerate(group.arms):
            draws[a].add(xs[:, j], None if gs is None else gs[:, j])
            steps[a] += num * thinning
    per_record[id(group)] = t_rec
    for a in group.arms:
        charged[a] += spent


@functools.lru_cache(maxsize=None)
def _score_function(metric):
    if metric == "ksd":
        return jax.jit(lambda key, x, s, mask: imq_ksd(x, s, mask=mask))
    return jax.jit(lambda key, x, s, mask: fssd_opt(key, x, s, mask=mask))


def _winner_kernel(factory, arm, tuned, model, plate, form, chunk_size):
    """The winning arm as a kernel with a fixed step: the dynamics of ``tuned``
    (the arm's kernel, whose step was a state field), ready for MCMC, sharing the
    mode, preconditioner and centre already found."""
    options = dict(
        step_size=arm.step_size,
        gradient=arm.gradient,
        preconditioner=form,
        chunk_size=chunk_size,
    )
    if constructor_accepts(factory, "variant"):
        options["variant"] = tuned.variant
    if arm.subsample_size is not None:
        model = subsample_size(model, {plate: arm.subsample_size})
    kernel = factory(model, **options)
    kernel.use_setup(tuned.setup)
    return kernel
