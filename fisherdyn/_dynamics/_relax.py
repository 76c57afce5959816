"""Fixed points of the damped dynamics (docs/math.md §6): `relax`.

`relax` integrates the sphere chart to a steady-state event and polishes the end point with
a Newton solve (optimistix) of the stationary conditions on the support the dynamics
selected. The fixed point's derivative is that of the stationary conditions (the implicit
function theorem through `optimistix.root_find`); the integrated path is not differentiated.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import optimistix as optx

from .._custom_types import Array, ArrayLike, Bool, Float, RealScalarLike, Scores, Temperature
from .._entropies import AbstractEntropy
from .._results import RESULTS
from ._batching import run
from ._coordinates import SphereCoordinates
from ._integrate import (
    Outcome, Static, Trajectory, _meter, field, final_state, integrate, trajectory,
)
from ._problem import (
    Problem,
    controller,
    default_tols,
    is_overdamped,
    positive_time,
    prepare,
    raise_if,
    resolve_solver,
)
from ._stiff import esdirk_step, is_esdirk, linearize
from ._system import FisherSystem, boundary_forces, forces

__all__ = ["relax", "RelaxSolution"]


class RelaxSolution(Outcome):
    """The fixed point the damped dynamics converged to.

    **Fields:**
    - `rho`: the polished fixed point $\\rho^*$ (exact zeros off the support);
      `lam`: its multiplier $\\lambda^*$ (so $E_i - T h_i(\\rho^*) = \\lambda^*$ on the support).
    - `t`: the time at which the steady state was reached (for a batch, which is integrated
      in blocks of problems as one system, to within a step of the block).
    - `residual`: $\\max_{i \\in A}|g_i - \\lambda^*|$ together with the off-support
      violation $\\max_{i\\notin A}(\\lambda^* - g_i(0))_+$ and $|\\sum\\rho^* - 1|$.
    - `rho_end`: the integrated end point before polishing.
    - `result`: `fisherdyn.RESULTS`, printed as a word by `result_name`; `stats`: integration
      steps (for a batch without `saveat`: those of the block integrated together), Newton
      steps, the size of the polish step.
    - `path`: the integrated `Trajectory` on the `saveat` times (None unless asked for); times
      after the steady-state event are `inf`.

    A batch of problems adds its batch axes in front of every array field.
    """

    rho: Float[Array, "*batch N"]
    lam: Float[Array, "*batch"]
    t: Float[Array, "*batch"]
    residual: Float[Array, "*batch"]
    rho_end: Float[Array, "*batch N"]
    result: RESULTS
    stats: dict[str, Array]
    path: Trajectory | None = None


def _state_norm(tree):
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in jtu.tree_leaves(tree)]))


def _on_support(active, u):
    """The weights $e^{u_i}$ on the support, exact zeros off it."""
    return jnp.where(active, jnp.exp(jnp.where(active, u, 0.0)), 0.0)


def _diagonal_scale(entropy, z, T, active, u0):
    """The inverse diagonal of the Newton system at `u0` (1 where it is unusable).

    The Newton system is bordered diagonal ($(g_i - \\lambda)/T$ depends on $u_i$ alone, plus
    a rank-one term through $M_q$ for Renyi / Sharma-Mittal), so a dense LU would cost
    $O(N^3)$ per step. Scaled by its diagonal, the system is the identity plus rank two or
    three, and GMRES solves it in a few $O(N)$ matrix-free products (the scaling leaves the
    root, and its implicit derivative, unchanged). The diagonal is the derivative of the
    forces with the moment held fixed, a separable law, so one JVP along ones gives it
    exactly.
    """
    frozen = entropy.stationary_law()
    T_frozen = entropy.effective_temperature(T, _on_support(active, u0))

    def frozen_residual(u):
        return jnp.where(active, forces(frozen, _on_support(active, u), z, T_frozen) / T, u)

    _, diag = jax.jvp(frozen_residual, (u0,), (jnp.ones_like(u0),))
    diag = jax.lax.stop_gradient(diag)
    usable = jnp.isfinite(diag) & (diag != 0)
    return jnp.where(usable, 1.0 / jnp.where(usable, diag, 1.0), 1.0)


def _newton_on_support(entropy, z, T, active, u0, lam0, rtol, mask=None):
    """Newton on the stationary conditions restricted to the support `active`, from
    $(u_0, \\lambda_0)$: returns (rho, lam, residual, converged, off-support violation,
    Newton steps, the final u); masked keys (`mask` False) are not checked off the support."""

    def fn(y, _):
        u, lam = y
        rho = _on_support(active, u)
        g = forces(entropy, rho, z, T)
        r = jnp.where(active, (g - lam) / T, u)
        return r, jnp.sum(rho) - 1

    scale = _diagonal_scale(entropy, z, T, active, u0)

    def scaled(y, args):
        r, s = fn(y, args)
        return r * scale, s

    # linear solves well below the polish tolerance (1e-12; float32 1e-5)
    gmres_tol = 1e-13 if u0.dtype == jnp.float64 else 1e-6
    linear = lx.GMRES(rtol=gmres_tol, atol=gmres_tol, max_steps=64, restart=8, stagnation_iters=8)
    solver = optx.Newton(rtol=rtol, atol=rtol, norm=optx.max_norm, linear_solver=linear)
    sol = optx.root_find(
        scaled, solver, (u0, lam0), max_steps=64, throw=False,
        adjoint=optx.ImplicitAdjoint(linear_solver=linear),
    )
    u, lam = sol.value
    rho = _on_support(active, u)
    rho = rho / jnp.sum(rho)
    g = forces(entropy, rho, z, T)
    on = jnp.max(jnp.where(active, jnp.abs(g - lam), 0.0))
    skip = active if mask is None else active | ~mask
    off = jnp.max(
        jnp.where(skip, 0.0, jnp.maximum(lam - boundary_forces(entropy, rho, z, T), 0.0))
    )
    residual = jnp.maximum(jnp.maximum(on, off), jnp.abs(jnp.sum(rho) - 1))
    # A weight far below the others (a key within the steady-state tolerance of a cutoff)
    # has a root in u = log(rho) that rounding blurs beyond the Cauchy test in u, though rho
    # is exact: where Newton stopped at its step limit (or saw that noise as divergence), the
    # root stands if the next Newton step would move every weight by less than the tolerance.
    r = jnp.where(active, (g - lam) / T, 0.0)
    rho_step = jnp.max(jnp.abs(rho * r * _diagonal_scale(entropy, z, T, active, u)))
    settled = (rho_step <= rtol) & (jnp.abs(jnp.sum(_on_support(active, u)) - 1) <= rtol)
    stopped = (sol.result == optx.RESULTS.nonlinear_max_steps_reached) | (
        sol.result == optx.RESULTS.nonlinear_divergence
    )
    converged = (sol.result == optx.RESULTS.successful) | (
        stopped & settled & jnp.isfinite(residual)
    )
    return rho, lam, residual, converged, off, sol.stats["num_steps"], u


def _retry_on_new_support(system, rho_end, lam_end, rtol, active, u0, first):
    """Newton once more on the support that the first solve's multiplier selects.

    A key whose boundary force sits within the steady-state tolerance of the multiplier can
    be on the wrong side of it at the end point. If it is on the support there, Newton drives
    its weight to 0 without converging; if it is off, Newton converges to a point that pulls
    it inward. Where the first solve failed in one of these ways, the second one takes the
    support that its multiplier selects among the keys the dynamics left inside the simplex
    (a key at exactly 0 stays off: faces are invariant). Computed for every problem and kept
    only where the first solve failed.
    """
    entropy, z, T = system.entropy, system.scores, system.T
    rho, lam, residual, ok_newton, off, steps, u = first
    lam_ok = jnp.isfinite(lam)
    inside = rho_end > 0 if system.mask is None else (rho_end > 0) & system.mask
    selected = ~(boundary_forces(entropy, rho_end, z, T) > lam)
    retry_active = jnp.where(ok_newton, active | (selected & inside), active & selected)
    retry = (~ok_newton | (off > 0)) & lam_ok & jnp.any(retry_active != active)
    added = retry_active & ~active
    active = jnp.where(retry, retry_active, active)
    u_start = jnp.where(jnp.all(jnp.isfinite(u)), u, u0)
    # a key taken onto the support starts from its weight at the end point
    u_start = jnp.where(added, jnp.log(jnp.where(added, rho_end, 1.0)), u_start)
    second = _newton_on_support(
        entropy, z, T, active, u_start, jnp.where(lam_ok, lam, lam_end), rtol, system.mask
    )
    rho, lam, residual, ok_newton, off, steps2, _ = jax.tree.map(
        lambda new, old: jnp.where(retry, new, old), second, first
    )
    steps = jnp.where(retry, steps + steps2, steps)
    return rho, lam, residual, ok_newton, off, steps, active


def _polish(system: FisherSystem, rho_end, lam_end, rtol):
    """Newton on the stationary conditions, from the integrated end point.

    Unknowns $(u, \\lambda)$ with $\\rho_i = e^{u_i}$ on the support; equations
    $(g_i(\\rho) - \\lambda)/T = 0$ on the support, $\\sum\\rho = 1$. The support is the
    dynamics': a component is off it where the boundary force beats the multiplier,
    $g_i(0) > \\lambda$ (possible only for the cutoff families) - there its weight is 0.
    """
    entropy, z, T = system.entropy, system.scores, system.T
    active = ~(boundary_forces(entropy, rho_end, z, T) > lam_end)
    if system.mask is not None:
        # a masked key is never on the support, and its boundary force is not a condition
        active = active & system.mask
    u0 = jnp.where(active & (rho_end > 0), jnp.log(jnp.where(rho_end > 0, rho_end, 1.0)), 0.0)
    # a support component the integration left at exactly 0 (only if it started there: faces
    # are invariant) starts at a tiny weight, and the result says support_inconsistent
    u0 = jnp.where(active & (rho_end <= 0), jnp.log(jnp.finfo(rho_end.dtype).tiny) / 4, u0)
    first = _newton_on_support(entropy, z, T, active, u0, lam_end, rtol, system.mask)
    rho, lam, residual, ok_newton, off, steps, _ = first
    if entropy.may_have_cutoff:
        rho, lam, residual, ok_newton, off, steps, active = _retry_on_new_support(
            system, rho_end, lam_end, rtol, active, u0, first
        )
    # a component the dynamics left at exactly 0 while the boundary force pulls it inward:
    # the run rests on an invariant face at a point that is not a fixed point of the simplex
    stuck = jnp.any(active & (rho_end <= 0))
    ok_support = (off <= 0) & ~stuck
    return rho, lam, residual, ok_newton, ok_support, steps


def _relax_result(integration, ok_newton, ok_support):
    """The result code: the integration's, then the polish's and the support check's."""
    converged = integration == diffrax.RESULTS.event_occurred
    result = RESULTS.where(
        converged,
        RESULTS.successful,
        RESULTS.where(
            integration == diffrax.RESULTS.successful,
            RESULTS.steady_state_not_reached,
            RESULTS.promote(integration),
        ),
    )
    result = RESULTS.where(converged & ~ok_newton, RESULTS.polish_failed, result)
    return RESULTS.where(converged & ok_newton & ~ok_support, RESULTS.support_inconsistent, result)


