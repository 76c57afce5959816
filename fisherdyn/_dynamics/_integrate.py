"""Integrating the Fisher-Lagrangian dynamics and extracting its fixed points (MATH.md §6).

`simulate` integrates one trajectory (or a batch) with Diffrax; `relax` integrates to a
steady-state event and polishes the end point with a Newton solve (optimistix) of the
stationary conditions on the support the dynamics selected.

Everything numeric (scores, T, mass, damping, the entropy's parameters, initial conditions,
t1, tolerances) is a traced argument: sweeping values reuses the compiled solve. Static are
only the chart, the solver, `max_steps`, the number of saved points, the overdamped switch
(`mass == 0`) and the progress meter. Leading axes of `scores` (and of any per-problem
argument) are batch axes, solved in one compiled call (vmapped in blocks of 256 problems:
cache-sized, and each block stops at its own slowest member; a batch sharded over devices
with `jax.sharding` is vmapped whole, so that each device solves its own shard); `jax.vmap`
over the public functions works too.
"""

from __future__ import annotations

from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
import optimistix as optx
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxtyping import Array

from ._system import (
    AbstractCoordinates,
    FisherSystem,
    SimplexCoordinates,
    SphereCoordinates,
    boundary_forces,
    forces,
    may_have_cutoff,
)
from .._entropies import AbstractEntropy, AbstractTsallisShapedEntropy, Burg
from .._results import RESULTS

__all__ = ["simulate", "relax", "Trajectory", "RelaxSolution", "RESULTS"]


# --------------------------------------------------------------------------- inputs


def _is_concrete(x) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jtu.tree_leaves(x))


def _float_dtype():
    return jnp.result_type(float)


def _arrayify_entropy(entropy, dtype):
    """Python-number parameters become arrays, so they are traced (no recompiles)."""
    return jtu.tree_map(
        lambda leaf: jnp.asarray(leaf, dtype) if isinstance(leaf, (int, float)) else leaf,
        entropy,
    )


# Default tolerances per precision: (rtol, atol, steady-state tol, Newton tol).
_DEFAULT_TOLS = {8: (1e-8, 1e-10, 1e-6, 1e-12), 4: (1e-5, 1e-7, 1e-3, 1e-5)}


def _default_tols(dtype, **given):
    """Fill the tolerances left as None with the defaults for `dtype` (float64 unless JAX's
    x64 mode is off: then float32, where the float64 defaults are unreachable), as arrays,
    checked: rtol, atol >= 0 with rtol + atol > 0; the steady-state and Newton tolerances
    > 0; all finite. (A tolerance of 0 or below would only surface as a run that never
    settles, long after the call.)"""
    rtol, atol, tol, polish = _DEFAULT_TOLS.get(jnp.dtype(dtype).itemsize, _DEFAULT_TOLS[4])
    defaults = dict(rtol=rtol, atol=atol, tol=tol, polish_tol=polish)
    out = {k: jnp.asarray(defaults[k] if v is None else v, dtype) for k, v in given.items()}
    for k, v in out.items():
        positive = k in ("tol", "polish_tol")
        ok = jnp.all(jnp.isfinite(v)) & jnp.all(v > 0 if positive else v >= 0)
        out[k] = _check(ok, f"{k} must be finite and {'> 0' if positive else '>= 0'}", v)
    if "rtol" in out and "atol" in out:
        out["rtol"] = _check(
            jnp.all(out["rtol"] + out["atol"] > 0), "rtol and atol cannot both be 0", out["rtol"]
        )
    return out


def _resolve_coords(coords) -> AbstractCoordinates:
    if isinstance(coords, AbstractCoordinates):
        return coords
    table = {"sphere": SphereCoordinates(), "simplex": SimplexCoordinates()}
    if coords not in table:
        raise ValueError(f"coords must be 'sphere' or 'simplex', got {coords!r}")
    return table[coords]


# The explicit solvers loop over their stages with `lax.scan` (one trace of the vector
# field instead of one per stage): noticeably faster to compile, same steps.
_SOLVERS = {
    "tsit5": lambda: diffrax.Tsit5(scan_kind="lax"),
    "dopri5": lambda: diffrax.Dopri5(scan_kind="lax"),
    "dopri8": lambda: diffrax.Dopri8(scan_kind="lax"),
    "kvaerno5": diffrax.Kvaerno5,
}


def _resolve_solver(solver) -> diffrax.AbstractSolver:
    if solver is None:
        return _SOLVERS["tsit5"]()
    if isinstance(solver, diffrax.AbstractSolver):
        return solver
    if isinstance(solver, str) and solver.lower() in _SOLVERS:
        return _SOLVERS[solver.lower()]()
    raise ValueError(
        f"solver must be a diffrax solver or one of {sorted(_SOLVERS)}, got {solver!r}"
    )


