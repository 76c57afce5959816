"""Charts that carry the damped Fisher-Lagrangian dynamics (docs/math.md §6).

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
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, Bool, Float, PyTree
from .._results import RESULTS
from ._system import FisherSystem, forces, free_energy_of

__all__ = [
    "AbstractCoordinates",
    "SphereCoordinates",
    "SimplexCoordinates",
    "as_coordinates",
    "boundary_force_diverges",
]

State = PyTree[Float[Array, "*batch N"]]
"""A chart's state: `(position, velocity)` for the inertial system, `position` alone for the
overdamped flow."""


def _x_times(x, rho, g):
    """$x_i g_i$, exactly 0 on the boundary whatever $g_i$ does there."""
    return jnp.where(rho > 0, x * g, 0.0)


class AbstractCoordinates(eqx.Module):
    """A chart for the dynamics. The state is `(position, velocity)` for the inertial system
    and `position` alone for the overdamped flow (`mass = 0`).

    A chart is passed to `fisherdyn.simulate` as `coords=`; subclasses implement every
    abstract method below and name themselves with the class variable `name`.
    """

    name: eqx.AbstractClassVar[str]

    @abc.abstractmethod
    def from_simplex(
        self, rho: Float[Array, "*batch N"], rho_dot: Float[Array, "*batch N"] | None
    ) -> State:
        """The chart's state for weights `rho` and velocity `rho_dot` (None: overdamped)."""

    @abc.abstractmethod
    def vector_field(self, t: Any, y: State, system: FisherSystem) -> State:
        """The inertial system, $m > 0$."""

    @abc.abstractmethod
    def overdamped_field(self, t: Any, y: State, system: FisherSystem) -> State:
        """The replicator flow, $m = 0$, $\\gamma > 0$."""

    @abc.abstractmethod
    def observe(
        self, y: State, system: FisherSystem, overdamped: bool
    ) -> tuple[
        Float[Array, "*batch N"], Float[Array, "*batch N"], Float[Array, "*batch"],
        Float[Array, "*batch"],
    ]:
        """$(\\rho, \\dot\\rho, \\lambda, H)$ of a state (any leading batch axes)."""

    @abc.abstractmethod
    def weights_and_multiplier(
        self, y: State, system: FisherSystem, overdamped: bool
    ) -> tuple[Float[Array, "*batch N"], Float[Array, "*batch"]]:
        """$(\\rho, \\lambda)$ of a state only (cheaper than `observe`)."""

    @abc.abstractmethod
    def constraint_drift(self, y: State, overdamped: bool) -> Float[Array, "*batch"]:
        """How far the raw state is off the chart's constraint surface ($\\ge 0$)."""

    @abc.abstractmethod
    def boundary_event(self, overdamped: bool) -> diffrax.Event | None:
        """The event that stops a solve before the chart turns singular on the boundary, or
        None where it stays regular there. The event's `args` are `(system, boundary_tol)`."""

    def boundary_result(self) -> RESULTS:
        """The result of a solve that `boundary_event` stopped (default: the chart's own
        boundary, `RESULTS.boundary_reached`)."""
        return RESULTS.boundary_reached


