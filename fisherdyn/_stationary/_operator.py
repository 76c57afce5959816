"""Fixed-temperature stationary attention operators (MATH.md sections 2-3).

`stationary(entropy, scores, T)` solves the stationary law $T G(\\rho_i) = z_i + \\lambda$ on
the support with $\\sum\\rho = 1$:

- Shannon: closed form (softmax).
- Separable families (Tsallis, Kaniadakis, Burg, Abe): the componentwise inverse law
  $\\rho_i = G^{-1}((z_i - \\nu)/T)$ plus one scalar normalization root $\\nu$, found by a
  bracketed (safeguarded) Newton iteration on $\\log\\sum\\rho(\\nu)$. The bracket
  $[\\max z, \\max z - T\\hat G(1/N)]$ is exact: at its ends the top weight is 1 and 1/N.
- Renyi / Sharma-Mittal: the Tsallis map at a self-consistent temperature
  $T_{eff} = T\\phi(M_q)$. Parametrized by its threshold, the consistency is one scalar
  equation per row (each evaluation one pass over the scores, no inner solve): Newton where
  the root is certified unique, else a fine scan for the branch of least free energy (see
  `_solve_tsallis_shaped`). `stationary_branches` keeps the full scan in $\\log M$.

The derivative is an exact `custom_jvp` from the saved output (implicit function theorem),
including tangents with respect to the scores, T and the entropy's parameters.

The root iteration here is purpose-built and batch-native; the independent cross-check
(`solve_stationary`) uses optimistix and scipy instead and shares none of this code.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from .._entropies import (
    AbstractEntropy,
    Burg,
    AbstractSeparableEntropy,
    Kaniadakis,
    AbstractTsallisShapedEntropy,
    Abe,
    Renyi,
    SharmaMittal,
    Shannon,
    Tsallis,
    _concrete,
)

__all__ = [
    "stationary",
    "stationary_info",
    "stationary_jacobian",
    "stationary_branches",
    "free_energy",
    "StationaryInfo",
    "Branches",
]


# --------------------------------------------------------------------------- input checks


def _check_entropy(entropy):
    if not isinstance(entropy, AbstractEntropy):
        raise TypeError(f"expected a fisherdyn entropy (e.g. Shannon()), got {entropy!r}")


def _keys_last(scores, axis):
    """The scores as a float array with the key axis last (at least one key)."""
    z = jnp.asarray(scores)
    if not jnp.issubdtype(z.dtype, jnp.floating):
        z = z.astype(jnp.result_type(float))
    if z.ndim == 0:
        raise ValueError("scores must have at least one axis (the keys)")
    z = jnp.moveaxis(z, axis, -1)
    if z.shape[-1] == 0:
        raise ValueError(f"scores of shape {jnp.shape(scores)} have no keys on axis {axis}")
    return z


def _checked_T(T, bad_scores, dtype):
    """T as an array shaped to broadcast against the scores, carrying the input checks.
    Both checks ride on the small T (every solve reads it): routing the full score array
    through error_if would cost an extra pass over it."""
    T = jnp.asarray(T, dtype=dtype)
    T = eqx.error_if(T, bad_scores, "scores contain NaN or +inf")
    T = eqx.error_if(T, jnp.any(~(T > 0)) | jnp.any(~jnp.isfinite(T)), "T must be finite and > 0")
    return T[..., None] if T.ndim > 0 else T


def _prepare(scores, T, mask, axis):
    """Move `axis` last, validate, and build the effective mask (False = excluded)."""
    z = _keys_last(scores, axis)
    if mask is None:
        # One reduction (the row max, NaN-propagating) serves the input check and the
        # empty-row test: two passes over the scores fewer than the masked path.
        zmax = jnp.max(z, axis=-1, keepdims=True)
        bad_scores = jnp.any(jnp.isnan(zmax) | (zmax == jnp.inf))
        empty = zmax == -jnp.inf
        keep = z > -jnp.inf  # -inf behaves like a masked entry
    else:
        keep = jnp.asarray(mask)
        if keep.dtype != bool:
            raise TypeError(f"mask must be boolean (True = keep), got dtype {keep.dtype}")
        try:
            keep = jnp.broadcast_to(keep, jnp.moveaxis(z, -1, axis).shape)
        except ValueError:
            raise ValueError(
                f"mask of shape {keep.shape} does not broadcast to scores of shape "
                f"{jnp.shape(scores)}"
            ) from None
        keep = jnp.moveaxis(keep, axis, -1)
        keep = keep & (z > -jnp.inf)  # -inf behaves like a masked entry
        bad_scores = jnp.any(jnp.isnan(z) | (z == jnp.inf))
        empty = ~jnp.any(keep, axis=-1, keepdims=True)
    T = _checked_T(T, bad_scores, z.dtype)
    # Empty rows are solved as if unmasked (finite, harmless) and zeroed afterwards.
    keep = keep | empty
    # kept entries are finite here (NaN / +inf raise above; -inf is never kept)
    return jnp.where(keep, z, 0.0), keep, T, empty


# --------------------------------------------------------------------------- helpers


def _row_max(z, keep):
    return jnp.max(jnp.where(keep, z, -jnp.inf), axis=-1, keepdims=True)


def _project(c, v):
    """$P v = c\\odot v - c\\,(c\\cdot v)/\\sum c$: the tangent response of a separable law."""
    sc = jnp.sum(c, -1, keepdims=True)
    return c * v - c * jnp.sum(c * v, -1, keepdims=True) / jnp.where(sc > 0, sc, 1.0)


def _shifted_G(entropy, rho, active):
    safe = jnp.where(active, rho, 1.0)
    return jnp.where(active, entropy.G_shifted(safe), 0.0)


def _slope(entropy, rho, active):
    """$dx/dy = 1/G'(x)$ on the support (0 off it), overflow-free."""
    safe = jnp.where(active, rho, 1.0)
    if isinstance(entropy, Abe):
        log = jnp.log(safe)
        A, dA = entropy.asinh_G_of_log(log)
        absA = jnp.abs(A)
        logcosh = absA + jnp.log1p(jnp.exp(-2 * absA)) - jnp.log(2.0)
        s = jnp.exp(log - jnp.log(dA) - logcosh)
    elif isinstance(entropy, Tsallis):
        s = jnp.exp((2 - entropy.q) * jnp.log(safe)) / entropy.q
    else:
        s = 1.0 / entropy.G_prime(safe)
    return jnp.where(active, s, 0.0)


def _param_jvp(fn, entropy, t_entropy):
    """Directional derivative of `fn(entropy)` along the entropy tangent (None = zero)."""
    if t_entropy is None:
        return None
    leaves, treedef = jtu.tree_flatten(entropy)
    t_leaves = treedef.flatten_up_to(t_entropy)
    idx = [i for i, t in enumerate(t_leaves) if t is not None]
    if not idx:
        return None

    def f(*vals):
        new = list(leaves)
        for i, v in zip(idx, vals):
            new[i] = v
        return fn(jtu.tree_unflatten(treedef, new))

    return jax.jvp(f, [leaves[i] for i in idx], [t_leaves[i] for i in idx])[1]


def _add(a, b):
    return a if b is None else a + b


# --------------------------------------------------------------------------- separable solver


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
    aux: jax.Array
    inner: jax.Array
    done: jax.Array


