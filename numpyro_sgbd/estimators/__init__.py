"""Gradient estimates and their noise: the one layer between models and update rules.

An estimator is a callable ``estimator(rng_key, z, model_args, model_kwargs)`` that
returns a :class:`GradientEstimate` at the unconstrained position ``z``. Three sources
exist: a NumPyro model whose data sit in a subsample plate
(:class:`MinibatchEstimator`), an exact potential (:class:`PotentialEstimator`), and a
user-supplied stochastic gradient (:class:`CustomEstimator`).

The modules, by concern (every name below is importable from here):

- :mod:`~numpyro_sgbd.estimators.base`: the :class:`Estimator` protocol, the
  :class:`GradientEstimate`, the chain's :class:`Centre`, and the estimators
  without data (:class:`PotentialEstimator`, :class:`CustomEstimator`);
- :mod:`~numpyro_sgbd.estimators.indices`: minibatch indices
  (:func:`draw_indices`) and the noise variance of their sampling scheme
  (:func:`noise_variance_factor`);
- :mod:`~numpyro_sgbd.estimators.rows`: per-datum gradients as rows, streamed
  or gathered, and their moments;
- :mod:`~numpyro_sgbd.estimators.compiled`: the data as arguments of compiled
  functions (:func:`split_arrays`), and one-off programs (:func:`jit_once`,
  :func:`median_start`);
- :mod:`~numpyro_sgbd.estimators.minibatch`: :class:`MinibatchEstimator`;
- :mod:`~numpyro_sgbd.estimators.control_variates`:
  :class:`ControlVariateEstimator`.
"""

from numpyro_sgbd.estimators.base import (
    Centre,
    CustomEstimator,
    Estimator,
    GradientEstimate,
    PotentialEstimator,
    # Private; the kernels and the samplers import it from here.
    _finite_tree,  # noqa: F401
)
from numpyro_sgbd.estimators.compiled import (
    as_jax_arrays,
    jit_once,
    median_start,
    median_start_program,
    split_arrays,
)
from numpyro_sgbd.estimators.control_variates import (
    ControlVariateEstimator,
    unconstrained_centre,
    with_setup,
)
from numpyro_sgbd.estimators.indices import (
    AUTO_REPLACE_RATIO,
    # Private; the tests import it from here.
    _index_words,  # noqa: F401
    draw_indices,
    noise_variance_factor,
    resolve_replace,
)
from numpyro_sgbd.estimators.minibatch import MinibatchEstimator
from numpyro_sgbd.estimators.rows import GatheredRows, StreamedRows

__all__ = [
    "AUTO_REPLACE_RATIO",
    "Centre",
    "ControlVariateEstimator",
    "CustomEstimator",
    "Estimator",
    "GatheredRows",
    "GradientEstimate",
    "MinibatchEstimator",
    "PotentialEstimator",
    "StreamedRows",
    "as_jax_arrays",
    "draw_indices",
    "jit_once",
    "median_start",
    "median_start_program",
    "noise_variance_factor",
    "resolve_replace",
    "split_arrays",
    "unconstrained_centre",
    "with_setup",
]
