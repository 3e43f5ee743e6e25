"""The minibatch gradient of a NumPyro model whose data sit in subsample plates,
with the noise statistics of its per-datum gradients (:class:`MinibatchEstimator`)."""

from functools import partial

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
from numpyro.handlers import substitute
from numpyro.infer.util import _unconstrain_reparam, log_density

from numpyro_sgbd.enumeration import enumerated_log_joint
from numpyro_sgbd.estimators.base import Estimator, GradientEstimate
from numpyro_sgbd.estimators.compiled import as_jax_arrays, split_arrays
from numpyro_sgbd.estimators.full_data import (
    chunked_full_data,
    shard_sites,
    split_local,
    summed_over_shards,
)
from numpyro_sgbd.estimators.indices import (
    draw_indices,
    gather_local,
    noise_variance_factor,
    resolve_replace,
)
from numpyro_sgbd.estimators.rows import (
    StreamedRows,
    _flat_size,
    default_row_budget,
    first_rows,
    gathered_stream,
    noise_statistics,
    noise_subset,
    parts_difference,
    pulled_rows,
    rows_per_chunk,
)
from numpyro_sgbd.estimators.static_gathers import without_static_gathers
from numpyro_sgbd.handlers import fix_plates, shard_local

__all__ = ["MinibatchEstimator", "NOISE_ROWS", "STREAMED_NOISE_ROWS"]

#: The kernels' :attr:`MinibatchEstimator.streamed_noise_rows`: a noise sd
#: from about 32 rows has a relative sd of 1/4 in each coordinate's variance,
#: and the kernels average it over about ten steps (beta = 0.1).
STREAMED_NOISE_ROWS = 32

#: The key of the noise's own indices in :meth:`MinibatchEstimator.draw`'s
#: result with ``covariance="rows"``.
NOISE_ROWS = "__noise_rows__"


