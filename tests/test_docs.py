"""The documentation builds with warnings as errors, and its doctests pass.

Run as ``python -m sphinx`` in a subprocess, as a user would, so the build sees a
fresh interpreter (autodoc imports the package; the doctests compile JAX code).
"""

import os
from pathlib import Path
import re
import subprocess
import sys

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def sphinx(builder, out):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b"]
    return subprocess.run(
        cmd + [builder, str(DOCS), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")

    result = sphinx("html", tmp_path / "html")

    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "html" / "index.html").exists()
    # Every gallery page made it in, with its figure.
    pages = sorted(p.stem for p in (DOCS / "gallery").glob("*.rst"))
    for page in pages:
        html = tmp_path / "html" / "gallery" / f"{page}.html"
        assert html.exists(), page
    for image in (DOCS / "_static").glob("*.png"):
        assert (tmp_path / "html" / "_images" / image.name).exists(), image.name


def test_docs_doctests_pass(tmp_path):
    pytest.importorskip("sphinx")

    result = sphinx("doctest", tmp_path / "doctest")

    report = (tmp_path / "doctest" / "output.txt").read_text()
    assert result.returncode == 0, result.stdout + result.stderr + report
    assert "0 failures in tests" in report, report
    assert re.search(r"^\s*[1-9]\d* tests$", report, re.MULTILINE), report
