"""Damped Fisher-Lagrangian dynamics of attention weights (MATH.md section 6).

The Lagrangian $L = (m/2)\\sum\\dot\\rho_i^2/\\rho_i - F(\\rho) + \\lambda(\\sum\\rho - 1)$ with
Rayleigh dissipation $R = (\\gamma/2)\\sum\\dot\\rho_i^2/\\rho_i$ gives

$$m(\\ddot\\rho_i/\\rho_i - \\tfrac12\\dot\\rho_i^2/\\rho_i^2) + \\gamma\\dot\\rho_i/\\rho_i
  + g_i = \\lambda, \\qquad g_i = E_i - T h_i(\\rho).$$

Two charts carry it:

- `SphereCoordinates` ($\\rho_i = x_i^2$; the Fisher metric is 4 x Euclidean on the unit
  sphere): smooth through the boundary, the default. Sparse (Tsallis, q > 1) fixed points are
  reached, and with inertia a component may cross $x_i = 0$ ($x_i \\to -x_i$ is the same
  $\\rho$).
- `SimplexCoordinates` (the weights themselves): the textbook form, for comparison. It is
  singular where a weight reaches zero in finite time (the inertial replicator is not
  well-posed there: Laraki & Mertikopoulos, SIAM J. Control Optim. 2015), so it carries a
  boundary event.

With `mass = 0` each chart has its own first-order overdamped system, the replicator
equation $\\gamma\\dot\\rho_i = \\rho_i(\\lambda - g_i)$ (the Fisher-Rao gradient flow of F).

The multiplier is written for an arbitrary state so that the constraint is preserved
exactly where the chart allows it: in the simplex chart $\\sum\\ddot\\rho \\equiv 0$, so an
explicit Runge-Kutta method keeps $\\sum\\rho = 1$ to round-off (linear invariant); in the
sphere chart $c = \\sum x^2$ obeys $\\ddot c + 2a\\dot c + a^2(c - 1) = 0$, a critically damped
return to the sphere that vanishes identically on it (so it changes nothing there).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._entropies import AbstractEntropy, AbstractTsallisShapedEntropy, Tsallis

__all__ = [
    "FisherSystem",
    "AbstractCoordinates",
    "SphereCoordinates",
    "SimplexCoordinates",
    "forces",
    "boundary_forces",
    "free_energy_of",
]


class FisherSystem(eqx.Module):
    """The physical problem: entropy, scores, temperature, mass and damping.

    Every field is a pytree leaf (the entropy's parameters too), so the same compiled solve
    serves any values: sweeping them does not recompile. `mass = 0` is not allowed here; the
    overdamped flow is selected statically by the solver (see `overdamped`).
    """

    entropy: AbstractEntropy
    scores: Array
    T: Array
    mass: Array
    damping: Array

    @property
    def energies(self):
        return -self.scores


def forces(entropy: AbstractEntropy, rho, scores, T):
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


def may_have_cutoff(entropy: AbstractEntropy) -> bool:
    """Whether the family can put keys at exactly zero weight (Tsallis and Renyi /
    Sharma-Mittal, at q > 1); static, decided by the family alone."""
    return type(entropy).may_have_cutoff


def boundary_forces(entropy: AbstractEntropy, rho, scores, T):
    """$g_i(\\rho_i \\to 0^+)$ at fixed other weights: $E_i$ for the cutoff families
    (Tsallis / Renyi / Sharma-Mittal with q > 1), $-\\infty$ for the repulsive ones (every other
    family: their $h$ diverges to $+\\infty$ at 0, so the boundary is never a fixed point)."""
    E = -scores
    if may_have_cutoff(entropy):
        return jnp.where(entropy.q > 1, E, -jnp.inf)
    return jnp.full_like(E, -jnp.inf)


def free_energy_of(entropy: AbstractEntropy, rho, scores, T):
    """$F(\\rho) = \\sum\\rho_i E_i - T S(\\rho)$ (no input checks; used along trajectories)."""
    return -jnp.sum(rho * scores, -1) - T * entropy.value(rho)


def _x_times(x, rho, g):
    """$x_i g_i$, exactly 0 on the boundary whatever $g_i$ does there."""
    return jnp.where(rho > 0, x * g, 0.0)


class AbstractCoordinates(eqx.Module):
    """A chart for the dynamics. The state is `(position, velocity)` for the inertial system
    and `position` alone for the overdamped flow.

    **Methods:** `from_simplex(rho, rho_dot)` builds the initial state, `vector_field(t, y,
    system)` / `overdamped_field(t, y, system)` are the ODEs, `observe(y, system,
    overdamped)` returns $(\\rho, \\dot\\rho, \\lambda, H)$.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def from_simplex(self, rho, rho_dot):
        """The chart's state for weights `rho` and velocity `rho_dot` (None: overdamped)."""

    @abc.abstractmethod
    def vector_field(self, t, y, system: FisherSystem):
        """Inertial system, $m > 0$."""

    @abc.abstractmethod
    def overdamped_field(self, t, y, system: FisherSystem):
        """The replicator flow, $m = 0$, $\\gamma > 0$."""

    @abc.abstractmethod
    def observe(self, y, system: FisherSystem, overdamped: bool):
        """$(\\rho, \\dot\\rho, \\lambda, H)$ of a state (any leading batch axes)."""


class SphereCoordinates(AbstractCoordinates):
    """$\\rho_i = x_i^2$: $4m\\ddot x_i = 2x_i(\\lambda - g_i) - 4\\gamma\\dot x_i$,
    $\\lambda = \\sum x_i^2 g_i - 2m\\sum\\dot x_i^2$ on the sphere (MATH.md §6).

    Off the sphere (integration error) $\\lambda$ gains terms that pull $c = \\sum x^2$ back
    with rate $a = \\gamma/(2m) + \\sqrt{T/m}$, critically damped; they vanish on it. The
    reported weights are $\\rho = x^2/c$ (the nearest point of the ray), so $\\sum\\rho = 1$ and
    $\\rho \\ge 0$ to round-off; the drift $|c - 1|$ is reported separately.
    """

    name: ClassVar[str] = "sphere"

    def from_simplex(self, rho, rho_dot):
        x = jnp.sqrt(rho)
        if rho_dot is None:
            return x
        # x_dot = rho_dot / (2 x); rho_dot must vanish where rho does (checked by the caller)
        v = jnp.where(x > 0, rho_dot / (2 * jnp.where(x > 0, x, 1.0)), 0.0)
        return x, v

    @staticmethod
    def _rate(system):
        return system.damping / (2 * system.mass) + jnp.sqrt(system.T / system.mass)

    def multiplier(self, x, v, system):
        m, gam = system.mass, system.damping
        rho = x * x
        g = forces(system.entropy, rho, system.scores, system.T)
        c = jnp.sum(rho, -1)
        xg = jnp.sum(x * _x_times(x, rho, g), -1)
        a = self._rate(system)
        xv = jnp.sum(x * v, -1)
        lam = (
            xg - 2 * m * jnp.sum(v * v, -1) + (2 * gam - 4 * m * a) * xv - m * a**2 * (c - 1)
        ) / c
        return lam, g, rho

    def vector_field(self, t, y, system):
        x, v = y
        lam, g, rho = self.multiplier(x, v, system)
        acc = (2 * (lam * x - _x_times(x, rho, g)) - 4 * system.damping * v) / (4 * system.mass)
        return v, acc

    def overdamped_multiplier(self, x, system):
        rho = x * x
        g = forces(system.entropy, rho, system.scores, system.T)
        c = jnp.sum(rho, -1)
        a = system.T / system.damping
        lam = (jnp.sum(x * _x_times(x, rho, g), -1) - system.damping * a * (c - 1)) / c
        return lam, g, rho

    def overdamped_field(self, t, y, system):
        lam, g, rho = self.overdamped_multiplier(y, system)
        return (lam * y - _x_times(y, rho, g)) / (2 * system.damping)

    def observe(self, y, system, overdamped):
        if overdamped:
            x = y
            v = self.overdamped_field(None, x, system)
            lam, _, _ = self.overdamped_multiplier(x, system)
            kinetic = jnp.zeros_like(lam)
        else:
            x, v = y
            lam, _, _ = self.multiplier(x, v, system)
            kinetic = 2 * system.mass * jnp.sum(v * v, -1)
        c = jnp.sum(x * x, -1, keepdims=True)
        rho = x * x / c
        rho_dot = 2 * x * v / c - x * x * 2 * jnp.sum(x * v, -1, keepdims=True) / c**2
        H = kinetic + free_energy_of(system.entropy, rho, system.scores, system.T)
        return rho, rho_dot, lam, H

    def constraint_drift(self, y, overdamped):
        x = y if overdamped else y[0]
        return jnp.abs(jnp.sum(x * x, -1) - 1)

    def weights_and_multiplier(self, y, system, overdamped):
        """$(\\rho, \\lambda)$ only (cheaper than `observe`)."""
        if overdamped:
            x = y
            lam, _, _ = self.overdamped_multiplier(x, system)
        else:
            x, v = y
            lam, _, _ = self.multiplier(x, v, system)
        return x * x / jnp.sum(x * x, -1, keepdims=True), lam


class SimplexCoordinates(AbstractCoordinates):
    """The weights themselves: $\\ddot\\rho_i = [\\rho_i(\\lambda - g_i) - \\gamma\\dot\\rho_i]/m
    + \\dot\\rho_i^2/(2\\rho_i)$ with $\\lambda$ chosen so that $\\sum\\ddot\\rho \\equiv 0$.

    Singular where a weight reaches 0 in finite time; `boundary_event` stops the solve
    before that happens (see `_simulate.simulate`).
    """

    name: ClassVar[str] = "simplex"

    def from_simplex(self, rho, rho_dot):
        return rho if rho_dot is None else (rho, rho_dot)

    @staticmethod
    def _kinetic_terms(rho, rho_dot):
        pos = rho > 0
        return jnp.where(pos, rho_dot**2 / jnp.where(pos, rho, 1.0), 0.0)

    def multiplier(self, rho, rho_dot, system):
        m, gam = system.mass, system.damping
        g = forces(system.entropy, rho, system.scores, system.T)
        w = self._kinetic_terms(rho, rho_dot)
        rg = jnp.sum(jnp.where(rho > 0, rho * g, 0.0), -1)
        lam = (rg + gam * jnp.sum(rho_dot, -1) - 0.5 * m * jnp.sum(w, -1)) / jnp.sum(rho, -1)
        return lam, g, w

    def vector_field(self, t, y, system):
        rho, rho_dot = y
        lam, g, w = self.multiplier(rho, rho_dot, system)
        drive = jnp.where(rho > 0, rho * (lam - g), 0.0)
        acc = (drive - system.damping * rho_dot) / system.mass + 0.5 * w
        return rho_dot, acc

    def overdamped_multiplier(self, rho, system):
        g = forces(system.entropy, rho, system.scores, system.T)
        lam = jnp.sum(jnp.where(rho > 0, rho * g, 0.0), -1) / jnp.sum(rho, -1)
        return lam, g

    def overdamped_field(self, t, y, system):
        lam, g = self.overdamped_multiplier(y, system)
        return jnp.where(y > 0, y * (lam - g), 0.0) / system.damping

    def observe(self, y, system, overdamped):
        if overdamped:
            rho = y
            rho_dot = self.overdamped_field(None, rho, system)
            lam, _ = self.overdamped_multiplier(rho, system)
            kinetic = jnp.zeros_like(lam)
        else:
            rho, rho_dot = y
            lam, _, w = self.multiplier(rho, rho_dot, system)
            kinetic = 0.5 * system.mass * jnp.sum(w, -1)
        H = kinetic + free_energy_of(system.entropy, rho, system.scores, system.T)
        return rho, rho_dot, lam, H

    def constraint_drift(self, y, overdamped):
        rho = y if overdamped else y[0]
        return jnp.abs(jnp.sum(rho, -1) - 1)

    @staticmethod
    def boundary_hit(y, system, boundary_tol):
        """True once a weight is within `boundary_tol` of 0 and heading there in finite time.

        An exponential approach (a fixed point on or near the boundary) has a constant
        chart time-to-boundary $2\\rho_i/|\\dot\\rho_i| = 2/\\text{rate}$; a finite-time hit
        has it shrinking to 0 at finite sphere speed
        $|\\dot x_i| = |\\dot\\rho_i|/(2\\sqrt{\\rho_i})$. The event fires when it falls
        below $0.1\\sqrt{m/T}$, far below every linear time scale of a Shannon-like mode.
        """
        rho, rho_dot = y
        tau = 0.1 * jnp.sqrt(system.mass / system.T)
        approaching = rho_dot < 0
        close = rho < boundary_tol
        fast = 2 * rho < -rho_dot * tau
        bad = ~jnp.all(jnp.isfinite(rho)) | ~jnp.all(jnp.isfinite(rho_dot))
        return jnp.any(close & approaching & fast) | bad


def tangent_basis(x):
    """An orthonormal basis (columns) of the tangent space $\\{v : x\\cdot v = 0\\}$ of the unit
    sphere at `x`, from the Householder reflection that maps `x` to $\\pm e_1$."""
    n = x.shape[-1]
    e1 = jnp.zeros(n, x.dtype).at[0].set(1.0)
    s = jnp.where(x[0] >= 0, 1.0, -1.0)
    u = x + s * e1
    H = jnp.eye(n, dtype=x.dtype) - 2 * jnp.outer(u, u) / jnp.sum(u * u)
    return H[:, 1:]


def stiffness_matrix(entropy: AbstractEntropy, rho, scores, T):
    """The tangent stiffness of the sphere equation at a fixed point $\\rho^*$ (MATH.md §6).

    Linearizing $4m\\ddot x = 2x(\\lambda - g) - 4\\gamma\\dot x$ about $x^* = \\sqrt{\\rho^*}$:
    $m\\ddot\\delta + \\gamma\\dot\\delta + K\\delta = 0$ on the tangent space, with
    $K = P[\\tfrac12\\mathrm{diag}(g - \\lambda) + D_x\\,\\partial g/\\partial\\rho\\,D_x]P$,
    $P = I - x^*x^{*T}$. On the support $g = \\lambda$ and the second term is
    $T\\,\\mathrm{diag}(\\rho G'(\\rho))$ for separable families (plus the rank-one moment
    coupling for Renyi / Sharma-Mittal); an inactive component ($x_i^* = 0$) decouples with
    stiffness $(g_i(0) - \\lambda)/2$. Returns (K, x*, lambda, active).
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
