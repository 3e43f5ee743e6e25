"""Scoring the arms of :func:`~numpyro_sgbd.tuning.tune`: the discrepancy of each
arm's thinned draws against the full-data scores there, their control-variate
estimate on a fixed subset of the data, or the minibatch scores the arm
recorded, a batch of arms per call.

Every call has the same shapes (a batch of ``batch`` arms, ``num_draws`` draws
each, padded and masked), so the programs compile once, before the rounds, and
one call is timed then: the budget reserves the scoring still to come from that
time and from the rounds' own scoring as they go.
"""

import math
import time

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd.estimators import MinibatchEstimator
from numpyro_sgbd.evaluation.fssd import fssd_opt
from numpyro_sgbd.evaluation.ksd import imq_ksd

#: Draws per batched full-data pass (arms x ``num_draws``): one pass over the
#: data serves the whole batch, so the rows are read once per batch, not per arm.
_DRAWS_PER_BATCH = 400
#: Rows of the fixed subset behind ``scores="subset"``; ``scores="auto"`` uses
#: every row up to this many.
SUBSET_ROWS = 8192


class Subset:
    r"""The control-variate scores of ``scores="subset"``: around the mode
    :math:`\hat z`, with a fixed subset S of m rows drawn once without
    replacement (the same for every arm, draw and round),

    .. math::

        \nabla U(z) \approx \nabla U(\hat z) + \nabla\hat U_S(z)
            - \nabla\hat U_S(\hat z),

    :math:`\hat U_S` the minibatch potential on S (NumPyro's plate scales it by
    N/m) and :math:`\nabla U(\hat z)` the full-data gradient the mode search
    left. Exact at the mode and where S holds every row; elsewhere its error
    is that of the subset's estimate of the change in the gradient from the
    mode, shrinking like :math:`1/\sqrt{m}` for i.i.d. data (the control
    variates of the tuning paper, App. D.3, applied to the scores). Every arm
    is scored against the same fixed function, so the ranking compares like
    with like; a score costs m rows instead of N.

    :param source: the set-up's kernel (after ``init``).
    :param problem: the tuning's :class:`~numpyro_sgbd.tuning.chains.Problem`.
    :param int rows: m.
    """

    def __init__(self, source, problem, rows):
        setup = source.setup
        ((name, (size, _, dim)),) = source.estimator.plates.items()
        self.rows = min(rows, size)
        pick = np.random.default_rng(0).choice(size, self.rows, replace=False)
        self.indices = {name: jnp.asarray(np.sort(pick), jnp.int32)}
        self.pre = source.preconditioner
        self.estimator = MinibatchEstimator(
            problem.model, {name: (size, self.rows, dim)}, pullback=self.pre.pull
        )
        self.mode = setup.mode
        self.unravel = ravel_pytree(setup.mode)[1]
        self.mode_grad = ravel_pytree(setup.mode_value_grad[1])[0]

    def scores(self, xs, args, kwargs):
        """The scores in u at draws ``xs`` (rows of u)."""
        pre, est, idx = self.pre, self.estimator, self.indices

        def grad_u(z):
            return est.evaluate(z, idx, args, kwargs)[1]

        base = pre.pull(self.mode_grad) - grad_u(self.mode)
        grads = jax.vmap(lambda x: grad_u(self.unravel(pre.to_z(x))))(xs)
        return -(base + grads)


def _full_scores(objective, pre, xs):
    """Full-data scores in u at draws ``xs`` (rows of u), in one batched pass over
    the data chunks: ``L' grad_z log pi(z)`` at ``z = z_hat + L u``."""
    zs = jax.vmap(pre.to_z)(xs)
    _, grads = jax.vmap(objective.value_and_grad)(zs)
    return -pre.pull(grads)  # score = -grad U, pulled back to u