class SphereCoordinates(AbstractCoordinates):
    """$\\rho_i = x_i^2$: $4m\\ddot x_i = 2x_i(\\lambda - g_i) - 4\\gamma\\dot x_i$,
    $\\lambda = \\sum x_i^2 g_i - 2m\\sum\\dot x_i^2$ on the sphere (docs/math.md §6).

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
        """$(\\lambda, g, \\rho)$ of the inertial state `(x, v)`."""
        rho = x * x
        g = forces(system.entropy, rho, system.scores, system.T)
        return self.multiplier_for_forces(x, v, rho, g, system), g, rho

    def multiplier_for_forces(self, x, v, rho, g, system):
        """$\\lambda$ of the inertial state `(x, v)` with weights `rho` = $x^2$ and forces `g`."""
        m, gam = system.mass, system.damping
        c = jnp.sum(rho, -1)
        xg = jnp.sum(x * _x_times(x, rho, g), -1)
        a = self._rate(system)
        xv = jnp.sum(x * v, -1)
        return (
            xg - 2 * m * jnp.sum(v * v, -1) + (2 * gam - 4 * m * a) * xv - m * a**2 * (c - 1)
        ) / c

    @staticmethod
    def acceleration(x, v, rho, g, lam, system):
        """$\\ddot x$ of the inertial state for forces `g` and multiplier `lam`."""
        return (2 * (lam * x - _x_times(x, rho, g)) - 4 * system.damping * v) / (4 * system.mass)

    def vector_field(self, t, y, system):
        x, v = y
        lam, g, rho = self.multiplier(x, v, system)
        return v, self.acceleration(x, v, rho, g, lam, system)

    def overdamped_multiplier(self, x, system):
        """$(\\lambda, g, \\rho)$ of the overdamped state `x`."""
        rho = x * x
        g = forces(system.entropy, rho, system.scores, system.T)
        return self.overdamped_multiplier_for_forces(x, rho, g, system), g, rho

    @staticmethod
    def overdamped_multiplier_for_forces(x, rho, g, system):
        """$\\lambda$ of the overdamped state `x` with weights `rho` = $x^2$ and forces `g`."""
        c = jnp.sum(rho, -1)
        a = system.T / system.damping
        return (jnp.sum(x * _x_times(x, rho, g), -1) - system.damping * a * (c - 1)) / c

    @staticmethod
    def overdamped_velocity(x, rho, g, lam, system):
        """$\\dot x$ of the overdamped flow for forces `g` and multiplier `lam`."""
        return (lam * x - _x_times(x, rho, g)) / (2 * system.damping)

    def overdamped_field(self, t, y, system):
        lam, g, rho = self.overdamped_multiplier(y, system)
        return self.overdamped_velocity(y, rho, g, lam, system)

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

    def weights_and_multiplier(self, y, system, overdamped):
        if overdamped:
            x = y
            lam, _, _ = self.overdamped_multiplier(x, system)
        else:
            x, v = y
            lam, _, _ = self.multiplier(x, v, system)
        return x * x / jnp.sum(x * x, -1, keepdims=True), lam

    def constraint_drift(self, y, overdamped):
        x = y if overdamped else y[0]
        return jnp.abs(jnp.sum(x * x, -1) - 1)

    def boundary_event(self, overdamped):
        # the overdamped flow has a bounded speed wherever F is finite: no event
        if overdamped:
            return None
        return diffrax.Event(lambda t, y, args, **kwargs: self.singular_boundary_hit(y, *args))

    def boundary_result(self):
        """`RESULTS.boundary_singular`: the sphere is regular at the boundary, so its event
        marks where the family's force is not."""
        return RESULTS.boundary_singular

    @staticmethod
    def singular_boundary_hit(
        y: State, system: FisherSystem, boundary_tol: Float[Array, ""]
    ) -> Bool[Array, ""]:
        """True once a weight closes in on 0 in finite time where the family's sphere force
        $x_i h(x_i^2)$ diverges at $x_i = 0$ (free energy finite there, so a trajectory can
        climb the cusp; the equation of motion is not Lipschitz there and the solver stalls).

        The criterion is `SimplexCoordinates.boundary_hit`'s in the sphere's terms: within
        `boundary_tol` in $\\rho_i = x_i^2$, moving towards 0, and with time-to-boundary
        $|x_i/\\dot x_i|$ below $0.1\\sqrt{m/T}$. Masked keys (exactly 0) never count.
        """
        x, v = y
        singular = boundary_force_diverges(system)
        tau = 0.1 * jnp.sqrt(system.mass / system.T)
        close = x * x < boundary_tol
        approaching = x * v < 0
        fast = jnp.abs(x) < jnp.abs(v) * tau
        hit = close & approaching & fast
        if system.mask is not None:
            hit = hit & system.mask
        return singular & jnp.any(hit)


