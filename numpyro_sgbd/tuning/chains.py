"""The arms' chains in :func:`~numpyro_sgbd.tuning.tune`: the set-up they share,
their families and groups, and the timed runs charged to each arm (the compiled
programs are in :mod:`~numpyro_sgbd.tuning.programs`, the scores in
:mod:`~numpyro_sgbd.tuning.scoring`).

An arm's chain runs in the whitened coordinates u of the shared preconditioner,
from the same draw of its Laplace approximation as every other arm. The arms of
one sampler and gradient estimator are a family (:class:`_Family`): one kernel
and one compiled program, whatever their step and subsample sizes (both are
arguments of the program). A family's arms of one subsample size are a group
(:class:`_Group`): their chains, one per step size, run vectorised in one call
of the program, which advances them ``thinning`` steps per record and keeps each
record's draw in u (and its minibatch score, for the stochastic KSD). The groups
of a size run in calls of their own, so that an arm's time is what its own size
costs. A group keeps its chains for every round, those of pruned arms masked,
so nothing compiles once the rounds start.
"""

import math
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.estimators import ControlVariateEstimator, split_arrays
from numpyro_sgbd.handlers import subsample_size
from numpyro_sgbd.mode import full_data_objective
from numpyro_sgbd.samplers import SGLD
from numpyro_sgbd.tuning.arguments import Arm, constructor_accepts
from numpyro_sgbd.tuning.programs import (
    ONCE,
    QUICK,
    Compiler,
    buffer_rows,
    prepare_kernel,
    record_program,
    setup_values,
    start_program,
)
from numpyro_sgbd.tuning.scoring import SUBSET_ROWS, Subset
from numpyro_sgbd.tuning.sizes import Rows, pass_rows, rows_of, sized_supported

#: Records kept per arm before its stride doubles (memory O(this x d) per arm).
_KEEP_FACTOR = 8


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
    #: The scores the arms are rated by: ``"full"``, ``"subset"`` or
    #: ``"minibatch"`` (``"auto"`` resolved).
    scores: str = "full"
    #: The :class:`~numpyro_sgbd.tuning.scoring.Subset` of ``scores="subset"``.
    subset: object = None


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


class _Family(NamedTuple):
    """The arms of one sampler and gradient estimator: its kernels (one, shared
    by every subsample size, where the sizes are traced: ``sized`` is then
    ``(chunk, columns)`` of :class:`~numpyro_sgbd.tuning.sizes.SizedEstimator`;
    else one per size, each with its own program), its subsample sizes and
    its step sizes."""

    name: str
    gradient: str
    kernels: list
    sized: tuple
    sizes: list
    steps: tuple


class _Group:
    """The chains of one family at one subsample size that run in one call of
    the family's program: one per step size (or one arm when
    ``vectorize=False``). The group keeps its chains for good: a pruned arm's
    chain, or one whose step broke its noise bound at the start, still runs in
    the call (masked: neither recorded nor charged), so one program serves
    every round."""

    def __init__(self, family, size, arms):
        self.family = family
        #: The index of the subsample size in ``family.sizes``.
        self.size = size
        self.arms = list(arms)
        self.kernel = family.kernels[size]
        #: The subsample size as the program takes it.
        self.rows = None
        self.state = None
        #: The compiled program (:func:`~numpyro_sgbd.tuning.programs.record_program`).
        self.program = None
        #: Records a call of it returns at most (:func:`~numpyro_sgbd.tuning.
        #: programs.buffer_rows`).
        self.buffer = None

    def run(self, num_records, arrays):
        return self.program(self.state, self.rows, num_records, arrays)


# ------------------------------------------------------ set-up and the groups
def shared_setup(problem, gradients, settings, rng_key):
    """The mode, preconditioner and control-variate centre every arm uses, found
    once by an SGLD kernel's ``init`` (control variates' centre where any arm
    uses them), and what the scores need: ``scores="auto"`` resolved (the
    full-data scores up to :data:`~numpyro_sgbd.tuning.scoring.SUBSET_ROWS`
    rows, control-variate scores on a subset of that many above), the
    full-data objective or the :class:`~numpyro_sgbd.tuning.scoring.Subset`."""
    model, model_args, model_kwargs, _ = problem
    source = SGLD(
        model,
        preconditioner=settings.preconditioner,
        gradient=(
            "control_variates" if "control_variates" in gradients else "minibatch"
        ),
        chunk_size=settings.chunk_size,
    )
    # The search alone: no chain of its own (the arms' start is the start
    # program's), so no initial state compiles.
    prepare_kernel(source, problem, None)
    form = source.adaptation_info["preconditioner"]
    pre = source.preconditioner
    d = int(pre.loc.shape[0])
    arrays, rebuild, _ = split_arrays((model_args, model_kwargs))
    scores = _resolved_scores(settings.scores, source.estimator)
    objective = subset = None
    if scores == "full":
        objective = full_data_objective(
            model, model_args, model_kwargs, chunk_size=settings.chunk_size
        )
    elif scores == "subset":
        subset = Subset(source, problem, SUBSET_ROWS)
    return Shared(source, form, pre, d, arrays, rebuild, objective, scores, subset)


