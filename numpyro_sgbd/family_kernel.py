"""The kernel of every sampler given as a pure update family of
:mod:`numpyro_sgbd.updates` (all but NOGIN): its variants, hyperparameters per
site, the corrected variant's noise bound and its state's statistics, over the
adapter of :mod:`numpyro_sgbd.kernel`."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import core
from numpyro_sgbd.kernel import _SGKernel
from numpyro_sgbd.options import _per_site, check_noise_options
from numpyro_sgbd.prepare import has_tracer
from numpyro_sgbd.state import _FAMILY_HEAD, _FAMILY_TAIL

__all__ = ["_FamilyKernel"]


class _FamilyKernel(_SGKernel):
    """The one NumPyro adapter for samplers given as a pure update family
    (:mod:`numpyro_sgbd.updates`, :class:`core.Family`). A sampler's class sets
    ``_family_init`` and ``_family_step`` (the family's ``init`` and ``step``:
    see ``docs/adding_a_sampler.rst``), ``_state_type`` (from
    :func:`family_state`), ``_VARIANTS``, the step target and noise bound
    (``_STEP_TARGET``, ``_NOISE_DIFFUSION`` or ``_noise_step_bound``), and in its
    constructor ``_hyperparameters``, the call arguments of the pure step,
    validated against z in ``_prepare``. Nothing here branches on the sampler."""

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
        *sources,
        step_size=None,
        variant=None,
        beta=0.1,
        init_noise_sd=None,
        **options,
    ):
        if variant is not None and variant not in self._VARIANTS:
            raise ValueError(
                f"variant must be one of {self._VARIANTS} or None, got {variant!r}."
            )
        self._variant_arg = variant
        if variant is None:
            variant = self._default_variant(step_size)
        check_noise_options(beta, init_noise_sd)
        super().__init__(*sources, step_size=step_size, **options)
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

    def _default_options(self, plates, local=None):
        super()._default_options(plates, local)
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
        if has_tracer(state.noise_sd):
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
