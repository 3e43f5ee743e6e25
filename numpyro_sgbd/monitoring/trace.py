"""The convergence check after sampling: thinned draws kept in the state, and the
host check they feed once a run ends.

NumPyro's :class:`~numpyro.infer.MCMC` calls a kernel's ``sample`` once per
iteration and gives it no word of when the run ends, nor the draws afterwards.
So the kernel keeps its own record: when ``init`` is called by an ``MCMC`` run
(found on the call stack through its public ``sampler``, ``num_samples`` and
``num_chains``), the state gets a :class:`Trace` buffer of at most
:data:`TRACE_ROWS` evenly spaced sampling draws of at most :data:`TRACE_COORDS`
unconstrained coordinates, written in place once per sample, which the host
reads when the run has ended (:mod:`~numpyro_sgbd.monitoring.checks`; under
:func:`~numpyro_sgbd.monitoring.per_step` the sample that ends the run calls
the host with it). There :class:`ConvergenceCheck` pools
the chains and computes the rank-normalised bulk and tail ESS and split R-hat of
Vehtari et al. (2021), the statistics ArviZ reports, with
:mod:`numpyro_sgbd.monitoring.convergence`.

The record holds every draw the run keeps (every ``thinning``-th sample of
NumPyro's ``MCMC``) where that fits in :data:`TRACE_ROWS` x :data:`TRACE_COORDS`
values per chain (more rows where fewer coordinates are checked), so the check's
ESS is that of the draws ``mcmc.get_samples()`` returns, computed as
:func:`~numpyro_sgbd.compare` computes it
(:func:`numpyro_sgbd.monitoring.convergence.summary`):
for a model of up to 256 unconstrained coordinates the two agree exactly. A
longer run is thinned further, evenly; the ESS of draws thinned to k rows is about
``min(k, ESS of the chain)``, so a chain with fewer than :data:`MIN_ESS`
effective draws still shows it, and the warning says the draws were thinned.
Rank-based statistics do not change under monotone maps of a coordinate, so
checking the unconstrained draws is checking the constrained ones.

**References**

1. Vehtari, A., Gelman, A., Simpson, D., Carpenter, B. & Buerkner, P.-C. (2021).
   *Rank-normalization, folding, and localization: an improved R-hat for
   assessing convergence of MCMC.* Bayesian Analysis 16(2), Sections 4.1-4.3.
"""

import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "ConvergenceWarning",
    "MIN_ESS",
    "MAX_RHAT",
    "TRACE_COORDS",
    "TRACE_ROWS",
    "Trace",
]

#: Sampling draws kept per chain for the check at :data:`TRACE_COORDS`
#: coordinates: the record's size bound is ``TRACE_ROWS * TRACE_COORDS`` values
#: per chain, which fewer coordinates spend on more rows.
TRACE_ROWS = 1024
#: Unconstrained coordinates checked, at most (evenly spaced over the flat z).
TRACE_COORDS = 256
#: The check warns below this bulk or tail ESS (Vehtari et al. 2021, Section 4.3).
MIN_ESS = 100
#: ... or, with several chains, above this rank-normalised split R-hat (ibid.).
#: One chain's split R-hat (its halves compared) is recorded but not checked:
#: at the few hundred effective draws of a converged default run it exceeds 1.01
#: in some coordinate by its own noise about one run in twelve (4 of 50 seeds of
#: SGBD on 10^6 rows, d = 10, ESS about 700), and a chain that trends is what the
#: drift check, with its noise-aware threshold, already reports.
MAX_RHAT = 1.01


class ConvergenceWarning(RuntimeWarning):
    """The convergence check's warning: too few effective draws, or chains that
    disagree. Its own class, so that a caller running deliberately short chains
    can filter it alone (``warnings.filterwarnings("ignore",
    category=ConvergenceWarning)``)."""


class Trace(NamedTuple):
    """The state's record of thinned sampling draws (see the module)."""

    #: ``(rows, coords)`` per chain; row ``j`` is the draw of sample
    #: ``(j + 1) * every`` of the run.
    rows: jax.Array


