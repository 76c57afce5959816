"""A Flax `attention_fn` with an entropy family as its normalizer (linen and nnx).

`flax_attention_fn(entropy, T)` returns a plain function with the signature and conventions
of `flax.linen.dot_product_attention` (and of `flax.nnx.dot_product_attention`), to pass as
`attention_fn=` to `nn.MultiHeadDotProductAttention` or `nnx.MultiHeadAttention`. It imports
nothing from Flax (Flax stays an optional dependency) except to sow weights into a module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Float
from .._entropies import AbstractEntropy, Shannon
from .._misc import check_entropy
from ._blockwise import causal_mask, in_query_blocks, query_block_size
from ._normalizer import _boolean_mask, _relative_temperature, _weights_from_logits

__all__ = ["flax_attention_fn"]


def _promote(*xs, dtype):
    """Flax's `promote_dtype`: one common (inexact) dtype, or the one asked for."""
    if dtype is None:
        dtype = jnp.result_type(*xs)
        if not jnp.issubdtype(dtype, jnp.inexact):
            dtype = jnp.result_type(float)
    return [jnp.asarray(x, dtype) for x in xs]


def _einsums(precision, einsum_dot_general, qk_einsum, av_einsum):
    if (qk_einsum is None) != (av_einsum is None):
        raise ValueError(
            "qk_attn_weights_einsum and attn_weights_value_einsum must be specified together."
        )
    if (precision or einsum_dot_general) and qk_einsum is not None:
        raise ValueError(
            "precision/einsum_dot_general and qk_attn_weights_einsum/"
            "attn_weights_value_einsum are mutually exclusive."
        )
    if qk_einsum is not None:
        return qk_einsum, av_einsum
    default = functools.partial(
        jnp.einsum, precision=precision, _dot_general=einsum_dot_general or jax.lax.dot_general
    )
    return default, default


