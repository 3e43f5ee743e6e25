"""MAMBA: choosing the sampler, its step size and the minibatch size for a
wall-clock budget, by successive halving scored with a Stein discrepancy.

:func:`tune` runs every combination of the given samplers, gradient estimators,
subsample sizes and step sizes (the *arms*) for a short time, scores each by the
kernel Stein discrepancy (or FSSD) of its thinned draws against the full-data score,
keeps the best third and gives the survivors three times as long, until one is left
(Coullon, South & Nemeth, Algorithm 1). It returns the winner as a kernel ready for
:class:`~numpyro.infer.MCMC`, with a table of every arm in every round.

Its arguments are checked in :mod:`~numpyro_sgbd.tuning.arguments`; the arms'
chains (their shared set-up, families and groups, timed runs) are in
:mod:`~numpyro_sgbd.tuning.chains`, the compiled programs that start and run
them in :mod:`~numpyro_sgbd.tuning.programs` (one per sampler family, the
subsample size a traced value: :mod:`~numpyro_sgbd.tuning.sizes`), the scores in
:mod:`~numpyro_sgbd.tuning.scoring` and the deadline in
:mod:`~numpyro_sgbd.tuning.budget`; here are the rounds.
"""

from dataclasses import dataclass, field
import logging
import math
import time
from typing import NamedTuple

from jax import random
import numpy as np

from numpyro_sgbd.estimators import as_jax_arrays
from numpyro_sgbd.tuning.arguments import (  # noqa: F401 (public here as before)
    METRICS,
    MIN_DRAWS,
    SAMPLERS,
    SCORES,
    Arm,
    Settings,
    check_settings,
    plate_choice,
    sampler_grids,
)
from numpyro_sgbd.tuning.budget import Deadline, arms_per_round, check_budget
from numpyro_sgbd.tuning.chains import (
    Problem,
    Recording,
    Records,
    Shared,
    _Draws,  # noqa: F401 (the tests read it here)
    ready_groups,
    run_groups,
    shared_setup,
    winner_kernel,
)
from numpyro_sgbd.tuning.scoring import (
    Scorer,
    _full_scores,  # noqa: F401 (the tests read it here)
)

__all__ = ["Arm", "TuneResult", "tune"]

