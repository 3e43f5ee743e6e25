"""Parametrizations shared by the test files: the default run keeps some cases and
``-m slow`` runs the rest."""

import pytest


def some_cases(argnames, cases, keep):
    """Parametrize ``argnames`` over ``cases`` (tuples, one value per name), those
    not in ``keep`` marked slow."""
    return pytest.mark.parametrize(
        argnames,
        [pytest.param(*c, marks=() if c in keep else pytest.mark.slow) for c in cases],
    )


def one_kernel(names, keep):
    """Parametrize ``kernel_name`` over ``names``, all but ``keep`` marked slow."""
    return some_cases("kernel_name", [(k,) for k in sorted(names)], [(keep,)])
