"""The NumPyro adapter of the samplers: model tracing, the gradient estimator,
the start, and the glue between NumPyro's ``MCMC`` and the pure pieces.

:class:`_SGKernel` is the :class:`~numpyro.infer.mcmc.MCMCKernel` side (``init``,
``sample``, ``postprocess_fn``, diagnostics, pickling); :class:`_FamilyKernel` runs
any pure update family of :mod:`numpyro_sgbd.updates` on it with no branch on the
sampler, through :func:`numpyro_sgbd.core.build_kernel` (the step, the warmup
adaptation and the non-finite guard). The shared arguments are checked in
:mod:`numpyro_sgbd.options`, the set-up found by ``init`` is a
:class:`~numpyro_sgbd.setup.Setup`, and the run checks are in
:mod:`numpyro_sgbd.monitoring`. The samplers themselves are in
:mod:`numpyro_sgbd.samplers`.
"""

from collections import namedtuple
import contextlib
import difflib
import functools
import inspect
import logging
import warnings

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.initialization import (
    init_to_uniform,
)
from numpyro.infer.mcmc import MCMCKernel
from numpyro.infer.util import (
    ParamInfo,
    constrain_fn,
    find_valid_initial_params,
    initialize_model,
)
from numpyro.util import identity, is_prng_key, not_jax_tracer

from numpyro_sgbd import advice, core, monitoring, preconditioning
from numpyro_sgbd.estimators import (
    Centre,
    ControlVariateEstimator,
    CustomEstimator,
    MinibatchEstimator,
    PotentialEstimator,
    as_jax_arrays,
    jit_once,
    split_arrays,
)
from numpyro_sgbd.handlers import SubsamplePlates, sample_trace, subsample_plates
from numpyro_sgbd.monitoring import wall_time
from numpyro_sgbd.options import (
    _per_site,
    kernel_options,
)
from numpyro_sgbd.setup import Setup, dimension, find_centre, find_preconditioner
from numpyro_sgbd.sharding import any_sharded, data_sharding
from numpyro_sgbd.validation import (
    check_plate_data,
    check_real,
    warn_unadapted,
)

__all__ = ["Centre", "SGState", "family_state", "wall_time"]

logger = logging.getLogger("numpyro_sgbd")

#: The fields every kernel's state on :class:`_FamilyKernel` has, in order; a
#: sampler's own statistics (``kinetic_energy``, ``thermostat``, ...) go between
#: ``tolerance_exceeded`` and ``num_nonfinite`` (see :func:`family_state`).
_FAMILY_HEAD = (
    "i",
    "z",
    "z_grad",
    "potential_energy_estimate",
    "noise_sd",
    "mean_noise_sd",
    "tolerance_exceeded",
)
_FAMILY_TAIL = (
    "num_nonfinite",
    "centre",
    "rng_key",
    "step_size",
    "scale",
    "aux",
    "trace",
)


def family_state(name, statistics=(), *, module=None):
    """The state type of a kernel on :class:`_FamilyKernel`: :class:`SGState`'s
    fields, the sampler's own per-draw ``statistics`` (scalars, collected by
    default) before ``num_nonfinite``, and last ``aux``, the update family's own
    state (e.g. position and momentum) over the flat position in u with a
    preconditioner, over z's pytree without. Assign it to a module-level name
    equal to ``name`` in ``module`` (the caller's ``__name__``) so that it
    pickles."""
    return namedtuple(
        name,
        _FAMILY_HEAD + tuple(statistics) + _FAMILY_TAIL,
        defaults=(None, None, None, None),
        module=module,
    )


SGState = family_state("SGState", module=__name__)
SGState.__doc__ = """
State of the stochastic-gradient kernels; every field but ``z``, ``noise_sd`` and
``rng_key`` is a scalar that ``MCMC.run(..., extra_fields=(...))`` can collect. The
four sampler statistics ``potential_energy_estimate``, ``mean_noise_sd``,
``tolerance_exceeded`` and ``num_nonfinite`` are collected by default
(:attr:`default_fields`), so they reach ``az.from_numpyro(mcmc).sample_stats`` and
:func:`~numpyro_sgbd.compare` without being asked for.

 - **i** - iteration number.
 - **z** - position in unconstrained space (dict of sites for a model).
 - **z_grad** - the minibatch estimate of the potential's gradient at ``z``, from the
   minibatch that the next step uses.
 - **potential_energy_estimate** - the minibatch estimate of the potential at ``z``
   (prior + Jacobian + N/n-scaled minibatch likelihood). It is *not* the full-data
   potential, so it is named differently from NUTS's ``potential_energy`` (which
   ArviZ turns into ``lp``).
 - **noise_sd** - :math:`\\hat\\tau`, the moving average of the per-coordinate noise
   sd of ``z_grad``; ``None`` where the noise is not estimated.
 - **mean_noise_sd** - the mean of :math:`\\hat\\tau` over coordinates (NaN where the
   noise is not estimated).
 - **tolerance_exceeded** - the fraction of coordinates whose last move was outside
   the noise tolerance: :math:`|w| \\ge 1.702/\\hat\\tau` for SGBD,
   :math:`\\hat\\tau\\sigma \\ge 2` for SGLD (NaN where the noise is not estimated).
 - **num_nonfinite** - number of steps refused because they produced a non-finite
   value. Once it is positive the chain has stopped where it was.
 - **centre** - with ``gradient="control_variates"`` and ``recentre_every``, the
   control variates' current centre (a :class:`Centre`); ``None`` otherwise.
 - **rng_key** - random key.
 - **step_size** - with ``step_size=None`` (adapted in warmup), this chain's step
   size in the whitened coordinates u, fixed from the end of warmup; ``None`` when
   the step size was given.
 - **scale** - with ``adapt_mass_matrix`` (SGBD's default with ``step_size=None``),
   this chain's re-estimated per-coordinate sds of u
   (:class:`~numpyro_sgbd.preconditioning.ScaleAdaptation`; its ``scale`` is s,
   fixed from 60 % of warmup): the rule then runs in v = u / s, so each
   coordinate of u moves by ``step_size * s``. ``None`` otherwise.
 - **aux** - the update family's own state
   (:class:`~numpyro_sgbd.updates.position.PositionState` for SGBD and SGLD). Its
   position ``aux.z`` is the flat u with a preconditioner, and ``None`` without
   one (the position is then ``z``, kept once).
 - **trace** - when NumPyro's ``MCMC`` runs the kernel, the thinned sampling
   draws its convergence check reads at the end of the run
   (:class:`~numpyro_sgbd.monitoring.Trace`); ``None`` otherwise.

With a preconditioner (``z = z_hat + L u``, see :mod:`numpyro_sgbd.preconditioning`)
``z`` stays in the model's unconstrained space while ``z_grad`` and ``noise_sd`` are
flat arrays in u.
"""


#: Data larger than this, compiled into NumPyro's sampling loop as constants
#: (``jit_model_args=False``), draw a warning naming ``jit_model_args=True``.
CONSTANT_DATA_WARN_BYTES = 64 * 2**20


