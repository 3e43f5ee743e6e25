"""The momentum samplers: SGHMC and SGNHT (the complete recipe's explicit
updates) and BAOAB (the splitting integrator)."""

import numpy as np

from numpyro_sgbd import core
from numpyro_sgbd.discretisation import BiasLaw
from numpyro_sgbd.kernel import SGKernel, family_state
from numpyro_sgbd.options import _check_positive_tree
from numpyro_sgbd.spec import SamplerSpec
from numpyro_sgbd.updates.baoab import baoab_step
from numpyro_sgbd.updates.sghmc import sghmc_init, sghmc_step
from numpyro_sgbd.updates.sgnht import sgnht_init, sgnht_step

__all__ = ["BAOAB", "SGHMC", "SGNHT"]

SGHMCKernelState = family_state(
    "SGHMCKernelState", ("kinetic_energy",), module=__name__
)
SGHMCKernelState.__doc__ = """State of :class:`SGHMC`: the fields of
:class:`~numpyro_sgbd.SGState` (``tolerance_exceeded`` is the fraction of
coordinates where the corrected variant's injected variance
:math:`\\epsilon(2C - \\epsilon\\hat\\tau^2)` was clipped at 0), ``kinetic_energy``
(:math:`\\tfrac12 p^\\top M^{-1}p` after the step, collected by default) and
``aux``, the pure :class:`~numpyro_sgbd.updates.sghmc.SGHMCState` (its momentum,
flat in u with a preconditioner; its position as for :class:`~numpyro_sgbd.SGState`:
u with a preconditioner, ``None`` without)."""

SGNHTKernelState = family_state(
    "SGNHTKernelState", ("kinetic_energy", "thermostat"), module=__name__
)
SGNHTKernelState.__doc__ = """State of :class:`SGNHT`: as
:class:`SGHMCKernelState`, with ``thermostat`` (:math:`\\xi`, collected by
default) and ``aux`` the pure :class:`~numpyro_sgbd.updates.sgnht.SGNHTState`."""


BAOABKernelState = family_state(
    "BAOABKernelState", ("kinetic_energy",), module=__name__
)
BAOABKernelState.__doc__ = """State of :class:`BAOAB`: as :class:`SGHMCKernelState`
(``z_grad`` is the force the next step's first kick uses, ``aux`` the pure
:class:`~numpyro_sgbd.updates.sghmc.SGHMCState`); ``tolerance_exceeded`` is NaN:
the scheme has no noise tolerance."""


def _friction_mass(args):
    """SGHMC's and BAOAB's hyperparameters: a positive friction and diagonal
    mass, per site."""
    _check_positive_tree(args["friction"], "friction")
    _check_positive_tree(args["mass"], "mass")
    return {"friction": args["friction"], "mass": args["mass"]}


def _thermostat(args):
    """SGNHT's: one scalar step and diffusion, as one thermostat couples all
    coordinates."""
    step_size, diffusion = args["step_size"], args["diffusion"]
    if step_size is not None and (isinstance(step_size, dict) or np.ndim(step_size)):
        raise ValueError(
            "SGNHT's step_size must be a positive scalar (one thermostat "
            f"couples all coordinates), got {step_size!r}."
        )
    if isinstance(diffusion, dict) or np.ndim(diffusion):
        raise ValueError(
            "diffusion must be a positive scalar A (the thermostat is one "
            f"scalar for all coordinates), got {diffusion!r}."
        )
    _check_positive_tree(diffusion, "diffusion")
    return {"diffusion": diffusion}


SGHMC_SPEC = SamplerSpec(
    name="SGHMC",
    init=sghmc_init,
    step=core.gradient_at_end(sghmc_step),
    state_type=SGHMCKernelState,
    hyperparameters={"friction": 1.0, "mass": 1.0},
    not_taken=("adapt_mass_matrix",),
    check=_friction_mass,
    init_args=("mass",),
    noise_diffusion="friction",
    # In u (unit posterior scale) with C = 1 the explicit update's variance is
    # 1.053 at 0.05 (sd 2.6 % wide, like SGLD's 0.4) and 1.11 at 0.1.
    step_target=0.05,
    # var - 1 = 1.29 h on N(0, I) with exact gradients at friction = mass = 1
    # (the Euler update is first order), median bulk ESS 0.42 h per step
    # (benchmarks/bias_laws.py). Measured at the defaults only: with another
    # friction or mass there is no law (bias_law() is None).
    bias_laws=dict.fromkeys(
        ("vanilla", "corrected"), BiasLaw(1.285, 0.0, 1, 0.418, 1.0)
    ),
    bias_law_at={"friction": 1.0, "mass": 1.0},
)

