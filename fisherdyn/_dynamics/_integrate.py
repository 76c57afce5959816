"""Integrating the damped Fisher-Lagrangian dynamics (docs/math.md §6): `simulate`.

Everything numeric (scores, T, mass, damping, the entropy's parameters, initial conditions,
t1, tolerances) is a traced argument: sweeping values reuses the compiled solve. Static are
only the chart, the solver, `max_steps`, the number of saved points, the overdamped switch
(`mass == 0`) and the progress meter. Leading axes of `scores` (and of any per-problem
argument) are batch axes, solved in one compiled call (see `_batching.py`); `jax.vmap` over
the public functions works too.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._custom_types import Array, ArrayLike, Bool, Float, Int, RealScalarLike, Scores, Temperature
from .._entropies import AbstractEntropy
from .._optional import require
from .._results import RESULTS, result_name
from ._batching import run
from ._coordinates import AbstractCoordinates, as_coordinates
from ._problem import (
    check,
    controller,
    default_tols,
    is_overdamped,
    positive_time,
    prepare,
    raise_if,
    resolve_adjoint,
    resolve_solver,
)

__all__ = [
    "simulate", "Trajectory", "Outcome", "Static", "integrate", "final_state", "field",
    "trajectory",
]


class Outcome(eqx.Module):
    """A solve's outcome: a subclass has a field `result`, a `fisherdyn.RESULTS` code."""

    # (no `AbstractVar` annotation: under postponed annotations equinox would make it a
    # field of this base, first in every subclass's constructor)

    @property
    def result_name(self) -> str | np.ndarray:
        """`result` as a word (`"successful"`, `"boundary_reached"`, `"polish_failed"`,
        ...), see `fisherdyn.result_name`."""
        return result_name(self.result)  # pyright: ignore[reportAttributeAccessIssue]


class Trajectory(Outcome):
    """A solved trajectory of the Fisher-Lagrangian dynamics.

    **Fields:**
    - `ts`: save times, shape (K,); entries past an early stop are `inf` (Diffrax's
      convention), and so are the matching entries of every other field.
    - `rho`, `rho_dot`: weights and their velocity, (K, N).
    - `lam`: the multiplier $\\lambda(t)$; `energy`: $H = (m/2)\\sum\\dot\\rho^2/\\rho + F$.
    - `t_final`, `rho_final`, `rho_dot_final`: the state where the solve stopped (t1, or
      the boundary event of the simplex chart).
    - `constraint_drift`: max over saved points of $|\\sum x^2 - 1|$ (sphere) or
      $|\\sum\\rho - 1|$ (simplex) of the raw integrated state.
    - `result`: a `fisherdyn.RESULTS` code (Diffrax's codes, promoted, plus
      `boundary_reached`, `boundary_singular`); `result_name` prints it as a word.
      `stats`: Diffrax's step counts.
    - `coords`: the chart's name; `overdamped`: whether the first-order flow was integrated.

    A batch of problems adds its batch axes in front of every array field.
    """

    ts: Float[Array, "*batch K"]
    rho: Float[Array, "*batch K N"]
    rho_dot: Float[Array, "*batch K N"]
    lam: Float[Array, "*batch K"]
    energy: Float[Array, "*batch K"]
    t_final: Float[Array, "*batch"]
    rho_final: Float[Array, "*batch N"]
    rho_dot_final: Float[Array, "*batch N"]
    constraint_drift: Float[Array, "*batch"]
    result: RESULTS
    stats: dict[str, Int[Array, "*batch"]]
    coords: str = eqx.field(static=True)
    overdamped: bool = eqx.field(static=True)


class Static(eqx.Module):
    """What a compiled solve is specialized on (`simulate`'s and `relax`'s)."""

    coords: AbstractCoordinates = eqx.field(static=True)
    solver: diffrax.AbstractSolver = eqx.field(static=True)
    overdamped: bool = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    adjoint: diffrax.AbstractAdjoint = eqx.field(static=True)
    n_save: int = eqx.field(static=True, default=0)
    # `relax`'s solver for a block of problems integrated as one system (None: `solver`)
    block_solver: diffrax.AbstractSolver | None = eqx.field(static=True, default=None)

    @property
    def solver_of_block(self) -> diffrax.AbstractSolver:
        """The solver of a block of problems integrated as one system."""
        return self.solver if self.block_solver is None else self.block_solver


def field(coords: AbstractCoordinates, overdamped: bool):
    """The chart's vector field `(t, y, system) -> dy/dt`: the overdamped flow or the
    inertial system."""
    return coords.overdamped_field if overdamped else coords.vector_field


def _meter(progress: bool) -> diffrax.AbstractProgressMeter:
    if not progress:
        return diffrax.NoProgressMeter()
    require("tqdm", extra="progress", what="progress=True")  # Diffrax's bar is tqdm's
    return diffrax.TqdmProgressMeter()


