"""The in-context hetero-associative recall task the looped transformer is trained on.

A context of key/label pairs ($\\pm1$ keys), then a corrupted copy of one key as the query; the
model reads out the label at the query token.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .._custom_types import Array, Float, Int

__all__ = ["RecallBatch", "recall_task"]


class RecallBatch(NamedTuple):
    """A batch of recall problems.

    **Fields:**

    - `tokens` `(batch, n_pairs + 1, dim + n_classes + 1)`: context tokens are
      `[key, onehot(label), 0]`, the last token is the query `[corrupted key, 0, 1]`.
    - `labels` `(batch,)`: the query's label.
    - `target` `(batch,)`: the index of the context pair whose key was corrupted into the
      query (where attention should go).
    """

    tokens: Float[Array, "batch n_tok token_dim"]
    labels: Int[Array, " batch"]
    target: Int[Array, " batch"]


def recall_task(key: jax.Array, batch: int, n_pairs: int, dim: int, corrupt: float, *,
                n_classes: int | None = None, dtype=jnp.float32) -> RecallBatch:
    """Generate in-context hetero-associative recall problems (seeded, pure).

    Keys are i.i.d. uniform $\\pm1$ vectors of length `dim`; labels uniform in
    `range(n_classes)` (default `n_pairs`). The query copies the key of a uniformly chosen
    pair with exactly `round(corrupt * dim)` distinct coordinates flipped.

    **Arguments:**

    - `key`: a JAX PRNG key (the only source of randomness).
    - `batch`, `n_pairs`, `dim`: problem count, context pairs, key dimension.
    - `corrupt`: fraction of key coordinates flipped in the query, in [0, 0.5).
    - `n_classes`: number of labels; `dtype`: float dtype of the tokens.

    **Returns:**

    A `RecallBatch`.
    """
    if not 0 <= corrupt < 0.5:
        raise ValueError(f"corrupt must be in [0, 0.5), got {corrupt}")
    n_classes = n_pairs if n_classes is None else n_classes
    return _recall_task(key, int(batch), int(n_pairs), int(dim), int(round(corrupt * dim)),
                        int(n_classes), jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5, 6))
def _recall_task(key, batch, n_pairs, dim, n_flip, n_classes, dtype):
    # One draw of uniforms feeds everything (a single PRNG kernel keeps compilation cheap);
    # float32 bits regardless of the x64 flag, so the data do not depend on it.
    u = jr.uniform(key, (batch, n_pairs * dim + n_pairs + 1 + dim), jnp.float32)
    u_keys, u_lab, u_tgt, u_flip = jnp.split(u, np.cumsum([n_pairs * dim, n_pairs, 1]), -1)
    keys = jnp.where(u_keys < 0.5, 1.0, -1.0).astype(dtype).reshape(batch, n_pairs, dim)
    labels_ctx = jnp.minimum(jnp.floor(u_lab * n_classes), n_classes - 1).astype(jnp.int32)
    target = jnp.minimum(jnp.floor(u_tgt[:, 0] * n_pairs), n_pairs - 1).astype(jnp.int32)
    # exactly n_flip distinct positions: the n_flip smallest of i.i.d. uniforms (rank by
    # pairwise comparison, ties broken by index)
    less = (u_flip[:, None, :] < u_flip[:, :, None]) | (
        (u_flip[:, None, :] == u_flip[:, :, None])
        & (jnp.arange(dim)[None, :] < jnp.arange(dim)[:, None])
    )
    rank = jnp.sum(less, -1)
    flip = jnp.where(rank < n_flip, -1.0, 1.0).astype(dtype)
    query = jnp.take_along_axis(keys, target[:, None, None], axis=1)[:, 0] * flip
    onehot = jax.nn.one_hot(labels_ctx, n_classes, dtype=dtype)
    ctx = jnp.concatenate([keys, onehot, jnp.zeros((batch, n_pairs, 1), dtype)], -1)
    qtok = jnp.concatenate(
        [query, jnp.zeros((batch, n_classes), dtype), jnp.ones((batch, 1), dtype)], -1)
    tokens = jnp.concatenate([ctx, qtok[:, None]], axis=1)
    labels = jnp.take_along_axis(labels_ctx, target[:, None], axis=1)[:, 0]
    return RecallBatch(tokens, labels, target)
