"""Seconds per step and per epoch of SGLD on a Bayesian neural network: NumPyro's
model run by ``numpyro_sgbd.SGLD`` / a hand-written BlackJAX ``sgld`` (issue 62,
item 5; the floor is 1.2x, as for the GLMs in ``run.py`` section (b)).

    python benchmarks/network_step.py            # n = 600 and 6000 (about 4 minutes)
    python benchmarks/network_step.py --quick    # n = 600 only (about 2 minutes)
    python benchmarks/network_step.py --quick --defaults  # and the default paths

The network is the one the MAMBA paper tunes SGLD on (Coullon, South & Nemeth,
section 4.3 and Appendix C.3.1): 784-100-10, with a softmax as the hidden
layer's nonlinearity as the paper writes it, beta = softmax(softmax(x B + b) A +
a), N(0, 1) priors on every weight and bias (79,510 parameters), a categorical
likelihood, on the N = 60,000 training images of Fashion-MNIST (Debian's
``dataset-fashion-mnist``; pixels scaled to [0, 1]; random data of the same
shapes, said so in the output, where it is not installed), minibatches of 1 %
(n = 600) and 10 % (n = 6000), and the paper's SGLD step for n = 600,
h = 10^-5.5 (its Table 8, MAMBA; BlackJAX's step size, h = sigma^2 / 2 in
``numpyro_sgbd``'s sigma).

Ours: the model as a user writes it, the network from
``numpyro.contrib.module.random_flax_module`` (two ``flax.linen.Dense`` layers,
prior ``dist.Normal(0, 1)``), the data in ``numpyro.plate("data", N,
subsample_size=n)`` read through ``numpyro.subsample``, run by
``MCMC(SGLD(model, step_size=sigma, preconditioner="none"), num_warmup=0,
jit_model_args=True, progress_bar=False)``: a given step, so vanilla SGLD on plain
minibatch gradients, no mode search, no adaptation (the bare step, as ``run.py``
times it). BlackJAX: the same log prior and per-datum log likelihood in
``jax.numpy`` over a pytree (A, a, B, b), ``grad_estimator(logprior, loglik, N)``
and ``blackjax.sgld``, stepped by a jitted ``lax.scan`` that draws each step's
minibatch in the loop, as the GLMs' hand-written floor and BlackJAX step do
(``run.py`` section (b)) and as our kernel does inside its step, with
``numpyro_sgbd``'s own ``draw_indices`` and its default scheme
(``resolve_replace(None, N, n)``: with replacement at n <= N/100, without
above). A second BlackJAX timing takes the index arrays drawn once beforehand
instead ("rows given"): on XLA:CPU a loop whose gather reads indices drawn in the
same iteration costs 0.15-0.4 ms a step more at n = 600 than one reading them
from the scan's input, though the draw alone costs 5 microseconds (`/tmp`-scripted
variants: an unused draw beside given rows costs nothing; sorting the drawn rows
does not help), a cost every in-loop sampler pays and this column leaves out.
Both sides start from the same weights, keep every draw and take the data as
arguments of the compiled loop. A third timing, "scan", runs our kernel's
``sample`` in the same kind of ``lax.scan`` as BlackJAX's, without NumPyro's
driver: what ours / BlackJAX owes to the step itself and what to the run around
it (the driver's loop, and the run checks' record of each draw, which the kernel
keeps only under ``MCMC``).

Seconds per step are marginal, (T(6k) - T(k)) / 5k, each T the fastest of
``--repeats`` rounds (interference only adds time), an MCMC run's T less the
seconds JAX reports compiling in it (``MCMC.run`` compiles its loop on every
call); each round runs all three at both lengths, so the ratios' times
pass through the same slow spells of the machine. No clock runs inside a chain.
Seconds per epoch are seconds per step x N / n.
"""

import argparse
from functools import partial
import gc
import gzip
import os
import platform
import time

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.contrib.module import random_flax_module
import numpyro.distributions as dist
from numpyro.infer import MCMC
from run import Table, compile_seconds

from numpyro_sgbd import NOGIN, SGLD
from numpyro_sgbd.estimators import draw_indices, resolve_replace

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
HIDDEN, CLASSES = 100, 10


