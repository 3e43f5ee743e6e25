"""Same keys, same draws: every sampler and variant before and after a change.

    python benchmarks/draws_identity.py --against 6571231   # about 5 minutes
    python benchmarks/draws_identity.py --save now.npz      # record this tree
    python benchmarks/draws_identity.py --compare a.npz b.npz

A redesign of the kernels (issue 44) must keep their draws. This runs each case
below (every sampler, variant, increment and gradient, a fixed step and
``step_size=None``, several steps a sample, the preconditioner forms, a model
with a constrained site, ``potential_fn``, host-held data) for a short warmup and
sampling run on fixed keys, and records the draws, the extra fields and the
last state's leaves. ``--against REV`` checks out REV in a temporary git
worktree, records its draws with this same case list in a child process that
imports REV's package (checked), records the draws of the tree this script sits
in in another, and compares: the largest absolute difference per case, and which
cases differ. It exits 1 when any case differs by more than ``--atol`` (0: bit
for bit) or exists on one side only.
"""

import argparse
import os
from pathlib import Path
import subprocess
import sys
import tempfile

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
NUM_WARMUP, NUM_SAMPLES = 150, 100


def _data():
    rng = np.random.default_rng(0)
    N, d = 2000, 3
    X = rng.normal(size=(N, d)).astype(np.float32)
    beta = np.array([0.8, -0.5, 0.3], np.float32)
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ beta))).astype(np.float32)
    return X, y


def _models():
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def logistic(X, y, n):
        theta = numpyro.sample("theta", dist.Normal(0, 1).expand([X.shape[1]]))
        with numpyro.plate("N", X.shape[0], subsample_size=n) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ theta), obs=y[idx])

    def linear(X, y, n):  # a constrained site: sigma > 0
        theta = numpyro.sample("theta", dist.Normal(0, 1).expand([X.shape[1]]))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("N", X.shape[0], subsample_size=n) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ theta, sigma), obs=y[idx])

    def potential(z):
        return 0.5 * jnp.sum((z["x"] - 1.0) ** 2 / jnp.array([1.0, 4.0]))

    return logistic, linear, potential


def _unit(x):
    return 1.0 + 0.0 * x


