"""Scoring the arms of :func:`~numpyro_sgbd.tuning.tune`: the discrepancy of each
arm's thinned draws against the full-data scores there (or the minibatch scores it
recorded), a batch of arms per call.

Every call has the same shapes (a batch of ``batch`` arms, ``num_draws`` draws
each, padded and masked), so the programs compile once, before the rounds, and
one call is timed then: the budget reserves the scoring still to come from that
time and from the rounds' own scoring as they go.
"""

import functools
import math
import time

import jax
from jax import random
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.evaluation.fssd import fssd_opt
from numpyro_sgbd.evaluation.ksd import imq_ksd

#: Draws per batched full-data pass (arms x ``num_draws``): one pass over the
#: data serves the whole batch, so the rows are read once per batch, not per arm.
_DRAWS_PER_BATCH = 400


def _full_scores(objective, pre, xs):
    """Full-data scores in u at draws ``xs`` (rows of u), in one batched pass over
    the data chunks: ``L' grad_z log pi(z)`` at ``z = z_hat + L u``."""
    zs = jax.vmap(pre.to_z)(xs)
    _, grads = jax.vmap(objective.value_and_grad)(zs)
    return -pre.pull(grads)  # score = -grad U, pulled back to u


@functools.lru_cache(maxsize=None)
def _metric_batch(metric):
    """The metric of a batch of arms, ``(keys, x, s, mask) -> values``, one
    compiled program per metric (vmapped over the batch's leading axis)."""
    if metric == "ksd":

        def one(key, x, s, mask):
            return imq_ksd(x, s, mask=mask)

    else:

        def one(key, x, s, mask):
            return fssd_opt(key, x, s, mask=mask)

    return jax.jit(jax.vmap(one))


class Scorer:
    """Scores arms a batch at a time; :meth:`warm_up` compiles the programs and
    :meth:`time_batch` measures one call, so :meth:`predict` can say what scoring
    a number of arms will cost.

    :param shared: the tuning's :class:`~numpyro_sgbd.tuning.chains.Shared`.
    :param settings: its :class:`~numpyro_sgbd.tuning.arguments.Settings`.
    :param arms: every arm, in the table's order (an arm's index keys its
        metric's random draws, FSSD's locations).
    :param key_score: the key those keys fold from.
    """

    def __init__(self, shared, settings, arms, key_score):
        self.shared = shared
        self.settings = settings
        self.index = {a: i for i, a in enumerate(arms)}
        self.key_score = key_score
        self.batch = max(1, _DRAWS_PER_BATCH // settings.num_draws)
        #: Seconds per batched call: timed before the rounds, then each round's.
        self.seconds_per_batch = math.nan

    def _values(self, keys, x, s, mask):
        """One batched call on host arrays ``x`` (batch, num_draws, d), scores
        ``s`` alike or ``None`` (full-data scores), ``mask`` (batch, num_draws)."""
        if s is None:
            return np.asarray(self._full_call(keys, jnp.asarray(x), mask))
        metric = _metric_batch(self.settings.metric)
        return np.asarray(metric(keys, jnp.asarray(x), jnp.asarray(s), mask))

    @functools.cached_property
    def _full_call(self):
        """The full-data scores and the metric of a batch, as one compiled
        program: XLA then computes the gradients alone (the objective's values
        are dropped), several times faster than the objective's own program
        mapped over the draws."""
        objective, pre = self.shared.objective, self.shared.pre
        metric = _metric_batch(self.settings.metric)

        def call(keys, x, mask):
            s = _full_scores(objective, pre, x.reshape(-1, x.shape[-1]))
            return metric(keys, x, s.reshape(x.shape), mask)

        return jax.jit(call)

    def _dummy(self):
        """A batch at the mode (u = 0), every draw counted: for compiling and
        timing the calls, whose cost does not depend on the values."""
        b, m, d = self.batch, self.settings.num_draws, self.shared.d
        x = np.zeros((b, m, d), np.asarray(self.shared.pre.loc).dtype)
        s = None if self.shared.objective is not None else x
        keys = jnp.stack([self.key_score] * b)
        return keys, x, s, jnp.ones((b, m), bool)

    def warm_up(self):
        """Compile the batched calls (the first call); returns its seconds."""
        t0 = time.perf_counter()
        self._values(*self._dummy())
        return time.perf_counter() - t0

    def time_batch(self):
        """Time one compiled call, the estimate :meth:`predict` starts from."""
        t0 = time.perf_counter()
        self._values(*self._dummy())
        self.seconds_per_batch = time.perf_counter() - t0
        return self.seconds_per_batch

    def predict(self, num_arms):
        """Predicted seconds to score ``num_arms`` arms."""
        return math.ceil(num_arms / self.batch) * self.seconds_per_batch

    def score(self, draws):
        """``{arm: value}`` for ``draws`` (``{arm: _Draws}``): the metric of
        ``num_draws`` of each arm's draws, equally spaced over its run, ``inf``
        where not finite or where the arm recorded nothing. The time per batch
        it took becomes the estimate for the rounds to come."""
        num_draws, batch = self.settings.num_draws, self.batch
        arms = [a for a, dr in draws.items() if dr.count]
        values = {a: math.inf for a in draws}
        t0 = time.perf_counter()
        for start in range(0, len(arms), batch):
            part = arms[start : start + batch]
            rows = [_padded(draws[a], num_draws) for a in part]
            rows += [rows[0]] * (batch - len(part))  # padding, discarded
            x = np.stack([r[0] for r in rows])
            s = None if rows[0][1] is None else np.stack([r[1] for r in rows])
            mask = jnp.asarray(np.stack([r[2] for r in rows]))
            keys = jnp.stack(
                [random.fold_in(self.key_score, self.index[a]) for a in part]
                + [self.key_score] * (batch - len(part))
            )
            for a, v in zip(part, self._values(keys, x, s, mask)):
                values[a] = float(v) if np.isfinite(v) else math.inf
        if arms:
            calls = math.ceil(len(arms) / batch)
            self.seconds_per_batch = (time.perf_counter() - t0) / calls
        return values


def _padded(draws, num_draws):
    """``(x, s, mask)``: ``num_draws`` of the arm's draws equally spaced over its
    run, padded to ``num_draws`` rows with its last (masked out), so every arm
    has the shapes of the compiled calls."""
    x, s = draws.take(num_draws)
    m = len(x)
    pad = num_draws - m
    x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    if s is not None:
        s = np.concatenate([s, np.repeat(s[-1:], pad, axis=0)])
    return x, s, np.arange(num_draws) < m
