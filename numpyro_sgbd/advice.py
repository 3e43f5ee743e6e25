"""What a kernel's warnings advise: remedies chosen from the run's settings and
measurements, never one that is already in force.

A warning that names a fix the user already applied teaches them to ignore
warnings. Each function here takes :class:`RunFacts` (what the kernel was asked to
do and what the model is) and returns the remedies that still apply, in the
order a user should try them; the kernel joins them into its message.
"""

from typing import NamedTuple

import numpy as np

from numpyro_sgbd.setup import dimension

__all__ = [
    "RunFacts",
    "convergence_remedies",
    "drift_remedies",
    "join",
    "nonfinite_remedies",
    "step_remedies",
]

#: Up to this many rows times parameters, NUTS over all the data is affordable
#: (a few minutes on a CPU): the warnings say so instead of only tuning the SG run.
NUTS_AFFORDABLE = 2_000_000


class RunFacts(NamedTuple):
    """What a run was set up with, for choosing remedies."""

    #: The kernel's class name (``"SGBD"``, ``"SGLD"``, ``"NOGIN"``, ...).
    sampler: str
    #: ``"control_variates"``, ``"minibatch"`` or ``None`` (a user's gradient).
    gradient: str = None
    #: Whether warmup adapted the step (``step_size=None``).
    adaptive: bool = False
    #: ``{plate: (N, n)}`` of the subsample plates.
    plates: dict = None
    #: Number of unconstrained parameters.
    dim: int = 0
    #: Warmup samples of this run.
    num_warmup: int = 0
    #: Whether the model has local sites (:mod:`~numpyro_sgbd.local_sites`),
    #: which ``step_size=None`` does not take.
    local: bool = False


def run_facts(kernel):
    """What ``kernel``'s run was set up with
    (:class:`~numpyro_sgbd.kernel.SGKernel`, after ``init``)."""
    prepared, config = kernel.prepared, kernel.config
    plates = {k: v[:2] for k, v in (prepared.plates or {}).items()}
    return RunFacts(
        sampler=type(kernel).__name__,
        gradient=None if prepared.model is None else config.gradient,
        adaptive=config.args["step_size"] is None,
        plates=plates,
        dim=dimension(prepared.draw_shapes),
        num_warmup=kernel.run_shape().num_warmup // kernel.num_steps,
        local=bool(prepared.local),
    )


def _one_plate(facts):
    plates = facts.plates or {}
    return next(iter(plates.items())) if len(plates) == 1 else None


def _nuts_affordable(facts):
    """NUTS on all rows, where N x d is small enough for it."""
    plate = _one_plate(facts)
    if plate is None or not facts.dim:
        return []
    size = plate[1][0]
    if size * facts.dim > NUTS_AFFORDABLE:
        return []
    return [
        f"at N = {size:,} NUTS over all rows is affordable: "
        "reference_posterior(model, *args) runs it on the same model"
    ]


def _larger_subsample(facts):
    plate = _one_plate(facts)
    if plate is None:
        return []
    name, (size, n) = plate
    if 2 * n > size:
        return []
    return [
        f"raise the subsample size of plate {name!r} from {n:,} towards "
        f"{min(size, 4 * n):,} (the gradient noise sd falls like 1/sqrt(n))"
    ]


def step_remedies(facts):
    """Remedies for an adapted step that the gradient noise held far below its
    target.

    >>> facts = RunFacts("SGBD", "minibatch", True, {"data": (10_000, 100)}, 5)
    >>> [r.split(" ")[0] for r in step_remedies(facts)]
    ['use', 'raise', 'at']
    >>> cv = facts._replace(gradient="control_variates")
    >>> any("control_variates" in r for r in step_remedies(cv))
    False
    """
    remedies = []
    if facts.gradient == "minibatch" and _one_plate(facts) is not None:
        remedies.append(
            "use gradient='control_variates' (the noise vanishes at the mode)"
        )
    remedies += _larger_subsample(facts)
    if facts.gradient == "control_variates":
        remedies.append(
            "with control variates on, noise this large means the posterior is far "
            "from Gaussian around its mode at this N, so no step size fixes it"
        )
    remedies += _nuts_affordable(facts)
    return remedies


def drift_remedies(facts):
    """Remedies for draws that still drift at the end of the run.

    >>> facts = RunFacts("SGLD", "control_variates", True, {"d": (500, 50)}, 3, 1000)
    >>> any("step_size=None" in r for r in drift_remedies(facts))
    False
    >>> any("step_size=None" in r for r in drift_remedies(facts._replace(
    ...     adaptive=False)))
    True
    >>> any("step_size=None" in r for r in drift_remedies(facts._replace(
    ...     adaptive=False, local=True)))  # local sites: not available
    False
    """
    remedies = [
        f"raise num_warmup (now {facts.num_warmup:,}): the chain may not have "
        "reached the posterior",
        "raise num_samples",
    ]
    return remedies + _adapting(facts) + _nuts_affordable(facts)


def _adapting(facts):
    """``step_size=None``, where the run gave a step and the model takes it."""
    if facts.adaptive or facts.local:
        return []
    return ["use step_size=None to adapt the start, the preconditioner and the step"]


def convergence_remedies(facts, *, ess, rhat, num_samples, warned=()):
    """Remedies for draws with too few effective draws (``ess``, the smallest
    bulk or tail ESS) or chains that disagree (``rhat``, the largest R-hat).

    >>> facts = RunFacts("SGLD", "control_variates", True, {"d": (10**6, 100)}, 3)
    >>> convergence_remedies(facts, ess=25.0, rhat=1.0, num_samples=1000)[0]
    'raise num_samples from 1,000 to about 4,000 (the ESS grows in proportion)'
    """
    remedies = []
    if rhat > 1.01:
        remedies.append(
            f"raise num_warmup (now {facts.num_warmup:,}): the chains disagree, so "
            "some have not reached the posterior or the posterior has several "
            "modes that no chain crosses between"
        )
    if ess < 100:
        more = 100 / max(ess, 1.0) * num_samples
        unit = 10 ** max(int(np.log10(more)) - 1, 0)  # two significant figures
        more = int(np.ceil(more / unit) * unit)
        remedies.append(
            f"raise num_samples from {num_samples:,} to about {more:,} (the ESS "
            "grows in proportion)"
        )
    if "step" in warned:
        remedies.append("see the warning on the step the gradient noise held down")
    return remedies + _adapting(facts) + _nuts_affordable(facts)


def nonfinite_remedies(facts):
    """Remedies for a chain stopped by a non-finite value."""
    if facts.adaptive:
        return [
            "check the model's gradients (a log density that overflows far from "
            "the mode)",
            "give a step_size below the adapted one (mcmc.last_state.step_size)",
        ]
    return ["reduce step_size", "check the model's gradients"]


def join(remedies):
    """``"a, b or c"``, capitalised, as a sentence's end."""
    if not remedies:
        return ""
    text = (
        remedies[0]
        if len(remedies) == 1
        else (", ".join(remedies[:-1]) + ", or " + remedies[-1])
    )
    return text[0].upper() + text[1:] + "."
