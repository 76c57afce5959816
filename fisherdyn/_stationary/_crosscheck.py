"""An independent realization of the fixed-T stationary map by direct root solving.

`solve_stationary` solves the stationary conditions of MATH.md §2,

$$T\\,G(\\rho_i) - z_i - \\lambda = 0 \\ (\\rho_i > 0), \\qquad \\sum_i \\rho_i = 1,$$

with general-purpose root finders (optimistix or scipy) and nothing else. It shares no solver
code with `fisherdyn/_stationary.py` (it does not import it) and exists to cross-check it:

- The multiplier is the unknown of a scalar monotone equation. It is solved in the gauge of
  the shifted law $\\hat G = G - G(1)$ (`entropy.G_shifted`), $\\nu = \\lambda - T G(1)$:
  $\\sum_i \\hat G^{-1}((z_i + \\nu)/T) = 1$, bracketed by
  $[T\\hat G(1/(2n)) - \\max z,\\ T\\hat G(2) - \\max z]$ (top weight $1/(2n)$ and 2 at the
  ends: the sum is below and above 1 even for a one-hot solution). The shift keeps the
  near-Shannon limits (Tsallis q -> 1, where G(1) = q/(q-1)) well conditioned; `lam` is
  reported in the convention $T G(\\rho_i) - z_i = \\lambda$.
- Each weight is $\\rho_i = \\hat G^{-1}(y_i)$, found by a component root solve in
  $\\ell = \\ln\\rho_i$ of $\\mathrm{asinh}\\,\\hat G(e^\\ell) = \\mathrm{asinh}\\,y_i$ (nearly
  linear in $\\ell$ for every family) on $\\ell \\in [-700, 1]$; weights whose law value lies
  below $\\hat G(e^{-700})$ are exactly 0 (this is the Tsallis q > 1 cutoff
  $T G(0^+) - z_i \\ge \\lambda$).
- Renyi / Sharma-Mittal: the Tsallis map at $T_{eff} = T\\phi(M)$ with the self-consistency
  $\\ln M_q(\\rho) = \\ln M$ solved in $\\ln M$: a grid scan (`n_grid` points) over the whole
  range of $M$ brackets every root, each bracket is refined, and the root of least free
  energy is returned (or, with `M0=`, the root nearest to $M_0$ in $\\ln M$).

`method="optimistix"`: JAX, every root by `optx.Bisection` (robust bracketing) followed by an
`optx.Newton` polish clipped to the bracket; the separable component laws are inverted
numerically from `entropy.G_shifted` alone (no closed forms), the Tsallis profile of Renyi /
Sharma-Mittal by its closed form. jit/vmap compatible. Derivatives (jacfwd/grad) come from
the implicit function theorem at the solution: custom JVPs of the component and multiplier
solves (MATH.md §3) and optimistix's implicit adjoint for log M; no iteration is unrolled.
`method="scipy"`: float64 numpy, `scipy.optimize.brentq` for the multiplier, for $\\ln M$ and
for the component laws without a closed form (Abe); closed-form inverses written here from
MATH.md §2 for Shannon, Tsallis, Kaniadakis and Burg.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
import optimistix as optx
import scipy.optimize

from .._entropies import (
    Abe,
    AbstractEntropy,
    AbstractSeparableEntropy,
    AbstractTsallisShapedEntropy,
    Burg,
    Kaniadakis,
    Renyi,
    Shannon,
    SharmaMittal,
    Tsallis,
)

__all__ = ["solve_stationary", "StationarySolution"]

_L_LO = -700.0  # exp(-700) ~ 1e-304: weights below this are reported as exact zeros
_L_HI = 1.0
_BIG = 1e300


class StationarySolution(eqx.Module):
    """The result of `solve_stationary`.

    **Fields:**
    - `rho`: the stationary weights, shape (N,).
    - `lam`: the multiplier $\\lambda$ of $T G(\\rho_i) - z_i = \\lambda$ (Renyi / Sharma-Mittal:
      $T_{eff} G_{Tsallis}(\\rho_i) - z_i = \\lambda$).
    - `residual`: $\\max_i |T G(\\rho_i) - z_i - \\lambda|$ over the support, evaluated with
      `entropy.G` (Renyi / S-M: the Tsallis G at $T_{eff} = T\\phi(M_q(\\rho))$ recomputed from
      the returned $\\rho$, so it also measures the self-consistency).
    - `result`: an `optimistix.RESULTS` code (`successful` when every root solve converged).
    - `T_eff`: the realized temperature (T for fixed-scale families).
    """

    rho: jax.Array
    lam: jax.Array
    residual: jax.Array
    result: optx.RESULTS
    T_eff: jax.Array

    @property
    def converged(self):
        return self.result == optx.RESULTS.successful


# =========================================================================== checks


def _check(entropy, scores, T, mask):
    if not isinstance(entropy, AbstractEntropy):
        raise TypeError(f"expected a fisherdyn entropy (e.g. Shannon()), got {entropy!r}")
    if not isinstance(entropy, (AbstractSeparableEntropy, AbstractTsallisShapedEntropy)):
        raise TypeError(f"no stationary conditions known for {type(entropy).__name__}")
    if jnp.ndim(scores) != 1:
        raise ValueError(
            f"solve_stationary takes one score vector of shape (N,), got shape "
            f"{jnp.shape(scores)}; batch with jax.vmap (method='optimistix')"
        )
    if jnp.ndim(T) != 0:
        raise ValueError("T must be a scalar")
    if mask is not None and jnp.shape(mask) != jnp.shape(scores):
        raise ValueError(f"mask shape {jnp.shape(mask)} != scores shape {jnp.shape(scores)}")


def _residual(entropy, rho, z, lam, T_eff):
    """$\\max_{\\rho_i > 0} |T G(\\rho_i) - z_i - \\lambda|$ with the library's own law."""
    law = entropy.tsallis() if isinstance(entropy, AbstractTsallisShapedEntropy) else entropy
    on = rho > 0
    G = law.G(jnp.where(on, rho, 1.0))
    return jnp.max(jnp.where(on, jnp.abs(T_eff * G - jnp.where(on, z, 0.0) - lam), 0.0))


