"""The far poles of a block of secular roots, through one Taylor series about its centre.

For the roots of a block (`_secular`'s blocks of consecutive roots) the poles more than
`_NEAR` places beyond the block's ends are far from every root in it, so their sums
$\\sum_j w_j/(d_j - x)^{m+1}$ at any x in the block are the derivatives of one series,
$\\sum_j w_j/(d_j - x) = \\sum_n C_n s^n$ in $s = (x - c)/h$, with
$C_n = \\sum_j w_j h^n/(d_j - c)^{n+1}$, c the centre and h the half-width of the span of
the block's intervals (scaled so, no coefficient overflows). Its coefficients cost one pass over the poles per block, not
one per root: the secular solve's cost falls from $O(N^2)$ per pass to $O(N^2/B)$ plus
$O(N (B + 2\\,\\mathrm{near}))$. The series converges by the ratio $r$ of the block's
half-width to its distance from the nearest far pole; where $r$ is above `_RATIO` (a sparse
tail, a block that spans a wide gap) the block sums every pole instead, so the truncation
left is below $r^{D+1}/(1 - r)$ of the far poles' sum, $\\approx 10^{-15}$.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["FarField", "far_fields", "near_width", "series_derivative"]

_NEAR = 192
_DEGREE = 24
_RATIO = 0.25


class FarField(NamedTuple):
    """One block's far poles: `ok` (the series is used), the first near pole `start` (the
    near poles are `start ... start + near_width - 1`), the centre `c` and half-width `h`
    of the block's span and the series' coefficients `C` over all far poles and `CL` over
    those left of the block."""

    ok: jax.Array
    start: jax.Array
    c: jax.Array
    h: jax.Array
    C: jax.Array
    CL: jax.Array


def _block_field(pv, pw, kb, ab, bb, width):
    n = pv.shape[0]
    idx = jnp.arange(n)
    start = jnp.clip(kb[0] - _NEAR, 0, n - width)
    c = 0.5 * (jnp.min(ab) + jnp.max(bb))
    h = 0.5 * (jnp.max(bb) - jnp.min(ab))
    h = jnp.where(h > 0, h, 1.0)
    far = (idx < start) | (idx >= start + width)
    gap = jnp.where(far, pv - c, jnp.inf)
    ok = h <= _RATIO * jnp.min(jnp.abs(gap))

    def coefficients():
        v = h / gap  # 0 on the near poles; |v| <= _RATIO on the far ones
        powers = [pw / gap]
        for _ in range(_DEGREE):
            powers.append(powers[-1] * v)
        left = idx < start
        sums = jax.lax.reduce(
            (*powers, *(jnp.where(left, p, 0.0) for p in powers)),
            (jnp.zeros((), pv.dtype),) * (2 * _DEGREE + 2),
            lambda x, y: tuple(a + b for a, b in zip(x, y)), (0,))
        return jnp.stack(sums[:_DEGREE + 1]), jnp.stack(sums[_DEGREE + 1:])

    def unused():
        zero = jnp.zeros(_DEGREE + 1, pv.dtype)
        return zero, zero

    C, CL = jax.lax.cond(ok, coefficients, unused)
    return ok, start, c, h, C, CL


def far_fields(pv, pw, kb, ab, bb):
    """The far field of every block: `kb` the blocks' root indices, `ab`, `bb` the ends
    of their intervals, all (blocks, B). None where the poles are too few for a far field
    (every block then sums every pole)."""
    n = pv.shape[0]
    width = near_width(kb.shape[-1])
    if n <= 2 * width:
        return None
    return FarField(*jax.lax.map(lambda a: _block_field(pv, pw, *a, width), (kb, ab, bb)))


def near_width(block):
    """How many poles a block of `block` roots sums exactly beside its far series."""
    return block + 2 * _NEAR


def series_derivative(far, dt, m, left=False):
    """The m-th Taylor coefficient, $\\frac{1}{m!}\\frac{d^m}{dx^m}$, of the block's far
    series (`left`: of its far left poles only) at $x - c$ = `dt`."""
    C = far.CL if left else far.C
    s = dt / far.h
    acc = jnp.zeros_like(dt)
    for d in range(_DEGREE, m - 1, -1):
        acc = acc * s + C[d] * math.comb(d, m)
    return acc / far.h**m
