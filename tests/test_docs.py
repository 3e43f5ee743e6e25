"""The documentation builds with warnings as errors, and its doctests pass.

Run as ``python -m sphinx`` in a subprocess, as a user would, so the build sees a
fresh interpreter (autodoc imports the package; the doctests compile JAX code).
"""

import csv
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


# ------------------------------------------------- numbers the docs quote
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"
BEGIN = "<!-- fertility_summary.md: begin"
END = "<!-- fertility_summary.md: end -->"
#: Decimal numbers README and the guide may type: definitions and advice, not
#: measurements (each with where it comes from).
CONSTANTS = {
    "0.1": "SGBD's increment sd is 0.1 sigma; a move of 0.1 to 0.5 sds",
    "0.5": "a move of 0.1 to 0.5 sds; step 0.5 / sqrt(N)",
    "1.414e-3": "sqrt(2 x 1e-6): the BlackJAX conversion",
    "1.702": "the logistic-normal approximation's constant",
    "1.7": "1.702 rounded",
    "3.3": "the SGBD paper's Section 3.3",
    "0.1-0.2": "xi that is good for most uses (advice)",
    "0.7": "SGBD samples at 0.7 of its warmup step (a default)",
    "3.11": "a Python version",
    "3.12": "a Python version",
    "0.2": "ArviZ's 0.2x series",
}
NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?:[-–]\d+\.\d+)?(?:e-?\d+)?")


def _generated_cells():
    """Every cell of the generated tables (the sampler table, the demo's
    summary), as typed there."""
    cells = set()
    with open(GENERATED / "sampler_table.csv", newline="") as f:
        for row in csv.reader(f):
            cells.update(row)
    for line in (GENERATED / "fertility_summary.md").read_text().splitlines():
        cells.update(c.strip() for c in line.split("|"))
        cells.update(NUMBER.findall(line))
    return cells


def _readme_parts():
    """README's text outside the demo's table, and the table."""
    text = (ROOT / "README.md").read_text()
    head, rest = text.split(BEGIN)
    table, tail = rest.split(END)
    return head + tail, table.split("\n", 1)[1].strip()


def test_readme_table_is_the_demos_own():
    """README's table is the file ``python examples/fertility.py --summary``
    writes, verbatim: regenerate the file, then copy it in."""
    _, table = _readme_parts()
    assert table == (GENERATED / "fertility_summary.md").read_text().strip()


@pytest.mark.parametrize("page", ["README.md", "docs/guide.rst"])
def test_quoted_numbers_are_in_the_generated_tables(page):
    """A measured number in README or the guide is one the generated tables
    hold; the rest are the definitions in :data:`CONSTANTS`."""
    text = _readme_parts()[0] if page == "README.md" else (ROOT / page).read_text()
    cells = _generated_cells()
    stray = [n for n in NUMBER.findall(text) if n not in cells and n not in CONSTANTS]
    assert not stray, (
        f"{page} quotes {stray}, which neither docs/_generated/ nor the "
        "constants hold: quote the regenerated tables or include them"
    )


def test_sampler_table_covers_every_default_sampler():
    """One row per problem and sampler with a default path, NUTS first, each
    run with an accuracy or the error it raised."""
    with open(GENERATED / "sampler_table.csv") as f:
        rows = list(csv.DictReader(f))
    problems = list(dict.fromkeys(r["problem"] for r in rows))
    assert len(problems) >= 5
    for problem in problems:
        mine = [r for r in rows if r["problem"] == problem]
        assert [r["sampler"] for r in mine] == [
            "NUTS",
            "SGBD",
            "SGLD",
            "NOGIN",
            "SGHMC",
            "SGNHT",
        ], problem
        for r in mine[1:]:
            assert r["xi"] or r["warned"].startswith("raised"), (problem, r)


def test_pages_stay_short():
    """README at most 120 lines, the benchmarks page at most 200 (issue 47):
    details go to the usage page, history to benchmarks/results.md."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 120
    assert len((DOCS / "benchmarks.rst").read_text().splitlines()) <= 200
