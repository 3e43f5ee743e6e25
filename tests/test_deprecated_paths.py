"""The evaluation side's old module paths (before numpyro_sgbd.evaluation) still
import: each warns once, pointing at the importer, and gives the new modules'
own objects."""

import subprocess
import sys

import pytest

from numpyro_sgbd.evaluation import comparison, criticism, drift, fssd, ksd, laplace
from numpyro_sgbd.evaluation import reference as reference_module

#: Old path: (its public names, the new module of each, a new path its warning
#: names).
MOVED = {
    "numpyro_sgbd.comparison": (
        {name: comparison for name in ("Comparison", "compare", "plot_marginals")},
        "numpyro_sgbd.evaluation.comparison",
    ),
    "numpyro_sgbd.criticism": (
        {
            name: criticism
            for name in (
                "LOG_LIKELIHOOD_ROWS",
                "from_numpyro",
                "full_data_log_likelihood",
            )
        },
        "numpyro_sgbd.evaluation.criticism",
    ),
    "numpyro_sgbd.diagnostics": (
        {
            "drift": drift,
            "fssd": fssd,
            "fssd_opt": fssd,
            "imq_ksd": ksd,
            "ksd": ksd,
            "posterior_ksd": ksd,
            "unconstrained_draws_and_scores": ksd,
        },
        "numpyro_sgbd.evaluation.ksd",
    ),
    "numpyro_sgbd.reference": (
        {
            **{
                name: laplace
                for name in (
                    "AUTO_CONDITION",
                    "AUTO_SD_RATIO",
                    "AUTO_SHRINKAGE",
                    "LAPLACE_DENSE_MAX_DIM",
                )
            },
            **{
                name: reference_module
                for name in (
                    "ESS_PER_CHAIN_MIN",
                    "PosteriorMode",
                    "RHAT_MAX",
                    "full_batch",
                    "full_batch_scores",
                    "posterior_mode",
                    "reference_posterior",
                )
            },
        },
        "numpyro_sgbd.evaluation.reference",
    ),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_gives_the_new_objects(old, monkeypatch):
    names, new = MOVED[old]
    # A fresh import, whatever imported the old path before in this session.
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated.*{new}") as rec:
        module = __import__(old, fromlist=["__all__"])
    ours = [w for w in rec if issubclass(w.category, DeprecationWarning)]
    assert len(ours) == 1
    assert ours[0].filename == __file__  # the importer, not the shim
    assert sorted(module.__all__) == sorted(names)
    for name, home in names.items():
        assert getattr(module, name) is getattr(home, name), name


def test_the_package_imports_none_of_the_old_paths():
    code = (
        "import sys, numpyro_sgbd\n"
        f"old = [m for m in {sorted(MOVED)!r} if m in sys.modules]\n"
        "assert not old, old\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
