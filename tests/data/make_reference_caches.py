"""Write a small reference_posterior cache file, for the cross-version cache tests.

Run once under each ArviZ major version, with the numpyro_sgbd to test on the path::

    JAX_PLATFORMS=cpu python tests/data/make_reference_caches.py OUT.nc

``reference-arviz0.nc`` was written by numpyro_sgbd at commit 40b3f3a (before the
ArviZ 1.x support, ``InferenceData.to_netcdf``) under ArviZ 0.23;
``reference-arviz1.nc`` by the ArviZ 1.x support under ArviZ 1.3
(``numpyro_sgbd.evaluation._arviz.to_netcdf`` of a DataTree).
"""

from pathlib import Path
import shutil
import sys
import tempfile

from jax import random
import numpyro
import numpyro.distributions as dist

from numpyro_sgbd import reference_posterior


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


if __name__ == "__main__":
    y = 1.0 + random.normal(random.key(0), (30,))
    with tempfile.TemporaryDirectory() as folder:
        reference_posterior(
            model, y, num_warmup=500, num_samples=1000, cache_dir=folder, strict=True
        )
        (written,) = Path(folder).glob("*.nc")
        shutil.copy(written, sys.argv[1])
