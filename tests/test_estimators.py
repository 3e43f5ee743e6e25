"""The estimator layer: index draws, minibatch gradients, per-datum noise."""

import jax
from jax import random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import stats

from numpyro_sgbd.estimators import (
    ControlVariateEstimator,
    GatheredRows,
    MinibatchEstimator,
    draw_indices,
    jit_once,
    noise_variance_factor,
)
from numpyro_sgbd.estimators.minibatch import NOISE_ROWS

# Our own numerics (no ArviZ, no NumPyro contract): CI's Python 3.12 run
# skips them; the first run covers them.
pytestmark = pytest.mark.heavy


@pytest.mark.parametrize("size, n", [(50, 10), (50, 40), (1000, 200)])
def test_draw_indices_without_replacement_is_uniform(size, n):
    keys = random.split(random.key(0), 4000)
    idx = jax.vmap(lambda k: draw_indices(k, size=size, subsample_size=n))(keys)
    idx = np.asarray(idx)
    assert idx.shape == (4000, n)
    assert all(len(np.unique(row)) == n for row in idx)
    assert idx.min() >= 0 and idx.max() < size
    # Each index is included with probability n / size: chi-square over the counts.
    counts = np.bincount(idx.ravel(), minlength=size)
    expected = 4000 * n / size
    chi2 = np.sum((counts - expected) ** 2 / expected) * (1 - n / size) ** -1
    assert stats.chi2.sf(chi2, size - 1) > 1e-3


def test_draw_indices_with_replacement():
    idx = draw_indices(random.key(1), size=10, subsample_size=1000, replace=True)
    assert idx.shape == (1000,) and len(np.unique(idx)) == 10


def test_draw_indices_are_uniform_at_ten_to_the_eight():
    # random.randint(key, (n,), 0, N) for N > 2**16 is one 32-bit word modulo N,
    # so its first 2**32 mod N indices (95 % of N = 10**8) come 43/42 times as
    # often as the rest: that fraction of the draws would be 0.95082 against
    # 0.94967, 10 binomial standard errors apart at 4 * 10**6 draws.
    size, draws = 10**8, 4 * 10**6
    below = 2**32 % size
    idx = np.asarray(draw_indices(random.key(3), size, draws, replace=True))
    assert idx.min() >= 0 and idx.max() < size
    p = below / size
    se = np.sqrt(p * (1 - p) / draws)
    assert abs(np.mean(idx < below) - p) < 4 * se


@pytest.mark.parametrize("make_key", [random.key, random.PRNGKey])
def test_draw_indices_is_the_multiply_shift_of_two_words(make_key):
    # floor((w0 * 2**32 + w1) * N / 2**64) in exact integers, the words those of
    # the key's threefry blocks (0, i): the same from the same key, whatever its
    # kind, and a valid draw from a key of another implementation.
    from numpyro_sgbd.estimators import _index_words

    for size in (7, 10**6, 2**31 - 1):
        key = make_key(size)
        idx = np.asarray(draw_indices(key, size, 500, replace=True))
        w0, w1 = np.asarray(_index_words(key, 500)).astype(object)
        exact = [((int(a) << 32 | int(b)) * size) >> 64 for a, b in zip(w0, w1)]
        np.testing.assert_array_equal(idx, exact)
    rbg = np.asarray(draw_indices(random.key(0, impl="rbg"), 1000, 50, replace=True))
    assert rbg.min() >= 0 and rbg.max() < 1000 and len(np.unique(rbg)) > 40
    with pytest.raises(ValueError, match="size must be between 1 and 2"):
        draw_indices(random.key(0), 2**31, 10)


def test_noise_variance_factor():
    assert noise_variance_factor(1000, 10) == pytest.approx(10 * 0.99)
    assert noise_variance_factor(1000, 10, replace=True) == 10.0
    # None chooses by n/N: with replacement at n = N/100, without above it.
    assert noise_variance_factor(1000, 10, replace=None) == 10.0
    assert noise_variance_factor(1000, 11, replace=None) == pytest.approx(11 * 0.989)


def test_draw_indices_auto_replace():
    # n = N/100 draws with replacement (duplicates appear among 4000 draws of 10
    # from 1000); n > N/100 without (never).
    keys = random.split(random.key(2), 4000)
    with_dups = jax.vmap(lambda k: draw_indices(k, 1000, 10, replace=None))(keys)
    assert any(len(np.unique(row)) < 10 for row in np.asarray(with_dups))
    distinct = jax.vmap(lambda k: draw_indices(k, 1000, 11, replace=None))(keys)
    assert all(len(np.unique(row)) == 11 for row in np.asarray(distinct))


