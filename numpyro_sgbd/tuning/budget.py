""":func:`~numpyro_sgbd.tuning.tune`'s budget: wall time from the call to the
result.

The deadline is fixed when ``tune`` is called. Set-up and compiling come first
and are measured; what is left pays for the rounds. At the start of each round
the scoring still to come (every round's arms, at the seconds per batch the
scorer last took) and the few steps that build the result are kept back, and the
rest is split equally among the rounds still to come: a round that overran
leaves less to the later ones, and the result comes back at the deadline.
"""

import math
import time

from numpyro_sgbd.tuning.arguments import MIN_DRAWS

#: Seconds kept back after the last round for building the winner's kernel and
#: the table (no compiling: a kernel object and a small DataFrame).
FINISH = 0.25
#: A budget refused for round 0 names the budget that would do with its
#: sampling part this much larger, so that a retry on a machine whose load
#: changes is not refused again (the step times come from four records).
_MARGIN = 1.5


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
    """

    def __init__(self, budget, started, counts, scorer):
        self.budget = budget
        self.started = started
        self.end = started + budget
        self.counts = counts
        self.scorer = scorer

    def left(self):
        """Seconds until the deadline (negative past it)."""
        return self.end - time.perf_counter()

    def reserve(self, i):
        """Seconds kept back at the start of round ``i``: scoring rounds ``i``
        on, and building the result."""
        return sum(self.scorer.predict(c) for c in self.counts[i:]) + FINISH

    def sampling(self, i):
        """Round ``i``'s sampling wall time: what is left less the reserve, an
        equal share for each round still to come (0 past the deadline)."""
        rounds_left = len(self.counts) - i
        return max(0.0, (self.left() - self.reserve(i)) / rounds_left)


def check_budget(groups, per_record, settings, deadline):
    """Refuse, before any arm runs, a budget that leaves the slowest arm fewer
    than :data:`MIN_DRAWS` records in round 0 once the set-up, compiling and the
    scoring to come are paid (or no arm at all to run), naming the budget that
    would do."""
    num_alive = sum(len(g.arms) for g in groups)
    if not num_alive:
        raise ValueError(
            "Every arm breaks its sampler's noise bound at the start (step_size * "
            "tau^2 > 2 * friction): give smaller step_sizes, larger subsample_sizes "
            "or control variates."
        )
    rounds = len(deadline.counts)
    sampling = deadline.sampling(0)
    r0 = sampling / num_alive
    # A chain is charged its share of its group's call: per record, the call's
    # time over the group's chains.
    slowest = max(per_record[id(g)] / len(g.arms) for g in groups)
    needed = MIN_DRAWS * slowest
    if r0 >= needed:
        return
    spent = time.perf_counter() - deadline.started
    reserve = deadline.reserve(0)
    minimum = spent + reserve + _MARGIN * needed * num_alive * rounds
    raise ValueError(
        f"budget={deadline.budget:g} s is wall time from the call to the result: "
        f"set-up and compiling took {spent:.3g} s and scoring the arms will take "
        f"about {reserve:.3g} s, which leaves {max(r0, 0.0):.3g} s for each of the "
        f"{num_alive} arms in round 0 of {rounds}, but the slowest arm needs "
        f"{needed:.3g} s for {MIN_DRAWS} draws {settings.thinning} steps apart. "
        f"Pass budget >= {math.ceil(minimum * 10) / 10:g} s, or fewer arms "
        "(samplers, step_sizes, subsample_sizes, gradients)."
    )
