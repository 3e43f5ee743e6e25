"""``tune``'s budget as wall time (issue 45, item 2): the wall time of
``tune(model, X, y, budget=T)`` from the call to the result, against the bound
``1.25 T + 10`` s, with the seconds by phase and the chosen arm.

Logistic regression (``run.make_data``, d = 10, N(0, 1) prior, the data plate
declared with n = 100), the default search: five samplers, control variates, n in
{10, 100, 1000}, five step sizes each (75 arms, three rounds). For N in {10^5,
10^6} and T in {30, 100} s; about ten minutes on two cores:

    python benchmarks/tune_budget.py [--num-data 100000 1000000] [--budgets 30 100]
"""

import argparse
import time

import jax
from run import make_data
from tune_vectorize import make_model

from numpyro_sgbd import tune


def main(args):
    model = make_model(args.dim, prior_sd=1.0)
    phases = ("setup", "compile", "sampling", "scoring", "total")
    header = (
        f"{'N':>9}{'T':>6}{'wall':>8}{'bound':>8}"
        + "".join(f"{p:>10}" for p in phases)
        + "  winner (sampler, n, h): its discrepancy"
    )
    lines = [header]
    print(header, flush=True)
    for num_data in args.num_data:
        X, y = make_data(num_data, args.dim)
        jax.block_until_ready((X, y))
        for budget in args.budgets:
            started = time.perf_counter()
            try:
                result = tune(model, X, y, budget=budget, rng_key=jax.random.key(0))
            except ValueError as err:  # refused: the fixed costs leave too little
                wall = time.perf_counter() - started
                minimum = str(err).split("Pass ")[1].split(",")[0]
                line = (
                    f"{num_data:>9}{budget:>6g}{wall:>8.1f}"
                    f"{1.25 * budget + 10:>8.1f}  refused before sampling: {minimum}"
                )
                lines.append(line)
                print(line, flush=True)
                continue
            wall = time.perf_counter() - started
            arm = result.arm
            table = result.table
            best = table[table["status"] == "winner"]["discrepancy"].iloc[0]
            line = (
                f"{num_data:>9}{budget:>6g}{wall:>8.1f}{1.25 * budget + 10:>8.1f}"
                + "".join(f"{result.seconds[p]:>10.1f}" for p in phases)
                + f"  {arm.sampler} n={arm.subsample_size} h={arm.step_size:.3g}:"
                f" {result.metric} {best:.3f}"
            )
            lines.append(line)
            print(line, flush=True)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-data", type=int, nargs="+", default=[10**5, 10**6])
    parser.add_argument("--budgets", type=float, nargs="+", default=[30.0, 100.0])
    parser.add_argument("--dim", type=int, default=10)
    main(parser.parse_args())
