"""Whether ``tune`` should run a group's step sizes as vectorised chains: steps per
charged second of an arm, vectorised against one arm at a time.

Logistic regression (``run.make_data``), N = 10**5 rows, d = 10; SGLD with control
variates and five step sizes per subsample size. For each subsample size, ``tune``
runs the same five arms for one round twice, ``vectorize=True`` (one call of the
family's program for five chains, each arm charged a fifth of its wall time) and
``vectorize=False`` (five calls of a program of one chain), with the same budget;
the ratio of their steps per charged second (the median over the five arms) is
measured in this one process. Compile times are printed beside it. About two
minutes on two cores:

    python benchmarks/tune_vectorize.py [--num-data 100000] [--budget 5]
"""

import argparse

import numpy as np
import numpyro
import numpyro.distributions as dist
from run import make_data

from numpyro_sgbd import tune, unroll_threefry_on_cpu


def make_model(dim, prior_sd=3.0, subsample_size=100):
    """The benchmark's logistic regression (also benchmarks/tune_budget.py's,
    with N(0, 1) priors), the data plate declared with n = ``subsample_size``."""

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, prior_sd).expand([dim]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

    return model


def main(args):
    # Importing numpyro_sgbd leaves JAX's CPU lowering of the threefry hash as
    # JAX has it (up to JAX 0.10 a rolled loop). This benchmark's recorded
    # figures were timed with it unrolled (the package's import did that then),
    # so it opts in first and new runs compare like for like (the draws are the
    # same; both sides of each comparison here draw under that lowering).
    unroll_threefry_on_cpu()
    X, y = make_data(args.num_data, args.dim)
    model = make_model(args.dim)
    steps = [0.4, 0.2, 0.1, 0.05, 0.025]
    print(f"N={args.num_data} d={args.dim}, SGLD control variates, 5 step sizes")
    header = (
        f"{'n':>7}{'vectorised steps/s':>20}{'one by one steps/s':>20}"
        f"{'ratio':>8}{'compile v/1 s':>16}"
    )
    print(header)
    for n in args.subsample_sizes:
        rates, compiles = [], []
        for vectorize in (True, False):
            result = tune(
                model,
                X,
                y,
                budget=args.budget,
                samplers=["SGLD"],
                gradients=["control_variates"],
                subsample_sizes=[n],
                step_sizes=steps,
                eta=10,  # five arms, one round
                vectorize=vectorize,
            )
            table = result.table
            rates.append(float(np.median(table["steps"] / table["seconds"])))
            compiles.append(result.seconds["compile"])
        print(
            f"{n:>7}{rates[0]:>20.0f}{rates[1]:>20.0f}{rates[0] / rates[1]:>8.2f}"
            f"{compiles[0]:>8.1f}/{compiles[1]:<7.1f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--budget", type=float, default=5.0)
    parser.add_argument(
        "--subsample-sizes", type=int, nargs="+", default=[10, 100, 1000, 10000]
    )
    main(parser.parse_args())