SGNHT_SPEC = SamplerSpec(
    name="SGNHT",
    init=sgnht_init,
    step=core.gradient_at_end(sgnht_step),
    state_type=SGNHTKernelState,
    hyperparameters={"diffusion": 1.0},
    defaults={"variant": "vanilla"},
    not_taken=("adapt_mass_matrix",),
    check=_thermostat,
    init_args=("diffusion",),
    noise_diffusion="diffusion",
    step_target=0.05,
    # var - 1 = -0.43 h on N(0, I) with exact gradients at diffusion 1 (first
    # order, the sds narrow), median bulk ESS 0.38 h per step (bias_laws.py);
    # no law at another diffusion.
    bias_laws=dict.fromkeys(
        ("vanilla", "corrected"), BiasLaw(-0.433, 0.0, 1, 0.380, 1.0)
    ),
    bias_law_at={"diffusion": 1.0},
)

BAOAB_SPEC = SamplerSpec(
    name="BAOAB",
    init=sghmc_init,
    step=baoab_step,
    state_type=BAOABKernelState,
    hyperparameters={"friction": 1.0, "mass": 1.0},
    not_taken=("adapt_mass_matrix", "beta", "init_noise_sd"),
    check=_friction_mass,
    init_args=("mass",),
    variants=("vanilla",),
    step_target=0.2,
    # Exact on a Gaussian's positions (Leimkuhler & Matthews 2013): var - 1 =
    # 0.006 +- 0.004 h on N(0, I), no measurable bias; median bulk ESS 0.39 h
    # per step at friction = mass = 1 (benchmarks/bias_laws.py).
    bias_laws={"vanilla": BiasLaw(0.0, 0.0, 1, 0.388, 1.0)},
    bias_law_at={"friction": 1.0, "mass": 1.0},
)


