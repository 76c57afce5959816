"""Eigenvalues of a diagonal matrix under a rank-one modification, from the secular equation.

`secular_eigenvalues(d, z2, valid, inv_sigma)` returns the eigenvalues of
$D + \\sigma zz^\\top$ ($1/\\sigma$ = `inv_sigma` finite), or of $D$ compressed onto
$z^\\perp$ (`inv_sigma` = 0, the limit $\\sigma \\to \\infty$), over the `valid` entries.
Ties in $d$ and zero weights deflate (the eigenvalue is $d_i$ itself); the others are the
roots of $1/\\sigma + \\sum_i z_i^2/(d_i - \\lambda) = 0$, one between each pair of
consecutive poles (and one past the last pole for $\\sigma > 0$). Each root is found from
the nearer pole of its interval (a shift $\\tau$, so that the differences $d_i - \\lambda$
keep their relative precision next to a pole) by the rational "middle way" iteration of
Gragg / Bunch-Nielsen-Sorensen, safeguarded by bisection: first on the poles of a window
around the interval plus a Taylor expansion of the other poles, then with every pole (a
pass per step, until a step is below the square root of the rounding: usually one).
Every pass runs in blocks of roots, so memory stays O(N); past about 900 poles, a block
sums the poles far from it through one series (`_far_field`), so a pass costs about
O(N^2/64) instead of O(N^2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._far_field import far_fields, near_width, series_derivative

__all__ = ["secular_eigenvalues"]

# poles on each side of an interval that the first, local solve sees exactly
_WINDOW = 24
# roots per block of a pass over all pairs (a (block, N) slab at a time)
_BLOCK = 64
_LOCAL_ITERS = 40
_MAX_EXACT_PASSES = 6


def _root_blocks(n_roots, *per_root):
    """The per-root arrays in blocks of `_BLOCK` roots, (blocks, `_BLOCK`), the last padded
    with copies of the last root."""
    pad = (-n_roots) % _BLOCK
    return tuple(jnp.pad(a, (0, pad), mode="edge").reshape(-1, _BLOCK) for a in per_root)


def _blocked(fn, n_roots, *per_root, far=None):
    """`fn(*per_root_block)` over blocks of `_BLOCK` roots, results concatenated; with a
    far field (`far_fields` of the same blocks), `fn(*per_root_block, far_block)`."""
    if n_roots <= _BLOCK:
        return fn(*per_root)
    blocks = _root_blocks(n_roots, *per_root)
    if far is None:
        out = jax.lax.map(lambda args: fn(*args), blocks)
    else:
        out = jax.lax.map(lambda args: fn(*args[0], args[1]), (blocks, far))
    return jax.tree_util.tree_map(lambda a: a.reshape(-1)[:n_roots], out)


def row_sums(*terms):
    """The sums over the last axis of several arrays in one loop (one variadic reduce: XLA
    would otherwise recompute their shared producers, a division, once per sum)."""
    zero = jnp.zeros((), terms[0].dtype)
    return jax.lax.reduce(terms, (zero,) * len(terms),
                          lambda x, y: tuple(a + b for a, b in zip(x, y)), (terms[0].ndim - 1,))


def _middle_way(tau, da, db, inv_sigma, psi, dpsi, phi, dphi, has_b):
    """The step of the two-pole rational model matched to value and slope at `tau`."""
    A = dpsi * da * da
    B = jnp.where(has_b, dphi * db * db, 0.0)
    C = inv_sigma + psi - dpsi * da + phi - jnp.where(has_b, dphi * db, 0.0)
    # C (da - e)(db - e) + A (db - e) + B (da - e) = 0, the root with da < e < db
    db_ = jnp.where(has_b, db, 0.0)
    a2 = C
    a1 = C * (da + db_) + A + B
    a0 = C * da * db_ + A * db_ + B * da
    # without b the model is C + A/(da - e) = 0 (the last root of sigma > 0): e = da + A/C
    e_lin = da + A / jnp.where(C == 0, 1.0, C)
    disc = jnp.sqrt(jnp.maximum(a1 * a1 - 4 * a2 * a0, 0.0))
    qq = -0.5 * (-a1 + jnp.where(a1 >= 0, -disc, disc))
    qq = jnp.where(qq == 0, 1.0, qq)
    e1 = qq / jnp.where(a2 == 0, 1.0, a2)
    e2 = a0 / qq
    inside1 = (e1 > da) & (e1 < db) & (a2 != 0)
    e = jnp.where(inside1, e1, e2)
    return tau + jnp.where(has_b, e, e_lin)


def _safeguard(new, tau, lo, hi, scale):
    """`new` inside the bracket; else bisection, except for a step at the rounding level of
    a converged root (where the bracket has closed onto it)."""
    ok = (new > lo) & (new < hi) & jnp.isfinite(new)
    still = jnp.abs(new - tau) <= 8 * jnp.finfo(tau.dtype).eps * scale
    return jnp.where(ok, new, jnp.where(still, tau, 0.5 * (lo + hi)))


def _step(inv_sigma, tau, lo, hi, sums, a, b, ov, has_b):
    """One safeguarded middle-way step of every root, with its bracket updated."""
    psi, dpsi, phi, dphi = sums
    g = inv_sigma + psi + phi
    hi = jnp.where(g > 0, tau, hi)
    lo = jnp.where(g < 0, tau, lo)
    da = (a - ov) - tau
    db = (b - ov) - tau
    new = _middle_way(tau, da, db, inv_sigma, psi, dpsi, phi, dphi, has_b)
    return _safeguard(new, tau, lo, hi, jnp.abs(tau) + jnp.abs(ov)), lo, hi



def _secular_poles(d, z2, valid, inv_sigma, tie_rtol):
    """Sort and deflate the poles of `secular_eigenvalues`: the tie groups, the secular
    poles compacted to the front (padded beyond every root) and each root's interval."""
    n = d.shape[0]
    dtype = d.dtype
    idx = jnp.arange(n)
    # sort: the valid entries by d, then the rest
    big = jnp.where(valid, jnp.abs(d), 0.0).max()
    key = jnp.where(valid, d, jnp.inf)
    order = jnp.argsort(key, stable=True)
    ds, ws, vs = d[order], jnp.where(valid, z2, 0.0)[order], valid[order]
    # a tie group starts where the gap to the previous valid pole exceeds the tolerance
    gap = jnp.concatenate([jnp.full((1,), jnp.inf, dtype), ds[1:] - ds[:-1]])
    start = vs & (gap > tie_rtol * big)
    group = (jnp.cumsum(start) - 1).astype(idx.dtype)
    gw = jax.ops.segment_sum(ws, jnp.where(vs, group, n), n + 1)[:n]
    # a pole takes part in the secular equation where its group's weight is positive;
    # every other member of a group (and every zero-weight group) is an eigenvalue itself
    gpos = gw > 0
    n_groups = jnp.sum(start)
    is_pole_group = (idx < n_groups) & gpos
    # the group's pole value: its first member
    first = jnp.zeros(n, idx.dtype).at[jnp.where(start, group, n)].set(idx, mode="drop")
    gval = ds[first]
    deflated = vs & ~(start & gpos[jnp.clip(group, 0, n - 1)])
    # compact the secular poles to the front
    pole_order = jnp.argsort(jnp.where(is_pole_group, gval, jnp.inf), stable=True)
    p_on = is_pole_group[pole_order]
    n_s = jnp.sum(p_on)
    pv = gval[pole_order]
    pw = jnp.where(p_on, gw[pole_order], 0.0)
    top = jnp.where(p_on, pv, -jnp.inf).max()
    bot = jnp.where(p_on, pv, jnp.inf).min()
    total_w = jnp.sum(pw)
    span = jnp.where(n_s > 0, top - bot, 0.0)
    extra = jnp.where(inv_sigma > 0, total_w / jnp.where(inv_sigma > 0, inv_sigma, 1.0), 0.0)
    # padding poles beyond every root, weight 0 (finite, so that no difference is 0)
    far = jnp.where(n_s > 0, top + jnp.abs(top), 0.0) + 2 * (span + extra) + 1
    pv = jnp.where(p_on, pv, far)
    # roots: interval k = (pv[k], pv[k+1]), k < n_s - 1; for sigma > 0 also k = n_s - 1
    k = idx
    n_roots = n_s - 1 + (inv_sigma > 0).astype(n_s.dtype)
    root_ok = k < n_roots
    has_b = k < n_s - 1
    a = pv[k]
    b = jnp.where(has_b, pv[jnp.clip(k + 1, 0, n - 1)], a + extra)
    width = b - a

    return dict(order=order, ds=ds, vs=vs, group=group, gval=gval, deflated=deflated,
                pole_order=pole_order, pv=pv, pw=pw, k=k, root_ok=root_ok, has_b=has_b,
                a=a, b=b, width=width)


