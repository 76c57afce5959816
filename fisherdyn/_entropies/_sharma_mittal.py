from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from .._custom_types import ArrayLike
from .._misc import real_parameter
from ._base import AbstractTsallisShapedEntropy
from ._renyi import log_moment


class SharmaMittal(AbstractTsallisShapedEntropy):
    """$S_{q,r} = (M_q^{(1-r)/(1-q)} - 1)/(1-r)$; r -> 1 is Renyi, r = q is Tsallis.

    Tsallis profile at $T_{eff} = T M_q^{(q-r)/(1-q)}$.
    """

    q: ArrayLike
    r: ArrayLike
    parse_names: ClassVar[tuple[str, ...]] = ("sharma_mittal",)
    parse_defaults: ClassVar[tuple[float, ...]] = (2.0, 1.5)

    def __check_init__(self):
        q = real_parameter(self.q, "q", "SharmaMittal")
        r = real_parameter(self.r, "r", "SharmaMittal")
        if q is not None and not np.all((q > 0) & (q != 1) & np.isfinite(q)):
            raise ValueError(f"SharmaMittal needs q > 0 and q != 1; got q={q}.")
        if r is not None and not np.all((r > 0) & (r != 1) & np.isfinite(r)):
            raise ValueError(
                f"SharmaMittal needs r > 0 and r != 1 (r -> 1 is Renyi: use Renyi(q)); got r={r}."
            )

    def temperature_factor(self, M):
        return M ** ((self.q - self.r) / (1 - self.q))

    def shape_exponent(self):
        return (self.q - self.r) / (self.q - 1)

    def value_of_log_moment(self, logM):
        return jnp.expm1((1 - self.r) / (1 - self.q) * logM) / (1 - self.r)

    def value(self, rho, mask=None):
        return self.value_of_log_moment(log_moment(self.q, rho, mask))