def _resolved_scores(scores, estimator):
    """``scores`` with ``"auto"`` resolved for the set-up's ``estimator``: the
    subset's scores above :data:`~numpyro_sgbd.tuning.scoring.SUBSET_ROWS`
    rows of one plate (where the estimator can form them), else full-data."""
    if scores == "subset" and not _subset_supported(estimator):
        raise ValueError(
            "scores='subset' needs one subsample plate without local or "
            "enumerated sites and unsharded data; use scores='full'."
        )
    if scores != "auto":
        return scores
    if not _subset_supported(estimator):
        return "full"
    ((size, _, _),) = _plain(estimator).plates.values()
    return "subset" if size > SUBSET_ROWS else "full"


def _plain(estimator):
    """The minibatch estimator (inside control variates)."""
    if isinstance(estimator, ControlVariateEstimator):
        return estimator.estimator
    return estimator


def _subset_supported(estimator):
    plain = _plain(estimator)
    return (
        len(plain.plates) == 1
        and plain.sharding is None
        and not plain.local
        and plain.enumerate_dim is None
    )


def _arm_kernel(factory, gradient, n, problem, shared, chunk_size):
    """A family's kernel: the sampler with its step a state field (set per
    chain), the shared preconditioner's form and set-up, on the model with
    subsample size ``n`` (``None``: the declared sizes), prepared from the
    model without compiling (:func:`~numpyro_sgbd.tuning.programs.prepare_kernel`)."""
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
    return prepare_kernel(kernel, problem, shared.source.setup.mode)


def make_family(arms, factory, problem, shared, settings):
    """The :class:`_Family` of ``arms``, those of one sampler and gradient
    estimator (every combination of its sizes and steps). The subsample sizes
    are traced where there are several and the estimator allows
    (:func:`~numpyro_sgbd.tuning.sizes.sized_supported`): one kernel, on the
    model as declared, serves them all."""
    name, g = arms[0].sampler, arms[0].gradient
    sizes = list(dict.fromkeys(a.subsample_size for a in arms))
    steps = tuple(dict.fromkeys(a.step_size for a in arms))
    chunk_size = settings.chunk_size
    if len(sizes) > 1:
        # On the model as declared: its sizes are the set-up's, whose tracing
        # has compiled what preparing the kernel runs eagerly already.
        kernel = _arm_kernel(factory, g, None, problem, shared, chunk_size)
        if sized_supported(kernel.estimator):
            rows = pass_rows(sizes, kernel.estimator, shared.d)
            sized = (rows, max(sizes))
            return _Family(name, g, [kernel] * len(sizes), sized, sizes, steps)
    kernels = [_arm_kernel(factory, g, n, problem, shared, chunk_size) for n in sizes]
    return _Family(name, g, kernels, None, sizes, steps)


def make_groups(families, vectorize):
    """The groups of chains that run: per family and size, its step sizes as
    one group (``vectorize``) or one group each."""
    groups = []
    for family in families:
        for i, n in enumerate(family.sizes):
            arms = [Arm(family.name, family.gradient, n, h) for h in family.steps]
            for part in [arms] if vectorize else [[a] for a in arms]:
                groups.append(_Group(family, i, part))
    return groups


def _within_noise_bound(kernel, state, steps):
    """Per chain: whether its step keeps the corrected variant's injected variance
    positive at the start, the check a kernel given that step makes in ``init``;
    always true for samplers without such a bound."""
    noise_sd = getattr(state, "noise_sd", None)  # NOGIN's state keeps none
    bound = getattr(kernel, "noise_bound", None)
    bound = None if bound is None else bound(noise_sd, batch_ndim=1)
    if bound is None:
        return [True] * len(steps)
    tau, value = bound
    return list(np.asarray(steps) * tau**2 <= 2 * value)


def _no_rows():
    """The size argument of a program that ignores it (one kernel per size)."""
    return Rows(np.int32(0), np.int32(0), np.zeros((), jnp.result_type(float)))