def _metric_fn(metric):
    if metric == "ksd":

        def one(key, x, s, mask):
            return imq_ksd(x, s, mask=mask)

    else:

        def one(key, x, s, mask):
            return fssd_opt(key, x, s, mask=mask)

    def batch(key, index, x, s, mask):
        keys = jax.vmap(lambda i: random.fold_in(key, i))(index)
        return jax.vmap(one)(keys, x, s, mask)

    return batch


class Scorer:
    """Scores arms a batch at a time, in one compiled program (:meth:`use`, from
    :meth:`program_job`; else compiled on first use); :meth:`time_batch`
    measures one call, so :meth:`predict` can say what scoring a number of
    arms will cost.

    :param shared: the tuning's :class:`~numpyro_sgbd.tuning.chains.Shared`.
    :param settings: its :class:`~numpyro_sgbd.tuning.arguments.Settings`.
    :param arms: every arm, in the table's order (an arm's index keys its
        metric's random draws, FSSD's locations).
    :param key_score: the key those keys fold from.
    """

    def __init__(self, shared, settings, arms, key_score):
        self.shared = shared
        self.settings = settings
        #: The :class:`Subset` of ``scores="subset"``, else ``None``.
        self.subset = shared.subset
        self.index = {a: i for i, a in enumerate(arms)}
        self.key_score = key_score
        self.batch = max(1, _DRAWS_PER_BATCH // settings.num_draws)
        #: Seconds per batched call: timed before the rounds, then each round's.
        self.seconds_per_batch = math.nan
        #: The compiled batched call (:meth:`use`), or ``None`` (compiled on
        #: first use).
        self.program = None

    def _values(self, index, x, s, mask):
        """One batched call on host arrays: the arms' indices ``index`` (batch,),
        draws ``x`` (batch, num_draws, d), scores ``s`` alike or ``None``
        (full-data or subset scores, computed in the call), ``mask`` (batch,
        num_draws)."""
        if self.program is None:
            self.program = jax.jit(self._call())
        return np.asarray(self.program(*self._arguments(index, x, s, mask)))

    def _arguments(self, index, x, s, mask):
        other = self.shared.arrays if s is None else s
        return (self.key_score, index, x, other, mask)

    def _call(self):
        """``call(key, index, x, scores or data, mask) -> values``: the scores
        (full-data or :class:`Subset`, from the data's arrays; or as given) and
        the metric of a batch, as one program: XLA then computes the gradients
        alone (the objective's values are dropped), several times faster than
        the objective's own program mapped over the draws."""
        objective, pre = self.shared.objective, self.shared.pre
        subset, rebuild = self.subset, self.shared.rebuild
        metric = _metric_fn(self.settings.metric)
        given = self.shared.scores == "minibatch"

        def call(key, index, x, other, mask):
            if given:
                return metric(key, index, x, other, mask)
            flat = x.reshape(-1, x.shape[-1])
            if subset is None:
                s = _full_scores(objective, pre, flat)
            else:
                s = subset.scores(flat, *rebuild(other))
            return metric(key, index, x, s.reshape(x.shape), mask)

        return call

    def program_job(self):
        """``(fn, args)``: the batched call and arguments to compile it for
        (:class:`~numpyro_sgbd.tuning.programs.Compiler`); :meth:`use` takes
        the compiled program."""
        return self._call(), self._arguments(*self._dummy())

    def use(self, program):
        """Make the compiled ``program`` (of :meth:`program_job`) the calls'."""
        self.program = program

    def _dummy(self):
        """A batch at the mode (u = 0), every draw counted: for compiling and
        timing the calls, whose cost does not depend on the values."""
        b, m, d = self.batch, self.settings.num_draws, self.shared.d
        x = np.zeros((b, m, d), np.asarray(self.shared.pre.loc).dtype)
        s = None if self.shared.scores != "minibatch" else x
        return np.zeros(b, np.int32), x, s, np.ones((b, m), bool)

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
            mask = np.stack([r[2] for r in rows])
            index = np.asarray(
                [self.index[a] for a in part] + [0] * (batch - len(part)), np.int32
            )
            for a, v in zip(part, self._values(index, x, s, mask)):
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
