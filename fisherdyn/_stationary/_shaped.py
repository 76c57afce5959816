"""Renyi / Sharma-Mittal: the Tsallis map at a self-consistent temperature, solved as ONE
scalar equation per row (its threshold), with the certificate that the root is unique.

With $p = 1/(q-1)$, $d_i = \\max z - z_i \\ge 0$ and $u_i = (\\delta - d_i)_+$ (q > 1) or
$\\delta + d_i$ (q < 1), every Tsallis profile is $\\rho_i = u_i^p / S_p$, $S_k = \\sum_i u_i^k$:
its temperature is $q S_p^{q-1}/|q-1|$ and $M_q = S_{p+1}/S_p^q$. With $T_{eff} = T M^{-s}$
(the family's `shape_exponent`: Renyi 1, Sharma-Mittal (q-r)/(q-1)) the self-consistency is,
in $t = \\log\\delta$,

$$h(t) = s \\log S_{p+1} - \\beta \\log S_p - \\log a = 0, \\quad
\\beta = s q - (q-1),\\ a = qT/|q-1|,$$

i.e. $h = t + s \\log\\hat S_{p+1} - \\beta\\log\\hat S_p - \\log a$ with
$\\hat S_k = \\sum (u/\\delta)^k$. $h \\to -\\infty$ as $\\delta \\to 0$ (one-hot) and
$+\\infty$ as $\\delta \\to \\infty$ (uniform); $dh/d\\delta = (1 - \\gamma D)/R$,
$\\gamma = \\beta/(q-1)$, $R = S_{p+1}/S_p > 0$, $D = S_{p+1} S_{p-1}/S_p^2 - 1 \\ge 0$
(Cauchy-Schwarz), and $dF(\\rho(\\delta))/d\\delta$ has the sign of h: stable branches are
the upward crossings and the least-F branch is the global minimum of F along the curve.
$\\gamma \\le 0$ (r >= 2 - 1/q: Renyi q < 1, Sharma-Mittal(2, 1.5), ...) makes h increasing:
one root, no scan. Otherwise a coarse grid certifies the row cell by cell (`_shape_certify`);
rows it cannot certify are rescanned on a fine grid (`_shape_scan`), a chunk of rows at a time.
Each evaluation of h is one pass over the scores, with no inner solve.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .._misc import concrete_float
from ._separable import row_max


def _log_moment(q, rho, active):
    """$\\log M_q = \\log\\sum_i\\rho_i^q$ over the active keys (keepdims)."""
    safe = jnp.where(active, rho, 1.0)
    return jnp.log(jnp.sum(jnp.where(active, jnp.exp(q * jnp.log(safe)), 0.0), -1, keepdims=True))


def _free_energy_rows(entropy, rho, z, keep, T):
    return -jnp.sum(jnp.where(keep, rho * z, 0.0), -1, keepdims=True) - T * entropy.value(
        rho, keep
    )[..., None]


_SHAPE_CELLS = 4  # certificate grid
_SHAPE_SCAN_CELLS = 64  # fine scan of the uncertified rows
_SHAPE_CHUNK_KEYS = 1 << 15  # keys (rows x N) per fine-scan chunk
_SHAPE_SOFT = 0.9  # heuristic bound on gamma*D at the ends of a cell no rigorous test passes
_SHAPE_SOFT_MIN_KEYS = 16  # active keys needed at the left end of a cell for the heuristic


class _Shape(NamedTuple):
    q: jax.Array
    p: jax.Array
    s: jax.Array
    beta: jax.Array
    gamma: jax.Array
    d: jax.Array
    keep: jax.Array
    loga: jax.Array
    t_lo: jax.Array
    t_hi: jax.Array


def _shape_setup(entropy, z, keep, T):
    q = entropy.q
    dtype = z.dtype
    s = entropy.shape_exponent()
    p = 1.0 / (q - 1)
    beta = s * q - (q - 1)
    gamma = beta / (q - 1)
    T = jnp.asarray(T, dtype)
    row_shape = jnp.broadcast_shapes(z.shape[:-1] + (1,), keep.shape[:-1] + (1,),
                                     T.shape if T.ndim else ())
    z = jnp.broadcast_to(z, row_shape[:-1] + z.shape[-1:])
    keep = jnp.broadcast_to(keep, z.shape)
    zmax = row_max(z, keep)
    d = jnp.where(keep, zmax - z, 0.0)
    n = jnp.sum(keep, -1, keepdims=True).astype(dtype)
    logn = jnp.log(n)
    above = q > 1
    loga = jnp.broadcast_to(jnp.log(q * T / jnp.abs(q - 1)), row_shape).astype(dtype)
    # Every root: h = log(delta/a) + s log M + (q-1) L with L = -log max(rho) in [0, log n]
    # and log M in [max(-qL, (1-q) log n), -(q-1) L] (q > 1) or [(1-q) L, (1-q) log n]
    # (q < 1); the extremes of h sit on the vertices of that triangle.
    c = q - 1
    v1 = jnp.where(above, c * c / q - s * c, s * (1 - q)) * logn
    v2 = jnp.where(above, (1 - s) * c, (s - 1) * (1 - q)) * logn
    t_lo = loga - jnp.maximum(0.0, jnp.maximum(v1, v2)) - 1e-3
    t_hi = loga - jnp.minimum(0.0, jnp.minimum(v1, v2)) + 1e-3
    # q > 1, 0 <= s <= 1: h >= log(R/a) and R >= delta - mean(d), so delta <= a + mean(d).
    tight = jnp.log(jnp.exp(loga) + jnp.sum(d, -1, keepdims=True) / n) + 1e-3
    t_hi = jnp.where(above & (s >= 0) & (s <= 1), jnp.minimum(t_hi, tight), t_hi)
    if concrete_float(q) is not None and concrete_float(q) > 1:
        d = jnp.where(keep, d, jnp.inf)  # no weight in _shape_sums
    return _Shape(q, p, s, beta, gamma, d, keep, loga, t_lo, t_hi)


def _shape_sums(sh, t, count=False, profile=False):
    """(Shat_{p-1}, Shat_p, Shat_{p+1}, X) at t = log delta, with
    X = sum (u/delta)^p (u/delta - 1) = Shat_{p+1} - Shat_p summed without cancellation (and,
    with `count`, the number of active keys), and the weights (u/delta)^p: one elementwise
    pass."""
    inv = jnp.exp(-t)
    qc, pc = concrete_float(sh.q), concrete_float(sh.p)
    if qc is not None and qc > 1:
        if profile:
            # the same v, written without a constant: XLA:CPU hands the profile's row sum to
            # a library that would fill the constants 1 and 0 as whole arrays per call
            delta = jnp.exp(t)
            dm = jnp.minimum(sh.d, delta)
            v = (delta - dm) * inv
        else:
            dm = jnp.minimum(sh.d * inv, 1.0) / inv
            v = jnp.maximum(1.0 - sh.d * inv, 0.0)  # masked keys carry d = +inf: v = 0
        if pc == round(pc) and 1 <= pc <= 4:  # q = 2, 3/2, 4/3, 5/4: multiplies only
            k = int(round(pc))
            vm = (v > 0).astype(v.dtype) if k == 1 else jax.lax.integer_pow(v, k - 1)
            vp = v if k == 1 else vm * v
        else:
            act = v > 0
            vs = jnp.where(act, v, 1.0)
            # log1p(-d/delta), not log(v): near q = 1 the power p = 1/(q-1) multiplies the
            # rounding of v = 1 - d/delta (float32: p = 1e6 turns it into a 6% error)
            vp = jnp.where(act, jnp.exp(sh.p * jnp.log1p(-jnp.where(act, dm * inv, 0.0))), 0.0)
            vm = vp / vs
        vq = vp * v
        vx = -vp * jnp.minimum(sh.d * inv, 1.0)
    else:
        above = sh.q > 1
        d = jnp.where(sh.keep, sh.d, 0.0)
        x = jnp.where(above, -d * inv, d * inv)
        v = 1.0 + x
        act = sh.keep & (v > 0)
        vs = jnp.where(act, v, 1.0)
        vp = jnp.where(act, jnp.exp(sh.p * jnp.log1p(jnp.where(act, x, 0.0))), 0.0)
        vm = jnp.where(act, vp / vs, 0.0)
        vq = vp * vs
        vx = vp * jnp.where(act, x, 0.0)
    terms = (vm.astype(v.dtype), vp, vq, vx)
    if count:
        terms = terms + ((v > 0).astype(v.dtype) if qc is not None and qc > 1
                         else act.astype(v.dtype),)
    zero = jnp.zeros((), v.dtype)
    S = jax.lax.reduce(terms, (zero,) * len(terms), _add_tuple, (v.ndim - 1,))
    return tuple(x[..., None] for x in S), vp


def _add_tuple(a, b):
    return tuple(x + y for x, y in zip(a, b))


def _shape_eval(sh, t, count=False):
    S, _ = _shape_sums(sh, t, count)
    S0, S1, S2, X = S[:4]
    # h = t + s log Shat_{p+1} - beta log Shat_p - log a, written with
    # log Shat_{p+1} - log Shat_p = log1p(X / Shat_p): near q = 1 the shape exponent s is
    # ~1/(q-1) (Sharma-Mittal) and would multiply the rounding of the two logs
    h = t + sh.s * jnp.log1p(X / S1) + (1 - sh.s) * (sh.q - 1) * jnp.log(S1) - sh.loga
    dh = sh.s * (sh.p + 1) * S1 / S2 - sh.beta * sh.p * S0 / S1
    return (S0, S1, S2, h, dh) + S[4:]


def _shape_newton(sh, t, lo, hi, max_iter=60):
    """Bracketed Newton in t for h = 0, h(lo) < 0 <= h(hi) (bisection when Newton leaves)."""
    eps = jnp.finfo(sh.d.dtype).eps
    _, _, _, h, dh = _shape_eval(sh, t)

    def body(st):
        it, t, lo, hi, h, dh, done = st
        lo = jnp.where(h < 0, t, lo)
        hi = jnp.where(h >= 0, t, hi)
        newton = t - h / jnp.where(dh > 0, dh, 1.0)
        ok = (dh > 0) & (newton > lo) & (newton < hi)
        t_new = jnp.where(ok, newton, 0.5 * (lo + hi))
        small = jnp.abs(t_new - t) <= 4 * eps * (1 + jnp.abs(t))
        t_new = jnp.where(done, t, t_new)
        _, _, _, h_new, dh_new = _shape_eval(sh, t_new)
        done_new = done | small | (jnp.abs(h_new) <= 2 * eps) | (
            hi - lo <= 4 * eps * (1 + jnp.abs(t)))
        return (it + 1, t_new, lo, hi, jnp.where(done, h, h_new), jnp.where(done, dh, dh_new),
                done_new)

    st = (jnp.array(0), t, lo, hi, h, dh, jnp.abs(h) <= 2 * eps)
    _, t, lo, hi, h, _, _ = jax.lax.while_loop(
        lambda s: (s[0] < max_iter) & ~jnp.all(s[-1]), body, st)
    # the final bracket, the last evaluated t at one of its ends
    return jnp.where(h < 0, t, lo), jnp.where(h < 0, hi, t), h < 0


def _shape_profile(sh, lo, hi, at_lo):
    """(rho, log M) at the root Newton left in [lo, hi] (`at_lo`: its last t is lo, else hi).

    For q > 2 a group of tied keys enters the support with infinite slope: within one ulp of
    delta its weight jumps from 0 to a visible share and h jumps across 0, so no t is a
    root. Where the bracket has collapsed onto such a jump, the profile is interpolated
    between its ends with the share of the entering keys that zeroes h (h depends on it
    through Shat_p alone, as their (u/delta)^(p+1) vanishes): the profile of a delta inside
    the ulp. Elsewhere it is the profile at the last t."""
    (_, S1a, _, Xa), vpa = _shape_sums(sh, lo, profile=True)
    (_, S1b, _, Xb), vpb = _shape_sums(sh, hi, profile=True)
    ha = lo + sh.s * jnp.log1p(Xa / S1a) + (1 - sh.s) * (sh.q - 1) * jnp.log(S1a) - sh.loga
    gap = S1b - S1a
    beta = jnp.where(sh.beta != 0, sh.beta, 1.0)
    theta = S1a * jnp.expm1(ha / beta) / jnp.where(gap > 0, gap, 1.0)
    eps = jnp.finfo(sh.d.dtype).eps
    jump = (gap > 0) & (sh.beta != 0) & (hi - lo <= 8 * eps * (1 + jnp.abs(hi)))
    theta = jnp.where(jump, jnp.clip(theta, 0.0, 1.0), jnp.where(at_lo, 0.0, 1.0))
    w = vpa + theta * (vpb - vpa)
    # the weights' own sum, not the tuple reduction's Shat_p: XLA:CPU sums a tuple
    # reduction in one running sum, whose float32 rounding over a long row shows in sum(rho)
    S1 = jnp.sum(w, -1, keepdims=True)
    X = Xa + theta * (Xb - Xa)
    # log M = log Shat_{p+1} - q log Shat_p, without cancellation near q = 1
    return w / S1, jnp.log1p(X / S1) - (sh.q - 1) * jnp.log(S1)


def _shape_grid(sh, K):
    u = jnp.linspace(0.0, 1.0, K + 1, dtype=sh.d.dtype)
    tg = sh.t_lo + (sh.t_hi - sh.t_lo) * u.reshape((K + 1,) + (1,) * sh.d.ndim)
    # one row pass per grid point: a batched (K+1, ..., N) pass does not fit in cache
    S0, S1, S2, h, _, n = jax.lax.map(lambda t: _shape_eval(sh, t, True), tg)
    return tg, S0, S1, S2, h, n


def _pick_cell(k, tg, h):
    """Bracket and secant start in cell k of the grid (k: (1, ...) indices)."""
    pick = lambda x: jnp.take_along_axis(x * jnp.ones_like(h[:-1]), k, 0)  # noqa: E731
    lo, hi, h_lo, h_hi = pick(tg[:-1]), pick(tg[1:]), pick(h[:-1]), pick(h[1:])
    t0 = lo - h_lo * (hi - lo) / jnp.where(h_hi != h_lo, h_hi - h_lo, 1.0)
    return jnp.clip(t0, lo, hi), lo, hi


def _shape_certify(sh, tg, S0, S1, S2, h, n):
    """Per row: is the root unique (so that Newton in its grid cell finds every branch)?

    A cell [t_k, t_k+1] passes when (rigorous) h cannot vanish on it: <d> is nondecreasing in
    delta, so R = delta -+ <d> lies in [delta_k -+ <d>_k+1, delta_k+1 -+ <d>_k] (q > 1; for q < 1
    R = delta + <d> is monotone), and (q-1) log S_p is increasing; or (rigorous) h is increasing
    on it: gamma D <= gamma (S_{p+1} S_{p-1} / S_p^2)_max - gamma < 1 from the endpoint sums,
    each S_k being monotone in delta when p >= 1 or q < 1; or (heuristic) gamma D <= 0.9 at
    both ends. The row is certified when every cell passes and h changes sign exactly once.
    """
    q, p, s, gamma = sh.q, sh.p, sh.s, sh.gamma
    above = q > 1
    dg = jnp.exp(tg)
    vbar = S2 / S1
    dd = jnp.where(above, dg * (1 - vbar), dg * (vbar - 1))  # <d>
    W = (q - 1) * (p * tg + jnp.log(S1))  # (q-1) log S_p
    R_min = jnp.where(above, dg[:-1] - dd[1:], dg[:-1] + dd[:-1])
    R_max = jnp.where(above, dg[1:] - dd[:-1], dg[1:] + dd[1:])
    lR_min = jnp.log(jnp.maximum(R_min, 0.0))
    lR_max = jnp.log(jnp.maximum(R_max, 0.0))
    a1, a2 = s * lR_min, s * lR_max
    b1, b2 = (1 - s) * W[:-1], (1 - s) * W[1:]
    h_min = jnp.minimum(a1, a2) + jnp.minimum(b1, b2) - sh.loga
    h_max = jnp.maximum(a1, a2) + jnp.maximum(b1, b2) - sh.loga
    excluded = (h_min > 0) | (h_max < 0)
    lS0 = (p - 1) * tg + jnp.log(S0)
    lS1 = p * tg + jnp.log(S1)
    lS2 = (p + 1) * tg + jnp.log(S2)
    log_kappa = (jnp.maximum(lS0[:-1], lS0[1:]) + jnp.maximum(lS2[:-1], lS2[1:])
                 - 2 * jnp.minimum(lS1[:-1], lS1[1:]))
    increasing = (gamma <= 0) | (((q < 1) | (p >= 1)) & (gamma * jnp.expm1(log_kappa) < 1))
    gD = gamma * (S0 * S2 / (S1 * S1) - 1)
    # the heuristic only where D cannot move fast: no support changes (q < 1), or 1 < q <= 2
    # with enough active keys at the cell's left end that keys entering the support move D
    # by little (q = 2: D jumps by (D + 1)/n at each entry); never for q > 2 (D -> inf at
    # each entry). A near-one-hot start (few active keys) is where folds hide.
    smooth = (q < 1) | ((p >= 1) & (n[:-1] >= _SHAPE_SOFT_MIN_KEYS))
    soft = smooth & (jnp.maximum(gD[:-1], gD[1:]) <= _SHAPE_SOFT)
    neg = h < 0
    change = neg[:-1] != neg[1:]
    ok = jnp.all(excluded | increasing | soft, 0) & (jnp.sum(change, 0) == 1)
    return ok, jnp.argmax(change, 0)[None]


def _shape_scan(entropy, sh, T, K=_SHAPE_SCAN_CELLS, n_candidates=3):
    """All rows: fine grid in t, the upward crossings of h ranked by the free energy of the
    grid profiles at their ends, each candidate polished by Newton, the least F returned."""
    tg, S0, S1, S2, h, _ = _shape_grid(sh, K)
    dg = jnp.exp(tg)
    vbar = S2 / S1
    dd = jnp.where(sh.q > 1, dg * (1 - vbar), dg * (vbar - 1))  # <d>
    F = dd - T * entropy.value_of_log_moment(jnp.log(S2) - sh.q * jnp.log(S1))  # F + max z
    neg = h < 0
    up = neg[:-1] & ~neg[1:]
    score = jnp.where(up, jnp.minimum(F[:-1], F[1:]), jnp.inf)
    order = jnp.argsort(score[..., 0], axis=0)[:n_candidates][..., None]  # (C, ..., 1)
    valid = jnp.take_along_axis(score, order, 0) < jnp.inf
    order = jnp.where(valid, order, order[:1])
    t0, lo, hi = _pick_cell(order, tg, h)
    rho_c, logM_c = _shape_profile(sh, *_shape_newton(sh, t0, lo, hi))
    zrel = jnp.where(sh.keep, -sh.d, 0.0)
    F_c = _free_energy_rows(entropy, rho_c, zrel, sh.keep, T)
    best = jnp.argmin(F_c[..., 0], axis=0)[None, ..., None]
    return jnp.take_along_axis(rho_c, best, 0)[0], jnp.take_along_axis(logM_c, best, 0)[0]


def _shape_rescan(entropy, sh, T, redo, rho, logM):
    """Replace the rows flagged in `redo` by `_shape_scan`, a chunk of rows at a time."""
    N = rho.shape[-1]
    row_shape = rho.shape[:-1] + (1,)
    B = 1
    for size in row_shape[:-1]:
        B *= size
    flat = lambda x: jnp.broadcast_to(x, row_shape[:-1] + x.shape[-1:]).reshape(  # noqa: E731
        (B, x.shape[-1]))
    fl = _Shape(sh.q, sh.p, sh.s, sh.beta, sh.gamma, flat(sh.d), flat(sh.keep), flat(sh.loga),
                flat(sh.t_lo), flat(sh.t_hi))
    T_f = flat(jnp.broadcast_to(jnp.asarray(T, rho.dtype), row_shape))
    redo = flat(redo)[:, 0]
    # chunks of ~32K keys: large enough that the loop overhead is small against the scan,
    # small enough that a few uncertified rows do not drag many idle ones through it
    Bc = min(B, max(1, _SHAPE_CHUNK_KEYS // N))
    order = jnp.nonzero(redo, size=B, fill_value=B)[0]
    count = jnp.sum(redo)

    def body(c):
        j, rho, logM = c
        idx = jax.lax.dynamic_slice(order, (j * Bc,), (Bc,))
        valid = idx < B
        at = jnp.where(valid, idx, 0)
        sub = _Shape(*fl[:5], *(x[at] for x in fl[5:]))
        r, m = _shape_scan(entropy, sub, T_f[at])
        tgt = jnp.where(valid, idx, B)
        return j + 1, rho.at[tgt].set(r, mode="drop"), logM.at[tgt].set(m, mode="drop")

    _, rho_f, logM_f = jax.lax.while_loop(lambda c: c[0] * Bc < count, body,
                                          (jnp.array(0), rho.reshape(B, N), logM.reshape(B, 1)))
    return rho_f.reshape(rho.shape), logM_f.reshape(logM.shape)


def _solve_tsallis_shaped(entropy, z, keep, T):
    """(rho, log M) of every row: Newton where the root is certified unique, else the fine
    scan for the branch of least free energy."""
    if entropy.shape_exponent() is None:
        raise TypeError(f"no threshold parametrization for {type(entropy).__name__}")
    sh = _shape_setup(entropy, z, keep, T)
    gamma = concrete_float(sh.gamma)
    if gamma is not None and gamma <= 0:  # h increasing: the root is unique
        return _shape_profile(sh, *_shape_newton(sh, 0.5 * (sh.t_lo + sh.t_hi), sh.t_lo,
                                                 sh.t_hi))
    tg, S0, S1, S2, h, n = _shape_grid(sh, _SHAPE_CELLS)
    ok, k = _shape_certify(sh, tg, S0, S1, S2, h, n)
    t0, lo, hi = _pick_cell(k, tg, h)
    rho, logM = _shape_profile(sh, *_shape_newton(sh, t0[0], lo[0], hi[0]))
    return _shape_rescan(entropy, sh, T, ~ok, rho, logM)
