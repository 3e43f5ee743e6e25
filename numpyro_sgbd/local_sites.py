r"""Latent sites inside the subsample plate ("local sites"): a random effect per
row, a per-row scale, a latent position per datum, written as NumPyro writes them
(``numpyro.sample`` inside ``numpyro.plate(name, N, subsample_size=n)``).

**The scheme.** Write the model as :math:`p(\theta) \prod_i p(u_i, y_i \mid
\theta)`, with :math:`\theta` the global sites and :math:`u_i` datum i's local
sites. Each chain holds every :math:`u_i` (the site as an array over all N rows,
unconstrained, in ``state.z``: memory O(N x site size)). Where a step
estimates the gradient on its minibatch S (at the end of the step for the rules
that move on the gradient at their start, SGBD paper Algorithm 2, and for
BAOAB), it first

1. moves the rows :math:`u_i, i \in S`, each by one Metropolis-adjusted Barker
   step on its exact conditional :math:`p(u_i \mid \theta, y_i) \propto
   p(u_i, y_i \mid \theta)` at that position :math:`\theta` (a state of the
   chain; NOGIN, which estimates between its two drifts, at no state, moves
   the rows at the start of its step instead: ``Family.rows_first``), which involves
   datum i alone (:func:`~numpyro_sgbd.updates.barker_mh.barker_mh_rows`); the
   other rows stay;
2. then estimates :math:`\nabla_\theta \log p(\theta, u, y) = \nabla\log
   p(\theta) + \sum_i \nabla_\theta \log p(u_i, y_i \mid \theta)` on the
   same S at the new rows (the plate's N/n scale applies to the local sites'
   densities as to the data), which the sampler's own rule moves
   :math:`\theta` on. For SGBD, SGLD and the other rules of that kind no row
   changes between this estimate and the move that uses it.

This is a Gibbs sampler of the two blocks (Geman & Geman 1984; as SGRLD's
latent Dirichlet allocation samples each minibatch document's topic assignments
from their conditional before the global stochastic-gradient step, Patterson &
Teh 2013, *Stochastic gradient Riemannian Langevin dynamics on the probability
simplex*, NeurIPS, Section 4). Why it leaves the posterior invariant: S is drawn
independently of the state, and for each S step 1 is a product of Metropolis-
Hastings kernels, one per row, each exactly invariant for that row's conditional,
so it leaves the joint posterior exactly invariant; a mixture over S of invariant
kernels is invariant. Given S, the state after step 1 is still distributed as
the posterior, so S is independent of it and step 2's estimate is unbiased for
:math:`\nabla_\theta \log p(\theta \mid u, y)`; the rule's move of
:math:`\theta` on it targets that conditional up to the usual discretisation
and gradient-noise bias (``docs/maths.rst``; SGBD paper, Section 3). The
composition keeps the posterior invariant up to that bias alone.

The local step size h is one scalar for all local sites, adapted in warmup
(Robbins-Monro on log h) to a mean acceptance of :data:`ACCEPT_TARGET` and fixed
after; being Metropolis-adjusted, any h keeps step 1 exact, and h sets only how
fast the rows mix. A row moves when its datum is drawn, about every N/n steps.
"""

from typing import Any, Callable, NamedTuple

import jax
from jax import random
import jax.numpy as jnp
from numpyro.distributions.transforms import biject_to
from numpyro.primitives import Messenger

from numpyro_sgbd.enumeration import is_enumerated
from numpyro_sgbd.estimators.compiled import as_jax_arrays
from numpyro_sgbd.estimators.indices import gather_local
from numpyro_sgbd.updates.barker_mh import barker_mh_rows

__all__ = [
    "ACCEPT_TARGET",
    "LocalSite",
    "LocalState",
    "LocalUpdate",
    "constrained_local",
    "gather_local",
    "gather_rows",
    "global_sites",
    "initial_local",
    "local_site",
    "local_sites_of",
    "local_update",
]

