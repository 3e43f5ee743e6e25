"""Simulation-based calibration with arviz-devs' simuk, which takes our kernels
as they are: the seconds of each fit, the first against the later ones, and the
ranks' uniformity.

    python benchmarks/sbc_simuk.py                      # SGLD, 30 simulations
    python benchmarks/sbc_simuk.py --sampler NOGIN --simulations 60
    python benchmarks/sbc_simuk.py --cache /tmp/jax-cache --checks-off
    python benchmarks/sbc_simuk.py --thinning 1     # every draw ranked

Needs Python >= 3.12 and ``pip install simuk`` (simuk needs ArviZ 1.x); not a
test dependency. A logistic regression (2,000 rows, 3 coefficients with N(0, 1)
priors, n = 100) run by ``SGLD(model)`` (or ``--sampler SGBD`` or ``NOGIN``)
with 500 + 2,000 samples and ``jit_model_args=True``; simuk draws the
coefficients from the prior and our simulator draws the 2,000 labels (simuk's
prior predictive of a subsample plate would draw only n of them). ``--cache``
names a directory (give a new one) for JAX's persistent compilation cache and
``--checks-off`` runs the simulations inside ``numpyro_sgbd.monitoring.off()``:
the pattern docs/usage.rst gives for repeated fits. ``--thinning`` (default 10)
keeps every 10th of the 2,000 draws, as Talts et al. (2018, Section 5.1)
advise: ranks among autocorrelated draws are not uniform even for an exact
sampler, and simuk's ranking costs a Python step per kept draw. Printed: the
wall seconds of the whole SBC run, simuk's own work included (issue 59's target for 60
simulations: 1/3 of the 64-79 s they took before), of all the fits and of
simuk's ``compute_rank_statistics`` (a Python loop over every draw of every
fit, after the last); each fit's seconds (simuk's ``MCMC`` and ``run`` and the
conversion to ArviZ); the mean of the later fits over the first (issue 45's
target: 1/5 or less); and per coefficient the chi-square p-value of its ranks
in 10 bins (uniform ranks: a calibrated sampler).

Each fit is timed by wrapping the SBC object's method that runs one fit
(``_get_posterior_samples_numpyro`` in simuk 0.3), a private name of simuk's:
a later simuk may rename it, and then this script says so.
"""

import argparse
import time
import warnings

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from refits import add_pattern_options, pattern  # benchmarks/refits.py
from scipy import stats

from numpyro_sgbd import NOGIN, SGBD, SGLD

SAMPLERS = {"SGLD": SGLD, "SGBD": SGBD, "NOGIN": NOGIN}
N, D = 2000, 3
NUM_SAMPLES = 2000


def model(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        obs = None if y is None else y[idx]
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=obs)


def run(sampler, num_simulations, thinning):
    import simuk

    X = random.normal(random.key(0), (N, D))

    def simulator(w, seed):
        p = jax.nn.sigmoid(X @ w)
        y = random.bernoulli(random.PRNGKey(seed), p)
        return {"y": np.asarray(y, np.float32)}

    sbc = simuk.SBC(
        SAMPLERS[sampler](model),
        simulator=simulator,
        num_simulations=num_simulations,
        data_dir={"X": X, "y": jnp.zeros(N)},
        sample_kwargs={
            "num_warmup": 500,
            "num_samples": NUM_SAMPLES,
            "thinning": thinning,
            "jit_model_args": True,
            "progress_bar": False,
        },
        seed=0,
        progress_bar=False,
    )
    one_fit = getattr(sbc, "_get_posterior_samples_numpyro", None)
    if one_fit is None:
        raise SystemExit(
            "this simuk has no _get_posterior_samples_numpyro to time: see the "
            "docstring"
        )
    seconds, rank_seconds = [], []
    sbc._get_posterior_samples_numpyro = _timed(one_fit, seconds)
    sbc.compute_rank_statistics = _timed(sbc.compute_rank_statistics, rank_seconds)
    sbc.run_simulations()
    return sbc, seconds, sum(rank_seconds)


def _timed(method, seconds):
    """``method``, appending the seconds of each call to ``seconds``."""

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = method(*args, **kwargs)
        seconds.append(time.perf_counter() - start)
        return out

    return timed


def rank_p_values(sbc, thinning, bins=10):
    """Per coefficient, the chi-square p-value of its ranks in ``bins`` bins."""
    ranks = np.asarray(sbc.simulations["prior_sbc"]["w"]).reshape(-1, D)
    top = NUM_SAMPLES // thinning + 1  # how many kept draws lie below the truth
    edges = np.linspace(0, top, bins + 1)
    # the share of the possible ranks 0, ..., top - 1 in each bin
    expected = np.histogram(np.arange(top), edges)[0] / top * len(ranks)
    values = []
    for k in range(D):
        counts = np.histogram(ranks[:, k], edges)[0]
        values.append(stats.chisquare(counts, expected).pvalue)
    return values


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--simulations", type=int, default=30)
    parser.add_argument("--sampler", choices=list(SAMPLERS), default="SGLD")
    parser.add_argument("--thinning", type=int, default=10)
    add_pattern_options(parser)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # short runs: the convergence check speaks
    start = time.perf_counter()
    with pattern(args):
        sbc, seconds, rank_seconds = run(args.sampler, args.simulations, args.thinning)
    wall = time.perf_counter() - start
    later = float(np.mean(seconds[1:]))
    print(
        f"{args.sampler}: {args.simulations} simulations in {wall:.1f} s wall: "
        f"the fits {sum(seconds):.1f} s, simuk's rank statistics {rank_seconds:.1f} s"
    )
    print("fits (s):", " ".join(f"{s:.2f}" for s in seconds))
    print(
        f"{args.sampler}: fits after the first {later:.2f} s / the first "
        f"{seconds[0]:.2f} s = {later / seconds[0]:.2f}"
    )
    p = ", ".join(
        f"w[{k}] {v:.2f}" for k, v in enumerate(rank_p_values(sbc, args.thinning))
    )
    print(f"ranks' chi-square p-values (10 bins): {p}")


if __name__ == "__main__":
    main()
