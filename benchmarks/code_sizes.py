"""The largest modules, classes and functions of the package, before and after a
change (issue 44: no module over 600 lines, no class over 300, no function over
80 lines of code, docstrings aside).

    python benchmarks/code_sizes.py                  # this tree
    python benchmarks/code_sizes.py --against 6571231

Modules and classes count every line; a function counts its lines less its
docstring, nested functions included (a closure is part of its parent). With
``--against REV`` the package at REV is read from git, without checking it out.
"""

import argparse
import ast
from pathlib import Path
import subprocess

ROOT = Path(__file__).resolve().parent.parent
LIMITS = {"modules": 600, "classes": 300, "functions": 80}


def _docstring_lines(node):
    body = node.body
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.end_lineno - first.lineno + 1
    return 0


def sizes(files):
    """``{"modules": [...], "classes": [...], "functions": [...]}`` of ``(lines,
    name)`` for ``files``, a dict of path to source."""
    out = {"modules": [], "classes": [], "functions": []}
    for path, source in sorted(files.items()):
        out["modules"].append((len(source.splitlines()), path))
        for node in ast.walk(ast.parse(source)):
            name = f"{Path(path).name}:{getattr(node, 'name', '')}"
            if isinstance(node, ast.ClassDef):
                out["classes"].append((node.end_lineno - node.lineno + 1, name))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
                out["functions"].append((lines, name))
    return {k: sorted(v, reverse=True) for k, v in out.items()}


def tree_files():
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for p in (ROOT / "numpyro_sgbd").rglob("*.py")
    }


def revision_files(rev):
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "numpyro_sgbd"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        name: subprocess.run(
            ["git", "show", f"{rev}:{name}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for name in names
        if name.endswith(".py")
    }


def report(label, found, top):
    print(label)
    for kind, rows in found.items():
        over = sum(1 for lines, _ in rows if lines > LIMITS[kind])
        shown = ", ".join(f"{name} {lines}" for lines, name in rows[:top])
        print(f"  {kind} (over {LIMITS[kind]}: {over}): {shown}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", help="a git revision to compare with")
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    if args.against:
        report(f"at {args.against}", sizes(revision_files(args.against)), args.top)
    report("this tree", sizes(tree_files()), args.top)


if __name__ == "__main__":
    main()
