"""The warnings' remedies (numpyro_sgbd.advice) follow the run: what is in force
is never advised (issue 43, item 2). The kernels' own warning paths are driven
in tests/test_adaptation.py and tests/test_monitoring.py."""

from numpyro_sgbd.advice import (
    RunFacts,
    convergence_remedies,
    drift_remedies,
    join,
    nonfinite_remedies,
    step_remedies,
)

# A large N with d = 10: NUTS is not affordable, so it is never advised here.
LARGE = RunFacts("SGBD", "minibatch", False, {"data": (10**6, 1000)}, 10, 500)


def _text(remedies):
    return join(remedies)


def test_step_remedies_follow_the_gradient_and_the_subsample_size():
    plain = _text(step_remedies(LARGE))
    assert "gradient='control_variates'" in plain and "from 1,000 towards" in plain
    cv = _text(step_remedies(LARGE._replace(gradient="control_variates")))
    assert "control_variates'" not in cv and "far from Gaussian" in cv
    # n already near N: no larger subsample is left to advise.
    full = LARGE._replace(plates={"data": (1500, 1000)})
    assert "subsample size" not in _text(step_remedies(full))
    # Two subsample plates: control variates need one, so they are not advised.
    two = LARGE._replace(plates={"a": (10**6, 100), "b": (10**6, 100)})
    assert "control_variates" not in _text(step_remedies(two))
    assert "NUTS" not in plain


def test_nuts_is_advised_only_where_it_is_affordable():
    small = LARGE._replace(plates={"data": (5822, 256)}, dim=86)
    assert "at N = 5,822 NUTS over all rows is affordable" in _text(
        step_remedies(small)
    )
    assert "NUTS" in _text(drift_remedies(small))
    assert "NUTS" not in _text(drift_remedies(LARGE))


def test_drift_and_convergence_advise_adaptation_only_when_it_is_off():
    assert "step_size=None" in _text(drift_remedies(LARGE))
    adaptive = LARGE._replace(adaptive=True)
    assert "step_size=None" not in _text(drift_remedies(adaptive))
    given = convergence_remedies(LARGE, ess=30.0, rhat=1.0, num_samples=2000)
    assert "step_size=None" in _text(given)
    adapted = convergence_remedies(adaptive, ess=30.0, rhat=1.0, num_samples=2000)
    assert "step_size=None" not in _text(adapted)
    assert "from 2,000 to about 6,700" in _text(adapted)


def test_convergence_remedies_follow_what_failed():
    ess_only = _text(convergence_remedies(LARGE, ess=50.0, rhat=1.0, num_samples=1000))
    assert "num_samples" in ess_only and "disagree" not in ess_only
    rhat_only = _text(
        convergence_remedies(LARGE, ess=500.0, rhat=1.2, num_samples=1000)
    )
    assert "disagree" in rhat_only and "raise num_samples" not in rhat_only
    held = convergence_remedies(
        LARGE, ess=50.0, rhat=1.0, num_samples=1000, warned=("step",)
    )
    assert "held down" in _text(held)


def test_nonfinite_remedies_follow_the_step_source():
    assert "reduce step_size" in _text(nonfinite_remedies(LARGE)).lower()
    adaptive = _text(nonfinite_remedies(LARGE._replace(adaptive=True)))
    assert "below the adapted one" in adaptive and "reduce step_size" not in adaptive


def test_join_reads_as_a_sentence():
    assert join([]) == ""
    assert join(["a"]) == "A."
    assert join(["a", "b", "c"]) == "A, b, or c."