def logistic(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    s = numpyro.sample("s", dist.LogNormal(0, 1))
    with numpyro.plate("data", X.shape[0], subsample_size=8) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=s * (X[idx] @ w)), obs=y[idx])


def _hand_written(X, y, z, idx):
    """Per-datum scaled log-likelihood gradients and the potential gradient by hand."""
    N, n = X.shape[0], idx.shape[0]

    def loglik_i(z, i):
        s = jnp.exp(z["s"])
        logit = s * (X[i] @ z["w"])
        return (N / n) * (y[i] * logit - jnp.logaddexp(0.0, logit))

    def potential(z):
        s = jnp.exp(z["s"])
        prior = dist.Normal(0, 1).log_prob(z["w"]).sum()
        prior = prior + dist.LogNormal(0, 1).log_prob(s) + z["s"]  # + log-Jacobian
        return -(prior + sum(loglik_i(z, i) for i in idx))

    per_datum = jax.vmap(jax.grad(loglik_i), in_axes=(None, 0))(z, idx)
    return jax.grad(potential)(z), per_datum


# "jacobian": forward mode (d <= n) and reverse mode; "vmap": one datum at a time.
@pytest.mark.parametrize("per_datum", ["vmap", "jacobian"])
@pytest.mark.parametrize("dim", [3, 12])
def test_minibatch_gradient_and_noise_match_hand_written(dim, per_datum):
    N = 40
    X = random.normal(random.key(0), (N, dim))
    y = (random.uniform(random.key(1), (N,)) < 0.5).astype(jnp.float32)
    z = {"w": random.normal(random.key(2), (dim,)) * 0.3, "s": jnp.array(0.2)}
    est = MinibatchEstimator(
        logistic, {"data": (N, 8, -1)}, noise=True, per_datum=per_datum
    )
    key = random.key(3)
    out = est(key, z, (X, y), {})
    idx = est.draw(key)["data"]
    grad, per_datum = _hand_written(X, y, z, idx)
    for site in ("w", "s"):
        np.testing.assert_allclose(out.z_grad[site], grad[site], rtol=1e-4, atol=1e-4)
        tau = np.sqrt(
            noise_variance_factor(N, 8) * np.var(per_datum[site], axis=0, ddof=1)
        )
        np.testing.assert_allclose(out.noise_sd[site], tau, rtol=1e-4, atol=1e-5)
    # The potential estimate is NumPyro's: prior + Jacobian + (N/n) * minibatch sum.
    plain = MinibatchEstimator(logistic, {"data": (N, 8, -1)})(key, z, (X, y), {})
    np.testing.assert_allclose(plain.potential_energy, out.potential_energy, rtol=1e-5)
    np.testing.assert_allclose(plain.z_grad["w"], grad["w"], rtol=1e-4, atol=1e-4)


def test_minibatch_gradient_is_unbiased():
    N = 30
    X = random.normal(random.key(0), (N, 2))
    y = (random.uniform(random.key(1), (N,)) < 0.5).astype(jnp.float32)
    z = {"w": jnp.array([0.3, -0.2]), "s": jnp.array(0.1)}
    est = MinibatchEstimator(logistic, {"data": (N, 8, -1)}, noise=True)
    keys = random.split(random.key(5), 4000)
    outs = jax.vmap(lambda k: est(k, z, (X, y), {}))(keys)
    full, _ = _hand_written(X, y, z, jnp.arange(N))
    # _hand_written scales by N / n with n = N here, i.e. the full-data gradient.
    for site in ("w", "s"):
        g = np.asarray(outs.z_grad[site])
        se = g.std(0) / np.sqrt(len(g))
        assert np.all(np.abs(g.mean(0) - full[site]) < 4 * se + 1e-5)
        # The estimated noise sd matches the spread of the estimates themselves.
        np.testing.assert_allclose(
            np.sqrt(np.mean(np.asarray(outs.noise_sd[site]) ** 2, 0)),
            g.std(0),
            rtol=0.1,
        )


