"""JAX's threefry hash lowered for the CPU without loops, on request.

Every ``jax.random`` draw under the default implementation hashes counters with
threefry2x32: 20 rounds of 32-bit adds, rotations and xors. JAX up to 0.10
lowers it for the CPU as a loop of five iterations (four rounds each) and for
every other platform unrolled. Each such loop is a while loop that XLA:CPU runs
iteration by iteration, and an SG step makes several draws (key splits, the
minibatch indices, the noise), so on a CPU those loops were up to half of a
minibatch step (vanilla SGBD, n = 100). ``python benchmarks/random_numbers.py
--steps`` measures it (docs/benchmarks.rst, current results). JAX has
since made the unrolled lowering its CPU default too (jax-ml/jax pull request
37872), having found it faster both to compile and to run.

:func:`unroll_threefry_on_cpu` backports that for a JAX that still rolls the
loop, and :func:`unrolled_threefry` does so for a ``with`` block only. The hash
is the same function of the same words, only written without the loop, so
every draw is the same bit for bit (tested). Both change a table of JAX's that
the whole process shares, so the package never calls them itself: importing it
leaves JAX's lowering rules as they were. Where JAX no longer has the rolled
CPU rule (or has moved the private names used here) they do nothing.
"""

import contextlib
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


def _cpu_lowerings():
    """JAX's table of CPU-specific lowering rules, ``{primitive: entry}``, where
    :func:`unrolled_threefry` reads the rule it restores; None where this JAX
    keeps them elsewhere."""
    try:
        from jax._src.interpreters import mlir
    except ImportError:
        return None
    table = getattr(mlir, "_platform_specific_lowerings", None)
    if table is None or not hasattr(mlir, "register_lowering"):
        return None
    return table["cpu"]


def unroll_threefry_on_cpu(unrolled=True):
    """Make JAX lower its threefry hash for the CPU unrolled, for the rest of the
    process, as it lowers it for every other platform.

    JAX's random numbers (``jax.random``, threefry2x32 by default) hash
    counters with 20 rounds of 32-bit arithmetic. JAX up to 0.10 writes that
    hash for the CPU as a loop of five iterations, which XLA:CPU runs one by one
    several times in every SG step (key splits, minibatch indices, noise); later
    JAX unrolls it there too (jax-ml/jax pull request 37872). This backports the
    unrolled form: the same hash of the same words, so every draw is the same
    bit for bit, while programs that draw compile and run faster on a CPU (the
    figures are in the documentation's benchmarks). Accelerators are not
    affected.

    The package does not call this itself: JAX's lowering rules are shared by
    the whole process, so it is for a program that wants the speed to say so,
    once at its start (:func:`unrolled_threefry` limits it to a ``with`` block).
    It applies to programs compiled afterwards; a compiled program, and JAX's
    caches of them, keep the lowering they were compiled with
    (``jax.clear_caches()`` drops those). It relies on private names of JAX's
    (``jax._src``).

    :param bool unrolled: True registers the unrolled rule for the CPU; False
        registers JAX's own rolled CPU rule again.
    :return: whether this JAX had a rolled CPU rule to swap. False (and nothing
        changed) on a JAX that already unrolls on the CPU, or that moved the
        private names used here; its draws are the same either way.

    >>> import jax
    >>> from jax import random
    >>> before = jax.jit(lambda key: random.bits(key, (4,)))(random.key(0))
    >>> swapped = unroll_threefry_on_cpu()
    >>> after = jax.jit(lambda key: random.bits(key, (4,)))(random.key(0))
    >>> bool((after == before).all())  # the same bits under either lowering
    True
    >>> unroll_threefry_on_cpu(False) == swapped  # the rolled rule back
    True
    """
    module = _threefry_module()
    if module is None or _cpu_lowerings() is None:
        return False
    from jax._src.interpreters import mlir

    rule = (
        module._threefry2x32_lowering_rule
        if unrolled
        else module._threefry2x32_cpu_lowering_rule
    )
    mlir.register_lowering(module.threefry2x32_p, rule, platform="cpu")
    return True


@contextlib.contextmanager
def unrolled_threefry():
    """Within a ``with`` block, JAX lowers its threefry hash for the CPU
    unrolled (:func:`unroll_threefry_on_cpu`); on leaving it, the CPU rule that
    was registered before is registered again, exactly that one.

    For a program that wants the faster draws without changing JAX for the rest
    of its process. Programs compiled inside the block keep the unrolled
    lowering when called after it (and programs compiled before it keep theirs
    inside it): JAX caches compiled programs by function and arguments, not by
    lowering rule. The draws are the same bit for bit under either lowering.
    Not thread-safe: the rule is JAX's, shared by every thread.

    :return: a context manager whose value (``with ... as swapped``) says
        whether this JAX had a rolled CPU rule to swap; where it did not, the
        block runs with JAX's rules untouched.

    >>> import jax
    >>> from jax import random
    >>> with unrolled_threefry():
    ...     inside = jax.jit(lambda key: random.bits(key, (4,)))(random.key(0))
    >>> outside = jax.jit(lambda key: random.bits(key, (4,)))(random.key(0))
    >>> bool((inside == outside).all())
    True
    """
    table = _cpu_lowerings()
    module = _threefry_module()
    if module is None or table is None:
        yield False
        return
    primitive = module.threefry2x32_p
    missing = object()
    before = table.get(primitive, missing)
    try:
        yield unroll_threefry_on_cpu(True)
    finally:
        if before is missing:
            table.pop(primitive, None)
        else:
            table[primitive] = before
