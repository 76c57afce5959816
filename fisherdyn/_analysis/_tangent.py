"""Tangent-gradient test: do two entropies share the inverse-gradient shape at rho?
(docs/math.md §5)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Float
from .._entropies import AbstractEntropy
from .._misc import check_entropy

__all__ = ["tangent_test", "TangentTest"]


class TangentTest(NamedTuple):
    """`a_star`: the best scale $a^*$ with $\\Pi\\nabla S_a \\approx a^*\\,\\Pi\\nabla S_b$;
    `R`: the relative residual $\\|u - a^* v\\| / \\|u\\|$ (0 = same shape at rho)."""

    a_star: Float[Array, "*batch"]
    R: Float[Array, "*batch"]


def tangent_test(
    entropy_a: AbstractEntropy, entropy_b: AbstractEntropy, rho: Float[ArrayLike, "*batch N"]
) -> TangentTest:
    """Compare the tangential gradients of two entropies at $\\rho$ (docs/math.md §5).

    With $\\Pi = I - \\mathbf{1}\\mathbf{1}^T/N$, $u = \\Pi\\nabla S_a(\\rho)$,
    $v = \\Pi\\nabla S_b(\\rho)$: $a^* = u\\cdot v / v\\cdot v$ and
    $R = \\|u - a^* v\\| / \\|u\\|$. $R = 0$ means the two stationary laws have the same
    profile shape at $\\rho$ (e.g. Renyi vs Tsallis with $a^* = 1/M_q(\\rho)$). Batched over
    the leading axes of `rho` (last axis = the simplex); jit/vmap/grad compatible.

    **Arguments:**

    - `entropy_a`, `entropy_b`: entropy families.
    - `rho`: points of the simplex, shape (..., N) with N >= 3 (N = 2 is degenerate: the
      tangent space is one-dimensional, so any two gradients are parallel and R = 0).

    **Returns:** `TangentTest(a_star, R)`, each of shape `rho.shape[:-1]`. Conventions at
    degenerate points: `R = 0` where $u = 0$; `a_star = nan` (and `R = 1`) where $v = 0$.
    """
    check_entropy(entropy_a)
    check_entropy(entropy_b)
    rho = jnp.asarray(rho)
    if rho.ndim == 0 or rho.shape[-1] < 3:
        n = rho.shape[-1] if rho.ndim else 0
        raise ValueError(
            f"tangent_test needs N >= 3 components (got N = {n}): for N = 2 the tangent "
            "space of the simplex is one-dimensional and every pair of gradients is parallel"
        )
    u = entropy_a.grad(rho)
    v = entropy_b.grad(rho)
    u = u - jnp.mean(u, -1, keepdims=True)
    v = v - jnp.mean(v, -1, keepdims=True)
    uv = jnp.sum(u * v, -1)
    vv = jnp.sum(v * v, -1)
    uu = jnp.sum(u * u, -1)
    v_zero = vv == 0
    a_star = jnp.where(v_zero, 0.0, uv / jnp.where(v_zero, 1.0, vv))
    diff = u - a_star[..., None] * v
    dd = jnp.sum(diff * diff, -1)
    u_zero = uu == 0
    # sqrt at 0 has an infinite derivative: keep the grad finite on the degenerate set
    R = jnp.where(u_zero, 0.0, jnp.sqrt(jnp.where(u_zero, 1.0, dd / jnp.where(u_zero, 1.0, uu))))
    a_star = jnp.where(v_zero, jnp.nan, a_star)
    return TangentTest(a_star, R)