class TracePlan(NamedTuple):
    """Static facts of a run's record, fixed when ``init`` finds the run."""

    #: Samples the run draws after warmup.
    num_samples: int
    #: Chains of the run.
    num_chains: int
    #: Samples between kept rows.
    every: int
    #: Kept rows per chain.
    rows: int
    #: Flat indices of the checked coordinates.
    coords: tuple
    #: The run's own thinning (``MCMC(thinning=...)``): it keeps one sample
    #: in ``thinning``; ``every`` is a multiple of it.
    thinning: int = 1
    #: For a network model, the rows of ``plate`` whose log-likelihood the
    #: record keeps after the coordinates, and which the convergence and drift
    #: checks read instead of them (:mod:`~numpyro_sgbd.monitoring.predictive`).
    probes: tuple = ()
    plate: str = ""

    @property
    def width(self):
        """The record's columns: the coordinates, then the probed rows."""
        return len(self.coords) + len(self.probes)

    def checked(self, rows):
        """``(columns, ids)``: the columns of ``rows`` (``(..., coords)``) the
        convergence and drift checks read (the probed rows' log-likelihoods for
        a network, else the coordinates) and their flat coordinates or rows."""
        if self.probes:
            return rows[..., len(self.coords) :], self.probes
        return rows[..., : len(self.coords)], self.coords

    def name(self, shapes, j):
        """How a message names the checked column of id ``j``."""
        from numpyro_sgbd.monitoring.notes import flat_name
        from numpyro_sgbd.monitoring.predictive import row_name

        return row_name(self.plate, j) if self.probes else flat_name(shapes, j)


def driving_mcmc(kernel):
    """The :class:`~numpyro.infer.MCMC` whose ``run`` (or ``warmup``) is calling
    ``kernel`` now, from the call stack; ``None`` when none is (a kernel driven
    by hand, by :func:`~numpyro_sgbd.tune`, ...)."""
    from numpyro.infer import MCMC

    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, MCMC) and owner.sampler is kernel:
            return owner
        frame = frame.f_back
    return None


