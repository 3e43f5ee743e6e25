"""The samplers users construct: SGBD, SGLD, NOGIN and the complete recipe's
SGHMC, SGNHT, SGRLD and any (D, Q) sampler.

Each is a short validating constructor over a pure update family of
:mod:`numpyro_sgbd.updates` and the NumPyro adapter of
:mod:`numpyro_sgbd.kernel` (:class:`~numpyro_sgbd.kernel._FamilyKernel`): its
state type, the family's ``init``/``step`` and its hyperparameters, which stay
call arguments of the pure step (so that tuning can vmap over them).
"""

from collections import namedtuple
from functools import partial
import warnings

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
from numpyro.infer.initialization import init_to_uniform

from numpyro_sgbd import core, monitoring
from numpyro_sgbd.estimators import _finite_tree
from numpyro_sgbd.kernel import (
    SGState,
    _FamilyKernel,
    _has_tracer,
    _SGKernel,
    family_state,
    logger,
)
from numpyro_sgbd.options import _check_positive, _check_positive_tree, _per_site
from numpyro_sgbd.setup import dimension
from numpyro_sgbd.updates import (
    BARKER_TOLERANCE,
    COVARIANCES,
    VARIANTS,
    nogin_damp,
)
from numpyro_sgbd.updates.barker import INCREMENTS
from numpyro_sgbd.updates.nogin import NOGINUpdateState, nogin_init, nogin_step
from numpyro_sgbd.updates.position import (
    PositionInfo,
    PositionState,
    barker_update,
    langevin_update,
    position_init,
)
from numpyro_sgbd.updates.recipe import check_recipe, recipe_step
from numpyro_sgbd.updates.sghmc import sghmc_init, sghmc_step
from numpyro_sgbd.updates.sgnht import sgnht_init, sgnht_step
from numpyro_sgbd.validation import check_step_size

__all__ = [
    "NOGIN",
    "NOGINState",
    "SGBD",
    "SGHMC",
    "SGLD",
    "SGNHT",
    "SGRLD",
    "Recipe",
    "choose_covariance",
]


