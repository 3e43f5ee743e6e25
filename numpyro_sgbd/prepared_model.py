"""The model a kernel runs, prepared from its data: :class:`PreparedModel`
holds one trace's facts (plates, shapes, local and enumerated sites), the
set-up (mode, preconditioner, control variates' centre), the gradient
estimator and the evaluation rows, as :mod:`numpyro_sgbd.prepare` computes
them, and gives the chains' start, the model ArviZ reads and the constrained
values. The kernel (:class:`~numpyro_sgbd.kernel.SGKernel`) holds one.
"""

import warnings

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
from numpyro import handlers
from numpyro.infer.util import (
    ParamInfo,
    constrain_fn,
    find_valid_initial_params,
    initialize_model,
)
from numpyro.util import identity, not_jax_tracer

from numpyro_sgbd import preconditioning
from numpyro_sgbd.enumeration import marginal_model
from numpyro_sgbd.estimators import (
    ControlVariateEstimator,
    CustomEstimator,
    PotentialEstimator,
)
from numpyro_sgbd.local_laplace import draw_rows
from numpyro_sgbd.local_sites import (
    constrained_local,
    gather_local,
    gather_rows,
    initial_local,
)
from numpyro_sgbd.prepare import (
    LogLikelihoodSubsetWarning,
    Programs,
    model_rows,
    prepare,
)
from numpyro_sgbd.setup import Setup
from numpyro_sgbd.state import SetupArrays

__all__ = ["PreparedModel"]


def _fixed_rows(model, indices):
    """``model`` with each plate named in ``indices`` given those rows. The
    plate keeps its declared ``subsample_size`` (so that the package still sees
    the model's subsample plates: :func:`~numpyro_sgbd.handlers.subsample_plates`),
    and NumPyro's warning that it differs from the number of rows given is
    silenced: there the difference is the point."""
    fixed = handlers.substitute(model, data=indices)

    def evaluated(*model_args, **model_kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", "subsample_size does not match len", UserWarning
            )
            return fixed(*model_args, **model_kwargs)

    return evaluated


# ------------------------------------------------------------ the start
def check_init_params(init_params, shapes):
    """Raise unless ``init_params`` gives an unconstrained value for every
    latent site."""
    if not isinstance(init_params, dict) or set(init_params) != set(shapes):
        got = sorted(init_params) if isinstance(init_params, dict) else init_params
        raise ValueError(
            "init_params must be a dict of unconstrained values for the latent "
            f"sites {sorted(shapes)}; got {got}."
        )


def initial_params(programs, model, strategy, shapes, rng_key, model_args, kwargs):
    """A valid initial point of ``model`` by ``strategy``: the search as one
    compiled program with the data as its arguments (NumPyro's
    ``initialize_model`` runs it op by op, and each op is compiled apart on
    first use); where it finds none, NumPyro's own path says what is wrong."""
    prototype = {k: jnp.zeros(v) for k, v in shapes.items()}

    def make(rebuild):
        def find_from_arrays(rng_key, arrays):
            args, kw = rebuild(arrays)
            (z, _, _), ok = find_valid_initial_params(
                rng_key,
                model,
                init_strategy=strategy,
                model_args=args,
                model_kwargs=kw,
                prototype_params=prototype,
            )
            return z, jnp.all(ok)

        return find_from_arrays

    fn, arrays = programs.over_data(make, model_args, kwargs)
    z, ok = fn(rng_key, arrays)
    # Under chain_method="parallel" this runs inside pmap, where the flag is
    # abstract: NumPyro's own initialisation skips its check there too.
    if not not_jax_tracer(ok) or bool(ok):
        return z
    info = initialize_model(
        rng_key,
        model,
        init_strategy=strategy,
        model_args=model_args,
        model_kwargs=kwargs,
    )
    return info.param_info.z