def _controller(solver, rtol, atol):
    if isinstance(solver, diffrax.AbstractImplicitSolver):
        return diffrax.PIDController(rtol=rtol, atol=atol)
    return diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=0.3, icoeff=0.3)


def _overdamped(mass) -> bool:
    """`mass == 0` (concretely) selects the first-order replicator flow."""
    if not _is_concrete(mass):
        return False
    m = np.asarray(mass)
    if np.any(m < 0) or not np.all(np.isfinite(m)):
        raise ValueError(f"mass must be finite and >= 0, got {mass}")
    if np.all(m == 0):
        return True
    if np.any(m == 0):
        raise ValueError(
            "mass = 0 (the overdamped flow, a first-order system) and mass > 0 cannot be "
            "mixed in one batch: solve them in separate calls"
        )
    return False


def _check(cond_ok, message, value):
    """Raise `ValueError(message)` now when concrete, else attach a runtime check."""
    if _is_concrete(cond_ok):
        if not bool(np.all(np.asarray(cond_ok))):
            raise ValueError(message)
        return value
    return eqx.error_if(value, ~jnp.all(cond_ok), message)


class _Problem(eqx.Module):
    system: FisherSystem
    rho0: Array
    velocity0: Array | None
    batch_shape: tuple[int, ...] = eqx.field(static=True)


def _prepare(entropy, scores, T, mass, damping, rho0, velocity0, overdamped, need_damping):
    if not isinstance(entropy, AbstractEntropy):
        raise TypeError(f"expected a fisherdyn entropy (e.g. Shannon()), got {entropy!r}")
    dtype = _float_dtype()
    z = jnp.asarray(scores)
    z = z.astype(dtype) if not jnp.issubdtype(z.dtype, jnp.floating) else z
    if jnp.finfo(z.dtype).bits < 32:
        # bfloat16 / float16: integrated in float32 (an adaptive solver cannot resolve
        # its tolerances in 8-10 mantissa bits); results come back in float32
        z = z.astype(jnp.float32)
    dtype = z.dtype
    if z.ndim == 0:
        raise ValueError("scores must have at least one axis (the keys)")
    n = z.shape[-1]
    if n < 2:
        raise ValueError(f"the dynamics needs at least 2 keys, got scores of shape {z.shape}")
    z = _check(jnp.all(jnp.isfinite(z)), "scores must be finite", z)
    T = jnp.asarray(T, dtype)
    T = _check(jnp.all(T > 0) & jnp.all(jnp.isfinite(T)), "T must be finite and > 0", T)
    mass = jnp.asarray(mass, dtype)
    damping = jnp.asarray(damping, dtype)
    damping = _check(
        jnp.all(damping >= 0) & jnp.all(jnp.isfinite(damping)),
        "damping must be finite and >= 0",
        damping,
    )
    if overdamped or need_damping:
        what = "the overdamped flow (mass = 0)" if overdamped else "relax"
        damping = _check(jnp.all(damping > 0), f"{what} needs damping > 0", damping)
    if not overdamped:
        mass = _check(jnp.all(mass > 0), "mass must be > 0 (or exactly 0: overdamped)", mass)
    entropy = _arrayify_entropy(entropy, dtype)

    if rho0 is None:
        rho0 = jnp.full((n,), 1.0 / n, dtype)
    else:
        rho0 = jnp.asarray(rho0, dtype)
        if rho0.shape[-1:] != (n,):
            raise ValueError(f"rho0 must have {n} weights on its last axis, got {rho0.shape}")
        ok = (
            jnp.all(rho0 >= 0, -1)
            & jnp.all(jnp.isfinite(rho0), -1)
            & (jnp.abs(jnp.sum(rho0, -1) - 1) <= 1e-9 * n)
        )
        rho0 = _check(ok, "rho0 must lie on the simplex (rho0 >= 0, sum(rho0) = 1)", rho0)
        if not entropy.finite_at_boundary:
            rho0 = _check(
                jnp.all(rho0 > 0),
                "Burg's free energy is infinite on the boundary: rho0 must be > 0",
                rho0,
            )
    if velocity0 is not None:
        if overdamped:
            raise ValueError("the overdamped flow (mass = 0) is first order: omit velocity0")
        v0 = jnp.asarray(velocity0, dtype)
        if v0.shape[-1:] != (n,):
            raise ValueError(f"velocity0 must have {n} entries on its last axis, got {v0.shape}")
        scale = 1.0 + jnp.max(jnp.abs(v0), -1)
        ok = (
            jnp.all(jnp.isfinite(v0), -1)
            & (jnp.abs(jnp.sum(v0, -1)) <= 1e-9 * n * scale)
            & jnp.all((rho0 > 0) | (v0 == 0), -1)
        )
        v0 = _check(
            ok,
            "velocity0 must be tangent to the simplex: sum(velocity0) = 0, and 0 wherever "
            "rho0 = 0 (a weight on the boundary cannot move with finite Fisher speed)",
            v0,
        )
    elif not overdamped:
        v0 = jnp.zeros_like(rho0)
    else:
        v0 = None

    leaves = [z[..., 0], T, mass, damping, rho0[..., 0]]
    leaves += [leaf for leaf in jtu.tree_leaves(entropy)]
    if v0 is not None:
        leaves.append(v0[..., 0])
    batch_shape = jnp.broadcast_shapes(*[jnp.shape(leaf) for leaf in leaves])
    system = FisherSystem(entropy, z, T, mass, damping)
    return _Problem(system, rho0, v0, tuple(batch_shape))


