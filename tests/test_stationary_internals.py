"""Checks that reach the stationary solver's private internals.

These tests exercise what the public API cannot reach: an iteration cap, the Renyi
fine-rescan chunk size, Abe's row-block size, the separable solver's warm start and the log
of Abe's component root far below float64's smallest weight. Every
private name they use comes through `internals()` below, the one place to repoint when the
solver modules move.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import MULTI, make, record, spec_id, stat

import fisherdyn as fd


def internals():
    """The private modules these tests use, by role."""
    from fisherdyn._entropies import _abe
    from fisherdyn._stationary import _separable, _shaped

    return types.SimpleNamespace(
        separable=_separable,  # _solve_separable, _spread_shift
        shaped=_shaped,  # _SHAPE_CHUNK_KEYS, _SHAPE_CELLS, _shape_setup / _grid / _certify,
        # _solve_tsallis_shaped
        blocks=_abe,  # _ABE_BLOCK_BYTES
    )


def test_unconverged_rows_are_nan_not_wrong():
    """The separable solver marks a row it could not converge (NaN weights) instead of
    returning its last iterate. Forced here with an iteration cap of 1 (internal argument):
    rows that need more iterations come back NaN, rows converged by then are finite and
    equal the uncapped solve to 1e-15; under the operator's own cap no row is NaN."""
    _solve_separable = internals().separable._solve_separable

    rng = np.random.default_rng(3)
    Z = np.concatenate([rng.standard_cauchy(size=(8, 64)), np.zeros((1, 64))])  # + uniform
    keep = jnp.ones(Z.shape, bool)
    for ent in (fd.Abe(3.0), fd.Tsallis(3.0), fd.Kaniadakis(0.3)):
        capped = np.asarray(jax.jit(lambda z: _solve_separable(
            ent, z, keep, jnp.asarray(1.0), max_iter=1, nan_if_unconverged=True)[0])(Z))
        full = np.asarray(fd.stationary(ent, Z, 1.0))
        bad = np.isnan(capped).any(-1)
        assert bad.any() and not bad[-1], type(ent).__name__
        assert np.all(np.isnan(capped[bad]))
        np.testing.assert_allclose(capped[~bad], full[~bad], rtol=0, atol=1e-15)
        assert np.all(np.isfinite(full)) and np.max(np.abs(full.sum(-1) - 1)) <= 1e-13
    # a row converged to round-off whose component check cannot pass (Abe's asinh form on a
    # deep tail) is returned, equal to scipy's root
    zb = np.array([0.0, -3.0, -6.0, -9.0, -12.0, -15.0])
    ent = fd.Abe(float(np.exp(0.035)))
    ref = fd.solve_stationary(ent, zb, 1.0, method="scipy")
    np.testing.assert_allclose(fd.stationary(ent, zb, 1.0), ref.rho, rtol=0, atol=1e-13)


def test_fine_rescan_in_chunks_matches_rowwise(monkeypatch):
    """Rows the cell certificate cannot vouch for are rescanned a chunk at a time (gathered,
    scanned, scattered back). With chunks of 2 rows, a batch mixing multi-root rows (the
    second MULTI case, T = 3: the first pass's Newton lands on another root there) with
    certified gaussian rows must equal the operator row by row (a single-row chunk each) to
    1e-13, and the rescan must span several chunks."""
    st = internals().shaped

    entropy = make(("renyi", 2.0))
    rng = np.random.default_rng(11)
    multi, T_multi = np.asarray(MULTI[1][1]), MULTI[1][2]
    rows, Ts = [], []
    for i in range(24):
        if i % 3 == 0:
            rows.append(multi + 0.01 * rng.normal(size=multi.size)), Ts.append(T_multi)
        else:
            rows.append(rng.normal(size=multi.size)), Ts.append(1.0)
    z, T = np.array(rows), np.array(Ts)[:, None]
    keep = jnp.ones(z.shape, bool)
    monkeypatch.setattr(st, "_SHAPE_CHUNK_KEYS", 2 * z.shape[-1])

    def uncertified(z, T):
        sh = st._shape_setup(entropy, z, keep, T)
        tg, S0, S1, S2, h, n = st._shape_grid(sh, st._SHAPE_CELLS)
        return jnp.sum(~st._shape_certify(sh, tg, S0, S1, S2, h, n)[0])

    count = int(jax.jit(uncertified)(jnp.asarray(z), jnp.asarray(T)))
    assert count > 4, count  # at least three chunks of 2 rows
    rho = np.asarray(jax.jit(lambda z, T: st._solve_tsallis_shaped(entropy, z, keep, T)[0])(
        jnp.asarray(z), jnp.asarray(T)))
    ref = np.stack([stat(entropy, z[i], Ts[i]) for i in range(len(z))])
    np.testing.assert_allclose(rho, ref, rtol=0, atol=1e-13)


