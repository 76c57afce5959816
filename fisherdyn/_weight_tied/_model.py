"""A weight-tied (looped) transformer whose attention normalizer is any entropy family.

One pre-LayerNorm block (multi-head attention + MLP) is applied L times with input
re-injection and a residual step $h = c/L$:

$$u_l = x_l + e,\\quad a_l = \\mathrm{Attn}(\\mathrm{LN}_1 u_l),\\quad
  x_{l+1} = x_l + \\tfrac{c}{L}\\,\\big(a_l + \\mathrm{MLP}(\\mathrm{LN}_2(u_l + a_l))\\big),$$

$x_0 = 0$, $e$ the token embedding: an explicit Euler discretization of
$\\dot x = F(x, e)$ on $t\\in[0, c]$, so the loop index reads as continuous depth
$t_l = l\\,c/L$ (docs/math.md §6). Running more loops at the same step continues the same
flow past the trained depth; that is what `extract_paths` records.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

from .._custom_types import Array, Float
from .._entropies import AbstractEntropy, Shannon
from .._misc import check_entropy
from .._stationary import stationary

__all__ = ["LoopedConfig", "LoopedTransformer", "init_looped"]


@dataclasses.dataclass(frozen=True)
class LoopedConfig:
    """Task and architecture of a `LoopedTransformer`.

    **Fields:**

    - Task: `n_pairs` context pairs, `dim`-dimensional $\\pm1$ keys, `n_classes` labels
      (None = `n_pairs`), `corrupt` fraction of query bits flipped.
    - Model: width `d_model`, `n_heads` heads of width `d_model // n_heads`, MLP width
      `d_mlp`, `n_loops` = L trained loops, `step` = c (residual step c/L), `entropy` the
      attention normalizer, `T` its temperature (None = $\\sqrt{d_{head}}$, the standard
      scaling), `dtype` of the weights.
    """

    n_pairs: int = 8
    dim: int = 16
    n_classes: int | None = None
    corrupt: float = 0.125
    d_model: int = 32
    n_heads: int = 2
    d_mlp: int = 64
    n_loops: int = 8
    step: float = 2.0
    entropy: AbstractEntropy = dataclasses.field(default_factory=Shannon)
    T: float | None = None
    dtype: str = "float32"

    def __post_init__(self):
        check_entropy(self.entropy)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_loops < 1 or not self.step > 0:
            raise ValueError("need n_loops >= 1 and step > 0")
        if self.T is not None and not self.T > 0:
            raise ValueError(f"T must be > 0, got {self.T}")

    @property
    def classes(self) -> int:
        return self.n_pairs if self.n_classes is None else self.n_classes

    @property
    def token_dim(self) -> int:
        return self.dim + self.classes + 1

    @property
    def n_ctx(self) -> int:
        """Length of an attention row: the context pairs and the query itself."""
        return self.n_pairs + 1

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def temperature(self) -> float:
        return math.sqrt(self.d_head) if self.T is None else float(self.T)

    def fingerprint(self) -> dict:
        """A JSON-able description (the entropy by its repr) used for the cache key."""
        d = dataclasses.asdict(self)
        d["entropy"] = repr(self.entropy)
        return d


class _Trace(NamedTuple):
    attn: Float[Array, "loops+1 heads n_tok n_tok"]
    scores: Float[Array, "loops+1 heads n_tok n_tok"]
    logits: Float[Array, "loops+1 n_classes"]


class LoopedTransformer(eqx.Module):
    """One pre-LayerNorm transformer block applied in a loop (weight-tied depth).

    Construct with `LoopedTransformer(config, key=key)`. Calling the model on one problem's
    tokens `(n_tok, token_dim)` returns the label logits at the query token after
    `n_loops` loops (default: the trained `config.n_loops`), always with the trained step
    `config.step / config.n_loops`. Batch with `jax.vmap`.
    """

    embed: eqx.nn.Linear
    ln_attn: eqx.nn.LayerNorm
    wq: eqx.nn.Linear
    wk: eqx.nn.Linear
    wv: eqx.nn.Linear
    wo: eqx.nn.Linear
    ln_mlp: eqx.nn.LayerNorm
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear
    ln_out: eqx.nn.LayerNorm
    readout: eqx.nn.Linear
    config: LoopedConfig = eqx.field(static=True)

    def __init__(self, config: LoopedConfig, *, key: jax.Array):
        dt = jnp.dtype(config.dtype)
        d = config.d_model
        ks = jr.split(key, 8)
        self.config = config
        self.embed = eqx.nn.Linear(config.token_dim, d, key=ks[0], dtype=dt)
        self.ln_attn = eqx.nn.LayerNorm(d, dtype=dt)
        self.wq = eqx.nn.Linear(d, d, use_bias=False, key=ks[1], dtype=dt)
        self.wk = eqx.nn.Linear(d, d, use_bias=False, key=ks[2], dtype=dt)
        self.wv = eqx.nn.Linear(d, d, use_bias=False, key=ks[3], dtype=dt)
        self.wo = eqx.nn.Linear(d, d, use_bias=False, key=ks[4], dtype=dt)
        self.ln_mlp = eqx.nn.LayerNorm(d, dtype=dt)
        self.mlp_in = eqx.nn.Linear(d, config.d_mlp, key=ks[5], dtype=dt)
        self.mlp_out = eqx.nn.Linear(config.d_mlp, d, key=ks[6], dtype=dt)
        self.ln_out = eqx.nn.LayerNorm(d, dtype=dt)
        self.readout = eqx.nn.Linear(d, config.classes, key=ks[7], dtype=dt)

    # config views (the fields the studies read)
    @property
    def n_heads(self) -> int:
        return self.config.n_heads

    @property
    def d_model(self) -> int:
        return self.config.d_model

    @property
    def n_loops(self) -> int:
        return self.config.n_loops

    @property
    def step(self) -> float:
        return self.config.step

    @property
    def entropy(self) -> AbstractEntropy:
        return self.config.entropy

    @property
    def T(self) -> float:
        return self.config.temperature

    @property
    def dt(self) -> float:
        """The residual step $c/L$ (depth per loop)."""
        return self.config.step / self.config.n_loops

    def _heads(self, lin, x):
        n = x.shape[0]
        y = jax.vmap(lin)(x).reshape(n, self.config.n_heads, self.config.d_head)
        return y.transpose(1, 0, 2)

    def _attend(self, x, e):
        """Scores, weights and attention output at state x (re-injected input e)."""
        u = x + e
        y = jax.vmap(self.ln_attn)(u)
        q, k, v = self._heads(self.wq, y), self._heads(self.wk, y), self._heads(self.wv, y)
        scores = jnp.einsum("hqd,hkd->hqk", q, k)
        rho = stationary(self.config.entropy, scores, self.config.temperature)
        out = jnp.einsum("hqk,hkd->qhd", rho, v).reshape(x.shape[0], self.config.d_model)
        a = jax.vmap(self.wo)(out)
        return u, a, scores, rho

    def _logits(self, x):
        return self.readout(self.ln_out(x[-1]))

    def _update(self, u, a):
        m = jax.vmap(self.mlp_out)(jax.nn.gelu(jax.vmap(self.mlp_in)(jax.vmap(self.ln_mlp)(u + a))))
        return a + m

    def trace(self, tokens: Float[Array, "n_tok token_dim"],
              n_loops: int | None = None) -> _Trace:
        """Run `n_loops` loops on one problem, recording every state $x_0..x_n$.

        **Returns:**

        `(attn, scores, logits)` with a leading axis of length `n_loops + 1`: the attention
        weights and raw scores $q\\cdot k$ (all heads, all rows) computed at each state, and
        the readout logits of each state.
        """
        n = self.config.n_loops if n_loops is None else int(n_loops)
        e = jax.vmap(self.embed)(tokens)
        dt = jnp.asarray(self.dt, e.dtype)

        def body(x, _):
            u, a, scores, rho = self._attend(x, e)
            return x + dt * self._update(u, a), (rho, scores, self._logits(x))

        x_n, (rho, scores, logits) = jax.lax.scan(body, jnp.zeros_like(e), length=n)
        _, _, s_n, rho_n = self._attend(x_n, e)
        return _Trace(
            jnp.concatenate([rho, rho_n[None]]),
            jnp.concatenate([scores, s_n[None]]),
            jnp.concatenate([logits, self._logits(x_n)[None]]),
        )

    def loop_logits(self, tokens: Float[Array, "n_tok token_dim"],
                    n_loops: int | None = None) -> Float[Array, "loops+1 n_classes"]:
        """Readout logits of every state $x_0..x_n$, shape `(n_loops + 1, n_classes)`."""
        n = self.config.n_loops if n_loops is None else int(n_loops)
        e = jax.vmap(self.embed)(tokens)
        dt = jnp.asarray(self.dt, e.dtype)

        def body(x, _):
            u, a, _, _ = self._attend(x, e)
            return x + dt * self._update(u, a), self._logits(x)

        x_n, logits = jax.lax.scan(body, jnp.zeros_like(e), length=n)
        return jnp.concatenate([logits, self._logits(x_n)[None]])

    def __call__(self, tokens: Float[Array, "n_tok token_dim"],
                 n_loops: int | None = None) -> Float[Array, " n_classes"]:
        return self.loop_logits(tokens, n_loops)[-1]

    def with_loops(self, n_loops: int) -> LoopedTransformer:
        """The same weights as a model of `n_loops` loops at step `config.step / n_loops`
        (the same continuous depth c, discretized finer or coarser)."""
        return _with_config(self, dataclasses.replace(self.config, n_loops=int(n_loops)))


def init_looped(config: LoopedConfig, key: jax.Array) -> LoopedTransformer:
    """`LoopedTransformer(config, key=key)`, built under one jit shared by every config with
    the same array sizes.

    The weights do not depend on the normalizer, the loop count or the step, so
    initializing models that differ only in those compiles once.

    **Arguments:**

    - `config`: a `LoopedConfig`.
    - `key`: a JAX PRNG key.

    **Returns:**

    A `LoopedTransformer` equal to the eagerly constructed one.
    """
    sizes = dataclasses.replace(config, entropy=Shannon(), n_loops=1, step=1.0, T=None)
    return _with_config(_init_looped(sizes, key), config)


@eqx.filter_jit
def _init_looped(config, key):
    return LoopedTransformer(config, key=key)


def _shell(config: LoopedConfig) -> LoopedTransformer:
    """The model's structure with `jax.ShapeDtypeStruct` leaves (nothing computed)."""
    return eqx.filter_eval_shape(LoopedTransformer, config, key=jr.PRNGKey(0))


def _with_config(model: LoopedTransformer, config: LoopedConfig) -> LoopedTransformer:
    """`model`'s weights under another config of the same array sizes (e.g. another loop
    count: the same weights run at step `config.step / config.n_loops`)."""
    leaves = jax.tree_util.tree_leaves(model)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(_shell(config)), leaves)
