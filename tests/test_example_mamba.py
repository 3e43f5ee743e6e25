"""The MAMBA logistic-regression example (tuning paper, Table 1), run with
``--quick``."""

import numpy as np
import pytest


@pytest.mark.slow  # 4 tunes, 6 timed runs and NUTS: 3 to 6 minutes on 2 cores
def test_mamba_logistic_quick(tmp_path, load_example):
    """The quick run (N = 20,000; SGLD with minibatch gradients and SGBD with
    control variates; MAMBA-KSD, MAMBA-FSSD and the default adaptation) writes a
    row for every cell with a finite KSD and xi, its figures and the arms of
    every tune; each MAMBA winner is one of the arms it was given, and each run
    sampled for about the seconds asked.

    Accuracy: corrected SGBD with control variates must have
    ``xi < 0.1 + 3 (xi_mcse + xi_ref_mcse)`` in each of its three runs (bound
    about 0.25). Two runs of seed 0 gave xi 0.024-0.046, xi_mcse 0.02-0.03 and
    NUTS's error 0.024. A sampler that ignored the plate's N/n factor would have
    sds about sqrt(N/n) = 10 times too wide, xi near 9; one stuck at its start, xi
    near 1. tune charges wall-clock seconds, so the arms it picks vary from run to
    run with the machine's load (every SGBD tune so far picked h = 0.5, the top of
    its grid). Injected by hand once: the draws collapsed half-way to their mean
    in the example's ``sample_for`` gave xi 0.48-0.49 for SGBD, and this test
    fails.
    """
    pytest.importorskip("matplotlib")
    pd = pytest.importorskip("pandas")
    ex = load_example("mamba_logistic")

    ex.main(["--quick", "--out", str(tmp_path)])

    args = ex.parse_args(["--quick"])
    for name in ("mamba_logistic.png", "mamba_logistic_tune.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    table = pd.read_csv(tmp_path / "mamba_logistic.csv")
    report = table.to_string()
    expected = {(f"{s} {g}", m) for s, g in ex.QUICK_ROWS for m in ex.METHODS}
    assert set(zip(table["row"], table["method"])) == expected, report
    assert len(table) == len(expected), report
    assert table["error"].isna().all(), report
    finite = ["xi", "xi_mcse", "ksd", "ksd_ref", "xi_ref_mcse", "min_ess_bulk"]
    finite += ["num_samples", "sample_seconds", "step_size", "tune_seconds"]
    assert np.all(np.isfinite(table[finite].to_numpy(dtype=float))), report
    assert (table["sample_seconds"] >= 0.5 * args.sample_seconds).all(), report

    arms = pd.read_csv(tmp_path / "mamba_logistic_arms.csv")
    for row in table.itertuples():
        if row.method == "default":
            assert row.subsample_size == args.subsample_size, report
            continue
        tuned = arms[(arms["row"] == row.row) & (arms["method"] == row.method)]
        first = tuned[tuned["round"] == 0]
        # tune's default step grid: twice the sampler's step_size=None target,
        # the target, and down from there.
        target = ex.SAMPLERS[row.sampler].spec.step_target
        grid = np.unique(first["step_size"])
        assert np.isclose(grid.max(), 2 * target), first.to_string()
        assert np.isclose(grid, target).any() and len(grid) > 2, first.to_string()
        assert set(first["subsample_size"]) == set(args.tune_subsample_sizes)
        assert row.subsample_size in args.tune_subsample_sizes, report
        assert np.isclose(grid, row.step_size).any(), report
        winner = tuned[tuned["status"] == "winner"]
        assert len(winner) == 1, tuned.to_string()
        assert winner["subsample_size"].item() == row.subsample_size
        assert np.isclose(winner["step_size"].item(), row.step_size)
        assert winner["round"].item() == tuned["round"].max() > 0, tuned.to_string()

    sgbd = table[table["row"] == "SGBD control_variates"]
    bound = 0.1 + 3 * (sgbd["xi_mcse"] + sgbd["xi_ref_mcse"])
    assert (sgbd["xi"] < bound).all(), report
