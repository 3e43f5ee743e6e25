"""The NumPyro adapter of the samplers: the glue between NumPyro's ``MCMC`` and
the pure pieces, as NumPyro's ``HMC`` class is over ``hmc()``.

:class:`_SGKernel` is the :class:`~numpyro.infer.mcmc.MCMCKernel` side (``init``,
``sample``, ``postprocess_fn``, diagnostics, pickling) over the pure pair of
:func:`numpyro_sgbd.core.build_kernel`; what ``init`` prepares from the model and
its data is computed by :mod:`numpyro_sgbd.prepare` and kept in a
:class:`~numpyro_sgbd.setup.Setup`, the shared arguments are checked in
:mod:`numpyro_sgbd.options`, and the run checks are wired in by
:mod:`numpyro_sgbd.monitoring.run`. :class:`_FamilyKernel` runs any pure update
family of :mod:`numpyro_sgbd.updates` on it with no branch on the sampler. The
samplers themselves are in :mod:`numpyro_sgbd.samplers`.
"""

from abc import abstractmethod
import logging

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from numpyro_sgbd import advice, core, preconditioning
from numpyro_sgbd.estimators import Centre, with_setup
from numpyro_sgbd.local_sites import local_update
from numpyro_sgbd.model_side import ModelSide
from numpyro_sgbd.monitoring import Monitor, driving_mcmc, mode, wall_time
from numpyro_sgbd.monitoring.checks import on_progress
from numpyro_sgbd.monitoring.run import (
    Monitored,
    after_sample,
    check_closed_over,
    start_trace,
)
from numpyro_sgbd.options import (
    _per_site,
    check_keyword_names,
    kernel_options,
)
from numpyro_sgbd.prepare import (
    Programs,
    eager_if_traced,
    has_tracer,
)
from numpyro_sgbd.setup import Setup, dimension
from numpyro_sgbd.sharding import check_untransformed
from numpyro_sgbd.state import SGState, family_state
from numpyro_sgbd.validation import warn_unadapted

__all__ = ["Centre", "SGState", "family_state", "wall_time"]

logger = logging.getLogger("numpyro_sgbd")

_PROGRAMS = ("init", "init_params", "postprocess", "start", "steps")


def run_steps(mcmc, num_steps):
    """The sampling steps of ``mcmc``'s run, every chain's (``num_steps`` SG
    steps a sample), or ``None`` without an MCMC."""
    if mcmc is None:
        return None
    return int(mcmc.num_samples) * int(mcmc.num_chains) * int(num_steps)


