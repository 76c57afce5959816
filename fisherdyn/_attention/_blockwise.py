"""Attention in blocks of queries: O(N) memory for every family, exact gradients.

The stationary law normalizes each query's row of scores on its own, so the rows can be
solved a block of queries at a time: each block forms its strip of scores
`(..., block, n_k)`, solves it with the dense operator (the same solver and custom JVP,
row for row) and contracts it with the values; no `(n_q, n_k)` array is ever formed.
The blocks run in a `lax.map`, whose body is rematerialized under differentiation
(`jax.checkpoint`): the backward pass stores only each block's inputs and recomputes its
strip, as FlashAttention recomputes its scores, so gradients in q, k, v, T, the bias and
the family's parameters are the dense path's exact ones in memory linear in N.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

# Scores of one block, in bytes, when the block size is automatic: large enough that a
# block's matrix products stay efficient, small enough to stay in the last-level cache
# region of a CPU and far below any memory limit.
_BLOCK_BYTES = 1 << 23
# The automatic choice: the dense path while the whole score array is at most this size.
_DENSE_BYTES = 1 << 26


def query_block_size(n_q, n_k, batch, itemsize, block_size):
    """The number of query rows per block, or None for the dense path, for scores of shape
    `(batch..., n_q, n_k)` (`batch`: the product of the batch axes) of `itemsize` bytes.

    `block_size=None` is automatic: dense while the scores take at most `_DENSE_BYTES`,
    else blocks whose scores take about `_BLOCK_BYTES`. An explicit size of at least `n_q`
    is the dense path."""
    if block_size is None:
        per_row = batch * n_k * max(itemsize, 4)  # (half precision is solved in float32)
        if per_row * n_q <= _DENSE_BYTES:
            return None
        return max(1, min(n_q, _BLOCK_BYTES // max(per_row, 1)))
    if (isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral)
            or block_size < 1):
        raise ValueError(f"block_size must be a positive int or None, got {block_size!r}")
    return None if block_size >= n_q else int(block_size)


def _split(x, axis, n_q, block, fill):
    """`x` with its query axis (`axis`, counted from the end, of length n_q) cut into
    blocks: padded with `fill` to a whole number of blocks and the block index moved to
    the front, `(count, ..., block, ...)`."""
    count = -(-n_q // block)
    axis = x.ndim + axis
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, count * block - n_q)
    x = jnp.pad(x, pad, constant_values=fill)
    x = x.reshape(x.shape[:axis] + (count, block) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


def _per_query(x, axis, n_q):
    """Whether `x` varies along the query axis (else every block shares it)."""
    return x is not None and jnp.ndim(x) >= -axis and jnp.shape(x)[axis] == n_q and n_q > 1


def in_query_blocks(fn, per_query, n_q, block, out_axis):
    """`fn(**inputs)` evaluated `block` query rows at a time, in a `lax.map` whose body is
    rematerialized under differentiation (`jax.checkpoint`).

    **Arguments:**
    - `fn`: computes the output rows of the queries it is given; rowwise in the queries.
    - `per_query`: `{name: (x, axis, fill)}`; an `x` whose axis `axis` (from the end) has
      length `n_q` is cut into blocks (padded with `fill`), any other (None, or broadcast
      along the queries) is passed whole to every block.
    - `out_axis`: the query axis of `fn`'s output, from the end.

    **Returns:** `fn` on all the queries, assembled from the blocks."""
    split, shared = {}, {}
    for name, (x, axis, fill) in per_query.items():
        if _per_query(x, axis, n_q):
            split[name] = _split(jnp.asarray(x), axis, n_q, block, fill)
        else:
            shared[name] = x

    @jax.checkpoint
    def one_block(blocks):
        return fn(**shared, **blocks)

    out = jax.lax.map(one_block, split)  # (count, ..., block, ...)
    axis = out.ndim + out_axis  # the block axis, counted with the leading count axis
    out = jnp.moveaxis(out, 0, axis - 1)
    out = out.reshape(out.shape[:axis - 1] + (-1,) + out.shape[axis + 1:])
    return jax.lax.slice_in_dim(out, 0, n_q, axis=axis - 1)


def blockwise_attention(dense, q, k, v, *, entropy, T, mask, bias, block, is_causal=False):
    """`dense(q, k, v, entropy=..., T=..., mask=..., bias=...)` evaluated `block` query
    rows at a time (see the module docstring). `T` is a scalar or broadcasts against the
    score batch shape `(..., n_q)`; `mask` and `bias` against `(..., n_q, n_k)`;
    `is_causal` adds the causal mask, built per block.

    **Returns:** `(..., n_q, d_v)`, equal row for row to `dense` on the whole input."""

    def rows(q, mask, bias, T, positions):
        if positions is not None:
            causal = causal_mask(positions, k.shape[-2])
            mask = causal if mask is None else jnp.asarray(mask) & causal
        return dense(q, k, v, entropy=entropy, T=T, mask=mask, bias=bias)

    positions = jnp.arange(q.shape[-2]) if is_causal else None
    per_query = {"q": (q, -2, 0.0), "mask": (mask, -2, True), "bias": (bias, -2, 0.0),
                 "T": (T, -1, 1.0), "positions": (positions, -1, 0)}
    return in_query_blocks(rows, per_query, q.shape[-2], block, -2)


def causal_mask(rows, n_k):
    """The causal mask `key <= query` of the query positions `rows`, `(len(rows), n_k)`:
    a block of queries builds its rows from their positions (cut into blocks with the
    queries) instead of slicing an `(n_q, n_k)` mask."""
    return rows[:, None] >= jnp.arange(n_k)[None, :]
