"""Fenchel-Young losses of the entropy families (Blondel, Martins, Niculae 2020).

With the regularizer $\\Omega = -T S$ restricted to the simplex, the Fenchel-Young loss is

$$L(z; y) = \\Omega(y) + \\Omega^*(z) - \\langle z, y\\rangle,\\qquad
\\Omega^*(z) = \\max_\\rho \\langle z, \\rho\\rangle + T S(\\rho)
= \\langle z, \\rho^*\\rangle + T S(\\rho^*),$$

with $\\rho^* = $ `stationary(entropy, z, T)`, the maximizer. By Danskin's theorem
$\\nabla_z L = \\rho^* - y$ and $\\partial_T L = S(\\rho^*) - S(y)$; the conjugate is a
`custom_jvp` carrying exactly these, so no derivative runs through the solver (and second
derivatives go through the exact Jacobian of `stationary`).

For Shannon at T = 1 this is the softmax cross-entropy minus the target's entropy; for
Tsallis(alpha) at T = 1/alpha it is the alpha-entmax loss of Peters, Niculae, Martins (2019),
whose practitioner names `sparsemax`, `entmax15`, `entmax` and their losses are below, with the
`entmax` package's meaning of alpha.

Their signatures follow one rule: a loss takes its normalizer's arguments with the target
inserted after the scores, `fenchel_young_loss(entropy, scores, target, T)` beside
`stationary(entropy, scores, T)`, `entmax_loss(scores, target, alpha)` beside
`entmax(scores, alpha)` (the `entmax` package's order); the key `axis` and the `mask` are
keyword only everywhere.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Float, Mask, Scores, Temperature, Weights
from .._entropies import AbstractEntropy, Shannon, Tsallis
from .._misc import check_entropy, concrete_float, param_jvp
from .._stationary import stationary
from .._stationary import keys_last, row_T

__all__ = [
    "fenchel_young_loss",
    "sparsemax",
    "entmax15",
    "entmax",
    "sparsemax_loss",
    "entmax15_loss",
    "entmax_loss",
]


# --------------------------------------------------------------------------- the conjugate


def _maximizer(entropy, z, T, mask):
    """$\\rho^*$ for keys-last scores; an array T is folded into the scores (the law is
    invariant under $(z, T) \\to (z/c, T/c)$) so that its broadcasting is ours, not the
    operator's."""
    if T.ndim == 0:
        return stationary(entropy, z, T, mask=mask)
    return stationary(entropy, z / T[..., None], 1.0, mask=mask)


def _kept(z, mask):
    keep = z > -jnp.inf  # -inf scores are excluded keys, as in `stationary`
    return keep if mask is None else keep & mask


@eqx.filter_custom_jvp
def _conjugate(entropy, z, T, mask):
    """$\\Omega^*(z) = \\langle z, \\rho^*\\rangle + T S(\\rho^*)$ over the kept keys."""
    rho = _maximizer(entropy, z, T, mask)
    keep = _kept(z, mask)
    lin = jnp.sum(jnp.where(keep, jnp.where(keep, z, 0.0) * rho, 0.0), axis=-1)
    return lin + T * entropy.value(rho, keep)


@_conjugate.def_jvp
def _conjugate_jvp(primals, tangents):
    # Danskin: at the maximizer the derivative of <z, rho> + T S(rho) is taken at fixed rho.
    # rho is not stopped, so the tangent itself differentiates through `stationary`.
    entropy, z, T, mask = primals
    t_entropy, t_z, t_T, _ = tangents
    rho = _maximizer(entropy, z, T, mask)
    keep = _kept(z, mask)
    lin = jnp.sum(jnp.where(keep, jnp.where(keep, z, 0.0) * rho, 0.0), axis=-1)
    S = entropy.value(rho, keep)
    out = lin + T * S
    t_out = jnp.zeros_like(out)
    if t_z is not None:
        t_out = t_out + jnp.sum(jnp.where(keep, rho * jnp.where(keep, t_z, 0.0), 0.0), axis=-1)
    if t_T is not None:
        t_out = t_out + S * t_T
    dS = param_jvp(lambda e: e.value(rho, keep), entropy, t_entropy)
    if dS is not None:
        t_out = t_out + T * dS
    return out, t_out


