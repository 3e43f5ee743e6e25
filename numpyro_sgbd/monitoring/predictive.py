"""A network's run checked by its predictions (issue 62, item 2).

A network's weights do not mix, under any sampler: permuting or sign-flipping
hidden units leaves the likelihood unchanged, so chains settle in different
copies of the same function and every weight's R-hat across chains is large
while their predictions agree. The convergence and drift checks of
:mod:`~numpyro_sgbd.monitoring.trace` read, for a model that builds a network
with ``numpyro.contrib.module`` (one subsample plate, no local or enumerated
sites: the models the network set-up takes), the log-likelihood of
:data:`PROBE_ROWS` fixed rows of its plate at each recorded draw instead of
weight coordinates: the pointwise log predictive densities whose means over
draws ``az.loo`` and ``az.waic`` sum, and which do not change under the
symmetries. The record still keeps the weight coordinates for the run's error
estimate (:mod:`~numpyro_sgbd.discretisation`).

The rows are evenly spaced over the plate (every row's index ``round(j (N -
1) / (P - 1))``), so data sorted by class or time are probed across their
range; they are fixed by N alone, and the same for every run of the model.
Under :func:`~numpyro_sgbd.monitoring.per_step` the live drift notes, made
while the run goes, still read the coordinates; the check at the run's end
reads the rows.
"""

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.infer.util import constrain_fn

__all__ = ["PROBE_ROWS", "probe_fn", "probe_rows", "row_name"]

#: Rows whose log-likelihood the record keeps for a network model.
PROBE_ROWS = 32


def probe_rows(prepared):
    """``(plate, rows)`` the record probes for ``prepared``'s model
    (:class:`~numpyro_sgbd.prepared_model.PreparedModel`), or ``("", ())`` for
    a model that builds no network or that the network set-up does not take."""
    plates = prepared.plates or {}
    plain = not prepared.local and prepared.enumerate_dim is None
    if not prepared.modules or len(plates) != 1 or not plain:
        return "", ()
    ((plate, (size, _, _)),) = plates.items()
    rows = np.linspace(0, size - 1, min(size, PROBE_ROWS)).round().astype(int)
    return plate, tuple(int(r) for r in np.unique(rows))


def row_name(plate, row):
    """How a message names a probed row's column."""
    return f"the log-likelihood of row {row} of plate '{plate}'"


def probe_fn(prepared, plate, rows, model_args, model_kwargs):
    """``z -> (..., len(rows))``: the log-likelihood of each of ``rows`` of
    ``plate`` (summed over the plate's observed sites and their other axes) at
    the unconstrained draw ``z``, whose leaves may carry leading chain axes
    beyond the sites' shapes."""
    model = prepared.model_at({plate: jnp.asarray(rows)})
    dim = prepared.plates[plate][2]
    shapes = prepared.shapes

    def one(z):
        theta = constrain_fn(model, model_args, model_kwargs, z)
        trace = handlers.trace(handlers.substitute(model, data=theta)).get_trace(
            *model_args, **model_kwargs
        )
        total = jnp.zeros(len(rows))
        for site in trace.values():
            if site["type"] != "sample" or not site["is_observed"]:
                continue
            if not any(f.name == plate for f in site["cond_indep_stack"]):
                continue
            log_prob = jnp.moveaxis(site["fn"].log_prob(site["value"]), dim, 0)
            total = total + jnp.reshape(log_prob, (len(rows), -1)).sum(1)
        return total

    def batched(z):
        name = next(iter(shapes))
        extra = jnp.ndim(z[name]) - len(shapes[name])
        fn = one
        for _ in range(extra):
            fn = jax.vmap(fn)
        return fn(z)

    return batched
