"""0.1.0's module paths (``numpyro_sgbd.kernels``, ``numpyro_sgbd.reference``)
still import 0.1.0's names: each warns once, pointing at the importer, and gives
the new modules' own objects. The evaluation side's never-released paths are
gone."""

import importlib
import subprocess
import sys

import pytest

from numpyro_sgbd import handlers, kernel, samplers

#: Old path: (its public names and the module each now lives in, a path its
#: warning names).
MOVED = {
    "numpyro_sgbd.kernels": (
        {"SGBD": samplers, "SGLD": samplers, "SGState": kernel},
        "numpyro_sgbd.samplers",
    ),
    "numpyro_sgbd.reference": ({"full_batch": handlers}, "numpyro_sgbd.handlers"),
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


@pytest.mark.parametrize(
    "gone",
    ["numpyro_sgbd.comparison", "numpyro_sgbd.criticism", "numpyro_sgbd.diagnostics"],
)
def test_the_unreleased_paths_are_gone(gone):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(gone)


def test_the_package_imports_none_of_the_old_paths_and_no_arviz():
    """Sampling needs no ArviZ: ``import numpyro_sgbd`` loads neither it nor the
    evaluation side, which loads on first use of one of its names."""
    code = (
        "import sys, numpyro_sgbd\n"
        f"old = [m for m in {sorted(MOVED)!r} if m in sys.modules]\n"
        "assert not old, old\n"
        "heavy = [m for m in ('arviz', 'arviz_base', 'xarray', 'pandas', "
        "'numpyro_sgbd.evaluation.comparison') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "numpyro_sgbd.compare\n"
        "assert 'numpyro_sgbd.evaluation.comparison' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
