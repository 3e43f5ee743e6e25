"""How far a run is from the reference posterior: a table and a figure."""

from dataclasses import dataclass
import warnings

import numpy as np
import pandas as pd

from numpyro_sgbd import discretisation
from numpyro_sgbd.evaluation import _arviz
from numpyro_sgbd.evaluation._runs import (
    check_shapes,
    components,
    error_estimate,
    load_run,
    load_runs,
    named_runs,
    pooled,
    run_warnings,
)
from numpyro_sgbd.evaluation.ksd import ksd, unconstrained_draws_and_scores
from numpyro_sgbd.evaluation.reference import ESS_PER_CHAIN_MIN, RHAT_MAX
from numpyro_sgbd.monitoring import convergence

__all__ = ["Comparison", "compare", "plot_marginals"]

# Sampler statistics summarised in the table: (field, column, reduction).
_STATS = (
    ("potential_energy_estimate", "mean_potential_energy_estimate", np.nanmean),
    ("mean_noise_sd", "mean_noise_sd", np.nanmean),
    ("tolerance_exceeded", "frac_tolerance_exceeded", np.nanmean),
    ("num_nonfinite", "num_nonfinite", np.nanmax),
    ("diverging", "num_divergent", np.nansum),
)
# Fields that are not statistics to average (z itself) or are summarised above.
_KNOWN_STATS = {field for field, _, _ in _STATS} | {"z", "lp"}
_SUMMARY = [
    "num_draws",
    "xi",
    "est_xi",
    "max_bias_mean",
    "max_bias_var",
    "max_rel_bias_var",
    "min_ess_bulk",
    "ess_per_s",
    "ksd",
    "sampling_time",
    "warnings",
]


@dataclass
class Comparison:
    """The result of :func:`compare`: two pandas DataFrames.

    :ivar per_parameter: one row per (run, parameter component), indexed by
        ``run`` and ``parameter`` (``"beta[0]"``): ``mean``, ``sd``, ``ref_mean``,
        ``ref_sd``, ``bias_mean`` = ``|mean - ref_mean| / ref_sd``, ``bias_var`` =
        ``|sd**2 - ref_sd**2| / ref_sd`` (SGBD paper, supplement eq. 40; in the
        units of the parameter, not scale-free), ``rel_bias_var`` =
        ``|sd**2 / ref_sd**2 - 1|`` (scale-free), ``ess_bulk``, ``ess_tail`` and
        ``r_hat`` (NaN for a single chain).
    :ivar summary: one row per run, indexed by ``run``: ``num_draws``, ``xi`` (the
        relative error of the posterior sds), ``est_xi`` (the xi the run's SG
        kernel expects from its own rule's bias law and the run's ESS, with no
        reference: see :attr:`~numpyro_sgbd.SGBD.error_estimate`; NaN for
        NUTS, ArviZ data and rules without a law), ``max_bias_mean``, ``max_bias_var``,
        ``max_rel_bias_var``, ``min_ess_bulk``, ``ess_per_s``, ``ksd``,
        ``sampling_time`` (seconds) and the
        sampler statistics the run recorded (``mean_potential_energy_estimate``,
        ``mean_noise_sd``, ``frac_tolerance_exceeded``, ``num_nonfinite``,
        ``num_divergent``, and ``mean_<name>`` for any other scalar statistic,
        such as :class:`~numpyro_sgbd.SGHMC`'s ``kinetic_energy``,
        :class:`~numpyro_sgbd.SGNHT`'s ``thermostat`` or :class:`~numpyro_sgbd.NOGIN`'s
        ``noise_damping``). ``warnings`` lists the kinds of warning an SG kernel
        issued during the run (its ``run_warnings``: ``"drift"``, ``"step"``,
        ``"nonfinite"``, ``"convergence"``, ...), ``"none"`` when it issued
        none, NaN where that is unknown (NUTS, ArviZ data, plain draws). The
        reference's own row has NaN biases and ``xi``.
    :ivar bool reference_trustworthy: ``False`` when the reference failed its
        convergence check: the scores are then against a reference that may be
        wrong, and the printed table says so first.
    :ivar str reference_check: the reference's figures (R-hat, bulk ESS) and
        where they come from.
    """

    per_parameter: "object"
    summary: "object"
    reference_trustworthy: bool = True
    reference_check: str = ""

    def __str__(self):
        def fmt(v):
            if isinstance(v, float) and np.isnan(v):
                return "-"
            if isinstance(v, (int, np.integer)) or float(v).is_integer() and v > 99:
                return f"{int(v)}"
            return f"{v:.3g}"

        stats = [c for c in self.summary if c not in _SUMMARY]
        accuracy = self.summary[_SUMMARY].dropna(axis=1, how="all")
        if "warnings" in accuracy:  # unknown shows as the other NaNs do
            accuracy = accuracy.assign(warnings=accuracy["warnings"].fillna("-"))
        parts = []
        if not self.reference_trustworthy:
            parts += [
                "WARNING: these scores are against an untrustworthy reference "
                f"({self.reference_check}).",
                "",
            ]
        parts += ["Summary over parameters:", accuracy.to_string(float_format=fmt)]
        if stats:
            parts += [
                "",
                "Sampler statistics (per-draw means; counts are totals):",
                self.summary[stats].to_string(float_format=fmt),
            ]
        for column, title in (
            ("bias_mean", "Standardised bias of the mean |mean - ref| / ref sd:"),
            ("bias_var", "Standardised bias of the variance |var - ref| / ref sd:"),
            ("rel_bias_var", "Relative bias of the variance |var / ref var - 1|:"),
        ):
            wide = self.per_parameter[column].unstack("run")
            wide = wide.loc[
                list(dict.fromkeys(self.per_parameter.index.get_level_values(1))),
                list(dict.fromkeys(self.per_parameter.index.get_level_values(0))),
            ]
            wide = wide.dropna(axis=1, how="all")
            parts += ["", title, wide.to_string(float_format=fmt)]
        return "\n".join(parts)

    __repr__ = __str__


