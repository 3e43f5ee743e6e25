"""How many SG steps one sample takes when the kernel's ``num_steps`` is left at
its default (``None``).

NumPyro's ``MCMC`` with ``progress_bar=True`` (its default) drives the chain from
a Python loop: one dispatch of its compiled body, a collection update and the
bar's refresh per sample, 0.1 to 0.3 ms on a CPU whatever the step costs. An SG
step on a minibatch of a thousand rows costs tens of µs, so with one step per
sample the loop was 80 to 90 % of the run (``benchmarks/run.py``, section (g)).
So where NumPyro's Python loop drives the kernel and the user gave no
``num_steps``, the kernel measures its own step once, before the loop compiles,
and takes enough steps per sample that they last about :data:`SAMPLE_SECONDS`:
the loop's share of the run is then a tenth or so. Everywhere else (bar off,
chains mapped over devices with ``pmap``, a kernel driven by hand or by
:func:`~numpyro_sgbd.tune`) a sample is one step, as in NumPyro's kernels.

What is kept: ``num_warmup`` and ``num_samples`` still count samples and
``thinning`` still thins samples, so the run has ``k (num_warmup +
num_samples)`` steps and keeps every ``k * thinning``-th one: the chain that
``num_steps=1`` gives with ``k`` times the warmup, thinned by ``k`` (each draw
from the same stationary law, less correlated with the one before).
"""

import logging
import math
import time

import jax
import jax.numpy as jnp

from numpyro_sgbd import core

__all__ = ["SAMPLE_SECONDS", "choose", "for_run", "python_loop"]

logger = logging.getLogger("numpyro_sgbd")

#: Seconds of SG steps a sample is given when NumPyro's Python loop drives the
#: kernel: about 10 times that loop's cost per sample, which on two CPU cores
#: came to 0.2 to 0.3 ms a sample with the run checks (the bar cost 0.9 to 1.3
#: times the bar-off time per step at 1.5 ms, ``benchmarks/run.py --parts g``).
SAMPLE_SECONDS = 2.5e-3
#: At most this many steps a sample (steps of a few µs: small models and n).
MAX_STEPS = 1000
#: The longer of the two loops timed: the difference of a loop of this many
#: steps and one of a single step is the step's own time, without dispatch.
_PROBE_STEPS = 16


def python_loop(mcmc):
    """Whether ``mcmc`` (an :class:`~numpyro.infer.MCMC`, or ``None``) runs its
    chains from NumPyro's Python loop: the progress bar on, and the chains not
    mapped over devices (with ``chain_method="parallel"`` and several chains
    NumPyro's bar is a host callback inside one compiled loop)."""
    if mcmc is None or not getattr(mcmc, "progress_bar", False):
        return False
    return not (mcmc.chain_method == "parallel" and mcmc.num_chains > 1)


def choose(sample_kernel, state, model_args, model_kwargs):
    """Steps per sample for a run of ``sample_kernel`` from ``state``: the number
    whose time is about :data:`SAMPLE_SECONDS` (at least 1, at most
    :data:`MAX_STEPS`), from the time of a compiled loop of one step and of
    :data:`_PROBE_STEPS` steps, each the fastest of two series of three calls
    (the steps are run and thrown away: ``state`` is not advanced)."""

    @jax.jit
    def steps(state, model_args, model_kwargs, k):
        return core.repeat(sample_kernel, k)(state, model_args, model_kwargs)

    def seconds(k):
        best = math.inf
        for _ in range(2):
            s, start = state, time.perf_counter()
            for _ in range(3):
                s = steps(s, model_args, model_kwargs, k)
            jax.block_until_ready(s)
            best = min(best, (time.perf_counter() - start) / 3)
        return best

    jax.block_until_ready(steps(state, model_args, model_kwargs, jnp.int32(1)))
    one = seconds(jnp.int32(1))
    if one >= SAMPLE_SECONDS:
        return 1
    many = seconds(jnp.int32(_PROBE_STEPS))
    # The difference is the step's own time; under noise it can come out near
    # zero, so a quarter of the long loop's time per step bounds it below.
    per_step = max((many - one) / (_PROBE_STEPS - 1), 0.25 * many / _PROBE_STEPS)
    return int(min(MAX_STEPS, max(1, math.ceil(SAMPLE_SECONDS / per_step))))


def for_run(chosen, kernel_type, sample_kernel, state, model_args, model_kwargs):
    """:func:`choose`'s steps per sample, measured once per shape of the state
    and the data and kept in the dict ``chosen`` (a kernel's: later runs of the
    same shapes reuse it)."""
    leaves, tree = jax.tree.flatten((state, model_args, model_kwargs))
    key = (tree, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves))
    if key not in chosen:
        chosen[key] = choose(sample_kernel, state, model_args, model_kwargs)
        logger.info(
            "%s: %d SG steps per sample under NumPyro's progress bar "
            "(num_steps=None); each kept draw is the last of its sample's steps.",
            kernel_type.__name__,
            chosen[key],
        )
    return chosen[key]
