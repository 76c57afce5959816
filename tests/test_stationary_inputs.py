"""Input conventions of the stationary operators: T broadcasts like `softmax(z / T)`,
`where=` as an alias of `mask`, float masks refused with the fix named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd


RNG = np.random.default_rng(18)
Z = jnp.asarray(RNG.normal(size=(3, 5)))
TS = jnp.asarray([0.5, 1.0, 2.0])


@pytest.mark.parametrize("T", [TS[:, None], TS], ids=["per-row-keys-axis", "batch-shape"])
def test_T_broadcasts_like_softmax(T):
    # Reference: jax.nn.softmax(z / T) (round-off, 1e-15); every family keeps the shape.
    ref = jax.nn.softmax(Z / TS[:, None])
    rho = fd.stationary(fd.Shannon(), Z, T)
    assert rho.shape == Z.shape
    np.testing.assert_allclose(rho, ref, rtol=0, atol=1e-15)
    rows = np.stack([fd.stationary(fd.Tsallis(1.5), Z[i], TS[i]) for i in range(3)])
    for e in (fd.Tsallis(1.5), fd.Renyi(2.0)):
        assert fd.stationary(e, Z, T).shape == Z.shape
    np.testing.assert_allclose(fd.stationary(fd.Tsallis(1.5), Z, T), rows, rtol=0, atol=1e-14)
    e = fd.Kaniadakis(0.3)
    assert fd.stationary_info(e, Z, T).rho.shape == Z.shape
    assert fd.stationary_jacobian(e, Z, T).shape == (3, 5, 5)
    F = fd.free_energy(fd.Shannon(), Z, rho, T)
    assert F.shape == (3,)
    F_rows = [fd.free_energy(fd.Shannon(), Z[i], rho[i], TS[i]) for i in range(3)]
    np.testing.assert_allclose(F, F_rows, rtol=1e-14)


def test_T_with_key_axis_elsewhere():
    ref = jax.nn.softmax(Z / TS[:, None])
    rho = fd.stationary(fd.Shannon(), Z.T, TS[None, :], axis=0)
    np.testing.assert_allclose(rho.T, ref, rtol=0, atol=1e-15)
    rho = fd.stationary(fd.Kaniadakis(0.3), Z.T, TS, axis=0)  # the batch shape
    assert rho.shape == Z.T.shape


def test_T_varying_along_keys_is_an_error():
    with pytest.raises(ValueError, match="varies along the key axis"):
        fd.stationary(fd.Shannon(), Z, jnp.ones(5))
    with pytest.raises(ValueError, match="varies along the key axis"):
        fd.stationary(fd.Shannon(), jnp.zeros((3, 3)), jnp.ones((3, 3)))
    with pytest.raises(ValueError, match="does not broadcast"):
        fd.stationary(fd.Shannon(), Z, jnp.ones(4))
    with pytest.raises(ValueError, match="does not broadcast"):
        fd.stationary(fd.Shannon(), Z, jnp.ones((2, 1, 1)))  # would enlarge the scores


def test_where_alias_of_mask():
    keep = jnp.asarray(RNG.random((3, 5)) < 0.6).at[:, 0].set(True)
    for e in (fd.Shannon(), fd.Tsallis(2.0)):
        a = fd.stationary(e, Z, 0.7, mask=keep)
        b = fd.stationary(e, Z, 0.7, where=keep)
        np.testing.assert_array_equal(a, b)
        assert np.all(np.asarray(b)[~np.asarray(keep)] == 0)
    with pytest.raises(TypeError, match="not both"):
        fd.stationary(fd.Shannon(), Z, mask=keep, where=keep)


def test_float_mask_refused_with_the_fix():
    with pytest.raises(TypeError, match="boolean mask.*additive"):
        fd.stationary(fd.Shannon(), Z, mask=jnp.ones((3, 5)))
    with pytest.raises(TypeError, match="boolean mask.*additive"):
        fd.stationary(fd.Kaniadakis(0.3), Z, where=jnp.ones((3, 5)))


@pytest.mark.parametrize("q", [1.0001, 1 / 1.0001, 1.001])
def test_abe_near_one_wide_scores(q):
    # Abe close to q = 1 (the asinh-form law) on scores spread over 8000 at T = 30: rows
    # whose keys sit between the Shannon core and the algebraic tail (|sinh(eps) w| ~ 1)
    # were NaN. Reference: solve_stationary(method="scipy"), an independent bracketed root;
    # tolerance 1e-13 absolute on the weights (1.4e-14 measured), 1e-13 on the sums.
    rng = np.random.default_rng(3)
    z = rng.normal(size=(16, 64))
    z = z / (z.max(-1, keepdims=True) - z.min(-1, keepdims=True)) * 8000
    rho = np.asarray(fd.stationary(fd.Abe(q), jnp.asarray(z), 30.0))
    assert np.all(np.isfinite(rho))
    assert np.max(np.abs(rho.sum(-1) - 1)) <= 1e-13
    for i in (0, 7, 15):  # NaN at q = 1.0001 before the fix
        ref = fd.solve_stationary(fd.Abe(q), jnp.asarray(z[i]), 30.0, method="scipy")
        np.testing.assert_allclose(rho[i], np.asarray(ref.rho), rtol=0, atol=1e-13)


@pytest.mark.parametrize("q", [2.5, 3.0, 5.0])
def test_tsallis_above_two_on_the_simplex_at_large_T(q):
    # Tsallis q > 2 at large T: one ulp of the multiplier moves the sum by up to 1e-4
    # (q = 5, T = 1000), so the root alone missed the simplex; the weights are normalized
    # after it. Bound 1e-13 (float64; 4.4e-16 measured), gaussian and Cauchy rows, N 64-1024.
    rng = np.random.default_rng(4)
    worst = 0.0
    for N in (64, 1024):
        for Z in (rng.normal(size=(8, N)), rng.standard_cauchy(size=(8, N))):
            for T in (10.0, 100.0, 1000.0):
                rho = np.asarray(fd.stationary(fd.Tsallis(q), jnp.asarray(Z), T))
                assert np.all(np.isfinite(rho)) and np.all(rho >= 0)
                worst = max(worst, np.max(np.abs(rho.sum(-1) - 1)))
    assert worst <= 1e-13, worst


# --------------------------------------------------------------------------- bad inputs

Z3 = np.array([1.0, 0.5, -0.2])


def _one_line_value_error(fn, match):
    with pytest.raises(ValueError, match=match) as info:
        jax.block_until_ready(fn())
    assert len(str(info.value).splitlines()) == 1, str(info.value)


def test_concrete_bad_inputs_raise_one_line_value_errors():
    """Concrete NaN / +inf scores and T <= 0 or non-finite raise a one-line ValueError from
    every entry point that takes scores and T (they raised a 37-line EquinoxRuntimeError,
    which `except ValueError` does not catch)."""
    nan = Z3.copy()
    nan[1] = np.nan
    inf = Z3.copy()
    inf[2] = np.inf
    entropy = fd.Tsallis(0.5)
    entries = [
        lambda z, T: fd.stationary(fd.Shannon(), z, T),  # the softmax path
        lambda z, T: fd.stationary(entropy, z, T),
        lambda z, T: fd.stationary_info(entropy, z, T).rho,
        lambda z, T: fd.stationary_jacobian(entropy, z, T),
        lambda z, T: fd.solve_stationary(entropy, z, T).rho,
        lambda z, T: fd.relaxation_spectrum(entropy, z, T, mass=1.0, damping=1.0).omega2,
        lambda z, T: fd.simulate(entropy, z, T, mass=1.0, damping=1.0, t1=1.0).rho,
    ]
    for fn in entries:
        for z in (nan, inf, jnp.asarray(nan)):
            _one_line_value_error(lambda: fn(z, 1.0), r"scores (contain NaN or \+inf|must)")
        for T in (0.0, -1.0, np.nan, np.inf, jnp.asarray(0.0)):
            _one_line_value_error(lambda: fn(Z3, T), "T must be finite and > 0")
    renyi = lambda z, T: fd.stationary_branches(fd.Renyi(2.0), z, T).rho  # noqa: E731
    _one_line_value_error(lambda: renyi(nan, 1.0), r"NaN or \+inf")
    _one_line_value_error(lambda: renyi(Z3, 0.0), "T must")
    # attention: q k^T are the scores
    q = np.array([[1.0, np.nan]])
    _one_line_value_error(lambda: fd.attention(q, q, q), r"NaN or \+inf")
    _one_line_value_error(lambda: fd.attention(Z3[None], Z3[None], Z3[None], T=0.0), "T must")


def test_bad_input_messages_name_the_problem():
    z = np.array([[1.0, np.nan, 0.0], [np.inf, 0.0, 1.0]])
    with pytest.raises(ValueError, match=r"^scores contain NaN or \+inf \(2 of 6 entries\)"):
        fd.stationary(fd.Tsallis(1.5), z, 1.0)
    with pytest.raises(ValueError, match=r"^T must be finite and > 0, got -1.0 \(1 of its 2"):
        fd.stationary(fd.Tsallis(1.5), np.zeros((2, 3)), np.array([[1.0], [-1.0]]))
    # a masked entry may hold anything: it is ignored, not an error (weights 0 there)
    keep = ~np.isnan(z) & ~np.isinf(z)
    rho = np.asarray(fd.stationary(fd.Tsallis(1.5), z, 1.0, mask=keep))
    assert np.all(rho[~keep] == 0) and np.allclose(rho.sum(-1), 1, rtol=0, atol=1e-14)
    # solve_stationary needs a key to solve for
    with pytest.raises(ValueError, match="every key of a row is masked"):
        fd.solve_stationary(fd.Shannon(), Z3, 1.0, mask=np.zeros(3, bool))


def test_traced_bad_inputs_raise_at_run_time_with_the_reason():
    """Under jit the inputs are traced: Equinox's runtime check raises, its message the
    reason. vmap and grad are unaffected by the concrete pre-check (reference: softmax,
    and its Jacobian diag(p) - p p^T, round-off 1e-15)."""
    f = jax.jit(lambda z, T: fd.stationary(fd.Tsallis(0.5), z, T))
    with pytest.raises(Exception, match=r"T must be finite and > 0"):
        jax.block_until_ready(f(jnp.asarray(Z3), 0.0))
    with pytest.raises(Exception, match=r"scores contain NaN or \+inf: mask"):
        jax.block_until_ready(f(jnp.asarray(Z3).at[0].set(jnp.nan), 1.0))
    # an eager vmap or grad runs the program at once: a ValueError, without the count
    bad = jnp.asarray(Z3).at[1].set(jnp.nan)
    for fn, z in ((jax.vmap(lambda z: fd.stationary(fd.Tsallis(0.5), z, 1.0)), bad[None]),
                  (jax.grad(lambda z: fd.stationary(fd.Shannon(), z, 1.0)[0]), bad)):
        with pytest.raises(ValueError, match=r"^scores contain NaN or \+inf: mask"):
            fn(z)
    with pytest.raises(ValueError, match="^T must be finite and > 0"):
        jax.vmap(lambda T: fd.stationary(fd.Tsallis(0.5), jnp.asarray(Z3), T))(
            jnp.array([1.0, 0.0]))
    batch = jnp.asarray(np.stack([Z3, Z3[::-1]]))
    rho = jax.vmap(lambda z: fd.stationary(fd.Shannon(), z, 0.5))(batch)
    np.testing.assert_allclose(rho, jax.nn.softmax(batch / 0.5), rtol=0, atol=1e-15)
    J = jax.jacfwd(lambda z: fd.stationary(fd.Shannon(), z, 1.0))(jnp.asarray(Z3))
    p = np.asarray(jax.nn.softmax(Z3))
    np.testing.assert_allclose(J, np.diag(p) - np.outer(p, p), rtol=0, atol=1e-15)
