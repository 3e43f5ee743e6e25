"""Each sampler's discretisation bias law in the whitened coordinates u (issue 60,
item 1): the stationary variance of its rule on a standard normal, as a function
of the step.

    python benchmarks/bias_laws.py                       # about 5 minutes on 2 cores
    python benchmarks/bias_laws.py --samplers SGBD SGLD --fractions 0.5 1 2
    python benchmarks/bias_laws.py --samplers SGBD SGLD --tau-h 0 0.5 1
    python benchmarks/bias_laws.py --samplers SGBD SGLD --tau-h 0 0.5 1 \\
        --variant corrected

In u, where the step adapts, a well-set-up posterior is close to N(0, I). For
each sampler this runs its rule on the potential U(z) = |z|^2 / 2 in d =
``--dim`` independent coordinates (exact gradients: what remains is the
discretisation alone, not the gradient noise; ``--tau-h K`` adds Gaussian noise
of sd tau = K / h to each coordinate of the gradient and states its sd, as a
minibatch estimate does) at steps ``--fractions`` times the
sampler's default target in u (``Sampler.step_target()``), ``--num-samples``
draws after ``--num-warmup`` at the target and 1 / fraction^2 times as many
below it (a Langevin-type rule mixes in about 1 / h^2 steps). It prints the
variance of the draws (the mean over the d coordinates, and its standard error
across them), the relative error of the sds it implies, sqrt(var) - 1, and the
weighted least-squares fit of var - 1 = c h^p over the steps h, p = 1
(first-order rules) or 2, whichever fits: the law a default step would invert
(the sds' bias about c h^p / 2); and the median bulk ESS per step with its
log-log fit a h^q, the rate the default step predicts its Monte Carlo error
from. With several ``--tau-h``, also the joint fit var - 1 = c h^2 + b (tau
h)^2 over them: the noise's share, which a default step reads from the run's
own tau. Known laws, for checking the script:
unadjusted Langevin has var = 1 / (1 - h^2 / 4) (h = sigma, SGLD's
parameterisation), so c = 1/4 for small h; BAOAB samples a harmonic potential's
positions exactly (Leimkuhler & Matthews 2013), so c = 0.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC

from numpyro_sgbd import BAOAB, NOGIN, SGBD, SGHMC, SGLD, SGNHT, GradientEstimate

SAMPLERS = {
    "SGBD": SGBD,
    "SGLD": SGLD,
    "NOGIN": NOGIN,
    "SGHMC": SGHMC,
    "SGNHT": SGNHT,
    "BAOAB": BAOAB,
}


def potential(z):
    return 0.5 * jnp.sum(z**2)


def noisy_gradient(tau):
    """``gradient_fn(rng_key, z)``: the potential's gradient plus N(0, tau^2)
    noise in each coordinate, with its sd (as a minibatch estimate states it)."""

    def gradient_fn(rng_key, z):
        noise = tau * jax.random.normal(rng_key, jnp.shape(z))
        return GradientEstimate(z + noise, noise_sd=jnp.full(jnp.shape(z), tau))

    return gradient_fn


def variance(sampler, step, fraction, args, key, tau_h=0.0):
    """``(mean variance over the coordinates, its standard error)``: exact
    gradients, or with ``tau_h`` > 0 noise of sd tau = tau_h / step."""
    if tau_h > 0:
        source = {"gradient_fn": noisy_gradient(tau_h / step)}
    else:
        source = {"potential_fn": potential}
    if args.variant is not None:
        source["variant"] = args.variant
    kernel = SAMPLERS[sampler](**source, step_size=step)
    longer = max(1.0, 1.0 / fraction**2)
    mcmc = MCMC(
        kernel,
        num_warmup=int(args.num_warmup * longer),
        num_samples=int(args.num_samples * longer),
        progress_bar=False,
    )
    mcmc.run(key, init_params=jnp.zeros(args.dim))
    draws = np.asarray(mcmc.get_samples())
    per = draws.var(axis=0, ddof=1)
    # Bulk ESS per step, the median over the coordinates: the rate the default
    # step's Monte Carlo error is predicted from (item 1).
    ess = effective_sample_size(draws[None])
    rate = float(np.median(ess)) / draws.shape[0]
    return float(per.mean()), float(per.std(ddof=1) / np.sqrt(per.size)), rate


def law(steps, variances, errors, power):
    """``(c, its standard error, chi-square)`` of var - 1 = c h^power, by least
    squares through the origin weighted by the variances' standard errors."""
    hp = np.asarray(steps) ** power
    resid = np.asarray(variances) - 1.0
    w = 1.0 / np.asarray(errors) ** 2
    c = np.sum(w * hp * resid) / np.sum(w * hp**2)
    chi2 = np.sum(w * (resid - c * hp) ** 2)
    return float(c), float(1.0 / np.sqrt(np.sum(w * hp**2))), float(chi2)


