"""`fd.attention(..., block_size=...)`: the blockwise path against the dense one.

The reference is the dense path on the same inputs (itself checked against closed forms and
mpmath in test_attention.py / test_stationary.py), and central finite differences for the
gradients. The blockwise path solves each query row with the same solver, so the stated
tolerances (1e-12 relative in float64, 1e-6 in float32) are far above what it should reach;
they are the contract, not the measurement (run with -s to see the measured maxima).
"""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ONE_PER_CLASS, RUN_ONCE, make, record, spec_id

import fisherdyn as fd

RNG = np.random.default_rng(31)
B, NQ, NK, D, DV = 2, 150, 170, 8, 5
BLOCK = 48  # not a divisor of NQ: the last block is padded
TOL = {jnp.float64: 1e-12, jnp.float32: 1e-6}
# Tsallis(2.0) is the battery's sparsemax; Tsallis(1.5) is its one-per-class entry
FAMILIES = ONE_PER_CLASS + [("tsallis", 2.0)]


def _inputs(dtype, n_q=NQ, n_k=NK, batch=B):
    q = jnp.asarray(RNG.normal(size=(batch, n_q, D)), dtype)
    k = jnp.asarray(RNG.normal(size=(batch, n_k, D)), dtype)
    v = jnp.asarray(RNG.normal(size=(batch, n_k, DV)), dtype)
    return q, k, v


def _masks(n_q=NQ, n_k=NK):
    """A full mask with one all-masked row (row 3 of batch 0), and a key-padding mask of
    shape (batch, 1, n_k) (the last 20 keys of batch 1 masked)."""
    full = jnp.asarray(RNG.random((B, n_q, n_k)) > 0.3).at[0, 3].set(False)
    padding = jnp.ones((B, 1, n_k), bool).at[1, :, -20:].set(False)
    return full, padding


def _attend(entropy, q, k, v, T, mask, bias, block):
    return fd.attention(q, k, v, entropy=entropy, T=T, mask=mask, bias=bias, block_size=block)


@ft.partial(eqx.filter_jit, **RUN_ONCE)
def _both(entropy, q, k, v, T, mask, bias, block):
    """(blockwise, dense) in one compiled program."""
    return (_attend(entropy, q, k, v, T, mask, bias, block),
            _attend(entropy, q, k, v, T, mask, bias, None))


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("spec", FAMILIES, ids=spec_id)
def test_forward_equals_dense(spec, dtype):
    """float64: a full mask with an all-masked row, a bias and one T per query row;
    float32: a key-padding mask of shape (batch, 1, n_k) and the default T."""
    entropy = make(spec)
    q, k, v = _inputs(dtype)
    full, padding = _masks()
    if dtype == jnp.float64:
        bias = jnp.asarray(RNG.normal(size=(NQ, NK)), dtype)
        T = jnp.asarray(RNG.uniform(1.0, 4.0, size=(B, NQ)), dtype)
        blocks, dense = _both(entropy, q, k, v, T, full, bias, BLOCK)
        assert jnp.all(blocks[0, 3] == 0)  # the all-masked row is a zero row, as dense
    else:
        blocks, dense = _both(entropy, q, k, v, None, padding, None, BLOCK)
    assert blocks.shape == dense.shape and blocks.dtype == dense.dtype
    err = _rel(blocks, dense)
    record(f"blockwise forward {spec_id(spec)} {jnp.dtype(dtype).name}", err)
    assert err <= TOL[dtype]


@pytest.mark.parametrize("spec", [("shannon",), ("kaniadakis", 0.3)], ids=spec_id)
def test_forward_long_rows(spec):
    """N = 1024 keys and queries, float32, causal mask, blocks of 128 rows."""
    entropy = make(spec)
    q, k, v = _inputs(jnp.float32, 1024, 1024, 1)
    causal = jnp.tril(jnp.ones((1024, 1024), bool))
    err = _rel(*_both(entropy, q, k, v, None, causal, None, 128))
    record(f"blockwise forward N=1024 {spec_id(spec)}", err)
    assert err <= 1e-6


def _loss(entropy, q, k, v, T, bias, mask, block):
    out = fd.attention(q, k, v, entropy=entropy, T=T, mask=mask, bias=bias, block_size=block)
    return jnp.sum(jnp.sin(out))  # a cotangent that differs between entries


_grad = ft.partial(eqx.filter_jit, **RUN_ONCE)(jax.grad(_loss, argnums=(0, 1, 2, 3, 4, 5)))
# the battery's heavier programs (component roots, self-consistent temperature) run with -m slow
_FAST_GRADIENTS = {"shannon", "kaniadakis", "tsallis", "renyi"}


