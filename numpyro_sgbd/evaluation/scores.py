"""The exact full-data score at draws of any run (:func:`full_batch_scores`), the
input of the kernel Stein discrepancy, and the sites of a model that a reference
or a comparison reads (:func:`_model_sites`)."""

import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.infer import init_to_sample
from numpyro.infer.util import unconstrain_fn

from numpyro_sgbd.enumeration import (
    constrained_sites,
    first_enumeration_dim,
    is_enumerated,
    potential_energy,
)
from numpyro_sgbd.estimators import as_jax_arrays, split_arrays
from numpyro_sgbd.handlers import full_batch, subsample_plates

__all__ = ["full_batch_scores"]

# Memory budget of one chunk of full_batch_scores, in data rows x draws.
_CHUNK_ELEMENTS = 4_000_000


def _model_sites(model, model_args, model_kwargs):
    """``(latent, kept, max_size, enumerate_dim)``: the latent sample sites, the
    kept deterministic sites, the largest plate size, and the first enumeration
    dimension where the model has enumerated discrete sites (``None``
    otherwise).

    Deterministic sites inside a subsample plate have one value per data point and
    are dropped, as the SG kernels drop them; enumerated discrete sites are
    summed out, not drawn, by the kernels and by NUTS alike.
    """

    def traced(fn):
        # init_to_sample also values sites that cannot be sampled (ImproperUniform).
        fn = handlers.substitute(handlers.seed(fn, 0), substitute_fn=init_to_sample)
        return handlers.trace(fn).get_trace(*model_args, **model_kwargs)

    trace = traced(full_batch(model))
    raw = traced(model)
    data_plates = set(subsample_plates(raw))
    sizes = [int(site["args"][0]) for site in raw.values() if site["type"] == "plate"]
    max_size = max([1, *sizes])
    latent, kept = [], []
    enumerated = [site for site in trace.values() if is_enumerated(site)]
    enumerate_dim = first_enumeration_dim(trace) if enumerated else None
    for name, site in trace.items():
        if is_enumerated(site):
            continue
        if site["type"] == "sample" and not site["is_observed"]:
            latent.append(name)
            kept.append(name)
        elif site["type"] == "deterministic":
            frames = {f.name for f in site["cond_indep_stack"]}
            if not frames & data_plates:
                kept.append(name)
    return latent, kept, max_size, enumerate_dim


def full_batch_scores(model, samples, *model_args, chunk_size=None, **model_kwargs):
    r"""Draws in unconstrained space and the exact full-data score at each.

    For each draw :math:`\theta_k` (constrained, as
    :meth:`MCMC.get_samples() <numpyro.infer.mcmc.MCMC.get_samples>` returns it) this
    gives :math:`z_k = T^{-1}(\theta_k)` in NumPyro's unconstrained space and
    :math:`\nabla_z \log\pi(z_k) = -\nabla U(z_k)`, with :math:`U` the potential of
    :class:`full_batch(model) <full_batch>` (prior, Jacobian and all N data points):
    the inputs of :func:`~numpyro_sgbd.ksd`. Draws are processed ``chunk_size`` at a
    time, so memory is O(``chunk_size`` x N), never O(m x N).

    :param model: the NumPyro model, with its data in subsample plates.
    :param dict samples: ``{site: draws}`` with the draws on the leading axis, for
        every latent sample site (other keys are ignored).
    :param model_args: the model's positional arguments (the data).
    :param int chunk_size: draws per evaluation; default keeps chunk x N near 4e6.
    :param model_kwargs: the model's keyword arguments.
    :return: ``(z, scores)``, two dicts ``{site: array}`` with the draws' leading axis.

    >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=2):
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> y = jnp.array([1.0, 2.0, 3.0])
    >>> z, s = full_batch_scores(model, {"mu": jnp.array([0.0, 1.0])}, y)
    >>> s["mu"].tolist()  # -mu + sum(y - mu)
    [6.0, 2.0]
    """
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    latent, _, max_size, enumerate_dim = _model_sites(model, model_args, model_kwargs)
    missing = [name for name in latent if name not in samples]
    if missing:
        raise ValueError(
            f"samples lacks the latent site(s) {missing}; pass every latent sample "
            "site of the model (as mcmc.get_samples() returns them)."
        )
    params = {name: jnp.asarray(samples[name]) for name in latent}
    sizes = {int(jnp.shape(v)[0]) if jnp.ndim(v) else -1 for v in params.values()}
    if len(sizes) != 1 or -1 in sizes:
        raise ValueError(
            "every site in samples needs the same number of draws on its leading "
            f"axis; got shapes { {k: tuple(v.shape) for k, v in params.items()} }."
        )
    (m,) = sizes
    if chunk_size is None:
        chunk_size = max(1, _CHUNK_ELEMENTS // max_size)
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
    chunk_size = min(chunk_size, m)
    widened = full_batch(model)
    arrays, rebuild, _ = split_arrays((model_args, model_kwargs))
    valued = constrained_sites(widened, enumerate_dim)

    def one(theta, arrays):
        args, kwargs = rebuild(arrays)
        z = unconstrain_fn(valued, args, kwargs, theta)
        # Score = grad log density = -grad potential.
        score = jax.grad(lambda z: -potential_energy(widened, args, kwargs, z))(z)
        return z, score

    batched = jax.jit(jax.vmap(one, in_axes=(0, None)))
    zs, scores = [], []
    for start in range(0, m, chunk_size):
        chunk = jax.tree.map(lambda v: v[start : start + chunk_size], params)
        short = chunk_size - jax.tree.leaves(chunk)[0].shape[0]
        if short:  # pad the last chunk so that one compiled function serves all
            chunk = jax.tree.map(
                lambda v: jnp.concatenate([v, jnp.repeat(v[-1:], short, 0)]), chunk
            )
        z, score = batched(chunk, arrays)
        keep = chunk_size - short
        zs.append(jax.tree.map(lambda v: v[:keep], z))
        scores.append(jax.tree.map(lambda v: v[:keep], score))

    def cat(parts):
        return jax.tree.map(lambda *v: jnp.concatenate(v), *parts)

    return cat(zs), cat(scores)
