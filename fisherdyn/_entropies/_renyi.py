from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from .._custom_types import ArrayLike
from .._misc import real_parameter
from ._base import AbstractTsallisShapedEntropy, _masked_sum, _safe_log
from ._tsallis import Tsallis


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
        # ln(1 + sum rho expm1((q-1) ln rho)) / (1-q): exact as q -> 1 on the simplex.
        log, pos = _safe_log(rho)
        dev = _masked_sum(jnp.where(pos, rho * jnp.expm1((self.q - 1) * log), 0.0), mask)
        total = _masked_sum(rho, mask)
        return jnp.log(total + dev) / (1 - self.q)
