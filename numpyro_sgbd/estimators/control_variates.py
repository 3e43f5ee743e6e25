"""The minibatch gradient with control variates around a centre, which the chain
may move during warmup (:class:`ControlVariateEstimator`), and a user's centre
checked and unconstrained (:func:`unconstrained_centre`), and an estimator
bound to a set-up's arrays (:func:`with_setup`)."""

import copy

import jax
import jax.numpy as jnp
from numpyro.distributions.transforms import biject_to

from numpyro_sgbd.estimators.base import Centre, Estimator, _finite_tree
from numpyro_sgbd.estimators.compiled import as_jax_arrays
from numpyro_sgbd.estimators.minibatch import MinibatchEstimator
from numpyro_sgbd.estimators.rows import parts_difference

__all__ = ["ControlVariateEstimator", "unconstrained_centre", "with_setup"]


class ControlVariateEstimator(Estimator):
    r"""Minibatch gradient with control variates around a centre :math:`\hat z`.

    .. math::

        \hat g(z) = \nabla U(\hat z) + \nabla\hat U_S(z) - \nabla\hat U_S(\hat z),

    :math:`\hat U_S` the minibatch potential of :class:`MinibatchEstimator` on the
    indices S drawn for this step and :math:`U` the full-data potential (tuning
    paper, Coullon, South & Nemeth, App. D.3). The prior and Jacobian
    terms of the two minibatch potentials cancel at :math:`\hat z` and are exact at
    z; the likelihood part is
    :math:`\frac{N}{n}\sum_{i\in S}[\nabla\ell_i(z) - \nabla\ell_i(\hat z)]` around
    the exact full-data gradient at the centre, so the estimate is unbiased and its
    noise vanishes as z approaches :math:`\hat z`. Noise statistics (sd and
    covariance) come from the per-datum differences
    :math:`\nabla\ell_i(z) - \nabla\ell_i(\hat z)`. The potential estimate is
    :math:`U(\hat z) + \hat U_S(z) - \hat U_S(\hat z)`. A step costs two minibatch
    gradients (with per-datum gradients where the noise is needed).

    It wraps any minibatch estimator: one with ``plates`` (exactly one subsample
    plate), ``evaluate(z, indices, ...)`` and ``map_shards`` (which draws the
    indices and summarises, shard by shard where the data are sharded), such as
    :class:`MinibatchEstimator` or a subclass, evaluating it at z and at the
    centre on the same indices.

    :param estimator: the estimator to wrap; or a NumPyro model, for which the
        wrapped estimator is ``MinibatchEstimator(model, plates, noise=noise,
        replace=replace, covariance=covariance, per_datum=per_datum,
        pullback=pullback)``.
    :param dict plates, noise, replace, covariance, per_datum, pullback: as
        :class:`MinibatchEstimator`, given only with a model.
    :param centre: :math:`\hat z`, unconstrained values by site (``None`` with
        ``recentre_every``: each chain starts at its initial position).
    :param centre_potential: :math:`U(\hat z)`, the full-data potential.
    :param centre_grad: :math:`\nabla U(\hat z)`, like ``centre``.
    :param int recentre_every: ``None`` (the centre stays), or move each chain's
        centre to the mean of its last ``recentre_every`` warmup draws (the
        chain's :class:`Centre` then lives in its state; see :meth:`recentre`).
    :param int chunk_size: rows per chunk of the full-data gradient at a new
        centre.
    """

    def __init__(
        self,
        estimator,
        plates=None,
        centre=None,
        centre_potential=None,
        centre_grad=None,
        *,
        noise=False,
        replace=False,
        covariance=None,
        per_datum="vmap",
        pullback=None,
        recentre_every=None,
        chunk_size=4096,
    ):
        if isinstance(estimator, Estimator):
            if plates is not None:
                raise ValueError(
                    "ControlVariateEstimator wraps the given estimator, whose "
                    "plates are its own: pass plates= only with a model."
                )
        else:
            estimator = MinibatchEstimator(
                estimator,
                plates,
                noise=noise,
                replace=replace,
                covariance=covariance,
                per_datum=per_datum,
                pullback=pullback,
            )
        if len(estimator.plates) != 1:
            raise ValueError(
                "Control-variate gradients need exactly one subsample plate; the "
                f"model subsamples {sorted(estimator.plates) or 'none'}."
            )
        #: The wrapped estimator.
        self.estimator = estimator
        self.centre = centre
        self.centre_potential = centre_potential
        self.centre_grad = centre_grad
        self.recentre_every = recentre_every
        self.chunk_size = chunk_size

    # What the kernels and the mode search ask of an estimator, from the wrapped one.
    model = property(lambda self: self.estimator.model)
    plates = property(lambda self: self.estimator.plates)
    noise = property(lambda self: self.estimator.noise)
    covariance = property(lambda self: self.estimator.covariance)
    pullback = property(lambda self: self.estimator.pullback)
    sharding = property(lambda self: self.estimator.sharding)

    def full_data_parts(self, model_args=(), model_kwargs=None, chunk_size=4096):
        """The wrapped estimator's :meth:`~MinibatchEstimator.full_data_parts`."""
        return self.estimator.full_data_parts(model_args, model_kwargs, chunk_size)

    def __call__(self, rng_key, z, model_args=(), model_kwargs=None):
        centre = (self.centre, self.centre_potential, self.centre_grad)
        return self.around(rng_key, z, centre, model_args, model_kwargs)

    def around(self, rng_key, z, centre, model_args=(), model_kwargs=None):
        """The estimate at ``z`` around another centre: ``centre`` is
        ``(z_hat, U(z_hat), grad U(z_hat))`` (the kernels' re-centring keeps it in
        their state)."""
        centre, centre_potential, centre_grad = centre
        model_kwargs = {} if model_kwargs is None else model_kwargs
        model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))

        def difference(est, indices, points, args, kwargs):
            # The minibatch parts at z minus those at the centre, same indices.
            z, centre = points
            if type(est).evaluate is MinibatchEstimator.evaluate:
                # Its own evaluate: both points formed as one (one gather, one
                # pullback); a subclass's evaluate is called as it is.
                return est.evaluate(z, indices, args, kwargs, centre=centre)
            return parts_difference(
                est.evaluate(z, indices, args, kwargs),
                est.evaluate(centre, indices, args, kwargs),
            )

        est = self.estimator.map_shards(
            difference, rng_key, (z, centre), model_args, model_kwargs
        )
        return est._replace(
            z_grad=jax.tree.map(jnp.add, est.z_grad, centre_grad),
            potential_energy=est.potential_energy + centre_potential,
        )

    def estimate(self, rng_key, z, model_args=(), model_kwargs=None, centre=None):
        if centre is None:
            return self(rng_key, z, model_args, model_kwargs)
        return self.around(
            rng_key,
            z,
            (centre.z, centre.potential, centre.grad),
            model_args,
            model_kwargs,
        )

    def initial_centre(self, z, model_args=(), model_kwargs=None):
        """With ``recentre_every``: the chain's :class:`Centre`, at the given or
        searched centre, else at the chain's initial position ``z`` (its full-data
        potential and gradient computed in chunks). ``None`` otherwise."""
        if self.recentre_every is None:
            return None
        if self.centre is None:
            centre = z
            potential, grad = self.full_data(
                z, model_args, model_kwargs, chunk_size=self.chunk_size
            )
        else:
            centre = self.centre
            potential, grad = self.centre_potential, self.centre_grad
        potential = jnp.asarray(potential, jnp.result_type(float))
        return Centre(centre, potential, grad, jax.tree.map(jnp.zeros_like, z))

    def recentre(
        self,
        centre,
        z,
        i,
        num_warmup,
        model_args=(),
        model_kwargs=None,
        *,
        batched=False,
    ):
        """Add the draw ``z`` to the window's sum; every ``recentre_every`` warmup
        iterations move the centre to the window's mean, with the full-data
        potential and gradient there (in chunks). A non-finite result keeps the old
        centre. ``batched``: ``centre`` and ``z`` carry a leading axis of
        vectorized chains, which share ``i``, so the O(N) branch runs only when
        due."""
        every = self.recentre_every
        if every is None:
            return centre
        z_sum = jax.tree.map(jnp.add, centre.z_sum, z)
        i = jnp.ravel(i)[0]
        due = (i % every == 0) & (i <= num_warmup)

        def move(centre, z_sum):
            z = jax.tree.map(lambda x: x / every, z_sum)
            potential, grad = self.full_data(
                z, model_args, model_kwargs, chunk_size=self.chunk_size
            )
            zeros = jax.tree.map(jnp.zeros_like, z_sum)
            new = Centre(z, potential.astype(centre.potential.dtype), grad, zeros)
            ok = _finite_tree(new)
            old = centre._replace(z_sum=zeros)
            return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)

        return jax.lax.cond(
            due,
            jax.vmap(move) if batched else move,
            lambda centre, z_sum: centre._replace(z_sum=z_sum),
            centre,
            z_sum,
        )