# --------------------------------------------------------------------------- the loss


def _as_distribution(target, z, axis):
    """The target as a keys-last distribution: integer labels (the scores' shape without
    the key axis) become one-hot rows; anything else is a distribution of the scores' shape."""
    y = jnp.asarray(target)
    n = z.shape[-1]
    if jnp.issubdtype(y.dtype, jnp.integer) and y.shape == z.shape[:-1]:
        y = eqx.error_if(y, jnp.any((y < 0) | (y >= n)), f"class labels must lie in [0, {n})")
        return jax.nn.one_hot(y, n, dtype=z.dtype)
    if jnp.issubdtype(y.dtype, jnp.integer) or y.dtype == bool:
        y = y.astype(z.dtype)
    if not jnp.issubdtype(y.dtype, jnp.floating):
        raise TypeError(f"target must be a float distribution or integer labels, got {y.dtype}")
    y = jnp.moveaxis(y, axis, -1) if y.ndim == z.ndim else y
    if y.shape != z.shape:
        raise ValueError(
            f"target of shape {jnp.shape(target)} is neither a distribution of the scores' "
            f"shape nor integer labels of the batch shape {z.shape[:-1]}"
        )
    return y.astype(z.dtype)


def _checked_target(y, keep):
    """Runtime checks (`eqx.error_if`, also under jit): one reduction per check over the
    target, cheap against the solve. The simplex tolerance is $\\sqrt{\\epsilon}$ of the
    dtype (3.5e-4 in float32, 1.5e-8 in float64): a float32 softmax over 10^5 classes sums
    to 1 within 1e-5, while a target that is not a distribution misses by far more."""
    tol = float(jnp.finfo(y.dtype).eps) ** 0.5
    y = eqx.error_if(y, jnp.any(~(y >= 0)), "target must be >= 0 (no NaN)")
    y = eqx.error_if(
        y, jnp.any(jnp.where(keep, 0.0, y) != 0), "target must be 0 on masked (or -inf) keys"
    )
    total = jnp.sum(jnp.where(keep, y, 0.0), axis=-1)
    return eqx.error_if(y, jnp.any(jnp.abs(total - 1) > tol), "target rows must sum to 1")


