"""The batch-native separable root: $\\hat G(\\rho_i) = (z_i - \\nu)/T$, $\\sum_i\\rho_i = 1$.

The componentwise inverse law (the family's `component_law`) plus one scalar normalization
root $\\nu$ per row, found by a bracketed (safeguarded) Newton iteration on a Box-Cox
transform of $S(\\nu) = \\sum_i\\rho_i(\\nu)$. The bracket $[\\max z, \\max z - T\\hat G(1/N)]$
is exact: at its ends the top weight is 1 and 1/N. A law with a finite cutoff
(`AbstractCutoffComponentLaw`) is solved for the threshold's distance below the top score
instead, in units of its value at weight 1/N, so that rows of many near-tied keys (every
weight far below 1) keep the relative precision of that distance. The loop carries one
scalar per row, so each iteration is one fused pass over the scores. Everything
family-specific is asked of the family (`docs/math.md §2`); nothing here tests its type.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .._entropies import ComponentLawSwitch
from .._misc import concrete_float


def row_max(z, keep):
    return jnp.max(jnp.where(keep, z, -jnp.inf), axis=-1, keepdims=True)


def softmax(z, keep, T):
    x = jnp.where(keep, z / T, -jnp.inf)
    m = jnp.max(x, -1, keepdims=True)
    e = jnp.where(keep, jnp.exp(x - m), 0.0)
    return e / jnp.sum(e, -1, keepdims=True)


def _boxcox(S, dS, lam):
    lam = jnp.asarray(lam, S.dtype)
    lam_safe = jnp.where(lam == 0, 1.0, lam)
    logS = jnp.log(S)
    h = jnp.where(lam == 0, logS, jnp.expm1(lam * logS) / lam_safe)
    dh = jnp.exp((lam - 1) * logS) * dS
    return h, dh


class _RootState(NamedTuple):
    it: jax.Array
    nu: jax.Array
    h: jax.Array
    dh: jax.Array
    lo: jax.Array
    h_lo: jax.Array
    hi: jax.Array
    h_hi: jax.Array
    side: jax.Array
    aux: jax.Array  # the component law's state
    inner: jax.Array  # the component law's error, max over the row
    done: jax.Array
    # the last evaluation: its nu (nu itself unless a predicted step moved on), the sum of
    # the weights there and of their slopes dS/dy
    nu_eval: jax.Array
    S: jax.Array
    slope_sum: jax.Array


class _Rows(NamedTuple):
    """One batch of rows in the solver's gauge (row max 0) and its component law."""

    law: object
    z: jax.Array
    keep: jax.Array
    T: jax.Array
    inv_T: jax.Array
    lam: object
    unit: jax.Array | None = None  # the multiplier per unit of the solver's nu (None: 1)

    def multiplier(self, nu):
        return nu if self.unit is None else nu * self.unit

    def components(self, nu, aux, cold=False):
        # y = (z - nu)/T as a product: XLA:CPU writes a divided array out as a pass of its
        # own, a multiplied one fuses into its consumers
        y = jnp.where(self.keep, (self.z - self.multiplier(nu)) * self.inv_T, 0.0)
        rho, slope, aux, err = self.law(y, aux, cold)
        if err is None:
            inner = jnp.zeros_like(nu)
        else:
            inner = jnp.max(jnp.where(self.keep, err, 0.0), -1, keepdims=True)
        return jnp.where(self.keep, rho, 0.0), jnp.where(self.keep, slope, 0.0), aux, inner

    def evaluate(self, nu, aux, cold=False):
        h, dh, aux, inner, _, _ = self.evaluate_sums(nu, aux, cold)
        return h, dh, aux, inner

    def evaluate_sums(self, nu, aux, cold=False):
        """`evaluate`, and the sums of the weights and of their slopes."""
        rho, slope, aux, inner = self.components(nu, aux, cold)
        S = jnp.sum(rho, -1, keepdims=True)
        slope_sum = jnp.sum(slope, -1, keepdims=True)
        dS = -self.multiplier(slope_sum) / self.T
        h, dh = _boxcox(S, dS, self.lam)
        return h, dh, aux, inner, S, slope_sum


