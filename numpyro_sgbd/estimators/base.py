"""What the kernels ask of a gradient source: the :class:`Estimator` protocol,
the :class:`GradientEstimate` it returns, the chain's :class:`Centre`, and the two
sources without data of their own (:class:`PotentialEstimator`,
:class:`CustomEstimator`)."""

from collections import namedtuple
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "Centre",
    "CustomEstimator",
    "Estimator",
    "GradientEstimate",
    "PotentialEstimator",
]


class GradientEstimate(NamedTuple):
    """A stochastic estimate of the potential's gradient at one position.

    :param z_grad: estimate of :math:`\\nabla U(z)`, the gradient of the potential
        (negative log density), a pytree like ``z``.
    :param noise_sd: per-coordinate standard deviation :math:`\\tau` of the noise in
        ``z_grad`` (pytree like ``z``), or ``None`` where it is unknown. The corrected
        variants need it.
    :param potential_energy: the matching estimate of :math:`U(z)`, or ``None``.
    :param noise_cov: the covariance :math:`\\Sigma` of the noise in ``z_grad`` over
        ``z`` flattened by :func:`jax.flatten_util.ravel_pytree`, in the form
        :class:`~numpyro_sgbd.NOGIN`'s ``covariance`` names: a ``(d, k)`` factor
        :math:`C` with :math:`\\Sigma = CC^\\top` (``"lowrank"``), the ``(d, d)``
        matrix (``"full"``) or its diagonal ``(d,)`` (``"diag"``). ``None`` where it
        is unknown or not asked for.
    :param local: where the model has local sites, ``(rows, LocalState)``: their
        N rows after the local move made before this estimate, and its step
        (:mod:`~numpyro_sgbd.local_sites`); ``None`` otherwise.
    """

    z_grad: Any
    noise_sd: Any = None
    potential_energy: Any = None
    noise_cov: Any = None
    local: Any = None


def _finite_tree(tree):
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


Centre = namedtuple("Centre", ["z", "potential", "grad", "z_sum"])
Centre.__doc__ = """
The control variates' centre as the kernels keep it in their state when they
re-centre during warmup (``recentre_every``).

 - **z** - the centre :math:`\\hat z`, unconstrained, like the state's ``z``.
 - **potential** - the full-data potential :math:`U(\\hat z)`.
 - **grad** - the full-data gradient :math:`\\nabla U(\\hat z)`.
 - **z_sum** - the sum of the positions since the last re-centring; the next
   centre is their mean.
"""


class Estimator:
    """The protocol the kernels call: ``estimate`` at a position, around the
    chain's :class:`Centre` where the estimator keeps one in the state
    (control variates with ``recentre_every``; ``None`` for every other
    estimator), ``initial_centre`` and ``recentre``."""

    #: Every how many warmup steps the centre moves (``None``: it never does).
    recentre_every = None

    def initial_centre(self, z, model_args=(), model_kwargs=None):
        """The chain's :class:`Centre` at ``z``, or ``None`` (no centre in the
        state)."""
        return None

    def estimate(self, rng_key, z, model_args=(), model_kwargs=None, centre=None):
        """The :class:`GradientEstimate` at ``z`` (around ``centre`` if given)."""
        return self(rng_key, z, model_args, model_kwargs)

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
        """The chain's centre after its draw ``z`` at iteration ``i``."""
        return centre

    # The full-data pass, for an estimator of a model with a subsample plate:
    # such an estimator gives ``full_data_parts(model_args, model_kwargs,
    # chunk_size) -> (run, arrays)``, ``run(z, arrays)`` jitted.
    def full_data(self, z, model_args=(), model_kwargs=None, *, chunk_size=4096):
        """The exact full-data potential and its gradient at ``z``, summed over the
        data in chunks of ``chunk_size`` rows: memory O(chunk_size x d), never
        O(N x d). Needs exactly one subsample plate.

        :return: ``(U(z), grad U(z))``.
        """
        return self.full_data_fn(model_args, model_kwargs, chunk_size=chunk_size)(z)

    def full_data_fn(self, model_args=(), model_kwargs=None, *, chunk_size=4096):
        """:meth:`full_data` as a jitted function of z, compiled once for these
        model arguments (for an optimiser's repeated calls); the data are
        arguments of the compiled function, not constants in it."""
        run, arrays = self.full_data_parts(model_args, model_kwargs, chunk_size)
        return lambda z: run(z, arrays)

    def full_data_parts(self, model_args=(), model_kwargs=None, chunk_size=4096):
        """``(run, arrays)``: :meth:`full_data` is ``run(z, arrays)``."""
        raise TypeError(
            f"{type(self).__name__} has no full-data pass: it needs a model with "
            "a subsample plate (MinibatchEstimator, ControlVariateEstimator)."
        )


class PotentialEstimator(Estimator):
    """Exact gradients of a potential function: full-batch unadjusted dynamics.

    :param potential_fn: ``potential_fn(z) -> U(z)``, the negative log density.
    """

    def __init__(self, potential_fn):
        self.potential_fn = potential_fn

    def __call__(self, rng_key, z, model_args=(), model_kwargs=None):
        value, grad = jax.value_and_grad(self.potential_fn)(z)
        noise = jax.tree.map(jnp.zeros_like, grad)
        return GradientEstimate(grad, noise, value)


class CustomEstimator(Estimator):
    """A user-supplied stochastic gradient ``gradient_fn(rng_key, z)``.

    ``gradient_fn`` returns a :class:`GradientEstimate` (``z_grad`` the noisy gradient
    of the potential, ``noise_sd`` its per-coordinate noise sd if known), or just the
    gradient pytree. This is how the SGBD paper's injected-noise experiments (Section
    4.1, supplement C) run through the same update rules.
    """

    def __init__(self, gradient_fn):
        self.gradient_fn = gradient_fn

    def __call__(self, rng_key, z, model_args=(), model_kwargs=None):
        out = self.gradient_fn(rng_key, z)
        if not isinstance(out, GradientEstimate):
            out = GradientEstimate(out)
        if out.potential_energy is None:
            out = out._replace(potential_energy=jnp.array(jnp.nan))
        return out