def _idx(path):
    """The array in a gzipped IDX file (the MNIST format: a big-endian header of
    the element type and the dimensions, then the elements)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(
        int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)
    )
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_data(folder, num_data):
    """Fashion-MNIST's training images as float32 rows in [0, 1] and its labels as
    int32; random data of the same shapes where ``folder`` lacks them. Returns
    ``(X, y, description)``."""
    images = os.path.join(folder, "train-images-idx3-ubyte.gz")
    labels = os.path.join(folder, "train-labels-idx1-ubyte.gz")
    if os.path.exists(images) and os.path.exists(labels):
        X = _idx(images).reshape(-1, 28 * 28)[:num_data].astype(np.float32) / 255.0
        y = _idx(labels)[:num_data].astype(np.int32)
        return X, y, f"Fashion-MNIST ({folder})"
    print(
        f"{images} not found (apt-get install dataset-fashion-mnist): "
        "timing on random data of the same shapes instead"
    )
    rng = np.random.default_rng(0)
    X = rng.random((num_data, 28 * 28), dtype=np.float32)
    y = rng.integers(0, CLASSES, num_data).astype(np.int32)
    return X, y, "random data in Fashion-MNIST's shapes"


def _network():
    import flax.linen as linen

    class PaperNet(linen.Module):
        """x -> softmax(softmax(x B + b) A + a), the softmax of the output left to
        the categorical likelihood (logits)."""

        @linen.compact
        def __call__(self, x):
            hidden = jax.nn.softmax(linen.Dense(HIDDEN, name="hidden")(x))
            return linen.Dense(CLASSES, name="output")(hidden)

    return PaperNet()


def model(X, y, subsample_size):
    """The network as a NumPyro model: N(0, 1) on every weight, categorical labels."""
    net = random_flax_module(
        "net", _network(), dist.Normal(0.0, 1.0), input_shape=(1, X.shape[1])
    )
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size):
        x = numpyro.subsample(X, event_dim=1)
        numpyro.sample(
            "y", dist.Categorical(logits=net(x)), obs=numpyro.subsample(y, event_dim=0)
        )


def initial_weights(dim, seed=0):
    """N(0, 1) weights: the model's sites and the same values as BlackJAX's pytree."""
    kA, ka, kB, kb = random.split(random.key(seed), 4)
    params = {
        "A": random.normal(kA, (HIDDEN, CLASSES)),
        "a": random.normal(ka, (CLASSES,)),
        "B": random.normal(kB, (dim, HIDDEN)),
        "b": random.normal(kb, (HIDDEN,)),
    }
    sites = {
        "net/output.kernel": params["A"],
        "net/output.bias": params["a"],
        "net/hidden.kernel": params["B"],
        "net/hidden.bias": params["b"],
    }
    return params, sites


def logprior(params):
    return sum(jnp.sum(jax.scipy.stats.norm.logpdf(p)) for p in jax.tree.leaves(params))


def loglik(params, datum):
    """log p(y | x, params) of one image (BlackJAX's estimator maps it over the
    minibatch)."""
    x, y = datum
    hidden = jax.nn.softmax(x @ params["B"] + params["b"])
    return jax.nn.log_softmax(hidden @ params["A"] + params["a"])[y]


def index_arrays(N, n, num_steps, seed=1):
    """(num_steps, n) minibatch indices, drawn as the kernel draws them."""
    replace = resolve_replace(None, N, n)
    keys = random.split(random.key(seed), num_steps)
    draw = jax.jit(jax.vmap(lambda k: draw_indices(k, N, n, replace=replace)))
    return jax.block_until_ready(draw(keys)), replace


def blackjax_run(N, h, n=None, replace=None):
    """A jitted ``run(params, X, y, idx)``: BlackJAX's sgld over a minibatch a
    step, every draw kept: the rows ``idx[t]`` at step t, or, with ``n``, rows
    drawn in the loop by ``draw_indices`` (``idx`` then only gives the number of
    steps, its first axis)."""
    import blackjax
    from blackjax.sgmcmc.gradients import grad_estimator

    sgld = blackjax.sgld(grad_estimator(logprior, loglik, N))

    @jax.jit
    def run(params, X, y, idx):
        def step(params, xs):
            key, rows = xs
            if n is not None:
                key, key_rows = random.split(key)
                rows = draw_indices(key_rows, N, n, replace=replace)
            params = sgld.step(key, params, (X[rows], y[rows]), h)
            return params, params

        keys = random.split(random.key(2), idx.shape[0])
        return jax.lax.scan(step, params, (keys, idx))

    return run


def _timed(fn):
    """Seconds of ``fn()`` less the seconds JAX spent compiling in it, the garbage
    collector paused."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        with compile_seconds() as compiling:
            jax.block_until_ready(fn())
        return time.perf_counter() - start - compiling[0]
    finally:
        gc.enable()


