"""The complete recipe's samplers as NumPyro kernels: SGHMC, SGNHT, Recipe, SGRLD.

The pure updates have their exact-law tests (``test_updates_momentum.py``,
``test_updates_recipe.py``); here the adapter: that it hands each family the right
hyperparameters, that Recipe is SGLD draw for draw, that SGRLD samples a Dirichlet
posterior through a NumPyro model, the statistics reach ArviZ and ``compare``, and
bad input fails before compiling.
"""

from _agreement import checked_ess
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest
import scipy.linalg

from numpyro_sgbd import SGHMC, SGLD, SGNHT, SGRLD, GradientEstimate, Recipe, compare


def _run(kernel, *args, num_warmup=100, num_samples=200, key=0, **kwargs):
    run_kwargs = {
        k: kwargs.pop(k) for k in ("init_params", "extra_fields") if k in kwargs
    }
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        progress_bar=False,
        **kwargs,
    )
    mcmc.run(random.key(key), *args, **run_kwargs)
    return mcmc


def two_site_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("data", y.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y[idx])


@pytest.fixture(scope="module")
def y():
    return 1.0 + 2.0 * random.normal(random.key(0), (1000,))


def test_recipe_with_unit_diffusion_is_sgld_draw_for_draw(y):
    """Recipe(D = I, Q = 0) at eps = sigma^2 / 2 and SGLD at sigma make the same
    draws from the same key: same minibatches, same unit normals, same drift."""
    sigma = 0.01
    init = {"mu": jnp.array(1.0), "sigma": jnp.array(0.7)}
    runs = [
        _run(kernel, y, init_params=init, num_warmup=20, num_samples=100)
        for kernel in (
            SGLD(two_site_model, step_size=sigma, variant="vanilla"),
            Recipe(two_site_model, step_size=sigma**2 / 2, diffusion=jnp.ones_like),
        )
    ]
    a, b = (r.get_samples() for r in runs)
    assert int(runs[0].last_state.num_nonfinite) == 0
    for site in ("mu", "sigma"):
        np.testing.assert_allclose(a[site], b[site], rtol=1e-5, atol=1e-6)
    # and not trivially: the chain moved
    assert float(jnp.std(a["mu"])) > 0


def _recipe_sghmc(gradient_fn, step_size, friction, mass, variant):
    """SGHMC as the recipe on (z, p) (recipe paper, eq. 12): unit mass, so the
    mass m of SGHMC(mass=m) enters as p -> p / sqrt(m), eps -> eps / sqrt(m),
    C -> C / m. Only m = 1 is compared here."""
    assert mass == 1.0

    def diffusion(x):
        d = x.shape[0] // 2
        return jnp.concatenate([jnp.zeros(d), jnp.full(d, friction)])

    def curl(x):
        d = x.shape[0] // 2
        eye, zero = jnp.eye(d), jnp.zeros((d, d))
        return jnp.block([[zero, -eye], [eye, zero]])

    return Recipe(
        gradient_fn=gradient_fn,
        step_size=step_size,
        diffusion=diffusion,
        curl=curl,
        momentum=True,
        variant=variant,
    )


