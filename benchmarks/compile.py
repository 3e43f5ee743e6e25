"""Compile once (issue 59, item 5): what first and later fits compile.

For a first fit and the later ones: the seconds running, the seconds XLA spent
compiling, and the programs it compiled.

    python benchmarks/compile.py                      # parts a, b and c
    python benchmarks/compile.py --parts a --fits 10
    python benchmarks/compile.py --parts c --rows 1000000
    python benchmarks/compile.py --json compile.json  # every number, as JSON

Every case starts in fresh processes, so that its first fit compiles what a
user's would; programs and compile seconds are counted by
``refits.CompiledPrograms`` (JAX's backend compile events less its persistent
cache's hits; the seconds are backend compile seconds, a hit's load
included, tracing and lowering not).

- **(a) refits.** ``benchmarks/refits.py`` (its ``fits``, through its command
  line): a 2,000-row logistic regression, 500 + 2,000 samples, one ``MCMC``
  with ``jit_model_args=True`` fitted to ``--fits`` data sets of the same
  shapes (default 5), for ``SGBD(model)``, ``SGLD(model)`` and
  ``NOGIN(model)``; each sampler in three settings, a process each: NumPyro's
  progress bar off, on, and off with JAX's persistent cache in a new
  directory. First: the first fit; later: the mean of the others (their
  programs listed fit by fit). Target: the later fits compile no program and
  take at most 1/5 of the first's seconds.
- **(b) a new process.** ``examples/fertility.py --quick`` run twice, in two
  fresh processes that share a new persistent cache directory
  (``jax_persistent_cache_min_compile_time_secs`` and
  ``..._min_entry_size_bytes`` 0) and the same ``--out`` directory (so the
  second also reads the NUTS reference the first cached there). Each process
  counts from the call of the example's ``main`` (loaded with ``runpy``).
  Target: the second process compiles for at most 10 % of the first's compile
  seconds.
- **(c) tune.** ``numpyro_sgbd.tune(model, X, y, n, budget=10)`` on the MAMBA
  logistic regression of ``examples/mamba_logistic.py`` (its ``model`` and
  ``simulate``: d = 10, N = ``--rows``, default 10^5, the plate declared with
  n = N / 100), one call counted from the call to the result. Target: wall
  time at most 1.25 x 10 + 5 s. Where ``tune`` refuses the budget
  (``ValueError``) or fails, the row says so and the message is printed below
  the table.

Printed: a line per case as it ends, then a Markdown table, one row a case:
first (s, compile s, programs, loaded from the cache), later (the same),
later / first (of the quantity the target names: seconds in (a), compile
seconds in (b)) and the target, met or missed.
"""

import argparse
import json
from pathlib import Path
import runpy
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
SAMPLERS = ("SGBD", "SGLD", "NOGIN")
#: Part (a)'s settings: refits.py's options for each ({cache}: a new directory).
REFIT_SETTINGS = {
    "bar off": [],
    "bar on": ["--bar"],
    "bar off, cache": ["--cache", "{cache}"],
}
#: The line a child process prints its numbers on.
MARK = "compile.py child: "


