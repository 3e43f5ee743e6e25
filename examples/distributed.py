"""Sampling with the data split over two processes joined by ``jax.distributed``.

Logistic regression on scikit-learn's breast-cancer data (569 tumours, 30
standardised features; shipped with scikit-learn, no download). The script starts
itself three times on this machine:

* once as a single process with 2 simulated CPU devices, the rows sharded over
  them (:func:`numpyro_sgbd.shard_data`);
* twice as processes 0 and 1 of a ``jax.distributed`` run over gloo on
  localhost, 1 device each, each holding only its half of the rows.

Every process runs the same sampling code; the script then checks that the
two-process draws are the one-process draws, as the two runs use the same key::

    python examples/distributed.py

To run on several hosts, start ``python examples/distributed.py worker I P ADDR``
on each (I its index, P the number of processes, ADDR ``host:port`` of process
0); each loads its own rows. See the "Big data" page of the docs.
"""

import os
import socket
import subprocess
import sys
import tempfile

import numpy as np


def load_rows(process_id, num_processes):
    """This process's rows: the data standardised, an even number of rows
    (568; the last tumour is dropped so that the rows split in two)."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = ((X - X.mean(0)) / X.std(0)).astype(np.float32)[:568]
    y = y.astype(np.float32)[:568]
    rows = np.array_split(np.arange(len(y)), num_processes)[process_id]
    return X[rows], y[rows]


def worker(process_id, num_processes, address, out):
    """One process of the run (or the whole one-process run, num_processes=1)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=num_processes,
            process_id=process_id,
        )
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    from numpyro_sgbd import SGLD, shard_data

    def model(X, y, n=100):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0, 5))
        with numpyro.plate("data", X.shape[0], subsample_size=n) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w + b), obs=y[idx])

    X, y = shard_data(*load_rows(process_id, num_processes))
    mcmc = MCMC(
        SGLD(model),
        num_warmup=1000,
        num_samples=2000,
        progress_bar=False,
        jit_model_args=True,
    )
    mcmc.run(jax.random.key(0), X, y)
    draws = mcmc.get_samples()
    np.savez(out, **{k: np.asarray(v) for k, v in draws.items()})
    print(
        f"process {process_id}/{num_processes} on {jax.device_count()} devices: "
        f"b = {float(draws['b'].mean()):.3f} +- {float(draws['b'].std()):.3f}",
        flush=True,
    )


def _start(args, devices):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    cmd = [sys.executable, os.path.abspath(__file__), "worker", *map(str, args)]
    return subprocess.Popen(cmd, env=env)


def main():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        one = os.path.join(tmp, "one.npz")
        two = [os.path.join(tmp, f"p{i}.npz") for i in range(2)]
        procs = [_start([0, 1, "-", one], devices=2)]
        procs += [_start([i, 2, f"localhost:{port}", two[i]], 1) for i in range(2)]
        if any(p.wait() for p in procs):
            sys.exit("a process failed; see its output above")
        ref = np.load(one)
        for path in two:
            got = np.load(path)
            for name in ref.files:
                gap = np.max(np.abs(got[name] - ref[name]))
                np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-4)
                print(f"{os.path.basename(path)} {name}: largest gap {gap:.1e}")
    print("The two-process draws are the one-process draws.")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        pid, nproc, address, out = sys.argv[2:6]
        worker(int(pid), int(nproc), address, out)
    else:
        main()