def _tolerances(dtype):
    """(|S - 1| target, component error target, eps): float32 stops at 16 eps (~2e-6),
    well inside its rounding of the scores themselves."""
    eps = jnp.finfo(dtype).eps
    return (4 * eps if eps < 1e-10 else 16 * eps), 256 * eps, eps


def _spread_shift(entropy, z, keep, zbar, n, hi, T, law=None):
    r"""Second-order correction to Jensen's start: $S(\nu) \approx n\,x(\bar y) +
    \tfrac{n}{2} x''(\bar y) V$, V the row variance of $y = (z - \nu)/T$, so one Newton step
    from Jensen's $\bar y$ (where $n\,x(\bar y) = 1$) moves nu right by
    $\tfrac{T}{2} V x''/x'$ (Shannon: $T V/2$, the lognormal correction). Rows only, apart
    from the variance. `law`: `y -> (x, dx/dy)` as the solver evaluates it cold (default
    `inverse_shifted`). The shifted start may land right of the root, which the bracketed
    iteration takes in its stride."""
    dev = jnp.where(keep, z - zbar, 0.0)
    V = jnp.sum(dev * dev, -1, keepdims=True) / (n * T * T)
    ybar = -hi / T
    law = entropy.inverse_shifted if law is None else law
    (_, slope), (_, curv) = jax.jvp(law, (ybar,), (jnp.ones_like(ybar),))
    shift = 0.5 * T * V * curv / jnp.where(slope > 0, slope, 1.0)
    # trusted while the spread is within one temperature unit (V <= 1), held at its V = 1
    # value beyond, where the raw correction overshoots for wide rows
    shift = shift * jnp.minimum(1.0, 1.0 / V)
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    ok = entropy.second_order_start()
    if ok is not True:
        shift = jnp.where(ok, shift, 0.0)
    return jax.lax.stop_gradient(shift).astype(z.dtype)


def _start(entropy, rows, n, lo, hi, use_newton, newton_always):
    r"""Jensen: for a convex law x(y) (all but Tsallis q > 2), $S(\nu) \ge n\,x(\bar y)$, so
    $\nu = \bar z + hi$ (where $n x = 1$) is still left of the root, far closer than the max
    for dense families; the variance correction (`_spread_shift`) may land right of it."""
    zbar = jnp.sum(rows.z, -1, keepdims=True) / n  # masked entries are 0 here
    hi_m = rows.multiplier(hi)
    shift = _spread_shift(entropy, rows.z, rows.keep, zbar, n, hi_m, rows.T, rows.law.cold)
    jensen = zbar + hi_m + shift
    jensen = jnp.clip(jensen if rows.unit is None else jensen / rows.unit, lo, hi)
    return jensen if newton_always else jnp.where(use_newton, jensen, lo)


def _scale(rows, nu):
    """The size nu is resolved relative to: |nu| + T from weight 1; from a cutoff, |nu|
    alone (there nu is the threshold's distance below the top score in units of its value
    at weight 1/n, the only scale of the keys on the support)."""
    return jnp.abs(nu) if rows.unit is not None else jnp.abs(nu) + rows.T


