"""The one NumPyro kernel class of every sampler, over the pure pair, as NumPyro's
``HMC`` is over ``hmc()``.

:class:`SGKernel` is the :class:`~numpyro.infer.mcmc.MCMCKernel` side (``init``,
``sample``, ``postprocess_fn``, diagnostics, pickling) of
:func:`numpyro_sgbd.core.build_kernel`'s ``(init_kernel, sample_kernel)``. A
sampler is a :class:`~numpyro_sgbd.spec.SamplerSpec` (its update family,
arguments, variants, noise and step bounds) and its class sets only ``spec``:
nothing here branches on the sampler. What ``init`` prepares from the model
and its data is a :class:`~numpyro_sgbd.prepared_model.PreparedModel`; the
run checks are wired in by :mod:`numpyro_sgbd.monitoring.run`.
"""

import logging
from typing import Any, NamedTuple

import jax
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from numpyro_sgbd import core
from numpyro_sgbd import spec as specs
from numpyro_sgbd.estimators import Centre
from numpyro_sgbd.monitoring import Monitor, driving_mcmc, mode, wall_time
from numpyro_sgbd.monitoring.checks import on_progress
from numpyro_sgbd.monitoring.run import (
    Monitored,
    after_sample,
    check_closed_over,
    start_trace,
)
from numpyro_sgbd.prepare import eager_if_traced, has_tracer
from numpyro_sgbd.prepared_model import PreparedModel
from numpyro_sgbd.sampler_config import SamplerConfig
from numpyro_sgbd.setup import Setup
from numpyro_sgbd.sharding import check_untransformed
from numpyro_sgbd.state import SGState, family_state
from numpyro_sgbd.step_programs import StepPrograms
from numpyro_sgbd.validation import warn_unadapted

__all__ = ["Centre", "RunShape", "SGKernel", "SGState", "family_state", "wall_time"]

logger = logging.getLogger("numpyro_sgbd")


class RunShape(NamedTuple):
    """What a run's checks need of the kernel: warmup (in SG steps) and SG
    steps per sample, the given step (per site, or a scalar in u; ``None``
    when adapted), the gradient estimator's kind, whether the noise covariance
    comes from a second minibatch, and whether the kernel runs a model."""

    num_warmup: int
    num_steps: int
    fixed_step: Any
    gradient: Any
    independent_noise: bool
    has_model: bool


def run_steps(mcmc, num_steps):
    """The sampling steps of ``mcmc``'s run, every chain's (``num_steps`` SG
    steps a sample), or ``None`` without an MCMC."""
    if mcmc is None:
        return None
    return int(mcmc.num_samples) * int(mcmc.num_chains) * int(num_steps)


