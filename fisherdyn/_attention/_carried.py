"""Attention that carries a state across the loops of a weight-tied (looped) model.

A looped model applies one block $L$ times, so its depth reads as time, $t_l = l\\,c/L$.
An `AbstractCarriedLoop` makes the attention weights of that block the state of a dynamics
driven by each loop's scores, instead of the normalizer of those scores:

- `FisherLoop`: the weights are the position of the damped Fisher-Lagrangian dynamics
  (docs/math.md §6) in the sphere chart $\\psi = \\sqrt\\rho$, advanced over each loop's
  depth towards that loop's scores, with learnable mass and damping per head; its
  attention follows the dynamics by construction.
- `LinearScoreLoop`: a damped linear oscillator in score space with as many parameters,
  $m\\ddot z + \\gamma\\dot z = s - z$ per key, read out through the normalizer.

Both hold the loop's scores fixed over the loop (a zero-order hold): loop $l$ drives the
state from $t_l$ to $t_{l+1} = t_l + c/L$ with the scores $s_l$ computed at the block's
state $x_l$, and the attention of loop $l$ is the weights at $t_{l+1}$. Both start at rest
from the uniform weights ($\\psi = 1/\\sqrt n$, resp. $z = 0$). They are Equinox modules:
a model holds one as a field and threads its state through its loop (a `jax.lax.scan`).
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, Float
from .._dynamics import fisher_loop_step, linear_score_step
from .._misc import softplus_inverse
from .._stationary import stationary

__all__ = ["AbstractCarriedLoop", "FisherLoop", "LinearScoreLoop"]


class AbstractCarriedLoop(eqx.Module):
    """Attention weights that carry a state across a looped model's loops, with per-head
    dynamics parameters.

    Two parameters per head, positive through a softplus (`mass`, `damping`), and
    optionally a learnable temperature per head (`raw_T`; None: the temperature the model
    passes to `temperature`). The state is `(position, velocity)`, each
    `(heads, n_tok, n_ctx)`. In a model's loop body (one step of its `jax.lax.scan`, the
    state carried beside the residual stream):

    ```python
    T = layer.temperature(T_model)                       # (heads,)
    state = layer.advance(state, scores, entropy, T, dt)  # scores (heads, n_tok, n_ctx)
    weights = layer.weights(state, entropy, T)            # rows on the simplex
    ```

    starting from `state = layer.init_state((heads, n_tok, n_ctx), dtype)`.
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
        self.raw_mass = ones * softplus_inverse(jnp.asarray(mass, dtype))
        self.raw_damping = ones * softplus_inverse(jnp.asarray(damping, dtype))
        self.raw_T = None if T is None else ones * softplus_inverse(jnp.asarray(T, dtype))

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
    """Attention as the damped Fisher-Lagrangian dynamics: the weights are the position
    $\\rho = \\psi^2$, advanced per loop by `fisher_loop_step` with `substeps` RK4 steps
    towards the loop's scores (the state is `(psi, psi_dot)`)."""

    substeps: int = eqx.field(static=True, default=4)

    def __init__(self, n_heads, mass, damping, T, dtype=jnp.float32, substeps: int = 4):
        super().__init__(n_heads, mass, damping, T, dtype)
        self.substeps = int(substeps)

    def init_state(self, shape, dtype):
        return jnp.full(shape, 1 / jnp.sqrt(shape[-1]), dtype), jnp.zeros(shape, dtype)

    def advance(self, state, scores, entropy, T, dt):
        col = lambda a: a[:, None]  # noqa: E731
        return fisher_loop_step(entropy, scores, state, col(T), mass=col(self.mass),
                                damping=col(self.damping), dt=dt, substeps=self.substeps)

    def weights(self, state, entropy, T):
        x2 = state[0] * state[0]
        return x2 / jnp.sum(x2, -1, keepdims=True)


class LinearScoreLoop(AbstractCarriedLoop):
    """Attention read out of a linear dynamics in score space, with as many parameters as
    `FisherLoop`: $m\\ddot z + \\gamma\\dot z = s - z$ per key (stiffness
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
        return linear_score_step(scores, state, a=self.a[:, None], b=self.b[:, None], dt=dt)

    def weights(self, state, entropy, T):
        return stationary(entropy, state[0], T[:, None, None])