def _abe_component(entropy, y, log, steps=3):
    """Abe inversion $G(e^l) = 1 + y$ per component: `steps` Newton steps in l on the asinh
    form (nearly linear in both the Shannon core and the algebraic tails), warm-started from
    `log`. Returns (x, slope, log, relative residual)."""
    target = jnp.arcsinh(1.0 + y)

    def step(_, log):
        A, dA = entropy.asinh_G_of_log(log)
        return jnp.minimum(log - jnp.clip((A - target) / dA, -100.0, 100.0), 1.0)

    log = jax.lax.fori_loop(0, steps, step, log, unroll=True)
    A, dA = entropy.asinh_G_of_log(log)
    x = jnp.exp(log)
    slope = x / (dA * jnp.sqrt(1 + (1.0 + y) ** 2))
    return x, slope, log, jnp.abs(A - target) / (1 + jnp.abs(target))


# Abe with |ln q| >= _ABE_V_MIN_EPS is solved in v = x^(1/Q - 1) (Q = max(q, 1/q)); closer to
# q = 1 the asinh form above keeps the Shannon limit free of cancellation.
_ABE_V_MIN_EPS = 0.2
# Newton steps of the v iteration from its cold-start guess, by float width in bytes
_ABE_COLD_STEPS = {2: 3, 4: 3, 8: 4}


