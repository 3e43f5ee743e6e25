"""compare and plot_marginals: accuracy figures against a reference posterior."""

import time
import warnings

import arviz as az
import jax
from jax import random
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
import pytest

import numpyro_sgbd
from numpyro_sgbd import SGLD, Comparison, compare, monitoring, plot_marginals
from numpyro_sgbd.evaluation import _arviz

PRIOR_SD = 10.0


def gaussian_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def standardised(rng, shape, mean, sd):
    """Draws whose sample mean and sd (ddof=1, over all but the last axis) are
    exactly ``mean`` and ``sd``."""
    x = rng.normal(size=shape)
    flat = x.reshape(-1, shape[-1])
    x = (x - flat.mean(0)) / flat.std(0, ddof=1)
    return mean + sd * x


@pytest.fixture(scope="module")
def reference():
    rng = np.random.default_rng(0)
    w = standardised(rng, (2, 1500, 2), np.array([1.0, -3.0]), np.array([0.5, 2.0]))
    return _arviz.from_dict({"posterior": {"w": w}})


def test_known_biases_and_xi(reference):
    ref_w = reference.posterior["w"].values.reshape(-1, 2)
    ref_mean, ref_sd = np.array([1.0, -3.0]), np.array([0.5, 2.0])
    shift, scale = np.array([0.2, -1.5]), np.array([1.3, 0.6])  # in ref sds
    draws = {"w": ref_mean + shift * ref_sd + scale * (ref_w - ref_mean)}
    table = compare({"moved": draws}, reference, ksd_draws=0)
    assert isinstance(table, Comparison)
    row = table.per_parameter.loc["moved"]
    np.testing.assert_allclose(row["bias_mean"], np.abs(shift), rtol=1e-6)
    # |var - ref var| / ref sd = |scale^2 - 1| ref sd
    np.testing.assert_allclose(
        row["bias_var"], np.abs(scale**2 - 1) * ref_sd, rtol=1e-6
    )
    # Scale-free: the same whatever the parameter's units.
    np.testing.assert_allclose(row["rel_bias_var"], np.abs(scale**2 - 1), rtol=1e-6)
    xi = np.linalg.norm((scale - 1) * ref_sd) / np.linalg.norm(ref_sd)
    summary = table.summary.loc["moved"]
    np.testing.assert_allclose(summary["xi"], xi, rtol=1e-6)
    np.testing.assert_allclose(summary["max_bias_mean"], 1.5, rtol=1e-6)
    np.testing.assert_allclose(summary["max_rel_bias_var"], 0.69, rtol=1e-6)
    assert summary["num_draws"] == 3000
    assert list(row.index) == ["w[0]", "w[1]"]
    # The reference's own row: no bias by definition, its ESS and time as given.
    assert np.isnan(table.summary.loc["reference", "xi"])
    assert table.summary.loc["reference", "min_ess_bulk"] > 1000
    text = str(table)
    assert "moved" in text and "w[1]" in text and "xi" in text
    assert "max_rel_bias_var" in text and "|var / ref var - 1|" in text


def test_ess_per_second_from_wall_times(reference):
    draws = {"w": reference.posterior["w"].values.reshape(-1, 2)}
    table = compare([draws], reference, ksd_draws=0, wall_times={"run 0": 2.0})
    row = table.summary.loc["run 0"]
    assert row["ess_per_s"] == pytest.approx(row["min_ess_bulk"] / 2.0)
    assert np.isnan(table.summary.loc["reference", "ess_per_s"])


def test_mismatched_runs_are_errors(reference):
    w = reference.posterior["w"].values.reshape(-1, 2)
    with pytest.raises(ValueError, match="run 'other' has no variable 'w'"):
        compare({"other": {"v": w}}, reference)
    with pytest.raises(ValueError, match=r"shape \(3,\) in run 'wide'"):
        compare({"wide": {"w": np.ones((100, 3))}}, reference)
    with pytest.raises(ValueError, match="no posterior group"):
        stats_only = _arviz.from_dict({"sample_stats": {"lp": np.ones((1, 5))}})
        compare({"a": {"w": w}}, stats_only)
    with pytest.raises(ValueError, match="like the reference"):
        compare({"reference": {"w": w}}, reference)
    with pytest.raises(TypeError, match="candidates must be"):
        compare(3.0, reference)
    with pytest.raises(ValueError, match="wall_times names unknown"):
        compare({"a": {"w": w}}, reference, wall_times={"b": 1.0})


