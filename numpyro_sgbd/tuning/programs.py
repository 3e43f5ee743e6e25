"""The compiled programs of :func:`~numpyro_sgbd.tune`'s arms: one program that
starts every arm (:func:`start_program`) and one per sampler family that runs
its arms (:func:`record_program`), compiled in worker threads
(:class:`Compiler`).

A family is one sampler with one gradient estimator. Its arms differ by values
the programs take as arguments: the step size (a field of each chain's state)
and the subsample size (:class:`~numpyro_sgbd.tuning.sizes.Rows`, with
:class:`~numpyro_sgbd.tuning.sizes.SizedEstimator`), so a family compiles once
whatever its grid. The chains' start, a draw of the Laplace approximation, is
drawn once for the model, and the first gradient estimate there once per
estimator and size, not once per kernel.

The kernels' own pieces are reused as they are: each family's kernel is
prepared from the model without compiling anything (:func:`prepare_kernel`),
and its pure pair is the kernel's own with the sized estimator in place of the
kernel's estimator (:func:`pure_pair`). Both read the kernel's private methods
(its ``_build``, ``_prepare``, ``_kernel_fns``): a kernel has no public way yet
to be prepared without an initial state, or to give its pure pair with another
estimator.
"""

from concurrent.futures import ThreadPoolExecutor
import os

import jax
from jax import lax, random
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp

from numpyro_sgbd.estimators import with_setup
from numpyro_sgbd.tuning.sizes import SizedEstimator
from numpyro_sgbd.validation import warmup_elsewhere

#: Records per compiled call at most.
BUFFER = 256
#: Floats a call's buffer of draws (and of scores) may hold: fewer records a
#: call where chains x d is large. At 256 records a call, six chains of the
#: 79,510-weight network's draws made 488 MB a buffer, allocated and copied to
#: the host by every call whatever its length.
BUFFER_FLOATS = 2**24


