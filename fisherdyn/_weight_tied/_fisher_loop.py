"""Loops whose attention carries a state across loops: the controls of the weight-tied study.

- `FisherLoop` (the positive control): each attention row is the position of the damped
  Fisher-Lagrangian dynamics (docs/math.md §6) in the sphere chart $\\psi = \\sqrt\\rho$,
  advanced over one loop's depth $c/L$ towards the loop's scores, with learnable mass and
  damping per head. Its attention follows the dynamics by construction.
- `LinearScoreLoop` (the negative control with as many parameters): a damped linear
  oscillator in score space, $m\\ddot z + \\gamma\\dot z = s - z$ per key, read out through the
  normalizer, $\\rho = \\mathrm{stationary}(S, z, T)$. Second order, but not the Fisher
  geometry.

Both hold the loop's scores fixed over the loop (a zero-order hold): loop $l$ drives the
state from $t_l$ to $t_{l+1} = t_l + c/L$ with the scores $s_l$ computed at the block's
state $x_l$, and the attention of loop $l$ is the weights at $t_{l+1}$. Both start at rest
from the uniform weights ($\\psi = 1/\\sqrt n$, resp. $z = 0$).
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from .._custom_types import Array, ArrayLike, Float
from .._dynamics import FisherSystem, SphereCoordinates
from .._entropies import AbstractEntropy, Shannon
from .._stationary import stationary

__all__ = [
    "AbstractCarriedLoop",
    "FisherLoop",
    "LinearScoreLoop",
    "fisher_loop_step",
    "linear_score_step",
    "linear_score_dynamics",
    "fisher_score_dynamics",
]


def _softplus_inverse(y):
    y = jnp.asarray(y)
    return y + jnp.log(-jnp.expm1(-y))


def fisher_loop_step(
    entropy: AbstractEntropy,
    position: Float[Array, "*batch N"],
    velocity: Float[Array, "*batch N"],
    scores: Float[Array, "*batch N"],
    T: Float[ArrayLike, "*#batch"],
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

    - `entropy`: the family; `position` $\\psi$, `velocity` $\\dot\\psi$: the state
      (leading axes are batch axes; $\\sum\\psi^2 = 1$, $\\psi\\cdot\\dot\\psi = 0$).
    - `scores`: the scores $z$ held fixed over the step; `T`, `mass` ($m > 0$), `damping`
      ($\\gamma$): per problem (broadcast against the batch axes).
    - `dt`: the time step; `substeps`: RK4 steps within it (static).

    **Returns:**

    The state `(position, velocity)` at time `dt`.
    """
    batch = scores.shape[:-1]
    bcast = lambda a: jnp.broadcast_to(jnp.asarray(a, scores.dtype), batch)  # noqa: E731
    T, mass, damping = bcast(T), bcast(mass), bcast(damping)
    flat = lambda a: a.reshape((-1,) + a.shape[len(batch):])  # noqa: E731
    out = jax.vmap(_fisher_row, in_axes=(None, 0, 0, 0, 0, 0, 0, None, None))(
        entropy, flat(position), flat(velocity), flat(scores), flat(T), flat(mass),
        flat(damping), dt, int(substeps))
    return tuple(o.reshape(position.shape) for o in out)


