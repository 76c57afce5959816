"""`fisherdyn.attention`: entropy-normalized scaled dot-product attention."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sparsemax

import fisherdyn as fd

RNG = np.random.default_rng(20240611)
H, NQ, NK, DK, DV = 2, 5, 7, 4, 3
Q = RNG.normal(size=(H, NQ, DK))
K = RNG.normal(size=(H, NK, DK))
V = RNG.normal(size=(H, NK, DV))


def softmax_attention_np(q, k, v, T, mask=None):
    """Hand-written reference: softmax(q k^T / T) v in NumPy float64."""
    s = q @ np.swapaxes(k, -1, -2) / T
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = np.max(s, -1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    tot = e.sum(-1, keepdims=True)
    w = np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)
    return w @ v, w


@pytest.mark.parametrize("T", [None, 0.7, "per-head"])
def test_shannon_matches_handwritten_softmax_attention(T):
    # Reference: NumPy softmax attention; T = None means sqrt(d_k). Tolerance 1e-12 (float64).
    if T == "per-head":
        T_arg, T_np = jnp.array([[0.5], [1.9]]), np.array([0.5, 1.9])[:, None, None]
    else:
        T_arg = T
        T_np = math.sqrt(DK) if T is None else T
    out = fd.attention(Q, K, V, T=T_arg)
    ref, _ = softmax_attention_np(Q, K, V, T_np)
    assert out.dtype == jnp.float64 and out.shape == (H, NQ, DV)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=0, atol=1e-12)


def test_masked_shannon_matches_handwritten_and_empty_rows_are_zero():
    # Reference: NumPy softmax attention with -inf masking; an all-masked row gives zeros
    # (finite gradients). Tolerance 1e-12.
    mask = RNG.random((H, NQ, NK)) < 0.6
    mask[..., 0] = True
    mask[1, 2, :] = False  # all-masked row
    out = fd.attention(Q, K, V, mask=jnp.asarray(mask))
    ref, _ = softmax_attention_np(Q, K, V, math.sqrt(DK), mask)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=0, atol=1e-12)
    assert np.all(np.asarray(out[1, 2]) == 0.0)
    w = fd.attention_weights(Q, K, mask=jnp.asarray(mask))
    assert np.all(np.asarray(w)[~mask] == 0.0)
    g = jax.grad(lambda k: jnp.sum(fd.attention(Q, k, V, mask=jnp.asarray(mask)) ** 2))(K)
    assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize(
    "entropy", [fd.Tsallis(1.5), fd.Kaniadakis(0.3)]
)
def test_mask_equals_deleting_keys(entropy):
    # Reference: the definition of a mask: masking key j is attention over the other keys.
    # Masked keys get exactly zero weight and zero gradient. Tolerance 1e-12.
    drop = 3
    mask = np.ones((NQ, NK), bool)
    mask[:, drop] = False
    keep = np.arange(NK) != drop

    def masked(k, v):
        out = fd.attention(Q[0], k, v, entropy=entropy, T=1.3, mask=jnp.asarray(mask))
        return jnp.sum(jnp.sin(out)), out

    (_, out), (gk, gv) = jax.jit(jax.value_and_grad(masked, argnums=(0, 1), has_aux=True))(
        K[0], V[0]
    )
    unmasked = jax.jit(lambda k, v: fd.attention(Q[0], k, v, entropy=entropy, T=1.3))
    ref = unmasked(K[0][keep], V[0][keep])
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=1e-12)
    assert np.all(np.asarray(gk)[drop] == 0.0) and np.all(np.asarray(gv)[drop] == 0.0)


def test_tsallis2_is_sparsemax_attention():
    # Reference: docs/math.md §2, Tsallis q = 2 is sparsemax(z / (2T)); hand-written sort-based
    # sparsemax. Tolerance 1e-12.
    T = 0.4
    z = Q @ np.swapaxes(K, -1, -2)
    ref_w = sparsemax(z / (2 * T))
    assert np.any(ref_w == 0.0)  # the check exercises a sparse support
    out = jax.jit(lambda q, k, v: fd.attention(q, k, v, entropy=fd.Tsallis(2.0), T=T))(Q, K, V)
    np.testing.assert_allclose(np.asarray(out), ref_w @ V, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "entropy", [fd.Kaniadakis(0.3), fd.Tsallis(1.5)]
)
def test_gradients_match_finite_differences(entropy):
    # Reference: central finite differences of the forward operator (step 1e-5, float64:
    # truncation ~1e-10, rounding ~1e-11) along random directions, against reverse-mode
    # grad and forward-mode jvp. Tolerance 1e-7 (relative to 1 + |FD|).
    W = RNG.normal(size=(H, NQ, DV))
    T = 1.1

    @jax.jit
    def loss(q, k, v):
        return jnp.sum(W * fd.attention(q, k, v, entropy=entropy, T=T))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(Q, K, V)
    h = 1e-5
    for _ in range(2):
        dirs = [RNG.normal(size=x.shape) for x in (Q, K, V)]
        for i in range(3):
            plus = [x + h * d if j == i else x for j, (x, d) in enumerate(zip((Q, K, V), dirs))]
            minus = [x - h * d if j == i else x for j, (x, d) in enumerate(zip((Q, K, V), dirs))]
            fdiff = (float(loss(*plus)) - float(loss(*minus))) / (2 * h)
            ad = float(np.sum(np.asarray(grads[i]) * dirs[i]))
            assert abs(ad - fdiff) <= 1e-7 * (1 + abs(fdiff)), (i, ad, fdiff)
        tangents = tuple(jnp.asarray(d) for d in dirs)
        _, jvp = jax.jit(lambda t: jax.jvp(loss, (Q, K, V), t))(tangents)
        fdiff = (
            float(loss(*(x + h * d for x, d in zip((Q, K, V), dirs))))
            - float(loss(*(x - h * d for x, d in zip((Q, K, V), dirs))))
        ) / (2 * h)
        assert abs(float(jvp) - fdiff) <= 1e-7 * (1 + abs(fdiff))


def test_jit_and_vmap_agree_with_batched_call():
    # Reference: the batched eager call itself (batch axes are independent). Tolerance 1e-14.
    ent = fd.Kaniadakis(0.3)
    both = jax.jit(lambda q, k, v: (fd.attention(q, k, v, entropy=ent),
                                             fd.attention_weights(q, k, entropy=ent)))
    batched, w = both(Q, K, V)
    mapped = jax.jit(jax.vmap(lambda q, k, v: fd.attention(q, k, v, entropy=ent)))(Q, K, V)
    np.testing.assert_allclose(np.asarray(mapped), np.asarray(batched), rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(w.sum(-1)), 1.0, rtol=0, atol=1e-13)


def test_shape_errors():
    with pytest.raises(ValueError, match="d_k"):
        fd.attention(Q, K[..., :3], V)
    with pytest.raises(ValueError, match="n_k"):
        fd.attention(Q, K, V[:, :3])


def test_per_head_temperature_when_heads_equal_queries():
    """A per-head T of shape (heads, 1) is read per head even when n_q == heads (where
    `stationary`'s softmax-style broadcasting alone would read it per query). Reference:
    `jax.nn.softmax` of the scores divided by each head's T."""
    rng = np.random.default_rng(5)
    H = NQ = 3
    q = rng.normal(size=(H, NQ, 4))
    k = rng.normal(size=(H, 6, 4))
    T = np.array([0.5, 1.0, 2.0])[:, None]
    ref = jax.nn.softmax(np.einsum("hqd,hkd->hqk", q, k) / T[..., None], axis=-1)
    w = fd.attention_weights(q, k, entropy=fd.Shannon(), T=T)
    np.testing.assert_allclose(w, ref, rtol=0, atol=1e-14)


def test_bias_is_added_to_the_scores():
    """`bias` is an additive score bias: Shannon attention with it is softmax((q k^T + b) / T)
    (reference: NumPy, hand-written), a -inf bias entry masks its key exactly as `mask` does,
    and a bias of Flax's logits units (b_F = b / sqrt(d_k)) reproduces Flax's softmax of
    q k^T / sqrt(d_k) + b_F. Tolerance 1e-12 (float64 round-off)."""
    b = RNG.normal(size=(H, NQ, NK))
    out = fd.attention(Q, K, V, T=0.9, bias=jnp.asarray(b))
    s = (Q @ np.swapaxes(K, -1, -2) + b) / 0.9
    w = np.exp(s - s.max(-1, keepdims=True))
    ref = (w / w.sum(-1, keepdims=True)) @ V
    np.testing.assert_allclose(np.asarray(out), ref, rtol=0, atol=1e-12)
    mask = RNG.random((H, NQ, NK)) < 0.6
    mask[..., 0] = True
    additive = jnp.asarray(np.where(mask, 0.0, -np.inf))
    for entropy in (fd.Shannon(), fd.Tsallis(1.5)):
        by_bias = fd.attention_weights(Q, K, entropy=entropy, bias=additive)
        by_mask = fd.attention_weights(Q, K, entropy=entropy, mask=jnp.asarray(mask))
        np.testing.assert_allclose(np.asarray(by_bias), np.asarray(by_mask), rtol=0, atol=1e-12)
    b_flax = b[0] / math.sqrt(DK)  # a broadcast (n_q, n_k) bias
    flax_logits = Q / math.sqrt(DK) @ np.swapaxes(K, -1, -2) + b_flax
    w = np.exp(flax_logits - flax_logits.max(-1, keepdims=True))
    np.testing.assert_allclose(
        np.asarray(fd.attention_weights(Q, K, bias=jnp.asarray(b[0]))),
        w / w.sum(-1, keepdims=True), rtol=0, atol=1e-12)
