"""
Example: calibration of a Bayesian neural network, tuned three ways (Table 3)
=============================================================================

The tuning paper's neural-network experiment (Coullon, South & Nemeth, Section
4.3, Table 3, Tables 8-9, Appendix C.3) with this package's samplers, on
**Fashion-MNIST** (Xiao, Rasul & Vollgraf 2017), not the paper's MNIST: MNIST
is not shipped by any package installable here, and Fashion-MNIST has the same
format (28 x 28 grey images, 60,000 for training, 10,000 for testing, ten
classes) and is read from Debian's ``dataset-fashion-mnist``
(``/usr/share/datasets/fashion-mnist``; nothing is downloaded). It is the
harder data set: this network's MAP fit is 82-84 % accurate on it, against the
paper's 93 % on MNIST, and a less accurate classifier has more room to be
miscalibrated (its confidences spread over more bins, each of which can miss),
so our calibration errors need not match the paper's numbers.

**Model** (paper, Appendix C.3.1): the class probabilities of an image x are
``softmax(softmax(x B + b) A + a)``, B 784 x 100, b 100, A 100 x 10, a 10
(79,510 weights), N(0, 1) priors on every weight, pixels scaled to [0, 1].
The softmax in the hidden layer is the paper's formula, kept as written. The
network is a ``flax.linen`` module turned into latent sites by
``numpyro.contrib.module.random_flax_module``; the images sit in
``numpyro.plate("data", N, subsample_size=n)``.

**Rows** (one cell per row and column; columns SGLD, SGLD-CV, SGHMC,
SGHMC-CV, SGNHT, SGNHT-CV; "-CV" is ``gradient="control_variates"`` centred at
the MAP fit):

- ``MAMBA-KSD`` and ``MAMBA-FSSD``: :func:`numpyro_sgbd.tune` with
  ``metric="ksd"`` or ``"fssd"``, one call per cell (``--mamba-columns``;
  by default every column for KSD and the SGLD column for FSSD: each cell
  costs about two minutes), subsample sizes 1 % and 10 % of N (tune takes
  sizes below N, so the paper's 100 % is left out) and six step sizes,
  sqrt(h) for h = 1, 0.1, ..., 1e-5. tune runs its arms in the whitened
  coordinates u of its own set-up (for a network, an Adam fit and a
  diagonal Fisher preconditioner; tune refuses ``preconditioner="none"``),
  so the grid is every other of the paper's twelve half-decades of h
  (Appendix C.3.3) moved to u, where the posterior has unit scale, starting
  at a step of 1. The arms are the
  samplers' vanilla variants (``functools.partial(SGLD, variant="vanilla")``:
  the paper's samplers estimate no gradient noise). ``--tune-budget`` is wall
  time from the call to the result, set-up, compiling and scoring included
  (100 s, of which those took about 65 s on 2 cores; the paper's R = 10 s is
  the winner's own sampling time, about a twelfth of the sampling in two
  rounds of 12 arms). tune records every step
  (``--tune-thinning 1``; the paper thinned by 10) and scores 30 draws an arm,
  to keep its minimum budget within minutes on 2 cores. Where tune refuses a
  budget as too small, it is tried again with the budget tune names if that
  is at most ``--tune-max-budget``, and otherwise with the 1 % size alone
  (the paper's MAMBA chose 1 % for every sampler, Table 8); a cell whose last
  try is refused holds tune's message, and ``tune_sizes`` in the csv says
  which sizes the winner was chosen from. The winner runs as ``result.kernel``
  (tune's set-up, with the winning step and size) from tune's own Adam fit
  (``kernel.setup.mode``), not from the example's MAP: its diagonal
  preconditioner and control variates' centre belong to the mode tune fitted,
  and another fit is another mode (the hidden units permuted), where those
  scales are wrong. Started at the example's MAP, the SGLD winner's chains
  left the fit (accuracy 25 % and 10 %); from a draw around tune's fit (the
  kernel's default start), 78 %; the quick run's winner, at 3,000 images,
  fell to 10-34 % from such a draw and kept 45-47 % from the fit itself.
- ``Grid``: the paper's grid search (Appendix C.3.2): from the MAP plus N(0, 1)
  noise, ``--grid-steps`` iterations (100; the paper's 1,000 at its 12 values
  would take hours here) at 10 % batches for each log10 h of
  ``--grid-log10-h``, scored by the IMQ kernel Stein discrepancy
  (:func:`numpyro_sgbd.ksd`) of ``--ksd-draws`` equally spaced draws, their
  scores the potential's gradient on a fixed ``--ksd-rows`` rows scaled by
  N / rows (the paper's stochastic KSD, Appendix B.2); the lowest wins.
- ``Heuristic``: h = 1/N (log10 h = -4.8 for N = 60,000; Brosse et al. 2018,
  the paper's Section 4) at 10 % batches.
- Beyond the paper: each sampler's default, with no options at all
  (``SGLD(model)``, ``SGHMC(model)``, ``SGBD(model)``, ``NOGIN(model)``,
  ``PSGLD(model)``, ``CyclicalSGLD(model)``; declared n = 1 %), which adapts
  itself (for a network: its own Adam fit, a diagonal Fisher preconditioner,
  control variates, the corrected variant, the step in warmup), for
  ``--default-steps`` steps (400 in the full run, a quarter of them warmup: a
  default SGLD step costs about 46 ms at n = 600 here, ten times a vanilla
  step on plain minibatches, most of it the corrected variant's noise sd from
  32 per-datum gradients); ``MAP``, the single Adam fit every
  paper row starts from; and ``Ensemble``, a deep ensemble of
  ``--ensemble-size`` MAP fits from different seeds (Lakshminarayanan et al.
  2017), its predictive the mean of their softmax probabilities. A cell whose
  kernel raises holds the error instead of numbers.

**The paper's samplers in ours.** The paper's SGLD, theta <- theta - (h/2)
grad U + sqrt(h) xi, is :class:`~numpyro_sgbd.SGLD` with ``step_size`` sqrt(h).
Its SGHMC (Appendix D.1, friction alpha = 0.01, no noise estimate) and SGNHT
(Appendix D.2, a = 0.01) move a velocity v = epsilon p; with v so, our
:class:`~numpyro_sgbd.SGHMC` and :class:`~numpyro_sgbd.SGNHT` are theirs for
``step_size`` epsilon = sqrt(h), ``friction`` C = alpha / epsilon and
``diffusion`` A = a / epsilon (vanilla variants, ``preconditioner="none"``).
The paper's SGHMC also has L, the leapfrog steps between momentum refreshes;
ours never refreshes the momentum, so L would only thin the chain, and every
chain here is thinned alike. In tune's arms the friction and diffusion are the
samplers' defaults (1 in u): tune sets one step per arm and cannot tie the
friction to it.

**Each run** (every sampled cell): ``--num-chains`` vectorised chains (different
keys; the paper's cells start from the MAP, and so do ours, except the defaults
and MAMBA's winners, which start from their own fits), ``--passes`` passes over
the training data (ceil(passes N / n) steps, so a 10 % batch takes a tenth of
the steps of a 1 % one: the wall-clock-free stand-in for the paper's equal 300
s, which was over a thousand passes), the first
quarter dropped as burn-in, the rest thinned to ``--num-draws`` draws a chain.
The posterior predictive of a chain is the mean of the draws' softmax
probabilities on the test images; from it:

- ``ECE`` and ``MCE`` (Guo et al. 2017), in %: the test images binned by the
  predictive's largest probability (the confidence) into **10 equal-width
  bins** of [0, 1]; ECE is the bins' mean |accuracy - confidence| weighted by
  their share of the images, MCE the largest over non-empty bins;
- ``accuracy`` (%) and ``log_lik``, the mean log predictive probability of the
  true label.

Each number is the mean ± sd over the chains (over ``--num-chains`` ensembles
or MAP fits for those rows). The paper's MNIST numbers stand beside ours.

Usage::

    # The full run: N = 60,000, every column, 2 chains a cell (the gallery
    # page gives its time on 2 cores).
    python examples/bnn_calibration.py --out out
    # 3,000 training and 1,000 test images, the SGLD column, one default and
    # small budgets: every code path, in about 2 minutes on 2 cores (tune's
    # set-up and compiling are most of it).
    python examples/bnn_calibration.py --quick --out /tmp/bnn

It prints the table and writes ``bnn_calibration.md`` (the table),
``bnn_calibration.csv`` (one line per cell and chain) and
``bnn_calibration.png`` (reliability diagrams and ECE) to ``--out``.

**References**

1. Coullon, J., South, L. & Nemeth, C. (2023). *Efficient and generalizable
   tuning strategies for stochastic gradient MCMC.* Statistics and Computing.
   Section 4.3, Tables 3, 8 and 9, Appendices B.2, C.3 and D.
2. Guo, C., Pleiss, G., Sun, Y. & Weinberger, K. Q. (2017). *On calibration of
   modern neural networks.* ICML.
3. Lakshminarayanan, B., Pritzel, A. & Blundell, C. (2017). *Simple and
   scalable predictive uncertainty estimation using deep ensembles.* NeurIPS.
4. Brosse, N., Durmus, A. & Moulines, E. (2018). *The promises and pitfalls of
   stochastic gradient Langevin dynamics.* NeurIPS.
5. Xiao, H., Rasul, K. & Vollgraf, R. (2017). *Fashion-MNIST: a novel image
   dataset for benchmarking machine learning algorithms.* arXiv:1708.07747.
"""