def test_noise_covariance_forms_match_hand_written():
    # Sigma = c Cov(per-datum gradients) over z raveled in ravel_pytree's order
    # ("s" before "w"), as factor C (d, n), as the matrix, and as its diagonal.
    N, dim = 40, 3
    X = random.normal(random.key(0), (N, dim))
    y = (random.uniform(random.key(1), (N,)) < 0.5).astype(jnp.float32)
    z = {"w": random.normal(random.key(2), (dim,)) * 0.3, "s": jnp.array(0.2)}
    key = random.key(3)
    out = {}
    for form in ("lowrank", "full", "diag"):
        est = MinibatchEstimator(logistic, {"data": (N, 8, -1)}, covariance=form)
        out[form] = est(key, z, (X, y), {}).noise_cov
    idx = est.draw(key)["data"]
    _, per_datum = _hand_written(X, y, z, idx)
    flat = np.concatenate([per_datum["s"][:, None], per_datum["w"]], axis=1)
    sigma = noise_variance_factor(N, 8) * np.cov(flat, rowvar=False, ddof=1)
    assert out["lowrank"].shape == (dim + 1, 8)
    np.testing.assert_allclose(
        out["lowrank"] @ out["lowrank"].T, sigma, rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(out["full"], sigma, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["diag"], np.diag(sigma), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="covariance must be"):
        MinibatchEstimator(logistic, {"data": (N, 8, -1)}, covariance="dense")


def test_noise_rows_apart_from_the_minibatch_are_unbiased():
    # covariance="rows": the gradient of the minibatch's 8 indices (as without
    # noise), and a factor B from m = 4 other rows with E B B^T the noise
    # covariance of that 8-row gradient, c(N, 8) times the population covariance
    # of the per-datum gradients (ddof 1): over 20,000 draws every entry within 4
    # Monte Carlo se (measured: 2.0 at most). A factor scaled for m rows
    # instead of n puts every entry 5.5-163 se off (checked by hand).
    N, dim = 40, 3
    X = random.normal(random.key(0), (N, dim))
    y = (random.uniform(random.key(1), (N,)) < 0.5).astype(jnp.float32)
    z = {"w": random.normal(random.key(2), (dim,)) * 0.3, "s": jnp.array(0.2)}
    rows = MinibatchEstimator(
        logistic, {"data": (N, 8, -1)}, covariance="rows", covariance_rows=4
    )
    plain = MinibatchEstimator(logistic, {"data": (N, 8, -1)})
    key = random.key(3)
    indices = rows.draw(key)
    assert indices["data"].shape == (8,) and indices[NOISE_ROWS].shape == (4,)
    est = rows(key, z, (X, y), {})
    assert est.noise_cov.shape == (dim + 1, 4)
    expected = plain.evaluate(z, {"data": indices["data"]}, (X, y), {})
    np.testing.assert_allclose(
        ravel_pytree(est.z_grad)[0], ravel_pytree(expected[1])[0], rtol=1e-5
    )
    _, per_datum = _hand_written(X, y, z, jnp.arange(N))
    flat = np.concatenate([per_datum["s"][:, None], per_datum["w"]], axis=1)
    h = flat * N / 8  # the terms as the 8-row minibatch scales them
    sigma = noise_variance_factor(N, 8) * np.cov(h, rowvar=False, ddof=1)
    keys = random.split(random.key(4), 20_000)
    factors = jax.jit(jax.vmap(lambda k: rows(k, z, (X, y), {}).noise_cov))(keys)
    outer = np.einsum("kia,kja->kij", np.asarray(factors), np.asarray(factors))
    se = outer.std(0) / np.sqrt(len(keys))
    assert np.all(np.abs(outer.mean(0) - sigma) < 4 * se + 1e-6), (
        outer.mean(0) - sigma
    ) / se
    with pytest.raises(ValueError, match="covariance_rows"):
        MinibatchEstimator(logistic, {"data": (N, 8, -1)}, covariance="rows")


def test_row_budget_defaults_by_platform(monkeypatch):
    """Rows per chunk of per-datum gradients at the matrix-factorisation example's
    size (d = 194,820, n = 800): one at a time on a CPU, 20 (of 2**22 floats) on
    an accelerator; an int set on the estimator wins on either."""
    z = {"u": np.zeros(194_819, np.float32), "s": np.float32(0.0)}
    estimator = MinibatchEstimator(logistic, {"data": (10**5, 800, -1)}, noise=True)
    rows = {}
    for platform in ("cpu", "gpu", "tpu"):
        monkeypatch.setattr(jax, "default_backend", lambda p=platform: p)
        rows[platform] = estimator._rows_per_chunk(z, 800)
    assert rows == {"cpu": 1, "gpu": 20, "tpu": 20}
    estimator.row_budget = 800 * 194_820
    assert estimator._rows_per_chunk(z, 800) == 800


@pytest.mark.parametrize("rows", [1, 2])  # rows per chunk
def test_streamed_per_datum_rows_give_the_noise_statistics_of_all_rows(rows):
    # Large d forms the per-datum gradients a chunk at a time (row_budget floats)
    # and reduces them in one pass; the noise sd, the diagonal covariance (in u,
    # through a pullback) and the control variates' differences match the
    # statistics of all n rows at once, and the gradient is the same.
    N, dim = 40, 4
    X = random.normal(random.key(0), (N, dim))
    y = (random.uniform(random.key(1), (N,)) < 0.5).astype(jnp.float32)
    z = {"w": random.normal(random.key(2), (dim,)) * 0.3, "s": jnp.array(0.2)}
    centre = {"w": jnp.zeros(dim), "s": jnp.array(0.0)}
    A = random.normal(random.key(4), (dim + 1, dim + 1))
    key = random.key(3)

    def estimators(**kw):
        whole = MinibatchEstimator(logistic, {"data": (N, 8, -1)}, **kw)
        streamed = MinibatchEstimator(logistic, {"data": (N, 8, -1)}, **kw)
        streamed.row_budget = rows * (dim + 1)
        assert streamed._rows_per_chunk(z, 8) == rows
        assert whole._rows_per_chunk(z, 8) == 8
        return whole, streamed

    cases = {
        "sd": estimators(noise=True),
        "diag in u": estimators(covariance="diag", pullback=lambda g: g @ A),
    }
    for whole, streamed in cases.values():
        a, b = whole(key, z, (X, y), {}), streamed(key, z, (X, y), {})
        for x, x_streamed in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_allclose(x_streamed, x, rtol=1e-4, atol=1e-5)
    whole, streamed = cases["sd"]
    a, b = (
        ControlVariateEstimator(e, None, centre, 0.0, centre)(key, z, (X, y), {})
        for e in (whole, streamed)
    )
    for x, x_streamed in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x_streamed, x, rtol=1e-4, atol=1e-6)
    # The differences' spread, not the rows' at z.
    plain = whole(key, z, (X, y), {}).noise_sd["w"]
    assert not np.allclose(a.noise_sd["w"], plain, rtol=0.05)


