"""Model criticism over every data row: the pointwise log-likelihood of all N rows,
computed in chunks, and ArviZ data that carry it.

``az.from_numpyro(mcmc)`` on a stochastic-gradient run evaluates the log-likelihood
through the kernel's :attr:`~numpyro_sgbd.SGBD.model`, whose subsample plates hold
every row by default up to
:data:`~numpyro_sgbd.prepare.LOG_LIKELIHOOD_ALL_ROWS` rows (a fixed random subset
of that many above it, with a warning; ``log_likelihood_size`` sets the number),
so ``az.loo`` and ``az.waic`` estimate the elpd of all the data, computed by NumPyro
one draw at a time over all the rows. :func:`full_data_log_likelihood` evaluates
every row under :class:`~numpyro_sgbd.full_batch`, a chunk of rows at a time (all
draws of a chunk at once), and :func:`from_numpyro` puts the result in the
``log_likelihood`` group, with attributes saying which rows it holds.
"""

from functools import partial
import math
import warnings

import arviz as az
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.infer import init_to_sample

from numpyro_sgbd.estimators import as_jax_arrays, split_arrays
from numpyro_sgbd.evaluation import _arviz
from numpyro_sgbd.handlers import fix_plates, full_batch, subsample_plates
from numpyro_sgbd.monitoring.checks import check
from numpyro_sgbd.monitoring.run import Monitored
from numpyro_sgbd.prepare import LogLikelihoodSubsetWarning

__all__ = ["LOG_LIKELIHOOD_ROWS", "from_numpyro", "full_data_log_likelihood"]

#: The values of :func:`from_numpyro`'s ``log_likelihood`` argument (besides
#: ``False``) and of the ``log_likelihood_rows`` attribute it writes.
LOG_LIKELIHOOD_ROWS = ("all", "subset")

# Default memory budget of one chunk, in data rows x draws (as full_batch_scores).
_CHUNK_ELEMENTS = 4_000_000


def _check_chunk_size(chunk_size):
    if chunk_size is not None and not (
        isinstance(chunk_size, (int, np.integer))
        and not isinstance(chunk_size, bool)
        and chunk_size > 0
    ):
        raise ValueError(
            f"chunk_size must be a positive int (or None), got {chunk_size!r}."
        )


def _layout(model, model_args, model_kwargs):
    """``(plates, latent, global_sites, observed)`` of ``model``, from one trace with
    prior values: ``plates`` maps each subsample plate's name to its size N,
    ``latent`` lists the latent sample sites, ``global_sites`` the latent and
    deterministic sites outside every subsample plate (the ones to substitute), and
    ``observed`` maps each observed site to the frame of its subsample plate, or
    ``None`` outside them.

    A plate counts as subsampled when its declared ``subsample_size`` is below its
    size, whatever indices a handler has given it, so a kernel's
    :attr:`~numpyro_sgbd.SGBD.model` (its plate substituted with the evaluation
    subset) is laid out as the model as written.
    """
    # init_to_sample also values sites that cannot be sampled (ImproperUniform).
    traced = handlers.substitute(handlers.seed(model, 0), substitute_fn=init_to_sample)
    trace = handlers.trace(traced).get_trace(*model_args, **model_kwargs)
    plates = {name: size for name, (size, _) in subsample_plates(trace).items()}
    latent, global_sites, observed = [], [], {}
    for name, site in trace.items():
        if site["type"] not in ("sample", "deterministic"):
            continue
        frames = [f for f in site["cond_indep_stack"] if f.name in plates]
        if site["type"] == "sample" and site["is_observed"]:
            observed[name] = frames[0] if frames else None
            continue
        if site["type"] == "sample":
            latent.append(name)
        if not frames:
            global_sites.append(name)
    return plates, latent, global_sites, observed


def _check_one_plate(plates):
    """A ``ValueError`` for a model that subsamples more than one plate: the
    rows are evaluated in chunks of one plate's."""
    if len(plates) > 1:
        raise ValueError(
            "full_data_log_likelihood evaluates the rows of one subsample plate in "
            f"chunks; the model subsamples {sorted(plates)}. Subsample one plate "
            "(drop subsample_size from the others), or evaluate "
            "numpyro.infer.util.log_likelihood(full_batch(model), ...) without "
            "chunks (memory O(draws x N)); from_numpyro takes "
            "log_likelihood='subset' for ArviZ's group over the evaluation subset."
        )


