"""`fisherdyn.flax_attention_fn` as Flax's `attention_fn` (linen and nnx; optional: flax).

Reference: Flax's own `dot_product_attention` (linen) and `nnx.dot_product_attention`
through the same layers with the same parameters and dropout rng. Tolerance: float32
round-off of the attention output (1e-6; differences in the order of reductions only).
"""

import functools as ft
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd
from fisherdyn import flax_attention_fn
from helpers import RUN_ONCE

nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")

KEYS = jax.random.split(jax.random.key(0), 8)
X = jax.random.normal(KEYS[0], (2, 5, 12), jnp.float32)  # [batch, q_length, features]
KV = jax.random.normal(KEYS[1], (2, 7, 12), jnp.float32)
# at least one key kept per query (Flax averages over a fully masked row; we return zeros)
MASK = jax.random.bernoulli(KEYS[2], 0.6, (2, 1, 5, 7)).at[..., 0].set(True)
BIAS = 0.5 * jax.random.normal(KEYS[3], (2, 3, 5, 7), jnp.float32)
ATOL = 1e-6

FAMILIES = [fd.Shannon(), fd.Tsallis(1.5), fd.Tsallis(2.0), fd.Kaniadakis(0.3), fd.Burg(),
            fd.Abe(1.5), fd.Renyi(2.0), fd.SharmaMittal(2.0, 1.5)]


def test_import_fisherdyn_does_not_import_flax():
    code = "import sys, fisherdyn; assert 'flax' not in sys.modules, 'flax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_shannon_equals_linen(dropout):
    kw = dict(num_heads=3, dropout_rate=dropout, deterministic=dropout == 0.0)
    ref = nn.MultiHeadDotProductAttention(**kw)
    ours = nn.MultiHeadDotProductAttention(**kw, attention_fn=flax_attention_fn(fd.Shannon()))
    params = ref.init({"params": KEYS[4]}, X, KV)
    rngs = {"dropout": KEYS[5]}
    for mask in (None, MASK):
        a = ref.apply(params, X, KV, mask=mask, rngs=rngs)
        b = ours.apply(params, X, KV, mask=mask, rngs=rngs)
        assert b.dtype == a.dtype == jnp.float32
        np.testing.assert_allclose(b, a, rtol=0, atol=ATOL)
    # a float 0/1 mask (what nn.make_attention_mask returns) means the same
    fmask = MASK.astype(jnp.float32)
    np.testing.assert_allclose(ours.apply(params, X, KV, mask=fmask, rngs=rngs),
                               ref.apply(params, X, KV, mask=MASK, rngs=rngs), rtol=0, atol=ATOL)
    # sown weights, as Flax sows them
    _, st_a = ref.apply(params, X, KV, mask=MASK, rngs=rngs, sow_weights=True,
                        mutable=["intermediates"])
    _, st_b = ours.apply(params, X, KV, mask=MASK, rngs=rngs, sow_weights=True,
                         mutable=["intermediates"])
    np.testing.assert_allclose(jax.tree.leaves(st_b)[0], jax.tree.leaves(st_a)[0], atol=ATOL)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_shannon_equals_nnx(dropout):
    kw = dict(num_heads=3, in_features=12, decode=False, dropout_rate=dropout)
    ref = nnx.MultiHeadAttention(**kw, rngs=nnx.Rngs(0))
    ours = nnx.MultiHeadAttention(**kw, rngs=nnx.Rngs(0),
                                  attention_fn=flax_attention_fn(fd.Shannon()))
    # a float 0/1 mask: nnx's own causal path combines masks by logical_and with a float32
    # causal mask, which strict dtype promotion refuses for a boolean one
    for mask in (None, MASK[..., :5].astype(jnp.float32)):
        for causal in (False, True):
            call = dict(mask=mask, deterministic=dropout == 0.0, is_causal=causal)
            a = ref(X, KV[:, :5], rngs=nnx.Rngs(dropout=1), **call)
            b = ours(X, KV[:, :5], rngs=nnx.Rngs(dropout=1), **call)
            np.testing.assert_allclose(b, a, rtol=0, atol=ATOL)


