"""Any (D, Q) sampler of the complete recipe, and SGRLD on it."""

from collections import namedtuple

import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from numpyro_sgbd import core
from numpyro_sgbd.kernel import SGKernel, family_state
from numpyro_sgbd.prepare import has_tracer
from numpyro_sgbd.spec import REQUIRED, SamplerSpec, per_site
from numpyro_sgbd.updates.position import (
    PositionInfo,
    PositionState,
    position_init,
)
from numpyro_sgbd.updates.recipe import check_recipe, recipe_step
from numpyro_sgbd.updates.sghmc import sghmc_init
from numpyro_sgbd.validation import check_step_size

__all__ = ["Recipe", "SGRLD"]

RecipeKernelState = family_state("RecipeKernelState", module=__name__)
RecipeKernelState.__doc__ = """State of :class:`Recipe` and :class:`SGRLD`: the
fields of :class:`~numpyro_sgbd.SGState`, ``tolerance_exceeded`` being the fraction
of eigenvalues of :math:`2D - \\epsilon\\hat B` clipped at 0."""


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


def _check_epsilon(name, step_size):
    check_step_size(step_size, "a positive float (epsilon)")
    if step_size is None or isinstance(step_size, dict) or np.ndim(step_size):
        raise ValueError(
            f"{name} needs step_size, a positive scalar epsilon "
            f"(got {step_size!r}): a position-dependent D has no whitened "
            "coordinates to adapt a step in."
        )


def _check_recipe_args(args):
    """The recipe's D and Q (functions of the flat position) and its step."""
    _check_epsilon("Recipe", args["step_size"])
    diffusion, curl = args["diffusion"], args["curl"]
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
    if not isinstance(args["momentum"], (bool, np.bool_)):
        raise ValueError(f"momentum must be True or False, got {args['momentum']!r}.")
    return {"diffusion": diffusion, "curl": curl}


def _recipe_family_of(args):
    """The recipe on z, or with ``momentum`` on (z, p)."""
    if args.get("momentum"):
        return _position_momentum, core.gradient_at_end(_recipe_momentum_family)
    return position_init, core.gradient_at_end(_recipe_family)


def _resolve_recipe(hyper, shapes, one_z, preconditioned, args):
    """D and Q checked at the start (with momentum, on (z, p))."""
    resolved = per_site(hyper, shapes, one_z, preconditioned, args)
    x = ravel_pytree(one_z)[0]
    if args.get("momentum"):
        x = jnp.concatenate([x, jnp.zeros_like(x)])
    if not has_tracer(x):  # under pmap the start is abstract: checked there
        check_recipe(resolved["diffusion"], resolved["curl"], x)
    return resolved


def _check_metric(args):
    """SGRLD's inverse metric, a function of z or a dict of per-site ones."""
    _check_epsilon("SGRLD", args["step_size"])
    inverse_metric = args["inverse_metric"]
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
    return {"inverse_metric": inverse_metric}


def _resolve_metric(hyper, shapes, one_z, preconditioned, args):
    """SGRLD's D(x) on the flat position, from the inverse metric over z's
    structure (1 on the sites a dict does not name)."""
    unravel = ravel_pytree(one_z)[1]
    metric = hyper["inverse_metric"]
    if isinstance(metric, dict):
        if not isinstance(one_z, dict) or set(metric) - set(one_z):
            raise ValueError(
                f"inverse_metric names sites {sorted(metric)}, but the latent "
                f"sites are {sorted(one_z) if isinstance(one_z, dict) else '-'}."
            )
        sites = metric

        def metric(z):  # noqa: F811 - the per-site functions, 1 elsewhere
            return {
                k: sites[k](v) if k in sites else jnp.ones_like(v) for k, v in z.items()
            }

    def diffusion(x):
        return ravel_pytree(metric(unravel(x)))[0]

    return _resolve_recipe(
        {"diffusion": diffusion, "curl": None}, shapes, one_z, preconditioned, args
    )


RECIPE_SPEC = SamplerSpec(
    name="Recipe",
    init=position_init,
    step=core.gradient_at_end(_recipe_family),
    state_type=RecipeKernelState,
    hyperparameters={"diffusion": REQUIRED, "curl": None, "momentum": False},
    defaults={"step_size": REQUIRED, "variant": "vanilla"},
    not_taken=("adapt_mass_matrix",),
    fixed={"preconditioner": "none"},
    check=_check_recipe_args,
    family=_recipe_family_of,
    resolve=_resolve_recipe,
)

SGRLD_SPEC = SamplerSpec(
    name="SGRLD",
    init=position_init,
    step=core.gradient_at_end(_recipe_family),
    state_type=RecipeKernelState,
    hyperparameters={"inverse_metric": REQUIRED},
    defaults={"step_size": REQUIRED},
    not_taken=("adapt_mass_matrix", "beta", "init_noise_sd"),
    fixed={"preconditioner": "none", "variant": "vanilla"},
    check=_check_metric,
    resolve=_resolve_metric,
)


class Recipe(SGKernel):
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

    spec = RECIPE_SPEC


class SGRLD(SGKernel):
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

    spec = SGRLD_SPEC
