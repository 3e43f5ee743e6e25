"""NOGIN, the noisy gradient integrator: the pure A-B-O-B-A pieces on flat vectors.

The gradient covariance couples coordinates, so these functions act on one flat
vector ``theta`` of length d (a kernel ravels its pytree first). The mass matrix is
diagonal, given by its diagonal ``mass`` (shape ``(d,)`` or a scalar).
"""

from typing import Any, NamedTuple

import jax
from jax import random
import jax.numpy as jnp

__all__ = [
    "COVARIANCES",
    "NOGINInfo",
    "NoiseAverage",
    "NOGINUpdateState",
    "nogin_damp",
    "nogin_drift",
    "nogin_init",
    "nogin_kick",
    "nogin_lambda",
    "nogin_step",
    "noise_average_init",
    "noise_average_update",
]

COVARIANCES = ("lowrank", "diag", "full", "lowrank+diag")

#: Steps over which ``"lowrank+diag"`` averages its noise estimates: the weight
#: of a new one is ``max(1 / t, 1 / NOISE_WINDOW)`` at its t-th update. The
#: step adaptation keeps the smallest step the damping allowed over the second
#: half of warmup, so the estimate's noise sets the step: on
#: ``benchmarks/nogin_scale.py``'s indexed-vector model (each coefficient in 0.6 %
#: of the rows) a 100-step window held the step at 0.15 in u and the smallest
#: bulk ESS at 49 in 4,000 draws; 500 steps, 0.20 and 145 (1,000: the same), xi
#: 0.057 against 0.062.
NOISE_WINDOW = 500
#: Per-datum gradients a step that ``"lowrank+diag"`` draws for its estimate
#: (:class:`~numpyro_sgbd.estimators.MinibatchEstimator`'s ``covariance_rows``).
NOISE_ROWS_PER_STEP = 8


class NoiseAverage(NamedTuple):
    r"""The running estimate of the force's noise covariance that
    ``covariance="lowrank+diag"`` damps by:
    :math:`\bar\Sigma \approx \operatorname{diag}(e) + FF^\top`, F = QL,
    :math:`e = \max(\mathrm{diagonal} - \operatorname{rowsum}(F^2), 0)`.

    - **diagonal** - the moving average of :math:`\Sigma`'s diagonal, shape
      ``(d,)`` (exact: every estimate's diagonal enters it).
    - **basis** - Q, shape ``(d, r)``, orthonormal: the r leading directions of
      the moving average, tracked by one subspace iteration a step (all of
      :math:`R^d` where r = d).
    - **root** - L, shape ``(r, r)``, lower triangular: :math:`LL^\top` is the
      average compressed to the basis, :math:`Q^\top\bar\Sigma Q`.
    - **count** - the number of estimates averaged so far.
    """

    diagonal: Any
    basis: Any
    root: Any
    count: Any

    @property
    def factor(self):
        r"""F = QL, shape ``(d, r)``: :math:`FF^\top = QQ^\top\bar\Sigma
        QQ^\top`."""
        return self.basis @ self.root