import argparse
import functools
import gzip
import math
from pathlib import Path
import re
import sys
import time
import warnings

import flax.linen as nn
import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.contrib.module import random_flax_module
import numpyro.distributions as dist
from numpyro.infer import MCMC
from numpyro.infer.util import log_density
import optax
import pandas as pd

import numpyro_sgbd
from numpyro_sgbd import NOGIN, PSGLD, SGBD, SGHMC, SGLD, SGNHT, CyclicalSGLD, tune

DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
HIDDEN, CLASSES = 100, 10
SAMPLERS = {"SGLD": SGLD, "SGHMC": SGHMC, "SGNHT": SGNHT}
#: The paper's columns: (sampler, gradient estimator).
COLUMNS = {
    "SGLD": ("SGLD", "minibatch"),
    "SGLD-CV": ("SGLD", "control_variates"),
    "SGHMC": ("SGHMC", "minibatch"),
    "SGHMC-CV": ("SGHMC", "control_variates"),
    "SGNHT": ("SGNHT", "minibatch"),
    "SGNHT-CV": ("SGNHT", "control_variates"),
}
QUICK_COLUMNS = ("SGLD",)
DEFAULTS = {
    "SGLD": SGLD,
    "SGHMC": SGHMC,
    "SGBD": SGBD,
    "NOGIN": NOGIN,
    "PSGLD": PSGLD,
    "CyclicalSGLD": CyclicalSGLD,
}
QUICK_DEFAULTS = ("SGLD",)
#: The paper's SGHMC friction alpha and SGNHT diffusion a (Appendix D).
PAPER_ALPHA = 0.01
#: Table 3 (ECE, MCE in %) and Table 9 (test accuracy in %), MNIST, by row and
#: column; the paper has no FSSD row for this model.
PAPER = {
    "MAMBA-KSD": {
        "SGLD": (1.04, 36.4, 93.1),
        "SGLD-CV": (0.9, 15.7, 93.1),
        "SGHMC": (0.7, 47.1, 93.0),
        "SGHMC-CV": (0.7, 21.3, 93.1),
        "SGNHT": (9.3, 45.7, 94.0),
        "SGNHT-CV": (0.9, 27.4, 93.1),
    },
    "Grid": {
        "SGLD": (14.6, 42.1, 93.8),
        "SGLD-CV": (8.8, 40.7, 94.2),
        "SGHMC": (20.1, 65.5, 92.5),
        "SGHMC-CV": (25.1, 55.2, 82.9),
        "SGNHT": (5.4, 42.2, 95.1),
        "SGNHT-CV": (7.7, 42.3, 94.6),
    },
    "Heuristic": {
        "SGLD": (0.8, 23.3, 93.3),
        "SGLD-CV": (0.7, 22.0, 93.2),
        "SGHMC": (50.9, 71.6, 91.7),
        "SGHMC-CV": (40.8, 74.8, 90.1),
        "SGNHT": (6.2, 43.2, 95.2),
        "SGNHT-CV": (7.0, 51.5, 95.0),
    },
}
#: Table 8: the paper's chosen log10 h and batch (% of N).
PAPER_SETTINGS = {
    "MAMBA-KSD": {c: (h, 1) for c, h in zip(COLUMNS, (-5.5, -5.5, -6.5, -6, -5, -7.5))},
    "Grid": {c: (h, 10) for c, h in zip(COLUMNS, (-3.5, -3.5, -5, -5, -5, -4.5))},
    "Heuristic": {c: (-4.8, 10) for c in COLUMNS},
}
#: tune's step sizes in u: sqrt(h) for h in whole decades from 1 to 1e-5 (every
#: other of the paper's twelve half-decades, moved to u).
TUNE_STEPS = tuple(10.0 ** (-k / 4) for k in range(0, 12, 2))
QUICK_TUNE_STEPS = (0.1, 0.01)
NUM_BINS = 10