def unconstrained_centre(centre, trace, shapes):
    """A user's centre (constrained values by site) on the unconstrained scale,
    checked against the model's latent sites."""
    missing = sorted(set(shapes) - set(centre))
    extra = sorted(set(centre) - set(shapes))
    if missing or extra:
        raise ValueError(
            "centre must give a value for every latent site "
            f"{sorted(shapes)}: missing {missing}, unknown {extra}."
        )
    out = {}
    for name, value in centre.items():
        support = trace[name]["fn"].support
        value = jnp.asarray(value, dtype=jnp.result_type(float))
        want = jnp.shape(trace[name]["value"])
        if jnp.shape(value) != want:
            raise ValueError(
                f"centre['{name}'] has shape {jnp.shape(value)}; the site's value has "
                f"shape {want}."
            )
        if not bool(jnp.all(jnp.isfinite(value))):
            raise ValueError(f"centre['{name}'] = {value} is not finite.")
        if not bool(jnp.all(support(value))):
            raise ValueError(
                f"centre['{name}'] = {value} is outside the site's support "
                f"{support}; give constrained values."
            )
        z = biject_to(support).inv(value)
        if not bool(jnp.all(jnp.isfinite(z))):
            raise ValueError(
                f"centre['{name}'] = {value} is not finite on the unconstrained scale."
            )
        out[name] = z
    return out


