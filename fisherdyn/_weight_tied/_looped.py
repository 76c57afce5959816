"""A weight-tied (looped) transformer whose attention normalizer is any entropy family.

One pre-LayerNorm block (multi-head attention + MLP) is applied L times with input
re-injection and a residual step $h = c/L$:

$$u_l = x_l + e,\\quad a_l = \\mathrm{Attn}(\\mathrm{LN}_1 u_l),\\quad
  x_{l+1} = x_l + \\tfrac{c}{L}\\,\\big(a_l + \\mathrm{MLP}(\\mathrm{LN}_2(u_l + a_l))\\big),$$

$x_0 = 0$, $e$ the token embedding: an explicit Euler discretization of
$\\dot x = F(x, e)$ on $t\\in[0, c]$, so the loop index reads as continuous depth
$t_l = l\\,c/L$ (MATH.md §6). Running more loops at the same step continues the same flow
past the trained depth; that is what `extract_paths` records.

The task (`recall_task`) is in-context hetero-associative recall: a context of key/label
pairs ($\\pm1$ keys), then a corrupted copy of one key as the query; the model reads out the
label at the query token. The loss averages over the later loops so the computation settles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import tempfile
import time
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax

from .._misc import RUN_ONCE
from .._entropies import AbstractEntropy, Shannon
from .._stationary import stationary

__all__ = [
    "LoopedConfig",
    "LoopedTransformer",
    "RecallBatch",
    "recall_task",
    "TrainedLooped",
    "train_looped",
    "evaluate_looped",
    "LoopedPaths",
    "extract_paths",
    "default_cache_dir",
    "init_looped",
]

_FORMAT_VERSION = 1  # bump when the architecture or the training recipe changes


# --------------------------------------------------------------------------- the task


class RecallBatch(NamedTuple):
    """A batch of recall problems.

    `tokens` `(batch, n_pairs + 1, dim + n_classes + 1)`: context tokens are
    `[key, onehot(label), 0]`, the last token is the query `[corrupted key, 0, 1]`;
    `labels` `(batch,)` the query's label; `target` `(batch,)` the index of the context pair
    whose key was corrupted into the query (where attention should go).
    """

    tokens: jax.Array
    labels: jax.Array
    target: jax.Array


def recall_task(key, batch: int, n_pairs: int, dim: int, corrupt: float, *,
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

    **Returns:** a `RecallBatch`.
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


# --------------------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class LoopedConfig:
    """Task and architecture of a `LoopedTransformer`.

    Task: `n_pairs` context pairs, `dim`-dimensional $\\pm1$ keys, `n_classes` labels (None =
    `n_pairs`), `corrupt` fraction of query bits flipped. Model: width `d_model`, `n_heads`
    heads of width `d_model // n_heads`, MLP width `d_mlp`, `n_loops` = L trained loops,
    `step` = c (residual step c/L), `entropy` the attention normalizer, `T` its temperature
    (None = $\\sqrt{d_{head}}$, the standard scaling), `dtype` of the weights.
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
        if not isinstance(self.entropy, AbstractEntropy):
            raise TypeError(f"entropy must be a fisherdyn entropy, got {self.entropy!r}")
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
    attn: jax.Array  # (loops+1, heads, n_tok, n_tok)
    scores: jax.Array  # (loops+1, heads, n_tok, n_tok)
    logits: jax.Array  # (loops+1, n_classes)


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

    def __init__(self, config: LoopedConfig, *, key):
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

    def trace(self, tokens, n_loops: int | None = None) -> _Trace:
        """Run `n_loops` loops on one problem, recording every state $x_0..x_n$.

        **Returns:** `(attn, scores, logits)` with a leading axis of length `n_loops + 1`:
        the attention weights and raw scores $q\\cdot k$ (all heads, all rows) computed at
        each state, and the readout logits of each state.
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

    def loop_logits(self, tokens, n_loops: int | None = None):
        """Readout logits of every state $x_0..x_n$, shape `(n_loops + 1, n_classes)`."""
        n = self.config.n_loops if n_loops is None else int(n_loops)
        e = jax.vmap(self.embed)(tokens)
        dt = jnp.asarray(self.dt, e.dtype)

        def body(x, _):
            u, a, _, _ = self._attend(x, e)
            return x + dt * self._update(u, a), self._logits(x)

        x_n, logits = jax.lax.scan(body, jnp.zeros_like(e), length=n)
        return jnp.concatenate([logits, self._logits(x_n)[None]])

    def __call__(self, tokens, n_loops: int | None = None):
        return self.loop_logits(tokens, n_loops)[-1]

    def with_loops(self, n_loops: int) -> "LoopedTransformer":
        """The same weights as a model of `n_loops` loops at step `config.step / n_loops`
        (the same continuous depth c, discretized finer or coarser)."""
        return _with_config(self, dataclasses.replace(self.config, n_loops=int(n_loops)))


# --------------------------------------------------------------------------- training


def init_looped(config: LoopedConfig, key) -> LoopedTransformer:
    """`LoopedTransformer(config, key=key)`, built under one jit that every config with the
    same array sizes shares (the weights do not depend on the normalizer, the loop count
    or the step), so initializing models that differ only in those compiles once."""
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


def default_cache_dir() -> pathlib.Path:
    """`$FISHERDYN_CACHE`, else `~/.cache/fisherdyn` if writable, else `.cache/` in the repo."""
    env = os.environ.get("FISHERDYN_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    home = pathlib.Path("~/.cache/fisherdyn").expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return pathlib.Path(__file__).resolve().parent.parent / ".cache"


@dataclasses.dataclass(frozen=True)
class TrainedLooped:
    """The result of `train_looped`.

    `model` the trained `LoopedTransformer`; `accuracy` on a fixed held-out batch at the
    trained depth; `loss_history` (steps,) training losses; `seconds` wall time of the
    training run that produced the weights (compilation included; not of the cache load);
    `step_ms` the time per training step after compilation; `from_cache`; `path`
    of the cached weights (None if caching was off).
    """

    model: LoopedTransformer
    accuracy: float
    loss_history: np.ndarray
    seconds: float
    step_ms: float
    from_cache: bool
    path: str | None


def _loss_fn(model, tokens, labels, first):
    logits = jax.vmap(model.loop_logits)(tokens)[:, first:]  # (B, loops, C)
    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, labels[:, None, None], -1)[..., 0]
    return jnp.mean(nll)


_SHORT_RUN = 400  # training steps below which the step compiles at XLA level 0


@functools.lru_cache(maxsize=32)
def _training_step(config, batch, first, lr, weight_decay, steps):
    """(optimizer, compiled step) for one config and recipe, reused across calls."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr * 0.02)
    optim = optax.chain(optax.clip_by_global_norm(1.0),
                        optax.adamw(schedule, weight_decay=weight_decay))
    dtype = jnp.dtype(config.dtype)
    # a short run is dominated by compiling its step (see _compile.py)
    jit = functools.partial(eqx.filter_jit, **RUN_ONCE) if steps < _SHORT_RUN else eqx.filter_jit

    @jit
    def train_step(model, opt_state, k_data, i):
        data = recall_task(jr.fold_in(k_data, i), batch, config.n_pairs, config.dim,
                           config.corrupt, n_classes=config.classes, dtype=dtype)
        loss, grads = eqx.filter_value_and_grad(_loss_fn)(model, data.tokens, data.labels, first)
        params = eqx.filter(model, eqx.is_inexact_array)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(model, updates), opt_state, loss

    return optim, train_step