def kernel_scan(kernel, X, y, sites):
    """``run(steps)``: ``steps`` of our kernel's ``sample`` in a jitted ``lax.scan``
    that keeps every draw, the loop BlackJAX's step gets (NumPyro's driver left
    out); compiled once per length."""

    @partial(jax.jit, static_argnums=3)
    def scan(state, X, y, steps):
        def step(state, _):
            state = kernel.sample(state, (X, y), {})
            return state, state.z

        return jax.lax.scan(step, state, None, length=steps)

    state = kernel.init(random.key(0), 0, sites, (X, y), {})
    return lambda steps: scan(state, X, y, steps)


def marginal(sides, k, repeats):
    """``{side: (T(6k) - T(k)) / 5k}``, each T the fastest of ``repeats`` rounds
    in which every side runs both lengths in turn (``sides``: ``{name:
    run(steps)}``, compiled beforehand)."""
    best = {(side, s): float("inf") for side in sides for s in (k, 6 * k)}
    for _ in range(repeats):
        for steps in (k, 6 * k):
            for side, run in sides.items():
                best[side, steps] = min(best[side, steps], _timed(lambda: run(steps)))
    jax.clear_caches()
    return {side: (best[side, 6 * k] - best[side, k]) / (5 * k) for side in sides}


def paired_seconds(X, y, n, h, k, repeats):
    """Marginal seconds per step, (T(6k) - T(k)) / 5k, of: our ``MCMC`` run, our
    kernel's ``sample`` in a scan and BlackJAX's sgld in a scan, drawing its rows
    in the loop (``"bj"``) or given them (``"bj_given"``), their runs
    alternating round by round. Returns a dict by side."""
    N = X.shape[0]
    params, sites = initial_weights(X.shape[1])
    idx, replace = index_arrays(N, n, 6 * k)
    sigma = float(np.sqrt(2 * h))
    kernel = SGLD(
        partial(model, subsample_size=n), step_size=sigma, preconditioner="none"
    )
    bj = blackjax_run(N, h, n, replace)
    bj_given = blackjax_run(N, h)

    def ours(steps):
        mcmc = MCMC(
            kernel,
            num_warmup=0,
            num_samples=steps,
            progress_bar=False,
            jit_model_args=True,
        )
        mcmc.run(random.key(0), X, y, init_params=sites)
        return mcmc.get_samples()

    sides = {
        "ours": ours,
        "scan": kernel_scan(kernel, X, y, sites),
        "bj": lambda steps: bj(params, X, y, idx[:steps]),
        "bj_given": lambda steps: bj_given(params, X, y, idx[:steps]),
    }
    for steps in (k, 6 * k):  # compile the scans outside the timed calls
        for side in ("scan", "bj", "bj_given"):
            jax.block_until_ready(sides[side](steps))
    return marginal(sides, k, repeats)


#: The default paths ``--defaults`` times, as ``(label, kernel class, options)``.
DEFAULT_PATHS = (
    ("SGLD(model)", SGLD, {}),
    ("vanilla", SGLD, {"variant": "vanilla"}),
    ("minibatch", SGLD, {"gradient": "minibatch"}),
    ("vanilla, minibatch", SGLD, {"variant": "vanilla", "gradient": "minibatch"}),
    ("NOGIN(model)", NOGIN, {}),
)


def default_seconds(X, y, n, k, repeats):
    """Marginal seconds per step, (T(6k) - T(k)) / 5k, of each default path of
    :data:`DEFAULT_PATHS` and of the bare given step (``"bare"``), each kernel's
    ``sample`` in a scan after its set-up (the default's Adam fit and Fisher
    diagonal, and control variates' centre: paid once, in ``init``, not timed)."""
    _, sites = initial_weights(X.shape[1])
    kernels = {
        "bare": SGLD(
            partial(model, subsample_size=n), step_size=1e-3, preconditioner="none"
        )
    }
    for label, cls, options in DEFAULT_PATHS:
        kernels[label] = cls(partial(model, subsample_size=n), **options)
    sides = {
        label: kernel_scan(kernel, X, y, sites) for label, kernel in kernels.items()
    }
    for steps in (k, 6 * k):
        for run in sides.values():
            jax.block_until_ready(run(steps))
    return marginal(sides, k, repeats)


