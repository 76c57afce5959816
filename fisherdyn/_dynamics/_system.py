"""The physical problem of the damped Fisher-Lagrangian dynamics (docs/math.md §6).

The Lagrangian $L = (m/2)\\sum\\dot\\rho_i^2/\\rho_i - F(\\rho) + \\lambda(\\sum\\rho - 1)$ with
Rayleigh dissipation $R = (\\gamma/2)\\sum\\dot\\rho_i^2/\\rho_i$ gives

$$m(\\ddot\\rho_i/\\rho_i - \\tfrac12\\dot\\rho_i^2/\\rho_i^2) + \\gamma\\dot\\rho_i/\\rho_i
  + g_i = \\lambda, \\qquad g_i = E_i - T h_i(\\rho).$$

This module holds what does not depend on a chart: the problem (`FisherSystem`), the forces
$g$, their boundary values, the free energy of a state, and the tangent stiffness of the
sphere equation at a fixed point (used by the relaxation spectrum). The charts that carry
the equations of motion are in `_coordinates.py`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, Bool, Float
from .._entropies import AbstractEntropy

__all__ = [
    "FisherSystem",
    "forces",
    "boundary_forces",
    "free_energy_of",
    "tangent_basis",
    "stiffness_matrix",
]


class FisherSystem(eqx.Module):
    """The physical problem: entropy, scores, temperature, mass and damping.

    Every field is a pytree leaf (the entropy's parameters too), so the same compiled solve
    serves any values: sweeping them does not recompile. `mass = 0` is not allowed here; the
    overdamped flow is selected statically by the solver.

    **Fields:**
    - `entropy`: the family $S$.
    - `scores`: the scores $z$ (the energies are $E = -z$).
    - `T`: the temperature $T > 0$.
    - `mass`: the mass $m$ of the Fisher kinetic term.
    - `damping`: the Rayleigh damping $\\gamma$.
    - `mask`: which keys take part (True), or None for all. A masked key has weight and
      velocity exactly 0 at all times (a zero component is invariant in both charts), and
      its score is stored as 0.
    """

    entropy: AbstractEntropy
    scores: Float[Array, "*batch N"]
    T: Float[Array, "*#batch"]
    mass: Float[Array, "*#batch"]
    damping: Float[Array, "*#batch"]
    mask: Bool[Array, "*#batch N"] | None = None

    @property
    def energies(self) -> Float[Array, "*batch N"]:
        """The energies $E = -z$."""
        return -self.scores


def forces(
    entropy: AbstractEntropy,
    rho: Float[Array, "*batch N"],
    scores: Float[Array, "*batch N"],
    T: Float[Array, "*#batch"],
) -> Float[Array, "*batch N"]:
    """$g_i = E_i - T h_i(\\rho)$, with $h$ evaluated only on the support ($\\rho_i > 0$).

    Off the support the entropic part is set to 0, i.e. $g_i = E_i$. That is the exact
    boundary value for families with a cutoff (Tsallis and Renyi / Sharma-Mittal at q > 1:
    $h(0) = 0$); for the families whose $h$ diverges at 0, the forces only ever enter as
    $x_i g_i$ or $\\rho_i g_i$, which are set to 0 there. The double `where` keeps autodiff
    free of NaN at the boundary.
    """
    pos = rho > 0
    safe = jnp.where(pos, rho, 1.0)
    h = entropy.grad(safe, mask=pos)
    return jnp.where(pos, -scores - T * h, -scores)


def boundary_forces(
    entropy: AbstractEntropy,
    rho: Float[Array, "*batch N"],
    scores: Float[Array, "*batch N"],
    T: Float[Array, "*#batch"],
) -> Float[Array, "*batch N"]:
    """$g_i(\\rho_i \\to 0^+)$ at fixed other weights: $E_i$ for the cutoff families
    (Tsallis / Renyi / Sharma-Mittal with q > 1), $-\\infty$ for the repulsive ones (every other
    family: their $h$ diverges to $+\\infty$ at 0, so the boundary is never a fixed point)."""
    E = -scores
    if entropy.may_have_cutoff:
        return jnp.where(entropy.q > 1, E, -jnp.inf)
    return jnp.full_like(E, -jnp.inf)


def free_energy_of(
    entropy: AbstractEntropy,
    rho: Float[Array, "*batch N"],
    scores: Float[Array, "*batch N"],
    T: Float[Array, "*#batch"],
) -> Float[Array, "*batch"]:
    """$F(\\rho) = \\sum\\rho_i E_i - T S(\\rho)$ (no input checks; used along trajectories)."""
    return -jnp.sum(rho * scores, -1) - T * entropy.value(rho)


def tangent_basis(x: Float[Array, " N"]) -> Float[Array, "N N-1"]:
    """An orthonormal basis (columns) of the tangent space $\\{v : x\\cdot v = 0\\}$ of the unit
    sphere at `x`, from the Householder reflection that maps `x` to $\\pm e_1$."""
    n = x.shape[-1]
    e1 = jnp.zeros(n, x.dtype).at[0].set(1.0)
    s = jnp.where(x[0] >= 0, 1.0, -1.0)
    u = x + s * e1
    H = jnp.eye(n, dtype=x.dtype) - 2 * jnp.outer(u, u) / jnp.sum(u * u)
    return H[:, 1:]


def stiffness_matrix(
    entropy: AbstractEntropy,
    rho: Float[Array, " N"],
    scores: Float[Array, " N"],
    T: Float[Array, ""],
) -> tuple[Float[Array, "N N"], Float[Array, " N"], Float[Array, ""], Bool[Array, " N"]]:
    """The tangent stiffness of the sphere equation at a fixed point $\\rho^*$ (docs/math.md §6).

    Linearizing $4m\\ddot x = 2x(\\lambda - g) - 4\\gamma\\dot x$ about $x^* = \\sqrt{\\rho^*}$:
    $m\\ddot\\delta + \\gamma\\dot\\delta + K\\delta = 0$ on the tangent space, with
    $K = P[\\tfrac12\\mathrm{diag}(g - \\lambda) + D_x\\,\\partial g/\\partial\\rho\\,D_x]P$,
    $P = I - x^*x^{*T}$. On the support $g = \\lambda$ and the second term is
    $T\\,\\mathrm{diag}(\\rho G'(\\rho))$ for separable families (plus the rank-one moment
    coupling for Renyi / Sharma-Mittal); an inactive component ($x_i^* = 0$) decouples with
    stiffness $(g_i(0) - \\lambda)/2$.

    **Returns:** `(K, x*, lambda, active)`.
    """
    active = rho > 0
    x = jnp.sqrt(rho)
    g = forces(entropy, rho, scores, T)
    lam = jnp.sum(jnp.where(active, rho * g, 0.0))

    def g_on_support(r):
        safe = jnp.where(active, r, 1.0)
        return -scores - T * entropy.grad(safe, mask=active)

    Hg = jax.jacfwd(g_on_support)(rho)
    Hg = jnp.where(active[:, None] & active[None, :], Hg, 0.0)
    Hg = 0.5 * (Hg + Hg.T)
    core = x[:, None] * Hg * x[None, :] + jnp.diag(jnp.where(active, 0.0, 0.5 * (g - lam)))
    P = jnp.eye(rho.shape[-1], dtype=rho.dtype) - jnp.outer(x, x)
    return P @ core @ P, x, lam, active