# ------------------------------------------------------------------ the data
def read_idx(path):
    """An IDX file (gzip) as a numpy array of its declared shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = np.frombuffer(raw, ">u4", count=ndim, offset=4)
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist(num_train, num_test, seed):
    """``(X, y, X_test, y_test)``: flattened images in [0, 1] (float32) and
    integer labels; a seeded random subset where fewer rows are asked for."""
    files = {
        part: (
            DATA_DIR / f"{prefix}-images-idx3-ubyte.gz",
            DATA_DIR / f"{prefix}-labels-idx1-ubyte.gz",
        )
        for part, prefix in (("train", "train"), ("test", "t10k"))
    }
    missing = [str(p) for pair in files.values() for p in pair if not p.exists()]
    if missing:
        sys.exit(
            f"Fashion-MNIST not found ({', '.join(missing)}). Install it with\n"
            "    apt-get install dataset-fashion-mnist\n"
            f"(Debian's package; it puts the IDX files in {DATA_DIR})."
        )
    rng = np.random.default_rng(seed)
    out = []
    for part, size in (("train", num_train), ("test", num_test)):
        images, labels = (read_idx(p) for p in files[part])
        X = images.reshape(len(images), -1).astype(np.float32) / 255.0
        y = labels.astype(np.int32)
        if size < len(y):
            keep = np.sort(rng.choice(len(y), size, replace=False))
            X, y = X[keep], y[keep]
        out += [X, y]
    return tuple(out)


# ----------------------------------------------------------------- the model
class MLP(nn.Module):
    """784-100-10 with a softmax hidden layer: the logits of the paper's beta."""

    @nn.compact
    def __call__(self, x):
        hidden = jax.nn.softmax(nn.Dense(HIDDEN, name="hidden")(x))
        return nn.Dense(CLASSES, name="out")(hidden)


def model(X, y=None, subsample_size=None):
    """Categorical likelihood on the network's logits, N(0, 1) on every weight."""
    net = random_flax_module(
        "net", MLP(), dist.Normal(0.0, 1.0), input_shape=(1, X.shape[1])
    )
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size):
        x = numpyro.subsample(X, event_dim=1)
        labels = None if y is None else numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Categorical(logits=net(x)), obs=labels)