def _T_eff(entropy, rho, T):
    if isinstance(entropy, AbstractTsallisShapedEntropy):
        return T * entropy.temperature_factor(entropy.moment(rho))
    return T


# =========================================================================== optimistix path

_R = optx.RESULTS


def _bisect_then_newton(fn, args, lower, upper, y0, tol_bisect=1e-9, tol_newton=1e-13):
    """A scalar root of the monotone increasing `fn` in [lower, upper]: `optx.Bisection`
    to `tol_bisect`, then an `optx.Newton` polish clipped to the bracket.
    Returns (root, ok)."""
    bis = optx.root_find(
        fn,
        optx.Bisection(rtol=tol_bisect, atol=tol_bisect, flip=False),
        y0,
        args,
        options=dict(lower=lower, upper=upper),
        max_steps=256,
        throw=False,
    )
    start = jax.lax.stop_gradient(bis.value)
    newton = optx.root_find(
        fn,
        optx.Newton(rtol=tol_newton, atol=tol_newton, linear_solver=lx.Diagonal()),
        start,
        args,
        options=dict(lower=lower, upper=upper),
        max_steps=64,
        throw=False,
        tags=frozenset({lx.diagonal_tag}),
    )
    ok = (bis.result == _R.successful) & (newton.result == _R.successful)
    return newton.value, ok


def _law_value(law, l):
    """$\\hat G(e^l)$, finite: a NaN (overflow of a product form at extreme l, where the
    law is at its lowest) reads as -1e300."""
    g = law.G_shifted(jnp.exp(l))
    return jnp.clip(jnp.where(jnp.isnan(g), -_BIG, g), -_BIG, _BIG)


def _component_fn(l, args):
    law, y = args
    return jnp.arcsinh(_law_value(law, l)) - jnp.arcsinh(y)


