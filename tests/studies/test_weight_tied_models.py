"""The weight-tied study's models, tasks and training (`studies/weight_tied`): the
pointer-chasing task, the carried-attention controls (Fisher dynamics, linear score
dynamics) inside the looped model, fixed-point training and its diagnostics. The carried
layers and their dynamics alone are library tests: tests/test_fisher_loop.py.
"""

import dataclasses
import json
import pathlib
import re

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import weight_tied as wt

import fisherdyn as fd
from weight_tied.model import LoopedConfig, init_looped
from weight_tied.task import PointerBatch, pointer_task, task_batch


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


@pytest.mark.parametrize("n_classes", [8, 20])
def test_pointer_task_distinct_labels(n_classes):
    # References: numpy following (as above) still gives labels, targets and chains; each
    # problem's node labels (read off the context's one-hots) are distinct, and every class
    # is used (chi-square-free check: each of n_classes appears across 512 problems); fewer
    # classes than nodes is refused.
    n_nodes, dim, hops = 8, 24, 3
    b = pointer_task(jr.PRNGKey(9), 512, n_nodes, hops, dim, n_classes=n_classes,
                     distinct_labels=True)
    tok = np.asarray(b.tokens)
    labels, target, chain = _follow(tok, dim, hops)
    np.testing.assert_array_equal(np.asarray(b.labels), labels)
    np.testing.assert_array_equal(np.asarray(b.chain), chain)
    ctx_labels = np.argmax(tok[:, :-1, 2 * dim:-1], -1)
    assert all(len(set(row)) == n_nodes for row in ctx_labels)
    assert set(ctx_labels.ravel()) == set(range(n_classes))
    with pytest.raises(ValueError, match="distinct"):
        pointer_task(jr.PRNGKey(9), 2, n_nodes, hops, dim, n_classes=4, distinct_labels=True)


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
    assert jax.eval_shape(jax.vmap(model), b.tokens).shape == (4, 5)
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


# ---------------------------------------------------------------------------------------
# positive control: the attention is the damped Fisher-Lagrangian dynamics

from fisherdyn import FisherLoop, linear_score_dynamics  # noqa: E402


def _f64(model):
    return jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float64) if eqx_is_float(x) else x, model)


def eqx_is_float(x):
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)


FISHER_TINY = LoopedConfig(n_pairs=4, dim=8, task="pointer", hops=2, d_model=16, n_heads=2,
                           d_mlp=16, n_loops=4, step=1.0, loop_kind="fisher", mass=0.6,
                           damping=0.9, substeps=6)


def _pointer_problems(cfg):
    """The problems every FISHER_TINY-sized test extracts paths on (one compiled trace per
    model kind across the tests)."""
    return pointer_task(jr.PRNGKey(2), 2, cfg.n_pairs, cfg.hops, cfg.dim, dtype=jnp.float64)


def test_fisher_model_attention_follows_simulate_piecewise():
    # Reference: fd.simulate run loop by loop (rtol 1e-10) from the previous loop's
    # (rho, rho_dot), each loop holding that loop's recorded scores: the model's recorded
    # attention must be the dynamics with a zero-order hold of its own scores, at t_{l+1}.
    # Tolerance 1e-6 (RK4 with 6 substeps of 0.25/6, as above).
    cfg = FISHER_TINY
    model = _f64(init_looped(cfg, jr.PRNGKey(1)))
    paths = wt.extract_paths(model, _pointer_problems(cfg), dtype=jnp.float64)
    assert paths.loop_kind == "fisher"
    np.testing.assert_allclose(np.asarray(paths.attn_t), np.asarray(paths.t) + model.dt)
    par = model.dynamics_parameters()
    np.testing.assert_allclose(par["mass"], 0.6, rtol=1e-6)
    np.testing.assert_allclose(par["damping"], 0.9, rtol=1e-6)
    np.testing.assert_allclose(par["T"], model.T)
    n_ctx = cfg.n_ctx
    sim = jax.jit(lambda z, r, rd: fd.simulate(
        cfg.entropy, z, model.T, mass=0.6, damping=0.9, rho0=r, velocity0=rd, t1=model.dt,
        saveat=2, rtol=1e-10, atol=1e-12))
    for b in range(1):
        for h in range(cfg.n_heads):
            rho, rho_dot = jnp.full(n_ctx, 1 / n_ctx), jnp.zeros(n_ctx)
            for l in range(cfg.n_loops + 1):
                tr = sim(paths.scores[l, b, h], rho, rho_dot)
                rho, rho_dot = tr.rho_final, tr.rho_dot_final
                np.testing.assert_allclose(np.asarray(paths.attn[l, b, h]), np.asarray(rho),
                                           rtol=0, atol=1e-6)


def test_frozen_score_fisher_model_is_one_relaxation_and_its_modes_are_the_spectrum():
    # With frozen scores the loop's attention is one damped relaxation toward fixed scores.
    # Reference 1: a single fd.simulate over the whole depth (rtol 1e-10), sampled at every
    # loop end (tolerance 1e-6: RK4, 6 substeps of 0.25/6 per loop). Reference 2: the
    # eigenvalues of the loop map's Jacobian with an attention component are exp(s h) for
    # the roots s of relaxation_spectrum at the fixed point (the state is block triangular:
    # the carried attention does not see the residual stream), so linear_response's
    # errors are round-off (< 1e-4: the fixed point is reached to ~1e-9 after 400 loops).
    cfg = dataclasses.replace(FISHER_TINY, frozen_scores=True, entropy=fd.Kaniadakis(0.3))
    model = _f64(init_looped(cfg, jr.PRNGKey(1)))
    probs = _pointer_problems(cfg)
    paths = wt.extract_paths(model, probs, dtype=jnp.float64)
    z = paths.scores[0, 0]
    np.testing.assert_allclose(np.asarray(paths.scores[:, 0]),
                               np.broadcast_to(np.asarray(z), paths.scores[:, 0].shape),
                               rtol=0, atol=1e-12)
    ts = np.asarray(paths.attn_t)
    for h in range(cfg.n_heads):
        tr = fd.simulate(cfg.entropy, z[h], model.T, mass=0.6, damping=0.9, t1=float(ts[-1]),
                         saveat=jnp.asarray(ts), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(paths.attn[:, 0, h]), np.asarray(tr.rho),
                                   rtol=0, atol=1e-6)
    rep = wt.fixed_point_report(model, probs.tokens[:1], 400, n_inits=1)
    assert float(rep.carry_residual[0]) < 1e-8
    for h in range(cfg.n_heads):
        lr = wt.linear_response(rep.jacobian[0], rep.attn[0, h], cfg.entropy, model.T,
                                step=model.dt, readout=rep.attn_jacobian[0, h],
                                scores=rep.scores[0, h])
        assert lr.max_error < 1e-4, lr.errors
        np.testing.assert_allclose(lr.mass, 0.6, rtol=1e-4)
        np.testing.assert_allclose(lr.damping, 0.9, rtol=1e-4)


