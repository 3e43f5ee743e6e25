"""JAX's threefry hash lowered for the CPU without loops.

Every ``jax.random`` draw under the default implementation hashes counters with
threefry2x32: 20 rounds of 32-bit adds, rotations and xors. JAX up to 0.10
lowers it for the CPU as a loop of five iterations (four rounds each) and for
every other platform unrolled. Each such loop is a while loop that XLA:CPU runs
iteration by iteration, and an SG step makes several draws (key splits, the
minibatch indices, the noise), so on a CPU those loops were up to half of a
minibatch step (vanilla SGBD, n = 100). ``python benchmarks/random_numbers.py
--steps`` measures it, and the rows are in ``docs/benchmarks.rst``. JAX has
since made the unrolled lowering its CPU default too (jax-ml/jax pull request
37872), having found it faster both to compile and to run.

:func:`unroll_threefry_on_cpu` backports that for a JAX that still rolls the
loop. The hash is the same function of the same words, only written without
the loop, so every draw is the same bit for bit (tested). The package calls it
once, on import. Where JAX no longer has the rolled CPU rule it does nothing.
"""

import importlib

_MODULES = ("jax._src.random.threefry2x32", "jax._src.prng")


def _threefry_module():
    """JAX's module that defines the threefry primitive and both lowering rules,
    or None when this JAX has no separate (rolled) CPU rule."""
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if all(
            hasattr(module, attr)
            for attr in (
                "threefry2x32_p",
                "_threefry2x32_lowering_rule",
                "_threefry2x32_cpu_lowering_rule",
            )
        ):
            return module
    return None


def unroll_threefry_on_cpu(unrolled=True):
    """Lower ``threefry2x32`` for the CPU as JAX lowers it elsewhere (unrolled),
    or, with ``unrolled=False``, back to JAX's own rolled CPU rule.

    Applies to programs compiled afterwards (a compiled program keeps its
    lowering). Returns whether this JAX had the rule to swap; when it did not
    (a JAX that already unrolls, or that moved these private names), nothing
    changes and the draws are JAX's either way.
    """
    module = _threefry_module()
    try:
        from jax._src.interpreters import mlir
    except ImportError:
        return False
    if module is None:
        return False

    rule = (
        module._threefry2x32_lowering_rule
        if unrolled
        else module._threefry2x32_cpu_lowering_rule
    )
    mlir.register_lowering(module.threefry2x32_p, rule, platform="cpu")
    return True