@eqx.filter_custom_jvp
def _invert_component(law, y):
    """$\\rho = \\hat G^{-1}(y)$, $\\hat G = G - G(1)$, from the law alone; 0 below
    $\\hat G(e^{-700})$. Returns (rho, ok)."""
    dtype = y.dtype
    g_lo = _law_value(law, jnp.asarray(_L_LO, dtype))
    g_hi = _law_value(law, jnp.asarray(_L_HI, dtype))
    below = y <= g_lo
    outside = below | (y >= g_hi) | ~jnp.isfinite(y)
    # a harmless in-range target (root l = 0) where there is no root in the bracket
    y_use = jnp.where(outside, 0.0, y)
    l0 = jnp.asarray(0.5 * (_L_LO + _L_HI), dtype)
    l, ok = _bisect_then_newton(
        _component_fn, (law, y_use), jnp.asarray(_L_LO, dtype), jnp.asarray(_L_HI, dtype), l0
    )
    rho = jnp.where(below, 0.0, jnp.exp(l))
    ok = below | (ok & ~outside)
    return rho, ok


def _law_terms(law, rho):
    """(G(rho) - G(1), G'(rho)) by autodiff of the shifted law (rho > 0)."""
    return jax.value_and_grad(law.G_shifted)(rho)


@_invert_component.def_jvp
def _invert_component_jvp(primals, tangents):
    # implicit function theorem on G^(rho) = y: d rho = (dy - dG^/dparams) / G'(rho)
    law, y = primals
    t_law, t_y = tangents
    rho, ok = _invert_component(law, y)
    on = rho > 0
    x = jnp.where(on, rho, 1.0)
    _, Gp = _law_terms(law, x)
    t = jnp.zeros_like(y) if t_y is None else t_y
    if t_law is not None and jtu.tree_leaves(t_law):
        t = t - eqx.filter_jvp(lambda L: L.G_shifted(x), (law,), (t_law,))[1]
    return (rho, ok), (jnp.where(on, t / Gp, 0.0), None)


# The profiles work in the gauge of the shifted law $\\hat G = G - G(1)$ and the shifted
# multiplier $\\nu = \\lambda - T G(1)$: $T\\hat G(\\rho_i) = z_i + \\nu$. This keeps the
# near-Shannon limits (Tsallis q -> 1, where G(1) = q/(q-1) is huge) well conditioned.


class _LawProfile(eqx.Module):
    """Separable family: $\\rho_i = \\hat G^{-1}((z_i + \\nu)/T)$ by component root solves."""

    law: AbstractSeparableEntropy

    def G_shifted(self, x):
        return self.law.G_shifted(x)

    def G1(self):
        return self.law.G1()

    def __call__(self, z, keep, T, nu):
        y = jnp.where(keep, (z + nu) / T, 0.0)
        rho, ok = jax.vmap(lambda yi: _invert_component(self.law, yi))(y)
        return jnp.where(keep, rho, 0.0), jnp.all(ok | ~keep)


class _TsallisProfile(eqx.Module):
    """Closed-form Tsallis profile (MATH.md §2) in the shifted gauge:
    $\\rho_i = [1 + (q-1) y_i/q]_+^{1/(q-1)}$, $y_i = (z_i + \\nu)/T$."""

    q: jax.Array

    def G_shifted(self, x):
        return self.q * jnp.expm1((self.q - 1) * jnp.log(x)) / (self.q - 1)

    def G1(self):
        return self.q / (self.q - 1)

    def __call__(self, z, keep, T, nu):
        q = self.q
        u = (q - 1) * (z + nu) / (q * T)
        pos = keep & (u > -1)
        rho = jnp.where(pos, jnp.exp(jnp.log1p(jnp.where(pos, u, 0.0)) / (q - 1)), 0.0)
        return rho, jnp.asarray(True)


def _multiplier_fn(a, args):
    profile, z, keep, T, lam_lo, width = args
    rho, _ = profile(z, keep, T, lam_lo + a * width)
    return jnp.log(jnp.sum(rho))


@eqx.filter_custom_jvp
def _solve_multiplier(profile, z, keep, T):
    """Find the shifted multiplier $\\nu$ with $\\sum\\rho(\\nu) = 1$ in the exact bracket.
    Returns (rho, nu, ok)."""
    dtype = z.dtype
    n = jnp.sum(keep).astype(dtype)
    zmax = jnp.max(jnp.where(keep, z, -jnp.inf))
    lam_hi = T * profile.G_shifted(jnp.asarray(2.0, dtype)) - zmax
    lam_lo = T * profile.G_shifted(1.0 / (2.0 * n)) - zmax
    width = lam_hi - lam_lo
    args = (profile, z, keep, T, lam_lo, width)
    zero, one = jnp.asarray(0.0, dtype), jnp.asarray(1.0, dtype)
    a, ok = _bisect_then_newton(_multiplier_fn, args, zero, one, jnp.asarray(0.5, dtype))
    lam = lam_lo + a * width
    rho, ok_rho = profile(z, keep, T, lam)
    return rho, lam, ok & ok_rho