def _neg_pow(v, a, log_v):
    """$v^{-a}$; a few multiplies and a sqrt when 2a is a small known integer."""
    if _small_half_integer(a):
        k2 = int(round(2 * _concrete_float(a)))
        p = jax.lax.integer_pow(v, k2 // 2) if k2 >= 2 else jnp.ones_like(v)
        if k2 % 2:
            p = p * jnp.sqrt(v)
        return 1.0 / p
    return jnp.exp(-a * log_v)


def _small_half_integer(a):
    a_c = _concrete_float(a)
    return a_c is not None and abs(2 * a_c - round(2 * a_c)) < 1e-12 and 1 <= round(2 * a_c) <= 8


def _concrete_float(x):
    try:
        return float(x)
    except Exception:  # a tracer
        return None


def _abe_v_constants(entropy):
    q_c = _concrete_float(entropy.q)
    if q_c is not None:
        Q = max(q_c, 1.0 / q_c)
        return Q, Q / (Q - 1)
    Q = jnp.exp(entropy.eps)
    return Q, Q / (Q - 1)


def _abe_v_guess(entropy, y):
    """Cold start for `_abe_component_v`: the Shannon core $v = e^{b(1-w)}$, capped by the
    upper bound of the root (exact in the algebraic tail)."""
    Q, p = _abe_v_constants(entropy)
    w = 1.0 + jnp.maximum(y, -jnp.sqrt(jnp.finfo(y.dtype).max))
    v_lb = jnp.maximum(1.0, (Q * Q - 1) * (-w))
    v_ub = (Q * Q - 1) * (-w) + Q * Q * _neg_pow(v_lb, Q, jnp.log(v_lb))
    return jnp.minimum(jnp.exp(jnp.minimum((1 - w) / p, 50.0)), v_ub)


def _abe_component_v(entropy, y, v, steps=2):
    r"""Abe inversion $G(x) = 1 + y$ (for |ln q| not small) in $v = x^{-b}$, $b = 1 - 1/Q$:
    $f(v) = v/Q - Q v^{-Q} + (Q - 1/Q)(1 + y) = 0$, f increasing and concave, so a Newton
    step from any point lands at or left of the root and the iteration is monotone from
    there; $v \ge \max(1, (Q^2 - 1)(-w))$ is a lower bound (x <= 1 as y <= 0). Warm-started
    from `v`. Returns (x, slope, v, error estimate relative to v)."""
    Q, p = _abe_v_constants(entropy)
    # below -sqrt(max) the weight underflows (x < |w|^-1) and the clamp keeps v finite
    w = 1.0 + jnp.maximum(y, -jnp.sqrt(jnp.finfo(y.dtype).max))
    v_lb = jnp.maximum(1.0, (Q * Q - 1) * (-w))
    v = jnp.maximum(v, v_lb)
    c = (Q - 1.0 / Q) * w
    for _ in range(steps):
        vq = _neg_pow(v, Q, jnp.log(v))
        fp = 1.0 / Q + Q * Q * vq / v
        step = (v / Q - Q * vq + c) / fp
        v = jnp.maximum(v - step, v_lb)  # (jnp.fmax here defeats XLA:CPU vectorization)
    # Everything returned is a function of the final v alone (the slope and the error
    # estimate re-evaluate f and f' there instead of reusing the last step's): XLA:CPU then
    # writes out v once instead of each intermediate of the last step (benchmark batch
    # 28 -> 25 kernels per block, 6-17 % faster in A/B runs).
    x = _neg_pow(v, p, jnp.log(v))
    vq = _neg_pow(v, Q, jnp.log(v))
    fp = 1.0 / Q + Q * Q * vq / v
    slope = p * (x / v) * (Q - 1.0 / Q) / fp
    # the next Newton step, relative to v: the distance to the root to first order
    err = jnp.abs(v / Q - Q * vq + c) / (fp * v)
    return x, slope, v, err


def _normalization_power(entropy):
    r"""Box-Cox power lam: the solver zeroes $h = (S^{lam} - 1)/lam$ ($\log S$ at lam = 0),
    $S(\nu) = \sum_i\rho_i(\nu)$. The power makes h exactly linear in nu when one key is
    active (Shannon: log; Tsallis: q - 1; Burg: -1), so Newton needs few steps; for
    Tsallis 1 < q <= 2, $S^{q-1} = \|(1 + a(z-\nu))_+\|_p$ is convex in nu and Newton from
    the left bracket end is monotone."""
    if isinstance(entropy, Tsallis):
        return jnp.minimum(entropy.q - 1, 1.0)
    if isinstance(entropy, Burg):
        return -1.0
    if isinstance(entropy, Kaniadakis):
        # between Shannon's log (exact for the exponential core) and -kappa (exact for the
        # algebraic tail x ~ |w|^(-1/kappa)): fewest Newton steps over typical score spreads
        return -0.5 * entropy._k
    return 0.0


def _boxcox(S, dS, lam):
    lam = jnp.asarray(lam, S.dtype)
    lam_safe = jnp.where(lam == 0, 1.0, lam)
    logS = jnp.log(S)
    h = jnp.where(lam == 0, logS, jnp.expm1(lam * logS) / lam_safe)
    dh = jnp.exp((lam - 1) * logS) * dS
    return h, dh


def _solve_separable(entropy, z, keep, T, nu0=None, max_iter=None, _abe_form=None,
                     nan_if_unconverged=False):
    r"""Solve $\hat G(\rho_i) = (z_i - \nu)/T$, $\sum\rho = 1$ for every row.

    Bracketed Newton on a Box-Cox transform of $S(\nu) = \sum\rho(\nu)$, with an Illinois
    (modified regula falsi) step whenever Newton leaves the bracket; Tsallis q > 2 uses
    Illinois only (its keys enter the support with infinite slope, which stalls Newton).
    The loop carries one scalar per row, so each iteration is one fused pass over the
    scores. Returns (rho, nu, slope) with `slope = d rho/d y` on the support; with
    `nan_if_unconverged`, the weights of a row not converged within `max_iter` are NaN.
    """
    is_abe = isinstance(entropy, Abe)
    if is_abe and _abe_form is None:
        # Abe: the v form away from q = 1 (cheap, warm-started), the asinh form near it.
        if jnp.ndim(entropy.eps) > 0:
            _abe_form = "asinh"
        else:
            q_c = _concrete_float(entropy.q)
            eps_c = None if q_c is None else abs(math.log(q_c))
            if eps_c is None:
                def branch(form):
                    return lambda e, z_, k_, T_: _solve_separable(
                        e, z_, k_, T_, nu0, max_iter, form, nan_if_unconverged)

                return jax.lax.cond(entropy.eps >= _ABE_V_MIN_EPS, branch("v"), branch("asinh"),
                                    entropy, z, keep, T)
            _abe_form = "v" if eps_c >= _ABE_V_MIN_EPS else "asinh"
    abe_v = is_abe and _abe_form == "v"
    dtype = z.dtype
    eps = jnp.finfo(dtype).eps
    # |S - 1| target: 4 eps in float64; float32 stops at 16 eps (~2e-6), well inside its
    # rounding of the scores themselves
    tol = 4 * eps if eps < 1e-10 else 16 * eps
    inner_tol = 256 * eps
    if max_iter is None:
        max_iter = 200
    T = jnp.asarray(T, dtype)
    row_shape = jnp.broadcast_shapes(z.shape[:-1] + (1,), keep.shape[:-1] + (1,), T.shape if T.ndim else ())
    z = jnp.broadcast_to(z, row_shape[:-1] + z.shape[-1:])
    keep = jnp.broadcast_to(keep, z.shape)
    n = jnp.sum(keep, -1, keepdims=True).astype(dtype)
    # Work relative to the row maximum, so nu is resolved at the scale of T, not of |z|.
    zmax = _row_max(z, keep)
    z = jnp.where(keep, z - zmax, 0.0)
    if nu0 is not None:
        nu0 = nu0 - zmax
    lo = jnp.zeros_like(zmax)
    hi = jnp.maximum(-T * entropy.G_shifted(1.0 / n), lo)
    lam = _normalization_power(entropy)
    newton_only_bad = isinstance(entropy, Tsallis)
    use_newton = jnp.logical_not(jnp.asarray(entropy.q) > 2) if newton_only_bad else True

    # y = (z - nu)/T as a product: XLA:CPU writes a divided array out as a pass of its own
    # (an expensive op feeding several consumers), a multiplied one fuses into them
    inv_T = 1.0 / T

    def components(nu, aux, steps=2):
        y = jnp.where(keep, (z - nu) * inv_T, 0.0)
        if abe_v:
            # warm-started from the previous iterate: an inexact S(nu) is flagged by `inner`
            # (brackets and the stopping test only trust converged components)
            rho, slope, aux, inner = _abe_component_v(entropy, y, aux, steps)
            inner = jnp.max(jnp.where(keep, inner, 0.0), -1, keepdims=True)
        elif is_abe:
            # a fresh start from the asymptotic guess each time (no warm start), so that
            # every evaluation of S(nu) is the same function of nu and brackets stay valid
            rho, slope, aux, inner = _abe_component(entropy, y, entropy.log_guess(y), steps=6)
            inner = jnp.max(jnp.where(keep, inner, 0.0), -1, keepdims=True)
        else:
            rho, slope = entropy.inverse_shifted(y)
            inner = jnp.zeros_like(nu)
        return jnp.where(keep, rho, 0.0), jnp.where(keep, slope, 0.0), aux, inner

    def evaluate(nu, aux, steps=2):
        rho, slope, aux, inner = components(nu, aux, steps)
        S = jnp.sum(rho, -1, keepdims=True)
        h, dh = _boxcox(S, -jnp.sum(slope, -1, keepdims=True) / T, lam)
        return h, dh, aux, inner

    if nu0 is None:
        # Jensen: for a convex law x(y) (all but Tsallis q > 2), S(nu) >= n x(mean y), so
        # nu = mean z + hi (where n x = 1) is still left of the root; far closer than the
        # max for dense families (S there ~ 1.1 instead of ~ n^(1/2) for N = 512 gaussians).
        # Dense families then add the second-order (variance) correction, which may land
        # right of the root (the bracketed iteration handles either side).
        zbar = jnp.sum(z, -1, keepdims=True) / n  # masked entries are 0 here
        law = _component_law(entropy, dtype, _abe_form if is_abe else None)
        shift = _spread_shift(entropy, z, keep, zbar, n, hi, T, law)
        jensen = jnp.clip(zbar + hi + shift, lo, hi)
        if newton_only_bad:
            jensen = jnp.where(use_newton, jensen, lo)
        nu = jensen
    else:
        nu = jnp.clip(jnp.broadcast_to(nu0, lo.shape), lo, hi)
    if abe_v:
        aux0 = jnp.where(keep, _abe_v_guess(entropy, (z - nu) * inv_T), 1.0)
    elif is_abe:
        aux0 = jnp.where(keep, entropy.log_guess((z - nu) * inv_T), 0.0)
    else:
        aux0 = jnp.zeros((), dtype)
    # Abe: a cold start. From the guess the v iteration reaches float32 round-off in 3
    # steps and float64's in 4 (relative error 8e-2, 2e-3, 7e-7, 1e-13, 2e-15 at the root)
    h, dh, aux, inner = evaluate(nu, aux0, steps=_ABE_COLD_STEPS[jnp.dtype(dtype).itemsize])
    if newton_only_bad:
        h_hi = jnp.where(use_newton, jnp.nan, jnp.minimum(evaluate(hi, aux0)[0], 0.0))
    else:
        h_hi = jnp.full_like(nu, jnp.nan)  # unknown until the iteration lands right of the root
    done = ((jnp.abs(h) <= tol) | (hi <= lo)) & (inner <= inner_tol)
    state = _RootState(
        jnp.array(0), nu, h, dh, lo, jnp.full_like(nu, jnp.nan), hi, h_hi,
        jnp.zeros(nu.shape, jnp.int8), aux, inner, done,
    )

    def cond(s):
        return (s.it < max_iter) & ~jnp.all(s.done)

    def body(s):
        # Bracket updates only trust h when the components are converged (Abe).
        # (the sign of h: components converged, or their error well below |h|)
        trusted = (s.inner <= inner_tol) | ((s.inner <= 1e3 * inner_tol) & (8 * s.inner <= jnp.abs(s.h)))
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
        small = jnp.abs(nu_new - s.nu) <= 2 * eps * (jnp.abs(s.nu) + T)
        # Untrusted (Abe's v form: components not converged after their warm-started
        # steps): stay and refine them at the same nu. Stepping on an inexact h without a
        # bracket update can cycle: Abe(3), float64, Cauchy scores at T = 10 bounced between
        # two values of nu for all 200 iterations and returned weights summing to 1.13-1.46.
        # (The asinh form restarts cold at every nu: staying would repeat the evaluation.)
        stay = ~trusted if abe_v else jnp.zeros_like(s.done)
        nu_new = jnp.where(s.done | stay, s.nu, nu_new)
        small = small & ~stay  # staying is not stagnation
        h, dh, aux, inner = evaluate(nu_new, s.aux)
        inner_ok = inner <= inner_tol
        # Stop at |h| ~ eps; or when nu no longer moves (float32, ill-conditioned Tsallis
        # q > 2) provided h is already small or the bracket has collapsed to round-off.
        collapsed = (hi - lo) <= 8 * eps * (jnp.abs(nu_new) + T)
        settled = small & ((jnp.abs(h) <= jnp.sqrt(eps)) | collapsed)
        done = s.done | (((jnp.abs(h) <= tol) | settled | collapsed) & inner_ok)
        # Predictive stop: after two Newton steps on converged components, Newton's error
        # model h_next ~ M h^2, M ~ |h| / h_prev^2 (floored at 1: a previous step far from
        # the root underestimates it), says whether one more step lands within tol; if so
        # take that step without evaluating it (the caller's final pass evaluates rho there).
        newton_next = nu_new - h / jnp.where(dh < 0, dh, -1.0)
        in_bracket = jnp.where(h >= 0, (newton_next >= nu_new) & (newton_next <= hi),
                               (newton_next <= nu_new) & (newton_next >= lo))
        predicted = (ok_newton & inner_ok & trusted & (dh < 0) & in_bracket
                     & (2 * h**2 * jnp.maximum(jnp.abs(h), s.h**2) <= tol * s.h**2) & ~done)
        nu_new = jnp.where(predicted, newton_next, nu_new)
        done = done | predicted
        return _RootState(
            s.it + 1, nu_new, h, dh, lo, h_lo, hi, h_hi, side,
            jnp.where(s.done, s.aux, aux) if is_abe else s.aux, inner, done,
        )

    out = jax.lax.while_loop(cond, body, state)
    rho, slope, _, _ = components(out.nu, out.aux)
    if nan_if_unconverged:
        # a row still unconverged after max_iter is reported, not returned as if solved;
        # one whose sum is at round-off passes (Abe's asinh form has a component-residual
        # floor above inner_tol on deep tails: at q = e^0.035, scores down to -15, it never
        # sets `done` although it equals scipy's root)
        rho = jnp.where(out.done | (jnp.abs(out.h) <= 64 * tol) | ~keep, rho, jnp.nan)
    return rho, out.nu + zmax, slope


def _component_law(entropy, dtype, abe_form=None):
    """`y -> (x, dx/dy)` as the separable solver evaluates it from a cold start (Abe: its
    v or asinh iteration, not the 40-step `inverse_shifted`)."""
    if abe_form == "v":
        steps = _ABE_COLD_STEPS[jnp.dtype(dtype).itemsize]
        return lambda y: _abe_component_v(entropy, y, _abe_v_guess(entropy, y), steps)[:2]
    if abe_form == "asinh":
        return lambda y: _abe_component(entropy, y, entropy.log_guess(y), steps=6)[:2]
    return entropy.inverse_shifted


def _spread_shift(entropy, z, keep, zbar, n, hi, T, law=None):
    r"""Second-order correction to Jensen's start: $S(\nu) \approx n\,x(\bar y) +
    \tfrac{n}{2} x''(\bar y) V$, V the row variance of $y = (z - \nu)/T$, so one Newton step
    from Jensen's $\bar y$ (where $n\,x(\bar y) = 1$) moves nu right by
    $\tfrac{T}{2} V x''/x'$ (Shannon: $T V/2$, the lognormal correction). Rows only, apart
    from the variance. Measured on (4096, 512) gaussian float32 scores: the start's |h|
    drops from ~0.12 to ~0.003 (Kaniadakis 0.3), which saves one pass over the scores for
    Kaniadakis, Abe and Burg. Not for Tsallis q > 1: near the cutoff the expansion is poor
    (its start got worse). The shifted start may land right of the root, which the bracketed
    iteration takes in its stride."""
    dev = jnp.where(keep, z - zbar, 0.0)
    V = jnp.sum(dev * dev, -1, keepdims=True) / (n * T * T)
    ybar = -hi / T
    # `law`: the solver's own component law (`_component_law`). Abe's `inverse_shifted` is a
    # 40-step Newton loop: on row scalars, in row blocks, that was 1600 tiny kernels, a
    # fifth of Abe's time on the benchmark batch.
    law = entropy.inverse_shifted if law is None else law
    (_, slope), (_, curv) = jax.jvp(law, (ybar,), (jnp.ones_like(ybar),))
    shift = 0.5 * T * V * curv / jnp.where(slope > 0, slope, 1.0)
    # trusted while the spread is within one temperature unit (V <= 1), held at its V = 1
    # value beyond: the raw correction overshot for wide rows (T = 0.01, Cauchy scores) and
    # cost up to 5 extra passes there; capped, it never took more passes than Jensen alone
    # (gaussian, Cauchy and exponential scores, T = 0.01 to 10, N = 8 and 512)
    shift = shift * jnp.minimum(1.0, 1.0 / V)
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    if isinstance(entropy, Tsallis):
        shift = jnp.where(entropy.q > 1, 0.0, shift)
    return jax.lax.stop_gradient(shift).astype(z.dtype)


def _softmax(z, keep, T):
    x = jnp.where(keep, z / T, -jnp.inf)
    m = jnp.max(x, -1, keepdims=True)
    e = jnp.where(keep, jnp.exp(x - m), 0.0)
    return e / jnp.sum(e, -1, keepdims=True)


# --------------------------------------------------------------------------- Renyi / Sharma-Mittal


def _log_moment(q, rho, active):
    safe = jnp.where(active, rho, 1.0)
    return jnp.log(jnp.sum(jnp.where(active, jnp.exp(q * jnp.log(safe)), 0.0), -1, keepdims=True))


def _consistency(entropy, ts, z, keep, T, logM, nu0=None):
    """Tsallis solve at T_eff(M) and the residual log M_q(rho) - log M (plus d/dlogM)."""
    q = entropy.q
    M = jnp.exp(logM)
    t = T * entropy.temperature_factor(M)
    rho, nu, slope = _solve_separable(ts, z, keep, t, nu0)
    active = rho > 0
    lm = _log_moment(q, rho, active)
    r = lm - logM
    # d rho/dt = (slope/t)(ybar - y), y = (z - nu)/t ; dt/dlogM = t * dlog(phi)/dlogM
    y = jnp.where(active, (z - nu) / t, 0.0)
    ssum = jnp.sum(slope, -1, keepdims=True)
    ybar = jnp.sum(slope * y, -1, keepdims=True) / jnp.where(ssum > 0, ssum, 1.0)
    drho_dt = slope / t * (ybar - y)
    safe = jnp.where(active, rho, 1.0)
    w = jnp.where(active, q * jnp.exp((q - 1) * jnp.log(safe)), 0.0)
    dlm_dt = jnp.sum(w * drho_dt, -1, keepdims=True) / jnp.exp(lm)
    dlogphi = jax.grad(lambda lm_: jnp.log(entropy.temperature_factor(jnp.exp(lm_))))
    dlogphi_dlogM = jnp.vectorize(dlogphi)(logM)
    dr = dlm_dt * t * dlogphi_dlogM - 1.0
    return rho, nu, r, dr, t


def _free_energy_rows(entropy, rho, z, keep, T):
    return -jnp.sum(jnp.where(keep, rho * z, 0.0), -1, keepdims=True) - T * entropy.value(
        rho, keep
    )[..., None]


def _logM_range(entropy, keep, dtype):
    n = jnp.sum(keep, -1, keepdims=True).astype(dtype)
    end = (1 - entropy.q) * jnp.log(n)
    return jnp.minimum(end, 0.0), jnp.maximum(end, 0.0)


def _scan_consistency(entropy, z, keep, T, n_grid):
    """Residual of the self-consistency on a grid in log M spanning its whole range."""
    ts = entropy.tsallis()
    a, b = _logM_range(entropy, keep, z.dtype)
    u = jnp.linspace(0.0, 1.0, n_grid, dtype=z.dtype).reshape((n_grid,) + (1,) * z.ndim)
    logM = a + (b - a) * u  # (K, ..., 1)
    rho, nu, r, _, t = _consistency(entropy, ts, z[None], keep[None], T, logM)
    return logM, rho, nu, r


# Renyi / Sharma-Mittal as ONE scalar equation per row (no inner Tsallis solve).
#
# With p = 1/(q-1), d_i = max z - z_i >= 0 and u_i = (delta - d_i)_+ (q > 1) or delta + d_i
# (q < 1), every Tsallis profile is rho_i = u_i^p / S_p, S_k = sum_i u_i^k: its temperature is
# q S_p^(q-1)/|q-1| and M_q = S_{p+1}/S_p^q. With T_eff = T M^-s (Renyi s = 1, Sharma-Mittal
# s = (q-r)/(q-1)) the self-consistency is, in t = log delta,
#     h(t) = s log S_{p+1} - beta log S_p - log a = 0,   beta = s q - (q-1),  a = qT/|q-1|,
# i.e. h = t + s log Shat_{p+1} - beta log Shat_p - log a with Shat_k = sum (u/delta)^k.
# h -> -inf as delta -> 0 (one-hot) and +inf as delta -> inf (uniform);
#     dh/d delta = (1 - gamma D)/R,  gamma = beta/(q-1),  R = S_{p+1}/S_p > 0,
#     D = S_{p+1} S_{p-1}/S_p^2 - 1 >= 0 (Cauchy-Schwarz),
# and dF(rho(delta))/d delta has the sign of h: stable branches are the upward crossings and
# the least-F branch is the global minimum of F along the curve delta -> rho(delta).
# gamma <= 0 (r >= 2 - 1/q: Renyi q < 1, Sharma-Mittal(2, 1.5), ...) makes h increasing: one
# root, no scan. Otherwise a coarse grid certifies the row cell by cell (see _shape_certify);
# rows it cannot certify are rescanned on a fine grid (_shape_scan), a chunk of rows at a time.

_SHAPE_CELLS = 4  # certificate grid
_SHAPE_SCAN_CELLS = 64  # fine scan of the uncertified rows
_SHAPE_CHUNK_KEYS = 1 << 15  # keys (rows x N) per fine-scan chunk
_SHAPE_SOFT = 0.9  # heuristic bound on gamma*D at the ends of a cell no rigorous test passes
_SHAPE_SOFT_MIN_KEYS = 16  # active keys needed at the left end of a cell for the heuristic


def _shape_exponent(entropy):
    """s with T_eff = T M_q^-s (Renyi 1, Sharma-Mittal (q-r)/(q-1)); None otherwise."""
    if isinstance(entropy, Renyi):
        return 1.0
    if isinstance(entropy, SharmaMittal):
        return (entropy.q - entropy.r) / (entropy.q - 1)
    return None


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
    s = _shape_exponent(entropy)
    p = 1.0 / (q - 1)
    beta = s * q - (q - 1)
    gamma = beta / (q - 1)
    T = jnp.asarray(T, dtype)
    row_shape = jnp.broadcast_shapes(z.shape[:-1] + (1,), keep.shape[:-1] + (1,),
                                     T.shape if T.ndim else ())
    z = jnp.broadcast_to(z, row_shape[:-1] + z.shape[-1:])
    keep = jnp.broadcast_to(keep, z.shape)
    zmax = _row_max(z, keep)
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
    if _concrete(q) is not None and _concrete(q) > 1:
        d = jnp.where(keep, d, jnp.inf)  # no weight in _shape_sums
    return _Shape(q, p, s, beta, gamma, d, keep, loga, t_lo, t_hi)


def _shape_sums(sh, t, count=False, profile=False):
    """(Shat_{p-1}, Shat_p, Shat_{p+1}) at t = log delta (and, with `count`, the number of
    active keys), and the weights (u/delta)^p: one elementwise pass."""
    inv = jnp.exp(-t)
    qc, pc = _concrete(sh.q), _concrete(sh.p)
    if qc is not None and qc > 1:
        if profile:
            # the same v, written without a constant: XLA:CPU hands the profile's row sum to
            # YNNPACK, which took the constants 1 and 0 as whole arrays filled per call (two
            # 8 MB fills, 40 % of Sharma-Mittal's time on the benchmark batch; in the
            # iteration's sums this form was slower)
            delta = jnp.exp(t)
            v = (delta - jnp.minimum(sh.d, delta)) * inv
        else:
            v = jnp.maximum(1.0 - sh.d * inv, 0.0)  # masked keys carry d = +inf: v = 0
        if pc == round(pc) and 1 <= pc <= 4:  # q = 2, 3/2, 4/3, 5/4: multiplies only
            k = int(round(pc))
            vm = (v > 0).astype(v.dtype) if k == 1 else jax.lax.integer_pow(v, k - 1)
            vp = v if k == 1 else vm * v
        else:
            act = v > 0
            vs = jnp.where(act, v, 1.0)
            vp = jnp.where(act, jnp.exp(sh.p * jnp.log(vs)), 0.0)
            vm = vp / vs
        vq = vp * v
    else:
        above = sh.q > 1
        d = jnp.where(sh.keep, sh.d, 0.0)
        v = jnp.where(above, 1.0 - d * inv, 1.0 + d * inv)
        act = sh.keep & (v > 0)
        vs = jnp.where(act, v, 1.0)
        vp = jnp.where(act, jnp.exp(sh.p * jnp.log(vs)), 0.0)
        vm = jnp.where(act, vp / vs, 0.0)
        vq = vp * vs
    terms = (vm.astype(v.dtype), vp, vq)
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
    S0, S1, S2 = S[:3]
    h = t + sh.s * jnp.log(S2) - sh.beta * jnp.log(S1) - sh.loga
    dh = sh.s * (sh.p + 1) * S1 / S2 - sh.beta * sh.p * S0 / S1
    return (S0, S1, S2, h, dh) + S[3:]


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
    st = jax.lax.while_loop(lambda s: (s[0] < max_iter) & ~jnp.all(s[-1]), body, st)
    return st[1]


def _shape_profile(sh, t):
    (_, S1, S2), vp = _shape_sums(sh, t, profile=True)
    return vp / S1, jnp.log(S2) - sh.q * jnp.log(S1)


def _shape_grid(sh, K):
    u = jnp.linspace(0.0, 1.0, K + 1, dtype=sh.d.dtype)
    tg = sh.t_lo + (sh.t_hi - sh.t_lo) * u.reshape((K + 1,) + (1,) * sh.d.ndim)
    # one row pass per grid point (a batched (K+1, ..., N) pass is slower on CPU)
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


def _value_of_logM(entropy, logM):
    if isinstance(entropy, Renyi):
        return logM / (1 - entropy.q)
    return jnp.expm1((1 - entropy.r) / (1 - entropy.q) * logM) / (1 - entropy.r)


def _shape_scan(entropy, sh, T, K=_SHAPE_SCAN_CELLS, n_candidates=3):
    """All rows: fine grid in t, the upward crossings of h ranked by the free energy of the
    grid profiles at their ends, each candidate polished by Newton, the least F returned."""
    tg, S0, S1, S2, h, _ = _shape_grid(sh, K)
    dg = jnp.exp(tg)
    vbar = S2 / S1
    dd = jnp.where(sh.q > 1, dg * (1 - vbar), dg * (vbar - 1))  # <d>
    F = dd - T * _value_of_logM(entropy, jnp.log(S2) - sh.q * jnp.log(S1))  # F + max z
    neg = h < 0
    up = neg[:-1] & ~neg[1:]
    score = jnp.where(up, jnp.minimum(F[:-1], F[1:]), jnp.inf)
    order = jnp.argsort(score[..., 0], axis=0)[:n_candidates][..., None]  # (C, ..., 1)
    valid = jnp.take_along_axis(score, order, 0) < jnp.inf
    order = jnp.where(valid, order, order[:1])
    t0, lo, hi = _pick_cell(order, tg, h)
    t = _shape_newton(sh, t0, lo, hi)
    rho_c, logM_c = _shape_profile(sh, t)
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
    # Chunks of ~32K keys: each chunk's scan costs ~20x its loop overhead (~0.2 ms), and a
    # few uncertified rows do not drag a large chunk of idle ones through the scan. (The
    # benchmark batch, 4096 x 512 gaussian, Renyi(2), T = 1, leaves 41 rows uncertified:
    # the former B // 32 = 128-row chunks made Renyi 11 % slower than 64-row ones; with
    # every row uncertified, T = 0.1, the two cost the same within 2 %.)
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
    if _shape_exponent(entropy) is None:
        raise TypeError(f"no threshold parametrization for {type(entropy).__name__}")
    sh = _shape_setup(entropy, z, keep, T)
    gamma = _concrete(sh.gamma)
    if gamma is not None and gamma <= 0:  # h increasing: the root is unique
        t = _shape_newton(sh, 0.5 * (sh.t_lo + sh.t_hi), sh.t_lo, sh.t_hi)
        return _shape_profile(sh, t)
    tg, S0, S1, S2, h, n = _shape_grid(sh, _SHAPE_CELLS)
    ok, k = _shape_certify(sh, tg, S0, S1, S2, h, n)
    t0, lo, hi = _pick_cell(k, tg, h)
    rho, logM = _shape_profile(sh, _shape_newton(sh, t0[0], lo[0], hi[0]))
    return _shape_rescan(entropy, sh, T, ~ok, rho, logM)


# --------------------------------------------------------------------------- the operator


class StationaryInfo(NamedTuple):
    """The stationary profile with its multiplier data.

    `nu` is the normalization shift in the solver's gauge (Renyi/S-M: of the Tsallis map
    at `T_eff`), `T_eff` the realized temperature (T for fixed-scale families).
    """

    rho: jax.Array
    T_eff: jax.Array


# Abe's component iteration chains divides and square roots whose intermediates XLA:CPU
# writes out as whole arrays (a value with several consumers is not recomputed), so its
# passes run at memory speed; solved in blocks of rows of about this many bytes, those
# arrays stay in cache (the (4096, 512) float32 benchmark batch: 1.6-2x faster). The other
# families fuse into few passes: blocking them only added loop overhead (Kaniadakis 1.4x slower).
_ABE_BLOCK_BYTES = 1 << 20


def _in_row_blocks(fn, z, keep, T, block_bytes):
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

    # T is a scalar or shaped (..., 1) against the scores (`_checked_T`)
    zb, kb, Tb = blocks(z, n, 0.0), blocks(keep, n, True), blocks(T, 1, 1.0)

    def body(j, out):
        # each block's weights overwrite its scores in place: the blocked scores are the
        # output buffer (`lax.map` would first fill a fresh one with zeros, 4 % of Abe's time)
        take = lambda x: jax.lax.dynamic_index_in_dim(x, j, keepdims=False)  # noqa: E731
        return jax.lax.dynamic_update_index_in_dim(out, fn(take(out), take(kb), take(Tb)), j, 0)

    out = jax.lax.fori_loop(0, count, body, zb)
    return out.reshape(count * block, n)[:rows].reshape(shape)


def _solve(entropy, z, keep, T):
    if isinstance(entropy, Shannon):
        return _softmax(z, keep, T), T * jnp.ones_like(z[..., :1])
    if isinstance(entropy, AbstractSeparableEntropy):
        def solve(z, keep, T):
            return _solve_separable(entropy, z, keep, T, nan_if_unconverged=True)[0]

        if isinstance(entropy, Abe):
            rho = _in_row_blocks(solve, z, keep, T, _ABE_BLOCK_BYTES)
        else:
            rho = solve(z, keep, T)
        return rho, T * jnp.ones_like(z[..., :1])
    if isinstance(entropy, AbstractTsallisShapedEntropy):
        rho, logM = _solve_tsallis_shaped(entropy, z, keep, T)
        return rho, T * entropy.temperature_factor(jnp.exp(logM))
    raise TypeError(f"no stationary map for {type(entropy).__name__}")


@eqx.filter_custom_jvp
def _stationary_core(entropy, z, keep, T):
    rho, _ = _solve(entropy, z, keep, T)
    return rho


def _separable_tangent(entropy, rho, keep, T, t_z, t_T, t_entropy):
    active = keep & (rho > 0)
    c = _slope(entropy, rho, active) / T
    zeta = jnp.zeros_like(rho) if t_z is None else jnp.where(keep, t_z, 0.0)
    y = _shifted_G(entropy, rho, active)
    if t_T is not None:
        zeta = zeta - y * t_T
    dG = _param_jvp(lambda e: _shifted_G(e, rho, active), entropy, t_entropy)
    if dG is not None:
        zeta = zeta - T * dG
    return _project(c, zeta)


def _tsallis_shaped_tangent(entropy, rho, keep, T, t_z, t_T, t_entropy):
    q = entropy.q
    ts = entropy.tsallis()
    active = keep & (rho > 0)
    logM = _log_moment(q, rho, active)
    M = jnp.exp(logM)
    t = T * entropy.temperature_factor(M)
    c = _slope(ts, rho, active) / t
    y = _shifted_G(ts, rho, active)
    zeta = jnp.zeros_like(rho) if t_z is None else jnp.where(keep, t_z, 0.0)
    dG = _param_jvp(lambda e: _shifted_G(e.tsallis(), rho, active), entropy, t_entropy)
    if dG is not None:
        zeta = zeta - t * dG
    # direct change of T_eff at fixed M
    t_dot0 = jnp.zeros_like(M) if t_T is None else t_T * entropy.temperature_factor(M)
    dphi = _param_jvp(lambda e: e.temperature_factor(M), entropy, t_entropy)
    if dphi is not None:
        t_dot0 = t_dot0 + T * dphi
    Py = _project(c, y)
    A = _project(c, zeta) - Py * t_dot0
    dphi_dM = jnp.vectorize(jax.grad(lambda m: entropy.temperature_factor(m)))(M)
    B = -Py * T * dphi_dM
    safe = jnp.where(active, rho, 1.0)
    w = jnp.where(active, q * jnp.exp((q - 1) * jnp.log(safe)), 0.0)
    m_q = _param_jvp(lambda e: jnp.exp(_log_moment(e.q, rho, active)), entropy, t_entropy)
    num = jnp.sum(w * A, -1, keepdims=True)
    if m_q is not None:
        num = num + m_q
    M_dot = num / (1.0 - jnp.sum(w * B, -1, keepdims=True))
    return A + B * M_dot


@_stationary_core.def_jvp
def _stationary_core_jvp(primals, tangents):
    entropy, z, keep, T = primals
    t_entropy, t_z, _, t_T = tangents
    rho = _stationary_core(entropy, z, keep, T)
    if t_T is not None:
        t_T = jnp.broadcast_to(t_T, T.shape)
    if isinstance(entropy, AbstractTsallisShapedEntropy):
        t_rho = _tsallis_shaped_tangent(entropy, rho, keep, T, t_z, t_T, t_entropy)
    else:
        t_rho = _separable_tangent(entropy, rho, keep, T, t_z, t_T, t_entropy)
    return rho, t_rho


def stationary(entropy: AbstractEntropy, scores, T=1.0, *, mask=None, axis: int = -1):
    """The fixed-temperature stationary attention map of an entropy family.

    Solves $T G(\\rho_i) = z_i + \\lambda$ on the support, $\\sum_i\\rho_i = 1$ (MATH.md §2),
    batched over every axis but `axis`; jit/vmap/grad compatible with the exact Jacobian of
    MATH.md §3 as a custom JVP.

    **Arguments:**
    - `entropy`: an entropy family, e.g. `Kaniadakis(0.3)`.
    - `scores`: the scores $z$, any batch shape: float64 / float32, or bfloat16 / float16
      (solved in float32, the weights returned in the input's precision).
    - `T`: temperature > 0, a scalar or an array over the batch shape.
    - `mask`: boolean, True = keep; masked entries (and `-inf` scores) get exactly zero
      weight and zero gradient; an all-masked row returns zeros.
    - `axis`: the key axis.

    **Returns:** $\\rho$ with the shape of `scores`. Renyi / Sharma-Mittal return the
    self-consistent branch of least free energy (see `stationary_branches`). A row of a
    separable family whose normalization root has not converged after 200 iterations is
    returned as NaN (unless its weights already sum to 1 at round-off), never as an
    unconverged answer (none seen over gaussian, Cauchy, exponential and bimodal scores,
    T = 0.01 to 10; at most 32 iterations).
    """
    _check_entropy(entropy)
    return _stationary_jit(entropy, _as_array(scores), _as_array(T), mask, axis)


def _as_array(x):
    # Python scalars become traced arrays, so new values of T do not recompile.
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


@eqx.filter_jit
def _stationary_jit(entropy, scores, T, mask, axis):
    # Half-precision scores (bfloat16, float16) are solved in float32 and the weights
    # rounded back: the solvers' stopping tests need more than 8 bits (in bfloat16 itself
    # Tsallis rows summed to 1 +- 0.1 on 16 keys).
    low = jnp.issubdtype(scores.dtype, jnp.floating) and jnp.finfo(scores.dtype).bits < 32
    z_in = scores.astype(jnp.float32) if low else scores
    if mask is None and type(entropy) is Shannon:
        rho = _shannon_unmasked(z_in, T, axis)
    elif mask is None and not isinstance(entropy, Abe):
        # (not Abe: the folded mask gained it 4-5 % on the benchmark batch in row blocks,
        # for a compile time of 3.3-3.7 s instead of 2.6 s, so it keeps one path)
        rho = _solve_unmasked(entropy, z_in, T, axis)
    else:
        z, keep, T, empty = _prepare(z_in, T, mask, axis)
        rho = _stationary_core(entropy, z, keep, T)
        if mask is None:
            # Abe without a mask: its solver already gives -inf keys weight 0, so only rows
            # of all -inf (solved as uniform) need zeroing; without any, no pass over the
            # output (5 % of Abe's time on the benchmark batch)
            rho = jax.lax.cond(jnp.any(empty), lambda r: jnp.where(empty, 0.0, r),
                               lambda r: r, rho)
        else:
            rho = jnp.where(empty | ~keep, 0.0, rho)
        rho = jnp.moveaxis(rho, -1, axis)
    return rho.astype(scores.dtype) if low else rho


def _unmasked_inputs(scores, T, axis):
    """`_prepare` without a mask: keys last, the NaN/+inf and T checks riding on one row-max
    reduction. Returns (z, zmax, T) with T shaped to broadcast against z."""
    z = _keys_last(scores, axis)
    zmax = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))  # NaN-propagating
    T = _checked_T(T, jnp.any(jnp.isnan(zmax) | (zmax == jnp.inf)), z.dtype)
    return z, zmax, T