def _window_taylor(pv, pw, j, kb, mb, W):
    """Per root of the block (`kb`, interval midpoints `mb`): the Taylor coefficients
    $\\sum w u^{m+1}$, m = 0..5, $u = 1/(d_j - \\mathrm{mid})$, of the poles `pv[j]`
    outside the root's window, and the left poles' share $\\sum_{d_j < \\mathrm{mid}} w u^2$
    of the slope."""
    u = 1.0 / (pv[None, :] - mb[:, None])
    # the window's poles are summed exactly in the local solve
    offset = j[None, :] - kb[:, None]
    r1 = jnp.where((offset < -W + 1) | (offset > W), pw[None, :] * u, 0.0)
    r2 = r1 * u
    r3 = r2 * u
    r4 = r3 * u
    r5 = r4 * u
    return row_sums(r1, r2, r3, r4, r5, r5 * u, jnp.minimum(r1, 0.0) * u)


def _block_taylor(pv, pw, kb, mb, far, W):
    """`_window_taylor` over every pole for one block of roots: the near poles exactly and
    the far ones from the block's series (`far`, None: every pole exactly)."""
    n = pv.shape[0]
    idx = jnp.arange(n)
    if far is None:
        return _window_taylor(pv, pw, idx, kb, mb, W)
    width = near_width(kb.shape[0])

    def series():
        near = _window_taylor(jax.lax.dynamic_slice_in_dim(pv, far.start, width),
                              jax.lax.dynamic_slice_in_dim(pw, far.start, width),
                              far.start + jnp.arange(width), kb, mb, W)
        dt = mb - far.c
        coef = [series_derivative(far, dt, m) for m in range(6)]
        # the far left poles' share of the slope: the derivative of their series
        coef.append(series_derivative(far, dt, 1, left=True))
        return tuple(a + b for a, b in zip(near, coef))

    return jax.lax.cond(far.ok, series, lambda: _window_taylor(pv, pw, idx, kb, mb, W))


