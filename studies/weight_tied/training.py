"""Training a looped transformer on its task (the only module that imports optax).

The loss averages the readout's cross entropy over the later loops, so the computation is
trained to settle rather than to pass through the answer. Fixed-point (DEQ-style) training
draws the loop count per step, $n \\sim U\\{L_{lo}..L_{hi}\\}$ at the trained step $c/L$,
optionally penalizing the last loop's residual, relative $\\|x_n - x_{n-1}\\|^2/\\|x_n\\|^2$
or absolute (the mean square of $x_n - x_{n-1}$ per entry), so the loop is trained to
converge rather than to be read at one depth. The relative residual is also satisfied by a
stream that grows linearly without converging; the absolute one is not.
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
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax

from jaxtyping import Float

from .cache import atomic_write, cache_paths, default_cache_dir
from .jit import RUN_ONCE
from .model import LoopedConfig, LoopedTransformer, _shell, _with_config, init_looped
from .paths import evaluate_looped
from .task import task_batch

__all__ = ["DivergedStep", "TrainedLooped", "TrainingDiverged", "replay_divergence",
           "train_looped"]


@dataclasses.dataclass(frozen=True)
class TrainedLooped:
    """The result of `train_looped`.

    **Fields:**

    - `model`: the trained `LoopedTransformer`.
    - `accuracy`: on a fixed held-out batch at the trained depth.
    - `loss_history` `(steps,)`: training losses.
    - `seconds`: wall time of the training run that produced the weights (compilation
      included; not of the cache load); `step_ms`: the median time of a training step
      (compilations excluded).
    - `from_cache`: the weights were loaded; `path`: of the cached weights (None if caching
      was off).
    - `trained_by`: where and by which code the weights were trained: `host` (`host_of`)
      and `code` (`code_fingerprint`); None for weights cached before it was recorded.
    """

    model: LoopedTransformer
    accuracy: float
    loss_history: Float[np.ndarray, " steps"]
    seconds: float
    step_ms: float
    from_cache: bool
    path: str | None
    trained_by: dict | None = None


class TrainingDiverged(FloatingPointError):
    """A training step whose loss is not finite. `model` holds the weights before that
    step (all finite: the loss is computed from them), `step` its index in its stage
    (from 0) and `loops` its drawn loop count (None: the config's L), so the step can be
    replayed (`replay_divergence`)."""

    def __init__(self, message, model, step, loops):
        super().__init__(message)
        self.model, self.step, self.loops = model, step, loops


def _loss_fn(model, tokens, labels, first):
    logits = jax.vmap(model.loop_logits)(tokens)[:, first:]  # (B, loops, C)
    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, labels[:, None, None], -1)[..., 0]
    return jnp.mean(nll)


def _deq_loss_fn(model, tokens, labels, n, loss_from, n_max, penalty, absolute=False):
    """The loss at a drawn loop count n <= n_max: the cross entropy averaged over loops
    floor(loss_from n)..n, plus `penalty` times the mean residual of loop n (relative, or
    per entry when `absolute`).
    The scan runs n_max loops (one compiled program for every n <= n_max); loops past n get
    zero weight."""
    logits, xs, _ = jax.vmap(lambda t: model.run(t, n_max))(tokens)
    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, labels[:, None, None], -1)[..., 0]  # (B, n_max + 1)
    loop = jnp.arange(n_max + 1)
    first = jnp.minimum(jnp.floor(loss_from * n.astype(logits.dtype)).astype(n.dtype), n)
    w = ((loop >= first) & (loop <= n)).astype(logits.dtype)
    loss = jnp.mean(jnp.sum(nll * w, -1) / jnp.sum(w))
    if penalty:
        x_n = jnp.take(xs, n, axis=1)
        x_prev = jnp.take(xs, n - 1, axis=1)
        num = jnp.sum((x_n - x_prev) ** 2, (-2, -1))
        if absolute:
            den = jnp.asarray(x_n.shape[-2] * x_n.shape[-1], xs.dtype)
        else:
            den = jnp.sum(x_n**2, (-2, -1)) + jnp.finfo(xs.dtype).tiny
        loss = loss + penalty * jnp.mean(num / den)
    return loss


_SHORT_RUN = 400  # training steps below which the step compiles at XLA level 0
# Fixed-point training runs each step's scan to the shortest of this many lengths that
# covers its drawn n, not always to hi: the loops run follow the drawn n, for three more
# compiled steps.
_LOOP_BUCKETS = 4


def _loop_buckets(lo, hi):
    """The scan lengths of fixed-point training over n in lo..hi, increasing, ending at hi."""
    k = min(_LOOP_BUCKETS, hi - lo + 1)
    return sorted({lo + math.ceil((hi - lo) * j / k) for j in range(1, k + 1)} | {hi})


def _loop_counts(k_data, steps, lo, hi):
    """The loop count of every step, drawn from its own stream (`fold_in(step key, 1)`) so
    that the problems do not depend on it, `(steps,)` int."""
    draw = lambda i: jr.randint(jr.fold_in(jr.fold_in(k_data, i), 1), (), lo, hi + 1)  # noqa: E731
    return np.asarray(jax.vmap(draw)(jnp.arange(steps, dtype=jnp.int32)))


@functools.lru_cache(maxsize=32)
def _training_step(config, batch, first, lr, weight_decay, steps, n_max=None, loss_from=0.5,
                   penalty=0.0, absolute=False):
    """(optimizer, compiled step) for one config and recipe, reused across calls; `n_max`
    selects the fixed-point loss at the step's loop count `n <= n_max` (an argument), the
    scan running n_max loops."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr * 0.02)
    optim = optax.chain(optax.clip_by_global_norm(1.0),
                        optax.adamw(schedule, weight_decay=weight_decay))
    # a short run spends more time compiling its step than running it
    jit = functools.partial(eqx.filter_jit, **RUN_ONCE) if steps < _SHORT_RUN else eqx.filter_jit

    @jit
    def train_step(model, opt_state, k_data, i, n=None):
        data = task_batch(config, jr.fold_in(k_data, i), batch)
        if n_max is None:
            loss, grads = eqx.filter_value_and_grad(_loss_fn)(model, data.tokens, data.labels,
                                                              first)
        else:
            loss, grads = eqx.filter_value_and_grad(_deq_loss_fn)(
                model, data.tokens, data.labels, n, loss_from, n_max, penalty, absolute)
        params = eqx.filter(model, eqx.is_inexact_array)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(model, updates), opt_state, loss

    return optim, train_step


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


def _optimize(model, config, k_data, *, steps, batch, lr, weight_decay, loss_from, progress,
              loops=None, residual_penalty=0.0, absolute=False):
    first = min(int(math.floor(loss_from * config.n_loops)), config.n_loops)
    hyper = (batch, first, lr, weight_decay, steps)
    try:
        hash(config)
        build = _training_step  # compiled once per (config, recipe), reused across calls
    except TypeError:  # array-valued entropy parameters: no reuse
        build = _training_step.__wrapped__
    if loops is None:
        optim, step = build(config, *hyper)
        steps_for = lambda n: step  # noqa: E731
        counts = [None] * steps
    else:
        # a short run would spend the saving on compiling the other lengths
        buckets = _loop_buckets(*loops) if steps >= _SHORT_RUN else [loops[1]]
        built = {b: build(config, *hyper, b, loss_from, residual_penalty, absolute)
                 for b in buckets}
        optim = built[buckets[-1]][0]  # the same schedule for every length
        compiled = {b: step for b, (_, step) in built.items()}
        counts = _loop_counts(k_data, steps, *loops)
        steps_for = lambda n: compiled[next(b for b in buckets if b >= n)]  # noqa: E731
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    losses = np.zeros(steps)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"train {config.entropy!r}", leave=True)
    durations = np.zeros(steps)
    start = last = time.perf_counter()
    for i in range(steps):
        n = counts[i]
        args = () if n is None else (jnp.asarray(n, jnp.int32),)
        before = model
        model, opt_state, loss = steps_for(n)(model, opt_state, k_data,
                                              jnp.asarray(i, jnp.int32), *args)
        losses[i] = float(loss)
        if not np.isfinite(losses[i]):
            # a diverged model is never cached or returned: every later step would be NaN too
            raise TrainingDiverged(
                f"training diverged: the loss is {losses[i]} at step {i + 1} of {steps} "
                f"({config.entropy!r}, loop_kind {config.loop_kind!r}); no weights were cached. "
                + carried_rates(before, config)
                + "Try a smaller learning rate; for a Fisher loop, whose explicit RK4 substeps "
                "must resolve the rates it learns, also more substeps or a larger mass",
                before, i, None if n is None else int(n))
        now = time.perf_counter()
        durations[i], last = now - last, now
        if bar is not None:
            bar.update(1)
            if i % 25 == 0 or i == steps - 1:
                bar.set_postfix(loss=f"{losses[i]:.3f}")
    if bar is not None:
        bar.close()
    # the median step: the first step of each compiled length is its compilation
    return model, losses, last - start, 1e3 * float(np.median(durations))