def _run(command):
    """Run ``command`` from the repository root; its stdout, or exit with its
    stderr's tail where it failed."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, command))} failed:\n{done.stderr[-4000:]}")
    return done.stdout


def _child(*options):
    """Run this script as a child with ``options``; the dict it prints."""
    out = _run([sys.executable, __file__, *map(str, options)])
    line = next(line for line in out.splitlines() if line.startswith(MARK))
    return json.loads(line[len(MARK) :])


def _counted(compiled, seconds):
    return {
        "seconds": seconds,
        "compile_seconds": compiled.seconds,
        "programs": compiled.programs,
        "loaded": compiled.hits,
    }


def child_fertility(cache, out):
    """In a child: ``examples/fertility.py --quick --out OUT`` under the
    persistent cache in ``cache``, counted from the call of its ``main``."""
    from refits import CompiledPrograms, persistent_cache

    persistent_cache(cache)
    example = runpy.run_path(str(ROOT / "examples" / "fertility.py"))
    with CompiledPrograms() as compiled:
        start = time.perf_counter()
        example["main"](["--quick", "--out", str(out)])
        return _counted(compiled, time.perf_counter() - start)


def child_tune(rows, budget):
    """In a child: one call of ``tune`` on the MAMBA logistic regression with
    ``rows`` rows, counted from the call to the result (or to its refusal)."""
    import jax
    from refits import CompiledPrograms

    from numpyro_sgbd import tune

    example = runpy.run_path(str(ROOT / "examples" / "mamba_logistic.py"))
    X, y, _ = example["simulate"](rows, 10, 0)
    jax.block_until_ready((X, y))
    with CompiledPrograms() as compiled:
        start = time.perf_counter()
        try:
            tune(example["model"], X, y, max(2, rows // 100), budget=budget)
            outcome = "ran"
        except Exception as err:  # a refused budget (ValueError), or a failure
            outcome = f"{type(err).__name__}: {err}"
        return {**_counted(compiled, time.perf_counter() - start), "outcome": outcome}


def part_a(num_fits, workdir):
    rows = []
    for name in SAMPLERS:
        for setting, options in REFIT_SETTINGS.items():
            out = workdir / f"refits-{len(rows)}.json"
            cache = workdir / f"cache-{len(rows)}"
            options = [option.format(cache=cache) for option in options]
            command = [sys.executable, str(HERE / "refits.py"), "--samplers", name]
            _run(command + ["--fits", str(num_fits), "--json", str(out), *options])
            fits = json.loads(out.read_text())[name]
            later = {
                key: [fit[key] for fit in fits[1:]]
                for key in ("seconds", "compile_seconds", "programs", "loaded")
            }
            for key in ("seconds", "compile_seconds"):
                later[key] = sum(later[key]) / len(later[key])
            ratio = later["seconds"] / fits[0]["seconds"]
            met = ratio <= 0.2 and not any(later["programs"])
            case = f"{name}, {setting}"
            rows.append(_row("a", case, fits[0], later, f"{ratio:.2f} (s)", met))
            rows[-1]["target"] = "<= 0.2, 0 programs"
            _progress(rows[-1])
    return rows


def part_b(workdir):
    cache, out = workdir / "fertility-cache", workdir / "fertility-out"
    first, later = (
        _child("--child", "fertility", "--cache", cache, "--out", out) for _ in range(2)
    )
    ratio = later["compile_seconds"] / first["compile_seconds"]
    case = "fertility.py --quick, a new process"
    row = _row("b", case, first, later, f"{ratio:.2f} (compile s)", ratio <= 0.1)
    row["target"] = "<= 0.1"
    _progress(row)
    return [row]


def part_c(rows, budget):
    result = _child("--child", "tune", "--rows", rows, "--budget", budget)
    bound = 1.25 * budget + 5
    case = f"tune, N = {rows:.0e}, budget {budget:g} s"
    row = _row("c", case, result, None, None, result["seconds"] <= bound)
    row["outcome"], row["target"] = result["outcome"], f"<= {bound:g} s"
    if result["outcome"] != "ran":
        row["met"] = None
    _progress(row)
    return [row]


def _row(part, case, first, later, ratio, met):
    return dict(part=part, case=case, first=first, later=later, ratio=ratio, met=met)


def _cells(numbers):
    if numbers is None:
        return ["-"] * 4
    programs, loaded = (
        " ".join(map(str, n)) if isinstance(n, list) else str(n)
        for n in (numbers["programs"], numbers["loaded"])
    )
    return [
        f"{numbers['seconds']:.2f}",
        f"{numbers['compile_seconds']:.2f}",
        programs,
        loaded,
    ]


def _verdict(row):
    if row["met"] is None:
        error = row["outcome"].split(":")[0]
        return f"refused ({error})" if error == "ValueError" else f"failed ({error})"
    return "met" if row["met"] else "missed"


def _progress(row):
    text = f"({row['part']}) {row['case']}:"
    for when in ("first", "later"):
        if row[when] is not None:
            s, compiling, programs, loaded = _cells(row[when])
            text += f" {when} {s} s ({compiling} s compiling, programs {programs}"
            text += f", loaded {loaded});"
    print(f"{text} {row['ratio'] or '-'}; {_verdict(row)}", flush=True)


def table(rows):
    """The Markdown table of ``rows``; the refusals' messages below it."""
    header = ["part", "case"]
    for when in ("first", "later"):
        header += [f"{when} s", "compile s", "programs", "loaded"]
    header += ["later / first", "target"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["part"], row["case"], *_cells(row["first"])]
        cells += [*_cells(row["later"]), row["ratio"] or "-"]
        cells.append(f"{row['target']}: {_verdict(row)}")
        lines.append("| " + " | ".join(cells) + " |")
    for row in rows:
        if row.get("outcome", "ran") != "ran":
            lines.append(f"\n({row['part']}) {row['case']}: {row['outcome']}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices="abc", default=list("abc"))
    parser.add_argument("--fits", type=int, default=5, help="(a): fits per case")
    parser.add_argument("--rows", type=int, default=100_000, help="(c): N")
    parser.add_argument("--budget", type=float, default=10.0, help="(c): seconds")
    parser.add_argument("--json", help="write every case's numbers to this file")
    parser.add_argument(
        "--child", choices=["fertility", "tune"], help=argparse.SUPPRESS
    )
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "fertility":
        print(MARK + json.dumps(child_fertility(args.cache, args.out)), flush=True)
        return
    if args.child == "tune":
        print(MARK + json.dumps(child_tune(args.rows, args.budget)), flush=True)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="compile-") as workdir:
        workdir = Path(workdir)
        if "a" in args.parts:
            rows += part_a(args.fits, workdir)
        if "b" in args.parts:
            rows += part_b(workdir)
        if "c" in args.parts:
            rows += part_c(args.rows, args.budget)
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