def _has_neg_inf(z):
    # through the row minimum: one reduction XLA:CPU vectorizes (YNNPACK), where
    # `any(z == -inf)` is an elementwise compare plus a boolean reduce-window (on the
    # (4096, 512) benchmark batch 0.45 ms against 1.2 ms, a tenth of Burg's time)
    return jnp.any(jnp.min(z, axis=-1) == -jnp.inf)


@jax.custom_batching.custom_vmap
def _any_neg_inf(z):
    return _has_neg_inf(z)


@_any_neg_inf.def_vmap
def _any_neg_inf_vmap(axis_size, in_batched, z):
    # one answer for the whole vmapped batch (unbatched), so that the `lax.cond` below
    # stays a branch under vmap instead of becoming a select that runs both sides
    return _has_neg_inf(z), False


def _solve_unmasked(entropy, scores, T, axis):
    """The stationary map without a mask. When no score is -inf (the common case) the
    solvers run with a keep mask that is the constant True, which XLA folds away: no mask
    reads, no where-copies of the scores, no empty-row pass (measured on (4096, 512) float32:
    Burg 5.1 -> 2.1x softmax, Tsallis(1.5) 8.8 -> 6.2x, Renyi 17.2 -> 14.6x). A batch with
    any -inf score takes the general path; under vmap the test covers the whole batch."""
    z, zmax, T = _unmasked_inputs(scores, T, axis)

    def general(z, T):
        empty = zmax == -jnp.inf
        keep = (z > -jnp.inf) | empty  # empty rows: solved as unmasked zeros, zeroed after
        rho = _stationary_core(entropy, jnp.where(keep, z, 0.0), keep, T)
        return jnp.where(empty | ~keep, 0.0, rho)

    def finite(z, T):
        return _stationary_core(entropy, z, jnp.ones(z.shape, bool), T)

    rho = jax.lax.cond(_any_neg_inf(jax.lax.stop_gradient(z)), general, finite, z, T)
    return jnp.moveaxis(rho, -1, axis)


