from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp

from ._base import AbstractSeparableEntropy, _safe_log


class Shannon(AbstractSeparableEntropy):
    """$S = -\\sum \\rho\\ln\\rho$; stationary map `softmax(z/T)` (closed form)."""

    parse_names: ClassVar[tuple[str, ...]] = ("shannon",)
    realization: ClassVar[str] = "closed form"
    closed_form_softmax: ClassVar[bool] = True

    def tail_reference(self, T):
        return 1.0 / float(T), "1/T"

    def G(self, x):
        return 1.0 + jnp.log(x)

    def G_prime(self, x):
        return 1.0 / x

    def G1(self):
        return 1.0

    def G_shifted(self, x):
        return jnp.log(x)

    def inverse_shifted(self, y):
        x = jnp.exp(y)
        return x, x

    def terms(self, rho):
        log, pos = _safe_log(rho)
        return jnp.where(pos, -rho * log, 0.0)