def _root_step(rows, s, use_newton, max_h, tols):
    """One iteration: bracket update, Newton / Illinois / bisection step, evaluation, stop
    tests (including the predictive stop after a quadratic-convergence step)."""
    tol, inner_tol, eps = tols
    T = rows.T
    # bracket updates only trust h when the components are converged, or their error is
    # well below |h| (the sign of h is then right)
    trusted = (s.inner <= inner_tol) | (
        (s.inner <= 1e3 * inner_tol) & (8 * s.inner <= jnp.abs(s.h))
    )
    left = (s.h >= 0) & trusted
    right = (s.h < 0) & trusted
    lo = jnp.where(left, s.nu, s.lo)
    h_lo = jnp.where(left, s.h, s.h_lo)
    hi = jnp.where(right, s.nu, s.hi)
    h_hi = jnp.where(right, s.h, s.h_hi)
    # Illinois: the same end moved twice in a row -> halve the other end's value
    side = jnp.where(left, 1, jnp.where(right, -1, 0)).astype(jnp.int8)
    h_hi = jnp.where(left & (s.side == 1), 0.5 * h_hi, h_hi)
    h_lo = jnp.where(right & (s.side == -1), 0.5 * h_lo, h_lo)
    newton = s.nu - s.h / jnp.where(s.dh < 0, s.dh, -1.0)
    ok_newton = use_newton & (newton >= lo) & (newton <= hi) & jnp.isfinite(newton)
    denom = h_lo - h_hi
    secant = lo + h_lo * (hi - lo) / jnp.where(denom > 0, denom, 1.0)
    ok_secant = (denom > 0) & (secant >= lo) & (secant <= hi)
    nu_new = jnp.where(ok_newton, newton, jnp.where(ok_secant, secant, 0.5 * (lo + hi)))
    small = jnp.abs(nu_new - s.nu) <= 2 * eps * _scale(rows, s.nu)
    # a warm-started law whose components are not converged stays at nu and refines them:
    # stepping on an inexact h without a bracket update can cycle
    warm = rows.law.warm_start
    stay = ~trusted if warm else jnp.zeros_like(s.done)
    nu_new = jnp.where(s.done | stay, s.nu, nu_new)
    small = small & ~stay  # staying is not stagnation
    h, dh, aux, inner, S, slope_sum = rows.evaluate_sums(nu_new, s.aux)
    inner_ok = inner <= inner_tol
    # stop at |h| ~ eps; or when nu no longer moves (float32, ill-conditioned Tsallis q > 2)
    # provided h is already small or the bracket has collapsed to round-off
    collapsed = (hi - lo) <= 8 * eps * _scale(rows, nu_new)
    settled = small & ((jnp.abs(h) <= max_h) | collapsed)
    done = s.done | (((jnp.abs(h) <= tol) | settled | collapsed) & inner_ok)
    # predictive stop: after two Newton steps on converged components, Newton's error model
    # h_next ~ M h^2, M ~ |h| / h_prev^2 (floored at 1), says whether one more step lands
    # within tol; if so take it without evaluating it (the caller's final pass does)
    newton_next = nu_new - h / jnp.where(dh < 0, dh, -1.0)
    in_bracket = jnp.where(h >= 0, (newton_next >= nu_new) & (newton_next <= hi),
                           (newton_next <= nu_new) & (newton_next >= lo))
    predicted = (ok_newton & inner_ok & trusted & (dh < 0) & in_bracket
                 & (2 * h**2 * jnp.maximum(jnp.abs(h), s.h**2) <= tol * s.h**2) & ~done)
    done = done | predicted
    aux = jnp.where(s.done, s.aux, aux) if warm else s.aux
    return _RootState(s.it + 1, jnp.where(predicted, newton_next, nu_new), h, dh, lo, h_lo,
                      hi, h_hi, side, aux, inner, done, nu_new, S, slope_sum)