def _shannon_unmasked(scores, T, axis):
    """softmax(z/T) without a mask: the same input checks as `_prepare` riding on one
    row-max reduction, then one fused exp-sum-divide (plain autodiff is the exact softmax
    Jacobian). The general path (keep mask, where-copies of the scores, the solver's custom
    JVP) cost 2.6x softmax for what is softmax."""
    z, zmax, T = _unmasked_inputs(scores, T, axis)
    empty = zmax == -jnp.inf  # every key -inf (masked): a zero row, zero gradient
    d = z - jnp.where(empty, 0.0, zmax)
    keep = d > -jnp.inf  # double where: -inf keys get weight 0 and no NaN in d/dT
    e = jnp.where(keep, jnp.exp(jnp.where(keep, d, 0.0) / T), 0.0)
    rho = e / jnp.where(empty, 1.0, jnp.sum(e, -1, keepdims=True))
    return jnp.moveaxis(rho, -1, axis)


def stationary_info(entropy: AbstractEntropy, scores, T=1.0, *, mask=None) -> StationaryInfo:
    """`stationary` plus the realized temperature `T_eff` (last axis = keys; no gradient)."""
    _check_entropy(entropy)
    return _stationary_info_jit(entropy, _as_array(scores), _as_array(T), mask)


@eqx.filter_jit
def _stationary_info_jit(entropy, scores, T, mask):
    z, keep, T, empty = _prepare(scores, T, mask, -1)
    rho, T_eff = _solve(entropy, z, keep, T)
    return StationaryInfo(jnp.where(empty | ~keep, 0.0, rho), T_eff[..., 0])


