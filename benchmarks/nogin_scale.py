"""NOGIN's default step against SGLD's at d = 10 to 5,000 (issue 63), before
and after the running low-rank-plus-diagonal noise estimate.

    python benchmarks/nogin_scale.py            # about 20 minutes on 2 CPU cores
    python benchmarks/nogin_scale.py --quick    # d = 10 and 136 only, a few minutes

Problems: logistic regressions on N(0, 1/d) covariates with N(0, 1)
coefficients (``glm10``, ``glm136``, ``glm501``: N = 20,000; ``glm5000``:
N = 10,000), n = 500 a minibatch; and ``indexed501``, an indexed-vector
logistic model (30,000 rows, each reading 3 of 500 coefficients and an
intercept, d = 501; n = 300), the issue's first row.

Kernels, each on its default path (``SGLD(model)``, ``NOGIN(model)``: the mode
search, the preconditioner, the adapted step): SGLD; NOGIN (its default,
``covariance="lowrank+diag"``); and "NOGIN before", the default this issue
replaced: the covariance estimated afresh every step from a second minibatch
(``noise_estimate="auto"`` on plain minibatches), in the form
:func:`~numpyro_sgbd.samplers.per_step_covariance` picks ("full" for n >= d,
"lowrank" below).

Printed, per problem: ms per step of each (the difference of two run lengths,
each the fastest of ``--repeats`` runs less its compile seconds, the kernels
alternating in every round so their ratio sees the same slow spells) and the
ratio to SGLD's step measured in the same rounds. Then, on ``indexed501``
(``--accuracy``, default on): 1,000 warmup + 4,000 draws of each, one chain,
against NUTS over all rows: xi (relative error of the posterior sds), the
smallest and median bulk ESS, and ESS per second of sampling (ESS over draws
times the step's seconds above).
"""

import argparse
import contextlib
import gc
import io
import time
import warnings

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.diagnostics import effective_sample_size
import numpyro.distributions as dist
from numpyro.infer import MCMC
from run import compile_seconds

from numpyro_sgbd import NOGIN, SGLD, reference_posterior
from numpyro_sgbd.samplers import per_step_covariance


