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
    F = fd.free_energy(fd.Shannon(), rho, Z, T)
    assert F.shape == (3,)
    F_rows = [fd.free_energy(fd.Shannon(), rho[i], Z[i], TS[i]) for i in range(3)]
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
