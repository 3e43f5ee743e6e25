"""Ground truth: the same model with every subsample plate widened to the full data."""

import jax.numpy as jnp
from numpyro.primitives import Messenger

__all__ = ["full_batch"]


class full_batch(Messenger):
    """Widen every subsample plate of ``fn`` to its full size.

    Inside the handler, ``numpyro.plate(name, N, subsample_size=n)`` yields the indices
    ``0..N-1`` and applies no ``N/n`` scale, so the potential of ``full_batch(model)``
    is the exact full-data potential of the same model code, and
    ``MCMC(NUTS(full_batch(model)))`` samples the exact posterior.

    :param fn: a NumPyro model.

    >>> import jax, numpyro, numpyro.distributions as dist
    >>> from numpyro import handlers
    >>> def model():
    ...     with numpyro.plate("data", 10, subsample_size=3) as idx:
    ...         numpyro.deterministic("idx", idx)
    >>> tr = handlers.trace(full_batch(model)).get_trace()
    >>> tr["idx"]["value"].tolist() == list(range(10))
    True
    """

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["value"] is None:
            size = msg["args"][0]
            msg["value"] = jnp.arange(size)
            msg["args"] = (size, size)