@_solve_multiplier.def_jvp
def _solve_multiplier_jvp(primals, tangents):
    # Differentiate T G^(rho_i) = z_i + nu, sum rho = 1 (MATH.md §3) so that Newton polishes
    # around this solve never differentiate through the root finders themselves:
    # d rho = c (zeta + d nu), d nu = -(c.zeta)/sum c, c = 1/(T G'(rho)) on the support,
    # zeta = dz - G^ dT - T dG^/dparams.
    profile, z, keep, T = primals
    t_profile, t_z, _, t_T = tangents
    rho, lam, ok = _solve_multiplier(profile, z, keep, T)
    on = keep & (rho > 0)
    x = jnp.where(on, rho, 1.0)
    G, Gp = jax.vmap(lambda xi: _law_terms(profile, xi))(x)
    c = jnp.where(on, 1.0 / (T * Gp), 0.0)
    zeta = jnp.zeros_like(z) if t_z is None else t_z
    if t_T is not None:
        zeta = zeta - G * t_T
    if t_profile is not None and jtu.tree_leaves(t_profile):
        zeta = zeta - T * eqx.filter_jvp(lambda P: P.G_shifted(x), (profile,), (t_profile,))[1]
    zeta = jnp.where(on, zeta, 0.0)
    t_lam = -jnp.sum(c * zeta) / jnp.sum(c)
    return (rho, lam, ok), (c * (zeta + t_lam), t_lam, None)


def _solve_separable_optx(entropy, z, keep, T):
    """(rho, lambda, ok) in the convention T G(rho_i) - z_i = lambda."""
    profile = _LawProfile(entropy)
    rho, nu, ok = _solve_multiplier(profile, z, keep, T)
    return rho, nu + T * profile.G1(), ok


def _solve_tsallis_optx(q, z, keep, T):
    """(rho, lambda, ok) of the Tsallis map at temperature T."""
    profile = _TsallisProfile(q)
    rho, nu, ok = _solve_multiplier(profile, z, keep, T)
    return rho, nu + T * profile.G1(), ok


def _logM_range(q, n):
    end = (1 - q) * jnp.log(n)
    return jnp.minimum(end, 0.0), jnp.maximum(end, 0.0)


def _consistency_fn(logM, args):
    entropy, z, keep, T, sign = args
    T_eff = T * entropy.temperature_factor(jnp.exp(logM))
    rho, _, _ = _solve_tsallis_optx(entropy.q, z, keep, T_eff)
    return sign * (jnp.log(jnp.sum(rho**entropy.q)) - logM)


def _free_energy(entropy, rho, z, keep, T):
    return -jnp.sum(jnp.where(keep, rho * z, 0.0)) - T * entropy.value(rho, keep)


def _solve_shaped_optx(entropy, z, keep, T, M0, n_grid):
    dtype = z.dtype
    q = entropy.q
    n = jnp.sum(keep).astype(dtype)
    lo, hi = _logM_range(q, n)
    grid = lo + (hi - lo) * jnp.linspace(0.0, 1.0, n_grid, dtype=dtype)

    def residual_at(logM):
        T_eff = T * entropy.temperature_factor(jnp.exp(logM))
        rho, _, res = _solve_tsallis_optx(q, z, keep, T_eff)
        return jnp.log(jnp.sum(rho**q)) - logM, res

    r, _ = jax.vmap(residual_at)(grid)
    valid = r[:-1] * r[1:] <= 0  # a root in [grid_k, grid_k+1] (at least one exists)
    first = jnp.argmax(valid)
    left = jnp.where(valid, grid[:-1], grid[first])
    right = jnp.where(valid, grid[1:], grid[first + 1])
    sign = jnp.where(
        jnp.where(valid, r[:-1], r[first]) <= jnp.where(valid, r[1:], r[first + 1]), 1.0, -1.0
    ).astype(dtype)

    def refine(left, right, sign):
        # in log M itself (not a unit coordinate on the bracket): the tolerances then match
        # the noise floor of the consistency residual whatever the grid spacing
        args = (entropy, z, keep, T, sign)
        logM, ok = _bisect_then_newton(_consistency_fn, args, left, right, 0.5 * (left + right))
        T_eff = T * entropy.temperature_factor(jnp.exp(logM))
        rho, lam, ok_rho = _solve_tsallis_optx(q, z, keep, T_eff)
        return rho, lam, logM, ok & ok_rho

    rho_c, lam_c, logM_c, ok_c = jax.vmap(refine)(left, right, sign)
    # M0 = nan: least free energy; else the root nearest to M0 in log M
    F = jax.vmap(lambda rho: _free_energy(entropy, rho, z, keep, T))(rho_c)
    score = jnp.where(jnp.isnan(M0), F, jnp.abs(logM_c - jnp.log(M0)))
    score = jnp.where(valid, score, jnp.inf)
    k = jnp.argmin(score)
    return rho_c[k], lam_c[k], ok_c[k]


