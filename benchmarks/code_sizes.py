"""The largest modules, classes and functions of the package, before and after a
change (issue 44: no module over 600 lines, no class over 300, no function over
80 lines of code, docstrings aside).

    python benchmarks/code_sizes.py                  # this tree
    python benchmarks/code_sizes.py --against 6571231
    python benchmarks/code_sizes.py --hops           # the modules one run crosses

Modules and classes count every line; a function counts its lines less its
docstring, nested functions included (a closure is part of its parent). With
``--against REV`` the package at REV is read from git, without checking it out.

``--hops`` runs one default ``MCMC(SGBD(model))`` under a profiler hook
(:func:`sys.setprofile`) and reports, for the set-up path (everything
``SGKernel.init`` calls) and for the step (everything the core's
``sample_kernel`` calls while JAX traces it), the package modules whose
functions run and the deepest chain of calls that change module on the way
(issue 61: at most 8 modules for the set-up, 3 for the step).
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


class _Hops:
    """The package modules called inside ``entry`` (a function's code object),
    and the deepest chain of module changes under it."""

    def __init__(self, entry):
        self.entry, self.inside, self.modules = entry, 0, set()
        # The chain of module changes now, and the frames that made them.
        self.stack, self.pushed, self.deepest = [], set(), []

    def __call__(self, frame, event, arg):
        name = frame.f_globals.get("__name__", "")
        if event == "call":
            if frame.f_code is self.entry:
                self.inside += 1
            if self.inside and name.startswith("numpyro_sgbd"):
                self.modules.add(name)
                if not self.stack or self.stack[-1] != name:
                    self.stack.append(name)
                    self.pushed.add(id(frame))
                    if len(self.stack) > len(self.deepest):
                        self.deepest = list(self.stack)
        elif event == "return":
            if id(frame) in self.pushed:
                self.pushed.discard(id(frame))
                self.stack.pop()
            if frame.f_code is self.entry:
                self.inside -= 1


def hops():
    """One default SGBD run on a logistic regression of 2,000 rows, profiled."""
    import sys

    import jax
    import numpy as np
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    from numpyro_sgbd import SGBD, core, kernel

    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([3]).to_event(1))
        with numpyro.plate("data", x.shape[0], subsample_size=100) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3)).astype(np.float32)
    y = (rng.random(2000) < 1 / (1 + np.exp(-x @ np.array([1.0, -1, 0.5])))) * 1.0
    found = {}
    for label, entry in (
        ("set-up (SGKernel.init)", kernel.SGKernel.init.__code__),
        ("step (core's sample_kernel)", core._sample_kernel.__code__),
    ):
        hook = _Hops(entry)
        sys.setprofile(hook)
        try:
            mcmc = MCMC(SGBD(model), num_warmup=200, num_samples=200)
            mcmc.progress_bar = False
            mcmc.run(jax.random.key(0), x, y.astype(np.float32))
        finally:
            sys.setprofile(None)
        found[label] = hook
    for label, hook in found.items():
        names = sorted(m.removeprefix("numpyro_sgbd.") for m in hook.modules)
        print(f"{label}: {len(names)} modules, {len(hook.deepest)} deep")
        print("  modules: " + ", ".join(names))
        chain = [m.removeprefix("numpyro_sgbd.") for m in hook.deepest]
        print("  deepest: " + " -> ".join(chain))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", help="a git revision to compare with")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--hops", action="store_true", help="profile one run")
    args = parser.parse_args()
    if args.hops:
        hops()
        return
    if args.against:
        report(f"at {args.against}", sizes(revision_files(args.against)), args.top)
    report("this tree", sizes(tree_files()), args.top)


if __name__ == "__main__":
    main()
