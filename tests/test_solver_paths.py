"""The operator's alternative code paths agree with each other and with the stationary law.

Abe's row blocks against slices below one block, Abe on wide rows against the law, the
unmasked fast paths (generic and Shannon's fused softmax) against the general masked path,
with and without `jax.vmap`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import make, spec_id

import fisherdyn as fd


def test_abe_row_blocks_match_rowwise():
    """Abe solves large batches in row blocks (cache-sized, one at a time, the last padded).
    3000 rows of 64 keys (float64: blocks of 2048 rows, so two blocks and 1096 padding rows)
    with a per-row T and mask must give what the operator gives on slices of 8 rows (below
    one block: the direct path). Tolerance 1e-14: each row's root stops at
    |sum rho - 1| <= 4 eps and only summation order can differ between the two paths. The
    stationary law is checked on every row too (numpy, Abe's G in closed form)."""
    rng = np.random.default_rng(7)
    Z = rng.normal(size=(3, 1000, 64))
    Ts = np.exp(rng.uniform(-1, 1, size=(3, 1000)))
    M = rng.uniform(size=Z.shape) > 0.2
    M[0, 5] = False  # an empty row: zeros
    ent = fd.Abe(1.5)
    W = rng.normal(size=Z.shape)
    f = jax.jit(lambda Z, T, M: fd.stationary(ent, Z, T, mask=M))
    grad = jax.jit(jax.grad(lambda Z, T, M, W: jnp.sum(W * f(Z, T, M))))
    rho = np.asarray(f(Z, Ts, M))
    g = np.asarray(grad(Z, Ts, M, W))
    rows, rows_g = [], []
    for i in range(3):
        for j in range(0, 1000, 8):
            sl = (i, slice(j, j + 8))
            rows.append(np.asarray(f(Z[sl], Ts[sl], M[sl])))
            rows_g.append(np.asarray(grad(Z[sl], Ts[sl], M[sl], W[sl])))
    np.testing.assert_allclose(rho, np.concatenate(rows).reshape(Z.shape), rtol=0, atol=1e-14)
    np.testing.assert_allclose(g, np.concatenate(rows_g).reshape(Z.shape), rtol=0, atol=1e-12)
    assert np.all(rho[0, 5] == 0) and np.all(rho[~M] == 0)
    sums = rho.sum(-1)
    # (1e-13: 1% of these rows end between 4 eps and 3.5e-14, on either path)
    assert np.max(np.abs(np.delete(sums.ravel(), 5) - 1)) <= 1e-13
    q = 1.5
    with np.errstate(divide="ignore", invalid="ignore"):  # masked zeros: excluded below
        G = (q * rho ** (q - 1) - rho ** (1 / q - 1) / q) / (q - 1 / q)
        lam = np.where(M, Ts[..., None] * G - Z, np.nan)
    lam = np.delete(lam.reshape(-1, 64), 5, axis=0)
    spread = np.nanmax(lam, -1) - np.nanmin(lam, -1)
    assert np.max(spread / (1 + np.nanmax(np.abs(lam), -1))) <= 1e-10


@pytest.mark.parametrize("q", [3.0, 0.4])
def test_abe_wide_rows_converge(q):
    """Abe with Q = max(q, 1/q) >= 2.5 on 512-key rows of gaussian, Cauchy and exponential
    scores at T = 0.01 ... 10 (768 rows, float64): rows on which an unguarded root
    iteration cycles (components not converged after their warm-started steps, Newton on nu
    bouncing between two values) and stops with weights far off the simplex. Reference: the
    stationary law itself (numpy, Abe's G in closed form): sum to 1e-13 (the solver stops at
    4 eps; 1.7e-14 measured), T G(rho_i) - z_i one constant per row to 1e-10 relative."""
    rng = np.random.default_rng(1)
    draws = [rng.normal(size=(64, 512)), rng.standard_cauchy(size=(64, 512)),
             rng.exponential(size=(64, 512))]
    temps = [0.01, 0.1, 1.0, 10.0]
    Z = np.concatenate([z for z in draws for _ in temps])
    Ts = np.concatenate([np.full(64, t) for _ in draws for t in temps])
    rho = np.asarray(jax.jit(fd.stationary)(fd.Abe(q), Z, Ts))
    assert np.all(np.isfinite(rho)) and np.all(rho > 0)
    assert np.max(np.abs(rho.sum(-1) - 1)) <= 1e-13
    G = (q * rho ** (q - 1) - rho ** (1 / q - 1) / q) / (q - 1 / q)
    lam = Ts[:, None] * G - Z
    spread = (lam.max(-1) - lam.min(-1)) / (1 + np.abs(lam).max(-1))
    assert spread.max() <= 1e-10


@pytest.mark.parametrize("spec", [("tsallis", 1.5), ("kaniadakis", 0.3)], ids=spec_id)
def test_unmasked_fast_path_matches_general_path_under_vmap(spec):
    """Without a mask and without -inf scores the solvers run with a constant-True keep mask
    (XLA folds the masking away); a batch with any -inf score takes the general path. Under
    jax.vmap the choice is made once for the whole batch (custom_vmap predicate), so the
    branch stays a `cond` instead of a select that would run both paths. Reference: the
    general path via an explicit all-True mask; equal to 1e-14 in float64, values and
    gradients, with and without a -inf score in the vmapped batch."""
    e = make(spec)
    Z = jnp.asarray(np.random.default_rng(7).normal(size=(3, 6)))
    Z_inf = Z.at[1, 2].set(-jnp.inf)
    fast = jax.vmap(lambda z: fd.stationary(e, z, 0.8))
    general = jax.vmap(lambda z: fd.stationary(e, jnp.where(jnp.isfinite(z), z, 0.0), 0.8,
                                                mask=jnp.isfinite(z)))
    w = jnp.arange(6.0)
    for batch in (Z, Z_inf):
        np.testing.assert_allclose(fast(batch), general(batch), atol=1e-14, rtol=0)
        g_fast = jax.grad(lambda z: jnp.sum(fast(z) * w))(batch)
        g_gen = jax.grad(lambda z: jnp.sum(general(z) * w))(batch)
        assert np.all(np.isfinite(g_fast))
        np.testing.assert_allclose(g_fast, g_gen, atol=1e-13, rtol=0)
    assert float(fast(Z_inf)[1, 2]) == 0.0
    # every cond of the unbatched program (the path choice and the input checks) survives
    # vmap; a batched predicate would have turned the path choice into a select
    n_cond = str(jax.make_jaxpr(lambda z: fd.stationary(e, z, 0.8))(Z)).count("cond[")
    assert str(jax.make_jaxpr(fast)(Z)).count("cond[") == n_cond


def test_shannon_without_mask_equals_the_masked_path():
    """Shannon without a mask takes a fused softmax path (its own input checks, plain
    autodiff). Reference: the general masked path (keep mask, solver custom JVP) on the same
    rows: -inf keys and an all -inf row give identical weights (1e-15) and identical
    gradients in z and in T, with no NaN (the -inf keys' d/dT is 0, not 0 x inf)."""
    z = jnp.array([[1.0, -jnp.inf, 0.3, -0.2], [-jnp.inf] * 4, [2.0, -1.0, 0.5, 0.0]])
    m = jnp.isfinite(z)
    w = jnp.arange(4.0)

    def fast(z, T):
        return fd.stationary(fd.Shannon(), z, T)

    def general(z, T):
        return fd.stationary(fd.Shannon(), jnp.where(m, z, 0.0), T, mask=m)

    np.testing.assert_allclose(fast(z, 0.7), general(z, 0.7), atol=1e-15, rtol=0)
    for row in range(3):
        loss = lambda fn: lambda z, T: jnp.sum(fn(z, T)[row] * w)  # noqa: E731
        g_fast = jax.grad(loss(fast), argnums=(0, 1))(z, 0.7)
        g_gen = jax.grad(loss(general), argnums=(0, 1))(z, 0.7)
        for a, b in zip(g_fast, g_gen):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, b, atol=1e-14, rtol=0)
    T = jnp.array([0.5, 1.0, 2.0])  # per-row temperatures broadcast as in the general path
    np.testing.assert_allclose(fast(z, T), general(z, T), atol=1e-15, rtol=0)
