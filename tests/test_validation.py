"""Bad input that JAX would take silently is refused before compiling: data whose
length is not their subsample plate's size, a step size given as a string, and
step_size=None with no warmup to adapt it in."""

import inspect
import warnings

from jax import random
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC
from numpyro.infer.mcmc import MCMCKernel
import pytest

import numpyro_sgbd
from numpyro_sgbd import SGBD, SGLD, host_data, posterior_mode, reference_posterior
from numpyro_sgbd.validation import check_plate_data

# The logistic regression, smaller: N declared as a constant, as a user
# who knows the data's size writes it.
N, D, SUBSAMPLE = 200, 3, 20
_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, D)).astype(np.float32)
Y = (_rng.random(N) < 0.5).astype(np.float32)


def logistic(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE) as idx:
        numpyro.sample("obs", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def subsampled(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE) as idx:
        obs = numpyro.subsample(y, event_dim=0)
        numpyro.sample("obs", dist.Bernoulli(logits=X[idx] @ w), obs=obs)


NUM_GROUPS = 7
GROUP = _rng.integers(0, NUM_GROUPS, N)


def grouped(group, y):
    effect = numpyro.sample("effect", dist.Normal(0.0, 1.0).expand([NUM_GROUPS]))
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE) as idx:
        logits = effect[group[idx]]  # effect is read at data, not at plate indices
        numpyro.sample("obs", dist.Bernoulli(logits=logits), obs=y[idx])


SHORT = Y[:-100]
LONG = np.concatenate([Y, Y])


def _sgbd_init(model, *args):
    SGBD(model, step_size=1e-3).init(random.key(0), 0, None, args, {})


@pytest.mark.parametrize("y", [SHORT, LONG], ids=["short", "long"])
def test_a_y_of_another_length_than_its_plate_is_refused_by_the_kernel(y):
    kernel = SGBD(logistic, step_size=1e-3)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=5, progress_bar=False)
    with pytest.raises(ValueError, match=rf"argument 'y'.*site 'obs'.*{len(y)} ent"):
        mcmc.run(random.key(0), X, y)


@pytest.mark.parametrize("y", [SHORT, LONG], ids=["short", "long"])
def test_a_y_of_another_length_than_its_plate_is_refused_by_the_reference(y):
    with pytest.raises(ValueError, match=rf"argument 'y'.*plate 'data'.*size {N}"):
        reference_posterior(logistic, X, y, num_warmup=10, num_samples=10)


def test_a_short_x_is_named():
    with pytest.raises(ValueError, match=r"argument 'X' \(positional argument 0\)"):
        _sgbd_init(logistic, X[:-100], Y)


def test_data_given_as_keywords_and_kept_on_the_host_are_checked():
    def by_keyword(*, X, y):
        logistic(X, y)

    with pytest.raises(ValueError, match="keyword argument 'y'"):
        check_plate_data(by_keyword, (), {"X": X, "y": SHORT})
    with pytest.raises(ValueError, match="argument 'y'"):
        check_plate_data(logistic, host_data(X, SHORT))
    check_plate_data(logistic, host_data(X, Y))


def test_an_array_read_at_data_indices_may_have_any_length():
    # group has the plate's N rows; effect, read at group[idx], has 7.
    _sgbd_init(grouped, GROUP, Y)
    with pytest.raises(ValueError, match="argument 'group'"):
        check_plate_data(grouped, (GROUP[:-1], Y))


def test_numpyro_subsample_of_a_short_y_names_it():
    with pytest.raises(ValueError, match=r"numpyro.subsample.*argument 'y'"):
        _sgbd_init(subsampled, X, SHORT)


