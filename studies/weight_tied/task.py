"""The in-context tasks the looped transformer is trained on.

- Recall: a context of key/label pairs ($\\pm1$ keys), then a corrupted copy of one key as the
  query; the model reads out the label at the query token (one retrieval).
- Pointer chasing: a context of links between nodes, a start node as the query; the model
  follows `hops` links and reads out the label of the node it ends on (`hops` retrievals in
  sequence, so attention has to move between keys across loops).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from jaxtyping import Array, Float, Int

__all__ = ["RecallBatch", "recall_task", "PointerBatch", "pointer_task", "task_batch"]


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


class PointerBatch(NamedTuple):
    """A batch of multi-hop pointer-chasing problems.

    **Fields:**

    - `tokens` `(batch, n_nodes + 1, 2 dim + n_classes + 1)`: context token $i$ is
      `[key_i, key_{pi(i)}, onehot(label_{pi(i)}), 0]` (a node, the node it links to, and
      that node's label); the last token is the query `[key_start, 0, 0, 1]`.
    - `labels` `(batch,)`: the label of $\\pi^{hops}(start)$.
    - `target` `(batch,)`: the context token that holds that label, $\\pi^{hops-1}(start)$
      (where attention should go at the last hop).
    - `chain` `(batch, hops)`: the context tokens visited, $\\pi^{j}(start)$ for
      $j = 0..hops-1$ (where attention should go at hop $j + 1$).
    """

    tokens: Float[Array, "batch n_tok token_dim"]
    labels: Int[Array, " batch"]
    target: Int[Array, " batch"]
    chain: Int[Array, "batch hops"]


def pointer_task(key: jax.Array, batch: int, n_nodes: int, hops: int, dim: int, *,
                 n_classes: int | None = None, corrupt: float = 0.0,
                 distinct_labels: bool = False, dtype=jnp.float32) -> PointerBatch:
    """Generate multi-hop pointer-chasing problems (seeded, pure).

    Each problem draws `n_nodes` i.i.d. uniform $\\pm1$ keys, a uniformly random cyclic
    permutation $\\pi$ of the nodes (one cycle, so $\\pi^j(s) \\ne s$ for $0 < j < n$: the
    hops never short-cut), labels uniform in `range(n_classes)` (default `n_nodes`) and a
    uniform start node. Following one link is one key lookup (find the token whose first
    key equals the current key, read its second key), so the answer needs `hops`
    retrievals in sequence; `hops = 1` is a one-hop lookup of the start key's token, the
    recall task without corruption.

    **Arguments:**

    - `key`: a JAX PRNG key (the only source of randomness).
    - `batch`, `n_nodes`, `hops`, `dim`: problem count, nodes (context tokens), links to
      follow (>= 1), key dimension.
    - `n_classes`: number of labels; `corrupt`: fraction of the query key's coordinates
      flipped, in [0, 0.5); `dtype`: float dtype of the tokens.
    - `distinct_labels`: give the nodes distinct labels (a uniformly random choice of
      `n_nodes` of the `n_classes`, needs `n_classes >= n_nodes`). With labels drawn with
      replacement the most frequent label in the context is the answer about a third of
      the time at 8 nodes (0.32), a shortcut that needs no lookup at all; with distinct
      labels no label is more likely than another without following the links.

    **Returns:**

    A `PointerBatch`.
    """
    if not 0 <= corrupt < 0.5:
        raise ValueError(f"corrupt must be in [0, 0.5), got {corrupt}")
    if hops < 1 or n_nodes < 2:
        raise ValueError(f"need hops >= 1 and n_nodes >= 2, got {hops}, {n_nodes}")
    n_classes = n_nodes if n_classes is None else n_classes
    if distinct_labels and n_classes < n_nodes:
        raise ValueError(f"distinct labels need n_classes >= n_nodes, got {n_classes} < "
                         f"{n_nodes}")
    return _pointer_task(key, int(batch), int(n_nodes), int(hops), int(dim),
                         int(round(corrupt * dim)), int(n_classes), jnp.dtype(dtype),
                         bool(distinct_labels))


def _rank(u):
    """Rank of each entry along the last axis (ties broken by index), by comparison."""
    n = u.shape[-1]
    less = (u[..., None, :] < u[..., :, None]) | (
        (u[..., None, :] == u[..., :, None]) & (jnp.arange(n)[None, :] < jnp.arange(n)[:, None]))
    return jnp.sum(less, -1)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5, 6, 7, 8))
def _pointer_task(key, batch, n_nodes, hops, dim, n_flip, n_classes, dtype, distinct=False):
    # the distinct labels' draw is appended, so the other problems' data stay as they were
    extra = n_classes if distinct else 0
    u = jr.uniform(key, (batch, n_nodes * dim + 2 * n_nodes + 1 + dim + extra), jnp.float32)
    u_keys, u_lab, u_cyc, u_start, u_flip, u_perm = jnp.split(
        u, np.cumsum([n_nodes * dim, n_nodes, n_nodes, 1, dim]), -1)
    keys = jnp.where(u_keys < 0.5, 1.0, -1.0).astype(dtype).reshape(batch, n_nodes, dim)
    if distinct:  # the first n_nodes classes of a random order of all of them
        label_of = jnp.argsort(_rank(u_perm), -1)[:, :n_nodes].astype(jnp.int32)
    else:
        label_of = jnp.minimum(jnp.floor(u_lab * n_classes), n_classes - 1).astype(jnp.int32)
    # the cycle visits the nodes in the order of their rank: pi(order[j]) = order[j + 1]
    rank = _rank(u_cyc)  # (batch, n_nodes): position of node i in the cycle
    order = jnp.argsort(rank, -1).astype(jnp.int32)  # order[j] = node at position j
    nxt = jnp.take_along_axis(order, (rank + 1) % n_nodes, -1)  # pi(i)
    start = jnp.minimum(jnp.floor(u_start[:, 0] * n_nodes), n_nodes - 1).astype(jnp.int32)

    def hop(node, _):
        return jnp.take_along_axis(nxt, node[:, None], -1)[:, 0], node

    end, chain = jax.lax.scan(hop, start, length=hops)
    chain = chain.T  # (batch, hops): pi^j(start), j < hops
    flip = jnp.where(_rank(u_flip) < n_flip, -1.0, 1.0).astype(dtype)
    qkey = jnp.take_along_axis(keys, start[:, None, None], axis=1)[:, 0] * flip
    dst = jnp.take_along_axis(keys, nxt[:, :, None], axis=1)
    onehot = jax.nn.one_hot(jnp.take_along_axis(label_of, nxt, -1), n_classes, dtype=dtype)
    ctx = jnp.concatenate([keys, dst, onehot, jnp.zeros((batch, n_nodes, 1), dtype)], -1)
    qtok = jnp.concatenate([qkey, jnp.zeros((batch, dim + n_classes), dtype),
                            jnp.ones((batch, 1), dtype)], -1)
    tokens = jnp.concatenate([ctx, qtok[:, None]], axis=1)
    labels = jnp.take_along_axis(label_of, end[:, None], -1)[:, 0]
    return PointerBatch(tokens, labels, chain[:, -1], chain)


def task_batch(config, key: jax.Array, batch: int) -> RecallBatch | PointerBatch:
    """A batch of the task a `LoopedConfig` names (`config.task`), with its sizes.

    **Arguments:**

    - `config`: a `LoopedConfig`; `key`: a JAX PRNG key; `batch`: the number of problems.

    **Returns:**

    A `RecallBatch` (`task="recall"`) or a `PointerBatch` (`task="pointer"`, `n_pairs`
    nodes, `hops` links).
    """
    dtype = jnp.dtype(config.dtype)
    if config.task == "pointer":
        return pointer_task(key, batch, config.n_pairs, config.hops, config.dim,
                            n_classes=config.classes, corrupt=config.corrupt,
                            distinct_labels=config.distinct_labels, dtype=dtype)
    return recall_task(key, batch, config.n_pairs, config.dim, config.corrupt,
                       n_classes=config.classes, dtype=dtype)
