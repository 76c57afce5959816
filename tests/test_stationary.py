"""The fixed-temperature stationary operators against independent references (docs/math.md §2-3).

References used here, none of them sharing code with `fisherdyn` (see `helpers.py`):
- an mpmath solve at 40 digits of `T G(rho_i) = z_i + lambda`, `sum rho = 1` (bracketed
  Illinois root on the scalar multiplier, component inversions in mpmath where the law has
  no closed inverse; Renyi / Sharma-Mittal: every root of the self-consistency in M found by a
  scan of its whole range, then the branch of least free energy);
- closed forms: softmax (scipy) and a sort-based sparsemax;
- the stationary law itself, evaluated in mpmath on the float64 output;
- the limits in which one family becomes another.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
import scipy.special
from helpers import (
    CASES,
    DPS,
    MULTI,
    SPECS,
    Z_A,
    RefFamily,
    arr,
    compact_q,
    jit_branches,
    jit_stationary,
    make,
    mp_reference,
    mp_separable,
    mp_tsallis_shaped,
    record,
    sparsemax,
    spec_id,
    stat,
    tsallis_shaped,
)

import fisherdyn as fd


# --------------------------------------------------------------------------- reference solves


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_matches_mpmath_reference(spec, case):
    # Reference: the 40-digit mpmath solve (least-free-energy branch for Renyi / S-M).
    # Tolerance: 1e-12 absolute on rho and 1e-12 (1 + |F|) on the free energy.
    z, T = CASES[case]
    rho_ref, F_ref, _ = mp_reference(spec, case)
    rho_ref = np.array([float(r) for r in rho_ref])
    rho = stat(make(spec), z, T)
    err = np.max(np.abs(rho - rho_ref))
    record("|rho - mpmath|", err)
    assert err <= 1e-12
    assert rho.dtype == np.float64
    F = float(fd.free_energy(make(spec), jnp.asarray(z), jnp.asarray(rho), T))
    record("|F - mpmath F|", abs(F - float(F_ref)))
    assert abs(F - float(F_ref)) <= 1e-12 * (1 + abs(float(F_ref)))


Z_TAIL = np.array([0.5, 0.0, -1.0, -10.0, -100.0, -1000.0, -3000.0])
DENSE_SPECS = [s for s in SPECS if not compact_q(s)]


@pytest.mark.parametrize(
    "spec", DENSE_SPECS,
    ids=spec_id)
def test_tail_relative_accuracy(spec):
    # Reference: the 40-digit mpmath solve on scores spanning 3e3 at T = 0.1 (|w| up to 3e4):
    # the dense families' tails (algebraic: docs/math.md §2) to 1e-10 relative (+1e-300 absolute).
    T = 0.1
    fam = RefFamily(spec)
    with mp.workdps(DPS):
        if tsallis_shaped(spec):
            rho_ref = mp_tsallis_shaped(fam, Z_TAIL, T, n_grid=16)[0][1]
        else:
            rho_ref = mp_separable(fam, Z_TAIL, T)[0]
    rho_ref = np.array([float(r) for r in rho_ref])
    rho = stat(make(spec), Z_TAIL, T)
    rel = np.max(np.abs(rho - rho_ref) / np.maximum(rho_ref, 1e-300))
    record("tail |rho / mpmath - 1|", rel if np.isfinite(rel) else 0.0)
    np.testing.assert_allclose(rho, rho_ref, rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize("spec, z, T, n_grid", MULTI, ids=["renyi2-3roots", "renyi2-5roots",
                                                            "sm3_1.5-2roots"])
def test_multibranch_least_free_energy(spec, z, T, n_grid):
    # The operator returns the branch of least free energy among every root. Reference: every
    # root of the mpmath self-consistency scan (n_grid points in log M, each sign change
    # refined to 40 digits); tolerance 1e-12 on rho of the least-F branch.
    z = np.asarray(z)
    with mp.workdps(DPS):
        branches = mp_tsallis_shaped(RefFamily(spec), z, T, n_grid=n_grid)
    assert len(branches) >= 2
    assert float(branches[1][0] - branches[0][0]) > 1e-6  # the minimum is unambiguous
    rho_ref = np.array([float(r) for r in branches[0][1]])
    rho = stat(make(spec), z, T)
    err = np.max(np.abs(rho - rho_ref))
    record("|rho - mpmath| multi-branch", err)
    assert err <= 1e-12
    if spec[0] != "renyi":  # stationary_branches is compiled for Renyi only (runtime)
        return
    # stationary_branches finds the same set of roots (M to 1e-9, F to 1e-9 (1 + |F|)).
    b = jit_branches(arr(make(spec)), jnp.asarray(z), jnp.asarray(T))
    valid = np.asarray(b.valid)
    M_lib, F_lib = np.asarray(b.M)[valid], np.asarray(b.free_energy)[valid]
    M_ref = np.array([float(m) for _, _, m in branches])
    F_ref = np.array([float(F) for F, _, _ in branches])
    assert len(M_lib) == len(M_ref)
    order = np.argsort(M_ref)
    np.testing.assert_allclose(np.sort(M_lib), M_ref[order], rtol=0, atol=1e-9)
    np.testing.assert_allclose(F_lib[np.argsort(M_lib)], F_ref[order], rtol=0,
                               atol=1e-9 * (1 + np.max(np.abs(F_ref))))


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("case", range(len(CASES)))
def test_closed_forms(case):
    # Shannon = scipy.special.softmax(z/T), Tsallis(2) = sparsemax(z/(2T)); tolerance 1e-14.
    z, T = CASES[case]
    for T_ in (T, 0.1 * T, 10 * T):
        err_s = np.max(np.abs(stat(fd.Shannon(), z, T_) - scipy.special.softmax(z / T_)))
        err_t = np.max(np.abs(stat(fd.Tsallis(2.0), z, T_) - sparsemax(z / (2 * T_))))
        record("|Shannon - softmax|", err_s)
        record("|Tsallis2 - sparsemax|", err_t)
        assert err_s <= 1e-14
        assert err_t <= 1e-14


def test_batching_and_axis():
    # Reference: the unbatched operator row by row (tolerance 1e-14); `axis` moves the keys.
    Z = np.stack([z for z, _ in CASES])
    Ts = np.array([T for _, T in CASES])
    for spec in [("kaniadakis", 0.3), ("shannon",)]:
        rows = np.stack([stat(make(spec), z, T) for z, T in CASES])
        batched = np.asarray(jit_stationary(arr(make(spec)), jnp.asarray(Z), jnp.asarray(Ts)))
        np.testing.assert_allclose(batched, rows, rtol=0, atol=1e-14)
    # the key axis first (generic: the same code moves it last for every family)
    along0 = np.asarray(jit_stationary(fd.Shannon(), jnp.asarray(Z.T), jnp.asarray(Ts), axis=0))
    np.testing.assert_allclose(along0.T, rows, rtol=0, atol=1e-14)


# --------------------------------------------------------------------------- stationary law


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_stationary_law(spec, case):
    # Reference: the law itself. T(-dS/drho_i) - z_i evaluated in mpmath on the float64 output
    # is one constant lambda on the support (spread <= 1e-12 (1 + max|z| + T)) and, for the
    # compact q > 1 families, T G(0+) - z_i >= lambda off it (slack 1e-12).
    z, T = CASES[case]
    rho = stat(make(spec), z, T)
    fam = RefFamily(spec)
    with mp.workdps(DPS):
        support = [i for i in range(len(z)) if rho[i] > 0]
        lam = [float(T * fam.minus_grad(rho, i) - z[i]) for i in support]
        spread = max(lam) - min(lam)
        record("stationary-law spread", spread)
        assert spread <= 1e-12 * (1 + np.max(np.abs(z)) + T)
        off = [i for i in range(len(z)) if rho[i] == 0]
        if off:
            assert compact_q(spec)  # only q > 1 families may have exact zeros
            lam0 = np.mean(lam)
            for i in off:
                assert float(T * fam.minus_grad(rho, i)) - z[i] >= lam0 - 1e-12
    assert abs(rho.sum() - 1) <= 4e-15 and np.all(rho >= 0)


# --------------------------------------------------------------------------- limits


def test_tsallis_limit_q_to_one():
    # Reference: softmax (scipy); the map is O(|q-1|) away: tolerance 10 |q - 1|.
    for z, T in CASES:
        p = scipy.special.softmax(z / T)
        for d in (1e-6, 1e-4, -1e-6, -1e-4):
            err = np.max(np.abs(stat(fd.Tsallis(1 + d), z, T) - p))
            record("Tsallis q->1: |rho - softmax| / |q-1|", err / abs(d))
            assert err <= 10 * abs(d)


@pytest.mark.parametrize(
    "kappa",
    [1e-2, 1e-4, -1e-4,
     1e-6],
)
def test_kaniadakis_limit_kappa_to_zero(kappa):
    # Reference: softmax (scipy); the map is O(kappa^2) away: tolerance 10 kappa^2 + 1e-14.
    for z, T in CASES:
        err = np.max(np.abs(stat(fd.Kaniadakis(kappa), z, T) - scipy.special.softmax(z / T)))
        record(f"Kaniadakis |rho - softmax| at kappa = {kappa:g}", err)
        assert err <= 10 * kappa**2 + 1e-14


def test_abe_limit_q_to_one():
    # Reference: softmax (scipy); the map is even in eps = ln q and O(eps^2) away:
    # tolerance 10 eps^2 + 1e-14. q = 1 exactly and q = 1 + 1e-12 must not cancel.
    for z, T in CASES:
        p = scipy.special.softmax(z / T)
        for q in (1.0, 1 + 1e-12, 1 - 1e-12, 1 + 1e-6, 1 + 1e-4, 1 - 1e-4, 1.01):
            err = np.max(np.abs(stat(fd.Abe(q), z, T) - p))
            eps = np.log(q)
            record(f"Abe q->1: |rho - softmax| at q = {q!r}", err)
            assert err <= 10 * eps**2 + 1e-14
        # continuity through q = 1 and q <-> 1/q symmetry of the map (tolerance 1e-14)
        r1 = stat(fd.Abe(1.0), z, T)
        assert np.max(np.abs(stat(fd.Abe(1 + 1e-12), z, T) - r1)) <= 1e-14
        np.testing.assert_allclose(stat(fd.Abe(3.0), z, T), stat(fd.Abe(1 / 3), z, T),
                                   rtol=0, atol=1e-14)


def test_sharma_mittal_limits():
    # References: Renyi(q) as r -> 1 (tolerance 10 |r - 1|), Tsallis(q) as r -> q (tolerance
    # 10 |r - q|); r = q exactly is Tsallis (tolerance 1e-14). Both from the public operator
    # of the other family, checked above against mpmath.
    for z, T in CASES:
        for q in (2.0, 0.7):
            ren, tsa = stat(fd.Renyi(q), z, T), stat(fd.Tsallis(q), z, T)
            for d in (1e-6, -1e-6, 1e-4):
                e1 = np.max(np.abs(stat(fd.SharmaMittal(q, 1 + d), z, T) - ren))
                e2 = np.max(np.abs(stat(fd.SharmaMittal(q, q + d), z, T) - tsa))
                record("S-M r->1: |rho - Renyi| / |r-1|", e1 / abs(d))
                record("S-M r->q: |rho - Tsallis| / |r-q|", e2 / abs(d))
                assert e1 <= 10 * abs(d)
                assert e2 <= 10 * abs(d)
            e0 = np.max(np.abs(stat(fd.SharmaMittal(q, q), z, T) - tsa))
            assert e0 <= 1e-14


def test_kaniadakis_sign_symmetry():
    # Reference: docs/math.md §2, S_kappa = S_{-kappa}; the map is identical (tolerance 0 / 1e-15).
    for z, T in CASES:
        np.testing.assert_array_equal(stat(fd.Kaniadakis(0.3), z, T),
                                      stat(fd.Kaniadakis(-0.3), z, T))


# --------------------------------------------------------------------------- validation


def test_bad_inputs_raise():
    # NaN / +inf scores and non-positive T raise, eagerly and under jit (eqx.error_if).
    z = jnp.asarray(Z_A)
    bad_z = z.at[2].set(jnp.nan)
    # eagerly (Shannon) and under jit (the compiled programs of the other tests)
    with pytest.raises(Exception, match="NaN"):
        jax.block_until_ready(fd.stationary(fd.Shannon(), bad_z, 1.0))
    with pytest.raises(Exception, match="T must be"):
        jax.block_until_ready(fd.stationary(fd.Shannon(), z, -1.0))
    entropy = arr(fd.Tsallis(1.5))
    with pytest.raises(Exception, match="NaN"):
        jax.block_until_ready(jit_stationary(entropy, bad_z, jnp.asarray(1.0)))
    for T in (0.0, -1.0, np.nan):
        with pytest.raises(Exception, match="T must be"):
            jax.block_until_ready(jit_stationary(entropy, z, jnp.asarray(T)))
    with pytest.raises(Exception, match=r"\+inf"):
        jax.block_until_ready(jit_stationary(fd.Shannon(), z.at[0].set(jnp.inf), jnp.asarray(1.0)))
    with pytest.raises(Exception, match="T must be"):  # one bad temperature in a batch
        jax.block_until_ready(jit_stationary(arr(fd.Kaniadakis(0.3)), jnp.stack([z, z, z]),
                                    jnp.array([1.0, 0.0, 2.0])))
    with pytest.raises(TypeError):
        fd.stationary("shannon", z)
    with pytest.raises(Exception, match="NaN"):  # free of jit: error raised by eqx.error_if
        jax.block_until_ready(eqx.filter_jit(fd.stationary_jacobian)(fd.Shannon(), bad_z, 1.0))
    # shapes: a mask that does not broadcast, a row without keys
    with pytest.raises(ValueError, match=r"mask of shape \(2,\) does not broadcast"):
        fd.stationary(fd.Tsallis(1.5), z, mask=np.array([True, False]))
    with pytest.raises(ValueError, match="no keys"):
        fd.stationary(fd.Shannon(), np.zeros((2, 0)))
    # free_energy: defined off the simplex (finite here), but not for negative / NaN weights
    rho_off = np.array([0.2, 0.3, 0.6] + [0.0] * (len(Z_A) - 3))
    assert np.isfinite(float(fd.free_energy(fd.Shannon(), z, rho_off, 1.0)))
    for bad_rho in (rho_off * np.r_[1.0, -1.0, np.ones(len(Z_A) - 2)], rho_off * np.nan):
        with pytest.raises(Exception, match="rho >= 0"):
            jax.block_until_ready(fd.free_energy(fd.Shannon(), z, bad_rho, 1.0))
