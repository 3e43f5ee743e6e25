"""Linear changes of variables for the kernels: z = z_hat + L u, L L' ~ H^-1.

With H the full-data Hessian of the potential at its mode z_hat, the posterior of
``u`` is close to a standard normal where the Laplace approximation holds: every
coordinate has unit scale and the coordinates are nearly uncorrelated, so one step
size serves them all and a coordinate-wise rule such as SGBD's Barker moves is not
held back by correlations it cannot see. The kernels keep the position ``z`` in the
model's unconstrained space and move it by ``L du``, where ``du`` is the update
rule's increment computed in ``u``; gradients (and the per-datum gradients behind
the noise estimates) reach the rule as ``L' g``, their value in ``u``.

Three forms of L, by what they cost (d parameters, n the subsample size, k the rank):

=============  ============================  =============  =====================
form           L                             memory         a step with noise
=============  ============================  =============  =====================
``dense``      ``R^-T``, ``H = R R'``        2 d^2 floats   O(n d^2)
``lowrank``    ``D^-1/2 (I + V A V')``       d (k + 1)      O(n d k)
``diagonal``   ``D^-1/2``                    d              O(n d)
=============  ============================  =============  =====================

D is H's diagonal; ``V`` (d x k, orthonormal) and the Ritz values behind ``A`` come
from k Lanczos steps on the scaled Hessian ``D^-1/2 H D^-1/2`` (Golub & Van Loan,
Matrix Computations, Section 10.1), one Hessian-vector product each, so that the
directions the diagonal misses most (the scaled Hessian's extreme eigenvalues:
strongly correlated parameters) are whitened too. No d x d array is formed for
``lowrank`` or ``diagonal``.

L is the Laplace approximation's, so where the posterior is far from Gaussian
(a scale mixture, heavy tails, a skewed scale parameter) the posterior sds of u can
be far from 1. ``adapt_mass_matrix`` re-estimates them from each chain's warmup
draws, in windows as NUTS's diagonal mass adaptation does (Stan Reference Manual,
"HMC algorithm parameters": an initial buffer, doubling windows, a terminal
buffer): u = diag(s) v, and the update rule runs in v (:func:`scale_windows`,
:func:`scale_update`).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DENSE_MAX_DIM",
    "DENSE_MAX_BYTES",
    "Preconditioner",
    "ScaleAdaptation",
    "choose_preconditioner",
    "dense",
    "diagonal",
    "lowrank",
    "scale_init",
    "scale_update",
    "scale_windows",
]

#: ``preconditioner="auto"`` is dense up to this many parameters, low-rank plus
#: diagonal above: a step's per-datum gradients cost O(n d^2) with a dense L,
#: which at d = 100, n = 1,000 is already several times a step's own cost.
DENSE_MAX_DIM = 100
#: A dense L (and its inverse) past this many bytes is an error.
DENSE_MAX_BYTES = 1 << 30
#: Lanczos steps (the rank k of the low-rank correction).
LOWRANK_RANK = 20
FORMS = ("dense", "lowrank", "diagonal")


class Preconditioner(NamedTuple):
    """``z = loc + L u`` for flat vectors; see the module docstring.

    :ivar str form: ``"dense"``, ``"lowrank"`` or ``"diagonal"``.
    :ivar loc: ``z_hat``, shape (d,).
    :ivar scale: ``D^-1/2`` (the per-coordinate posterior sd of the Laplace
        approximation's diagonal), shape (d,); ones for ``dense``.
    :ivar matrix: ``dense``: L (d x d, upper triangular); ``lowrank``: V (d x k);
        ``diagonal``: ``None``.
    :ivar values: ``lowrank``: the k values ``A`` of ``L = D^-1/2 (I + V diag(A)
        V')``; otherwise ``None``.
    :ivar inverse: ``dense``: L^-1 = R' (d x d); ``lowrank``: the k values ``B`` of
        ``L^-1 = (I + V diag(B) V') D^1/2``; ``diagonal``: ``None``.
    """

    form: str
    loc: jax.Array
    scale: jax.Array
    matrix: object = None
    values: object = None
    inverse: object = None

    @property
    def nbytes(self):
        """Memory of L (and what applies its inverse), in bytes."""
        arrays = (self.scale, self.matrix, self.values, self.inverse)
        return int(sum(np.asarray(a).nbytes for a in arrays if a is not None))

    def move(self, du):
        """``L du`` for a flat increment ``du`` of shape (d,)."""
        if self.form == "dense":
            return self.matrix @ du
        if self.form == "lowrank":
            du = du + self.matrix @ (self.values * (du @ self.matrix))
        return self.scale * du

    def pull(self, g):
        """``L' g`` for gradients ``g`` of shape (..., d) (rows): their value in u."""
        if self.form == "dense":
            return g @ self.matrix
        g = g * self.scale
        if self.form == "lowrank":
            g = g + (g @ self.matrix * self.values) @ self.matrix.T
        return g

    def to_u(self, z):
        """``L^-1 (z - loc)`` for a flat position z of shape (d,)."""
        dz = z - self.loc
        if self.form == "dense":
            return self.inverse @ dz
        du = dz / self.scale
        if self.form == "lowrank":
            du = du + self.matrix @ (self.inverse * (du @ self.matrix))
        return du

    def to_z(self, u):
        """``loc + L u``."""
        return self.loc + self.move(u)


# A pytree whose form is static: a chain's state carries L (its ``setup``
# field) through jit, vmap and NumPyro's loop, where a string leaf cannot go.
jax.tree_util.register_pytree_node(
    Preconditioner,
    lambda pre: (tuple(pre)[1:], pre.form),
    lambda form, arrays: Preconditioner(form, *arrays),
)


#: The fewest rows :func:`noise_rows` lets the noise sd in u come from.
NOISE_ROWS_MIN = 128


def noise_rows(pre, n, d):
    """How many of a minibatch's ``n`` per-datum gradients the noise sd in the
    whitened coordinates is estimated from, or ``None`` for all of them.

    A dense L mixes every coordinate: pulling the n rows back costs n d^2
    multiply-adds, d times the minibatch gradient's n d (at d = 100, n = 1,000
    several times the rest of the step, ``benchmarks/run.py --parts i``). The
    corrected variants need only the noise variance per coordinate, which m of
    the n rows estimate without bias where the minibatch's first m rows are a
    random sample of the data (indices drawn with replacement, the kernels'
    default for n <= N/100, or as a random permutation; the estimator keeps
    every row of a sorted draw), and the kernels average it over steps
    (beta = 0.1: about ten minibatches). So with a dense L the
    noise comes from ``m = max(NOISE_ROWS_MIN, 16 n / d)`` rows, whose pull
    costs m d^2 = 16 n d multiply-adds, a dense product XLA runs near the
    machine's peak; the gradient itself uses every row. Where m reaches n
    (d <= 16 at any n), every row is used, as before."""
    if pre is None or pre.form != "dense":
        return None
    m = max(NOISE_ROWS_MIN, (16 * n) // max(d, 1))
    return None if m >= n else int(m)


def choose_preconditioner(d):
    """The form ``preconditioner="auto"`` takes for d parameters, and why."""
    if d <= DENSE_MAX_DIM:
        return "dense", f"d = {d} <= {DENSE_MAX_DIM}"
    return "lowrank", f"d = {d} > {DENSE_MAX_DIM}: low-rank plus diagonal"


def dense_bytes(d, dtype=np.float32):
    """Memory a dense L and its inverse take for d parameters."""
    return 2 * d * d * np.dtype(dtype).itemsize


def check_dense(d, dtype=np.float32):
    """Raise before any work when a dense L for d parameters passes
    :data:`DENSE_MAX_BYTES`."""
    need = dense_bytes(d, dtype)
    if need > DENSE_MAX_BYTES:
        raise ValueError(
            f"preconditioner='dense' needs {need / 2**30:.1f} GiB for d = {d} "
            f"parameters (L and its inverse, d x d each; the limit is "
            f"{DENSE_MAX_BYTES / 2**30:.0f} GiB). Use preconditioner='lowrank' "
            "(O(d k) memory) or 'diagonal'."
        )


def _not_positive(what):
    return ValueError(
        f"the full-data Hessian at the mode is not positive definite ({what}): the "
        "point is not a strict mode, or the posterior is improper along some "
        "direction. Check the model's priors, pass init_params with a step_size "
        "(no preconditioner), or use preconditioner='diagonal'."
    )


def dense(loc, hessian):
    """L = R^-T from the Cholesky factor of the d x d Hessian ``H = R R'``.

    Computed in float64 on the host (the Hessian of an ill-conditioned regression
    can have a condition number of 10^10 and more), then cast to ``loc``'s dtype.

    >>> import numpy as np
    >>> H = np.array([[4.0, 1.0], [1.0, 2.0]])
    >>> p = dense(np.zeros(2, np.float32), H)
    >>> L = np.asarray(p.matrix, float)
    >>> np.allclose(L @ L.T, np.linalg.inv(H), atol=1e-6)
    True
    """
    h = np.asarray(hessian, np.float64)
    h = 0.5 * (h + h.T)
    if not np.all(np.isfinite(h)):
        raise _not_positive("it has non-finite entries")
    try:
        r = np.linalg.cholesky(h)
    except np.linalg.LinAlgError:
        smallest = float(np.linalg.eigvalsh(h)[0])
        raise _not_positive(f"smallest eigenvalue {smallest:.3g}") from None
    eye = np.eye(h.shape[0])
    l_matrix = np.linalg.solve(r, eye).T  # R^-T: upper triangular
    dtype = jnp.result_type(loc)
    # Cast on the host: a device-side cast or fill compiles a program of its own.
    return Preconditioner(
        "dense",
        jnp.asarray(loc, dtype),
        jnp.asarray(np.ones(h.shape[0], dtype)),
        jnp.asarray(l_matrix.astype(dtype)),
        None,
        jnp.asarray(r.T.astype(dtype)),
    )


def diagonal(loc, hessian_diag):
    """L = diag(1 / sqrt(H_jj)).

    >>> p = diagonal(np.zeros(2, np.float32), np.array([4.0, 0.25]))
    >>> np.asarray(p.scale).tolist()
    [0.5, 2.0]
    """
    h = np.asarray(hessian_diag, np.float64)
    if not np.all(np.isfinite(h)) or np.any(h <= 0):
        j = int(np.argmin(np.where(np.isfinite(h), h, -np.inf)))
        raise _not_positive(f"diagonal entry {j} is {h[j]:.3g}")
    dtype = jnp.result_type(loc)
    return Preconditioner(
        "diagonal", jnp.asarray(loc, dtype), jnp.asarray((h**-0.5).astype(dtype))
    )


def lowrank(loc, hessian_diag, hvp, *, rank=LOWRANK_RANK, seed=0):
    """L = D^-1/2 (I + V diag(A) V'), from ``rank`` Lanczos steps on the scaled
    Hessian ``S = D^-1/2 H D^-1/2`` (one Hessian-vector product each).

    With Ritz pairs ``(theta_i, v_i)`` of S, S is taken as ``I + V (Theta - I) V'``
    (unit curvature outside the Krylov space, where the diagonal scaling is
    trusted), so ``S^-1/2 = I + V (Theta^-1/2 - I) V'``: ``A = theta^-1/2 - 1``, and
    the inverse map uses ``B = theta^1/2 - 1``.

    :param loc: the mode, flat (d,).
    :param hessian_diag: H's diagonal, (d,), positive.
    :param hvp: ``V -> rows H v`` at the mode, for a (m, d) block of vectors.
    """
    diag = diagonal(loc, hessian_diag)
    d = int(np.shape(loc)[0])
    k = int(min(rank, d))
    s = np.asarray(hessian_diag, np.float64) ** -0.5
    dtype = jnp.result_type(loc)

    def scaled_product(v):
        hv = np.asarray(hvp(jnp.asarray((s * v)[None], dtype))[0], np.float64)
        return s * hv

    rng = np.random.default_rng(seed)
    q = rng.normal(size=d)
    q /= np.linalg.norm(q)
    basis = np.zeros((k, d))
    alpha, beta = np.zeros(k), np.zeros(k)
    m = k
    for j in range(k):
        basis[j] = q
        w = scaled_product(q)
        alpha[j] = q @ w
        # Full re-orthogonalisation (k is small): keeps the Ritz vectors orthonormal.
        w -= basis[: j + 1].T @ (basis[: j + 1] @ w)
        w -= basis[: j + 1].T @ (basis[: j + 1] @ w)
        b = np.linalg.norm(w)
        if j + 1 < k:
            if b < 1e-10:  # an invariant subspace: S is known exactly there
                m = j + 1
                break
            beta[j] = b
            q = w / b
    t = np.diag(alpha[:m]) + np.diag(beta[: m - 1], 1) + np.diag(beta[: m - 1], -1)
    theta, y = np.linalg.eigh(t)
    if not np.all(np.isfinite(theta)) or theta[0] <= 0:
        raise _not_positive(f"a Ritz value of the scaled Hessian is {theta[0]:.3g}")
    vectors = basis[:m].T @ y  # (d, m), orthonormal
    return Preconditioner(
        "lowrank",
        diag.loc,
        diag.scale,
        jnp.asarray(vectors, dtype),
        jnp.asarray(theta**-0.5 - 1, dtype),
        jnp.asarray(theta**0.5 - 1, dtype),
    )


# ------------------------------------------------ scales of u from warmup draws
#: The fewest warmup iterations with which ``adapt_mass_matrix`` re-estimates the
#: scales (below it they stay 1: the windows would hold too few draws).
SCALE_MIN_WARMUP = 200
#: Pseudo-draws at the Laplace scale 1 added to each window's variance (Stan adds
#: 5 at 10^-3; in u the prior guess is 1, so the shrinkage is towards L itself).
SCALE_SHRINKAGE = 5.0


class ScaleAdaptation(NamedTuple):
    """Per-chain state of the windowed re-estimation of u's scales.

    :ivar scale: s, the current per-coordinate sd of u (ones at the start), (d,).
    :ivar mean: the current window's running mean of u, (d,).
    :ivar m2: its running sum of squared deviations (Welford), (d,).
    :ivar count: draws in the current window, a scalar.
    """

    scale: jax.Array
    mean: jax.Array
    m2: jax.Array
    count: jax.Array


def scale_windows(num_warmup):
    """``(start, ends)``: the iteration after which the first window opens and the
    iterations at which each window closes (an empty ``ends`` when ``num_warmup <``
    :data:`SCALE_MIN_WARMUP`).

    The first 15 % of warmup is a buffer (the chain leaves its start), then three
    windows of doubling length close at 60 %: each new estimate of s is used by the
    next window, the last one from 60 % on. The step size is adapted after it, with
    the scales fixed (see the kernels).

    >>> scale_windows(1000)
    (150, (214, 343, 600))
    >>> scale_windows(100)
    (100, ())
    """
    num_warmup = int(num_warmup)
    if num_warmup < SCALE_MIN_WARMUP:
        return num_warmup, ()
    start, stop = int(0.15 * num_warmup), int(0.6 * num_warmup)
    base = (stop - start) / 7
    ends = (start + round(base), start + round(3 * base), stop)
    return start, ends


def scale_init(d, dtype):
    """The state at the start: s = 1 (L as the Laplace approximation gives it)."""
    zeros = jnp.zeros(d, dtype)
    return ScaleAdaptation(jnp.ones(d, dtype), zeros, zeros, jnp.zeros((), dtype))


def scale_update(adapt, u, i, start, ends):
    """Add the draw ``u`` (flat, in u) taken at iteration ``i`` to the open window;
    at a window's end set ``s^2 = (m var + k) / (m + k)`` (m draws, k =
    :data:`SCALE_SHRINKAGE`) and open the next window. Returns the new state.

    >>> import jax.numpy as jnp
    >>> a = scale_init(1, jnp.float32)
    >>> for i, x in enumerate([-3.0, 3.0] * 50, start=1):
    ...     a = scale_update(a, jnp.array([x]), i, 0, (100,))
    >>> bool(abs(a.scale[0] - ((100 * 9 * 100 / 99 + 5) / 105) ** 0.5) < 1e-3)
    True
    """
    if not ends:
        return adapt
    ends = jnp.asarray(ends)
    inside = (i > start) & (i <= ends[-1])
    count = adapt.count + 1
    delta = u - adapt.mean
    mean = adapt.mean + delta / count
    m2 = adapt.m2 + delta * (u - mean)
    closes = jnp.any(i == ends)
    var = m2 / jnp.maximum(count - 1, 1)
    scale = jnp.sqrt((count * var + SCALE_SHRINKAGE) / (count + SCALE_SHRINKAGE))
    zeros = jnp.zeros_like(mean)
    new = ScaleAdaptation(
        jnp.where(closes, scale, adapt.scale),
        jnp.where(closes, zeros, mean),
        jnp.where(closes, zeros, m2),
        jnp.where(closes, 0.0, count).astype(adapt.count.dtype),
    )
    return jax.tree.map(lambda a, b: jnp.where(inside, a, b), new, adapt)