def _raise_if(out, failed):
    """Raise the result's message where `failed`. Called eagerly the check runs now, on the
    small result array alone (routing the weights through it would gather a sharded batch
    onto one device); under an outer jit it is attached to the weights."""
    if _is_concrete(failed):
        out.result.error_if(jnp.zeros(()), failed)
        return out
    return eqx.tree_at(lambda o: o.rho, out, out.result.error_if(out.rho, failed))


def _batch_shape(problem: _Problem, extra: tuple, extra_dims: tuple):
    """The problem's batch shape, widened by any batch axes of the extra arguments."""
    shapes = [problem.batch_shape]
    for e, d in zip(extra, extra_dims):
        if e is not None:
            shapes.append(jnp.shape(e)[: jnp.ndim(e) - d])
    return tuple(jnp.broadcast_shapes(*shapes))


def _broadcast_problem(problem: _Problem, extra: tuple, extra_dims: tuple, shape):
    """Broadcast every per-problem array to the batch shape and flatten it to one axis."""
    size = int(np.prod(shape)) if shape else 1
    s = problem.system

    def per_problem(x, event_dims):
        x = jnp.asarray(x)
        tail = x.shape[x.ndim - event_dims :] if event_dims else ()
        x = jnp.broadcast_to(x, shape + tail)
        return x.reshape((size,) + tail)

    entropy = jtu.tree_map(lambda leaf: per_problem(leaf, 0), s.entropy)
    system = FisherSystem(
        entropy,
        per_problem(s.scores, 1),
        per_problem(s.T, 0),
        per_problem(s.mass, 0),
        per_problem(s.damping, 0),
    )
    rho0 = per_problem(problem.rho0, 1)
    v0 = None if problem.velocity0 is None else per_problem(problem.velocity0, 1)
    extra = tuple(None if e is None else per_problem(e, d) for e, d in zip(extra, extra_dims))
    return system, rho0, v0, extra, size


def _unflatten(tree, shape):
    return jtu.tree_map(lambda x: x.reshape(shape + x.shape[1:]), tree)


def _run(single, problem: _Problem, extra: tuple, extra_dims: tuple, static):
    """Solve one problem, or vmap over the flattened batch. `extra_dims[i]` is the number of
    trailing (non-batch) axes of `extra[i]` (0: a per-problem scalar, 1: a shared grid)."""
    shape = _batch_shape(problem, extra, extra_dims)
    if shape == ():
        return _jit_single(single, problem.system, problem.rho0, problem.velocity0, extra, static)
    sharded = _batch_is_sharded((problem, extra))
    system, rho0, v0, extra, _ = _broadcast_problem(problem, extra, extra_dims, shape)
    out = _jit_batch(single, system, rho0, v0, extra, static, sharded)
    return _unflatten(out, shape)


def _explicit_batch_axis(tree):
    """(mesh, axis) splitting the batch (leading) axis of an explicitly sharded input."""
    for leaf in jtu.tree_leaves(tree):
        sharding = jax.typeof(leaf).sharding
        spec = getattr(sharding, "spec", None)
        if spec is not None and len(spec) and spec[0] is not None:
            return sharding.mesh, spec[0]
    return None


def _batch_is_sharded(tree) -> bool:
    """Whether the batch is split over several devices (`jax.sharding`): an input whose type
    names a mesh axis on its batch axis (explicit sharding), or a concrete array that is not
    fully replicated (automatic sharding inside an outer jit is invisible here, and XLA
    partitions the blocked loop as it sees fit)."""
    if _explicit_batch_axis(tree) is not None:
        return True
    return any(
        isinstance(leaf, jax.Array)
        and not isinstance(leaf, jax.core.Tracer)
        and not leaf.sharding.is_fully_replicated
        for leaf in jtu.tree_leaves(tree)
    )