def _fisher_row(entropy, x, v, z, T, mass, damping, dt, substeps):
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
    z: Float[Array, "*batch N"],
    v: Float[Array, "*batch N"],
    scores: Float[Array, "*batch N"],
    a: Float[ArrayLike, "*#batch"],
    b: Float[ArrayLike, "*#batch"],
    dt: float,
) -> tuple[Float[Array, "*batch N"], Float[Array, "*batch N"]]:
    """Advance $\\ddot z = a(s - z) - b\\dot z$ exactly by `dt` at fixed scores $s$.

    The linear system is solved in closed form (the matrix exponential of its 2 x 2
    generator, shared by the keys), so a loop is the continuous damped oscillator, not a
    discretization of it.

    **Arguments:**

    - `z`, `v`: the score-space state and its velocity; `scores`: $s$, held fixed.
    - `a` (> 0), `b` (>= 0): stiffness and damping per problem (broadcast against the
      batch axes); `dt`: the time step.

    **Returns:**

    `(z, v)` at time `dt`.
    """
    batch = scores.shape[:-1]
    a = jnp.broadcast_to(jnp.asarray(a, scores.dtype), batch)
    b = jnp.broadcast_to(jnp.asarray(b, scores.dtype), batch)
    E = _oscillator_propagator(a, b, dt)[..., None, :, :]  # (*batch, 1, 2, 2)
    u = z - scores
    u_new = E[..., 0, 0] * u + E[..., 0, 1] * v
    v_new = E[..., 1, 0] * u + E[..., 1, 1] * v
    return scores + u_new, v_new


def linear_score_dynamics(
    scores: Float[ArrayLike, "K *batch N"],
    times: Float[ArrayLike, " K+1"],
    a: Float[ArrayLike, "*#batch"],
    b: Float[ArrayLike, "*#batch"],
    T: Float[ArrayLike, "*#batch"],
    z0: Float[ArrayLike, "*#batch N"] | None = None,
    v0: Float[ArrayLike, "*#batch N"] | None = None,
    *,
    entropy: AbstractEntropy | None = None,
) -> tuple[Float[Array, "K+1 *batch N"], Float[Array, "K+1 *batch N"],
           Float[Array, "K+1 *batch N"]]:
    """Attention paths of the linear score-space dynamics (the equal-parameter baseline).

    $\\ddot z = a(s(t) - z) - b\\dot z$ with the scores piecewise constant,
    $s(t) = s_k$ on $[t_k, t_{k+1})$, and attention $\\rho = \\mathrm{stationary}(S, z, T)$
    (softmax(z/T) for Shannon). Each interval is solved exactly, so this is the path of a
    `LinearScoreLoop` model given its recorded loop scores (`LoopedPaths.scores[:-1]`).

    **Arguments:**

    - `scores`: `(K, *batch, N)`, one row per interval (leading axis, as in
      `LoopedPaths`; hold one vector with `jnp.broadcast_to`).
    - `times`: `(K + 1,)` non-decreasing times $t_0..t_K$.
    - `a` (> 0), `b`, `T` (> 0): stiffness, damping, temperature, scalars or per problem
      (broadcast against `*batch`).
    - `z0`, `v0`: the initial state (default 0: uniform attention, at rest).
    - `entropy`: the normalizer (default Shannon).

    **Returns:**

    `(attn, z, v)`, each `(K + 1, *batch, N)` at the times $t_0..t_K$.
    """
    entropy = Shannon() if entropy is None else entropy
    s_k = jnp.asarray(scores)
    times = jnp.asarray(times, s_k.dtype)
    shape = s_k.shape[1:]
    z0 = jnp.zeros(shape, s_k.dtype) if z0 is None else jnp.broadcast_to(
        jnp.asarray(z0, s_k.dtype), shape)
    v0 = jnp.zeros(shape, s_k.dtype) if v0 is None else jnp.broadcast_to(
        jnp.asarray(v0, s_k.dtype), shape)

    def body(carry, inp):
        s, dt = inp
        new = linear_score_step(carry[0], carry[1], s, a, b, dt)
        return new, new

    _, (zs, vs) = jax.lax.scan(body, (z0, v0), (s_k, jnp.diff(times)))
    zs = jnp.concatenate([z0[None], zs])
    vs = jnp.concatenate([v0[None], vs])
    T = jnp.broadcast_to(jnp.asarray(T, zs.dtype), shape[:-1])
    return stationary(entropy, zs, T[..., None]), zs, vs