def cases():
    """``{name: (make_kernel, args)}``; each run on its own fixed key."""
    import jax.numpy as jnp

    import numpyro_sgbd as sg

    logistic, linear, potential = _models()
    X, y = _data()
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    lin_y = Xj @ jnp.array([0.8, -0.5, 0.3]) + 0.5 * jnp.asarray(
        np.random.default_rng(1).normal(size=len(y)).astype(np.float32)
    )
    args = (Xj, yj, 100)
    out = {}

    def add(name, make, a=args):
        out[name] = (make, a)

    for cls, variants in (
        (sg.SGBD, ("vanilla", "corrected", "extreme")),
        (sg.SGLD, ("vanilla", "corrected", "extreme")),
    ):
        for variant in variants:
            for gradient in ("minibatch", "control_variates"):
                add(
                    f"{cls.__name__} {variant} {gradient} fixed",
                    lambda c=cls, v=variant, g=gradient: c(
                        logistic, step_size=0.02, variant=v, gradient=g
                    ),
                )
            add(
                f"{cls.__name__} {variant} adapted",
                lambda c=cls, v=variant: c(logistic, variant=v),
            )
    add("SGBD default", lambda: sg.SGBD(logistic))
    add("SGLD default", lambda: sg.SGLD(logistic))
    add(
        "SGBD gaussian", lambda: sg.SGBD(logistic, step_size=0.02, increment="gaussian")
    )
    add("SGBD num_steps=3", lambda: sg.SGBD(logistic, step_size=0.02, num_steps=3))
    add("SGBD replace", lambda: sg.SGBD(logistic, step_size=0.02, replace=True))
    add(
        "SGBD recentre_every",
        lambda: sg.SGBD(
            logistic, step_size=0.02, gradient="control_variates", recentre_every=50
        ),
    )
    for form in ("dense", "lowrank", "diagonal"):
        add(f"SGBD precond {form}", lambda f=form: sg.SGBD(logistic, preconditioner=f))
        add(f"SGLD precond {form}", lambda f=form: sg.SGLD(logistic, preconditioner=f))
    add("SGBD no mass", lambda: sg.SGBD(logistic, adapt_mass_matrix=False))
    add("SGBD linear adapted", lambda: sg.SGBD(linear), (Xj, lin_y, 100))
    add("SGLD linear adapted", lambda: sg.SGLD(linear), (Xj, lin_y, 100))
    add("NOGIN default", lambda: sg.NOGIN(logistic))
    add("NOGIN fixed", lambda: sg.NOGIN(logistic, step_size=0.02))
    add("NOGIN linear", lambda: sg.NOGIN(linear), (Xj, lin_y, 100))
    for cov in ("diag", "full", "lowrank"):
        add(f"NOGIN {cov}", lambda c=cov: sg.NOGIN(logistic, covariance=c))
    add("NOGIN num_steps=2", lambda: sg.NOGIN(logistic, step_size=0.02, num_steps=2))
    add("SGHMC default", lambda: sg.SGHMC(logistic))
    add("SGHMC fixed", lambda: sg.SGHMC(logistic, step_size=0.01))
    add(
        "SGHMC corrected cv",
        lambda: sg.SGHMC(
            logistic,
            step_size=0.01,
            friction=80.0,
            variant="corrected",
            gradient="control_variates",
        ),
    )
    add("SGNHT fixed", lambda: sg.SGNHT(logistic, step_size=0.01))
    add("SGNHT default", lambda: sg.SGNHT(logistic))
    add(
        "Recipe",
        lambda: sg.Recipe(logistic, step_size=0.01, diffusion=_unit),
    )
    add(
        "Recipe momentum",
        lambda: sg.Recipe(logistic, step_size=0.01, diffusion=_unit, momentum=True),
    )
    add(
        "SGRLD",
        lambda: sg.SGRLD(
            logistic, step_size=0.01, inverse_metric={"theta": lambda z: 1.0 + 0.0 * z}
        ),
    )
    add(
        "SGBD potential_fn",
        lambda: sg.SGBD(potential_fn=potential, step_size=0.3),
        (),
    )
    add(
        "SGLD potential_fn",
        lambda: sg.SGLD(potential_fn=potential, step_size=0.3),
        (),
    )
    add(
        "SGBD host data",
        lambda: sg.SGBD(logistic),
        (sg.host_data(X), sg.host_data(y), 100),
    )
    return out


def _leaves(tree, prefix, store):
    import jax

    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = prefix + jax.tree_util.keystr(path)
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        store[name] = np.asarray(leaf)


