"""The effect handlers that give subsample plates their indices: every place the
package touches a plate's indices is here.

:class:`full_batch` widens each subsample plate to all its data (the exact model),
:class:`fix_plates` gives named plates given indices (a minibatch, a chunk), and
:class:`SubsamplePlates` gives a model's subsample plates prototype indices
while tracing it, :func:`subsample_plates` reads the plates from a trace (the
package's one notion of a subsample plate),
:class:`subsample_size` sets a plate's minibatch size without editing the model, and
:class:`shard_local` makes the model on one shard of sharded data the shard's share
of the whole potential.
"""

import jax
from jax import random
import jax.numpy as jnp
from numpyro import handlers
from numpyro.infer import init_to_sample
from numpyro.primitives import Messenger

__all__ = [
    "SubsamplePlates",
    "fix_plates",
    "full_batch",
    "shard_local",
    "subsample_plates",
    "subsample_size",
]


def subsample_plates(trace):
    """``{name: (size, n)}`` of the plates in ``trace`` (a NumPyro trace, concrete
    or abstract) whose declared ``subsample_size`` n is below their size: what
    every part of the package counts as a subsample plate, whatever indices a
    handler has given the plate (so a kernel's :attr:`~numpyro_sgbd.SGBD.model`,
    its plate fixed to the evaluation rows, has the plates of the model as
    written).

    >>> import numpyro
    >>> def model():
    ...     with numpyro.plate("coef", 3):
    ...         pass
    ...     with numpyro.plate("data", 10, subsample_size=4):
    ...         pass
    >>> subsample_plates(handlers.trace(handlers.seed(model, 0)).get_trace())
    {'data': (10, 4)}
    """
    plates = {}
    for site in trace.values():
        if site["type"] == "plate":
            size, n = site["args"]
            if n is not None and n < size:
                plates[site["name"]] = (int(size), int(n))
    return plates


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


class subsample_size(Messenger):
    """Set the ``subsample_size`` of named plates: inside the handler
    ``numpyro.plate(name, N, subsample_size=n)`` behaves as if written with
    ``subsample_size=sizes[name]``, so one model serves several minibatch sizes (as
    :func:`~numpyro_sgbd.tune` compares them).

    :param fn: a NumPyro model.
    :param dict sizes: ``{plate name: subsample size}``, each an int in ``[1, N)``
        (checked when the plate is reached, where N is known).

    >>> import numpyro
    >>> from numpyro import handlers
    >>> def model():
    ...     with numpyro.plate("data", 10, subsample_size=3) as idx:
    ...         numpyro.deterministic("idx", idx)
    >>> seeded = handlers.seed(subsample_size(model, {"data": 5}), 0)
    >>> handlers.trace(seeded).get_trace()["idx"]["value"].shape
    (5,)
    """

    def __init__(self, fn=None, sizes=None):
        if not isinstance(sizes, dict) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1
            for n in sizes.values()
        ):
            raise ValueError(
                f"sizes must be a dict {{plate name: positive int}}, got {sizes!r}."
            )
        self.sizes = dict(sizes)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "plate" or msg["name"] not in self.sizes:
            return
        size = msg["args"][0]
        n = self.sizes[msg["name"]]
        if n >= size:
            raise ValueError(
                f"subsample_size {n} for plate '{msg['name']}' must be below its "
                f"size {size}; for the full data drop the plate from sizes."
            )
        msg["args"] = (size, n)
        msg["value"] = None  # drawn by NumPyro, or given by a handler outside


def sample_trace(model, model_args, model_kwargs):
    """A trace of ``model`` with its latent sites at draws from the prior
    (``init_to_sample``, key 0): the sites, their distributions and shapes. Under
    :func:`jax.eval_shape` it compiles nothing."""
    prototype = handlers.substitute(
        handlers.seed(model, random.key(0)), substitute_fn=init_to_sample
    )
    return handlers.trace(prototype).get_trace(*model_args, **model_kwargs)


class SubsamplePlates(Messenger):
    """Gives subsample plates cheap prototype indices 0..n-1 (which plates they
    are, :func:`subsample_plates` reads from the trace)."""

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
        msg["value"] = jnp.arange(n)


class shard_local(Messenger):
    """The model on one of ``num_shards`` equal shards of its data: the potential
    whose sum over the shards is the model's potential.

    Inside :func:`jax.shard_map` the model's arrays are the shard's ``local_size``
    rows. Sites in the plate ``name`` get the scale ``local_size / m`` for ``m``
    given indices (:class:`fix_plates`), whatever size the model declares for the
    plate (the global N, or ``len(X)``, which is local there); every other site
    (prior, Jacobian, data outside the plate) is weighted ``1 / num_shards``, so
    that the sum over the shards counts it once (docs: Big data).
    """

    def __init__(self, fn, name, local_size, num_shards):
        self.name = name
        self.local_size = local_size
        self.num_shards = num_shards
        self.declared = None
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] == self.name:
            self.declared = msg["args"][0]
            return
        if msg["type"] != "sample":
            return
        stack = msg.get("cond_indep_stack", [])
        if any(f.name == self.name for f in stack):
            # The plate scaled the site by declared / m; the shard's share is
            # local_size / m.
            factor = self.local_size / self.declared
        else:
            factor = 1.0 / self.num_shards
        msg["scale"] = factor if msg["scale"] is None else factor * msg["scale"]