@pytest.mark.parametrize(
    "make,mass",
    [
        (
            lambda g, eps, c, m, v: SGHMC(
                gradient_fn=g, step_size=eps, friction=c, mass=m, variant=v
            ),
            0.25,
        ),
        (_recipe_sghmc, 1.0),
    ],
    ids=["SGHMC", "Recipe-SGHMC"],
)
def test_sghmc_kernel_matches_the_exact_law_of_its_chain(make, mass):
    """SGHMC through the adapter on N(0, s^2) with injected gradient noise of sd
    tau, given to the corrected variant as the GradientEstimate's noise sd; and
    the same sampler written as Recipe(D = (0, C), Q = ((0, -I), (I, 0)),
    momentum=True), which must have the same law (it does not share SGHMC's unit
    draws, so the check is in law, not draw for draw).

    The chain (z, p) is linear-Gaussian, so Var(z) solves a discrete Lyapunov
    equation in step_size, friction and mass: a wrong hyperparameter handed to the
    pure step (mass ignored, friction doubled, the correction skipped) moves it by
    more than the tolerance. 50 vectorized chains x 1500 draws; the tolerance is 5
    Monte Carlo standard errors of the variance from the ESS (failure rate < 1e-6
    for a correct kernel if the ESS is right; it is an estimate, hence 5).
    """
    s, tau, eps, friction = 2.0, 3.0, 0.1, 0.8

    def gradient_fn(rng_key, z):
        noise = tau * random.normal(rng_key, jnp.shape(z))
        return GradientEstimate(z / s**2 + noise, noise_sd=jnp.full_like(z, tau))

    kernel = make(gradient_fn, eps, friction, mass, "corrected")
    mcmc = _run(
        kernel,
        num_warmup=300,
        num_samples=1500,
        num_chains=50,
        chain_method="vectorized",
        init_params=jnp.zeros((50,)),
    )
    z = np.asarray(mcmc.get_samples(group_by_chain=True))
    # x' = A x + noise: z' = z + eps p / m; p' = p - eps z / s^2 - eps C p / m
    # + eps * (gradient noise) + N(0, eps (2C - eps tau^2)).
    a = np.array([[1.0, eps / mass], [-eps / s**2, 1.0 - eps * friction / mass]])
    noise = np.diag([0.0, eps**2 * tau**2 + eps * (2 * friction - eps * tau**2)])
    exact = scipy.linalg.solve_discrete_lyapunov(a, noise)[0, 0]
    ess = float(checked_ess(z[..., None] ** 2)[0])
    var = float(np.mean(z**2))
    mcse = np.sqrt(2.0) * exact / np.sqrt(ess)
    assert abs(var - exact) < 5 * mcse, (var, exact, mcse, ess)
    # The law without the correction (injected variance 2 eps C, so the gradient
    # noise adds eps^2 tau^2 on top) is rejected: the test sees the correction.
    vanilla = np.diag([0.0, eps**2 * tau**2 + 2 * eps * friction])
    wrong = scipy.linalg.solve_discrete_lyapunov(a, vanilla)[0, 0]
    assert abs(var - wrong) > 5 * mcse, (var, wrong, mcse)


def gamma_model(counts, alpha):
    """Expanded mean of a Dirichlet(alpha) with multinomial counts: phi_k ~
    Gamma(alpha_k, 1), counts ~ Poisson(phi_k), so phi | counts ~ Gamma(alpha +
    counts, 1) and theta = phi / sum(phi) ~ Dirichlet(alpha + counts)."""
    phi = numpyro.sample("phi", dist.Gamma(alpha, 1.0))
    numpyro.deterministic("theta", phi / phi.sum())
    numpyro.sample("counts", dist.Poisson(phi), obs=counts)


@pytest.mark.filterwarnings("ignore:The model has no subsampled plate")
def test_sgrld_samples_a_dirichlet_posterior_on_the_simplex():
    """SGRLD with Patterson & Teh's expanded-mean metric, written in NumPyro's
    unconstrained z = log phi (D = exp(-z)), samples theta ~ Dirichlet(alpha + n).

    Exact gradients; 50 vectorized chains x 4000 draws at eps = 0.01. Tolerance:
    5 MCSE of each E theta_k (from the ESS) plus 0.01 for the step's O(eps) bias.
    Dropping the Gamma term (d D / dz) moves the mean of log phi_k by about 1 /
    (alpha_k + n_k): with alpha_k + n_k as small as 2.5 it fails. In log phi the
    metric's noise grows like exp(-z / 2), so a posterior with much mass near
    phi = 0 needs a smaller step (every chain here must finish).
    """
    alpha = jnp.array([0.5, 1.0, 2.0])
    counts = jnp.array([2.0, 5.0, 10.0])
    kernel = SGRLD(
        gamma_model, step_size=0.01, inverse_metric={"phi": lambda z: jnp.exp(-z)}
    )
    mcmc = _run(
        kernel,
        counts,
        alpha,
        num_warmup=1000,
        num_samples=4000,
        num_chains=50,
        chain_method="vectorized",
    )
    assert int(np.max(mcmc.last_state.num_nonfinite)) == 0
    theta = np.asarray(mcmc.get_samples(group_by_chain=True)["theta"])
    a = np.asarray(alpha + counts)
    exact = a / a.sum()
    ess = checked_ess(theta)
    mcse = theta.reshape(-1, 3).std(0) / np.sqrt(ess)
    mean = theta.reshape(-1, 3).mean(0)
    assert np.all(np.abs(mean - exact) < 5 * mcse + 0.01), (mean, exact, mcse)
    assert np.allclose(theta.sum(-1), 1.0, atol=1e-5)


