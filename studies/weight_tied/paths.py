"""Reading a looped model out loop by loop: task accuracy and the attention paths."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from jaxtyping import Array, ArrayLike, Float, Int

from fisherdyn import AbstractEntropy

from .jit import RUN_ONCE
from .model import LoopedTransformer
from .task import PointerBatch, RecallBatch, task_batch

__all__ = ["LoopedPaths", "extract_paths", "evaluate_looped"]


@functools.partial(eqx.filter_jit, **RUN_ONCE)
def _predict(model, tokens, n_loops):
    return jnp.argmax(jax.vmap(lambda t: model(t, n_loops))(tokens), -1).astype(jnp.int32)


@functools.partial(eqx.filter_jit, **RUN_ONCE)
def _trace_batch(model, tokens, n_loops):
    return jax.vmap(lambda t: model.trace(t, n_loops))(tokens)


def evaluate_looped(model: LoopedTransformer, key: jax.Array, batch: int = 1024,
                    n_loops: int | None = None) -> float:
    """Accuracy on `batch` fresh problems of the model's task (`config.task`) from `key`
    after `n_loops` loops.

    **Arguments:**

    - `model`: a `LoopedTransformer`.
    - `key`: a JAX PRNG key for the problems.
    - `batch`: the number of problems.
    - `n_loops`: loops to run (default: the trained `model.n_loops`).

    **Returns:**

    The fraction of problems whose label is read out correctly.
    """
    c = model.config
    data = task_batch(c, key, batch)
    n = c.n_loops if n_loops is None else int(n_loops)
    pred = _predict(model, data.tokens, n)
    return float(np.mean(np.asarray(pred) == np.asarray(data.labels)))


class LoopedPaths(eqx.Module):
    """Attention paths of a looped model, one row per loop (no truncation).

    **Fields:**

    - `attn` `(loops + 1, batch, heads, n_ctx)`: each head's full attention row of the
      query token at states $x_0..x_n$ (rows sum to 1; `n_ctx = n_pairs + 1`, the last
      entry is the query attending to itself). Row l is the attention that drives the
      step $x_l \\to x_{l+1}$; the last one is computed at the final state.
    - `scores` same shape: the raw scores $z = q\\cdot k$ that produced them (the
      normalizer is `stationary(entropy, scores, T)`).
    - `logits` `(loops + 1, batch, n_classes)`: the readout at each state.
    - `t` `(loops + 1,)`: continuous depth $t_l = l\\,c/L$ (trained step).
    - `T`: the attention temperature; `entropy`: the normalizer; `n_trained`: L.
    - `labels`, `target` `(batch,)` when the inputs were a `RecallBatch` or a
      `PointerBatch` (else None); `chain` `(batch, hops)` for a `PointerBatch`.
    - `attn_t` `(loops + 1,)`: the depth at which each attention row holds. For the plain
      transformer $t_l$ (computed at $x_l$); for a carried loop (`"fisher"`, `"linear"`)
      $t_{l+1}$: loop $l$ advances the attention's state from $t_l$ to $t_{l+1}$ with the
      scores `scores[l]` held fixed, starting at rest from uniform weights at $t = 0$.
    - `loop_kind`: the model's `config.loop_kind`.
    """

    attn: Float[Array, "loops+1 batch heads *rows n_ctx"]
    scores: Float[Array, "loops+1 batch heads *rows n_ctx"]
    logits: Float[Array, "loops+1 batch n_classes"]
    t: Float[Array, " loops+1"]
    labels: Int[Array, " batch"] | None
    target: Int[Array, " batch"] | None
    T: float = eqx.field(static=True)
    entropy: AbstractEntropy = eqx.field(static=True)
    n_trained: int = eqx.field(static=True)
    attn_t: Float[Array, " loops+1"] | None = None
    chain: Int[Array, "batch hops"] | None = None
    loop_kind: str = eqx.field(static=True, default="transformer")

    @property
    def accuracy(self) -> Float[Array, " loops+1"]:
        """Task accuracy per loop, `(loops + 1,)` (needs labels)."""
        if self.labels is None:
            raise ValueError("no labels: extract from a RecallBatch")
        hit = jnp.argmax(self.logits, -1).astype(self.labels.dtype) == self.labels[None]
        return jnp.mean(hit.astype(self.logits.dtype), axis=-1)


def _cast(model, dtype):
    """`model` with its float weights in `dtype`, and that dtype (None keeps the model's)."""
    if dtype is None:
        return model, model.embed.weight.dtype
    dtype = jnp.dtype(dtype)
    if dtype.itemsize == 8 and not jax.config.jax_enable_x64:
        raise ValueError(f"dtype={dtype} needs jax.config.update('jax_enable_x64', True)")
    model = jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)
    return model, dtype


def extract_paths(model: LoopedTransformer,
                  inputs: RecallBatch | Float[ArrayLike, "batch n_tok token_dim"],
                  n_loops: int | None = None, *, dtype=None,
                  all_rows: bool = False) -> LoopedPaths:
    """Record the attention path of every head over `n_loops` loops at the trained step.

    Use `n_loops` = 2-4 x the trained depth to see whether the attention settles.

    **Arguments:**

    - `model`: a `LoopedTransformer`.
    - `inputs`: a `RecallBatch`, a `PointerBatch` or tokens `(batch, n_tok, token_dim)`.
    - `n_loops`: loops to run (default: the trained `model.n_loops`).
    - `dtype`: run in this float dtype (e.g. `jnp.float64` for fitting), casting weights
      and inputs; None keeps the model's.
    - `all_rows`: also keep every token's row: `attn`/`scores` then have shape
      `(loops + 1, batch, heads, n_tok, n_ctx)`.

    **Returns:**

    A `LoopedPaths`.
    """
    labels = target = chain = None
    if isinstance(inputs, RecallBatch):
        tokens, labels, target = inputs
    elif isinstance(inputs, PointerBatch):
        tokens, labels, target, chain = inputs
    else:
        tokens = jnp.asarray(inputs)
    model, dtype = _cast(model, dtype)
    tokens = tokens.astype(dtype)
    n = model.n_loops if n_loops is None else int(n_loops)
    tr = _trace_batch(model, tokens, n)
    attn = jnp.moveaxis(tr.attn, 1, 0)  # (loops+1, batch, heads, n_tok, n_tok)
    scores = jnp.moveaxis(tr.scores, 1, 0)
    if not all_rows:
        attn, scores = attn[..., -1, :], scores[..., -1, :]
    t = jnp.arange(n + 1, dtype=dtype) * jnp.asarray(model.dt, dtype)
    attn_t = t if model.loop is None else t + jnp.asarray(model.dt, dtype)
    return LoopedPaths(attn, scores, jnp.moveaxis(tr.logits, 1, 0), t, labels, target,
                       model.T, model.entropy, model.n_loops, attn_t, chain, model.loop_kind)
