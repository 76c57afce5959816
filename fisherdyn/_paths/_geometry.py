"""The Fisher-Rao geometry of the simplex: distance and geodesics (via the sphere $\\sqrt\\rho$)."""

from __future__ import annotations

import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Float

__all__ = ["fisher_rao_distance", "geodesic_interpolation"]


def chord2(x, y):
    """$\\|x - y\\|^2$ of two sphere points (last axis)."""
    return jnp.sum((x - y) ** 2, -1)


def angle_from_chord2(c2):
    """The Fisher-Rao distance $4\\arcsin(c/2)$ from the squared chord $c^2$ of the unit
    vectors $\\sqrt\\rho$ (exact, no cancellation at small distances)."""
    return 4.0 * jnp.arcsin(jnp.minimum(jnp.sqrt(c2), 2.0) / 2.0)


def fisher_rao_distance(p: Float[ArrayLike, "*#batch N"],
                        q: Float[ArrayLike, "*#batch N"]) -> Float[Array, "*batch"]:
    """The Fisher-Rao distance $d(p, q) = 2\\arccos\\sum_i\\sqrt{p_i q_i}$ of two points of the
    simplex (last axis; other axes broadcast).

    Evaluated as $4\\arcsin(\\|\\sqrt p - \\sqrt q\\|/2)$, the same number without the
    cancellation of arccos near 1. It is the geodesic distance of the Fisher metric
    $\\sum\\dot\\rho_i^2/\\rho_i$ (4 x the great-circle distance of $\\sqrt\\rho$ on the unit
    sphere); its maximum is $\\pi$ (disjoint supports).

    **Arguments:**

    - `p`, `q`: probability vectors (nonnegative, summing to 1).

    **Returns:**

    The distances, shape `broadcast(p, q).shape[:-1]`.
    """
    p, q = jnp.asarray(p), jnp.asarray(q)
    return angle_from_chord2(chord2(jnp.sqrt(p), jnp.sqrt(q)))


def geodesic_interpolation(p: Float[ArrayLike, "*#batch N"], q: Float[ArrayLike, "*#batch N"],
                           s: Float[ArrayLike, "*#batch"]) -> Float[Array, "*batch N"]:
    """The point at fraction `s` of the Fisher-Rao geodesic from `p` to `q`.

    The geodesic is the great circle through $\\sqrt p$ and $\\sqrt q$ on the unit sphere,
    traversed at constant speed: $x(s) = [\\sin((1-s)\\theta)\\sqrt p + \\sin(s\\theta)\\sqrt q]
    /\\sin\\theta$, $\\theta = d(p, q)/2$, returned as $\\rho = x^2/\\|x\\|^2$. `s` in [0, 1]
    interpolates; `s > 1` continues past `q` (the constant-speed extrapolation used as a
    naive baseline for predicting the next layers). `d(p, result) = |s| d(p, q)` while the
    arc stays in the positive orthant.

    **Arguments:**

    - `p`, `q`: probability vectors (last axis).
    - `s`: scalar or array broadcasting against their batch axes.

    **Returns:**

    Probability vectors of the broadcast shape.
    """
    x, y = jnp.sqrt(jnp.asarray(p)), jnp.sqrt(jnp.asarray(q))
    s = jnp.asarray(s, x.dtype)[..., None]
    theta = angle_from_chord2(chord2(x, y))[..., None] / 2
    small = theta < 1e-6
    th = jnp.where(small, 1.0, theta)
    slerp = (jnp.sin((1 - s) * th) * x + jnp.sin(s * th) * y) / jnp.sin(th)
    z = jnp.where(small, (1 - s) * x + s * y, slerp)
    z2 = z * z
    return z2 / jnp.sum(z2, -1, keepdims=True)