def stationary_jacobian(entropy: AbstractEntropy, scores, T=1.0, *, mask=None):
    """The exact Jacobian $J = \\partial\\rho/\\partial z$ from the closed form of MATH.md §3.

    Separable: $J = \\mathrm{diag}(c) - c c^T/\\sum c$, $c_i = 1/(T G'(\\rho_i))$ on the support.
    Renyi / Sharma-Mittal: the same at $T_{eff}$ plus the symmetric rank-one correction from
    $dM = q\\sum\\rho^{q-1}d\\rho$ through $T_{eff}(M)$. Last axis = keys; returns (..., N, N).
    """
    _check_entropy(entropy)
    return _jacobian_jit(entropy, _as_array(scores), _as_array(T), mask)


@eqx.filter_jit
def _jacobian_jit(entropy, scores, T, mask):
    z, keep, T, empty = _prepare(scores, T, mask, -1)
    rho = jax.lax.stop_gradient(_stationary_core(entropy, z, keep, T))
    active = keep & (rho > 0) & ~empty
    if isinstance(entropy, AbstractTsallisShapedEntropy):
        q = entropy.q
        ts = entropy.tsallis()
        M = jnp.exp(_log_moment(q, rho, active))
        t = T * entropy.temperature_factor(M)
        c = _slope(ts, rho, active) / t
    else:
        c = _slope(entropy, rho, active) / T
    sc = jnp.sum(c, -1, keepdims=True)
    sc = jnp.where(sc > 0, sc, 1.0)
    J = jnp.vectorize(jnp.diag, signature="(n)->(n,n)")(c) - c[..., :, None] * c[..., None, :] / sc[
        ..., None
    ]
    if isinstance(entropy, AbstractTsallisShapedEntropy):
        y = _shifted_G(ts, rho, active)
        Py = _project(c, y)
        dphi_dM = jnp.vectorize(jax.grad(lambda m: entropy.temperature_factor(m)))(M)
        B = -Py * T * dphi_dM
        safe = jnp.where(active, rho, 1.0)
        w = jnp.where(active, q * jnp.exp((q - 1) * jnp.log(safe)), 0.0)
        wJ = jnp.einsum("...i,...ij->...j", w, J)
        denom = 1.0 - jnp.sum(w * B, -1, keepdims=True)
        J = J + B[..., :, None] * (wJ / denom)[..., None, :]
    return J