@pytest.mark.parametrize("spec", [
    s if s[0] in _FAST_GRADIENTS else pytest.param(s, marks=pytest.mark.slow) for s in FAMILIES
], ids=spec_id)
def test_gradients_equal_dense(spec):
    """d/d(entropy parameters, q, k, v, T, bias) of the blockwise path equal the dense
    path's jax.grad within 1e-10 relative (float64): the same exact implicit-function
    derivative, recomputed one block at a time."""
    entropy = make(spec)
    entropy = jax.tree_util.tree_map(lambda p: jnp.asarray(p, jnp.float64), entropy)
    q, k, v = _inputs(jnp.float64, 60, 70, 1)
    T = jnp.asarray(2.5)
    bias = jnp.asarray(RNG.normal(size=(60, 70)))
    mask = jnp.asarray(RNG.random((1, 60, 70)) > 0.2).at[0, 5].set(False)
    dense = _grad(entropy, q, k, v, T, bias, mask, None)
    blocks = _grad(entropy, q, k, v, T, bias, mask, 16)
    names = ["entropy", "q", "k", "v", "T", "bias"]
    for name, a, b in zip(names, jax.tree_util.tree_leaves(blocks),
                          jax.tree_util.tree_leaves(dense), strict=False):
        err = _rel(a, b) if jnp.max(jnp.abs(b)) > 0 else float(jnp.max(jnp.abs(a)))
        record(f"blockwise grad {spec_id(spec)} {name}", err)
        assert err <= 1e-10, name
    assert jnp.all(blocks[1][0, 5] == 0)  # the all-masked query has no gradient


@pytest.mark.parametrize(
    "spec", [("kaniadakis", 0.3), pytest.param(("renyi", 1.5), marks=pytest.mark.slow)],
    ids=spec_id)
def test_gradients_finite_differences(spec):
    """Directional derivatives in (q, k, v, T, family parameter) against central
    differences, step 1e-5 in float64: truncation ~1e-10, round-off ~1e-11 relative."""
    param = jnp.asarray(spec[1], jnp.float64)
    q, k, v = _inputs(jnp.float64, 40, 50, 1)
    args = (param, q, k, v, jnp.asarray(1.7))
    dirs = tuple(jnp.asarray(RNG.normal(size=jnp.shape(a))) for a in args)

    def f(param, q, k, v, T):
        return _loss(make((spec[0], param)), q, k, v, T, None, None, 16)

    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4)), **RUN_ONCE)(*args)
    f = jax.jit(f, **RUN_ONCE)
    h = 1e-5
    for i in range(5):
        plus = [a + h * d if j == i else a for j, (a, d) in enumerate(zip(args, dirs))]
        minus = [a - h * d if j == i else a for j, (a, d) in enumerate(zip(args, dirs))]
        fd_dir = (f(*plus) - f(*minus)) / (2 * h)
        ad_dir = jnp.sum(grads[i] * dirs[i])
        err = abs(float(fd_dir - ad_dir)) / max(abs(float(fd_dir)), 1e-3)
        record(f"blockwise grad vs finite differences {spec_id(spec)} arg {i}", err)
        assert err <= 1e-6


def test_memory_is_linear():
    """Temporaries of the compiled forward+backward of one head (float32, d = 64, blocks of
    64 rows): doubling N from 1024 to 2048 at most doubles them blockwise (linear, plus a
    margin of 10 %), and at N = 2048 they stay below half of one (N, N) float32 array; the
    dense path's exceed one such array (it holds the scores and the weights)."""
    d = 64

    def temp_bytes(n, block):
        x = jnp.zeros((n, d), jnp.float32)
        loss = lambda q, k, v: jnp.sum(fd.attention(q, k, v, block_size=block))  # noqa: E731
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), **RUN_ONCE)
        return grad.lower(x, x, x).compile().memory_analysis().temp_size_in_bytes

    square = 2048 * 2048 * 4
    small, large = temp_bytes(1024, 64), temp_bytes(2048, 64)
    record("blockwise temporaries N=2048 / N=1024", large / small)
    assert large <= 2.2 * small
    assert large < square / 2
    assert temp_bytes(2048, None) > square