def _draws_and_scores(source, draws, num_draws):
    model, args, kwargs = source
    pooled = {k: v.reshape((-1,) + v.shape[2:]) for k, v in draws.items()}
    return unconstrained_draws_and_scores(
        model, pooled, *args, num_draws=num_draws, **kwargs
    )


def _ess(flat):
    """``{"bulk", "tail", "r_hat"}`` per component of ``flat`` (chain, draw, K):
    the rank-normalised ESS and R-hat of
    :func:`numpyro_sgbd.monitoring.convergence.summary`
    (NaN R-hat for a single chain), the statistics ArviZ reports and the very
    function the kernels' convergence check uses, so the ESS of a run is one
    figure in both."""
    stats = convergence.summary(flat)
    out = {"bulk": stats.ess_bulk.reshape(-1), "tail": stats.ess_tail.reshape(-1)}
    if flat.shape[0] > 1:
        out["r_hat"] = stats.rhat.reshape(-1)
    else:
        out["r_hat"] = np.full(flat.shape[-1], np.nan)
    return out


def _reference_check(reference, flat):
    """``(trustworthy, figures)``: reference_posterior's verdict where it left one
    (``posterior.attrs["trustworthy"]``), else the largest rank-normalised R-hat
    and smallest bulk ESS of ``flat`` (chain, draw, K) against its thresholds. One
    chain is split in two halves for R-hat (ArviZ's split R-hat needs two)."""
    posterior = (
        _arviz.group(reference, "posterior")
        if _arviz.is_inference_data(reference)
        else None
    )
    attrs = {} if posterior is None else posterior.attrs
    if "trustworthy" in attrs:
        figures = ", ".join(
            f"{k} {float(attrs[k]):.3g}"
            for k in ("max_rhat", "min_ess_bulk", "num_divergent")
            if k in attrs
        )
        return bool(int(attrs["trustworthy"])), (
            f"reference_posterior's own check: {figures}"
        )
    chains, draws = flat.shape[:2]
    halves = (
        flat if chains > 1 else flat[:, : draws // 2 * 2].reshape(2, -1, flat.shape[2])
    )
    with warnings.catch_warnings():  # a constant component gives NaN, said below
        warnings.simplefilter("ignore", RuntimeWarning)
        max_rhat = float(np.nanmax(convergence.rhat(halves))) if draws >= 8 else np.nan
        min_ess = float(np.nanmin(convergence.ess_bulk(flat)))
    ess_min = ESS_PER_CHAIN_MIN * chains
    trusted = bool(max_rhat < RHAT_MAX and min_ess >= ess_min)
    figures = (
        f"max R-hat {convergence.rhat_text(max_rhat)} (needs < {RHAT_MAX}), "
        f"min bulk ESS {min_ess:.0f} "
        f"(needs >= {ess_min}) over {chains} chain(s) of {draws} draws"
    )
    return trusted, figures


def _checked_options(runs, reference_name, ksd_draws, wall_times):
    """``wall_times`` as a dict, after checking that no candidate takes the
    reference's name, ``ksd_draws`` is a count and ``wall_times`` names only
    known runs."""
    if reference_name in runs:
        raise ValueError(
            f"a candidate is named {reference_name!r}, like the reference; pass "
            "another reference_name=."
        )
    if not (isinstance(ksd_draws, int) and ksd_draws >= 0):
        raise ValueError(f"ksd_draws must be an int >= 0, got {ksd_draws!r}.")
    wall_times = dict(wall_times or {})
    unknown = set(wall_times) - set(runs) - {reference_name}
    if unknown:
        raise ValueError(f"wall_times names unknown runs {sorted(unknown)}.")
    return wall_times


def _ksd_source(model, model_args, model_kwargs, loaded):
    """``(model, args, kwargs)`` for the KSD's scores: the given model, else the
    first loaded run's (an MCMC's), else ``None`` (no KSD)."""
    if model is None:
        return next((s for *_, s in loaded.values() if s is not None), None)
    return (model, tuple(model_args), dict(model_kwargs or {}))


def _warn_untrusted(figures, strict):
    """Warn (``ValueError`` with ``strict``) that the reference failed its
    convergence check; the warning points at :func:`compare`'s caller."""
    message = (
        f"compare: the reference is not trustworthy ({figures}), so the scores "
        "against it may be wrong, for correct runs too. Sample a trustworthy "
        "one first, with the settings reference_posterior's warning names from "
        "what it measured (laplace=True or dense_mass=True where draws hit the "
        "maximal tree depth, a higher target_accept_prob for divergences, more "
        "num_warmup otherwise); strict=True makes this an error."
    )
    if strict:
        raise ValueError(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def _finite(name, flat):
    """Whether the run's pooled draws ``flat`` are all finite; a warning (at
    :func:`compare`'s caller) that its rows are NaN where not."""
    finite = bool(np.all(np.isfinite(flat)))
    if not finite:
        warnings.warn(
            f"run {name!r} has non-finite draws; its rows in the comparison are NaN.",
            RuntimeWarning,
            stacklevel=3,
        )
    return finite


def _scores(flat, finite, ref_mean, ref_sd, is_ref):
    """One run's scores per component of its pooled draws ``flat`` (chain, draw,
    K): ``mean``, ``sd``, ``ess`` (:func:`_ess`) and the biases against the
    reference's ``ref_mean`` and ``ref_sd`` (NaN for the reference itself, and
    all NaN for a run with non-finite draws)."""
    all_draws = flat.reshape(-1, flat.shape[-1])
    nan = np.full(flat.shape[-1], np.nan)
    if finite:
        mean, sd = all_draws.mean(0), all_draws.std(0, ddof=1)
        ess = _ess(flat)
    else:
        mean, sd, ess = nan, nan, {"bulk": nan, "tail": nan, "r_hat": nan}
    return dict(
        mean=mean,
        sd=sd,
        ess=ess,
        bias_mean=nan if is_ref else np.abs(mean - ref_mean) / ref_sd,
        bias_var=nan if is_ref else np.abs(sd**2 - ref_sd**2) / ref_sd,
        rel_bias_var=nan if is_ref else np.abs(sd**2 / ref_sd**2 - 1),
    )


def _parameter_rows(name, names, scores, ref_mean, ref_sd):
    """The run's rows of :attr:`Comparison.per_parameter`, one per component."""
    ess = scores["ess"]
    return [
        dict(
            run=name,
            parameter=parameter,
            mean=scores["mean"][j],
            sd=scores["sd"][j],
            ref_mean=ref_mean[j],
            ref_sd=ref_sd[j],
            bias_mean=scores["bias_mean"][j],
            bias_var=scores["bias_var"][j],
            rel_bias_var=scores["rel_bias_var"][j],
            ess_bulk=ess["bulk"][j],
            ess_tail=ess["tail"][j],
            r_hat=ess["r_hat"][j],
        )
        for j, parameter in enumerate(names)
    ]


def _summary_row(name, flat, scores, finite, is_ref, ref_sd, seconds, run):
    """The run's row of :attr:`Comparison.summary`, before its KSD (NaN here)
    and its sampler statistics: the number of draws, ``xi``, the largest biases,
    the smallest bulk ESS, its rate per second of ``seconds`` and the kernel's
    warnings."""
    sd = scores["sd"]
    min_ess = float(np.min(scores["ess"]["bulk"])) if finite else np.nan
    return dict(
        run=name,
        num_draws=flat.shape[0] * flat.shape[1],
        xi=np.nan
        if is_ref
        else float(np.linalg.norm(sd - ref_sd) / np.linalg.norm(ref_sd)),
        est_xi=_estimated_xi(run, flat, scores, finite),
        max_bias_mean=float(np.max(scores["bias_mean"])),
        max_bias_var=float(np.max(scores["bias_var"])),
        max_rel_bias_var=float(np.max(scores["rel_bias_var"])),
        min_ess_bulk=min_ess,
        ess_per_s=min_ess / seconds if seconds else np.nan,
        ksd=np.nan,
        sampling_time=np.nan if seconds is None else float(seconds),
        warnings=run_warnings(run),
    )


def _estimated_xi(run, flat, scores, finite):
    """The xi the run's kernel expects without a reference: its rule's bias law
    at the step it sampled at (``kernel.error_estimate``) beside the Monte
    Carlo error of these components' sds over all the run's draws ``flat``
    (:func:`~numpyro_sgbd.monitoring.convergence.sd_error`), weighted by their variances
    as xi weights them (:func:`~numpyro_sgbd.discretisation.estimate`); NaN
    where the kernel has no estimate."""
    found = error_estimate(run)
    if found is None or not finite:
        return np.nan
    errors, _ = convergence.sd_error(flat)
    law, step, tau2 = found["law"], found["step"], found["noise_sq"]
    return discretisation.estimate(law, step, tau2, errors, scores["sd"] ** 2)["xi"]


def _run_ksd(name, source, draws, ksd_draws, ksd_scale, ksd_standardise):
    """``(ksd, ksd_scale)``: the run's KSD of ``ksd_draws`` draws with full-data
    scores from ``source``, in coordinates divided by ``ksd_scale``; the scale is
    fixed by the first run to get here (the reference, whose row comes first):
    its unconstrained sds with ``ksd_standardise``, else 1. NaN, with a warning
    at :func:`compare`'s caller, where a draw maps to non-finite values."""
    try:
        x, s = _draws_and_scores(source, draws, ksd_draws)
    except ValueError as err:
        raise ValueError(f"KSD of run {name!r}: {err}") from err
    good = np.all(np.isfinite(x), axis=1) & np.all(np.isfinite(s), axis=1)
    if ksd_scale is None:
        ksd_scale = x[good].std(0, ddof=1) if ksd_standardise else 1.0
    if good.all():
        return ksd(x / ksd_scale, s * ksd_scale), ksd_scale
    warnings.warn(
        f"run {name!r}: {int((~good).sum())} of {good.size} draws map to "
        "non-finite unconstrained values or full-data scores (a draw on "
        "a support's boundary, or an overflowing likelihood); its KSD is "
        "NaN.",
        RuntimeWarning,
        stacklevel=3,
    )
    return np.nan, ksd_scale


def _statistics(stats):
    """The summary columns of a run's sampler statistics ``stats``: those of
    ``_STATS``, reduced as it says, and ``mean_<name>`` of any other numeric
    per-draw scalar (a new sampler's statistics reach the table without being
    registered here). All-NaN statistics (not estimated) reduce quietly."""
    columns = {}
    for field, column, reduce in _STATS:
        if field in stats:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                columns[column] = float(reduce(stats[field]))
    for field in sorted(set(stats) - _KNOWN_STATS):
        if np.issubdtype(np.asarray(stats[field]).dtype, np.number):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                columns[f"mean_{field}"] = float(np.nanmean(stats[field]))
    return columns


def _tables(rows, summaries):
    """``(per_parameter, summary)`` DataFrames of the rows, the summary's columns
    in their documented order: ``_SUMMARY``, the known statistics, the others."""
    per_parameter = pd.DataFrame(rows).set_index(["run", "parameter"])
    summary = pd.DataFrame(summaries).set_index("run")
    known = [c for _, c, _ in _STATS if c in summary]
    columns = (
        _SUMMARY + known + [c for c in summary if c not in _SUMMARY and c not in known]
    )
    return per_parameter, summary[columns]


def compare(
    candidates,
    reference,
    *,
    var_names=None,
    reference_name="reference",
    model=None,
    model_args=(),
    model_kwargs=None,
    ksd_draws=1000,
    ksd_standardise=True,
    wall_times=None,
    strict=False,
):
    r"""Accuracy of one or several runs against a reference posterior.

    For every scalar component :math:`j` of the compared variables, with
    :math:`\bar\theta_j, \hat v_j` a run's mean and variance and :math:`E\theta_j,
    \mathrm{sd}(\theta_j)` the reference's, this reports the standardised bias of
    the mean :math:`|\bar\theta_j - E\theta_j| / \mathrm{sd}(\theta_j)` and of the
    variance :math:`|\hat v_j - \mathrm{Var}\,\theta_j| / \mathrm{sd}(\theta_j)`
    (SGBD paper, supplement eq. 40), which has the parameter's units, and the
    scale-free :math:`|\hat v_j / \mathrm{Var}\,\theta_j - 1|`, the bulk and
    tail ESS and rank-normalised R-hat that ArviZ reports (computed by
    :func:`numpyro_sgbd.monitoring.convergence.summary`, as the kernels'
    convergence check
    computes them, so that a run's ESS is the same figure in its warning and
    here); over all
    components, the relative error of the posterior standard deviations
    :math:`\xi = \|\hat\sigma - \sigma_{\mathrm{ref}}\|_2 / \|\sigma_{\mathrm{ref}}\|_2`
    (tuning paper, Section 4.1), the largest biases, the smallest bulk ESS and the
    ESS per second of wall time where that is known. With a model, it adds the
    kernel Stein discrepancy of ``ksd_draws`` equally spaced draws with full-data
    scores (:func:`~numpyro_sgbd.posterior_ksd`, in unconstrained space, the same
    number of draws for every run, the reference included, so the values are
    comparable). By default the KSD is taken in coordinates standardised by the
    reference's unconstrained posterior sds: with the IMQ kernel's unit length scale
    and posterior sds far below 1, the raw KSD of a thousand draws measures mostly
    the size of the scores, not the accuracy (see
    :func:`~numpyro_sgbd.posterior_ksd`). The
    sampler statistics a run recorded (the SG kernels' ``potential_energy_estimate``,
    ``mean_noise_sd``, ``tolerance_exceeded``, ``num_nonfinite``; NUTS's
    ``diverging``) are summarised too. The reference has a row of its own.

    A run is an :class:`~numpyro.infer.mcmc.MCMC` object after ``run``, ArviZ data
    with a ``posterior`` group (an :class:`arviz.InferenceData` from ArviZ 0.x or
    an :class:`xarray.DataTree` from ArviZ 1.x, as ``az.from_numpyro`` and
    :func:`~numpyro_sgbd.reference_posterior` return them; its
    ``posterior.attrs["sampling_time"]``, as :func:`~numpyro_sgbd.reference_posterior`
    sets it, gives the wall time), or a dict of draws with the draws on the leading
    axis (as ``mcmc.get_samples()``). An :class:`~numpyro.infer.mcmc.MCMC` run of
    this package's kernels knows its wall time (compilation included, from host
    times the kernel notes every 256 steps); other runs' come from
    ``wall_times=`` or the ArviZ attribute, else ``ess_per_s`` is NaN.

    Scores are only as good as the reference. A reference from
    :func:`~numpyro_sgbd.reference_posterior` carries its own verdict
    (``posterior.attrs["trustworthy"]``); for any other, the largest rank-normalised
    R-hat must be below 1.01 and the smallest bulk ESS at least 100 per chain (a
    single chain is split in two for R-hat). An untrustworthy reference gives a
    ``UserWarning`` with its figures, ``reference_trustworthy=False`` and a first
    line in the printed table, or a ``ValueError`` with ``strict=True``.

    :param candidates: a run, a list of runs, or a dict ``{name: run}``.
    :param reference: the reference run (typically from
        :func:`~numpyro_sgbd.reference_posterior`).
    :param var_names: variables to compare (default: every variable of the
        reference). Each run must have them with the reference's shapes.
    :param str reference_name: the reference's row label.
    :param model: the NumPyro model, for the KSD. Default: the model of the first
        :class:`~numpyro.infer.mcmc.MCMC` candidate (with its data); with neither,
        the ``ksd`` column is NaN.
    :param tuple model_args: the model's positional arguments, with ``model``.
    :param dict model_kwargs: the model's keyword arguments, with ``model``.
    :param int ksd_draws: draws per run in the KSD (``0`` to skip it).
    :param bool ksd_standardise: standardise the KSD's coordinates by the
        reference's sds (default); ``False`` for raw coordinates, as the tuning
        paper's Table 1.
    :param dict wall_times: ``{name: seconds}``, overriding the runs' own.
    :param bool strict: raise instead of warn when the reference is not
        trustworthy.
    :return: a :class:`Comparison`; ``print`` it for a readable table.
    :raises ValueError: on mismatched variable names or shapes, a reference
        without finite draws, or (with ``strict=True``) an untrustworthy
        reference. A run with non-finite draws gets a NaN row and a
        warning naming it; a run whose draws map to non-finite unconstrained values
        or full-data scores gets a NaN KSD and a warning; the other rows are kept.

    **Example**

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> ref = {"x": rng.normal(size=4000)}
    >>> shifted = {"x": ref["x"] + 0.5 * ref["x"].std(ddof=1)}
    >>> table = compare({"shifted": shifted}, ref, ksd_draws=0)
    >>> round(float(table.summary.loc["shifted", "max_bias_mean"]), 3)
    0.5
    """
    runs = named_runs(candidates)
    wall_times = _checked_options(runs, reference_name, ksd_draws, wall_times)
    loaded, var_names = load_runs(reference_name, reference, runs, var_names)
    source = _ksd_source(model, model_args, model_kwargs, loaded)
    names, ref_flat = pooled(loaded[reference_name][0], var_names)
    if not np.all(np.isfinite(ref_flat)):
        raise ValueError("the reference has non-finite draws; it cannot be compared.")
    ref_all = ref_flat.reshape(-1, ref_flat.shape[-1])
    ref_mean, ref_sd = ref_all.mean(0), ref_all.std(0, ddof=1)
    trusted, figures = _reference_check(reference, ref_flat)
    if not trusted:
        _warn_untrusted(figures, strict)
    runs_by_name = {reference_name: reference, **runs}
    rows, summaries = [], []
    ksd_scale = None  # set from the reference, whose row comes first
    for name, (draws, stats, seconds, _) in loaded.items():
        seconds = wall_times.get(name, seconds)
        _, flat = pooled(draws, var_names)
        is_ref = name == reference_name
        finite = _finite(name, flat)
        scores = _scores(flat, finite, ref_mean, ref_sd, is_ref)
        rows += _parameter_rows(name, names, scores, ref_mean, ref_sd)
        summary = _summary_row(
            name, flat, scores, finite, is_ref, ref_sd, seconds, runs_by_name[name]
        )
        if finite and source is not None and ksd_draws:
            summary["ksd"], ksd_scale = _run_ksd(
                name, source, draws, ksd_draws, ksd_scale, ksd_standardise
            )
        summary.update(_statistics(stats))
        summaries.append(summary)
    return Comparison(*_tables(rows, summaries), trusted, figures)


def plot_marginals(candidates, reference, path, *, var_names=None, bins=40):
    """Overlay each run's marginal densities on the reference's and write a file.

    One panel per scalar component (as the SGBD paper's Figures 3 and 11), a
    step-histogram density per run, the reference in black. Runs are given as to
    :func:`compare`.

    :param candidates: a run, a list of runs, or a dict ``{name: run}``.
    :param reference: the reference run.
    :param path: the image file to write (any format matplotlib knows).
    :param var_names: variables to plot (default: all of the reference's).
    :param int bins: histogram bins per panel.
    :return: ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"reference": reference, **named_runs(candidates)}
    draws = {name: load_run(name, run)[0] for name, run in runs.items()}
    ref = draws["reference"]
    var_names = list(ref) if var_names is None else list(np.atleast_1d(var_names))
    for name, d in draws.items():
        check_shapes(name, d, ref, var_names)
    panels = []
    for var in var_names:
        for name, d in draws.items():
            names, flat = components(var, d[var])
            draws[name] = {**d, var: flat}
        panels += [(var, j, n) for j, n in enumerate(names)]
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False, constrained_layout=True
    )
    for (var, j, label), ax in zip(panels, axes.flat):
        values = {
            name: d[var][..., j].ravel()[np.isfinite(d[var][..., j].ravel())]
            for name, d in draws.items()
        }
        lo = min(np.quantile(v, 0.002) for v in values.values() if v.size)
        hi = max(np.quantile(v, 0.998) for v in values.values() if v.size)
        edges = np.linspace(lo, hi, bins + 1)
        for name, v in values.items():
            is_ref = name == "reference"
            ax.hist(
                v,
                bins=edges,
                density=True,
                histtype="step",
                color="black" if is_ref else None,
                linewidth=2.0 if is_ref else 1.2,
                label=name,
                zorder=3 if is_ref else 2,
            )
        ax.set_title(label)
        ax.set_yticks([])
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
