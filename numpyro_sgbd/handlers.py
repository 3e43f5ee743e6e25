"""The effect handlers that give subsample plates their indices: every place the
package touches a plate's indices is here.

:class:`full_batch` widens each subsample plate to all its data (the exact model),
:class:`fix_plates` gives named plates given indices (a minibatch, a chunk), and
:class:`SubsamplePlates` records a model's subsample plates while tracing it.
"""

import jax
import jax.numpy as jnp
from numpyro.primitives import Messenger

__all__ = ["SubsamplePlates", "fix_plates", "full_batch"]


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
            # A concrete array even under a transform (Predictive vmaps the model
            # over draws), where jnp.arange would be traced and a model indexing
            # NumPy data with it (X[idx]) would fail.
            with jax.ensure_compile_time_eval():
                msg["value"] = jnp.arange(size)
            msg["args"] = (size, size)


class fix_plates(Messenger):
    """Give each plate named in ``indices`` those indices: the plate's scale is then
    N / len(indices), whatever its ``subsample_size``."""

    def __init__(self, fn, indices):
        self.indices = indices
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] in self.indices:
            idx = self.indices[msg["name"]]
            msg["value"] = idx
            msg["args"] = (msg["args"][0], jnp.shape(idx)[0])


class SubsamplePlates(Messenger):
    """Records subsample plates and gives them cheap prototype indices 0..n-1."""

    def __init__(self, fn=None):
        self.plates = {}
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "plate" or msg["value"] is not None:
            return
        size, n = msg["args"]
        if n > size:
            raise ValueError(
                f"numpyro.plate('{msg['name']}', {size}, subsample_size={n}): "
                "subsample_size must be smaller than the plate size; drop "
                "subsample_size (or make it < size) for this plate."
            )
        self.plates[msg["name"]] = (size, n)
        msg["value"] = jnp.arange(n)