def record(path, only=None):
    """Run every case (or those named in ``only``) and save ``{case: arrays}``."""
    import warnings

    import jax
    from jax import random
    from numpyro.infer import MCMC

    import numpyro_sgbd

    where = Path(numpyro_sgbd.__file__).resolve().parent
    print(f"numpyro_sgbd from {where}", flush=True)
    expected = os.environ.get("DRAWS_IDENTITY_PACKAGE")
    if expected and where != Path(expected).resolve() / "numpyro_sgbd":
        raise SystemExit(f"imported {where}, expected the tree at {expected}")
    store = {}
    for i, (name, (make, args)) in enumerate(sorted(cases().items())):
        if only and name not in only:
            continue
        init = None
        if not args:  # potential_fn: an initial point
            init = {"x": jax.numpy.zeros(2)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                kernel = make()
                mcmc = MCMC(
                    kernel,
                    num_warmup=NUM_WARMUP,
                    num_samples=NUM_SAMPLES,
                    progress_bar=False,
                )
                mcmc.run(
                    random.key(i),
                    *args,
                    init_params=init,
                    extra_fields=tuple(kernel.default_fields),
                )
            except Exception as err:  # a case that fails is recorded as failing
                store[f"{name}|error"] = np.array(f"{type(err).__name__}: {err}")
                print(f"{name}: {type(err).__name__}: {err}", flush=True)
                continue
        _leaves(mcmc.get_samples(), f"{name}|samples", store)
        _leaves(mcmc.get_extra_fields(), f"{name}|extra", store)
        _leaves(mcmc.last_state, f"{name}|state", store)
        print(f"recorded {name}", flush=True)
    np.savez(path, **store)


def compare(path_a, path_b, atol=0.0):
    """Print the largest difference per case; return the cases that differ."""
    a, b = np.load(path_a), np.load(path_b)
    names = sorted({k.split("|")[0] for k in (*a.files, *b.files)})
    bad = []
    for name in names:
        ka = {k for k in a.files if k.split("|")[0] == name}
        kb = {k for k in b.files if k.split("|")[0] == name}
        # A state field one side lacks (a field added to the state) is listed;
        # every other field, draws and statistics first, must still agree.
        added = {k for k in ka ^ kb if k.split("|")[1].startswith("state.")}
        if (ka ^ kb) - added:
            bad.append(name)
            print(f"{name}: different fields {sorted((ka ^ kb) - added)}")
            continue
        ka = ka - added
        if added:
            fields = sorted({k.split("|")[1].split("[")[0] for k in added})
            print(f"{name}: state fields on one side only: {', '.join(fields)}")
        worst, where, draws = 0.0, "", 0.0
        for k in sorted(ka):
            x, y = a[k], b[k]
            if x.dtype.kind in "US" or x.shape != y.shape:
                diff = 0.0 if x.shape == y.shape and (x == y).all() else np.inf
            else:
                with np.errstate(invalid="ignore"):
                    d = np.abs(x.astype(np.float64) - y.astype(np.float64))
                same_nan = np.isnan(x.astype(np.float64)) & np.isnan(
                    y.astype(np.float64)
                )
                d = np.where(same_nan, 0.0, d)
                diff = float(np.nan_to_num(d, nan=np.inf).max()) if d.size else 0.0
            if diff > worst:
                worst, where = diff, k
            if k.split("|")[1].startswith("samples"):  # samples['site']
                draws = max(draws, diff)
        status = "identical" if worst == 0 else f"max |diff| {worst:.3g} at {where}"
        if worst:
            status += f"; draws {'identical' if draws == 0 else f'{draws:.3g}'}"
        if worst > atol:
            bad.append(name)
        print(f"{name}: {status}")
    print(f"\n{len(names) - len(bad)} of {len(names)} cases within atol = {atol}")
    return bad


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--save", type=Path, help="record this tree's draws here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument("--against", metavar="REV", help="a git revision")
    parser.add_argument("--atol", type=float, default=0.0)
    parser.add_argument("--only", nargs="+", help="case names (see cases())")
    args = parser.parse_args(argv)
    if args.save:
        record(args.save, args.only)
        return 0
    if args.compare:
        return 1 if compare(*args.compare, atol=args.atol) else 0
    if not args.against:
        parser.error("give --save, --compare or --against")
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(tree), args.against],
            cwd=ROOT,
            check=True,
        )
        try:
            files = []
            for label, package in (("before", tree), ("after", ROOT)):
                out = Path(tmp) / f"{label}.npz"
                env = dict(
                    os.environ,
                    PYTHONPATH=str(package),
                    JAX_PLATFORMS="cpu",
                    DRAWS_IDENTITY_PACKAGE=str(package),
                )
                command = [sys.executable, __file__, "--save", str(out)]
                command += ["--only", *args.only] if args.only else []
                print(f"-- recording {label} ({package})", flush=True)
                subprocess.run(command, env=env, check=True, cwd=package)
                files.append(out)
            return 1 if compare(*files, atol=args.atol) else 0
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT
            )


if __name__ == "__main__":
    sys.exit(main())
