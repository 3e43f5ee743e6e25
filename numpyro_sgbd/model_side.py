"""The half of a kernel that prepares it from the model and its data: one trace
of the model, the set-up (mode, preconditioner, control variates' centre), the
gradient estimator, the chains' start and the constrained values, as
:mod:`numpyro_sgbd.prepare` computes them. :class:`ModelSide` is a base of the
kernels (:class:`~numpyro_sgbd.kernel._SGKernel`), whose other half is the
NumPyro protocol over the core's pure step.
"""

import warnings

import jax
from jax import random
import jax.numpy as jnp
from numpyro import handlers
from numpyro.infer.util import ParamInfo, constrain_fn
from numpyro.util import identity

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
    CentreRequest,
    LogLikelihoodSubsetWarning,
    Request,
    check_init_params,
    initial_params,
    laplace_start,
    model_rows,
    prepare,
)
from numpyro_sgbd.setup import Setup
from numpyro_sgbd.state import SetupArrays

__all__ = ["ModelSide"]


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


class ModelSide:
    """What a kernel's ``init`` prepares from the model (or potential, or
    gradient function) and its data, before compiling: the hooks a sampler sets
    to say which gradient noise it needs, the set-up and estimator, the start,
    the compiled initial state and ``postprocess_fn``. The attributes it reads
    are set by the kernel's constructor."""

    # ------------------------------------------- what the samplers set
    def _noise_form(self):
        """What the estimator must return besides the gradient: ``None``, ``"sd"``
        (per-coordinate noise sd) or a covariance form (``"lowrank"``, ...)."""
        return None

    def _noise_needed_by(self):
        """(who needs the noise, how to do without) for error messages."""
        return "", ""

    def _default_options(self, plates, local=None):
        """Resolve the options left to ``step_size=None``'s defaults once the
        subsample plates and the local sites are known (``None`` before the
        trace: reset them); return whether the noise form changed. Control
        variates need one plate and no local sites (each row's local value
        moves with its own datum: no centre serves every term)."""
        if plates is None:
            self._gradient = self._gradient_arg
        elif self._gradient == "auto":
            cv = len(plates) == 1 and not local
            self._gradient = "control_variates" if cv else "minibatch"
        return False

    def _resolve_noise_form(self, noise_form, shapes, plates):
        """The noise form once z's shapes and the subsample plates are known (NOGIN
        chooses its covariance form here)."""
        return noise_form

    @property
    def setup(self):
        """What ``init`` found from the model and its data, as one immutable
        :class:`~numpyro_sgbd.setup.Setup` (the mode, the preconditioner, the
        control variates' centre); every field ``None`` before ``init``."""
        return self._setup

    def use_setup(self, setup):
        """Use ``setup`` (another kernel's :attr:`setup`, found from the same data)
        so that ``init`` on those data searches for none of it again: for kernels
        of one model that differ in the sampler, its hyperparameters or a plate's
        subsample size (the full-data mode and gradient do not depend on them)."""
        if not isinstance(setup, Setup):
            raise TypeError(
                "use_setup takes another kernel's .setup (a numpyro_sgbd.setup."
                f"Setup), got {type(setup).__name__}."
            )
        self._setup = setup

    @property
    def preconditioner(self):
        """The change of variables z = z_hat + L u, built by ``init``
        (:class:`~numpyro_sgbd.preconditioning.Preconditioner`), or ``None``."""
        return self._setup.preconditioner

    @property
    def adaptation_info(self):
        """After ``init`` with a preconditioner or ``step_size=None``: the mode
        search's report, L's form, memory and cost, and the step size's target."""
        return self._setup.adaptation_info

    @property
    def centre_info(self):
        """After ``init`` with ``gradient="control_variates"``: the first centre
        (unconstrained, by site), how it was found, and the search's report."""
        return self._setup.centre_info

    @property
    def estimator(self):
        """After ``init``: the gradient estimator (:mod:`numpyro_sgbd.estimators`),
        whose ``estimate(rng_key, z, model_args, model_kwargs, centre)`` gives the
        :class:`~numpyro_sgbd.GradientEstimate` the step uses."""
        return self._estimator

    @property
    def model(self):
        """The model as ``az.from_numpyro`` (through
        :func:`numpyro.infer.util.log_likelihood`) and
        :class:`~numpyro.infer.Predictive` read it: every subsample plate fixed to
        the rows :attr:`log_likelihood_indices` gives, each enumerated site summed
        out datum by datum, each local site read from the draws' row.

        By default (``log_likelihood_size=None``) those are all N rows of a plate
        of up to :data:`~numpyro_sgbd.prepare.LOG_LIKELIHOOD_ALL_ROWS` (50,000),
        so ArviZ's ``log_likelihood`` and ``observed_data`` hold every row and
        ``az.loo`` / ``az.waic`` estimate the elpd of all the data. ArviZ keeps 4
        bytes per draw and row; above that size the rows are a fixed random
        subset of that many, and reading this property warns (``az.loo`` then
        estimates the elpd of the subset). ``log_likelihood_size`` sets the
        number of rows (at least N: all of them); :func:`~numpyro_sgbd.from_numpyro`
        evaluates every row in chunks. ``None`` for kernels built from
        ``potential_fn`` or ``gradient_fn``.
        """
        if self._model is None or not self.log_likelihood_indices:
            return self._model
        note = self._subset_note()
        if note:
            warnings.warn(note, LogLikelihoodSubsetWarning, stacklevel=2)
        return self._model_at(self.log_likelihood_indices)

    def _subset_note(self):
        """Why the default evaluation rows are a subset, or ``""``: a plate above
        :data:`~numpyro_sgbd.prepare.LOG_LIKELIHOOD_ALL_ROWS` rows."""
        if self._log_likelihood_size is not None:  # asked for: documented
            return ""
        short = {
            name: (len(idx), self._plates[name][0])
            for name, idx in self.log_likelihood_indices.items()
            if len(idx) < self._plates[name][0]
        }
        if not short:
            return ""
        who = type(self).__name__
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

    def _model_at(self, indices):
        """The model with every subsample plate fixed to ``indices``, its local
        sites read from draws of every row and its enumerated sites summed out
        datum by datum (the model as written without subsample plates)."""
        if not indices:
            return self._model
        model = _fixed_rows(self._model, indices)
        if self._local:  # draws hold every row of the local sites
            model = gather_rows(model, self._local, indices)
        if self._enumerate_dim is None:
            return model
        # Each datum's log-likelihood is its marginal over the enumerated sites.
        return marginal_model(model, next(iter(self._plates)), self._enumerate_dim)

    def _build(self, model_args, model_kwargs):
        """Prepare the kernel from the model and its data
        (:func:`~numpyro_sgbd.prepare.prepare`) and keep what it found."""
        self._default_options(None)
        if self._model is None:
            source = self._potential_fn
            self._estimator = (
                CustomEstimator(self._gradient_fn)
                if source is None
                else PotentialEstimator(source)
            )
            return
        request = Request(
            preconditioner=self._preconditioner_arg,
            centre=CentreRequest(
                self._centre_arg, self._recentre_every, self._chunk_size
            ),
            replace=self._replace,
            log_likelihood_size=self._log_likelihood_size,
            who=type(self).__name__,
            adaptation={
                "step_target": self._STEP_TARGET,
                "sampling_fraction": self._SAMPLING_FRACTION,
                "adapt_mass_matrix": self._adapt_mass,
            },
        )
        prepared = prepare(
            self._model, model_args, model_kwargs, request, self._setup, self._choose
        )
        info = prepared.info
        self._plates, self._z_shapes = info.plates, info.shapes
        self._plate_deterministic = info.deterministic
        self._enumerate_dim, self._local = info.enumerate_dim, info.local
        self._setup, self._estimator = prepared.setup, prepared.estimator
        self.log_likelihood_indices = prepared.log_likelihood_indices
        self._model_rows = model_rows(info.plates)

    def _setup_arrays(self):
        """The set-up the step reads, as the arrays a chain's state carries
        (:class:`~numpyro_sgbd.state.SetupArrays`): L and the control variates'
        fixed centre. Every leaf an array, so that a later run's set-up is an
        argument of the programs compiled for the first, not a constant."""
        est, centre = self._estimator, None
        if isinstance(est, ControlVariateEstimator) and est.centre is not None:
            centre = (est.centre, est.centre_potential, est.centre_grad)
            centre = jax.tree.map(jnp.asarray, centre)
        return SetupArrays(self.preconditioner, centre)

    def _choose(self, plates, shapes, local=None):
        """``(noise_form, gradient)`` for these plates and local sites: the noise
        the sampler's rule needs from the estimator (raises where it needs one
        subsample plate and the model has several) and the estimator, once the
        defaults that depend on the plates are resolved."""
        noise_form = self._resolve_noise_form(self._noise_form(), shapes, plates)
        if self._default_options(plates, local):
            noise_form = self._noise_form()
        if noise_form is not None and len(plates) > 1:
            who, fix = self._noise_needed_by()
            raise ValueError(
                f"{who} estimates the gradient noise from the per-datum gradients of "
                f"one subsample plate, but the model subsamples {sorted(plates)}. "
                f"{fix}Subsample a single plate."
            )
        return noise_form, self._gradient

    def _start(self, rng_key, batched, init_params, model_args, model_kwargs):
        """``(rng_key, z)``: the chains' keys and initial points: drawn from the
        Laplace approximation with a preconditioner and no ``init_params``, else
        ``init_params`` or a point of the init strategy."""
        if init_params is None and self.preconditioner is not None:
            pre, mode = self.preconditioner, self._setup.mode
            rng_key, z = laplace_start(
                self._programs["start"], pre, mode, rng_key, batched
            )
            if not self._local:
                return rng_key, z
            # Each chain's rows from their Laplace approximations at the mode.
            keys = jax.vmap(random.split)(rng_key) if batched else random.split(rng_key)
            rng_key, key_rows = (keys[:, 0], keys[:, 1]) if batched else keys
            chains = jnp.shape(rng_key)[:1] if batched else ()
            first = key_rows[0] if batched else key_rows
            rows = draw_rows(first, self._setup.local_rows, self._local, chains)
            return rng_key, {**z, **rows}
        if batched:
            rng_key, key_init = jnp.swapaxes(jax.vmap(random.split)(rng_key), 0, 1)
        else:
            rng_key, key_init = random.split(rng_key)
        if isinstance(init_params, ParamInfo):  # as NumPyro's HMC accepts
            init_params = init_params.z
        if self._model is None:
            if init_params is None:
                raise ValueError(
                    "init_params is required with potential_fn or gradient_fn: pass "
                    "mcmc.run(rng_key, init_params=...)."
                )
            return rng_key, init_params
        given = {} if init_params is None else dict(init_params)
        local = {k: given.pop(k) for k in self._local if k in given}
        if self._local and not local:
            key = random.fold_in(key_init[0] if batched else key_init, 2)
            chains = jnp.shape(rng_key)[:1] if batched else ()
            local = initial_local(key, self._local, chains)
        if init_params is not None:
            check_init_params(given, self._z_shapes)
            return rng_key, {**given, **local}
        model = self._model_at(self._model_rows)
        if self._local:  # the global sites' start, given the local sites' rows
            one = jax.tree.map(lambda x: x[0], local) if batched else local
            rows = gather_local(one, self._local, *self._model_rows.values())
            model = handlers.condition(model, constrained_local(rows, self._local))
        z = initial_params(
            self._programs["init_params"],
            model,
            self._init_strategy,
            self._z_shapes,
            key_init,
            model_args,
            model_kwargs,
        )
        return rng_key, {**z, **local}

    def _shapes_of(self, one_z):
        """The latent sites' shapes: the model's, or those of ``one_z`` (one
        chain's position) for a potential_fn or gradient_fn."""
        if self._model is not None:
            return self._z_shapes
        if isinstance(one_z, dict):
            return {k: tuple(jnp.shape(v)) for k, v in one_z.items()}
        return jax.tree.map(lambda x: tuple(jnp.shape(x)), one_z)

    @property
    def _draw_shapes(self):
        """The shapes of every site in z, the local sites' N rows included."""
        local = {k: s.shape for k, s in self._local.items()}
        return {**(self._z_shapes or {}), **local}

    def _probe(self, one_z, model_args, model_kwargs):
        """A user's potential_fn or gradient_fn: its estimate checked before
        compiling (the model's own estimators give z's structure and the noise
        form the kernel asked for by construction)."""

        def probe_fn(rng_key, z):
            centre = self._estimator.initial_centre(z, model_args, model_kwargs)
            return self._estimator.estimate(
                rng_key, z, model_args, model_kwargs, centre
            )

        probe = jax.eval_shape(probe_fn, random.key(0), one_z)
        if jax.tree.structure(probe.z_grad) != jax.tree.structure(one_z):
            raise ValueError(
                "The gradient estimate does not have the structure of z: "
                f"{jax.tree.structure(probe.z_grad)} vs {jax.tree.structure(one_z)}."
            )
        self._check_probe(probe, one_z)

    def _cached_init(self, model_args, model_kwargs):
        """The compiled initial-state function for these model arguments, with
        the set-up's arrays among its arguments: kept for later data of the same
        shapes."""

        def make(rebuild):
            def init_from_arrays(rng_key, z, arrays):
                args, kwargs, values, _ = rebuild(arrays)
                return self._init_state(rng_key, z, args, kwargs, values)

            return init_from_arrays

        programs = self._programs["init"]
        values = self._setup_arrays()
        # The adaptation's static values are part of the key: a refit with
        # another warmup or run length traces again.
        static = (self._num_warmup, self._run_steps)
        fn, arrays = programs.over_data(make, model_args, model_kwargs, values, static)
        return lambda rng_key, z: fn(rng_key, z, arrays)

    def _recentre(self, state, model_args, model_kwargs):
        """The control variates' centre after this step (re-centring in warmup)."""
        return self._estimator.recentre(
            state.centre,
            state.z,
            state.i,
            self._num_warmup,
            model_args,
            model_kwargs,
            batched=self._batched,
        )

    def postprocess_fn(self, model_args, model_kwargs):
        if self._model is None:
            return identity
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if self._plates is None:
            self._build(model_args, model_kwargs)
        # A minibatch's rows will do: only the global sites are kept. (With
        # enumerated sites the model sums them out: none is drawn.)
        indices = self._model_rows
        drop, model = self._plate_deterministic, self._model_at(indices)
        local = self._local

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

        programs = self._programs["postprocess"]
        fn, arrays = programs.over_data(make, model_args, model_kwargs)
        return lambda z: fn(z, arrays)
