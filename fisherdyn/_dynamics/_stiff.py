"""The stiff path of `relax`: the sphere chart's Jacobian as per-key blocks plus low rank,
and an ESDIRK step (Diffrax's Kvaerno tableaus) whose Newton systems are solved with it.

The sphere chart's field couples the keys only through a few scalars: the multiplier
$\\lambda$ and, for Renyi / Sharma-Mittal, the self-consistent temperature $T_{eff}$
(docs/math.md §6). Written as $f(y) = F(y, s(y))$ with $F$ acting key by key at fixed $s$,
its Jacobian is

$$J = L + P W^T, \\qquad L = \\partial_y F|_s \\ \\text{(one } n\\times n \\text{ block per key)},
\\quad P = \\partial_s F, \\quad W = \\nabla s,$$

with $n$ = 2 for the inertial chart $(x, v)$, 1 for the overdamped one, and $k$ = 1 or 2
columns in $P$ and $W$. An implicit stage's Newton matrix $I - cJ$ is then solved in $O(N)$
by the Woodbury identity (a $k\\times k$ capacitance system), where a dense factorization
of a block of B problems would cost $O((nBN)^3)$.

The step is written out here rather than taken from Diffrax's `Kvaerno5.step` because
Diffrax's root finders see the stage equation as an opaque function (and materialize its
Jacobian), and each stage's solve is an Optimistix loop with its own bookkeeping; Diffrax
still runs the integration loop, the step-size controller and the steady-state event.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._custom_types import Array, Float
from ._coordinates import SphereCoordinates
from ._system import FisherSystem, forces

__all__ = [
    "split_field", "linearize", "factorize", "apply_inverse", "structured_solve", "is_esdirk",
    "esdirk_step",
]


def _couples_through_moment(entropy) -> bool:
    # a separable family is its own stationary law; the others have a self-consistent T_eff
    return entropy.stationary_law() is not entropy


def split_field(overdamped: bool):
    """The sphere chart's field as `(s, F)`: `s(y, system)` the scalars that couple the keys,
    `F(y, s, system)` the field key by key at fixed `s`; `F(y, s(y)) = f(y)`."""

    def temperature(rho, system):
        entropy = system.entropy
        if not _couples_through_moment(entropy):
            return jnp.asarray(system.T, rho.dtype)
        pos = rho > 0
        return entropy.effective_temperature(system.T, jnp.where(pos, rho, 0.0), mask=pos)

    def local_forces(rho, T_eff, system):
        law = system.entropy.stationary_law()
        return forces(law, rho, system.scores, T_eff)

    coords = SphereCoordinates()

    def couplings(lam, T_eff, system):
        if _couples_through_moment(system.entropy):
            return jnp.stack([lam, T_eff])
        return lam[None]

    def fixed_temperature(s, system):
        return s[1] if s.shape[0] > 1 else system.T

    if overdamped:

        def s(x, system):
            rho = x * x
            T_eff = temperature(rho, system)
            g = local_forces(rho, T_eff, system)
            return couplings(coords.overdamped_multiplier_for_forces(x, rho, g, system), T_eff,
                             system)

        def F(x, s, system):
            rho = x * x
            g = local_forces(rho, fixed_temperature(s, system), system)
            return coords.overdamped_velocity(x, rho, g, s[0], system)

        return s, F

    def s(y, system):
        x, v = y
        rho = x * x
        T_eff = temperature(rho, system)
        g = local_forces(rho, T_eff, system)
        return couplings(coords.multiplier_for_forces(x, v, rho, g, system), T_eff, system)

    def F(y, s, system):
        x, v = y
        rho = x * x
        g = local_forces(rho, fixed_temperature(s, system), system)
        return v, coords.acceleration(x, v, rho, g, s[0], system)

    return s, F


class Linearization(eqx.Module):
    """$J = L + PW^T$ of one problem, the state's leaves stacked: `L` (n, n, N) with
    `L[i, j]` $= \\partial F_i/\\partial y_j$ key by key, `P` (n, N, k), `W` (k, n, N)."""

    L: Float[Array, "n n N"]
    P: Float[Array, "n N k"]
    W: Float[Array, "k n N"]


def _stack(tree):
    return jnp.stack(jtu.tree_leaves(tree))


def linearize(y, system: FisherSystem, overdamped: bool) -> Linearization:
    """The structured Jacobian of the sphere chart's field at the state `y` (one problem):
    one forward pass per state leaf, $k$ forward passes through the couplings and $k$
    reverse passes through the couplings' own computation."""
    s_fn, F = split_field(overdamped)
    leaves, treedef = jtu.tree_flatten(y)
    s = s_fn(y, system)
    rows = []
    for j in range(len(leaves)):
        tangent = jtu.tree_unflatten(
            treedef, [jnp.ones_like(a) if i == j else jnp.zeros_like(a) for i, a in enumerate(leaves)]
        )
        _, dF = jax.jvp(lambda y_: F(y_, s, system), (y,), (tangent,))
        rows.append(_stack(dF))  # dF_i / dy_j for every i, key by key
    L = jnp.stack(rows, 1)
    P = _stack(jax.jacfwd(lambda s_: F(y, s_, system))(s))
    W = jnp.moveaxis(_stack(jax.jacrev(lambda y_: s_fn(y_, system))(y)), 0, 1)
    return Linearization(L, P, W)


