"""Big data: step time with the data sharded over 1, 2 and 4 devices, and a
10^8-row logistic regression on one machine.

    python benchmarks/big_data.py steps [--num-data 10000000]
    python benchmarks/big_data.py large [--num-data 100000000]

``steps`` runs one subprocess per device count (simulated CPU devices,
``XLA_FLAGS=--xla_force_host_platform_device_count=K``, fixed before JAX is
imported) at N = 10^7, d = 10, n = 1000, and prints ms per step of a vanilla SGLD
step and a corrected SGBD step (per-datum noise statistics), each the median of
three timed runs of a compiled loop of ``kernel.sample`` with the data as
arguments, and the ratios to one device, all from this one invocation. On a CPU
the simulated devices share its cores: the ratios show what sharding costs in
collectives and per-shard work, not a speed-up; on a machine with several
accelerators each shard has its own.

``large`` simulates the data in chunks straight into a JAX array (each chunk
written in place, so generation needs the data plus one chunk), runs
``MCMC(SGLD(model), jit_model_args=True)`` with the default adaptation (mode
search, Laplace preconditioner, control variates around the mode), and compares
the draws' sds with the Laplace approximation's (the exact Hessian at the exact
mode, Newton's method in float64 over the data in chunks): xi = ||sd - sd_L|| /
||sd_L||. With ``--host-data`` the data are NumPy arrays kept on the host by
``numpyro_sgbd.host_data``, read a minibatch (or a full-data pass's chunk) at a
time through host callbacks. NUTS cannot run at this size: every NUTS step is up
to 2^10 full-data gradients, each a pass over all 10^8 rows. It prints wall
seconds per phase and peak resident memory / data size.
"""

import argparse
import os
import resource
import subprocess
import sys
import time


