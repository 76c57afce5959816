from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import ArrayLike
from .._misc import concrete_float, real_parameter, softplus_inverse
from ._base import (
    AbstractComponentLaw,
    AbstractSeparableEntropy,
    ComponentLawSwitch,
    _safe_log,
    _sinh_ratio,
)

# |ln q| from which the solver inverts the law in v = x^(1/Q - 1) (Q = max(q, 1/q)); closer
# to q = 1 the asinh form keeps the Shannon limit free of cancellation.
_ABE_V_MIN_EPS = 0.2
# Newton steps of the v iteration from its cold-start guess, by float width in bytes: enough
# to reach round-off from the guess.
_ABE_COLD_STEPS = {2: 3, 4: 3, 8: 4}
# The component iteration chains divides and square roots whose intermediates XLA:CPU writes
# out as whole arrays; solved in row blocks of about this many bytes they stay in cache.
_ABE_BLOCK_BYTES = 1 << 20


def _abe_parts(eps, log):
    """Pieces of the stable Abe law, with eps = |ln q| > 0.

    $G = e^{c\\ell}\\,\\sinh(\\epsilon + s\\ell)/s$, $s = \\sinh\\epsilon$,
    $c = \\cosh\\epsilon - 1 = 2\\sinh^2(\\epsilon/2)$: even in eps, no cancellation as eps -> 0.
    """
    s = jnp.sinh(eps)
    c = 2 * jnp.sinh(eps / 2) ** 2
    return s, c, eps + s * log


def _small_half_integer(a):
    a_c = concrete_float(a)
    return a_c is not None and abs(2 * a_c - round(2 * a_c)) < 1e-12 and 1 <= round(2 * a_c) <= 8