@functools.partial(eqx.filter_jit, **RUN_ONCE)
def _predict(model, tokens, n_loops):
    return jnp.argmax(jax.vmap(lambda t: model(t, n_loops))(tokens), -1).astype(jnp.int32)


@functools.partial(eqx.filter_jit, **RUN_ONCE)
def _trace_batch(model, tokens, n_loops):
    return jax.vmap(lambda t: model.trace(t, n_loops))(tokens)


def evaluate_looped(model: LoopedTransformer, key, batch: int = 1024, n_loops: int | None = None):
    """Recall accuracy on `batch` fresh problems from `key` after `n_loops` loops."""
    c = model.config
    data = recall_task(key, batch, c.n_pairs, c.dim, c.corrupt, n_classes=c.classes,
                       dtype=jnp.dtype(c.dtype))
    n = c.n_loops if n_loops is None else int(n_loops)
    pred = _predict(model, data.tokens, n)
    return float(np.mean(np.asarray(pred) == np.asarray(data.labels)))


def _cache_paths(config, recipe, cache_dir):
    blob = json.dumps({"v": _FORMAT_VERSION, "config": config.fingerprint(), "recipe": recipe},
                      sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
    stem = f"looped-{config.entropy.name.lower()}-{digest}"
    root = pathlib.Path(cache_dir)
    return root / f"{stem}.eqx", root / f"{stem}.json", blob


def _atomic_write(path: pathlib.Path, write):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _numeric_mode(config):
    """Train float32 models with x64 off and standard promotion whatever the caller's
    global flags: the weights (and the cache) then do not depend on them, and optax (which
    mixes int step counts with float constants) also runs under strict promotion."""
    stack = contextlib.ExitStack()
    if jnp.dtype(config.dtype).itemsize < 8:
        stack.enter_context(jax.enable_x64(False))
    elif not jax.config.jax_enable_x64:
        raise ValueError(f"dtype={config.dtype} needs jax.config.update('jax_enable_x64', True)")
    stack.enter_context(jax.numpy_dtype_promotion("standard"))
    return stack


def _optimize(model, config, k_data, *, steps, batch, lr, weight_decay, loss_from, progress):
    first = min(int(math.floor(loss_from * config.n_loops)), config.n_loops)
    hyper = (batch, first, lr, weight_decay, steps)
    try:
        hash(config)
        build = _training_step  # compiled once per (config, recipe), reused across calls
    except TypeError:  # array-valued entropy parameters: no reuse
        build = _training_step.__wrapped__
    optim, train_step = build(config, *hyper)
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    losses = np.zeros(steps)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"train {config.entropy!r}", leave=True)
    start = compiled = time.perf_counter()
    for i in range(steps):
        model, opt_state, loss = train_step(model, opt_state, k_data, jnp.asarray(i, jnp.int32))
        losses[i] = float(loss)
        if i == 0:
            compiled = time.perf_counter()
        if bar is not None:
            bar.update(1)
            if i % 25 == 0 or i == steps - 1:
                bar.set_postfix(loss=f"{losses[i]:.3f}")
    end = time.perf_counter()
    if bar is not None:
        bar.close()
    return model, losses, end - start, 1e3 * (end - compiled) / max(1, steps - 1)