@eqx.filter_jit
def _solve_optx(entropy, z, keep, T, M0, n_grid):
    if isinstance(entropy, AbstractTsallisShapedEntropy):
        rho, lam, ok = _solve_shaped_optx(entropy, z, keep, T, M0, n_grid)
    else:
        rho, lam, ok = _solve_separable_optx(entropy, z, keep, T)
    T_eff = _T_eff(entropy, rho, T)
    return rho, lam, _R.where(ok, _R.successful, _R.nonlinear_divergence), T_eff


# =========================================================================== scipy path

_EPS = np.finfo(np.float64).eps


def _np_abe_G(q):
    """Abe law. For eps = |ln q| <= 1/2 in the cancellation-free form (s = sinh eps)
    $G = e^{(\\cosh\\epsilon - 1)\\ell}\\sinh(\\epsilon + s\\ell)/s$ (= 1 + l at eps = 0);
    beyond, where q - 1/q >= 1 cannot cancel, as written in MATH.md §2 with q = e^eps (its
    two powers of x stay finite for l >= -700, unlike the product form)."""
    eps = abs(np.log(q))
    if eps == 0.0:
        return lambda x: 1.0 + np.log(x)
    if eps > 0.5:
        q = np.exp(eps)

        def G_direct(x):
            ell = np.log(x)
            return (q * np.exp((q - 1) * ell) - np.exp((1 / q - 1) * ell) / q) / (q - 1 / q)

        return G_direct
    s = np.sinh(eps)
    c = 2.0 * np.sinh(eps / 2) ** 2

    def G(x):
        ell = np.log(x)
        return np.exp(c * ell) * np.sinh(eps + s * ell) / s

    return G


def _np_law(entropy):
    """(G^, G^ inverse or None, G(1)) in numpy, written from the table of MATH.md §2, in the
    shifted gauge G^ = G - G(1) (see the optimistix profiles)."""
    if isinstance(entropy, Shannon):
        return np.log, np.exp, 1.0
    if isinstance(entropy, Tsallis):
        q = float(entropy.q)

        def inv(y):
            # [1 + (q-1) y/q]_+^(1/(q-1)), through log1p: exact as q -> 1
            u = (q - 1) * y / q
            pos = u > -1
            return np.where(pos, np.exp(np.log1p(np.where(pos, u, 0.0)) / (q - 1)), 0.0)

        return (lambda x: q * np.expm1((q - 1) * np.log(x)) / (q - 1)), inv, q / (q - 1)
    if isinstance(entropy, Kaniadakis):
        k = abs(float(entropy.kappa))

        def inv(y):
            w = y + 1.0  # G(x) = w
            root = np.sqrt(k**2 * w**2 + 1 - k**2)
            # k w + root, rationalized for w < 0 (no cancellation in the deep tail)
            num = np.where(w >= 0, k * w + root, (1 - k**2) / (root - k * w))
            return (num / (1 + k)) ** (1 / k)

        def G_hat(x):
            return ((1 + k) * x**k - (1 - k) * x ** (-k)) / (2 * k) - 1.0

        return G_hat, inv, 1.0
    if isinstance(entropy, Burg):
        return (lambda x: 1.0 - 1.0 / x), (lambda y: 1.0 / (1.0 - y)), -1.0
    if isinstance(entropy, Abe):
        G = _np_abe_G(float(entropy.q))
        return (lambda x: G(x) - 1.0), None, 1.0
    # any other separable family: its own (shifted) law through JAX, inverted by brentq

    def G_hat(x):
        return np.asarray(entropy.G_shifted(jnp.asarray(x, jnp.float64)))

    return G_hat, None, float(entropy.G1())


