"""Cyclical SGLD, added as a spec on the one kernel (issue 61): its exact law on
a two-mode target, SGLD draw for draw with a one-step cycle, and its draws
against NUTS through the default path.

The target is the equal mixture of N(-5, 1) and N(5, 1): a barrier of 12.5
between the modes, which SGLD at a small step crosses in exponential time.
Within a mode the target is Gaussian to within e^-10 |z|, so each coordinate of
unadjusted Langevin there is linear: its mean stays at the mode and its
variance follows v' = (1 - s_k / 2)^2 v + s_k, s_k the squared step of the
schedule. Over the second half of each cycle (the small steps) the draws' law
is then exact: each mode with weight 1/2 by symmetry, and (|z| - 5)^2 with the
periodic mean of that recursion. Tolerances come from the spread of the cycles'
own means; the same statistic rejects a schedule applied to sigma rather than
to sigma^2.
"""

from _agreement import checked_ess
import jax
from jax import random
import jax.numpy as jnp
from jax.scipy.special import logsumexp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
import pytest

from numpyro_sgbd import SGLD, CyclicalSGLD
from numpyro_sgbd.updates import cyclical as cyclical_module

MODE, PEAK, LENGTH, CYCLES = 5.0, 1.9, 200, 200


def _potential(z):
    return -jnp.sum(
        logsumexp(jnp.stack([-((z - MODE) ** 2) / 2, -((z + MODE) ** 2) / 2]), 0)
    )


def within_mode_variance(peak, length):
    """The mean of the recursion's variance over the second half of a cycle,
    once periodic (the draw after each step of the schedule)."""
    r = np.arange(length) / length
    steps = peak**2 * 0.5 * (np.cos(np.pi * r) + 1)
    v, kept = 1.0, []
    for _ in range(20):  # contracts by at least (1 - s/2)^2 < 1 each cycle
        kept = []
        for k, s in enumerate(steps):
            v = (1 - s / 2) ** 2 * v + s
            if r[k] >= 0.5:
                kept.append(v)
    return float(np.mean(kept))


def _kept_draws(**options):
    kernel = CyclicalSGLD(
        potential_fn=_potential, step_size=PEAK, cycle_length=LENGTH, **options
    )
    mcmc = MCMC(kernel, num_warmup=0, num_samples=LENGTH * CYCLES, progress_bar=False)
    mcmc.run(
        random.key(0), init_params=jnp.array([MODE]), extra_fields=("cycle_position",)
    )
    x = np.asarray(mcmc.get_samples())[:, 0].reshape(CYCLES, LENGTH)
    position = np.asarray(mcmc.get_extra_fields()["cycle_position"]).reshape(
        CYCLES, LENGTH
    )
    return x, position


def _per_cycle(x, position):
    """Each cycle's fraction of kept draws in the right mode and mean of
    (|z| - 5)^2 over them (the step's r is before it: kept where r >= 0.5)."""
    keep = position >= 0.5
    right = np.array([np.mean(c[k] > 0) for c, k in zip(x, keep)])
    spread = np.array([np.mean((np.abs(c[k]) - MODE) ** 2) for c, k in zip(x, keep)])
    return right, spread


def _within(values, expected):
    se = values.std(ddof=1) / np.sqrt(len(values))
    return abs(values.mean() - expected) < 4 * se, (values.mean(), expected, se)


def test_cyclical_sgld_samples_its_exact_law_on_two_modes():
    right, spread = _per_cycle(*_kept_draws())
    ok, why = _within(right, 0.5)
    assert ok, why
    expected = within_mode_variance(PEAK, LENGTH)
    assert abs(expected - 1) > 0.05  # not the target's own: the steps' bias
    ok, why = _within(spread, expected)
    assert ok, why


def test_the_law_test_rejects_a_schedule_on_sigma(monkeypatch):
    schedule = cyclical_module.cyclical_schedule

    def on_sigma(k, cycle_length):
        factor, position = schedule(k, cycle_length)
        return factor**2, position

    monkeypatch.setattr(cyclical_module, "cyclical_schedule", on_sigma)
    _, spread = _per_cycle(*_kept_draws())
    ok, _ = _within(spread, within_mode_variance(PEAK, LENGTH))
    assert not ok


def test_sgld_at_a_small_step_stays_in_its_mode():
    """What the cycles are for: SGLD at the small end of the schedule does not
    cross the barrier in as many steps."""
    mcmc = MCMC(
        SGLD(potential_fn=_potential, step_size=0.5),
        num_warmup=0,
        num_samples=LENGTH * CYCLES,
        progress_bar=False,
    )
    mcmc.run(random.key(0), init_params=jnp.array([MODE]))
    assert np.mean(np.asarray(mcmc.get_samples()) > 0) > 0.95


def test_a_one_step_cycle_is_sgld_draw_for_draw():
    """The same keys and moves: equal to float rounding (XLA folds SGLD's
    constant step into its program, not the schedule's computed one)."""

    def draws(kernel):
        mcmc = MCMC(kernel, num_warmup=50, num_samples=200, progress_bar=False)
        mcmc.run(random.key(3), init_params=jnp.array([1.0, -1.0]))
        return np.asarray(mcmc.get_samples())

    potential = lambda z: 0.5 * jnp.sum(z**2)  # noqa: E731
    one = draws(CyclicalSGLD(potential_fn=potential, step_size=0.3, cycle_length=1))
    sgld = draws(SGLD(potential_fn=potential, step_size=0.3))
    np.testing.assert_allclose(one, sgld, rtol=1e-4, atol=1e-5)


def test_cyclical_sgld_checks_its_arguments():
    with pytest.raises(ValueError, match="cycle_length must be a positive int"):
        CyclicalSGLD(potential_fn=_potential, step_size=0.1, cycle_length=0)
    with pytest.raises(ValueError, match="explore must be a number in"):
        CyclicalSGLD(potential_fn=_potential, step_size=0.1, explore=1.0)


def _regression(x, y):
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=200) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ beta, 1.0), obs=y[idx])


def test_the_default_path_agrees_with_nuts():
    """``CyclicalSGLD(model)``: the step adapted in warmup is the cycles' peak;
    every draw kept. Tolerances: 4 Monte Carlo errors of the means (ESS from
    the draws), and the sds within 15 % (the larger steps' bias included)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(5000, 2)), jnp.float32)
    y = x @ jnp.array([1.0, -0.5]) + jnp.asarray(rng.normal(size=5000), jnp.float32)

    def full(x, y):
        beta = numpyro.sample("beta", dist.Normal(0, 10).expand([2]).to_event(1))
        numpyro.sample("y", dist.Normal(x @ beta, 1.0).to_event(1), obs=y)

    nuts = MCMC(NUTS(full), num_warmup=500, num_samples=2000, progress_bar=False)
    nuts.run(random.key(1), x, y)
    ref = np.asarray(nuts.get_samples()["beta"])
    mcmc = MCMC(
        CyclicalSGLD(_regression, cycle_length=100),
        num_warmup=1000,
        num_samples=10000,
        progress_bar=False,
    )
    mcmc.run(random.key(2), x, y)
    draws = np.asarray(mcmc.get_samples()["beta"])
    ess = checked_ess(draws[None])
    se = draws.std(0) / np.sqrt(ess)
    assert np.all(np.abs(draws.mean(0) - ref.mean(0)) < 4 * se + 0.1 * ref.std(0))
    assert np.all(np.abs(draws.std(0) / ref.std(0) - 1) < 0.15), draws.std(0)


@pytest.fixture(autouse=True)
def _jax_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield
