"""A weight-tied (looped) transformer whose attention normalizer is any entropy family.

One pre-LayerNorm block (multi-head attention + MLP) is applied L times with input
re-injection and a residual step $h = c/L$:

$$u_l = x_l + e,\\quad a_l = \\mathrm{Attn}(\\mathrm{LN}_1 u_l),\\quad
  x_{l+1} = x_l + \\tfrac{c}{L}\\,\\big(a_l + \\mathrm{MLP}(\\mathrm{LN}_2(u_l + a_l))\\big),$$

$x_0 = 0$, $e$ the token embedding: an explicit Euler discretization of
$\\dot x = F(x, e) - \\lambda x$ on $t\\in[0, c]$ ($\\lambda$ = `LoopedConfig.leak`, 0 by
default; a leak $\\lambda > 0$ bounds the stream by $\\sup\\|F\\|/\\lambda$, since every input of
$F$ is layer-normalized, and pulls the loop map toward a contraction), so the loop index
reads as continuous depth $t_l = l\\,c/L$ (docs/math.md §6). Running more loops at the same
step continues the same flow past the trained depth; that is what `extract_paths` records.

`LoopedConfig.loop_kind` chooses what the attention of a loop is: the normalizer of that
loop's scores (`"transformer"`), or the state of a dynamics carried across loops and driven
by them (`"fisher"`, `"linear"`: the study's controls, `fisherdyn.FisherLoop` and
`fisherdyn.LinearScoreLoop`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

from jaxtyping import Array, Float

from fisherdyn import (
    AbstractCarriedLoop,
    AbstractEntropy,
    FisherLoop,
    LinearScoreLoop,
    Shannon,
    stationary,
)

__all__ = ["LoopedConfig", "LoopedTransformer", "init_looped"]

_TASKS = ("recall", "pointer")
_LOOP_KINDS = ("transformer", "fisher", "linear")
# RK4's stability interval on the negative real axis: h * rate <= 2.785
_RK4_STABLE = 2.785
# fields added after the first cached weights: omitted from the fingerprint at these values
_LATER_DEFAULTS = dict(task="recall", hops=1, loop_kind="transformer", mass=1.0, damping=1.0,
                       learn_T=False, substeps=4, frozen_scores=False, leak=0.0,
                       dose=1.0, distinct_labels=False)


@dataclasses.dataclass(frozen=True)
class LoopedConfig:
    """Task and architecture of a `LoopedTransformer`.

    **Fields:**

    - Task: `task` = `"recall"` (`recall_task`) or `"pointer"` (`pointer_task` with
      `n_pairs` nodes and `hops` links); `n_pairs` context pairs (nodes),
      `dim`-dimensional $\\pm1$ keys, `n_classes` labels (None = `n_pairs`), `corrupt`
      fraction of query bits flipped; `distinct_labels` (pointer task): the nodes' labels
      are distinct, so that the most frequent label is no shortcut (`pointer_task`).
    - Model: width `d_model`, `n_heads` heads of width `d_model // n_heads`, MLP width
      `d_mlp`, `n_loops` = L trained loops, `step` = c (residual step c/L), `entropy` the
      attention normalizer, `T` its temperature (None = $\\sqrt{d_{head}}$, the standard
      scaling), `dtype` of the weights.
    - Attention: `loop_kind` = `"transformer"` (each loop's attention is
      `stationary(entropy, scores, T)`), `"fisher"` (a `FisherLoop`: the attention is the
      damped Fisher-Lagrangian dynamics driven by the loop scores, the positive control) or
      `"linear"` (a `LinearScoreLoop`: linear second-order dynamics in score space, the
      negative control). `mass`, `damping`: their initial $m$ and $\\gamma$ per head;
      `learn_T`: also learn T per head (initialized at the temperature); `substeps`: RK4
      steps per loop of the Fisher dynamics. `frozen_scores`: queries and keys read the
      input embedding only, so every loop sees the same scores (for `"fisher"`: the
      attention is then exactly the damped relaxation toward fixed scores, the positive
      control of the fixed-target tests; for `"transformer"` the attention is constant).
    - `dose` $\\beta \\in [0, 1]$, for `"fisher"` / `"linear"`: the attention is
      $(1 - \\beta)\\,\\mathrm{stationary}(z_l) + \\beta\\,\\rho_{carried}$, a graded
      architectural dose of the carried dynamics ($\\beta = 1$, the default: the carried
      state alone; $\\beta = 0$: the plain transformer's attention, the carried state
      still computed but unread).
    - Residual: `leak` = $\\lambda \\ge 0$, the step is $x + (c/L)(\\text{block} - \\lambda x)$.
      With $\\lambda = 0$ the stream grows without bound (no fixed point); a leak bounds it
      and forgets what earlier loops wrote, so a loop can replace the key it follows.

    Fields at their defaults are left out of the cache fingerprint, so the weights cached
    for a config are found whatever fields were added later.
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
    task: str = "recall"
    hops: int = 1
    loop_kind: str = "transformer"
    mass: float = 1.0
    damping: float = 1.0
    learn_T: bool = False
    substeps: int = 4
    frozen_scores: bool = False
    leak: float = 0.0
    dose: float = 1.0
    distinct_labels: bool = False

    def __post_init__(self):
        if not isinstance(self.entropy, AbstractEntropy):
            raise TypeError(f"expected a fisherdyn entropy (e.g. fd.Shannon()), got "
                            f"{self.entropy!r}")
        if self.task not in _TASKS:
            raise ValueError(f"task must be one of {_TASKS}, got {self.task!r}")
        if self.loop_kind not in _LOOP_KINDS:
            raise ValueError(f"loop_kind must be one of {_LOOP_KINDS}, got {self.loop_kind!r}")
        if self.hops < 1 or (self.task == "recall" and self.hops != 1):
            raise ValueError(f"hops must be >= 1 (and 1 for the recall task), got {self.hops}")
        if not (self.mass > 0 and self.damping > 0) or self.substeps < 1:
            raise ValueError("need mass > 0, damping > 0 and substeps >= 1")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_loops < 1 or not self.step > 0:
            raise ValueError("need n_loops >= 1 and step > 0")
        if not 0 <= self.dose <= 1:
            raise ValueError(f"dose must be in [0, 1], got {self.dose}")
        if self.dose != 1 and self.loop_kind == "transformer":
            raise ValueError("dose needs a carried loop (loop_kind 'fisher' or 'linear')")
        if not self.leak >= 0:
            raise ValueError(f"leak must be >= 0, got {self.leak}")
        if self.T is not None and not self.T > 0:
            raise ValueError(f"T must be > 0, got {self.T}")
        # the damped mode decays at about gamma/m; an RK4 substep h beyond RK4's stability
        # interval on the negative axis (2.785 / rate) makes the carried state blow up
        rate = self.damping / self.mass
        h = self.substep
        if self.loop_kind == "fisher" and h * rate > _RK4_STABLE:
            need = math.ceil(h * self.substeps * rate / _RK4_STABLE)
            raise ValueError(
                f"an RK4 substep of {h:.3g} is unstable at damping/mass = {rate:.3g} "
                f"(h * damping/mass = {h * rate:.3g} > {_RK4_STABLE}): use substeps >= "
                f"{need}, a larger mass or a smaller step")

    @property
    def classes(self) -> int:
        return self.n_pairs if self.n_classes is None else self.n_classes

    @property
    def token_dim(self) -> int:
        if self.task == "pointer":
            return 2 * self.dim + self.classes + 1
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

    @property
    def substep(self) -> float:
        """The time step h of one RK4 substep of a Fisher loop: step / (loops * substeps)."""
        return self.step / (self.n_loops * self.substeps)

    def fingerprint(self) -> dict:
        """A JSON-able description (the entropy by its repr) used for the cache key."""
        d = dataclasses.asdict(self)
        d["entropy"] = repr(self.entropy)
        for name, default in _LATER_DEFAULTS.items():
            if d[name] == default:
                del d[name]
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

    The loop state is `(x, carry)`: the residual stream $x$ `(n_tok, d_model)` and, for
    `loop_kind` `"fisher"` / `"linear"`, the attention's own carried state (`loop`, a
    `FisherLoop` / `LinearScoreLoop`; None and `carry = None` for the plain transformer).
    The transformer weights do not depend on `loop_kind`: the same key gives the same
    block whatever carries the attention.
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
    loop: AbstractCarriedLoop | None
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
        self.loop = _make_loop(config)

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

    @property
    def loop_kind(self) -> str:
        return self.config.loop_kind

    def dynamics_parameters(self) -> dict:
        """The carried attention's learned parameters per head, as numpy arrays:
        `mass`, `damping`, `T` (and `a`, `b` for `"linear"`), plus the `entropy` (the
        family) and `loop_kind`. For the plain transformer only `T`, `entropy`, `loop_kind`.
        """
        import numpy as np

        out = dict(loop_kind=self.loop_kind, entropy=self.entropy)
        if self.loop is None:
            out["T"] = np.full(self.n_heads, self.T)
            return out
        out.update(mass=np.asarray(self.loop.mass), damping=np.asarray(self.loop.damping),
                   T=np.asarray(self.loop.temperature(self.T)))
        if isinstance(self.loop, LinearScoreLoop):
            out.update(a=np.asarray(self.loop.a), b=np.asarray(self.loop.b))
        return out

    def _heads(self, lin, x):
        n = x.shape[0]
        y = jax.vmap(lin)(x).reshape(n, self.config.n_heads, self.config.d_head)
        return y.transpose(1, 0, 2)

    def _attend(self, x, e, carry=None):
        """Scores, weights and attention output at state (x, carry) (re-injected input e),
        and the carried attention state after the loop."""
        u = x + e
        y = jax.vmap(self.ln_attn)(u)
        # frozen: the scores of x = 0, the same at every loop
        ys = jax.vmap(self.ln_attn)(e) if self.config.frozen_scores else y
        q, k, v = self._heads(self.wq, ys), self._heads(self.wk, ys), self._heads(self.wv, y)
        scores = jnp.einsum("hqd,hkd->hqk", q, k)
        if self.loop is None:
            rho = stationary(self.config.entropy, scores, self.config.temperature)
        else:
            T = self.loop.temperature(self.config.temperature).astype(scores.dtype)
            carry = self.loop.advance(carry, scores, self.config.entropy, T, self.dt)
            rho = self.loop.weights(carry, self.config.entropy, T)
            if self.config.dose != 1:
                beta = jnp.asarray(self.config.dose, scores.dtype)
                plain = stationary(self.config.entropy, scores, T[:, None, None])
                rho = (1 - beta) * plain + beta * rho
        out = jnp.einsum("hqk,hkd->qhd", rho, v).reshape(x.shape[0], self.config.d_model)
        a = jax.vmap(self.wo)(out)
        return u, a, scores, rho, carry

    def _logits(self, x):
        return self.readout(self.ln_out(x[-1]))

    def _update(self, u, a):
        m = jax.vmap(self.mlp_out)(jax.nn.gelu(jax.vmap(self.mlp_in)(jax.vmap(self.ln_mlp)(u + a))))
        return a + m

    def _step(self, x, u, a):
        """One Euler step of the residual stream, $x + h(\\text{block} - \\lambda x)$."""
        f = self._update(u, a)
        if self.config.leak:
            f = f - jnp.asarray(self.config.leak, x.dtype) * x
        return x + jnp.asarray(self.dt, x.dtype) * f

    def embedding(self, tokens: Float[Array, "n_tok token_dim"]) -> Float[Array, "n_tok d_model"]:
        """The re-injected input $e$ of one problem."""
        return jax.vmap(self.embed)(tokens)

    def initial_state(self, tokens: Float[Array, "n_tok token_dim"]):
        """The loop state at depth 0: `(x_0 = 0, carry_0)` (carry at rest, uniform attention;
        None for the plain transformer)."""
        e = self.embedding(tokens)
        carry = None
        if self.loop is not None:
            n = e.shape[0]
            carry = self.loop.init_state((self.config.n_heads, n, n), e.dtype)
        return jnp.zeros_like(e), carry

    def loop_map(self, state, e: Float[Array, "n_tok d_model"]):
        """One loop: the state `(x_l, carry_l)` to `(x_{l+1}, carry_{l+1})` (`e` from
        `embedding`). The map whose fixed points `fixed_point_report` studies."""
        x, carry = state
        u, a, _, _, carry = self._attend(x, e, carry)
        return self._step(x, u, a), carry

    def _scan(self, tokens, n_loops, state0, record_attn):
        n = self.config.n_loops if n_loops is None else int(n_loops)
        e = self.embedding(tokens)
        if state0 is None:
            state0 = self.initial_state(tokens)

        def body(state, _):
            x, carry = state
            u, a, scores, rho, carry = self._attend(x, e, carry)
            rec = (rho, scores) if record_attn else ()
            return (self._step(x, u, a), carry), (rec, self._logits(x), x)

        state_n, (rec, logits, xs) = jax.lax.scan(body, state0, length=n)
        xs = jnp.concatenate([xs, state_n[0][None]])
        logits = jnp.concatenate([logits, self._logits(state_n[0])[None]])
        return e, state_n, rec, logits, xs

    def trace(self, tokens: Float[Array, "n_tok token_dim"],
              n_loops: int | None = None, state0=None) -> _Trace:
        """Run `n_loops` loops on one problem, recording every state $x_0..x_n$.

        **Arguments:** `tokens` of one problem; `n_loops` (default: the trained L);
        `state0`: the initial loop state (default `initial_state(tokens)`).

        **Returns:**

        `(attn, scores, logits)` with a leading axis of length `n_loops + 1`: the attention
        weights and raw scores $q\\cdot k$ (all heads, all rows) of each loop $l$ (the
        weights that drive the step $x_l \\to x_{l+1}$; the last row is that of one more
        loop from the final state), and the readout logits of each state.
        """
        e, (x_n, c_n), (rho, scores), logits, _ = self._scan(tokens, n_loops, state0, True)
        _, _, s_n, rho_n, _ = self._attend(x_n, e, c_n)
        return _Trace(
            jnp.concatenate([rho, rho_n[None]]),
            jnp.concatenate([scores, s_n[None]]),
            logits,
        )

    def loop_logits(self, tokens: Float[Array, "n_tok token_dim"],
                    n_loops: int | None = None, state0=None) -> Float[Array, "loops+1 n_classes"]:
        """Readout logits of every state $x_0..x_n$, shape `(n_loops + 1, n_classes)`."""
        return self._scan(tokens, n_loops, state0, False)[3]

    def run(self, tokens: Float[Array, "n_tok token_dim"], n_loops: int | None = None,
            state0=None):
        """`(logits, xs, state_n)`: the readout logits and residual streams of every state
        $x_0..x_n$, `(n + 1, n_classes)` and `(n + 1, n_tok, d_model)`, and the final
        loop state `(x_n, carry_n)`."""
        _, state_n, _, logits, xs = self._scan(tokens, n_loops, state0, False)
        return logits, xs, state_n

    def __call__(self, tokens: Float[Array, "n_tok token_dim"],
                 n_loops: int | None = None) -> Float[Array, " n_classes"]:
        return self.loop_logits(tokens, n_loops)[-1]

    def with_loops(self, n_loops: int) -> LoopedTransformer:
        """The same weights as a model of `n_loops` loops at step `config.step / n_loops`
        (the same continuous depth c, discretized finer or coarser)."""
        return _with_config(self, dataclasses.replace(self.config, n_loops=int(n_loops)))


def _make_loop(config: LoopedConfig) -> AbstractCarriedLoop | None:
    """The carried attention of a config (None for the plain transformer)."""
    dtype = jnp.dtype(config.dtype)
    T = config.temperature if config.learn_T else None
    if config.loop_kind == "fisher":
        return FisherLoop(config.n_heads, config.mass, config.damping, T, dtype,
                          substeps=config.substeps)
    if config.loop_kind == "linear":
        return LinearScoreLoop(config.n_heads, config.mass, config.damping, T, dtype)
    return None


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
    sizes = dataclasses.replace(config, entropy=Shannon(), n_loops=1, step=1.0, T=None, hops=1,
                                mass=1.0, damping=1.0, substeps=4, leak=0.0, dose=1.0,
                                distinct_labels=False)
    model = _with_config(_init_looped(sizes, key), config)
    if model.loop is not None:  # its initial values come from the config, not the key
        model = eqx.tree_at(lambda m: m.loop, model, _make_loop(config))
    return model


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