def fisher_score_dynamics(
    entropy: AbstractEntropy,
    scores: Float[ArrayLike, "K *batch N"],
    times: Float[ArrayLike, " K+1"],
    mass: Float[ArrayLike, "*#batch"],
    damping: Float[ArrayLike, "*#batch"],
    T: Float[ArrayLike, "*#batch"],
    rho0: Float[ArrayLike, "*#batch N"] | None = None,
    velocity0: Float[ArrayLike, "*#batch N"] | None = None,
    *,
    substeps: int = 4,
) -> tuple[Float[Array, "K+1 *batch N"], Float[Array, "K+1 *batch N"],
           Float[Array, "K+1 *batch N"]]:
    """Attention paths of the damped Fisher-Lagrangian dynamics under piecewise-constant
    scores, $s(t) = s_k$ on $[t_k, t_{k+1})$: what a `FisherLoop` model computes from its
    recorded loop scores (`LoopedPaths.scores[:-1]`, times `0, attn_t`).

    Each interval is `substeps` RK4 steps of `fisher_loop_step`.

    **Arguments:**

    - `entropy`: the family; `scores`: `(K, *batch, N)`, one row per interval.
    - `times`: `(K + 1,)` non-decreasing times $t_0..t_K$.
    - `mass` ($m > 0$), `damping` ($\\gamma$), `T`: scalars or per problem.
    - `rho0`: initial weights (default uniform); `velocity0`: initial $\\dot\\rho$
      (default 0, at rest).
    - `substeps`: RK4 steps per interval (static).

    **Returns:**

    `(attn, psi, psi_dot)`, each `(K + 1, *batch, N)` at the times $t_0..t_K$ (the weights
    and the sphere chart's state $\\psi = \\sqrt\\rho$, $\\dot\\psi$).
    """
    s_k = jnp.asarray(scores)
    times = jnp.asarray(times, s_k.dtype)
    shape = s_k.shape[1:]
    rho0 = jnp.full(shape, 1 / shape[-1], s_k.dtype) if rho0 is None else \
        jnp.broadcast_to(jnp.asarray(rho0, s_k.dtype), shape)
    x0 = jnp.sqrt(rho0)
    if velocity0 is None:
        v0 = jnp.zeros(shape, s_k.dtype)
    else:
        rd = jnp.broadcast_to(jnp.asarray(velocity0, s_k.dtype), shape)
        v0 = jnp.where(x0 > 0, rd / (2 * jnp.where(x0 > 0, x0, 1.0)), 0.0)

    def body(carry, inp):
        s, dt = inp
        # one interval: substeps RK4 steps of dt / substeps (dt traced, so via the ratio)
        new = _fisher_interval(entropy, carry[0], carry[1], s, T, mass, damping, dt,
                               int(substeps))
        return new, new

    _, (xs, vs) = jax.lax.scan(body, (x0, v0), (s_k, jnp.diff(times)))
    xs = jnp.concatenate([x0[None], xs])
    vs = jnp.concatenate([v0[None], vs])
    x2 = xs * xs
    return x2 / jnp.sum(x2, -1, keepdims=True), xs, vs


def _fisher_interval(entropy, x, v, s, T, mass, damping, dt, substeps):
    batch = s.shape[:-1]
    bcast = lambda a: jnp.broadcast_to(jnp.asarray(a, s.dtype), batch).reshape(-1)  # noqa: E731
    flat = lambda a: a.reshape((-1,) + a.shape[len(batch):])  # noqa: E731
    out = jax.vmap(_fisher_row, in_axes=(None, 0, 0, 0, 0, 0, 0, None, None))(
        entropy, flat(x), flat(v), flat(s), bcast(T), bcast(mass), bcast(damping), dt,
        substeps)
    return tuple(o.reshape(x.shape) for o in out)