def carried_parameters(model, config) -> dict | None:
    """A carried loop's learned `mass`, `damping` and `T` per head (lists), and for a Fisher
    loop `substep_damping_rate`, h * damping/mass of its RK4 substep (stable up to 2.785);
    None for the plain transformer."""
    if config.loop_kind == "transformer":
        return None
    p = model.dynamics_parameters()
    out = {k: np.asarray(p[k]).tolist() for k in ("mass", "damping", "T")}
    if config.loop_kind == "fisher":
        out["substep_damping_rate"] = (config.substep * p["damping"] / p["mass"]).tolist()
    return out


def carried_rates(model, config) -> str:
    """A sentence on a Fisher loop's learned mass, damping and substep rate per head (for
    the error of a diverged training); empty for other loops."""
    if config.loop_kind != "fisher":
        return ""
    p = carried_parameters(model, config)
    fmt = lambda a: ", ".join(f"{v:.4g}" for v in a)  # noqa: E731
    return (f"Before that step the heads' mass was {fmt(p['mass'])}, their damping "
            f"{fmt(p['damping'])}, so h * damping/mass = {fmt(p['substep_damping_rate'])} "
            f"(at the start {config.substep * config.damping / config.mass:.3g}). ")


def _curriculum_configs(config, curriculum):
    """The configs of a curriculum's stages `(nodes, hops, steps)`, checked: `[(config,
    steps)]`."""
    stages = []
    for stage in curriculum:
        if len(stage) != 3 or config.task != "pointer":
            raise ValueError("a curriculum is stages (nodes, hops, steps) of the pointer task, "
                             f"got {stage!r} for task {config.task!r}")
        nodes, hops, n = (int(v) for v in stage)
        if nodes < 2 or hops < 1 or n < 1:
            raise ValueError(f"a curriculum stage needs nodes >= 2, hops >= 1, steps >= 1; "
                             f"got {stage!r}")
        c = dataclasses.replace(config, n_pairs=nodes, hops=hops)
        if c.token_dim != config.token_dim:
            raise ValueError(f"the stage {stage!r} changes the token layout (labels follow the "
                             "node count): set config.n_classes")
        stages.append((c, n))
    return stages


