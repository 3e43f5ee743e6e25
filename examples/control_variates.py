"""
Example: control-variate gradients on a simulated 10^6-row logistic regression
===============================================================================

The setting of the control-variates issue: N = 1,000,000 rows, d = 10 N(0, 1)
covariates, coefficients with a N(0, 10^2) prior (``dist.Normal(0, 10)``), labels
drawn from the model at coefficients drawn from N(0, 1). Minibatches of n = 1,000
(0.1 % of the data).

Compared, for SGBD (corrected) and SGLD (corrected), with the plain minibatch
gradient and with control variates (``gradient="control_variates"``): the relative
error of the posterior sds, xi = ||sd - sd_ref|| / ||sd_ref||, and the largest
standardised error of the means, max_j |mean_j - mean_ref_j| / sd_ref_j, against
NUTS on the full data (500 warmup + 1,000 draws), with the wall time of each run.

First the default path, ``SGBD(logistic_model)`` and ``SGLD(logistic_model)`` with
nothing to tune: each finds the mode, whitens the posterior with the Hessian there,
uses control variates around the mode and adapts its step in warmup (its time
includes all of that). Then the hand-tuned runs the first version of this example
documented: they start at the full-data mode with per-coordinate steps
``step_scale / sqrt(H_jj)`` from the diagonal Hessian H there
(:func:`~numpyro_sgbd.posterior_mode`, run once, its time added to each hand-tuned
run's time); the control variates are centred at the same mode (``centre=mode.params``).

NUTS's own 1,000 draws have a Monte Carlo error of about 1 / sqrt(2 ESS), some 2 %
per sd, so xi against NUTS cannot go much below 2 % even for exact draws. The table
therefore also gives xi against the Laplace approximation (the inverse Hessian at
the mode, exact to O(1/N) for this posterior), and NUTS's own xi against it.

Usage::

    python examples/control_variates.py            # about 5 minutes
    python examples/control_variates.py --quick    # N = 100,000, fewer steps

It prints the table and writes it to ``OUT/control_variates.csv``, and a figure of
each run's per-coefficient mean error and sd ratio against NUTS to
``OUT/control_variates.png``.
"""

import argparse
import csv
from pathlib import Path
import time

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS, init_to_value
from numpyro.infer.util import potential_energy

from numpyro_sgbd import SGBD, SGLD, full_batch, posterior_mode


def logistic_model(X, y, subsample_size=None):
    """Logistic regression, N(0, 10^2) prior on each coefficient."""
    theta = numpyro.sample(
        "theta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1)
    )
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ theta), obs=y[idx])


def simulate(num_rows, dim, seed):
    """N(0, 1) covariates, coefficients from N(0, 1), labels from the model."""
    k_theta, k_x, k_y = random.split(random.key(seed), 3)
    theta = random.normal(k_theta, (dim,))
    X = random.normal(k_x, (num_rows, dim))
    y = random.bernoulli(k_y, jax.nn.sigmoid(X @ theta)).astype(jnp.float32)
    return X, y


def errors(draws, ref_mean, ref_sd):
    """(xi, largest standardised mean error) of ``draws`` (rows are draws)."""
    sd = draws.std(axis=0, ddof=1)
    xi = np.linalg.norm(sd - ref_sd) / np.linalg.norm(ref_sd)
    bias = np.max(np.abs(draws.mean(axis=0) - ref_mean) / ref_sd)
    return xi, bias