def test_nan_draws_give_a_nan_row_and_a_warning(reference):
    w = reference.posterior["w"].values.reshape(-1, 2).copy()
    w[5, 1] = np.nan
    with pytest.warns(RuntimeWarning, match="run 'broken' has non-finite"):
        table = compare({"broken": {"w": w}, "fine": {"w": w[:4]}}, reference)
    assert table.summary.loc["broken", ["xi", "max_bias_mean"]].isna().all()
    assert table.per_parameter.loc["broken"]["bias_mean"].isna().all()
    assert np.isfinite(table.summary.loc["fine", "xi"])
    bad_reference = {"w": w}
    with pytest.raises(ValueError, match="reference has non-finite"):
        compare({"fine": {"w": w[:4]}}, bad_reference)


def scale_model(y):
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
        numpyro.sample("y", dist.Normal(0.0, sigma), obs=y[idx])


def test_a_draw_on_the_support_boundary_gives_that_run_a_nan_ksd_only():
    # sigma = 0 is a finite draw whose unconstrained value, log 0, is not.
    y = 0.5 * random.normal(random.key(8), (200,))
    rng = np.random.default_rng(9)
    exact = {"sigma": np.exp(np.log(0.5) + 0.05 * rng.normal(size=400))}
    boundary = {"sigma": exact["sigma"].copy()}
    boundary["sigma"][17] = 0.0
    fine = {"sigma": exact["sigma"][::-1].copy()}
    with pytest.warns(RuntimeWarning, match="run 'boundary': 1 of 400 draws map to"):
        table = compare(
            {"boundary": boundary, "fine": fine},
            exact,
            model=scale_model,
            model_args=(y,),
            ksd_draws=400,
        )
    ksd = table.summary["ksd"]
    assert np.isnan(ksd["boundary"])
    assert np.isfinite(ksd["fine"]) and np.isfinite(ksd["reference"])
    # The rest of its row stands.
    assert np.isfinite(table.summary.loc["boundary", ["xi", "max_bias_mean"]]).all()


