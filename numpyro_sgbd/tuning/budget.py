""":func:`~numpyro_sgbd.tuning.tune`'s budget: wall time from the call to the
result.

The deadline is fixed when ``tune`` is called. Set-up and compiling come first
and are measured once, when every program is compiled; what is left pays for
the rounds. At the start of each round the scoring still to come (every round's
arms, at the seconds per batch the scorer last took) and the few steps that
build the result are kept back, and the rest is split equally among the rounds
still to come, each round taking at least what its arms need for a minimum of
draws: a round that overran leaves less to the later ones, and the result comes
back at the deadline.
"""

import logging
import math
import time

from numpyro_sgbd.tuning.arguments import MIN_DRAWS

logger = logging.getLogger("numpyro_sgbd")

#: Seconds kept back after the last round for building the winner's kernel and
#: the table (no compiling: a kernel object and a small DataFrame).
FINISH = 0.25
#: A budget refused for round 0 names the budget that would do with its
#: sampling part this much larger, so that a retry on a machine whose load
#: changes is not refused again (the step times come from four records).
_MARGIN = 1.5
#: Where set-up and compiling leave the rounds less than their minimum, they run
#: that minimum anyway if the result then comes back at most this many seconds
#: past the deadline (and no more than the budget itself); else the budget is
#: refused. Set-up and compiling take seconds whatever the budget.
GRACE = 5.0


def arms_per_round(num_alive, rounds, eta):
    """The number of arms scored in each round: ``num_alive`` in round 0, then
    the best ``1/eta`` of the round before (at least one)."""
    counts = [num_alive]
    for _ in range(rounds - 1):
        counts.append(max(1, counts[-1] // eta))
    return counts


class Deadline:
    """The end of one :func:`~numpyro_sgbd.tuning.tune` call's budget.

    :param float budget: seconds from the call to the result.
    :param float started: ``time.perf_counter()`` at the call.
    :param list counts: the arms scored in each round (:func:`arms_per_round`).
    :param scorer: the :class:`~numpyro_sgbd.tuning.scoring.Scorer`, whose
        seconds per batch predict the scoring to come.
    :param float per_arm: the sampling seconds an arm needs at least in each
        round (:func:`per_arm_floor`); 0 to split the rounds equally.
    """

    def __init__(self, budget, started, counts, scorer, per_arm=0.0):
        self.budget = budget
        self.started = started
        self.end = started + budget
        self.counts = counts
        self.scorer = scorer
        self.per_arm = per_arm

    def left(self):
        """Seconds until the deadline (negative past it)."""
        return self.end - time.perf_counter()

    def reserve(self, i):
        """Seconds kept back at the start of round ``i``: scoring rounds ``i``
        on, and building the result."""
        return sum(self.scorer.predict(c) for c in self.counts[i:]) + FINISH

    def floor(self, i):
        """The sampling seconds round ``i`` needs at least: :attr:`per_arm` for
        each of its arms."""
        return self.per_arm * self.counts[i]

    def needed(self):
        """Seconds every round's floor and the scoring take, with the result."""
        return sum(self.floor(i) for i in range(len(self.counts))) + self.reserve(0)

    def sampling(self, i):
        """Round ``i``'s sampling wall time: what is left less the reserve, an
        equal share for each round still to come, and at least its
        :meth:`floor` (a tight budget then overruns: :func:`check_budget`)."""
        rounds_left = len(self.counts) - i
        free = max(0.0, self.left() - self.reserve(i))
        return max(free / rounds_left, self.floor(i))


def per_arm_floor(groups, live, per_record):
    """The sampling seconds a round gives each arm at least, so that every arm
    adds :data:`MIN_DRAWS` draws: each arm is charged the same seconds, its
    share of its group's calls, so the slowest arm sets them."""
    slowest = max(
        per_record[id(g)] / len(live.intersection(g.arms))
        for g in groups
        if live.intersection(g.arms)
    )
    return MIN_DRAWS * slowest


def check_budget(groups, live, per_record, settings, deadline):
    """Refuse, before any arm runs, a budget that cannot give every round its
    floor (:data:`MIN_DRAWS` more draws for the slowest arm) once the set-up,
    compiling and the scoring to come are paid (or no arm at all to run),
    naming the budget that would do. Compiling is counted once, as measured:
    every program is compiled before this check, and none after.

    Where what is left covers the floors, each round gets an equal share of it
    or its floor, whichever is more (:meth:`Deadline.sampling`). Where it does
    not, but the floors and the scoring would end at most :data:`GRACE`
    seconds past the deadline (and no more than the budget past it), the
    rounds run their floors anyway and a warning says by how much the call
    will overrun: set-up and compiling do not shrink with the budget, and a
    result a few seconds late serves better than none."""
    num_alive = len(live)
    if not num_alive:
        raise ValueError(
            "Every arm breaks its sampler's noise bound at the start (step_size * "
            "tau^2 > 2 * friction): give smaller step_sizes, larger subsample_sizes "
            "or control variates."
        )
    rounds = len(deadline.counts)
    deadline.per_arm = per_arm_floor(groups, live, per_record)
    needed = deadline.needed()
    late = needed - deadline.left()
    if late <= 0:
        return
    spent = time.perf_counter() - deadline.started
    if late <= min(GRACE, deadline.budget):
        logger.warning(
            "tune: budget=%g s leaves the rounds less than their %d arms need for "
            "%d draws each once set-up and compiling (%.3g s) are paid: they run "
            "that minimum, and the result comes about %.2g s after the deadline. "
            "Pass budget >= %g s for more.",
            deadline.budget,
            num_alive,
            MIN_DRAWS,
            spent,
            late,
            _enough(deadline),
        )
        return
    reserve = deadline.reserve(0)
    r0 = max(deadline.left() - reserve, 0.0) / rounds / num_alive
    raise ValueError(
        f"budget={deadline.budget:g} s is wall time from the call to the result: "
        f"set-up and compiling took {spent:.3g} s and scoring the arms will take "
        f"about {reserve:.3g} s, which leaves {r0:.3g} s for each of the "
        f"{num_alive} arms in round 0 of {rounds}, but the slowest arm needs "
        f"{deadline.per_arm:.3g} s for {MIN_DRAWS} draws {settings.thinning} "
        f"steps apart. Pass budget >= {_enough(deadline):g} s, or fewer arms "
        "(samplers, step_sizes, subsample_sizes, gradients)."
    )


def _enough(deadline):
    """A budget that would give every round an equal share of at least round
    0's floor (with a margin): set-up and compiling as they took, the scoring
    as predicted."""
    spent = time.perf_counter() - deadline.started
    rounds = len(deadline.counts)
    minimum = spent + deadline.reserve(0) + _MARGIN * deadline.floor(0) * rounds
    return math.ceil(minimum * 10) / 10
