from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp

from ._base import AbstractSeparableEntropy


class Burg(AbstractSeparableEntropy):
    """$S = \\sum \\ln\\rho$; stationary map $T/(\\mu - z_i)$ with inverse-linear tail."""

    parse_names: ClassVar[tuple[str, ...]] = ("burg",)
    realization: ClassVar[str] = "scalar root"
    finite_at_boundary: ClassVar[bool] = False

    def tail_reference(self, T):
        return -1.0, "-1"

    def G(self, x):
        return -1.0 / x

    def G_prime(self, x):
        return 1.0 / x**2

    def G1(self):
        return -1.0

    def inverse_shifted(self, y):
        # -1/x + 1 = y  =>  x = 1/(1 - y), valid for y < 1 (guaranteed by the bracket).
        x = 1.0 / (1.0 - y)
        return x, x * x

    def terms(self, rho):
        return jnp.log(rho)

    def normalization_power(self):
        # S(nu)^-1 is exactly linear in nu when one key is active
        return -1.0