class SGKernel(Monitored, MCMCKernel):
    """A stochastic-gradient sampler for NumPyro's ``MCMC``: the sampler's
    :class:`~numpyro_sgbd.spec.SamplerSpec` (the class attribute ``spec``) run
    by the core's pure pair. Construct one of :mod:`numpyro_sgbd.samplers`;
    :class:`~numpyro_sgbd.SGBD` documents the arguments they share."""

    sample_field = "z"
    spec = None
    __signature__ = specs.SpecSignature()

    def __init__(self, model=None, potential_fn=None, gradient_fn=None, **kwargs):
        if self.spec is None:
            raise TypeError("SGKernel runs a sampler's spec: construct SGBD, SGLD, ...")
        sources = (model, potential_fn, gradient_fn)
        self._config = config = SamplerConfig(self.spec, sources, kwargs)
        request = config.request(type(self).__name__)
        self._prepared = PreparedModel(sources, request, config.args["init_strategy"])
        self._steps = StepPrograms(config, self._prepared)
        # Whether the last `init` saw traced model arguments (inside the user's
        # jax.jit): its data-derived values must not outlive it (`_sample_fn`).
        self._traced_setup = False
        self._diagnostics = (0, "")
        self._monitor = Monitor()  # the host side of the run checks

    def pure_pair(self, values, estimator=None):
        """The core's ``(init_kernel, sample_kernel)`` of one chain
        (:func:`core.build_kernel`), its set-up (L and the centre) read from
        ``values``, a chain's ``state.setup``; with ``estimator`` in place of the
        kernel's own where given (:func:`~numpyro_sgbd.tune`'s sized estimates).
        After :meth:`prepare`."""
        return self._steps.pure_pair(values, estimator)

    # --------------------------------------------------------- what users read
    @classmethod
    def step_target(cls):
        """The step size in the whitened coordinates u (unit posterior scale)
        that ``step_size=None`` starts from and never exceeds, and that
        :func:`~numpyro_sgbd.tune`'s grid of steps is centred on."""
        return cls.spec.step_target

    def bias_law(self):
        """This kernel's :class:`~numpyro_sgbd.discretisation.BiasLaw` (its
        variant's, measured by ``benchmarks/bias_laws.py``), or ``None`` where
        none is measured (another hyperparameter than the law's, or one per
        site)."""
        return self._config.bias_law()

    @property
    def variant(self):
        """The variant: as given, or by default ``"corrected"`` with
        ``step_size=None`` (``"vanilla"`` for a model with several subsample plates,
        whose noise cannot be estimated) and ``"vanilla"`` otherwise."""
        return self._config.variant

    @property
    def noise_form(self):
        """What the step needs from the gradient estimator besides the gradient:
        ``None``, ``"sd"`` (the corrected variants) or NOGIN's covariance form
        (``"lowrank"``, ``"full"`` or ``"diag"``, chosen at ``init`` with
        ``covariance="auto"``)."""
        return self._config.noise_form

    @property
    def default_fields(self):
        """``z``, the per-draw statistics every state has and the sampler's own
        (see its state type)."""
        noise = ("potential_energy_estimate", "mean_noise_sd")
        if "tolerance_exceeded" in self.spec.state_type._fields:
            noise += ("tolerance_exceeded",)
        return ("z", *noise, *self._config.statistics, "num_nonfinite")

    @property
    def num_steps(self):
        """SG steps per sample, as given (default 1)."""
        return self._config.options.num_steps

    @property
    def sample_kernel(self):
        """After ``init``: the pure, jittable step ``sample_kernel(state,
        model_args, model_kwargs) -> state`` of this kernel's chains (vectorized
        over their leading axis when ``init`` was given several), without the
        host-side checks of :meth:`sample`; ``None`` before ``init``."""
        return self._steps.sample_impl

    @property
    def config(self):
        """The sampler as constructed: its spec, arguments and their resolved
        defaults (:class:`~numpyro_sgbd.sampler_config.SamplerConfig`)."""
        return self._config

    @property
    def prepared(self):
        """What ``init`` prepared from the model and its data
        (:class:`~numpyro_sgbd.prepared_model.PreparedModel`)."""
        return self._prepared

    @property
    def setup(self):
        """What ``init`` found from the model and its data, as one immutable
        :class:`~numpyro_sgbd.setup.Setup` (the mode, the preconditioner, the
        control variates' centre); every field ``None`` before ``init``."""
        return self._prepared.setup

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
        self._prepared.setup = setup

    @property
    def preconditioner(self):
        """The change of variables z = z_hat + L u, built by ``init``
        (:class:`~numpyro_sgbd.preconditioning.Preconditioner`), or ``None``."""
        return self._prepared.setup.preconditioner

    @property
    def adaptation_info(self):
        """After ``init`` with a preconditioner or ``step_size=None``: the mode
        search's report, L's form, memory and cost, and the step size's target."""
        return self._prepared.setup.adaptation_info

    @property
    def centre_info(self):
        """After ``init`` with ``gradient="control_variates"``: the first centre
        (unconstrained, by site), how it was found, and the search's report."""
        return self._prepared.setup.centre_info

    @property
    def estimator(self):
        """After ``init``: the gradient estimator (:mod:`numpyro_sgbd.estimators`),
        whose ``estimate(rng_key, z, model_args, model_kwargs, centre)`` gives the
        :class:`~numpyro_sgbd.GradientEstimate` the step uses."""
        return self._prepared.estimator

    @property
    def log_likelihood_indices(self):
        """After ``init``: the rows of each subsample plate :attr:`model` fixes
        (``None`` before, or without a model)."""
        return self._prepared.log_likelihood_indices

    @property
    def model(self):
        """The model as ``az.from_numpyro`` and :class:`~numpyro.infer.Predictive`
        read it: by default every row of each subsample plate up to 50,000 (see
        :meth:`~numpyro_sgbd.prepared_model.PreparedModel.evaluated_model`);
        ``None`` for kernels built from ``potential_fn`` or ``gradient_fn``."""
        return self._prepared.evaluated_model(type(self).__name__)

    # ------------------------------------------------------------ preparing
    def prepare(self, model_args, model_kwargs, one_z=None):
        """Prepare from the model and its data as ``init`` does, compiling
        nothing: the set-up (or the one :meth:`use_setup` gave), the estimator,
        the defaults that depend on the plates, and with ``one_z`` (one chain's
        global sites) the hyperparameters against its shapes."""
        self._config.reset()
        self._prepared.build(model_args, model_kwargs, self._config.choose)
        if one_z is not None:
            self._resolve(one_z)

    def _resolve(self, one_z):
        """The step size and hyperparameters against the shapes of ``one_z``,
        one chain's global sites."""
        shapes = self._prepared.shapes_of(one_z)
        self._config.resolve(shapes, one_z, self.preconditioner is not None)

    def noise_bound(self, noise_sd, batch_ndim=0):
        """``(tau, value)`` for the corrected variant's bound ``step * tau^2 <= 2 *
        value`` (recipe paper, eq. 9): ``tau`` the largest noise sd of the
        minibatch gradient, one per chain over the leading ``batch_ndim`` axes,
        and ``value`` the smallest entry of the diffusion hyperparameter; ``None``
        for a sampler without such a bound or where the noise is not estimated.
        After ``init``."""
        return self._config.noise_bound(noise_sd, batch_ndim)

    # ------------------------------------------------------------ MCMC API
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        self._monitor.start()
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        check_untransformed(has_tracer(rng_key), (model_args, model_kwargs))
        self._traced_setup = has_tracer((model_args, model_kwargs))
        # Inside pmap or the user's jax.jit, what the kernel keeps on itself is
        # computed eagerly, so that no tracer outlives the transform; not
        # otherwise, where eager evaluation would compile every operation of the
        # set-up's programs apart.
        traced = (rng_key, model_args, model_kwargs)
        with eager_if_traced(traced):
            self.prepare(model_args, model_kwargs)
        warn_unadapted(self, num_warmup, self._config.args["step_size"])
        batched = not is_prng_key(rng_key)
        rng_key, z = self._prepared.start(
            rng_key, batched, init_params, model_args, model_kwargs
        )
        one_z = jax.tree.map(lambda x: x[0], z) if batched else z
        with eager_if_traced(traced):
            self._resolve(core.global_sites(one_z, tuple(self._prepared.local)))
        if self._prepared.model is None:
            probe = self._prepared.probe(one_z, model_args, model_kwargs)
            self._config.check_probe(probe, one_z)
        # In steps: `state.i` counts SG steps, num_steps of them per sample.
        k = self.num_steps
        self._steps.start(
            int(num_warmup) * k, run_steps(driving_mcmc(self), k), batched
        )
        init_one = self._steps.init_fn(model_args, model_kwargs)
        state = jax.vmap(init_one)(rng_key, z) if batched else init_one(rng_key, z)
        state = start_trace(self, state, one_z)
        if self.spec.noise_diffusion is not None:
            self._config.check_initial_noise(state, type(self).__name__)
        if self.spec.run_checks is not None:
            state = self.spec.run_checks.start(state, self.run_shape())
        return state

    @property
    def _sample_fn(self):
        """The step, or ``None`` when :meth:`init` must run (again) first. NumPyro's
        ``MCMC`` skips ``init`` when resuming from ``post_warmup_state`` unless this
        is ``None``: after a run inside the user's ``jax.jit`` the kernel's
        data-derived values belonged to that trace, so ``init`` runs again."""
        return None if self._traced_setup else self._steps.sample_impl

    def sample(self, state, model_args, model_kwargs):
        # Runs in Python when NumPyro traces its loop, at the start of each run.
        self._monitor.start()
        self._monitor.new_run(mode())
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if has_tracer(state) and not has_tracer((model_args, model_kwargs)):
            sharded = getattr(self.estimator, "sharding", None) is not None
            check_closed_over(sharded, model_args, model_kwargs)
        # The records stay out of the step (and its non-finite guard, which
        # selects between whole states): written once per sample.
        trace, checks = getattr(state, "trace", None), self.spec.run_checks
        if trace is not None:
            state = state._replace(trace=None)
        kept = {} if checks is None else {k: getattr(state, k) for k in checks.fields}
        state = state._replace(**dict.fromkeys(kept))
        new_state = self._steps.steps_fn(model_args, model_kwargs)(state)
        new_state = after_sample(
            self, state, new_state, trace, model_args, model_kwargs
        )
        if checks is None:
            return new_state
        return checks.after(kept, state, new_state, self.run_shape(), self._warn)

    def postprocess_fn(self, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if self._prepared.model is not None and self._prepared.plates is None:
            self.prepare(model_args, model_kwargs)
        return self._prepared.postprocess_fn(model_args, model_kwargs)

    # ------------------------------------------------------------ run checks
    def run_shape(self):
        """What the run checks need of this kernel (:class:`RunShape`)."""
        return RunShape(
            self._steps.num_warmup,
            self.num_steps,
            self._config.step_size,
            self._config.gradient,
            self._config.independent_noise(),
            self._prepared.model is not None,
        )

    def _warn(self, kind, *values):
        """Record and give the sampler's own run warning ``kind``."""
        self._monitor.record_warning(kind)
        self.spec.run_checks.warnings[kind](self.run_shape(), *values)

    def recorded_checks(self, state, take):
        """The sampler's own checks after the run, from what its ``state``
        recorded (``take(field)``: the field of the checked chains, on the host),
        as ``[(iteration, kind, check)]`` (see
        :func:`~numpyro_sgbd.monitoring.check_run`)."""
        checks = self.spec.run_checks
        if checks is None:
            return []
        return checks.recorded(state, take, self.run_shape(), self._warn)

    def get_diagnostics_str(self, state):
        # With the bar on, the run checks after the run are made here, at the
        # run's last sample (see numpyro_sgbd.monitoring.checks).
        on_progress(self, state)
        # The progress bar asks after every step; reading the state forces a
        # device sync, so refresh the text only every 100 steps.
        calls, text = self._diagnostics
        if calls % 100 == 0:
            text = self._config.describe(state)
        self._diagnostics = (calls + 1, text)
        return text

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_monitor"] = self._monitor.for_pickling()
        return state