def _neg_pow(v, a, log_v):
    """$v^{-a}$; a few multiplies and a sqrt when 2a is a small known integer."""
    if _small_half_integer(a):
        k2 = int(round(2 * concrete_float(a)))
        p = jax.lax.integer_pow(v, k2 // 2) if k2 >= 2 else jnp.ones_like(v)
        if k2 % 2:
            p = p * jnp.sqrt(v)
        return 1.0 / p
    return jnp.exp(-a * log_v)


class Abe(AbstractSeparableEntropy):
    """$S_A = -\\sum(\\rho^q - \\rho^{1/q})/(q - 1/q)$, q > 0 (q = 1 is Shannon, continuously).

    Reciprocal symmetric: $S_A(q) = S_A(1/q)$, so the map is even in $\\epsilon = \\ln q$.
    Realized by per-component inversion of G plus a scalar normalization root.
    """

    q: ArrayLike
    parse_names: ClassVar[tuple[str, ...]] = ("abe",)
    parse_defaults: ClassVar[tuple[float, ...]] = (1.5,)
    realization: ClassVar[str] = "component roots"
    row_block_bytes: ClassVar[int | None] = _ABE_BLOCK_BYTES

    def tail_reference(self, T):
        q = float(self.q)
        q = max(q, 1 / q)
        return -q / (q - 1), "-q/(q-1)"

    @classmethod
    def shape_chart(cls):
        """$q = e^{0.01 + \\mathrm{softplus}(u)}$: a fit finds q > 1, since $S_A(q) = S_A(1/q)$."""
        return (lambda u: jnp.exp(0.01 + jax.nn.softplus(u)),
                lambda q: softplus_inverse(abs(math.log(q)) - 0.01))

    def __check_init__(self):
        q = real_parameter(self.q, "q", "Abe")
        if q is not None and not np.all((q > 0) & np.isfinite(q)):
            raise ValueError(f"Abe needs q > 0; got q={q}.")

    @property
    def eps(self):
        return jnp.abs(jnp.log(self.q))

    def G_of_log(self, log):
        """G as a function of $\\ell = \\ln x$ (finite for every real l)."""
        eps = self.eps
        s, c, arg = _abe_parts(jnp.where(eps == 0, 1.0, eps), log)
        val = jnp.exp(c * log) * jnp.sinh(arg) / s
        return jnp.where(eps == 0, 1.0 + log, val)

    def dG_dlog(self, log):
        eps = self.eps
        s, c, arg = _abe_parts(jnp.where(eps == 0, 1.0, eps), log)
        val = jnp.exp(c * log) * (c * jnp.sinh(arg) / s + jnp.cosh(arg))
        return jnp.where(eps == 0, 1.0, val)

    def G(self, x):
        return self.G_of_log(jnp.log(x))

    def G_prime(self, x):
        return self.dG_dlog(jnp.log(x)) / x

    def G1(self):
        return 1.0

    def asinh_G_of_log(self, log):
        """(asinh G(l), d asinh G / dl), overflow-free for any l (used by the solver)."""
        eps = self.eps
        eps_safe = jnp.where(eps == 0, 1.0, eps)
        s, c, arg = _abe_parts(eps_safe, log)
        absarg = jnp.abs(arg)
        # log|G| = c l + log|sinh(arg)| - log s
        log_sinh = absarg + jnp.log(-jnp.expm1(-2 * absarg)) - jnp.log(2.0)
        L = c * log + log_sinh - jnp.log(s)
        sign = jnp.sign(arg)
        small = L < 0
        G_small = sign * jnp.exp(jnp.where(small, L, 0.0))
        A_big = sign * (L + jnp.log1p(jnp.sqrt(1 + jnp.exp(-2 * jnp.where(small, 0.0, L)))))
        A = jnp.where(small, jnp.arcsinh(G_small), A_big)
        # derivative: G_l / sqrt(1 + G^2)
        Gl_small = jnp.exp(c * jnp.where(small, log, 0.0)) * (
            c * jnp.sinh(jnp.where(small, arg, 0.0)) / s + jnp.cosh(jnp.where(small, arg, 0.0))
        )
        dA_small = Gl_small / jnp.sqrt(1 + G_small**2)
        argsafe = jnp.where(small, 1.0, arg)
        dA_big = (c + s / jnp.tanh(argsafe)) * jnp.tanh(A_big)
        dA = jnp.where(small, dA_small, dA_big)
        # Shannon limit
        A0 = jnp.arcsinh(1.0 + log)
        dA0 = 1.0 / jnp.sqrt(1 + (1.0 + log) ** 2)
        return jnp.where(eps == 0, A0, A), jnp.where(eps == 0, dA0, dA)

    def log_guess(self, y):
        r"""Starting point for the inversion of $G(e^l) = 1 + y$: the Shannon core
        $l = y$ (near q = 1: $\sinh(\epsilon + s l) = s w$), or in the deep tail the
        asymptote $-e^{(c-s)l - \epsilon}/(2s) = 1 + y$."""
        eps = self.eps
        s = jnp.sinh(eps)
        c = 2 * jnp.sinh(eps / 2) ** 2
        w = 1.0 + y
        tail = (jnp.log(jnp.maximum(-w, 1.0)) + eps + jnp.log(2 * s)) / jnp.where(
            eps == 0, -1.0, c - s
        )
        tail = jnp.where((eps == 0) | (w > -1.0), -jnp.inf, tail)
        far = jnp.minimum(jnp.maximum(y, tail), 0.0)
        # Near q = 1 the asymptote holds only where |s w| >> 1 (elsewhere it is positive and
        # the guess would be l = 0, far from a root near y): the exact law without its
        # factor e^{c l}, l = (asinh(s w) - eps)/s, covers the core and the onset of the tail.
        e1 = jnp.where(eps == 0, 1.0, eps)
        s1 = jnp.sinh(e1)
        core = (jnp.arcsinh(s1 * w) - e1) / s1
        near = jnp.where(s1 * w < -10.0, jnp.maximum(core, tail), core)
        near = jnp.minimum(jnp.where(eps == 0, y, near), 0.0)
        return jnp.where(eps < _ABE_V_MIN_EPS, near, far)

    def _asinh_newton(self, y, log, steps, unroll=1):
        """`steps` Newton steps in $l = \\ln x$ on $\\mathrm{asinh}\\,G(e^l) =
        \\mathrm{asinh}(1 + y)$ from `log`: nearly linear both in the Shannon core and in the
        algebraic tails. Returns (x, dx/dy, l, residual relative to the target)."""
        target = jnp.arcsinh(1.0 + y)
        # the law is nearly linear in l with slope ~ sinh(eps) in the tails, so the natural
        # step bound scales as 1/sinh(eps): a fixed bound stalls Newton near q = 1
        s = jnp.sinh(self.eps)
        bound = 100.0 / jnp.minimum(jnp.where(s > 0, s, 1.0), 1.0)

        def step(_, log):
            A, dA = self.asinh_G_of_log(log)
            return jnp.minimum(log - jnp.clip((A - target) / dA, -bound, bound), 1.0)

        log = jax.lax.fori_loop(0, steps, step, log, unroll=unroll)
        A, dA = self.asinh_G_of_log(log)
        x = jnp.exp(log)
        # dx/dy = x dl/dy = x (dA/dy)/(dA/dl), dA/dy = 1/sqrt(1 + (1 + y)^2)
        slope = x / (dA * jnp.sqrt(1 + (1.0 + y) ** 2))
        return x, slope, log, jnp.abs(A - target) / (1 + jnp.abs(target))

    def inverse_shifted(self, y):
        """Newton on the asinh form from `log_guess`; converged well within 40 steps."""
        x, slope, _, _ = self._asinh_newton(y, self.log_guess(y), 40)
        return x, slope

    def terms(self, rho):
        # -(rho^q - rho^(1/q))/(q - 1/q) = -rho^(cosh eps) sinh(sinh(eps) l)/sinh(eps)
        log, pos = _safe_log(rho)
        eps = self.eps
        s = jnp.sinh(eps)
        val = -jnp.exp(jnp.cosh(eps) * log) * _sinh_ratio(s, log)
        return jnp.where(pos, val, 0.0)

    def inverse_slope(self, x):
        # x / (dA/dl cosh A) in logs: G'(x) overflows in the deep tail
        log = jnp.log(x)
        A, dA = self.asinh_G_of_log(log)
        absA = jnp.abs(A)
        logcosh = absA + jnp.log1p(jnp.exp(-2 * absA)) - jnp.log(2.0)
        return jnp.exp(log - jnp.log(dA) - logcosh)

    def _v_constants(self):
        """(Q, p) = (max(q, 1/q), Q/(Q-1)), as Python floats when q is known."""
        q_c = concrete_float(self.q)
        if q_c is not None:
            Q = max(q_c, 1.0 / q_c)
            return Q, Q / (Q - 1)
        Q = jnp.exp(self.eps)
        return Q, Q / (Q - 1)

    def component_law(self):
        # the v form away from q = 1 (cheap, warm-started), the asinh form near it
        if jnp.ndim(self.eps) > 0:
            return _AbeAsinhLaw(self)
        q_c = concrete_float(self.q)
        if q_c is None:
            return ComponentLawSwitch(
                self.eps >= _ABE_V_MIN_EPS, _AbeVLaw(self), _AbeAsinhLaw(self)
            )
        return _AbeVLaw(self) if abs(math.log(q_c)) >= _ABE_V_MIN_EPS else _AbeAsinhLaw(self)


class _AbeAsinhLaw(AbstractComponentLaw):
    """Abe's asinh Newton from the asymptotic guess at every evaluation (no warm start),
    so that each evaluation of S(nu) is the same function of nu and brackets stay valid."""

    entropy: Abe

    def __call__(self, y, state, cold):
        x, slope, _, err = self.entropy._asinh_newton(y, self.entropy.log_guess(y), 6, True)
        return x, slope, state, err


class _AbeVLaw(AbstractComponentLaw):
    r"""Abe's law $G(x) = 1 + y$ (|ln q| not small) in $v = x^{-b}$, $b = 1 - 1/Q$:
    $f(v) = v/Q - Q v^{-Q} + (Q - 1/Q)(1 + y) = 0$, f increasing and concave, so a Newton step
    from any point lands at or left of the root and the iteration is monotone from there;
    $v \ge \max(1, (Q^2 - 1)(-w))$ is a lower bound (x <= 1 as y <= 0). The state is v,
    warm-starting each evaluation from the previous one."""

    entropy: Abe
    warm_start: ClassVar[bool] = True

    def init(self, y, keep=None):
        # the Shannon core v = e^{b(1-w)}, capped by the upper bound of the root (exact in
        # the algebraic tail)
        Q, p = self.entropy._v_constants()
        w = 1.0 + jnp.maximum(y, -jnp.sqrt(jnp.finfo(y.dtype).max))
        v_lb = jnp.maximum(1.0, (Q * Q - 1) * (-w))
        v_ub = (Q * Q - 1) * (-w) + Q * Q * _neg_pow(v_lb, Q, jnp.log(v_lb))
        v = jnp.minimum(jnp.exp(jnp.minimum((1 - w) / p, 50.0)), v_ub)
        return v if keep is None else jnp.where(keep, v, 1.0)

    def __call__(self, y, v, cold):
        steps = _ABE_COLD_STEPS[jnp.dtype(y.dtype).itemsize] if cold else 2
        Q, p = self.entropy._v_constants()
        # below -sqrt(max) the weight underflows (x < |w|^-1) and the clamp keeps v finite
        w = 1.0 + jnp.maximum(y, -jnp.sqrt(jnp.finfo(y.dtype).max))
        v_lb = jnp.maximum(1.0, (Q * Q - 1) * (-w))
        v = jnp.maximum(v, v_lb)
        c = (Q - 1.0 / Q) * w
        for _ in range(steps):
            vq = _neg_pow(v, Q, jnp.log(v))
            fp = 1.0 / Q + Q * Q * vq / v
            step = (v / Q - Q * vq + c) / fp
            v = jnp.maximum(v - step, v_lb)  # (jnp.fmax here defeats XLA:CPU vectorization)
        # everything returned is a function of the final v alone (f and f' re-evaluated
        # there): XLA:CPU then writes out v once, not each intermediate of the last step
        x = _neg_pow(v, p, jnp.log(v))
        vq = _neg_pow(v, Q, jnp.log(v))
        fp = 1.0 / Q + Q * Q * vq / v
        slope = p * (x / v) * (Q - 1.0 / Q) / fp
        # the next Newton step, relative to v: the distance to the root to first order
        err = jnp.abs(v / Q - Q * vq + c) / (fp * v)
        return x, slope, v, err