def weight_shapes(X):
    """``{site: shape}`` of the network's latent sites."""
    trace = handlers.trace(handlers.seed(model, 0)).get_trace(X[:2])
    return {
        k: v["value"].shape
        for k, v in trace.items()
        if v["type"] == "sample" and k.startswith("net/")
    }


def potential_on(params, X, y, idx):
    """The potential with the plate's rows fixed to ``idx`` (scaled by N / |idx|
    by the plate itself): a minibatch estimate, or a fixed-subset one."""
    fixed = handlers.substitute(handlers.seed(model, 0), data={"data": idx})
    lp, _ = log_density(fixed, (X, y), {"subsample_size": idx.shape[0]}, params)
    return -lp


def logits(params, X):
    """The network's logits on ``X`` through the model's own code."""
    fixed = handlers.substitute(handlers.seed(model, 0), data=params)
    return handlers.trace(fixed).get_trace(X)["y"]["fn"].logits


@jax.jit
def mean_probs(draws, X):
    """The posterior predictive: softmax probabilities averaged over ``draws``
    (a dict of sites with a leading draw axis)."""
    probs = jax.lax.map(lambda p: jax.nn.softmax(logits(p, X)), draws)
    return probs.mean(0)


# ------------------------------------------------------------- the MAP fits
@functools.partial(jax.jit, static_argnames=("steps", "batch_size"))
def _adam(rng_key, start, X, y, *, steps, batch_size, learning_rate):
    """Adam on minibatch potentials, the learning rate decayed by a cosine."""
    optimiser = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

    def step(carry, key):
        params, state = carry
        idx = random.randint(key, (batch_size,), 0, X.shape[0])
        grads = jax.grad(potential_on)(params, X, y, idx)
        updates, state = optimiser.update(grads, state)
        return (optax.apply_updates(params, updates), state), None

    keys = random.split(rng_key, steps)
    (params, _), _ = jax.lax.scan(step, (start, optimiser.init(start)), keys)
    return params


def map_fit(rng_key, X, y, shapes, args):
    """A MAP fit: ``args.map_steps`` Adam steps from a prior draw shrunk by 10
    (a network at all-zero weights is a saddle)."""
    k_start, k_fit = random.split(rng_key)
    keys = random.split(k_start, len(shapes))
    start = {
        name: 0.1 * random.normal(key, shape)
        for key, (name, shape) in zip(keys, sorted(shapes.items()))
    }
    return _adam(
        k_fit,
        start,
        X,
        y,
        steps=args.map_steps,
        batch_size=args.map_batch,
        learning_rate=args.map_learning_rate,
    )


# ----------------------------------------------------------------- metrics
def calibration(probs, labels, num_bins=NUM_BINS):
    """ECE and MCE (in %, Guo et al. 2017: equal-width bins of the largest
    probability), accuracy (%), mean log probability of the true label, and the
    bins' ``(confidence, accuracy, count)`` for the reliability diagram."""
    probs = np.asarray(probs, np.float64)
    confidence = probs.max(1)
    correct = probs.argmax(1) == labels
    which = np.minimum((confidence * num_bins).astype(int), num_bins - 1)
    count = np.bincount(which, minlength=num_bins)
    conf_sum = np.bincount(which, confidence, minlength=num_bins)
    acc_sum = np.bincount(which, correct, minlength=num_bins)
    seen = count > 0
    gap = np.abs(acc_sum[seen] - conf_sum[seen]) / count[seen]
    true_p = np.clip(probs[np.arange(len(labels)), labels], 1e-300, None)
    return dict(
        ece=100 * float(np.sum(count[seen] * gap) / len(labels)),
        mce=100 * float(gap.max()),
        accuracy=100 * float(correct.mean()),
        log_lik=float(np.mean(np.log(true_p))),
        bins=(conf_sum, acc_sum, count),
    )


def flat(draws):
    """Draws ``{site: (m, ...)}`` as one (m, d) array, sites in sorted order."""
    m = next(iter(draws.values())).shape[0]
    return jnp.concatenate([draws[k].reshape(m, -1) for k in sorted(draws)], 1)


@jax.jit
def _scores(draws, X, y, rows):
    """grad log pi at each draw, estimated on the fixed ``rows``."""
    return jax.lax.map(lambda p: jax.grad(potential_on)(p, X, y, rows), draws)


def stochastic_ksd(draws, X, y, rows):
    """IMQ KSD (:func:`numpyro_sgbd.ksd`) of ``draws``, each draw's score the
    log density's gradient on the fixed ``rows``, scaled by N / len(rows)."""
    scores = jax.tree.map(lambda g: -g, _scores(draws, X, y, rows))
    value = float(numpyro_sgbd.ksd(np.asarray(flat(draws)), np.asarray(flat(scores))))
    return value if np.isfinite(value) else math.inf


