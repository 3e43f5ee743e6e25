"""Ground truth: the same model with every subsample plate widened to the full data.

:class:`full_batch` widens the plates; :func:`reference_posterior` runs NUTS on the
widened model, checks that it converged and caches the draws on disk;
:func:`full_batch_scores` evaluates the exact score at draws of any run, for the
kernel Stein discrepancy. (:func:`~numpyro_sgbd.mode.posterior_mode`, re-exported
here, lives in :mod:`numpyro_sgbd.mode`.) The Laplace map NUTS may run in
comes from :mod:`~numpyro_sgbd.evaluation.laplace`, the cache's keys and files
from :mod:`~numpyro_sgbd.evaluation.cache`.
"""

from functools import partial
import json
import logging
from pathlib import Path
import time
import warnings

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS, init_to_median

from numpyro_sgbd.enumeration import require_funsor
from numpyro_sgbd.estimators import as_jax_arrays
from numpyro_sgbd.evaluation import _arviz
from numpyro_sgbd.evaluation.cache import _cache_key, _load_cached, _save_cached
from numpyro_sgbd.evaluation.laplace import (
    _WELL_CONDITIONED,
    _laplace_choice,
    _whitened_nuts,
)
from numpyro_sgbd.evaluation.scores import _model_sites, full_batch_scores
from numpyro_sgbd.handlers import full_batch
from numpyro_sgbd.mode import LOCAL_SITES_REASON, PosteriorMode, posterior_mode
from numpyro_sgbd.monitoring.convergence import rhat_text
from numpyro_sgbd.validation import check_plate_data

__all__ = [
    "PosteriorMode",
    "full_batch",
    "full_batch_scores",
    "posterior_mode",
    "reference_posterior",
]

# A reference is trusted when every check passes (Vehtari et al. 2021 for R-hat and
# ESS; any divergence or saturated tree depth means NUTS may have missed mass).
RHAT_MAX = 1.01
ESS_PER_CHAIN_MIN = 100
_log = logging.getLogger("numpyro_sgbd")