def defaults_table(table, X, y, args):
    """The ``--defaults`` section: ms per step of the default paths at n = 600,
    and each over the bare step."""
    n, k = 600, args.defaults_steps
    times = default_seconds(X, y, n, k, args.repeats)
    table.section(
        f"Default paths at n = {n}, ms per step (kernel's sample in a scan, k = {k}, "
        f"fastest of {args.repeats}), and over the bare given step (vanilla, "
        "minibatch, no preconditioner)",
        ["path", "ms/step", "/ bare"],
    )
    for label, seconds in times.items():
        table.row(label, 1e3 * seconds, seconds / times["bare"])


def main(args):
    if args.quick:
        args.subsample_sizes, args.timed_seconds = [600], 1.0
    started = time.perf_counter()
    X, y, source = load_data(args.data, args.num_data)
    N = X.shape[0]
    print(
        f"numpyro-sgbd network step: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, jax {jax.__version__}, numpyro "
        f"{numpyro.__version__}, backend {jax.default_backend()}"
        + (" (--quick)" if args.quick else "")
    )
    print(
        f"784-{HIDDEN}-{CLASSES} softmax network, N = {N:,} rows of {source}, "
        f"h = {args.step_size:.3g} (sigma = {np.sqrt(2 * args.step_size):.3g})"
    )
    X, y = jnp.asarray(X), jnp.asarray(y)
    table = Table()
    table.section(
        f"SGLD, ms per step and s per epoch (N/n steps), fastest of {args.repeats} "
        "alternating rounds; 'scan': our kernel's sample in a lax.scan",
        [
            "n",
            "ours ms/step",
            "scan ms/step",
            "BlackJAX ms",
            "rows given ms",
            "ours s/epoch",
            "BlackJAX s/ep",
            "ours / BlackJAX",
            "scan / BlackJAX",
            "scan / given",
        ],
    )
    for n in args.subsample_sizes:
        # k from a probe of BlackJAX's step: 5k steps last about --timed-seconds.
        probe_idx, replace = index_arrays(N, n, 6)
        probe = blackjax_run(N, args.step_size)
        params, _ = initial_weights(X.shape[1])
        jax.block_until_ready(probe(params, X, y, probe_idx))
        t = _timed(lambda: probe(params, X, y, probe_idx)) / 6
        k = max(args.num_steps, int(args.timed_seconds / t / 5))
        times = paired_seconds(X, y, n, args.step_size, k, args.repeats)
        ours, scan, bj = times["ours"], times["scan"], times["bj"]
        epoch = N / n
        table.row(
            f"{n} ({'with' if replace else 'w/o'} repl., k={k})",
            1e3 * ours,
            1e3 * scan,
            1e3 * bj,
            1e3 * times["bj_given"],
            ours * epoch,
            bj * epoch,
            ours / bj,
            scan / bj,
            scan / times["bj_given"],
        )
    if args.defaults:
        defaults_table(table, X, y, args)
    print(f"\n{(time.perf_counter() - started) / 60:.1f} minutes")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="n = 600 only, shorter runs"
    )
    parser.add_argument("--data", default=FASHION_MNIST, help="folder of the IDX files")
    parser.add_argument("--num-data", type=int, default=60_000)
    parser.add_argument("--subsample-sizes", type=int, nargs="+", default=[600, 6000])
    parser.add_argument(
        "--step-size",
        type=float,
        default=10**-5.5,
        help="h, BlackJAX's SGLD step size (numpyro_sgbd's sigma = sqrt(2 h))",
    )
    parser.add_argument(
        "--num-steps", type=int, default=10, help="the least k (runs of k and 6k steps)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="also time the default paths (SGLD(model) and its parts, NOGIN(model))",
    )
    parser.add_argument(
        "--defaults-steps", type=int, default=40, help="k of the default paths' runs"
    )
    parser.add_argument(
        "--timed-seconds",
        type=float,
        default=2.0,
        help="about how long the timed difference of two runs lasts",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
