"""numpyro_sgbd.evaluation._arviz: one behaviour under ArviZ 0.x (InferenceData) and 1.x
(DataTree). Every test here runs under whichever ArviZ is installed; the suite is run
under both."""

import os
from pathlib import Path
import subprocess
import sys

import arviz as az
import numpy as np
import pytest
import xarray as xr

from numpyro_sgbd.evaluation import _arviz

DATA = Path(__file__).parent / "data"
# The installed version's own container, as az.from_numpyro returns it.
NATIVE = xr.DataTree if _arviz.ARVIZ_MAJOR >= 1 else az.InferenceData


def ar1(rng, rho, shape):
    """Stationary AR(1) chains along axis 1, unit marginal variance."""
    x = np.empty(shape)
    x[:, 0] = rng.normal(size=(shape[0],) + shape[2:])
    noise = np.sqrt(1 - rho**2) * rng.normal(size=shape)
    for t in range(1, shape[1]):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    return x


def test_from_dict_builds_the_installed_container_with_group_attrs():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(2, 50, 3))
    data = _arviz.from_dict(
        {"posterior": {"w": w}, "sample_stats": {"diverging": np.zeros((2, 50), bool)}},
        attrs={"posterior": {"sampling_time": 1.5}},
    )
    assert isinstance(data, NATIVE)
    assert _arviz.is_inference_data(data)
    assert not _arviz.is_inference_data({"posterior": {"w": w}})
    assert sorted(_arviz.group_names(data)) == ["posterior", "sample_stats"]
    posterior = _arviz.group(data, "posterior")
    assert isinstance(posterior, xr.Dataset)
    np.testing.assert_array_equal(posterior["w"].values, w)
    assert posterior.attrs["sampling_time"] == 1.5
    assert data.posterior.attrs["sampling_time"] == 1.5  # the user's view
    assert _arviz.group(data, "log_likelihood") is None


def test_ess_and_rhat_take_chain_draw_arrays():
    rng = np.random.default_rng(1)
    rho, draws = 0.5, 4000
    x = ar1(rng, rho, (2, draws, 3))
    ess = _arviz.ess(x, method="bulk")
    assert ess.shape == (3,)
    # AR(1): ESS = n (1 - rho) / (1 + rho) = 2667 over both chains; the estimate's
    # relative sd is 6% here (40 seeds), so 30% is 5 sd (fixed seed, and a false
    # alarm about once in 10^6 seeds). With the chain and draw axes swapped, ArviZ
    # would see 4000 chains of 2 draws and return NaN.
    np.testing.assert_allclose(ess, 2 * draws * (1 - rho) / (1 + rho), rtol=0.3)
    assert _arviz.ess(x, method="tail").shape == (3,)
    np.testing.assert_allclose(_arviz.rhat(x), 1.0, atol=0.01)
    # Chains stuck at different levels: R-hat far above 1.
    assert np.all(_arviz.rhat(x + np.array([0.0, 3.0])[:, None, None]) > 1.5)
    # A dataset gives a dataset with the same numbers.
    dataset = xr.Dataset({"w": (("chain", "draw", "k"), x)})
    np.testing.assert_allclose(_arviz.ess(dataset, method="bulk")["w"].values, ess)


def test_netcdf_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    data = _arviz.from_dict(
        {
            "posterior": {"w": rng.normal(size=(2, 20, 3)).astype(np.float32)},
            "sample_stats": {"n_steps": np.arange(40).reshape(2, 20)},
        },
        attrs={"posterior": {"trustworthy": 1, "max_rhat": 1.001}},
    )
    path = _arviz.to_netcdf(data, tmp_path / "x.nc")
    assert [p.name for p in tmp_path.iterdir()] == ["x.nc"]  # no partial file left
    back = _arviz.from_netcdf(path)
    path.unlink()  # loaded into memory and closed: the file is not needed any more
    assert isinstance(back, NATIVE)
    for name in ("posterior", "sample_stats"):
        xr.testing.assert_identical(_arviz.group(back, name), _arviz.group(data, name))
    assert back.posterior.attrs["trustworthy"] == 1


@pytest.mark.parametrize("written_by", ["arviz0", "arviz1"])
def test_files_written_under_either_major_version_load(written_by):
    path = DATA / f"reference-{written_by}.nc"
    data = _arviz.from_netcdf(path)
    assert isinstance(data, NATIVE)
    assert sorted(_arviz.group_names(data)) == ["posterior", "sample_stats"]
    assert data.posterior["mu"].shape == (2, 1000)
    assert data.sample_stats["diverging"].dtype == bool
    assert data.posterior.attrs["trustworthy"] == 1
    # The same numbers as xarray reads from the file directly.
    with xr.open_dataset(path, group="posterior", engine="h5netcdf") as raw:
        np.testing.assert_array_equal(data.posterior["mu"].values, raw["mu"].values)


def test_a_written_file_reads_with_the_installed_arviz_itself(tmp_path):
    data = _arviz.from_netcdf(DATA / "reference-arviz0.nc")
    path = _arviz.to_netcdf(data, tmp_path / "copy.nc")
    native = az.from_netcdf(path)  # 0.x: InferenceData; 1.x: open_datatree
    np.testing.assert_array_equal(native.posterior["mu"], data.posterior["mu"])


def test_a_non_netcdf_file_is_an_oserror(tmp_path):
    path = tmp_path / "bad.nc"
    path.write_bytes(b"not HDF5")
    with pytest.raises(OSError):
        _arviz.from_netcdf(path)


def test_from_numpyro_works_when_arviz_is_imported_before_the_package():
    # The import order ruff/isort gives a user's script. Under ArviZ 1.x it used to
    # leave numpyro.infer without `initialization`, and az.from_numpyro failed.
    script = """
import arviz as az
from numpyro_sgbd import SGLD
from jax import random
import numpyro, numpyro.distributions as dist
from numpyro.infer import MCMC

def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

mcmc = MCMC(SGLD(model, step_size=0.05), num_warmup=5, num_samples=10,
            progress_bar=False)
mcmc.run(random.key(0), random.normal(random.key(1), (20,)))
assert az.from_numpyro(mcmc).posterior["mu"].shape == (1, 10)
"""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
