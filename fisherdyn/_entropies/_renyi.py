from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import ArrayLike
from .._misc import real_parameter
from ._base import AbstractTsallisShapedEntropy, _masked_sum, _safe_log
from ._tsallis import Tsallis


def log_moment(q, rho, mask=None):
    """$\\ln M_q = \\ln\\sum_i \\rho_i^q$ scaled by the largest term, so that it stays finite
    where every $\\rho_i^q$ underflows (large q, long rows, float32)."""
    log, pos = _safe_log(rho)
    if mask is not None:
        pos = pos & mask
    lq = jnp.where(pos, q * log, -jnp.inf)
    top = jax.lax.stop_gradient(jnp.max(lq, -1, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    return top[..., 0] + jnp.log(jnp.sum(jnp.where(pos, jnp.exp(lq - top), 0.0), -1))


class Renyi(AbstractTsallisShapedEntropy):
    """$S_q = \\ln M_q/(1-q)$; Tsallis profile at $T_{eff} = T/M_q$."""

    q: ArrayLike
    parse_names: ClassVar[tuple[str, ...]] = ("renyi",)
    parse_defaults: ClassVar[tuple[float, ...]] = (2.0,)

    @classmethod
    def shape_chart(cls):
        """Tsallis's chart, $q = 1.01 + \\mathrm{softplus}(u)$."""
        return Tsallis.shape_chart()

    def __check_init__(self):
        q = real_parameter(self.q, "q", "Renyi")
        if q is not None and not np.all((q > 0) & (q != 1) & np.isfinite(q)):
            raise ValueError(f"Renyi needs q > 0 and q != 1 (q = 1 is Shannon); got q={q}.")

    def temperature_factor(self, M):
        return 1.0 / M

    def shape_exponent(self):
        return 1.0

    def value_of_log_moment(self, logM):
        return logM / (1 - self.q)

    def value(self, rho, mask=None):
        # ln(1 + sum rho expm1((q-1) ln rho)) / (1-q): exact as q -> 1 on the simplex; where
        # M_q is far from 1 that sum cancels (M_q -> 0 for large q), and ln M_q taken
        # directly loses nothing.
        log, pos = _safe_log(rho)
        dev = _masked_sum(jnp.where(pos, rho * jnp.expm1((self.q - 1) * log), 0.0), mask)
        total = _masked_sum(rho, mask)
        near = jnp.abs(dev) <= 0.5 * jnp.abs(total)
        log_near = jnp.log(jnp.where(near, total + dev, 1.0))
        return jnp.where(near, log_near, log_moment(self.q, rho, mask)) / (1 - self.q)
