"""`eqx.nn.MultiheadAttention` with an entropy family as its normalizer.

Same fields (plus `entropy` and `T`), constructor and call as `eqx.nn.MultiheadAttention`;
the projections are built by that class from the same PRNG key, so the parameters are
identical and can be moved between the two modules leaf for leaf.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from .._custom_types import Array, ArrayLike, Bool, Float
from .._entropies import AbstractEntropy, Shannon
from .._misc import check_entropy
from ._blockwise import in_query_blocks, query_block_size
from ._normalizer import _boolean_mask, _relative_temperature, _weights_from_logits

__all__ = ["MultiheadAttention"]


class MultiheadAttention(eqx.Module):
    """Multi-head attention whose weights are an entropy family's stationary map.

    $\\text{Attention}(\\tilde Q, \\tilde K, \\tilde V) = \\rho\\,\\tilde V$ with
    $\\rho = $ `stationary(entropy, Q̃ K̃ᵀ, T)` per head, $T = \\sqrt{d_{qk}}$ by default:
    with `Shannon()` this is `eqx.nn.MultiheadAttention` (softmax of
    $\\tilde Q\\tilde K^\\intercal/\\sqrt{d_{qk}}$) to float32 round-off.

    ```python
    attn = fd.MultiheadAttention(4, 32, entropy=fd.Tsallis(1.5), key=jax.random.key(0))
    out = attn(x, x, x)  # x: (seq_length, 32)
    ```

    Fields: those of `eqx.nn.MultiheadAttention` (`query_proj`, `key_proj`, `value_proj`,
    `output_proj`, `dropout`, `num_heads`, `query_size`, ...), plus `entropy` and `T`. A
    JAX-array `T` is a trainable leaf (a learned temperature).

    One difference from Equinox, on purpose: a query whose keys are all masked gets zero
    weights (a zero output before `output_proj`), where Equinox's softmax over its
    `finfo.min` fill averages the masked values.
    """

    query_proj: eqx.nn.Linear
    key_proj: eqx.nn.Linear
    value_proj: eqx.nn.Linear
    output_proj: eqx.nn.Linear
    dropout: eqx.nn.Dropout
    entropy: AbstractEntropy
    T: float | Array | None
    block_size: int | None = eqx.field(static=True)

    num_heads: int = eqx.field(static=True)
    query_size: int = eqx.field(static=True)
    key_size: int = eqx.field(static=True)
    value_size: int = eqx.field(static=True)
    output_size: int = eqx.field(static=True)
    qk_size: int = eqx.field(static=True)
    vo_size: int = eqx.field(static=True)
    use_query_bias: bool = eqx.field(static=True)
    use_key_bias: bool = eqx.field(static=True)
    use_value_bias: bool = eqx.field(static=True)
    use_output_bias: bool = eqx.field(static=True)

    def __init__(
        self,
        num_heads: int,
        query_size: int,
        key_size: int | None = None,
        value_size: int | None = None,
        output_size: int | None = None,
        qk_size: int | None = None,
        vo_size: int | None = None,
        use_query_bias: bool = False,
        use_key_bias: bool = False,
        use_value_bias: bool = False,
        use_output_bias: bool = False,
        dropout_p: float = 0.0,
        inference: bool = False,
        dtype=None,
        *,
        entropy: AbstractEntropy = Shannon(),
        T: float | ArrayLike | None = None,
        block_size: int | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:** those of `eqx.nn.MultiheadAttention` (the same defaults), and

        - `entropy`: the normalizer's family (keyword only; default `Shannon()`: softmax).
        - `T`: the temperature of the per-head scores $\\tilde q\\cdot\\tilde k$ (keyword
          only); `None` means $\\sqrt{d_{qk}}$, the standard scaling. A scalar, or an array
          broadcastable to `(num_heads, q_seq, 1)`, e.g. one per head `(num_heads, 1, 1)`.
        - `block_size`: query rows per block of the blockwise evaluation, as in
          `fd.attention` (keyword only; `None`: automatic, dense up to 64 MiB of logits).
          Dropout on the weights needs them whole: it takes the dense path (an explicit
          `block_size` with active dropout is an error).
        - `key`: the PRNG key of the initialization; the same key gives the same parameters
          as `eqx.nn.MultiheadAttention`.
        """
        check_entropy(entropy)
        # Equinox builds the projections: identical parameters from the same key
        ref = eqx.nn.MultiheadAttention(
            num_heads, query_size, key_size, value_size, output_size, qk_size, vo_size,
            use_query_bias, use_key_bias, use_value_bias, use_output_bias, dropout_p,
            inference, dtype, key=key,
        )  # fmt: skip
        self.query_proj = ref.query_proj
        self.key_proj = ref.key_proj
        self.value_proj = ref.value_proj
        self.output_proj = ref.output_proj
        self.dropout = ref.dropout
        self.entropy = entropy
        self.T = T
        self.block_size = block_size
        self.num_heads = ref.num_heads
        self.query_size = ref.query_size
        self.key_size = ref.key_size
        self.value_size = ref.value_size
        self.output_size = ref.output_size
        self.qk_size = ref.qk_size
        self.vo_size = ref.vo_size
        self.use_query_bias = ref.use_query_bias
        self.use_key_bias = ref.use_key_bias
        self.use_value_bias = ref.use_value_bias
        self.use_output_bias = ref.use_output_bias

    def __call__(
        self,
        query: Float[Array, "q_seq q_size"],
        key_: Float[Array, "kv_seq k_size"],
        value: Float[Array, "kv_seq v_size"],
        mask: None | Bool[ArrayLike, "q_seq kv_seq"] | Bool[ArrayLike, "h q_seq kv_seq"] = None,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        deterministic: bool | None = None,
        process_heads: None | Callable = None,
    ) -> Float[Array, "q_seq o_size"]:
        """**Arguments:** as `eqx.nn.MultiheadAttention.__call__`:

        - `query` `(q_seq, query_size)`, `key_` `(kv_seq, key_size)`, `value`
          `(kv_seq, value_size)`.
        - `mask`: `(q_seq, kv_seq)` or per head `(num_heads, q_seq, kv_seq)`, False = ignore
          (boolean, or 0/1 floats: checked at run time).
        - `key`: the dropout PRNG key (split over heads as Equinox splits it), `inference`,
          `deterministic` (deprecated in favour of `inference`), `process_heads`.

        **Returns:** `(q_seq, output_size)`.
        """
        if deterministic is not None:
            inference = deterministic
            warnings.warn(
                "MultiheadAttention()(deterministic=...) is deprecated "
                "in favour of MultiheadAttention()(inference=...)"
            )
        q_len, _ = query.shape
        kv_len, _ = key_.shape
        if kv_len != value.shape[0]:
            raise ValueError("key and value must both be sequences of equal length.")
        query_heads = self._project(self.query_proj, query)
        key_heads = self._project(self.key_proj, key_)
        value_heads = self._project(self.value_proj, value)
        if process_heads is not None:
            shapes = (query_heads.shape, key_heads.shape, value_heads.shape)
            query_heads, key_heads, value_heads = process_heads(
                query_heads, key_heads, value_heads
            )
            if (query_heads.shape, key_heads.shape, value_heads.shape) != shapes:
                raise ValueError("process_heads must not change the shape of the heads.")
        block = self._block(query_heads, key_heads, inference)
        if block is not None:
            attn = self._blockwise(query_heads, key_heads, value_heads, mask, block)
            return jax.vmap(self.output_proj)(attn.reshape(q_len, -1))
        weights = self._weights(query_heads, key_heads, mask, self.T)
        if key is None:
            weights = self.dropout(weights, key=None, inference=inference)
        else:  # one key per head, as Equinox draws them
            keys = jax.random.split(key, self.num_heads)
            drop = lambda w, k: self.dropout(w, key=k, inference=inference)
            weights = jax.vmap(drop)(weights, keys)
        attn = jnp.einsum("hsS,Shd->shd", weights, value_heads).reshape(q_len, -1)
        return jax.vmap(self.output_proj)(attn)

    def _block(self, query_heads, key_heads, inference):
        """Query rows per block, or None for the dense path (always with active dropout)."""
        if jnp.issubdtype(query_heads.dtype, jnp.complexfloating):
            return None  # (the complex softmax takes the dense path)
        n_q, heads, _ = query_heads.shape
        itemsize = jnp.result_type(query_heads.dtype, key_heads.dtype).itemsize
        block = query_block_size(n_q, key_heads.shape[0], heads, itemsize, self.block_size)
        inference = self.dropout.inference if inference is None else inference
        if block is not None and self.dropout.p > 0 and not inference:
            if self.block_size is not None:
                raise ValueError("block_size: dropout on the attention weights needs them "
                                 "whole; leave block_size=None or call with inference=True")
            return None
        return block

    def _blockwise(self, query_heads, key_heads, value_heads, mask, block):
        """`(q_seq, num_heads, vo_size)` from blocks of `block` query rows."""
        def rows(query, mask, T):
            weights = self._weights(query, key_heads, mask, T)
            return jnp.einsum("hsS,Shd->shd", weights, value_heads)

        per_query = {"query": (query_heads, -3, 0), "mask": (mask, -2, 1), "T": (self.T, -2, 1)}
        return in_query_blocks(rows, per_query, query_heads.shape[0], block, -3)

    def _weights(self, query_heads, key_heads, mask, T):
        """$\\rho$ of shape `(num_heads, q_seq, kv_seq)` at the temperature `T`."""
        depth = query_heads.shape[-1]
        # the same rounding as Equinox: scale the query, then contract
        query_heads = query_heads / math.sqrt(depth)
        logits = jnp.einsum("shd,Shd->hsS", query_heads, key_heads)
        keep = _boolean_mask(mask)
        if keep is not None:
            if keep.shape not in (logits.shape[1:], logits.shape):
                raise ValueError(
                    "mask must have shape (query_seq_length, kv_seq_length)="
                    f"{logits.shape[1:]} or (num_heads, query_seq_length, kv_seq_length)="
                    f"{logits.shape}. Got {keep.shape}."
                )
            keep = jnp.broadcast_to(keep, logits.shape)
        tau = _relative_temperature(T, depth)
        return _weights_from_logits(self.entropy, logits, tau, keep).astype(logits.dtype)

    def _project(self, proj, x):
        seq_length, _ = x.shape
        return jax.vmap(proj)(x).reshape(seq_length, self.num_heads, -1)
