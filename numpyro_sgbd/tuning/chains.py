"""The arms' chains in :func:`~numpyro_sgbd.tuning.tune`: the set-up they share,
their kernels and groups, the compiled programs that advance and record them, and
the timed runs charged to each arm (the scores are in
:mod:`~numpyro_sgbd.tuning.scoring`).

An arm's chain runs in the whitened coordinates u of the shared preconditioner,
from the same draw of its Laplace approximation as every other arm. Arms that
share a sampler, gradient estimator and subsample size share a kernel
(:class:`_Group`), their chains vectorised over the step sizes in one program; the
program advances them ``thinning`` steps per record and keeps each record's draw
in u (and its minibatch score, for the stochastic KSD). A group keeps its program
for every round, the chains of pruned arms masked, so nothing compiles once the
rounds start.
"""

from concurrent.futures import ThreadPoolExecutor
import math
import os
import time
from typing import Callable, NamedTuple

import jax
from jax import lax, random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.estimators import split_arrays
from numpyro_sgbd.handlers import subsample_size
from numpyro_sgbd.modes import full_data_objective
from numpyro_sgbd.samplers import SGLD
from numpyro_sgbd.tuning.arguments import constructor_accepts
from numpyro_sgbd.validation import warmup_elsewhere

#: Records kept per arm before its stride doubles (memory O(this x d) per arm).
_KEEP_FACTOR = 8
#: Records per compiled call at most.
_BUFFER = 256


class Problem(NamedTuple):
    """The model as :func:`~numpyro_sgbd.tuning.tune` was given it, its
    arguments as JAX arrays, and the subsample plate whose size the arms set
    (``None``: the declared sizes)."""

    model: Callable
    model_args: tuple
    model_kwargs: dict
    plate: str


class Shared(NamedTuple):
    """What every arm shares, found once before any arm runs."""

    #: The kernel whose ``init`` found the mode, preconditioner and centre.
    source: object
    #: The preconditioner's form (``"dense"``, ``"lowrank"`` or ``"diagonal"``).
    form: str
    #: The preconditioner: ``z = z_hat + L u``.
    pre: object
    #: The number of latent coordinates.
    d: int
    #: The model's arguments as a flat list of arrays, and its inverse.
    arrays: list
    rebuild: Callable
    #: The full-data objective (``scores="full"``), else ``None``.
    objective: object


class Recording(NamedTuple):
    """How a group's program records: the preconditioner and data layout of
    :class:`Shared`, steps per record, and whether minibatch scores are kept."""

    shared: Shared
    thinning: int
    record_grads: bool


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


class Records(NamedTuple):
    """What the rounds record per arm: its thinned draws (:class:`_Draws`), the
    seconds charged to it and the steps it took, and the set of arms whose chain
    stopped on a non-finite value. The rounds add to these containers."""

    draws: dict
    charged: dict
    steps: dict
    stopped: set

    @classmethod
    def start(cls, groups, num_draws):
        """Empty records for the arms of ``groups``."""
        draws = {a: _Draws(_KEEP_FACTOR * num_draws) for g in groups for a in g.arms}
        return cls(draws, {a: 0.0 for a in draws}, {a: 0 for a in draws}, set())


class _Group:
    """Arms that share a sampler, gradient estimator and subsample size: one
    kernel, its chains vectorised over the step sizes (or one arm each when
    ``vectorize=False``). The group keeps its chains for good: a pruned arm's
    chain still runs in the program (masked: neither recorded nor charged), so
    one program per group serves every round."""

    def __init__(self, kernel, arms, state):
        self.kernel = kernel
        self.arms = list(arms)
        self.state = state
        #: The compiled program (:func:`record_program`), or its future.
        self.program = None


def _slice_state(state, keep):
    keep = jnp.asarray(keep)
    return jax.tree.map(lambda x: x[keep], state)


# ------------------------------------------------------ set-up and the groups
def shared_setup(problem, gradients, settings, rng_key):
    """The mode, preconditioner and control-variate centre every arm uses, found
    once by an SGLD kernel's ``init`` (control variates' centre where any arm
    uses them), and the full-data objective for ``scores="full"``."""
    model, model_args, model_kwargs, _ = problem
    source = SGLD(
        model,
        preconditioner=settings.preconditioner,
        gradient=(
            "control_variates" if "control_variates" in gradients else "minibatch"
        ),
        chunk_size=settings.chunk_size,
    )
    with warmup_elsewhere():  # the arms' steps are set below
        source.init(rng_key, 0, None, model_args, model_kwargs)
    form = source.adaptation_info["preconditioner"]
    pre = source.preconditioner
    d = int(pre.loc.shape[0])
    arrays, rebuild, _ = split_arrays((model_args, model_kwargs))
    objective = None
    if settings.scores == "full":
        objective = full_data_objective(
            model, model_args, model_kwargs, chunk_size=settings.chunk_size
        )
    return Shared(source, form, pre, d, arrays, rebuild, objective)