def train_looped(
    config: LoopedConfig,
    *,
    seed: int = 0,
    steps: int = 1200,
    batch: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 1e-4,
    loss_from: float = 0.5,
    eval_batch: int = 1024,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    progress: bool = True,
) -> TrainedLooped:
    """Train a `LoopedTransformer` on `recall_task` with optax, deterministically from `seed`.

    AdamW with linear warmup and cosine decay, global-norm clipping at 1. Each step draws a
    fresh batch from `fold_in(key, step)`; the loss is the cross entropy of the readout
    averaged over loops `l >= loss_from * L` (the computation is trained to settle, not
    just to pass through the answer). Weights are cached with `eqx.tree_serialise_leaves`
    under `cache_dir` (default `default_cache_dir()`), keyed by a hash of the config and
    of this recipe; a cached model is loaded instead of retrained.

    **Arguments:**
    - `config`: a `LoopedConfig`.
    - `seed`: the only source of randomness (init, data, evaluation).
    - `steps`, `batch`, `lr`, `weight_decay`: optimization.
    - `loss_from`: fraction of the trained depth from which loops enter the loss.
    - `eval_batch`: held-out problems for the reported accuracy.
    - `cache_dir`, `use_cache`: weight cache location; `use_cache=False` neither reads
      nor writes it.
    - `progress`: show a tqdm progress bar and print the final accuracy.

    **Returns:** a `TrainedLooped` (`.model`, `.accuracy`, `.loss_history`, `.seconds`, ...).
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    recipe = dict(seed=int(seed), steps=int(steps), batch=int(batch), lr=float(lr),
                  weight_decay=float(weight_decay), loss_from=float(loss_from),
                  eval_batch=int(eval_batch))
    key = jr.PRNGKey(seed)
    k_init, k_data, k_eval = jr.split(key, 3)
    weights_path = meta_path = None
    if use_cache:
        weights_path, meta_path, blob = _cache_paths(
            config, recipe, default_cache_dir() if cache_dir is None else cache_dir)
        if weights_path.exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            with _numeric_mode(config):
                model = eqx.tree_deserialise_leaves(weights_path, _shell(config))
            if progress:
                print(f"train_looped: loaded {weights_path} (accuracy {meta['accuracy']:.3f})")
            return TrainedLooped(model, meta["accuracy"], np.asarray(meta["loss_history"]),
                                 meta["seconds"], meta["step_ms"], True, str(weights_path))

    with _numeric_mode(config):
        model = init_looped(config, k_init)
        model, losses, seconds, step_ms = _optimize(
            model, config, k_data, steps=int(steps), batch=int(batch), lr=float(lr),
            weight_decay=float(weight_decay), loss_from=float(loss_from), progress=progress)
        accuracy = evaluate_looped(model, k_eval, eval_batch)
    if progress:
        print(f"train_looped: {config.entropy!r} accuracy {accuracy:.3f} "
              f"({seconds:.1f} s, {step_ms:.1f} ms/step after compilation)")
    if use_cache:
        _atomic_write(weights_path, lambda f: eqx.tree_serialise_leaves(f, model))
        meta = dict(json.loads(blob), accuracy=accuracy, seconds=seconds, step_ms=step_ms,
                    loss_history=losses.tolist())
        _atomic_write(meta_path, lambda f: f.write(json.dumps(meta).encode()))
    return TrainedLooped(model, accuracy, losses, seconds, step_ms, False,
                         None if weights_path is None else str(weights_path))


# --------------------------------------------------------------------------- extraction


class LoopedPaths(eqx.Module):
    """Attention paths of a looped model, one row per loop (no truncation).

    - `attn` `(loops + 1, batch, heads, n_ctx)`: each head's full attention row of the
      query token at states $x_0..x_n$ (rows sum to 1; `n_ctx = n_pairs + 1`, the last
      entry is the query attending to itself). Row l is the attention that drives the
      step $x_l \to x_{l+1}$; the last one is computed at the final state.
    - `scores` same shape: the raw scores $z = q\\cdot k$ that produced them (the
      normalizer is `stationary(entropy, scores, T)`).
    - `logits` `(loops + 1, batch, n_classes)`: the readout at each state.
    - `t` `(loops + 1,)`: continuous depth $t_l = l\\,c/L$ (trained step).
    - `T`: the attention temperature; `entropy`: the normalizer; `n_trained`: L.
    - `labels`, `target` `(batch,)` when the inputs were a `RecallBatch` (else None).
    """

    attn: jax.Array
    scores: jax.Array
    logits: jax.Array
    t: jax.Array
    labels: jax.Array | None
    target: jax.Array | None
    T: float = eqx.field(static=True)
    entropy: AbstractEntropy = eqx.field(static=True)
    n_trained: int = eqx.field(static=True)

    @property
    def accuracy(self):
        """Recall accuracy per loop, `(loops + 1,)` (needs labels)."""
        if self.labels is None:
            raise ValueError("no labels: extract from a RecallBatch")
        hit = jnp.argmax(self.logits, -1).astype(self.labels.dtype) == self.labels[None]
        return jnp.mean(hit.astype(self.logits.dtype), axis=-1)


def extract_paths(model: LoopedTransformer, inputs, n_loops: int | None = None, *,
                  dtype=None, all_rows: bool = False) -> LoopedPaths:
    """Record the attention path of every head over `n_loops` loops at the trained step.

    Use `n_loops` = 2-4 x the trained depth to see whether the attention settles.

    **Arguments:**
    - `model`: a `LoopedTransformer`.
    - `inputs`: a `RecallBatch` or tokens `(batch, n_tok, token_dim)`.
    - `n_loops`: loops to run (default: the trained `model.n_loops`).
    - `dtype`: run in this float dtype (e.g. `jnp.float64` for fitting), casting weights
      and inputs; None keeps the model's.
    - `all_rows`: also keep every token's row: `attn`/`scores` then have shape
      `(loops + 1, batch, heads, n_tok, n_ctx)`.

    **Returns:** a `LoopedPaths`.
    """
    labels = target = None
    if isinstance(inputs, RecallBatch):
        tokens, labels, target = inputs
    else:
        tokens = jnp.asarray(inputs)
    if dtype is not None:
        dtype = jnp.dtype(dtype)
        if dtype.itemsize == 8 and not jax.config.jax_enable_x64:
            raise ValueError(f"dtype={dtype} needs jax.config.update('jax_enable_x64', True)")
        model = jax.tree_util.tree_map(
            lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)
    else:
        dtype = model.embed.weight.dtype
    tokens = tokens.astype(dtype)
    n = model.n_loops if n_loops is None else int(n_loops)
    tr = _trace_batch(model, tokens, n)
    attn = jnp.moveaxis(tr.attn, 1, 0)  # (loops+1, batch, heads, n_tok, n_tok)
    scores = jnp.moveaxis(tr.scores, 1, 0)
    if not all_rows:
        attn, scores = attn[..., -1, :], scores[..., -1, :]
    t = jnp.arange(n + 1, dtype=dtype) * jnp.asarray(model.dt, dtype)
    return LoopedPaths(attn, scores, jnp.moveaxis(tr.logits, 1, 0), t, labels, target,
                       model.T, model.entropy, model.n_loops)