@eqx.filter_jit
def _jit_single(single, system, rho0, v0, extra, static):
    return single(system, rho0, v0, extra, static)


# Problems per vmapped block: large batches run as a sequence of blocks (`lax.map` with
# `batch_size`) so that each block's state stays in cache, and each block stops at its own
# slowest member instead of the whole batch's. A batch sharded over devices is vmapped
# whole: XLA partitions the vmapped loop, each device running its own shard.
_BLOCK = 256


@eqx.filter_jit
def _jit_batch(single, system, rho0, v0, extra, static, sharded=False):
    fn = lambda args: single(*args, static)  # noqa: E731
    size = rho0.shape[0]
    args = (system, rho0, v0, extra)
    if sharded:
        found = _explicit_batch_axis(args)
        if found is not None:
            # Explicit sharding: Diffrax's internals are written for automatic sharding, so
            # the solve runs with the mesh axis switched to automatic (`auto_axes`), its
            # inputs and outputs split along the batch.
            mesh, axis = found

            def split(x):
                return NamedSharding(mesh, P(axis, *([None] * (jnp.ndim(x) - 1))))

            args = jtu.tree_map(lambda x: jax.sharding.reshard(x, split(x)), args)
            plain = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), x.dtype), args)
            out = eqx.filter_eval_shape(jax.vmap(fn), plain)
            return jax.sharding.auto_axes(
                jax.vmap(fn), axes=axis, out_sharding=jtu.tree_map(split, out)
            )(args)
    if size <= _BLOCK or sharded:
        return jax.vmap(fn)(args)
    return jax.lax.map(fn, (system, rho0, v0, extra), batch_size=_BLOCK)


# --------------------------------------------------------------------------- trajectories