def laplace_start(programs, pre, mode, rng_key, batched):
    """``(rng_key, z)``: the key split for the initial state, and z drawn from
    the Laplace approximation N(z_hat, L L') with the other half, so that chains
    start apart, near the mode, on the posterior's scale. One compiled program,
    kept per form and shapes, with L as its argument: run op by op the split and
    the draw compiled five programs (a threefry normal among them)."""
    cache_key = (pre.form, batched, jax.tree.structure(mode)) + tuple(
        (jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(mode)
    )
    unravel = ravel_pytree(mode)[1]

    def build():
        def start(rng_key, arrays):
            pre = preconditioning.Preconditioner(cache_key[0], *arrays)

            def one(key):
                key, key_init = random.split(key)
                u = random.normal(key_init, pre.loc.shape, pre.loc.dtype)
                return key, unravel(pre.to_z(u))

            return jax.vmap(one)(rng_key) if batched else one(rng_key)

        return start

    return programs.get(cache_key, build)(rng_key, tuple(pre)[1:])


class PreparedModel:
    """The model (or potential, or gradient function) a kernel runs, prepared
    from its data by :meth:`build` before compiling: the model's subsample
    ``plates``, its latent ``shapes``, ``deterministic`` sites inside a plate,
    enumerated (``enumerate_dim``) and ``local`` sites, the ``setup`` found
    from the full data, the gradient ``estimator``, the evaluation rows
    ``log_likelihood_indices`` and the minibatch ``rows`` that stand for the
    model's plates where any will do. ``request`` is what the kernel asks
    :func:`~numpyro_sgbd.prepare.prepare` for."""

    def __init__(self, sources, request, init_strategy):
        self.model, self.potential_fn, self.gradient_fn = sources
        self.request, self.init_strategy = request, init_strategy
        self.setup = Setup()
        self.plates, self.shapes, self.deterministic = None, None, ()
        self.enumerate_dim, self.local, self.modules = None, {}, ()
        self.estimator = self.log_likelihood_indices = self.rows = None
        names = ("init_params", "postprocess", "start")
        self.programs = {name: Programs() for name in names}

    @property
    def source(self):
        """``"model"``, ``"potential_fn"`` or ``"gradient_fn"``: what was given."""
        if self.model is not None:
            return "model"
        return "potential_fn" if self.potential_fn is not None else "gradient_fn"

    def build(self, model_args, model_kwargs, choose):
        """Prepare from the model and its data (:func:`~numpyro_sgbd.prepare.
        prepare`), ``choose(plates, shapes, local) -> (noise_form, gradient)``
        saying what the sampler's rule needs, and keep what it found."""
        if self.model is None:
            source = self.potential_fn
            self.estimator = (
                CustomEstimator(self.gradient_fn)
                if source is None
                else PotentialEstimator(source)
            )
            return
        prepared = prepare(
            self.model, model_args, model_kwargs, self.request, self.setup, choose
        )
        info = prepared.info
        self.plates, self.shapes = info.plates, info.shapes
        self.deterministic = info.deterministic
        self.enumerate_dim, self.local = info.enumerate_dim, info.local
        self.modules = info.modules
        self.setup, self.estimator = prepared.setup, prepared.estimator
        self.log_likelihood_indices = prepared.log_likelihood_indices
        self.rows = model_rows(info.plates)

    def evaluated_model(self, who):
        """The model as ``az.from_numpyro`` (through
        :func:`numpyro.infer.util.log_likelihood`) and
        :class:`~numpyro.infer.Predictive` read it (the kernel ``who``'s
        ``model``): every subsample plate fixed to the rows
        ``log_likelihood_indices`` gives, each enumerated site summed out datum
        by datum, each local site read from the draws' row.

        By default (``log_likelihood_size=None``) those are all N rows of a plate
        of up to :data:`~numpyro_sgbd.prepare.LOG_LIKELIHOOD_ALL_ROWS` (50,000),
        so ArviZ's ``log_likelihood`` and ``observed_data`` hold every row and
        ``az.loo`` / ``az.waic`` estimate the elpd of all the data. ArviZ keeps 4
        bytes per draw and row; above that size the rows are a fixed random
        subset of that many, and reading the model warns (``az.loo`` then
        estimates the elpd of the subset). ``log_likelihood_size`` sets the
        number of rows (at least N: all of them);
        :func:`~numpyro_sgbd.from_numpyro` evaluates every row in chunks.
        ``None`` without a model."""
        if self.model is None or not self.log_likelihood_indices:
            return self.model
        note = self.subset_note(who)
        if note:
            warnings.warn(note, LogLikelihoodSubsetWarning, stacklevel=3)
        return self.model_at(self.log_likelihood_indices)

    def subset_note(self, who):
        """Why the default evaluation rows are a subset, or ``""``: a plate above
        :data:`~numpyro_sgbd.prepare.LOG_LIKELIHOOD_ALL_ROWS` rows."""
        if self.request.log_likelihood_size is not None:  # asked for: documented
            return ""
        short = {
            name: (len(idx), self.plates[name][0])
            for name, idx in self.log_likelihood_indices.items()
            if len(idx) < self.plates[name][0]
        }
        if not short:
            return ""
        held = ", ".join(
            f"{m:,} of the {n:,} rows of plate '{k}'" for k, (m, n) in short.items()
        )
        limit = max(m for m, _ in short.values())
        size = max(n for _, n in short.values())
        return (
            f"{who}.model, which az.from_numpyro evaluates, holds the "
            f"log-likelihood of {held} (a fixed random subset: every row only up "
            f"to {limit:,} rows by default, as ArviZ keeps 4 bytes per draw and "
            "row), so az.loo and az.waic estimate the elpd of those rows only. "
            f"Pass log_likelihood_size={size} to {who} for every row, or use "
            "numpyro_sgbd.from_numpyro(mcmc), which evaluates every row in chunks."
        )

    def model_at(self, indices):
        """The model with every subsample plate fixed to ``indices``, its local
        sites read from draws of every row and its enumerated sites summed out
        datum by datum (the model as written without subsample plates)."""
        if not indices:
            return self.model
        model = _fixed_rows(self.model, indices)
        if self.local:  # draws hold every row of the local sites
            model = gather_rows(model, self.local, indices)
        if self.enumerate_dim is None:
            return model
        # Each datum's log-likelihood is its marginal over the enumerated sites.
        return marginal_model(model, next(iter(self.plates)), self.enumerate_dim)

    def setup_arrays(self, preconditioner):
        """The set-up the step reads, as the arrays a chain's state carries
        (:class:`~numpyro_sgbd.state.SetupArrays`): ``preconditioner`` and the
        control variates' fixed centre. Every leaf an array, so that a later
        run's set-up is an argument of the programs compiled for the first, not
        a constant."""
        est, centre = self.estimator, None
        if isinstance(est, ControlVariateEstimator) and est.centre is not None:
            centre = (est.centre, est.centre_potential, est.centre_grad)
            centre = jax.tree.map(jnp.asarray, centre)
        return SetupArrays(preconditioner, centre)

    def start(self, rng_key, batched, init_params, model_args, model_kwargs):
        """``(rng_key, z)``: the chains' keys and initial points: drawn from the
        Laplace approximation with a preconditioner and no ``init_params``, else
        ``init_params`` or a point of the init strategy."""
        pre = self.setup.preconditioner
        if init_params is None and pre is not None:
            return self._laplace_start(rng_key, batched)
        if batched:
            rng_key, key_init = jnp.swapaxes(jax.vmap(random.split)(rng_key), 0, 1)
        else:
            rng_key, key_init = random.split(rng_key)
        if isinstance(init_params, ParamInfo):  # as NumPyro's HMC accepts
            init_params = init_params.z
        if self.model is None:
            if init_params is None:
                raise ValueError(
                    "init_params is required with potential_fn or gradient_fn: pass "
                    "mcmc.run(rng_key, init_params=...)."
                )
            return rng_key, init_params
        given = {} if init_params is None else dict(init_params)
        local = {k: given.pop(k) for k in self.local if k in given}
        if self.local and not local:
            key = random.fold_in(key_init[0] if batched else key_init, 2)
            chains = jnp.shape(rng_key)[:1] if batched else ()
            local = initial_local(key, self.local, chains)
        if init_params is not None:
            check_init_params(given, self.shapes)
            return rng_key, {**given, **local}
        model = self.model_at(self.rows)
        if self.local:  # the global sites' start, given the local sites' rows
            one = jax.tree.map(lambda x: x[0], local) if batched else local
            rows = gather_local(one, self.local, *self.rows.values())
            model = handlers.condition(model, constrained_local(rows, self.local))
        z = initial_params(
            self.programs["init_params"],
            model,
            self.init_strategy,
            self.shapes,
            key_init,
            model_args,
            model_kwargs,
        )
        return rng_key, {**z, **local}

    def _laplace_start(self, rng_key, batched):
        """Draws from the Laplace approximation at the mode; with local sites,
        each chain's rows from theirs."""
        pre, mode = self.setup.preconditioner, self.setup.mode
        rng_key, z = laplace_start(self.programs["start"], pre, mode, rng_key, batched)
        if not self.local:
            return rng_key, z
        keys = jax.vmap(random.split)(rng_key) if batched else random.split(rng_key)
        rng_key, key_rows = (keys[:, 0], keys[:, 1]) if batched else keys
        chains = jnp.shape(rng_key)[:1] if batched else ()
        first = key_rows[0] if batched else key_rows
        rows = draw_rows(first, self.setup.local_rows, self.local, chains)
        return rng_key, {**z, **rows}

    def probe(self, one_z, model_args, model_kwargs):
        """A user's potential_fn or gradient_fn: the shapes of its estimate at
        ``one_z``, its gradient checked for z's structure before compiling (the
        model's own estimators give it by construction)."""
        estimator = self.estimator

        def probe_fn(rng_key, z):
            centre = estimator.initial_centre(z, model_args, model_kwargs)
            return estimator.estimate(rng_key, z, model_args, model_kwargs, centre)

        probe = jax.eval_shape(probe_fn, random.key(0), one_z)
        if jax.tree.structure(probe.z_grad) != jax.tree.structure(one_z):
            raise ValueError(
                "The gradient estimate does not have the structure of z: "
                f"{jax.tree.structure(probe.z_grad)} vs {jax.tree.structure(one_z)}."
            )
        return probe

    def shapes_of(self, one_z):
        """The latent sites' shapes: the model's, or those of ``one_z`` (one
        chain's position) for a potential_fn or gradient_fn."""
        if self.model is not None:
            return self.shapes
        if isinstance(one_z, dict):
            return {k: tuple(jnp.shape(v)) for k, v in one_z.items()}
        return jax.tree.map(lambda x: tuple(jnp.shape(x)), one_z)

    @property
    def draw_shapes(self):
        """The shapes of every site in z, the local sites' N rows included."""
        local = {k: s.shape for k, s in self.local.items()}
        return {**(self.shapes or {}), **local}

    def postprocess_fn(self, model_args, model_kwargs):
        """NumPyro's ``postprocess_fn``: the constrained values and deterministic
        sites of an unconstrained draw."""
        if self.model is None:
            return identity
        # A minibatch's rows will do: only the global sites are kept. (With
        # enumerated sites the model sums them out: none is drawn.)
        indices = self.rows
        drop, model = self.deterministic, self.model_at(indices)
        local = self.local

        # One compiled function, kept per argument structure: NumPyro's loop
        # first calls it eagerly (to size its buffers). Inside the loop it is
        # traced inline.
        def make(rebuild):
            def constrained(z, arrays):
                args, kwargs = rebuild(arrays)
                # The model reads the evaluation rows of the local sites; the
                # draws hold all their N rows.
                rows = local and gather_local(z, local, *indices.values())
                out = constrain_fn(
                    model, args, kwargs, {**z, **rows}, return_deterministic=True
                )
                out.update(constrained_local(z, local))
                return {k: v for k, v in out.items() if k not in drop}

            return constrained

        programs = self.programs["postprocess"]
        fn, arrays = programs.over_data(make, model_args, model_kwargs)
        return lambda z: fn(z, arrays)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["setup"] = self.setup.for_pickling()
        if getattr(self.estimator, "sharding", None) is not None:
            # Its mesh holds devices, which do not pickle; `init` rebuilds it.
            state["estimator"] = None
        return state
