"""The Abe stationary map as a perturbation of softmax, through fourth order in eps = ln q
(docs/math.md §4)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Float, Mask, Scores, Temperature

__all__ = ["abe_expansion", "abe_series", "AbeExpansion"]


def _g2(ell):
    return ell * (ell**2 + 6 * ell + 6) / 6


def _g2_prime(ell):
    return (ell**2 + 4 * ell + 2) / 2


def _g4(ell):
    return ell * (3 * ell**4 + 45 * ell**3 + 185 * ell**2 + 210 * ell + 30) / 360


class AbeExpansion(eqx.Module):
    """Coefficients of $\\rho_i = p_i(1 + \\epsilon^2 c_{2,i} + \\epsilon^4 c_{4,i} + \\dots)$
    and $\\lambda = \\lambda_0 + \\epsilon^2\\lambda_2 + \\epsilon^4\\lambda_4 + O(\\epsilon^6)$
    (convention $T G(\\rho_i) - z_i = \\lambda$), $q = e^\\epsilon$.

    **Fields:** `p` = softmax(z/T); `c2`, `c4` (zero on masked keys); `lam0` =
    $T(1 + \\ln p_i) - z_i$ (the same for every i); `lam2` = $T\\langle g_2\\rangle$;
    `lam4` = $T\\Lambda_4$. Batch shape = that of the scores without the last axis for the
    multipliers.
    """

    p: Float[Array, "*batch N"]
    c2: Float[Array, "*batch N"]
    c4: Float[Array, "*batch N"]
    lam0: Float[Array, "*batch"]
    lam2: Float[Array, "*batch"]
    lam4: Float[Array, "*batch"]

    def rho(self, eps: Float[ArrayLike, "*#batch"], order: int = 4) -> Float[Array, "*batch N"]:
        """The truncated map $p(1 + \\epsilon^2 c_2 [+ \\epsilon^4 c_4])$ (not clipped)."""
        if order not in (2, 4):
            raise ValueError(f"order must be 2 or 4, got {order}")
        eps = jnp.asarray(eps)[..., None]
        corr = eps**2 * self.c2
        if order == 4:
            corr = corr + eps**4 * self.c4
        return self.p * (1 + corr)

    def lam(self, eps: Float[ArrayLike, "*#batch"], order: int = 4) -> Float[Array, "*batch"]:
        """The truncated multiplier (order 2 or 4, see the class docstring)."""
        if order not in (2, 4):
            raise ValueError(f"order must be 2 or 4, got {order}")
        eps = jnp.asarray(eps)
        out = self.lam0 + eps**2 * self.lam2
        return out + eps**4 * self.lam4 if order == 4 else out


def abe_expansion(
    scores: Scores, T: Temperature = 1.0, *, mask: Mask | None = None
) -> AbeExpansion:
    """Expand the Abe stationary map about softmax through $O(\\epsilon^4)$ (docs/math.md §4).

    With $q = e^\\epsilon$, $G = (1 + \\ell) + \\epsilon^2 g_2(\\ell) + \\epsilon^4 g_4(\\ell)$,
    $\\ell = \\ln x$, $p = \\mathrm{softmax}(z/T)$, $\\langle f\\rangle = \\sum p_i f_i$:
    $c_2 = \\langle g_2\\rangle - g_2(\\ell)$,
    $\\Lambda_4 = \\langle g_2'(\\ell) c_2 + g_4(\\ell) - c_2^2/2\\rangle$,
    $c_4 = c_2^2/2 + \\Lambda_4 - g_2'(\\ell) c_2 - g_4(\\ell)$, $\\ell_i = \\ln p_i$.
    Batched over leading axes (last axis = keys); jit/vmap/grad compatible.

    **Arguments:**

    - `scores`: $z$, shape (..., N).
    - `T`: temperature > 0 (scalar or broadcastable to the batch shape).
    - `mask`: optional boolean, True = keep (masked keys get p = c2 = c4 = 0).

    **Returns:** an `AbeExpansion`.
    """
    z = jnp.asarray(scores)
    if not jnp.issubdtype(z.dtype, jnp.floating):
        z = z.astype(jnp.result_type(float))
    T = jnp.asarray(T, z.dtype)
    keep = jnp.ones(z.shape, bool) if mask is None else jnp.broadcast_to(mask, z.shape)
    Tk = T[..., None] if T.ndim else T
    x = jnp.where(keep, z / Tk, -jnp.inf)
    ell = jax.nn.log_softmax(x, axis=-1)
    ell = jnp.where(keep, ell, 0.0)  # finite placeholder; weights are zero there
    p = jnp.where(keep, jnp.exp(ell), 0.0)

    def mean(f):
        return jnp.sum(p * f, -1)

    g2, g2p, g4 = _g2(ell), _g2_prime(ell), _g4(ell)
    c2 = mean(g2)[..., None] - g2
    Lam4 = mean(g2p * c2 + g4 - c2**2 / 2)
    c4 = c2**2 / 2 + Lam4[..., None] - g2p * c2 - g4
    c2 = jnp.where(keep, c2, 0.0)
    c4 = jnp.where(keep, c4, 0.0)
    # lambda0 = T(1 + l_i) - z_i, the same for every kept i: average it with the weights p
    lam0 = mean(jnp.where(keep, Tk * (1 + ell) - jnp.where(keep, z, 0.0), 0.0))
    return AbeExpansion(p, c2, c4, lam0, T * mean(g2), T * Lam4)


def abe_series(
    scores: Scores,
    T: Temperature = 1.0,
    *,
    eps: Float[ArrayLike, "*#batch"] = 0.0,
    order: int = 2,
    mask: Mask | None = None,
) -> Float[Array, "*batch N"]:
    """The truncated Abe map $p(1 + \\epsilon^2 c_2 [+ \\epsilon^4 c_4])$, $q = e^\\epsilon$.

    Not clipped: for broad scores the truncation can go negative, the exact map never does
    (docs/math.md §4). Batched over leading axes; jit/vmap/grad compatible.

    **Arguments:** `scores`, `T` and (keyword only) `mask` as in `abe_expansion`; keyword
    only, `eps` $= \\ln q$ and the truncation `order`, 2 or 4.

    **Returns:** the truncated weights, the shape of `scores`.
    """
    return abe_expansion(scores, T, mask=mask).rho(eps, order)