def with_setup(estimator, setup):
    """``estimator`` reading the set-up from ``setup``'s arrays (a chain's
    :class:`~numpyro_sgbd.state.SetupArrays`: ``preconditioner`` and
    ``centre``): a copy whose pullback ``g -> L' g`` (of a
    :class:`MinibatchEstimator`, and of the one it wraps or runs on each shard)
    is L's where there is a preconditioner, and whose fixed centre ``(z_hat,
    U(z_hat), grad U(z_hat))`` (of a :class:`ControlVariateEstimator`) is
    ``setup.centre`` where that is not ``None``.

    The kernels call it inside their compiled step with the arrays a chain's
    state carries, so that the step reads L and the centre as arguments rather
    than constants. Other estimators are returned as they are."""
    pre = setup.preconditioner
    return _bound(estimator, None if pre is None else pre.pull, setup.centre)


def _bound(estimator, pullback, centre):
    if isinstance(estimator, ControlVariateEstimator):
        bound = copy.copy(estimator)
        bound.estimator = _bound(estimator.estimator, pullback, None)
        if centre is not None:
            bound.centre, bound.centre_potential, bound.centre_grad = centre
        return bound
    if isinstance(estimator, MinibatchEstimator) and pullback is not None:
        bound = copy.copy(estimator)
        bound.pullback = pullback
        if estimator.shard is not None:
            bound.shard = _bound(estimator.shard, pullback, None)
        return bound
    return estimator