@pytest.mark.slow
def test_fisher_model_trains_with_finite_gradients():
    # Reference: finite differences of the loss in the learned mass of head 0 (central,
    # step 1e-5, float64: truncation ~1e-10, agreement to 1e-5 relative); every gradient
    # leaf finite and the dynamics parameters' gradients nonzero.
    from weight_tied.training import _loss_fn

    cfg = FISHER_TINY
    model = _f64(init_looped(cfg, jr.PRNGKey(1)))
    probs = pointer_task(jr.PRNGKey(3), 8, cfg.n_pairs, cfg.hops, cfg.dim, dtype=jnp.float64)
    # one compiled program for the gradient and the finite differences' values
    value_and_grad = jax.jit(jax.value_and_grad(
        lambda mdl: _loss_fn(mdl, probs.tokens, probs.labels, 2)))
    _, grads = value_and_grad(model)
    leaves = [x for x in jax.tree_util.tree_leaves(grads) if eqx_is_float(x)]
    assert all(np.all(np.isfinite(np.asarray(x))) for x in leaves)
    g = float(grads.loop.raw_mass[0])
    assert abs(g) > 0 and np.all(np.asarray(grads.loop.raw_damping) != 0)
    eps = 1e-5


    plus = eqx.tree_at(lambda m: m.loop.raw_mass, model, model.loop.raw_mass.at[0].add(eps))
    minus = eqx.tree_at(lambda m: m.loop.raw_mass, model, model.loop.raw_mass.at[0].add(-eps))
    fdiff = (float(value_and_grad(plus)[0]) - float(value_and_grad(minus)[0])) / (2 * eps)
    np.testing.assert_allclose(g, fdiff, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# negative control: linear second-order dynamics in score space


LINEAR_TINY = dataclasses.replace(FISHER_TINY, loop_kind="linear", mass=0.5, damping=1.5)


def test_linear_model_is_linear_score_dynamics_of_its_scores():
    # Reference: linear_score_dynamics (tested against the closed form above) driven by
    # the model's own recorded loop scores, a = 1/m, b = gamma/m; 1e-12 in float64. The
    # control has as many free parameters per head as the Fisher loop (two, plus T).
    cfg = LINEAR_TINY
    model = _f64(init_looped(cfg, jr.PRNGKey(1)))
    fisher = init_looped(FISHER_TINY, jr.PRNGKey(1))
    n_par = lambda m: sum(x.size for x in jax.tree_util.tree_leaves(m.loop))  # noqa: E731
    assert n_par(model) == n_par(fisher) == 2 * cfg.n_heads
    par = model.dynamics_parameters()
    # (initialized in float32: 1e-6)
    np.testing.assert_allclose(par["a"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(par["b"], 3.0, rtol=1e-6)
    paths = wt.extract_paths(model, _pointer_problems(cfg), dtype=jnp.float64)
    times = jnp.concatenate([jnp.zeros(1), paths.attn_t])
    attn, _, _ = linear_score_dynamics(fd.Shannon(), paths.scores, model.T, times=times,
                                       a=jnp.asarray(par["a"]), b=jnp.asarray(par["b"]))
    np.testing.assert_allclose(np.asarray(paths.attn), np.asarray(attn[1:]), rtol=0,
                               atol=1e-12)


# ---------------------------------------------------------------------------------------
# fixed points: diagnostics and DEQ-style training

from weight_tied.fixed_point import fixed_point_report  # noqa: E402

FP_TINY = LoopedConfig(n_pairs=3, dim=6, corrupt=0.0, d_model=8, n_heads=2, d_mlp=8,
                       n_loops=3, step=1.0)


def test_a_loop_that_is_not_finite_fails_the_preconditions_with_its_reason():
    # A Fisher loop with one NaN weight (its carried state then blows up, as an unstable
    # one does; the transformer's normalizer would refuse the NaN scores instead): the
    # report still returns (a NaN spectral radius, NaN residuals) and the study's
    # preconditions fail on it by name, never an exception. Control: the same model with
    # finite weights has a finite spectral radius.
    from weight_tied.study import preconditions

    cfg = dataclasses.replace(FP_TINY, loop_kind="fisher", mass=0.5, substeps=2)
    model = _f64(init_looped(cfg, jr.PRNGKey(4)))
    probs = wt.recall_task(jr.PRNGKey(5), 2, FP_TINY.n_pairs, FP_TINY.dim, 0.0,
                           dtype=jnp.float64)
    ok = fixed_point_report(model, probs.tokens, n_inits=1)
    assert np.all(np.isfinite(ok.spectral_radius))
    broken = eqx.tree_at(lambda m: m.wq.weight, model, model.wq.weight.at[0, 0].set(np.nan))
    rep = fixed_point_report(broken, probs.tokens, n_inits=1)
    assert np.isnan(rep.spectral_radius).all() and np.isnan(rep.residual).all()
    d = dict(accuracy=1.0, fixed_point=dict(spectral_radius=float(np.median(
        rep.spectral_radius)), path_distance_4L=float(np.median(rep.path_distance))))
    _, failed = preconditions(d, 2.0)
    assert any(f.startswith("spectral radius nan") for f in failed)


def test_fixed_point_report_jacobian_and_spectral_radius():
    # References: (1) central finite differences of model.loop_map (step 1e-6, float64:
    # truncation ~1e-12 * |Phi'''|, round-off ~1e-10; agreement 1e-6 absolute); (2) the
    # spectral radius by power iteration on the finite-difference Jacobian (geometric mean
    # of the norm growth over 400 iterations after 200 of burn-in: ~1 % for the measured
    # gap between the two largest moduli); (3) the residual recomputed from model.run.
    model = _f64(init_looped(FP_TINY, jr.PRNGKey(4)))
    probs = wt.recall_task(jr.PRNGKey(5), 2, FP_TINY.n_pairs, FP_TINY.dim, 0.0,
                           dtype=jnp.float64)
    rep = fixed_point_report(model, probs.tokens, n_inits=1)
    N = 4 * FP_TINY.n_loops
    assert rep.n_loops == N and rep.jacobian.shape[0] == 1
    _, xs, state = model.run(probs.tokens[0], N)
    res = np.linalg.norm(np.asarray(xs[-1] - xs[-2])) / np.linalg.norm(np.asarray(xs[-1]))
    np.testing.assert_allclose(rep.residual[0], res, rtol=1e-10)
    assert rep.carry_residual is None and rep.path_distance.shape == (2,)
    # without the linearization: the same residuals and spread, empty Jacobian fields
    bare = fixed_point_report(model, probs.tokens, n_inits=1, n_jacobian=0)
    np.testing.assert_allclose(bare.residual, rep.residual, rtol=1e-12)
    np.testing.assert_allclose(bare.path_distance, rep.path_distance, rtol=1e-12)
    D = rep.jacobian.shape[-1]
    assert bare.jacobian.shape == (0, D, D) and bare.spectral_radius.shape == (0,)
    assert bare.attn_jacobian.shape == (0,) + rep.attn_jacobian.shape[1:]
    with pytest.raises(ValueError, match="n_jacobian"):
        fixed_point_report(model, probs.tokens, n_jacobian=-1)
    e = model.embedding(probs.tokens[0])
    flat, unravel = jax.flatten_util.ravel_pytree(state)
    step = jax.jit(lambda f: jax.flatten_util.ravel_pytree(model.loop_map(unravel(f), e))[0])
    h = 1e-6
    eye = np.eye(flat.size)
    fdj = np.stack([(np.asarray(step(flat + h * d)) - np.asarray(step(flat - h * d))) / (2 * h)
                    for d in eye], -1)
    np.testing.assert_allclose(rep.jacobian[0], fdj, rtol=0, atol=1e-6)
    v = np.ones(flat.size)
    logs = []
    for k in range(600):
        v = fdj @ v
        nv = np.linalg.norm(v)
        if k >= 200:
            logs.append(np.log(nv))
        v = v / nv
    np.testing.assert_allclose(rep.spectral_radius[0], np.exp(np.mean(logs)), rtol=0.02)
    assert np.all(np.diff(np.abs(rep.eigenvalues[0])) <= 1e-12)
    # the attention Jacobian against finite differences of the query's attention rows
    attn = jax.jit(lambda f: model._attend(unravel(f)[0], e, None)[3][:, -1])
    fda = np.stack([(np.asarray(attn(flat + h * d)) - np.asarray(attn(flat - h * d))) / (2 * h)
                    for d in eye], -1)
    np.testing.assert_allclose(rep.attn_jacobian[0], fda, rtol=0, atol=1e-6)


def test_deq_training_options_and_cache_key(tmp_path):
    # References: (1) the cache key of the plain recipe is the one built before the new
    # options (weights stored by hand under the old-format key are found and loaded, no
    # training); (2) a fixed-point run records its loop range and penalty in the key, is
    # deterministic, and bad loop ranges are refused.
    import json

    from weight_tied.cache import cache_paths
    from weight_tied.training import TrainedLooped, _store, train_looped, trained_by

    kw = dict(seed=1, steps=3, batch=4, eval_batch=8, progress=False, cache_dir=tmp_path)
    old_recipe = dict(seed=1, steps=3, batch=4, lr=3e-3, weight_decay=1e-4, loss_from=0.5,
                      eval_batch=8)
    w, m, blob = cache_paths(FP_TINY.fingerprint(), FP_TINY.entropy.name, old_recipe, tmp_path)
    stored = TrainedLooped(init_looped(FP_TINY, jr.PRNGKey(0)), 0.123, np.zeros(3), 0.0, 0.0,
                           False, str(w))
    _store(stored, w, m, blob)
    plain = train_looped(FP_TINY, **kw)
    assert plain.from_cache and plain.path == str(w) and plain.accuracy == 0.123
    assert plain.trained_by is None  # stored without the record: not made up on loading
    deq = train_looped(FP_TINY, loops=(3, 9), residual_penalty=10.0, **kw)
    assert not deq.from_cache and deq.path != plain.path
    meta = json.loads(open(deq.path.replace(".eqx", ".json")).read())
    assert meta["recipe"]["loops"] == [3, 9] and meta["recipe"]["residual_penalty"] == 10.0
    # the weights name the host and code that trained them, and a cache load keeps that
    assert meta["trained_by"] == deq.trained_by == trained_by()
    assert train_looped(FP_TINY, loops=(3, 9), residual_penalty=10.0,
                        **kw).trained_by == deq.trained_by
    assert np.all(np.isfinite(deq.loss_history))
    again = train_looped(FP_TINY, loops=(3, 9), residual_penalty=10.0, use_cache=False,
                         **{k: v for k, v in kw.items() if k != "cache_dir"})
    np.testing.assert_array_equal(again.loss_history, deq.loss_history)
    # a model kind is part of the weights' key too
    fp = dataclasses.replace(FP_TINY, loop_kind="fisher", mass=0.5).fingerprint()
    assert fp["loop_kind"] == "fisher" and fp["mass"] == 0.5 and "damping" not in fp
    with pytest.raises(ValueError, match="loops"):
        train_looped(FP_TINY, loops=(5, 2), **kw)
    with pytest.raises(ValueError, match="residual_penalty"):
        train_looped(FP_TINY, residual_penalty=1.0, **kw)


def test_source_fingerprint_reads_the_sources_and_their_names_only(tmp_path):
    # Reference: copies of one small package tree. The fingerprint must stay the same where
    # the tree is moved or a non-source file changes, and change with one source byte or
    # a file's name. The installed code's fingerprint is that of copies of the fisherdyn and
    # study packages placed elsewhere.
    import shutil

    import weight_tied.training

    from weight_tied.training import code_fingerprint, source_fingerprint

    a = tmp_path / "a" / "pkg"
    (a / "sub").mkdir(parents=True)
    (a / "__init__.py").write_text("x = 1\n")
    (a / "sub" / "law.py").write_text("def G(x):\n    return x\n")
    (a / "notes.txt").write_text("not code")
    base = source_fingerprint([a])
    b = tmp_path / "b" / "deeper" / "pkg"
    shutil.copytree(a, b)
    assert source_fingerprint([b]) == base
    (b / "notes.txt").write_text("changed")
    assert source_fingerprint([b]) == base
    (b / "sub" / "law.py").write_text("def G(x):\n    return x \n")
    assert source_fingerprint([b]) != base
    shutil.rmtree(b)
    shutil.copytree(a, b)
    (b / "sub" / "law.py").rename(b / "sub" / "law2.py")
    assert source_fingerprint([b]) != base
    fp = code_fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", fp)
    roots = [pathlib.Path(fd.__file__).parent, pathlib.Path(weight_tied.training.__file__).parent]
    copies = [shutil.copytree(r, tmp_path / "elsewhere" / r.name) for r in roots]
    assert source_fingerprint(copies) == fp
    assert source_fingerprint(copies[:1]) != fp  # the study's sources count too


def test_deq_training_scan_lengths_do_not_change_the_training(monkeypatch):
    # Reference: the same run with one scan length (every step runs hi loops, the loops past
    # the drawn n at zero weight). Running each step to the shortest of four lengths that
    # covers its n must give the same losses: float32 round-off differs between the compiled
    # programs, ~1e-7 relative per step, so 1e-5 over 6 steps.
    from weight_tied import training as _training

    for lo, hi in ((3, 9), (8, 24), (5, 5), (2, 3)):
        b = _training._loop_buckets(lo, hi)
        assert b[-1] == hi and len(b) <= _training._LOOP_BUCKETS and b == sorted(set(b))
        assert all(any(lo <= n <= x for x in b) for n in range(lo, hi + 1))
    counts = _training._loop_counts(jr.PRNGKey(3), 400, 3, 9)
    assert counts.min() == 3 and counts.max() == 9  # both ends are drawn
    kw = dict(seed=2, steps=6, batch=8, eval_batch=8, progress=False, use_cache=False,
              loops=(3, 9), residual_penalty=1.0)
    monkeypatch.setattr(_training, "_SHORT_RUN", 0)  # buckets only pay on long runs
    bucketed = _training.train_looped(FP_TINY, **kw)
    monkeypatch.setattr(_training, "_LOOP_BUCKETS", 1)
    assert _training._loop_buckets(3, 9) == [9]
    full = _training.train_looped(FP_TINY, **kw)
    np.testing.assert_allclose(bucketed.loss_history, full.loss_history, rtol=1e-5)
    leaves = lambda m: jax.tree_util.tree_leaves(eqx.filter(m, eqx.is_inexact_array))  # noqa: E731
    for a, c in zip(leaves(bucketed.model), leaves(full.model)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_deq_training_shrinks_the_fixed_point_residual():
    # Reference: the same tiny model trained at fixed depth. Trained over loop counts
    # U{L..3L} with a residual penalty of 100, the relative residual at 4L must fall below
    # 0.3x that of the fixed-depth model (measured: ~0.09 -> ~0.007) and below 0.02.
    from weight_tied.training import train_looped

    kw = dict(seed=0, steps=300, batch=32, eval_batch=256, progress=False, use_cache=False)
    L = FP_TINY.n_loops
    probs = wt.recall_task(jr.PRNGKey(7), 16, FP_TINY.n_pairs, FP_TINY.dim, 0.0)
    plain = train_looped(FP_TINY, **kw)
    deq = train_looped(FP_TINY, loops=(L, 3 * L), residual_penalty=100.0, **kw)
    r_plain = np.median(fixed_point_report(plain.model, probs.tokens).residual)
    r_deq = np.median(fixed_point_report(deq.model, probs.tokens).residual)
    assert r_deq < 0.3 * r_plain and r_deq < 0.02


# ---------------------------------------------------------------------------------------
# paths of every model kind on the pointer task


@pytest.mark.parametrize("kind", ["transformer", "fisher", "linear"])
def test_extract_paths_every_kind_on_pointer_task(kind):
    # References: the readout at loop L equals the model's forward (float64, 1e-10); rows
    # are probability vectors (1e-12); all_rows keeps the query row as the last row; the
    # per-loop accuracy is recomputed from the logits by hand; with_loops keeps the
    # dynamics parameters (depth per loop c/n).
    cfg = {"fisher": FISHER_TINY, "linear": LINEAR_TINY}.get(
        kind, dataclasses.replace(FISHER_TINY, loop_kind=kind))
    model = _f64(init_looped(cfg, jr.PRNGKey(1)))
    probs = _pointer_problems(cfg)
    n = cfg.n_loops
    rows = wt.extract_paths(model, probs, n, dtype=jnp.float64, all_rows=kind == "fisher")
    assert rows.loop_kind == kind
    np.testing.assert_array_equal(np.asarray(rows.chain), np.asarray(probs.chain))
    attn = np.asarray(rows.attn)
    assert np.all(attn >= 0)
    np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=0, atol=1e-12)
    if kind == "fisher":  # every token's row carries its own state; the query's is last
        assert attn.shape == (n + 1, 2, cfg.n_heads, cfg.n_ctx, cfg.n_ctx)
        rows = dataclasses.replace(rows, attn=rows.attn[..., -1, :],
                                   scores=rows.scores[..., -1, :])
    assert rows.attn.shape == (n + 1, 2, cfg.n_heads, cfg.n_ctx)
    direct = jax.vmap(model)(probs.tokens)
    np.testing.assert_allclose(np.asarray(rows.logits[cfg.n_loops]), np.asarray(direct),
                               rtol=0, atol=1e-10)
    hits = np.argmax(np.asarray(rows.logits), -1) == np.asarray(probs.labels)[None]
    np.testing.assert_allclose(np.asarray(rows.accuracy), hits.mean(-1), atol=1e-15)
    lag = 0.0 if kind == "transformer" else model.dt
    np.testing.assert_allclose(np.asarray(rows.attn_t), np.asarray(rows.t) + lag, atol=1e-15)
    m2 = model.with_loops(2 * cfg.n_loops)
    assert m2.dt == pytest.approx(model.dt / 2)
    if kind != "transformer":
        np.testing.assert_array_equal(np.asarray(m2.loop.raw_mass), np.asarray(model.loop.raw_mass))


def test_fingerprint_keeps_the_keys_of_earlier_configs():
    # Reference: the field list the cache keys were built from before the new fields; a
    # default config hashes to the same key, a changed new field to another.
    old = {"n_pairs", "dim", "n_classes", "corrupt", "d_model", "n_heads", "d_mlp", "n_loops",
           "step", "entropy", "T", "dtype"}
    assert set(LoopedConfig().fingerprint()) == old
    for change in (dict(task="pointer"), dict(loop_kind="linear"), dict(learn_T=True),
                   dict(substeps=2), dict(damping=2.0)):
        assert set(dataclasses.replace(LoopedConfig(), **change).fingerprint()) > old


def test_fisher_score_dynamics_replays_the_model():
    # Reference: the Fisher model's recorded attention (itself checked against
    # fd.simulate loop by loop above) from its recorded loop scores, times 0, attn_t, and
    # the model's (m, gamma, T) per head; 1e-12 (the same arithmetic, float64).
    from fisherdyn import fisher_score_dynamics

    cfg = FISHER_TINY
    model = _f64(init_looped(cfg, jr.PRNGKey(1)))
    paths = wt.extract_paths(model, _pointer_problems(cfg), dtype=jnp.float64)
    par = model.dynamics_parameters()
    times = jnp.concatenate([jnp.zeros(1), paths.attn_t])
    attn, _, _ = fisher_score_dynamics(cfg.entropy, paths.scores, jnp.asarray(par["T"]),
                                       times=times, mass=jnp.asarray(par["mass"]),
                                       damping=jnp.asarray(par["damping"]),
                                       substeps=cfg.substeps)
    np.testing.assert_allclose(np.asarray(attn[0]), 1 / cfg.n_ctx, atol=1e-15)
    np.testing.assert_allclose(np.asarray(attn[1:]), np.asarray(paths.attn), rtol=0,
                               atol=1e-12)


def test_learnable_temperature_is_per_head_and_starts_at_the_config_T():
    # Reference: the config's temperature (sqrt(d_head) by default) and the softplus
    # parametrization; without learn_T the loop holds the config's T.
    cfg = dataclasses.replace(FISHER_TINY, learn_T=True)
    model = init_looped(cfg, jr.PRNGKey(0))
    assert model.loop.raw_T.shape == (cfg.n_heads,)
    np.testing.assert_allclose(model.dynamics_parameters()["T"], cfg.temperature, rtol=1e-6)
    fixed = FisherLoop(3, 0.5, 2.0, None)
    np.testing.assert_allclose(np.asarray(fixed.temperature(1.7)), 1.7, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(fixed.mass), 0.5, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fixed.damping), 2.0, rtol=1e-6)


# ---------------------------------------------------------------------------------------
# the contracting loop: a leaky residual, trained against the absolute residual


def test_leaky_loop_is_the_plain_loop_minus_the_leak():
    # Reference: the plain loop map with the same weights. The leaky step is
    # x + h (F(x) - lam x), so Phi_lam(x) = Phi_0(x) - h lam x exactly (float64, 1e-13 on
    # states of norm ~1); the leak leaves the weights and, at 0, the cache key unchanged.
    cfg0 = dataclasses.replace(FP_TINY, task="pointer", hops=2, n_pairs=4, dim=6)
    leaky = dataclasses.replace(cfg0, leak=1.5)
    assert "leak" not in cfg0.fingerprint() and leaky.fingerprint()["leak"] == 1.5
    m0 = _f64(init_looped(cfg0, jr.PRNGKey(4)))
    m1 = _f64(init_looped(leaky, jr.PRNGKey(4)))
    tok = jnp.asarray(task_batch(cfg0, jr.PRNGKey(5), 1).tokens[0], jnp.float64)
    e = m0.embedding(tok)
    x = jr.normal(jr.PRNGKey(6), e.shape, jnp.float64)
    got = m1.loop_map((x, None), e)[0]
    want = m0.loop_map((x, None), e)[0] - m0.dt * 1.5 * x
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-13)
    # the trace runs the same step: its last state is n loop maps from x_0 = 0
    state = m1.initial_state(tok)
    for _ in range(leaky.n_loops):
        state = m1.loop_map(state, e)
    np.testing.assert_allclose(np.asarray(m1.run(tok)[1][-1]), np.asarray(state[0]),
                               rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="leak"):
        dataclasses.replace(cfg0, leak=-1.0)


def test_leak_bounds_the_stream_that_grows_without_it():
    # Reference: the bound |x| <= sup|F| / lam of x' = F - lam x, with sup|F| taken over
    # the visited states. Every input of the block is layer-normalized, so F stays O(1):
    # without a leak an untrained loop's stream grows about linearly in the loops (the
    # study's transformers: |x_n| ~ n), with lam = 2 it stays below max|F| / 2 at every
    # loop of 400.
    cfg = dataclasses.replace(FP_TINY, task="pointer", hops=2, n_pairs=4, dim=6)
    tok = jnp.asarray(task_batch(cfg, jr.PRNGKey(5), 1).tokens[0], jnp.float64)
    norms = {}
    for lam in (0.0, 2.0):
        m = _f64(init_looped(dataclasses.replace(cfg, leak=lam), jr.PRNGKey(4)))
        xs = np.asarray(m.run(tok, 400)[1])
        norms[lam] = np.linalg.norm(xs.reshape(401, -1), axis=1)
        if lam:
            e = m.embedding(tok)
            F = [np.linalg.norm(np.asarray(m._update(*m._attend(jnp.asarray(x), e)[:2])))
                 for x in xs[::10]]
            assert norms[lam].max() <= max(F) / lam * (1 + 1e-9)
    assert norms[0.0][400] > 3 * norms[0.0][100] > 0  # linear growth: ~4x
    assert norms[2.0][400] < 1.01 * norms[2.0][100]


def test_absolute_residual_penalty_is_the_mean_square_step(tmp_path):
    # Reference: the penalty recomputed by hand from the model's own states, the mean of
    # (x_n - x_{n-1})^2 over batch and entries, and the relative one as before; the recipe
    # key records "absolute" only (earlier caches keep their keys) and bad names are refused.
    from weight_tied.training import _deq_loss_fn, train_looped

    cfg = FP_TINY
    m = _f64(init_looped(cfg, jr.PRNGKey(3)))
    data = task_batch(cfg, jr.PRNGKey(8), 4)
    tok = jnp.asarray(data.tokens, jnp.float64)
    n, n_max = jnp.asarray(4), 6
    base = _deq_loss_fn(m, tok, data.labels, n, 0.5, n_max, 0.0)
    absolute = _deq_loss_fn(m, tok, data.labels, n, 0.5, n_max, 2.0, True)
    relative = _deq_loss_fn(m, tok, data.labels, n, 0.5, n_max, 2.0, False)
    xs = np.stack([np.asarray(m.run(t, n_max)[1]) for t in tok])  # (B, n_max + 1, ...)
    step = xs[:, 4] - xs[:, 3]
    np.testing.assert_allclose(float(absolute - base), 2.0 * np.mean(step**2), rtol=1e-10)
    rel = np.mean(np.sum(step**2, (1, 2)) / np.sum(xs[:, 4] ** 2, (1, 2)))
    np.testing.assert_allclose(float(relative - base), 2.0 * rel, rtol=1e-10)
    import json

    kw = dict(seed=1, steps=2, batch=4, eval_batch=8, progress=False, cache_dir=tmp_path,
              loops=(3, 6), residual_penalty=1.0)
    tr = train_looped(cfg, residual="absolute", **kw)
    assert np.all(np.isfinite(tr.loss_history))
    meta = json.loads(open(tr.path.replace(".eqx", ".json")).read())
    assert meta["recipe"]["residual"] == "absolute"
    rel = train_looped(cfg, **kw)
    assert "residual" not in json.loads(open(rel.path.replace(".eqx", ".json")).read())["recipe"]
    with pytest.raises(ValueError, match="residual"):
        train_looped(cfg, residual="squared", **kw)


def test_dose_mixes_the_normalizer_and_the_carried_state():
    # Reference: the two ends computed separately at the same loop state, the carried
    # state's weights (dose 1) and softmax of the loop's scores by hand (Shannon, T the
    # model's): the dosed attention is their mixture to 1e-13, and the carried state
    # advances the same whatever the dose.
    cfg = dataclasses.replace(FISHER_TINY, entropy=fd.Shannon())
    tok = jnp.asarray(_pointer_problems(cfg).tokens[0], jnp.float64)
    full = _f64(init_looped(cfg, jr.PRNGKey(1)))
    e = full.embedding(tok)
    x, c = full.initial_state(tok)
    x = x + 0.3 * jr.normal(jr.PRNGKey(2), x.shape, jnp.float64)
    _, _, scores, rho1, c1 = full._attend(x, e, c)
    z = np.asarray(scores) / full.T
    soft = np.exp(z - z.max(-1, keepdims=True))
    soft /= soft.sum(-1, keepdims=True)
    for beta in (0.0, 0.5):
        m = _f64(init_looped(dataclasses.replace(cfg, dose=beta), jr.PRNGKey(1)))
        _, _, s, rho, cb = m._attend(x, e, c)
        np.testing.assert_allclose(np.asarray(s), np.asarray(scores), rtol=0, atol=0)
        np.testing.assert_allclose(np.asarray(rho), (1 - beta) * soft + beta * np.asarray(rho1),
                                   rtol=0, atol=1e-13)
        for a, b in zip(jax.tree_util.tree_leaves(cb), jax.tree_util.tree_leaves(c1)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="dose"):
        dataclasses.replace(cfg, dose=1.5)
    with pytest.raises(ValueError, match="carried"):
        dataclasses.replace(cfg, loop_kind="transformer", dose=0.5)


def test_mode_shortcut_accuracy_by_hand():
    # Reference: hand-built problems. Context labels [0, 0, 1] and answer 0: the mode is
    # right (1); labels [0, 1, 2] (a three-way tie) and answer 2: right a third of the time;
    # labels [1, 1, 0] and answer 0: wrong. Mean 4/9.
    from weight_tied.pilot import mode_shortcut_accuracy

    dim, C = 2, 3

    def tok(labels):
        ctx = [np.concatenate([np.zeros(2 * dim), np.eye(C)[lab], [0.0]]) for lab in labels]
        return np.stack(ctx + [np.concatenate([np.zeros(2 * dim + C), [1.0]])])

    batch = PointerBatch(np.stack([tok([0, 0, 1]), tok([0, 1, 2]), tok([1, 1, 0])]),
                         np.array([0, 2, 0]), None, None)
    assert mode_shortcut_accuracy(batch, dim, C) == pytest.approx(4 / 9, rel=1e-12)
    # on generated data it is the frequency rule's accuracy, about 0.32 at 8 nodes
    b = pointer_task(jr.PRNGKey(0), 4000, 8, 2, 16)
    assert 0.29 < mode_shortcut_accuracy(b, 16, 8) < 0.35


# a pilot of a tiny model trained for 3 steps, evaluated on a few problems
TINY_PILOT = ["--nodes", "4", "--hops", "2", "--dim", "8", "--width", "8", "--loops", "2",
              "--steps", "3", "--batch", "4", "--problems", "8", "--fp-problems", "2",
              "--jacobians", "1", "--no-progress"]


def test_pilot_reports_the_preconditions_of_a_model(tmp_path, monkeypatch, capsys):
    # A smoke run of `python studies/weight_tied pilot` (3 training steps): it reports every
    # precondition with its number, and an untrained model fails the accuracy one.
    monkeypatch.setenv("FISHERDYN_CACHE", str(tmp_path))
    from weight_tied.pilot import main

    out = main(TINY_PILOT + ["--json", str(tmp_path / "p.json")])
    values = out["preconditions"]["values"]
    assert set(values) == {"accuracy", "spectral_radius", "endpoint_distance", "depth_ratio"}
    assert all(np.isfinite(v) for v in values.values())
    assert any(f.startswith("accuracy") for f in out["preconditions"]["failed"])
    assert len(out["accuracy_by_loop"]) == 4 * 2 + 1 and out["chance"] == 0.25
    assert out["host"]["jax"] == jax.__version__ and out["host"]["backend"] == "cpu"
    assert out["carried"] is None  # a plain transformer carries no dynamics
    assert out["training"]["seconds"] > 0 and out["training"]["cached"] is False
    assert out["training"]["trained_by"]["host"] == out["host"]  # trained where it ran
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists() and "cpu family" in cpuinfo.read_text():  # x86 Linux
        family = re.search(r"^cpu family\s*:\s*(\d+)", cpuinfo.read_text(), re.M).group(1)
        assert re.fullmatch(rf"family {family}, model \d+", out["host"]["cpu_id"])
    # the linear-response statistic of each linearized problem and head (2 heads by default)
    lr = out["fixed_point"]["linear_response"]
    assert len(lr) == 1 * 2 and all(e is None or e >= 0 for e in lr)
    printed = capsys.readouterr().out
    assert "preconditions (protocol" in printed and "linear response at 16L" in printed
    assert (tmp_path / "p.json").exists()


def test_pilot_resumes_from_an_earlier_run(tmp_path, monkeypatch, capsys):
    # `--resume` takes a model's result from an earlier `--json` file when its design,
    # recipe and evaluation settings match, and evaluates the other seeds. The reused
    # result is marked with an accuracy no evaluation gives (0.123), so that reuse is seen
    # in the output; a different evaluation setting or recipe does not match.
    monkeypatch.setenv("FISHERDYN_CACHE", str(tmp_path))
    from weight_tied.pilot import earlier_results, main, result_key

    first = tmp_path / "first.json"
    main(TINY_PILOT + ["--seeds", "0", "--json", str(first)])
    data = json.loads(first.read_text())
    record = data["models"]["shannon"][0]
    record["accuracy"] = record["preconditions"]["values"]["accuracy"] = 0.123
    first.write_text(json.dumps(data))
    out = main(TINY_PILOT + ["--seeds", "0,1", "--resume", str(first)])
    models = out["models"]["shannon"]
    assert [m["recipe"]["seed"] for m in models] == [0, 1]
    assert models[0]["accuracy"] == 0.123 and models[1]["accuracy"] != 0.123
    assert out["replication"]["shannon"]["accuracy"]["min"] == 0.123
    assert f"result reused from {first}" in capsys.readouterr().out
    found = earlier_results([first])
    key = result_key(record["config"], record["recipe"], record["evaluation"])
    assert set(found) == {key}
    assert result_key(record["config"], record["recipe"],
                      dict(record["evaluation"], problems=16)) not in found
    assert result_key(record["config"], dict(record["recipe"], steps=4),
                      record["evaluation"]) not in found
    with pytest.raises(SystemExit, match="need --seeds"):
        main(TINY_PILOT + ["--resume", str(first)])
    # `--cached-only` trains nothing: seed 1 loads from the weight cache, seed 2 has no
    # model and is listed with its reason, outside the summary
    out = main(TINY_PILOT + ["--seeds", "0-2", "--cached-only", "--resume", str(first)])
    rep = out["replication"]["shannon"]
    assert rep["seeds"] == [0, 1] and list(rep["without_a_model"]) == ["2"]
    assert "no cached weights for seed 2" in rep["without_a_model"]["2"]
    with pytest.raises(SystemExit, match="need --seeds"):
        main(TINY_PILOT + ["--cached-only"])
    # a training that diverges is a seed without a model too, with the error's message
    import weight_tied.pilot as pilot_module

    def diverging(one, log):
        raise FloatingPointError(f"training diverged (seed {one.seed})")

    monkeypatch.setattr(pilot_module, "pilot", diverging)
    out = main(TINY_PILOT + ["--seeds", "0,3", "--resume", str(first)])
    rep = out["replication"]["shannon"]
    assert rep["seeds"] == [0] and rep["without_a_model"] == {
        "3": "training diverged (seed 3)"}
    # a single-seed run's file (`--seed 1 --json`) is one model's result, found the same way
    single = tmp_path / "single.json"
    single.write_text(json.dumps(models[1], default=float))
    assert set(earlier_results([single])) == {
        result_key(models[1]["config"], models[1]["recipe"], models[1]["evaluation"])}


def test_linear_response_over_seeds_is_tested_per_seed():
    # Seeds are the units: each seed's median statistic (None where nothing was evaluable)
    # enters an exact sign test against the YES region's top (0.2). Reference: scipy's
    # binomial test on the same counts, and the interval's coverage from the binomial law.
    from scipy.stats import binomtest

    from weight_tied.pilot import linear_response_spread

    lists = [[1.0, 0.5, None], [0.1, 0.15], [None, None], [0.4, 0.6], [2.0], [0.9, 0.7]]
    out = linear_response_spread([dict(fixed_point=dict(linear_response=v)) for v in lists])
    assert out["per_seed"] == [0.75, 0.125, None, 0.5, 2.0, 0.8]
    assert (out["evaluable"], out["total"]) == (9, 12)
    t = out["above_yes"]
    assert (t["threshold"], t["units"], t["above"]) == (0.2, 5, 4)
    assert t["p"] == pytest.approx(binomtest(4, 5, 0.5, alternative="greater").pvalue,
                                   rel=1e-12)
    assert t["min_p"] == 0.5**5
    # five units: the range is the narrowest interval, coverage 1 - 2 / 2^5
    iv = out["median_interval"]
    assert (iv["low"], iv["high"]) == (0.125, 2.0)
    assert iv["coverage"] == pytest.approx(1 - 2 * 0.5**5, rel=1e-12)
    # a model recorded without the statistic leaves the summary out
    assert linear_response_spread([dict(fixed_point={})]) is None


@pytest.mark.slow
def test_pilot_replicates_a_design_over_seeds(tmp_path, monkeypatch, capsys):
    # `pilot --seeds 0,1 --families shannon tsallis` trains four 3-step models and
    # summarizes each family. Reference: the per-model results themselves (the counts, the
    # failures and the ranges are recomputed here by hand from each model's own
    # preconditions), and a run of one seed alone gives that model's numbers again (the
    # weights come from the cache). The figure is written.
    monkeypatch.setenv("FISHERDYN_CACHE", str(tmp_path))
    from weight_tied.pilot import design_title, main

    fig = tmp_path / "rep.png"
    out = main(TINY_PILOT + ["--seeds", "0,1", "--families", "shannon", "tsallis", "--figure",
                         str(fig)])
    assert set(out["replication"]) == {"shannon", "tsallis"} and fig.stat().st_size > 0
    for family in ("shannon", "tsallis"):
        models, rep = out["models"][family], out["replication"][family]
        assert [m["recipe"]["seed"] for m in models] == [0, 1] == rep["seeds"]
        assert rep["meeting_all"] == sum(not m["preconditions"]["failed"] for m in models)
        assert set(rep["failed"]) == {str(m["recipe"]["seed"]) for m in models
                                      if m["preconditions"]["failed"]}
        acc = [m["preconditions"]["values"]["accuracy"] for m in models]
        assert rep["accuracy"] == dict(median=np.median(acc), min=min(acc), max=max(acc))
        greatest = [m["fixed_point"]["4L"]["endpoint_distance_max"] for m in models]
        assert rep["seeds_with_a_problem_beyond"] == sum(g > 0.05 for g in greatest)
        assert rep["endpoint_distance_greatest"]["max"] == max(greatest)
    assert "tsallis: 0 of 2 seeds meet every precondition" in capsys.readouterr().out
    again = main(TINY_PILOT + ["--seed", "1", "--family", "tsallis"])
    assert again["preconditions"] == out["models"]["tsallis"][1]["preconditions"]
    title = design_title(out["models"]["tsallis"][0])
    assert "n_pairs 4" in title and "steps 3" in title
    assert "seed" not in title and "Tsallis" not in title
    with pytest.raises(SystemExit, match="need --seeds"):
        main(TINY_PILOT + ["--families", "shannon"])


@pytest.mark.slow
def test_pilot_trains_a_carried_loop_on_its_own_scores(tmp_path, monkeypatch):
    # `--loop-kind fisher --dose 0.5`: the config the pilot trains is an unfrozen Fisher loop
    # at that dose with the given dynamics (read back from the recipe's fingerprint); a
    # dose without a carried loop is refused.
    monkeypatch.setenv("FISHERDYN_CACHE", str(tmp_path))
    from weight_tied.pilot import main

    common = ["--nodes", "4", "--hops", "2", "--dim", "8", "--width", "8", "--loops", "2",
              "--steps", "2", "--batch", "4", "--problems", "8", "--fp-problems", "2",
              "--jacobians", "1", "--no-progress"]
    out = main(common + ["--loop-kind", "fisher", "--dose", "0.5", "--mass", "0.5",
                         "--substeps", "2"])
    cfg = out["config"]
    assert cfg["loop_kind"] == "fisher" and cfg["dose"] == 0.5
    assert cfg["mass"] == 0.5 and cfg["substeps"] == 2 and "frozen_scores" not in cfg
    # the learned parameters per head: two steps move the mass little from its start, and
    # the substep's rate is h * damping/mass with h = step / (loops * substeps) = 0.5
    learned = out["carried"]
    assert len(learned["mass"]) == 2 and np.allclose(learned["mass"], 0.5, rtol=0.05)
    np.testing.assert_allclose(learned["substep_damping_rate"],
                               0.5 * np.array(learned["damping"]) / learned["mass"], rtol=1e-6)
    with pytest.raises(SystemExit, match="dose"):
        main(common + ["--dose", "0.5"])


@pytest.mark.slow
def test_pilot_follow_describes_every_head(tmp_path, monkeypatch):
    # `pilot --follow` on a 3-step model: one description per head, named among the three
    # families' Fisher models and the four baselines, with the head's noise estimate and the
    # own family's held-out likelihood interval (low <= estimate <= high).
    monkeypatch.setenv("FISHERDYN_CACHE", str(tmp_path))
    from weight_tied.pilot import main

    out = main(["--nodes", "4", "--hops", "2", "--dim", "8", "--width", "8", "--loops", "4",
                "--steps", "3", "--batch", "4", "--problems", "8", "--fp-problems", "2",
                "--jacobians", "1", "--no-progress", "--follow", "--follow-problems", "8"])
    names = {"Fisher Shannon", "Fisher Tsallis", "Fisher Kaniadakis", "linear",
             "relaxation", "constant", "geodesic"}
    assert len(out["follow"]) == 2
    for f in out["follow"]:
        assert set(f["mean_sq_error"]) == names and f["best"] in names
        assert f["best"] == min(f["mean_sq_error"], key=f["mean_sq_error"].get)
        assert f["noise"] >= 1e-3 and f["margin"] >= 0
        iv = f["loglik_ratio"]
        assert iv["low"] <= iv["estimate"] <= iv["high"]


def test_curriculum_stages_train_first_and_enter_the_cache_key(tmp_path, monkeypatch):
    # References: the stage shapes are the pointer task's own (`pointer_task` of the stage
    # sizes gives the stage's tokens, one layout for every stage when n_classes is fixed);
    # the loss history holds every stage's steps in order, the first stage's first loss is
    # the cross entropy of the untrained model on its own (smaller) problems, which at
    # init is near log(n_classes); and a curriculum is part of the weights' key.
    import json

    from weight_tied import training as _training
    from weight_tied.training import _curriculum_configs, train_looped

    # the problems each compiled training step draws (recorded when it is traced)
    drawn = []
    real_batch = _training.task_batch

    def recording_batch(config, key, batch):
        drawn.append((config.n_pairs, config.hops))
        return real_batch(config, key, batch)

    monkeypatch.setattr(_training, "task_batch", recording_batch)

    cfg = LoopedConfig(task="pointer", n_pairs=6, hops=2, n_classes=6, dim=6, d_model=8,
                       n_heads=2, d_mlp=8, n_loops=3, step=1.0)
    stages = _curriculum_configs(cfg, ((3, 1, 2), (4, 2, 3)))
    assert [(c.n_pairs, c.hops, n) for c, n in stages] == [(3, 1, 2), (4, 2, 3)]
    for c, _ in stages:
        tok = pointer_task(jr.PRNGKey(0), 2, c.n_pairs, c.hops, 6, n_classes=6).tokens
        assert tok.shape == (2, c.n_pairs + 1, cfg.token_dim)
    kw = dict(seed=0, steps=2, batch=4, eval_batch=8, progress=False, cache_dir=tmp_path,
              loops=(3, 6), residual_penalty=0.1, residual="absolute")
    plain = train_looped(cfg, **kw)
    tr = train_looped(cfg, curriculum=((3, 1, 2), (4, 2, 3)), **kw)
    assert len(tr.loss_history) == 2 + 3 + 2 and not tr.from_cache
    # the stages' problems first, in order, then the config's own (its step already compiled)
    assert drawn == [(6, 2), (3, 1), (4, 2)]
    assert tr.path != plain.path and tr.model.config == cfg
    meta = json.loads(open(tr.path.replace(".eqx", ".json")).read())
    assert meta["recipe"]["curriculum"] == [[3, 1, 2], [4, 2, 3]]
    assert "curriculum" not in json.loads(open(plain.path.replace(".eqx", ".json")).read())[
        "recipe"]
    assert abs(tr.loss_history[0] - np.log(6)) < 0.5 and np.all(np.isfinite(tr.loss_history))
    assert train_looped(cfg, curriculum=((3, 1, 2), (4, 2, 3)), **kw).from_cache
    with pytest.raises(ValueError, match="n_classes"):
        _curriculum_configs(dataclasses.replace(cfg, n_classes=None), ((3, 1, 2),))
    with pytest.raises(ValueError, match="pointer"):
        _curriculum_configs(FP_TINY, ((3, 1, 2),))
    with pytest.raises(ValueError, match="nodes >= 2"):
        _curriculum_configs(cfg, ((1, 1, 2),))


def test_a_fisher_loop_whose_rk4_substep_is_unstable_is_refused():
    # Reference: RK4's stability polynomial R(z) = 1 + z + z^2/2 + z^3/6 + z^4/24 on the
    # negative axis; the config's bound sits where |R| crosses 1 (to 1e-3 in z), and a loop
    # beyond it is refused with the substeps that would do, which then pass.
    from weight_tied.model import _RK4_STABLE

    R = lambda z: 1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24  # noqa: E731
    assert abs(R(-_RK4_STABLE + 1e-3)) < 1 < abs(R(-_RK4_STABLE - 1e-3))
    kw = dict(loop_kind="fisher", mass=0.02, damping=1.0, step=4.0, n_loops=8)
    with pytest.raises(ValueError, match="substeps >= 9"):
        LoopedConfig(substeps=8, **kw)
    LoopedConfig(substeps=9, **kw)
    LoopedConfig(loop_kind="linear", mass=0.02, damping=1.0, step=4.0, n_loops=8, substeps=1)


def test_carried_rates_reads_the_fisher_loops_parameters():
    # Reference: the config's own initial mass and damping (an untrained loop holds them
    # per head), and h = step / (loops * substeps); other loops have no such sentence.
    from weight_tied.training import carried_rates

    cfg = LoopedConfig(task="pointer", n_pairs=4, hops=2, dim=8, d_model=8, n_heads=2,
                       d_mlp=16, n_loops=2, step=2.0, loop_kind="fisher", mass=0.25,
                       damping=0.75, substeps=3)
    text = carried_rates(init_looped(cfg, jr.PRNGKey(0)), cfg)
    h = 2.0 / (2 * 3)
    assert "mass was 0.25, 0.25" in text and "damping 0.75, 0.75" in text
    assert f"= {h * 3:.4g}, {h * 3:.4g} (at the start {h * 3:.3g})" in text
    plain = dataclasses.replace(cfg, loop_kind="transformer", mass=1.0, damping=1.0,
                                substeps=4)
    assert carried_rates(init_looped(plain, jr.PRNGKey(0)), plain) == ""


def test_training_that_diverges_stops_and_caches_only_a_record(tmp_path):
    # A Fisher loop trained at a learning rate of 10 drives its carried state beyond its
    # RK4 substeps within a few steps (NaN loss): training stops with the step and caches
    # no weights, only a record that `cached_only` reports. Control: the same loop at the
    # default rate trains its 5 steps, finite, and leaves no record.
    from weight_tied.training import code_fingerprint, replay_divergence, train_looped

    cfg = LoopedConfig(task="pointer", n_pairs=4, hops=2, dim=8, d_model=8, n_heads=2,
                       d_mlp=16, n_loops=2, loop_kind="fisher", mass=0.5, damping=1.0,
                       substeps=2)
    with pytest.raises(FloatingPointError, match=r"diverged: the loss is nan at step \d+ of 30"
                       ) as err:
        train_looped(cfg, steps=30, batch=4, lr=10.0, cache_dir=tmp_path, progress=False)
    weights, record = sorted(tmp_path.iterdir(), key=lambda f: f.suffix)
    assert record.name.endswith(".diverged.json") and weights.name.endswith(".diverged.eqx")
    saved = json.loads(record.read_text())
    assert saved["message"] == str(err.value)
    assert saved["host"]["cpu"] in saved["message"] and saved["code"] == code_fingerprint()
    # the record keeps the weights before the step: finite, and the step's batch, replayed
    # through them, gives the non-finite loss again
    step = replay_divergence(cfg, steps=30, batch=4, lr=10.0, cache_dir=tmp_path)
    assert re.search(rf"at step {step.record['step'] + 1} of 30", str(err.value))
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in
               jax.tree_util.tree_leaves(eqx.filter(step.model, eqx.is_inexact_array)))
    assert not np.isfinite(step.loss) and step.tokens.shape[0] == 4
    assert step.loops == step.scan_loops == cfg.n_loops and step.record["loops"] is None
    # fixed-point training: the record keeps the step's drawn loop count as well
    deq = dict(steps=30, batch=4, lr=10.0, loops=(2, 5), residual_penalty=0.1)
    with pytest.raises(FloatingPointError, match="diverged"):
        train_looped(cfg, cache_dir=tmp_path, progress=False, **deq)
    step = replay_divergence(cfg, cache_dir=tmp_path, **deq)
    assert 2 <= step.loops <= 5 and step.scan_loops == 5 and not np.isfinite(step.loss)
    assert step.loss_terms == dict(loss_from=0.5, penalty=0.1, absolute=False)
    with pytest.raises(FloatingPointError, match=r"the loss is nan at step \d+ of 30.*"
                       r"\(recorded in .*\.diverged\.json\)"):
        train_looped(cfg, steps=30, batch=4, lr=10.0, cache_dir=tmp_path, progress=False,
                     cached_only=True)
    # another recipe (the control's) has no record: it is not in the cache
    with pytest.raises(LookupError, match="no cached weights"):
        train_looped(cfg, steps=5, batch=4, cache_dir=tmp_path, progress=False,
                     cached_only=True)
    with pytest.raises(LookupError, match="no recorded divergence"):
        replay_divergence(cfg, steps=5, batch=4, cache_dir=tmp_path)
    # a curriculum's record names the stage that diverged
    with pytest.raises(FloatingPointError, match=r"stage 1 of 2: training diverged"):
        train_looped(cfg, steps=3, batch=4, lr=10.0, cache_dir=tmp_path, progress=False,
                     curriculum=((4, 1, 30),))
    for f in tmp_path.iterdir():
        f.unlink()
    # the message names the learned rates before the step (h = step / (loops * substeps))
    h = cfg.step / (cfg.n_loops * cfg.substeps)
    assert f"(at the start {h * 1.0 / 0.5:.3g})" in str(err.value)
    assert "h * damping/mass = " in str(err.value)
    # and the processor it diverged on (the same seed trains differently on another)
    assert re.search(r"\(on .+, JAX \d", str(err.value))
    tr = train_looped(cfg, steps=5, batch=4, cache_dir=tmp_path, progress=False)
    assert np.all(np.isfinite(tr.loss_history)) and len(list(tmp_path.iterdir())) == 2
    # a training that succeeds removes its recipe's stale record
    weights = pathlib.Path(tr.path)
    stale = weights.with_name(weights.stem + ".diverged.json")
    for f in tmp_path.iterdir():
        f.unlink()
    stale.write_text(json.dumps(dict(message="an earlier divergence")))
    stale.with_suffix(".eqx").write_bytes(b"weights before an earlier divergence")
    train_looped(cfg, steps=5, batch=4, cache_dir=tmp_path, progress=False)
    assert not stale.exists() and len(list(tmp_path.iterdir())) == 2
