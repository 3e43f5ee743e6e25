"""Kernel Stein discrepancy against a naive double loop and known laws."""

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sgbd.evaluation.ksd import ksd

# Our own numerics (no ArviZ, no NumPyro contract): CI's Python 3.12 run
# skips them; the first run covers them.
pytestmark = pytest.mark.heavy


def _naive_ksd(x, s, c=1.0, beta=-0.5):
    """O(m^2) loop; the kernel's derivatives by autodiff, not by our closed form."""

    def k(a, b):
        return (c**2 + jnp.sum((a - b) ** 2)) ** beta

    grad_a = jax.grad(k, argnums=0)
    grad_b = jax.grad(k, argnums=1)
    cross = jax.jacfwd(grad_b, argnums=0)  # d/da of grad_b: trace is div_a div_b k

    total = 0.0
    for i in range(x.shape[0]):
        for j in range(x.shape[0]):
            a, b = x[i], x[j]
            total += (
                float(s[i] @ s[j]) * float(k(a, b))
                + float(s[i] @ grad_b(a, b))
                + float(s[j] @ grad_a(a, b))
                + float(jnp.trace(cross(a, b)))
            )
    return np.sqrt(total) / x.shape[0]


def _gaussian_draws(seed, m, d=2, shift=0.0, scale=1.0):
    x = shift + scale * random.normal(random.key(seed), (m, d))
    return x, -x  # scores of the N(0, I) target


# 39 s; test_stein checks the same kernel against its own double loop in CI.
@pytest.mark.slow
def test_ksd_equals_naive_double_loop():
    kx, ks = random.split(random.key(0))
    x = 3.0 + random.normal(kx, (25, 3))
    s = random.normal(ks, (25, 3))
    np.testing.assert_allclose(ksd(x, s), _naive_ksd(x, s), rtol=2e-4)
    np.testing.assert_allclose(
        ksd(x, s, c=2.0, beta=-0.3), _naive_ksd(x, s, c=2.0, beta=-0.3), rtol=2e-4
    )


def test_ksd_is_invariant_to_block_size():
    x, s = _gaussian_draws(1, 500, d=4, shift=0.3)
    whole = ksd(x, s, block_size=500)
    for block_size in (1, 7, 128):
        np.testing.assert_allclose(ksd(x, s, block_size=block_size), whole, rtol=1e-5)


def test_ksd_of_exact_draws_shrinks_with_m():
    # For exact draws the V-statistic has E[KSD^2] = E[k_p(x, x)] / m, so KSD
    # falls like m^(-1/2): 16 times the draws, a quarter of the discrepancy.
    small = np.mean([ksd(*_gaussian_draws(seed, 100)) for seed in range(5)])
    large = np.mean([ksd(*_gaussian_draws(seed, 1600)) for seed in range(5)])
    assert 0.15 < large / small < 0.4, (small, large)


@pytest.mark.parametrize("shift, scale", [(0.5, 1.0), (0.0, 1.5), (0.0, 0.7)])
def test_ksd_is_larger_for_wrong_draws(shift, scale):
    exact = ksd(*_gaussian_draws(2, 1000))
    x = shift + scale * random.normal(random.key(2), (1000, 2))
    wrong = ksd(x, -x)
    assert wrong > 3 * exact, (exact, wrong)


@pytest.mark.parametrize(
    "samples, scores, kwargs, match",
    [
        (np.zeros((5, 2)), np.zeros((5, 3)), {}, "same shape"),
        (np.zeros((0, 2)), np.zeros((0, 2)), {}, "empty"),
        (np.full((5, 2), np.nan), np.zeros((5, 2)), {}, "samples contain non-finite"),
        (np.zeros((5, 2)), np.full((5, 2), np.inf), {}, "scores contain non-finite"),
        (np.zeros((5, 2)), np.zeros((5, 2)), {"beta": 0.5}, "-1 < beta < 0"),
        (np.zeros((5, 2)), np.zeros((5, 2)), {"block_size": 0}, "block_size"),
    ],
)
def test_ksd_bad_input(samples, scores, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ksd(samples, scores, **kwargs)