def one_law(sampler, tau_h, args, key):
    """Print the variances over the steps and the fitted law of ``sampler`` at
    gradient noise ``tau_h`` (tau times the step); return ``[(h, tau_h, var,
    se)]``."""
    target = SAMPLERS[sampler].step_target()
    steps, variances, errors, rates = [], [], [], []
    for fraction in args.fractions:
        step = fraction * target
        v, se, rate = variance(sampler, step, fraction, args, key, tau_h)
        steps.append(step)
        variances.append(v)
        errors.append(se)
        rates.append(rate)
        print(
            f"{sampler:<8}{tau_h:>6g}{target:>8.3g}{step:>9.3g}{v:>9.4f}{se:>7.4f}"
            f"{np.sqrt(v) - 1:>+9.4f}{rate:>10.4f}"
        )
    fits = {p: law(steps, variances, errors, p) for p in (1, 2)}
    p = min(fits, key=lambda q: fits[q][2])
    c, se, _ = fits[p]
    chi2 = ", ".join(f"h^{q} {fits[q][2]:.1f}" for q in fits)
    print(
        f"{sampler:<8} tau h = {tau_h:g}: var - 1 = ({c:.3f} +- {se:.3f}) h^{p} "
        f"(chi-square {chi2}, {len(steps) - 1} dof); sd bias about "
        f"{c / 2:.3f} h^{p}, {c / 2 * target**p:+.4f} at the target"
    )
    q, a = np.polyfit(np.log(steps), np.log(rates), 1)
    print(
        f"{sampler:<8} tau h = {tau_h:g}: bulk ESS per step (median) about "
        f"{np.exp(a):.3f} h^{q:.2f}"
    )
    return [(h, tau_h, v, e) for h, v, e in zip(steps, variances, errors)]


def joint_law(rows):
    """``((c, b), (se_c, se_b), chi-square)`` of var - 1 = c h^2 + b (tau h)^2
    over ``rows`` of every noise level, weighted by the standard errors."""
    h, tau_h, v, e = (np.asarray(x) for x in zip(*rows))
    design = np.stack([h**2, tau_h**2], axis=1) / e[:, None]
    target = (v - 1.0) / e
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    cov = np.linalg.inv(design.T @ design)
    chi2 = float(np.sum((target - design @ coef) ** 2))
    return coef, np.sqrt(np.diag(cov)), chi2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument(
        "--fractions", nargs="+", type=float, default=[0.25, 0.5, 1.0, 1.5, 2.0]
    )
    parser.add_argument(
        "--tau-h",
        nargs="+",
        type=float,
        default=[0.0],
        help="gradient noise sd times the step (0: exact gradients)",
    )
    parser.add_argument(
        "--variant", help="e.g. corrected (SGBD, SGLD); default: the kernel's own"
    )
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--num-warmup", type=int, default=2000)
    parser.add_argument("--num-samples", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    key = jax.random.key(args.seed)
    print(f"d = {args.dim}, {args.num_warmup} + {args.num_samples} steps")
    head = f"{'sampler':<8}{'tau h':>6}{'target':>8}{'step':>9}{'var':>9}{'+-':>7}"
    print(f"{head}{'sd bias':>9}{'ESS/step':>10}")
    for sampler in args.samplers:
        rows = []
        for tau_h in args.tau_h:
            try:
                rows += one_law(sampler, tau_h, args, key)
            except (TypeError, ValueError) as err:  # a rule that needs more
                print(f"{sampler:<8} tau h = {tau_h:g}: not run ({err})")
        if len({r[1] for r in rows}) > 1:
            (c, b), (sc, sb), chi2 = joint_law(rows)
            print(
                f"{sampler:<8} joint: var - 1 = ({c:.3f} +- {sc:.3f}) h^2 + "
                f"({b:.3f} +- {sb:.3f}) (tau h)^2 (chi-square {chi2:.1f}, "
                f"{len(rows) - 2} dof)"
            )


if __name__ == "__main__":
    main()