def ready_groups(arms, factories, problem, recording, settings, rng_key, scorer):
    """``(groups, kernels, status, per_record)``: the groups of chains, each arm's
    kernel, ``"noise bound"`` for the arms whose step breaks their sampler's
    bound at the start (they do not run), and each group's seconds per record
    (:func:`time_records`). Everything the rounds run is compiled here, once,
    in worker threads: one program per family (per family and size where the
    sizes cannot be traced), the start of every chain, and the scorer's."""
    shared = recording.shared
    compiler = Compiler()
    families, groups, inputs = [], [], []
    for name, g in dict.fromkeys((a.sampler, a.gradient) for a in arms):
        members = [a for a in arms if (a.sampler, a.gradient) == (name, g)]
        family = make_family(members, factories[name], problem, shared, settings)
        parts = make_groups([family], settings.vectorize)
        inputs.append(_family_inputs(family, parts, shared))
        families.append(family)
        groups += parts
    index = [(families.index(g.family), g.size) for g in groups]
    values = [i.values for i in inputs]
    rows = [i.rows for i in inputs]
    steps = [h for i in inputs for h in i.steps]
    start = start_program(families, index, shared)
    start_args = (rng_key, values, rows, steps, shared.arrays)
    states = jax.eval_shape(start, *start_args)  # the chains' shapes, nothing run
    for group, state in zip(groups, states):
        _add_program(compiler, families.index(group.family), group, state, recording)
    compiler.add("start", start, start_args, ONCE)
    compiler.add("scores", *scorer.program_job())
    compiled = compiler.compile()
    scorer.use(compiled["scores"])
    states = compiled["start"](*start_args)
    kernels, status = {}, {}
    for group, state in zip(groups, states):
        group.state = state
        group.program = compiled[group.program]
        steps_h = [a.step_size for a in group.arms]
        ok = _within_noise_bound(group.kernel, state, steps_h)
        for a, fine in zip(group.arms, ok):
            kernels[a] = group.kernel
            if not fine:
                status[a] = "noise bound"
    live = {a for g in groups for a in g.arms if a not in status}
    per_record = time_records([g for g in groups if live & set(g.arms)], shared.arrays)
    scorer.time_batch()
    return groups, kernels, status, per_record


class _Inputs(NamedTuple):
    """What the start program takes for one family."""

    values: object
    rows: object
    steps: list


def _family_inputs(family, groups, shared):
    """The start's inputs for ``family`` and its ``groups``: its set-up arrays,
    its sizes (stacked :class:`~numpyro_sgbd.tuning.sizes.Rows`, ``None`` with
    a kernel per size) and each group's step sizes; and each group's size as
    its program takes it."""
    values = setup_values(family.kernels[0], shared.pre)
    rows = None
    if family.sized is not None:
        size = _plate_size(family)
        each = [rows_of(n, family.sized[0], size) for n in family.sizes]
        rows = jax.tree.map(lambda *x: np.stack(x), *each)
    for group in groups:
        group.rows = (
            _no_rows()
            if rows is None
            else jax.tree.map(lambda x, i=group.size: x[i], rows)
        )
    steps = [np.asarray([a.step_size for a in g.arms]) for g in groups]
    return _Inputs(values, rows, steps)


def _add_program(compiler, f, group, state, recording):
    """Lower the program of ``group`` (of family ``f``, its chains' abstract
    ``state``) for ``compiler``, unless lowered already: one per family and
    lane count, or one per size where each size has its own kernel. The
    group's ``program`` is its name."""
    family, shared = group.family, recording.shared
    key = (f, None if family.sized else group.size, len(group.arms))
    group.program = key
    group.buffer = buffer_rows(len(group.arms), shared.d)
    if key not in compiler:
        run = record_program(group.kernel, recording, family.sized)
        compiler.add(key, run, (state, group.rows, 1, shared.arrays), QUICK)


def _plate_size(family):
    """N, the rows of the one plate whose size ``family``'s arms set."""
    ((size, _, _),) = family.kernels[0].estimator.plates.values()
    return size


def time_records(groups, arrays):
    """Seconds per record of each group (by ``id``), timed on four records that
    nobody is charged for."""
    per_record = {}
    for group in groups:
        t1 = time.perf_counter()
        jax.block_until_ready(group.run(4, arrays))
        per_record[id(group)] = (time.perf_counter() - t1) / 4
    return per_record


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
        num = int(min(group.buffer, max(1, math.ceil(want))))
        t0 = time.perf_counter()
        state, xs, gs = group.run(num, arrays)
        # Sliced on the host: slicing the device array compiles a program
        # for each length.
        xs = np.asarray(xs)[:num]
        gs = None if gs is None else np.asarray(gs)[:num]
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