def _model_structure(model, model_args, model_kwargs):
    """``(plates, dims, shapes, deterministic)`` of ``model`` from one trace with
    ``init_to_sample`` values: its subsample plates ``{name: (size, n)}``, the
    batch dim of each plate an observed site sits in, the unconstrained shape of
    each latent site, and the deterministic sites inside a subsample plate.
    Validates the model (NumPyro's plate check as NUTS runs it; no discrete
    latent site, none inside a subsample plate).

    The trace is abstract (:func:`jax.eval_shape`): run op by op, it compiled
    some twenty one-operation programs, about a second of a fresh process. Only
    static facts leave it."""
    found = {}
    # NumPy data indexed by the plate's traced indices (X[idx]) must be JAX arrays.
    model_args, model_kwargs = as_jax_arrays((model_args, model_kwargs))

    def structure():
        recorder = SubsamplePlates(model)
        trace = sample_trace(recorder, model_args, model_kwargs)
        # NumPyro's own check of the model's plates, as NUTS runs it (it warns
        # when a batch dimension has no plate). Private in NumPyro: skipped where
        # a version lacks it.
        validate = getattr(numpyro.util, "_validate_model", None)
        if validate is not None:
            validate(trace, plate_warning="loose")
        plates = subsample_plates(trace)
        dims = {}
        shapes = {}
        deterministic = []
        for name, site in trace.items():
            in_plates = [
                f for f in site.get("cond_indep_stack", []) if f.name in plates
            ]
            if site["type"] == "deterministic" and in_plates:
                deterministic.append(name)
            if site["type"] != "sample":
                continue
            if site["is_observed"]:
                for frame in in_plates:
                    dims[frame.name] = frame.dim
                continue
            if site["fn"].support.is_discrete:
                raise ValueError(
                    f"Site '{name}' is a discrete latent variable; stochastic-gradient "
                    "kernels need continuous parameters. Marginalise it out (e.g. "
                    "with a mixture distribution) or observe it."
                )
            if in_plates:
                raise ValueError(
                    f"Site '{name}' is a latent variable inside the subsample plate "
                    f"'{in_plates[0].name}'. Only global parameters can be sampled "
                    "with minibatches: move it out of the plate, or marginalise it."
                )
            unconstrained = biject_to(site["fn"].support).inv(site["value"])
            shapes[name] = tuple(jnp.shape(unconstrained))
        found["out"] = (plates, dims, shapes, deterministic)

    jax.eval_shape(structure)
    return found["out"]


def _has_tracer(tree):
    """Whether any leaf of ``tree`` is a JAX tracer (abstract, inside a transform)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def _eager_if_traced(tree):
    """``jax.ensure_compile_time_eval()`` where ``tree`` holds a tracer (the
    kernel set up inside a transform), else a context that does nothing."""
    return (
        jax.ensure_compile_time_eval()
        if _has_tracer(tree)
        else contextlib.nullcontext()
    )


def _args_key(model_args, model_kwargs):
    """Identity of the model arguments, for caching what was computed from them:
    the arrays themselves (kept alive by the key, so their ids are not reused) and
    the other leaves' values."""
    leaves, treedef = jax.tree.flatten((model_args, model_kwargs))
    arrays = tuple(x for x in leaves if isinstance(x, (np.ndarray, jax.Array)))
    ids = tuple(id(x) if isinstance(x, (np.ndarray, jax.Array)) else x for x in leaves)
    return (treedef, ids), arrays


