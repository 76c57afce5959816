"""The stationary operators on hard inputs: masks, -inf scores, extreme scales and
temperatures, one key, 65536 keys.

References: the operator on the kept sub-vector and its Jacobian, the constraint
$\\sum\\rho = 1$ against a conditioning-aware bound, and the float64 operator for float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ONE_PER_CLASS, Z_A, arr, derivs, make, record, spec_id

import fisherdyn as fd


N_ROBUST = 64
KEEP_POS = np.array([1, 9, 17, 30, 41, 52, 63])  # where the mask rows keep Z_A


def _batch(dtype):
    """Rows of length 64 for one compiled vmap program per class and dtype.

    Rows 0-12: scores of scale 1e-3 .. 1e4 (both signs) at T = 1e-3 .. 1e3, no mask; row 13: both
    extremes +-1e4 in one row at T = 1e-3. Mask rows (T = 1): 14 keeps Z_A at KEEP_POS and masks
    57 entries of scale 5e3 (larger than every kept score); 15 is the same with -inf instead of
    the mask; 16 is all masked; 17 keeps one entry (at T = 1e-3).
    """
    rng = np.random.default_rng(11)
    n = N_ROBUST
    rows, temps = [], []
    for scale in (1e-3, 1.0, 1e2, 1e4):
        for T in (1e-3, 1.0, 1e3):
            rows.append(scale * rng.uniform(-1, 1, size=n))
            temps.append(T)
    rows.append(np.r_[1e4, -1e4, np.zeros(n - 2)])
    temps.append(1e-3)
    masks = [np.ones(n, bool)] * len(rows)
    keep = np.zeros(n, bool)
    keep[KEEP_POS] = True
    z = 5e3 * rng.uniform(-1, 1, size=n)
    z[KEEP_POS] = Z_A
    one = np.zeros(n, bool)
    one[KEEP_POS[3]] = True
    rows += [z, np.where(keep, z, -np.inf), z, z]
    masks += [keep, np.ones(n, bool), np.zeros(n, bool), one]
    temps += [1.0, 1.0, 1.0, 1e-3]
    return np.asarray(rows, dtype), np.asarray(temps, dtype), np.asarray(masks)


N_ROBUST_ROWS = 13


@jax.jit
def _rows_value_and_grad(entropy, Z, T, M, W):
    """jax.vmap over rows (per-row T and mask); rho and jax.grad of sum(W * rho) wrt Z."""

    def f(Z):
        rho = jax.vmap(lambda z, t, m: fd.stationary(entropy, z, t, mask=m))(Z, T, M)
        return jnp.sum(W * rho), rho

    (_, rho), g = jax.value_and_grad(f, has_aux=True)(Z)
    return rho, g


@functools.lru_cache(maxsize=None)
def rows_result(spec, dtype):
    Z, T, M = _batch(dtype)
    W = np.random.default_rng(5).normal(size=Z.shape).astype(dtype)
    rho, g = _rows_value_and_grad(arr(make(spec), dtype), jnp.asarray(Z), jnp.asarray(T),
                                  jnp.asarray(M), jnp.asarray(W))
    assert rho.dtype == dtype and g.dtype == dtype  # output dtype = input dtype
    return Z, T, W, np.asarray(rho, np.float64), np.asarray(g, np.float64)


@pytest.mark.parametrize("spec", ONE_PER_CLASS + [("tsallis", 3.0)], ids=spec_id)
def test_masks(spec):
    # References: the operator on the kept sub-vector (tolerance 1e-14) and its Jacobian
    # (VJP of the kept entries, tolerance 1e-12); masked entries and -inf scores get exactly
    # zero weight and zero gradient; an all-masked row is zeros with zero gradient.
    Z, T, W, rho, g = rows_result(spec, np.float64)
    keep = np.zeros(N_ROBUST, bool)
    keep[KEEP_POS] = True
    r_mask, r_inf, r_none, r_one = rho[N_ROBUST_ROWS:]
    g_mask, g_inf, g_none, g_one = g[N_ROBUST_ROWS:]
    assert np.all(np.isfinite(rho[N_ROBUST_ROWS:])) and np.all(np.isfinite(g[N_ROBUST_ROWS:]))
    assert np.all(r_mask[~keep] == 0) and np.all(g_mask[~keep] == 0)
    _, _, (sub, _, J_sub, _, _, _, _) = derivs(make(spec), Z_A, 1.0)
    err = np.max(np.abs(r_mask[keep] - sub))
    record("|masked row - sub-vector operator|", err)
    assert err <= 1e-14
    np.testing.assert_allclose(g_mask[keep], J_sub.T @ W[N_ROBUST_ROWS, keep], rtol=0,
                               atol=1e-12)
    # -inf scores = masked entries, in the value and the gradient
    np.testing.assert_allclose(r_inf, r_mask, rtol=0, atol=1e-15)
    assert np.all(r_inf[~keep] == 0) and np.all(g_inf[~keep] == 0)
    np.testing.assert_allclose(g_inf[keep], J_sub.T @ W[N_ROBUST_ROWS + 1, keep], rtol=0,
                               atol=1e-12)
    # all masked: zeros, zero gradient
    assert np.all(r_none == 0) and np.all(g_none == 0)
    # a single kept key (at T = 1e-3): weight 1 (4 eps), zero gradient (4 eps (1 + 1/T))
    i = KEEP_POS[3]
    assert abs(r_one[i] - 1) <= 4 * np.finfo(float).eps and np.sum(r_one != 0) == 1
    assert np.all(np.abs(g_one) <= 4 * np.finfo(float).eps * (1 + 1e3))


def _check_finite(rho, g):
    assert np.all(np.isfinite(rho)) and np.all(np.isfinite(g))
    assert np.all(rho >= 0)


def _sum_deviation(rho, Z, T, dtype):
    """max |sum rho - 1| in ulps, and its ratio to the conditioning-aware bound
    eps (N + max|z|/T) (what a solver whose multiplier lives at the scale of z can reach)."""
    eps = np.finfo(dtype).eps
    n = Z.shape[-1]
    dev = np.abs(rho.sum(-1) - 1)
    cond = n + np.max(np.abs(Z.astype(np.float64)), -1) / T.astype(np.float64)
    return np.max(dev) / eps, np.max(dev / (eps * cond))


def _dtypes(spec):
    # S-M shares Renyi's self-consistent code path: its float32 compile only in the slow run
    if spec[0] == "sharma_mittal":
        return [np.float64, pytest.param(np.float32, marks=pytest.mark.slow)]
    return [np.float64, np.float32]


def _robust_params():
    out = []
    for s in ONE_PER_CLASS:
        for d in _dtypes(s):
            marks = list(getattr(d, "marks", ()))
            d = getattr(d, "values", (d,))[0]
            out.append(pytest.param(s, d, marks=marks, id=f"{spec_id(s)}-{np.dtype(d).name}"))
    return out


@pytest.mark.parametrize("spec, dtype", _robust_params())
def test_robustness(spec, dtype):
    # Scores of scale up to 1e4, T = 1e-3 .. 1e3 (rows of `_batch`): finite, nonnegative,
    # finite gradient, dtype preserved, |sum - 1| <= 4 eps (N + max|z|/T); float32 within 1e-3
    # of float64 (same inputs) where |z|/T <= 10 (reference: the float64 operator).
    Z, T, _, rho, g = rows_result(spec, dtype)
    k = N_ROBUST_ROWS
    _check_finite(rho[:k], g[:k])
    _, ratio = _sum_deviation(rho[:k], Z[:k], T[:k], dtype)
    assert ratio <= 4
    if dtype == np.float32:
        _, _, _, rho64, _ = rows_result(spec, np.float64)
        tame = np.max(np.abs(Z[:k].astype(np.float64)), -1) / T[:k] <= 10
        err = np.max(np.abs(rho[:k][tame] - rho64[:k][tame]))
        record("|float32 - float64| (|z|/T <= 10)", err)
        assert err <= 1e-3


@pytest.mark.parametrize("spec, dtype", _robust_params())
def test_on_simplex(spec, dtype):
    # Reference: the constraint sum rho = 1, within 2 N eps (N = 64) on every robustness row.
    Z, T, _, rho, _ = rows_result(spec, dtype)
    k = N_ROBUST_ROWS
    ulps, ratio = _sum_deviation(rho[:k], Z[:k], T[:k], dtype)
    record(f"|sum rho - 1| / eps ({np.dtype(dtype).name}, N = 64) {spec_id(spec)}", ulps)
    record(f"|sum rho - 1| / (eps (N + |z|/T)) ({np.dtype(dtype).name})", ratio)
    assert ulps <= 2 * N_ROBUST


@pytest.mark.parametrize(
    "spec",
    [s if s[0] in ("shannon", "tsallis", "kaniadakis") else pytest.param(s, marks=pytest.mark.slow)
     for s in ONE_PER_CLASS],  # every class sees one kept key in test_masks already
    ids=spec_id)
def test_single_key(spec):
    # N = 1: the only distribution is [1] (tolerance 4 eps), with zero gradient (J = c - c^2/c:
    # tolerance 4 eps (1 + 1/T), the rounding of c ~ 1/T).
    Z = np.array([[0.3], [-1e4], [1e4]])
    T = np.array([1e-3, 1.0, 1e3])
    rho, g = _rows_value_and_grad(arr(make(spec)), jnp.asarray(Z), jnp.asarray(T),
                                  jnp.ones(Z.shape, bool), jnp.ones(Z.shape))
    eps = np.finfo(float).eps
    record("N = 1: |rho - 1| / eps", np.max(np.abs(np.asarray(rho) - 1)) / eps)
    assert np.all(np.abs(np.asarray(rho) - 1) <= 4 * eps)
    assert np.all(np.abs(np.asarray(g)[:, 0]) <= 4 * eps * (1 + 1 / T))


LARGE_N = [
    pytest.param(("tsallis", 1.5), np.float32),
    pytest.param(("kaniadakis", 0.3), np.float64),
    pytest.param(("shannon",), np.float32, marks=pytest.mark.slow),
    pytest.param(("renyi", 2.0), np.float64, marks=pytest.mark.slow),
    pytest.param(("sharma_mittal", 0.7, 0.4), np.float32, marks=pytest.mark.slow),
    pytest.param(("burg",), np.float64, marks=pytest.mark.slow),
    pytest.param(("abe", 1.5), np.float32, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("spec, dtype", LARGE_N,
                         ids=lambda v: spec_id(v) if isinstance(v, tuple) else np.dtype(v).name)
def test_large_n(spec, dtype):
    # N = 65536, rows |z| <= 1 (T = 1), 1e2 (T = 1e-3), 1e4 (T = 1e3): finite, nonnegative,
    # dtype preserved, |sum - 1| <= 2 N eps.
    rng = np.random.default_rng(13)
    n = 65536
    Z = np.stack([s * rng.uniform(-1, 1, n) for s in (1.0, 1e2, 1e4)]).astype(dtype)
    T = np.array([1.0, 1e-3, 1e3], dtype)
    W = rng.normal(size=Z.shape).astype(dtype)
    rho, g = _rows_value_and_grad(arr(make(spec), dtype), jnp.asarray(Z), jnp.asarray(T),
                                  jnp.ones(Z.shape, bool), jnp.asarray(W))
    assert rho.dtype == dtype and g.dtype == dtype
    rho, g = np.asarray(rho, np.float64), np.asarray(g, np.float64)
    _check_finite(rho, g)
    ulps, _ = _sum_deviation(rho, Z, T, dtype)
    record(f"|sum rho - 1| / eps ({np.dtype(dtype).name}, N = {n})", ulps)
    assert ulps <= 2 * n