def test_shannon_equals_flax_functions():
    # The plain functions, with bias, mask and grouped-query heads (nnx, float32, 1e-6),
    # and in float64 against linen (1e-13), also without batch axes and with a temperature.
    q = jax.random.normal(KEYS[6], (2, 5, 4, 8))
    k = jax.random.normal(KEYS[7], (2, 7, 2, 8))
    v = jax.random.normal(KEYS[0], (2, 7, 2, 8))  # jax.nn.dot_product_attention: v depth = k's
    fn = jax.jit(flax_attention_fn(fd.Shannon()), **RUN_ONCE)
    bias = jnp.asarray(BIAS[:, :1], jnp.float64)
    # (nnx's fast path, jax.nn.dot_product_attention, takes float32 under strict promotion)
    q32, k32, v32, b32 = (x.astype(jnp.float32) for x in (q, k, v, bias))
    ref = nnx.dot_product_attention(q32, k32, v32, b32, MASK)
    np.testing.assert_allclose(fn(q32, k32, v32, b32, MASK), ref, rtol=0, atol=ATOL)
    kr, vr = jnp.repeat(k, 2, axis=-2), jnp.repeat(v, 2, axis=-2)
    ref = nn.dot_product_attention(q, kr, vr, bias, MASK)
    np.testing.assert_allclose(fn(q, kr, vr, bias, MASK), ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(fn(q[0], kr[0], vr[0]), nn.dot_product_attention(q[0], kr[0], vr[0]),
                               rtol=0, atol=1e-13)
    # T = c sqrt(d) is softmax(logits / c): Flax's with the query scaled by 1/c and bias c b
    hot = jax.jit(flax_attention_fn(fd.Shannon(), T=2.0 * np.sqrt(8)), **RUN_ONCE)
    ref = nn.dot_product_attention(q / 2.0, kr, vr, bias, MASK)
    np.testing.assert_allclose(hot(q, kr, vr, 2.0 * bias, MASK), ref, rtol=0, atol=1e-13)


def test_masks():
    # A fully masked query gets zero weights; masked keys neither take weight nor leak
    # (cutting them off gives the same row); -inf in an additive bias masks the same keys;
    # a float mask with other values than 0/1 is an error (1e-6: float32 round-off).
    attn = flax_attention_fn(fd.Tsallis(1.5))
    q = jax.random.normal(KEYS[6], (1, 5, 3, 4), jnp.float32)
    k = jax.random.normal(KEYS[7], (1, 7, 3, 4), jnp.float32)
    mask = np.ones((1, 3, 5, 7), bool)
    mask[..., 1, :] = False
    mask[..., 2, 3:] = False
    bias = jnp.where(mask, 0.0, -jnp.inf).astype(jnp.float32)

    @ft.partial(jax.jit, **RUN_ONCE)
    def all_ways(q, k):
        return attn(q, k, k, mask=mask), attn(q[:, 2:3], k[:, :3], k[:, :3]), attn(q, k, k, bias)

    out, cut, biased = all_ways(q, k)
    np.testing.assert_array_equal(out[:, 1], 0.0)
    np.testing.assert_allclose(out[:, 2], cut[:, 0], rtol=0, atol=ATOL)
    np.testing.assert_allclose(biased, out, rtol=0, atol=ATOL)
    with pytest.raises(Exception, match="only 0 .masked. and 1"):
        attn(q, k, k, mask=jnp.where(mask, 0.0, -jnp.inf))


@pytest.mark.parametrize("entropy", FAMILIES, ids=lambda e: e.name)
def test_every_family_trains(entropy):
    # Finite outputs and parameter gradients through a linen layer, masks and dropout on;
    # a non-Shannon family really changes the output.
    layer = nn.MultiHeadDotProductAttention(
        num_heads=3, dropout_rate=0.1, attention_fn=flax_attention_fn(entropy))
    params = layer.init({"params": KEYS[4]}, X, KV, deterministic=True)

    def loss(p):
        out = layer.apply(p, X, KV, mask=MASK, deterministic=False, rngs={"dropout": KEYS[5]})
        return jnp.sum(out**2)

    val, grads = jax.jit(jax.value_and_grad(loss), **RUN_ONCE)(params)
    assert np.isfinite(val)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_non_shannon_differs():
    ref = nn.MultiHeadDotProductAttention(num_heads=3)
    ours = nn.MultiHeadDotProductAttention(num_heads=3,
                                           attention_fn=flax_attention_fn(fd.Tsallis(2.0)))
    params = ref.init({"params": KEYS[4]}, X, KV)
    assert float(jnp.max(jnp.abs(ours.apply(params, X, KV) - ref.apply(params, X, KV)))) > 1e-2