def _integrate_to_steady_state(system, y0, t1, rtol, atol, tol, path_ts, static: Static):
    f = field(static.coords, static.overdamped)

    def steady(t, y, args, **kwargs):
        return _state_norm(f(t, y, args[0])) < args[1]

    saveat = diffrax.SaveAt(t1=True) if path_ts is None else diffrax.SaveAt(ts=path_ts, t1=True)
    return integrate(static, y0, t1, (system, tol), saveat, rtol, atol, diffrax.Event(steady))


def _finish(system, rho0, y_end, t_end, integration, num_steps, polish_tol, static, path=None):
    """Polish one problem's integrated end point into its `RelaxSolution`."""
    coords = static.coords
    system_const = jax.lax.stop_gradient(system)
    rho_end, lam_end = coords.weights_and_multiplier(y_end, system_const, static.overdamped)
    # Keep a failed run's numbers finite so the polish below stays well defined.
    finite = jnp.all(jnp.isfinite(rho_end)) & jnp.isfinite(lam_end)
    rho_end = jnp.where(finite, rho_end, jax.lax.stop_gradient(rho0))
    lam_end = jnp.where(finite, lam_end, 0.0)
    rho, lam, residual, ok_newton, ok_support, n_newton = _polish(
        system, rho_end, lam_end, polish_tol
    )
    result = _relax_result(integration, ok_newton, ok_support)
    stats = {
        "num_steps": num_steps,
        "num_newton_steps": n_newton,
        "polish_shift": jnp.max(jnp.abs(rho - rho_end)),
    }
    if path is not None:
        path = path(result)
    return RelaxSolution(rho, lam, t_end, residual, rho_end, result, stats, path)


