"""The programs behind `fit_path`: the model trajectory, its residuals, the vmapped
Levenberg-Marquardt fit and the summary of a fit.

One compiled program serves both orders (a `lax.switch` on a traced index), both energy
models (a score schedule) and every family compiled into it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx

from .._custom_types import Array, Float
from .._dynamics import FisherSystem, SphereCoordinates, relaxation_spectrum
from .._misc import RUN_ONCE
from ._charts import FAMILIES, Family
from ._geometry import angle_from_chord2, chord2

LOG_BOX = 6.0  # each of log(m/gamma), log gamma, log T stays within +-6 e-folds of its scale
FLOOR = 1e-6  # rho0 is mixed with this much of the uniform law (keeps zeros movable)
_COORDS = SphereCoordinates()


class FitData(NamedTuple):
    """One path, arrays only (the fit program is vmapped over a batch of these)."""

    times: Float[Array, " K"]
    sqrt_rho: Float[Array, "K N"]  # measured sqrt(rho)
    weights: Float[Array, " K"]  # 1 on the fitted layers, 0 elsewhere (layer 0 included)
    scores: Float[Array, "K N"]  # the energy schedule actually used (-E)
    x0: Float[Array, " N"]  # initial sphere point
    scale: Float[Array, " 3"]  # reference log(m/gamma), log gamma, log T


def unpack(p, data: FitData, overdamped):
    """Physical parameters from the unconstrained vector p = (a_m, a_gamma, a_T, u, w).

    `overdamped` may be traced: then the mass and the velocity entries are ignored (their
    Jacobian columns vanish) and m = 0, v0 = 0 are reported."""
    box = lambda a, ref: ref + LOG_BOX * jnp.tanh(a / LOG_BOX)  # noqa: E731
    damping = jnp.exp(box(p[1], data.scale[1]))
    # p[0] charts the inertial time m/gamma, so that m -> 0 is reachable whatever gamma is
    mass = jnp.where(overdamped, 0.0, damping * jnp.exp(box(p[0], data.scale[0])))
    T = jnp.exp(box(p[2], data.scale[2]))
    u = p[3]
    w = p[4:]
    span = data.times[-1] - data.times[0]
    v0 = jnp.where(overdamped, 0.0, (w - data.x0 * jnp.dot(data.x0, w)) / span)
    return mass, damping, T, u, v0


def _score_at(t, times, scores):
    """Piecewise-linear interpolation of the score schedule (held constant outside)."""
    return jax.vmap(lambda col: jnp.interp(t, times, col), in_axes=1)(scores)


class FitStatic(eqx.Module):
    """What the fit program is compiled for: the ODE step budget and the families."""

    max_steps: int = eqx.field(static=True)
    # the families compiled into the program's lax.switch (indices into FAMILIES); the
    # traced family index is a position in this tuple
    compiled: tuple = eqx.field(static=True)
    # "tsit5" (explicit) or "kvaerno5" (implicit: an inertial time far below a layer step)
    solver: str = eqx.field(static=True, default="tsit5")


def _branches(fam: Family, u, T, mass, damping):
    """(inertial, overdamped) vector fields of one family on the state (x, v)."""

    def inertial(t, y, z):
        return _COORDS.vector_field(t, y, FisherSystem(fam.build(u), z, T, mass, damping))

    def overdamped(t, y, z):
        x, v = y
        # the mass is a placeholder here (the overdamped field does not read it)
        system = FisherSystem(fam.build(u), z, T, jnp.ones_like(T), damping)
        return _COORDS.overdamped_field(t, x, system), jnp.zeros_like(v)

    return inertial, overdamped


def solve(family_index, overdamped, p, data: FitData, grids, static: FitStatic, rtol, atol):
    """The model's unit sphere points |x|/||x|| on each time grid of `grids` (a tuple of
    non-decreasing arrays, one solve), and a success flag.

    One program for every compiled family and both orders: `lax.switch` on the traced index
    `2 * family_index + overdamped` (`family_index`: a position in `static.compiled`); the
    state is (x, v) in both (v frozen at 0 when overdamped)."""
    mass, damping, T, u, v0 = unpack(p, data, overdamped)
    branches = [b for i in static.compiled for b in _branches(FAMILIES[i], u, T, mass, damping)]
    index = 2 * family_index + overdamped.astype(family_index.dtype)

    def vector_field(t, y, args):
        z = _score_at(t, data.times, data.scores)
        return jax.lax.switch(index, branches, t, y, z)

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vector_field),
        diffrax.Kvaerno5() if static.solver == "kvaerno5" else diffrax.Tsit5(scan_kind="lax"),
        data.times[0],
        jnp.max(jnp.stack([g[-1] for g in grids])),
        None,
        (data.x0, v0),
        saveat=diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=g, fn=lambda t, y, a: y[0])
                                    for g in grids]),
        # no jump_ts at the layer-time kinks of model B: the forced stops spend the step
        # budget that the smooth stretches need
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=0.3, icoeff=0.3),
        max_steps=static.max_steps,
        adjoint=diffrax.ForwardMode(),
        throw=False,
    )
    xs = sol.ys
    ok = (sol.result == diffrax.RESULTS.successful) & jnp.all(
        jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs]))
    out = []
    for x in xs:
        x = jnp.where(ok, x, data.x0)
        out.append(jnp.abs(x) / jnp.linalg.norm(x, axis=-1, keepdims=True))
    return out, ok


def _residuals(p, args):
    """Residual vector whose squared norm is the weighted summed squared FR distance: per
    layer, $(a - \\sqrt\\rho)\\,d/\\|a - \\sqrt\\rho\\|$ (smooth; the ratio is 2 at 0)."""
    family_index, overdamped, data, static, rtol, atol = args
    (a,), ok = solve(family_index, overdamped, p, data, (data.times,), static, rtol, atol)
    return residuals_of(a, ok, data)


def residuals_of(a, ok, data):
    """The residual vector of `_residuals` from the model's sphere points `a`."""
    diff = a - data.sqrt_rho
    c2 = jnp.sum(diff**2, -1, keepdims=True)
    small = c2 < 1e-10
    c2s = jnp.where(small, 1.0, c2)
    ratio = jnp.where(small, 2.0 + c2 / 12.0, angle_from_chord2(c2s) / jnp.sqrt(c2s))
    r = diff * ratio * jnp.sqrt(data.weights)[:, None]
    # a failed solve costs more than any path can (max distance is pi per layer)
    return jnp.where(ok, r, jnp.pi).reshape(-1)