def integrate(static: Static, y0, t1, args, saveat, rtol, atol, event) -> diffrax.Solution:
    """One Diffrax solve of the chart's field from t = 0 to `t1` (stopped by `event`);
    `args` are `(system, ...)`, as the chart's events take them."""
    f = field(static.coords, static.overdamped)
    system = args[0]
    return diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: f(t, y, args[0])),
        static.solver,
        t0=jnp.zeros((), t1.dtype),
        t1=t1,
        dt0=None,
        y0=y0,
        args=args,
        saveat=saveat,
        stepsize_controller=controller(static.solver, rtol, atol, system.mask),
        event=event,
        max_steps=static.max_steps,
        throw=False,
        adjoint=static.adjoint,
        progress_meter=_meter(static.progress),
    )


def final_state(sol: diffrax.Solution):
    """`(k, y)`: the index and the state where a solve saved with `SaveAt(..., t1=True)`
    stopped."""
    # The buffer holds the requested save times and then the final state. An event stops
    # the solve early, and Diffrax then writes the final state right after the last save
    # time reached: the last finite entry is the final state, the ones before are saves.
    k = jnp.sum(jnp.isfinite(sol.ts)) - 1
    return k, jtu.tree_map(lambda y: y[k], sol.ys)


def trajectory(sol, y0, system, coords: AbstractCoordinates, overdamped, result) -> Trajectory:
    """Observables of a solve saved with `SaveAt(ts=..., t1=True)`."""
    k, y_final = final_state(sol)
    ys_saved = jtu.tree_map(lambda y: y[:-1], sol.ys)
    reached = jnp.arange(sol.ts.shape[0] - 1) < k

    def mask(o, fill):
        return jnp.where(reached.reshape((-1,) + (1,) * (o.ndim - 1)), o, fill)

    # Evaluate the observables on a finite stand-in where the solve never got to.
    safe = jtu.tree_map(mask, ys_saved, y0)
    obs = jax.vmap(lambda y: coords.observe(y, system, overdamped))(safe)
    rho, rho_dot, lam, H = jtu.tree_map(lambda o: mask(o, jnp.inf), obs)
    rho_f, rho_dot_f, _, _ = coords.observe(y_final, system, overdamped)
    drift = jax.vmap(lambda y: coords.constraint_drift(y, overdamped))(safe)
    drift = jnp.max(jnp.where(reached, drift, 0.0))
    stats = {k: sol.stats[k] for k in ("num_steps", "num_accepted_steps", "num_rejected_steps")}
    return Trajectory(
        jnp.where(reached, sol.ts[:-1], jnp.inf),
        rho,
        rho_dot,
        lam,
        H,
        sol.ts[k],
        rho_f,
        rho_dot_f,
        drift,
        result,
        stats,
        coords.name,
        overdamped,
    )


def _simulate_single(system, rho0, v0, extra, static: Static):
    t1, rtol, atol, boundary_tol, ts = extra
    coords = static.coords
    y0 = coords.from_simplex(rho0, None if static.overdamped else v0)
    if ts is None:
        ts = t1 * jnp.linspace(0.0, 1.0, static.n_save, dtype=rho0.dtype)
    sol = integrate(
        static, y0, t1, (system, boundary_tol), diffrax.SaveAt(ts=ts, t1=True), rtol, atol,
        coords.boundary_event(static.overdamped),
    )
    result = RESULTS.promote(sol.result)
    at_event = sol.result == diffrax.RESULTS.event_occurred
    result = RESULTS.where(at_event, coords.boundary_result(), result)
    return trajectory(sol, y0, system, coords, static.overdamped, result)


def _save_times(saveat, t1, dtype):
    """`(ts, n_save)` from `saveat=`: a number of equally spaced times (`ts` None, made in
    the solve from the traced `t1`), or checked explicit times."""
    if isinstance(saveat, (int, np.integer)) and not isinstance(saveat, bool):
        if saveat < 2:
            raise ValueError(f"saveat must be >= 2 save points, got {saveat}")
        return None, int(saveat)
    ts = jnp.asarray(saveat, dtype)
    if ts.ndim == 0 or ts.shape[-1] < 1:
        raise ValueError("saveat must be an int, or an array of times (one row per problem)")
    ts = check(
        jnp.all(ts >= 0) & jnp.all(jnp.diff(ts, axis=-1) >= 0) & jnp.all(ts[..., -1] <= t1),
        "saveat times must be non-decreasing and lie in [0, t1]",
        ts,
    )
    return ts, ts.shape[-1]