def _arm_kernel(factory, gradient, n, problem, shared, chunk_size):
    """The kernel of a group: the sampler with its step a state field (set per
    chain), the shared preconditioner's form and set-up, on the model with
    subsample size ``n`` (``None``: the declared sizes)."""
    options = dict(
        step_size=None,
        gradient=gradient,
        preconditioner=shared.form,
        chunk_size=chunk_size,
    )
    if constructor_accepts(factory, "adapt_mass_matrix"):
        options["adapt_mass_matrix"] = False
    model = problem.model
    arm_model = model if n is None else subsample_size(model, {problem.plate: n})
    kernel = factory(arm_model, **options)
    kernel.use_setup(shared.source.setup)
    return kernel


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


def _start_chains(kernel, part, key_init, problem):
    """``(state, ok)``: one chain per arm of ``part`` at its step size, and per
    chain whether that step is within the sampler's noise bound. One key for every
    chain: each arm starts from the same draw of the Laplace approximation
    (common random numbers)."""
    keys = jnp.broadcast_to(key_init, (len(part),) + key_init.shape)
    with warmup_elsewhere():  # the arms' steps are set below
        state = kernel.init(keys, 0, None, problem.model_args, problem.model_kwargs)
    steps = jnp.asarray([a.step_size for a in part], state.step_size.dtype)
    state = state._replace(step_size=steps)
    return state, _within_noise_bound(kernel, state, steps)


def make_groups(arms, factories, problem, shared, settings, key_init, on_group):
    """``(groups, kernels, status)``: the groups of chains that run, each arm's
    kernel, and ``"noise bound"`` for the arms whose step breaks their sampler's
    bound at the start (they do not run). ``on_group(group)`` is called as each
    group is made (to start compiling its program while the next is made)."""
    groups, kernels, status = [], {}, {}
    for name, g, n in {(a.sampler, a.gradient, a.subsample_size): None for a in arms}:
        members = [
            a for a in arms if (a.sampler, a.gradient, a.subsample_size) == (name, g, n)
        ]
        kernel = _arm_kernel(
            factories[name], g, n, problem, shared, settings.chunk_size
        )
        for a in members:
            kernels[a] = kernel
        for part in [members] if settings.vectorize else [[a] for a in members]:
            state, ok = _start_chains(kernel, part, key_init, problem)
            for a, fine in zip(part, ok):
                if not fine:
                    status[a] = "noise bound"
            alive = [i for i, fine in enumerate(ok) if fine]
            if not alive:
                continue
            if len(alive) < len(part):  # slicing compiles a gather per leaf
                state = _slice_state(state, alive)
            group = _Group(kernel, [part[i] for i in alive], state)
            groups.append(group)
            on_group(group)
    return groups, kernels, status


# ------------------------------------------------------------ the programs
def record_program(kernel, recording):
    """``run(state, num_records, arrays) -> (state, xs, gs)``: the kernel's chains
    advance ``num_records * thinning`` steps; ``xs`` holds the draws in u every
    ``thinning`` steps (rows past ``num_records`` unused), ``gs`` the minibatch
    scores there with ``scores="minibatch"``."""
    sample = kernel.sample_kernel
    shared, thinning = recording.shared, recording.thinning
    pre, d = shared.pre, shared.d

    def to_u(z):
        return pre.to_u(ravel_pytree(z)[0])

    def run(state, num_records, arrays):
        args, kwargs = shared.rebuild(arrays)
        k = jnp.shape(state.i)[0]
        xs = jnp.zeros((_BUFFER, k, d), pre.loc.dtype)
        gs = (
            jnp.zeros((_BUFFER, k, d), pre.loc.dtype)
            if recording.record_grads
            else None
        )

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