def _flat_draws(posterior_samples, latent, global_sites, batch_ndims):
    """``(params, batch_shape)``: the draws of the ``global_sites`` (those of
    ``posterior_samples`` that are substituted) with their ``batch_ndims``
    leading batch axes flattened into one, and that batch shape. A
    ``ValueError`` where a ``latent`` site is missing or the draws disagree on
    their batch shape."""
    missing = [name for name in latent if name not in posterior_samples]
    if missing:
        raise ValueError(
            f"posterior_samples lacks the latent site(s) {missing}; pass every "
            "latent sample site of the model (as mcmc.get_samples() returns them)."
        )
    params = {
        name: jnp.asarray(posterior_samples[name])
        for name in global_sites
        if name in posterior_samples
    }
    batch_shapes = {name: jnp.shape(v)[:batch_ndims] for name, v in params.items()}
    if len(set(batch_shapes.values())) > 1 or any(
        jnp.ndim(v) < batch_ndims for v in params.values()
    ):
        raise ValueError(
            f"every site in posterior_samples needs the same {batch_ndims} leading "
            f"batch axes (batch_ndims={batch_ndims}); got shapes "
            f"{ {k: tuple(jnp.shape(v)) for k, v in params.items()} }."
        )
    batch_shape = next(iter(batch_shapes.values()), (1,) * batch_ndims)
    num_draws = math.prod(batch_shape)
    params = {
        k: jnp.reshape(v, (num_draws,) + jnp.shape(v)[batch_ndims:])
        for k, v in params.items()
    }
    return params, batch_shape


def _one_draw(widened, observed, theta, indices, args, kwargs):
    """The unscaled log-densities of the ``observed`` sites (as
    :func:`numpyro.infer.util.log_likelihood` returns them) of the ``widened``
    model at the draw ``theta``, on the plate rows ``indices`` (``None``: all)."""
    fn = handlers.substitute(widened, data=theta)
    if indices:
        # Outermost, so these indices win over any given to the plate inside.
        fn = fix_plates(fn, indices)
    trace = handlers.trace(fn).get_trace(*args, **kwargs)
    return {s: trace[s]["fn"].log_prob(trace[s]["value"]) for s in observed}


def _draws_at(widened, observed, rebuild, params, indices, arrays):
    """:func:`_one_draw` of every draw in ``params`` (leading axis), the model's
    arguments rebuilt from their array leaves ``arrays``."""
    args, kwargs = rebuild(arrays)
    one = partial(_one_draw, widened, observed)
    return jax.vmap(one, (0, None, None, None))(params, indices, args, kwargs)


def _chunk(draws_at, plate, c, params, start, arrays):
    """``draws_at`` (:func:`_draws_at`) on the ``c`` rows of ``plate`` from
    ``start``."""
    return draws_at(params, {plate: start + jnp.arange(c)}, arrays)


def _row_axes(observed, shapes, plate, c):
    """``{site: axis}``: the axis of each in-plate site's rows in a chunk's
    result ``shapes`` (after the draws'); a ``ValueError`` for a site with no
    axis of the chunk's ``c`` rows."""
    axes = {}
    for site, frame in observed.items():
        if frame is None:
            continue
        shape = shapes[site].shape
        axis = len(shape) + frame.dim
        if axis < 1 or shape[axis] != c:
            raise ValueError(
                f"Site '{site}' is in the subsample plate '{plate}', but its "
                f"log-density has shape {shape[1:]} for a chunk of {c} rows, with no "
                f"axis of the plate (dim={frame.dim}); give the site one "
                "log-density per row of the plate."
            )
        axes[site] = axis
    return axes


def _write_chunk(chunk, params, arrays, axes, size, c, k, rows):
    """``rows`` with chunk ``k`` written in (the last shifted back to end at row
    ``size``, overlapping the one before)."""
    start = jnp.minimum(k * c, size - c)
    part = chunk(params, start, arrays)
    return {
        s: lax.dynamic_update_slice_in_dim(rows[s], part[s], start, axis)
        for s, axis in axes.items()
    }