def test_second_plate_and_lagged_reads():
    def matrix(R):
        with numpyro.plate("rows", N, subsample_size=8, dim=-2) as i:
            with numpyro.plate("cols", D, subsample_size=2, dim=-1) as j:
                numpyro.sample("r", dist.Normal(0.0, 1.0), obs=R[i][:, j])

    check_plate_data(matrix, (X,))
    with pytest.raises(ValueError, match=r"argument 'R'.*plate 'cols'.*axis 1"):
        check_plate_data(matrix, (X[:, :2],))

    def series(y):  # N - 1 transitions of a series of N values
        rho = numpyro.sample("rho", dist.Normal(0.0, 1.0))
        with numpyro.plate("steps", N - 1, subsample_size=8) as t:
            numpyro.sample("y", dist.Normal(rho * y[t], 1.0), obs=y[t + 1])

    check_plate_data(series, (Y,))


# ------------------------------------------ data used without the plate's indices


def unindexed_obs(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE) as idx:
        numpyro.sample("obs", dist.Bernoulli(logits=X[idx] @ w), obs=y)


def unindexed_x(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE) as idx:
        numpyro.sample("obs", dist.Bernoulli(logits=X @ w), obs=y[idx])


# Each entry point that samples or searches on the model: the error must come
# from the check, before anything is compiled.
ENTRY_POINTS = {
    "kernel": _sgbd_init,
    "reference": lambda model, *args: reference_posterior(
        model, *args, num_warmup=10, num_samples=10
    ),
    "mode": posterior_mode,
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_observed_site_without_the_plates_indices_is_named(entry):
    """``obs=y`` for ``obs=y[idx]``: the kernels met JAX's "Incompatible shapes
    for broadcasting"; the reference and the mode search, which evaluate the
    plate whole, ran on a model that no kernel can run."""
    with pytest.raises(
        ValueError,
        match=r"site 'obs' \(model argument 'y' \(positional argument 1\)\): "
        rf"it has {N} entries.*without the plate's indices.*obs=y\[idx\]",
    ):
        ENTRY_POINTS[entry](unindexed_obs, X, Y)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_argument_without_the_plates_indices_is_named(entry):
    """``X @ w`` for ``X[idx] @ w``: the argument is named, and y, read at the
    plate's indices, is not."""
    with pytest.raises(ValueError) as caught:
        ENTRY_POINTS[entry](unindexed_x, X, Y)
    text = str(caught.value)
    assert text.startswith("model argument 'X' (positional argument 0): it has")
    assert "use x[idx]" in text and "argument 'y'" not in text


BAD_ROW = 17


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("bad", [np.nan, -np.inf], ids=["nan", "inf"])
def test_a_non_finite_covariate_is_named_with_its_row(entry, bad):
    """The kernels said "potential not finite ... standardise the covariates",
    the reference NumPyro's "invalid logits"; neither named the NaN."""
    bad_x = X.copy()
    bad_x[BAD_ROW, 1] = bad
    bad_x[BAD_ROW + 5, 0] = bad
    with pytest.raises(
        ValueError,
        match=rf"argument 'X' .*non-finite value at row {BAD_ROW} "
        rf"\(entry \({BAD_ROW}, 1\) is {bad}; 2 of {N} rows hold",
    ):
        ENTRY_POINTS[entry](logistic, bad_x, Y)


def test_a_non_finite_value_on_another_axis_or_on_the_host_is_named():
    with pytest.raises(ValueError, match=r"argument 'y'.*at row 3 "):
        check_plate_data(logistic, host_data(X, np.where(np.arange(N) == 3, np.nan, Y)))

    def transposed(Xt, y):
        logistic(Xt.T, y)

    bad = X.T.copy()
    bad[2, 9] = np.inf
    with pytest.raises(ValueError, match=r"index 9 along axis 1 \(entry \(2, 9\)"):
        check_plate_data(transposed, (jnp.asarray(bad), Y))


def test_missing_data_that_the_model_handles_are_not_refused():
    """NaN where the model masks the observations (``obs_mask``) or tests for
    NaN itself: missing data, not an error."""
    missing = np.where(np.arange(N) % 10 == 0, np.nan, Y).astype(np.float32)

    def masked(X, y, observed):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
        with numpyro.plate("data", N, subsample_size=SUBSAMPLE) as idx:
            numpyro.sample(
                "obs", dist.Normal(X[idx] @ w, 1.0), obs=y[idx], obs_mask=observed[idx]
            )

    def imputed(X, y):
        logistic(jnp.nan_to_num(X), y)

    check_plate_data(masked, (X, missing, np.isfinite(missing)))
    bad_x = X.copy()
    bad_x[BAD_ROW, 1] = np.nan
    check_plate_data(imputed, (bad_x, Y))


# --------------------------------------------------------------- step sizes

SAMPLERS = sorted(
    name
    for name in numpyro_sgbd.__all__
    if inspect.isclass(getattr(numpyro_sgbd, name))
    and issubclass(getattr(numpyro_sgbd, name), MCMCKernel)
)
# Each sampler's required arguments besides the step size.
REQUIRED = {
    "Recipe": {"diffusion": lambda z: 1.0},
    "SGRLD": {"inverse_metric": lambda z: 1.0},
}


def test_every_sampler_is_covered():
    assert set(SAMPLERS) >= {"SGBD", "SGLD", "NOGIN", "SGHMC", "SGNHT", "Recipe"}


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_step_size_given_as_a_string_is_refused(name):
    cls = getattr(numpyro_sgbd, name)
    with pytest.raises(TypeError, match=r"step_size must be a positive float.*'0\.05'"):
        cls(logistic, step_size="0.05", **REQUIRED.get(name, {}))


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_misspelt_hyperparameter_is_refused_with_the_valid_names(name):
    """Issue 44: at construction, naming the closest valid name and all of them
    (Python's own TypeError names neither); the signature in help() stays."""
    cls = getattr(numpyro_sgbd, name)
    with pytest.raises(TypeError) as raised:
        cls(logistic, stepsize=0.05, **REQUIRED.get(name, {}))
    text = str(raised.value)
    assert f"{name} got an unexpected keyword argument 'stepsize'" in text
    assert "did you mean 'step_size'?" in text
    assert "Its arguments are: model, potential_fn, gradient_fn, step_size" in text
    assert "step_size" in inspect.signature(cls).parameters


def test_other_non_numbers_are_refused():
    with pytest.raises(TypeError, match=r"step_size\['w'\] must be"):
        SGBD(logistic, step_size={"w": "0.05"})
    with pytest.raises(TypeError, match="got the bool True"):
        SGLD(logistic, step_size=True)
    with pytest.raises(TypeError, match="friction must be"):
        numpyro_sgbd.SGHMC(logistic, step_size=0.05, friction="1.0")
    with pytest.raises(TypeError, match="init_noise_sd must be"):
        SGLD(logistic, step_size=0.05, init_noise_sd="0.1")
    SGBD(logistic, step_size=np.float32(0.05))  # NumPy and JAX numbers are fine
    SGBD(logistic, step_size={"w": jnp.full(D, 0.05)})


# -------------------------------------------------------------------- warmup


def _unadapted(record):
    return [w for w in record if "num_warmup=0" in str(w.message)]


def test_no_warmup_without_a_step_size_warns():
    kernel = SGLD(logistic)
    with pytest.warns(UserWarning, match="nothing is adapted"):
        kernel.init(random.key(0), 0, None, (X, Y), {})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        SGLD(logistic, step_size=1e-3).init(random.key(0), 0, None, (X, Y), {})
        # Resuming an adapted kernel (NumPyro calls init again when it resumes
        # from post_warmup_state after a run inside jax.jit): nothing to say.
        kernel.init(random.key(0), 10, None, (X, Y), {})
        kernel.init(random.key(0), 0, None, (X, Y), {})
    assert not _unadapted(record)


def test_warmup_then_run_does_not_warn():
    mcmc = MCMC(SGBD(logistic), num_warmup=4, num_samples=4, progress_bar=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mcmc.warmup(random.key(0), X, Y)
        mcmc.run(random.key(1), X, Y)
        mcmc.post_warmup_state = mcmc.last_state
        mcmc.run(mcmc.post_warmup_state.rng_key, X, Y)
    assert not _unadapted(record)
