"""Scaled dot-product attention with an entropy family as its normalizer (docs/math.md §1-3).

Scaled dot-product attention is the Shannon stationary map of the scores $z = q\\cdot k$ at
$T = \\sqrt{d_k}$: $\\mathrm{softmax}(q k^T/\\sqrt{d_k})$. Any other family replaces the
softmax by its stationary law $T G(\\rho_i) = z_i + \\lambda$, solved by `stationary`, whose
exact custom JVP makes the operator differentiable end to end.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Bool, Float, Temperature
from .._entropies import AbstractEntropy, Shannon
from .._stationary import refuse_complex, stationary
from ._blockwise import blockwise_attention, causal_mask, query_block_size

__all__ = ["attention", "attention_weights"]


def _default_T(d_k: int) -> float:
    return math.sqrt(d_k)


def attention_weights(
    q: Float[ArrayLike, "*#batch n_q d_k"],
    k: Float[ArrayLike, "*#batch n_k d_k"],
    *,
    entropy: AbstractEntropy = Shannon(),
    T: Temperature | None = None,
    mask: Bool[ArrayLike, "*#batch n_q n_k"] | None = None,
    bias: Float[ArrayLike, "*#batch n_q n_k"] | None = None,
) -> Float[Array, "*batch n_q n_k"]:
    """The attention weights $\\rho = \\mathrm{stationary}(S, q k^T + b, T)$.

    **Arguments:**
    - `q`: queries, shape `(..., n_q, d_k)`.
    - `k`: keys, shape `(..., n_k, d_k)` (batch axes broadcast against `q`).
    - `entropy`: the normalizer's entropy family (default `Shannon()`: softmax).
    - `T`: temperature > 0; `None` means $\\sqrt{d_k}$ (standard scaling). A scalar or an
      array broadcastable to the score batch shape `(..., n_q)`, e.g. `(heads, 1)` per head.
    - `mask`: boolean, broadcastable to `(..., n_q, n_k)`, True = attend. Masked keys get
      exactly zero weight and zero gradient; an all-masked row gives a zero row.
    - `bias`: an additive score bias $b$, broadcastable to `(..., n_q, n_k)`, added to the
      scores $q k^T$ before the normalizer, in their units (Flax's `bias` $b_F$, added to the
      logits $q k^T/\\sqrt{d_k}$, is $b = \\sqrt{d_k}\\,b_F$ here); `-inf` entries are
      masked keys.

    **Returns:** $\\rho$ of shape `(..., n_q, n_k)`; every unmasked row sums to 1.

    Complex `q`, `k` or `bias` raise a `TypeError`: the weights are a probability vector
    over real scores (the Flax and Equinox drop-ins compute the complex softmax of Flax for
    `Shannon()`).
    """
    for x, name in ((q, "q"), (k, "k"), (bias, "bias")):
        refuse_complex(x, name)
    q = jnp.asarray(q)
    k = jnp.asarray(k)
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError("q and k need shape (..., n, d_k)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k disagree on d_k: {q.shape[-1]} vs {k.shape[-1]}")
    if T is None:
        T = _default_T(q.shape[-1])
    elif jnp.ndim(T) > 0:
        # T is documented against the score batch shape (..., n_q): give it the key axis
        # explicitly, so that `stationary` never reads a per-head T as one per query
        T = jnp.asarray(T)[..., None]
    scores = jnp.einsum("...qd,...kd->...qk", q, k)
    if bias is not None:
        scores = scores + jnp.asarray(bias, scores.dtype)
    if mask is not None:
        mask = jnp.broadcast_to(jnp.asarray(mask), scores.shape)
    return stationary(entropy, scores, T, mask=mask)


def attention(
    q: Float[ArrayLike, "*#batch n_q d_k"],
    k: Float[ArrayLike, "*#batch n_k d_k"],
    v: Float[ArrayLike, "*#batch n_k d_v"],
    *,
    entropy: AbstractEntropy = Shannon(),
    T: Temperature | None = None,
    mask: Bool[ArrayLike, "*#batch n_q n_k"] | None = None,
    bias: Float[ArrayLike, "*#batch n_q n_k"] | None = None,
    is_causal: bool = False,
    block_size: int | None = None,
) -> Float[Array, "*batch n_q d_v"]:
    """Dot-product attention normalized by an entropy family's stationary map.

    $\\mathrm{out} = \\rho\\,v$ with $\\rho = \\mathrm{stationary}(S, q k^T + b, T)$; with
    `Shannon()` and `T=None` this is exactly `softmax((q k^T + b) / sqrt(d_k)) v`. Usable as a
    plain function inside equinox/flax modules (jit, vmap, grad; the Jacobian of the
    normalizer is the exact one of docs/math.md §3). Put heads in the leading batch axes,
    e.g. `(batch, heads, seq, d_k)`.

    **Arguments:**
    - `q`: `(..., n_q, d_k)`; `k`: `(..., n_k, d_k)`; `v`: `(..., n_k, d_v)`.
    - `entropy`, `T`, `mask`, `bias` (keyword only): as in `attention_weights`.
    - `is_causal`: query i attends to keys j <= i only (with `mask`, both apply), as
      `jnp.tril` of an `(n_q, n_k)` array of ones, without forming it on the blockwise path.
    - `block_size`: query rows per block of the blockwise evaluation, which never forms
      the `(n_q, n_k)` scores: memory linear in the sequence length, the same weights row
      for row and exact gradients (each block's scores are recomputed in the backward
      pass). `None` (default): the dense path while the scores take at most 64 MiB, blocks
      of about 8 MiB of scores above; a size of at least `n_q` is the dense path.

    **Returns:** `(..., n_q, d_v)`. Rows whose keys are all masked return zeros.
    """
    refuse_complex(v, "v")  # (its cast to the weights' real dtype would drop the imaginary part)
    v = jnp.asarray(v)
    if v.ndim < 2 or v.shape[-2] != jnp.shape(k)[-2]:
        raise ValueError(f"v needs shape (..., n_k, d_v) with n_k = {jnp.shape(k)[-2]}")
    q, k = jnp.asarray(q), jnp.asarray(k)
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError("q and k need shape (..., n, d_k)")
    batch = math.prod(jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2]))
    itemsize = jnp.result_type(q.dtype, k.dtype).itemsize
    block = query_block_size(q.shape[-2], k.shape[-2], batch, itemsize, block_size)
    if block is None:
        if is_causal:
            causal = causal_mask(jnp.arange(q.shape[-2]), k.shape[-2])
            mask = causal if mask is None else jnp.asarray(mask) & causal
        return _dense_attention(q, k, v, entropy=entropy, T=T, mask=mask, bias=bias)
    if T is None:
        T = _default_T(q.shape[-1])
    return blockwise_attention(_dense_attention, q, k, v, entropy=entropy, T=T, mask=mask,
                               bias=bias, block=block, is_causal=is_causal)


def _dense_attention(q, k, v, *, entropy, T, mask, bias):
    w = attention_weights(q, k, entropy=entropy, T=T, mask=mask, bias=bias)
    return jnp.einsum("...qk,...kd->...qd", w, v.astype(w.dtype))


# --------------------------------------------------------------------------- for the drop-ins


def _boolean_mask(mask):
    """A Flax / Equinox mask as booleans. A float or integer mask is read as Flax's
    `make_attention_mask` writes it (1 = attend, 0 = masked), and is checked to hold only
    those two values: an additive mask (0 / -inf) read as truth values would silently
    attend everywhere, and belongs in `bias` (where -inf scores are masked keys)."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.dtype == bool:
        return mask
    mask = eqx.error_if(
        mask,
        jnp.any((mask != 0) & (mask != 1)),
        "a non-boolean attention mask must hold only 0 (masked) and 1 (attend), as "
        "flax.linen.make_attention_mask makes it; put an additive (0 / -inf) mask in `bias`",
    )
    return mask != 0