def _load(config, weights_path, meta_path, progress):
    """The cached `TrainedLooped`, or None when the cache holds no such model."""
    if not (weights_path.exists() and meta_path.exists()):
        return None
    meta = json.loads(meta_path.read_text())
    with _numeric_mode(config):
        model = eqx.tree_deserialise_leaves(weights_path, _shell(config))
    if progress:
        print(f"train_looped: loaded {weights_path} (accuracy {meta['accuracy']:.3f})")
    return TrainedLooped(model, meta["accuracy"], np.asarray(meta["loss_history"]),
                         meta["seconds"], meta["step_ms"], True, str(weights_path),
                         meta.get("trained_by"))


def _store(trained, weights_path, meta_path, blob):
    """Write the weights and their metadata (each file atomically)."""
    atomic_write(weights_path, lambda f: eqx.tree_serialise_leaves(f, trained.model))
    meta = dict(json.loads(blob), accuracy=trained.accuracy, seconds=trained.seconds,
                step_ms=trained.step_ms, loss_history=trained.loss_history.tolist(),
                trained_by=trained.trained_by)
    atomic_write(meta_path, lambda f: f.write(json.dumps(meta).encode()))


def host_of() -> dict:
    """Where a result was computed: JAX's version, its backend and the processor. The same
    seed trains to different weights on a processor whose floating-point kernels differ."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            info = {k.strip(): v.strip() for k, v in
                    (line.split(":", 1) for line in f if ":" in line)}  # the last core's
    except OSError:  # not Linux
        info = {}
    cpu = info.get("model name", cpu)
    cpu += " (AVX-512)" if "avx512f" in info.get("flags", "").split() else ""
    host = dict(jax=jax.__version__, backend=jax.default_backend(), cpu=cpu)
    if "cpu family" in info and "model" in info:  # a virtual machine's name may not tell
        host["cpu_id"] = f"family {info['cpu family']}, model {info['model']}"
    return host


def source_fingerprint(roots) -> str:
    """The first 16 hex digits of the SHA-256 of the `*.py` files under `roots` (package
    directories), each with its path relative to its root's parent: where the packages
    lie does not enter."""
    h = hashlib.sha256()
    for root in map(pathlib.Path, roots):
        for path in sorted(root.rglob("*.py")):
            h.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.cache
def code_fingerprint() -> str:
    """`source_fingerprint` of the code that trains a model: the installed `fisherdyn`
    package and this study package.

    The weight cache is keyed by the design and the recipe, not by the code, yet a formula
    rewritten to round differently changes a training's last bits, which training
    amplifies into other weights; the fingerprint says which code trained them."""
    import fisherdyn

    return source_fingerprint([pathlib.Path(fisherdyn.__file__).parent,
                               pathlib.Path(__file__).parent])


def trained_by() -> dict:
    """The record a training leaves beside its weights: `host_of()` and
    `code_fingerprint()`."""
    return dict(host=host_of(), code=code_fingerprint())


def divergence_path(weights_path: pathlib.Path) -> pathlib.Path:
    """The cache's record of a training that diverged, beside the weights it did not write."""
    return weights_path.with_name(weights_path.stem + ".diverged.json")