def test_streamed_noise_rows_give_the_sd_of_the_first_rows_and_every_rows_gradient():
    # With streamed_noise_rows the streamed noise sd comes from the first m rows
    # of a random-order minibatch (m the multiple of the rows per chunk reaching
    # it) and the gradient from all n; a sorted draw keeps every row.
    N, n, dim = 400, 16, 4
    X = random.normal(random.key(0), (N, dim))
    y = (random.uniform(random.key(1), (N,)) < 0.5).astype(jnp.float32)
    z = {"w": random.normal(random.key(2), (dim,)) * 0.3, "s": jnp.array(0.2)}
    centre = {"w": jnp.zeros(dim), "s": jnp.array(0.0)}

    def pair(replace):
        whole = MinibatchEstimator(
            logistic, {"data": (N, n, -1)}, noise=True, replace=replace
        )
        some = MinibatchEstimator(
            logistic,
            {"data": (N, n, -1)},
            noise=True,
            replace=replace,
            streamed_noise_rows=5,
        )
        some.row_budget = 2 * (dim + 1)  # two rows a chunk: m = 6
        return whole, some

    whole, some = pair(True)
    indices = some.draw(random.key(3))
    first = MinibatchEstimator(logistic, {"data": (N, 6, -1)}, noise=True, replace=True)
    head = {"data": indices["data"][:6]}
    for at in (None, centre):  # plain, and the control variates' differences
        est = {}
        for name, e, idx in (("whole", whole, indices), ("some", some, indices)):
            est[name] = e.summarise(*e.evaluate(z, idx, (X, y), {}, centre=at))
        est["first"] = first.summarise(*first.evaluate(z, head, (X, y), {}, at))
        for site in z:
            np.testing.assert_allclose(
                est["some"].z_grad[site], est["whole"].z_grad[site], rtol=1e-5
            )
            # Each row is its datum's term scaled by N / (plate's n).
            ratio = (6 / n) ** 2 * noise_variance_factor(N, n, replace=True)
            ratio /= noise_variance_factor(N, 6, replace=True)
            np.testing.assert_allclose(
                est["some"].noise_sd[site] ** 2,
                ratio * est["first"].noise_sd[site] ** 2,
                rtol=1e-4,
            )
        assert not np.allclose(est["some"].noise_sd["w"], est["whole"].noise_sd["w"])
    whole, some = pair(False)  # sorted: every row
    indices = some.draw(random.key(3))
    a, b = (e.summarise(*e.evaluate(z, indices, (X, y), {})) for e in (whole, some))
    np.testing.assert_allclose(b.noise_sd["w"], a.noise_sd["w"], rtol=1e-4)


