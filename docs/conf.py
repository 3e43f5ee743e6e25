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
exclude_patterns = ["_build"]
# Inventories are fetched when the docs are built with network access; offline
# builds only lose the cross-project links.
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", None),
    "numpyro": ("https://num.pyro.ai/en/stable", None),
    "jax": ("https://docs.jax.dev/en/latest", None),
    "arviz": ("https://python.arviz.org/en/stable", None),
}
html_theme = "alabaster"