class Factorization(eqx.Module):
    """$(I - cJ)^{-1}$ of one problem, ready to apply: the per-key inverses of
    $I - cL$ (`inv`, (n, n, N)), $A^{-1}U$ with $U = cP$ (`AinvU`, (n, N, k)), $W$, and the
    inverse of the Woodbury capacitance matrix $I_k - W^T A^{-1} U$ (`cap_inv`, (k, k))."""

    inv: Float[Array, "n n N"]
    AinvU: Float[Array, "n N k"]
    W: Float[Array, "k n N"]
    cap_inv: Float[Array, "k k"]


def _apply_blocks(inv, b):
    """Key by key $A^{-1}b$ for b of shape (n, N, ...)."""
    ex = (Ellipsis,) + (None,) * (b.ndim - 2)
    n = inv.shape[0]
    return jnp.stack([
        sum(inv[i, j][ex] * b[j] for j in range(n)) for i in range(n)
    ])


def _small_inverse(M):
    """The inverse of a 1x1 or 2x2 matrix whose entries are arrays of one shape, in closed
    form (a batched LAPACK call per tiny matrix costs more than the whole solve)."""
    if M.shape[0] == 1:
        return 1.0 / M
    det = M[0, 0] * M[1, 1] - M[0, 1] * M[1, 0]
    return jnp.stack([jnp.stack([M[1, 1], -M[0, 1]]), jnp.stack([-M[1, 0], M[0, 0]])]) / det


def factorize(lin: Linearization, c) -> Factorization:
    """Prepare $(I - cJ)^{-1}$ for one problem: $O(N)$."""
    n = lin.L.shape[0]
    A = jnp.eye(n, dtype=lin.L.dtype)[:, :, None] - c * lin.L
    inv = _small_inverse(A)
    AinvU = _apply_blocks(inv, c * lin.P)
    k = AinvU.shape[-1]
    # W^T A^{-1} U, k x k
    WtAU = jnp.stack([
        jnp.stack([jnp.sum(lin.W[a] * AinvU[..., b]) for b in range(k)]) for a in range(k)
    ])
    cap_inv = _small_inverse(jnp.eye(k, dtype=lin.L.dtype) - WtAU)
    return Factorization(inv, AinvU, lin.W, cap_inv)


def apply_inverse(fac: Factorization, r: Float[Array, "n N"]) -> Float[Array, "n N"]:
    """$(I - cJ)^{-1} r$ by the Woodbury identity: $A^{-1}r + A^{-1}U\\,C^{-1}W^TA^{-1}r$."""
    Ainv_r = _apply_blocks(fac.inv, r)
    k = fac.cap_inv.shape[0]
    proj = [jnp.sum(fac.W[a] * Ainv_r) for a in range(k)]
    coef = [sum(fac.cap_inv[b, a] * proj[a] for a in range(k)) for b in range(k)]
    return Ainv_r + sum(fac.AinvU[..., b] * coef[b] for b in range(k))


def structured_solve(lin: Linearization, c, r: Float[Array, "n N"]) -> Float[Array, "n N"]:
    """$(I - cJ)^{-1} r$ for one problem: per-key $n\\times n$ inverses and the Woodbury
    identity for the rank-$k$ part."""
    return apply_inverse(factorize(lin, c), r)


def is_esdirk(solver) -> bool:
    """Whether `solver` is one of Diffrax's ESDIRK methods (Kvaerno3/4/5): an explicit first
    stage, then implicit stages sharing one diagonal coefficient."""
    tableau = getattr(solver, "tableau", None)
    if not isinstance(solver, diffrax.AbstractImplicitSolver) or not isinstance(
        tableau, diffrax.ButcherTableau
    ):
        return False
    diag = np.asarray(tableau.a_diagonal)
    return diag[0] == 0 and np.all(diag[1:] == diag[1]) and tableau.a_predictor is not None


