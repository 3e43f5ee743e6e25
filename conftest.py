import atexit
import gc
import importlib.util
import os
from pathlib import Path
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_platform_name", "cpu")

# A script that tests/test_sharding.py runs in subprocesses (it reads its
# arguments and sets up devices at import): not a module for --doctest-modules.
# The old module paths of the evaluation side warn when imported and hold no
# doctests of their own (tests/test_deprecated_paths.py imports them).
collect_ignore = [
    "tests/sharded_checks.py",
    "numpyro_sgbd/comparison.py",
    "numpyro_sgbd/criticism.py",
    "numpyro_sgbd/diagnostics.py",
    "numpyro_sgbd/reference.py",
]

# JAX's persistent compilation cache, in a directory of this session's own: NumPyro
# compiles its sampling loop anew on every MCMC.run, and parametrised cases compile
# the same programs again and again; from the cache each is loaded instead
# (test_adaptation.py: 180 s without, 155 s with).
# NUMPYRO_SGBD_TEST_CACHE=0 turns it off.
if os.environ.get("NUMPYRO_SGBD_TEST_CACHE", "1") != "0":
    _cache_dir = tempfile.mkdtemp(prefix="jax-cache-")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# Every XLA:CPU executable keeps its own memory mappings, and the suite compiles
# thousands of them: kept to the end, they passed Linux's default limit of 65530
# mappings per process and the compiler crashed (a segfault in CI). JAX's caches
# are cleared after each module, and after any test that leaves more than this
# many mappings (test_kernels alone reached about 34 000).
_MAX_MAPPINGS = 20_000


def _release_compiled_code():
    jax.clear_caches()
    gc.collect()


def _num_mappings():
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: the per-module clearing has to do
        return 0


@pytest.fixture(autouse=True, scope="module")
def _release_after_module():
    yield
    _release_compiled_code()


@pytest.fixture(autouse=True)
def _release_when_many_mappings():
    yield
    if _num_mappings() > _MAX_MAPPINGS:
        _release_compiled_code()


EXAMPLES = Path(__file__).resolve().parent / "examples"


@pytest.fixture(scope="session")
def load_example():
    """Import ``examples/<name>.py`` as a module (the examples are not a package)."""

    def load(name):
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