class SGBD(_FamilyKernel):
    r"""Stochastic gradient Barker dynamics (Mauri & Zanella, 2024).

    Each coordinate :math:`j` draws an increment :math:`w_j` of scale
    :math:`\sigma_j` = ``step_size`` and moves to :math:`z_j + w_j` or
    :math:`z_j - w_j`, choosing :math:`+w_j` with probability
    :math:`p(w_j, \hat g_j)` where :math:`\hat g = -\nabla\hat U` is the minibatch
    force:

    .. math::

        p = \mathrm{sigmoid}(w\hat g) \ (\text{vanilla}), \quad
        \mathrm{sigmoid}(\alpha w\hat g),\ \alpha =
            \frac{1.702}{\sqrt{1.702^2 - \hat\tau^2 w^2}} \ (\text{corrected}), \quad
        \mathbf 1(w\hat g > 0) \ (\text{extreme}).

    The corrected variant falls back to the sign rule where
    :math:`|w| \ge 1.702/\hat\tau`. :math:`\hat\tau_j` is the standard deviation of
    the noise of :math:`\hat g_j` itself (SGBD paper, Algorithm 3 line 6 writes the
    per-datum sd; the correction needs :math:`\sqrt{c}` times it), estimated from the
    minibatch's per-datum gradients and smoothed by the moving average
    :math:`\hat\tau \leftarrow (1-\beta)\hat\tau + \beta\tau`.

    :param model: a NumPyro model whose data sit in
        ``numpyro.plate(name, N, subsample_size=n)``. The kernel draws the minibatch
        indices itself in O(n) and substitutes them into the plate. Latent sites must
        be continuous and outside the subsample plate. A model with no subsample plate
        runs full batch (exact gradients), with a warning.
    :param potential_fn: instead of a model, a potential :math:`U(z)`; the gradients
        are then exact (unadjusted Barker). Needs ``init_params``.
    :param gradient_fn: instead of a model, ``gradient_fn(rng_key, z)`` returning a
        :class:`~numpyro_sgbd.GradientEstimate` (noisy gradient of the potential and,
        for ``variant="corrected"``, its noise sd). Needs ``init_params``.
    :param step_size: :math:`\sigma`, a positive scalar, or a dict
        ``{site: value}`` broadcastable to each site's unconstrained shape for
        per-coordinate steps (diagonal preconditioning, SGBD paper supplement D.3).
        Default ``None``: adapted in warmup, in the whitened coordinates u of the
        full-data Hessian at the mode, and fixed from the end of warmup (target 0.5
        in u, lowered to keep every move inside the noise tolerance
        :math:`|w| < 1.702/\hat\tau`, eq. 8; sampling runs at 0.7 of the step
        warmup ends with; see :ref:`adaptation`). Needs a
        model.
    :param str variant: ``"vanilla"`` (Algorithm 2), ``"corrected"`` (Algorithm 3) or
        ``"extreme"`` (Algorithm 4). Default ``None``: ``"corrected"`` with
        ``step_size=None`` (``"vanilla"``, with a warning, for a model with several
        subsample plates), ``"vanilla"`` with a given step size.
    :param str preconditioner: the change of variables :math:`z = \hat z + Lu`,
        :math:`LL^\top \approx H^{-1}` at the full-data mode :math:`\hat z`, in
        which the update rule runs (:mod:`~numpyro_sgbd.preconditioning`):
        ``"dense"``, ``"lowrank"``, ``"diagonal"``, ``"auto"`` (dense for d <= 100,
        low-rank above) or ``"none"``. Default ``None``: ``"auto"`` with
        ``step_size=None``, ``"none"`` with a given step size (which is then a
        scalar in u). Without ``init_params`` chains start at draws from the
        Laplace approximation :math:`N(\hat z, LL^\top)`. What was chosen and what
        it cost: :attr:`adaptation_info`.
    :param bool adapt_mass_matrix: re-estimate the per-coordinate sds s of u from
        each chain's warmup draws, in windows as NUTS adapts its diagonal mass
        matrix (:func:`~numpyro_sgbd.preconditioning.scale_windows`: a buffer of
        15 % of warmup, three doubling windows ending at 60 %; each estimate shrunk
        towards the Laplace scale 1), and run the rule in v = u / s. It corrects
        L where the posterior is far from its Laplace approximation (a scale
        mixture, heavy tails, a skewed scale parameter), which otherwise mixes
        slowly along the coordinates L makes too narrow (a spike-and-slab
        posterior 3.7 times wider than L: bulk ESS 1,800 against 50, the sd within
        4 %). Default ``None``: on with ``step_size=None`` (from ``num_warmup >=
        200``), off with a given step size. Needs a preconditioner. Each chain's
        s: ``last_state.scale.scale``.
    :param str increment: ``"bimodal"`` (default; :math:`w \sim N(\sigma,
        (0.1\sigma)^2)`, by symmetry the paper's bimodal law) or ``"gaussian"``
        (:math:`w \sim N(0, \sigma^2)`).
    :param float beta: moving-average rate of :math:`\hat\tau` (corrected). Default
        0.1: it averages about ten minibatches, cutting the sampling error of a
        single batch's estimate about four-fold, while still following the change
        of :math:`\tau` along the chain within ten steps.
    :param init_noise_sd: initial :math:`\hat\tau` (scalar or dict of sites); default:
        the estimate from the first minibatch.
    :param replace: draw minibatch indices with replacement (``True``) or without
        (``False``, as NumPyro's plate: expected cost one sort of n integers per
        step; the noise variance factor is then :math:`n(1-n/N)` per unit of
        per-term variance instead of :math:`n`). Default ``None``: with replacement
        when :math:`n \le N/100`, where the two differ by at most 1 % in noise
        variance and the sort would cost more than a small model's minibatch
        gradient; without replacement otherwise
        (:func:`~numpyro_sgbd.estimators.resolve_replace`).
    :param init_strategy: a NumPyro init strategy (default ``init_to_uniform``).
    :param int log_likelihood_size: how many data points the ``model`` property (and so
        ArviZ's ``log_likelihood`` and ``observed_data`` groups) evaluates; default the
        subsample size.
    :param str gradient: ``"minibatch"``, or ``"control_variates"``: the
        minibatch gradient around a centre :math:`\hat z`,
        :math:`\nabla U(\hat z) + \nabla\hat U_S(z) - \nabla\hat U_S(\hat z)`
        (:class:`~numpyro_sgbd.estimators.ControlVariateEstimator`), unbiased, with a
        noise that vanishes as the chain nears :math:`\hat z`; the noise statistics
        of the corrected variants then come from the per-datum differences, so
        corrected SGBD stays within its tolerance on large N. A step costs about two
        minibatch gradients; the full-data potential and gradient at the centre are
        computed once, in chunks. Needs a model with one subsample plate.
        Default ``None``: ``"control_variates"`` (centred at the mode the
        adaptation finds) with ``step_size=None`` and one subsample plate,
        ``"minibatch"`` otherwise.
    :param dict centre: the control variates' centre, constrained values by site
        (as ``mcmc.get_samples()`` or :func:`~numpyro_sgbd.posterior_mode` give).
        Default: the full-data mode, found as :func:`~numpyro_sgbd.posterior_mode`
        finds it (Newton-CG on the chunked full-data potential from
        ``init_to_median``, a few full-data gradients per iteration and d
        Hessian-vector products at the end; a one-line report is logged to the
        ``numpyro_sgbd`` logger; it warns if the search stops within a posterior
        sd of a mode without converging and raises if it ends farther); the
        result is in :attr:`centre_info`.
    :param int chunk_size: data rows per chunk of the full-data computations at the
        centre (default 4096): memory O(chunk_size x d), whatever N.
    :param int num_steps: SG steps per sample (default 1), as HMC's ``num_steps``
        is leapfrog steps per sample: each call of ``sample`` (one tick of NumPyro's
        progress bar, one row of ``extra_fields``) runs ``num_steps`` steps in one
        compiled loop and returns the last. ``num_warmup`` and ``num_samples`` count
        samples, so a run takes ``num_steps * (num_warmup + num_samples)`` steps, and
        ``MCMC``'s ``thinning=t`` keeps every ``t * num_steps``-th step. The draws
        in between are never stored or dispatched: with ``progress_bar=True``
        NumPyro's Python work per sample is paid once per
        ``num_steps`` steps. The chain is the one ``num_steps=1`` runs with
        ``num_steps`` times the warmup, of which every ``num_steps``-th draw is
        kept.
    :param int recentre_every: with control variates, move the centre during
        warmup: every ``recentre_every`` warmup steps it becomes the mean of the
        chain's unconstrained positions over those steps, with the full-data
        potential and gradient there (in chunks; a non-finite result keeps the old
        centre). Without ``centre`` no mode search runs and each chain starts
        centred at its initial position. After warmup the centre stays where it is
        (the draws come from one time-homogeneous chain); it is in
        ``mcmc.last_state.centre`` (a :class:`~numpyro_sgbd.Centre`). Each
        re-centring costs one pass over the data, about N/n minibatch gradients:
        ``recentre_every`` of N/n or more adds at most about one minibatch
        gradient per warmup step. It helps where the posterior mean is far from the
        mode in posterior sds, or where no good centre is at hand (see the user
        guide). Default ``None``: a fixed centre.

    **References**

    1. Mauri, L. & Zanella, G. (2024). *Robust SGMCMC with Barker dynamics.*
       Algorithms 2-4, eq. (8), Corollary 1.

    **Example**

    >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
    ...     with numpyro.plate("data", y.shape[0], subsample_size=50) as idx:
    ...         numpyro.sample("y", dist.Normal(mu, 1), obs=y[idx])
    >>> y = 3.0 + jax.random.normal(jax.random.key(1), (2000,))
    >>> mcmc = MCMC(SGBD(model, step_size=0.01), num_warmup=500, num_samples=2000,
    ...             progress_bar=False)
    >>> mcmc.run(jax.random.key(0), y)
    >>> bool(abs(mcmc.get_samples()["mu"].mean() - y.mean()) < 0.05)
    True
    """

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size=None,
        variant=None,
        increment="bimodal",
        beta=0.1,
        init_noise_sd=None,
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
        if increment not in INCREMENTS:
            raise ValueError(
                f"increment must be one of {INCREMENTS}, got {increment!r}."
            )
        super().__init__(
            model,
            potential_fn,
            gradient_fn,
            step_size=step_size,
            variant=variant,
            beta=beta,
            init_noise_sd=init_noise_sd,
            preconditioner=preconditioner,
            adapt_mass_matrix=adapt_mass_matrix,
            gradient=gradient,
            centre=centre,
            recentre_every=recentre_every,
            replace=replace,
            init_strategy=init_strategy,
            log_likelihood_size=log_likelihood_size,
            chunk_size=chunk_size,
            num_steps=num_steps,
        )
        self._hyperparameters = {"increment": increment}

    _state_type = SGState
    _family_init = staticmethod(position_init)
    _family_step = staticmethod(barker_update)
    _VARIANTS = VARIANTS
    _SCALE_MAX = None

    # In u (unit posterior scale) a Barker step of 0.5 gave xi 0.016 and a mean
    # bias of 0.04 sd on a 26,000-row logistic regression (issue 17); the
    # coordinates of a product target move independently, so it does not
    # shrink with d. The increment |w| stays below 1.3 sigma with the bimodal law
    # (N(sigma, (0.1 sigma)^2)), so tau sigma < 1.702 / 1.3 keeps every move inside
    # the corrected rule's tolerance |w| < 1.702 / tau (SGBD paper, eq. 8).
    _STEP_TARGET = 0.5
    # Sampling at 0.35 in u. Unadjusted Barker on a standard normal has variance
    # about 1 + 0.66 sigma^2 (simulated: 1.16 at 0.5, 1.08 at 0.35, 1.04 at 0.25),
    # so its sds come out 7 %, 4 % and 2 % wide. At 0.5 the default's xi was 0.059
    # on average over 50 seeds of ISLR Default (3,000 + 30,000 steps, Monte Carlo
    # floor 0.02); at 0.35 0.027-0.039 on average over 8 seeds of each
    # adaptation-accuracy problem. At 0.25 the bias falls to about 2 % but the ESS
    # halves, and at 30,000 draws the run-end checks then warned on 4 of 24 runs
    # (three R-hats just above 1.01, one drift) where 0.35 warned on 1
    # (benchmarks/step_targets.py --fractions, results.md). Warmup stays at 0.5:
    # with a smaller step throughout, the scale windows saw too little of a
    # posterior wider than its Laplace approximation (spike-and-slab: s 1.3 and
    # 2.8 where 3.7 is right).
    _SAMPLING_FRACTION = 0.7

    def _noise_step_bound(self, largest):
        return BARKER_TOLERANCE / 1.3 / largest


