"""Scaled dot-product attention with an entropy family as its normalizer (MATH.md §1-3).

Scaled dot-product attention is the Shannon stationary map of the scores $z = q\\cdot k$ at
$T = \\sqrt{d_k}$: $\\mathrm{softmax}(q k^T/\\sqrt{d_k})$. Any other family replaces the
softmax by its stationary law $T G(\\rho_i) = z_i + \\lambda$, solved by `stationary`, whose
exact custom JVP makes the operator differentiable end to end.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from .._entropies import AbstractEntropy, Shannon
from .._stationary import stationary

__all__ = ["attention", "attention_weights"]


def _default_T(d_k: int) -> float:
    return math.sqrt(d_k)


def attention_weights(q, k, entropy: AbstractEntropy = Shannon(), T=None, mask=None):
    """The attention weights $\\rho = \\mathrm{stationary}(S, q k^T, T)$.

    **Arguments:**
    - `q`: queries, shape `(..., n_q, d_k)`.
    - `k`: keys, shape `(..., n_k, d_k)` (batch axes broadcast against `q`).
    - `entropy`: the normalizer's entropy family (default `Shannon()`: softmax).
    - `T`: temperature > 0; `None` means $\\sqrt{d_k}$ (standard scaling). A scalar or an
      array broadcastable to the score batch shape `(..., n_q)`, e.g. `(heads, 1)` per head.
    - `mask`: boolean, broadcastable to `(..., n_q, n_k)`, True = attend. Masked keys get
      exactly zero weight and zero gradient; an all-masked row gives a zero row.

    **Returns:** $\\rho$ of shape `(..., n_q, n_k)`; every unmasked row sums to 1.
    """
    q = jnp.asarray(q)
    k = jnp.asarray(k)
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError("q and k need shape (..., n, d_k)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k disagree on d_k: {q.shape[-1]} vs {k.shape[-1]}")
    if T is None:
        T = _default_T(q.shape[-1])
    scores = jnp.einsum("...qd,...kd->...qk", q, k)
    if mask is not None:
        mask = jnp.broadcast_to(jnp.asarray(mask), scores.shape)
    return stationary(entropy, scores, T, mask=mask)


def attention(q, k, v, entropy: AbstractEntropy = Shannon(), T=None, mask=None):
    """Dot-product attention normalized by an entropy family's stationary map.

    $\\mathrm{out} = \\rho\\,v$ with $\\rho = \\mathrm{stationary}(S, q k^T, T)$; with
    `Shannon()` and `T=None` this is exactly `softmax(q k^T / sqrt(d_k)) v`. Usable as a
    plain function inside equinox/flax modules (jit, vmap, grad; the Jacobian of the
    normalizer is the exact one of MATH.md §3). Put heads in the leading batch axes,
    e.g. `(batch, heads, seq, d_k)`.

    **Arguments:**
    - `q`: `(..., n_q, d_k)`; `k`: `(..., n_k, d_k)`; `v`: `(..., n_k, d_v)`.
    - `entropy`, `T`, `mask`: as in `attention_weights`.

    **Returns:** `(..., n_q, d_v)`. Rows whose keys are all masked return zeros.
    """
    v = jnp.asarray(v)
    if v.ndim < 2 or v.shape[-2] != jnp.shape(k)[-2]:
        raise ValueError(f"v needs shape (..., n_k, d_v) with n_k = {jnp.shape(k)[-2]}")
    w = attention_weights(q, k, entropy, T, mask)
    return jnp.einsum("...qk,...kd->...qd", w, v.astype(w.dtype))
