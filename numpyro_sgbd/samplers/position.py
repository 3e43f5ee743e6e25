"""SGBD, SGLD, pSGLD and cyclical SGLD: the position-only families (Barker and
Langevin moves; pSGLD's preconditioned by RMSprop, cyclical SGLD's on a
restarted cosine schedule)."""

from numpyro_sgbd import core
from numpyro_sgbd.discretisation import BiasLaw
from numpyro_sgbd.kernel import SGKernel, SGState, family_state
from numpyro_sgbd.spec import SamplerSpec
from numpyro_sgbd.updates import (
    BARKER_TOLERANCE,
    VARIANTS,
)
from numpyro_sgbd.updates.barker import INCREMENTS
from numpyro_sgbd.updates.cyclical import cyclical_init, cyclical_update
from numpyro_sgbd.updates.position import (
    barker_update,
    langevin_update,
    position_init,
)
from numpyro_sgbd.updates.psgld import psgld_init, psgld_update

__all__ = ["PSGLD", "SGBD", "SGLD", "CyclicalSGLD"]


def _check_increment(args):
    if args["increment"] not in INCREMENTS:
        raise ValueError(
            f"increment must be one of {INCREMENTS}, got {args['increment']!r}."
        )
    return {"increment": args["increment"]}


def _barker_bound(largest):
    # The increment |w| stays below 1.3 sigma with the bimodal law (N(sigma,
    # (0.1 sigma)^2)), so tau sigma < 1.702 / 1.3 keeps every move inside the
    # corrected rule's tolerance |w| < 1.702 / tau (SGBD paper, eq. 8).
    return BARKER_TOLERANCE / 1.3 / largest


def _langevin_bound(largest):
    # The corrected noise variance sigma^2 - tau^2 sigma^4 / 4 is positive while
    # tau sigma < 2; the bound keeps a fifth of that margin.
    return 1.6 / largest


SGBD_SPEC = SamplerSpec(
    name="SGBD",
    init=position_init,
    step=core.gradient_at_end(barker_update),
    state_type=SGState,
    hyperparameters={"increment": "bimodal"},
    check=_check_increment,
    variants=VARIANTS,
    noise_step_bound=_barker_bound,
    # In u (unit posterior scale) a Barker step of 0.5 gave xi 0.016 and a
    # mean bias of 0.04 sd on a 26,000-row logistic regression (issue 17); the
    # coordinates of a product target move independently, so it does not
    # shrink with d.
    step_target=0.5,
    # Sampling at 0.35 in u. Unadjusted Barker on a standard normal has
    # variance about 1 + 0.66 sigma^2 (simulated: 1.16 at 0.5, 1.08 at 0.35,
    # 1.04 at 0.25), so its sds come out 7 %, 4 % and 2 % wide. At 0.5 the
    # default's xi was 0.059 on average over 50 seeds of ISLR Default (3,000 +
    # 30,000 steps, Monte Carlo floor 0.02); at 0.35 0.027-0.039 on average
    # over 8 seeds of each adaptation-accuracy problem. At 0.25 the bias falls
    # to about 2 % but the ESS halves, and at 30,000 draws the run-end checks
    # then warned on 4 of 24 runs (three R-hats just above 1.01, one drift)
    # where 0.35 warned on 1 (benchmarks/step_targets.py --fractions,
    # results.md). Warmup stays at 0.5: with a smaller step throughout, the
    # scale windows saw too little of a posterior wider than its Laplace
    # approximation (spike-and-slab: s 1.3 and 2.8 where 3.7 is right).
    sampling_fraction=0.7,
    # Barker's bounded moves are robust to the step: the scales are unbounded.
    scale_max=None,
    # Under MCMC the sampling step serves the run's length instead (the
    # smaller of warmup's and discretisation.run_step's), from this law: on
    # N(0, I) in d = 100 (benchmarks/bias_laws.py, results.md "Issue 60"),
    # var - 1 = 0.26 h^2 with exact gradients, plus 0.20 (vanilla) or 0.04
    # (corrected) times (tau h)^2 with Gaussian gradient noise of sd tau, and a
    # median bulk ESS of 0.25 h^2 per step.
    bias_laws={
        "vanilla": BiasLaw(0.258, 0.203, 2, 0.248, 2.0),
        "corrected": BiasLaw(0.255, 0.040, 2, 0.248, 2.0),
    },
    # Measured with the bimodal increment only.
    bias_law_at={"increment": "bimodal"},
)

