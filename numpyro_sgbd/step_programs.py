"""The compiled programs of a kernel's chains: :class:`StepPrograms` builds the
core's pure pair (:func:`~numpyro_sgbd.core.build_kernel`) from the sampler's
configuration and the prepared model, and keeps the initial-state program and
a sample's steps program compiled per argument structure, with the data and the
set-up as arguments, so that a refit on data of the same shapes compiles
nothing again."""

import jax

from numpyro_sgbd import core
from numpyro_sgbd import spec as specs
from numpyro_sgbd.estimators import with_setup
from numpyro_sgbd.local_sites import local_update
from numpyro_sgbd.monitoring import mode
from numpyro_sgbd.prepare import Programs

__all__ = ["StepPrograms"]


class StepPrograms:
    """The steps of the chains of one kernel, configured by ``config`` (a
    :class:`~numpyro_sgbd.sampler_config.SamplerConfig`) over ``prepared`` (a
    :class:`~numpyro_sgbd.prepared_model.PreparedModel`). :meth:`start` fixes a
    run's warmup (in SG steps), its sampling steps (every chain's, or ``None``)
    and the chains' layout; ``sample_impl`` is then the pure step of the
    chains (vectorized over a leading axis where ``batched``)."""

    def __init__(self, config, prepared):
        self.config, self.prepared = config, prepared
        self.num_warmup, self.run_steps, self.batched = 0, None, False
        self.sample_impl = None
        self.programs = {"init": Programs(), "steps": Programs(False)}

    def pure_pair(self, values, estimator=None):
        """The core's ``(init_kernel, sample_kernel)`` of one chain, its set-up
        (L and the centre) read from ``values``, a chain's ``state.setup``; with
        ``estimator`` in place of the prepared one where given."""
        prepared, config = self.prepared, self.config
        if estimator is None:
            estimator = with_setup(prepared.estimator, values)
        adaptation = config.adaptation(
            self.num_warmup, self.run_steps, values.preconditioner
        )
        local = None
        if prepared.local:
            local = local_update(prepared.estimator, prepared.local, self.num_warmup)
        return core.build_kernel(
            config.family(),
            estimator.estimate,
            estimator.initial_centre,
            adaptation,
            bound=specs.step_bound(config.spec),
            allowed=config.allowed(),
            local=local,
        )

    def start(self, num_warmup, run_steps, batched):
        """A run of ``num_warmup`` warmup steps and ``run_steps`` sampling steps
        (or ``None``), of vectorized chains where ``batched``."""
        self.num_warmup, self.run_steps, self.batched = num_warmup, run_steps, batched
        self.sample_impl = self._sample_one
        if batched:
            self.sample_impl = jax.vmap(self._sample_one, in_axes=(0, None, None))

    def _init_state(self, rng_key, z, model_args, model_kwargs, values):
        state = self.pure_pair(values)[0](rng_key, z, model_args, model_kwargs)
        return state._replace(setup=values)

    def _sample_one(self, state, model_args, model_kwargs):
        return self.pure_pair(state.setup)[1](state, model_args, model_kwargs)

    def init_fn(self, model_args, model_kwargs):
        """The compiled initial-state function ``(rng_key, z) -> state`` of one
        chain for these model arguments, with the set-up's arrays among its
        arguments: kept for later data of the same shapes."""

        def make(rebuild):
            def init_from_arrays(rng_key, z, arrays):
                args, kwargs, values, _ = rebuild(arrays)
                return self._init_state(rng_key, z, args, kwargs, values)

            return init_from_arrays

        values = self.prepared.setup_arrays(self.prepared.setup.preconditioner)
        # The adaptation's static values are part of the key: a refit with
        # another warmup or run length traces again.
        static = (self.num_warmup, self.run_steps)
        fn, arrays = self.programs["init"].over_data(
            make, model_args, model_kwargs, values, static
        )
        return lambda rng_key, z: fn(rng_key, z, arrays)

    def steps_fn(self, model_args, model_kwargs):
        """One sample's steps ``state -> state`` as a ``jit`` of its own, kept per
        argument structure, monitoring mode and chain layout: NumPyro traces its
        sampling loop again on every run, and a kept ``jit`` is not traced again
        inside it (a later fit's loop only lowers the step). The data are
        arguments and the set-up is in the state, so the program is the same for
        any data of these shapes."""
        options = self.config.options

        def make(rebuild):
            recentre = None if options.recentre_every is None else self._recentre
            steps = core.repeat(self.sample_impl, options.num_steps, recentre)

            def run(state, arrays):
                args, kwargs, _ = rebuild(arrays)
                return steps(state, args, kwargs)

            return run

        how = (mode(), self.batched, self.num_warmup, self.run_steps)
        fn, arrays = self.programs["steps"].over_data(
            make, model_args, model_kwargs, how
        )
        return lambda state: fn(state, arrays)

    def _recentre(self, state, model_args, model_kwargs):
        """The control variates' centre after this step (re-centring in warmup)."""
        return self.prepared.estimator.recentre(
            state.centre,
            state.z,
            state.i,
            self.num_warmup,
            model_args,
            model_kwargs,
            batched=self.batched,
        )

    def __getstate__(self):
        state = self.__dict__.copy()
        state["sample_impl"] = None
        return state