class SGHMC(SGKernel):
    r"""Stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin, 2014), in
    the form the complete recipe gives it (Ma, Chen & Fox, 2015, eq. 12).

    .. math::

        z &\leftarrow z + \epsilon M^{-1} p, \\
        p &\leftarrow p - \epsilon\nabla\hat U(z) - \epsilon C M^{-1} p
            + N\big(0, \epsilon(2C - \epsilon\hat B)\big),

    both lines from the old state. :math:`\hat B = 0` (``variant="vanilla"``) or
    the per-coordinate variance :math:`\hat\tau^2` of the minibatch gradient
    (``"corrected"``, estimated from the per-datum gradients as for
    :class:`~numpyro_sgbd.SGBD`). It is the recipe with :math:`z = (\theta, p)`,
    :math:`H = U + \tfrac12 p^\top M^{-1}p`, :math:`D = \mathrm{diag}(0, C)`,
    :math:`Q = \begin{pmatrix}0 & -I\\ I & 0\end{pmatrix}`.

    For a Gaussian target with Gaussian gradient noise the chain is linear and its
    law exact (:math:`\mathrm{Var}(z) \approx s^2(1 + \epsilon/(C s))` in units of
    the posterior sd s with exact gradients): the explicit update is biased by
    :math:`O(\epsilon/C)`, so the default step is small.

    :param model: a NumPyro model with its data in
        ``numpyro.plate(name, N, subsample_size=n)`` (see :class:`~numpyro_sgbd.SGBD`).
    :param potential_fn: instead of a model, a potential :math:`U(z)` (exact
        gradients); needs ``init_params`` and ``step_size``.
    :param gradient_fn: instead of a model, ``gradient_fn(rng_key, z)`` returning a
        :class:`~numpyro_sgbd.GradientEstimate`; needs ``init_params`` and
        ``step_size``.
    :param step_size: :math:`\epsilon`, a positive scalar or dict of sites. Default
        ``None``: adapted in warmup in the whitened coordinates u of the full-data
        Hessian at the mode (target 0.05, lowered to keep
        :math:`\epsilon\hat\tau^2 \le 1.6 C`), as for :class:`~numpyro_sgbd.SGBD`.
    :param friction: :math:`C`, a positive scalar or dict of sites (default 1; in
        u with a preconditioner). The corrected variant needs
        :math:`2C \ge \epsilon\hat\tau^2` (recipe paper, eq. 9); a given step that
        breaks it at the first minibatch raises before sampling.
    :param mass: the diagonal mass :math:`M`, positive scalar or dict of sites
        (default 1).
    :param str variant: ``"vanilla"`` or ``"corrected"``. Default ``None``:
        ``"corrected"`` with ``step_size=None``, ``"vanilla"`` otherwise.
    :param preconditioner: as for :class:`~numpyro_sgbd.SGBD`.
    :param gradient: as for :class:`~numpyro_sgbd.SGBD`.
    :param centre: as for :class:`~numpyro_sgbd.SGBD`.
    :param recentre_every: as for :class:`~numpyro_sgbd.SGBD`.
    :param float beta: moving-average rate of :math:`\hat\tau` (default 0.1).
    :param init_noise_sd: initial :math:`\hat\tau` (default: the first minibatch's).
    :param replace: as for :class:`~numpyro_sgbd.SGBD`.
    :param init_strategy: a NumPyro init strategy (default ``init_to_uniform``).
    :param int log_likelihood_size: as for :class:`~numpyro_sgbd.SGBD`.
    :param int chunk_size: as for :class:`~numpyro_sgbd.SGBD`.
    :param int num_steps: as for :class:`~numpyro_sgbd.SGBD`.

    The state is a :class:`SGHMCKernelState`; ``kinetic_energy`` is collected by
    default and reaches ``az.from_numpyro(...).sample_stats``.

    **References**

    1. Chen, T., Fox, E. & Guestrin, C. (2014). *Stochastic gradient Hamiltonian
       Monte Carlo.* ICML.
    2. Ma, Y.-A., Chen, T. & Fox, E. (2015). *A complete recipe for stochastic
       gradient MCMC.* NIPS. Eq. (9), (12).

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> kernel = SGHMC(potential_fn=lambda z: 0.5 * jnp.sum(z**2), step_size=0.05)
    >>> mcmc = MCMC(kernel, num_warmup=500, num_samples=20000, progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.zeros(2))
    >>> bool(abs(mcmc.get_samples().var() - 1.05) < 0.15)
    True
    """

    spec = SGHMC_SPEC


class SGNHT(SGKernel):
    r"""The stochastic gradient Nosé-Hoover thermostat (Ding et al., 2014), in the
    form of the complete recipe (Ma, Chen & Fox, 2015, eq. 15).

    .. math::

        z &\leftarrow z + \epsilon p, \\
        p &\leftarrow p - \epsilon\nabla\hat U(z) - \epsilon\xi p
            + N\big(0, \epsilon(2A - \epsilon\hat B)\big), \\
        \xi &\leftarrow \xi + \epsilon\big(p^\top p / d - 1\big),

    all from the old state. The thermostat :math:`\xi` is a friction that adapts
    until the kinetic energy per coordinate is 1/2: it absorbs gradient noise of an
    unknown level, which the vanilla variant (:math:`\hat B = 0`, the default)
    does not estimate (its mean settles near :math:`A + \epsilon\tau^2/2`).
    ``"corrected"`` subtracts :math:`\hat\tau^2` as :class:`SGHMC` does.

    :param float step_size: :math:`\epsilon`, a positive scalar (default ``None``:
        adapted as for :class:`SGHMC`, target 0.05 in u).
    :param float diffusion: :math:`A`, the injected noise and the thermostat's
        start (default 1), a positive scalar (one thermostat for all coordinates).
    :param str variant: ``"vanilla"`` (default) or ``"corrected"``.

    The other arguments are those of :class:`SGHMC` (no ``friction`` or ``mass``:
    the thermostat is the friction, the mass is 1). The state is a
    :class:`SGNHTKernelState`; ``kinetic_energy`` and ``thermostat`` are collected
    by default.

    **References**

    1. Ding, N., Fang, Y., Babbush, R., Chen, C., Skeel, R. D. & Neven, H. (2014).
       *Bayesian sampling using stochastic gradient thermostats.* NIPS.
    2. Ma, Y.-A., Chen, T. & Fox, E. (2015). *A complete recipe for stochastic
       gradient MCMC.* NIPS. Eq. (15).

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> def noisy(rng_key, z):  # exact gradient plus noise of sd 2 the sampler ignores
    ...     from numpyro_sgbd import GradientEstimate
    ...     return GradientEstimate(z + 2.0 * jax.random.normal(rng_key, z.shape))
    >>> kernel = SGNHT(gradient_fn=noisy, step_size=0.05)
    >>> mcmc = MCMC(kernel, num_warmup=2000, num_samples=20000, progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.zeros(10))
    >>> xi = mcmc.get_extra_fields()["thermostat"]
    >>> bool(abs(xi.mean() - (1 + 0.05 * 4 / 2)) < 0.1)
    True
    """

    spec = SGNHT_SPEC