def test_block_size_choice():
    q, k, v = _inputs(jnp.float64, 20, 20, 1)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="block_size"):
            fd.attention(q, k, v, block_size=bad)
    from fisherdyn._attention._blockwise import query_block_size

    # a block of at least n_q rows is the dense path; automatic: dense up to 64 MiB of
    # float32 scores (4096 x 4096), blocks of about 8 MiB (512 rows) above
    assert query_block_size(20, 20, 1, 8, 20) is None
    assert query_block_size(20, 20, 1, 8, 7) == 7
    assert query_block_size(4096, 4096, 1, 4, None) is None
    assert query_block_size(8192, 8192, 1, 4, None) == 256
    assert query_block_size(4096, 4096, 2, 4, None) == 256


def test_flax_drop_in_blocks():
    """`flax_attention_fn(..., block_size=...)` against its dense path: Flax's layout
    `[batch, length, heads, depth]`, grouped-query heads (2 key heads for 4 query heads),
    a causal mask built per block from the query positions, a 0/1 float padding mask, a
    bias and one T per head; float64, 1e-12 relative."""
    entropy = fd.Kaniadakis(0.3)
    n, d = 90, 8
    query = jnp.asarray(RNG.normal(size=(2, n, 4, d)))
    key = jnp.asarray(RNG.normal(size=(2, n, 2, d)))
    value = jnp.asarray(RNG.normal(size=(2, n, 2, d)))
    bias = jnp.asarray(RNG.normal(size=(4, n, n)))
    mask = jnp.ones((2, 1, 1, n)).at[1, ..., -7:].set(0.0)
    T = jnp.asarray([1.0, 2.0, 3.0, 4.0])[:, None, None]

    def run(block):
        fn = fd.flax_attention_fn(entropy, T, block_size=block)
        return fn(query, key, value, bias=bias, mask=mask, is_causal=True)

    blocks, dense = jax.jit(lambda: (run(32), run(None)), **RUN_ONCE)()
    assert blocks.shape == dense.shape == (2, n, 4, d)
    err = _rel(blocks, dense)
    record("blockwise flax drop-in", err)
    assert err <= 1e-12
    with pytest.raises(ValueError, match="block_size"):
        fd.flax_attention_fn(entropy, block_size=32)(query, key, value, dropout_rate=0.1,
                                                      dropout_rng=jax.random.key(0))


def test_equinox_drop_in_blocks():
    """`fd.MultiheadAttention(..., block_size=...)` against the same module's dense path
    (the same parameters): a per-head mask and a learnable per-head T, output and gradient
    in T; float64, 1e-12 relative."""
    n = 70
    kw = dict(entropy=fd.Tsallis(1.5), T=jnp.asarray([[[1.0]], [[3.0]]]), key=jax.random.key(0))
    dense = fd.MultiheadAttention(2, 12, dtype=jnp.float64, **kw)
    blocks = fd.MultiheadAttention(2, 12, dtype=jnp.float64, block_size=16, **kw)
    x = jnp.asarray(RNG.normal(size=(n, 12)))
    mask = jnp.asarray(RNG.random((2, n, n)) > 0.3)

    @ft.partial(eqx.filter_jit, **RUN_ONCE)
    def run(model):
        return eqx.filter_value_and_grad(lambda m: jnp.sum(jnp.sin(m(x, x, x, mask))))(model)

    (value_b, grad_b), (value_d, grad_d) = run(blocks), run(dense)
    assert abs(float(value_b - value_d)) <= 1e-12 * abs(float(value_d))
    assert _rel(grad_b.T, grad_d.T) <= 1e-12
    assert _rel(grad_b.query_proj.weight, grad_d.query_proj.weight) <= 1e-12
    with pytest.raises(ValueError, match="block_size"):
        fd.MultiheadAttention(2, 12, dropout_p=0.1, block_size=16, key=jax.random.key(0))(
            x, x, x, key=jax.random.key(1))


def test_is_causal():
    """`is_causal=True` equals the explicit `jnp.tril` mask, dense and blockwise (combined
    with a key-padding mask), float64, 1e-12 relative."""
    entropy = fd.Tsallis(1.5)
    q, k, v = _inputs(jnp.float64, 100, 100, 1)
    padding = jnp.ones((1, 1, 100), bool).at[..., 90:].set(False)
    tril = jnp.tril(jnp.ones((100, 100), bool)) & padding

    @ft.partial(jax.jit, **RUN_ONCE)
    def run(q, k, v):
        causal = lambda block: fd.attention(  # noqa: E731
            q, k, v, entropy=entropy, mask=padding, is_causal=True, block_size=block)
        return causal(32), causal(None), fd.attention(q, k, v, entropy=entropy, mask=tril)

    blocks, dense, explicit = run(q, k, v)
    assert _rel(dense, explicit) <= 1e-12
    assert _rel(blocks, explicit) <= 1e-12