def _all_rows(chunk, observed, axes, shapes, size, c, params, arrays):
    """Every ``observed`` site's log-densities of all ``size`` rows, a
    :func:`_chunk` of ``c`` rows at a time written into the result; the sites
    outside the plate (not in ``axes``) once per draw, from the first chunk."""
    out = {}
    if len(axes) < len(observed):  # sites outside the plate: once per draw
        first = chunk(params, 0, arrays)
        out = {s: first[s] for s in observed if s not in axes}
    rows = {
        s: jnp.zeros(
            shapes[s].shape[:axis] + (size,) + shapes[s].shape[axis + 1 :],
            shapes[s].dtype,
        )
        for s, axis in axes.items()
    }
    body = partial(_write_chunk, chunk, params, arrays, axes, size, c)
    out.update(lax.fori_loop(0, -(-size // c), body, rows))
    return out


def full_data_log_likelihood(
    model,
    posterior_samples,
    *model_args,
    batch_ndims=1,
    chunk_size=None,
    **model_kwargs,
):
    r"""The pointwise log-likelihood of every data row, computed in chunks of rows.

    For each draw :math:`\theta_k` and each observed site, the log-density
    :math:`\log p(y_i \mid \theta_k)` of every row :math:`i = 1..N` of the model's
    subsample plate, as :func:`numpyro.infer.util.log_likelihood` gives it for
    :class:`full_batch(model) <numpyro_sgbd.full_batch>` (unscaled: no N/n), the
    input of PSIS-LOO and WAIC over all the data (``az.loo``, ``az.waic``). The
    plate is evaluated on ``chunk_size`` rows at a time (all draws of a chunk at
    once), and each chunk written into the result, so memory beyond the result is
    O(draws x ``chunk_size``), never O(draws x N) or more. The last chunk is shifted
    back to end at row N (it overlaps the one before rather than being padded).

    Observed sites outside the subsample plate (a global summary, say) are
    evaluated once per draw, with their own shape. A model without a subsample plate
    is evaluated in one pass per draw. The arguments are those of
    :func:`numpyro.infer.util.log_likelihood`, plus ``chunk_size``.

    :param model: the NumPyro model as written, with its data in one subsample plate
        ``numpyro.plate(name, N, subsample_size=n)`` (a kernel's
        :attr:`~numpyro_sgbd.SGBD.model` will do too: its evaluation subset is
        overridden).
    :param dict posterior_samples: ``{site: draws}``, with ``batch_ndims`` leading
        batch axes, for every latent sample site, as
        :meth:`MCMC.get_samples() <numpyro.infer.mcmc.MCMC.get_samples>` returns them
        (deterministic sites outside the plate are substituted too; other keys are
        ignored).
    :param model_args: the model's positional arguments (the data).
    :param int batch_ndims: the number of leading batch axes of the draws: 1 for
        ``(num_samples, ...)``, 2 for ``(num_chains, num_samples, ...)``, 0 for a
        single draw.
    :param int chunk_size: data rows per chunk; default keeps draws x rows near
        4e6.
    :param model_kwargs: the model's keyword arguments.
    :return: ``{observed site: array}``, each of shape ``batch_shape + (N,)`` for a
        site of one datum per row (in general the site's log-density shape under
        :class:`~numpyro_sgbd.full_batch`), rows in the data's order.
    :raises ValueError: for a model that subsamples more than one plate, for draws
        that lack a latent site or disagree on their batch shape, and for a bad
        ``chunk_size`` or ``batch_ndims``.

    **References**

    1. Vehtari, Gelman & Gabry (2017), *Practical Bayesian model evaluation using
       leave-one-out cross-validation and WAIC*, Statistics and Computing 27:
       Section 2 (the pointwise log-likelihood both estimators take).

    >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer.util import log_likelihood
    >>> from numpyro_sgbd import full_batch
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=2) as idx:
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = jnp.arange(5.0)
    >>> draws = {"mu": jnp.array([0.0, 1.0, 2.0])}
    >>> ll = full_data_log_likelihood(model, draws, y, chunk_size=2)
    >>> ll["y"].shape  # 3 draws x all 5 rows, in chunks of 2
    (3, 5)
    >>> exact = log_likelihood(full_batch(model), draws, y)["y"]
    >>> bool(jnp.allclose(ll["y"], exact))
    True
    """
    _check_chunk_size(chunk_size)
    if not (isinstance(batch_ndims, int) and batch_ndims >= 0):
        raise ValueError(f"batch_ndims must be an int >= 0, got {batch_ndims!r}.")
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
    plates, latent, global_sites, observed = _layout(model, model_args, model_kwargs)
    _check_one_plate(plates)
    params, batch_shape = _flat_draws(
        posterior_samples, latent, global_sites, batch_ndims
    )
    if not observed:
        return {}

    arrays, rebuild, _ = split_arrays((model_args, model_kwargs))
    draws_at = partial(_draws_at, full_batch(model), observed, rebuild)
    if not plates:
        result = jax.jit(draws_at, static_argnums=1)(params, None, arrays)
        return {s: jnp.reshape(v, batch_shape + v.shape[1:]) for s, v in result.items()}

    ((plate, size),) = plates.items()
    if chunk_size is None:
        chunk_size = max(1, _CHUNK_ELEMENTS // math.prod(batch_shape))
    c = int(min(chunk_size, size))
    chunk = partial(_chunk, draws_at, plate, c)
    shapes = jax.eval_shape(chunk, params, 0, arrays)
    axes = _row_axes(observed, shapes, plate, c)
    run = jax.jit(partial(_all_rows, chunk, observed, axes, shapes, size, c))
    result = run(params, arrays)
    return {
        s: jnp.reshape(result[s], batch_shape + result[s].shape[1:]) for s in observed
    }


def _check_log_likelihood(log_likelihood):
    if log_likelihood is not False and log_likelihood not in LOG_LIKELIHOOD_ROWS:
        raise ValueError(
            "log_likelihood must be 'all' (every data row, computed in chunks), "
            "'subset' (ArviZ's group over the kernel's fixed evaluation subset) or "
            f"False (no log_likelihood group), got {log_likelihood!r}."
        )


def from_numpyro(mcmc, *, log_likelihood="all", chunk_size=None, **kwargs):
    """``az.from_numpyro(mcmc, **kwargs)``, with a ``log_likelihood`` group over
    every data row.

    With ``log_likelihood="all"`` the group holds
    :func:`full_data_log_likelihood` of the run's draws: every row of the subsample
    plate (dimensions ``(chain, draw, <site>_dim_0)``, or the names ``dims=`` gives
    the site), so ``az.loo`` and ``az.waic`` estimate the elpd of all N rows
    whatever N (the kernel's :attr:`~numpyro_sgbd.SGBD.model`'s subset warning
    does not apply). With ``"subset"`` it holds ArviZ's own group, over the
    kernel's fixed evaluation rows (see :attr:`~numpyro_sgbd.SGBD.model`: all N by
    default up to :data:`~numpyro_sgbd.prepare.LOG_LIKELIHOOD_ALL_ROWS`, else
    ``log_likelihood_size`` of them). Either way the group's attributes say which:
    ``log_likelihood_rows`` (``"all"`` where it holds every row, else
    ``"subset"``) and, for a model with a subsample plate,
    ``log_likelihood_plate`` (its name), ``log_likelihood_size`` (the rows held)
    and ``data_size`` (its N). The other groups are ArviZ's (``observed_data``
    holds the kernel's evaluation rows). ``False`` gives no ``log_likelihood``
    group. A run of this package's kernels is checked first
    (:func:`~numpyro_sgbd.check`: the run checks' warnings, once per run).

    :param mcmc: a :class:`~numpyro.infer.mcmc.MCMC` that has run, with a kernel
        built from a model.
    :param str log_likelihood: ``"all"``, ``"subset"`` or ``False``.
    :param int chunk_size: rows per chunk for ``"all"`` (see
        :func:`full_data_log_likelihood`).
    :param kwargs: passed to ``az.from_numpyro`` (``coords``, ``dims``, ...).
    :return: the installed ArviZ's container: an :class:`arviz.InferenceData`
        (ArviZ 0.x) or an :class:`xarray.DataTree` (ArviZ 1.x).
    :raises ValueError: for a bad ``log_likelihood`` or ``chunk_size`` (before any
        work), for ``"all"`` with a kernel built from ``potential_fn`` or
        ``gradient_fn``, and as :func:`full_data_log_likelihood`.

    **References**

    1. Vehtari, Gelman & Gabry (2017), *Practical Bayesian model evaluation using
       leave-one-out cross-validation and WAIC*, Statistics and Computing 27.

    >>> import jax, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sgbd import SGLD
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
    ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = 1.0 + jax.random.normal(jax.random.key(0), (150,))
    >>> mcmc = MCMC(SGLD(model, step_size=0.02), num_warmup=50, num_samples=100,
    ...             progress_bar=False)
    >>> mcmc.run(jax.random.key(1), y)
    >>> data = from_numpyro(mcmc, chunk_size=64)
    >>> group = data["log_likelihood"]  # under ArviZ 0.x and 1.x alike
    >>> group["y"].shape  # (chain, draw, every row)
    (1, 100, 150)
    >>> group.attrs["log_likelihood_rows"], group.attrs["data_size"]
    ('all', 150)
    """
    _check_log_likelihood(log_likelihood)
    _check_chunk_size(chunk_size)
    with warnings.catch_warnings():
        if log_likelihood != "subset":  # every row, or none: no subset to warn of
            warnings.simplefilter("ignore", LogLikelihoodSubsetWarning)
        model = mcmc.sampler.model
        if model is None and log_likelihood is not False:
            raise ValueError(
                f"log_likelihood={log_likelihood!r} needs a kernel built from a "
                "model; this one was built from potential_fn or gradient_fn. Pass "
                "log_likelihood=False."
            )
        if isinstance(mcmc.sampler, Monitored):
            check(mcmc)  # the run checks' warnings, once per run
        # ArviZ's subset group only where asked for (0.x builds one by default).
        data = az.from_numpyro(
            mcmc, log_likelihood=log_likelihood == "subset", **kwargs
        )
    if log_likelihood is False:
        return data
    # The model's arguments as the run had them (az.from_numpyro reads them so too).
    model_args, model_kwargs = as_jax_arrays((mcmc._args, mcmc._kwargs))
    plates, _, _, _ = _layout(model, model_args, model_kwargs)
    if log_likelihood == "all":
        _set_every_row(data, mcmc, model, model_args, model_kwargs, chunk_size, kwargs)
    # ArviZ's group holds the kernel's evaluation rows: every row by default up
    # to a size, and without a subsample plate.
    indices = getattr(mcmc.sampler, "log_likelihood_indices", None) or {}
    held = {
        plate: size if log_likelihood == "all" else len(indices.get(plate, ()))
        for plate, size in plates.items()
    }
    rows = "all" if all(held[p] == size for p, size in plates.items()) else "subset"
    attrs = {"log_likelihood_rows": rows}
    if len(plates) == 1:
        ((plate, size),) = plates.items()
        attrs.update(log_likelihood_plate=plate, data_size=size)
        if held[plate]:
            attrs["log_likelihood_size"] = held[plate]
    if "log_likelihood" in _arviz.group_names(data):  # none without observations
        _arviz.group_attrs(data, "log_likelihood").update(attrs)
    return data


def _set_every_row(data, mcmc, model, model_args, model_kwargs, chunk_size, kwargs):
    """Put :func:`full_data_log_likelihood` of the run's draws in ``data`` as its
    ``log_likelihood`` group, with ArviZ's dimension names and coordinates."""
    values = full_data_log_likelihood(
        model,
        mcmc.get_samples(group_by_chain=True),
        *model_args,
        batch_ndims=2,
        chunk_size=chunk_size,
        **model_kwargs,
    )
    posterior = _arviz.group(data, "posterior")
    dataset = _arviz.dict_to_dataset(
        {name: np.asarray(v) for name, v in values.items()},
        coords=kwargs.get("coords"),
        dims=kwargs.get("dims"),
        index_origin=kwargs.get("index_origin"),
        library=numpyro,
    ).assign_coords(chain=posterior["chain"], draw=posterior["draw"])
    _arviz.set_group(data, "log_likelihood", dataset)