class SGLD(_FamilyKernel):
    r"""Stochastic gradient Langevin dynamics (Welling & Teh, 2011).

    .. math::

        z \leftarrow z - \frac{\sigma^2}{2}\nabla\hat U(z) + \varepsilon, \quad
        \varepsilon \sim N(0, \sigma^2)\ (\text{vanilla}),\
        N(0, \max(0, \sigma^2 - \hat\tau^2\sigma^4/4))\ (\text{corrected}),\
        0\ (\text{extreme}).

    ``step_size`` is :math:`\sigma` in the SGBD paper's parameterisation; BlackJAX's
    ``sgld`` step size is :math:`\epsilon = \sigma^2/2`. All other arguments are as
    for :class:`SGBD` (there is no ``increment``); with ``step_size=None`` the
    target in the whitened coordinates is 0.4, lowered to keep
    :math:`\hat\tau\sigma < 1.6`. ``tolerance_exceeded`` counts the
    coordinates where the gradient noise alone exceeds the injected variance
    (:math:`\hat\tau\sigma \ge 2`).
    ``adapt_mass_matrix`` is off by default and keeps s at most 1, as for
    :class:`NOGIN`: unadjusted Langevin is unstable for steps past about twice
    the posterior's curvature radius, which L fixes at the mode (on a
    spike-and-slab posterior, uncapped scales about 4 made SGLD's sd 15 % too
    wide).

    **References**

    1. Welling, M. & Teh, Y. W. (2011). *Bayesian learning via stochastic gradient
       Langevin dynamics.* ICML.
    2. Mauri, L. & Zanella, G. (2024). *Robust SGMCMC with Barker dynamics.*
       Supplement, Algorithms 5-6.

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z**2), step_size=0.5)
    >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=4000, progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.zeros(2))
    >>> bool(abs(mcmc.get_samples().var() - 1 / (1 - 0.5**2 / 4)) < 0.15)
    True
    """

    # Unadjusted Langevin on a standard normal has variance 1 / (1 - sigma^2 / 4):
    # sigma = 0.4 overstates the sd by 2 %, 0.5 by 3 % (xi 0.023 measured on the
    # 26,000-row regression of issue 17). The corrected noise variance
    # sigma^2 - tau^2 sigma^4 / 4 is positive while tau sigma < 2; the cap keeps
    # a fifth of that margin.
    _STEP_TARGET = 0.4
    _state_type = SGState
    _family_init = staticmethod(position_init)
    _family_step = staticmethod(langevin_update)
    _VARIANTS = VARIANTS

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
        super().__init__(
            model,
            potential_fn,
            gradient_fn,
            step_size=step_size,
            variant=variant,
            beta=beta,
            init_noise_sd=init_noise_sd,
            preconditioner=preconditioner,
            adapt_mass_matrix=adapt_mass_matrix,
            gradient=gradient,
            centre=centre,
            recentre_every=recentre_every,
            replace=replace,
            init_strategy=init_strategy,
            log_likelihood_size=log_likelihood_size,
            chunk_size=chunk_size,
            num_steps=num_steps,
        )

    def _noise_step_bound(self, largest):
        return 1.6 / largest


NOGINState = namedtuple(
    "NOGINState",
    [
        "i",
        "z",
        "p",
        "potential_energy_estimate",
        "mean_noise_sd",
        "noise_damping",
        "num_nonfinite",
        "centre",
        "rng_key",
        "step_size",
        "scale",
        "trace",
    ],
    defaults=(None, None, None),
)
NOGINState.__doc__ = """
State of :class:`NOGIN`. The scalar fields can be collected with
``MCMC.run(..., extra_fields=(...))``; ``potential_energy_estimate``,
``mean_noise_sd``, ``noise_damping`` and ``num_nonfinite`` are collected by default.

 - **i** - iteration number.
 - **z** - position in unconstrained space (dict of sites for a model).
 - **p** - momentum, a flat vector over z raveled by
   :func:`jax.flatten_util.ravel_pytree`.
 - **potential_energy_estimate** - the minibatch estimate of the potential at the
   half-step position where the last step evaluated its force.
 - **mean_noise_sd** - the mean over coordinates of the noise sd
   :math:`\\sqrt{\\Sigma_{jj}}` of the last force (0 with exact gradients).
 - **noise_damping** - :math:`\\frac{\\beta h^2}{4}\\rho(\\Sigma M^{-1})`, the largest
   eigenvalue of the noise term of the last O-step (0 with exact gradients). The
   damping factor's smallest eigenvalue is
   :math:`(1-\\lambda^2-x)/(1+\\lambda^2+x)` at this value x; near 1 or above,
   gradient noise rather than the step size limits exploration (see :class:`NOGIN`).
 - **num_nonfinite** - number of refused non-finite steps (see :class:`SGState`).
 - **centre** - the control variates' centre while re-centring (see
   :class:`SGState`), else ``None``.
 - **rng_key** - random key.
 - **step_size**, **scale** - as for :class:`SGState`; with ``scale`` the mass in
   u is ``mass / s**2``.
 - **trace** - the convergence check's draws (see :class:`SGState`).
"""

# noise_damping above which the gradient noise, not the step, sets the
# autocorrelation time (Matthews & Weare, Section 4.3).
_STALL_DAMPING = 1.0
# Check the damping once, at this iteration or at the end of warmup if later.
_STALL_CHECK_ITERATION = 100


def _warn_stall(i, damping):
    warnings.warn(
        f"NOGIN: noise_damping = {float(np.max(damping)):.3g} at iteration "
        f"{int(np.max(i))}. The momentum damping that cancels the gradient noise "
        "multiplies the autocorrelation time by about 1 + noise_damping (Matthews & "
        "Weare, Section 4.3): below this subsample size fewer data per step no longer "
        "buy more effective draws per data pass. Increase subsample_size (the noise "
        "variance falls like 1/n) or otherwise reduce the gradient noise. Far from "
        "the posterior the noise is larger still and can freeze the chain: start "
        "NOGIN near the posterior (init_to_value(values=posterior_mode(model, "
        "*args).params), or init_params from a short SGBD run). See "
        "state.noise_damping / sample_stats.",
        UserWarning,
        stacklevel=2,
    )


