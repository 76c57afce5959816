from __future__ import annotations

import dataclasses
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import ArrayLike
from .._misc import concrete_float, real_parameter
from ._base import AbstractSeparableEntropy, _safe_log, _sinh_ratio


_ONE_EXP_KAPPA = 0.2


class Kaniadakis(AbstractSeparableEntropy):
    """$S_\\kappa = -\\sum \\rho(\\rho^\\kappa - \\rho^{-\\kappa})/(2\\kappa)$, 0 < |kappa| < 1.

    Dense, with algebraic tail $\\rho \\approx C_\\kappa |w|^{-1/\\kappa}$; symmetric in
    $\\kappa \\leftrightarrow -\\kappa$ (|kappa| is used).
    """

    kappa: ArrayLike
    one_exp: bool = eqx.field(static=True, default=False, repr=False)
    """Whether G uses its one-exp form while kappa is traced (set by `for_tracing` from a
    concrete |kappa| >= 0.2; a concrete kappa decides by itself)."""
    parse_names: ClassVar[tuple[str, ...]] = ("kaniadakis",)
    parse_defaults: ClassVar[tuple[float, ...]] = (0.3,)
    realization: ClassVar[str] = "scalar root"

    def tail_reference(self, T):
        return -1 / abs(float(self.kappa)), "-1/kappa"

    @classmethod
    def shape_chart(cls):
        """$\\kappa = 0.01 + 0.94\\,\\sigma(u)$ (a fit finds |kappa|, which is all the law uses)."""
        return (lambda u: 0.01 + (0.95 - 0.01) * jax.nn.sigmoid(u),
                lambda kappa: float(np.log((abs(kappa) - 0.01) / (0.95 - abs(kappa)))))

    def __check_init__(self):
        k = real_parameter(self.kappa, "kappa", "Kaniadakis")
        if k is not None and not np.all((0 < np.abs(k)) & (np.abs(k) < 1)):
            raise ValueError(
                f"Kaniadakis needs 0 < |kappa| < 1 (kappa = 0 is Shannon); got kappa={k}."
            )

    @property
    def _k(self):
        return jnp.abs(self.kappa)

    def G(self, x):
        # ((1+k)x^k - (1-k)x^-k)/(2k) = sinh(y)/k + cosh(y), y = k ln x
        k = self._k
        log = jnp.log(x)
        k_c = concrete_float(self.kappa)
        if (abs(k_c) >= _ONE_EXP_KAPPA) if k_c is not None else self.one_exp:
            # the two powers from one exp (cheaper than expm1): their difference loses at
            # most a factor 1/k, an absolute error of about eps/k <= 5 eps where G is O(1)
            u = jnp.exp(k * log)
            return ((1 + k) / (2 * k)) * u - ((1 - k) / (2 * k)) / u
        # from one expm1: with F = e^|y| - 1 and r = e^-|y|, sinh|y| = F (1 + r)/2 and
        # cosh y = (1 + F + r)/2, each a sum of terms of one sign (exact for small |y|)
        F = jnp.expm1(k * jnp.abs(log))
        r = 1.0 / (1.0 + F)
        return 0.5 * (jnp.sign(log) * (F * (1.0 + r)) / k + (1.0 + F) + r)

    def for_tracing(self):
        # a concrete |kappa| >= 0.2 keeps G's one-exp form once kappa is traced
        k_c = concrete_float(self.kappa)
        return dataclasses.replace(self, one_exp=k_c is not None and abs(k_c) >= _ONE_EXP_KAPPA)

    def G_prime(self, x):
        k = self._k
        # cosh y + k sinh y = ((1+k) x^k + (1-k) x^-k)/2: two positive terms, one exp
        u = jnp.exp(k * jnp.log(x))
        return ((1 + k) * u + (1 - k) / u) / (2 * x)

    def G1(self):
        return 1.0

    def inverse_shifted(self, y):
        # G(x) = 1 + y  <=>  x^k = u = (k w + r)/(1 + k),  w = 1 + y,  r = sqrt(k^2 w^2 + 1 - k^2).
        # Since (k w + r)(r - k w) = 1 - k^2:  ln u = sign(w) ln(k|w| + r) + [w<0] ln(1-k^2)
        # - ln(1+k), one log and no cancellation in the deep tail; and dx/dy = x / r.
        # ln u = O(kappa) is formed with log1p so that ln(u)/kappa stays exact as kappa -> 0.
        k = self._k
        w = 1.0 + y
        r = jnp.sqrt((k * w) ** 2 + (1 - k**2))
        k_c = concrete_float(self.kappa)
        plain = k_c is not None and abs(k_c) >= 0.2 and jnp.finfo(jnp.result_type(y)).eps > 1e-10
        if plain:
            # float32 with kappa >= 0.2: a plain log and the exponent as a product, cheaper
            # and as accurate there (the deep tail's exponent dominates the error)
            L = jnp.log(k * jnp.abs(w) + r)
        else:
            L = jnp.log1p(k * jnp.abs(w) + k**2 * (w * w - 1) / (r + 1))  # r - 1 exactly
        log_u = jnp.where(w >= 0, L, jnp.log1p(-(k**2)) - L) - jnp.log1p(k)
        x = jnp.exp(log_u * (1.0 / k) if plain else log_u / k)
        return x, x / r

    def terms(self, rho):
        log, pos = _safe_log(rho)
        return jnp.where(pos, -rho * _sinh_ratio(self._k, log), 0.0)

    def normalization_power(self):
        # between Shannon's log (exact for the exponential core) and -kappa (exact for the
        # algebraic tail x ~ |w|^(-1/kappa)): fewest Newton steps over typical score spreads
        return -0.5 * self._k