def _check_shapes(query, key, value):
    if not (query.ndim == key.ndim == value.ndim) or query.ndim < 3:
        raise ValueError(
            "query, key and value need the same rank, shaped [batch..., length, num_heads, "
            f"depth]; got {query.shape}, {key.shape}, {value.shape}"
        )
    if not (query.shape[:-3] == key.shape[:-3] == value.shape[:-3]):
        raise ValueError(
            f"q, k, v batch dims must match: {query.shape}, {key.shape}, {value.shape}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"q, k depths must match: {query.shape[-1]} and {key.shape[-1]}")
    if key.shape[-3] != value.shape[-3]:
        raise ValueError(f"k, v lengths must match: {key.shape[-3]} and {value.shape[-3]}")
    if key.shape[-2] != value.shape[-2] or query.shape[-2] % key.shape[-2] != 0:
        raise ValueError(
            "query heads must be a multiple of the key heads (grouped-query attention), and "
            f"key and value heads equal; got {query.shape[-2]}, {key.shape[-2]}, "
            f"{value.shape[-2]}"
        )


def _sow(module, weights):
    # a module was passed, so Flax is installed: import it only here
    from flax import nnx

    if isinstance(module, nnx.Module):
        module.sow(nnx.Intermediate, "attention_weights", weights)
    else:
        module.sow("intermediates", "attention_weights", weights)


def _dropout(weights, rng, rate, broadcast, key_ndim):
    """Flax's attention dropout, draw for draw: on the weights, broadcast over batch and heads
    unless `broadcast_dropout=False`, kept entries scaled by 1/keep_prob."""
    if rng is None:
        raise ValueError("dropout_rate > 0 and deterministic=False need a dropout_rng")
    keep_prob = 1.0 - rate
    if broadcast:
        shape = (1,) * (key_ndim - 2) + weights.shape[-2:]
    else:
        shape = weights.shape
    keep = jax.random.bernoulli(rng, keep_prob, shape)
    multiplier = keep.astype(weights.dtype) / jnp.asarray(keep_prob, dtype=weights.dtype)
    return weights * multiplier


def _logits(query, key, value, bias, mask, is_causal, dtype, promote_dtype, qk_einsum,
            rows=None):
    """Flax's promotion, grouped heads, scaling and masks: `(logits, keep, value, dtype,
    key_ndim, depth)`, `keep` None or boolean of the logits' shape. `rows`: the positions
    of the queries when they are a block of a longer sequence (for the causal mask)."""
    if promote_dtype is None:
        query, key, value = _promote(query, key, value, dtype=dtype)
    else:  # nnx's convention: one tuple in, the promoted tuple out
        query, key, value = promote_dtype((query, key, value), dtype=dtype)
    dtype = query.dtype
    _check_shapes(query, key, value)
    key_ndim = key.ndim
    n_rep = query.shape[-2] // key.shape[-2]
    if n_rep > 1:  # query head j reads key head j // n_rep, as nnx groups them
        key = jnp.repeat(key, n_rep, axis=-2)
        value = jnp.repeat(value, n_rep, axis=-2)
    depth = query.shape[-1]
    # the same rounding as Flax: scale the query, then contract
    query = query / jnp.sqrt(depth).astype(dtype)
    logits = qk_einsum("...qhd,...khd->...hqk", query, key)
    if bias is not None:
        logits = logits + bias
    keep = _boolean_mask(mask)
    if is_causal:
        rows = jnp.arange(logits.shape[-2]) if rows is None else rows
        causal = causal_mask(rows, logits.shape[-1])
        keep = causal if keep is None else keep & causal
    if keep is not None:
        keep = jnp.broadcast_to(keep, logits.shape)
    return logits, keep, value, dtype, key_ndim, depth


def flax_attention_fn(
    entropy: AbstractEntropy = Shannon(),
    T: float | ArrayLike | None = None,
    *,
    block_size: int | None = None,
) -> Callable[..., Float[Array, "*batch q_length num_heads v_depth"]]:
    """A drop-in for `flax.linen.dot_product_attention` normalized by an entropy family.

    The weights are $\\rho = $ `stationary(entropy, q k^T + \\sqrt{d}\\,b, T)` over the keys:
    with Flax's logits $\\ell = (q/\\sqrt{d}) k^T + b$ this is `stationary(entropy, ℓ, T/√d)`,
    so `Shannon()` with `T=None` (that is $T = \\sqrt{d}$) is Flax's softmax attention.

    ```python
    import flax.linen as nn
    layer = nn.MultiHeadDotProductAttention(
        num_heads=4, attention_fn=fd.flax_attention_fn(fd.Tsallis(1.5)))
    ```

    The returned function takes Flax's arguments and conventions: `query`
    `[batch..., q_length, num_heads, qk_depth]`, `key` `[batch..., kv_length, num_heads,
    qk_depth]` (fewer key heads than query heads is grouped-query attention, as in nnx),
    `value` `[batch..., kv_length, num_heads, v_depth]`; `bias` and `mask` broadcastable to
    `[batch..., num_heads, q_length, kv_length]`; `broadcast_dropout`, `dropout_rng`,
    `dropout_rate`, `deterministic` (dropout on the weights, as Flax draws it), `dtype`,
    `precision`, `module` (sows `attention_weights`), `force_fp32_for_softmax` (the
    normalization in float32, as Flax), `einsum_dot_general`, `qk_attn_weights_einsum`,
    `attn_weights_value_einsum` (linen), and `is_causal` and `promote_dtype` (nnx: a function
    taking the tuple `(query, key, value)` and `dtype=`, returning the promoted tuple; `None`
    promotes as Flax's default). It returns `[batch..., q_length, num_heads, v_depth]`.

    Equal to Flax: with `Shannon()` and `T=None` the output is bitwise that of
    `flax.linen.dot_product_attention` in float32 and float64 (the same scaling, contraction
    and `jax.nn.softmax`). In bfloat16 and float16 it is within 2 ulp of the half-precision
    result: the normalizer computes in float32 and rounds the weights once to the inputs'
    dtype, where Flax's softmax rounds each intermediate (the maximum-shifted logits, their
    exponentials, the row sum) in half precision; `force_fp32_for_softmax=True` makes Flax
    normalize in float32 too, and then the outputs are bitwise equal again.

    Complex inputs: with `Shannon()` the weights are Flax's complex softmax
    $e^{\\ell_i}/\\sum_j e^{\\ell_j}$ of the complex logits (bitwise equal to
    `flax.linen.dot_product_attention`); every other family refuses complex inputs with a
    `TypeError`, its stationary law being a threshold on real scores.

    Masks: boolean (True = attend), or 0/1 floats as `flax.linen.make_attention_mask` writes
    them (checked at run time: any other value is an error; an additive 0 / -inf mask goes
    in `bias`, whose -inf entries are masked keys). Masked keys get exactly zero weight and
    zero gradient. One difference from Flax, on purpose: a query whose keys are all masked
    gets zero weights (a zero output), where Flax's softmax over its `finfo.min` fill
    averages the masked values.

    **Arguments:**

    - `entropy`: the normalizer's family (default `Shannon()`: softmax).
    - `T`: the temperature of the scores $q\\cdot k$; `None` means $\\sqrt{d}$ (Flax's
      scaling). A scalar, or an array broadcastable to `[batch..., num_heads, q_length, 1]`
      (e.g. one per head, `[num_heads, 1, 1]`).
    - `block_size`: query rows per block, as in `attention`; sowing (`module`) and dropout
      on the weights take the dense path (with an explicit `block_size`, an error).

    **Returns:** the `attention_fn`.
    """
    check_entropy(entropy)

    def attention_fn(
        query,
        key,
        value,
        bias=None,
        mask=None,
        broadcast_dropout: bool = True,
        dropout_rng=None,
        dropout_rate: float = 0.0,
        deterministic: bool = False,
        dtype=None,
        precision=None,
        module=None,
        force_fp32_for_softmax: bool = False,
        einsum_dot_general=None,
        qk_attn_weights_einsum=None,
        attn_weights_value_einsum=None,
        is_causal: bool = False,
        promote_dtype=None,
    ):
        qk_einsum, av_einsum = _einsums(
            precision, einsum_dot_general, qk_attn_weights_einsum, attn_weights_value_einsum
        )
        if block := _flax_block(query, key, module, deterministic, dropout_rate, block_size):
            return _in_blocks(functools.partial(
                _flax_rows, entropy, key, value, is_causal, dtype, promote_dtype, qk_einsum,
                av_einsum, force_fp32_for_softmax), query, bias, mask, T, block)
        logits, keep, value, dtype, key_ndim, depth = _logits(
            query, key, value, bias, mask, is_causal, dtype, promote_dtype, qk_einsum)
        weights = _flax_weights(entropy, logits, keep, T, depth, dtype, force_fp32_for_softmax)
        if module is not None:
            _sow(module, weights)
        if not deterministic and dropout_rate > 0.0:
            weights = _dropout(weights, dropout_rng, dropout_rate, broadcast_dropout, key_ndim)
        return av_einsum("...hqk,...khd->...qhd", weights, value)

    return attention_fn


def _flax_weights(entropy, logits, keep, T, depth, dtype, force_fp32_for_softmax):
    """The weights of Flax's logits, in Flax's dtype (float32 with `force_fp32_for_softmax`)."""
    if force_fp32_for_softmax and jnp.issubdtype(dtype, jnp.complexfloating):
        raise ValueError("force_fp32_for_softmax=True would drop the imaginary part of "
                         "complex logits: leave it False (the softmax is then complex)")
    if force_fp32_for_softmax and dtype != jnp.float32:
        logits = logits.astype(jnp.float32)  # and the weights stay float32, as in Flax
    weights = _weights_from_logits(entropy, logits, _relative_temperature(T, depth), keep)
    return weights if force_fp32_for_softmax else weights.astype(dtype)


def _flax_rows(entropy, key, value, is_causal, dtype, promote_dtype, qk_einsum, av_einsum,
               force_fp32_for_softmax, query, bias, mask, T, positions):
    """The output rows of a block of queries at sequence positions `positions`."""
    logits, keep, value, dtype, _, depth = _logits(
        query, key, value, bias, mask, is_causal, dtype, promote_dtype, qk_einsum, positions)
    weights = _flax_weights(entropy, logits, keep, T, depth, dtype, force_fp32_for_softmax)
    return av_einsum("...hqk,...khd->...qhd", weights, value)


def _in_blocks(rows, query, bias, mask, T, block):
    """`rows(query, bias, mask, T, positions)` over blocks of `block` queries (Flax's
    layout: the query axis is -3 of `query` and of the output, -2 of the others)."""
    n_q = jnp.shape(query)[-3]
    per_query = {"query": (query, -3, 0), "bias": (bias, -2, 0), "mask": (mask, -2, 1),
                 "T": (T, -2, 1), "positions": (jnp.arange(n_q), -1, 0)}
    return in_query_blocks(rows, per_query, n_q, block, -3)


def _flax_block(query, key, module, deterministic, dropout_rate, block_size):
    """Query rows per block for Flax's layout `[batch..., length, heads, depth]`, or None
    for the dense path (always when the whole weights are needed: sown or dropped out)."""
    whole = module is not None or (not deterministic and dropout_rate > 0.0)
    query, key = jnp.asarray(query), jnp.asarray(key)
    if query.ndim < 3 or key.ndim < 3:
        return None  # (the dense path reports the shapes)
    if jnp.issubdtype(query.dtype, jnp.complexfloating) or jnp.issubdtype(
            key.dtype, jnp.complexfloating):
        return None  # (the complex softmax takes the dense path)
    batch = math.prod(jnp.broadcast_shapes(query.shape[:-3], key.shape[:-3])) * query.shape[-2]
    itemsize = jnp.result_type(query.dtype, key.dtype).itemsize
    block = query_block_size(query.shape[-3], key.shape[-3], batch, itemsize, block_size)
    if whole and block is not None:
        if block_size is not None:
            raise ValueError("block_size: sowing the attention weights (`module`) and dropout "
                             "on them need the whole weights; leave block_size=None there")
        return None
    return block