def _solve_separable(entropy, z, keep, T, nu0=None, max_iter=None, nan_if_unconverged=False,
                     law=None):
    r"""Solve $\hat G(\rho_i) = (z_i - \nu)/T$, $\sum\rho = 1$ for every row.

    Bracketed Newton on a Box-Cox transform of $S(\nu)$ (power `entropy.normalization_power`),
    with an Illinois (modified regula falsi) step whenever Newton leaves the bracket; Illinois
    only where `entropy.normalization_newton()` is False.

    **Arguments:**
    - `entropy`: a separable family; `z`, `keep`, `T`: rows of scores, the keys taking part
      (masked scores finite), temperatures broadcasting against the rows.
    - `nu0`: a start for the multiplier (default: the second-order Jensen start).
    - `max_iter`: iteration cap (default 200).
    - `nan_if_unconverged`: the weights of a row not converged within `max_iter` are NaN.
    - `law`: the component law (default `entropy.component_law()`).

    **Returns:** (rho, nu, slope) with `slope` $= d\rho/dy$ on the support.
    """
    law = entropy.component_law() if law is None else law
    if isinstance(law, ComponentLawSwitch):
        def branch(which):
            return lambda: _solve_separable(entropy, z, keep, T, nu0, max_iter,
                                            nan_if_unconverged, which)

        return jax.lax.cond(law.pred, branch(law.if_true), branch(law.if_false))
    dtype = z.dtype
    tols = _tolerances(dtype)
    tol, inner_tol, eps = tols
    max_iter = 200 if max_iter is None else max_iter
    T = jnp.asarray(T, dtype)
    row_shape = jnp.broadcast_shapes(z.shape[:-1] + (1,), keep.shape[:-1] + (1,),
                                     T.shape if T.ndim else ())
    z = jnp.broadcast_to(z, row_shape[:-1] + z.shape[-1:])
    keep = jnp.broadcast_to(keep, z.shape)
    n = jnp.sum(keep, -1, keepdims=True).astype(dtype)
    # work relative to the row maximum, so nu is resolved at the scale of T, not of |z|
    zmax = row_max(z, keep)
    z = jnp.where(keep, z - zmax, 0.0)
    if law.from_cutoff:
        # nu measured from the top key's cutoff, in units of the top key's distance from it
        # at weight 1/n (nu = -1): a row of many near-tied keys has its root within that
        # distance of the cutoff, which a nu measured from weight 1 resolves only to the
        # rounding of G(1) - G(0+) (and rounds onto the cutoff itself, all weights 0, once
        # the distance is below it), and which in score units can be too small for
        # differences to stay normal numbers
        unit = T * law.target(1.0 / n)
        hi = -jnp.ones_like(unit)
        lo = jnp.minimum(-T * law.target(jnp.ones((), dtype)) / unit, hi)
    else:
        unit = None
        lo = jnp.zeros_like(zmax)
        hi = jnp.maximum(-T * entropy.G_shifted(1.0 / n), lo)
    rows = _Rows(law, z, keep, T, 1.0 / T, entropy.normalization_power(), unit)
    # the multiplier of the gauge at weight 1 (what `nu0` and the result hold) at nu = 0
    nu1 = 0.0 if unit is None else T * law.target(jnp.ones((), dtype))
    use_newton = entropy.normalization_newton()
    newton_always = use_newton is True
    if nu0 is None:
        nu = _start(entropy, rows, n, lo, hi, use_newton, newton_always)
    else:
        nu = nu0 - zmax - nu1
        nu = jnp.clip(jnp.broadcast_to(nu if unit is None else nu / unit, lo.shape), lo, hi)
    aux0 = law.init((z - rows.multiplier(nu)) * rows.inv_T, keep)
    h, dh, aux, inner, S, slope_sum = rows.evaluate_sums(nu, aux0, cold=True)
    if newton_always:
        h_hi = jnp.full_like(nu, jnp.nan)  # unknown until the iteration lands right of the root
    else:
        h_hi = jnp.where(use_newton, jnp.nan, jnp.minimum(rows.evaluate(hi, aux0)[0], 0.0))
    done = ((jnp.abs(h) <= tol) | (hi <= lo)) & (inner <= inner_tol)
    state = _RootState(jnp.array(0), nu, h, dh, lo, jnp.full_like(nu, jnp.nan), hi, h_hi,
                       jnp.zeros(nu.shape, jnp.int8), aux, inner, done, nu, S, slope_sum)
    out = jax.lax.while_loop(
        lambda s: (s.it < max_iter) & ~jnp.all(s.done),
        lambda s: _root_step(rows, s, use_newton, jnp.sqrt(eps), tols),
        state,
    )
    rho, slope, nu = _final_weights(rows, out, use_newton, keep, tol, eps,
                                    nan_if_unconverged)
    return rho, rows.multiplier(nu) + nu1 + zmax, slope