def test_abe_without_mask_zeroes_only_what_it_must():
    """Abe without a mask skips the final zeroing pass unless a row is all -inf: -inf keys
    still weigh exactly 0 (its solver zeroes them), an all -inf row comes back as zeros, and
    values and gradients equal the explicit-mask path (1e-14, float64). Row blocks are in
    play: 4500 float64 rows of 64 keys are three blocks of 2048 rows (~1 MB each)."""
    st = internals().blocks

    e = fd.Abe(1.5)
    rng = np.random.default_rng(5)
    z = rng.normal(size=(4500, 64))
    assert z.shape[0] > 2 * (st._ABE_BLOCK_BYTES // (64 * 8))  # at least three blocks
    z[3, :5] = -np.inf
    z[4000, 60:] = -np.inf  # in the last, padded block
    for rows in (z, np.where(np.arange(4500)[:, None] == 7, -np.inf, z)):  # + an empty row
        Z = jnp.asarray(rows)
        keep = jnp.isfinite(Z)
        w = jnp.asarray(rng.normal(size=z.shape))
        none = lambda Z: fd.stationary(e, Z, 0.8)  # noqa: E731
        masked = lambda Z: fd.stationary(e, jnp.where(keep, Z, 0.0), 0.8, mask=keep)  # noqa: E731
        r = np.asarray(none(Z))
        np.testing.assert_allclose(r, np.asarray(masked(Z)), atol=1e-14, rtol=0)
        assert np.all(r[~np.asarray(keep)] == 0.0)
        g = np.asarray(jax.grad(lambda Z: jnp.sum(w * none(Z)))(Z))
        g_ref = np.asarray(jax.grad(lambda Z: jnp.sum(w * masked(Z)))(Z))
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, g_ref, atol=1e-13, rtol=0)
    assert np.all(r[7] == 0.0) and np.all(g[7] == 0.0)


@pytest.mark.parametrize(
    "spec", [("tsallis", 0.5), ("kaniadakis", 0.3), ("kaniadakis", 0.7), ("burg",), ("abe", 1.5)],
    ids=spec_id,
)
def test_second_order_start_is_closer_than_jensen(spec):
    """The separable solver's start: Jensen's bound plus the variance correction. On rows
    whose spread is within the temperature (V <= 1, where the correction is used in full) it
    must land nearer the root than Jensen's bound alone. The root is read off the converged
    weights through the forward law, nu* = z_i - T G_shifted(rho_i) (no inverse law
    involved). Threshold 1/3: the neglected terms are third order in the spread."""
    st = internals().separable

    entropy = make(spec)
    T = 1.0
    z = np.random.default_rng(7).normal(scale=0.8, size=(16, 256))
    z = z - z.max(-1, keepdims=True)  # the solver's gauge: row max 0
    rho = np.asarray(fd.stationary(entropy, jnp.asarray(z), T))
    i = np.argmax(rho, -1)[:, None]
    nu_star = np.take_along_axis(z, i, -1) - T * np.asarray(
        entropy.G_shifted(jnp.asarray(np.take_along_axis(rho, i, -1)))
    )
    n = float(z.shape[-1])
    zbar = z.mean(-1, keepdims=True)
    hi = -T * float(entropy.G_shifted(1.0 / n))
    keep = jnp.ones(z.shape, bool)
    # the law as the solver evaluates it (Abe(1.5): its v iteration from a cold start)
    law = entropy.component_law().cold
    shift = np.asarray(st._spread_shift(entropy, jnp.asarray(z), keep, jnp.asarray(zbar),
                                        jnp.full_like(zbar, n), hi, T, law))
    err_jensen = np.abs(zbar + hi - nu_star)
    err_second = np.abs(zbar + hi + shift - nu_star)
    record(f"second-order start / Jensen, {spec_id(spec)}", np.max(err_second / err_jensen))
    assert np.all(err_second <= err_jensen / 3), np.max(err_second / err_jensen)


@pytest.mark.parametrize("q", [1.0000001, 1 / 1.0000001, 1.0001])
def test_abe_component_root_in_logs_far_in_the_tail(q):
    """Near q = 1 Abe's component law is solved for l = ln x, whose root sits at |l| up to
    ~1/sinh(eps) (4e7 at q = 1 + 1e-7, y = -3e8): far beyond where x underflows, but the
    log is what the solver's residual and the dynamics' log-chart see. Reference: an mpmath
    root of G(e^l) = 1 + y at 50 digits. Tolerance 1e-13 relative on l: the float64 law
    computes sinh(eps) l with relative error ~1e-16 and its conditioning in l is ~1; near
    l = 0 the target 1 + y itself carries an absolute rounding of ~1e-16, amplified ~20x by
    the near-cancelling asinh form, hence the 1e-14 absolute floor."""
    import mpmath as mp

    from helpers import RefFamily, bracket_root

    e = fd.Abe(q)
    y = -np.logspace(-2, 9, 23)
    x, _, log, resid = e._asinh_newton(jnp.asarray(y), e.log_guess(jnp.asarray(y)), 6)
    assert float(jnp.max(resid)) <= 1e-14
    fam = RefFamily(("abe", q))
    with mp.workdps(50):
        for yi, li in zip(y, np.asarray(log)):
            f = lambda l: fam.G(mp.exp(l)) - (1 + mp.mpf(float(yi)))  # noqa: E731
            lo = mp.mpf(-1)
            while f(lo) > 0:
                lo *= 2
            ref = float(bracket_root(f, lo, mp.mpf(1)))
            assert abs(li - ref) <= 1e-13 * abs(ref) + 1e-14, (yi, li, ref)