def _diverged_weights_path(weights_path: pathlib.Path) -> pathlib.Path:
    return weights_path.with_name(weights_path.stem + ".diverged.eqx")


def _record_divergence(weights_path, blob, message, model, where):
    atomic_write(_diverged_weights_path(weights_path),
                 lambda f: eqx.tree_serialise_leaves(f, model))
    record = dict(json.loads(blob), message=message, **where)
    atomic_write(divergence_path(weights_path),
                 lambda f: f.write(json.dumps(record).encode()))


def _plan(config, *, seed, steps, batch, lr, weight_decay, loss_from, eval_batch, loops,
          residual_penalty, residual, curriculum):
    """`train_looped`'s arguments checked: `(loops, stages, recipe)`, the loop range (None:
    the config's L), the curriculum's `[(config, steps)]` and the recipe its cache key
    holds."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    if loops is not None and not isinstance(loops, int):
        loops = (int(loops[0]), int(loops[1]))
        if not 1 <= loops[0] <= loops[1]:
            raise ValueError(f"loops must be (lo, hi) with 1 <= lo <= hi, got {loops}")
    elif loops is not None and int(loops) != config.n_loops:
        raise ValueError(f"loops={loops} as an int must be config.n_loops={config.n_loops}; "
                         "use (lo, hi) for fixed-point training")
    else:
        loops = None
    if residual_penalty and loops is None:
        raise ValueError("residual_penalty needs loops=(lo, hi)")
    if residual not in ("relative", "absolute"):
        raise ValueError(f"residual must be 'relative' or 'absolute', got {residual!r}")
    stages = _curriculum_configs(config, curriculum)
    recipe = dict(seed=int(seed), steps=int(steps), batch=int(batch), lr=float(lr),
                  weight_decay=float(weight_decay), loss_from=float(loss_from),
                  eval_batch=int(eval_batch))
    if loops is not None:  # only then in the key: the plain recipe keeps its cached weights
        recipe.update(loops=list(loops), residual_penalty=float(residual_penalty))
        if residual != "relative":  # only then: earlier recipes keep their cached weights
            recipe.update(residual=residual)
    if stages:  # only then: recipes without a curriculum keep their cached weights
        recipe.update(curriculum=[[c.n_pairs, c.hops, n] for c, n in stages])
    return loops, stages, recipe


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
    loops: int | tuple[int, int] | None = None,
    residual_penalty: float = 0.0,
    residual: str = "relative",
    curriculum: tuple[tuple[int, int, int], ...] = (),
    cached_only: bool = False,
) -> TrainedLooped:
    """Train a `LoopedTransformer` on its task (`config.task`: `recall_task` or
    `pointer_task`) with optax, deterministically from `seed`.

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
    - `loops`: None (or L) trains at the config's L loops. `(lo, hi)`: fixed-point
      (DEQ-style) training, each step at a loop count $n$ drawn uniformly from
      `lo..hi` (e.g. `(L, 3 * L)`) at the trained step $c/L$, the loss averaged over loops
      `floor(loss_from * n)..n`. With `steps >= 400` a step runs the shortest of four
      scan lengths up to `hi` that covers its n (the loops past n carry zero weight).
    - `residual_penalty`: with `loops = (lo, hi)`, adds this times the mean relative
      residual of the last loop: `residual="relative"`,
      $\\|x_n - x_{n-1}\\|^2/\\|x_n\\|^2$, or `"absolute"`, the mean of $(x_n - x_{n-1})^2$
      over the stream's entries (only the absolute residual rules out a stream that grows
      linearly).
    - `curriculum`: stages `(nodes, hops, steps)` of the pointer task trained in order,
      with the same recipe, before the `steps` on the config's own task; each stage has its
      own learning-rate schedule and data stream. Smaller problems first give the lookups
      a gradient: on 8 nodes from scratch a model learns only the most-frequent-label
      shortcut, after 4 nodes it follows the links (docs/guides/weight_tied.md). The
      stages must keep the token layout, so `config.n_classes` must be set when the node
      count changes.

    - `cached_only`: load the cached weights and never train; a model not in the cache
      raises `LookupError`, or `FloatingPointError` with the recorded message where its
      training diverged.

    A training whose loss turns NaN raises `FloatingPointError` (with the step and, for a
    Fisher loop, the learned rates) and caches no weights, only a record of the divergence
    (`divergence_path`); an ordinary call trains such a model again (the record is removed
    when that succeeds).

    The reported accuracy is at the trained L loops in either case.

    **Returns:**

    A `TrainedLooped` (`.model`, `.accuracy`, `.loss_history`, `.seconds`, ...).
    """
    loops, stages, recipe = _plan(config, seed=seed, steps=steps, batch=batch, lr=lr,
                                  weight_decay=weight_decay, loss_from=loss_from,
                                  eval_batch=eval_batch, loops=loops,
                                  residual_penalty=residual_penalty, residual=residual,
                                  curriculum=curriculum)
    k_init, k_data, k_eval = jr.split(jr.PRNGKey(seed), 3)
    if use_cache:
        root = default_cache_dir() if cache_dir is None else cache_dir
        weights_path, meta_path, blob = cache_paths(config.fingerprint(), config.entropy.name,
                                                    recipe, root)
        cached = _load(config, weights_path, meta_path, progress)
        if cached is not None:
            return cached
        diverged = divergence_path(weights_path)
        if cached_only and diverged.exists():
            record = json.loads(diverged.read_text())
            raise FloatingPointError(f"{record['message']} (recorded in {diverged})")
    if cached_only:
        raise LookupError(f"no cached weights for seed {seed} of this design and recipe"
                          + (f" ({weights_path.name})" if use_cache else " (cache off)"))
    recipe_kw = dict(batch=int(batch), lr=float(lr), weight_decay=float(weight_decay),
                     loss_from=float(loss_from), progress=progress, loops=loops,
                     residual_penalty=float(residual_penalty), absolute=residual == "absolute")
    with _numeric_mode(config):
        model = init_looped(config, k_init)
        history, seconds = [], 0.0
        try:
            for j, (stage, n) in enumerate(stages):
                model, losses, sec, _ = _optimize(_with_config(model, stage), stage,
                                                  jr.fold_in(k_data, 1 + j), steps=n,
                                                  **recipe_kw)
                history.append(losses)
                seconds += sec
            model, losses, sec, step_ms = _optimize(_with_config(model, config), config,
                                                    k_data, steps=int(steps), **recipe_kw)
        except TrainingDiverged as err:
            where = f"stage {len(history) + 1} of {len(stages) + 1}: " if stages else ""
            who = trained_by()
            host = who["host"]
            # the same seed diverges at another step (or not at all) on another processor
            message = f"{err} (on {host['cpu']}, JAX {host['jax']}, {host['backend']})"
            if use_cache:
                # an hour's training that diverged is a result too: `cached_only` reports it,
                # and the weights before the step let `replay_divergence` take it apart
                _record_divergence(weights_path, blob, where + message, err.model,
                                   dict(stage=len(history), step=err.step, loops=err.loops,
                                        **who))
            raise FloatingPointError(where + message) from None
        losses, seconds = np.concatenate(history + [losses]), seconds + sec
        accuracy = evaluate_looped(model, k_eval, eval_batch)
    if progress:
        print(f"train_looped: {config.entropy!r} accuracy {accuracy:.3f} "
              f"({seconds:.1f} s, median step {step_ms:.1f} ms)")
    trained = TrainedLooped(model, accuracy, losses, seconds, step_ms, False,
                            str(weights_path) if use_cache else None, trained_by())
    if use_cache:
        _store(trained, weights_path, meta_path, blob)
        divergence_path(weights_path).unlink(missing_ok=True)
        _diverged_weights_path(weights_path).unlink(missing_ok=True)
    return trained


@dataclasses.dataclass(frozen=True)
class DivergedStep:
    """The training step at which a `train_looped` run diverged, rebuilt from its record.

    **Fields:** `record` (the cache's record: message, stage, step, loops, host); `model`
    (the weights before the step, under its stage's config); `tokens`, `labels` (the
    step's batch); `loops` (its drawn loop count n) and `scan_loops` (the loops its
    compiled step ran, n or more: loops past n carry zero weight in the loss);
    `loss_terms` (`loss_from`, `penalty`, `absolute`); `loss`, the loss recomputed here.
    """

    record: dict
    model: LoopedTransformer
    tokens: np.ndarray
    labels: np.ndarray
    loops: int
    scan_loops: int
    loss_terms: dict
    loss: float

    def loss_under(self, **changes) -> float:
        """The step's loss from the same weights and batch under the model's config with
        `changes` (e.g. `substeps=10`: the same dynamics on finer RK4 substeps). One form
        serves both recipes: without a loop range it is the plain loss (n = L, no penalty)."""
        config = dataclasses.replace(self.model.config, **changes)
        model = _with_config(self.model, config)
        t = self.loss_terms
        with _numeric_mode(config):
            return float(eqx.filter_jit(_deq_loss_fn)(
                model, jnp.asarray(self.tokens), jnp.asarray(self.labels),
                jnp.asarray(self.loops, jnp.int32), t["loss_from"], self.scan_loops,
                t["penalty"], t["absolute"]))


def replay_divergence(config: LoopedConfig, *, seed: int = 0, steps: int = 1200,
                      batch: int = 64, lr: float = 3e-3, weight_decay: float = 1e-4,
                      loss_from: float = 0.5, eval_batch: int = 1024,
                      cache_dir: str | os.PathLike | None = None,
                      loops: int | tuple[int, int] | None = None,
                      residual_penalty: float = 0.0, residual: str = "relative",
                      curriculum: tuple[tuple[int, int, int], ...] = ()) -> DivergedStep:
    """The step at which `train_looped` with these arguments diverged: the weights before
    it, its batch and loop count, and its loss recomputed from them (a `DivergedStep`).

    Raises `LookupError` where the cache holds no such record (the training did not
    diverge, was not run here, or diverged before its record kept the weights).
    """
    loops, stages, recipe = _plan(config, seed=seed, steps=steps, batch=batch, lr=lr,
                                  weight_decay=weight_decay, loss_from=loss_from,
                                  eval_batch=eval_batch, loops=loops,
                                  residual_penalty=residual_penalty, residual=residual,
                                  curriculum=curriculum)
    root = default_cache_dir() if cache_dir is None else cache_dir
    weights_path, _, _ = cache_paths(config.fingerprint(), config.entropy.name, recipe, root)
    record_path, model_path = divergence_path(weights_path), _diverged_weights_path(weights_path)
    if not (record_path.exists() and model_path.exists()):
        raise LookupError(f"no recorded divergence with its weights for seed {seed} of this "
                          f"design and recipe ({record_path.name})")
    record = json.loads(record_path.read_text())
    j, i = int(record["stage"]), int(record["step"])
    stage, n_steps = (stages + [(config, int(steps))])[j]
    _, k_data, _ = jr.split(jr.PRNGKey(seed), 3)
    k_stage = jr.fold_in(k_data, 1 + j) if j < len(stages) else k_data
    with _numeric_mode(stage):
        model = eqx.tree_deserialise_leaves(model_path, _shell(stage))
        data = task_batch(stage, jr.fold_in(k_stage, i), int(batch))
        if loops is None:
            n = scan = stage.n_loops
        else:
            n = int(record["loops"])
            buckets = _loop_buckets(*loops) if n_steps >= _SHORT_RUN else [loops[1]]
            scan = next(b for b in buckets if b >= n)
    terms = dict(loss_from=float(loss_from), penalty=float(residual_penalty),
                 absolute=residual == "absolute")
    step = DivergedStep(record, model, np.asarray(data.tokens), np.asarray(data.labels), n,
                        scan, terms, float("nan"))
    return dataclasses.replace(step, loss=step.loss_under())