#: The mean acceptance rate the local step size adapts to in warmup. The
#: Barker proposal's optimum in high dimension is about 0.4 (Vogrinc,
#: Livingstone & Zanella 2022, Biometrika); the rows of a local site have a few
#: coordinates each, where higher rates mix as well.
ACCEPT_TARGET = 0.5

#: The local step size before warmup adapts it (unconstrained units).
INITIAL_STEP = 1.0


class LocalSite(NamedTuple):
    """A latent site inside the subsample plate (:func:`local_site`).

    :ivar str plate: the subsample plate's name.
    :ivar int axis: the plate's axis in the site's (unconstrained) value.
    :ivar tuple shape: the unconstrained shape with all N rows on ``axis``.
    :ivar support: the site's support (constrained by ``biject_to``).
    """

    plate: str
    axis: int
    shape: tuple
    support: Any


class LocalState(NamedTuple):
    """A chain's local step (its state's ``local`` field).

    :ivar step_size: the sd h of the Barker increments of every local row.
    :ivar acceptance: the mean acceptance probability of the last local step
        over its minibatch's rows (NaN before the first).
    """

    step_size: Any
    acceptance: Any


class LocalUpdate(NamedTuple):
    """What the core's step (:func:`~numpyro_sgbd.core.build_kernel`) runs for
    the local sites: ``names``; ``init() -> LocalState``; ``update(key_est,
    key_move, local, i, z, model_args, model_kwargs) -> (z, local)``, z with
    the rows of the minibatch ``key_est`` draws moved given z's other sites (the
    move's key folded from the step's ``key_move``; ``local`` the chain's
    :class:`LocalState`, ``i`` its step count)."""

    names: tuple
    init: Callable
    update: Callable


def _bound_is_traced(support):
    return any(
        isinstance(getattr(support, attr, None), jax.core.Tracer)
        for attr in ("lower_bound", "upper_bound")
    )


def local_site(name, site, frame, plates):
    """The :class:`LocalSite` of the traced latent ``site`` inside the
    subsample plate ``frame`` (``plates``: ``{name: (size, n)}``), or a
    ValueError saying why it cannot be sampled row by row."""
    size, n = plates[frame.name]
    support = site["fn"].support
    if _bound_is_traced(support):
        raise ValueError(
            f"Site '{name}' inside the subsample plate '{frame.name}' has a "
            "support whose bounds depend on other sites; local sites need a "
            "fixed support (e.g. reparametrise it as a fraction in (0, 1))."
        )
    value = site["value"]
    axis = jnp.ndim(value) - len(site["fn"].event_shape) + frame.dim
    unconstrained = jax.eval_shape(biject_to(support).inv, value)
    if axis < 0 or jnp.shape(value)[axis] != n or unconstrained.shape[axis] != n:
        raise ValueError(
            f"Site '{name}' inside the subsample plate '{frame.name}' has shape "
            f"{jnp.shape(value)} without the plate's {n} rows at dim {frame.dim}: "
            "a local site needs one value per datum (sample it with the plate's "
            "batch shape)."
        )
    shape = list(unconstrained.shape)
    shape[axis] = size
    return LocalSite(frame.name, int(axis), tuple(shape), support)


def local_sites_of(trace, plates, check=True):
    """``{name: LocalSite}`` of the continuous latent sites of ``trace`` (traced
    with its subsample plates at n prototype indices) inside its one subsample
    plate (``plates``: ``{name: (size, n)}``); empty where it has none or
    several plates (where the full data are evaluated in one pass). Enumerated
    discrete sites are summed out, not held. A ValueError from
    :func:`local_site` where a site cannot be held row by row; with
    ``check=False``, ``{name: None}`` (their names only)."""
    if len(plates) != 1:
        return {}
    (plate,) = plates
    found = {}
    for name, site in trace.items():
        if site["type"] != "sample" or site["is_observed"] or is_enumerated(site):
            continue
        frame = next((f for f in site["cond_indep_stack"] if f.name == plate), None)
        if frame is not None:
            found[name] = local_site(name, site, frame, plates) if check else None
    return found