class _SGKernel(MCMCKernel):
    """The one adapter from NumPyro models (or potentials, or noisy gradients) to the
    pure update rules: ``init``, ``sample``, ``postprocess_fn``, diagnostics and
    pickling. The step is the core's (:func:`core.build_kernel`) for the update
    family a subclass gives (``_family``): :class:`_FamilyKernel` for the rules
    of :mod:`numpyro_sgbd.updates` with per-site hyperparameters, NOGIN for its
    integrator on the flat position."""

    sample_field = "z"

    def __init_subclass__(cls, **kwargs):
        """Give each sampler's constructor a check of its keyword names: a
        misspelt hyperparameter raises at construction, naming the closest valid
        name and all of them (Python's own error names neither). ``help()`` still
        shows the constructor's own signature."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_checks_names", False):
            return
        parameters = inspect.signature(init).parameters
        if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            return
        names = [n for n in parameters if n != "self"]

        @functools.wraps(init)
        def checked(self, *args, **kwargs):
            unknown = [k for k in kwargs if k not in parameters]
            if unknown:
                close = difflib.get_close_matches(unknown[0], names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise TypeError(
                    f"{cls.__name__} got an unexpected keyword argument "
                    f"{unknown[0]!r}{hint}. Its arguments are: {', '.join(names)}."
                )
            return init(self, *args, **kwargs)

        checked._checks_names = True
        cls.__init__ = checked

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size=None,
        replace=None,
        init_strategy=init_to_uniform,
        log_likelihood_size=None,
        gradient=None,
        centre=None,
        chunk_size=4096,
        recentre_every=None,
        preconditioner=None,
        adapt_mass_matrix=None,
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
        preconditioner, adapt_mass_matrix = options.preconditioner, options.adapt_mass
        gradient, recentre_every = options.gradient, options.recentre_every
        self._num_steps = options.num_steps
        self._recentre_every = recentre_every
        self._preconditioner_arg = preconditioner
        self._adapt_mass = bool(adapt_mass_matrix)
        # (start, ends) of the scale windows for this run's num_warmup; see
        # preconditioning.scale_windows.
        self._scale_windows = (0, ())
        # What `init` finds from the model and its data: see `setup`.
        self._setup = Setup()
        self._batched = False
        self._gradient_arg = gradient
        self._gradient = gradient
        self._centre_arg = centre
        self._chunk_size = chunk_size
        self._model = model
        self._potential_fn = potential_fn
        self._gradient_fn = gradient_fn
        self._step_size_arg = step_size
        self._replace = replace
        self._init_strategy = init_strategy
        self._log_likelihood_size = log_likelihood_size
        # Built by `init` from the model and its arguments.
        self._estimator = None
        self._plates = None
        self._plate_deterministic = ()
        self.log_likelihood_indices = None
        self._z_shapes = None
        self._step_size = None
        self._sample_impl = None
        # Whether the last `init` saw traced model arguments (a kernel run inside
        # the user's jax.jit): what it computed from the data is then abstract and
        # must not outlive that trace (see `_sample_fn`).
        self._traced_setup = False
        self._init_fns = {}
        self._init_param_fns = {}
        self._postprocess_fns = {}
        self._start_fn = None  # (cache key, compiled Laplace start)
        self._diagnostics = (0, "")
        self._num_warmup = 0
        #: The kinds of warning the last run gave ("nonfinite", "step", "drift",
        #: "stall", "convergence"), in order; reset when a run starts.
        self.run_warnings = ()
        self.convergence = None
        self._trace_plan = None
        self._convergence_check = None
        # The host side of the run checks: see numpyro_sgbd.monitoring.
        self._monitor = monitoring.Monitor()

    # ------------------------------------------------------- what subclasses set
    def _noise_form(self):
        """What the estimator must return besides the gradient: ``None``, ``"sd"``
        (per-coordinate noise sd) or a covariance form (``"lowrank"``, ...)."""
        return None

    def _noise_needed_by(self):
        """(who needs the noise, how to do without) for error messages."""
        return "", ""

    def _default_options(self, plates):
        """Resolve the options left to ``step_size=None``'s defaults once the
        subsample plates are known (``None`` before the trace: reset them); return
        whether the noise form changed. Control variates need exactly one
        subsample plate."""
        if plates is None:
            self._gradient = self._gradient_arg
            return False
        if self._gradient == "auto":
            self._gradient = "control_variates" if len(plates) == 1 else "minibatch"
        return False

    def _resolve_noise_form(self, noise_form, shapes, plates):
        """The noise form once z's shapes and the subsample plates are known (NOGIN
        chooses its covariance form here)."""
        return noise_form

    def _prepare(self, shapes, one_z):
        """Validate the hyperparameters against z's shapes (before compiling)."""
        if self._step_size_arg is None:
            self._step_size = None
        elif self.preconditioner is not None:
            self._step_size = jnp.asarray(self._step_size_arg, jnp.result_type(float))
        else:
            self._step_size = _per_site(self._step_size_arg, shapes, "step_size")

    # ----------------------------------------------------- adaptation in warmup
    #: The step size in the whitened coordinates u (unit posterior scale) that
    #: ``step_size=None`` starts from and never exceeds; subclasses set it.
    _STEP_TARGET = 0.5
    #: The sampling step as a fraction of the step warmup ends with: warmup
    #: explores at :attr:`_STEP_TARGET` (the scale windows need the chain to
    #: cross the posterior), sampling trades some of that speed for a smaller
    #: discretisation bias; subclasses set it.
    _SAMPLING_FRACTION = 1.0

    #: The largest s ``adapt_mass_matrix`` may set (``None``: no bound, and the
    #: option is on by default with ``step_size=None``). The Langevin-type rules
    #: are stable only for steps below about 2 / sqrt(curvature), and L gives u
    #: unit curvature at the mode: a larger s would take their steps past what
    #: the mode's curvature allows (on a spike-and-slab posterior with s about 4,
    #: SGLD's sd came out 15 % too wide and NOGIN's 54 %), so SGLD and NOGIN set
    #: 1 (s may only shrink the steps) and SGBD, whose bounded moves are robust to
    #: the step, none.
    _SCALE_MAX = None

    def _adaptation(self):
        """The warmup adaptation as the core's value (:class:`core.Adaptation`),
        from what ``init`` set (the run's warmup, L, the given step)."""
        return core.Adaptation(
            num_warmup=self._num_warmup,
            scale_windows=self._scale_windows,
            step_target=self._STEP_TARGET,
            sampling_fraction=self._SAMPLING_FRACTION,
            scale_max=self._SCALE_MAX,
            fixed_step=self._step_size,
            adapt_mass=self._adapt_mass,
            preconditioner=self.preconditioner,
        )

    def _precondition(self, model_args, model_kwargs, shapes, data):
        """Find the full-data mode and build L from the Hessian there (before
        compiling, :func:`~numpyro_sgbd.setup.find_preconditioner`): a new set-up
        for ``data``."""
        pre, mode, value_grad, report = find_preconditioner(
            self._model,
            model_args,
            model_kwargs,
            dimension(shapes),
            self._preconditioner_arg,
            who=type(self).__name__,
            chunk_size=self._chunk_size,
        )
        info = {k: v for k, v in report.items() if k != "mode_search"}
        info.update(
            step_target=self._STEP_TARGET,
            sampling_fraction=self._SAMPLING_FRACTION,
            adapt_mass_matrix=self._adapt_mass,
            mode_search=report["mode_search"],
        )
        self._setup = Setup(
            data=data,
            preconditioner=pre,
            mode=mode,
            mode_value_grad=value_grad,
            adaptation_info=info,
        )

    @property
    def setup(self):
        """What ``init`` found from the model and its data, as one immutable
        :class:`~numpyro_sgbd.setup.Setup` (the mode, the preconditioner, the
        control variates' centre); every field ``None`` before ``init``."""
        return self._setup

    def use_setup(self, setup):
        """Use ``setup`` (another kernel's :attr:`setup`, found from the same data)
        so that ``init`` on those data searches for none of it again. For kernels
        of one model that differ in the sampler, its hyperparameters or a plate's
        subsample size: the full-data mode and gradient do not depend on those."""
        if not isinstance(setup, Setup):
            raise TypeError(
                "use_setup takes another kernel's .setup (a numpyro_sgbd.setup."
                f"Setup), got {type(setup).__name__}."
            )
        self._setup = setup
        self._init_fns = {}

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
    def sample_kernel(self):
        """After ``init``: the pure, jittable step ``sample_kernel(state,
        model_args, model_kwargs) -> state`` of this kernel's chains (vectorized
        over their leading axis when ``init`` was given several), without the
        host-side checks of :meth:`sample`; ``None`` before ``init``. As the
        second function of NumPyro's ``hmc()``."""
        return self._sample_impl

    def _check_probe(self, probe, one_z):
        """Validate the shapes of a gradient estimate (before compiling)."""

    def _diagnostic_parts(self, state):
        return []

    # ------------------------------------------------------------------ model side
    @property
    def model(self):
        """The model with every subsample plate fixed to :attr:`log_likelihood_indices`.

        ``az.from_numpyro`` uses it for ``observed_data`` and ``log_likelihood``:
        both then hold the fixed evaluation subset of the data (of
        ``log_likelihood_size`` points, by default the plate's ``subsample_size``),
        not all N points, so they cost O(n * num_samples) memory (ArviZ 1.x builds
        ``log_likelihood`` only with ``az.from_numpyro(mcmc, log_likelihood=True)``).
        For predictions over all rows use ``Predictive(full_batch(model), ...)``.
        ``None`` for kernels built from ``potential_fn`` or ``gradient_fn``.
        """
        if self._model is None or not self.log_likelihood_indices:
            return self._model
        return handlers.substitute(self._model, data=self.log_likelihood_indices)

    def _build(self, model_args, model_kwargs):
        """Trace the model once, validate it, and set up the gradient estimator."""
        self._default_options(None)
        noise_form = self._noise_form()
        if self._model is None:
            if self._potential_fn is not None:
                self._estimator = PotentialEstimator(self._potential_fn)
            else:
                self._estimator = CustomEstimator(self._gradient_fn)
            return
        check_plate_data(self._model, model_args, model_kwargs)
        plates, dims, shapes, deterministic = _model_structure(
            self._model, model_args, model_kwargs
        )
        if not plates:
            warnings.warn(
                "The model has no subsampled plate, so every step uses the full data "
                "(exact gradients: the unadjusted dynamics). For minibatches "
                "write numpyro.plate(name, N, subsample_size=n).",
                UserWarning,
                stacklevel=3,
            )
        noise_form = self._resolve_noise_form(noise_form, shapes, plates)
        if self._default_options(plates):
            noise_form = self._noise_form()
        if noise_form is not None and len(plates) > 1:
            who, fix = self._noise_needed_by()
            raise ValueError(
                f"{who} estimates the gradient noise from the per-datum gradients of "
                f"one subsample plate, but the model subsamples {sorted(plates)}. "
                f"{fix}Subsample a single plate."
            )
        self._plates = {
            name: (size, n, dims.get(name)) for name, (size, n) in plates.items()
        }
        self._plate_deterministic = tuple(deterministic)
        self._z_shapes = shapes
        sharding = (
            None
            if _has_tracer((model_args, model_kwargs))
            else data_sharding(self._plates, model_args, model_kwargs)
        )
        if self._preconditioner_arg != "none":
            key, arrays = _args_key(model_args, model_kwargs)
            data = self._setup.data
            if data is None or data[0] != key:
                if _has_tracer((model_args, model_kwargs)):
                    raise ValueError(
                        "step_size=None (or a preconditioner) searches for the "
                        "mode with the data in hand, but the model arguments are "
                        "traced (the kernel runs inside jax.jit or another "
                        "transform). Give step_size with preconditioner='none', or "
                        "run MCMC outside the transform."
                    )
                self._precondition(model_args, model_kwargs, shapes, (key, arrays))
        self._estimator = MinibatchEstimator(
            self._model,
            self._plates,
            noise=noise_form == "sd",
            covariance=None if noise_form in (None, "sd") else noise_form,
            replace=self._replace,
            pullback=None if self.preconditioner is None else self.preconditioner.pull,
            sharding=sharding,
        )
        if self._gradient == "control_variates":
            self._estimator = self._control_variates(shapes, model_args, model_kwargs)
        # Drawn by NumPy: a compiled draw_indices here was a compilation of its
        # own in every run.
        rng = np.random.default_rng(0)
        self.log_likelihood_indices = {
            name: jnp.asarray(
                np.sort(
                    rng.choice(
                        size, min(self._log_likelihood_size or n, size), replace=False
                    )
                ).astype(np.int32)
            )
            for name, (size, n) in plates.items()
        }

    def _control_variates(self, shapes, model_args, model_kwargs):
        """The control-variate estimator: the centre (given or searched), and the
        full-data potential and gradient there, computed once in chunks."""
        plain = self._estimator
        if len(self._plates) != 1:
            raise ValueError(
                "gradient='control_variates' needs exactly one subsample plate; the "
                f"model subsamples {sorted(self._plates) or 'none'}."
            )
        if self._centre_arg is None and self._recentre_every is not None:
            # Re-centring from each chain's initial position: no search; the
            # centres live in the state.
            self._setup = self._setup._replace(
                centre_info={"centre": None, "source": "initial position"}
            )
            centre = potential = grad = None
        else:
            centre, potential, grad = self._fixed_centre(
                plain, shapes, model_args, model_kwargs
            )
        return ControlVariateEstimator(
            plain,
            centre=centre,
            centre_potential=potential,
            centre_grad=grad,
            recentre_every=self._recentre_every,
            chunk_size=self._chunk_size,
        )

    def _fixed_centre(self, plain, shapes, model_args, model_kwargs):
        """The given or searched centre with the full-data potential and gradient
        there (:func:`~numpyro_sgbd.setup.find_centre`), kept in the set-up per
        dataset."""
        key, arrays = _args_key(model_args, model_kwargs)
        cached = self._setup.centre
        if cached is not None and cached[0] == key:
            return cached[2]
        if self._centre_arg is None and _has_tracer((model_args, model_kwargs)):
            raise ValueError(
                "gradient='control_variates' searches for its centre with "
                "the data in hand, but the model arguments are traced (the "
                "kernel runs inside jax.jit or another transform). Pass "
                "centre={site: value} (e.g. posterior_mode(model, "
                "*args).params) or run MCMC outside the transform."
            )
        centre, potential, grad, info = find_centre(
            self._setup,
            plain,
            self._model,
            model_args,
            model_kwargs,
            shapes,
            self._centre_arg,
            self._chunk_size,
        )
        self._setup = self._setup._replace(centre_info=info)
        if _has_tracer((potential, grad)):
            return centre, potential, grad
        found = (centre, potential, grad)
        self._setup = self._setup._replace(centre=(key, arrays, found))
        # The compiled initial-state function holds the old centre.
        self._init_fns = {}
        return found

    # ------------------------------------------------------------- re-centring
    def _initial_centre(self, z, model_args, model_kwargs):
        """The state's :class:`Centre` at the start (``None`` unless the estimator
        re-centres: :meth:`ControlVariateEstimator.initial_centre`)."""
        return self._estimator.initial_centre(z, model_args, model_kwargs)

    def _estimate(self, rng_key, z, model_args, model_kwargs, centre):
        """The gradient estimate at ``z``, around the state's centre if it has one."""
        return self._estimator.estimate(rng_key, z, model_args, model_kwargs, centre)

    # ------------------------------------------------------------- the core
    #: ``allowed(state)``, the step the noise allows now, where a sampler bounds
    #: its step by its own statistic (NOGIN's damping); ``None``: the core's
    #: :func:`~numpyro_sgbd.core.step_allowed`.
    _step_allowed = None

    def _family(self):
        """The update family as the core's value (:class:`core.Family`)."""
        raise NotImplementedError

    def _noise_step_bound(self, largest):
        """The largest step the noise allows at the largest noise sd ``largest``
        (:func:`core.noise_step_bound`; SGBD and SGLD bound ``tau * step``)."""
        return core.noise_step_bound(self._family(), largest)

    def _kernel_fns(self):
        """The core's ``(init_kernel, sample_kernel)`` for this kernel's family,
        estimator and adaptation (:func:`core.build_kernel`)."""
        return core.build_kernel(
            self._family(),
            self._estimator.estimate,
            self._estimator.initial_centre,
            self._adaptation(),
            bound=lambda family, largest: self._noise_step_bound(largest),
            allowed=self._step_allowed,
        )

    def _init_state(self, rng_key, z, model_args, model_kwargs):
        return self._kernel_fns()[0](rng_key, z, model_args, model_kwargs)

    def _sample_one(self, state, model_args, model_kwargs):
        return self._kernel_fns()[1](state, model_args, model_kwargs)

    def _initial_params(self, rng_key, init_params, model_args, model_kwargs):
        if isinstance(init_params, ParamInfo):  # as NumPyro's HMC accepts
            init_params = init_params.z
        if self._model is None:
            if init_params is None:
                raise ValueError(
                    "init_params is required with potential_fn or gradient_fn: pass "
                    "mcmc.run(rng_key, init_params=...)."
                )
            return init_params
        if init_params is not None:
            if not isinstance(init_params, dict) or set(init_params) != set(
                self._z_shapes
            ):
                got = (
                    sorted(init_params)
                    if isinstance(init_params, dict)
                    else init_params
                )
                raise ValueError(
                    "init_params must be a dict of unconstrained values for the latent "
                    f"sites {sorted(self._z_shapes)}; got {got}."
                )
            return init_params
        # The search as one compiled function with the data as its arguments:
        # NumPyro's initialize_model runs it op by op, and each op is compiled
        # apart on first use.
        model, strategy = self.model, self._init_strategy
        prototype = {k: jnp.zeros(v) for k, v in self._z_shapes.items()}

        def find(rebuild):
            def find_from_arrays(rng_key, arrays):
                args, kwargs = rebuild(arrays)
                (z, _, _), ok = find_valid_initial_params(
                    rng_key,
                    model,
                    init_strategy=strategy,
                    model_args=args,
                    model_kwargs=kwargs,
                    prototype_params=prototype,
                )
                return z, jnp.all(ok)

            return find_from_arrays

        fn, arrays = self._jit_over_data(
            "_init_param_fns", find, model_args, model_kwargs
        )
        z, ok = fn(rng_key, arrays)
        # Under chain_method="parallel" this runs inside pmap, where the flag
        # is abstract: NumPyro's own initialisation skips its check there too.
        if not not_jax_tracer(ok) or bool(ok):
            return z
        # NumPyro's own path says what is wrong with the model, and raises.
        info = initialize_model(
            rng_key,
            self.model,
            init_strategy=self._init_strategy,
            model_args=model_args,
            model_kwargs=model_kwargs,
        )
        return info.param_info.z

    def _laplace_start(self, rng_key, batched):
        """``(rng_key, z)``: the key split for the initial state, and z drawn from
        the Laplace approximation N(z_hat, L L') with the other half, so that
        chains start apart, near the mode, on the posterior's scale. One compiled
        program, kept per form and shapes, with L as its argument: run op by op
        the split and the draw compiled five programs (a threefry normal among
        them)."""
        pre = self.preconditioner
        cache_key = (pre.form, batched, jax.tree.structure(self._setup.mode)) + tuple(
            (jnp.shape(x), jnp.result_type(x))
            for x in jax.tree.leaves(self._setup.mode)
        )
        if self._start_fn is None or self._start_fn[0] != cache_key:
            unravel = ravel_pytree(self._setup.mode)[1]

            def start(rng_key, arrays):
                pre = preconditioning.Preconditioner(cache_key[0], *arrays)

                def one(key):
                    key, key_init = random.split(key)
                    u = random.normal(key_init, pre.loc.shape, pre.loc.dtype)
                    return key, unravel(pre.to_z(u))

                return jax.vmap(one)(rng_key) if batched else one(rng_key)

            self._start_fn = (cache_key, jit_once(start))
        return self._start_fn[1](rng_key, tuple(pre)[1:])

    # ------------------------------------------------------------------ MCMC API
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        self._monitor.start()
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        # In steps: `state.i` counts SG steps, num_steps of them per sample.
        self._num_warmup = int(num_warmup) * self._num_steps
        self._scale_windows = (
            preconditioning.scale_windows(self._num_warmup)
            if self._adapt_mass
            else (self._num_warmup, ())
        )
        if _has_tracer(rng_key) and any_sharded((model_args, model_kwargs)):
            raise ValueError(
                "The model's data are sharded over devices, and this kernel runs "
                "inside a transform (chain_method='parallel' maps chains onto the "
                "devices the data occupy, or the user's jax.jit): use "
                "chain_method='vectorized' (or 'sequential') and call MCMC.run "
                "outside jax.jit."
            )
        self._traced_setup = _has_tracer((model_args, model_kwargs))
        # Under chain_method="parallel" NumPyro calls `init` inside pmap, and a
        # kernel may run inside the user's jax.jit: what the kernel keeps on itself
        # (evaluation indices, hyperparameters, the centre) is computed eagerly
        # there, so that no tracer outlives the transform. Not otherwise: inside
        # the programs `_build` compiles (mode search, Hessian, centre), eager
        # evaluation would run every operation on constants as a program of its
        # own, each compiled apart (about 100 of them in a fresh process).
        with _eager_if_traced((rng_key, model_args, model_kwargs)):
            self._build(model_args, model_kwargs)
        warn_unadapted(self, num_warmup, self._step_size_arg)
        batched = not is_prng_key(rng_key)
        if init_params is None and self.preconditioner is not None:
            rng_key, z = self._laplace_start(rng_key, batched)
        else:
            if batched:
                rng_key, key_init = jnp.swapaxes(jax.vmap(random.split)(rng_key), 0, 1)
            else:
                rng_key, key_init = random.split(rng_key)
            z = self._initial_params(key_init, init_params, model_args, model_kwargs)
        one_z = jax.tree.map(lambda x: x[0], z) if batched else z
        shapes = (
            self._z_shapes
            if self._model is not None
            else jax.tree.map(lambda x: tuple(jnp.shape(x)), one_z)
        )
        if self._model is None and isinstance(one_z, dict):
            shapes = {k: tuple(jnp.shape(v)) for k, v in one_z.items()}
        with _eager_if_traced((rng_key, model_args, model_kwargs)):
            self._prepare(shapes, one_z)
        self._batched = batched

        if self._model is None:
            # A user's potential_fn or gradient_fn: its estimate checked before
            # compiling. The model's own estimators give z's structure and the
            # noise form the kernel asked for by construction, and tracing one
            # more estimate for them would cost every run a trace of the model.
            def probe_fn(rng_key, z):
                centre = self._initial_centre(z, model_args, model_kwargs)
                return self._estimate(rng_key, z, model_args, model_kwargs, centre)

            probe = jax.eval_shape(probe_fn, random.key(0), one_z)
            if jax.tree.structure(probe.z_grad) != jax.tree.structure(one_z):
                raise ValueError(
                    "The gradient estimate does not have the structure of z: "
                    f"{jax.tree.structure(probe.z_grad)} vs "
                    f"{jax.tree.structure(one_z)}."
                )
            self._check_probe(probe, one_z)
        init_one = self._cached_init(model_args, model_kwargs)
        if batched:
            state = jax.vmap(init_one)(rng_key, z)
            self._sample_impl = jax.vmap(self._sample_one, in_axes=(0, None, None))
        else:
            state = init_one(rng_key, z)
            self._sample_impl = self._sample_one
        return self._start_trace(state, one_z)

    def _start_trace(self, state, one_z):
        """Give ``state`` the convergence check's record when NumPyro's ``MCMC``
        is running the kernel (see :mod:`~numpyro_sgbd.monitoring`)."""
        leaves = jax.tree.leaves(one_z)
        dim = sum(int(np.size(x)) for x in leaves)
        # With monitoring.off() the run keeps no record (nor compiles the check).
        mcmc = monitoring.driving_mcmc(self) if monitoring.enabled() else None
        plan = monitoring.plan(mcmc, dim)
        check = self._convergence_check
        # Sequential and parallel chains each call `init`: a run starts, and the
        # check's pool of chains with it, only where no chain is pending.
        if check is None or check.plan != plan or not check.pending:
            self.run_warnings = ()
            check = None if plan is None else monitoring.ConvergenceCheck(plan)
        self._convergence_check = check
        if plan is None:
            self._trace_plan = None
            return state
        self._trace_plan = plan
        dtype = jnp.result_type(*leaves) if leaves else jnp.float32
        return state._replace(
            trace=monitoring.empty_trace(plan, dtype, jnp.shape(state.i))
        )

    @property
    def _sample_fn(self):
        """The compiled-on-demand step, or ``None`` when :meth:`init` must run
        (again) first. NumPyro's ``MCMC`` skips ``init`` when resuming from
        ``post_warmup_state`` unless this is ``None``: after a run inside the user's
        ``jax.jit`` the kernel's data-derived values belonged to that trace, so
        ``init`` runs again and rebuilds them (its initial state is discarded)."""
        return None if self._traced_setup else self._sample_impl

    def _jit_over_data(self, cache, make, model_args, model_kwargs):
        """``(fn, arrays)``: ``jit_once(make(rebuild))`` (the programs built here
        run once per set-up: the initial search, the initial state, the constrained
        values NumPyro sizes its buffers with), whose last argument is the array
        leaves of the model arguments, and those arrays.

        The arrays are passed to ``jit`` as arguments (data embedded as constants
        makes XLA compile slowly, and anew for every kernel); the other leaves (ints
        such as a subsample size) stay static, put back by ``rebuild``. The compiled
        function is kept in the dict attribute named ``cache``, one per argument
        structure and static values.
        """
        arrays, rebuild, key = split_arrays((model_args, model_kwargs))
        fn = None if key is None else getattr(self, cache).get(key)
        if fn is None:
            fn = jit_once(make(rebuild))
            if key is not None:
                setattr(self, cache, {key: fn})
        return fn, arrays

    def _cached_init(self, model_args, model_kwargs):
        """The jitted initial-state function for these model arguments."""

        def make(rebuild):
            def init_from_arrays(rng_key, z, arrays):
                args, kwargs = rebuild(arrays)
                return self._init_state(rng_key, z, args, kwargs)

            return init_from_arrays

        fn, arrays = self._jit_over_data("_init_fns", make, model_args, model_kwargs)
        return lambda rng_key, z: fn(rng_key, z, arrays)

    def sample(self, state, model_args, model_kwargs):
        # Runs in Python when NumPyro traces its loop, at the start of each run.
        self._monitor.start()
        self._monitor.new_run()
        model_kwargs = {} if model_kwargs is None else model_kwargs
        self._check_closed_over(state, model_args, model_kwargs)

        # The record stays out of the step (and its non-finite guard, which
        # selects between whole states): written once per sample, below.
        trace = getattr(state, "trace", None)
        if trace is not None:
            state = state._replace(trace=None)

        def one_step(state):
            new_state = self._sample_impl(state, model_args, model_kwargs)
            if self._recentre_every is None:
                return new_state
            return new_state._replace(
                centre=self._estimator.recentre(
                    new_state.centre,
                    new_state.z,
                    new_state.i,
                    self._num_warmup,
                    model_args,
                    model_kwargs,
                    batched=self._batched,
                )
            )

        if self._num_steps == 1:
            new_state = one_step(state)
        else:
            # One compiled loop per sample: NumPyro's per-sample costs (the
            # progress bar's Python dispatch, collecting extra_fields) are paid
            # once per num_steps steps.
            new_state = jax.lax.fori_loop(
                0, self._num_steps, lambda _, s: one_step(s), state
            )
        # Once per run: when the first chain stops (vectorized chains share a call).
        first_stop = jnp.any(new_state.num_nonfinite > 0) & jnp.all(
            state.num_nonfinite == 0
        )
        # One host call for the warning, the clock (see `wall_time`) and the
        # stationarity check's thinned draws (see monitoring.notes.Monitor).
        if not monitoring.enabled():
            return new_state if trace is None else new_state._replace(trace=trace)
        due = first_stop | monitoring.clock_due(
            state.i, new_state.i, self._num_warmup, self._num_steps
        )
        # The drift check's draws and the step check's smallest step are formed on
        # the host, from what the state holds: formed here, as operands of the
        # host call's branch, they were computed every step though read once in
        # hundreds (about a third of the notes' cost at n = 100; the rest is the
        # calls themselves, see monitoring.notes).
        scale = None if new_state.scale is None else new_state.scale.scale
        i = monitoring.call_host(
            due,
            self._on_host,
            new_state.i,
            first_stop,
            jax.tree.leaves(new_state.z),
            new_state.step_size,
            scale,
        )
        if trace is None:
            return new_state._replace(i=i)
        plan, k = self._trace_plan, self._num_steps
        before = (state.i - self._num_warmup) // k
        after = (new_state.i - self._num_warmup) // k
        trace = monitoring.record(trace, plan, new_state.z, after)
        ends = monitoring.run_ends(plan, before, after)
        i = monitoring.call_host(ends, self._on_run_end, i, trace.rows)
        return new_state._replace(i=i, trace=trace)

    def _on_run_end(self, i, rows):
        """The convergence check, once every chain's run has ended."""
        if self._convergence_check is None:  # unpickled mid-run: no pool to add to
            return
        found = self._convergence_check.add(rows)
        if found is None:
            return
        #: After an ``MCMC`` run: the convergence check's numbers (see
        #: :func:`~numpyro_sgbd.monitoring.report`), or ``None``.
        self.convergence = found
        if found["converged"]:
            return
        self._record_warning("convergence")
        ess = min(found["min_ess_bulk"], found["min_ess_tail"])
        parts = []
        if ess < monitoring.MIN_ESS:
            parts.append(
                f"a bulk ESS of {found['min_ess_bulk']:.0f} and a tail ESS of "
                f"{found['min_ess_tail']:.0f} (smallest, at "
                f"{self._flat_name(found['worst_ess'])})"
            )
        if found["max_rhat"] > monitoring.MAX_RHAT:
            parts.append(
                f"an R-hat of {found['max_rhat']:.3g} at "
                f"{self._flat_name(found['worst_rhat'])}"
            )
        remedies = advice.convergence_remedies(
            self._run_facts(),
            ess=ess,
            rhat=found["max_rhat"],
            num_samples=self._trace_plan.num_samples,
            warned=self.run_warnings,
        )
        warnings.warn(
            f"{type(self).__name__}: the sampling draws have "
            f"{' and '.join(parts)} (rank-normalised, over {found['num_chains']} "
            f"chain(s) of {found['num_draws']} evenly spaced draws; the check "
            f"wants ESS >= {monitoring.MIN_ESS} and R-hat <= {monitoring.MAX_RHAT})"
            ": means and sds carry Monte Carlo errors too large to trust. "
            f"{advice.join(remedies)} See kernel.convergence.",
            monitoring.ConvergenceWarning,
            stacklevel=2,
        )

    def _check_closed_over(self, state, model_args, model_kwargs):
        """While NumPyro traces its sampling loop: data arrays that arrive concrete
        (``jit_model_args=False``, NumPyro's default, closes over them) become
        constants of the compiled program, a copy of the data in it and compile
        time that grows with them. Sharded data cannot work so (each process
        would need every row); large data draw a warning."""
        if not _has_tracer(state) or _has_tracer((model_args, model_kwargs)):
            return
        if getattr(self._estimator, "sharding", None) is not None:
            raise ValueError(
                "The model's data are sharded over devices, but NumPyro's MCMC "
                "compiles data it closes over into its sampling loop as constants "
                "(jit_model_args=False, its default), which would gather every "
                "shard into one program: pass MCMC(..., jit_model_args=True, "
                "progress_bar=False), which passes the data as arguments and keeps "
                "each shard on its device (with the bar on, NumPyro passes them "
                "through a compiled call every step, a copy of the data each)."
            )
        arrays = [
            x
            for x in jax.tree.leaves((model_args, model_kwargs))
            if isinstance(x, (np.ndarray, jax.Array))
        ]
        nbytes = sum(int(np.size(x)) * np.dtype(x.dtype).itemsize for x in arrays)
        if nbytes > CONSTANT_DATA_WARN_BYTES:
            warnings.warn(
                f"The model's data ({nbytes / 2**20:.0f} MiB) are compiled into "
                "NumPyro's sampling loop as constants (MCMC's jit_model_args=False, "
                "its default): compilation takes longer and the program holds a "
                "copy of the data. Pass MCMC(..., jit_model_args=True, "
                "progress_bar=False), with the data as JAX arrays (jnp.asarray(X)), "
                "to pass them as arguments (with the bar on, NumPyro passes them "
                "through a compiled call every step, a copy of the data each).",
                UserWarning,
                stacklevel=2,
            )

    def _on_host(self, i, first_stop, leaves, step_size, scale):
        """A note from the step: the kernel's :class:`~numpyro_sgbd.monitoring.
        notes.Monitor` takes it."""
        self._monitor.note(self, i, first_stop, leaves, step_size, scale)

    #: ``step_size=None`` warns when warmup ends with a step below this fraction
    #: of the kernel's target in u.
    _STEP_WARN_FRACTION = 0.1

    def _record_warning(self, kind):
        """Note that this run warned (``kind``: "step", "drift", ...), for
        :attr:`run_warnings` and :func:`~numpyro_sgbd.compare`."""
        if kind not in self.run_warnings:
            self.run_warnings = (*self.run_warnings, kind)

    def _run_facts(self):
        """What this run was set up with, for :mod:`~numpyro_sgbd.advice`."""
        plates = {k: v[:2] for k, v in (self._plates or {}).items()}
        shapes = self._z_shapes or {}
        return advice.RunFacts(
            sampler=type(self).__name__,
            gradient=None if self._model is None else self._gradient,
            adaptive=self._step_size_arg is None,
            plates=plates,
            dim=dimension(shapes),
            num_warmup=self._num_warmup // self._num_steps,
        )

    def _flat_name(self, j):
        """``"site[k]"`` for flat coordinate ``j`` (sites in ``ravel_pytree``'s
        order, which sorts dict keys)."""
        if not self._z_shapes:
            return f"z[{j}]"
        for name in sorted(self._z_shapes):
            size = int(np.prod(self._z_shapes[name]))
            if j < size:
                return f"{name}[{j}]" if self._z_shapes[name] else name
            j -= size
        return f"z[{j}]"

    def postprocess_fn(self, model_args, model_kwargs):
        if self._model is None:
            return identity
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if self._plates is None:
            self._build(model_args, model_kwargs)

        drop = self._plate_deterministic

        # One compiled function, kept per argument structure: NumPyro's loop
        # first calls it eagerly (to size its buffers), where the model run op
        # by op compiled each operation apart (a dozen programs in a fresh
        # process). Inside the loop it is traced inline.
        def make(rebuild):
            def constrained(z, arrays):
                args, kwargs = rebuild(arrays)
                out = constrain_fn(
                    self.model, args, kwargs, z, return_deterministic=True
                )
                return {k: v for k, v in out.items() if k not in drop}

            return constrained

        fn, arrays = self._jit_over_data(
            "_postprocess_fns", make, model_args, model_kwargs
        )
        return lambda z: fn(z, arrays)

    def get_diagnostics_str(self, state):
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
        state["_convergence_check"] = None
        state["_init_fns"] = {}
        state["_init_param_fns"] = {}
        state["_postprocess_fns"] = {}
        state["_start_fn"] = None
        if getattr(self._estimator, "sharding", None) is not None:
            # Its mesh holds devices, which do not pickle; `init` rebuilds it.
            state["_estimator"] = None
        return state