def simulate(
    entropy: AbstractEntropy,
    scores: Scores,
    T: Temperature = 1.0,
    *,
    mass: Float[ArrayLike, "*#batch"] | RealScalarLike = 1.0,
    damping: Float[ArrayLike, "*#batch"] | RealScalarLike = 1.0,
    rho0: Float[ArrayLike, "*#batch N"] | None = None,
    velocity0: Float[ArrayLike, "*#batch N"] | None = None,
    t1: Float[ArrayLike, "*#batch"] | RealScalarLike = 10.0,
    saveat: int | Float[ArrayLike, "*#batch K"] = 201,
    coords: AbstractCoordinates | str = "sphere",
    rtol: Float[ArrayLike, "*#batch"] | RealScalarLike | None = None,
    atol: Float[ArrayLike, "*#batch"] | RealScalarLike | None = None,
    max_steps: int = 100_000,
    solver: diffrax.AbstractSolver | str | None = None,
    boundary_tol: Float[ArrayLike, "*#batch"] | RealScalarLike = 1e-8,
    mask: Bool[ArrayLike, "*#batch N"] | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool = True,
    progress: bool = False,
) -> Trajectory:
    """Integrate the damped Fisher-Lagrangian dynamics of the attention weights.

    $m(\\ddot\\rho_i/\\rho_i - \\tfrac12\\dot\\rho_i^2/\\rho_i^2) + \\gamma\\dot\\rho_i/\\rho_i
    + E_i - T h_i(\\rho) = \\lambda(t)$ on the simplex (docs/math.md §6), from `rho0` with
    velocity `velocity0`; `mass = 0` integrates the first-order replicator (Fisher-Rao
    gradient) flow $\\gamma\\dot\\rho_i = \\rho_i(\\lambda - g_i)$ instead.

    **Arguments:**

    - `entropy`, `scores`, `T`: the problem (scores' leading axes are batch axes).
    - `mass` ($m \\ge 0$), `damping` ($\\gamma \\ge 0$; > 0 when m = 0): scalars or per-problem.
    - `rho0`: initial weights on the simplex (default uniform); `velocity0`: initial
      $\\dot\\rho$, tangent to the simplex (default 0). Off the simplex / tangent space is a
      `ValueError` (a runtime error under `jit`).
    - `t1`: final time (t0 = 0). `saveat`: number of equally spaced save times in [0, t1],
      or an array of non-decreasing times in [0, t1] (one row per problem, or shared).
    - `coords`: the chart, `SphereCoordinates()` / `"sphere"` ($\\rho = x^2$, default; smooth
      through the boundary) or `SimplexCoordinates()` / `"simplex"` (stops with
      `RESULTS.boundary_reached` where a weight hits 0 in finite time: within
      `boundary_tol` and closing in faster than $0.1\\sqrt{m/T}$). The inertial sphere chart
      stops with `RESULTS.boundary_singular` where a weight closes in on 0 in the same way
      for a family whose force diverges there at finite free energy (Abe with
      $\\max(q, 1/q) \\ge 2$, Kaniadakis with $\\kappa > 1/2$, Tsallis with $q < 1/2$): the
      equation of motion is not well-posed there.
    - `rtol`, `atol`: PID step-size controller tolerances (default 1e-8, 1e-10 in float64;
      1e-5, 1e-7 in float32, i.e. when JAX's x64 mode is off). `solver`: a diffrax solver or
      one of `"tsit5"` (default), `"dopri5"`, `"dopri8"`, `"kvaerno5"` (stiff, implicit).
    - `mask`: boolean, broadcasting against `scores`; True where the key takes part. A
      `-inf` score is a masked key too. Masked weights (and velocities) are exactly 0 at
      every saved time, and the step-size control ignores them, so a problem padded with
      masked keys gives the unpadded one's trajectory to round-off. A problem with every key
      masked is a `ValueError` (a runtime error under `jit`).
    - `adjoint`: how the solve is differentiated. The default (None) is
      `diffrax.RecursiveCheckpointAdjoint()`: `jax.grad` / `jax.vjp` of any output with
      respect to `scores`, `T`, `mass`, `damping`, the entropy's parameters and the initial
      state (discretise-then-optimise: the derivative of the computed solution, with the
      step sizes it chose). Forward mode (`jax.jvp`, `jax.jacfwd`) needs
      `adjoint=diffrax.ForwardMode()`, which in turn cannot be reverse-differentiated.
    - `max_steps`: static step budget (finite, as the checkpointed adjoint needs). `throw`:
      raise on a failed solve (max_steps, ...); a boundary event is a result, not an error.
      `progress`: show Diffrax's tqdm meter (the `progress` extra).

    **Returns:**

    A `Trajectory` (batched over the leading axes when given a batch).
    """
    overdamped = is_overdamped(mass)
    problem = prepare(
        entropy, scores, T, mass, damping, rho0, velocity0, overdamped, False, mask
    )
    coords = as_coordinates(coords)
    adjoint = resolve_adjoint(adjoint)
    solver = resolve_solver(solver, reverse=not isinstance(adjoint, diffrax.ForwardMode))
    dtype = problem.rho0.dtype
    tols = default_tols(dtype, rtol=rtol, atol=atol)
    t1 = positive_time(t1, dtype)
    ts, n_save = _save_times(saveat, t1, dtype)
    static = Static(
        coords, solver, overdamped, int(max_steps), bool(progress), adjoint, n_save=n_save
    )
    extra = (t1, tols["rtol"], tols["atol"], jnp.asarray(boundary_tol, dtype), ts)
    out = run(_simulate_single, problem, extra, (0, 0, 0, 0, 1), static)
    if throw:
        failed = (out.result != RESULTS.successful) & (out.result != RESULTS.boundary_reached)
        out = raise_if(out, failed)
    return out