def _relax_single(system, rho0, v0, extra, static: Static):
    t1, rtol, atol, tol, polish_tol, path_ts = extra
    coords = static.coords
    # The fixed point's derivative is the implicit-function derivative of the stationary
    # conditions; the path that led there is irrelevant to it, so the integration sees no
    # tangents (this also allows forward mode).
    system_const = jax.lax.stop_gradient(system)
    rho0, v0, t1, rtol, atol, tol = jax.lax.stop_gradient((rho0, v0, t1, rtol, atol, tol))
    y0 = coords.from_simplex(rho0, None if static.overdamped else v0)
    sol = _integrate_to_steady_state(system_const, y0, t1, rtol, atol, tol, path_ts, static)
    k, y_end = final_state(sol)
    path = None
    if path_ts is not None:
        path = lambda result: trajectory(  # noqa: E731
            sol, y0, system_const, coords, static.overdamped, result
        )
    return _finish(
        system, rho0, y_end, sol.ts[k], sol.result, sol.stats["num_steps"], polish_tol, static,
        path,
    )


def _block_norm(mask):
    """The worst problem's RMS norm (over its unmasked keys) of a block's scaled error; the
    clock leaf (the second) carries no error that matters."""

    def norm(tree):
        leaves = jtu.tree_leaves(tree[0])
        if mask is None:
            mean = sum(jnp.mean(leaf * leaf, -1) for leaf in leaves) / len(leaves)
        else:
            total = sum(jnp.sum(jnp.where(mask, leaf * leaf, 0.0), -1) for leaf in leaves)
            mean = total / (len(leaves) * jnp.sum(mask, -1, dtype=total.dtype))
        worst = jnp.max(mean)
        positive = worst > 0
        return jnp.where(positive, jnp.sqrt(jnp.where(positive, worst, 1.0)), 0.0)

    return norm