def fenchel_young_loss(
    entropy: AbstractEntropy,
    scores: Scores,
    target: Weights | ArrayLike,
    T: Temperature = 1.0,
    *,
    mask: Mask | None = None,
    axis: int = -1,
) -> Float[Array, "*batch"]:
    """The Fenchel-Young loss $L(z; y) = \\Omega(y) + \\Omega^*(z) - \\langle z, y\\rangle$,
    $\\Omega = -T S$ on the simplex.

    $L \\ge 0$, with equality exactly at $y = \\rho^*(z) = $ `stationary(entropy, z, T)`;
    $\\nabla_z L = \\rho^*(z) - y$ (a `custom_jvp`, no derivative through the solver) and
    $\\partial_T L = S(\\rho^*) - S(y)$; the derivative in the family's parameters is
    $T\\,(\\partial_\\theta S(\\rho^*) - \\partial_\\theta S(y))$. The derivative in the target
    is that of $-T S(y) - \\langle z, y\\rangle$ (meaningful along the simplex, i.e. up to a
    constant per row). Shannon at `T=1` is `optax.softmax_cross_entropy(z, y)` minus the
    target's entropy; Tsallis(alpha) at `T=1/alpha` is the alpha-entmax loss.

    Renyi and Sharma-Mittal are not concave for every q, but `stationary` returns their
    global maximizer (the branch of least free energy), so $L \\ge 0$ and the gradient
    identity still hold; a target that is no $\\rho^*(z)$ then never reaches $L = 0$. Burg's
    $\\Omega$ is $+\\infty$ on the simplex's boundary: a target with a zero weight on a kept key
    gives $L = +\\infty$ (use dense targets).

    **Arguments:**

    - `entropy`: the entropy family, e.g. `Tsallis(1.5)`.
    - `scores`: the scores $z$ (logits), any batch shape.
    - `target`: a distribution of the scores' shape, or integer class labels of the batch
      shape (one-hot targets). Checked at run time (`eqx.error_if`, also under jit): >= 0,
      0 on excluded keys, each row summing to 1 within $\\sqrt{\\epsilon}$ of the dtype.
    - `T`: temperature > 0, a scalar or an array broadcasting as in `stationary` (a
      size-1 key axis, as in `softmax(z / T)`, or the batch shape).
    - `mask`: boolean, broadcastable to the scores, True = the key takes part; masked keys
      (and `-inf` scores) are excluded from $\\Omega$, $\\Omega^*$ and the inner product.
    - `axis`: the key axis.

    **Returns:** $L$ of the batch shape (the scores' shape without `axis`).
    """
    check_entropy(entropy)
    z_last = keys_last(scores, axis)
    y = _as_distribution(target, z_last, axis)
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"mask must be boolean (True = keep), got dtype {mask.dtype}")
        mask = jnp.moveaxis(jnp.broadcast_to(mask, jnp.shape(scores)), axis, -1)
    keep = _kept(z_last, mask)
    y = _checked_target(y, keep)
    # T broadcasts as in `stationary` (softmax(z / T)); the loss works with one T per row
    T = row_T(jnp.asarray(T, dtype=z_last.dtype), jnp.shape(scores), axis)
    T = T if T.ndim == 0 else T[..., 0]
    T = eqx.error_if(T, jnp.any(~(T > 0)) | jnp.any(~jnp.isfinite(T)), "T must be finite and > 0")
    lin = jnp.sum(jnp.where(keep, jnp.where(keep, z_last, 0.0) * y, 0.0), axis=-1)
    omega_y = -T * entropy.value(y, keep)
    return omega_y + _conjugate(entropy, z_last, T, mask) - lin


# --------------------------------------------------------------------------- entmax names


def _alpha_parts(alpha):
    """(is alpha == 1 as a Python bool or None when traced, the Tsallis family, its T)."""
    a = concrete_float(alpha)
    if a is not None:
        if not (a > 0 and a != float("inf")):
            raise ValueError(f"alpha-entmax needs alpha > 0; got alpha={a}")
        if a == 1:
            return True, None, None
        return False, Tsallis(alpha), 1.0 / jnp.asarray(alpha)
    alpha = jnp.asarray(alpha)
    alpha = eqx.error_if(alpha, ~(alpha > 0) | ~jnp.isfinite(alpha), "alpha must be > 0")
    # a traced alpha may be exactly 1, where the Tsallis law divides by zero: solve at a
    # harmless stand-in and select softmax there (double where, no NaN in the gradient)
    safe = jnp.where(alpha == 1, 2.0, alpha)
    return None, Tsallis(safe), 1.0 / safe


def sparsemax(scores: Scores, *, axis: int = -1, mask: Mask | None = None) -> Weights:
    """Sparsemax (Martins & Astudillo 2016), the Euclidean projection onto the simplex:
    `stationary(Tsallis(2), z, T=1/2)`, equal to `entmax.sparsemax`.

    **Arguments:** `scores`; keyword only, the key `axis` and an optional boolean `mask`
    (True = keep).

    **Returns:** the weights, the shape of `scores`.
    """
    return stationary(Tsallis(2.0), scores, 0.5, mask=mask, axis=axis)