def _final_weights(rows, out, use_newton, keep, tol, eps, nan_if_unconverged):
    """(rho, slope, nu) of the finished iteration `out`: Newton's iterate or the bracket's
    interpolated weights (per row where `use_newton` is decided at run time)."""
    newton = concrete_float(use_newton)
    newton = use_newton if newton is None else bool(newton)
    if newton is not False:
        rho_n, slope_n, nu_n = _newton_weights(rows, out, eps)
    if newton is True:
        rho, slope, nu = rho_n, slope_n, nu_n
    elif newton is False:
        rho, slope, nu = _bracket_weights(rows, out)
    else:  # decided per row at run time
        rho, slope, nu = _bracket_weights(rows, out)
        rho, slope = jnp.where(newton, rho_n, rho), jnp.where(newton, slope_n, slope)
        nu = jnp.where(newton, nu_n, nu)
    S = jnp.sum(rho, -1, keepdims=True)
    normalized = jnp.logical_not(newton)
    if newton is not False:
        # the iteration may stop on an h whose components were converged to `inner_tol`
        # only, above `tol`: where the sum is off by more than `tol`, one more Newton step on
        # it, linear in the weights (the convergence test below still judges S itself)
        off = (jnp.abs(1 - S) > tol) & (jnp.abs(1 - S) <= jnp.sqrt(eps))
        if newton is not True:
            off = off & newton

        def newton_step(rho, nu):
            dS = jnp.sum(slope, -1, keepdims=True)
            step = jnp.where(off & (dS > 0), (1 - S) / jnp.where(dS > 0, dS, 1.0), 0.0)
            nu = nu - step * rows.T / (1.0 if rows.unit is None else rows.unit)
            return jnp.maximum(rho + step * slope, 0.0), nu  # (step in y = (z - nu)/T)

        rho, nu = jax.lax.cond(_any_in_batch(off), newton_step, lambda rho, nu: (rho, nu),
                               rho, nu)
    if newton is not True:
        # the interpolated weights sum to 1 up to their rounding, removed here
        rho = jnp.where(normalized & (S > 0), rho / jnp.where(S > 0, S, 1.0), rho)
    if nan_if_unconverged:
        # a row still unconverged after max_iter is reported, not returned as if solved;
        # one whose sum is at round-off passes (a component-residual floor above inner_tol
        # on deep tails can keep `done` unset although the weights are right). A row whose
        # weights do not sum to 1 (all zero: a root below the dtype's smallest number) is
        # reported too, whatever stopped its iteration.
        converged = out.done | (jnp.abs(out.h) <= 64 * tol)
        sums = (S > 0) & jnp.isfinite(S) & (normalized | (jnp.abs(S - 1) <= jnp.sqrt(eps)))
        rho = jnp.where((converged & sums) | ~keep, rho, jnp.nan)
    return rho, slope, nu


def _newton_weights(rows, out, eps):
    """(rho, slope, nu) of a Newton iteration's result.

    In double precision, the weights at the final nu. In single precision the iteration
    stops with the sum up to `tol` (16 eps) from 1 and the weights are as far off as their
    sum; their own rounding (a few ulps of the top weight) is of the size of the rest. So
    the weights are evaluated at the nu of the loop's last evaluation, whose sums it holds
    (the same arithmetic gives the same weights), and take one Newton step on that sum
    linear in the weights, $\\rho + \\delta\\,d\\rho/dy$ with $\\delta = (1 - S)/\\sum
    d\\rho/dy$, in the same pass: this removes the stopping error and the rounding of the
    sum alike, at no extra pass over the scores. (A predicted final step, which the loop did
    not evaluate, is taken the same way.)"""
    if eps < 1e-10:
        rho, slope, _, _ = rows.components(out.nu, out.aux)
        return rho, slope, out.nu
    gap = 1 - out.S
    # the linear step's error grows as gap^2 / b^(2-p) for a key at distance b above a
    # cutoff: a larger gap (a predicted step's) is left to the predicted nu
    ok = (out.slope_sum > 0) & (jnp.abs(gap) <= 256 * eps)
    # a row that takes no step is evaluated at the loop's own nu, predicted or not
    nu = jnp.where(ok, out.nu_eval, out.nu)
    rho, slope, _, _ = rows.components(nu, out.aux)
    step = jnp.where(ok, gap / jnp.where(ok, out.slope_sum, 1.0), 0.0)
    rho = jnp.maximum(rho + step * slope, 0.0)
    return rho, slope, nu - step * rows.T / (1.0 if rows.unit is None else rows.unit)