def free_energy(entropy: AbstractEntropy, rho, scores, T=1.0, *, mask=None):
    """$F(\\rho) = \\sum_i \\rho_i E_i - T S(\\rho)$ with $E_i = -z_i$ (last axis = keys)."""
    _check_entropy(entropy)
    rho = jnp.asarray(rho)
    if not jnp.issubdtype(rho.dtype, jnp.floating):
        rho = rho.astype(jnp.result_type(float))
    # F is defined off the simplex (its gradient is used there), but not for negative or NaN
    # weights: the entropies' safe logarithms would silently drop them
    rho = eqx.error_if(
        rho, jnp.any(~(rho >= 0)), "free_energy needs weights rho >= 0 (no NaN)"
    )
    return _free_energy_unchecked(entropy, rho, scores, T, mask)


def _free_energy_unchecked(entropy, rho, scores, T, mask=None):
    z = jnp.asarray(scores, dtype=rho.dtype)
    keep = jnp.ones(z.shape, bool) if mask is None else jnp.asarray(mask)
    keep = keep & jnp.isfinite(z)
    energy = -jnp.sum(jnp.where(keep, rho * jnp.where(keep, z, 0.0), 0.0), -1)
    return energy - jnp.asarray(T) * entropy.value(rho, keep)


# --------------------------------------------------------------------------- all branches