def entmax15(scores: Scores, *, axis: int = -1, mask: Mask | None = None) -> Weights:
    """1.5-entmax (Peters, Niculae, Martins 2019): `stationary(Tsallis(1.5), z, T=2/3)`,
    equal to `entmax.entmax15`.

    **Arguments:** `scores`; keyword only, the key `axis` and an optional boolean `mask`
    (True = keep).

    **Returns:** the weights, the shape of `scores`.
    """
    return stationary(Tsallis(1.5), scores, 1.0 / 1.5, mask=mask, axis=axis)


def entmax(
    scores: Scores, alpha: ArrayLike, *, axis: int = -1, mask: Mask | None = None
) -> Weights:
    """alpha-entmax with the `entmax` package's meaning of alpha (`entmax.entmax_bisect`):
    $\\mathrm{argmax}_\\rho \\langle z, \\rho\\rangle + H^T_\\alpha(\\rho)$, which is
    `stationary(Tsallis(alpha), z, T=1/alpha)`.

    `alpha = 1` is softmax, on purpose (the Tsallis law divides by alpha - 1 there), also for
    a traced alpha; alpha = 2 is sparsemax. 0 < alpha < 1 gives the dense Tsallis maps.

    **Arguments:** `scores`; `alpha > 0`, a scalar (a Python float or a 0-d array, which is
    then differentiable); keyword only, the key `axis` and an optional boolean `mask`
    (True = keep).

    **Returns:** the weights, the shape of `scores`.
    """
    is_one, family, T = _alpha_parts(alpha)
    if is_one:
        return stationary(Shannon(), scores, 1.0, mask=mask, axis=axis)
    rho = stationary(family, scores, T, mask=mask, axis=axis)
    if is_one is None:
        soft = stationary(Shannon(), scores, 1.0, mask=mask, axis=axis)
        rho = jnp.where(jnp.asarray(alpha) == 1, soft, rho)
    return rho


def sparsemax_loss(
    scores: Scores, target: Weights | ArrayLike, *, mask: Mask | None = None, axis: int = -1
) -> Float[Array, "*batch"]:
    """The sparsemax loss, `entmax.sparsemax_loss`: `fenchel_young_loss(Tsallis(2), z, y,
    T=1/2)`. `target`: integer labels or distributions (see `fenchel_young_loss`).

    **Returns:** the loss of the batch shape.
    """
    return fenchel_young_loss(Tsallis(2.0), scores, target, 0.5, mask=mask, axis=axis)


def entmax15_loss(
    scores: Scores, target: Weights | ArrayLike, *, mask: Mask | None = None, axis: int = -1
) -> Float[Array, "*batch"]:
    """The 1.5-entmax loss, `entmax.entmax15_loss`: `fenchel_young_loss(Tsallis(1.5), z, y,
    T=2/3)`. `target`: integer labels or distributions (see `fenchel_young_loss`).

    **Returns:** the loss of the batch shape.
    """
    return fenchel_young_loss(Tsallis(1.5), scores, target, 1.0 / 1.5, mask=mask, axis=axis)


def entmax_loss(
    scores: Scores,
    target: Weights | ArrayLike,
    alpha: ArrayLike,
    *,
    mask: Mask | None = None,
    axis: int = -1,
) -> Float[Array, "*batch"]:
    """The alpha-entmax loss, `entmax.entmax_bisect_loss`: `fenchel_young_loss(Tsallis(alpha),
    z, y, T=1/alpha)`; alpha = 1 is the softmax cross-entropy (minus the target's entropy).

    **Arguments:** as `entmax` and `fenchel_young_loss`.

    **Returns:** the loss of the batch shape.
    """
    is_one, family, T = _alpha_parts(alpha)
    shannon = lambda: fenchel_young_loss(Shannon(), scores, target, 1.0, mask=mask, axis=axis)
    if is_one:
        return shannon()
    loss = fenchel_young_loss(family, scores, target, T, mask=mask, axis=axis)
    if is_one is None:
        loss = jnp.where(jnp.asarray(alpha) == 1, shannon(), loss)
    return loss
