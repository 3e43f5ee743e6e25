"""Discrete latent sites summed out datum by datum, so that a model written with
``@config_enumerate`` (a mixture's component, a zero-inflation indicator) runs
on the stochastic-gradient kernels as it runs on NUTS, with no funsor.

A discrete site marked for enumeration (``infer={"enumerate": "parallel"}``, as
:func:`config_enumerate` or NumPyro's funsor-based one mark every discrete
site) inside the
subsample plate is local to its datum. Its values are given all at once, along a
dimension of its own left of the model's plates (:class:`enumerate_sites`), and
the terms of the datum are summed in log space over them
(:func:`enumerated_log_joint`)::

    log p(y_i | theta) = logsumexp_c [log p(c_i = c | theta) + log p(y_i | c, theta)]

before the plate's scale N / n multiplies them. The minibatch estimate of the
log-likelihood, (N / n) sum_{i in S} log p(y_i | theta), is then unbiased, and
each datum's term is what the corrected variants and the control variates read
per datum. (NumPyro's funsor-based ``log_density`` scales each site's
log-density before summing the discrete values out, which is the same only
where the scale is 1: with a subsample it is not the minibatch estimate of the
marginal likelihood.) Several enumerated sites of one datum are summed out
jointly (the product of their numbers of values). The sum is exact: the data are
independent given the global parameters, so the marginal likelihood is the
product of the per-datum marginals (the mixture models of Bishop, Pattern
Recognition and Machine Learning, Section 9.2).

Not supported, with an error that says so (:func:`check_enumerated`): a discrete
site outside the subsample plate (a global discrete parameter couples every
datum: the likelihood is then no sum over the data), inside a plate nested in
it, or with an event shape.
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp
import numpyro
from numpyro import handlers
from numpyro.distributions import Distribution, ExpandedDistribution
from numpyro.distributions.discrete import CategoricalLogits, CategoricalProbs
from numpyro.infer import util as infer_util
from numpyro.primitives import Messenger

__all__ = [
    "check_enumerated",
    "config_enumerate",
    "constrained_sites",
    "enumerate_sites",
    "enumerated_log_joint",
    "enumeration_dim",
    "first_enumeration_dim",
    "is_enumerated",
    "marginal_model",
    "potential_energy",
    "require_funsor",
    "valued",
]


def _enumerate_config(site):
    if (
        site["type"] == "sample"
        and not site["is_observed"]
        and site["fn"].has_enumerate_support
    ):
        return {"enumerate": site["infer"].get("enumerate", "parallel")}
    return {}


def config_enumerate(fn):
    """Mark every latent site of ``fn`` whose distribution can enumerate its
    support for parallel enumeration, as
    ``numpyro.contrib.funsor.config_enumerate`` marks them (and usable as a
    decorator), without funsor, which NumPyro's version imports. A site's own
    ``infer={"enumerate": ...}`` is kept.

    >>> import numpyro, numpyro.distributions as dist
    >>> from numpyro import handlers
    >>> @config_enumerate
    ... def model():
    ...     numpyro.sample("c", dist.Bernoulli(0.3))
    >>> handlers.trace(handlers.seed(model, 0)).get_trace()["c"]["infer"]
    {'enumerate': 'parallel'}
    """
    return handlers.infer_config(fn, _enumerate_config)


def is_enumerated(site):
    """Whether a trace ``site`` is a latent discrete site marked for parallel
    enumeration."""
    return (
        site["type"] == "sample"
        and not site["is_observed"]
        and site["fn"].support.is_discrete
        and (site.get("infer") or {}).get("enumerate") == "parallel"
    )


class enumerate_sites(Messenger):
    """Give every latent discrete site marked for parallel enumeration all its
    values at once: site j (in the model's order) takes the values of its
    support along dimension ``first_dim - j`` (``first_dim`` left of every plate
    of the model, e.g. -2 where the model's plates use -1 only). ``dims`` maps
    each such site's name to its dimension after the model has run."""

    def __init__(self, fn, first_dim):
        self.first_dim = first_dim
        self.dims = {}
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "sample" or msg["value"] is not None:
            return
        if not is_enumerated(msg):
            return
        dim = self.first_dim - len(self.dims)
        values = msg["fn"].enumerate_support(expand=False)
        k = values.shape[0]
        msg["value"] = jnp.reshape(values, (k,) + (1,) * (-dim - 1))
        self.dims[msg["name"]] = dim


def first_enumeration_dim(trace):
    """The first dimension left of every plate in ``trace`` (NumPyro's
    ``max_plate_nesting`` + 1, negated): where :class:`enumerate_sites` puts the
    values of the first enumerated site."""
    dims = [
        f.dim
        for site in trace.values()
        for f in site.get("cond_indep_stack", ())
        if f.dim is not None
    ]
    return min(dims, default=0) - 1


def enumeration_dim(trace, plates):
    """The first enumeration dimension (:func:`first_enumeration_dim`) where
    ``trace`` has discrete latent sites, all of which the kernels can sum out
    over the subsample plate of ``plates`` (checked: :func:`check_enumerated`);
    ``None`` where it has none."""
    plate = next(iter(plates)) if len(plates) == 1 else None
    return first_enumeration_dim(trace) if check_enumerated(trace, plate) else None


def check_enumerated(trace, plate):
    """Raise where ``trace`` has a discrete latent site that the kernels cannot
    sum out datum by datum: not marked for enumeration, outside the subsample
    plate ``plate`` (``None``: the model has not exactly one), in a plate nested
    in it, or with an event shape. Return the names of those they can."""
    names = []
    for name, site in trace.items():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        if not site["fn"].support.is_discrete:
            continue
        if not is_enumerated(site):
            raise ValueError(
                f"Site '{name}' is a discrete latent variable that is not marked "
                "for enumeration; stochastic-gradient kernels sample continuous "
                "parameters and sum discrete ones out. Decorate the model with "
                "numpyro_sgbd.config_enumerate (or NumPyro's, in "
                "numpyro.contrib.funsor), or give the site infer="
                '{"enumerate": "parallel"}, as for NUTS; or marginalise it by '
                "hand."
            )
        frames = [f for f in site["cond_indep_stack"] if f.dim is not None]
        if plate is None or plate not in [f.name for f in frames]:
            raise ValueError(
                f"Site '{name}' is an enumerated discrete variable outside the "
                "subsample plate: a global discrete parameter couples every "
                "datum, so the likelihood is no sum over the data and a "
                "minibatch cannot estimate it. Put the site inside "
                "numpyro.plate(..., subsample_size=n) (one value per datum), or "
                "run NUTS on this model."
            )
        nested = [f.name for f in frames if f.name != plate]
        if nested or site["fn"].event_shape:
            why = f"inside the plates {nested}" if nested else "with an event shape"
            raise ValueError(
                f"Site '{name}' is an enumerated discrete variable {why}; the "
                "kernels sum out discrete sites with one value per datum of the "
                f"subsample plate '{plate}' and no event shape."
            )
        names.append(name)
    return names


def enumerated_log_joint(model, model_args, model_kwargs, plate, first_dim):
    """``(log_joint, per_datum)`` of ``model`` (its latent continuous sites
    substituted, its subsample plate ``plate`` fixed to n indices) with its
    enumerated sites summed out datum by datum: ``log_joint`` the sum of the
    global sites' scaled log-densities and of ``per_datum``, the n scaled
    per-datum log-marginals ``s log sum_c exp(sum of the datum's terms)``, s the
    plate's scale (N / n). ``first_dim``: the first enumeration dimension, left
    of every plate of the model."""
    enumerated = enumerate_sites(model, first_dim)
    trace = handlers.trace(enumerated).get_trace(*model_args, **model_kwargs)
    global_part, per_datum, scale = _summed_out(
        trace, plate, first_dim, enumerated.dims
    )
    if per_datum is None:
        return global_part, None
    if scale is not None:
        per_datum = scale * per_datum
    return global_part + jnp.sum(per_datum), per_datum


def _summed_out(trace, plate, first_dim, dims):
    """``(global part, per-datum log-marginals, scale)`` of an enumerated
    ``trace`` (``dims``: :attr:`enumerate_sites.dims`, from ``first_dim``): the
    global sites' scaled log-densities summed, the plate's n unscaled
    log-marginals (``None`` without a plate site) and its scale."""
    global_part, local, scale, plate_dim = 0.0, 0.0, None, None
    m = len(dims)
    for site in trace.values():
        if site["type"] != "sample":
            continue
        lp = _log_prob(site, dims.get(site["name"]))
        frame = next((f for f in site["cond_indep_stack"] if f.name == plate), None)
        if frame is None:
            s = 1.0 if site["scale"] is None else site["scale"]
            global_part = global_part + s * jnp.sum(lp)
            continue
        if scale is not None and not _same(site["scale"], scale):
            raise ValueError(
                f"Site '{site['name']}' in plate '{plate}' has another scale than "
                "the plate's other sites; an enumerated plate needs one."
            )
        scale, plate_dim = site["scale"], frame.dim
        local = local + _per_datum_shape(lp, plate_dim, first_dim)
    if plate_dim is None:
        return global_part, None, None
    # The plate's dimension is last now; the enumeration dimensions lead.
    full = m - first_dim + plate_dim
    local = jnp.reshape(local, (1,) * (full - jnp.ndim(local)) + jnp.shape(local))
    axes = tuple(range(m))
    per_datum = logsumexp(local, axis=axes) if axes else local
    return global_part, jnp.reshape(per_datum, (-1,)), scale


def _log_prob(site, dim):
    """The log-density of ``site`` at its value; for a categorical site given
    all its values along ``dim`` (:class:`enumerate_sites`), its table of
    normalised log-probabilities with the categories moved to ``dim``: the
    numbers ``log_prob`` gathers (``take_along_axis``), without the gather,
    whose transpose in the per-datum gradients (a pad and a reduction per
    datum, or a scatter-add) cost more than the rest of the site's term."""
    fn = site["fn"]
    base = fn.base_dist if isinstance(fn, ExpandedDistribution) else fn
    if dim is None or type(base) not in (CategoricalProbs, CategoricalLogits):
        return fn.log_prob(site["value"])
    batch = (1,) * max(0, -dim - len(fn.batch_shape)) + tuple(fn.batch_shape)
    at = len(batch) + dim
    if batch[at] != 1:  # a batch dimension where the values go: as NumPyro does
        return fn.log_prob(site["value"])
    if isinstance(base, CategoricalProbs):
        table = base.logits  # NumPyro's normalised log-probabilities
    else:
        table = base.logits - logsumexp(base.logits, axis=-1, keepdims=True)
    table = jnp.broadcast_to(table, batch + jnp.shape(table)[-1:])
    return jnp.moveaxis(jnp.squeeze(table, at), -1, at)


class _Marginal(Distribution):
    """The per-datum log-marginals of a plate as one observed site's
    log-density (whatever the value), for NumPyro's ``log_likelihood``."""

    def __init__(self, log_density):
        self.log_density = log_density
        super().__init__(batch_shape=jnp.shape(log_density))

    def log_prob(self, value):
        return self.log_density

    def sample(self, key, sample_shape=()):
        raise NotImplementedError(_FOR_LOG_LIKELIHOOD)


#: Why :func:`marginal_model` (a kernel's ``model`` with enumerated sites) does
#: not draw data: its observed site is each datum's marginal likelihood.
_FOR_LOG_LIKELIHOOD = (
    "A kernel's model with enumerated discrete sites gives each datum's "
    "marginal log-likelihood (for log_likelihood and ArviZ) and draws no data: "
    "predict with Predictive(full_batch(model), samples) on your own model "
    "(each new datum's discrete site drawn given the draws), and recover the "
    "data's discrete sites with infer_discrete=True."
)


def marginal_model(model, plate, first_dim):
    """``model`` as NumPyro's ``log_likelihood`` (and so ArviZ's
    ``from_numpyro``) reads it: its latent continuous sites as they are, its
    enumerated sites summed out, and the observed sites of the plate ``plate``
    replaced by one observed site (named as the first of them, holding its
    data) whose log-density is each datum's log-marginal
    ``log sum_c p(c, y_i | theta)``."""

    def hidden(site):
        return site["type"] == "sample" and (site["is_observed"] or is_enumerated(site))

    def marginal(*model_args, **model_kwargs):
        enumerated = enumerate_sites(model, first_dim)
        with handlers.block(hide_fn=hidden):
            trace = handlers.trace(enumerated).get_trace(*model_args, **model_kwargs)
        _, per_datum, _ = _summed_out(trace, plate, first_dim, enumerated.dims)
        observed = [
            site
            for site in trace.values()
            if site["type"] == "sample"
            and site["is_observed"]
            and plate in [f.name for f in site["cond_indep_stack"]]
        ]
        if not observed:  # called without the data: a prediction
            raise NotImplementedError(_FOR_LOG_LIKELIHOOD)
        numpyro.sample(
            observed[0]["name"], _Marginal(per_datum), obs=observed[0]["value"]
        )

    return marginal


def _per_datum_shape(lp, plate_dim, first_dim):
    """A datum site's log-density summed over every dimension but the plate's
    and the enumeration dimensions (those at or left of ``first_dim``), with the
    plate's dimension kept (size n or 1)."""
    ndim = jnp.ndim(lp)
    keep = {ndim + plate_dim} | {a for a in range(ndim) if a - ndim <= first_dim}
    summed = tuple(a for a in range(ndim) if a not in keep)
    lp = jnp.sum(lp, axis=summed, keepdims=True) if summed else lp
    # Drop the summed dims right of the plate so the plate dim is last.
    return jnp.reshape(lp, jnp.shape(lp)[: ndim + plate_dim + 1])


def _same(a, b):
    """Whether two sites' scales agree (traced ones are taken to: the plate's)."""
    if a is b:
        return True
    try:
        return bool(jnp.all(jnp.asarray(a) == jnp.asarray(b)))
    except jax.errors.ConcretizationTypeError:
        return True


def _enumeration_of(model, model_args, model_kwargs, params):
    """``(plate, first_dim)`` where ``model`` (its continuous sites at
    ``params``) has enumerated discrete sites (checked), else ``None``. A trace
    with the discrete sites drawn (key 0) finds them; under ``jit`` its
    operations are dead code."""
    fixed = handlers.substitute(
        handlers.seed(model, 0),
        substitute_fn=partial(infer_util._unconstrain_reparam, params),
    )
    trace = handlers.trace(fixed).get_trace(*model_args, **model_kwargs)
    found = [site for site in trace.values() if is_enumerated(site)]
    if not found:
        if any(_is_discrete_latent(site) for site in trace.values()):
            check_enumerated(trace, None)  # raises, naming the site
        return None
    frames = [f.name for f in found[0]["cond_indep_stack"] if f.dim is not None]
    plate = frames[0] if len(frames) == 1 else None
    check_enumerated(trace, plate)
    return plate, first_enumeration_dim(trace)


def _is_discrete_latent(site):
    return (
        site["type"] == "sample"
        and not site["is_observed"]
        and site["fn"].support.is_discrete
    )


def potential_energy(model, model_args, model_kwargs, params):
    """NumPyro's :func:`~numpyro.infer.util.potential_energy` of ``model`` at the
    unconstrained ``params``, with its enumerated discrete sites summed out
    datum by datum (:func:`enumerated_log_joint`); NumPyro's own where it has
    none. The evaluation (:func:`~numpyro_sgbd.reference_posterior`'s Laplace
    map, :func:`~numpyro_sgbd.full_batch_scores`) uses it on ``full_batch``
    models, where the plate's scale is 1."""
    found = _enumeration_of(model, model_args, model_kwargs, params)
    if found is None:
        return infer_util.potential_energy(model, model_args, model_kwargs, params)
    fixed = handlers.substitute(
        model, substitute_fn=partial(infer_util._unconstrain_reparam, params)
    )
    log_joint, _ = enumerated_log_joint(fixed, model_args, model_kwargs, *found)
    return -log_joint


def constrained_sites(model, first_dim):
    """``model`` for NumPyro's ``constrain_fn`` and ``unconstrain_fn``: its
    enumerated sites given all their values (:class:`enumerate_sites`), so that
    the model runs without drawing them; ``model`` itself where ``first_dim`` is
    ``None``."""
    return model if first_dim is None else enumerate_sites(model, first_dim)


def valued(model, model_args, model_kwargs):
    """:func:`constrained_sites` of ``model``, its enumeration found by one
    trace (:func:`_enumeration_of`)."""
    found = _enumeration_of(model, model_args, model_kwargs, {})
    return constrained_sites(model, None if found is None else found[1])


def require_funsor(what):
    """Raise an ImportError naming the extra that installs funsor, which NumPyro's
    NUTS needs for ``what`` (a model with enumerated discrete sites)."""
    try:
        import funsor  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"{what} has enumerated discrete sites, which NumPyro's NUTS sums "
            "out through funsor: pip install numpyro-sgbd[enumerate] (or pip "
            "install funsor). The stochastic-gradient kernels need no funsor."
        ) from error