class Branches(eqx.Module):
    """Every self-consistent solution of a Renyi / Sharma-Mittal map (fixed-size, padded).

    `valid[k]` marks real branches; `rho[k]`, `M[k]` (the moment $M_q$), `T_eff[k]`,
    `free_energy[k]` and `stable[k]` (a minimum of the dual in M, i.e. a downward crossing
    of the consistency residual: the branches the damped dynamics can settle on).
    """

    rho: jax.Array
    M: jax.Array
    T_eff: jax.Array
    free_energy: jax.Array
    stable: jax.Array
    valid: jax.Array

    @property
    def count(self):
        return jnp.sum(self.valid, -1)


def stationary_branches(entropy: AbstractEntropy, scores, T=1.0, *, mask=None, n_grid=512):
    """Every self-consistent solution of the fixed-T map, each with its M and free energy.

    The consistency equation $M = M_q(\\mathrm{Tsallis}(z, T\\phi(M)))$ is scanned over its
    whole range $M \\in [N^{1-q}, 1]$ (or $[1, N^{1-q}]$ for q < 1) on `n_grid` points in
    log M, every sign change is bracketed and polished. For fixed-scale families there is
    exactly one branch. One score vector (last axis); output padded to `n_grid - 1` slots.
    """
    _check_entropy(entropy)
    return _branches_jit(entropy, _as_array(scores), _as_array(T), mask, n_grid)


@eqx.filter_jit
def _branches_jit(entropy, scores, T, mask, n_grid):
    z, keep, T, empty = _prepare(scores, T, mask, -1)
    if z.ndim != 1:
        raise ValueError("stationary_branches takes one score vector (shape (N,))")
    if not isinstance(entropy, AbstractTsallisShapedEntropy):
        rho, T_eff = _solve(entropy, z, keep, T)
        F = _free_energy_unchecked(entropy, rho, z, T, mask=keep)
        M = jnp.sum(rho**2)
        return Branches(
            rho[None], M[None], T_eff, F[None], jnp.array([True]), jnp.array([True])
        )
    logM, rho_g, nu_g, r = _scan_consistency(entropy, z, keep, T, n_grid)
    r = r[..., 0]
    sign_change = ((r[:-1] > 0) & (r[1:] <= 0)) | ((r[:-1] < 0) & (r[1:] >= 0))
    down = r[:-1] > 0
    a = jnp.where(down, logM[:-1, 0], logM[1:, 0])  # orient so r(a) >= 0 >= r(b)
    b = jnp.where(down, logM[1:, 0], logM[:-1, 0])
    K1 = n_grid - 1
    lo = jnp.minimum(a, b)[:, None]
    hi = jnp.maximum(a, b)[:, None]
    rho_c, x_c = _refine_any(entropy, jnp.broadcast_to(z, (K1,) + z.shape),
                             jnp.broadcast_to(keep, (K1,) + keep.shape), T, lo, hi,
                             down[:, None], nu_g[:-1])
    F = _free_energy_unchecked(entropy, rho_c, jnp.broadcast_to(z, rho_c.shape), T, keep)
    M = jnp.exp(x_c[:, 0])
    T_eff = T * entropy.temperature_factor(M)
    return Branches(rho_c, M, T_eff, F, down & sign_change, sign_change)


def _refine_any(entropy, z, keep, T, lo, hi, down, nu0, max_iter=100):
    """Bracketed Newton in log M for a root of the consistency residual r in [lo, hi]
    (`down`: r(lo) >= 0 >= r(hi), else the reverse), each step a warm-started Tsallis solve.
    One call site of the inner solver keeps the compiled program small."""
    ts = entropy.tsallis()
    eps = jnp.finfo(z.dtype).eps
    sgn = jnp.where(down, 1.0, -1.0)  # sgn * r is + at lo and - at hi
    x0 = 0.5 * (lo + hi)
    rho0 = jnp.zeros(jnp.broadcast_shapes(z.shape, x0.shape), z.dtype)
    nan = jnp.full_like(x0, jnp.nan)

    def cond(s):
        return (s[0] < max_iter) & ~jnp.all(s[-1])

    def body(s):
        it, x, lo, hi, nu, r, dr, rho, done = s
        first = it == 0
        sr = sgn * r
        lo = jnp.where(~first & (sr >= 0), x, lo)
        hi = jnp.where(~first & (sr <= 0), x, hi)
        newton = x - r / jnp.where(dr != 0, dr, 1.0)
        inside = (newton >= lo) & (newton <= hi) & jnp.isfinite(newton)
        x_new = jnp.where(first, x, jnp.where(inside, newton, 0.5 * (lo + hi)))
        small = ~first & (jnp.abs(x_new - x) <= 8 * eps * (1 + jnp.abs(x)))
        x_new = jnp.where(done, x, x_new)
        rho_n, nu_n, r_n, dr_n, _ = _consistency(entropy, ts, z, keep, T, x_new, nu)
        done_n = done | (jnp.abs(r_n) <= 64 * eps) | small | ((hi - lo) <= 8 * eps * (1 + jnp.abs(x)))
        pick = lambda new, old: jnp.where(done, old, new)  # noqa: E731
        return (it + 1, x_new, lo, hi, pick(nu_n, nu), pick(r_n, r), pick(dr_n, dr),
                pick(rho_n, rho), done_n)

    s = (jnp.array(0), x0, lo, hi, jnp.broadcast_to(nu0, x0.shape), nan, nan, rho0,
         jnp.zeros(x0.shape, bool))
    out = jax.lax.while_loop(cond, body, s)
    return out[7], out[1]