class AbstractCarriedLoop(eqx.Module):
    """Per-head dynamics parameters of a loop whose attention carries a state.

    Two parameters per head, positive through a softplus (`mass`, `damping`), and
    optionally a learnable temperature per head (`raw_T`; None holds the config's T).
    The state of one loop is `(position, velocity)`, each `(heads, n_tok, n_ctx)`.
    """

    raw_mass: Float[Array, " heads"]
    raw_damping: Float[Array, " heads"]
    raw_T: Float[Array, " heads"] | None

    def __init__(self, n_heads: int, mass: float, damping: float, T: float | None,
                 dtype=jnp.float32):
        """**Arguments:** `n_heads`; initial `mass` (> 0) and `damping` (> 0), the same
        for every head; `T`: initial learnable temperature (None: not learnable);
        `dtype` of the parameters."""
        ones = jnp.ones(n_heads, dtype)
        self.raw_mass = ones * _softplus_inverse(jnp.asarray(mass, dtype))
        self.raw_damping = ones * _softplus_inverse(jnp.asarray(damping, dtype))
        self.raw_T = None if T is None else ones * _softplus_inverse(jnp.asarray(T, dtype))

    @property
    def mass(self) -> Float[Array, " heads"]:
        """$m$ per head."""
        return jax.nn.softplus(self.raw_mass)

    @property
    def damping(self) -> Float[Array, " heads"]:
        """$\\gamma$ per head."""
        return jax.nn.softplus(self.raw_damping)

    def temperature(self, T_fixed: float) -> Float[Array, " heads"]:
        """$T$ per head: the learned one, or `T_fixed` for every head."""
        if self.raw_T is None:
            return jnp.full(self.raw_mass.shape, T_fixed, self.raw_mass.dtype)
        return jax.nn.softplus(self.raw_T)

    @abc.abstractmethod
    def init_state(self, shape: tuple[int, ...], dtype) -> tuple[Array, Array]:
        """The state at rest with uniform attention, `shape = (heads, n_tok, n_ctx)`."""

    @abc.abstractmethod
    def advance(self, state, scores, entropy, T, dt):
        """The state after one loop of depth `dt` driven by `scores` `(heads, n_tok, n_ctx)`."""

    @abc.abstractmethod
    def weights(self, state, entropy, T) -> Array:
        """The attention weights of a state, `(heads, n_tok, n_ctx)`."""


class FisherLoop(AbstractCarriedLoop):
    """The positive control: the attention is the position of the damped Fisher-Lagrangian
    dynamics, $\\rho = \\psi^2$, advanced per loop by `fisher_loop_step` with `substeps` RK4
    steps (the state is `(psi, psi_dot)`)."""

    substeps: int = eqx.field(static=True, default=4)

    def __init__(self, n_heads, mass, damping, T, dtype=jnp.float32, substeps: int = 4):
        super().__init__(n_heads, mass, damping, T, dtype)
        self.substeps = int(substeps)

    def init_state(self, shape, dtype):
        return jnp.full(shape, 1 / jnp.sqrt(shape[-1]), dtype), jnp.zeros(shape, dtype)

    def advance(self, state, scores, entropy, T, dt):
        col = lambda a: a[:, None]  # noqa: E731
        return fisher_loop_step(entropy, state[0], state[1], scores, col(T), col(self.mass),
                                col(self.damping), dt, self.substeps)

    def weights(self, state, entropy, T):
        x2 = state[0] * state[0]
        return x2 / jnp.sum(x2, -1, keepdims=True)


class LinearScoreLoop(AbstractCarriedLoop):
    """The negative control: $m\\ddot z + \\gamma\\dot z = s - z$ per key (stiffness
    $a = 1/m$, damping $b = \\gamma/m$), solved exactly per loop by `linear_score_step`,
    attention $\\mathrm{stationary}(S, z, T)$ (the state is `(z, z_dot)`)."""

    def init_state(self, shape, dtype):
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    @property
    def a(self) -> Float[Array, " heads"]:
        """The stiffness $a = 1/m$ per head."""
        return 1 / self.mass

    @property
    def b(self) -> Float[Array, " heads"]:
        """The damping rate $b = \\gamma/m$ per head."""
        return self.damping / self.mass

    def advance(self, state, scores, entropy, T, dt):
        return linear_score_step(state[0], state[1], scores, self.a[:, None], self.b[:, None],
                                 dt)

    def weights(self, state, entropy, T):
        return stationary(entropy, state[0], T[:, None, None])
