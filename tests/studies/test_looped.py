"""The weight-tied study's looped transformer: task, training determinism, cache, path
extraction.

Fast checks on a tiny model trained for a few steps; the real training budget is measured
by the studies, not here.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import weight_tied as wt

import fisherdyn as fd

ENTROPY = fd.Kaniadakis(0.3)
TINY = wt.LoopedConfig(n_pairs=4, dim=8, corrupt=0.25, d_model=16, n_heads=2, d_mlp=16,
                       n_loops=3, step=1.0, entropy=ENTROPY)
RECIPE = dict(seed=3, steps=4, batch=8, eval_batch=32, progress=False)


def _f64(model):
    return jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float64) if isinstance(x, jax.Array) else x, model)


def _leaves(model):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(model)]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fisherdyn-cache")


@pytest.fixture(scope="module")
def trained(cache_dir):
    return wt.train_looped(TINY, cache_dir=cache_dir, **RECIPE)


@pytest.fixture(scope="module")
def problems():
    return wt.recall_task(jr.PRNGKey(11), 6, TINY.n_pairs, TINY.dim, TINY.corrupt)


@pytest.fixture(scope="module")
def paths(trained, problems):
    # 2x the trained depth, float64
    return wt.extract_paths(trained.model, problems, 2 * TINY.n_loops, dtype=jnp.float64)


def test_recall_task_definition():
    # Reference: the task's definition (keys +-1, query = target key with exactly
    # round(corrupt * dim) flipped coordinates, label = the target pair's label); seeded.
    n_pairs, dim, corrupt = 5, 12, 0.25
    a = wt.recall_task(jr.PRNGKey(0), 7, n_pairs, dim, corrupt)
    b = wt.recall_task(jr.PRNGKey(0), 7, n_pairs, dim, corrupt)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    tok = np.asarray(a.tokens)
    assert tok.shape == (7, n_pairs + 1, dim + n_pairs + 1) and tok.dtype == np.float32
    keys, onehot, flag = tok[:, :-1, :dim], tok[:, :-1, dim:-1], tok[:, :, -1]
    assert set(np.unique(keys)) == {-1.0, 1.0}
    np.testing.assert_array_equal(flag, np.tile([0.0] * n_pairs + [1.0], (7, 1)))
    tgt = np.asarray(a.target)
    true_key = keys[np.arange(7), tgt]
    flips = np.sum(tok[:, -1, :dim] != true_key, -1)
    np.testing.assert_array_equal(flips, round(corrupt * dim))
    np.testing.assert_array_equal(np.argmax(onehot[np.arange(7), tgt], -1), np.asarray(a.labels))
    np.testing.assert_array_equal(tok[:, -1, dim:-1], 0.0)


def test_training_is_deterministic_and_cached(trained, cache_dir):
    # Reference: bitwise equality (same seed => same weights; the cache round-trips them).
    assert not trained.from_cache and trained.path is not None
    assert np.all(np.isfinite(trained.loss_history)) and 0.0 <= trained.accuracy <= 1.0
    again = wt.train_looped(TINY, cache_dir=cache_dir, **RECIPE)
    assert again.from_cache and again.path == trained.path
    assert again.accuracy == trained.accuracy
    fresh = wt.train_looped(TINY, use_cache=False, **RECIPE)
    assert not fresh.from_cache and fresh.path is None
    for x, y, z in zip(_leaves(trained.model), _leaves(again.model), _leaves(fresh.model)):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    np.testing.assert_array_equal(trained.loss_history, fresh.loss_history)
    # training moved the weights away from the seeded initialization
    init = wt.init_looped(TINY, jr.split(jr.PRNGKey(3), 3)[0])
    assert any(np.any(x != y) for x, y in zip(_leaves(init), _leaves(trained.model)))


def test_shared_init_and_with_loops(trained, problems):
    # Reference: the eager constructor. init_looped builds the weights under one jit shared
    # by every config of the same sizes: configs that differ only in normalizer and loop
    # count get bitwise the same weights, the constructor's up to float32 round-off (a
    # fused program may contract operations differently), and the config asked for.
    key = jr.PRNGKey(7)
    direct = wt.LoopedTransformer(TINY, key=key)
    other = wt.LoopedConfig(**{**vars(TINY), "entropy": fd.Tsallis(1.5), "n_loops": 5})
    built = [wt.init_looped(cfg, key) for cfg in (TINY, other)]
    for cfg, b in zip((TINY, other), built):
        assert b.config == cfg
    for x, y, z in zip(_leaves(direct), _leaves(built[0]), _leaves(built[1])):
        np.testing.assert_array_equal(y, z)
        np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-7)
    # with_loops: same weights, n loops at step c/n; at the trained count it is the model
    m2 = trained.model.with_loops(2 * TINY.n_loops)
    assert m2.n_loops == 2 * TINY.n_loops and m2.dt == pytest.approx(trained.model.dt / 2)
    for x, y in zip(_leaves(trained.model), _leaves(m2)):
        np.testing.assert_array_equal(x, y)
    same = trained.model.with_loops(TINY.n_loops)
    np.testing.assert_array_equal(
        np.asarray(wt.extract_paths(same, problems).attn),
        np.asarray(wt.extract_paths(trained.model, problems).attn))


def test_extraction_shapes_rows_and_scores(trained, problems, paths):
    # References: rows are probability vectors (sum 1 within 1e-12 in float64); recomputing
    # the normalizer `stationary(entropy, scores, T)` from the recorded scores reproduces
    # the recorded rows (1e-12); the readout at loop L equals the model's forward (1e-10).
    model = trained.model
    L = TINY.n_loops
    n = 2 * L
    assert paths.attn.shape == (n + 1, 6, TINY.n_heads, TINY.n_ctx)
    assert paths.scores.shape == paths.attn.shape and paths.attn.dtype == jnp.float64
    assert paths.logits.shape == (n + 1, 6, TINY.classes)
    np.testing.assert_allclose(np.asarray(paths.t), np.arange(n + 1) * TINY.step / L, atol=1e-15)
    assert paths.T == pytest.approx(np.sqrt(TINY.d_head)) and paths.n_trained == L
    attn = np.asarray(paths.attn)
    assert np.all(attn >= 0)
    np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=0, atol=1e-12)
    again = jax.jit(lambda s: fd.stationary(ENTROPY, s, paths.T))(paths.scores)
    np.testing.assert_allclose(np.asarray(again), attn, rtol=0, atol=1e-12)
    direct = jax.jit(jax.vmap(_f64(model)))(problems.tokens.astype(jnp.float64))
    np.testing.assert_allclose(np.asarray(paths.logits[L]), np.asarray(direct), atol=1e-10)
    assert paths.accuracy.shape == (n + 1,)
    # every row of every token, same loops; the query's row is the last one
    full = wt.extract_paths(model, problems, n, dtype=jnp.float64, all_rows=True)
    assert full.attn.shape == (n + 1, 6, TINY.n_heads, TINY.n_ctx, TINY.n_ctx)
    np.testing.assert_array_equal(np.asarray(full.attn[..., -1, :]), attn)
    np.testing.assert_allclose(np.asarray(full.attn).sum(-1), 1.0, rtol=0, atol=1e-12)


def test_first_loop_attention_is_fd_attention(trained, problems, paths):
    # Reference: `fd.attention_weights` applied by hand to the block's first input
    # (state x_0 = 0, so u = embedding), heads split from the projections; 1e-12 (float64).
    m = _f64(trained.model)
    tokens = problems.tokens.astype(jnp.float64)

    @jax.jit
    def first_rows(tok):
        y = jax.vmap(m.ln_attn)(jax.vmap(m.embed)(tok))

        def split(w):
            return jax.vmap(w)(y).reshape(-1, TINY.n_heads, TINY.d_head).swapaxes(0, 1)

        return fd.attention_weights(split(m.wq), split(m.wk), entropy=ENTROPY)[:, -1]

    rows = jax.vmap(first_rows)(tokens)
    np.testing.assert_allclose(np.asarray(paths.attn[0]), np.asarray(rows), rtol=0, atol=1e-12)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        wt.LoopedConfig(d_model=10, n_heads=3)
    with pytest.raises(TypeError, match="entropy"):
        wt.LoopedConfig(entropy="shannon")
    with pytest.raises(ValueError, match="corrupt"):
        wt.recall_task(jr.PRNGKey(0), 2, 3, 4, 0.5)