def esdirk_step(
    tableau: diffrax.ButcherTableau, vf, lin, t0, t1, z0, f0, rtol, atol, kappa=0.1,
    max_iters=8,
):
    """One ESDIRK step of a block of problems, stage by stage, each implicit stage solved by
    a chord iteration with the structured Newton matrix $I - \\gamma\\,dt\\,J(z_0)$.

    Returns `(z1, error, f1, converged)`. The iteration of a stage stops when Hairer &
    Wanner's estimate of its remaining error, $\\eta\\,\\|\\delta\\|$ with
    $\\eta = \\theta/(1-\\theta)$ and $\\theta$ the contraction rate, is below `kappa` in
    each problem's error scale (on the stage state, $\\gamma\\,dt\\,\\delta$); $\\eta$ carries
    over from the previous stage, so a stage whose first correction is already small stops
    after one. A step whose iteration diverges or does not stop within `max_iters` is
    reported not converged (the caller rejects it).
    """
    dt = t1 - t0
    gdt = float(tableau.a_diagonal[1]) * dt
    fac = jax.vmap(factorize, in_axes=(0, None))(lin, gdt)
    solve = jax.vmap(apply_inverse, in_axes=(0, 1), out_axes=1)
    treedef = jtu.tree_structure(z0)
    unflat = lambda a: jtu.tree_unflatten(treedef, list(a))  # noqa: E731

    def size(delta, z):
        return jnp.max(jnp.abs(gdt * delta) / (atol + rtol * jnp.abs(z)))

    stages = len(tableau.c) + 1
    # the tableau's rows padded to all stages: one traced stage body, looped (`lax.scan`),
    # compiles faster than the stages written out
    A = np.zeros((stages - 1, stages))
    pred = np.zeros((stages - 1, stages))
    for i, (a, p) in enumerate(zip(tableau.a_lower, tableau.a_predictor)):
        A[i, : len(a)] = a
        pred[i, : len(p)] = p
    f0 = _stack(f0)
    z0s = _stack(z0)
    fs = jnp.zeros((stages,) + f0.shape, f0.dtype).at[0].set(f0)

    def stage(carry, row):
        fs, eta, ok = carry
        i, a, p, c = row
        # the stage's known part and its predicted f in one pass over the stage buffer
        known, guess = jnp.tensordot(jnp.stack([a, p]).astype(fs.dtype), fs, 1)
        partial = z0s + dt * known
        ti = t0 + c.astype(dt.dtype) * dt

        def body(carry):
            f, eta, prev, it, _, _ = carry
            z = partial + gdt * f
            residual = f - _stack(vf(ti, unflat(z)))
            delta = solve(fac, residual)
            f = f - delta
            d = size(delta, z)
            theta = d / prev
            eta = jnp.where(it > 0, theta / (1 - theta), eta)
            done = (eta * d <= kappa) | (d == 0)
            bad = (it > 0) & ((theta >= 1) | ~jnp.isfinite(d))
            return f, eta, d, it + 1, done, bad

        def cond(carry):
            _, _, _, it, done, bad = carry
            return ~done & ~bad & (it < max_iters)

        init = (guess, jnp.maximum(eta, 1e-4) ** 0.8, jnp.asarray(jnp.inf, dt.dtype),
                jnp.array(0), jnp.zeros((), bool), jnp.zeros((), bool))
        f, eta, _, _, done, bad = jax.lax.while_loop(cond, body, init)
        return (fs.at[i].set(f), eta, ok & done & ~bad), None

    rows = (jnp.arange(1, stages), jnp.asarray(A), jnp.asarray(pred),
            jnp.asarray(np.asarray(tableau.c, float)))
    init = (fs, jnp.ones((), dt.dtype), jnp.ones((), bool))
    (fs, _, ok), _ = jax.lax.scan(stage, init, rows)
    z1 = z0s + dt * jnp.tensordot(jnp.asarray(np.asarray(tableau.b_sol, float), fs.dtype), fs, 1)
    error = dt * jnp.tensordot(jnp.asarray(np.asarray(tableau.b_error, float), fs.dtype), fs, 1)
    # FSAL: the last stage is the end point, and its f the field there
    return unflat(z1), unflat(error), unflat(fs[-1]), ok