def _data_chunks(num_data, dim, chunk, seed=0):
    """Yields (X, y) chunks of the simulated logistic regression (float32)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    w = rng.normal(size=dim)
    for start in range(0, num_data, chunk):
        m = min(chunk, num_data - start)
        X = rng.standard_normal((m, dim), dtype=np.float32)
        p = 1 / (1 + np.exp(-(X @ w)))
        y = (rng.random(m) < p).astype(np.float32)
        yield X, y


def simulate(num_data, dim, chunk=1_000_000, sharding=None):
    """The data as JAX arrays, written chunk by chunk in place (donated buffers):
    peak memory is the data plus one chunk."""
    import jax
    import jax.numpy as jnp

    X = jnp.zeros((num_data, dim), jnp.float32, device=sharding)
    y = jnp.zeros((num_data,), jnp.float32, device=sharding)

    def put(X, y, cx, cy, start):
        X = jax.lax.dynamic_update_slice(X, cx, (start, 0))
        return X, jax.lax.dynamic_update_slice(y, cy, (start,))

    put = jax.jit(put, donate_argnums=(0, 1))
    start = 0
    for cx, cy in _data_chunks(num_data, dim, chunk):
        X, y = put(X, y, cx, cy, start)
        start += len(cx)
    return jax.block_until_ready((X, y))


def simulate_on_host(num_data, dim, chunk=1_000_000):
    """The data as NumPy arrays, filled chunk by chunk, kept on the host by
    :func:`numpyro_sgbd.host_data`: peak memory is the data plus one chunk."""
    import numpy as np

    from numpyro_sgbd import host_data

    X = np.empty((num_data, dim), np.float32)
    y = np.empty((num_data,), np.float32)
    start = 0
    for cx, cy in _data_chunks(num_data, dim, chunk):
        X[start : start + len(cx)], y[start : start + len(cy)] = cx, cy
        start += len(cx)
    return host_data(X, y)


def model(X, y, n=1000):
    import numpyro
    import numpyro.distributions as dist

    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=n) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def _peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _device_peak_bytes():
    """The accelerator's peak allocated bytes, or None on a CPU (where the
    resident memory above is the measure)."""
    import jax

    device = jax.local_devices()[0]
    if device.platform == "cpu":
        return None
    return (device.memory_stats() or {}).get("peak_bytes_in_use")


def one_device_count(args):
    """Run in a subprocess with args.devices simulated devices: ms per step."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from numpyro_sgbd import SGBD, SGLD, unroll_threefry_on_cpu

    # The package leaves JAX's threefry CPU lowering as JAX has it; the recorded
    # figures were timed with it unrolled (the same draws), so it opts in.
    unroll_threefry_on_cpu()
    k = jax.device_count()
    mesh = jax.make_mesh((k,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    X, y = simulate(
        args.num_data, args.dim, sharding=NamedSharding(mesh, PartitionSpec("data"))
    )
    out = {}
    for name, kernel in [
        ("SGLD vanilla", SGLD(model, step_size=1e-5, variant="vanilla")),
        ("SGBD corrected", SGBD(model, step_size=1e-5)),
    ]:
        state = kernel.init(jax.random.key(0), 0, None, (X, y), {})

        @jax.jit
        def run(state, X, y, kernel=kernel):
            return jax.lax.fori_loop(
                0, args.num_steps, lambda i, s: kernel.sample(s, (X, y), {}), state
            )

        jax.block_until_ready(run(state, X, y))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            jax.block_until_ready(run(state, X, y))
            times.append((time.perf_counter() - start) / args.num_steps)
        out[name] = sorted(times)[1]
    print("RESULT", k, out["SGLD vanilla"], out["SGBD corrected"], flush=True)
    peak = _device_peak_bytes()
    if peak is not None:
        data_bytes = X.nbytes + y.nbytes
        print(
            f"{jax.devices()[0].device_kind}: ms/step SGLD vanilla "
            f"{1e3 * out['SGLD vanilla']:.4f}, SGBD corrected "
            f"{1e3 * out['SGBD corrected']:.4f}; device peak {peak / 2**20:.0f} "
            f"MiB = {peak / data_bytes:.2f} x the data",
            flush=True,
        )


def steps(args):
    rows = {}
    for k in (1, 2, 4):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={k}"
        cmd = [sys.executable, __file__, "one", "--num-data", str(args.num_data)]
        cmd += ["--num-steps", str(args.num_steps)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
        if out.returncode or not line:
            raise RuntimeError(out.stdout[-2000:] + out.stderr[-4000:])
        _, _, sgld, sgbd = line[0].split()
        rows[k] = (float(sgld), float(sgbd))
    print(f"N={args.num_data} d={args.dim} n=1000, simulated CPU devices")
    print(f"{'devices':>8}{'SGLD ms':>10}{'SGBD ms':>10}{'SGLD /1':>9}{'SGBD /1':>9}")
    for k, (a, b) in rows.items():
        print(
            f"{k:>8}{1e3 * a:>10.3f}{1e3 * b:>10.3f}"
            f"{a / rows[1][0]:>9.2f}{b / rows[1][1]:>9.2f}"
        )


def laplace_sd(X, y, chunk=2_000_000):
    """The Laplace approximation's sds: Newton's method in float64 over the data
    in chunks (the mode to 1e-10), and the Hessian there."""
    import numpy as np

    N, d = X.shape
    w = np.zeros(d)
    for _ in range(30):
        g = w.copy()  # the N(0, 1) prior
        H = np.eye(d)
        for s in range(0, N, chunk):
            x = np.asarray(X[s : s + chunk], np.float64)
            t = np.asarray(y[s : s + chunk], np.float64)
            p = 1 / (1 + np.exp(-(x @ w)))
            g -= x.T @ (t - p)
            H += (x * (p * (1 - p))[:, None]).T @ x
        step = np.linalg.solve(H, g)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return np.sqrt(np.diag(np.linalg.inv(H)))


def large(args):
    import jax
    import numpy as np
    from numpyro.infer import MCMC

    from numpyro_sgbd import SGLD, unroll_threefry_on_cpu

    # The package leaves JAX's threefry CPU lowering as JAX has it; the recorded
    # figures were timed with it unrolled (the same draws), so it opts in.
    unroll_threefry_on_cpu()
    start = time.perf_counter()
    if args.host_data:
        X, y = simulate_on_host(args.num_data, args.dim)
        data_bytes = X.array.nbytes + y.array.nbytes
    else:
        X, y = simulate(args.num_data, args.dim)
        data_bytes = X.nbytes + y.nbytes
    generated = time.perf_counter()
    print(f"N={args.num_data} d={args.dim}: {data_bytes / 2**30:.2f} GiB of data")
    print(f"simulated in {generated - start:.1f} s, peak {_peak_mib():.0f} MiB")
    kernel = SGLD(model)
    mcmc = MCMC(
        kernel,
        num_warmup=args.num_warmup,
        num_samples=args.num_samples,
        progress_bar=False,
        jit_model_args=True,
    )
    mcmc.run(jax.random.key(0), X, y)
    draws = np.asarray(mcmc.get_samples()["w"], np.float64)
    sampled = time.perf_counter()
    info = kernel.adaptation_info
    print(
        f"MCMC.run {sampled - generated:.1f} s (mode search "
        f"{info['mode_seconds']:.1f} s, preconditioner "
        f"{info['preconditioner_seconds']:.1f} s), {args.num_warmup} + "
        f"{args.num_samples} steps"
    )
    peak, device_peak = _peak_mib(), _device_peak_bytes()
    sd_ref = laplace_sd(*((X.array, y.array) if args.host_data else (X, y)))
    sd = draws.std(0)
    xi = np.linalg.norm(sd - sd_ref) / np.linalg.norm(sd_ref)
    from numpyro.diagnostics import effective_sample_size

    ess = np.asarray(effective_sample_size(draws[None]))
    print(f"xi vs Laplace = {xi:.3f}; bulk ESS min {ess.min():.0f}")
    print(
        f"wall (simulate + MCMC.run) {sampled - start:.1f} s; peak resident "
        f"{peak:.0f} MiB = {peak * 2**20 / data_bytes:.2f} x the data"
    )
    if device_peak is not None:
        print(
            f"{jax.devices()[0].device_kind}: device peak "
            f"{device_peak / 2**20:.0f} MiB = {device_peak / data_bytes:.2f} x "
            "the data"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["steps", "large", "one"])
    parser.add_argument("--num-data", type=int, default=None)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--num-steps", type=int, default=2000)
    parser.add_argument("--num-warmup", type=int, default=5000)
    parser.add_argument("--num-samples", type=int, default=20000)
    parser.add_argument(
        "--host-data",
        action="store_true",
        help="large: keep the data on the host (numpyro_sgbd.host_data)",
    )
    args = parser.parse_args()
    if args.num_data is None:
        args.num_data = 100_000_000 if args.what == "large" else 10_000_000
    {"steps": steps, "large": large, "one": one_device_count}[args.what](args)