def _local_solve(pv, pw, k, a, b, width, has_b, inv_sigma):
    """The roots from the window's poles exactly and the far poles by their Taylor series:
    `(tau, lo, hi, origin, ov)`, root k = ov + tau in the bracket (lo, hi) about ov."""
    n = pv.shape[0]
    dtype = pv.dtype
    idx = jnp.arange(n)
    # far poles by their Taylor series (degree 5) about the midpoint
    W = min(_WINDOW, n)
    offs = jnp.arange(-W + 1, W + 1)

    mid = a + 0.5 * width
    far = far_fields(pv, pw, *_root_blocks(n, k, a, b)) if n > _BLOCK else None
    S = _blocked(lambda kb, mb, fb=None: _block_taylor(pv, pw, kb, mb, fb, W), n, k, mid, far=far)
    S1l = S[-1]
    wi = jnp.clip(k[:, None] + offs[None, :], 0, n - 1)
    w_in = (k[:, None] + offs[None, :] >= 0) & (k[:, None] + offs[None, :] < n)
    wv = pv[wi]
    ww = jnp.where(w_in, pw[wi], 0.0)
    wleft = offs[None, :] <= 0

    def local(origin_v, tau):
        dl = (wv - origin_v[:, None]) - tau[:, None]
        dl = jnp.where(ww > 0, dl, 1.0)
        r = ww / dl
        r2 = r / dl
        t = (origin_v - mid) + tau
        F = S[5]
        dF = 5 * S[5]
        for j in (4, 3, 2, 1):
            F = S[j] + t * F
            dF = j * S[j] + t * dF
        F = S[0] + t * F
        dFl = jnp.clip(S1l + t * 2 * S[2], 0.0, dF)  # the left poles' share of the slope
        psi = jnp.sum(jnp.where(wleft, r, 0.0), 1)
        phi = jnp.sum(jnp.where(wleft, 0.0, r), 1) + F
        dpsi = jnp.sum(jnp.where(wleft, r2, 0.0), 1) + dFl
        dphi = jnp.sum(jnp.where(wleft, 0.0, r2), 1) + (dF - dFl)
        return psi, dpsi, phi, dphi

    # which half holds the root: the sign of the equation at the midpoint
    zero = jnp.zeros(n, dtype)
    psi, dpsi, phi, dphi = local(mid, zero)
    at_mid = inv_sigma + psi + phi
    from_a = (at_mid >= 0) | ~has_b
    origin = jnp.where(from_a, k, jnp.clip(k + 1, 0, n - 1))
    ov = jnp.where(from_a, a, b)
    lo = jnp.where(from_a, 0.0, -0.5 * width)
    hi = jnp.where(from_a, jnp.where(has_b, 0.5 * width, width), 0.0)
    tau0 = 0.5 * (lo + hi)

    def local_body(_, carry):
        tau, lo, hi = carry
        return _step(inv_sigma, tau, lo, hi, local(ov, tau), a, b, ov, has_b)

    tau, _, _ = jax.lax.fori_loop(0, _LOCAL_ITERS, local_body, (tau0, lo, hi))

    return tau, lo, hi, origin, ov, far