def _check_count(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")


def _checked_settings(rng_key, **settings):
    """``(settings, rng_key)``: the arguments that make a reference, as its cache
    key and its record hold them (``laplace`` as ``"auto"`` or a bool, the key
    as a list of ints: its key data for a typed key), and the key itself
    (default ``random.key(0)``). A ``ValueError`` first for a bad count,
    ``target_accept_prob``, ``laplace`` or ``chain_method``, in that order."""
    _check_count(settings["num_warmup"], "num_warmup", 0)
    _check_count(settings["num_samples"], "num_samples", 1)
    _check_count(settings["num_chains"], "num_chains", 1)
    _check_count(settings["max_tree_depth"], "max_tree_depth", 1)
    target_accept_prob = settings["target_accept_prob"]
    if not 0 < target_accept_prob < 1:
        raise ValueError(
            f"target_accept_prob must lie in (0, 1), got {target_accept_prob!r}."
        )
    laplace = settings["laplace"]
    if isinstance(laplace, (bool, np.bool_)):
        settings["laplace"] = bool(laplace)
    elif not (isinstance(laplace, str) and laplace == "auto"):
        raise ValueError(f"laplace must be 'auto', True or False, got {laplace!r}.")
    chain_method = settings["chain_method"]
    if chain_method not in ("sequential", "parallel", "vectorized"):
        raise ValueError(
            "chain_method must be 'sequential', 'parallel' or 'vectorized', got "
            f"{chain_method!r}."
        )
    rng_key = random.key(0) if rng_key is None else rng_key
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        settings["rng_key"] = np.asarray(random.key_data(rng_key)).tolist()
    else:
        settings["rng_key"] = np.asarray(rng_key).tolist()
    return settings, rng_key


def _log_laplace(laplace, form, reason):
    """Log what ``laplace`` chose and why: at WARNING where ``"auto"`` fell
    back to plain NUTS after a failure, at INFO otherwise."""
    fallback = laplace == "auto" and form == "none"
    chosen = (_WELL_CONDITIONED, LOCAL_SITES_REASON)  # by choice, not a failure
    fallback = fallback and not reason.startswith(chosen)
    log = _log.warning if fallback else _log.info
    log("reference_posterior(laplace=%r): %s", laplace, reason)


# The extra fields reference_posterior records of every NUTS transition.
_FIELDS = ("potential_energy", "diverging", "num_steps", "accept_prob")
_FIELDS += ("adapt_state.step_size",)


def _mcmc(settings, progress_bar, **nuts):
    """The :class:`~numpyro.infer.mcmc.MCMC` of a NUTS kernel (``nuts``: its
    model or potential) with the ``settings`` of :func:`_checked_settings`."""
    kernel = NUTS(
        **nuts,
        dense_mass=settings["dense_mass"],
        target_accept_prob=settings["target_accept_prob"],
        max_tree_depth=settings["max_tree_depth"],
    )
    return MCMC(
        kernel,
        num_warmup=settings["num_warmup"],
        num_samples=settings["num_samples"],
        num_chains=settings["num_chains"],
        chain_method=settings["chain_method"],
        progress_bar=progress_bar,
    )


def _run_nuts(widened, data, keys, laplace_map, kept, settings, progress_bar):
    """``(posterior, stats)``: NUTS on the ``widened`` model with its ``data``
    (``(model_args, model_kwargs)``) and ``keys`` ``(init, run)``, its ``kept``
    sites grouped by chain, and its extra fields, every draw computed (for the
    wall time). With no Laplace map (``laplace_map``: the map, or ``None``,
    and the flat vector's unflattening) from the prior median; with one, in its
    coordinates u (``z = loc + W u``) from independent draws of the Laplace
    approximation, u ~ N(0, I), the sites mapped back."""
    (model_args, model_kwargs), (key_init, key_run) = data, keys
    whitening, unravel = laplace_map
    if whitening is None:
        init = init_to_median
        mcmc = _mcmc(settings, progress_bar, model=widened, init_strategy=init)
        mcmc.run(key_run, *model_args, extra_fields=_FIELDS, **model_kwargs)
        samples = mcmc.get_samples(group_by_chain=True)
        posterior = {name: samples[name] for name in kept}
    else:
        potential_fn, to_posterior = _whitened_nuts(
            widened, model_args, model_kwargs, whitening, unravel
        )
        num_chains = settings["num_chains"]
        shape = (num_chains, whitening.loc.shape[0])
        u0 = random.normal(key_init, shape, whitening.loc.dtype)
        mcmc = _mcmc(settings, progress_bar, potential_fn=potential_fn)
        mcmc.run(
            key_run,
            init_params=u0 if num_chains > 1 else u0[0],
            extra_fields=_FIELDS,
        )
        values = to_posterior(mcmc.get_samples(group_by_chain=True))
        posterior = {name: values[name] for name in kept}
    stats = mcmc.get_extra_fields(group_by_chain=True)
    for value in jax.tree.leaves(posterior):
        value.block_until_ready()
    return posterior, stats


def _record(posterior, stats, latent, settings, seconds, form, reason):
    """``(attrs, posterior, sample_stats)`` as stored: the draws and ArviZ's
    sample statistics as NumPy arrays, and the posterior's attributes (the
    convergence figures of the ``latent`` draws, the wall time, the Laplace
    choice and the ``settings`` as JSON)."""
    num_steps = np.asarray(stats["num_steps"])
    sample_stats = {
        "lp": -np.asarray(stats["potential_energy"]),
        "diverging": np.asarray(stats["diverging"]),
        "n_steps": num_steps,
        "tree_depth": np.floor(np.log2(np.maximum(num_steps, 1))).astype(int) + 1,
        "acceptance_rate": np.asarray(stats["accept_prob"]),
        "step_size": np.asarray(stats["adapt_state.step_size"]),
    }
    posterior = {k: np.asarray(v) for k, v in posterior.items()}
    attrs = _diagnose(
        {k: posterior[k] for k in latent},
        sample_stats["diverging"],
        num_steps,
        settings["max_tree_depth"],
        settings["num_chains"],
    )
    attrs.update(
        sampling_time=seconds,
        num_warmup=settings["num_warmup"],
        laplace=form,
        laplace_reason=reason,
        # NUTS's adapted step size (the median over chains), for the advice.
        step_size=float(np.median(sample_stats["step_size"])),
        dense_mass=int(settings["dense_mass"]),
        # What made it, for a reference loaded from the cache (netCDF attributes
        # hold strings, not dicts).
        settings=json.dumps(settings, sort_keys=True),
    )
    return attrs, posterior, sample_stats


def reference_posterior(
    model,
    *model_args,
    num_warmup=1000,
    num_samples=1000,
    num_chains=2,
    rng_key=None,
    chain_method="sequential",
    dense_mass=False,
    laplace="auto",
    target_accept_prob=0.8,
    max_tree_depth=10,
    cache_dir=None,
    strict=False,
    progress_bar=False,
    **model_kwargs,
):
    r"""The exact posterior of ``model`` by NUTS over all the data, as ArviZ data.

    NUTS runs on :class:`full_batch(model) <full_batch>`, the same model code with
    every subsample plate widened to its full size. The result is only ground truth
    if NUTS converged, so every run is checked: the largest R-hat (must be below
    1.01), the smallest bulk and tail ESS (at least 100 per chain), the number of
    divergent transitions (none) and the fraction of draws that hit
    ``max_tree_depth`` (none). A failed check warns with the figures and what to
    try, or raises with ``strict=True``. The figures are stored in
    ``idata.posterior.attrs`` (``max_rhat``, ``min_ess_bulk``, ``min_ess_tail``,
    ``num_divergent``, ``frac_max_tree_depth``, ``trustworthy``) together with
    ``sampling_time`` (seconds, as PyMC and ArviZ name it), ``step_size`` (NUTS's
    adapted step size), ``laplace`` and ``laplace_reason`` (below) and
    ``settings``, the arguments that made it (JSON).

    **Ill-conditioned posteriors.** NumPyro's mass-matrix adaptation starts from the
    identity and shrinks the adapted (co)variance towards it with weight about
    :math:`5\cdot 10^{-3}/(n+5)` for a window of n draws, which swamps posterior
    variances far below 1e-3; a diagonal mass matrix cannot remove correlations.
    On such posteriors (large-N regressions on raw or collinear covariates) NUTS
    needs its maximal tree depth and does not converge. So by default
    (``laplace="auto"``) the posterior mode :math:`\hat z` and the Hessian :math:`H`
    of the potential there are found first (damped Newton in unconstrained space),
    and NUTS runs in whitened coordinates :math:`u` with :math:`z = \hat z + W u`,
    :math:`W W^\top \approx H^{-1}` (the Laplace covariance) when any of these
    holds there: the posterior is ill-conditioned (the scaled Hessian
    :math:`D^{-1/2} H D^{-1/2}`, :math:`D` its diagonal, has a condition number of
    at least :data:`~numpyro_sgbd.evaluation.laplace.AUTO_CONDITION`), the Laplace
    sds :math:`\sqrt{(H^{-1})_{jj}}` span a ratio above
    :data:`~numpyro_sgbd.evaluation.laplace.AUTO_SD_RATIO`, or the shrinkage of the
    last adaptation window would add more than
    :data:`~numpyro_sgbd.evaluation.laplace.AUTO_SHRINKAGE` of the smallest Laplace
    variance. A well-conditioned posterior keeps plain NUTS (the same draws as
    ``laplace=False``).

    :math:`W` is factored in float64 on the host, as the kernels' preconditioner
    is, on a ladder. Up to
    :data:`~numpyro_sgbd.evaluation.laplace.LAPLACE_DENSE_MAX_DIM` parameters it is
    dense, from the eigendecomposition of the scaled Hessian, used as it is where
    that is positive definite in float64 (condition numbers of 10^7 and more from
    a float32 Hessian included), its eigenvalues floored at the Hessian's own
    resolution (d times its dtype's machine epsilon, relative to the largest) where
    rounding made some zero or negative. Above that size it is
    :func:`~numpyro_sgbd.preconditioning.lowrank`'s diagonal plus low-rank map, and
    the sds judged are the conditional ones, :math:`H_{jj}^{-1/2}`. Where neither
    factor exists (an eigenvalue or Ritz value clearly negative) it is the
    diagonal :math:`D^{-1/2}`. Plain NUTS is left only where no map exists: the
    mode search failed or the Hessian's diagonal is not positive (the
    ``numpyro_sgbd`` logger says so at WARNING).
    ``laplace=True`` whitens whatever the figures and raises where ``"auto"``
    falls back; ``laplace=False`` is plain NUTS. In :math:`u` the posterior has
    roughly unit variances, so the shrinkage is harmless, and ``dense_mass=True``
    still adapts the remaining correlation. The chains start at independent draws
    from the Laplace approximation. What was chosen and why (the measured figures,
    the rung of the ladder) is in ``idata.posterior.attrs["laplace"]``
    (``"dense"``, ``"lowrank"``, ``"diagonal"`` or ``"none"``) and
    ``["laplace_reason"]``, and logged at INFO by the ``numpyro_sgbd`` logger.
    A reference that fails its checks warns with the settings that would change
    it, chosen from what it measured (the fraction of draws at the maximal tree
    depth, the adapted step size, divergences, R-hat and ESS) among those it did
    not use (``laplace``, ``dense_mass``, ``max_tree_depth``,
    ``target_accept_prob``, ``num_warmup``).

    **Cache.** With ``cache_dir`` the result is written there as netCDF, in ArviZ's
    layout (one HDF5 group per ArviZ group, through h5netcdf), under a key that
    hashes the model's source code, its default arguments and closure values (and
    those of the functions it closes over), the data (every array's bytes), all the
    settings above (``laplace="auto"`` as given, not what it chose) and the NumPyro
    and JAX versions. A later call with the same key
    loads the file instead of sampling; the ArviZ version is not part of the key,
    and a file written under ArviZ 0.x loads under 1.x and the other way round. A
    file that cannot be read is sampled again and overwritten, with a warning.
    Functions the model calls by global name are not part of the key: after
    editing one, delete the file or change ``cache_dir``.

    :param model: the NumPyro model, with its data in subsample plates.
    :param model_args: the model's positional arguments (the data).
    :param int num_warmup: NUTS warmup (adaptation) iterations per chain.
    :param int num_samples: draws kept per chain.
    :param int num_chains: number of chains (at least 2 to check convergence).
    :param rng_key: a JAX random key (default ``jax.random.key(0)``).
    :param str chain_method: as :class:`~numpyro.infer.mcmc.MCMC`.
    :param bool dense_mass: adapt a dense mass matrix (in whitened coordinates when
        the Laplace map is used).
    :param laplace: ``"auto"`` (default): precondition by the Laplace covariance
        at the mode when NUTS needs it there (ill-conditioned, or scales it
        cannot adapt to); ``True``: always; ``False``: plain NUTS (see above).
    :param float target_accept_prob: as :class:`~numpyro.infer.hmc.NUTS`.
    :param int max_tree_depth: as :class:`~numpyro.infer.hmc.NUTS`.
    :param cache_dir: a folder for cached references, or ``None`` for no cache.
    :param bool strict: raise instead of warn when a check fails.
    :param bool progress_bar: show NumPyro's progress bar.
    :param model_kwargs: the model's keyword arguments.
    :return: the installed ArviZ's container, as ``az.from_numpyro`` returns it:
        an :class:`arviz.InferenceData` under ArviZ 0.x, an
        :class:`xarray.DataTree` under ArviZ 1.x. Either way ``.posterior`` holds
        the latent sites and the deterministic sites outside the data plates,
        constrained, and ``.sample_stats`` holds ``lp``, ``diverging``,
        ``n_steps``, ``tree_depth``, ``acceptance_rate`` and ``step_size``.
    :raises RuntimeError: with ``strict=True``, when a convergence check fails.

    **References**

    1. Hoffman, M. D. & Gelman, A. (2014). *The No-U-Turn Sampler.* JMLR.
    2. Vehtari, A., Gelman, A., Simpson, D., Carpenter, B. & Buerkner, P.-C. (2021).
       *Rank-normalization, folding, and localization: an improved R-hat.* Bayesian
       Analysis.
    3. Beskos, A., Pillai, N., Roberts, G., Sanz-Serna, J.-M. & Stuart, A. (2013).
       *Optimal tuning of the hybrid Monte Carlo algorithm.* Bernoulli 19(5A).

    **Example**

    >>> import jax, numpyro, numpyro.distributions as dist
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=10) as idx:
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = 2.0 + jax.random.normal(jax.random.key(0), (100,))
    >>> idata = reference_posterior(model, y)
    >>> bool(idata.posterior.attrs["trustworthy"])
    True
    >>> abs(float(idata.posterior["mu"].mean()) - float(y.mean())) < 0.05
    True
    """
    settings, rng_key = _checked_settings(
        rng_key,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method=chain_method,
        dense_mass=dense_mass,
        laplace=laplace,
        target_accept_prob=target_accept_prob,
        max_tree_depth=max_tree_depth,
    )
    laplace = settings["laplace"]
    path = None
    if cache_dir is not None:
        key = _cache_key(model, model_args, model_kwargs, settings)
        path = Path(cache_dir) / f"reference-{key}.nc"
        idata = _load_cached(path)
        if idata is not None:
            _report(idata.posterior.attrs, strict, loaded_from=path)
            return idata

    # After the cache: a cached reference was made from these very data (their
    # bytes are in its key), which passed this check then.
    check_plate_data(model, model_args, model_kwargs)
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    latent, kept, _, enumerate_dim = _model_sites(model, model_args, model_kwargs)
    if not latent:
        raise ValueError("model has no latent sample site: nothing to sample.")
    if enumerate_dim is not None and laplace is not True:
        require_funsor("The model")  # plain NUTS on it
    key_init, key_run = random.split(rng_key)
    start = time.perf_counter()
    whitening, form, reason, unravel = None, "none", "laplace=False: plain NUTS", None
    if laplace is not False:
        whitening, form, reason, unravel = _laplace_choice(
            model, model_args, model_kwargs, key_init, laplace, num_warmup
        )
    _log_laplace(laplace, form, reason)
    posterior, stats = _run_nuts(
        full_batch(model),
        (model_args, model_kwargs),
        (key_init, key_run),
        (whitening, unravel),
        kept,
        settings,
        progress_bar,
    )
    seconds = time.perf_counter() - start
    attrs, posterior, sample_stats = _record(
        posterior, stats, latent, settings, seconds, form, reason
    )
    _report(attrs, strict)
    idata = _arviz.from_dict(
        {"posterior": posterior, "sample_stats": sample_stats},
        attrs={"posterior": attrs},
    )
    if path is not None:
        _save_cached(idata, path)
    return idata


def _diagnose(latent, diverging, num_steps, max_tree_depth, num_chains):
    """Convergence figures of the latent draws ``{name: (chain, draw, ...)}``."""

    def extreme(diagnostic, fn):
        values = [np.ravel(diagnostic(v)) for v in latent.values()]
        values = np.concatenate(values) if values else np.array([np.nan])
        return float(fn(values)) if np.any(np.isfinite(values)) else float("nan")

    max_rhat = extreme(_arviz.rhat, np.nanmax) if num_chains > 1 else float("nan")
    # NumPyro counts leapfrog steps; a tree of depth D takes 2^D - 1 of them.
    saturated = float(np.mean(num_steps >= 2**max_tree_depth - 1))
    return dict(
        max_rhat=max_rhat,
        min_ess_bulk=extreme(partial(_arviz.ess, method="bulk"), np.nanmin),
        min_ess_tail=extreme(partial(_arviz.ess, method="tail"), np.nanmin),
        num_divergent=int(np.sum(diverging)),
        frac_max_tree_depth=saturated,
        num_chains=num_chains,
        max_tree_depth=max_tree_depth,
    )


def _report(attrs, strict, loaded_from=None):
    """Warn (or raise) when the reference failed a convergence check."""
    chains = int(attrs["num_chains"])
    problems = []
    if chains < 2:
        problems.append("one chain only, so R-hat cannot be checked (num_chains=2+)")
    elif not attrs["max_rhat"] < RHAT_MAX:
        problems.append(f"max R-hat {rhat_text(attrs['max_rhat'])} >= {RHAT_MAX}")
    for kind in ("bulk", "tail"):
        ess = attrs[f"min_ess_{kind}"]
        if not ess >= ESS_PER_CHAIN_MIN * chains:
            problems.append(
                f"min {kind} ESS {ess:.0f} < {ESS_PER_CHAIN_MIN * chains} "
                f"({ESS_PER_CHAIN_MIN} per chain)"
            )
    if attrs["num_divergent"] > 0:
        problems.append(f"{attrs['num_divergent']} divergent transitions")
    if attrs["frac_max_tree_depth"] > 0:
        problems.append(
            f"{100 * attrs['frac_max_tree_depth']:.1f}% of draws at max_tree_depth="
            f"{attrs['max_tree_depth']}"
        )
    attrs["trustworthy"] = int(not problems)
    if not problems:
        return
    where = f" (loaded from {loaded_from})" if loaded_from else ""
    message = (
        f"The NUTS reference posterior{where} is not trustworthy: "
        + "; ".join(problems)
        + ". "
        + _advice(attrs)
    )
    if strict:
        raise RuntimeError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


# An adapted NUTS step size below this (in the coordinates NUTS ran in, its mass
# matrix applied) means a scale or correlation NUTS's metric did not fit: where the
# metric fits, the step is of order d^-1/4 (Beskos et al. 2013), about 0.2 at d = 1000.
SMALL_STEP = 0.02


def _laplace_form(attrs):
    """``(form, setting, reason)``: the map the reference ran in, the ``laplace``
    it was given and why it chose so (a cache written before ``"auto"`` held 0 or
    1)."""
    form = attrs.get("laplace", 0)
    if isinstance(form, (int, np.integer)):
        form = "dense" if form else "none"
    setting = json.loads(attrs.get("settings", "{}")).get("laplace", False)
    return form, setting, str(attrs.get("laplace_reason", ""))


def _scale_tips(attrs, form, setting, reason):
    """The settings that would let NUTS's trajectories fit the posterior's scales
    and correlations, of those the reference did not use."""
    tips = []
    if form == "none" and setting is False:
        tips.append(
            "laplace='auto' (the default) or laplace=True, NUTS in coordinates "
            "whitened by the Laplace covariance at the mode"
        )
    elif form == "none" and reason.startswith(LOCAL_SITES_REASON):
        tips.append(
            "the local sites non-centred (numpyro.handlers.reparam with "
            "numpyro.infer.reparam.LocScaleReparam(0)), where a scale parameter "
            "makes a funnel of them"
        )
    elif form == "none" and reason.startswith(_WELL_CONDITIONED):
        tips.append(
            "laplace=True (the Laplace approximation is well conditioned, so a "
            "funnel or a scale that varies is more likely: a reparametrisation)"
        )
    elif form == "none":
        tips.append(f"checking the model's priors: no Laplace map was built ({reason})")
    if not attrs.get("dense_mass", 0):
        tips.append(
            "dense_mass=True (it adapts the correlations left, d(d+1)/2 "
            "covariances from the warmup draws)"
        )
    if attrs["frac_max_tree_depth"] > 0:
        tips.append(f"max_tree_depth={int(attrs['max_tree_depth']) + 2}")
    return tips


def _advice(attrs):
    """What to try, chosen from what the failed reference measured (tree depth,
    step size, divergences, R-hat and ESS) and from the settings it did not use."""
    form, setting, reason = _laplace_form(attrs)
    settings = json.loads(attrs.get("settings", "{}"))
    step = float(attrs.get("step_size", np.nan))
    deep = attrs["frac_max_tree_depth"] > 0 or step < SMALL_STEP
    tips = _scale_tips(attrs, form, setting, reason) if deep else []
    if attrs["num_divergent"] > 0:
        accept = float(settings.get("target_accept_prob", 0.8))
        tips.append(
            f"target_accept_prob={min(0.99, 1 - (1 - accept) / 2):.3g} (was "
            f"{accept:.3g}) for the divergences, or a reparametrisation (a funnel)"
        )
    if not tips:  # slow mixing only: longer adaptation and more draws
        warmup = int(attrs.get("num_warmup", settings.get("num_warmup", 1000)))
        figures = [
            f"{name} {text(attrs[key])}"
            for name, key, text in (
                ("R-hat", "max_rhat", rhat_text),
                ("bulk ESS", "min_ess_bulk", lambda x: f"{x:.0f}"),
            )
            if np.isfinite(attrs[key])
        ]
        tips.append(
            f"num_warmup={2 * max(warmup, 500)} and more num_samples"
            + (f" ({', '.join(figures)})" if figures else "")
        )
    measured = (
        f"{100 * attrs['frac_max_tree_depth']:.0f}% of draws at the maximal tree "
        "depth" + (f", adapted step size {step:.2g}" if np.isfinite(step) else "")
    )
    if form != "none" and (deep or attrs["num_divergent"] > 0):
        lead = (
            f"NUTS already ran in coordinates whitened by the {form} Laplace map "
            f"({measured}), so the posterior is far from Gaussian (skewed, "
            "heavy-tailed or multimodal) or the map's scales are off"
        )
    elif setting == "auto" and reason.startswith(_WELL_CONDITIONED):
        lead = (
            "The Laplace approximation at the mode is well conditioned, so scale "
            f"is not the trouble ({measured})"
        )
    elif form != "none":
        lead = f"NUTS ran whitened by the {form} Laplace map ({measured})"
    else:
        lead = f"NUTS ran without a Laplace map ({measured})"
    return f"{lead}. Try " + "; ".join(tips) + "."