def _mean_noise_sd(noise, covariance, dtype):
    """The mean over coordinates of the noise sd in a covariance of the given form
    (0 for exact gradients, ``noise`` None)."""
    if noise is None:
        return jnp.zeros((), dtype)
    if covariance == "diag":
        var = noise
    elif covariance == "full":
        var = jnp.diagonal(noise)
    else:
        var = jnp.sum(noise**2, axis=1)
    return jnp.mean(jnp.sqrt(var)) if var.size else jnp.zeros((), noise.dtype)


#: Largest noise-covariance matrix (d x d for "full", n x n inside "lowrank") that
#: ``covariance="auto"`` forms per chain, in bytes of float32.
MAX_COVARIANCE_BYTES = 2**30


def choose_covariance(d, n):
    """NOGIN's covariance form for ``d`` coordinates and minibatches of ``n``:
    ``(form, reason)``.

    A step costs :math:`O(dn^2 + n^3)` in the ``"lowrank"`` form (the d x n factor
    and an n x n solve) and :math:`O(d^2 n + d^3)` in the ``"full"`` form (the d x d
    matrix and its eigendecomposition), so the low-rank form is the cheaper exactly
    when n < d. Where the cheaper form's square matrix would pass
    :data:`MAX_COVARIANCE_BYTES`, ``"diag"`` (:math:`O(dn)`, an approximation) is
    chosen instead. Without subsampling (n = 0) the noise is zero: ``"diag"``.

    >>> choose_covariance(21, 1000)[0], choose_covariance(1000, 100)[0]
    ('full', 'lowrank')
    """
    if n == 0:
        return "diag", "no subsample plate: exact gradients, no noise"
    form, side = ("lowrank", n) if n < d else ("full", d)
    if 4 * side**2 > MAX_COVARIANCE_BYTES:
        return "diag", (
            f"d = {d}, n = {n}: the {form} form's {side} x {side} matrix would take "
            f"{4 * side**2 / 2**30:.1f} GiB per chain; the diagonal approximation "
            "instead"
        )
    return form, f"d = {d}, n = {n}: O(d n^2 + n^3) against O(d^2 n + d^3) a step"