class BAOAB(SGKernel):
    r"""Underdamped Langevin dynamics by the BAOAB splitting (Leimkuhler &
    Matthews, 2013) with minibatch forces: half a kick, half a drift, the exact
    Ornstein-Uhlenbeck flow of the friction and noise, half a drift, half a kick
    (:func:`~numpyro_sgbd.updates.baoab.baoab_step`),

    .. math::

        p &\leftarrow p - \tfrac h2 \nabla\hat U(z), \quad
        z \leftarrow z + \tfrac h2 M^{-1}p, \quad
        p \leftarrow c\,p + \sqrt{(1-c^2)M}\,\xi, \quad
        c = e^{-\gamma h M^{-1}}, \\
        z &\leftarrow z + \tfrac h2 M^{-1}p, \quad
        p \leftarrow p - \tfrac h2 \nabla\hat U(z).

    One minibatch force a step: the force at the end of a step is the next step's
    first kick. With exact forces a Gaussian target's law of z is exact at any
    stable step (:math:`h < 2` in units of the posterior sd), where SGHMC's
    explicit update is :math:`O(h)` off; the gradient noise adds momentum variance
    :math:`h^2\hat\tau^2` a step, which is not corrected for (``"vanilla"``
    only), so keep the noise small (control variates, the default gradient with a
    model) or the step short.

    :param model: a NumPyro model (see :class:`~numpyro_sgbd.SGBD`).
    :param potential_fn: instead of a model, a potential (exact gradients); needs
        ``init_params`` and ``step_size``.
    :param gradient_fn: instead of a model, ``gradient_fn(rng_key, z)`` returning
        a :class:`~numpyro_sgbd.GradientEstimate`; needs ``init_params`` and
        ``step_size``.
    :param step_size: h, a positive scalar or dict of sites. Default ``None``:
        adapted in warmup in the whitened coordinates u of the full-data Hessian
        at the mode, as for :class:`~numpyro_sgbd.SGBD` (target 0.2; no noise
        bound).
    :param friction: :math:`\gamma`, a positive scalar or dict of sites (default
        1; in u with a preconditioner).
    :param mass: the diagonal mass M, a positive scalar or dict of sites
        (default 1).
    :param str variant: ``"vanilla"`` (the only one).

    The other arguments are those of :class:`SGHMC`. The state is a
    :class:`BAOABKernelState`; ``kinetic_energy`` is collected by default.

    **References**

    1. Leimkuhler, B. & Matthews, C. (2013). *Rational construction of stochastic
       numerical methods for molecular sampling.* Applied Mathematics Research
       eXpress.

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> kernel = BAOAB(potential_fn=lambda z: 0.5 * jnp.sum(z**2), step_size=1.0)
    >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=4000, num_chains=8,
    ...             chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.zeros((8, 1)))
    >>> bool(abs(mcmc.get_samples().var() - 1.0) < 0.1)  # exact at h = 1
    True
    """

    spec = BAOAB_SPEC