def _combine(z0, coefficients, ks, dt):
    """$z_0 + dt\\sum_j a_j k_j$ leaf by leaf, skipping the tableau's zeros (one fused loop)."""

    def leaf(y, *k):
        terms = [float(a) * kj for a, kj in zip(coefficients, k) if a != 0]
        return y + dt * sum(terms[1:], terms[0]) if terms else y

    return jtu.tree_map(leaf, z0, *ks)


def _erk_step(tableau: diffrax.ButcherTableau, vf, t0, t1, z0, f0):
    """One explicit Runge-Kutta step written out stage by stage: `(z1, error, f(z1))`.

    Diffrax loops over the stages (one trace of the vector field), and every stage then reads
    the whole stage buffer through a dense row of the tableau; written out, each stage's
    combination is one fused pass over the stages it uses. The field at the end point is the
    last stage of an FSAL tableau (evaluated otherwise): it starts the next step and gives
    the steady-state test.
    """
    dt = t1 - t0
    ks = [f0]
    zi = z0
    for c, a in zip(tableau.c, tableau.a_lower):
        zi = _combine(z0, a, ks, dt)
        ks.append(jax.lax.optimization_barrier(vf(t0 + float(c) * dt, zi)))
    if tableau.ssal:
        z1 = zi
    else:
        z1 = _combine(z0, tableau.b_sol, ks, dt)
    error = _combine(jtu.tree_map(jnp.zeros_like, z0), tableau.b_error, ks, dt)
    f1 = ks[-1] if tableau.fsal else vf(t1, z1)
    return z1, error, f1