def _pole_sums(pv, pw, ovb, taub):
    """The sums of w/(d - lambda) and w/(d - lambda)^2 over the poles left and right of
    each root lambda = ovb + taub."""
    u = 1.0 / ((pv[None, :] - ovb[:, None]) - taub[:, None])
    r = pw[None, :] * u
    # the poles left of a root are exactly those with d_i - lambda < 0, i.e. r < 0
    left, right = jnp.minimum(r, 0.0), jnp.maximum(r, 0.0)
    return row_sums(left, left * u, right, right * u)


def _block_pole_sums(pv, pw, ovb, taub, far):
    """`_pole_sums` over every pole for one block of roots: the near poles one by one and
    the far ones from the block's series (`far`, None: every pole one by one)."""
    if far is None:
        return _pole_sums(pv, pw, ovb, taub)
    width = near_width(ovb.shape[0])

    def series():
        near = _pole_sums(jax.lax.dynamic_slice_in_dim(pv, far.start, width),
                          jax.lax.dynamic_slice_in_dim(pw, far.start, width), ovb, taub)
        dt = (ovb - far.c) + taub
        F, dF = series_derivative(far, dt, 0), series_derivative(far, dt, 1)
        FL, dFL = series_derivative(far, dt, 0, True), series_derivative(far, dt, 1, True)
        return near[0] + FL, near[1] + dFL, near[2] + (F - FL), near[3] + (dF - dFL)

    return jax.lax.cond(far.ok, series, lambda: _pole_sums(pv, pw, ovb, taub))


