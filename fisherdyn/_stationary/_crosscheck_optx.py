"""The optimistix cross-check of the stationary map: every root by `optx.Bisection` then an
`optx.Newton` polish clipped to the bracket, the separable component laws inverted
numerically from `entropy.G_shifted` alone (no closed forms), the Tsallis profile of Renyi /
Sharma-Mittal by its closed form. jit/vmap compatible; derivatives come from the implicit
function theorem at the solution (custom JVPs of the component and multiplier solves,
docs/math.md §3, and optimistix's implicit adjoint for log M), no iteration is unrolled.
Shares no code with the fast operator.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import optimistix as optx

from .._entropies import AbstractSeparableEntropy, AbstractTsallisShapedEntropy
from ._solution import no_algorithm

_L_LO = -700.0  # exp(-700) ~ 1e-304: weights below this are reported as exact zeros
_L_HI = 1.0
_BIG = 1e300
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
    """Closed-form Tsallis profile (docs/math.md §2) in the shifted gauge:
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
    # Differentiate T G^(rho_i) = z_i + nu, sum rho = 1 (docs/math.md §3) so that Newton polishes
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
def solve_optx(entropy, z, keep, T, M0, n_grid):
    """(rho, lambda, ok, T_eff) of one score vector (`M0 = nan`: least free energy)."""
    rho, lam, ok = _solve_optx(entropy, z, keep, T, M0, n_grid)
    return rho, lam, ok, entropy.effective_temperature(T, rho)


@functools.singledispatch
def _solve_optx(entropy, z, keep, T, M0, n_grid):
    """(rho, lambda, ok) of one score vector, by the algorithm of the family's base class."""
    raise no_algorithm("cross-check", entropy)


@_solve_optx.register
def _(entropy: AbstractSeparableEntropy, z, keep, T, M0, n_grid):
    return _solve_separable_optx(entropy, z, keep, T)


@_solve_optx.register
def _(entropy: AbstractTsallisShapedEntropy, z, keep, T, M0, n_grid):
    return _solve_shaped_optx(entropy, z, keep, T, M0, n_grid)
