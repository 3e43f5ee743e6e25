"""A sampler as one constructor call configured it: :class:`SamplerConfig` holds
the :class:`~numpyro_sgbd.spec.SamplerSpec`, the call's arguments checked and
their defaults resolved (some once the model's plates are known), and gives the
core's values the step is built from (:class:`~numpyro_sgbd.core.Family`,
:class:`~numpyro_sgbd.adaptation.Adaptation`). The kernel
(:class:`~numpyro_sgbd.kernel.SGKernel`) holds one; nothing here reads the
model or its data."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import core, preconditioning
from numpyro_sgbd import spec as specs
from numpyro_sgbd.options import _per_site, check_noise_options, kernel_options
from numpyro_sgbd.prepare import CentreRequest, Request, has_tracer

__all__ = ["SamplerConfig"]

_OPTION_NAMES = (
    "model",
    "potential_fn",
    "gradient_fn",
    "step_size",
    "replace",
    "log_likelihood_size",
    "gradient",
    "centre",
    "chunk_size",
    "recentre_every",
    "preconditioner",
    "adapt_mass_matrix",
    "num_steps",
)


class SamplerConfig:
    """``spec`` with the arguments of one constructor call (``sources``: the
    model, ``potential_fn``, ``gradient_fn``; ``kwargs``: the keywords), checked
    before anything is traced. ``args`` every argument by name, ``options`` the
    shared ones resolved (:class:`~numpyro_sgbd.options.KernelOptions`),
    ``hyperparameters`` the step's as given; set once the model is traced:
    ``gradient``, ``variant`` and ``noise_form``; once z's shapes are known:
    ``step_kwargs`` and ``step_size`` (the given step, per site or a scalar in
    u)."""

    def __init__(self, spec, sources, kwargs):
        self.spec = spec
        args = specs.arguments(spec, dict(zip(specs.SOURCES, sources)), kwargs)
        variant = args["variant"]
        if variant is not None and variant not in spec.variants:
            raise ValueError(
                f"variant must be one of {spec.variants} or None, got {variant!r}."
            )
        check_noise_options(args["beta"], args["init_noise_sd"])
        self.hyperparameters = specs.own_hyperparameters(spec, args)
        self.args = args
        self.options = kernel_options(
            **{k: args[k] for k in _OPTION_NAMES},
            scale_bounded=spec.scale_max is not None,
        )
        self.source = next(k for k in specs.SOURCES if args[k] is not None)
        self.reset()
        self.step_kwargs, self.step_size = {}, None

    def request(self, who):
        """What the kernel asks :func:`~numpyro_sgbd.prepare.prepare` for."""
        args, options, spec = self.args, self.options, self.spec
        return Request(
            preconditioner=options.preconditioner,
            centre=CentreRequest(
                args["centre"], options.recentre_every, args["chunk_size"]
            ),
            replace=args["replace"],
            log_likelihood_size=args["log_likelihood_size"],
            who=who,
            adaptation={
                "step_target": spec.step_target,
                "sampling_fraction": spec.sampling_fraction,
                "adapt_mass_matrix": options.adapt_mass,
            },
        )

    # ------------------------------------------------ defaults by the model
    def reset(self):
        """The defaults before the model is traced."""
        self.gradient = self.options.gradient
        self.variant = self._default_variant()
        self.noise_form = self._noise_form(None, None)

    def _default_variant(self, several_plates=False):
        """The variant as given; by default ``"corrected"`` with
        ``step_size=None`` where the family has it and the model at most one
        subsample plate, else ``"vanilla"``."""
        given = self.args["variant"]
        if given is not None:
            return given
        adapting = self.args["step_size"] is None
        corrected = adapting and "corrected" in self.spec.variants
        return "corrected" if corrected and not several_plates else "vanilla"

    def _noise_form(self, shapes, plates):
        form = self.spec.noise_form or specs.default_noise_form
        return form(self.hyperparameters, self.variant, shapes, plates, self.source)

    def choose(self, plates, shapes, local=None):
        """``(noise_form, gradient)`` once the model's plates and local sites are
        known: ``step_size=None``'s defaults resolved (control variates where
        one plate and no local sites allow them; the vanilla variant, with a
        warning, for several plates) and the noise the rule needs, which one
        subsample plate must give."""
        if self.gradient == "auto":
            cv = len(plates) == 1 and not local
            self.gradient = "control_variates" if cv else "minibatch"
        several = len(plates) > 1
        variant = self._default_variant(several)
        if variant != self.variant and several:
            warnings.warn(
                f"The model subsamples {sorted(plates)}: the gradient noise can be "
                "estimated for one subsample plate only, so step_size=None runs "
                "variant='vanilla' and cannot keep the step within the noise "
                "tolerance. Subsample a single plate for the corrected variant.",
                UserWarning,
                stacklevel=5,
            )
        self.variant = variant
        self.noise_form = self._noise_form(shapes, plates)
        if self.noise_form is not None and several:
            who, fix = self.spec.name, ""
            if self.spec.noise_form is None:
                who = "variant='corrected'"
                fix = "Use variant='vanilla' or 'extreme', or "
            raise ValueError(
                f"{who} estimates the gradient noise from the per-datum gradients of "
                f"one subsample plate, but the model subsamples {sorted(plates)}. "
                f"{fix}Subsample a single plate."
            )
        return self.noise_form, self.gradient

    def independent_noise(self):
        """Whether the noise covariance comes from rows drawn apart from the
        force's: a spec's ``noise_estimate``, ``"independent"`` or ``"auto"`` on
        plain minibatches of a model (a second minibatch), or a form that draws
        its own rows (NOGIN's ``"lowrank+diag"``)."""
        choice = self.args.get("noise_estimate")
        if self.source != "model" or choice in (None, "same"):
            return False
        if self.noise_form == "lowrank+diag":
            return True
        return choice == "independent" or self.gradient == "minibatch"

    # ------------------------------------------------------- by z's shapes
    def resolve(self, shapes, one_z, preconditioned):
        """The step size and hyperparameters checked against z's shapes (one
        chain's global sites, ``one_z``), before compiling."""
        step = self.args["step_size"]
        if step is None:
            self.step_size = None
        elif preconditioned:
            self.step_size = jnp.asarray(step, jnp.result_type(float))
        else:
            self.step_size = _per_site(step, shapes, "step_size")
        resolve = self.spec.resolve or specs.per_site
        hyper, args = self.hyperparameters, self.args
        self.step_kwargs = resolve(hyper, shapes, one_z, preconditioned, args)
        if preconditioned and isinstance(args["init_noise_sd"], dict):
            raise ValueError(
                "with a preconditioner the noise sd is in the whitened coordinates "
                "u, which have no sites: give init_noise_sd as a scalar."
            )

    def check_probe(self, probe, one_z):
        """A user's gradient estimate checked for what the rule needs."""
        check = self.spec.check_probe or specs.default_check_probe
        check(probe, one_z, self.noise_form, self.source)

    # ------------------------------------------------------ the core's values
    @property
    def statistics(self):
        """The sampler's own per-draw statistics: its state's fields between the
        noise's and ``num_nonfinite``."""
        fields = self.spec.state_type._fields
        first = fields.index("mean_noise_sd") + 1
        if "tolerance_exceeded" in fields:
            first = fields.index("tolerance_exceeded") + 1
        return fields[first : fields.index("num_nonfinite")]

    def family(self):
        """The update family as the core's value (:class:`core.Family`)."""
        spec, hyper, args = self.spec, self.step_kwargs, self.args
        init, step = spec.family(args) if spec.family else (spec.init, spec.step)
        fields = {
            "init": init,
            "step": step,
            "state_type": spec.state_type,
            "statistics": self.statistics,
            "variant": self.variant,
            "init_kwargs": {k: hyper[k] for k in spec.init_args},
            "step_kwargs": hyper,
            "beta": float(args["beta"]),
            "init_noise_sd": args["init_noise_sd"],
            "noise_diffusion": spec.noise_diffusion,
            "exact_nan_allowed": self.source == "gradient_fn",
        }
        if spec.family_options is not None:
            independent = self.independent_noise()
            fields.update(spec.family_options(hyper, self.noise_form, independent))
        return core.Family(**fields)

    def adaptation(self, num_warmup, run_steps, preconditioner):
        """The warmup adaptation
        (:class:`~numpyro_sgbd.adaptation.Adaptation`) of a run with
        ``num_warmup`` warmup steps and ``run_steps`` sampling steps (or
        ``None``), with ``preconditioner`` (a chain's, from its state)."""
        spec, adapt_mass = self.spec, self.options.adapt_mass
        windows = (num_warmup, ())
        if adapt_mass:
            windows = preconditioning.scale_windows(num_warmup)
        return core.Adaptation(
            num_warmup=num_warmup,
            scale_windows=windows,
            step_target=spec.step_target,
            sampling_fraction=spec.sampling_fraction,
            scale_max=spec.scale_max,
            fixed_step=self.step_size,
            adapt_mass=adapt_mass,
            preconditioner=preconditioner,
            bias_law=self.bias_law(),
            run_steps=run_steps,
        )

    def allowed(self):
        """``allowed(state)``, the step the noise allows now where the sampler
        bounds it by its own statistic; ``None``: the core's."""
        if self.spec.allowed is None:
            return None
        target = self.spec.step_target
        return lambda state: self.spec.allowed(target, state)

    def bias_law(self):
        """The variant's :class:`~numpyro_sgbd.discretisation.BiasLaw`, or
        ``None`` where none is measured (another hyperparameter than the law's,
        or one per site)."""
        for name, value in self.spec.bias_law_at.items():
            given = self.hyperparameters.get(name)
            if isinstance(given, dict) or np.ndim(given) or given != value:
                return None
        return self.spec.bias_laws.get(self.variant)

    def describe(self, state):
        """The progress bar's text for one chain's ``state``."""
        parts = [f"U_hat {float(state.potential_energy_estimate):.4g}"]
        if getattr(state, "noise_sd", None) is not None:
            parts.append(
                f"tau_hat {float(state.mean_noise_sd):.3g}, over tolerance "
                f"{100 * float(state.tolerance_exceeded):.0f}%"
            )
        for name in self.statistics:
            parts.append(f"{name} {float(np.max(getattr(state, name))):.3g}")
        if int(state.num_nonfinite) > 0:
            parts.append("STOPPED (non-finite)")
        return ", ".join(parts)

    # ----------------------------------------------------- the noise bound
    def noise_bound(self, noise_sd, batch_ndim=0):
        """``(tau, value)`` of the corrected variant's bound (see
        :meth:`~numpyro_sgbd.kernel.SGKernel.noise_bound`), or ``None``."""
        if self.spec.noise_diffusion is None or noise_sd is None:
            return None
        leaves = [np.asarray(x) for x in jax.tree.leaves(noise_sd)]
        lead = leaves[0].shape[:batch_ndim]
        flat = np.concatenate([x.reshape(lead + (-1,)) for x in leaves], axis=-1)
        tau = np.max(flat, axis=-1)
        diffusion = self.step_kwargs[self.spec.noise_diffusion]
        value = min(float(np.min(x)) for x in jax.tree.leaves(diffusion))
        return tau, value

    def check_initial_noise(self, state, who):
        """With a given step and a noise diffusion: raise before sampling when
        the first minibatch's noise already breaks ``2 D >= eps tau^2``."""
        noise_sd = getattr(state, "noise_sd", None)
        if self.step_size is None or noise_sd is None or has_tracer(noise_sd):
            return
        bound = self.noise_bound(noise_sd)
        if bound is None:
            return
        tau, value = float(bound[0]), bound[1]
        step = max(float(np.max(x)) for x in jax.tree.leaves(self.step_size))
        name = self.spec.noise_diffusion
        if step * tau**2 > 2 * value:
            raise ValueError(
                f"{who}: {name}={value:.3g} is smaller than the "
                f"gradient-noise term step_size * tau^2 / 2 = "
                f"{step * tau**2 / 2:.3g} at the initial position (tau = {tau:.3g}, "
                "the largest noise sd of the minibatch gradient): the corrected "
                f"variant needs 2 * {name} >= step_size * tau^2 (recipe paper, eq. "
                f"9). Increase {name} or the subsample size, or lower step_size."
            )

    def __getstate__(self):
        state = self.__dict__.copy()
        # Rebuilt from the hyperparameters by `init`.
        state["step_kwargs"] = {}
        return state