class NOGIN(_SGKernel):
    r"""NOGIN, the noisy gradient integrator (Matthews & Weare).

    Underdamped Langevin dynamics in (z, p), integrated by A-B-O-B-A steps whose
    O-step damps the momentum by the covariance :math:`\Sigma` of the minibatch force
    :math:`\tilde F = -\nabla\hat U` (Algorithm 2). With
    :math:`\lambda = \sqrt{(1-e^{-\gamma h})/(1+e^{-\gamma h})}` and one draw
    :math:`R\sim N(0, M/\beta)` per step:

    .. math::

        z &\leftarrow z + \tfrac h2 M^{-1}p, \qquad
        p \leftarrow p + \tfrac h2\tilde F(z) + \lambda R, \\
        p &\leftarrow \Big((1-\lambda^2)I - \tfrac{\beta h^2}{4}\Sigma M^{-1}\Big)
            \Big((1+\lambda^2)I + \tfrac{\beta h^2}{4}\Sigma M^{-1}\Big)^{-1}p, \\
        p &\leftarrow p + \tfrac h2\tilde F(z) + \lambda R, \qquad
        z \leftarrow z + \tfrac h2 M^{-1}p.

    The O-step damps by :math:`\beta\Sigma M^{-1}`, not the paper's
    :math:`M\Sigma/\beta`, which is exact only for :math:`M = I`, :math:`\beta = 1`
    (see :func:`~numpyro_sgbd.updates.nogin_damp`).
    For a Gaussian target with Gaussian gradient noise the z-marginal is exact at any
    stable step (:math:`h^2 < 4\rho(\Omega)` in the scale M sets; Lemma 4.2); for
    smooth targets the bias is :math:`O(h^2)` (Theorem 4.1), where SGLD's is
    :math:`O(h)` plus the gradient noise's share.

    :math:`\Sigma` comes from the minibatch's per-datum gradients
    (their sample covariance:
    :math:`\Sigma = CC^\top`, :math:`C = \sqrt{c/(n-1)}(G-\bar G)^\top`), in one of
    three forms, chosen by default (``covariance="auto"``) from d and n by
    :func:`~numpyro_sgbd.kernels.choose_covariance` (the choice is logged to the
    ``"numpyro_sgbd"`` logger and is :attr:`covariance` after ``init``):

    - ``"lowrank"``: the d x n factor C; the O-step is solved by the
      Woodbury identity in :math:`O(dn^2 + n^3)` and never forms a d x d matrix. Exact
      for the minibatch estimate; the cheaper form when n < d (regressions on many
      features, neural networks, matrix factorisation).
    - ``"full"``: the d x d matrix and one symmetric eigendecomposition per step,
      :math:`O(d^2 n + d^3)`. Same result as ``"lowrank"``; the cheaper form when
      n > d.
    - ``"diag"``: only the diagonal, :math:`O(dn)`: the cheap approximation that
      drops the correlations of the noise between coordinates (biased where they
      matter, e.g. correlated features).

    **Scale.** With the default unit mass, z's natural unit of time is its posterior
    sd s: set ``mass`` to about the posterior precision (:math:`1/s^2`, per site or
    coordinate), and then ``step_size`` around 0.1-1 and ``friction`` around 1 are
    sensible. The scheme is stable for :math:`h^2 < 4 s^2 m`. ``noise_damping`` in
    the state (and ArviZ's ``sample_stats``) is
    :math:`\frac{\beta h^2}{4}\rho(\Sigma M^{-1})`; the autocorrelation time is about
    :math:`(4/h^2)(1 + \text{noise\_damping})` steps (Section 4.3), so above 1 the
    gradient noise, not the step, limits exploration. The kernel warns, once, when
    it exceeds 1 at iteration ``max(num_warmup, 100)``.

    :param model: a NumPyro model with its data in
        ``numpyro.plate(name, N, subsample_size=n)``, as for :class:`SGBD`; the
        noise covariance needs a single subsample plate. A model without one runs
        full batch with :math:`\Sigma = 0`.
    :param potential_fn: instead of a model, a potential :math:`U(z)`: exact
        gradients, :math:`\Sigma = 0`. Needs ``init_params``.
    :param gradient_fn: instead of a model, ``gradient_fn(rng_key, z)`` returning a
        :class:`~numpyro_sgbd.GradientEstimate` with ``noise_cov`` in the form
        ``covariance`` names (over z raveled by
        :func:`~jax.flatten_util.ravel_pytree`). Needs ``init_params``.
    :param float step_size: h, a positive scalar (precondition with ``mass``).
        Default ``None``: adapted in warmup in the whitened coordinates u of the
        full-data Hessian H at the mode, where the mass is the identity (M = H in
        z; dense where the preconditioner is): target 0.5, lowered while
        ``noise_damping`` exceeds 1, fixed from the end of warmup (see
        :ref:`adaptation`). Needs a model and ``mass=1.0``.
    :param str preconditioner: as for :class:`SGBD`.
    :param bool adapt_mass_matrix: as for :class:`SGBD` (the mass in u becomes
        ``1 / s**2``), but off by default and with s at most 1: the windows may
        shorten the steps where the posterior is narrower than L says, never
        lengthen them past what the curvature at the mode allows (unadjusted
        Langevin rules are unstable beyond it).
    :param float friction: :math:`\gamma > 0`. Default 1.
    :param mass: the diagonal of M: a positive scalar, an array broadcastable to z,
        or a dict ``{site: value}`` broadcastable to each site's unconstrained shape.
    :param float inverse_temperature: :math:`\beta > 0` (Algorithm 2); the chain
        targets :math:`\pi^\beta`. Default 1.
    :param str covariance: ``"auto"`` (default: ``"lowrank"`` when n < d, else
        ``"full"``, ``"diag"`` where that matrix would pass 1 GiB), ``"lowrank"``,
        ``"full"`` or ``"diag"``. With ``gradient_fn`` name the form it returns.
    :param bool replace: draw minibatch indices with replacement (as :class:`SGBD`).
    :param init_strategy: a NumPyro init strategy (default ``init_to_uniform``).
    :param int log_likelihood_size: as for :class:`SGBD`.
    :param str gradient: ``"minibatch"`` or ``"control_variates"``, as for
        :class:`SGBD` (with control variates, :math:`\Sigma` comes from the
        per-datum differences).
    :param dict centre: as for :class:`SGBD`.
    :param int chunk_size: as for :class:`SGBD`.
    :param int num_steps: as for :class:`SGBD`.
    :param int recentre_every: as for :class:`SGBD`.

    **References**

    1. Matthews, C. & Weare, J. (2018). *Langevin Markov chain Monte Carlo with
       stochastic gradients.* Algorithms 1-2, eq. (4), Lemma 4.2, Theorem 4.1,
       Section 4.3.

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sgbd import GradientEstimate
    >>> def gradient_fn(rng_key, z):  # N(0, 1) target, force noise of variance 1
    ...     noise = jax.random.normal(rng_key, z.shape)
    ...     return GradientEstimate(z + noise, noise_cov=jnp.ones(z.shape))
    >>> kernel = NOGIN(gradient_fn=gradient_fn, step_size=1.5, covariance="diag")
    >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=4000, num_chains=8,
    ...             chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.zeros((8, 1)))
    >>> bool(abs(mcmc.get_samples().var() - 1.0) < 0.1)  # SGLD: about 3.6
    True
    """

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size=None,
        friction=1.0,
        mass=1.0,
        inverse_temperature=1.0,
        covariance="auto",
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
        check_step_size(step_size, "a positive float, or None to adapt it in warmup")
        if step_size is not None and (
            isinstance(step_size, dict) or np.ndim(step_size) != 0
        ):
            raise ValueError(
                "NOGIN's step_size must be a positive scalar; for per-coordinate "
                f"scales set mass= (the diagonal of M). Got {step_size!r}."
            )
        _check_positive(friction, "friction")
        _check_positive(inverse_temperature, "inverse_temperature")
        _check_positive_tree(mass, "mass")
        if covariance not in COVARIANCES + ("auto",):
            raise ValueError(
                f"covariance must be 'auto' or one of {COVARIANCES}, got "
                f"{covariance!r}."
            )
        if covariance == "auto" and gradient_fn is not None:
            raise ValueError(
                "With gradient_fn, name the form of the noise covariance your "
                f"function returns: covariance= one of {COVARIANCES}."
            )
        super().__init__(
            model,
            potential_fn,
            gradient_fn,
            step_size=step_size,
            preconditioner=preconditioner,
            adapt_mass_matrix=adapt_mass_matrix,
            gradient=gradient,
            centre=centre,
            recentre_every=recentre_every,
            replace=replace,
            init_strategy=init_strategy,
            log_likelihood_size=log_likelihood_size,
            chunk_size=chunk_size,
            num_steps=num_steps,
        )
        if self._preconditioner_arg != "none" and not (
            np.ndim(mass) == 0 and not isinstance(mass, dict) and float(mass) == 1.0
        ):
            raise ValueError(
                "with a preconditioner (step_size=None, or preconditioner=...) the "
                "mass is the identity in the whitened coordinates u, M = H at the "
                "mode in z: leave mass=1.0, or pass preconditioner='none' with a "
                "step_size and your own mass."
            )
        self._friction = float(friction)
        self._inverse_temperature = float(inverse_temperature)
        self._mass_arg = mass
        self._covariance_arg = covariance
        # Exact gradients (potential_fn) have no noise: any form serves.
        self._covariance = (
            "diag" if covariance == "auto" and model is None else covariance
        )
        self._mass = None

    @property
    def default_fields(self):
        """``z`` and the per-draw sampler statistics (see :class:`NOGINState`)."""
        return (
            "z",
            "potential_energy_estimate",
            "mean_noise_sd",
            "noise_damping",
            "num_nonfinite",
        )

    @property
    def covariance(self):
        """The form of the noise covariance: as given, or with
        ``covariance="auto"`` the form chosen at ``init`` (``"auto"`` before it)."""
        return self._covariance

    def _noise_form(self):
        return self._covariance

    def _resolve_noise_form(self, noise_form, shapes, plates):
        if self._covariance_arg != "auto":
            return noise_form
        d = dimension(shapes)
        n = max((m for _, m in plates.values()), default=0)
        self._covariance, why = choose_covariance(d, n)
        logger.info("NOGIN: covariance=%r (%s).", self._covariance, why)
        return self._covariance

    def _noise_needed_by(self):
        return "NOGIN", ""

    def _prepare(self, shapes, one_z):
        super()._prepare(shapes, one_z)
        mass = _per_site(self._mass_arg, shapes, "mass")
        flat_z, _ = ravel_pytree(one_z)
        if isinstance(mass, dict):  # ravel_pytree orders both dicts by key
            mass = ravel_pytree(mass)[0]
        elif isinstance(shapes, dict):  # one scalar for every site
            mass = jnp.broadcast_to(mass, flat_z.shape)
        else:  # z is one array
            mass = jnp.broadcast_to(mass, shapes).ravel()
        self._mass = jnp.asarray(mass, flat_z.dtype)

    def _check_probe(self, probe, one_z):
        if probe.noise_cov is None:
            if self._gradient_fn is not None:
                raise ValueError(
                    "NOGIN needs the covariance of the gradient noise: gradient_fn "
                    "must return GradientEstimate(z_grad, noise_cov=...) in the form "
                    f"covariance={self._covariance!r} names (zeros for exact "
                    "gradients)."
                )
            return
        d = ravel_pytree(one_z)[0].shape[0]
        try:
            jax.eval_shape(
                partial(nogin_damp, covariance=self._covariance),
                jax.ShapeDtypeStruct((d,), jnp.result_type(float)),
                probe.noise_cov,
                1.0,
                0.5,
            )
        except ValueError as err:
            raise ValueError(f"The gradient estimate's noise_cov: {err}") from None

    # Exact for a Gaussian target with Gaussian noise whatever h < 2 in units of
    # the posterior sd (Matthews & Weare, Lemma 4.2); 0.5 in u keeps the
    # second-order bias of non-Gaussian targets (their Theorem 4.1) small. The
    # noise term's damping grows like h^2: the step is kept where it is <= 1
    # (Section 4.3: beyond it the momentum is cancelled every step).
    _STEP_TARGET = 0.5
    _SCALE_MAX = 1.0

    def _step_allowed(self, state):
        target = jnp.asarray(self._STEP_TARGET, jnp.result_type(float))
        damping = state.noise_damping
        step = core.step_size(self._adaptation(), state)
        allowed = jnp.where(damping > 1.0, step / jnp.sqrt(damping), jnp.inf)
        return jnp.minimum(target, allowed).astype(target.dtype)

    def _mass_of(self, state):
        """The chain's mass: ``mass / s**2`` in u with re-estimated scales s (the
        rule in v = u / s with the given mass), else ``mass``."""
        if state.scale is None:
            return self._mass
        return self._mass / state.scale.scale**2

    def _init_state(self, rng_key, z, model_args, model_kwargs):
        rng_key, key_p, key_est = random.split(rng_key, 3)
        flat, _ = ravel_pytree(z)
        p = nogin_init(
            flat, key_p, mass=self._mass, inverse_temperature=self._inverse_temperature
        ).p
        centre = self._initial_centre(z, model_args, model_kwargs)
        est = self._estimate(key_est, z, model_args, model_kwargs, centre)
        noise = est.noise_cov
        mean_sd = _mean_noise_sd(noise, self._covariance, flat.dtype)
        state = NOGINState(
            i=jnp.array(0),
            z=z,
            p=p,
            potential_energy_estimate=jnp.asarray(
                est.potential_energy, jnp.result_type(float)
            ),
            mean_noise_sd=mean_sd,
            noise_damping=jnp.array(jnp.nan, flat.dtype),
            num_nonfinite=jnp.array(0),
            centre=centre,
            rng_key=rng_key,
            scale=core.initial_scale(self._adaptation(), flat),
        )
        if self._step_size_arg is None:
            state = state._replace(step_size=jnp.asarray(self._STEP_TARGET, flat.dtype))
        return state

    def _sample_one(self, state, model_args, model_kwargs):
        """One step of the pure :func:`~numpyro_sgbd.updates.nogin.nogin_step` in
        x (u with a preconditioner, where M = I, else z), its force estimated at
        the half-step position through the chain's estimator and centre."""
        rng_key, key_kick, key_est = random.split(state.rng_key, 3)
        flat, unravel = ravel_pytree(state.z)
        adaptation = self._adaptation()
        pre = adaptation.preconditioner

        def estimate_fn(x):
            z = unravel(x if pre is None else pre.to_z(x))
            est = self._estimate(key_est, z, model_args, model_kwargs, state.centre)
            return est._replace(z_grad=ravel_pytree(est.z_grad)[0])

        x = flat if pre is None else pre.to_u(flat)
        aux, info = nogin_step(
            key_kick,
            NOGINUpdateState(x, state.p),
            estimate_fn,
            core.step_size(adaptation, state),
            friction=self._friction,
            covariance=self._covariance,
            mass=self._mass_of(state),
            inverse_temperature=self._inverse_temperature,
        )
        flat = aux.z if pre is None else pre.to_z(aux.z)
        est, damping = info.estimate, info.noise_damping
        mean_sd = _mean_noise_sd(est.noise_cov, self._covariance, flat.dtype)
        potential = jnp.asarray(est.potential_energy, jnp.result_type(float))
        ok = (
            _finite_tree((flat, aux.p, damping))
            & core.potential_ok(potential, self._gradient_fn is not None)
            & (state.num_nonfinite == 0)
        )
        moved = state._replace(
            i=state.i + 1,
            z=unravel(flat),
            p=aux.p,
            potential_energy_estimate=potential,
            mean_noise_sd=mean_sd,
            noise_damping=damping,
            rng_key=rng_key,
        )
        moved = core.adapt_scale(adaptation, moved)
        if state.scale is not None:
            # The momentum's law in v is unchanged by a new s: in u, p ~ N(0,
            # mass / (beta s^2)), so p moves with s_old / s_new.
            moved = moved._replace(p=moved.p * state.scale.scale / moved.scale.scale)
        moved = core.adapt_step(adaptation, moved, self._step_allowed)
        return core.guard(ok, moved, state, rng_key)

    def sample(self, state, model_args, model_kwargs):
        new_state = super().sample(state, model_args, model_kwargs)
        if not monitoring.enabled():
            return new_state
        check_at = max(self._num_warmup, _STALL_CHECK_ITERATION)
        stalled = jnp.any(
            (state.i < check_at)
            & (new_state.i >= check_at)
            & (new_state.noise_damping > _STALL_DAMPING)
        )
        return new_state._replace(
            i=monitoring.call_host(
                stalled, self._warn_stall, new_state.i, new_state.noise_damping
            )
        )

    def _warn_stall(self, i, damping):
        self._record_warning("stall")
        _warn_stall(i, damping)

    def _diagnostic_parts(self, state):
        return [
            f"noise_damping {float(np.max(state.noise_damping)):.3g}",
        ]


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