class _FamilyKernel(_SGKernel):
    """The one NumPyro adapter for samplers given as a pure update family
    (:mod:`numpyro_sgbd.updates`). A sampler's class sets

    - ``_family_init(x, rng_key, **init_kwargs) -> aux``, the family's state at
      position ``x``, which it keeps in its field ``z``;
    - ``_family_step(rng_key, aux, z_grad, step_size, *, variant, noise_sd,
      **step_kwargs) -> (aux, info)``, one move given the gradient estimate at
      ``aux.z``; ``info`` has ``noise_exceeded`` (the fraction of coordinates
      outside the corrected variant's tolerance) and the sampler's statistics;
    - ``_state_type`` (from :func:`family_state`), ``_VARIANTS``, the step target
      and noise bound (``_STEP_TARGET``, ``_noise_step_bound``), and in its
      constructor ``_hyperparameters``, the call arguments of the pure step,
      validated against z in ``_prepare``.

    The position x is z's pytree without a preconditioner and the flat u with
    one, where z_grad and noise_sd come in the same form. With re-estimated
    scales s (``adapt_mass_matrix``) the step is ``step_size * s`` per
    coordinate of u, the rule in v = u / s for the coordinate-wise rules.
    Nothing here branches on the sampler."""

    _state_type = None
    _family_init = None
    _family_step = None
    #: The family's variants.
    _VARIANTS = ("vanilla", "corrected")
    #: The hyperparameter D whose injected variance ``eps (2 D - eps tau^2)`` the
    #: corrected variant keeps positive, by name (e.g. ``"friction"``).
    _NOISE_DIFFUSION = None
    #: Which hyperparameters the family's ``init`` takes (all go to ``step``).
    _INIT_ARGS = ()
    #: ``adapt_mass_matrix`` is off by default and s at most 1 (see
    #: :attr:`_SGKernel._SCALE_MAX`); SGBD lifts both.
    _SCALE_MAX = 1.0

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size=None,
        variant=None,
        beta=0.1,
        init_noise_sd=None,
        adapt_mass_matrix=None,
        **kwargs,
    ):
        if variant is not None and variant not in self._VARIANTS:
            raise ValueError(
                f"variant must be one of {self._VARIANTS} or None, got {variant!r}."
            )
        self._variant_arg = variant
        if variant is None:
            variant = self._default_variant(step_size)
        if not (isinstance(beta, (int, float)) and 0 < beta < 1):
            raise ValueError(f"beta must be a number in (0, 1), got {beta!r}.")
        if init_noise_sd is not None:
            leaves = jax.tree.leaves(init_noise_sd)
            for leaf in leaves:
                check_real(leaf, "init_noise_sd", "a non-negative number (or dict)")
            if not leaves or not all(
                np.all(np.isfinite(np.asarray(x, float)))
                and np.all(np.asarray(x, float) >= 0)
                for x in leaves
            ):
                raise ValueError(
                    "init_noise_sd must be non-negative and finite (a scalar or a "
                    f"dict of sites), got {init_noise_sd!r}."
                )
        super().__init__(
            model,
            potential_fn,
            gradient_fn,
            step_size=step_size,
            adapt_mass_matrix=adapt_mass_matrix,
            **kwargs,
        )
        self._variant = variant
        self._beta = float(beta)
        self._init_noise_sd = init_noise_sd
        #: The sampler's hyperparameters as given, by name (set by its constructor;
        #: numbers or dicts of sites are validated against z in ``_prepare``;
        #: strings and functions pass as they are).
        self._hyperparameters = {}
        self._init_kwargs = {}
        self._step_kwargs = {}

    def _default_variant(self, step_size):
        """``step_size=None`` checks the noise: ``"corrected"`` where the family
        has it, else ``"vanilla"``."""
        if step_size is None and "corrected" in self._VARIANTS:
            return "corrected"
        return "vanilla"

    @property
    def variant(self):
        """The variant: as given, or by default ``"corrected"`` with
        ``step_size=None`` (``"vanilla"`` for a model with several subsample plates,
        whose noise cannot be estimated) and ``"vanilla"`` otherwise."""
        return self._variant

    @property
    def _statistics(self):
        return self._state_type._fields[len(_FAMILY_HEAD) : -len(_FAMILY_TAIL)]

    @property
    def default_fields(self):
        """``z``, the per-draw sampler statistics of :class:`SGState` and the
        sampler's own (see its state type)."""
        return (
            "z",
            "potential_energy_estimate",
            "mean_noise_sd",
            "tolerance_exceeded",
            *self._statistics,
            "num_nonfinite",
        )

    def _default_options(self, plates):
        super()._default_options(plates)
        if plates is None:
            if self._variant_arg is None:
                self._variant = self._default_variant(self._step_size_arg)
            return False
        if (
            self._variant_arg is None
            and self._variant == "corrected"
            and len(plates) > 1
        ):
            warnings.warn(
                f"The model subsamples {sorted(plates)}: the gradient noise can be "
                "estimated for one subsample plate only, so step_size=None runs "
                "variant='vanilla' and cannot keep the step within the noise "
                "tolerance. Subsample a single plate for the corrected variant.",
                UserWarning,
                stacklevel=4,
            )
            self._variant = "vanilla"
            return True
        return False

    def _noise_form(self):
        return "sd" if self._variant == "corrected" else None

    def _noise_needed_by(self):
        return "variant='corrected'", "Use variant='vanilla' or 'extreme', or "

    def _check_probe(self, probe, one_z):
        if self._variant == "corrected" and probe.noise_sd is None:
            raise ValueError(
                "variant='corrected' needs the noise sd of the gradient: gradient_fn "
                "must return GradientEstimate(z_grad, noise_sd=...)."
            )

    def _prepare(self, shapes, one_z):
        super()._prepare(shapes, one_z)
        resolved = {}
        for name, value in self._hyperparameters.items():
            if value is None or callable(value) or isinstance(value, str):
                resolved[name] = value
            elif self.preconditioner is not None and isinstance(value, dict):
                raise ValueError(
                    f"with a preconditioner {name} is in the whitened coordinates "
                    "u, which have no sites: give a positive scalar."
                )
            elif self.preconditioner is not None:
                resolved[name] = jnp.asarray(value, jnp.result_type(float))
            else:
                resolved[name] = _per_site(value, shapes, name)
        self._step_kwargs = resolved
        self._init_kwargs = {k: resolved[k] for k in self._INIT_ARGS}
        if self.preconditioner is not None and isinstance(self._init_noise_sd, dict):
            raise ValueError(
                "with a preconditioner the noise sd is in the whitened coordinates "
                "u, which have no sites: give init_noise_sd as a scalar."
            )

    def _family(self):
        """The update family as the core's value (:class:`core.Family`), with the
        hyperparameters ``_prepare`` validated."""
        return core.Family(
            init=self._family_init,
            step=self._family_step,
            state_type=self._state_type,
            statistics=self._statistics,
            variant=self._variant,
            init_kwargs=self._init_kwargs,
            step_kwargs=self._step_kwargs,
            beta=self._beta,
            init_noise_sd=self._init_noise_sd,
            noise_diffusion=self._NOISE_DIFFUSION,
            exact_nan_allowed=self._gradient_fn is not None,
        )

    def noise_bound(self, noise_sd, batch_ndim=0):
        """``(tau, value)`` for the corrected variant's bound ``step * tau^2 <= 2 *
        value`` (recipe paper, eq. 9): ``tau`` the largest noise sd of the
        minibatch gradient, one per chain over the leading ``batch_ndim`` axes,
        and ``value`` the smallest entry of the diffusion hyperparameter; ``None``
        for a sampler without such a bound or where the noise is not estimated.
        After ``init``."""
        if self._NOISE_DIFFUSION is None or noise_sd is None:
            return None
        leaves = [np.asarray(x) for x in jax.tree.leaves(noise_sd)]
        lead = leaves[0].shape[:batch_ndim]
        flat = np.concatenate([x.reshape(lead + (-1,)) for x in leaves], axis=-1)
        tau = np.max(flat, axis=-1)
        name = self._NOISE_DIFFUSION
        value = min(float(np.min(x)) for x in jax.tree.leaves(self._step_kwargs[name]))
        return tau, value

    def _check_initial_noise(self, state):
        """With a given step and the corrected variant: raise before sampling when
        the first minibatch's noise already breaks ``2 D >= eps tau^2``."""
        if self._step_size_arg is None or state.noise_sd is None:
            return
        if _has_tracer(state.noise_sd):
            return
        tau, value = self.noise_bound(state.noise_sd)
        tau = float(tau)
        step = max(float(np.max(x)) for x in jax.tree.leaves(self._step_size))
        name = self._NOISE_DIFFUSION
        if step * tau**2 > 2 * value:
            raise ValueError(
                f"{type(self).__name__}: {name}={value:.3g} is smaller than the "
                f"gradient-noise term step_size * tau^2 / 2 = "
                f"{step * tau**2 / 2:.3g} at the initial position (tau = {tau:.3g}, "
                "the largest noise sd of the minibatch gradient): the corrected "
                "variant needs 2 * "
                f"{name} >= step_size * tau^2 (recipe paper, eq. 9). Increase "
                f"{name} or the subsample size, or lower step_size."
            )

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        state = super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)
        if self._NOISE_DIFFUSION is not None:
            self._check_initial_noise(state)
        return state

    def __getstate__(self):
        state = super().__getstate__()
        # Rebuilt from `_hyperparameters` by `init`.
        state["_init_kwargs"], state["_step_kwargs"] = {}, {}
        return state

    def _diagnostic_parts(self, state):
        parts = []
        if state.noise_sd is not None:
            parts.append(
                f"tau_hat {float(state.mean_noise_sd):.3g}, "
                f"over tolerance {100 * float(state.tolerance_exceeded):.0f}%"
            )
        for name in self._statistics:
            parts.append(f"{name} {float(np.mean(getattr(state, name))):.3g}")
        return parts
