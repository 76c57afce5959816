"""The damped dynamics under piecewise-constant scores (a zero-order hold), one interval at
a time: what an attention layer whose weights carry a state across a model's loops computes
(`fisherdyn.FisherLoop`, `fisherdyn.LinearScoreLoop`).

- `fisher_loop_step`, `fisher_score_dynamics`: the damped Fisher-Lagrangian dynamics
  (docs/math.md §6) in the sphere chart $\\psi = \\sqrt\\rho$, at fixed scores over each
  interval.
- `linear_score_step`, `linear_score_dynamics`: a damped linear oscillator in score space,
  $\\ddot z = a(s - z) - b\\dot z$ per key, read out through the normalizer,
  $\\rho = \\mathrm{stationary}(S, z, T)$: second order, but not the Fisher geometry.

Scores held over an interval $[t_l, t_{l+1})$ are $s_l$; both start at rest from the
uniform weights ($\\psi = 1/\\sqrt n$, resp. $z = 0$) unless told otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from .._custom_types import Array, ArrayLike, Float
from .._entropies import AbstractEntropy
from .._stationary import stationary
from ._coordinates import SphereCoordinates
from ._system import FisherSystem

__all__ = [
    "fisher_loop_step",
    "linear_score_step",
    "linear_score_dynamics",
    "fisher_score_dynamics",
]


def fisher_loop_step(
    entropy: AbstractEntropy,
    scores: Float[Array, "*batch N"],
    state: tuple[Float[Array, "*batch N"], Float[Array, "*batch N"]],
    T: Float[ArrayLike, "*#batch"],
    *,
    mass: Float[ArrayLike, "*#batch"],
    damping: Float[ArrayLike, "*#batch"],
    dt: float,
    substeps: int = 4,
) -> tuple[Float[Array, "*batch N"], Float[Array, "*batch N"]]:
    """Advance the damped Fisher-Lagrangian dynamics by `dt` at fixed scores, sphere chart.

    `substeps` classical Runge-Kutta (RK4) steps of `SphereCoordinates().vector_field`,
    the equation `fisherdyn.simulate` integrates:
    $4m\\ddot\\psi_i = 2\\psi_i(\\lambda - g_i) - 4\\gamma\\dot\\psi_i$,
    $g = -z - T h(\\psi^2)$. The local error is $O((dt/\\text{substeps})^5)$.

    **Arguments:**

    - `entropy`: the family; `scores`: the scores $z$ held fixed over the step.
    - `state`: `(position, velocity)`, $(\\psi, \\dot\\psi)$ (leading axes are batch axes;
      $\\sum\\psi^2 = 1$, $\\psi\\cdot\\dot\\psi = 0$), as this function returns it.
    - `T`, `mass` ($m > 0$), `damping` ($\\gamma$): per problem (broadcast against the batch
      axes).
    - `dt`: the time step; `substeps`: RK4 steps within it (static).

    **Returns:**

    The state `(position, velocity)` at time `dt`.
    """
    position, velocity = state
    batch = scores.shape[:-1]
    bcast = lambda a: jnp.broadcast_to(jnp.asarray(a, scores.dtype), batch)  # noqa: E731
    T, mass, damping = bcast(T), bcast(mass), bcast(damping)
    flat = lambda a: a.reshape((-1,) + a.shape[len(batch):])  # noqa: E731
    out = jax.vmap(_fisher_row, in_axes=(None, 0, 0, 0, 0, 0, 0, None, None))(
        entropy, flat(position), flat(velocity), flat(scores), flat(T), flat(mass),
        flat(damping), dt, int(substeps))
    return tuple(o.reshape(position.shape) for o in out)


def _fisher_row(entropy, x, v, z, T, mass, damping, dt, substeps):
    # RK4 by hand, not diffrax.diffeqsolve with constant steps: this runs inside a model's
    # loop body and is differentiated at every training step, where diffrax's solver loop
    # and saved state around the same fixed steps cost a multiple of this scan's time.
    system = FisherSystem(entropy, z, T, mass, damping)
    coords = SphereCoordinates()
    h = jnp.asarray(dt, z.dtype) / substeps

    def f(y):
        return coords.vector_field(None, y, system)

    def axpy(a, k, y):
        return jax.tree_util.tree_map(lambda yi, ki: yi + a * ki, y, k)

    def rk4(y, _):
        k1 = f(y)
        k2 = f(axpy(h / 2, k1, y))
        k3 = f(axpy(h / 2, k2, y))
        k4 = f(axpy(h, k3, y))
        incr = jax.tree_util.tree_map(lambda a, b, c, d: (a + 2 * b + 2 * c + d) / 6,
                                      k1, k2, k3, k4)
        return axpy(h, incr, y), None

    # rematerialized: reverse mode then stores one state per substep, not every stage's
    # intermediates, whose stores dominated the backward pass
    y, _ = jax.lax.scan(jax.checkpoint(rk4), (x, v), length=substeps)
    return y


def _oscillator_propagator(a, b, dt):
    """$\\exp(dt\\,A)$, $A = [[0, 1], [-a, -b]]$: the exact flow of $\\ddot u + b\\dot u + a u = 0$
    over `dt`, shape `(*batch, 2, 2)`."""
    a, b = jnp.broadcast_arrays(a, b)
    A = jnp.stack([jnp.stack([jnp.zeros_like(a), jnp.ones_like(a)], -1),
                   jnp.stack([-a, -b], -1)], -2)
    flat = A.reshape(-1, 2, 2)
    return jax.vmap(jsl.expm)(dt * flat).reshape(A.shape)


def linear_score_step(
    scores: Float[Array, "*batch N"],
    state: tuple[Float[Array, "*batch N"], Float[Array, "*batch N"]],
    *,
    a: Float[ArrayLike, "*#batch"],
    b: Float[ArrayLike, "*#batch"],
    dt: float,
) -> tuple[Float[Array, "*batch N"], Float[Array, "*batch N"]]:
    """Advance $\\ddot z = a(s - z) - b\\dot z$ exactly by `dt` at fixed scores $s$.

    The linear system is solved in closed form (the matrix exponential of its 2 x 2
    generator, shared by the keys), so a loop is the continuous damped oscillator, not a
    discretization of it.

    **Arguments:**

    - `scores`: $s$, held fixed; `state`: `(z, v)`, the score-space state and its velocity,
      as this function returns it. No entropy and no temperature: the oscillator lives in
      score space (a readout applies them).
    - `a` (> 0), `b` (>= 0): stiffness and damping per problem (broadcast against the
      batch axes); `dt`: the time step.

    **Returns:**

    `(z, v)` at time `dt`.
    """
    z, v = state
    batch = scores.shape[:-1]
    a = jnp.broadcast_to(jnp.asarray(a, scores.dtype), batch)
    b = jnp.broadcast_to(jnp.asarray(b, scores.dtype), batch)
    E = _oscillator_propagator(a, b, dt)[..., None, :, :]  # (*batch, 1, 2, 2)
    u = z - scores
    u_new = E[..., 0, 0] * u + E[..., 0, 1] * v
    v_new = E[..., 1, 0] * u + E[..., 1, 1] * v
    return scores + u_new, v_new


def linear_score_dynamics(
    entropy: AbstractEntropy,
    scores: Float[ArrayLike, "K *batch N"],
    T: Float[ArrayLike, "*#batch"],
    *,
    times: Float[ArrayLike, " K+1"],
    a: Float[ArrayLike, "*#batch"],
    b: Float[ArrayLike, "*#batch"],
    z0: Float[ArrayLike, "*#batch N"] | None = None,
    v0: Float[ArrayLike, "*#batch N"] | None = None,
) -> tuple[Float[Array, "K+1 *batch N"], Float[Array, "K+1 *batch N"],
           Float[Array, "K+1 *batch N"]]:
    """Attention paths of the linear score-space dynamics (the equal-parameter baseline).

    $\\ddot z = a(s(t) - z) - b\\dot z$ with the scores piecewise constant,
    $s(t) = s_k$ on $[t_k, t_{k+1})$, and attention $\\rho = \\mathrm{stationary}(S, z, T)$
    (softmax(z/T) for Shannon). Each interval is solved exactly, so this is the path of a
    model whose attention is a `LinearScoreLoop`, given the scores it recorded at each loop.

    **Arguments:**

    - `entropy`: the normalizer (`fisherdyn.Shannon()` for softmax).
    - `scores`: `(K, *batch, N)`, one row per interval (leading axis; hold one vector
      with `jnp.broadcast_to`).
    - `T` (> 0): the readout's temperature, a scalar or per problem (broadcast against
      `*batch`).
    - `times`: `(K + 1,)` non-decreasing times $t_0..t_K$.
    - `a` (> 0), `b`: stiffness and damping, scalars or per problem.
    - `z0`, `v0`: the initial state (default 0: uniform attention, at rest).

    **Returns:**

    `(attn, z, v)`, each `(K + 1, *batch, N)` at the times $t_0..t_K$.
    """
    s_k, times, state0 = _held_scores(scores, times)
    z0 = state0(z0, 0.0)
    v0 = state0(v0, 0.0)
    zs, vs = _scan_intervals(
        lambda s, state, dt: linear_score_step(s, state, a=a, b=b, dt=dt), s_k, times, (z0, v0)
    )
    shape = s_k.shape[1:]
    T = jnp.broadcast_to(jnp.asarray(T, zs.dtype), shape[:-1])
    return stationary(entropy, zs, T[..., None]), zs, vs


def fisher_score_dynamics(
    entropy: AbstractEntropy,
    scores: Float[ArrayLike, "K *batch N"],
    T: Float[ArrayLike, "*#batch"],
    *,
    times: Float[ArrayLike, " K+1"],
    mass: Float[ArrayLike, "*#batch"],
    damping: Float[ArrayLike, "*#batch"],
    rho0: Float[ArrayLike, "*#batch N"] | None = None,
    velocity0: Float[ArrayLike, "*#batch N"] | None = None,
    substeps: int = 4,
) -> tuple[Float[Array, "K+1 *batch N"], Float[Array, "K+1 *batch N"],
           Float[Array, "K+1 *batch N"]]:
    """Attention paths of the damped Fisher-Lagrangian dynamics under piecewise-constant
    scores, $s(t) = s_k$ on $[t_k, t_{k+1})$: what a model whose attention is a
    `FisherLoop` computes from the scores it recorded at each loop.

    Each interval is `substeps` RK4 steps of `fisher_loop_step`.

    **Arguments:**

    - `entropy`: the family; `scores`: `(K, *batch, N)`, one row per interval.
    - `T`: the temperature, a scalar or per problem.
    - `times`: `(K + 1,)` non-decreasing times $t_0..t_K$.
    - `mass` ($m > 0$), `damping` ($\\gamma$): scalars or per problem.
    - `rho0`: initial weights (default uniform); `velocity0`: initial $\\dot\\rho$
      (default 0, at rest).
    - `substeps`: RK4 steps per interval (static).

    **Returns:**

    `(attn, psi, psi_dot)`, each `(K + 1, *batch, N)` at the times $t_0..t_K$ (the weights
    and the sphere chart's state $\\psi = \\sqrt\\rho$, $\\dot\\psi$).
    """
    s_k, times, state0 = _held_scores(scores, times)
    rho0 = state0(rho0, 1 / s_k.shape[-1])
    if velocity0 is None:
        x0, v0 = jnp.sqrt(rho0), state0(None, 0.0)
    else:
        x0, v0 = SphereCoordinates().from_simplex(rho0, state0(velocity0, 0.0))

    def interval(s, state, dt):
        # one interval: substeps RK4 steps of dt / substeps (dt traced, so via the ratio)
        return _fisher_interval(entropy, *state, s, T, mass, damping, dt, int(substeps))

    xs, vs = _scan_intervals(interval, s_k, times, (x0, v0))
    x2 = xs * xs
    return x2 / jnp.sum(x2, -1, keepdims=True), xs, vs


def _held_scores(scores, times):
    """`(s_k, times, state0)`: the held scores and times as arrays of one dtype, and
    `state0(given, default)`, an initial state of the shape of one row of scores."""
    s_k = jnp.asarray(scores)
    shape = s_k.shape[1:]

    def state0(given, default):
        if given is None:
            return jnp.full(shape, default, s_k.dtype)
        return jnp.broadcast_to(jnp.asarray(given, s_k.dtype), shape)

    return s_k, jnp.asarray(times, s_k.dtype), state0


def _scan_intervals(step, s_k, times, state0):
    """The states at $t_0..t_K$ of `step(s, state, dt)` applied over each interval in turn."""

    def body(state, inp):
        s, dt = inp
        new = step(s, state, dt)
        return new, new

    _, states = jax.lax.scan(body, state0, (s_k, jnp.diff(times)))
    return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), state0, states)


def _fisher_interval(entropy, x, v, s, T, mass, damping, dt, substeps):
    batch = s.shape[:-1]
    bcast = lambda a: jnp.broadcast_to(jnp.asarray(a, s.dtype), batch).reshape(-1)  # noqa: E731
    flat = lambda a: a.reshape((-1,) + a.shape[len(batch):])  # noqa: E731
    out = jax.vmap(_fisher_row, in_axes=(None, 0, 0, 0, 0, 0, 0, None, None))(
        entropy, flat(x), flat(v), flat(s), bcast(T), bcast(mass), bcast(damping), dt,
        substeps)
    return tuple(o.reshape(x.shape) for o in out)