RecipeKernelState = family_state("RecipeKernelState", module=__name__)
RecipeKernelState.__doc__ = """State of :class:`Recipe` and :class:`SGRLD`: the
fields of :class:`~numpyro_sgbd.SGState`, ``tolerance_exceeded`` being the fraction
of eigenvalues of :math:`2D - \\epsilon\\hat B` clipped at 0."""


def _unit_diffusion(x):
    return jnp.ones_like(x)


def _recipe_family(rng_key, aux, z_grad, step_size, *, variant, noise_sd, **kw):
    """:func:`~numpyro_sgbd.updates.recipe.recipe_step` as a family step: the
    corrected variant's :math:`\\hat B` from the noise sd of the gradient."""
    noise_var = None
    if variant == "corrected" and noise_sd is not None:
        noise_var = ravel_pytree(jax.tree.map(jnp.square, noise_sd))[0]
    z, info = recipe_step(rng_key, aux.z, z_grad, step_size, noise_var=noise_var, **kw)
    return PositionState(z), PositionInfo(info.noise_clipped)


_PositionMomentum = namedtuple("_PositionMomentum", ["z", "p"])


def _position_momentum(x, rng_key):
    """The family state of a recipe on (z, p), p ~ N(0, I): SGHMC's unit-mass
    momentum draw."""
    return _PositionMomentum(x, sghmc_init(x, rng_key).p)


def _recipe_momentum_family(
    rng_key, aux, z_grad, step_size, *, variant, noise_sd, **kw
):
    r"""The recipe on (z, p) with H = U(z) + p'p / 2, so grad H = (grad U, p); the
    gradient noise is the z block of the diagonal V behind :math:`\hat B`."""
    noise_var = None
    if variant == "corrected" and noise_sd is not None:
        tau2 = ravel_pytree(jax.tree.map(jnp.square, noise_sd))[0]
        noise_var = jnp.concatenate([tau2, jnp.zeros_like(tau2)])
    (z, p), info = recipe_step(
        rng_key, (aux.z, aux.p), (z_grad, aux.p), step_size, noise_var=noise_var, **kw
    )
    return _PositionMomentum(z, p), PositionInfo(info.noise_clipped)


