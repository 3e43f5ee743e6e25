"""The runs :func:`~numpyro_sgbd.compare` and
:func:`~numpyro_sgbd.plot_marginals` take, read alike: what counts as a run
(:func:`named_runs`), its draws, sampler statistics, wall time and model
(:func:`load_run`, :func:`load_runs`), its variables as scalar components
(:func:`pooled`), and the warnings its kernel issued (:func:`run_warnings`)."""

from collections.abc import Mapping

import numpy as np
from numpyro.infer import MCMC

from numpyro_sgbd.evaluation import _arviz
from numpyro_sgbd.handlers import full_batch
from numpyro_sgbd.kernel import wall_time
from numpyro_sgbd.monitoring.checks import check
from numpyro_sgbd.monitoring.run import Monitored


def is_run(value):
    """Whether ``value`` is one run: an MCMC, ArviZ data or a dict of draws."""
    return isinstance(value, (MCMC, Mapping)) or _arviz.is_inference_data(value)


def named_runs(candidates):
    """``{name: run}`` of ``candidates``: one run (named ``"run"``), a list of
    runs (``"run 0"``, ...) or a dict of them as given; a ``TypeError`` for
    anything else."""
    # ArviZ's containers are Mappings of their groups: one run, not a dict of runs.
    if _arviz.is_inference_data(candidates):
        return {"run": candidates}
    if (
        isinstance(candidates, Mapping)
        and candidates
        and all(is_run(v) for v in candidates.values())
    ):
        return dict(candidates)
    if is_run(candidates):
        return {"run": candidates}
    if isinstance(candidates, (list, tuple)) and candidates:
        return {f"run {i}": run for i, run in enumerate(candidates)}
    raise TypeError(
        "candidates must be a run (MCMC, ArviZ InferenceData or DataTree, or a dict "
        "of draws), a list of runs, or a dict {name: run}; got "
        f"{type(candidates).__name__}."
    )


def load_run(name, run):
    """(draws grouped by chain, sampler stats grouped by chain, seconds, model info).

    The model info is ``(model, args, kwargs)`` of an MCMC run of a model (for
    the KSD's scores), else ``None``. The run checks of our kernels' runs are
    made here (:func:`~numpyro_sgbd.check`: their warnings, once per run)."""
    if isinstance(run, MCMC):
        if run._states is None:
            raise ValueError(f"run {name!r}: the MCMC object has not been run yet.")
        if isinstance(run.sampler, Monitored):
            check(run)
        draws = {k: np.asarray(v) for k, v in run.get_samples(True).items()}
        stats = {
            k: np.asarray(v)
            for k, v in run.get_extra_fields(group_by_chain=True).items()
            if not isinstance(v, (dict, tuple)) and np.ndim(v) == 2
        }
        sampler = run.sampler
        if isinstance(sampler, Monitored):  # ours: the model as the user gave it
            model = sampler.prepared.model
        else:  # NumPyro's HMC and NUTS keep it as `_model`
            model = getattr(sampler, "_model", None) or getattr(sampler, "model", None)
        if isinstance(model, full_batch):
            model = model.fn
        source = (model, run._args, run._kwargs) if model is not None else None
        # Our kernels note the host time as they run (NumPyro's do not).
        return draws, stats, wall_time(sampler, run), source
    if _arviz.is_inference_data(run):
        posterior = _arviz.group(run, "posterior")
        if posterior is None:
            raise ValueError(f"run {name!r}: the ArviZ data has no posterior group.")
        draws = {k: np.asarray(v) for k, v in posterior.data_vars.items()}
        sample_stats = _arviz.group(run, "sample_stats")
        stats = {}
        if sample_stats is not None:
            stats = {
                k: np.asarray(v)
                for k, v in sample_stats.data_vars.items()
                if np.ndim(v) == 2
            }
        seconds = posterior.attrs.get("sampling_time")
        return draws, stats, None if seconds is None else float(seconds), None
    # A dict of draws, NumPyro's get_samples() layout: draws on the leading axis.
    draws = {k: np.asarray(v)[None] for k, v in run.items()}
    return draws, {}, None, None


def components(var, array):
    """Reshape (chain, draw, *shape) to (chain, draw, K) with ArviZ-style names."""
    shape = array.shape[2:]
    names = [
        var if not shape else f"{var}[{', '.join(map(str, idx))}]"
        for idx in np.ndindex(*shape)
    ]
    return names, array.reshape(array.shape[:2] + (-1,))


def check_shapes(name, draws, ref_draws, var_names):
    """A ``ValueError`` unless the run ``name``'s ``draws`` hold every variable
    of ``var_names`` with the reference's shape and at least two draws a chain."""
    for var in var_names:
        if var not in draws:
            raise ValueError(
                f"run {name!r} has no variable {var!r}; the reference has "
                f"{sorted(ref_draws)} and the run {sorted(draws)}. Pass var_names= "
                "to compare a common subset."
            )
        if draws[var].shape[2:] != ref_draws[var].shape[2:]:
            raise ValueError(
                f"variable {var!r} has shape {draws[var].shape[2:]} in run {name!r} "
                f"but {ref_draws[var].shape[2:]} in the reference."
            )
        if draws[var].shape[1] < 2:
            raise ValueError(
                f"run {name!r} has {draws[var].shape[1]} draw(s) of {var!r}; "
                "need at least 2 per chain."
            )


def run_warnings(run):
    """The kinds of warning the run's SG kernel issued (its ``run_warnings``):
    ``"none"`` for none, NaN where unknown (NUTS, ArviZ data, plain draws)."""
    kinds = getattr(getattr(run, "sampler", None), "run_warnings", None)
    if not isinstance(run, MCMC) or kinds is None:
        return np.nan
    kinds = list(dict.fromkeys(kinds))  # each kind once, in the order issued
    return ", ".join(map(str, kinds)) if kinds else "none"


def error_estimate(run):
    """The run's SG kernel's own error estimate (its ``error_estimate``), or
    ``None`` (no law for its rule, NUTS, ArviZ data, plain draws)."""
    if not isinstance(run, MCMC):
        return None
    return getattr(run.sampler, "error_estimate", None)


def load_runs(reference_name, reference, runs, var_names):
    """``(loaded, var_names)``: :func:`load_run` of the reference (first) and of each
    run, by name, every one checked to hold the compared variables
    ``var_names`` (default: all of the reference's) with the reference's
    shapes."""
    ref_draws, ref_stats, ref_seconds, ref_source = load_run(reference_name, reference)
    if not ref_draws:
        raise ValueError("the reference has no draws.")
    if var_names is None:
        var_names = list(ref_draws)
    var_names = [var_names] if isinstance(var_names, str) else list(var_names)
    check_shapes(reference_name, ref_draws, ref_draws, var_names)
    loaded = {reference_name: (ref_draws, ref_stats, ref_seconds, ref_source)}
    for name, run in runs.items():
        loaded[name] = load_run(name, run)
        check_shapes(name, loaded[name][0], ref_draws, var_names)
    return loaded, var_names


def pooled(draws, var_names):
    """``(names, flat)``: the scalar components of ``var_names`` in ``draws``,
    named as ArviZ does, as one array (chain, draw, K) in float64: NumPy sums
    an axis that is not the last one draw by draw, and in float32 the means of
    200,000 draws of a coefficient near 1 with a posterior sd of 0.004 came out
    up to 0.4 sd off (their sds up to 8 % off)."""
    parts = [components(v, draws[v]) for v in var_names]
    names = [n for ns, _ in parts for n in ns]
    return names, np.concatenate([a for _, a in parts], axis=2).astype(np.float64)