class _SteadyStateStepper(diffrax.AbstractAdaptiveSolver):
    """A block's step: `solver`'s step of the block's state, plus each problem's speed
    (max-norm of the field) at the step's end and its clock.

    The state is `(z, tau, speed)`. The steady-state event reads `speed`, so it costs no
    evaluation of the field; for an explicit Runge-Kutta solver the step is written out
    (`_erk_step`) and `speed` comes from its last stage. `tau` advances by the step for every
    problem that was moving at the step's start, so it is the time at which the problem
    became stationary, to within a step. `args` are `(system, tol)`.
    """

    solver: diffrax.AbstractSolver
    field: Callable = eqx.field(static=True)
    # the block's structured Jacobian (`_stiff.linearize`, batched), for an ESDIRK solver
    linearize: Callable | None = eqx.field(static=True, default=None)
    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = diffrax.LocalLinearInterpolation

    @property
    def _tableau(self):
        explicit = isinstance(self.solver, diffrax.AbstractERK)
        written_out = explicit or (self.linearize is not None and is_esdirk(self.solver))
        return self.solver.tableau if written_out else None

    def order(self, terms):
        return self.solver.order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def _vf(self, args):
        return lambda t, z: self.field(z, args[0])

    def _term(self):
        return diffrax.ODETerm(lambda t, z, args: self.field(z, args[0]))

    def init(self, terms, t0, t1, y0, args):
        if self._tableau is not None:
            return self._vf(args)(t0, y0[0])
        return self.solver.init(self._term(), t0, t1, y0[0], args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        z0, tau0, speed0 = y0
        vf = self._vf(args)
        result = diffrax.RESULTS.successful
        if self._tableau is not None:
            f0 = jax.lax.cond(made_jump, lambda: vf(t0, z0), lambda: solver_state)
            if isinstance(self.solver, diffrax.AbstractERK):
                z1, error, f1 = _erk_step(self._tableau, vf, t0, t1, z0, f0)
            else:
                lin = self.linearize(z0, args[0])
                z1, error, f1, ok = esdirk_step(
                    self._tableau, vf, lin, t0, t1, z0, f0, args[2], args[3]
                )
                # a stage whose Newton iteration failed rejects the step (and shrinks dt)
                error = jtu.tree_map(lambda e: jnp.where(ok, e, jnp.inf), error)
            solver_state = f1
        else:
            z1, error, _, solver_state, result = self.solver.step(
                self._term(), t0, t1, z0, args, solver_state, made_jump
            )
            f1 = vf(t1, z1)
        moving = (speed0 >= args[1]).astype(tau0.dtype)
        y1 = (z1, tau0 + (t1 - t0) * moving, _block_speed(f1)[:, None])
        error = (error, jnp.zeros_like(tau0), jnp.zeros_like(speed0))
        return y1, error, dict(y0=y0, y1=y1), solver_state, result

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)


def _relax_block(system, rho0, v0, extra, static: Static):
    """A block of problems (leading axis) integrated as one system, then polished each.

    One step-size controller whose error norm is the worst problem's, and one steady-state
    event that fires once every problem is stationary (or past its own `t1`): the per-step
    work is plain batched arithmetic instead of a vmapped while loop in which every problem
    carries its own controller. Each problem's clock `tau` advances only while it is not
    stationary, so its `t` is when it first reached the steady state (to within a step).
    """
    t1, rtol, atol, tol, polish_tol, _ = extra
    coords = static.coords
    f = field(coords, static.overdamped)
    system_const = jax.lax.stop_gradient(system)
    rho0_c, v0, t1, rtol, atol, tol = jax.lax.stop_gradient((rho0, v0, t1, rtol, atol, tol))
    fields = jax.vmap(lambda y, s: f(None, y, s))

    def done(t, state, args, **kwargs):
        return jnp.all((state[2][:, 0] < tol) | (t >= t1))

    z0 = jax.vmap(lambda r, v: coords.from_simplex(r, None if static.overdamped else v))(
        rho0_c, v0
    )
    # per-problem leaves as columns, as the controller's per-problem tolerances are
    y0 = (z0, jnp.zeros_like(t1)[:, None], _block_speed(fields(z0, system_const))[:, None])
    solver = static.solver_of_block
    lin = None
    if isinstance(solver, diffrax.AbstractImplicitSolver):
        if not is_esdirk(solver):
            raise ValueError(
                "a batch without saveat is integrated in blocks of problems as one system, "
                "where the implicit solvers are Diffrax's ESDIRK methods (kvaerno5, "
                f"diffrax.Kvaerno3/4/5); got {type(solver).__name__}. Pass saveat= to solve "
                "each problem on its own, or an explicit solver"
            )
        # the block's Newton matrices in structured form (relax's chart is the sphere's),
        # solved in O(N) per problem
        lin = jax.vmap(functools.partial(linearize, overdamped=static.overdamped))
    ctrl = controller(solver, rtol[:, None], atol[:, None], None)
    ctrl = eqx.tree_at(lambda c: c.norm, ctrl, _block_norm(system.mask))
    sol = diffrax.diffeqsolve(
        # the field of the whole state; the stepper integrates its first part itself
        diffrax.ODETerm(
            lambda t, y, args: (fields(y[0], args[0]), jnp.zeros_like(y[1]), jnp.zeros_like(y[2]))
        ),
        _SteadyStateStepper(solver, fields, lin),
        t0=jnp.zeros((), t1.dtype),
        t1=jnp.max(t1),
        dt0=None,
        y0=y0,
        args=(system_const, tol[:, None], rtol[:, None], atol[:, None]),
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=ctrl,
        event=diffrax.Event(done),
        max_steps=static.max_steps,
        throw=False,
        adjoint=static.adjoint,
        progress_meter=_meter(static.progress),
    )
    y_end, tau, speed = jtu.tree_map(lambda leaf: leaf[-1], sol.ys)
    tau, speed = tau[:, 0], speed[:, 0]
    steady = (speed < tol) & (tau <= t1)
    stopped = (sol.result == diffrax.RESULTS.event_occurred) | (
        sol.result == diffrax.RESULTS.successful
    )
    # a problem that did not become stationary stopped where the block did or at its own t1
    t_end = jnp.where(steady, tau, jnp.minimum(sol.ts[-1], t1))
    steps = jnp.broadcast_to(sol.stats["num_steps"], t1.shape)

    def finish(s, r, y, t, n, p, steady):
        # the event's code where the problem is stationary, a run to t1 where it is not, and
        # the solve's failure (max_steps, ...) for every problem of a block that failed
        integration = diffrax.RESULTS.where(
            steady & stopped,
            diffrax.RESULTS.event_occurred,
            diffrax.RESULTS.where(stopped, diffrax.RESULTS.successful, sol.result),
        )
        return _finish(s, r, y, t, integration, n, p, static)

    return jax.vmap(finish)(system, rho0, y_end, t_end, steps, polish_tol, steady)