# ------------------------------------------------------------------- kernels
def paper_kernel(column, log10_h, n, centre):
    """The column's sampler with the paper's parameterisation (see the module
    docstring): step sqrt(h), SGHMC friction alpha / sqrt(h), SGNHT diffusion
    a / sqrt(h), no preconditioner, vanilla; control variates at ``centre``."""
    sampler, gradient = COLUMNS[column]
    eps = math.sqrt(10.0**log10_h)
    options = dict(
        step_size=eps, preconditioner="none", gradient=gradient, variant="vanilla"
    )
    if gradient == "control_variates":
        options["centre"] = centre
    if sampler == "SGHMC":
        options["friction"] = PAPER_ALPHA / eps
    elif sampler == "SGNHT":
        options["diffusion"] = PAPER_ALPHA / eps
    return SAMPLERS[sampler](functools.partial(model, subsample_size=n), **options)


def run_chains(kernel, data, args, rng_key, *, steps, init=None, chains=None):
    """Run ``chains`` vectorised chains of ``steps`` SG steps, a quarter dropped
    as burn-in (warmup: adaptation for a default kernel), the rest thinned to
    ``args.num_draws``. Returns ``(draws, mcmc)``, the network's draws by site
    with a leading chain axis."""
    chains = args.num_chains if chains is None else chains
    burn = steps // 4
    thinning = max(1, (steps - burn) // args.num_draws)
    mcmc = MCMC(
        kernel,
        num_warmup=burn,
        num_samples=steps - burn,
        thinning=thinning,
        num_chains=chains,
        chain_method="vectorized",
        progress_bar=False,
        jit_model_args=True,
    )
    if init is not None and chains > 1:
        init = jax.tree.map(lambda v: jnp.broadcast_to(v, (chains, *v.shape)), init)
    mcmc.run(rng_key, *data, init_params=init)
    draws = mcmc.get_samples(group_by_chain=True)
    if chains == 1 and next(iter(draws.values())).ndim == 1:
        draws = {k: v[None] for k, v in draws.items()}
    return {k: v for k, v in draws.items() if k.startswith("net/")}, mcmc


def num_steps(args, n):
    """SG steps for ``args.passes`` passes over the training data."""
    return int(math.ceil(args.passes * args.num_train / n))


# ---------------------------------------------------------------- the cells
def grid_search(column, data, centre, args, rng_key):
    """The paper's grid search: ``(log10 h, table of every grid point)``."""
    X, y = data
    n = args.num_train // 10
    rows = random.choice(
        random.key(args.seed), X.shape[0], (args.ksd_rows,), replace=False
    )
    noise = random.split(rng_key, len(args.grid_log10_h))
    scored = []
    for key, log10_h in zip(noise, args.grid_log10_h):
        k_init, k_run = random.split(key)
        start = {
            k: v + args.grid_noise * random.normal(random.fold_in(k_init, i), v.shape)
            for i, (k, v) in enumerate(sorted(centre.items()))
        }
        kernel = paper_kernel(column, log10_h, n, centre)
        draws, _ = run_chains(
            kernel,
            data,
            _with(args, num_draws=args.ksd_draws),
            k_run,
            steps=args.grid_steps,
            init=start,
            chains=1,
        )
        draws = {k: v[0] for k, v in draws.items()}
        scored.append((log10_h, stochastic_ksd(draws, X, y, rows)))
    best = min(scored, key=lambda s: s[1])[0]
    return best, scored


def _with(args, **changes):
    """A copy of ``args`` with ``changes``."""
    return argparse.Namespace(**{**vars(args), **changes})


def tune_cell(column, metric, data, args, rng_key):
    """``(kernel, arm, settings)``: :func:`tune` for one column, subsample sizes
    1 % and 10 % of N, then 1 % alone where tune refuses the budget for both.
    Each is retried once with the budget tune names where that is at most
    ``args.tune_max_budget``; a refusal of the last is raised."""
    N = args.num_train
    tries = [[N // 100, N // 10], [N // 100]]
    for k, sizes in enumerate(tries):
        try:
            result, budget = _tune_retried(column, metric, data, sizes, args, rng_key)
        except ValueError as err:
            if k == len(tries) - 1 or "budget" not in str(err):
                raise
            print(f"    tune at sizes {sizes}: {err}\n    trying {tries[k + 1]}")
            continue
        settings = dict(tune_sizes=" ".join(map(str, sizes)), tune_budget=budget)
        return result.kernel, result.arm, settings


def _tune_retried(column, metric, data, sizes, args, rng_key):
    """``(result, budget)`` of :func:`tune` at ``args.tune_budget``, or at the
    budget it names if it refuses that one and names at most
    ``args.tune_max_budget``."""
    sampler, gradient = COLUMNS[column]
    budget = args.tune_budget
    for attempt in range(2):
        try:
            result = tune(
                model,
                *data,
                sizes[0],
                budget=budget,
                # The paper's samplers estimate no gradient noise: vanilla.
                samplers=[functools.partial(SAMPLERS[sampler], variant="vanilla")],
                gradients=[gradient],
                subsample_sizes=sizes,
                step_sizes=args.tune_steps,
                metric=metric,
                thinning=args.tune_thinning,
                num_draws=args.tune_draws,
                rng_key=rng_key,
            )
            return result, budget
        except ValueError as err:
            named = re.search(r"budget >= ([0-9.]+) s", str(err))
            if named is None or attempt == 1:
                raise
            budget = 1.1 * float(named.group(1))
            if budget > args.tune_max_budget:
                raise
            print(f"    tune: {err}\n    retrying with budget {budget:.0f} s")


def sampled_cell(row, column, data, map_params, args, rng_key):
    """One paper cell: ``(draws, settings)`` for ``row`` in MAMBA-KSD,
    MAMBA-FSSD, Grid, Heuristic."""
    k_tune, k_run = random.split(rng_key)
    N, init = args.num_train, map_params
    if row.startswith("MAMBA"):
        metric = row.split("-")[1].lower()
        kernel, arm, settings = tune_cell(column, metric, data, args, k_tune)
        n = arm.subsample_size
        settings.update(n=n, step=f"{arm.step_size:.3g} in u")
        # Tune's own fit, the mode its preconditioner and centre belong to.
        init = kernel.setup.mode
    else:
        n = N // 10
        if row == "Grid":
            log10_h, scored = grid_search(column, data, map_params, args, k_tune)
            grid = " ".join(f"{h:g}:{v:.3g}" for h, v in scored)
            settings = dict(grid_ksd=grid)
        else:
            log10_h, settings = math.log10(1.0 / N), {}
        kernel = paper_kernel(column, log10_h, n, map_params)
        settings.update(n=n, step=f"log10 h = {log10_h:.2g}")
    steps = num_steps(args, n)
    draws, _ = run_chains(kernel, data, args, k_run, steps=steps, init=init)
    return draws, dict(settings, steps=steps)


def default_cell(name, data, args, rng_key):
    """A sampler's default, ``Sampler(model)`` at n = 1 %, adapting itself."""
    n = args.num_train // 100
    kernel = DEFAULTS[name](functools.partial(model, subsample_size=n))
    steps = args.default_steps
    draws, mcmc = run_chains(kernel, data, args, rng_key, steps=steps)
    step = float(np.mean(np.asarray(mcmc.last_state.step_size)))
    return draws, dict(n=n, steps=steps, step=f"{step:.3g} in u")


def score_draws(draws, X_test, y_test):
    """The calibration record of each chain's posterior predictive."""
    out = []
    for c in range(next(iter(draws.values())).shape[0]):
        chain = {k: v[c] for k, v in draws.items()}
        out.append(calibration(mean_probs(chain, X_test), y_test))
    return out


def fits_cells(data, test, shapes, args, rng_key):
    """The MAP and Ensemble rows: ``args.num_chains`` ensembles of
    ``args.ensemble_size`` fits (the first fit of each is a MAP row's)."""
    X_test, y_test = test
    maps, ensembles = [], []
    for c in range(args.num_chains):
        fits = [
            map_fit(random.fold_in(rng_key, c * 1000 + m), *data, shapes, args)
            for m in range(args.ensemble_size)
        ]
        probs = [mean_probs(jax.tree.map(lambda v: v[None], f), X_test) for f in fits]
        maps.append(calibration(probs[0], y_test))
        ensembles.append(calibration(jnp.mean(jnp.stack(probs), 0), y_test))
    return maps, ensembles


# ------------------------------------------------------------- the table
def record(records, row, column, chains, settings, seconds, error=None):
    """Append one cell's lines (one per chain; one line with ``error``)."""
    base = dict(row=row, column=column, seconds=seconds, **settings)
    if error is not None:
        records.append(dict(base, chain=None, error=error))
        return
    for c, m in enumerate(chains):
        line = {k: v for k, v in m.items() if k != "bins"}
        records.append(dict(base, chain=c, bins=m["bins"], **line))


def summary(records):
    """One line per cell: mean ± sd over chains, settings, the paper's numbers."""
    frame = pd.DataFrame(records)
    lines = []
    for (row, column), cell in frame.groupby(["row", "column"], sort=False):
        first = cell.iloc[0]
        line = dict(row=row, column=column)
        if isinstance(first.get("error"), str):
            line["error"] = first["error"]
        else:
            for key, fmt in (("ece", ".2f"), ("mce", ".1f"), ("accuracy", ".1f")):
                line[key] = _pm(cell[key], fmt)
            line["log_lik"] = _pm(cell["log_lik"], ".3f")
        for key in ("n", "step", "steps"):
            value = first.get(key)
            if isinstance(value, float) and value.is_integer():
                value = int(value)  # pandas keeps a column with gaps as floats
            line[key] = "" if _missing(value) else value
        line["seconds"] = f"{first['seconds']:.0f}"
        paper = PAPER.get(row, {}).get(column)
        line["paper ECE/MCE/acc"] = "" if paper is None else "%g / %g / %g" % paper
        setting = PAPER_SETTINGS.get(row, {}).get(column)
        line["paper log10 h, n"] = "" if setting is None else "%g, %g %%" % setting
        lines.append(line)
    return pd.DataFrame(lines).fillna("")


def _pm(values, fmt):
    values = np.asarray(values, float)
    if len(values) < 2:
        return format(values.mean(), fmt)
    return f"{format(values.mean(), fmt)} ± {format(values.std(ddof=1), fmt)}"


def _missing(value):
    return value is None or (isinstance(value, float) and np.isnan(value))


def markdown(table):
    """The table as GitHub markdown (``|`` in errors escaped)."""
    cols = list(table.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, line in table.iterrows():
        cells = [str(line[c]).replace("|", "/").replace("\n", " ") for c in cols]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(path, records):
    """Reliability diagrams (pooled over chains) of the best cell of each row,
    and every cell's ECE with its spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = pd.DataFrame([r for r in records if r.get("chain") is not None])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.2))
    ax.plot([0, 1], [0, 1], "k:", lw=1, label="perfect calibration")
    for k, (row, cells) in enumerate(frame.groupby("row", sort=False)):
        column = cells.groupby("column")["ece"].mean().idxmin()
        bins = cells[cells["column"] == column]["bins"]
        conf, acc, count = (np.sum([b[i] for b in bins], 0) for i in range(3))
        seen = count > 0
        label = row if row == column else f"{row}: {column}"
        ax.plot(
            conf[seen] / count[seen],
            acc[seen] / count[seen],
            "o-",
            ms=4,
            color=f"C{k % 10}",
            label=label,
        )
    ax.set(
        xlabel="confidence (largest predictive probability)",
        ylabel="accuracy in the bin",
        xlim=(0, 1),
        ylim=(0, 1),
        title="Reliability, 10 bins (best column of each row)",
    )
    ax.legend(fontsize=7, loc="upper left")
    cells = frame.groupby(["row", "column"], sort=False)["ece"]
    means, sds = cells.mean(), cells.std().fillna(0.0)
    labels = [r if r == c else f"{r} {c}" for r, c in means.index]
    x = np.arange(len(means))
    bx.bar(x, means.values, yerr=sds.values, color="C0", alpha=0.8)
    bx.set_xticks(x)
    bx.set_xticklabels(labels, rotation=75, ha="right", fontsize=7)
    bx.set(ylabel="ECE (%)", title="ECE per cell (mean ± sd over chains)")
    fig.suptitle("Bayesian neural network on Fashion-MNIST (not the paper's MNIST)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ the run
def partial_csv(records, out):
    """The lines so far (a long run's progress; rewritten at the end)."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [{k: v for k, v in r.items() if k != "bins"} for r in records]
    pd.DataFrame(lines).to_csv(out / "bnn_calibration.csv", index=False)


def timed(records, out, row, column, fn, *fn_args):
    """Run one cell, record it (or the error it raised) with its wall time, and
    write the lines so far to ``out``."""
    start = time.perf_counter()
    print(f"{row} | {column} ...", flush=True)
    try:
        chains, settings = fn(*fn_args)
    except Exception as err:  # a cell's failure is a result: keep the others
        message = f"{type(err).__name__}: {err}".splitlines()[0][:400]
        print(f"    failed: {message}", flush=True)
        record(records, row, column, [], {}, time.perf_counter() - start, message)
        partial_csv(records, out)
        return
    seconds = time.perf_counter() - start
    record(records, row, column, chains, settings, seconds)
    partial_csv(records, out)
    ece = np.mean([m["ece"] for m in chains])
    acc = np.mean([m["accuracy"] for m in chains])
    print(f"    ECE {ece:.2f} %, accuracy {acc:.1f} %, {seconds:.0f} s", flush=True)


def fit_rows(records, data, test, shapes, args, rng_key):
    """The MAP and Ensemble rows, timed together."""
    start = time.perf_counter()
    print("MAP fits and ensembles ...", flush=True)
    maps, ensembles = fits_cells(data, test, shapes, args, rng_key)
    seconds = time.perf_counter() - start
    fit = dict(n=args.map_batch, steps=args.map_steps, step="Adam")
    record(records, "MAP", "MAP", maps, fit, seconds)
    both = dict(fit, step=f"Adam, {args.ensemble_size} fits")
    record(records, "Ensemble", "Ensemble", ensembles, both, seconds)
    for name, cell in (("MAP", maps), ("Ensemble", ensembles)):
        ece = np.mean([m["ece"] for m in cell])
        print(
            f"    {name}: ECE {ece:.2f} %, accuracy "
            f"{np.mean([m['accuracy'] for m in cell]):.1f} %",
            flush=True,
        )


def _scored(cell, test, *cell_args):
    """``cell(*cell_args)``'s draws scored on the test images."""
    draws, settings = cell(*cell_args)
    return score_draws(draws, *test), settings


def write(table, records, total, args):
    """Print the table; write it (markdown and csv) and the figure."""
    text = markdown(table)
    print(text)
    print(f"total {total:.0f} s")
    partial_csv(records, args.out)
    note = (
        "Fashion-MNIST, not MNIST: the paper's numbers (MNIST) are beside ours. "
        f"ECE and MCE over {NUM_BINS} equal-width confidence bins; mean ± sd over "
        f"{args.num_chains} chains (fits); {args.num_train} training and "
        f"{args.num_test} test images. Total {total:.0f} s.\n\n"
    )
    (args.out / "bnn_calibration.md").write_text(note + text + "\n")
    plot(args.out / "bnn_calibration.png", records)
    print(f"wrote {args.out}/bnn_calibration.md, .csv and .png")


def run(args):
    X, y, X_test, y_test = load_fashion_mnist(args.num_train, args.num_test, args.seed)
    args.num_train, args.num_test = len(y), len(y_test)
    data, test = (jnp.asarray(X), jnp.asarray(y)), (jnp.asarray(X_test), y_test)
    shapes = weight_shapes(data[0])
    print(
        f"Fashion-MNIST (not the paper's MNIST): {len(y)} training and {len(y_test)} "
        f"test images, {sum(int(np.prod(s)) for s in shapes.values())} weights; "
        f"{args.num_chains} chains a cell, {args.passes:g} passes over the data each"
    )
    key = random.key(args.seed)
    records = []
    start = time.perf_counter()
    map_params = map_fit(random.fold_in(key, 1), *data, shapes, args)
    fit_rows(records, data, test, shapes, args, random.fold_in(key, 2))
    for i, row in enumerate(args.rows):
        for j, column in enumerate(args.columns_for[row]):
            k = random.fold_in(key, 100 * (i + 3) + j)
            cell = (sampled_cell, test, row, column, data, map_params, args, k)
            timed(records, args.out, row, column, _scored, *cell)
    for j, name in enumerate(args.defaults):
        k = random.fold_in(key, 10_000 + j)
        cell = (default_cell, test, name, data, args, k)
        timed(records, args.out, "default", name, _scored, *cell)
    total = time.perf_counter() - start
    table = summary(records)
    write(table, records, total, args)
    return table


# --------------------------------------------------------------- arguments
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="6,000/2,000 images, SGLD and SGLD-CV, small budgets",
    )
    parser.add_argument("--num-train", type=int, default=None)
    parser.add_argument("--num-test", type=int, default=None)
    parser.add_argument("--columns", nargs="+", choices=list(COLUMNS), default=None)
    parser.add_argument(
        "--mamba-columns",
        nargs="+",
        choices=list(COLUMNS),
        default=None,
        help="columns tuned by MAMBA",
    )
    parser.add_argument("--defaults", nargs="*", choices=list(DEFAULTS), default=None)
    parser.add_argument("--num-chains", type=int, default=2)
    parser.add_argument(
        "--passes",
        type=float,
        default=None,
        help="passes over the training data per run",
    )
    parser.add_argument("--num-draws", type=int, default=None, help="per chain")
    parser.add_argument(
        "--default-steps", type=int, default=None, help="steps of a default run"
    )
    parser.add_argument("--grid-log10-h", type=float, nargs="+", default=None)
    parser.add_argument("--grid-steps", type=int, default=None)
    parser.add_argument("--grid-noise", type=float, default=1.0)
    parser.add_argument("--ksd-rows", type=int, default=None)
    parser.add_argument("--ksd-draws", type=int, default=None)
    parser.add_argument("--tune-budget", type=float, default=None, help="seconds")
    parser.add_argument("--tune-max-budget", type=float, default=None)
    parser.add_argument("--tune-thinning", type=int, default=1)
    parser.add_argument("--tune-draws", type=int, default=None)
    parser.add_argument("--ensemble-size", type=int, default=None)
    parser.add_argument("--map-steps", type=int, default=None)
    parser.add_argument("--map-batch", type=int, default=500)
    parser.add_argument("--map-learning-rate", type=float, default=0.01)
    parser.add_argument("--rng-seed", dest="seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out"))
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = dict(
        num_train=3_000 if quick else 60_000,
        num_test=1_000 if quick else 10_000,
        columns=list(QUICK_COLUMNS if quick else COLUMNS),
        defaults=list(QUICK_DEFAULTS if quick else DEFAULTS),
        passes=3.0 if quick else 10.0,
        num_draws=20 if quick else 50,
        grid_log10_h=[-3.0, -5.0] if quick else [-3.0, -4.0, -5.0, -6.0],
        grid_steps=50 if quick else 100,
        default_steps=100 if quick else 400,
        ksd_rows=300 if quick else 6_000,
        ksd_draws=10 if quick else 20,
        tune_budget=75.0 if quick else 100.0,
        tune_max_budget=90.0 if quick else 200.0,
        tune_draws=10 if quick else 30,
        ensemble_size=2 if quick else 5,
        map_steps=300 if quick else 1000,
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.mamba_columns is None:
        args.mamba_columns = ["SGLD"] if quick else list(COLUMNS)
    args.tune_steps = QUICK_TUNE_STEPS if quick else TUNE_STEPS
    args.rows = ["MAMBA-KSD", "MAMBA-FSSD", "Grid", "Heuristic"]
    mamba = [c for c in args.columns if c in args.mamba_columns]
    # FSSD runs the same code as KSD; its cells cost a tune each.
    fssd = [] if quick else ["SGLD"]
    args.columns_for = {
        "MAMBA-KSD": mamba,
        "MAMBA-FSSD": [c for c in args.columns if c in fssd],
        "Grid": args.columns,
        "Heuristic": args.columns,
    }
    return args


def main(argv=None):
    with warnings.catch_warnings():
        warnings.simplefilter("once")  # each kernel's warnings once, not per cell
        return run(parse_args(argv))


if __name__ == "__main__":
    main()