class SGHMC(_FamilyKernel):
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

    _state_type = SGHMCKernelState
    _family_init = staticmethod(sghmc_init)
    _family_step = staticmethod(sghmc_step)
    _INIT_ARGS = ("mass",)
    _NOISE_DIFFUSION = "friction"
    # In u (unit posterior scale) with C = 1 the explicit update's variance is
    # 1.053 at 0.05 (sd 2.6 % wide, like SGLD's 0.4) and 1.11 at 0.1.
    _STEP_TARGET = 0.05

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size=None,
        friction=1.0,
        mass=1.0,
        variant=None,
        preconditioner=None,
        gradient=None,
        centre=None,
        recentre_every=None,
        beta=0.1,
        init_noise_sd=None,
        replace=None,
        init_strategy=init_to_uniform,
        log_likelihood_size=None,
        chunk_size=4096,
        num_steps=1,
    ):
        _check_positive_tree(friction, "friction")
        _check_positive_tree(mass, "mass")
        super().__init__(
            model,
            potential_fn,
            gradient_fn,
            step_size=step_size,
            variant=variant,
            preconditioner=preconditioner,
            gradient=gradient,
            centre=centre,
            recentre_every=recentre_every,
            beta=beta,
            init_noise_sd=init_noise_sd,
            replace=replace,
            init_strategy=init_strategy,
            log_likelihood_size=log_likelihood_size,
            chunk_size=chunk_size,
            num_steps=num_steps,
        )
        self._hyperparameters = {"friction": friction, "mass": mass}


class SGNHT(_FamilyKernel):
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

    _state_type = SGNHTKernelState
    _family_init = staticmethod(sgnht_init)
    _family_step = staticmethod(sgnht_step)
    _INIT_ARGS = ("diffusion",)
    _NOISE_DIFFUSION = "diffusion"
    _STEP_TARGET = 0.05

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size=None,
        diffusion=1.0,
        variant="vanilla",
        preconditioner=None,
        gradient=None,
        centre=None,
        recentre_every=None,
        beta=0.1,
        init_noise_sd=None,
        replace=None,
        init_strategy=init_to_uniform,
        log_likelihood_size=None,
        chunk_size=4096,
        num_steps=1,
    ):
        if step_size is not None and (
            isinstance(step_size, dict) or np.ndim(step_size)
        ):
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
        super().__init__(
            model,
            potential_fn,
            gradient_fn,
            step_size=step_size,
            variant=variant,
            preconditioner=preconditioner,
            gradient=gradient,
            centre=centre,
            recentre_every=recentre_every,
            beta=beta,
            init_noise_sd=init_noise_sd,
            replace=replace,
            init_strategy=init_strategy,
            log_likelihood_size=log_likelihood_size,
            chunk_size=chunk_size,
            num_steps=num_steps,
        )
        self._hyperparameters = {"diffusion": diffusion}


class Recipe(_FamilyKernel):
    r"""Any sampler of the complete recipe (Ma, Chen & Fox, 2015): a diffusion
    matrix :math:`D(z)` and a curl matrix :math:`Q(z)` define

    .. math::

        z \leftarrow z - \epsilon\big[(D(z) + Q(z))\nabla\hat U(z) - \Gamma(z)\big]
            + N\big(0, \epsilon(2D(z) - \epsilon\hat B)\big), \qquad
        \Gamma_i(z) = \sum_j \partial_j\big(D_{ij}(z) + Q_{ij}(z)\big),

    the Euler step of the SDE of the paper's eqs. (2)-(3), whose stationary law is
    the posterior for every positive semi-definite D and skew-symmetric Q (Theorem
    1). The drift adds :math:`\epsilon\Gamma`: the paper's eq. (9) prints
    :math:`-\epsilon[\ldots + \Gamma]`, which contradicts its eq. (3) (with
    :math:`D = \mathrm{diag}(\phi)` on a Gamma target only :math:`+\Gamma` gives
    SGRLD's drift). :math:`\Gamma` comes from automatic differentiation of D and Q.
    :math:`\hat B = (D+Q)\,\mathrm{diag}(\hat\tau^2)(D+Q)^\top` with
    ``variant="corrected"``, 0 with ``"vanilla"`` (the default).

    ``Recipe(model, diffusion=lambda x: jnp.ones_like(x), step_size=eps)`` is
    :class:`~numpyro_sgbd.SGLD` with ``step_size = sqrt(2 eps)``, draw for draw
    with the same key.

    :param model: a NumPyro model (see :class:`~numpyro_sgbd.SGBD`), or
        ``potential_fn`` / ``gradient_fn`` with ``init_params``.
    :param float step_size: :math:`\epsilon`, a positive scalar (required: there is
        no whitened space in which to adapt a position-dependent D).
    :param diffusion: ``diffusion(x) -> D``: x is the unconstrained z flattened by
        :func:`jax.flatten_util.ravel_pytree` (sites in sorted order); D is a
        ``(d,)`` vector (a diagonal matrix) or a ``(d, d)`` positive
        semi-definite matrix.
    :param curl: ``curl(x) -> Q``, a ``(d, d)`` skew-symmetric matrix, or ``None``
        (Q = 0).
    :param bool momentum: run the recipe on :math:`x = (z, p)` with
        :math:`H = U(z) + \tfrac12 p^\top p` (:math:`p \sim N(0, I)` at the start);
        D and Q are then functions of the flat :math:`(z, p)` of size 2d.
        ``D = (0, C)``, ``Q = ((0, -I), (I, 0))`` is :class:`SGHMC` with unit
        mass (recipe paper, eq. 12). Default ``False``.
    :param str variant: ``"vanilla"`` (default) or ``"corrected"``
        (:math:`V = (\hat\tau^2, 0)` with ``momentum``).

    The other arguments are those of :class:`SGHMC` except ``preconditioner``
    (always ``"none"``). :math:`D` and :math:`Q` are checked at the initial
    position before compiling: shape, symmetry, positive semi-definiteness,
    skew-symmetry. The state is a :class:`RecipeKernelState`.

    **References**

    1. Ma, Y.-A., Chen, T. & Fox, E. (2015). *A complete recipe for stochastic
       gradient MCMC.* NIPS. Eqs. (2), (3), (9), Theorem 1.

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> kernel = Recipe(potential_fn=lambda z: 0.5 * jnp.sum(z**2), step_size=0.02,
    ...                 diffusion=lambda x: 1.0 + x**2)
    >>> mcmc = MCMC(kernel, num_warmup=500, num_samples=20000, progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.zeros(2))
    >>> bool(abs(mcmc.get_samples().var() - 1.0) < 0.15)
    True
    """

    _state_type = RecipeKernelState
    _family_init = staticmethod(position_init)
    _family_step = staticmethod(_recipe_family)

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size,
        diffusion,
        curl=None,
        momentum=False,
        variant="vanilla",
        gradient=None,
        centre=None,
        recentre_every=None,
        beta=0.1,
        init_noise_sd=None,
        replace=None,
        init_strategy=init_to_uniform,
        log_likelihood_size=None,
        chunk_size=4096,
        num_steps=1,
    ):
        check_step_size(step_size, "a positive float (epsilon)")
        if step_size is None or isinstance(step_size, dict) or np.ndim(step_size):
            raise ValueError(
                f"{type(self).__name__} needs step_size, a positive scalar epsilon "
                f"(got {step_size!r}): a position-dependent D has no whitened "
                "coordinates to adapt a step in."
            )
        if not callable(diffusion):
            raise ValueError(
                "diffusion must be a function x -> D(x) of the flat unconstrained "
                "position, returning a (d,) vector or a (d, d) matrix; got "
                f"{type(diffusion).__name__}."
            )
        if curl is not None and not callable(curl):
            raise ValueError(
                "curl must be None or a function x -> Q(x) returning a (d, d) "
                f"skew-symmetric matrix; got {type(curl).__name__}."
            )
        super().__init__(
            model,
            potential_fn,
            gradient_fn,
            step_size=step_size,
            variant=variant,
            preconditioner="none",
            gradient=gradient,
            centre=centre,
            recentre_every=recentre_every,
            beta=beta,
            init_noise_sd=init_noise_sd,
            replace=replace,
            init_strategy=init_strategy,
            log_likelihood_size=log_likelihood_size,
            chunk_size=chunk_size,
            num_steps=num_steps,
        )
        if not isinstance(momentum, (bool, np.bool_)):
            raise ValueError(f"momentum must be True or False, got {momentum!r}.")
        self._momentum = bool(momentum)
        if self._momentum:  # the family on (z, p)
            self._family_init = _position_momentum
            self._family_step = _recipe_momentum_family
        self._hyperparameters = {"diffusion": diffusion, "curl": curl}

    def _prepare(self, shapes, one_z):
        super()._prepare(shapes, one_z)
        x = ravel_pytree(one_z)[0]
        if self._momentum:
            x = jnp.concatenate([x, jnp.zeros_like(x)])
        if not _has_tracer(x):  # under pmap the start is abstract: checked there
            check_recipe(self._step_kwargs["diffusion"], self._step_kwargs["curl"], x)


