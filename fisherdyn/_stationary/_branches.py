"""Every self-consistent branch of a Renyi / Sharma-Mittal map: a scan of the consistency
equation $M = M_q(\\mathrm{Tsallis}(z, T\\phi(M)))$ over the whole range of $M$, each sign
change polished by a bracketed Newton in $\\log M$."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, Bool, Float, Mask, Temperature
from .._entropies import AbstractEntropy, AbstractSeparableEntropy, AbstractTsallisShapedEntropy
from .._misc import check_entropy
from ._checks import call_checked, prepare
from ._operator import _free_energy_unchecked, _solve
from ._separable import _solve_separable
from ._shaped import _log_moment
from ._solution import no_algorithm


class Branch(NamedTuple):
    """One valid branch of `stationary_branches`: weights, moment $M_q$, effective
    temperature, free energy, and whether the damped dynamics can settle on it."""

    rho: np.ndarray
    M: float
    T_eff: float
    free_energy: float
    stable: bool


class Branches(eqx.Module):
    """Every self-consistent solution of a Renyi / Sharma-Mittal map.

    Iterating yields the valid branches as `Branch` records and `len()` counts them (both
    need concrete values, not tracers). The padded arrays stay available for `vmap` and
    `jit`: `valid[k]` marks real branches; `rho[k]`, `M[k]` (the moment $M_q$), `T_eff[k]`,
    `free_energy[k]` and `stable[k]` (a minimum of the dual in M, i.e. a downward crossing
    of the consistency residual: the branches the damped dynamics can settle on).
    """

    rho: Float[Array, "K N"]
    M: Float[Array, " K"]
    T_eff: Float[Array, " K"]
    free_energy: Float[Array, " K"]
    stable: Bool[Array, " K"]
    valid: Bool[Array, " K"]

    @property
    def count(self):
        """The number of valid branches (an array; works under `jit` and `vmap`)."""
        return jnp.sum(self.valid, -1)

    def _valid_indices(self):
        valid = np.asarray(self.valid)
        if valid.ndim != 1:
            raise ValueError("iterate over the Branches of one score vector (valid of shape (K,))")
        return np.flatnonzero(valid)

    def __len__(self) -> int:
        return len(self._valid_indices())

    def __iter__(self) -> Iterator[Branch]:
        rho, M, T_eff = np.asarray(self.rho), np.asarray(self.M), np.asarray(self.T_eff)
        F, stable = np.asarray(self.free_energy), np.asarray(self.stable)
        T_eff = np.broadcast_to(T_eff, M.shape)
        for k in self._valid_indices():
            yield Branch(rho[k], float(M[k]), float(T_eff[k]), float(F[k]), bool(stable[k]))


def stationary_branches(
    entropy: AbstractEntropy,
    scores: Float[ArrayLike, " N"],
    T: Temperature = 1.0,
    *,
    mask: Mask | None = None,
    n_grid: int = 512,
) -> Branches:
    """Every self-consistent solution of the fixed-T map, each with its M and free energy.

    The consistency equation $M = M_q(\\mathrm{Tsallis}(z, T\\phi(M)))$ is scanned over its
    whole range $M \\in [N^{1-q}, 1]$ (or $[1, N^{1-q}]$ for q < 1) on `n_grid` points in
    log M, every sign change is bracketed and polished. For fixed-scale families there is
    exactly one branch.

    **Arguments:** `entropy`, one score vector of shape (N,), a scalar `T`, `mask` as in
    `stationary`; `n_grid`: points of the scan.

    **Returns:** `Branches`, padded to `n_grid - 1` slots (one for fixed-scale families):
    `for b in stationary_branches(...)` visits the valid ones.
    """
    check_entropy(entropy)
    return call_checked(_branches_jit, entropy, scores, T, mask, n_grid)


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


@eqx.filter_jit
def _branches_jit(entropy, scores, T, mask, n_grid):
    z, keep, T, empty = prepare(scores, T, mask, -1)
    if z.ndim != 1:
        raise ValueError("stationary_branches takes one score vector (shape (N,))")
    return _branches(entropy, z, keep, T, n_grid)


@functools.singledispatch
def _branches(entropy, z, keep, T, n_grid):
    """Every branch of one prepared score vector, by the family's base class."""
    raise no_algorithm("branch scan", entropy)


@_branches.register
def _(entropy: AbstractSeparableEntropy, z, keep, T, n_grid):
    # a separable law has one stationary point
    rho, T_eff = _solve(entropy, z, keep, T)
    F = _free_energy_unchecked(entropy, rho, z, T, mask=keep)
    M = jnp.sum(rho**2)
    return Branches(rho[None], M[None], T_eff, F[None], jnp.array([True]), jnp.array([True]))


@_branches.register
def _(entropy: AbstractTsallisShapedEntropy, z, keep, T, n_grid):
    logM, rho_g, nu_g, r = _scan_consistency(entropy, z, keep, T, n_grid)
    r = r[..., 0]
    # r >= 0 at the range's first end (M_q >= N^(1-q) for q > 1, >= 1 for q < 1), with
    # equality at a uniform profile (all scores tied): a root there must not be lost to the
    # residual's rounding
    r = r.at[0].set(jnp.maximum(r[0], jnp.finfo(r.dtype).tiny))
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
        collapsed = (hi - lo) <= 8 * eps * (1 + jnp.abs(x))
        done_n = done | (jnp.abs(r_n) <= 64 * eps) | small | collapsed
        pick = lambda new, old: jnp.where(done, old, new)  # noqa: E731
        return (it + 1, x_new, lo, hi, pick(nu_n, nu), pick(r_n, r), pick(dr_n, dr),
                pick(rho_n, rho), done_n)

    s = (jnp.array(0), x0, lo, hi, jnp.broadcast_to(nu0, x0.shape), nan, nan, rho0,
         jnp.zeros(x0.shape, bool))
    out = jax.lax.while_loop(cond, body, s)
    return out[7], out[1]