def buffer_rows(num_chains, d):
    """Records per call (the buffer's rows) for ``num_chains`` chains of ``d``
    coordinates: :data:`BUFFER`, fewer where that passes :data:`BUFFER_FLOATS`
    (at least 4)."""
    return int(max(4, min(BUFFER, BUFFER_FLOATS // max(num_chains * d, 1))))


#: One-off programs (the start) are compiled at XLA's lowest optimisation level
#: on a CPU, as the kernels compile theirs (``jit_once``).
ONCE = {"xla_backend_optimization_level": 0}
#: The families' programs at XLA's level 1 on a CPU: as fast as at the default
#: level 2 for the samplers' steps, and quicker to compile.
QUICK = {"xla_backend_optimization_level": 1}


def prepare_kernel(kernel, problem, z):
    """Prepare ``kernel`` from the model and its data as its ``init`` does,
    without an initial state (the arms' start is :func:`start_program`'s): the
    set-up is found (or taken from the one the kernel was given), its
    estimator, hyperparameters and variant are set, and nothing is compiled
    for a start. ``z``: a position by site, or ``None`` (the set-up alone).

    The kernel's :meth:`~numpyro_sgbd.kernel.SGKernel.prepare` does this (the
    model's trace and the estimator, then the hyperparameters against z's
    shapes); where a kernel lacks it, its ``init`` is traced abstractly instead
    (the same result, but the model's trace then runs under
    ``jax.ensure_compile_time_eval``, where each of its operations compiles
    anew: about 1.5 s of the first kernel on a CPU)."""
    model_args, model_kwargs = problem.model_args, problem.model_kwargs
    if hasattr(kernel, "pure_pair"):
        kernel.prepare(model_args, model_kwargs, z)
        return kernel

    def init(rng_key):
        return kernel.init(rng_key, 0, z, model_args, model_kwargs)

    with warmup_elsewhere():  # the arms' steps are set by the start
        jax.eval_shape(init, random.key(0))
    return kernel


def setup_values(kernel, pre):
    """The :class:`~numpyro_sgbd.state.SetupArrays` a chain of ``kernel``
    carries: the shared preconditioner and the control variates' centre."""
    return kernel.prepared.setup_arrays(pre)


def pure_pair(kernel, values, estimator=None):
    """``(init_kernel, sample_kernel)`` of one chain of ``kernel``'s sampler, its
    set-up read from ``values``: the kernel's own
    (:func:`~numpyro_sgbd.core.build_kernel` over its family and adaptation),
    with ``estimator`` in place of the kernel's estimator where given."""
    return kernel.pure_pair(values, estimator)


def _estimator(kernel, values, sized, rows):
    """The estimator of a chain of ``kernel``: sized (``sized`` is ``(chunk,
    columns)``) at ``rows``, or ``None`` (the kernel's own)."""
    if sized is None:
        return None
    return SizedEstimator(with_setup(kernel.estimator, values), rows, *sized)


# -------------------------------------------------------------- the programs
def record_program(kernel, recording, sized):
    """``run(state, rows, num_records, arrays) -> (state, xs, gs)``: the chains
    of ``kernel`` (vectorised over the state's leading axis) advance
    ``num_records * thinning`` steps at subsample size ``rows`` (ignored when
    ``sized`` is ``None``: the kernel's own size); ``xs`` holds the draws in u
    every ``thinning`` steps (:func:`buffer_rows` rows, those past
    ``num_records`` unused), ``gs`` the
    minibatch scores there with ``scores="minibatch"``."""
    shared, thinning = recording.shared, recording.thinning
    pre, d = shared.pre, shared.d

    def to_u(z):
        return pre.to_u(ravel_pytree(z)[0])

    def run(state, rows, num_records, arrays):
        args, kwargs = shared.rebuild(arrays)

        def sample_one(s):
            est = _estimator(kernel, s.setup, sized, rows)
            return pure_pair(kernel, s.setup, est)[1](s, args, kwargs)

        def minibatch_score(s):
            est = _estimator(kernel, s.setup, sized, rows)
            est = with_setup(kernel.estimator, s.setup) if est is None else est
            key = random.fold_in(s.rng_key, 7)
            out = est.estimate(key, s.z, args, kwargs, s.centre)
            return -ravel_pytree(out.z_grad)[0]

        sample = jax.vmap(sample_one)
        k = jnp.shape(state.i)[0]
        buffer = buffer_rows(k, d)
        xs = jnp.zeros((buffer, k, d), pre.loc.dtype)
        gs = (
            jnp.zeros((buffer, k, d), pre.loc.dtype) if recording.record_grads else None
        )

        def record(j, carry):
            state, xs, gs = carry
            state = lax.fori_loop(0, thinning, lambda _, s: sample(s), state)
            xs = xs.at[j].set(jax.vmap(to_u)(state.z))
            if gs is not None:
                gs = gs.at[j].set(jax.vmap(minibatch_score)(state))
            return state, xs, gs

        return lax.fori_loop(0, num_records, record, (state, xs, gs))

    return run


class _Fixed:
    """An estimator that returns one estimate, computed before: the first
    estimate of a chain at the start (one per estimator and size)."""

    def __init__(self, estimate, source):
        self._estimate, self._source = estimate, source

    def estimate(self, rng_key, z, model_args=(), model_kwargs=None, centre=None):
        return self._estimate

    def initial_centre(self, z, model_args=(), model_kwargs=None):
        return self._source.initial_centre(z, model_args, model_kwargs)


def _union(kernels):
    """``(noise, covariance)``: the noise every estimate at the start needs for
    the ``kernels`` of one estimator (NOGIN's covariance, the others' sd)."""
    noise = any(k.estimator.noise for k in kernels)
    forms = {k.estimator.covariance for k in kernels} - {None}
    return noise, (forms.pop() if forms else None)


def _trimmed(est, kernel):
    """The shared first estimate as ``kernel``'s estimator returns it."""
    keep = kernel.estimator
    return est._replace(
        noise_sd=est.noise_sd if keep.noise else None,
        noise_cov=est.noise_cov if keep.covariance is not None else None,
    )


def start_program(families, groups, shared):
    """``start(rng_key, values, rows, steps, arrays) -> states``: one program that
    starts every arm. It draws the start z from the Laplace approximation once
    (every arm starts there: common random numbers), forms the first gradient
    estimate at z once per estimator and subsample size, and returns the initial
    state of each group's chains, one per step size of ``steps`` (a list over
    the groups, ``groups`` their ``(family, size)`` indices). ``values`` holds
    each family's set-up arrays, ``rows`` each sized family's sizes (stacked
    :class:`~numpyro_sgbd.tuning.sizes.Rows`; ``None`` for the others)."""
    unravel = ravel_pytree(shared.source.setup.mode)[1]

    def start(rng_key, values, rows, steps, arrays):
        args, kwargs = shared.rebuild(arrays)
        key_z, key_chain = random.split(rng_key)
        pre = values[0].preconditioner
        u = random.normal(key_z, pre.loc.shape, pre.loc.dtype)
        z = unravel(pre.to_z(u))
        key_est = random.fold_in(key_chain, 1)
        first = _first_estimates(families, values, rows, key_est, z, args, kwargs)
        states = {}
        for f in dict.fromkeys(f for f, _ in groups):
            family = families[f]
            if family.sized is None:  # each size its own kernel
                for g, kernel in enumerate(family.kernels):
                    init = pure_pair(kernel, values[f])[0]
                    states[f, g] = init(key_chain, z, args, kwargs)
                continue
            kernel = family.kernels[0]

            def one(est, kernel=kernel, f=f):
                fixed = _Fixed(_trimmed(est, kernel), kernel.estimator)
                return pure_pair(kernel, values[f], fixed)[0](
                    key_chain, z, args, kwargs
                )

            # One copy of the family's start, mapped over its sizes.
            stacked = jax.vmap(one)(first[family.gradient])
            for g in range(len(family.sizes)):
                states[f, g] = jax.tree.map(lambda x, g=g: x[g], stacked)
        return [
            _lanes(states[fg]._replace(setup=values[fg[0]]), h)
            for fg, h in zip(groups, steps)
        ]

    return start


def _lanes(state, steps):
    """``state`` repeated for each step size of ``steps`` (its chains)."""
    lanes = jax.tree.map(
        lambda x: jnp.broadcast_to(x, steps.shape + jnp.shape(x)), state
    )
    return lanes._replace(step_size=steps.astype(state.step_size.dtype))


def _first_estimates(families, values, rows, key, z, args, kwargs):
    """``{gradient: estimates}``: the first estimate at z for every size of the
    sized families of each gradient estimator (stacked over the sizes), with the
    noise they all need."""
    first = {}
    for gradient in {f.gradient for f in families if f.sized is not None}:
        members = [
            (i, f)
            for i, f in enumerate(families)
            if f.gradient == gradient and f.sized is not None
        ]
        i, family = members[0]
        noise, covariance = _union([f.kernels[0] for _, f in members])
        source = with_setup(family.kernels[0].estimator, values[i])

        def one(r, source=source, family=family, noise=noise, cov=covariance):
            sized = SizedEstimator(
                source, r, *family.sized, noise=noise, covariance=cov
            )
            return sized.estimate(key, z, args, kwargs)

        first[gradient] = jax.vmap(one)(rows[i])
    return first


# ------------------------------------------------------------- compiling
class Compiler:
    """Compiles programs in worker threads: :meth:`add` lowers a program here,
    :meth:`compile` hands every lowered program to XLA in a pool of threads and
    waits for them. Every program is lowered before any compiles: XLA's
    compile holds Python's lock for part of its time, so tracing alongside it
    ran three times slower and held back the compiles queued behind it."""

    def __init__(self):
        self.lowered = {}

    def add(self, name, fn, args, options=None):
        """Lower ``jax.jit(fn)`` for ``args`` (arrays or their shapes), to be
        compiled with the XLA ``options`` on a CPU."""
        if not (options and jax.default_backend() == "cpu"):
            options = None
        self.lowered[name] = (jax.jit(fn).lower(*args), options)

    def __contains__(self, name):
        return name in self.lowered

    def compile(self, on_main=None):
        """``{name: compiled program}``, compiled in worker threads while
        ``on_main()`` runs here."""
        workers = max(1, min(os.cpu_count() or 1, len(self.lowered)))
        pool = ThreadPoolExecutor(max_workers=workers)
        try:
            futures = {
                name: pool.submit(lowered.compile, options)
                if options
                else pool.submit(lowered.compile)
                for name, (lowered, options) in self.lowered.items()
            }
            if on_main is not None:
                on_main()
            return {name: f.result() for name, f in futures.items()}
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