class SGRLD(Recipe):
    r"""Stochastic gradient Riemannian Langevin dynamics (Patterson & Teh, 2013):
    the recipe with a position-dependent diagonal :math:`D(z) = G(z)^{-1}`, the
    inverse of a metric, :math:`Q = 0` and :math:`\hat B = 0` (Ma, Chen & Fox,
    2015, eq. 14):

    .. math::

        z_j \leftarrow z_j - \epsilon\big[D_j(z)\,\partial_j\hat U(z)
            - \partial_j D_j(z)\big] + \sqrt{2\epsilon D_j(z)}\,\eta_j.

    **The expanded mean on a simplex.** Write a Dirichlet(:math:`\alpha`) site as
    independent :math:`\phi_k \sim \mathrm{Gamma}(\alpha_k, 1)` with
    :math:`\theta = \phi / \sum_k\phi_k` (a deterministic site). Patterson & Teh's
    metric :math:`D = \mathrm{diag}(\phi)` becomes, in NumPyro's unconstrained
    :math:`z = \log\phi`, :math:`D(z) = e^{-z}`:
    ``SGRLD(model, inverse_metric={"phi": lambda z: jnp.exp(-z)}, ...)``.
    Each coordinate then moves on the scale of its own posterior sd, whether its
    count is 10 or :math:`10^6`. In :math:`\log\phi` the injected noise grows
    like :math:`e^{-z/2}`: where a posterior puts mass near :math:`\phi = 0`
    (:math:`\alpha_k + n_k \lesssim 1`) the explicit step can jump far and stop the
    chain as non-finite; take a smaller step there (Patterson & Teh's own update
    runs in :math:`\phi` with a mirror at 0:
    :func:`~numpyro_sgbd.updates.sgrld.sgrld_step` with ``reflect=True``).

    :param float step_size: :math:`\epsilon`, a positive scalar.
    :param inverse_metric: the diagonal :math:`D(z)`: a function of the
        unconstrained z (a dict of sites for a model) returning positive values
        of z's structure, or a dict ``{site: function of that site}``.

    The other arguments are those of :class:`Recipe` (no ``diffusion``, ``curl``
    or ``variant``). The state is a :class:`RecipeKernelState`.

    **References**

    1. Patterson, S. & Teh, Y. W. (2013). *Stochastic gradient Riemannian Langevin
       dynamics on the probability simplex.* NIPS.
    2. Ma, Y.-A., Chen, T. & Fox, E. (2015). *A complete recipe for stochastic
       gradient MCMC.* NIPS. Eq. (14).
    """

    def __init__(
        self,
        model=None,
        potential_fn=None,
        gradient_fn=None,
        *,
        step_size,
        inverse_metric,
        gradient=None,
        centre=None,
        recentre_every=None,
        replace=None,
        init_strategy=init_to_uniform,
        log_likelihood_size=None,
        chunk_size=4096,
        num_steps=1,
    ):
        if isinstance(inverse_metric, dict):
            bad = [k for k, f in inverse_metric.items() if not callable(f)]
            if bad:
                raise ValueError(
                    f"inverse_metric[{bad[0]!r}] must be a function of the site's "
                    "unconstrained value returning positive values of its shape."
                )
        elif not callable(inverse_metric):
            raise ValueError(
                "inverse_metric must be a function of the unconstrained z (or a "
                "dict {site: function}) returning positive values of z's "
                f"structure; got {type(inverse_metric).__name__}."
            )
        self._inverse_metric = inverse_metric
        super().__init__(
            model,
            potential_fn,
            gradient_fn,
            step_size=step_size,
            # Replaced in `_prepare`, once z's structure is known.
            diffusion=_unit_diffusion,
            gradient=gradient,
            centre=centre,
            recentre_every=recentre_every,
            replace=replace,
            init_strategy=init_strategy,
            log_likelihood_size=log_likelihood_size,
            chunk_size=chunk_size,
            num_steps=num_steps,
        )

    def _prepare(self, shapes, one_z):
        unravel = ravel_pytree(one_z)[1]
        metric = self._inverse_metric
        if isinstance(metric, dict):
            if not isinstance(one_z, dict) or set(metric) - set(one_z):
                raise ValueError(
                    f"inverse_metric names sites {sorted(metric)}, but the latent "
                    f"sites are {sorted(one_z) if isinstance(one_z, dict) else '-'}."
                )
            sites = metric

            def metric(z):  # noqa: F811 - the per-site functions, 1 elsewhere
                return {
                    k: sites[k](v) if k in sites else jnp.ones_like(v)
                    for k, v in z.items()
                }

        def diffusion(x):
            return ravel_pytree(metric(unravel(x)))[0]

        self._hyperparameters = {"diffusion": diffusion, "curl": None}
        super()._prepare(shapes, one_z)

    def __getstate__(self):
        state = super().__getstate__()
        # The flat diffusion closes over z's structure: rebuilt by `init`.
        state["_hyperparameters"] = {"diffusion": _unit_diffusion, "curl": None}
        return state