def _np_invert(G, y, flags):
    """$G^{-1}(y)$ componentwise by brentq in l = ln x on [-700, 1] (0 below G(e^-700))."""
    g_lo = G(np.exp(_L_LO))
    out = np.zeros_like(y)
    for i, yi in enumerate(y):
        if yi <= g_lo:
            continue
        target = np.arcsinh(yi)

        def f(ell):
            return np.arcsinh(np.clip(G(np.exp(ell)), -_BIG, _BIG)) - target

        ell, r = scipy.optimize.brentq(
            f, _L_LO, _L_HI, xtol=1e-15, rtol=4 * _EPS, maxiter=200, full_output=True
        )
        flags.append(r.converged)
        out[i] = np.exp(ell)
    return out


def _np_solve_multiplier(law, z, T, flags):
    """brentq for the shifted multiplier nu (T G^(rho_i) = z_i + nu) in the exact bracket;
    component brentq where the law has no closed-form inverse. Returns (rho, lambda)."""
    G_hat, inv, G1 = law
    n = z.size
    zmax = np.max(z)
    nu_hi = T * G_hat(2.0) - zmax
    nu_lo = T * G_hat(1.0 / (2.0 * n)) - zmax

    def profile(nu):
        y = (z + nu) / T
        return inv(y) if inv is not None else _np_invert(G_hat, y, flags)

    def f(nu):
        return np.sum(profile(nu)) - 1.0

    xtol = 1e-2 * _EPS * T  # the relative part (4 eps |nu|) dominates
    nu, r = scipy.optimize.brentq(
        f, nu_lo, nu_hi, xtol=xtol, rtol=4 * _EPS, maxiter=200, full_output=True
    )
    flags.append(r.converged)
    return profile(nu), nu + T * G1


def _np_value(entropy, rho):
    """Renyi / Sharma-Mittal entropy in numpy (for the branch choice)."""
    q = float(entropy.q)
    M = np.sum(rho[rho > 0] ** q)
    if isinstance(entropy, Renyi):
        return np.log(M) / (1 - q)
    r = float(entropy.r)
    return (M ** ((1 - r) / (1 - q)) - 1) / (1 - r)


def _np_phi(entropy, M):
    q = float(entropy.q)
    if isinstance(entropy, Renyi):
        return 1.0 / M
    if isinstance(entropy, SharmaMittal):
        r = float(entropy.r)
        return M ** ((q - r) / (1 - q))
    return float(entropy.temperature_factor(M))


def _np_solve_shaped(entropy, z, T, M0, n_grid, flags):
    q = float(entropy.q)
    law = _np_law(Tsallis(q))
    end = (1 - q) * np.log(z.size)
    lo, hi = min(end, 0.0), max(end, 0.0)

    def solve_at(logM):
        T_eff = T * _np_phi(entropy, np.exp(logM))
        return _np_solve_multiplier(law, z, T_eff, flags)

    def r(logM):
        rho, _ = solve_at(logM)
        return np.log(np.sum(rho[rho > 0] ** q)) - logM

    grid = np.linspace(lo, hi, n_grid)
    rg = np.array([r(x) for x in grid])
    best = None
    for k in range(n_grid - 1):
        if rg[k] * rg[k + 1] > 0:
            continue
        if rg[k] == 0:
            logM = grid[k]
        elif rg[k + 1] == 0:
            logM = grid[k + 1]
        else:
            logM, res = scipy.optimize.brentq(
                r, grid[k], grid[k + 1], xtol=1e-15, rtol=4 * _EPS, maxiter=200,
                full_output=True,
            )
            flags.append(res.converged)
        rho, lam = solve_at(logM)
        if M0 is None:
            score = -np.dot(rho, z) - T * _np_value(entropy, rho)
        else:
            score = abs(logM - np.log(M0))
        if best is None or score < best[0]:
            best = (score, rho, lam)
    return best[1], best[2]


