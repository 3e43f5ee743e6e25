"""The test files' one check of SG draws against NUTS's on the same model."""

from jax import random
import numpy as np
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC


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
        ess_a = effective_sample_size(a[None])
        ess_b = effective_sample_size(b[None])
        mcse = sd * np.sqrt(1 / ess_a + 1 / ess_b)
        assert np.all(np.abs(a.mean(0) - b.mean(0)) < 4 * mcse + allowance * sd), name
        rel = np.sqrt(1 / (2 * ess_a) + 1 / (2 * ess_b))
        assert np.all(np.abs(b.std(0) / sd - 1) < 4 * rel + allowance), name