def test_sgnht_thermostat_and_statistics_reach_arviz_and_compare(y):
    """SGNHT's thermostat and kinetic energy, SGHMC's kinetic energy, are
    collected by default and reach az.from_numpyro and compare's table."""
    import arviz as az

    runs = {}
    for name, kernel in {
        "SGHMC": SGHMC(two_site_model),
        "SGNHT": SGNHT(two_site_model),
    }.items():
        runs[name] = _run(
            kernel,
            y,
            num_warmup=200,
            num_samples=200,
            num_chains=2,
            chain_method="vectorized",
        )
        stats = az.from_numpyro(runs[name]).sample_stats
        assert "kinetic_energy" in stats
        assert np.all(np.isfinite(np.asarray(stats["kinetic_energy"])))
    assert "thermostat" in az.from_numpyro(runs["SGNHT"]).sample_stats
    xi = np.asarray(runs["SGNHT"].get_extra_fields()["thermostat"])
    assert np.all(np.isfinite(xi)) and np.any(xi != xi[0])
    table = compare(runs, reference=runs["SGHMC"].get_samples()).summary
    assert "mean_kinetic_energy" in table and "mean_thermostat" in table
    assert np.isfinite(table.loc["SGNHT", "mean_thermostat"])


def _potential(z):
    return 0.5 * jnp.sum(z**2)


@pytest.mark.parametrize(
    "make,match",
    [
        (
            lambda: SGHMC(potential_fn=_potential, step_size=0.1, friction=-1.0),
            "friction",
        ),
        (
            lambda: SGHMC(potential_fn=_potential, step_size=0.1, variant="extreme"),
            "variant",
        ),
        (
            lambda: SGNHT(potential_fn=_potential, step_size=0.1, diffusion={"a": 1.0}),
            "diffusion",
        ),
        (
            lambda: Recipe(
                potential_fn=_potential, step_size=None, diffusion=jnp.ones_like
            ),
            "step_size",
        ),
        (
            lambda: Recipe(potential_fn=_potential, step_size=0.1, diffusion=1.0),
            "diffusion",
        ),
        (
            lambda: SGRLD(potential_fn=_potential, step_size=0.1, inverse_metric=2.0),
            "inverse_metric",
        ),
    ],
)
def test_bad_hyperparameters_raise_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "diffusion,curl,match",
    [
        (lambda x: -jnp.ones_like(x), None, "semi-definite|PSD|negative"),
        (lambda x: jnp.ones(3), None, "shape"),
        (jnp.ones_like, lambda x: jnp.ones((2, 2)), "skew"),
    ],
)
def test_recipe_checks_d_and_q_before_compiling(diffusion, curl, match):
    kernel = Recipe(
        potential_fn=_potential, step_size=0.1, diffusion=diffusion, curl=curl
    )
    mcmc = MCMC(kernel, num_warmup=1, num_samples=1, progress_bar=False)
    with pytest.raises(ValueError, match=match):
        mcmc.run(random.key(0), init_params=jnp.zeros(2))


def test_corrected_sghmc_refuses_a_friction_below_the_noise_term():
    """2C >= eps tau^2 (recipe paper, eq. 9): tau = 10 at eps = 0.1 needs C >= 5."""

    def gradient_fn(rng_key, z):
        return GradientEstimate(z, noise_sd=jnp.full_like(z, 10.0))

    kernel = SGHMC(
        gradient_fn=gradient_fn, step_size=0.1, friction=1.0, variant="corrected"
    )
    mcmc = MCMC(kernel, num_warmup=1, num_samples=1, progress_bar=False)
    with pytest.raises(ValueError, match="friction=1 is smaller"):
        mcmc.run(random.key(0), init_params=jnp.zeros(2))