class MinibatchEstimator(Estimator):
    """Minibatch gradient of a NumPyro model whose data sit in subsample plates.

    Each call draws its own indices for every subsample plate (O(n), see
    :func:`draw_indices`), substitutes them into the plates, and evaluates NumPyro's
    potential of the substituted model in unconstrained space (prior, Jacobian and the
    plate's N/n-scaled likelihood: the N/n factor is NumPyro's own, applied nowhere
    else). With ``noise=True`` it also forms the n per-datum gradients of the scaled
    likelihood terms (forward or reverse mode, whichever needs fewer passes) and
    returns their noise sd (:func:`noise_variance_factor`); the prior and Jacobian
    terms are exact and add no noise. With ``covariance`` it also returns the noise
    covariance (the sample covariance of the minibatch: :math:`\\Sigma = CC^\\top` with
    :math:`C = \\sqrt{c/(n-1)}\\,(G - \\bar G)^\\top`, G the n x d per-datum gradients
    of the scaled terms and c the factor of :func:`noise_variance_factor`), as the
    factor C, the matrix, or its diagonal.

    :param model: the NumPyro model.
    :param dict plates: ``{name: (size, subsample_size, dim)}`` of its subsample plates
        (``dim`` may be ``None`` when no observed site was found in the plate).
    :param bool noise: whether to estimate the noise sd (needs exactly one plate).
    :param replace: draw indices with replacement (``None``: as
        :func:`resolve_replace` chooses for each plate).
    :param str covariance: ``None`` (default), ``"lowrank"``, ``"diag"`` or
        ``"full"``: also return the noise covariance in that form (implies
        ``noise``); ``"rows"``: a factor B (d x m) of it from ``covariance_rows``
        = m other rows.
    :param str per_datum: how the per-datum gradients are formed: ``"vmap"``
        (default) runs the model on each datum of the minibatch alone, vectorized,
        at the cost of about one minibatch gradient plus n evaluations of the
        model's parts outside the plate; ``"jacobian"`` takes one Jacobian of the
        n terms, min(n, d) times the cost of a minibatch gradient, but evaluates
        the parts outside the plate once (for a model whose prior costs more
        than its likelihood). Either way, where n x d floats would pass
        :attr:`row_budget` and the noise form needs only variances (the sd, or
        ``covariance="diag"``), the gradients of the likelihood terms alone are
        formed a chunk of rows at a time and reduced as they come
        (:class:`StreamedRows`): memory O(chunk x d + d), never n x d.
    :param pullback: ``None``, or a linear map ``g -> L' g`` on flat gradients of
        shape (..., d) (a :class:`~numpyro_sgbd.preconditioning.Preconditioner`'s
        ``pull``): the gradient, the per-datum gradients behind the noise
        statistics, and :meth:`full_data`'s gradient are then returned flat, in the
        coordinates u of ``z = z_hat + L u`` (positions stay in z).
    :param int noise_rows: ``None`` (every row), or the noise sd (not a
        covariance) from the first ``noise_rows`` per-datum gradients where the
        indices come in random order
        (:func:`~numpyro_sgbd.estimators.indices.in_random_order`); the gradient
        uses every row (:func:`~numpyro_sgbd.preconditioning.noise_rows`).
    :param int streamed_noise_rows: ``None`` (every row), or, where the
        per-datum gradients are streamed (n x d floats pass :attr:`row_budget`)
        for a noise sd, form only the first ``m`` of a minibatch whose indices
        come in random order: ``m`` the smallest multiple of the rows per chunk
        that reaches ``streamed_noise_rows`` (every row where that is n or more,
        or the indices are sorted). The gradient uses every row. At d ~ 10^5
        (a network) a chunk holds a few rows and streaming all n of them cost
        about a hundred minibatch gradients a step (:data:`STREAMED_NOISE_ROWS`).
    :param sharding: ``None``, or the
        :class:`~numpyro_sgbd.sharding.DataSharding` of the model's data: every
        estimate and full-data pass then runs shard by shard
        (:meth:`map_shards`).
    :param int enumerate_dim: ``None``, or the first enumeration dimension (left
        of the model's plates): discrete sites marked for enumeration are then
        summed out datum by datum (:mod:`~numpyro_sgbd.enumeration`).
    :param dict local: ``{name: LocalSite}`` of the model's latent sites inside
        its one plate: z then holds their N rows, the estimate reads those of
        its minibatch and differentiates the other sites only
        (:mod:`~numpyro_sgbd.local_sites`).
    """

    def __init__(
        self,
        model,
        plates,
        *,
        noise=False,
        replace=False,
        covariance=None,
        per_datum="vmap",
        pullback=None,
        sharding=None,
        noise_rows=None,
        enumerate_dim=None,
        local=None,
        covariance_rows=None,
        streamed_noise_rows=None,
    ):
        noise = _checked_noise(plates, noise, covariance, per_datum, covariance_rows)
        #: ``{name: LocalSite}`` of the latent sites inside the plate, whose N
        #: rows z holds (:mod:`~numpyro_sgbd.local_sites`); empty without.
        self.local = dict(local or {})
        self.model = model
        self.plates = dict(plates)
        self.noise = noise
        self.replace = replace
        self.covariance = covariance
        self.covariance_rows = covariance_rows if covariance == "rows" else None
        self.per_datum = per_datum
        self.pullback = pullback
        self.sharding = sharding
        self.noise_rows, self.enumerate_dim = noise_rows, enumerate_dim
        self.streamed_noise_rows = streamed_noise_rows
        #: The estimator on one shard (``None`` without sharding).
        self.shard = None
        if sharding is not None:
            ((name, (_, _, dim)),) = self.plates.items()
            self.shard = MinibatchEstimator(
                shard_local(model, name, sharding.local_size, sharding.num_shards),
                {name: (sharding.local_size, sharding.local_subsample_size, dim)},
                noise=noise,
                replace=resolve_replace(
                    replace, sharding.size, sharding.subsample_size
                ),
                covariance=covariance,
                per_datum=per_datum,
                pullback=pullback,
                noise_rows=noise_rows,
                enumerate_dim=enumerate_dim,
                local=shard_sites(self.local, sharding.local_size),
                covariance_rows=_per_shard(covariance_rows, sharding),
                streamed_noise_rows=streamed_noise_rows,
            )

    #: Per-datum gradients are formed in chunks of at most this many floats
    #: (``chunk x d``), where the covariance form does not need them all
    #: (``covariance`` None or ``"diag"``). ``None``, the default, picks by JAX's
    #: default backend: 2**18 (1 MiB of float32) on a CPU, where one row at a
    #: time is fastest at large d (XLA:CPU's batched scatter), and 2**22
    #: (16 MiB) on an accelerator, where every chunk costs a kernel launch (a
    #: corrected step of a large matrix factorisation was about ten times faster
    #: at 2**22, ``benchmarks/results-gpu.md``).
    #: Set an int, on the class or an instance, to choose.
    row_budget = None

    def _row_budget(self):
        return default_row_budget() if self.row_budget is None else self.row_budget

    def _rows_per_chunk(self, z, n):
        return rows_per_chunk(z, n, self.covariance, self._row_budget())

    def draw(self, rng_key):
        """Fresh indices ``{plate name: indices}`` for every subsample plate."""
        return _draw(rng_key, self.plates, self.replace, self.covariance_rows)

    def terms(self, z, indices, model_args, model_kwargs, with_terms=None, local=None):
        """(potential estimate, scaled per-datum log-likelihood terms h_i or None).

        ``indices`` fixes every subsample plate (``{name: indices}``); an index
        array of any length m gives its plate the scale N / m. The terms are formed
        where ``with_terms`` (default: where the noise is estimated). ``local``:
        the local sites' N rows, of which those of ``indices`` are substituted.
        """
        if local:
            (plate,) = {s.plate for s in self.local.values()}
            z = {**z, **gather_local(local, self.local, indices[plate])}
        model = fix_plates(self.model, indices)
        model = substitute(model, substitute_fn=partial(_unconstrain_reparam, z))
        with_terms = self.noise if with_terms is None else with_terms
        name = next(iter(self.plates), None)
        data = (model_args, model_kwargs)
        log_joint, terms = _log_joint(model, data, name, self.enumerate_dim, with_terms)
        return -log_joint, terms

    def __call__(self, rng_key, z, model_args=(), model_kwargs=None):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        # NumPy data cannot be indexed by the traced minibatch indices (X[idx]);
        # as JAX arrays they can, and jit embeds them as it would anyway.
        model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))
        return self.map_shards(_evaluate_on, rng_key, z, model_args, model_kwargs)

    def map_shards(self, local, rng_key, operand, model_args, model_kwargs):
        """The :class:`GradientEstimate` of ``local(estimator, indices, operand,
        model_args, model_kwargs) -> (value, grad, per_datum_grads)`` (as
        :meth:`evaluate` returns) on minibatch indices drawn from ``rng_key``.

        Without sharding this is ``local`` on this estimator's indices, summarised.
        With it, each shard k runs ``local`` on the per-shard estimator
        (:attr:`local`: its own N/K rows, the prior weighted 1/K) with n/K indices
        drawn by the key ``fold_in(rng_key, k)``, inside :func:`jax.shard_map`;
        the shards' potentials, gradients and noise statistics are summed in one
        all-reduce (:meth:`summarise`). The estimate is stratified, n/K rows from
        each shard, so its noise variance is the sum of the shards' (docs: Big
        data). ``operand`` (positions) and the result are replicated.
        """
        if self.sharding is None:
            parts = local(self, self.draw(rng_key), operand, model_args, model_kwargs)
            return self.summarise(*parts)
        sharding = self.sharding
        arrays, rebuild, _ = split_arrays((model_args, model_kwargs))
        axis = sharding.axis

        def on_shard(rng_key, operand, arrays):
            args, kwargs = rebuild(arrays)
            est = self.shard
            key = random.fold_in(rng_key, jax.lax.axis_index(axis))
            parts = local(est, est.draw(key), operand, args, kwargs)
            return est.summarise(*parts, axis_name=axis)

        return sharding.map(on_shard)(rng_key, operand, arrays)

    def evaluate(self, z, indices, model_args, model_kwargs, centre=None):
        """``(potential, its gradient, per-datum gradients or None)`` at ``z`` on
        the minibatch ``indices`` (from :meth:`draw`); the gradients in u where
        there is a pullback (:meth:`pull`). The per-datum gradients (rows) are
        formed where the noise is estimated. With ``centre``: the same at ``z``
        minus at ``centre`` on the same ``indices`` (control variates), the
        vmapped per-datum gradients one function of both points (one gather of a
        datum's rows) and one (linear) pullback."""
        value, grad, rows = self._at_z(z, indices, model_args, model_kwargs, centre)
        return (value, *self.pull(grad, rows))

    def pull(self, grad, per_datum_grads=None):
        """Gradients in u (flat) where there is a pullback (of the per-datum
        ones, the first ``noise_rows`` where they serve the noise sd only:
        :func:`~numpyro_sgbd.estimators.rows.noise_subset`); unchanged
        otherwise."""
        if self.pullback is None:
            return grad, per_datum_grads
        grad = self.pullback(ravel_pytree(grad)[0])
        if per_datum_grads is not None:
            some = self.noise_rows if self.covariance is None else None
            rows = noise_subset(per_datum_grads, some, self.plates, self.replace)
            per_datum_grads = pulled_rows(self.pullback, rows)
        return grad, per_datum_grads

    def datum_log_density(self, z, i, model_args, model_kwargs):
        """log p(u_i, y_i | theta) + log p(theta) / N: the density of datum ``i``
        of the one subsample plate and its local sites (their row in ``z``, with
        the other sites), minus its one-datum potential over N
        (:mod:`~numpyro_sgbd.local_sites`)."""
        ((name, (size, _, _)),) = self.plates.items()
        value, _ = self.terms(z, {name: i[None]}, model_args, model_kwargs, False)
        return -value / size

    def _at_z(self, z, indices, model_args, model_kwargs, centre=None):
        """:meth:`evaluate` (with or without ``centre``) before the pullback: the
        per-datum gradients at once (a Jacobian or vmapped one-datum potentials,
        as ``per_datum`` says), or a chunk at a time where n x d floats pass the
        row budget and the noise needs only variances."""
        z, local = split_local(z, self.local)
        terms = partial(
            self.terms, model_args=model_args, model_kwargs=model_kwargs, local=local
        )
        if centre is not None:
            apart = partial(self._at_z, indices=indices, model_args=model_args)
            apart = partial(apart, model_kwargs=model_kwargs)
        if self.covariance == "rows" and self.plates:
            return _apart(terms, z, indices, centre, self.plates, self.enumerate_dim)
        if not self.noise or not self.plates:
            if centre is not None:
                return parts_difference(apart(z), apart(centre))
            value, grad = jax.value_and_grad(partial(_potential, terms, indices))(z)
            return value, grad, None
        ((name, (_, n, _)),) = self.plates.items()
        # Tracing only: one log-density a datum per site in the plate, or raise.
        jax.eval_shape(partial(terms, indices=indices), z)
        chunk = self._rows_per_chunk(z, n)
        if centre is not None and (chunk < n or self.per_datum != "vmap"):
            return parts_difference(apart(z), apart(centre))
        if chunk < n:
            # A pullback mixes the coordinates: the gradients in u are dense.
            budget = self._row_budget() if self.pullback is None else None
            want = None if self.covariance else self.streamed_noise_rows
            if want is not None:  # whole chunks
                want = -(-want // chunk) * chunk
            some = first_rows(want, self.plates[name][0], n, self.replace)
            return _streamed(terms, z, indices, name, n, chunk, budget, some)
        if self.per_datum == "jacobian":
            return _by_jacobian(partial(terms, indices=indices), z, n)
        one = partial(_datum_potential, terms, name)
        one = one if self.enumerate_dim is None else without_static_gathers(one)
        if centre is not None:
            return _by_vmap_pair(one, z, centre, indices[name], n)
        return _by_vmap(one, z, indices[name], n)

    def summarise(self, value, grad, per_datum_grads, axis_name=None):
        """The :class:`GradientEstimate` of :meth:`evaluate`'s parts, with the
        noise statistics of the n per-datum gradients (rows of
        ``per_datum_grads``) where asked for.

        ``axis_name``: inside :func:`jax.shard_map`, these are one shard's parts;
        the potentials, gradients and noise variances (per coordinate, or the
        covariance) of the shards are summed over that mesh axis, and a low-rank
        factor's columns gathered from every shard (its n/K centred rows each).
        """
        total, gather = _reducers(axis_name)
        value, grad = total((value, grad))
        if not self.noise:
            return GradientEstimate(grad, None, value)
        if not self.plates:
            return GradientEstimate(grad, jax.tree.map(jnp.zeros_like, grad), value)
        ((size, n, _),) = self.plates.values()
        factor = noise_variance_factor(size, n, replace=self.replace)
        apart = self.covariance == "rows"  # B from the noise's own m rows
        form, m = ("lowrank", self.covariance_rows) if apart else (self.covariance, n)
        sd, cov = noise_statistics(per_datum_grads, m, factor, form, total, gather)
        return GradientEstimate(grad, sd, value, cov)

    def full_data_parts(self, model_args=(), model_kwargs=None, chunk_size=4096):
        """``(run, arrays)``: :meth:`full_data` is ``run(z, arrays)``, jitted, with
        the array leaves of the model arguments as its second argument (so that a
        caller's own jitted function can pass them through).

        With sharding, each shard sums its own rows in chunks and one all-reduce
        adds the shards' sums (the prior counted once, :class:`~numpyro_sgbd.
        handlers.shard_local`)."""
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if self.sharding is not None:
            run, arrays = self.shard.full_data_parts(
                model_args, model_kwargs, chunk_size
            )
            return summed_over_shards(run, self.sharding, self.local), arrays
        arrays, rebuild, _ = split_arrays(as_jax_arrays((model_args, model_kwargs)))
        ((name, (size, _, _)),) = self.plates.items()
        run = chunked_full_data(
            self.terms, name, size, rebuild, chunk_size, self.pull, self.local
        )
        return run, arrays


def _per_shard(rows, sharding):
    """``covariance_rows`` on each shard of ``sharding`` (at least 2)."""
    return rows and max(2, rows // sharding.num_shards)


def _draw(rng_key, plates, replace, rows=None):
    """Indices ``{plate name: indices}`` for every subsample plate, and with
    ``rows`` that many more under :data:`NOISE_ROWS`, drawn apart."""
    if rows is not None:  # the noise's rows, apart from the force's
        rng_key, key_rows = random.split(rng_key)
    keys = random.split(rng_key, max(len(plates), 1))
    indices = {
        name: draw_indices(key, size=size, subsample_size=n, replace=replace)
        for key, (name, (size, n, _)) in zip(keys, plates.items())
    }
    if rows is not None:
        ((size, _, _),) = plates.values()
        indices[NOISE_ROWS] = draw_indices(key_rows, size, rows, replace=replace)
    return indices


def _apart(terms, z, indices, centre, plates, enumerate_dim):
    """``covariance="rows"``'s ``(potential, gradient, rows)``: the minibatch's
    potential and gradient (minus the centre's), and the per-datum gradients
    of the noise's own indices, scaled as the minibatch's rows are."""
    ((name, (_, n, _)),) = plates.items()
    indices = dict(indices)
    idx = indices.pop(NOISE_ROWS)
    value_and_grad = jax.value_and_grad(partial(_potential, terms, indices))
    value, grad = value_and_grad(z)
    one = partial(_datum_potential, terms, name)
    one = one if enumerate_dim is None else without_static_gathers(one)
    if centre is None:
        return value, grad, _by_vmap(one, z, idx, n)[2]
    value_c, grad_c = value_and_grad(centre)
    grad = jax.tree.map(jnp.subtract, grad, grad_c)
    return value - value_c, grad, _by_vmap_pair(one, z, centre, idx, n)[2]


def _evaluate_on(est, indices, z, model_args, model_kwargs):
    """:meth:`MinibatchEstimator.evaluate` in :meth:`~MinibatchEstimator.map_shards`'
    argument order (each shard's estimator on its own indices)."""
    return est.evaluate(z, indices, model_args, model_kwargs)


def _checked_noise(plates, noise, covariance, per_datum, covariance_rows=None):
    """Whether the noise is estimated (asked for, or implied by a covariance
    form), after checking the options: ``per_datum`` and ``covariance`` name
    known forms (``"rows"`` with ``covariance_rows``), and the noise has one
    plate to come from."""
    if covariance == "rows" and not (
        isinstance(covariance_rows, int) and covariance_rows >= 2
    ):
        raise ValueError(
            "covariance='rows' needs covariance_rows, the number of rows a "
            f"noise estimate reads, an int >= 2; got {covariance_rows!r}."
        )
    if per_datum not in ("vmap", "jacobian"):
        raise ValueError(f"per_datum must be 'vmap' or 'jacobian', got {per_datum!r}.")
    if covariance not in (None, "lowrank", "diag", "full", "rows"):
        raise ValueError(
            "covariance must be None, 'lowrank', 'diag', 'full' or 'rows', got "
            f"{covariance!r}."
        )
    noise = noise or covariance is not None
    if noise and len(plates) > 1:
        raise ValueError(
            "Estimating the gradient noise needs exactly one subsample plate; "
            f"the model has {sorted(plates)}."
        )
    return noise


def _potential(terms, indices, z, with_terms=None):
    """The minibatch potential at ``z`` on ``indices``, from ``terms``
    (:meth:`MinibatchEstimator.terms` with the model's arguments bound)."""
    return terms(z, indices, with_terms=with_terms)[0]


def _datum_term(terms, name, n, z, i):
    """h_i = (N / n) log p(y_i | z), the scaled term of datum ``i`` of a
    minibatch of ``n``: the one-datum model weights its datum by N."""
    return terms(z, {name: i[None]}, with_terms=True)[1][0] / n


def _datum_potential(terms, name, z, i):
    """U_i = -log prior - N log p(y_i | z): the potential of the model on the
    single datum ``i`` of the plate ``name``."""
    return terms(z, {name: i[None]}, with_terms=False)[0]


def _term_rows(term, z, idx):
    """The gradients at ``z`` of ``term`` (:func:`_datum_term`) of each datum in
    ``idx``, as rows."""
    return jax.vmap(jax.grad(term), (None, 0))(z, idx)


def _streamed(terms, z, indices, name, n, chunk, row_budget, some):
    """``(potential, gradient, rows)`` for large d: the minibatch gradient as
    without noise, and the gradients of the likelihood terms alone (the prior
    and Jacobian are exact: no noise) of the first ``some`` data as
    :class:`StreamedRows` of ``chunk`` rows (memory O(chunk x d), never n x d);
    their chunks gathered (:func:`gathered_stream`) where a ``row_budget`` is
    given and that applies, dense otherwise."""
    potential = partial(_potential, terms, indices, with_terms=False)
    value, grad = jax.value_and_grad(potential)(z)
    term = partial(_datum_term, terms, name, n)
    idx = indices[name][:some]
    rows = None
    if row_budget is not None:
        rows = gathered_stream(term, z, idx, chunk, row_budget)
    if rows is None:
        rows = StreamedRows(partial(_term_rows, term, z), idx, chunk)
    return value, grad, rows


def _with_value(fn, z):
    """``fn(z)`` (the potential and the terms), and the potential as the aux."""
    out = fn(z)
    return out, out[0]


def _by_jacobian(fn, z, n):
    """``(potential, gradient, per-datum gradients)`` from one Jacobian of
    ``fn(z) = (potential, h_1..h_n)``: d forward passes or n + 1 reverse, each
    costing a minibatch gradient."""
    jac = jax.jacfwd if _flat_size(z) <= n else jax.jacrev
    (grad, per_datum_grads), value = jac(partial(_with_value, fn), has_aux=True)(z)
    return value, grad, per_datum_grads


def _by_vmap(one, z, idx, n):
    """``(potential, gradient, per-datum gradients)`` from the n one-datum
    potentials ``one(z, i)`` (:func:`_datum_potential`), vmapped over ``idx``.

    O(n d) work, as one minibatch gradient, where a Jacobian costs min(n, d) of
    them. Their mean is the minibatch potential (and gradient); grad U_i / n is
    minus the gradient of the scaled term h_i up to the prior's gradient / n, a
    shift common to all rows that the noise statistics (variances, centred
    covariances, differences between two points on the same indices) do not
    see."""
    values, grads = jax.vmap(jax.value_and_grad(one), (None, 0))(z, idx)
    return _reduced(values, grads, n)


def _by_vmap_pair(one, z, centre, idx, n):
    """:func:`_by_vmap` at ``z`` minus at ``centre``, each datum's two
    evaluations in one vmapped function: ``(potential difference, gradient
    difference, per-datum gradient differences)``."""

    def both(i):
        value, grad = jax.value_and_grad(one)(z, i)
        value_c, grad_c = jax.value_and_grad(one)(centre, i)
        return value - value_c, jax.tree.map(jnp.subtract, grad, grad_c)

    return _reduced(*jax.vmap(both)(idx), n)


def _reduced(values, grads, n):
    """The n one-datum potentials ``values`` and their gradients ``grads`` as
    ``(potential, gradient, per-datum gradients)``: the means, and ``-grad /
    n`` for the rows (see :func:`_by_vmap`)."""
    grad = jax.tree.map(lambda g: jnp.mean(g, 0), grads)
    return jnp.mean(values), grad, jax.tree.map(lambda g: -g / n, grads)


def _identity(x):
    return x


def _reducers(axis_name):
    """``(total, gather)`` of :meth:`MinibatchEstimator.summarise`: the sum over
    the mesh axis ``axis_name`` and the gather of a low-rank factor's columns
    from every shard; both the identity on one device (``None``)."""
    if axis_name is None:
        return _identity, _identity
    total = partial(jax.lax.psum, axis_name=axis_name)
    gather = partial(jax.lax.all_gather, axis_name=axis_name, axis=1, tiled=True)
    return total, gather


def _log_joint(model, data, name, enumerate_dim, with_terms):
    """``(log joint, per-datum terms or None)`` of ``model`` (its latent sites
    and plates fixed) on ``data``: its enumerated discrete sites summed out datum
    by datum from ``enumerate_dim`` (:mod:`~numpyro_sgbd.enumeration`), else
    NumPyro's ``log_density``; the terms of the plate ``name`` where
    ``with_terms`` and there is a subsample plate."""
    if enumerate_dim is not None:
        log_joint, terms = enumerated_log_joint(model, *data, name, enumerate_dim)
        return log_joint, terms if with_terms else None
    log_joint, trace = log_density(model, *data, {})
    if not with_terms or name is None:
        return log_joint, None
    return log_joint, _plate_terms(trace, name, jnp.shape(trace[name]["value"])[0])


def _plate_terms(trace, name, n):
    """The ``n`` scaled log-likelihood terms of the plate ``name``'s data in a
    model's ``trace``: each observed site's log-densities in the plate, times its
    scale, summed per datum."""
    per_datum = jnp.zeros((n,))
    for site in trace.values():
        # The observed sites, and the latent ones inside the plate (local sites).
        if site["type"] != "sample":
            continue
        frame = next((f for f in site["cond_indep_stack"] if f.name == name), None)
        if frame is None:
            continue
        lp = site["fn"].log_prob(site["value"])
        if site["scale"] is not None:
            lp = site["scale"] * lp
        axis = jnp.ndim(lp) + frame.dim
        if axis < 0 or jnp.shape(lp)[axis] != n:
            raise ValueError(
                f"Observed site '{site['name']}' in plate '{name}' has log-density "
                f"shape {jnp.shape(lp)} without the plate's dimension {frame.dim}; "
                "cannot form per-datum gradients."
            )
        lp = jnp.moveaxis(lp, axis, 0).reshape(n, -1).sum(-1)
        per_datum = per_datum + lp
    return per_datum