def glm(X, y, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def indexed(cols, vals, y, num_coefs=500, subsample_size=None):
    b0 = numpyro.sample("b0", dist.Normal(0.0, 2.0))
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([num_coefs]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
        logits = b0 + jnp.sum(w[cols[idx]] * vals[idx], -1)
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y[idx])


def problem(name):
    """``(model, args, n, d)`` of one problem (its data fixed by seed 0)."""
    k1, k2, k3 = random.split(random.key(0), 3)
    if name.startswith("glm"):
        d = int(name[3:])
        N = 10_000 if d > 1000 else 20_000
        X = random.normal(k1, (N, d)) / np.sqrt(d)
        w = random.normal(k2, (d,))
        y = random.bernoulli(k3, jax.nn.sigmoid(X @ w)).astype(jnp.float32)
        return glm, (np.asarray(X), np.asarray(y)), 500, d
    N, K = 30_000, 500
    cols = random.randint(k1, (N, 3), 0, K)
    vals = random.normal(k2, (N, 3))
    w = random.normal(k3, (K,))
    logits = -0.5 + jnp.sum(w[cols] * vals, -1)
    y = random.bernoulli(random.key(1), jax.nn.sigmoid(logits)).astype(jnp.float32)
    return indexed, (np.asarray(cols), np.asarray(vals), np.asarray(y)), 300, K + 1


def kernels(model, n, d):
    form = per_step_covariance(d, n)[0]
    return {
        "SGLD": lambda m: SGLD(m),
        "NOGIN": lambda m: NOGIN(m),
        "NOGIN before": lambda m: NOGIN(m, covariance=form),
    }


def _run(kernel, args, num_warmup, num_samples):
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        progress_bar=False,
        jit_model_args=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stderr(io.StringIO()), compile_seconds() as c:
            start = time.perf_counter()
            mcmc.run(random.key(1), *args)
            jax.block_until_ready(mcmc.get_samples())
            seconds = time.perf_counter() - start
    return mcmc, seconds - c[0]


def step_seconds(cases, model, args, n, steps, repeats):
    """Seconds per step of each case: (T(6k) - T(k)) / 5k, each T the fastest
    of ``repeats`` rounds, the cases alternating within every round."""
    best = {name: [np.inf, np.inf] for name in cases}
    bound = lambda m: lambda *a: m(*a, subsample_size=n)  # noqa: E731
    # One kernel a case, run again as a user refits: its set-up is kept.
    made = {name: make(bound(model)) for name, make in cases.items()}
    for _ in range(repeats):
        for name, kernel in made.items():
            for j, k in enumerate((steps[name], 6 * steps[name])):
                gc.collect()
                gc.disable()
                try:
                    _, t = _run(kernel, args, 0, k)
                finally:
                    gc.enable()
                best[name][j] = min(best[name][j], t)
    jax.clear_caches()
    return {name: (b6 - b1) / (5 * steps[name]) for name, (b1, b6) in best.items()}


def flat_sds(samples):
    return np.concatenate([np.std(np.asarray(v), 0).ravel() for v in samples.values()])


def accuracy(model, args, n, per_step, num_warmup=1000, num_samples=4000):
    """xi against NUTS, the smallest and median bulk ESS and ESS per second of
    each kernel on one chain."""
    ref = reference_posterior(model, *args, num_samples=2000, num_chains=2)
    ref_samples = {k: np.asarray(v) for k, v in ref.posterior.items()}
    ref_sd = np.concatenate(
        [v.reshape(-1, *v.shape[2:]).std(0).ravel() for v in ref_samples.values()]
    )
    out = {}
    for name, make in kernels(model, n, len(ref_sd)).items():
        mcmc, _ = _run(
            make(lambda *a: model(*a, subsample_size=n)), args, num_warmup, num_samples
        )
        samples = mcmc.get_samples()
        xi = np.linalg.norm(flat_sds(samples) - ref_sd) / np.linalg.norm(ref_sd)
        ess = np.concatenate(
            [
                np.ravel(effective_sample_size(np.asarray(v)[None]))
                for v in samples.values()
            ]
        )
        sampling = num_samples * per_step[name]
        out[name] = (xi, ess.min(), np.median(ess), ess.min() / sampling)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--problems", nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-accuracy", dest="accuracy", action="store_false")
    args = parser.parse_args(argv)
    names = ["glm10", "glm136"]
    if not args.quick:
        names += ["glm501", "indexed501", "glm5000"]
    names = args.problems or names
    print(f"{'problem':<12}{'d':>6}{'n':>6}{'kernel':>15}{'ms/step':>10}{'/ SGLD':>8}")
    timed = {}
    for name in names:
        model, data, n, d = problem(name)
        before = per_step_covariance(d, n)[0]
        # "before" costs 0.1 ms a step at d = 10, tens of ms at d = 5,000.
        slow = 1000 if d <= 20 else 200 if d <= 1000 else 20
        steps = {"SGLD": 2000, "NOGIN": 2000, "NOGIN before": slow}
        per_step = step_seconds(
            kernels(model, n, d), model, data, n, steps, args.repeats
        )
        timed[name] = per_step
        for kernel, t in per_step.items():
            label = f"{kernel} ({before})" if kernel == "NOGIN before" else kernel
            print(
                f"{name:<12}{d:>6}{n:>6}{label:>15}{1e3 * t:>10.3f}"
                f"{t / per_step['SGLD']:>8.2f}",
                flush=True,
            )
    if args.accuracy and "indexed501" in timed:
        model, data, n, d = problem("indexed501")
        print("\nindexed501: 1,000 + 4,000 draws, one chain, against NUTS")
        print(f"{'kernel':<15}{'xi':>8}{'min ESS':>9}{'med ESS':>9}{'ESS/s':>9}")
        for kernel, (xi, lo, med, rate) in accuracy(
            model, data, n, timed["indexed501"]
        ).items():
            print(f"{kernel:<15}{xi:>8.3f}{lo:>9.0f}{med:>9.0f}{rate:>9.1f}")


if __name__ == "__main__":
    main()
