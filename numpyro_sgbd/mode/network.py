"""A network's start and curvature: the default set-up of a model that builds a
neural network with ``numpyro.contrib.module``.

Newton-CG's mode and the Hessian there (:mod:`numpyro_sgbd.mode.search`) whiten
a posterior with one mode. A network's potential is not convex: its symmetries
alone (permuted or sign-flipped hidden units) give it many modes, saddles lie
between them, and at d ~ 10^5 the Hessian's diagonal alone costs d products.
Its set-up is therefore the one stochastic-gradient practice uses:

* a **start** at a maximum a posteriori fit by Adam (Kingma & Ba 2015) on the
  kernel's own minibatch gradients, from a shrunken draw of the prior (a
  network at its prior median, all weights zero, is a saddle Adam cannot
  leave);
* a **diagonal curvature** there, without a Hessian: the likelihood's by the
  empirical Fisher information, ``F_jj = sum_i g_ij^2`` over the per-datum
  gradients, estimated from the minibatch gradients' own noise (pSGLD's
  second-moment preconditioner, Li et al. 2016, taken once at the start rather
  than as a running average), plus the prior's, one Hessian-vector product
  against a Rademacher vector (exact for the factorised priors random modules
  place).

``L = diag(F + P)^-1/2`` is then what ``step_size=None`` adapts its step and
scales in, as for any model.
"""

import warnings

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import biject_to

from numpyro_sgbd.estimators import MinibatchEstimator, noise_variance_factor
from numpyro_sgbd.handlers import sample_trace

__all__ = [
    "NetworkFit",
    "NetworkWarning",
    "fit_network",
    "network_start",
    "warn_network",
]

#: Adam's steps to the start, and its first learning rate (decayed by a cosine
#: to 1% of it over the steps).
ADAM_STEPS = 1000
ADAM_LEARNING_RATE = 5e-2
#: Minibatches whose gradients' noise estimates the Fisher information.
FISHER_MINIBATCHES = 8
#: How far towards the prior's median the start's draw is shrunk.
START_SHRINK = 0.1
#: The curvature's floor, relative to its median: a weight no datum's gradient
#: moves (a dead unit) under a flat prior would otherwise get an unbounded step.
CURVATURE_FLOOR = 1e-4


class NetworkWarning(UserWarning):
    """The default path (a start and preconditioner found before sampling) on a
    model that builds a neural network with ``numpyro.contrib.module``."""


def warn_network(who, modules):
    """Warn (:class:`NetworkWarning`) that ``who``'s default path fits the
    networks ``modules`` and how far its chains were seen to mix."""
    names = ", ".join(f"'{m}'" for m in modules)
    warnings.warn(
        f"{who}: the model builds the network(s) {names} with "
        "numpyro.contrib.module. The default path starts at a MAP fit (Adam) "
        "with a diagonal preconditioner from the Fisher information there, and "
        "the chain explores around that fit: a network's posterior has many "
        "modes and its weights mix slowly. The run checks judge the run by its "
        "predictions (the log-likelihood of fixed rows at each draw), not by its "
        "weights: run several chains (num_chains, different keys) and call "
        "numpyro_sgbd.check(mcmc). On a 17-weight network four NOGIN chains of "
        "150,000 steps agreed with NUTS's predictive; SGLD's, SGBD's and "
        "SGHMC's still disagreed with each other (R-hat of the predictions up "
        "to 1.32; benchmarks/results.md, issue 62): prefer NOGIN.",
        NetworkWarning,
        stacklevel=6,
    )


class NetworkFit:
    """What :func:`fit_network` found: ``x`` (the start, flat), the curvature's
    diagonal ``curvature`` (d,), its parts ``fisher`` and ``prior``, the
    minibatch potential along Adam's path (``trace``, every tenth step) and how
    many coordinates the floor raised (``floored``)."""

    def __init__(self, x, curvature, fisher, prior, trace, floored, steps):
        self.x, self.curvature, self.fisher, self.prior = x, curvature, fisher, prior
        self.trace, self.floored, self.steps = trace, floored, steps


def network_start(model, model_args, model_kwargs, objective, modules, rng_key):
    """The flat start of Adam: the objective's start, with each network site (a
    latent site ``'<module>/...'``) moved to its prior median plus
    :data:`START_SHRINK` times a prior draw's distance from it, on the
    unconstrained scale."""
    sites = objective.unravel(objective.x0)
    trace = sample_trace(model, model_args, model_kwargs)
    keys = random.split(rng_key, len(sites))
    out = {}
    for key, (name, median) in zip(keys, sites.items()):
        if not any(name.startswith(m + "/") for m in modules):
            out[name] = median
            continue
        fn = trace[name]["fn"]
        draw = biject_to(fn.support).inv(fn.sample(key))
        draw = jnp.reshape(draw, jnp.shape(median)).astype(median.dtype)
        out[name] = median + START_SHRINK * (draw - median)
    return ravel_pytree(out)[0]


