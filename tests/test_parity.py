"""Complex inputs, `promote_dtype` and half precision against Flax, Equinox and NumPy.

Complex: Flax and Equinox normalize complex logits by `jax.nn.softmax`, the holomorphic
softmax; the drop-ins must give it for `Shannon()` (bitwise against `flax.linen`, which runs
the same operations) and every other entry point must refuse complex values with a one-line
`TypeError` rather than cast them to their real part.

Half precision: the reference is the exact softmax (float64) of the same half-precision
logits. fisherdyn normalizes in float32 and rounds once, so its weights lie within half an
ulp of it (0.51 allows the float32 round-off, ~1e-7 relative, a small fraction of a
half-precision ulp); Flax's half-precision softmax rounds its intermediates, which is the
whole of the difference between the two.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd

nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")

Z = jnp.array([[1.0 + 5.0j, 2.0 + 0.0j, 0.5 - 1.0j]], jnp.complex64)
Y = jnp.array([[1.0, 0.0, 0.0]], jnp.float32)
CALLS = {
    "stationary": lambda: fd.stationary(fd.Shannon(), Z, 1.0),
    "stationary_masked": lambda: fd.stationary(fd.Tsallis(1.5), Z, 1.0, mask=jnp.ones(3, bool)),
    "stationary_info": lambda: fd.stationary_info(fd.Tsallis(1.5), Z, 1.0),
    "stationary_jacobian": lambda: fd.stationary_jacobian(fd.Kaniadakis(0.3), Z, 1.0),
    "solve_stationary": lambda: fd.solve_stationary(fd.Renyi(2.0), Z, 1.0),
    "complex_T": lambda: fd.stationary(fd.Shannon(), jnp.real(Z), 1.0 + 1.0j),
    "entmax15": lambda: fd.entmax15(Z),
    "sparsemax": lambda: fd.sparsemax(Z),
    "entmax_bisect": lambda: fd.entmax(Z, 1.25),
    "entmax15_loss": lambda: fd.entmax15_loss(Z, Y),
    "fenchel_young_loss": lambda: fd.fenchel_young_loss(fd.Tsallis(1.5), Z, Y),
    "attention_q": lambda: fd.attention(Z.T, jnp.ones((3, 1)), jnp.ones((3, 2))),
    "attention_v": lambda: fd.attention(jnp.ones((2, 1)), jnp.ones((3, 1)), Z.T),
    "attention_weights_bias": lambda: fd.attention_weights(
        jnp.ones((1, 1)), jnp.ones((3, 1)), bias=Z),
    "simulate": lambda: fd.simulate(fd.Shannon(), Z[0], 1.0, t1=1.0),
    "relax": lambda: fd.relax(fd.Shannon(), Z[0], 1.0, mass=1.0, damping=1.0),
    "relax_rho0": lambda: fd.relax(fd.Shannon(), jnp.real(Z[0]), 1.0, mass=1.0, damping=1.0,
                                   rho0=jnp.full(3, 1 / 3, jnp.complex64)),
    "relaxation_spectrum": lambda: fd.relaxation_spectrum(
        fd.Shannon(), Z[0], 1.0, mass=1.0, damping=1.0),
    "flax_tsallis": lambda: fd.flax_attention_fn(fd.Tsallis(1.5))(*_complex_qkv(jnp.complex64)),
    "flax_fp32_softmax": lambda: fd.flax_attention_fn()(
        *_complex_qkv(jnp.complex64), force_fp32_for_softmax=True),
}


def _complex_qkv(dtype, shape=(2, 5, 3, 4)):
    ks = jax.random.split(jax.random.key(0), 6)
    real = jnp.float32 if dtype == jnp.complex64 else jnp.float64
    return tuple(
        jax.lax.complex(jax.random.normal(ks[i], shape, real),
                        jax.random.normal(ks[i + 3], shape, real))
        for i in range(3)
    )


@pytest.mark.parametrize("name", list(CALLS))
def test_complex_input_is_refused_in_one_line(name):
    """Before: a DeprecationWarning and the real part ([1+5j, 2] gave [0.269, 0.731])."""
    with pytest.raises((TypeError, ValueError)) as info:
        CALLS[name]()
    message = str(info.value)
    assert "\n" not in message and ("complex" in message or "imaginary" in message), message


def test_complex_input_refused_under_jit():
    with pytest.raises(TypeError, match="complex"):
        jax.jit(lambda z: fd.stationary(fd.Tsallis(1.5), z, 1.0))(Z)


@pytest.mark.parametrize("dtype", [jnp.complex64, jnp.complex128])
def test_complex_shannon_flax_drop_in_is_flax(dtype):
    """Bitwise against flax.linen (the same operations), masks and causal included."""
    if dtype == jnp.complex128 and not jax.config.jax_enable_x64:
        pytest.skip("complex128 needs jax_enable_x64")
    q, k, v = _complex_qkv(dtype)
    f = fd.flax_attention_fn(fd.Shannon())
    mask = jax.random.bernoulli(jax.random.key(3), 0.7, (2, 3, 5, 5)).at[..., 0].set(True)
    causal = nn.make_causal_mask(jnp.ones((2, 5)))
    with jax.numpy_dtype_promotion("standard"):  # Flax's masked fill is a real scalar
        assert jnp.all(f(q, k, v) == nn.dot_product_attention(q, k, v))
        assert jnp.all(f(q, k, v, mask=mask) == nn.dot_product_attention(q, k, v, mask=mask))
        flax_causal = nn.dot_product_attention(q, k, v, mask=causal)
    assert jnp.all(f(q, k, v, is_causal=True) == flax_causal)
    # holomorphic softmax, independently: e^l / sum e^l in NumPy (complex128)
    logits = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.complex128) / 2.0,
                       np.asarray(k, np.complex128))
    e = np.exp(logits)
    ref = np.einsum("bhqk,bkhd->bqhd", e / e.sum(-1, keepdims=True), np.asarray(v))
    tol = 1e-5 if dtype == jnp.complex64 else 1e-12  # the dtype's round-off, amplified by |e^l|
    np.testing.assert_allclose(np.asarray(f(q, k, v)), ref, rtol=tol, atol=tol)
    # gradients through the complex softmax, as Flax's
    loss = lambda fn: jax.grad(lambda q: jnp.sum(jnp.abs(fn(q, k, v)) ** 2))(q)
    with jax.numpy_dtype_promotion("standard"):
        assert jnp.all(loss(f) == loss(nn.dot_product_attention))


def test_complex_shannon_equinox_drop_in_is_equinox():
    """Equinox's weights are its complex softmax too (float32 round-off, as for real inputs:
    Equinox's and fisherdyn's masked fills differ in the operations, not the values)."""
    eqx = pytest.importorskip("equinox")
    key = jax.random.key(1)
    ref = eqx.nn.MultiheadAttention(2, 8, dtype=jnp.complex64, key=key)
    ours = fd.MultiheadAttention(2, 8, dtype=jnp.complex64, key=key)
    x = jax.lax.complex(jax.random.normal(key, (5, 8), jnp.float32),
                        jax.random.normal(jax.random.key(2), (5, 8), jnp.float32))
    mask = jnp.tril(jnp.ones((5, 5), bool))
    for m in (None, mask):
        with jax.numpy_dtype_promotion("standard"):  # Equinox's own promotions
            expected = ref(x, x, x, mask=m)
        np.testing.assert_allclose(ours(x, x, x, mask=m), expected, atol=1e-6)
    with pytest.raises(TypeError, match="Shannon"):
        fd.MultiheadAttention(2, 8, dtype=jnp.complex64, entropy=fd.Tsallis(1.5), key=key)(
            x, x, x)


def test_promote_dtype_as_nnx():
    """nnx's `promote_dtype=`: called on the (query, key, value) tuple with `dtype=`."""
    ks = jax.random.split(jax.random.key(4), 3)
    q, k, v = (jax.random.normal(kk, (2, 6, 2, 4), jnp.float32) for kk in ks)
    calls = []

    def to_bf16(args, dtype=None):
        calls.append((len(args), dtype))
        return tuple(jnp.asarray(a, jnp.bfloat16) for a in args)

    f = fd.flax_attention_fn(fd.Shannon())
    ours = f(q, k, v, promote_dtype=to_bf16)
    assert ours.dtype == jnp.bfloat16 and calls == [(3, None)]
    with jax.numpy_dtype_promotion("standard"):  # jax.nn.dot_product_attention's own
        ref = nnx.dot_product_attention(q, k, v, promote_dtype=to_bf16)
    assert ref.dtype == jnp.bfloat16
    # the default is Flax's default promotion (bitwise equal to nnx in float32)
    assert jnp.all(f(q, k, v, promote_dtype=nnx.nn.dtypes.promote_dtype) == f(q, k, v))
    assert jnp.all(f(q, k, v) == nnx.dot_product_attention(q, k, v))
    # the layer passes attention_fn through unchanged
    layer = nnx.MultiHeadAttention(2, 8, qkv_features=8, decode=False, rngs=nnx.Rngs(0),
                                   attention_fn=f)
    assert layer(jnp.ones((1, 3, 8), jnp.float32)).shape == (1, 3, 8)