class Trajectory(eqx.Module):
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
      `boundary_reached`); `stats`: Diffrax's step counts.
    """

    ts: Array
    rho: Array
    rho_dot: Array
    lam: Array
    energy: Array
    t_final: Array
    rho_final: Array
    rho_dot_final: Array
    constraint_drift: Array
    result: RESULTS
    stats: dict[str, Any]
    coords: str = eqx.field(static=True)
    overdamped: bool = eqx.field(static=True)


class _Static(eqx.Module):
    coords: AbstractCoordinates = eqx.field(static=True)
    solver: diffrax.AbstractSolver = eqx.field(static=True)
    overdamped: bool = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    n_save: int = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    boundary_event: bool = eqx.field(static=True)


def _term(coords, overdamped):
    field = coords.overdamped_field if overdamped else coords.vector_field
    return diffrax.ODETerm(lambda t, y, args: field(t, y, args[0]))


def _meter(progress):
    return diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter()


def _trajectory(sol, y0, system, coords, overdamped, result) -> Trajectory:
    """Observables of a solve saved with `SaveAt(ts=..., t1=True)`."""
    # The buffer holds the requested save times and then the final state. An event stops
    # the solve early, and Diffrax then writes the final state right after the last save
    # time reached: the last finite entry is the final state, the ones before are saves.
    k = jnp.sum(jnp.isfinite(sol.ts)) - 1
    y_final = jtu.tree_map(lambda y: y[k], sol.ys)
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


def _simulate_single(system, rho0, v0, extra, static: _Static):
    t1, rtol, atol, boundary_tol, ts = extra
    coords = static.coords
    y0 = coords.from_simplex(rho0, None if static.overdamped else v0)
    if ts is None:
        ts = t1 * jnp.linspace(0.0, 1.0, static.n_save, dtype=rho0.dtype)
    event = None
    if static.boundary_event:
        event = diffrax.Event(
            lambda t, y, args, **kw: SimplexCoordinates.boundary_hit(y, args[0], args[1])
        )
    sol = diffrax.diffeqsolve(
        _term(coords, static.overdamped),
        static.solver,
        t0=jnp.zeros((), rho0.dtype),
        t1=t1,
        dt0=None,
        y0=y0,
        args=(system, boundary_tol),
        saveat=diffrax.SaveAt(ts=ts, t1=True),
        stepsize_controller=_controller(static.solver, rtol, atol),
        event=event,
        max_steps=static.max_steps,
        throw=False,
        progress_meter=_meter(static.progress),
    )
    result = RESULTS.promote(sol.result)
    result = RESULTS.where(
        sol.result == diffrax.RESULTS.event_occurred, RESULTS.boundary_reached, result
    )
    return _trajectory(sol, y0, system, coords, static.overdamped, result)


def simulate(
    entropy: AbstractEntropy,
    scores,
    T=1.0,
    *,
    mass=1.0,
    damping=1.0,
    rho0=None,
    velocity0=None,
    t1=10.0,
    saveat=201,
    coords="sphere",
    rtol=None,
    atol=None,
    max_steps: int = 100_000,
    solver=None,
    boundary_tol=1e-8,
    throw: bool = True,
    progress: bool = False,
) -> Trajectory:
    """Integrate the damped Fisher-Lagrangian dynamics of the attention weights.

    $m(\\ddot\\rho_i/\\rho_i - \\tfrac12\\dot\\rho_i^2/\\rho_i^2) + \\gamma\\dot\\rho_i/\\rho_i
    + E_i - T h_i(\\rho) = \\lambda(t)$ on the simplex (MATH.md §6), from `rho0` with velocity
    `velocity0`; `mass = 0` integrates the first-order replicator (Fisher-Rao gradient) flow
    $\\gamma\\dot\\rho_i = \\rho_i(\\lambda - g_i)$ instead.

    **Arguments:**
    - `entropy`, `scores`, `T`: the problem (scores' leading axes are batch axes).
    - `mass` ($m \\ge 0$), `damping` ($\\gamma \\ge 0$; > 0 when m = 0): scalars or per-problem.
    - `rho0`: initial weights on the simplex (default uniform); `velocity0`: initial
      $\\dot\\rho$, tangent to the simplex (default 0). Off the simplex / tangent space is a
      `ValueError` (a runtime error under `jit`).
    - `t1`: final time (t0 = 0). `saveat`: number of equally spaced save times in [0, t1],
      or an array of non-decreasing times in [0, t1] (one row per problem, or shared).
    - `coords`: `"sphere"` ($\\rho = x^2$, default; smooth through the boundary) or
      `"simplex"` (stops with `RESULTS.boundary_reached` where a weight hits 0 in finite
      time: within `boundary_tol` and closing in faster than $0.1\\sqrt{m/T}$).
    - `rtol`, `atol`: PID step-size controller tolerances (default 1e-8, 1e-10 in float64;
      1e-5, 1e-7 in float32, i.e. when JAX's x64 mode is off). `solver`: a diffrax solver or one
      of `"tsit5"` (default), `"dopri5"`, `"dopri8"`, `"kvaerno5"` (stiff, implicit).
    - `max_steps`: static step budget. `throw`: raise on a failed solve (max_steps, ...); a
      boundary event is a result, not an error. `progress`: show Diffrax's tqdm meter.

    **Returns:** a `Trajectory` (batched over the leading axes when given a batch).
    """
    overdamped = _overdamped(mass)
    problem = _prepare(entropy, scores, T, mass, damping, rho0, velocity0, overdamped, False)
    coords = _resolve_coords(coords)
    solver = _resolve_solver(solver)
    dtype = problem.rho0.dtype
    tols = _default_tols(dtype, rtol=rtol, atol=atol)
    rtol, atol = tols["rtol"], tols["atol"]
    if isinstance(saveat, (int, np.integer)) and not isinstance(saveat, bool):
        if saveat < 2:
            raise ValueError(f"saveat must be >= 2 save points, got {saveat}")
        ts, n_save = None, int(saveat)
    else:
        ts = jnp.asarray(saveat, dtype)
        if ts.ndim == 0 or ts.shape[-1] < 1:
            raise ValueError("saveat must be an int, or an array of times (one row per problem)")
        n_save = ts.shape[-1]
    t1 = jnp.asarray(t1, dtype)
    t1 = _check(jnp.all(t1 > 0) & jnp.all(jnp.isfinite(t1)), "t1 must be finite and > 0", t1)
    if ts is not None:
        ts = _check(
            jnp.all(ts >= 0) & jnp.all(jnp.diff(ts, axis=-1) >= 0) & jnp.all(ts[..., -1] <= t1),
            "saveat times must be non-decreasing and lie in [0, t1]",
            ts,
        )
    static = _Static(
        coords,
        solver,
        overdamped,
        int(max_steps),
        n_save,
        bool(progress),
        isinstance(coords, SimplexCoordinates) and not overdamped,
    )
    extra = (t1, *(jnp.asarray(v, dtype) for v in (rtol, atol, boundary_tol)), ts)
    out = _run(_simulate_single, problem, extra, (0, 0, 0, 0, 1), static)
    if throw:
        failed = (out.result != RESULTS.successful) & (out.result != RESULTS.boundary_reached)
        out = _raise_if(out, failed)
    return out


# --------------------------------------------------------------------------- fixed points


class RelaxSolution(eqx.Module):
    """The fixed point the damped dynamics converged to.

    **Fields:**
    - `rho`: the polished fixed point $\\rho^*$ (exact zeros off the support);
      `lam`: its multiplier $\\lambda^*$ (so $E_i - T h_i(\\rho^*) = \\lambda^*$ on the support).
    - `t`: the time at which the steady-state event fired.
    - `residual`: $\\max_{i \\in A}|g_i - \\lambda^*|$ together with the off-support
      violation $\\max_{i\\notin A}(\\lambda^* - g_i(0))_+$ and $|\\sum\\rho^* - 1|$.
    - `rho_end`: the integrated end point before polishing.
    - `result`: `fisherdyn.RESULTS`; `stats`: integration steps, Newton steps, the size of the
      polish step.
    - `path`: the integrated `Trajectory` on the `saveat` times (None unless asked for); times
      after the steady-state event are `inf`.
    """

    rho: Array
    lam: Array
    t: Array
    residual: Array
    rho_end: Array
    result: RESULTS
    stats: dict[str, Any]
    path: Trajectory | None = None


def _state_norm(tree):
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in jtu.tree_leaves(tree)]))


def _newton_on_support(entropy, z, T, active, u0, lam0, rtol):
    """Newton on the stationary conditions restricted to the support `active`, from
    $(u_0, \\lambda_0)$: returns (rho, lam, residual, converged, off-support violation,
    Newton steps, the final u)."""

    def weights(u):
        return jnp.where(active, jnp.exp(jnp.where(active, u, 0.0)), 0.0)

    def fn(y, _):
        u, lam = y
        rho = weights(u)
        g = forces(entropy, rho, z, T)
        r = jnp.where(active, (g - lam) / T, u)
        return r, jnp.sum(rho) - 1

    # The Newton system is bordered diagonal ((g_i - lambda)/T depends on u_i alone, plus a
    # rank-one term through M_q for Renyi / Sharma-Mittal), so a dense LU would cost O(N^3)
    # per step (N = 4096: 10 s of a 10.2 s relax). Scaled by its diagonal at the start, the
    # system is the identity plus rank two or three, and GMRES solves it in a few O(N)
    # matrix-free products (the scaling leaves the root, and its implicit derivative,
    # unchanged). The diagonal is the derivative of the forces with the moment held fixed,
    # a separable law, so one JVP along ones gives it exactly.
    if isinstance(entropy, AbstractTsallisShapedEntropy):
        frozen = entropy.tsallis()
        T_frozen = T * entropy.temperature_factor(entropy.moment(weights(u0)))
    else:
        frozen, T_frozen = entropy, T

    def frozen_residual(u):
        return jnp.where(active, forces(frozen, weights(u), z, T_frozen) / T, u)

    _, diag = jax.jvp(frozen_residual, (u0,), (jnp.ones_like(u0),))
    diag = jax.lax.stop_gradient(diag)
    usable = jnp.isfinite(diag) & (diag != 0)
    scale = jnp.where(usable, 1.0 / jnp.where(usable, diag, 1.0), 1.0)

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
    rho = weights(u)
    rho = rho / jnp.sum(rho)
    g = forces(entropy, rho, z, T)
    on = jnp.max(jnp.where(active, jnp.abs(g - lam), 0.0))
    off = jnp.max(
        jnp.where(active, 0.0, jnp.maximum(lam - boundary_forces(entropy, rho, z, T), 0.0))
    )
    residual = jnp.maximum(jnp.maximum(on, off), jnp.abs(jnp.sum(rho) - 1))
    converged = sol.result == optx.RESULTS.successful
    return rho, lam, residual, converged, off, sol.stats["num_steps"], u


def _polish(system: FisherSystem, rho_end, lam_end, rtol):
    """Newton on the stationary conditions, from the integrated end point.

    Unknowns $(u, \\lambda)$ with $\\rho_i = e^{u_i}$ on the support; equations
    $(g_i(\\rho) - \\lambda)/T = 0$ on the support, $\\sum\\rho = 1$. The support is the
    dynamics': a component is off it where the boundary force beats the multiplier,
    $g_i(0) > \\lambda$ (possible only for the cutoff families) - there its weight is 0.
    """
    entropy, z, T = system.entropy, system.scores, system.T
    active = ~(boundary_forces(entropy, rho_end, z, T) > lam_end)
    u0 = jnp.where(active & (rho_end > 0), jnp.log(jnp.where(rho_end > 0, rho_end, 1.0)), 0.0)
    # a support component the integration left at exactly 0 (only if it started there: faces
    # are invariant) starts at a tiny weight, and the result says support_inconsistent
    u0 = jnp.where(active & (rho_end <= 0), jnp.log(jnp.finfo(rho_end.dtype).tiny) / 4, u0)
    rho, lam, residual, ok_newton, off, steps, u = _newton_on_support(
        entropy, z, T, active, u0, lam_end, rtol
    )
    if may_have_cutoff(entropy):
        # A key whose boundary force sits within the steady-state tolerance of the multiplier
        # can be on the wrong side of it at the end point: Newton then drives its weight to
        # 0 without converging (seen for Renyi(2) at N = 4096). Retry once on the support
        # that the multiplier Newton reached selects.
        lam_ok = jnp.isfinite(lam)
        retry_active = active & ~(boundary_forces(entropy, rho_end, z, T) > lam)
        retry = ~ok_newton & lam_ok & jnp.any(retry_active != active)
        active = jnp.where(retry, retry_active, active)
        # (from the first solve's end: where no retry is needed, the second solve - computed
        # for every problem, then discarded - starts at the root and stops at once)
        u_start = jnp.where(jnp.all(jnp.isfinite(u)), u, u0)
        second = _newton_on_support(
            entropy, z, T, active, u_start, jnp.where(lam_ok, lam, lam_end), rtol
        )
        rho, lam, residual, ok_newton, off, steps2, _ = jax.tree.map(
            lambda new, old: jnp.where(retry, new, old),
            second,
            (rho, lam, residual, ok_newton, off, steps, u),
        )
        steps = jnp.where(retry, steps + steps2, steps)
    # a component the dynamics left at exactly 0 while the boundary force pulls it inward:
    # the run rests on an invariant face at a point that is not a fixed point of the simplex
    stuck = jnp.any(active & (rho_end <= 0))
    ok_support = (off <= 0) & ~stuck
    return rho, lam, residual, ok_newton, ok_support, steps


class _RelaxStatic(eqx.Module):
    coords: AbstractCoordinates = eqx.field(static=True)
    solver: diffrax.AbstractSolver = eqx.field(static=True)
    overdamped: bool = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    progress: bool = eqx.field(static=True)


def _relax_single(system, rho0, v0, extra, static: _RelaxStatic):
    t1, rtol, atol, tol, polish_tol, path_ts = extra
    coords = static.coords
    # The fixed point's derivative is the implicit-function derivative of the stationary
    # conditions (optimistix differentiates the Newton root); the path that led there is
    # irrelevant to it, so the integration sees no tangents (this also allows forward mode).
    system_const = jax.lax.stop_gradient(system)
    rho0, v0, t1, rtol, atol, tol = jax.lax.stop_gradient((rho0, v0, t1, rtol, atol, tol))
    y0 = coords.from_simplex(rho0, None if static.overdamped else v0)
    field = coords.overdamped_field if static.overdamped else coords.vector_field

    def steady(t, y, args, **kwargs):
        return _state_norm(field(t, y, args[0])) < args[1]

    sol = diffrax.diffeqsolve(
        _term(coords, static.overdamped),
        static.solver,
        t0=jnp.zeros((), rho0.dtype),
        t1=t1,
        dt0=None,
        y0=y0,
        args=(system_const, tol),
        saveat=diffrax.SaveAt(t1=True) if path_ts is None else diffrax.SaveAt(ts=path_ts, t1=True),
        stepsize_controller=_controller(static.solver, rtol, atol),
        event=diffrax.Event(steady),
        max_steps=static.max_steps,
        throw=False,
        # nothing is differentiated through the path (see above): a plain while loop, no
        # checkpointing (much faster under vmap)
        adjoint=diffrax.ForwardMode(),
        progress_meter=_meter(static.progress),
    )
    k = jnp.sum(jnp.isfinite(sol.ts)) - 1  # the final state (see `_trajectory`)
    y_end = jtu.tree_map(lambda y: y[k], sol.ys)
    t_end = sol.ts[k]
    rho_end, lam_end = coords.weights_and_multiplier(y_end, system_const, static.overdamped)
    # Keep a failed run's numbers finite so the polish below stays well defined.
    finite = jnp.all(jnp.isfinite(rho_end)) & jnp.isfinite(lam_end)
    rho_end = jnp.where(finite, rho_end, rho0)
    lam_end = jnp.where(finite, lam_end, 0.0)
    rho, lam, residual, ok_newton, ok_support, n_newton = _polish(
        system, rho_end, lam_end, polish_tol
    )
    converged = sol.result == diffrax.RESULTS.event_occurred
    result = RESULTS.where(
        converged,
        RESULTS.successful,
        RESULTS.where(
            sol.result == diffrax.RESULTS.successful,
            RESULTS.steady_state_not_reached,
            RESULTS.promote(sol.result),
        ),
    )
    result = RESULTS.where(converged & ~ok_newton, RESULTS.polish_failed, result)
    result = RESULTS.where(
        converged & ok_newton & ~ok_support, RESULTS.support_inconsistent, result
    )
    stats = {
        "num_steps": sol.stats["num_steps"],
        "num_newton_steps": n_newton,
        "polish_shift": jnp.max(jnp.abs(rho - rho_end)),
    }
    path = None
    if path_ts is not None:
        path = _trajectory(sol, y0, system_const, coords, static.overdamped, result)
    return RelaxSolution(rho, lam, t_end, residual, rho_end, result, stats, path)


def _default_t1(problem: _Problem, overdamped):
    s = problem.system
    # a long multiple of the slowest Shannon-like time scale: overdamped omega^2/gamma,
    # inertial min(gamma/(2m), omega^2/gamma) with omega^2 ~ T
    scale = s.damping / s.T
    if not overdamped:
        scale = scale + 2 * s.mass / s.damping + jnp.sqrt(s.mass / s.T)
    return 1e4 * scale


def relax(
    entropy: AbstractEntropy,
    scores,
    T=1.0,
    *,
    mass,
    damping,
    rho0=None,
    velocity0=None,
    tol=None,
    t1=None,
    rtol=None,
    atol=None,
    polish_tol=None,
    max_steps: int = 200_000,
    solver=None,
    saveat=None,
    throw: bool = True,
    progress: bool = False,
) -> RelaxSolution:
    """The fixed point reached by the damped dynamics: integrate to a steady state, then
    polish the end point with Newton's method.

    Integrates the sphere chart (MATH.md §6) from `rho0` (default uniform) until the vector
    field's max-norm drops below `tol` (a `diffrax.Event`), then solves the stationary
    conditions $E_i - T h_i(\\rho) = \\lambda$ on the support the dynamics selected,
    $\\sum\\rho = 1$, by `optimistix.Newton` from the end point. A run that did not reach a
    steady state, a polish that did not converge, or an end point whose boundary components
    are pulled inward is never reported as converged.

    **Arguments:**
    - `entropy`, `scores`, `T`, `mass` ($m \\ge 0$; 0 = overdamped replicator flow),
      `damping` ($\\gamma > 0$), `rho0`, `velocity0`: as in `simulate`.
    - `tol`: steady-state threshold on the max-norm of the vector field (default 1e-6;
      float32: 1e-3). It only has to put
      the end point in Newton's basin; keep it well above the integrator's noise floor near
      a fixed point (about `rtol` x the fastest rate: explicit solvers jitter the stiff
      modes at the tolerance level). `polish_tol`: Newton tolerance (1e-12; float32 1e-5).
    - `t1`: give up after this time (default $10^4$ x the slowest Shannon-like time scale).
    - `rtol`, `atol`, `solver`, `max_steps`, `progress`: integration, as in `simulate`.
    - `saveat`: optional times at which to also record the path (`.path`): shape (K,), or
      (batch..., K) for one grid per problem.
    - `throw`: raise unless `result` is successful (else inspect `result`).

    **Returns:** a `RelaxSolution` (batched over the leading axes when given a batch).
    `rho` and `lam` are differentiable (forward and reverse mode) with respect to the scores,
    T and the entropy's parameters: their derivative is that of the stationary conditions at
    the fixed point (implicit function theorem, through `optimistix.root_find`); the
    integrated path is not differentiated.
    """
    overdamped = _overdamped(mass)
    problem = _prepare(entropy, scores, T, mass, damping, rho0, velocity0, overdamped, True)
    dtype = problem.rho0.dtype
    tols = _default_tols(dtype, rtol=rtol, atol=atol, tol=tol, polish_tol=polish_tol)
    rtol, atol, tol, polish_tol = (tols[k] for k in ("rtol", "atol", "tol", "polish_tol"))
    if t1 is None:
        t1 = _default_t1(problem, overdamped)
    else:
        t1 = jnp.asarray(t1, dtype)
        t1 = _check(jnp.all(t1 > 0) & jnp.all(jnp.isfinite(t1)), "t1 must be finite and > 0", t1)
    static = _RelaxStatic(
        SphereCoordinates(), _resolve_solver(solver), overdamped, int(max_steps), bool(progress)
    )
    extra = tuple(jnp.asarray(v, dtype) for v in (t1, rtol, atol, tol, polish_tol))
    if saveat is not None:
        saveat = jnp.asarray(saveat, dtype)
        if saveat.ndim == 0:
            raise ValueError("saveat must be a 1-D array of times, or one per problem (or None)")
    out = _run(_relax_single, problem, (*extra, saveat), (0, 0, 0, 0, 0, 1), static)
    if throw:
        out = _raise_if(out, out.result != RESULTS.successful)
    return out