class _SGKernel(ModelSide, Monitored, MCMCKernel):
    """The one adapter from NumPyro models (or potentials, or noisy gradients) to
    the pure update rules: ``init``, ``sample``, ``postprocess_fn``, diagnostics
    and pickling. The step is the core's (:func:`core.build_kernel`) for the
    update family a subclass gives (``_family``): :class:`_FamilyKernel` for the
    rules of :mod:`numpyro_sgbd.updates` with per-site hyperparameters, NOGIN
    for its integrator on the flat position."""

    sample_field = "z"
    #: The shared options a sampler's constructor does not take.
    _NOT_TAKEN = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_keyword_names(cls)

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size=None,
        preconditioner=None,
        adapt_mass_matrix=None,
        gradient=None,
        centre=None,
        recentre_every=None,
        replace=None,
        init_strategy=init_to_uniform,
        log_likelihood_size=None,
        chunk_size=4096,
        num_steps=1,
    ):
        options = kernel_options(
            model=model,
            potential_fn=potential_fn,
            gradient_fn=gradient_fn,
            step_size=step_size,
            replace=replace,
            log_likelihood_size=log_likelihood_size,
            gradient=gradient,
            centre=centre,
            chunk_size=chunk_size,
            recentre_every=recentre_every,
            preconditioner=preconditioner,
            adapt_mass_matrix=adapt_mass_matrix,
            num_steps=num_steps,
            scale_bounded=self._SCALE_MAX is not None,
        )
        self._model, self._potential_fn = model, potential_fn
        self._gradient_fn, self._step_size_arg = gradient_fn, step_size
        self._recentre_every = options.recentre_every
        # SG steps per sample: the user's, never a timing's (the draws are a
        # function of the seed and the arguments, with the bar on or off).
        self._num_steps = options.num_steps
        self._preconditioner_arg = options.preconditioner
        self._adapt_mass = options.adapt_mass
        self._gradient_arg = self._gradient = options.gradient
        self._centre_arg, self._chunk_size, self._replace = centre, chunk_size, replace
        self._init_strategy = init_strategy
        self._log_likelihood_size = log_likelihood_size
        # What `init` finds from the model and its data: see `setup`.
        self._setup = Setup()
        # Set by `init`: the run's warmup in steps, the model's plates, shapes and
        # evaluation rows, the estimator, the checked step and the compiled step.
        self._num_warmup = 0
        # The sampling steps of the run `init` is called for, every chain's
        # (`None` for a kernel driven by hand): see `discretisation.sampling_step`.
        self._run_steps = None
        self._plates, self._z_shapes, self._plate_deterministic = None, None, ()
        self._enumerate_dim, self._local = None, {}
        self.log_likelihood_indices = None
        self._estimator = self._step_size = self._sample_impl = None
        self._batched = False
        # Whether the last `init` saw traced model arguments (inside the user's
        # jax.jit): its data-derived values must not outlive it (`_sample_fn`).
        self._traced_setup = False
        self._programs = {name: Programs(name != "steps") for name in _PROGRAMS}
        self._diagnostics = (0, "")
        # The host side of the run checks: see numpyro_sgbd.monitoring.
        self._monitor = Monitor()

    def _prepare(self, shapes, one_z):
        """Validate the hyperparameters against z's shapes (before compiling)."""
        if self._step_size_arg is None:
            self._step_size = None
        elif self.preconditioner is not None:
            self._step_size = jnp.asarray(self._step_size_arg, jnp.result_type(float))
        else:
            self._step_size = _per_site(self._step_size_arg, shapes, "step_size")

    def _check_probe(self, probe, one_z):
        """Validate the shapes of a gradient estimate (before compiling)."""

    def _diagnostic_parts(self, state):
        return []

    #: The step size in the whitened coordinates u (unit posterior scale) that
    #: ``step_size=None`` starts from and never exceeds; subclasses set it.
    _STEP_TARGET = 0.5
    #: The sampling step as a fraction of the step warmup ends with (warmup
    #: explores at the target, sampling trades speed for a smaller bias).
    _SAMPLING_FRACTION = 1.0
    #: The largest s ``adapt_mass_matrix`` may set (``None``: no bound, and the
    #: option is on by default with ``step_size=None``). The Langevin-type rules
    #: are stable only for steps below about 2 / sqrt(curvature), and L gives u
    #: unit curvature at the mode, so SGLD and NOGIN set 1 (s may only shrink
    #: the steps) and SGBD, whose bounded moves are robust to the step, none.
    _SCALE_MAX = None
    #: ``step_size=None`` warns when warmup ends with a step below this fraction
    #: of the kernel's target in u.
    _STEP_WARN_FRACTION = 0.1
    #: The rule's discretisation bias law in u by variant
    #: (:class:`~numpyro_sgbd.discretisation.BiasLaw`), from which the default
    #: sampling step serves the run's length and a run states its own error; a
    #: variant without one samples at ``_SAMPLING_FRACTION`` of warmup's step.
    _BIAS_LAWS = {}
    #: The hyperparameters the laws were measured at, by name: with another
    #: value (or one per site) the kernel has no law.
    _BIAS_LAW_AT = {}
    #: ``allowed(state)``, the step the noise allows now, where a sampler bounds
    #: its step by its own statistic (NOGIN's damping); ``None``: the core's
    #: :func:`~numpyro_sgbd.core.step_allowed`.
    _step_allowed = None

    @classmethod
    def step_target(cls):
        """The step size in the whitened coordinates u (unit posterior scale)
        that ``step_size=None`` starts from and never exceeds, and that
        :func:`~numpyro_sgbd.tune`'s grid of steps is centred on."""
        return cls._STEP_TARGET

    def bias_law(self):
        """This kernel's :class:`~numpyro_sgbd.discretisation.BiasLaw` (its
        variant's, measured by ``benchmarks/bias_laws.py``), or ``None`` where
        none is measured: the recipe's depends on its ``diffusion``, SGHMC's
        and SGNHT's were measured at their default hyperparameters only, and
        SGBD's with the bimodal increment. NOGIN's and BAOAB's have ``c = 0``:
        they sample a Gaussian's variances without a measurable bias."""
        hyper = getattr(self, "_hyperparameters", {})
        for name, value in self._BIAS_LAW_AT.items():
            given = hyper.get(name)
            if isinstance(given, dict) or np.ndim(given) or given != value:
                return None
        return self._BIAS_LAWS.get(getattr(self, "_variant", None))

    @abstractmethod
    def _family(self):
        """Each sampler's update family as the core's value (:class:`core.Family`)."""

    def _noise_step_bound(self, largest):
        """The largest step the noise allows at the largest noise sd ``largest``
        (:func:`core.noise_step_bound`; SGBD and SGLD bound ``tau * step``)."""
        return core.noise_step_bound(self._family(), largest)

    # ------------------------------------------------------------- the core
    def _adaptation(self, preconditioner):
        """The warmup adaptation as the core's value (:class:`core.Adaptation`),
        with ``preconditioner`` (a chain's, from its state)."""
        return core.Adaptation(
            num_warmup=self._num_warmup,
            scale_windows=(
                preconditioning.scale_windows(self._num_warmup)
                if self._adapt_mass
                else (self._num_warmup, ())
            ),
            step_target=self._STEP_TARGET,
            sampling_fraction=self._SAMPLING_FRACTION,
            scale_max=self._SCALE_MAX,
            fixed_step=self._step_size,
            adapt_mass=self._adapt_mass,
            preconditioner=preconditioner,
            bias_law=self.bias_law(),
            run_steps=self._run_steps,
        )

    def _kernel_fns(self, values, estimator=None):
        """The core's ``(init_kernel, sample_kernel)`` for this kernel's family,
        estimator and adaptation (:func:`core.build_kernel`), reading L and the
        centre from ``values`` (a chain's ``state.setup``); ``estimator`` in
        place of the kernel's own where given (``tune``'s sized estimates)."""
        if estimator is None:
            estimator = with_setup(self._estimator, values)
        return core.build_kernel(
            self._family(),
            estimator.estimate,
            estimator.initial_centre,
            self._adaptation(values.preconditioner),
            bound=lambda family, largest: self._noise_step_bound(largest),
            allowed=self._step_allowed,
            local=local_update(self._estimator, self._local, self._num_warmup)
            if self._local
            else None,
        )

    def _init_state(self, rng_key, z, model_args, model_kwargs, values):
        state = self._kernel_fns(values)[0](rng_key, z, model_args, model_kwargs)
        return state._replace(setup=values)

    def _sample_one(self, state, model_args, model_kwargs):
        return self._kernel_fns(state.setup)[1](state, model_args, model_kwargs)

    @property
    def num_steps(self):
        """SG steps per sample, as given (default 1)."""
        return self._num_steps

    @property
    def sample_kernel(self):
        """After ``init``: the pure, jittable step ``sample_kernel(state,
        model_args, model_kwargs) -> state`` of this kernel's chains (vectorized
        over their leading axis when ``init`` was given several), without the
        host-side checks of :meth:`sample`; ``None`` before ``init``."""
        return self._sample_impl

    # ------------------------------------------------------------------ MCMC API
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        self._monitor.start()
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        # In steps: `state.i` counts SG steps, num_steps of them per sample.
        self._num_warmup = int(num_warmup) * self._num_steps
        self._run_steps = run_steps(driving_mcmc(self), self._num_steps)
        check_untransformed(has_tracer(rng_key), (model_args, model_kwargs))
        self._traced_setup = has_tracer((model_args, model_kwargs))
        # Inside pmap or the user's jax.jit, what the kernel keeps on itself is
        # computed eagerly, so that no tracer outlives the transform; not
        # otherwise, where eager evaluation would compile every operation of the
        # set-up's programs apart.
        eager = eager_if_traced((rng_key, model_args, model_kwargs))
        with eager:
            self._build(model_args, model_kwargs)
        warn_unadapted(self, num_warmup, self._step_size_arg)
        batched = not is_prng_key(rng_key)
        rng_key, z = self._start(
            rng_key, batched, init_params, model_args, model_kwargs
        )
        one_z = jax.tree.map(lambda x: x[0], z) if batched else z
        with eager_if_traced((rng_key, model_args, model_kwargs)):
            one_global = core.global_sites(one_z, tuple(self._local))
            self._prepare(self._shapes_of(one_z), one_global)
        self._batched = batched
        if self._model is None:
            self._probe(one_z, model_args, model_kwargs)
        init_one = self._cached_init(model_args, model_kwargs)
        if batched:
            state = jax.vmap(init_one)(rng_key, z)
            self._sample_impl = jax.vmap(self._sample_one, in_axes=(0, None, None))
        else:
            state = init_one(rng_key, z)
            self._sample_impl = self._sample_one
        return start_trace(self, state, one_z)

    @property
    def _sample_fn(self):
        """The step, or ``None`` when :meth:`init` must run (again) first. NumPyro's
        ``MCMC`` skips ``init`` when resuming from ``post_warmup_state`` unless this
        is ``None``: after a run inside the user's ``jax.jit`` the kernel's
        data-derived values belonged to that trace, so ``init`` runs again."""
        return None if self._traced_setup else self._sample_impl

    def sample(self, state, model_args, model_kwargs):
        # Runs in Python when NumPyro traces its loop, at the start of each run.
        self._monitor.start()
        self._monitor.new_run(mode())
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if has_tracer(state) and not has_tracer((model_args, model_kwargs)):
            sharded = getattr(self._estimator, "sharding", None) is not None
            check_closed_over(sharded, model_args, model_kwargs)
        # The record stays out of the step (and its non-finite guard, which
        # selects between whole states): written once per sample.
        trace = getattr(state, "trace", None)
        if trace is not None:
            state = state._replace(trace=None)
        new_state = self._steps_program(model_args, model_kwargs)(state)
        return after_sample(self, state, new_state, trace)

    def _steps_program(self, model_args, model_kwargs):
        """One sample's steps as a ``jit`` of its own, kept per argument
        structure, monitoring mode and chain layout: NumPyro traces its sampling
        loop again on every run, and a kept ``jit`` is not traced again inside
        it (a later fit's loop only lowers the step). The data are arguments and
        the set-up is in the state, so the program is the same for any data of
        these shapes."""

        def make(rebuild):
            recentre = None if self._recentre_every is None else self._recentre
            steps = core.repeat(self._sample_impl, self._num_steps, recentre)

            def run(state, arrays):
                args, kwargs, _ = rebuild(arrays)
                return steps(state, args, kwargs)

            return run

        how = (mode(), self._batched, self._num_warmup, self._run_steps)
        fn, arrays = self._programs["steps"].over_data(
            make, model_args, model_kwargs, how
        )
        return lambda state: fn(state, arrays)

    def _run_facts(self):
        """What this run was set up with, for :mod:`~numpyro_sgbd.advice`."""
        plates = {k: v[:2] for k, v in (self._plates or {}).items()}
        return advice.RunFacts(
            sampler=type(self).__name__,
            gradient=None if self._model is None else self._gradient,
            adaptive=self._step_size_arg is None,
            plates=plates,
            dim=dimension(self._draw_shapes),
            num_warmup=self._num_warmup // self._num_steps,
            local=bool(self._local),
        )

    def _recorded_checks(self, state, take):
        """A sampler's own checks after the run, from what its ``state`` recorded
        (``take(field)``: the field of the checked chains, on the host), as
        ``[(iteration, kind, check)]`` (see
        :func:`~numpyro_sgbd.monitoring.check_run`); none here."""
        return []

    def get_diagnostics_str(self, state):
        # With the bar on, the run checks after the run are made here, at the
        # run's last sample (see numpyro_sgbd.monitoring.checks).
        on_progress(self, state)
        # The progress bar asks after every step; reading the state forces a
        # device sync, so refresh the text only every 100 steps.
        calls, text = self._diagnostics
        if calls % 100 == 0:
            parts = [f"U_hat {float(state.potential_energy_estimate):.4g}"]
            parts += self._diagnostic_parts(state)
            if int(state.num_nonfinite) > 0:
                parts.append("STOPPED (non-finite)")
            text = ", ".join(parts)
        self._diagnostics = (calls + 1, text)
        return text

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_sample_impl"] = None
        state["_setup"] = self._setup.for_pickling()
        state["_monitor"] = self._monitor.for_pickling()
        if getattr(self._estimator, "sharding", None) is not None:
            # Its mesh holds devices, which do not pickle; `init` rebuilds it.
            state["_estimator"] = None
        return state