@jax.custom_batching.custom_vmap
def _any_in_batch(x):
    return jnp.any(x)


@_any_in_batch.def_vmap
def _any_in_batch_vmap(axis_size, in_batched, x):
    # one answer for the whole vmapped batch (unbatched): the `lax.cond` it drives stays a
    # branch under vmap instead of a select that runs both sides
    return jnp.any(x), False


def _bracket_weights(rows, out):
    """The weights of an Illinois-only root (Tsallis q > 2), interpolated between the ends
    of its final bracket (the last evaluated nu included), where the sum is >= 1 and <= 1.

    Keys enter the support with infinite slope (x ~ u^p, p < 1), so one ulp of nu can move
    the sum by far more than eps (a group of keys just above the threshold) and no nu sums
    to 1. Every interpolated weight lies between its values at the two ends, as the exact
    one does; rescaling the weights of one end instead would move the top weight by the
    whole excess of the sum. Returns (rho, slope, nu)."""
    right = out.h < 0
    a = jnp.where(right, out.lo, out.nu)
    b = jnp.where(right, out.nu, out.hi)
    rho_a, slope_a, _, _ = rows.components(a, out.aux)
    rho_b, slope_b, _, _ = rows.components(b, out.aux)
    S_a = jnp.sum(rho_a, -1, keepdims=True)
    S_b = jnp.sum(rho_b, -1, keepdims=True)
    gap = S_a - S_b
    theta = jnp.clip((S_a - 1) / jnp.where(gap > 0, gap, 1.0), 0.0, 1.0)
    theta = jnp.where(gap > 0, theta, 0.0)
    mix = lambda xa, xb: xa + theta * (xb - xa)  # noqa: E731
    return mix(rho_a, rho_b), mix(slope_a, slope_b), mix(a, b)


def in_row_blocks(fn, z, keep, T, block_bytes):
    """`fn(z, keep, T)` (rowwise) over row blocks of about `block_bytes` each, one at a
    time (a loop over blocks); the last block is padded with uniform rows (one compiled
    body: `lax.map`'s `batch_size` would compile the remainder a second time)."""
    shape, n = z.shape, z.shape[-1]
    rows = math.prod(shape[:-1])
    block = max(1, block_bytes // (n * z.dtype.itemsize))
    if rows <= block:
        return fn(z, keep, T)
    count = -(-rows // block)
    pad = ((0, count * block - rows), (0, 0))

    def blocks(x, width, fill):
        x = jnp.broadcast_to(x, shape[:-1] + (width,)).reshape(rows, width)
        return jnp.pad(x, pad, constant_values=fill).reshape(count, block, width)

    # T is a scalar or shaped (..., 1) against the scores (`checked_T`)
    zb, kb, Tb = blocks(z, n, 0.0), blocks(keep, n, True), blocks(T, 1, 1.0)

    def body(j, out):
        # each block's weights overwrite its scores in place: the blocked scores are the
        # output buffer (`lax.map` would first fill a fresh one with zeros)
        take = lambda x: jax.lax.dynamic_index_in_dim(x, j, keepdims=False)  # noqa: E731
        return jax.lax.dynamic_update_index_in_dim(out, fn(take(out), take(kb), take(Tb)), j, 0)

    out = jax.lax.fori_loop(0, count, body, zb)
    return out.reshape(count * block, n)[:rows].reshape(shape)


def solve_separable_rows(entropy, z, keep, T):
    """The weights of every row (NaN for a row that did not converge), in row blocks when
    the family asks for them."""
    def solve(z, keep, T):
        return _solve_separable(entropy, z, keep, T, nan_if_unconverged=True)[0]

    block = entropy.row_block_bytes
    return solve(z, keep, T) if block is None else in_row_blocks(solve, z, keep, T, block)
