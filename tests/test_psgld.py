"""pSGLD, added as a spec on the one kernel (issue 61): its law on a Gaussian,
where the RMSprop average holds still, and its draws against NUTS on a model
whose scales differ by a factor 100.

With a long average (``decay`` near 1) V is the stationary mean of the squared
gradient, so the chain is unadjusted Langevin with the fixed per-coordinate step
sigma sqrt(G), G = 1 / sqrt(E g^2). On N(0, s^2) that chain's variance is s^2 r
with r = 1 / (1 - sigma^2 G / (4 s^2)), and E g^2 = r / s^2 closes the loop:
sqrt(r) solves r - c sqrt(r) - 1 = 0, c = sigma^2 / (4 s). The tolerance is the
Monte Carlo error of independent chains; the same statistic rejects a
preconditioner without its square root.
"""

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
import pytest

from numpyro_sgbd import PSGLD, SGLD
from numpyro_sgbd.updates import psgld as psgld_module

SCALES = np.array([0.5, 2.0])
STEP, NUM_CHAINS = 1.0, 8


def law(scales, step):
    """E z^2 of the long-average chain on N(0, diag(scales^2))."""
    c = step**2 / (4 * scales)
    root = (c + np.sqrt(c**2 + 4)) / 2
    return scales**2 * root**2


def _second_moments():
    """Each chain's mean of z^2 per coordinate, and their standard error."""
    scales = jnp.asarray(SCALES)
    kernel = PSGLD(
        potential_fn=lambda z: 0.5 * jnp.sum((z / scales) ** 2),
        step_size=STEP,
        decay=0.999,
    )
    mcmc = MCMC(
        kernel,
        num_warmup=5000,
        num_samples=20000,
        num_chains=NUM_CHAINS,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(random.key(0), init_params=jnp.tile(scales, (NUM_CHAINS, 1)))
    x = np.asarray(mcmc.get_samples(group_by_chain=True))
    per_chain = (x**2).mean(axis=1)
    return per_chain.mean(0), per_chain.std(0, ddof=1) / np.sqrt(NUM_CHAINS)


def test_psgld_samples_its_exact_law_on_a_gaussian():
    mean, se = _second_moments()
    expected = law(SCALES, STEP)
    # Not the target's own s^2: the step is large, and G scales it per coordinate.
    assert np.all(np.abs(expected / SCALES**2 - 1) > 0.1)
    # 1 % for the average's own fluctuation, which the law takes as fixed.
    assert np.all(np.abs(mean - expected) < 5 * se + 0.01 * expected), (mean, se)


def test_the_law_test_rejects_a_preconditioner_without_its_root(monkeypatch):
    monkeypatch.setattr(
        psgld_module,
        "rms_preconditioner",
        lambda v, t, decay, eps: 1.0 / (eps + v / (1 - decay**t)),
    )
    mean, se = _second_moments()
    expected = law(SCALES, STEP)
    assert np.any(np.abs(mean - expected) > 5 * se + 0.01 * expected), (mean, se)


def test_psgld_checks_its_arguments():
    with pytest.raises(ValueError, match="decay must be a number in"):
        PSGLD(potential_fn=lambda z: z, step_size=0.1, decay=1.0)
    with pytest.raises(ValueError, match="eps must be a positive"):
        PSGLD(potential_fn=lambda z: z, step_size=0.1, eps=0.0)
    with pytest.raises(TypeError, match="did you mean 'decay'"):
        PSGLD(potential_fn=lambda z: z, step_size=0.1, decya=0.9)


def _regression(x, y):
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([2]).to_event(1))
    numpyro.sample("y", dist.Normal(x @ beta, 1.0).to_event(1), obs=y)


@pytest.mark.filterwarnings("ignore:.*subsample plate")
def test_psgld_agrees_with_nuts_where_sgld_at_its_step_does_not():
    """Exact gradients, a given step and no preconditioner, on a regression
    whose second covariate is 100 times the first's scale: posterior sds 0.022
    and 0.00022. G settles at about the sd, so the step 0.0094 moves the
    narrow coordinate by 0.63 of its sd and the wide one by 0.06 of its; SGLD
    at that step is unstable on the narrow one (a step of 43 sds)."""
    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(size=2000), 100 * rng.normal(size=2000)], 1)
    y = x @ np.array([1.0, 0.02]) + rng.normal(size=2000)
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
    nuts = MCMC(NUTS(_regression), num_warmup=500, num_samples=4000, progress_bar=False)
    nuts.run(random.key(1), x, y)
    ref = np.asarray(nuts.get_samples()["beta"])
    ref_mean, ref_sd = ref.mean(0), ref.std(0)

    def run(kernel):
        mcmc = MCMC(
            kernel,
            num_warmup=2000,
            num_samples=20000,
            num_chains=4,
            chain_method="vectorized",
            progress_bar=False,
        )
        init = {"beta": jnp.tile(jnp.asarray(ref_mean), (4, 1))}
        mcmc.run(random.key(2), x, y, init_params=init)
        return np.asarray(mcmc.get_samples()["beta"])

    # The average must outlast the chain's autocorrelation (about 500 steps on
    # the wide coordinate), or G moves with the position: that coordinate's sd
    # came out 33 %, 11 % and 4 % wide at decay 0.99, 0.999 and 0.9999.
    draws = run(PSGLD(_regression, step_size=0.0094, decay=0.9999))
    # Tolerances: about 4 Monte Carlo errors of the wide coordinate's mean and
    # sd (ESS about 160), and the narrow one's sd 5 % wide at this step.
    z = np.abs(draws.mean(0) - ref_mean) / ref_sd
    assert np.all(z < 0.3), z
    assert np.all(np.abs(draws.std(0) / ref_sd - 1) < 0.2), draws.std(0) / ref_sd
    plain = run(SGLD(_regression, step_size=0.0094))
    assert not np.all(np.isfinite(plain)) or np.any(
        np.abs(plain.std(0) / ref_sd - 1) > 0.5
    )


@pytest.fixture(autouse=True)
def _jax_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield
