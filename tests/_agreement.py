"""The test files' one check of SG draws against NUTS's on the same model, and
the effective sample size every statistical tolerance is computed from."""

from jax import random
import numpy as np
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC

#: The least ESS a statistical test accepts: its tolerances grow like
#: 1 / sqrt(ESS), so a chain that mixes badly would otherwise widen its own.
ESS_FLOOR = 100


def checked_ess(draws, floor=ESS_FLOOR):
    """NumPyro's ESS of ``draws`` (``(chains, draws, ...)``), per coordinate,
    raising where it is below ``floor``: the test then says the chain mixed too
    badly to test instead of passing on a tolerance its own poor mixing
    widened."""
    ess = np.asarray(effective_sample_size(np.asarray(draws, np.float64)))
    assert np.all(ess >= floor), f"ESS {np.min(ess):.0f} below the floor {floor}"
    return ess


def runs(nuts, sg, model_args, nuts_draws=(500, 1000), sg_draws=(2000, 4000)):
    """The ``MCMC`` runs of ``nuts`` and ``sg`` (kernels) on ``model_args``, each
    ``(num_warmup, num_samples)`` as given, keys 1 and 2."""
    out = []
    for seed, kernel, (warmup, samples) in ((1, nuts, nuts_draws), (2, sg, sg_draws)):
        mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, progress_bar=False)
        mcmc.run(random.key(seed), *model_args)
        out.append(mcmc)
    return out


def agree(ref, got, names, allowance):
    """Means within four MCSEs (from both runs' ESS) plus ``allowance`` of a NUTS
    sd for the SG chain's discretisation; sds within four standard errors (the
    relative error of an sd from an ESS of E is about 1/sqrt(2E)) plus the same
    allowance. Raises an AssertionError naming the site."""
    for name in names:
        a, b = np.asarray(ref[name]), np.asarray(got[name])
        sd = a.std(0)
        ess_a = checked_ess(a[None])
        ess_b = checked_ess(b[None])
        mcse = sd * np.sqrt(1 / ess_a + 1 / ess_b)
        assert np.all(np.abs(a.mean(0) - b.mean(0)) < 4 * mcse + allowance * sd), name
        rel = np.sqrt(1 / (2 * ess_a) + 1 / (2 * ess_b))
        assert np.all(np.abs(b.std(0) / sd - 1) < 4 * rel + allowance), name
