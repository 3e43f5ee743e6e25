"""Sphinx configuration: ``sphinx-build -b html docs docs/_build/html``."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

from numpyro_sgbd import __version__  # noqa: E402

project = "numpyro-sgbd"
author = "numpyro-sgbd developers"
release = __version__
version = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx.ext.napoleon",
]
autodoc_member_order = "bysource"
exclude_patterns = ["_build", "_generated"]  # included by other pages
# Cross-project links. Each project's inventory is fetched from its site when the
# build has network access; offline (CI reaches only the package registries) the
# build falls back to a small inventory written below, which lists exactly the
# objects these docs link to, at their addresses on the same sites. Either way
# there is no fetch warning, so ``sphinx-build -W`` passes offline too.
_SITES = {
    "python": "https://docs.python.org/3/",
    "numpyro": "https://num.pyro.ai/en/stable/",
    "jax": "https://docs.jax.dev/en/latest/",
    # Only the 0.x-only class arviz.InferenceData is linked here, at its home in the
    # 0.x docs (1.x moved its API pages to the arviz-base/-stats/-plots sites and
    # has no InferenceData); 1.x's container is linked at xarray's, so both links
    # resolve whichever ArviZ a reader has.
    "arviz": "https://python.arviz.org/en/v0.23.0/",
    "xarray": "https://docs.xarray.dev/en/stable/",
}
_OFFLINE_OBJECTS = {
    "python": [
        ("functools.partial", "py:function", "library/functools.html#$"),
        ("pickle", "py:module", "library/pickle.html#module-$"),
    ],
    "numpyro": [
        ("numpyro.infer.mcmc.MCMC", "py:class", "mcmc.html#$"),
        ("numpyro.infer.mcmc.MCMC.run", "py:method", "mcmc.html#$"),
        ("numpyro.infer.mcmc.MCMC.get_samples", "py:method", "mcmc.html#$"),
        ("numpyro.infer.mcmc.MCMCKernel", "py:class", "mcmc.html#$"),
        ("numpyro.infer.hmc.NUTS", "py:class", "mcmc.html#$"),
        ("numpyro.primitives.plate", "py:class", "primitives.html#$"),
    ],
    "jax": [
        (name, role, f"_autosummary/{name}.html#$")
        for name, role in [
            ("jax.vmap", "py:function"),
            ("jax.pure_callback", "py:function"),
            ("jax.debug.callback", "py:function"),
            ("jax.flatten_util.ravel_pytree", "py:function"),
        ]
    ],
    "arviz": [
        ("arviz.InferenceData", "py:class", "api/generated/arviz.InferenceData.html#$"),
    ],
    "xarray": [
        ("xarray.DataTree", "py:class", "generated/xarray.DataTree.html#$"),
    ],
}


def _write_offline_inventory(project, objects):
    """Write a Sphinx v2 inventory (a 4-line header, then zlib-compressed lines
    ``name domain:role priority uri display-name``) and return its path."""
    import zlib

    folder = os.path.join(os.path.dirname(__file__), "_build", "inventories")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{project}.inv")
    body = "".join(f"{name} {role} 1 {uri} -\n" for name, role, uri in objects)
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n# Version: \n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    with open(path, "wb") as f:
        f.write(header.encode() + zlib.compress(body.encode()))
    return path


intersphinx_mapping = {
    project: (url, (None, _write_offline_inventory(project, _OFFLINE_OBJECTS[project])))
    for project, url in _SITES.items()
}
intersphinx_timeout = 10
html_theme = "alabaster"

# The doctest builder runs the pages' ``.. doctest::`` blocks. The ``>>>`` examples
# in the docstrings that autodoc pulls in are run by pytest's --doctest-modules,
# each with its own module's names in scope, so they are not run twice here.
doctest_test_doctest_blocks = ""
