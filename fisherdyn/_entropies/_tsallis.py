from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import ArrayLike
from .._misc import concrete_float, real_parameter, softplus_inverse
from ._base import (
    AbstractCutoffComponentLaw,
    AbstractSeparableEntropy,
    ComponentLawSwitch,
    ExactComponentLaw,
    _masked_sum,
    _safe_log,
)

# q from which the solver measures the multiplier from the cutoff (`_TsallisCutoffLaw`):
# a weight x carries about p / x^(q-1) ulps of rounding in the gauge at weight 1 and about p
# in the cutoff gauge, p = 1/(q-1); nearer q = 1, p is large while x^(q-1) stays near 1 for
# all but vanishing weights, and the gauge at weight 1 (through log1p) is the more precise.
_CUTOFF_GAUGE_Q = 1.5


class Tsallis(AbstractSeparableEntropy):
    """$S_q = (1 - \\sum\\rho^q)/(q-1)$, q > 0, q != 1: the alpha-entmax family (alpha = q).

    For q > 1 the stationary map has compact support (exact zeros past the threshold); for
    0 < q < 1 it is dense with an algebraic tail.
    """

    q: ArrayLike
    parse_names: ClassVar[tuple[str, ...]] = ("tsallis", "entmax")
    parse_defaults: ClassVar[tuple[float, ...]] = (1.5,)
    example_parameters: ClassVar[tuple[tuple[float, ...], ...]] = ((2.0,),)  # sparsemax
    realization: ClassVar[str] = "threshold"
    may_have_cutoff: ClassVar[bool] = True

    @classmethod
    def shape_chart(cls):
        """$q = 1.01 + \\mathrm{softplus}(u)$: a fit keeps to the compact side, q > 1."""
        return (lambda u: 1.0 + 0.01 + jax.nn.softplus(u),
                lambda q: softplus_inverse(q - 1.0 - 0.01))

    def __check_init__(self):
        q = real_parameter(self.q, "q", "Tsallis")
        if q is not None and not np.all((q > 0) & (q != 1) & np.isfinite(q)):
            raise ValueError(f"Tsallis needs q > 0 and q != 1 (q = 1 is Shannon); got q={q}.")

    def G(self, x):
        # exp(a log x), not x**a: XLA:CPU evaluates a power with a traced exponent through
        # the scalar libm pow, several times the cost of its vectorized exp and log
        return self.q * jnp.exp((self.q - 1) * jnp.log(x)) / (self.q - 1)

    def G_prime(self, x):
        return self.q * x ** (self.q - 2)

    def G1(self):
        return self.q / (self.q - 1)

    def G_shifted(self, x):
        # q (x^(q-1) - 1)/(q-1) through expm1: exact as q -> 1.
        log, pos = _safe_log(x)
        val = self.q * jnp.expm1((self.q - 1) * log) / (self.q - 1)
        return jnp.where(pos, val, -self.q / (self.q - 1))

    def inverse_shifted(self, y):
        q = self.q
        base = 1.0 + (q - 1) * y / q
        active = base > 0
        base_safe = jnp.where(active, base, 1.0)
        p = concrete_float(1.0 / (q - 1)) if concrete_float(q) is not None else None
        if p is not None and p == round(p) and 1 <= p <= 4:
            # integer exponent (q = 2, 3/2, 4/3, 5/4): a few multiplies instead of exp/log;
            # for p >= 2, b = max(base, 0) alone carries the support (b^(p-1) vanishes off
            # it), which lets XLA fuse the solver's evaluation into fewer passes
            p = int(round(p))
            if p >= 2:
                b = jnp.maximum(base, 0.0)
                x = b**p
                slope = b ** (p - 1) / q
            else:  # q = 2 (sparsemax): the slope is the support indicator itself
                x = jnp.where(active, base, 0.0)
                slope = active.astype(base.dtype) / q  # (not where(., 1/q, 0): weakly f64)
        else:
            x = jnp.where(active, jnp.exp(jnp.log1p((q - 1) * y / q) / (q - 1)), 0.0)
            slope = jnp.where(active, x / (q * base_safe), 0.0)
        return x, slope

    def terms(self, rho):
        # rho (1 - rho^(q-1))/(q-1) = -rho expm1((q-1) ln rho)/(q-1): no cancellation near q=1.
        log, pos = _safe_log(rho)
        val = -rho * jnp.expm1((self.q - 1) * log) / (self.q - 1)
        return jnp.where(pos, val, 0.0)

    def value(self, rho, mask=None):
        # (1 - sum rho^q)/(q-1) = (1 - sum rho)/(q-1) + sum rho (1 - rho^(q-1))/(q-1):
        # the first term vanishes on the simplex but keeps grad(value) exact off it.
        total = _masked_sum(rho, mask)
        return (1.0 - total) / (self.q - 1) + _masked_sum(self.terms(rho), mask)

    def inverse_slope(self, x):
        # x^(2-q)/q as one exp: 1/G'(x) would overflow at small x for q > 2
        return jnp.exp((2 - self.q) * jnp.log(x)) / self.q

    def normalization_power(self):
        # exactly linear in nu with one key active; for 1 < q <= 2, S^(q-1) is a p-norm,
        # convex in nu, so Newton from the left bracket end is monotone
        return jnp.minimum(self.q - 1, 1.0)

    def normalization_newton(self):
        # for q > 2 keys enter the support with infinite slope, which stalls Newton
        return jnp.logical_not(jnp.asarray(self.q) > 2)

    def second_order_start(self):
        # near the cutoff (q > 1) the expansion behind the correction is poor
        return jnp.logical_not(self.q > 1)

    def component_law(self):
        q = concrete_float(self.q)
        if q is not None:
            return _TsallisCutoffLaw(self) if q >= _CUTOFF_GAUGE_Q else ExactComponentLaw(self)
        if jnp.ndim(self.q) > 0:  # no scalar to switch on
            return ExactComponentLaw(self)
        return ComponentLawSwitch(self.q >= _CUTOFF_GAUGE_Q, _TsallisCutoffLaw(self),
                                  ExactComponentLaw(self))


class _TsallisCutoffLaw(AbstractCutoffComponentLaw):
    r"""Tsallis q > 1 measured from its cutoff $G(0^+) = 0$: $u = G(x) = q x^{q-1}/(q-1)$,
    $x = b_+^{p}$ with $b = (q-1)u/q$, $p = 1/(q-1)$."""

    entropy: Tsallis

    def target(self, x):
        return self.entropy.G(x)

    def __call__(self, u, state, cold):
        q = self.entropy.q
        b = jnp.maximum((q - 1) * u / q, 0.0)
        p = concrete_float(1.0 / (q - 1)) if concrete_float(q) is not None else None
        if p == 1:
            # q = 2 (sparsemax): a select, not max(., 0), whose zero XLA:CPU would write out
            # as a whole array on every pass to hand the row sum to its reduction library
            active = u > 0
            x = jnp.where(active, (q - 1) * u / q, 0.0)
            slope = active.astype(u.dtype) / q  # (not where(., 1/q, 0): weakly f64)
        elif p is not None and p == round(p) and 2 <= p <= 4:
            # integer exponent (q = 3/2): multiplies instead of exp/log
            p = int(round(p))
            x = b**p
            slope = b ** (p - 1) / q
        else:
            active = b > 0
            b_safe = jnp.where(active, b, 1.0)
            x = jnp.where(active, jnp.exp(jnp.log(b_safe) / (q - 1)), 0.0)
            slope = jnp.where(active, x / (q * b_safe), 0.0)
        return x, slope, state, None
