"""Sharded-data checks, run in a subprocess by tests/test_sharding.py: JAX must see
several (simulated) CPU devices, which is fixed when it is first imported.

``python tests/sharded_checks.py OUT.json [PART]`` runs the single-process checks
on 4 devices: PART ``estimators`` (the estimators, the multi-process run's
reference, vectorized chains and bad input), ``mcmc`` (the conjugate posterior by
each kernel) or, by default, both (the test runs both at once, or the two
parts side by side, see its ``results`` fixture).
``python tests/sharded_checks.py OUT.json PID NPROC PORT`` runs the
multi-process run as process PID of NPROC (4 / NPROC devices each), joined by
``jax.distributed`` over gloo on localhost. Results go to OUT.json; the tests
assert on them.
"""

import json
import os
import sys
import time

OUT = sys.argv[1]
PID, NPROC, PORT = (int(a) for a in sys.argv[2:5]) if len(sys.argv) > 3 else (0, 1, 0)
PART = sys.argv[2] if len(sys.argv) == 3 else "all"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={4 // NPROC}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if NPROC > 1:
    jax.distributed.initialize(
        coordinator_address=f"localhost:{PORT}", num_processes=NPROC, process_id=PID
    )

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
from numpyro.diagnostics import effective_sample_size  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import numpyro_sgbd as ns  # noqa: E402
from numpyro_sgbd.estimators import (  # noqa: E402
    ControlVariateEstimator,
    MinibatchEstimator,
)
from numpyro_sgbd.sharding import data_sharding  # noqa: E402

K = 4
results = {}
_clock = [time.perf_counter()]


def lap(what):
    # Where the subprocess's time goes (the test prints it on failure).
    now = time.perf_counter()
    print(f"{now - _clock[0]:6.1f} s  {what}", flush=True)
    _clock[0] = now


# ---------------------------------------------------------------- logistic data
N, n, d = 4000, 400, 3
rng = np.random.default_rng(0)
X = rng.normal(size=(N, d)).astype(np.float32)
truth = np.array([1.0, -1.0, 0.5])
y = (rng.random(N) < 1 / (1 + np.exp(-X @ truth))).astype(np.float32)


def logistic(X, y, n=n):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([d]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=n) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def logistic_global_size(X, y, n=n):
    # The plate declares the global N, where X.shape[0] is a shard's rows.
    w = numpyro.sample("w", dist.Normal(0, 1).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=n) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def mcmc(kernel, data, **kwargs):
    m = MCMC(
        kernel,
        num_warmup=kwargs.pop("num_warmup", 500),
        num_samples=kwargs.pop("num_samples", 2000),
        progress_bar=False,
        jit_model_args=True,
        **kwargs,
    )
    m.run(jax.random.key(0), *data)
    return m


if NPROC > 1:
    rows = slice(PID * N // NPROC, (PID + 1) * N // NPROC)
    Xs, ys = ns.shard_data(X[rows], y[rows])
    w = mcmc(ns.SGLD(logistic), (Xs, ys), num_warmup=200, num_samples=200)
    results["draws"] = np.asarray(w.get_samples()["w"]).tolist()
    with open(OUT, "w") as f:
        json.dump(results, f)
    sys.exit(0)

Xs, ys = ns.shard_data(X, y)
Xj, yj = jnp.asarray(X), jnp.asarray(y)
results["devices"] = jax.device_count()
results["spec"] = [str(a) for a in Xs.sharding.spec]

if PART in ("all", "estimators"):
    # The multi-process test's reference: the same run in one process.
    results["draws"] = np.asarray(
        mcmc(
            ns.SGLD(logistic), (Xs, ys), num_warmup=200, num_samples=200
        ).get_samples()["w"]
    ).tolist()

    lap("one-process reference run")

    # ------------------------------------------- estimator: exact parts and the noise
    plates = {"data": (N, n, -1)}
    sharding = data_sharding(plates, (Xs, ys), {})
    z = {"w": jnp.array([0.5, -0.2, 0.1])}
    w = np.asarray(z["w"], np.float64)
    for name, model in [
        ("local_size", logistic),
        ("global_size", logistic_global_size),
    ]:
        plain = MinibatchEstimator(model, plates, noise=True)
        sharded = MinibatchEstimator(model, plates, noise=True, sharding=sharding)
        u0, g0 = plain.full_data(z, (Xj, yj))
        u1, g1 = sharded.full_data(z, (Xs, ys))
        results[f"full_{name}"] = {
            "potential": [float(u0), float(u1)],
            "grad": [np.asarray(g0["w"]).tolist(), np.asarray(g1["w"]).tolist()],
        }

    # Per-datum gradients of the log-likelihood, exactly, in float64.
    p = 1 / (1 + np.exp(-X.astype(np.float64) @ w))
    per_datum = (y - p)[:, None] * X  # grad of log p(y_i | w)
    full_grad = w - per_datum.sum(0)  # grad U = -grad log prior - sum_i grad l_i
    Nk, nk = N // K, n // K
    stratified = sum(
        nk
        * (1 - nk / Nk)
        * (Nk / nk) ** 2
        * per_datum[k * Nk : (k + 1) * Nk].var(0, ddof=1)
        for k in range(K)
    )
    M = 4000
    keys = jax.random.split(jax.random.key(1), M)
    for covariance in (None, "lowrank"):
        sharded = MinibatchEstimator(
            logistic, plates, noise=True, covariance=covariance, sharding=sharding
        )
        out = jax.jit(jax.vmap(lambda key: sharded(key, z, (Xs, ys))))(keys)  # noqa: B023
        grads = np.asarray(out.z_grad["w"], np.float64)
        entry = {
            "mean": grads.mean(0).tolist(),
            "var": grads.var(0, ddof=1).tolist(),
            "noise_var": (np.asarray(out.noise_sd["w"], np.float64) ** 2)
            .mean(0)
            .tolist(),
            "full_grad": full_grad.tolist(),
            "stratified": stratified.tolist(),
            "draws": M,
        }
        if covariance == "lowrank":
            C = np.asarray(out.noise_cov, np.float64)
            entry["factor_shape"] = list(C.shape)
            entry["factor_diag"] = (C**2).sum(-1).mean(0).tolist()
        results[f"estimator_{covariance}"] = entry

    lap("estimator checks")

    # Control variates around a centre: unbiased, sharded as unsharded.
    centre = {"w": jnp.array([0.9, -0.9, 0.4])}
    u_c, g_c = MinibatchEstimator(logistic, plates).full_data(centre, (Xj, yj))
    cv = ControlVariateEstimator(
        MinibatchEstimator(logistic, plates, noise=True, sharding=sharding),
        centre=centre,
        centre_potential=u_c,
        centre_grad=g_c,
    )
    out = jax.jit(jax.vmap(lambda key: cv(key, z, (Xs, ys))))(keys)
    grads = np.asarray(out.z_grad["w"], np.float64)
    results["control_variates"] = {
        "mean": grads.mean(0).tolist(),
        "var": grads.var(0, ddof=1).tolist(),
        "full_grad": full_grad.tolist(),
        "draws": M,
    }

    lap("control variates")

# ------------------------------------------------- a conjugate posterior by MCMC
# y_i ~ N(theta, 1), theta ~ N(0, 10^2 I): the posterior is N(m, s^2 I) with
# s^2 = 1 / (N + 1/100), m = s^2 sum_i y_i.
theta = np.array([0.7, -1.3])
Yg = (theta + rng.normal(size=(N, 2))).astype(np.float32)
s2 = 1 / (N + 0.01)


def gaussian(Y, n=n):
    t = numpyro.sample("theta", dist.Normal(0, 10).expand([2]).to_event(1))
    with numpyro.plate("data", Y.shape[0], subsample_size=n) as idx:
        numpyro.sample("y", dist.Normal(t, 1).to_event(1), obs=Y[idx])


Ys = ns.shard_data(Yg)
if PART in ("all", "mcmc"):
    results["exact"] = {"mean": (s2 * Yg.sum(0)).tolist(), "sd": float(np.sqrt(s2))}
    runs = {
        "SGBD": lambda: ns.SGBD(gaussian),  # default: adapted, control variates
        "SGLD": lambda: ns.SGLD(gaussian, gradient="minibatch"),
        "NOGIN": lambda: ns.NOGIN(gaussian, gradient="minibatch"),
    }
    for name, make in runs.items():
        for where, data in [("unsharded", (jnp.asarray(Yg),)), ("sharded", (Ys,))]:
            # 6,000 draws: at 2,000 SGLD's and NOGIN's ESS was 75-90 (at 4,000
            # SGBD's 95), below the tests' floor of 100.
            run = mcmc(make(), data, num_samples=6000)
            draws = np.asarray(run.get_samples()["theta"], np.float64)
            ess = effective_sample_size(draws[None])
            results[f"mcmc_{name}_{where}"] = {
                "mean": draws.mean(0).tolist(),
                "sd": draws.std(0).tolist(),
                "ess": np.asarray(ess).tolist(),
            }
            lap(f"{name} {where}")

if PART in ("all", "estimators"):
    # Vectorized chains on sharded data: chain for chain the sequential draws.
    for method in ("sequential", "vectorized"):
        m = mcmc(
            ns.SGLD(gaussian, gradient="minibatch"),
            (Ys,),
            num_warmup=100,
            num_samples=100,
            num_chains=2,
            chain_method=method,
        )
        results[f"chains_{method}"] = np.asarray(
            m.get_samples(group_by_chain=True)["theta"]
        ).tolist()

    lap("vectorized")

    # -------------------------------------------------------------- bad input
    errors = {}

    def error_of(fn):
        try:
            fn()
        except ValueError as e:
            return str(e)
        return None

    mesh = Xs.sharding.mesh
    P = jax.sharding.PartitionSpec
    errors["unsharded_rows"] = error_of(lambda: data_sharding(plates, (Xs, yj), {}))
    errors["subsample_size"] = error_of(
        lambda: data_sharding({"data": (N, 398, -1)}, (Xs, ys), {})
    )
    errors["small_subsample"] = error_of(
        lambda: data_sharding({"data": (N, 2, -1)}, (Xs, ys), {})
    )
    wide = jax.device_put(
        np.ones((N, 4), np.float32), jax.sharding.NamedSharding(mesh, P(None, "data"))
    )
    errors["other_axis"] = error_of(lambda: data_sharding(plates, (wide, ys), {}))
    other_mesh = jax.make_mesh(  # the same devices in another order
        (K,),
        ("data",),
        axis_types=(jax.sharding.AxisType.Auto,),
        devices=jax.devices()[::-1],
    )
    errors["two_meshes"] = error_of(
        lambda: data_sharding(
            plates,
            (Xs, jax.device_put(y, jax.sharding.NamedSharding(other_mesh, P("data")))),
            {},
        )
    )
    errors["uneven_rows"] = error_of(lambda: ns.shard_data(np.ones((4002, 2))))
    errors["host_data"] = error_of(
        lambda: data_sharding(plates, (Xs, ns.host_data(y)), {})
    )
    errors["two_plates"] = error_of(
        lambda: data_sharding({"a": (N, n, -1), "b": (N, n, -2)}, (Xs, ys), {})
    )

    def closed_over():
        m = MCMC(ns.SGLD(logistic), num_warmup=5, num_samples=5, progress_bar=False)
        m.run(jax.random.key(0), Xs, ys)

    errors["jit_model_args"] = error_of(closed_over)

    def parallel_chains():
        m = MCMC(
            ns.SGLD(logistic),
            num_warmup=5,
            num_samples=5,
            num_chains=2,
            chain_method="parallel",
            progress_bar=False,
            jit_model_args=True,
        )
        m.run(jax.random.key(0), Xs, ys)

    errors["parallel"] = error_of(parallel_chains)
    results["errors"] = errors

with open(OUT, "w") as f:
    json.dump(results, f)
