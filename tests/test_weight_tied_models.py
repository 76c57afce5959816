"""The weight-tied study's models, tasks and training: the pointer-chasing task, the
carried-attention controls (Fisher dynamics, linear score dynamics), fixed-point training
and its diagnostics.

Imports from the private modules until the names are exported.
"""

import dataclasses

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import fisherdyn as fd
from fisherdyn._weight_tied._model import LoopedConfig, init_looped
from fisherdyn._weight_tied._task import PointerBatch, pointer_task, task_batch


def _follow(tokens, dim, hops):
    """Plain-numpy pointer following: match keys by equality, token by token."""
    out_labels, out_target, out_chain = [], [], []
    for tok in tokens:
        ctx, q = tok[:-1], tok[-1]
        src, dst, lab = ctx[:, :dim], ctx[:, dim:2 * dim], ctx[:, 2 * dim:-1]
        cur = q[:dim]
        chain = []
        for _ in range(hops):
            hits = np.flatnonzero(np.all(src == cur, axis=1))
            assert hits.size >= 1
            i = hits[0]
            chain.append(i)
            cur = dst[i]
        out_chain.append(chain)
        out_target.append(chain[-1])
        out_labels.append(np.argmax(lab[chain[-1]]))
    return np.array(out_labels), np.array(out_target), np.array(out_chain)


@pytest.mark.parametrize("hops", [1, 2, 3, 5])
def test_pointer_task_matches_numpy_following(hops):
    # Reference: following the links in plain numpy by key equality (dim = 24 makes a
    # key collision among 6 nodes a ~1e-6 event, so the lookup is unambiguous).
    n_nodes, dim, batch = 6, 24, 64
    b = pointer_task(jr.PRNGKey(hops), batch, n_nodes, hops, dim)
    assert isinstance(b, PointerBatch)
    tok = np.asarray(b.tokens)
    assert tok.shape == (batch, n_nodes + 1, 2 * dim + n_nodes + 1) and tok.dtype == np.float32
    np.testing.assert_array_equal(tok[:, :, -1], np.tile([0.0] * n_nodes + [1.0], (batch, 1)))
    labels, target, chain = _follow(tok, dim, hops)
    np.testing.assert_array_equal(np.asarray(b.labels), labels)
    np.testing.assert_array_equal(np.asarray(b.target), target)
    np.testing.assert_array_equal(np.asarray(b.chain), chain)
    # one cycle through all nodes: the chain never revisits a node within n_nodes hops
    if hops <= n_nodes:
        assert all(len(set(c)) == hops for c in chain)
    # seeded and pure
    again = pointer_task(jr.PRNGKey(hops), batch, n_nodes, hops, dim)
    for x, y in zip(b, again):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_pointer_one_hop_is_lookup_and_links_form_one_cycle():
    # Reference: the definition. hops = 1: the label is the one stored on the token whose
    # first key is the query key (a one-hop lookup); following n_nodes links returns to
    # the start (a single cycle), and fewer never does.
    n_nodes, dim = 7, 20
    b1 = pointer_task(jr.PRNGKey(0), 50, n_nodes, 1, dim)
    tok = np.asarray(b1.tokens)
    for t, lab, tgt in zip(tok, np.asarray(b1.labels), np.asarray(b1.target)):
        i = np.flatnonzero(np.all(t[:-1, :dim] == t[-1, :dim], axis=1))[0]
        assert i == tgt and np.argmax(t[i, 2 * dim:-1]) == lab
    full = pointer_task(jr.PRNGKey(0), 50, n_nodes, n_nodes + 1, dim)
    chain = np.asarray(full.chain)
    np.testing.assert_array_equal(chain[:, n_nodes], chain[:, 0])
    assert all(len(set(c[:n_nodes])) == n_nodes for c in chain)
    # corrupt flips exactly round(corrupt * dim) query bits
    bc = pointer_task(jr.PRNGKey(0), 50, n_nodes, 2, dim, corrupt=0.25)
    t = np.asarray(bc.tokens)
    start = np.asarray(bc.chain)[:, 0]
    flips = np.sum(t[np.arange(50), start, :dim] != t[:, -1, :dim], -1)
    np.testing.assert_array_equal(flips, 5)


def test_config_selects_task():
    cfg = LoopedConfig(n_pairs=5, dim=8, task="pointer", hops=2, d_model=16, n_heads=2,
                       d_mlp=16, n_loops=3)
    assert cfg.token_dim == 2 * 8 + 5 + 1
    b = task_batch(cfg, jr.PRNGKey(1), 4)
    assert isinstance(b, PointerBatch) and b.tokens.shape == (4, 6, cfg.token_dim)
    model = init_looped(cfg, jr.PRNGKey(0))
    assert jax.vmap(model)(b.tokens).shape == (4, 5)
    # defaults keep the recall task, and leave the fingerprint as before the new fields
    base = LoopedConfig()
    assert base.task == "recall" and "task" not in base.fingerprint()
    assert cfg.fingerprint()["task"] == "pointer" and cfg.fingerprint()["hops"] == 2
    with pytest.raises(ValueError, match="task"):
        LoopedConfig(task="sorting")
    with pytest.raises(ValueError, match="hops"):
        LoopedConfig(hops=2)  # recall has one hop
    with pytest.raises(ValueError, match="loop_kind"):
        LoopedConfig(loop_kind="rnn")
