"""`fisherdyn`'s `MultiheadAttention`: `eqx.nn.MultiheadAttention` with an entropy.

Reference: `eqx.nn.MultiheadAttention` built from the same PRNG key (identical parameters),
called on the same inputs, masks and dropout keys. Tolerance: float32 round-off of the
output (1e-6).
"""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd
from fisherdyn import MultiheadAttention
from helpers import RUN_ONCE

KEYS = jax.random.split(jax.random.key(1), 6)
QL, KL, D, H = 5, 7, 12, 3
X = jax.random.normal(KEYS[0], (QL, D), jnp.float32)
KV = jax.random.normal(KEYS[1], (KL, D), jnp.float32)
# at least one key kept per query (Equinox averages over a fully masked row; we return 0)
MASK = jax.random.bernoulli(KEYS[2], 0.6, (QL, KL)).at[:, 0].set(True)
HMASK = jax.random.bernoulli(KEYS[3], 0.6, (H, QL, KL)).at[..., 0].set(True)
ATOL = 1e-6
ARGS = dict(num_heads=H, query_size=D, use_query_bias=True, use_output_bias=True,
            dtype=jnp.float32)

FAMILIES = [fd.Shannon(), fd.Tsallis(1.5), fd.Tsallis(2.0), fd.Kaniadakis(0.3), fd.Burg(),
            fd.Abe(1.5), fd.Renyi(2.0), fd.SharmaMittal(2.0, 1.5)]


def _pair(**kw):
    return (eqx.nn.MultiheadAttention(**ARGS, **kw, key=KEYS[4]),
            MultiheadAttention(**ARGS, **kw, key=KEYS[4]))


def test_same_parameters_from_the_same_key():
    ref, ours = _pair()
    for name in ("query_proj", "key_proj", "value_proj", "output_proj"):
        for a, b in zip(jax.tree.leaves(getattr(ref, name)), jax.tree.leaves(getattr(ours, name))):
            np.testing.assert_array_equal(a, b)
    assert ours.qk_size == ref.qk_size and ours.num_heads == ref.num_heads


def test_shannon_equals_equinox():
    ref, ours = _pair()
    # a 0/1 float mask means the boolean one
    for mask, bmask in ((None, None), (MASK, MASK), (HMASK, HMASK),
                        (MASK.astype(jnp.float32), MASK)):
        np.testing.assert_allclose(ours(X, KV, KV, mask), ref(X, KV, KV, bmask),
                                   rtol=0, atol=ATOL)
    f = eqx.filter_jit(lambda m, x, kv: m(x, kv, kv, MASK))
    np.testing.assert_allclose(f(ours, X, KV), f(ref, X, KV), rtol=0, atol=ATOL)


def test_shannon_equals_equinox_with_dropout():
    ref, ours = _pair(dropout_p=0.3)
    # training: the same per-head dropout keys, so the same dropped weights
    np.testing.assert_allclose(ours(X, KV, KV, MASK, key=KEYS[5]),
                               ref(X, KV, KV, MASK, key=KEYS[5]), rtol=0, atol=ATOL)
    # inference mode, by argument and by eqx.nn.inference_mode
    np.testing.assert_allclose(ours(X, KV, KV, MASK, inference=True),
                               ref(X, KV, KV, MASK, inference=True), rtol=0, atol=ATOL)
    ours_i, ref_i = eqx.nn.inference_mode(ours), eqx.nn.inference_mode(ref)
    np.testing.assert_allclose(ours_i(X, KV, KV), ref_i(X, KV, KV), rtol=0, atol=ATOL)
    with pytest.raises(RuntimeError):
        ours(X, KV, KV)  # dropout in training mode needs a key, as in Equinox


def test_temperature_and_masks():
    ref, ours = _pair()
    # T = c sqrt(qk_size) is softmax(logits / c): Equinox's with the query scaled by 1/c
    hot = MultiheadAttention(**ARGS, T=2.0 * np.sqrt(ours.qk_size), key=KEYS[4])
    ref_hot = eqx.tree_at(lambda m: (m.query_proj.weight, m.query_proj.bias), ref,
                          (ref.query_proj.weight / 2, ref.query_proj.bias / 2))
    np.testing.assert_allclose(hot(X, KV, KV), ref_hot(X, KV, KV), rtol=0, atol=ATOL)
    # a fully masked query: zero weights, so the output is the output projection's bias
    mask = MASK.at[1].set(False)
    out = eqx.tree_at(lambda m: m.entropy, ours, fd.Tsallis(1.5))(X, KV, KV, mask)
    np.testing.assert_allclose(out[1], ours.output_proj.bias, rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="mask must have shape"):
        ours(X, KV, KV, MASK[:, :3])
    with pytest.raises(Exception, match="only 0 .masked. and 1"):
        ours(X, KV, KV, jnp.where(MASK, 0.0, -jnp.inf))


@pytest.mark.parametrize("entropy", FAMILIES, ids=lambda e: e.name)
def test_every_family_trains(entropy):
    # Finite outputs and gradients for every family (mask and dropout on, learned T).
    attn = MultiheadAttention(**ARGS, dropout_p=0.1, entropy=entropy, T=jnp.asarray(2.0),
                              key=KEYS[4])

    @ft.partial(eqx.filter_jit, **RUN_ONCE)
    @eqx.filter_value_and_grad
    def loss(m):
        return jnp.sum(m(X, KV, KV, MASK, key=KEYS[5]) ** 2)

    val, grads = loss(attn)
    assert np.isfinite(val)
    leaves = jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))
    assert all(np.all(np.isfinite(g)) for g in leaves)
    assert np.abs(grads.T) > 0  # the temperature is a trainable leaf