logger = logging.getLogger("numpyro_sgbd")


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
    :ivar float budget: the budget in seconds: wall time from the call to
        :func:`tune` to its result, everything included.
    :ivar int rounds: the number of rounds, ``floor(log_eta M)`` (at least 1).
    :ivar dict seconds: wall-clock seconds by phase, all inside the budget:
        ``"setup"`` (mode search, preconditioner, control-variate centre, the
        score function), ``"compile"`` (each family's kernel, prepared without
        compiling, and its program, the start of every chain, the scoring's
        programs, the timed records and scoring call), ``"sampling"`` (the
        rounds' runs, masked chains of pruned arms included), ``"scoring"``
        (scores and discrepancies) and ``"total"``, from the call to the result
        (at most the budget up to small overruns, or up to 5 s past the
        deadline where set-up and compiling left the rounds too little: see
        :func:`tune`, **Time**).
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
    scores="auto",
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
    :math:`r_i = S / (|S_i| R)` more seconds, continuing its chain; then each is
    scored by the discrepancy of ``num_draws`` of its draws (equally spaced over its
    whole run, kept every ``thinning`` steps) and only the best
    :math:`\lfloor |S_i| / \eta \rfloor` go on; the winner is the best arm of the
    last round. ``budget`` (T) is wall time from the call to the result: S is
    what set-up, compiling and scoring leave of it (see **Time**).

    **Coordinates.** Every arm runs with the preconditioner of
    ``step_size=None`` (the full-data mode :math:`\hat z` and
    :math:`z = \hat z + L u` from the Hessian there, found once and shared), starts
    from one draw of the Laplace approximation (the same for every arm) and
    takes its step size in u, where the posterior has unit scale. The discrepancy is
    taken in u as well, with the score :math:`L^\top \nabla_z \log\pi`, so the IMQ
    kernel's unit length fits every model. Default step sizes are the sampler's
    ``step_size=None`` target times 2, 1, 1/4, 1/16 and 1/64; default subsample
    sizes are the plate's declared n, n / 10 and 10 n (within [2, N)).

    **Time.** The deadline is the call's start plus ``budget``. The set-up (mode
    search, preconditioner, centre) is done once; then everything the rounds run
    is compiled once, in worker threads: one program per family (a sampler with
    one gradient estimator), whose step size and subsample size are arguments,
    one program that starts every chain (one draw of the Laplace
    approximation, the first gradient estimate there once per estimator and
    size), and the scoring's; one call of each group (a family's arms of one
    subsample size, as vectorised chains, one per step size, with
    ``vectorize=True``) is timed. A family's sizes run in calls of their own,
    each costing what its minibatch costs (formed in passes of a fixed number
    of rows, the last masked; :mod:`~numpyro_sgbd.tuning.sizes`). At the
    start of each round the scoring still to come (predicted from the last
    timed scoring) is kept back, and the rest is split equally among the
    rounds to come, each round taking at least what its arms need for 10 more
    draws of the slowest (where set-up and compiling leave less than those
    minimums, the rounds run them anyway if the result then comes at most 5 s,
    and at most the budget, past the deadline, with a warning); a round's
    share is split equally among its arms. An arm is charged its
    group's wall time divided by the number of live arms in the group: the
    chains of pruned arms run on in their group's call, masked (neither
    recorded nor charged to them), so nothing compiles once the rounds start.
    ``result.seconds`` reports set-up, compiling, sampling and scoring apart.

    **Failures.** An arm whose chain meets a non-finite value (the kernel's guard
    stops it) is scored ``inf`` and pruned, and so is an SGHMC or SGNHT arm whose
    step breaks the corrected variant's bound :math:`\epsilon \tau^2 \le 2 D` at
    the start (the kernel would refuse it); neither stops the tuning.

    :param model: the NumPyro model, its data in one subsample plate
        ``numpyro.plate(name, N, subsample_size=n)`` (several subsample plates: the
        declared sizes only, minibatch gradients only).
    :param model_args: the model's positional arguments (the data).
    :param float budget: seconds of wall time from the call to the result (T):
        set-up, compiling, sampling and scoring all count.
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
        computed in chunks of ``chunk_size`` rows), ``"subset"`` (its control
        variate estimate around the mode on a fixed random subset of 8,192 rows,
        the same for every arm: :class:`~numpyro_sgbd.tuning.scoring.Subset`),
        ``"auto"`` (the default: ``"full"`` up to 8,192 rows, ``"subset"``
        above, with one subsample plate) or ``"minibatch"`` (the stochastic KSD
        of the tuning paper's Appendix B.2: the arm's own minibatch estimate at
        each recorded draw; cheaper, noisier).
    :param bool vectorize: run a family's step sizes of one subsample size as
        vectorised chains (one call of its program for them all); ``False``:
        one call for each arm, of the same program.
    :param str preconditioner: ``"auto"``, ``"dense"``, ``"lowrank"`` or
        ``"diagonal"`` (see :class:`~numpyro_sgbd.SGBD`).
    :param int chunk_size: data rows per chunk of full-data passes.
    :param model_kwargs: the model's keyword arguments.
    :return: a :class:`TuneResult`.
    :raises ValueError: for bad arguments (before any compiling), and when what
        set-up, compiling and the predicted scoring leave of the budget (and
        up to 5 s past the deadline) cannot give the slowest arm 10 more
        recorded draws in each round (after compiling, which measures the step
        and scoring times, before any arm runs; the message names the budget
        that would do).

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
    >>> result = tune(model, y, budget=10.0, samplers=["SGLD"],
    ...               gradients=["minibatch"], subsample_sizes=[32],
    ...               step_sizes=[0.4, 1e-5, 1e-7])
    >>> result.arm.step_size  # in 10 s, 1e-5 barely moves; 1e-7 not at all
    0.4
    >>> mcmc = MCMC(result.kernel, num_warmup=100, num_samples=1000,
    ...             progress_bar=False)
    >>> mcmc.run(jax.random.key(1), y)
    >>> bool(abs(mcmc.get_samples()["mu"].mean() - y.mean()) < 0.05)
    True
    """
    started = time.perf_counter()  # the budget runs from here
    settings = check_settings(
        Settings(
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
    )
    entries, grids = sampler_grids(samplers, step_sizes)
    rng_key = random.key(0) if rng_key is None else rng_key
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    choice = plate_choice(model, model_args, model_kwargs, gradients, subsample_sizes)
    problem = Problem(model, model_args, model_kwargs, choice.plate)
    arms = _arms(entries, grids, choice)
    rounds = _num_rounds(len(arms), settings.eta)
    seconds = {"setup": 0.0, "compile": 0.0, "sampling": 0.0, "scoring": 0.0}
    import pandas  # noqa: F401 (the table's; imported now, inside the set-up)

    shared = shared_setup(problem, choice.gradients, settings, rng_key)
    seconds["setup"] = time.perf_counter() - started

    # Compile everything the rounds run (every group's program, the scoring),
    # time four records of each group and one scoring call (uncharged), so a
    # budget too small for round 0 is refused before any arm runs.
    t0 = time.perf_counter()
    # One key for both: the start splits it in its program, the scorer folds
    # each arm's index into it in its own (no eager op compiles here).
    factories = dict(entries)
    recording = Recording(shared, settings.thinning, shared.scores == "minibatch")
    scorer = Scorer(shared, settings, arms, rng_key)
    groups, kernels, status, per_record = ready_groups(
        arms, factories, problem, recording, settings, rng_key, scorer
    )
    seconds["compile"] = time.perf_counter() - t0
    live = {a for g in groups for a in g.arms if a not in status}
    counts = arms_per_round(len(live), rounds, settings.eta)
    deadline = Deadline(settings.budget, started, counts, scorer)
    check_budget(groups, live, per_record, settings, deadline)

    plan = _Plan(rounds, settings, shared, scorer, deadline)
    records = Records.start(groups, settings.num_draws)
    out, table_rows = _rounds(groups, live, plan, records, per_record, seconds)
    table = _table(table_rows, status)
    best, kernel = _winner(out, kernels, factories, problem, plan)
    seconds["total"] = time.perf_counter() - started
    charged, steps = records.charged[best], records.steps[best]
    return TuneResult(
        kernel=kernel,
        arm=best,
        table=table,
        metric=metric,
        budget=settings.budget,
        rounds=rounds,
        seconds=seconds,
        steps_per_second=steps / charged if charged else math.nan,
    )


def _arms(entries, grids, choice):
    """Every combination of sampler, gradient estimator, subsample size and the
    sampler's step sizes, in this order (the table's)."""
    return [
        Arm(name, g, n, h)
        for name, _ in entries
        for g in choice.gradients
        for n in choice.subsample_sizes
        for h in grids[name]
    ]


def _winner(last_round, kernels, factories, problem, plan):
    """``(arm, kernel)``: the best arm of the last round as a kernel ready for
    MCMC; a RuntimeError where no arm of the last round has a finite score."""
    best = last_round.ranked[0]
    if not np.isfinite(last_round.values[best]):
        raise RuntimeError(
            "tune: every arm blew up (non-finite draws) or broke its noise bound; "
            "see the arms' table in the logs. Give smaller step_sizes."
        )
    kernel = winner_kernel(
        factories[best.sampler],
        best,
        kernels[best],
        problem,
        plan.shared.form,
        plan.settings.chunk_size,
    )
    return best, kernel


class _Plan(NamedTuple):
    """What every round reads: fixed once the groups are built."""

    rounds: int
    settings: Settings
    shared: Shared
    scorer: Scorer
    deadline: Deadline


class _Round(NamedTuple):
    """What one round leaves."""

    #: The arms that go on to the next round (the winner after the last).
    survivors: set
    #: The round's rows of the table, one per arm that ran in it.
    rows: list
    #: The arms that ran, best first, and their discrepancies.
    ranked: list
    values: dict
    #: Seconds spent sampling and scoring in the round.
    seconds: dict


def _rounds(groups, live, plan, records, per_record, seconds):
    """``(last round, table rows)``: every round in turn, each one's sampling
    and scoring seconds added to ``seconds``."""
    rows, out = [], None
    for i in range(plan.rounds):
        known = {} if out is None else out.values
        out = _round(i, groups, live, plan, records, per_record, known)
        live = out.survivors
        rows += out.rows
        for phase, spent in out.seconds.items():
            seconds[phase] += spent
    return out, rows


def _round(i, groups, live, plan, records, per_record, known):
    """Round ``i``: every arm of ``live`` charged an equal share of the round's
    sampling time (:meth:`Deadline.sampling`: what is left of the budget after
    the scoring to come, split over the rounds to come), continuing its chain
    on its group's program, then scored; the best ``1/eta`` go on (the best one
    in the last round)."""
    settings, deadline = plan.settings, plan.deadline
    # Round i's share: an equal part of its sampling time for each of its arms.
    r = deadline.sampling(i) / len(live)
    if r == 0.0:
        logger.warning(
            "tune: round %d of %d starts at the end of the budget (%g s); its "
            "arms are ranked on the draws they have.",
            i + 1,
            plan.rounds,
            deadline.budget,
        )
    arrays = plan.shared.arrays
    t_round = time.perf_counter()
    run_groups(groups, live, r, arrays, per_record, records, settings.thinning)
    sampling = time.perf_counter() - t_round

    t_score = time.perf_counter()
    if r == 0.0 and all(a in known for a in live):
        # No new draws (a budget that left this round nothing): the last
        # round's values stand, and its ranking.
        values = {a: known[a] for a in live}
    else:
        scored = {a: records.draws[a] for a in live if a not in records.stopped}
        values = plan.scorer.score(scored)
        values.update({a: math.inf for a in live if a in records.stopped})
    scoring = time.perf_counter() - t_score

    alive = [a for a in plan.scorer.index if a in live]  # the table's order
    ranked = sorted(alive, key=lambda a: values[a])
    last = i == plan.rounds - 1
    survivors = ranked[:1] if last else ranked[: max(1, len(alive) // settings.eta)]
    rows = _round_rows(i, alive, survivors, last, values, records, settings)
    logger.info(
        "tune: round %d of %d, %d arms of %.3g s; best %s %s = %.4g.",
        i + 1,
        plan.rounds,
        len(alive),
        r,
        _arm_label(ranked[0]),
        settings.metric,
        values[ranked[0]],
    )
    spent = {"sampling": sampling, "scoring": scoring}
    return _Round(set(survivors), rows, ranked, values, spent)


def _round_rows(i, alive, survivors, last, values, records, settings):
    """The table's rows of round ``i``: each arm's charged seconds, steps, scored
    draws, discrepancy and status."""
    rows = []
    for a in alive:
        if a in records.stopped:
            how = "non-finite"
        elif a in survivors:
            how = "winner" if last else "kept"
        else:
            how = "pruned"
        rows.append(
            dict(
                round=i,
                **a._asdict(),
                seconds=records.charged[a],
                steps=records.steps[a],
                draws=min(settings.num_draws, len(records.draws[a].index)),
                discrepancy=values[a],
                status=how,
            )
        )
    return rows


def _table(rows, status):
    """The :class:`pandas.DataFrame` of the rounds' rows and, as round 0 rows with
    an infinite discrepancy, the arms that never ran (``status``)."""
    import pandas as pd

    never_ran = [
        dict(
            round=0,
            **a._asdict(),
            seconds=0.0,
            steps=0,
            draws=0,
            discrepancy=math.inf,
            status=how,
        )
        for a, how in status.items()
    ]
    return pd.DataFrame(rows + never_ran)