def _ulps(got, exact, dtype):
    """|got - exact| in ulps of `dtype` at `exact`."""
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    scale = np.maximum(np.abs(exact), float(jnp.finfo(dtype).smallest_normal))
    return np.abs(got - exact) / (float(jnp.finfo(dtype).eps) * 2.0 ** np.floor(np.log2(scale)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_weights_are_rounded_once(dtype):
    """The weights (one-hot values read them out exactly) against the float64 softmax of
    the same half-precision logits: fisherdyn within 0.51 ulp, Flax's own further off (so
    "equal to Flax" in half precision is Flax's rounding), and bitwise equal to Flax once
    Flax normalizes in float32 too (`force_fp32_for_softmax=True`)."""
    ks = jax.random.split(jax.random.key(5), 2)
    q, k = (2 * jax.random.normal(kk, (4, 16, 4, 16)).astype(dtype) for kk in ks)
    v = jnp.broadcast_to(jnp.eye(16, dtype=dtype)[None, :, None, :], q.shape)
    logits = jnp.einsum("...qhd,...khd->...qhk", q / jnp.sqrt(16).astype(dtype), k)
    logits = np.asarray(logits.astype(jnp.float32), np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    exact = e / e.sum(-1, keepdims=True)
    f = fd.flax_attention_fn(fd.Shannon())
    ours = f(q, k, v)
    assert ours.dtype == dtype
    assert _ulps(ours, exact, dtype).max() <= 0.51
    assert _ulps(nn.dot_product_attention(q, k, v), exact, dtype).max() > 1.0
    fp32 = dict(force_fp32_for_softmax=True)
    with jax.numpy_dtype_promotion("standard"):  # float32 weights times half values
        assert jnp.all(f(q, k, v, **fp32) == nn.dot_product_attention(q, k, v, **fp32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_float_weights_bitwise_flax(dtype):
    if dtype == jnp.float64 and not jax.config.jax_enable_x64:
        pytest.skip("float64 needs jax_enable_x64")
    ks = jax.random.split(jax.random.key(6), 3)
    q, k, v = (2 * jax.random.normal(kk, (2, 9, 3, 8), dtype) for kk in ks)
    f = fd.flax_attention_fn(fd.Shannon())
    assert jnp.all(f(q, k, v) == nn.dot_product_attention(q, k, v))
    assert jnp.all(f(q, k, v, dropout_rate=0.2, deterministic=True)
                   == nnx.dot_product_attention(q, k, v, dropout_rate=0.2, deterministic=True))


# --------------------------------------------------------------------- float32 accuracy


def _bisect_float32(x, alpha, n_iter=50):
    """entmax_bisect's algorithm (the `entmax` package) in NumPy float32, independent of
    fisherdyn: 50 bisection steps on the threshold of [(alpha-1) x - tau]_+^(1/(alpha-1))
    from [max - 1, max - (1/d)^(alpha-1)], then a division by the sum."""
    one = np.float32(1)
    a = np.float32(alpha)
    X = x.astype(np.float32) * (a - one)
    tau_lo = X.max(-1, keepdims=True) - one
    tau_hi = X.max(-1, keepdims=True) - (one / np.float32(X.shape[-1])) ** (a - one)
    p = lambda tau: np.maximum(X - tau, np.float32(0)) ** (one / (a - one))  # noqa: E731
    f_lo = p(tau_lo).sum(-1, keepdims=True) - one
    dm = tau_hi - tau_lo
    for _ in range(n_iter):
        dm = dm / np.float32(2)
        p_m = p(tau_lo + dm)
        tau_lo = np.where((p_m.sum(-1, keepdims=True) - one) * f_lo >= 0, tau_lo + dm, tau_lo)
    return p_m / p_m.sum(-1, keepdims=True)


def _float32_batches():
    rng = np.random.default_rng(7)
    return [(4 * rng.normal(size=(512, 64))).astype(np.float32),
            rng.normal(size=(1024, 5)).astype(np.float32),
            rng.uniform(-1, 1, size=(512, 10)).astype(np.float32)]


def _float32_error(entropy, z):
    """max |rho32 - rho64| with the float64 solve of the same (float32) scores."""
    ref = np.asarray(fd.stationary(entropy, jnp.asarray(z, jnp.float64), 1.0))
    got = np.asarray(fd.stationary(entropy, jnp.asarray(z), 1.0), np.float64)
    return float(np.abs(got - ref).max()), ref


# 1.25 and 1.5 by default; the other three with -m slow
@pytest.mark.parametrize(
    "alpha", [a if a in (1.25, 1.5) else pytest.param(a, marks=pytest.mark.slow)
              for a in (1.1, 1.25, 1.5, 1.75, 2.0)])
def test_float32_entmax_within_bisection_error(alpha):
    """Before: 1.5-1.9e-6 for 1 < alpha < 2 (the sum's stopping tolerance, 16 eps, left in
    the weights) against the bisection's 1-5e-7. The bound is the bisection's own largest
    error over the same batches (it has no fisherdyn code in it)."""
    ours = theirs = 0.0
    for z in _float32_batches():
        err, ref = _float32_error(fd.Tsallis(alpha), z)
        ours = max(ours, err)
        bis = _bisect_float32(z / np.float32(alpha), alpha).astype(np.float64)
        theirs = max(theirs, float(np.abs(bis - ref).max()))
    assert ours <= theirs, (ours, theirs)


@pytest.mark.parametrize(("entropy", "bound"), [
    (fd.Tsallis(0.5), 2.4e-7), (fd.Tsallis(2.5), 2.4e-7), (fd.Kaniadakis(0.3), 2.4e-7),
    (fd.Burg(), 2.4e-7), (fd.Abe(1.5), 5e-7)], ids=lambda x: getattr(x, "name", ""))
def test_float32_error_of_the_other_separable_families(entropy, bound):
    """Four float32 ulps of a weight near 1 (4 * 6e-8), eight for Abe, whose components are
    an inner iteration of their own (before: up to 1.8e-6 for Tsallis(0.5), Kaniadakis and
    Abe, whose Newton iteration left its 16-eps stop in the weights)."""
    worst = max(_float32_error(entropy, z)[0] for z in _float32_batches())
    assert worst <= bound, worst