def _exact_passes(pv, pw, tau, lo, hi, a, b, ov, has_b, root_ok, inv_sigma, far):
    """Every pole (the far ones through their block's series, `far`), until the steps no
    longer move the roots (each block of roots stops on its own); the local bracket came
    from an approximate equation, so these start from the half-interval again."""
    n = pv.shape[0]
    dtype = pv.dtype
    eps = jnp.finfo(dtype).eps

    def exact(tau, lo, hi, a, b, ov, has_b, use, fb=None):
        def exact_sums(ovb, taub):
            return _block_pole_sums(pv, pw, ovb, taub, fb)

        def cond(carry):
            _, _, _, i, moved = carry
            return (i < _MAX_EXACT_PASSES) & moved

        def body(carry):
            tau, lo, hi, i, _ = carry
            new, lo, hi = _step(inv_sigma, tau, lo, hi, exact_sums(ov, tau), a, b, ov, has_b)
            # the iteration converges quadratically: after a step below sqrt(eps) (times a
            # margin for its constant) the next would be below the rounding
            change = jnp.abs(new - tau) > 0.03 * jnp.sqrt(eps) * (jnp.abs(new) + jnp.abs(ov))
            return new, lo, hi, i + 1, jnp.any(change & use)

        init = (tau, lo, hi, jnp.zeros((), jnp.int32), jnp.any(use))
        return jax.lax.while_loop(cond, body, init)[0]

    return _blocked(exact, n, tau, lo, hi, a, b, ov, has_b, root_ok, far=far)


def secular_eigenvalues(d, z2, valid, inv_sigma, tie_rtol):
    """Eigenvalues of $D + \\sigma zz^T$ ($z^\\perp$-compressed for `inv_sigma` = 0).

    **Arguments:** `d`, `z2` ($z_i^2 \\ge 0$), `valid` (entries taking part), all (n,);
    `inv_sigma` $= 1/\\sigma \\ge 0$ (flip the signs of `d` for $\\sigma < 0$); `tie_rtol`:
    poles closer than this times the largest $|d|$ are one pole (deflation).

    **Returns:** `(values, ok, group_of, group_value, pole_order, poles, origin, tau)`:
    `values[ok]` are the eigenvalues (`sum(valid)` of them, one fewer for the compression),
    the first n slots the secular roots, the last n the deflated entries (at their own
    $d_i$). `group_of` is each entry's tie group (n where not valid) and `group_value` the
    group's pole; the secular poles are `poles = group_value[pole_order]` (then padding),
    and root k is `poles[origin[k]] + tau[k]`, for a caller who needs accurate differences
    $d_i - \\lambda$.
    """
    n = d.shape[0]
    dtype = d.dtype
    idx = jnp.arange(n)
    P = _secular_poles(d, z2, valid, inv_sigma, tie_rtol)
    order, ds, vs, group, gval = P["order"], P["ds"], P["vs"], P["group"], P["gval"]
    pv, pw, k, root_ok, has_b = P["pv"], P["pw"], P["k"], P["root_ok"], P["has_b"]
    a, b, deflated, pole_order = P["a"], P["b"], P["deflated"], P["pole_order"]
    tau, lo, hi, origin, ov, far = _local_solve(pv, pw, k, a, b, P["width"], has_b, inv_sigma)
    tau = _exact_passes(pv, pw, tau, lo, hi, a, b, ov, has_b, root_ok, inv_sigma, far)
    roots = ov + tau
    # the deflated eigenvalues: the other members of each tie group and zero-weight poles
    defl_vals = jnp.zeros(n, dtype).at[order].set(jnp.where(deflated, ds, 0.0))
    defl_ok = jnp.zeros(n, bool).at[order].set(deflated)
    values = jnp.concatenate([jnp.where(root_ok, roots, 0.0), defl_vals])
    ok = jnp.concatenate([root_ok, defl_ok])
    group_of = jnp.full(n, n, idx.dtype).at[order].set(jnp.where(vs, group, n))
    return values, ok, group_of, gval, pole_order, pv, origin, tau