def plan(mcmc, dim, first=(), probes=("", ())):
    """The :class:`TracePlan` for a run of ``mcmc`` over ``dim`` coordinates, or
    ``None`` (no MCMC, or a run too short for the statistics). The flat indices
    ``first`` are checked before any other (up to :data:`TRACE_COORDS`), the
    rest spread evenly: with local sites, the global sites' coordinates, which
    the rows' thousands would otherwise crowd out. ``probes``: ``(plate,
    rows)`` whose log-likelihood a network's record keeps as well."""
    thinning = int(getattr(mcmc, "thinning", 1) or 1)
    if mcmc is None or dim == 0 or mcmc.num_samples // thinning < 4:
        return None
    num_samples = int(mcmc.num_samples)
    first = np.asarray(first, int)[:TRACE_COORDS]
    spread = np.linspace(0, dim - 1, min(dim, TRACE_COORDS - first.size)).round()
    coords = np.unique(np.concatenate([first, spread]))
    # The kept draws (NumPyro keeps the last sample of each block of
    # `thinning`, as `record` does), thinned further where they do not fit.
    kept = num_samples // thinning
    most = TRACE_ROWS * TRACE_COORDS // (len(coords) + len(probes[1]))
    every = thinning * -(-kept // most)
    return TracePlan(
        num_samples,
        int(mcmc.num_chains),
        every,
        num_samples // every,
        tuple(int(j) for j in coords),
        thinning,
        tuple(probes[1]),
        probes[0],
    )


def empty_trace(plan, dtype, batch_shape=()):
    """A zero :class:`Trace` for ``plan``."""
    shape = batch_shape + (plan.rows, plan.width)
    return Trace(jnp.zeros(shape, dtype))


def record(trace, plan, z, sample, probe=None):
    """``trace`` with the draw ``z`` (a pytree, chains leading where
    ``trace.rows`` has a chain axis) written at the row of the sampling sample
    ``sample`` (1 for the first draw after warmup; warmup samples write row 0,
    which sampling overwrites). One row is written every call, so the last draw
    of each block of ``plan.every`` samples is what stays. ``probe``: for a
    plan with probed rows, ``z -> (..., rows)`` their log-likelihoods
    (:func:`~numpyro_sgbd.monitoring.predictive.probe_fn`), formed only where
    the sample's row is the one kept."""
    batch = trace.rows.shape[:-2]
    # Each leaf's own coordinates, gathered from it: concatenating z whole to
    # pick a few hundred coordinates copied every weight of a network each step
    # (10-18 % of a 784-100-10 network's SGLD step, benchmarks/results.md).
    coords, at, parts = np.asarray(plan.coords), 0, []
    for x in jax.tree.leaves(z):
        size = int(np.prod(jnp.shape(x)[len(batch) :]))
        mine = coords[(coords >= at) & (coords < at + size)] - at
        if mine.size:
            parts.append(jnp.reshape(x, batch + (size,))[..., jnp.asarray(mine)])
        at += size
    last = jnp.max(sample)
    slot = jnp.clip((last - 1) // plan.every, 0, plan.rows - 1)
    if plan.probes:
        # Only a sampling draw that stays in its row pays for the forward pass:
        # the last of its block, or one past the last full block (the last
        # row); warmup's draws (sample <= 0) never stay.
        stays = (last % plan.every == 0) | (last > plan.rows * plan.every)
        kept = stays & (last > 0)
        zeros = jnp.zeros(batch + (len(plan.probes),), trace.rows.dtype)
        values = jax.lax.cond(
            kept, lambda z: probe(z).astype(zeros.dtype), lambda z: zeros, z
        )
        parts.append(values)
    row = jnp.concatenate(parts, axis=-1).astype(trace.rows.dtype)
    rows = jax.lax.dynamic_update_index_in_dim(
        trace.rows, row[..., None, :], slot, axis=len(batch)
    )
    return Trace(rows)


def run_ends(plan, before, after):
    """Whether the samples ``(before, after]`` (sampling samples, traced) hold
    the run's last one."""
    return jnp.any((before < plan.num_samples) & (after >= plan.num_samples))


class ConvergenceCheck:
    """Pools the chains' kept rows as each chain's run ends (sequential and
    parallel chains call once each, vectorized chains once together) and, when
    all are in, returns the statistics."""

    def __init__(self, plan):
        self.plan = plan
        self._rows = []
        #: Every chain's rows ``(chains, rows, coords)`` once all are in (for
        #: the run's error estimate), else ``None``.
        self.draws = None

    @property
    def pending(self):
        """Whether some chains of the run have ended and others not yet."""
        return bool(self._rows)

    def add(self, rows):
        """Add ``rows`` (``(..., rows, columns)``); return the report once every
        chain is in, else ``None``. ``draws`` keeps the coordinates' columns."""
        rows = np.asarray(rows, np.float64)
        self._rows.append(rows.reshape((-1,) + rows.shape[-2:]))
        if sum(r.shape[0] for r in self._rows) < self.plan.num_chains:
            return None
        draws, self._rows = np.concatenate(self._rows), []
        self.draws = draws[..., : len(self.plan.coords)]
        checked, ids = self.plan.checked(draws)
        found = report(checked, ids)
        found["checked"] = "rows" if self.plan.probes else "coordinates"
        return found


def report(draws, coords):
    """The check's numbers for ``draws`` ``(chains, rows, coords)``: a dict with
    the per-coordinate ``ess_bulk``, ``ess_tail`` and ``rhat`` (for one chain the
    split R-hat of its halves, recorded but not checked: ``rhat_checked``), their
    worst values and flat coordinates, and what was checked. A kernel's
    ``convergence`` adds ``checked``: ``"coordinates"``, or ``"rows"`` where the
    columns are a network's probed rows (``coords`` then holds their row
    indices; :mod:`~numpyro_sgbd.monitoring.predictive`)."""
    from numpyro_sgbd.monitoring import convergence

    stats = convergence.summary(draws)
    ess = np.fmin(stats.ess_bulk, stats.ess_tail)
    out = {
        "ess_bulk": stats.ess_bulk,
        "ess_tail": stats.ess_tail,
        "rhat": stats.rhat,
        "num_chains": draws.shape[0],
        "num_draws": draws.shape[1],
        "coords": np.asarray(coords),
    }
    finite = np.isfinite(ess)
    worst = int(np.argmin(np.where(finite, ess, np.inf))) if finite.any() else None
    out["min_ess_bulk"] = float(np.nanmin(stats.ess_bulk)) if finite.any() else np.nan
    out["min_ess_tail"] = float(np.nanmin(stats.ess_tail)) if finite.any() else np.nan
    out["worst_ess"] = None if worst is None else int(coords[worst])
    rhat_ok = np.isfinite(stats.rhat)
    out["max_rhat"] = float(np.nanmax(stats.rhat)) if rhat_ok.any() else np.nan
    out["worst_rhat"] = (
        int(coords[int(np.nanargmax(stats.rhat))]) if rhat_ok.any() else None
    )
    out["rhat_checked"] = draws.shape[0] > 1
    out["converged"] = bool(
        not (out["min_ess_bulk"] < MIN_ESS)
        and not (out["min_ess_tail"] < MIN_ESS)
        and not (out["rhat_checked"] and out["max_rhat"] > MAX_RHAT)
    )
    return out
