"""Per-iteration cost of control-variate gradients against the plain minibatch
gradient.

Logistic regression, N = 10**6 rows, d = 10, minibatch n = 1000 (defaults, the
control-variates issue's setting). Each ratio printed is of times measured in this
one process, each the marginal time per step of ``MCMC.run`` (see
``run.kernel_seconds``: the difference of a long and a short run, so the
one-off full-data gradient at the centre and compilation cancel):

    python benchmarks/control_variates_cost.py [--num-data 1000000] [--dim 10]

A control-variate step evaluates the minibatch at the chain's position and at the
centre, so about twice the plain cost is expected; the per-datum Jacobians of the
corrected variants are taken at both points too.
"""

import argparse

import jax.numpy as jnp
from run import kernel_seconds as time_kernel
from run import make_data

from numpyro_sgbd import SGBD, SGLD, unroll_threefry_on_cpu


def main(args):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
    X, y = make_data(args.num_data, args.dim)
    n = args.subsample_size
    centre = {"w": jnp.zeros(args.dim)}  # where it sits does not change the cost
    print(f"N={args.num_data} d={args.dim} n={n}")
    print(f"{'kernel':<18}{'plain ms':>10}{'CV ms':>10}{'CV/plain':>10}")
    for name, cls, variant in [
        ("SGBD vanilla", SGBD, "vanilla"),
        ("SGBD corrected", SGBD, "corrected"),
        ("SGLD corrected", SGLD, "corrected"),
    ]:

        def plain(model_n, cls=cls, variant=variant):
            return cls(model_n, step_size=1e-3, variant=variant)

        def with_cv(model_n, cls=cls, variant=variant):
            return cls(
                model_n,
                step_size=1e-3,
                variant=variant,
                gradient="control_variates",
                centre=centre,
            )

        t_plain = time_kernel(plain, X, y, n, args.num_steps, False)
        t_cv = time_kernel(with_cv, X, y, n, args.num_steps, False)
        print(
            f"{name:<18}{1e3 * t_plain:>10.3f}{1e3 * t_cv:>10.3f}"
            f"{t_cv / t_plain:>10.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--subsample-size", type=int, default=1000)
    parser.add_argument("--num-steps", type=int, default=3000)
    main(parser.parse_args())