def _solve_scipy(entropy, z, keep, T, M0, n_grid):
    z = np.asarray(z, np.float64)
    keep = np.asarray(keep, bool)
    T = float(T)
    flags: list[bool] = []
    zk = z[keep]
    if isinstance(entropy, AbstractTsallisShapedEntropy):
        rho_k, lam = _np_solve_shaped(entropy, zk, T, M0, n_grid, flags)
    else:
        rho_k, lam = _np_solve_multiplier(_np_law(entropy), zk, T, flags)
    rho = np.zeros_like(z)
    rho[keep] = rho_k
    return rho, lam, all(flags)


# =========================================================================== entry point


def solve_stationary(
    entropy: AbstractEntropy,
    scores,
    T=1.0,
    *,
    method: str = "optimistix",
    mask=None,
    M0=None,
    n_grid: int = 64,
) -> StationarySolution:
    """Solve the fixed-T stationary conditions of MATH.md §2 by direct root finding.

    An independent realization of `fisherdyn.stationary`, meant for cross-checks: it solves
    $T G(\\rho_i) - z_i - \\lambda = 0$ on the support and $\\sum\\rho = 1$ with general-purpose
    root finders (see the module docstring) and is much slower.

    **Arguments:**
    - `entropy`: an entropy family, e.g. `Abe(1.5)`.
    - `scores`: one score vector $z$ of shape (N,) (vmap for batches, `method="optimistix"`).
    - `T`: temperature > 0 (scalar).
    - `method`: `"optimistix"` (JAX; optx.Bisection + optx.Newton; jit/vmap compatible) or
      `"scipy"` (numpy float64; scipy.optimize.brentq).
    - `mask`: boolean (N,), True = keep; masked entries get exactly zero weight.
    - `M0`: Renyi / Sharma-Mittal only: return the self-consistent root whose moment
      $M_q$ is nearest to `M0` (in log M) instead of the branch of least free energy.
    - `n_grid`: Renyi / Sharma-Mittal: number of points of the log-M scan that brackets the
      self-consistent roots (two roots closer than one grid cell may be missed).

    **Returns:** a `StationarySolution(rho, lam, residual, result, T_eff)`. Renyi /
    Sharma-Mittal: by default the root of least free energy
    $F = -\\sum\\rho_i z_i - T S(\\rho)$ among all roots found by the scan.
    """
    _check(entropy, scores, T, mask)
    if method not in ("optimistix", "scipy"):
        raise ValueError(f"method must be 'optimistix' or 'scipy', got {method!r}")
    dtype = jnp.result_type(float)
    z = jnp.asarray(scores, dtype)
    keep = jnp.isfinite(z) if mask is None else jnp.asarray(mask, bool) & jnp.isfinite(z)
    z = eqx.error_if(z, jnp.any(jnp.isnan(z)) | jnp.any(z == jnp.inf), "scores contain NaN/+inf")
    z = eqx.error_if(z, ~jnp.any(keep), "every score is masked: there is no stationary law")
    T = jnp.asarray(T, dtype)
    T = eqx.error_if(T, ~(T > 0) | ~jnp.isfinite(T), "T must be finite and > 0")
    z = jnp.where(keep, z, 0.0)
    if method == "optimistix":
        # parameters as arrays: one compilation per family, whatever the parameter value
        ent = jtu.tree_map(lambda x: jnp.asarray(x, dtype), entropy)
        M0_arr = jnp.asarray(jnp.nan if M0 is None else M0, dtype)
        rho, lam, result, T_eff = _solve_optx(ent, z, keep, T, M0_arr, n_grid)
    else:
        rho, lam, ok = _solve_scipy(entropy, z, keep, T, M0, n_grid)
        rho, lam = jnp.asarray(rho, dtype), jnp.asarray(lam, dtype)
        result = _R.successful if ok else _R.nonlinear_divergence
        T_eff = _T_eff(entropy, rho, T)
    residual = _residual(entropy, rho, z, lam, T_eff)
    return StationarySolution(rho, lam, residual, result, jnp.asarray(T_eff, dtype))