class _Compiler:
    """Compiles the groups' programs in worker threads (XLA compiles outside
    Python's lock) while the main thread makes the next group: one program per
    kernel and number of chains, shared by the groups that have both."""

    def __init__(self, recording, pool, deadline, num_kernels):
        self.recording = recording
        self.pool = pool
        self.futures = {}
        #: ``(budget, started)``: making groups past the budget is refused.
        self.deadline = deadline
        self.num_kernels = num_kernels
        self.kernels = set()

    def __call__(self, group):
        self.kernels.add(id(group.kernel))
        self._check_deadline()
        key = (id(group.kernel), len(group.arms))
        if key not in self.futures:
            run = jax.jit(record_program(group.kernel, self.recording))
            lowered = run.lower(group.state, 1, self.recording.shared.arrays)
            self.futures[key] = self.pool.submit(lowered.compile)
        group.program = self.futures[key]

    def _check_deadline(self):
        """Refuse the budget as soon as making the groups has used it up, with
        what making all of them would take at this pace (rather than compile
        the rest first and come back late)."""
        budget, started = self.deadline
        spent = time.perf_counter() - started
        made = len(self.kernels)
        if spent <= budget or made >= self.num_kernels:
            return
        projected = spent * self.num_kernels / made
        raise ValueError(
            f"budget={budget:g} s is wall time from the call to the result, and "
            f"set-up and making {made} of the {self.num_kernels} kernels of the "
            f"arms took {spent:.3g} s: making them all would take about "
            f"{projected:.3g} s before any arm runs. Pass a budget well above "
            f"{math.ceil(projected):d} s, or fewer arms (samplers, "
            "subsample_sizes, gradients)."
        )


def time_records(groups, arrays):
    """Seconds per record of each group (by ``id``), timed on four records that
    nobody is charged for."""
    per_record = {}
    for group in groups:
        t1 = time.perf_counter()
        jax.block_until_ready(group.program(group.state, 4, arrays))
        per_record[id(group)] = (time.perf_counter() - t1) / 4
    return per_record


def ready_groups(
    arms, factories, problem, recording, settings, key_init, scorer, started
):
    """``(groups, kernels, status, per_record)``: the groups of :func:`make_groups`
    with their programs compiled (in threads, as the groups are made), the
    scorer's programs compiled and one of its calls timed, and each group's
    seconds per record (:func:`time_records`). Everything the rounds run is
    compiled here, once. A ValueError as soon as the budget (from ``started``)
    runs out while the groups are made."""
    workers = max(1, os.cpu_count() or 1)
    num_kernels = len({(a.sampler, a.gradient, a.subsample_size) for a in arms})
    pool = ThreadPoolExecutor(max_workers=workers)
    deadline = (settings.budget, started)
    compiler = _Compiler(recording, pool, deadline, num_kernels)
    try:
        groups, kernels, status = make_groups(
            arms, factories, problem, recording.shared, settings, key_init, compiler
        )
        scorer.warm_up()  # compiles in this thread while the workers compile
        for group in groups:
            group.program = group.program.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    per_record = time_records(groups, recording.shared.arrays)
    scorer.time_batch()
    return groups, kernels, status, per_record


def _run_group(group, live, r, arrays, per_record, records, thinning):
    """Run the group's chains until each of its live arms (``live``, their
    indices in the group) has been charged ``r`` more seconds: the wall time of
    each call divided by the number of live arms in it. The chains of pruned arms
    run on, masked (nothing recompiles); their time is charged to the live ones,
    as a lone survivor would pay for a program of its own."""
    k = len(live)
    spent = 0.0
    t_rec = per_record[id(group)]
    while spent < r:
        want = (r - spent) * k / max(t_rec, 1e-9)
        num = int(min(_BUFFER, max(1, math.ceil(want))))
        t0 = time.perf_counter()
        state, xs, gs = group.program(group.state, num, arrays)
        xs = np.asarray(xs[:num])
        gs = None if gs is None else np.asarray(gs[:num])
        wall = time.perf_counter() - t0
        group.state = state
        t_rec = wall / num
        spent += wall / k
        for j in live:
            a = group.arms[j]
            records.draws[a].add(xs[:, j], None if gs is None else gs[:, j])
            records.steps[a] += num * thinning
    per_record[id(group)] = t_rec
    for j in live:
        records.charged[group.arms[j]] += spent


def run_groups(groups, live, r, arrays, per_record, records, thinning):
    """Each arm of ``live`` charged ``r`` more seconds, on its group's program
    (the groups without a live arm stay still); the live arms whose chain met a
    non-finite value (the kernel's guard stopped it) join ``records.stopped``."""
    for group in groups:
        lanes = [j for j, a in enumerate(group.arms) if a in live]
        if not lanes:
            continue
        _run_group(group, lanes, r, arrays, per_record, records, thinning)
        num_bad = np.asarray(group.state.num_nonfinite) > 0
        for j in lanes:
            if num_bad[j]:
                records.stopped.add(group.arms[j])


def winner_kernel(factory, arm, tuned, problem, form, chunk_size):
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
    model = problem.model
    if arm.subsample_size is not None:
        model = subsample_size(model, {problem.plate: arm.subsample_size})
    kernel = factory(model, **options)
    kernel.use_setup(tuned.setup)
    return kernel