def global_sites(z, names=()):
    """z without its local sites ``names``: what the sampler's family moves;
    z itself where there are none."""
    if not names:
        return z
    return {k: v for k, v in z.items() if k not in names}


def _scatter(values, axis, idx, rows):
    index = (slice(None),) * axis + (idx,)
    return values.at[index].set(rows)


def initial_local(rng_key, sites, batch_shape=()):
    """The local sites' first values: uniform in (-2, 2), unconstrained, as
    NumPyro's default ``init_to_uniform`` starts a site (no model evaluation
    over the N rows)."""
    keys = random.split(rng_key, max(len(sites), 1))
    return {
        name: random.uniform(
            key, tuple(batch_shape) + site.shape, minval=-2.0, maxval=2.0
        )
        for key, (name, site) in zip(keys, sorted(sites.items()))
    }


def constrained_local(z, sites):
    """The local sites of ``z`` in their supports (all N rows)."""
    return {k: biject_to(s.support)(z[k]) for k, s in sites.items()}


def local_update(estimator, sites, num_warmup):
    """The :class:`LocalUpdate` of ``sites`` (``{name: LocalSite}``) for the
    :class:`~numpyro_sgbd.estimators.MinibatchEstimator` ``estimator`` (its
    draw gives the minibatch, and
    :meth:`~numpyro_sgbd.estimators.MinibatchEstimator.datum_log_density` each row's
    conditional), adapting the step during the first ``num_warmup`` steps."""
    names = tuple(sorted(sites))
    (plate,) = {s.plate for s in sites.values()}

    def init():
        nan = jnp.array(jnp.nan, jnp.result_type(float))
        return LocalState(jnp.asarray(INITIAL_STEP, jnp.result_type(float)), nan)

    def update(key_est, key_move, local, i, z, model_args, model_kwargs):
        rng_key = random.fold_in(key_move, 1)  # apart from the family's move
        args, kwargs = as_jax_arrays((model_args, model_kwargs))
        idx = estimator.draw(key_est)[plate]
        rest = {k: v for k, v in z.items() if k not in sites}
        rows = {
            k: jnp.moveaxis(v, sites[k].axis, 0)
            for k, v in gather_local(z, sites, idx).items()
        }

        def log_density(row, i):
            one = {k: jnp.expand_dims(r, sites[k].axis) for k, r in row.items()}
            return estimator.datum_log_density({**rest, **one}, i, args, kwargs)

        value_and_grad = jax.vmap(jax.value_and_grad(log_density))
        new_rows, acceptance = barker_mh_rows(
            rng_key, rows, lambda r: value_and_grad(r, idx), local.step_size
        )
        moved = {
            k: _scatter(z[k], sites[k].axis, idx, jnp.moveaxis(r, 0, sites[k].axis))
            for k, r in new_rows.items()
        }
        # Robbins-Monro on log h towards the target rate, in warmup only.
        gain = jnp.where(i < num_warmup, (i + 1.0) ** -0.6, 0.0)
        log_step = jnp.log(local.step_size) + gain * (acceptance - ACCEPT_TARGET)
        step = jnp.exp(log_step).astype(local.step_size.dtype)
        return {**z, **moved}, LocalState(step, acceptance.astype(step.dtype))

    return LocalUpdate(names, init, update)


class gather_rows(Messenger):
    """Give each local site whose value holds all N rows (a draw, substituted
    from outside the model) the rows of its plate's ``indices`` instead: the
    kernel's :attr:`~numpyro_sgbd.SGBD.model`, its plate fixed to the evaluation
    rows, then reads draws of every row (as ``az.from_numpyro`` passes them)."""

    def __init__(self, fn, sites, indices):
        self.sites, self.indices = sites, indices
        super().__init__(fn)

    def postprocess_message(self, msg):
        site = self.sites.get(msg["name"]) if msg["type"] == "sample" else None
        if site is None or msg["value"] is None:
            return
        size = site.shape[site.axis]
        if jnp.shape(msg["value"])[site.axis] == size:
            idx = self.indices[site.plate]
            msg["value"] = jnp.take(msg["value"], idx, axis=site.axis)