def _complex_softmax(entropy, logits, tau, mask):
    """Complex logits as Flax and Equinox normalize them: `jax.nn.softmax`, the holomorphic
    $e^{\\ell_i}/\\sum_j e^{\\ell_j}$, over a `finfo.min` fill of the masked keys (rows with
    no kept key give zeros, as for real logits). Only Shannon has that continuation: every
    other family's law is a threshold on real scores, so complex logits are refused."""
    if type(entropy) is not Shannon:
        raise TypeError(
            f"complex query/key/bias give complex logits, which only Shannon() normalizes "
            f"(the complex softmax of Flax and Equinox); {entropy.name} needs real inputs: "
            "pass the real part (or the modulus) of the complex values explicitly"
        )
    if tau is not None:
        logits = logits / jnp.asarray(tau).astype(logits.dtype)
    keep = jnp.real(logits) > -jnp.inf  # -inf bias entries are masked keys
    if mask is not None:
        keep = keep & mask
    fill = jnp.asarray(jnp.finfo(logits.dtype).min, logits.dtype)
    weights = jax.nn.softmax(jnp.where(keep, logits, fill))
    return jnp.where(jnp.any(keep, axis=-1, keepdims=True), weights, 0)


def _weights_from_logits(entropy, logits, tau, mask):
    """$\\rho$ = `stationary(entropy, logits, tau)` over the last axis, with the logits in
    the libraries' units ($q\\cdot k/\\sqrt{d}$ + bias, so `tau = 1` is their softmax). A
    `tau` array (per head, say) is folded into the logits (the law is invariant under
    $(z, T) \\to (z/c, T/c)$), so that its broadcasting is against the logits' shape."""
    if jnp.issubdtype(logits.dtype, jnp.complexfloating):
        return _complex_softmax(entropy, logits, tau, mask)
    if tau is None:
        return stationary(entropy, logits, 1.0, mask=mask)
    tau = jnp.asarray(tau)
    if tau.ndim == 0:
        return stationary(entropy, logits, tau.astype(logits.dtype), mask=mask)
    return stationary(entropy, logits / tau.astype(logits.dtype), 1.0, mask=mask)


def _relative_temperature(T, depth):
    """$T/\\sqrt{d}$, the temperature on the scaled logits (None: 1, the standard scaling)."""
    if T is None:
        return None
    if isinstance(T, (int, float)):
        if not (T > 0 and math.isfinite(T)):
            raise ValueError(f"T must be finite and > 0, got {T}")
        return T / math.sqrt(depth)
    T = jnp.asarray(T)
    T = eqx.error_if(T, jnp.any(~(T > 0)) | jnp.any(~jnp.isfinite(T)), "T must be finite and > 0")
    return T / math.sqrt(depth)