def _block_speed(dy):
    """Each problem's max-norm of the vector field (the steady-state test)."""
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf), -1) for leaf in jtu.tree_leaves(dy)]), 0)


# below this batch size the implicit step's fixed costs outweigh its fewer steps
# (benchmarks/relax_solvers.py --batch B; docs/performance.md)
_STIFF_MIN_BATCH = 8


def _block_default(entropy: AbstractEntropy, n_problems: int) -> str:
    """The default solver of a block: Dopri8 where the relaxation is fast (its steps are
    set by accuracy, and at the default rtol it takes about a third of Tsit5's steps for
    twice the evaluations each); for the families with a cutoff, whose slow boundary modes
    would hold an explicit solver at its stability limit (about one step per unit time) for
    most of the run, Kvaerno5 with its Newton systems solved in O(N) (`_stiff.py`), or
    Tsit5 for a batch too small to repay the implicit step's fixed costs."""
    if not entropy.may_have_cutoff:
        return "dopri8"
    return "kvaerno5" if n_problems >= _STIFF_MIN_BATCH else "tsit5"


def _default_t1(problem: Problem, overdamped):
    s = problem.system
    # a long multiple of the slowest Shannon-like time scale: overdamped omega^2/gamma,
    # inertial min(gamma/(2m), omega^2/gamma) with omega^2 ~ T
    scale = s.damping / s.T
    if not overdamped:
        scale = scale + 2 * s.mass / s.damping + jnp.sqrt(s.mass / s.T)
    return 1e4 * scale