def grouped(g, h, x, y):
    """Group effects read by index: ``alpha``, ``U``, the positive ``tau``
    (through its exp) and ``W`` (scaled by the parameter ``beta`` first) once
    per datum (gathered rows); ``V`` twice (a pair of rows, kept dense);
    ``beta`` and ``s`` densely."""
    num_groups = 6
    beta = numpyro.sample("beta", dist.Normal(0, 1))
    alpha = numpyro.sample("alpha", dist.Normal(0, 1).expand([num_groups]).to_event(1))
    U = numpyro.sample("U", dist.Normal(0, 1).expand([num_groups, 3]).to_event(2))
    V = numpyro.sample("V", dist.Normal(0, 1).expand([10, 3]).to_event(2))
    s = numpyro.sample("s", dist.LogNormal(0, 1))
    tau = numpyro.sample("tau", dist.HalfNormal(1).expand([num_groups]).to_event(1))
    W = numpyro.sample("W", dist.Normal(0, 1).expand([num_groups]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=8) as idx:
        gi, hi = g[idx], h[idx]
        mean = alpha[gi] + beta * x[idx, 0] + jnp.sum(U[gi] * x[idx], -1)
        mean = mean + (W * beta)[gi]
        mean = mean + jnp.sum(V[hi] * V[(hi + 1) % 10], -1)
        numpyro.sample("y", dist.Normal(mean, s + tau[gi]), obs=y[idx])


def test_gathered_rows_give_the_noise_statistics_of_dense_rows():
    # Where d is large, leaves a datum reads through one gather keep the slice's
    # gradient and its index (GatheredRows) instead of a dense row: the noise sd,
    # the diagonal covariance and the control variates' differences match the
    # statistics of all n dense rows. Six groups among eight data: slices collide.
    N = 40
    keys = random.split(random.key(0), 6)
    g = random.randint(keys[0], (N,), 0, 6)
    h = random.randint(keys[1], (N,), 0, 10)
    x = random.normal(keys[2], (N, 3))
    y = random.normal(keys[3], (N,))
    data = (g, h, x, y)
    plates = {"data": (N, 8, -1)}
    z = {
        "beta": jnp.array(0.3),
        "alpha": random.normal(keys[4], (6,)),
        "U": random.normal(keys[5], (6, 3)) * 0.5,
        "V": jnp.linspace(-1, 1, 30).reshape(10, 3),
        "s": jnp.array(0.1),
        "tau": jnp.linspace(-1.0, 0.5, 6),
        "W": jnp.linspace(0.5, -0.5, 6),
    }
    centre = jax.tree.map(lambda v: 0.5 * v, z)
    key = random.key(3)
    # d = 68: dense rows pass 400 floats a chunk; gathered ones (32 dense floats
    # and 2 x 6 for the slices and their gradients a row) come 8 or 4 at a time.
    for budget, kw in [
        (400, {"noise": True}),
        (200, {"noise": True}),
        (200, {"covariance": "diag"}),
    ]:
        whole = MinibatchEstimator(grouped, plates, **kw)
        gathered = MinibatchEstimator(grouped, plates, **kw)
        gathered.row_budget = budget
        assert whole._rows_per_chunk(z, 8) == 8 > gathered._rows_per_chunk(z, 8)
        indices = gathered.draw(key)
        rows = gathered.evaluate(z, indices, data, {})[2]
        assert rows.chunk == {400: 8, 200: 4}[budget]
        chunk = rows.fn(indices["data"][: rows.chunk])
        assert isinstance(chunk, GatheredRows)
        leaf = chunk.treedef.unflatten(range(7))
        cut = {k for k, j in leaf.items() if j in chunk.gathers}
        assert cut == {"alpha", "U", "tau", "W"}
        # As a compiled program whose data are arguments (jit_model_args).
        a = whole(key, z, data, {})
        b = jax.jit(lambda data: gathered(key, z, data, {}))(data)  # noqa: B023
        for x_whole, x_gathered in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_allclose(x_gathered, x_whole, rtol=1e-4, atol=1e-5)
        if budget == 400:
            continue
        a, b = (
            ControlVariateEstimator(e, None, centre, 0.0, centre)(key, z, data, {})
            for e in (whole, gathered)
        )
        for x_whole, x_gathered in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_allclose(x_gathered, x_whole, rtol=1e-4, atol=1e-5)


def bag(cols, vals, y):
    """A sparse linear model: each datum reads k = 4 weights of ``w`` and rows
    of ``E`` through one gather at its own column indices (``w[cols[i]]``),
    often the same column twice; ``s`` densely."""
    w = numpyro.sample("w", dist.Normal(0, 1).expand([30]).to_event(1))
    E = numpyro.sample("E", dist.Normal(0, 1).expand([30, 2]).to_event(2))
    s = numpyro.sample("s", dist.LogNormal(0, 1))
    with numpyro.plate("data", y.shape[0], subsample_size=8) as idx:
        c = cols[idx]
        mean = jnp.sum(w[c] * vals[idx], -1) + jnp.sum(E[c] ** 2, (-2, -1))
        numpyro.sample("y", dist.Normal(mean, s), obs=y[idx])


def test_gathered_rows_at_several_indices_a_datum_give_dense_rows_statistics():
    # A datum that reads k weights (a sparse GLM, a bag of words) keeps the k
    # slices' gradients and indices instead of a dense row (issue 45: the
    # corrected step of a d = 10^5 sparse model fell back to n x d rows); where
    # it reads one weight twice, that weight's gradient is the sum and counts
    # one datum. Same statistics as all n dense rows.
    N = 40
    keys = random.split(random.key(1), 5)
    cols = random.randint(keys[0], (N, 4), 0, 6)  # 6 of 30 columns: repeats
    assert any(len(set(row)) < 4 for row in np.asarray(cols))
    vals = random.normal(keys[1], (N, 4))
    y = random.normal(keys[2], (N,))
    data, plates = (cols, vals, y), {"data": (N, 8, -1)}
    z = {
        "w": random.normal(keys[3], (30,)),
        "E": random.normal(keys[4], (30, 2)) * 0.5,
        "s": jnp.array(0.2),
    }
    centre = jax.tree.map(lambda v: 0.5 * v, z)
    key = random.key(3)
    # d = 91: dense rows pass 400 floats at 4 a chunk; gathered ones (1 dense
    # float, 2 x 12 for the slices) come all 8 at once.
    for kw in ({"noise": True}, {"covariance": "diag"}):
        whole = MinibatchEstimator(bag, plates, **kw)
        gathered = MinibatchEstimator(bag, plates, **kw)
        gathered.row_budget = 400
        indices = gathered.draw(key)
        rows = gathered.evaluate(z, indices, data, {})[2]
        assert rows.chunk == 8 > gathered._rows_per_chunk(z, 8)
        chunk = rows.fn(indices["data"])
        leaf = chunk.treedef.unflatten(range(3))
        assert {k for k, j in leaf.items() if j in chunk.gathers} == {"w", "E"}
        pairs = [(whole(key, z, data, {}), gathered(key, z, data, {}))]
        pairs.append(
            tuple(
                ControlVariateEstimator(e, None, centre, 0.0, centre)(key, z, data, {})
                for e in (whole, gathered)
            )
        )
        for a, b in pairs:
            for x_whole, x_gathered in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
                np.testing.assert_allclose(x_gathered, x_whole, rtol=1e-4, atol=1e-5)


def test_jit_once_agrees_with_jit_and_runs_inside_transforms():
    """A set-up program compiled with its own XLA options gives jit's values, and
    inside jit, vmap or pmap (where a nested jit takes no compiler options) it
    falls back to plain jit instead of raising."""

    def f(x):
        return jnp.sin(x) @ x + random.normal(random.key(0), ())

    x = jnp.arange(4.0)
    once = jit_once(f)
    expected = jax.jit(f)(x)
    np.testing.assert_allclose(once(x), expected, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(once)(x), expected, rtol=1e-6)
    np.testing.assert_allclose(
        jax.vmap(once)(jnp.stack([x, x])), [expected] * 2, rtol=1e-6
    )
    np.testing.assert_allclose(jax.pmap(once)(x[None]), [expected], rtol=1e-6)