def run(args):
    X, y = simulate(args.num_rows, args.dim, args.seed)
    n = args.subsample_size
    model_args = (X, y, n)
    print(f"N = {args.num_rows}, d = {args.dim}, n = {n}")

    start = time.perf_counter()
    nuts = MCMC(
        NUTS(full_batch(logistic_model)),
        num_warmup=500,
        num_samples=1000,
        progress_bar=False,
    )
    nuts.run(random.key(args.seed + 1), *model_args)
    ref = np.asarray(nuts.get_samples()["theta"], np.float64)
    nuts_seconds = time.perf_counter() - start
    ref_mean, ref_sd = ref.mean(0), ref.std(0, ddof=1)

    start = time.perf_counter()
    mode = posterior_mode(logistic_model, *model_args)
    mode_seconds = time.perf_counter() - start
    theta_hat = mode.params["theta"]

    def potential(theta):
        return potential_energy(
            full_batch(logistic_model), model_args, {}, {"theta": theta}
        )

    laplace_sd = np.sqrt(np.diag(np.linalg.inv(jax.hessian(potential)(theta_hat))))
    laplace_mean = np.asarray(theta_hat, np.float64)

    step = {"theta": args.step_scale / jnp.sqrt(mode.hessian_diag["theta"])}
    init = init_to_value(values=mode.params)
    draws_by_method = {}
    rows = [
        (
            "NUTS (500 + 1000)",
            nuts_seconds,
            float("nan"),
            float("nan"),
            *errors(ref, laplace_mean, laplace_sd),
        )
    ]

    def run_sg(label, kernel, key, extra_seconds=0.0):
        """Run one SG kernel; record its draws and its row of the table."""
        mcmc = MCMC(
            kernel,
            num_warmup=args.num_warmup,
            num_samples=args.num_samples,
            progress_bar=False,
        )
        start = time.perf_counter()
        mcmc.run(key, *model_args)
        draws = np.asarray(mcmc.get_samples()["theta"], np.float64)
        seconds = time.perf_counter() - start + extra_seconds
        draws_by_method[label] = draws
        rows.append(
            (
                label,
                seconds,
                *errors(draws, ref_mean, ref_sd),
                *errors(draws, laplace_mean, laplace_sd),
            )
        )
        return mcmc

    for name, cls in (("SGBD", SGBD), ("SGLD", SGLD)):
        for gradient in ("minibatch", "control_variates"):
            extra = {"centre": mode.params} if gradient == "control_variates" else {}
            kernel = cls(
                logistic_model,
                step_size=step,
                variant="corrected",
                init_strategy=init,
                gradient=gradient,
                **extra,
            )
            label = f"{name} corrected, {gradient}"
            run_sg(label, kernel, random.key(args.seed + 2), mode_seconds)
    # The default path: no step size, no start, no centre. Each kernel finds the
    # mode itself, whitens with the Hessian there and adapts its step in warmup;
    # its time includes that search.
    for name, cls in (("SGBD", SGBD), ("SGLD", SGLD)):
        kernel = cls(logistic_model)
        label = f"{name}(model), adapted"
        mcmc = run_sg(label, kernel, random.key(args.seed + 3))
        print(
            f"{label}: {kernel.adaptation_info['preconditioner']} preconditioner, "
            f"adaptation {kernel.adaptation_info['seconds']:.1f} s, step "
            f"{float(mcmc.last_state.step_size):.3g} in u"
        )
    print(
        f"posterior_mode {mode_seconds:.1f} s (included in the hand-tuned SG times); "
        f"{args.num_warmup} + {args.num_samples} SG steps, step "
        f"{args.step_scale} / sqrt(H)"
    )
    header = (
        f"{'method':<36}{'seconds':>9}{'xi NUTS':>9}{'bias NUTS':>10}"
        f"{'xi Lapl':>9}{'bias Lapl':>10}"
    )
    print(header)
    for name, seconds, xi, bias, xi_l, bias_l in rows:
        print(
            f"{name:<36}{seconds:>9.1f}{xi:>9.3f}{bias:>10.3f}{xi_l:>9.3f}{bias_l:>10.3f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "control_variates.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["method", "seconds", "xi_nuts", "bias_nuts", "xi_laplace", "bias_laplace"]
        )
        writer.writerows(rows)
    print(f"wrote {path}")
    figure = args.out / "control_variates.png"
    plot(figure, ref_mean, ref_sd, draws_by_method)
    print(f"wrote {figure}")
    return rows


def plot(path, ref_mean, ref_sd, draws_by_method):
    """Per coordinate, each run's standardised mean error and sd ratio against
    NUTS: control variates near 0 and 1, plain minibatches far above 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_mean, ax_sd) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    coords = np.arange(len(ref_mean))
    for name, draws in draws_by_method.items():
        style = "--x" if "minibatch" in name else "-o"
        ax_mean.plot(coords, (draws.mean(0) - ref_mean) / ref_sd, style, label=name)
        ax_sd.plot(coords, draws.std(0, ddof=1) / ref_sd, style, label=name)
    ax_mean.axhline(0, color="k", lw=0.8)
    ax_sd.axhline(1, color="k", lw=0.8)
    ax_sd.set_yscale("log")
    ax_mean.set(xlabel="coefficient", ylabel="(mean - NUTS mean) / NUTS sd")
    ax_sd.set(xlabel="coefficient", ylabel="sd / NUTS sd (log scale)")
    ax_sd.legend(fontsize=8)
    fig.suptitle(
        "SG samplers against NUTS: adapted, control variates, plain minibatches"
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 100,000")
    parser.add_argument("--num-rows", type=int, default=None)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--subsample-size", type=int, default=1000)
    parser.add_argument("--num-warmup", type=int, default=None)
    parser.add_argument("--num-samples", type=int, default=None)
    parser.add_argument(
        "--step-scale", type=float, default=0.5, help="step in posterior sds"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out"))
    args = parser.parse_args(argv)
    if args.num_rows is None:
        args.num_rows = 100_000 if args.quick else 1_000_000
    if args.num_samples is None:
        args.num_samples = 10_000 if args.quick else 50_000
    if args.num_warmup is None:
        args.num_warmup = args.num_samples // 10
    return args


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