def relax(
    entropy: AbstractEntropy,
    scores: Scores,
    T: Temperature = 1.0,
    *,
    mass: Float[ArrayLike, "*#batch"] | RealScalarLike,
    damping: Float[ArrayLike, "*#batch"] | RealScalarLike,
    rho0: Float[ArrayLike, "*#batch N"] | None = None,
    velocity0: Float[ArrayLike, "*#batch N"] | None = None,
    tol: Float[ArrayLike, "*#batch"] | RealScalarLike | None = None,
    t1: Float[ArrayLike, "*#batch"] | RealScalarLike | None = None,
    rtol: Float[ArrayLike, "*#batch"] | RealScalarLike | None = None,
    atol: Float[ArrayLike, "*#batch"] | RealScalarLike | None = None,
    polish_tol: Float[ArrayLike, "*#batch"] | RealScalarLike | None = None,
    max_steps: int = 200_000,
    solver: diffrax.AbstractSolver | str | None = None,
    saveat: Float[ArrayLike, "*#batch K"] | None = None,
    mask: Bool[ArrayLike, "*#batch N"] | None = None,
    throw: bool = True,
    progress: bool = False,
) -> RelaxSolution:
    """The fixed point reached by the damped dynamics: integrate to a steady state, then
    polish the end point with Newton's method.

    Integrates the sphere chart (docs/math.md §6) from `rho0` (default uniform) until the
    vector field's max-norm drops below `tol` (a `diffrax.Event`), then solves the stationary
    conditions $E_i - T h_i(\\rho) = \\lambda$ on the support the dynamics selected,
    $\\sum\\rho = 1$, by `optimistix.Newton` from the end point. A run that did not reach a
    steady state, a polish that did not converge, or an end point whose boundary components
    are pulled inward is never reported as converged.

    **Arguments:**

    - `entropy`, `scores`, `T`, `mass` ($m \\ge 0$; 0 = overdamped replicator flow),
      `damping` ($\\gamma > 0$), `rho0`, `velocity0`: as in `simulate`.
    - `tol`: steady-state threshold on the max-norm of the vector field (default 1e-6;
      float32: 1e-3). It only has to put the end point in Newton's basin; keep it well above
      the integrator's noise floor near a fixed point (about `rtol` x the fastest rate:
      explicit solvers jitter the stiff modes at the tolerance level).
    - `polish_tol`: Newton tolerance (1e-12; float32 1e-5).
    - `t1`: give up after this time (default $10^4$ x the slowest Shannon-like time scale).
    - `rtol`, `atol`, `solver`, `max_steps`, `progress`: integration, as in `simulate`. The
      default solver of a batch without `saveat` (integrated in blocks of problems as one
      system) is `"dopri8"` for the families without a cutoff and, for those with one
      (Tsallis, Renyi / Sharma-Mittal), `"kvaerno5"` from 8 problems on and `"tsit5"`
      below, whichever is faster there; a single problem or a batch with `saveat` uses
      `"tsit5"`. A block takes Diffrax's ESDIRK methods (`"kvaerno5"`,
      `diffrax.Kvaerno3/4/5`) as its implicit solvers, and solves their Newton systems in
      O(N) per problem from the Jacobian's structure (docs/math.md §6); other implicit
      solvers need `saveat`.
    - `saveat`: optional times at which to also record the path (`.path`): shape (K,), or
      (batch..., K) for one grid per problem.
    - `mask`: as in `simulate` (True: the key takes part; `-inf` scores are masked). The
      fixed point is exactly 0 on masked keys, and equals the unpadded problem's to
      round-off.
    - `throw`: raise unless `result` is successful (else inspect `result`).

    **Returns:**

    A `RelaxSolution` (batched over the leading axes when given a batch). `rho` and `lam` are
    differentiable (forward and reverse mode) with respect to the scores, T and the
    entropy's parameters: their derivative is that of the stationary conditions at the fixed
    point (implicit function theorem, through `optimistix.root_find`); the integrated path is
    not differentiated.
    """
    overdamped = is_overdamped(mass)
    problem = prepare(
        entropy, scores, T, mass, damping, rho0, velocity0, overdamped, True, mask
    )
    dtype = problem.rho0.dtype
    tols = default_tols(dtype, rtol=rtol, atol=atol, tol=tol, polish_tol=polish_tol)
    t1 = _default_t1(problem, overdamped) if t1 is None else positive_time(t1, dtype)
    # nothing is differentiated through the path: a plain while loop, no checkpointing
    # (much faster under vmap)
    static = Static(
        SphereCoordinates(), resolve_solver(solver), overdamped, int(max_steps), bool(progress),
        diffrax.ForwardMode(), block_solver=resolve_solver(
            solver or _block_default(entropy, math.prod(problem.system.scores.shape[:-1]))
        ),
    )
    tols = [tols[k] for k in ("rtol", "atol", "tol", "polish_tol")]
    extra = tuple(jnp.asarray(v, dtype) for v in (t1, *tols))
    if saveat is not None:
        saveat = jnp.asarray(saveat, dtype)
        if saveat.ndim == 0:
            raise ValueError("saveat must be a 1-D array of times, or one per problem (or None)")
    # without saved paths a block of problems is integrated as one system
    block = _relax_block if saveat is None else None
    out = run(_relax_single, problem, (*extra, saveat), (0, 0, 0, 0, 0, 1), static, block)
    if throw:
        out = raise_if(out, out.result != RESULTS.successful)
    return out