SGLD_SPEC = SamplerSpec(
    name="SGLD",
    init=position_init,
    step=core.gradient_at_end(langevin_update),
    state_type=SGState,
    variants=VARIANTS,
    noise_step_bound=_langevin_bound,
    # Unadjusted Langevin on a standard normal has variance 1 / (1 - sigma^2 /
    # 4): sigma = 0.4 overstates the sd by 2 %, 0.5 by 3 % (xi 0.023 measured
    # on the 26,000-row regression of issue 17).
    step_target=0.4,
    # var - 1 = 0.30 h^2 (1/4 for small h) with exact gradients; Gaussian noise
    # adds 0.28 (tau h)^2 (vanilla) and nothing measurable once the corrected
    # variant subtracts it; median bulk ESS 0.28 h^2 per step (bias_laws.py).
    bias_laws={
        "vanilla": BiasLaw(0.308, 0.277, 2, 0.282, 2.0),
        "corrected": BiasLaw(0.298, 0.002, 2, 0.282, 2.0),
    },
)


class SGBD(SGKernel):
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
        each chain's warmup draws in windows, as NUTS adapts its diagonal mass
        matrix, and run the rule in v = u / s (where the posterior is far from
        its Laplace approximation). Default ``None``: on with ``step_size=None``,
        off with a given step size. Needs a preconditioner.
    :param str increment: ``"bimodal"`` (default; :math:`w \sim N(\sigma,
        (0.1\sigma)^2)`, by symmetry the paper's bimodal law) or ``"gaussian"``
        (:math:`w \sim N(0, \sigma^2)`).
    :param float beta: moving-average rate of :math:`\hat\tau` (corrected),
        default 0.1 (about ten minibatches).
    :param init_noise_sd: initial :math:`\hat\tau` (scalar or dict of sites); default:
        the estimate from the first minibatch.
    :param replace: draw minibatch indices with replacement (``True``) or without
        (``False``, as NumPyro's plate). Default ``None``: with replacement when
        :math:`n \le N/100`, without otherwise
        (:func:`~numpyro_sgbd.estimators.resolve_replace`).
    :param init_strategy: a NumPyro init strategy (default ``init_to_uniform``).
    :param int log_likelihood_size: how many rows of each subsample plate the
        ``model`` property (and so ArviZ's ``log_likelihood`` and
        ``observed_data`` groups, ``az.loo`` and ``az.waic``) evaluates: a fixed
        random subset, or every row where it is at least the plate's size N.
        Default ``None``: every row up to N = 50,000
        (:data:`~numpyro_sgbd.prepare.LOG_LIKELIHOOD_ALL_ROWS`; ArviZ keeps 4
        bytes per draw and row), that many rows above it, with a warning.
    :param str gradient: ``"minibatch"``, or ``"control_variates"``: the
        minibatch gradient around a centre :math:`\hat z`,
        :math:`\nabla U(\hat z) + \nabla\hat U_S(z) - \nabla\hat U_S(\hat z)`
        (:class:`~numpyro_sgbd.estimators.ControlVariateEstimator`; about two
        minibatch gradients a step). Needs a model with one subsample plate.
        Default ``None``: ``"control_variates"`` with ``step_size=None`` and one
        subsample plate, ``"minibatch"`` otherwise.
    :param dict centre: the control variates' centre, constrained values by site.
        Default: the full-data mode, as :func:`~numpyro_sgbd.posterior_mode` finds
        it; the result is in :attr:`centre_info`.
    :param int chunk_size: data rows per chunk of the full-data computations at the
        centre (default 4096): memory O(chunk_size x d), whatever N.
    :param int num_steps: SG steps per sample, as HMC's ``num_steps`` is
        leapfrog steps per sample, run in one compiled loop; ``num_warmup`` and
        ``num_samples`` count samples, ``thinning`` thins samples. Default 1,
        with the progress bar on or off: the draws depend on the seed and the
        arguments only. NumPyro's progress bar drives the chain from a Python
        loop that dispatches every sample; ``progress_bar=False`` runs the same
        chain in one compiled loop, and ``num_steps=k`` pays the dispatch once
        per k steps (another chain: every k-th step kept).
    :param int recentre_every: with control variates, move the centre every
        ``recentre_every`` warmup steps to the mean of the chain's positions over
        them (one pass over the data each). Default ``None``: a fixed centre.

    The user guide (``docs/usage.rst``) says when each option matters and what it
    costs.

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

    spec = SGBD_SPEC


class SGLD(SGKernel):
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

    spec = SGLD_SPEC


PSGLDKernelState = family_state("PSGLDKernelState", module=__name__)
PSGLDKernelState.__doc__ = """State of :class:`PSGLD`: the fields of
:class:`~numpyro_sgbd.SGState`, with ``aux`` the pure
:class:`~numpyro_sgbd.updates.psgld.PSGLDState` (the moving average of the
squared gradient, in u with a preconditioner)."""


def _check_rms(args):
    decay, eps = args["decay"], args["eps"]
    if not (isinstance(decay, (int, float)) and 0 <= decay < 1):
        raise ValueError(f"decay must be a number in [0, 1), got {decay!r}.")
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}.")
    return {"decay": float(decay), "eps": float(eps)}


PSGLD_SPEC = SGLD_SPEC._replace(
    name="PSGLD",
    init=psgld_init,
    step=core.gradient_at_end(psgld_update),
    state_type=PSGLDKernelState,
    # decay: the average must outlast the chain's autocorrelation time, or G
    # moves with the position and widens the draws: on tests/test_psgld.py's
    # regression (a coordinate of about 500 steps) its sd came out 33 %, 11 %
    # and 4 % wide at 0.99 (the paper's), 0.999 and 0.9999.
    hyperparameters={"decay": 0.999, "eps": 1e-5},
    check=_check_rms,
    # No law measured: the sampling step is warmup's (G moves the bias).
    bias_laws={},
)


class PSGLD(SGKernel):
    r"""Preconditioned SGLD (Li, Chen, Carlson & Carin, 2016): SGLD whose moves are
    scaled per coordinate by :math:`G = 1/(\lambda + \sqrt{\hat V})`, an
    RMSprop moving average :math:`\hat V` of the squared minibatch gradient
    (:func:`~numpyro_sgbd.updates.psgld.psgld_update`):

    .. math::

        z \leftarrow z - \frac{\sigma^2}{2} G\nabla\hat U(z) + \sqrt{G}\,
        \varepsilon, \quad \varepsilon \sim N(0, \sigma^2),

    with SGLD's variants coordinate by coordinate. For a posterior whose scales
    differ by coordinate and that no mode whitens (``preconditioner="none"``
    with a given step; or far from its Laplace approximation), G follows the
    gradient's local size: a coordinate of posterior sd s moves with steps
    about :math:`\sigma\sqrt{s}`, where SGLD's are :math:`\sigma` for all. The
    paper's correction :math:`\Gamma` is dropped, as there: G must change slowly
    (``decay``). With the default
    ``step_size=None`` the rule runs in the whitened coordinates u, where G is
    near 1 and adapts what the Laplace approximation misses. No bias law is
    measured: the sampling step is warmup's.

    :param float decay: :math:`\alpha`, the moving average's weight on the
        past, in [0, 1). Default 0.999, not the paper's 0.99: the average must
        outlast the chain's autocorrelation time, or G moves with the position
        and widens the draws (a coordinate mixing in about 500 steps came out
        33 % wide at 0.99, 11 % at 0.999 and 4 % at 0.9999).
    :param float eps: :math:`\lambda > 0`, which bounds G by :math:`1/\lambda`
        where the gradient vanishes (a chain started exactly at a mode moves
        :math:`\sigma/\sqrt\lambda` on its first step). Default 1e-5 (the
        paper's).

    The other arguments are :class:`SGLD`'s.

    **References**

    1. Li, C., Chen, C., Carlson, D. & Carin, L. (2016). *Preconditioned
       stochastic gradient Langevin dynamics for deep neural networks.* AAAI.
       Eq. (5), Algorithm 1.

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> scales = jnp.array([0.1, 10.0])  # sds four orders apart in variance
    >>> kernel = PSGLD(potential_fn=lambda z: 0.5 * jnp.sum((z / scales) ** 2),
    ...                step_size=0.1)
    >>> mcmc = MCMC(kernel, num_warmup=2000, num_samples=20000, num_chains=4,
    ...             chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.ones((4, 2)))
    >>> sd = mcmc.get_samples().std(0)  # SGLD at this step: 1.15 and 0.37 of them
    >>> bool(jnp.all(jnp.abs(sd / scales - 1) < 0.15))
    True
    """

    spec = PSGLD_SPEC


CyclicalKernelState = family_state(
    "CyclicalKernelState", ("cycle_position",), module=__name__
)
CyclicalKernelState.__doc__ = """State of :class:`CyclicalSGLD`: the fields of
:class:`~numpyro_sgbd.SGState`, ``cycle_position`` (where in its cycle the last
step was, in [0, 1), collected by default) and ``aux`` the pure
:class:`~numpyro_sgbd.updates.cyclical.CyclicalState` (its clock ``k``)."""


def _check_cycle(args):
    length, explore = args["cycle_length"], args["explore"]
    if not (isinstance(length, int) and length >= 1):
        raise ValueError(
            f"cycle_length must be a positive int (SG steps per cycle), got {length!r}."
        )
    if not (isinstance(explore, (int, float)) and 0 <= explore < 1):
        raise ValueError(
            "explore must be a number in [0, 1) (the fraction of each cycle run "
            f"without noise), got {explore!r}."
        )
    return {"cycle_length": length, "explore": float(explore)}


def _as_checked(hyper, shapes, one_z, preconditioned, args):
    """The cycle's length and the exploration fraction stay Python numbers, so a
    run without exploration compiles no descent."""
    return dict(hyper)


CYCLICAL_SPEC = SGLD_SPEC._replace(
    name="CyclicalSGLD",
    init=cyclical_init,
    step=core.gradient_at_end(cyclical_update),
    state_type=CyclicalKernelState,
    hyperparameters={"cycle_length": 1000, "explore": 0.0},
    check=_check_cycle,
    resolve=_as_checked,
    # No law: the step moves through the cycle; the sampling step (the
    # schedule's peak) is warmup's.
    bias_laws={},
)


class CyclicalSGLD(SGKernel):
    r"""Cyclical SGLD (Zhang, Li, Zhang, Chen & Wilson, 2020): SGLD whose step
    follows a cosine schedule restarted every ``cycle_length`` steps
    (:func:`~numpyro_sgbd.updates.cyclical.cyclical_update`),

    .. math::

        \sigma_k = \sigma\sqrt{c_k}, \quad
        c_k = \tfrac12\big(\cos(\pi r_k) + 1\big), \quad
        r_k = (k \bmod L) / L,

    so SGLD's :math:`\epsilon = \sigma_k^2/2` is the paper's
    :math:`\alpha_k`. The large steps at a cycle's start carry the chain out
    of a mode, the small ones at its end sample around the one it reached: for
    posteriors with several modes, which a fixed small step leaves one by one
    only in exponential time. With ``explore`` > 0 (the paper's :math:`\beta`)
    the first part of each cycle runs without noise (gradient descent); those
    draws are not the posterior's, and ``cycle_position`` (collected by
    default) says which to drop: keep ``cycle_position >= explore``.

    Where the step is large the draws carry SGLD's discretisation bias at that
    step; the cycle's draws mix steps from :math:`\sigma` down to 0 (no bias
    law is measured: the sampling step is warmup's peak).

    :param int cycle_length: L, SG steps per cycle. Default 1000. With 1 the
        kernel is SGLD (the same draws, to float rounding).
    :param float explore: :math:`\beta`, the fraction of each cycle run
        without noise, in [0, 1). Default 0.

    The other arguments are :class:`SGLD`'s; ``step_size`` is the step at a
    cycle's start (with ``step_size=None``, the step warmup adapts as SGLD's).

    **References**

    1. Zhang, R., Li, C., Zhang, J., Chen, C. & Wilson, A. G. (2020). *Cyclical
       stochastic gradient MCMC for Bayesian deep learning.* ICLR. Eq. (1),
       Algorithm 1.

    **Example**

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.infer import MCMC
    >>> from jax.scipy.special import logsumexp
    >>> def potential(z):  # N(-5, 1) and N(5, 1) equally: a barrier of 12.5
    ...     return -logsumexp(jnp.stack([-(z - 5) ** 2, -(z + 5) ** 2]) / 2).sum()
    >>> kernel = CyclicalSGLD(potential_fn=potential, step_size=1.9,
    ...                       cycle_length=200)
    >>> mcmc = MCMC(kernel, num_warmup=0, num_samples=40000, progress_bar=False)
    >>> mcmc.run(jax.random.key(0), init_params=jnp.array([5.0]),
    ...          extra_fields=("cycle_position",))
    >>> z = mcmc.get_samples()[:, 0]
    >>> late = mcmc.get_extra_fields()["cycle_position"] >= 0.5  # small steps
    >>> right = float((z[late] > 0).mean())  # 1/2 by symmetry; SGLD at 0.5: 1
    >>> 0.35 < right < 0.65
    True
    """

    spec = CYCLICAL_SPEC