@eqx.filter_jit
def fit_program(family_index, overdamped, data: FitData, inits, predict_times,
                static: FitStatic, lm_tol, rtol, atol, max_lm_steps):
    """Levenberg-Marquardt from every initial guess (vmapped over paths and restarts);
    returns the best parameters, each restart's loss and the best fitted path (at the data
    times and at `predict_times`)."""
    solver = optx.LevenbergMarquardt(rtol=lm_tol, atol=lm_tol)

    def one_restart(p0, d):
        args = (family_index, overdamped, d, static, rtol, atol)
        sol = optx.least_squares(
            _residuals, solver, p0, args, max_steps=max_lm_steps, throw=False
        )
        (a, b), ok = solve(family_index, overdamped, sol.value, d, (d.times, predict_times),
                           static, rtol, atol)
        loss = jnp.sum(residuals_of(a, ok, d) ** 2)
        return sol.value, jnp.where(ok, loss, jnp.inf), a, b, ok

    # one vmap over (path, restart) pairs: a second, nested vmap would transform the whole
    # program twice (tracing time)
    n_paths, restarts = inits.shape[:2]
    rep = lambda x: jnp.repeat(x, restarts, axis=0)  # noqa: E731
    # the barrier hides that the restarts' copies of one path are a broadcast, on which
    # XLA's algebraic simplifier loops (a page of warnings on stderr per compilation)
    flat = jax.lax.optimization_barrier(jax.tree_util.tree_map(rep, data))
    ps, losses, a, b, ok = jax.vmap(one_restart)(inits.reshape((-1,) + inits.shape[2:]), flat)
    losses = losses.reshape(n_paths, restarts)
    best = jnp.argmin(losses, -1) + restarts * jnp.arange(n_paths)
    return ps[best], losses, a[best], b[best], ok[best]


@functools.partial(eqx.filter_jit, **RUN_ONCE)
def predict_program(family_index, overdamped, params, data: FitData, times,
                    static: FitStatic, rtol, atol):
    """The fitted paths' unit sphere points at `times` (vmapped over paths) and their
    success flags."""

    def one(p, d):
        (a,), ok = solve(family_index, overdamped, p, d, (times,), static, rtol, atol)
        return a, ok

    return jax.vmap(one)(params, data)


@functools.partial(jax.jit, static_argnames=("fam_index",), **RUN_ONCE)
def summarize(params, losses, a, ok, data: FitData, overdamped, k, *, fam_index):
    """Physical parameters, distances, information criteria and the linear response
    (compiled once per family: `overdamped` and the parameter count `k` are traced)."""
    fam = FAMILIES[fam_index]
    N = a.shape[-1]
    mass, damping, T, u, v0x = jax.vmap(lambda p, d: unpack(p, d, overdamped))(params, data)
    entropy = fam.build(u)
    ok = ok & jnp.isfinite(jnp.min(losses, -1))
    dist = angle_from_chord2(chord2(a, data.sqrt_rho))
    loss = jnp.where(ok, jnp.sum(data.weights * dist**2, -1), jnp.inf)
    n_obs = (jnp.sum(data.weights[:, 1:] > 0, -1) * (N - 1)).astype(a.dtype)
    misfit = n_obs * jnp.log(jnp.maximum(loss, 1e-300) / n_obs)
    aic = misfit + 2 * k
    bic = misfit + k * jnp.log(n_obs)
    velocity0 = 2 * data.x0 * v0x  # rho_dot(0) = 2 x x_dot
    # linear response about the fixed point of the final energies
    spec = jax.vmap(lambda e, z, t, m, g: relaxation_spectrum(e, z, t, mass=m, damping=g))(
        entropy, data.scores[:, -1], T, mass, damping)
    soft = jnp.min(spec.omega2, -1)
    safe_m = jnp.where(overdamped, 1.0, mass)
    zeta = jnp.where(overdamped, jnp.inf,
                     damping / (2 * jnp.sqrt(safe_m * jnp.maximum(soft, 1e-300))))
    logs = jnp.stack([jnp.where(overdamped, data.scale[:, 0], jnp.log(safe_m / damping)),
                      jnp.log(damping), jnp.log(T)], -1)
    at_bound = jnp.any(jnp.abs(logs - data.scale) > 0.95 * LOG_BOX, -1)
    return dict(entropy=entropy, shape=fam.value(u), mass=mass, damping=damping, T=T,
                velocity0=velocity0, loss=loss, distances=dist, rho=a * a, success=ok,
                n_obs=n_obs, aic=aic, bic=bic, zeta=zeta,
                relaxation_time=1.0 / spec.slowest_rate, at_bound=at_bound)