def noise_average_init(d, rank, dtype=None):
    """The empty :class:`NoiseAverage` of ``d`` coordinates and rank ``rank``
    (the first update replaces it), its basis the first ``rank`` coordinate
    axes.

    >>> noise_average_init(5, 2).factor.shape
    (5, 2)
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    return NoiseAverage(
        jnp.zeros((d,), dtype),
        jnp.eye(d, rank, dtype=dtype),
        jnp.zeros((rank, rank), dtype),
        jnp.zeros((), jnp.int32),
    )


def noise_average_update(average, rows, window=NOISE_WINDOW):
    r"""The :class:`NoiseAverage` with a new unbiased estimate
    :math:`BB^\top` of the noise covariance, ``rows`` = B of shape ``(d, m)``
    (m per-datum gradients drawn apart from the force's minibatch, centred and
    scaled: :class:`~numpyro_sgbd.estimators.MinibatchEstimator` with
    ``covariance="rows"``).

    With weight :math:`w = \max(1/t, 1/\mathrm{window})` the average moves to
    :math:`S' = (1-w)\bar\Sigma + wBB^\top`. Its diagonal is kept exactly.
    Its leading directions are tracked by one step of subspace iteration: with
    :math:`K = [\sqrt{1-w}F, \sqrt w B]` (so that :math:`KK^\top` is the new
    average's low-rank part), the new basis orthonormalises
    :math:`KK^\top Q + \epsilon Q` (a shift of a millionth of the mean
    variance keeps the old directions where the estimate has none) by a
    Householder QR, and :math:`LL^\top = Q^\top KK^\top Q`. As the average
    moves slowly, one iteration a step follows its leading directions as power
    iteration converges (where d <= r the basis spans everything and the
    average is exact). O(d r (r + m)) flops, a d x r QR and an r x r Cholesky
    factorisation: never a d x d matrix nor an eigendecomposition.

    >>> import jax.numpy as jnp
    >>> avg = noise_average_update(noise_average_init(2, 2), jnp.eye(2))
    >>> bool(jnp.allclose(avg.factor @ avg.factor.T, jnp.eye(2), atol=1e-5))
    True
    """
    count = average.count + 1
    w = jnp.maximum(1.0 / count, 1.0 / window).astype(rows.dtype)
    stacked = jnp.concatenate(
        [jnp.sqrt(1.0 - w) * average.factor, jnp.sqrt(w) * rows], axis=1
    )
    diagonal = (1.0 - w) * average.diagonal + w * jnp.sum(rows**2, axis=1)
    shift = 1e-6 * jnp.mean(diagonal) + jnp.finfo(rows.dtype).tiny
    moved = stacked @ (stacked.T @ average.basis) + shift * average.basis
    # Householder QR: an orthonormal basis also where the iterate is (nearly)
    # rank-deficient, as the first steps' m-column estimates make it.
    basis = jnp.linalg.qr(moved)[0]
    projected = stacked.T @ basis  # (r + m, r)
    rank = basis.shape[1]
    gram = projected.T @ projected
    # The jitter also at rounding's scale of the largest direction: where the
    # noise lies in a few directions of many coordinates (a network's, d =
    # 79,510), a millionth of the mean variance is below float32's resolution of
    # the gram and its Cholesky factor came out NaN.
    eps = jnp.finfo(rows.dtype).eps
    jitter = jnp.maximum(shift, rank * eps * jnp.max(jnp.diagonal(gram)))
    gram = gram + jitter * jnp.eye(rank, dtype=rows.dtype)
    return NoiseAverage(diagonal, basis, jnp.linalg.cholesky(gram), count)


def nogin_lambda(step_size, friction):
    r""":math:`\lambda = \sqrt{(1 - e^{-\gamma h}) / (1 + e^{-\gamma h})}`.

    With this choice the O-step without gradient noise is the exact
    Ornstein-Uhlenbeck flow over time h: the momentum is multiplied by
    :math:`e^{-\gamma h}` and gets fresh variance :math:`1 - e^{-2\gamma h}` (times
    :math:`M/\beta`). Matthews & Weare, Algorithm 1, line 1 (the algorithm's form; the
    text's :math:`e^{-2\gamma h}` variant halves the friction).

    >>> import math
    >>> lam = nogin_lambda(0.5, 2.0)
    >>> abs(float((1 - lam**2) / (1 + lam**2)) - math.exp(-1.0)) < 1e-6
    True
    """
    decay = jnp.exp(-friction * step_size)
    return jnp.sqrt((1.0 - decay) / (1.0 + decay))


def nogin_drift(theta, p, step_size, mass=1.0):
    r"""The half A-step :math:`\theta \leftarrow \theta + h M^{-1} p / 2`
    (Algorithm 2, lines 3 and 8)."""
    return theta + 0.5 * step_size * p / mass


def _check_noise(noise, covariance, d):
    if covariance not in COVARIANCES:
        raise ValueError(
            f"covariance must be one of {COVARIANCES}, got {covariance!r}."
        )
    if covariance == "lowrank+diag":
        if not isinstance(noise, NoiseAverage):
            raise ValueError(
                "covariance='lowrank+diag' damps by a NoiseAverage "
                f"(noise_average_update), got {type(noise).__name__}."
            )
        expected = "(d,) and (d, r)"
        ok = jnp.shape(noise.diagonal) == (d,) and jnp.shape(noise.factor)[:1] == (d,)
        noise = (jnp.shape(noise.diagonal), jnp.shape(noise.factor))
    else:
        expected = {"diag": "(d,)", "full": "(d, d)", "lowrank": "(d, k)"}[covariance]
        ok = {
            "diag": jnp.shape(noise) == (d,),
            "full": jnp.shape(noise) == (d, d),
            "lowrank": jnp.ndim(noise) == 2 and jnp.shape(noise)[0] == d,
        }[covariance]
    if not ok:
        raise ValueError(
            f"covariance={covariance!r} needs noise of shape {expected} with d={d}, "
            f"got {noise if covariance == 'lowrank+diag' else jnp.shape(noise)}."
        )


def nogin_damp(
    p, noise, step_size, lam, *, covariance, mass=1.0, inverse_temperature=1.0
):
    r"""The O-step: damp the momentum by the gradient covariance (Algorithm 2, line 6,
    corrected for mass and temperature; see below).

    .. math::

        p \leftarrow \big((1-\lambda^2) I - c\,\Sigma M^{-1}\big)
            \big((1+\lambda^2) I + c\,\Sigma M^{-1}\big)^{-1} p,
        \qquad c = \frac{\beta h^2}{4},

    without forming an inverse. As :math:`(1-\lambda^2) + (1+\lambda^2) = 2`, the
    diag and lowrank forms compute it as :math:`2x - p` with
    :math:`x = ((1+\lambda^2)I + c\Sigma M^{-1})^{-1}p`: in strongly damped
    directions x is small and its rounding error stays small, where multiplying it
    by :math:`c\Sigma M^{-1}` would amplify it.

    The paper's Algorithm 2 writes
    :math:`\frac{h^2}{4\beta} M\Sigma`: dimensionally inconsistent, and equal to
    the form above only for :math:`M = I`, :math:`\beta = 1`. The two half-kicks
    add :math:`h^2\Sigma` to the momentum variance whatever M and :math:`\beta`,
    while the momentum's law is :math:`N(0, M/\beta)`; the damping that removes
    it is :math:`\beta\Sigma M^{-1}`. With it Lemma 4.2 holds for any mass and
    temperature (the stationary covariance of the linear Gaussian chain, computed
    exactly, equals :math:`\Omega/\beta`); with the paper's form it does not
    (scalar M = 4, :math:`\beta = 1`, h = 0.8, :math:`\Omega = 2`,
    :math:`\Sigma = 3`: 0.43 instead of 2).

    ``noise`` describes :math:`\Sigma`, the covariance of the noisy force:

    - ``"diag"``: its diagonal, shape ``(d,)``; O(d).
    - ``"full"``: the matrix, shape ``(d, d)``; O(d^3). With :math:`R = M^{-1/2}`,
      :math:`\Sigma M^{-1} = R^{-1} S R` for the symmetric
      :math:`S = R\Sigma R = V\operatorname{diag}(s)V^\top`, so one symmetric
      eigendecomposition gives the update,
      :math:`R^{-1}V\operatorname{diag}\big(\tfrac{1-\lambda^2-cs}{1+\lambda^2+cs}
      \big)V^\top R\,p`, and the largest eigenvalue, with no inverse formed.
    - ``"lowrank"``: a factor C of shape ``(d, k)`` with :math:`\Sigma = CC^\top`
      (k = the minibatch size for the per-datum estimate). With
      :math:`D = M^{-1}C`, the Woodbury identity gives
      :math:`(aI + cCD^\top)^{-1} p = \big(p - cC(aI_k + cD^\top C)^{-1}D^\top
      p\big)/a`, the k x k inverse through the eigendecomposition of
      :math:`D^\top C`: O(d k^2 + k^3) and never a d x d matrix.
    - ``"lowrank+diag"``: a :class:`NoiseAverage`,
      :math:`\Sigma = \operatorname{diag}(e) + FF^\top` (r columns). In the
      mass's coordinates (:math:`S = R\Sigma R = E + WW^\top`, W = RF) the
      Woodbury identity with the diagonal :math:`A = (1+\lambda^2)I + cE`
      gives :math:`(A + cWW^\top)^{-1}q = A^{-1}q - cA^{-1}W(I_r +
      cW^\top A^{-1}W)^{-1}W^\top A^{-1}q`, the r x r system by Cholesky:
      O(d r^2 + r^3). The largest eigenvalue is estimated from below, as the
      larger of S's largest diagonal entry and its Rayleigh quotient after
      four steps of power iteration from the leading direction of
      :math:`WW^\top` (itself by power iteration on :math:`W^\top W`).

    The per-minibatch forms use a single LAPACK decomposition per step: with a
    linear solve and a separate eigenvalue routine in one step, XLA on the CPU
    (jaxlib 0.10, two cores) deadlocked under ``chain_method="vectorized"``.
    ``"lowrank+diag"``'s QR and Cholesky factorisations ran vectorized
    (``tests/test_nogin.py``, 2,048 chains).

    :param p: momentum, shape ``(d,)``.
    :param noise: :math:`\Sigma` in the form ``covariance`` names.
    :param float step_size: h.
    :param float lam: :math:`\lambda` from :func:`nogin_lambda`.
    :param str covariance: ``"lowrank"``, ``"diag"``, ``"full"`` or ``"lowrank+diag"``.
    :param mass: diagonal of M, scalar or shape ``(d,)``.
    :param float inverse_temperature: :math:`\beta`.
    :return: ``(p_new, noise_damping)``; ``noise_damping`` is
        :math:`c\,\rho(\Sigma M^{-1})`, the largest eigenvalue of the noise term.
        Where it is large compared with :math:`1+\lambda^2` the momentum is nearly
        reversed or cancelled every step and exploration stalls (Matthews & Weare,
        Section 4.3).

    >>> import jax.numpy as jnp
    >>> p, _ = nogin_damp(jnp.ones(2), jnp.zeros(2), 0.1, 0.5, covariance="diag")
    >>> bool(jnp.allclose(p, 0.75 / 1.25))
    True
    """
    d = jnp.shape(p)[0]
    _check_noise(noise, covariance, d)
    if d == 0:  # nothing to damp (a model without latent sites)
        return p, jnp.zeros((), p.dtype)
    c = inverse_temperature * step_size**2 / 4.0
    a_plus = 1.0 + lam**2
    inv_mass = 1.0 / jnp.broadcast_to(jnp.asarray(mass, p.dtype), (d,))
    if covariance == "diag":
        a = c * noise * inv_mass
        return (2.0 - a_plus - a) / (a_plus + a) * p, jnp.max(a)
    if covariance == "full":
        # Sigma M^-1 = R^-1 S R with R = M^-1/2 and S = R Sigma R symmetric.
        root = jnp.sqrt(inv_mass)
        eigvals, eigvecs = jnp.linalg.eigh(root[:, None] * noise * root[None, :])
        a = c * eigvals
        factor = (2.0 - a_plus - a) / (a_plus + a)
        return (eigvecs @ (factor * (eigvecs.T @ (root * p)))) / root, a[-1]
    if covariance == "lowrank+diag":
        return _damp_low_rank_diagonal(p, noise, c, a_plus, inv_mass)
    # lowrank: Sigma M^-1 = C D^T with D = M^-1 C.
    dm = inv_mass[:, None] * noise  # (d, k)
    if noise.shape[1] == 0:
        return (2.0 - a_plus) / a_plus * p, jnp.zeros((), p.dtype)
    # C^T M^-1 C = U diag(g) U^T, (k, k); the nonzero eigenvalues of C D^T are g.
    g, u = jnp.linalg.eigh(noise.T @ dm)
    small_inv_dtp = u @ ((u.T @ (dm.T @ p)) / (a_plus + c * g))
    x = (p - c * noise @ small_inv_dtp) / a_plus
    return 2.0 * x - p, c * g[-1]


def _damp_low_rank_diagonal(p, average, c, a_plus, inv_mass):
    """:func:`nogin_damp` for a :class:`NoiseAverage` (see there)."""
    root = jnp.sqrt(inv_mass)
    w = root[:, None] * average.factor  # (d, r)
    diag_s = average.diagonal * inv_mass  # S's diagonal
    e = jnp.maximum(diag_s - jnp.sum(w**2, axis=1), 0.0)
    a = a_plus + c * e
    aw = w / a[:, None]
    q = root * p
    rank = w.shape[1]
    small = jnp.eye(rank, dtype=p.dtype) + c * (w.T @ aw)  # I + c W^T A^-1 W
    solve = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(small), True), aw.T @ q)
    x = q / a - c * aw @ solve
    # S's largest eigenvalue from below: its largest diagonal entry, and its
    # Rayleigh quotient after power iteration from the leading direction of
    # W W^T (itself by power iteration on W^T W).
    tiny = jnp.finfo(p.dtype).tiny
    gram = w.T @ w
    v = jnp.ones((rank,), p.dtype)
    for _ in range(8):
        v = gram @ v
        v = v / jnp.maximum(jnp.linalg.norm(v), tiny)
    u = w @ v
    for _ in range(4):
        u = e * u + w @ (w.T @ u)
        u = u / jnp.maximum(jnp.linalg.norm(u), tiny)
    rayleigh = jnp.vdot(u, e * u + w @ (w.T @ u)) / jnp.maximum(jnp.vdot(u, u), tiny)
    top = jnp.maximum(jnp.max(diag_s), rayleigh)
    return (2.0 * x - q) / root, c * top


def nogin_kick(
    rng_key,
    p,
    z_grad,
    noise,
    step_size,
    friction,
    *,
    covariance,
    mass=1.0,
    inverse_temperature=1.0,
):
    r"""The B-O-B middle of one NOGIN step (Algorithm 2, lines 4-7).

    With the force :math:`\tilde F = -\nabla\hat U` (``z_grad`` is the gradient of
    the potential, NumPyro's sign), one draw :math:`R \sim N(0, M/\beta)` used in
    both half-kicks:

    .. math::

        p \leftarrow p + h\tilde F/2 + \lambda R, \quad
        p \leftarrow \text{O-step (:func:`nogin_damp`)}, \quad
        p \leftarrow p + h\tilde F/2 + \lambda R.

    :param rng_key: random key.
    :param p: momentum, shape ``(d,)``.
    :param z_grad: the noisy gradient of the potential at the drifted position.
    :param noise: :math:`\Sigma` of the noisy force, as :func:`nogin_damp` takes it.
    :param float step_size: h.
    :param float friction: :math:`\gamma`.
    :param str covariance: ``"lowrank"``, ``"diag"``, ``"full"`` or ``"lowrank+diag"``.
    :param mass: diagonal of M, scalar or shape ``(d,)``.
    :param float inverse_temperature: :math:`\beta`.
    :return: ``(p_new, noise_damping)``.

    **References**

    1. Matthews, C. & Weare, J. (2018). *Langevin Markov chain Monte Carlo with
       stochastic gradients* (NOGIN). Algorithms 1 and 2 (with the O-step of
       :func:`nogin_damp`); Lemma 4.2.
    """
    lam = nogin_lambda(step_size, friction)
    d = jnp.shape(p)[0]
    mass_vec = jnp.broadcast_to(jnp.asarray(mass, p.dtype), (d,))
    r = jnp.sqrt(mass_vec / inverse_temperature) * random.normal(rng_key, (d,), p.dtype)
    force = -z_grad  # potential gradient -> force
    half = 0.5 * step_size * force + lam * r
    p, noise_damping = nogin_damp(
        p + half,
        noise,
        step_size,
        lam,
        covariance=covariance,
        mass=mass_vec,
        inverse_temperature=inverse_temperature,
    )
    return p + half, noise_damping


class NOGINUpdateState(NamedTuple):
    """State of :func:`nogin_step`: **z**, the position, and **p**, the momentum
    (flat vectors of length d); **average**, the :class:`NoiseAverage` of
    ``covariance="lowrank+diag"`` (``None`` for the other forms)."""

    z: Any
    p: Any
    average: Any = None


class NOGINInfo(NamedTuple):
    """Statistics of one :func:`nogin_step`.

    - **estimate** - what ``estimate_fn`` returned at the drifted position (its
      potential estimate and noise are the step's statistics).
    - **noise_damping** - as :func:`nogin_damp` returns it.
    """

    estimate: Any
    noise_damping: Any


def nogin_init(z, rng_key=None, *, mass=1.0, inverse_temperature=1.0, rank=None):
    r"""The :class:`NOGINUpdateState` at the flat position ``z``, with the momentum
    drawn from its stationary law :math:`N(0, M/\beta)` (zero without a key) and,
    with ``rank``, an empty :class:`NoiseAverage` of that rank
    (``covariance="lowrank+diag"``).

    >>> import jax.numpy as jnp
    >>> nogin_init(jnp.zeros(3)).p.shape
    (3,)
    """
    average = None
    if rank is not None:
        average = noise_average_init(jnp.shape(z)[0], rank, z.dtype)
    if rng_key is None:
        return NOGINUpdateState(z, jnp.zeros_like(z), average)
    sd = jnp.sqrt(jnp.asarray(mass, z.dtype) / inverse_temperature)
    p = sd * random.normal(rng_key, jnp.shape(z), z.dtype)
    return NOGINUpdateState(z, p, average)


def nogin_step(
    rng_key,
    state,
    estimate_fn,
    step_size,
    *,
    friction,
    covariance,
    mass=1.0,
    inverse_temperature=1.0,
):
    r"""One NOGIN step A-B-O-B-A (Matthews & Weare, Algorithm 2): half a drift,
    the noisy force and its covariance at the drifted position, the B-O-B kick of
    :func:`nogin_kick`, and the second half drift.

    The force is evaluated inside the step, at the half-step position, so the step
    takes the gradient estimator as a function rather than a gradient.

    :param rng_key: random key of the kick.
    :param NOGINUpdateState state: position and momentum (flat, length d).
    :param estimate_fn: ``estimate_fn(z) -> estimate`` with fields ``z_grad`` (the
        potential's noisy gradient, flat) and ``noise_cov`` (:math:`\Sigma` in the
        form ``covariance`` names, or ``None`` for exact gradients).
    :param float step_size: h.
    :param float friction: :math:`\gamma`.
    :param str covariance: ``"lowrank"``, ``"diag"``, ``"full"`` or
        ``"lowrank+diag"``: with the last, ``noise_cov`` is a factor B, shape
        ``(d, m)``, of an unbiased estimate :math:`BB^\top` drawn apart from
        the force, which enters the state's :class:`NoiseAverage`
        (:func:`noise_average_update`) before the O-step damps by the average.
    :param mass: diagonal of M, scalar or shape ``(d,)``.
    :param float inverse_temperature: :math:`\beta`.
    :return: ``(NOGINUpdateState, NOGINInfo)``.

    >>> import jax, jax.numpy as jnp
    >>> from collections import namedtuple
    >>> Est = namedtuple("Est", ["z_grad", "noise_cov"])
    >>> exact = lambda z: Est(z, None)  # a standard normal, exact gradients
    >>> state = nogin_init(jnp.zeros(2), jax.random.key(0))
    >>> state, info = nogin_step(
    ...     jax.random.key(1), state, exact, 0.5, friction=1.0, covariance="diag"
    ... )
    >>> float(info.noise_damping)
    0.0
    """
    z = nogin_drift(state.z, state.p, step_size, mass)
    estimate = estimate_fn(z)
    noise, average = estimate.noise_cov, state.average
    if noise is None:  # exact gradients: Sigma = 0
        noise, covariance = jnp.zeros_like(z), "diag"
    elif covariance == "lowrank+diag":
        noise = average = noise_average_update(average, noise)
    p, damping = nogin_kick(
        rng_key,
        state.p,
        estimate.z_grad,
        noise,
        step_size,
        friction,
        covariance=covariance,
        mass=mass,
        inverse_temperature=inverse_temperature,
    )
    moved = NOGINUpdateState(nogin_drift(z, p, step_size, mass), p, average)
    return moved, NOGINInfo(estimate, damping)
