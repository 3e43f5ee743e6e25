"""The evaluation side: how good a run's draws are, against what.

- :mod:`~numpyro_sgbd.evaluation.reference`: the ground truth, NUTS on the model
  with every subsample plate widened to the full data
  (:func:`~numpyro_sgbd.reference_posterior`), and the exact scores at any draws
  (:func:`~numpyro_sgbd.full_batch_scores`); with
  :mod:`~numpyro_sgbd.evaluation.laplace` (the Laplace map NUTS may run in) and
  :mod:`~numpyro_sgbd.evaluation.cache` (the reference's cache on disk);
- :mod:`~numpyro_sgbd.evaluation.comparison`: runs against a reference, in a
  table and a figure (:func:`~numpyro_sgbd.compare`);
- :mod:`~numpyro_sgbd.evaluation.criticism`: the pointwise log-likelihood of every
  data row, for LOO and WAIC (:func:`~numpyro_sgbd.from_numpyro`);
- :mod:`~numpyro_sgbd.evaluation.ksd` and :mod:`~numpyro_sgbd.evaluation.fssd`:
  Stein discrepancies, sample quality from draws and scores alone;
- :mod:`~numpyro_sgbd.evaluation.drift`: whether a chain's draws still drift;
- ``_runs``: the runs :func:`~numpyro_sgbd.compare` takes, read alike;
- ``_arviz``: everything that differs between ArviZ 0.x and 1.x.

This file imports nothing, and ``import numpyro_sgbd`` imports none of these
modules: the package's evaluation names load them on first use, so sampling
needs no ArviZ.
"""