def boundary_force_diverges(system: FisherSystem) -> Bool[Array, ""]:
    """Whether the sphere force $x\\,h(x^2)$ of a weight grows without bound as $x \\to 0$
    while the free energy stays finite there (Abe with $\\max(q, 1/q) \\ge 2$, Kaniadakis
    with $\\kappa > 1/2$, Tsallis with $q < 1/2$, ...).

    Decided from the entropy itself: the force at $x = 10^{-6}$ against $x = 10^{-3}$ (a
    bounded force, $x\\log x^2$ or $x^{2q-1}$ with $q \\ge 1/2$, shrinks or stays; a divergent
    one grows by a power of $10^3$). A family whose free energy is infinite at the boundary
    (Burg) keeps every trajectory of finite energy away from it.
    """
    entropy = system.entropy
    if not entropy.finite_at_boundary:
        return jnp.asarray(False)
    dtype = system.scores.dtype
    x = jnp.asarray([1e-6, 1e-3], dtype)
    rho = jnp.stack([x * x, 1 - x * x], -1)
    h = entropy.grad(rho)[..., 0]
    s = jnp.abs(x * h)
    grows = (s[0] > 1.01 * s[1]) | ~jnp.isfinite(s[0])
    return jax.lax.stop_gradient(jnp.isfinite(s[1]) & grows)


class SimplexCoordinates(AbstractCoordinates):
    """The weights themselves: $\\ddot\\rho_i = [\\rho_i(\\lambda - g_i) - \\gamma\\dot\\rho_i]/m
    + \\dot\\rho_i^2/(2\\rho_i)$ with $\\lambda$ chosen so that $\\sum\\ddot\\rho \\equiv 0$.

    Singular where a weight reaches 0 in finite time: `boundary_event` stops the inertial
    solve before that happens.
    """

    name: ClassVar[str] = "simplex"

    def from_simplex(self, rho, rho_dot):
        return rho if rho_dot is None else (rho, rho_dot)

    @staticmethod
    def _kinetic_terms(rho, rho_dot):
        pos = rho > 0
        return jnp.where(pos, rho_dot**2 / jnp.where(pos, rho, 1.0), 0.0)

    def multiplier(self, rho, rho_dot, system):
        """$(\\lambda, g, \\dot\\rho^2/\\rho)$ of the inertial state `(rho, rho_dot)`."""
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
        """$(\\lambda, g)$ of the overdamped state `rho`."""
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

    def weights_and_multiplier(self, y, system, overdamped):
        if overdamped:
            rho = y
            lam, _ = self.overdamped_multiplier(rho, system)
        else:
            rho, rho_dot = y
            lam, _, _ = self.multiplier(rho, rho_dot, system)
        return rho, lam

    def constraint_drift(self, y, overdamped):
        rho = y if overdamped else y[0]
        return jnp.abs(jnp.sum(rho, -1) - 1)

    def boundary_event(self, overdamped):
        # the overdamped replicator approaches the boundary only exponentially: no event
        if overdamped:
            return None
        return diffrax.Event(lambda t, y, args, **kwargs: self.boundary_hit(y, *args))

    @staticmethod
    def boundary_hit(
        y: State, system: FisherSystem, boundary_tol: Float[Array, ""]
    ) -> Bool[Array, ""]:
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


_BY_NAME = {"sphere": SphereCoordinates, "simplex": SimplexCoordinates}


def as_coordinates(coords: AbstractCoordinates | str) -> AbstractCoordinates:
    """A chart instance from `coords=`: an `AbstractCoordinates`, `"sphere"` or `"simplex"`."""
    if isinstance(coords, AbstractCoordinates):
        return coords
    if coords not in _BY_NAME:
        raise ValueError(
            "coords must be 'sphere', 'simplex' or an AbstractCoordinates instance "
            f"(e.g. fd.SphereCoordinates()), got {coords!r}"
        )
    return _BY_NAME[coords]()