def test_ksd_and_sampler_stats_from_an_mcmc_run():
    y = 1.0 + random.normal(random.key(0), (200,))
    precision = 1 / PRIOR_SD**2 + y.shape[0]
    mean, sd = float(y.sum() / precision), precision**-0.5
    rng = np.random.default_rng(1)
    exact = {"mu": mean + sd * rng.normal(size=2000)}
    mcmc = MCMC(
        SGLD(gaussian_model, step_size=0.02, variant="corrected"),
        num_warmup=200,
        num_samples=2000,
        progress_bar=False,
    )
    start = time.perf_counter()
    with monitoring.per_step():  # the live notes keep the clock with the bar off
        mcmc.run(random.key(2), y)
    jax.block_until_ready(mcmc.get_samples())
    seconds = time.perf_counter() - start
    shifted = {"mu": exact["mu"] + 2 * sd}
    # The model and data come from the MCMC candidate.
    table = compare({"sgld": mcmc, "shifted": shifted}, exact, ksd_draws=500)
    ksd = table.summary["ksd"]
    assert np.all(np.isfinite(ksd))
    assert ksd["shifted"] > 3 * ksd["reference"]
    frac = table.summary.loc["sgld", "frac_tolerance_exceeded"]
    assert 0 <= frac <= 1
    assert table.summary.loc["sgld", "mean_noise_sd"] > 0
    assert np.isnan(table.summary.loc["shifted", "mean_noise_sd"])
    assert "Sampler statistics" in str(table)
    # The kernel timed its own run (from init to the last step), so ESS per second
    # needs no wall_times=.
    recorded = table.summary.loc["sgld", "sampling_time"]
    assert 0.6 * seconds < recorded <= seconds
    assert table.summary.loc["sgld", "ess_per_s"] == pytest.approx(
        table.summary.loc["sgld", "min_ess_bulk"] / recorded
    )
    assert np.isnan(table.summary.loc["shifted", "ess_per_s"])
    # Given explicitly, the model gives the same KSD for plain draws.
    again = compare(
        {"shifted": shifted},
        exact,
        model=gaussian_model,
        model_args=(y,),
        ksd_draws=500,
    )
    assert again.summary.loc["shifted", "ksd"] == pytest.approx(ksd["shifted"])

    def two_sites(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
        nu = numpyro.sample("nu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
            numpyro.sample("y", dist.Normal(mu + nu, 1.0), obs=y[idx])

    with pytest.raises(ValueError, match="KSD of run 'partial'.*lacks the latent"):
        compare(
            {"partial": {"mu": exact["mu"]}},
            {"mu": exact["mu"], "nu": rng.normal(size=2000)},
            var_names="mu",
            model=two_sites,
            model_args=(y,),
        )


def test_arviz_data_from_numpyro_is_a_run_like_the_mcmc(tmp_path):
    # az.from_numpyro gives InferenceData under ArviZ 0.x and a DataTree under 1.x;
    # both are Mappings of their groups, which must not be taken for a dict of runs.
    y = 1.0 + random.normal(random.key(5), (200,))
    mcmc = MCMC(
        SGLD(gaussian_model, step_size=0.02, variant="corrected"),
        num_warmup=100,
        num_samples=300,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    start = time.perf_counter()
    with monitoring.per_step():  # the live notes keep the clock with the bar off
        mcmc.run(random.key(6), y)
    jax.block_until_ready(mcmc.get_samples())
    seconds = time.perf_counter() - start
    idata = az.from_numpyro(mcmc)
    exact = {"mu": np.random.default_rng(7).normal(float(y.mean()), 0.07, 2000)}
    by_mcmc = compare({"sgld": mcmc}, exact, ksd_draws=0)
    expected = by_mcmc.per_parameter.loc["sgld"]
    # Vectorized chains time as one pass.
    assert 0.6 * seconds < by_mcmc.summary.loc["sgld", "sampling_time"] <= seconds
    for table, name in [
        (compare(idata, exact, ksd_draws=0), "run"),
        (compare({"sgld": idata}, exact, ksd_draws=0), "sgld"),
        (compare([idata], exact, ksd_draws=0), "run 0"),
    ]:
        assert list(table.summary.index) == ["reference", name]
        got = table.per_parameter.loc[name]
        np.testing.assert_allclose(got.values, expected.values, rtol=1e-6)
        # The sampler statistics come from sample_stats.
        assert table.summary.loc[name, "mean_noise_sd"] == pytest.approx(
            by_mcmc.summary.loc["sgld", "mean_noise_sd"]
        )
    # As the reference too (300 SGLD draws per chain are not a trustworthy one),
    # and in plot_marginals.
    with pytest.warns(UserWarning, match="reference is not trustworthy"):
        table = compare({"exact": exact}, idata, ksd_draws=0)
    assert table.summary.loc["reference", "num_draws"] == 600
    path = plot_marginals(idata, idata, tmp_path / "m.png")
    assert path.stat().st_size > 5_000


def test_standardised_ksd_ranks_collapsed_draws_last():
    # 20,000 points: posterior sd 0.007, far below the IMQ kernel's scale of 1.
    y = random.normal(random.key(3), (20_000,))
    precision = 1 / PRIOR_SD**2 + y.shape[0]
    mean, sd = float(y.sum() / precision), precision**-0.5
    rng = np.random.default_rng(4)
    exact = {"mu": mean + sd * rng.normal(size=1000)}
    collapsed = {"mu": mean + 0.1 * sd * rng.normal(size=1000)}  # SGD-like
    kwargs = dict(model=gaussian_model, model_args=(y,), ksd_draws=500)
    ksd = compare({"collapsed": collapsed}, exact, **kwargs).summary["ksd"]
    assert ksd["collapsed"] > 3 * ksd["reference"]
    # Raw coordinates: the V-statistic's diagonal E|score|^2 / m (here 40) dominates
    # and the collapsed draws look better than exact ones. Why the default
    # standardises.
    raw = compare({"collapsed": collapsed}, exact, ksd_standardise=False, **kwargs)
    assert raw.summary.loc["collapsed", "ksd"] < raw.summary.loc["reference", "ksd"]


def test_plot_marginals_writes_a_file(reference, tmp_path):
    w = reference.posterior["w"].values.reshape(-1, 2)
    path = plot_marginals({"wider": {"w": 1.5 * w}}, reference, tmp_path / "m.png")
    assert path.stat().st_size > 10_000
    with pytest.raises(ValueError, match="has no variable"):
        plot_marginals({"bad": {"v": w}}, reference, tmp_path / "n.png")


def test_sequential_chains_add_their_times_and_a_resumed_run_is_not_guessed():
    y = 1.0 + random.normal(random.key(10), (200,))
    exact = {"mu": np.random.default_rng(11).normal(float(y.mean()), 0.07, 1000)}
    mcmc = MCMC(
        SGLD(gaussian_model, step_size=0.02, variant="corrected"),
        num_warmup=100,
        num_samples=400,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    start = time.perf_counter()
    with monitoring.per_step():  # the live notes keep the clock with the bar off
        mcmc.run(random.key(12), y)
    jax.block_until_ready(mcmc.get_samples())
    seconds = time.perf_counter() - start
    recorded = compare(mcmc, exact, ksd_draws=0).summary.loc["run", "sampling_time"]
    assert 0.6 * seconds < recorded <= seconds
    # Resumed from post_warmup_state, NumPyro (0.22) reuses the traced step: the
    # run notes no start and its compilation time is unknown, so no time is
    # reported rather than the steps' time alone (a tenth of the truth here).
    mcmc.post_warmup_state = mcmc.last_state
    start = time.perf_counter()
    with monitoring.per_step():
        mcmc.run(mcmc.post_warmup_state.rng_key, y)
    jax.block_until_ready(mcmc.get_samples())
    seconds = time.perf_counter() - start
    summary = compare(mcmc, exact, ksd_draws=0).summary.loc["run"]
    if not np.isnan(summary["sampling_time"]):  # a NumPyro that traces anew
        assert 0.6 * seconds < summary["sampling_time"] <= seconds
    else:
        assert np.isnan(summary["ess_per_s"])


# ----------------------------------------------------------------------------------
# An untrustworthy reference, and the kernels' warnings


def stuck_reference():
    """Two chains stuck at 0 and at 5, as a dict of draws (one chain, split in two
    for R-hat): R-hat about 3.5."""
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.normal(0.0, 0.1, 1000), rng.normal(5.0, 0.1, 1000)])
    return {"x": x}


def test_an_untrustworthy_reference_warns_marks_the_table_and_strict_raises():
    good = {"x": np.random.default_rng(13).normal(size=2000)}
    with pytest.warns(UserWarning, match=r"reference is not trustworthy.*max R-hat"):
        table = compare({"good": good}, stuck_reference(), ksd_draws=0)
    assert not table.reference_trustworthy
    assert "R-hat" in table.reference_check
    assert str(table).startswith("WARNING: these scores are against an untrustworthy")
    with pytest.raises(ValueError, match="reference is not trustworthy"):
        compare({"good": good}, stuck_reference(), ksd_draws=0, strict=True)
    # reference_posterior's own verdict is taken as it is.
    rng = np.random.default_rng(14)
    flagged = _arviz.from_dict(
        {"posterior": {"x": rng.normal(size=(2, 1000))}},
        attrs={"posterior": {"trustworthy": 0, "max_rhat": 1.53, "min_ess_bulk": 4}},
    )
    with pytest.warns(UserWarning, match="own check: max_rhat 1.53, min_ess_bulk 4"):
        table = compare({"good": good}, flagged, ksd_draws=0)
    assert not table.reference_trustworthy


def test_a_trustworthy_reference_gives_no_warning(reference):
    draws = {"w": reference.posterior["w"].values.reshape(-1, 2)}
    one_chain = {"w": draws["w"]}  # a dict of draws: one chain, split for R-hat
    for ref in (reference, one_chain):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = compare({"same": draws}, ref, ksd_draws=0)
        assert table.reference_trustworthy
        assert "WARNING" not in str(table)


def test_the_warnings_column_shows_what_the_kernel_recorded():
    y = 1.0 + random.normal(random.key(15), (200,))
    exact = {"mu": np.random.default_rng(16).normal(float(y.mean()), 0.07, 1000)}
    runs = {}
    for name, kinds in (("drifted", ("drift", "step", "drift")), ("clean", ())):
        mcmc = MCMC(
            SGLD(gaussian_model, step_size=0.02, variant="corrected"),
            num_warmup=50,
            num_samples=100,
            progress_bar=False,
        )
        mcmc.run(random.key(17), y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            numpyro_sgbd.check(mcmc)  # checked: compare checks it no more
        mcmc.sampler.run_warnings = kinds  # as the kernels record them
        runs[name] = mcmc
    runs["draws"] = exact
    table = compare(runs, exact, ksd_draws=0)
    column = table.summary["warnings"]
    assert column["drifted"] == "drift, step"
    assert column["clean"] == "none"
    assert np.isnan(column["draws"]) and np.isnan(column["reference"])
    text = str(table)
    assert "warnings" in text and "drift, step" in text


def test_long_float32_runs_are_scored_in_float64():
    # 200,000 float32 draws of coefficients near 1 with sds of 0.004, as a
    # 10^6-row regression gives: summed draw by draw in float32 their means
    # came out up to 0.4 sd off.
    rng = np.random.default_rng(1)
    mean, sd = np.array([1.0, -1.9, 1.66]), np.array([0.0037, 0.0046, 0.0045])
    exact = standardised(rng, (1, 200_000, 3), mean, sd)
    ref = _arviz.from_dict(
        {"posterior": {"w": standardised(rng, (2, 2000, 3), mean, sd)}}
    )
    table = compare({"run": {"w": exact[0].astype(np.float32)}}, ref, ksd_draws=0)
    # float32 rounds each draw by at most 6e-8 relative: 0.02 sd here
    assert table.summary.loc["run", "max_bias_mean"] < 0.03
    assert table.summary.loc["run", "xi"] < 0.01
