"""Importing the package changes nothing in JAX; the threefry backport is a call.

Issue 44, item 7: ``import numpyro_sgbd`` once swapped JAX's CPU lowering of
the threefry hash for the whole process. It is now
:func:`numpyro_sgbd.unroll_threefry_on_cpu` or the ``with`` block
:func:`numpyro_sgbd.unrolled_threefry`, and these tests hold both to their word.
"""

import json
import os
from pathlib import Path
import subprocess
import sys

import jax
from jax import random
import numpy as np
import pytest

import numpyro_sgbd
from numpyro_sgbd import _threefry, unroll_threefry_on_cpu, unrolled_threefry

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: JAX's lowering rules as JAX alone registers them,
# then as they are after ``import numpyro_sgbd``. Prints, as JSON, the
# (platform, primitive) of every rule registered before whose entry is no longer
# the same object, and whether threefry's CPU rule was among those registered.
_IMPORT_CHECK = """
import json

import jax
import jax.random  # registers threefry2x32's rules
from jax._src.interpreters import mlir
from jax.extend.random import threefry2x32_p


def snapshot():
    rules = {("any", p): entry for p, entry in mlir._lowerings.items()}
    for platform, table in mlir._platform_specific_lowerings.items():
        rules.update({(platform, p): entry for p, entry in table.items()})
    return rules


before = snapshot()
import numpyro_sgbd  # noqa: E402

after = snapshot()
changed = sorted(
    f"{platform}: {p}" for (platform, p), entry in before.items()
    if after.get((platform, p)) is not entry
)
print(json.dumps({
    "changed": changed,
    "threefry_cpu_rule": ("cpu", threefry2x32_p) in before,
    "package": numpyro_sgbd.__file__,
}))
"""


def test_import_leaves_jax_lowering_rules_as_they_were():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(result["package"]).resolve().parent == ROOT / "numpyro_sgbd"
    assert result["changed"] == []
    # The rule the package used to swap was there to be compared, where this JAX
    # registers a CPU rule of its own for threefry.
    if _threefry._threefry_module() is not None:
        assert result["threefry_cpu_rule"]


def _cpu_entry():
    table = _threefry._cpu_lowerings()
    module = _threefry._threefry_module()
    if table is None or module is None:
        pytest.skip("this JAX has no rolled CPU rule: it unrolls everywhere")
    return table.get(module.threefry2x32_p)


def _draws(key):
    k1, k2, k3 = random.split(key, 3)
    return (
        random.key_data(random.split(random.fold_in(k1, 7), 4)),
        random.normal(k1, (1001,)),
        random.randint(k2, (777,), 0, 10**6),
        random.bits(k3, (5, 3)),
    )


def _compiled_draws():
    """The draws of a program compiled now, and whether it has a while loop."""
    jax.clear_caches()  # compiled programs keep their lowering
    f = jax.jit(_draws)
    text = f.lower(random.key(3)).compile().as_text()
    return [np.asarray(x) for x in f(random.key(3))], " while(" in text


def test_unrolled_threefry_gives_the_same_draws_without_loops_and_restores():
    """Inside ``unrolled_threefry()`` threefry is lowered for the CPU unrolled:
    the draws of JAX's rolled CPU rule bit for bit (splits, fold_in, normal,
    randint, bits), and no while loop left in the compiled program. On leaving
    it, JAX's own rule entry is registered again, the same object."""
    if jax.default_backend() != "cpu":
        pytest.skip("the rolled lowering is JAX's CPU rule only")
    before = _cpu_entry()
    rolled, rolled_loops = _compiled_draws()
    if not rolled_loops:
        pytest.skip("this JAX's own CPU rule is unrolled already")
    try:
        with unrolled_threefry() as swapped:
            assert swapped
            unrolled, unrolled_loops = _compiled_draws()
        assert _cpu_entry() is before
        again, again_loops = _compiled_draws()
    finally:
        jax.clear_caches()
    assert not unrolled_loops
    assert again_loops
    for a, b, c in zip(rolled, unrolled, again):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_unroll_threefry_on_cpu_swaps_both_ways():
    """The explicit call registers the unrolled rule, and ``unrolled=False``
    JAX's rolled one; both stay until changed (here, until the ``with`` block
    that wraps them restores the rule the test found)."""
    module = _threefry._threefry_module()
    before = _cpu_entry()
    with unrolled_threefry():
        assert unroll_threefry_on_cpu(False)
        assert _cpu_entry().rule is module._threefry2x32_cpu_lowering_rule
        assert unroll_threefry_on_cpu()
        assert _cpu_entry().rule is module._threefry2x32_lowering_rule
    assert _cpu_entry() is before


def test_unrolled_threefry_nests_and_restores_on_error():
    before = _cpu_entry()
    with pytest.raises(RuntimeError, match="inside"):
        with unrolled_threefry():
            outer = _cpu_entry()
            with unrolled_threefry():
                pass
            assert _cpu_entry() is outer
            raise RuntimeError("inside")
    assert _cpu_entry() is before


def test_without_a_rolled_rule_both_do_nothing(monkeypatch):
    """A JAX with no separate rolled CPU rule (or that moved the private names):
    the call returns False, the block runs with JAX's rules untouched."""
    from jax._src.interpreters import mlir

    def entries():
        return {
            (platform, p): id(entry)
            for platform, table in mlir._platform_specific_lowerings.items()
            for p, entry in table.items()
        }

    before = entries()
    for missing in ("_threefry_module", "_cpu_lowerings"):
        with monkeypatch.context() as patch:
            patch.setattr(_threefry, missing, lambda: None)
            assert unroll_threefry_on_cpu() is False
            assert unroll_threefry_on_cpu(False) is False
            with unrolled_threefry() as swapped:
                assert swapped is False
        assert entries() == before


def test_the_backport_is_public():
    for name in ("unroll_threefry_on_cpu", "unrolled_threefry"):
        assert name in numpyro_sgbd.__all__
        assert getattr(numpyro_sgbd, name).__doc__