def fit_network(
    model,
    model_args,
    model_kwargs,
    plates,
    objective,
    modules,
    *,
    steps=ADAM_STEPS,
    rng_key=None,
    start=None,
):
    """The start and diagonal curvature of a network model (see the module's
    docstring): Adam's ``steps`` on minibatch gradients, then the Fisher
    information from :data:`FISHER_MINIBATCHES` minibatches' gradient noise plus
    the prior's curvature. ``plates``: the model's one subsample plate
    ``{name: (size, n, dim)}``; ``objective``: its full-data
    :class:`~numpyro_sgbd.mode.Objective` (the start's structure); ``start``, a
    flat point to start Adam from instead (a refit's last fit). A
    :class:`NetworkFit`."""
    import optax  # the network path's only use of it

    rng_key = random.key(0) if rng_key is None else rng_key
    key_start, key_adam, key_fisher, key_probe = random.split(rng_key, 4)
    x0 = start
    if x0 is None:
        x0 = network_start(
            model, model_args, model_kwargs, objective, modules, key_start
        )
    x0 = jnp.asarray(x0, objective.x0.dtype)
    unravel = objective.unravel
    ((size, n, _),) = plates.values()
    plain = MinibatchEstimator(model, plates, replace=False)
    noisy = MinibatchEstimator(model, plates, noise=True, replace=False)

    def value_grad(key, x):
        est = plain(key, unravel(x), model_args, model_kwargs)
        return est.potential_energy, ravel_pytree(est.z_grad)[0]

    schedule = optax.cosine_decay_schedule(ADAM_LEARNING_RATE, steps, alpha=0.01)
    adam = optax.adam(schedule)

    def adam_step(carry, key):
        x, opt = carry
        value, grad = value_grad(key, x)
        updates, opt = adam.update(grad, opt, x)
        return (optax.apply_updates(x, updates), opt), value

    def fit(x):
        keys = random.split(key_adam, steps)
        (x, _), values = jax.lax.scan(adam_step, (x, adam.init(x)), keys)

        # The Fisher diagonal sum_i f_ij^2 ~ N Var_i(f_ij) near the mode (the
        # mean per-datum gradient is O(1/N) there), f_i the unscaled per-datum
        # gradients: the noise variance is factor * Var_i((N/n) f_ij)
        # (noise_variance_factor), so N Var_i(f_ij) = var * n^2 / (factor N).
        def noise_var(key):
            est = noisy(key, unravel(x), model_args, model_kwargs)
            return ravel_pytree(est.noise_sd)[0] ** 2

        var = jax.vmap(noise_var)(random.split(key_fisher, FISHER_MINIBATCHES))
        factor = noise_variance_factor(size, n, replace=False)
        fisher = jnp.mean(var, 0) * n**2 / (factor * size)
        return x, values, fisher

    x, values, fisher = jax.jit(fit)(x0)
    prior = _prior_curvature(plain, unravel, x, model_args, model_kwargs, key_probe)
    fisher, prior = np.asarray(fisher, np.float64), np.asarray(prior, np.float64)
    total = fisher + np.maximum(prior, 0.0)
    floor = (
        CURVATURE_FLOOR * float(np.median(total[total > 0]))
        if np.any(total > 0)
        else 1.0
    )
    floored = int(np.sum(total < floor))
    total = np.maximum(total, floor)
    return NetworkFit(x, total, fisher, prior, np.asarray(values)[::10], floored, steps)


def _prior_curvature(estimator, unravel, x, model_args, model_kwargs, rng_key):
    """The diagonal of the prior potential's Hessian at ``x``, as ``v * (H v)``
    for one Rademacher ``v``: exact where the prior is factorised. The prior
    potential is a minibatch's potential plus its scaled log-likelihood terms
    (any minibatch: they cancel)."""
    ((name, (size, n, _)),) = estimator.plates.items()
    indices = {name: jnp.arange(n)}

    def prior_potential(x):
        value, terms = estimator.terms(
            unravel(x), indices, model_args, model_kwargs, with_terms=True
        )
        return value + jnp.sum(terms)

    v = random.rademacher(rng_key, x.shape, dtype=x.dtype)
    hvp = jax.jit(lambda x: jax.jvp(jax.grad(prior_potential), (x,), (v,))[1])
    return v * hvp(x)
