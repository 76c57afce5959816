"""Generalized entropies on the probability simplex (MATH.md section 2).

Each family is a small final `eqx.Module`. Separable families expose the scalar
inverse-gradient law through `G(x) = -h(x)` (`h = dS/dx`), its derivative and its
inverse; the stationary operators in `_stationary.py` are built only from these.

Parameters may be Python floats (kept exact, validated at construction) or JAX arrays
(then they are differentiable and vmappable; validation happens only when the value is
concrete).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = [
    "AbstractEntropy",
    "AbstractSeparableEntropy",
    "AbstractTsallisShapedEntropy",
    "Shannon",
    "Tsallis",
    "Renyi",
    "SharmaMittal",
    "Kaniadakis",
    "Burg",
    "Abe",
    "parse_entropy",
]


def _concrete(x) -> float | None:
    """The float value of `x` when it is known at trace time, else None."""
    try:
        return float(np.asarray(x))
    except Exception:  # a tracer: validated later, or not at all
        return None


def _safe_log(x):
    """(log x, x > 0) with a finite log where x == 0, so that `where` keeps grads clean."""
    pos = x > 0
    return jnp.log(jnp.where(pos, x, 1.0)), pos


def _masked_sum(terms, mask):
    if mask is not None:
        terms = jnp.where(mask, terms, 0.0)
    return jnp.sum(terms, axis=-1)


def _sinh_ratio(a, b):
    """sinh(a*b)/a, continuous (= b) at a == 0, without cancellation for small a."""
    a_safe = jnp.where(a == 0, 1.0, a)
    return jnp.where(a == 0, b, jnp.sinh(a_safe * b) / a_safe)


class AbstractEntropy(eqx.Module):
    """A generalized entropy $S(\\rho)$ on the simplex.

    **Methods:** `value(rho, mask=None)` is $S$ along the last axis; `grad(rho, mask=None)`
    is $h_i = \\partial S / \\partial \\rho_i$ (zero on masked entries).
    """

    realization: ClassVar[str]
    separable: ClassVar[bool]
    # Whether the family can put keys at exactly zero weight (a cutoff, at q > 1).
    may_have_cutoff: ClassVar[bool] = False
    # Whether the free energy stays finite where a weight reaches 0 (Burg's does not).
    finite_at_boundary: ClassVar[bool] = True

    def tail_reference(self, T) -> tuple[float | None, str]:
        """The known far-tail law of the stationary map, as (value, formula): the exponent
        of an algebraic tail $\rho \sim |z|^{p}$, or the rate $d\ln\rho/dz$ of an
        exponential one; `(None, "")` where no closed form is known."""
        return None, ""

    @abc.abstractmethod
    def value(self, rho, mask=None):
        """$S(\\rho)$, reduced over the last axis."""

    @abc.abstractmethod
    def grad(self, rho, mask=None):
        """$\\partial S/\\partial \\rho_i$ on the last axis."""

    @property
    def name(self) -> str:
        return type(self).__name__


class AbstractSeparableEntropy(AbstractEntropy):
    """$S = \\sum_i s(\\rho_i)$, described by $G(x) = -s'(x)$ (increasing).

    Subclasses implement `G`, `G_prime`, `inverse_shifted` and `_terms`; `G1 = G(1)` is the
    gauge constant. `inverse_shifted(y)` returns `(x, dx/dy)` with `G(x) - G(1) = y`, which is
    what the stationary solver iterates on: working with the shifted law keeps every family
    well conditioned in its Shannon limit.
    """

    separable: ClassVar[bool] = True

    @abc.abstractmethod
    def G(self, x):
        """$G(x) = -\\partial S/\\partial x$."""

    @abc.abstractmethod
    def G_prime(self, x):
        """$G'(x) > 0$."""

    @abc.abstractmethod
    def G1(self):
        """$G(1)$, the gauge constant."""

    @abc.abstractmethod
    def inverse_shifted(self, y):
        """`(x, dx/dy)` solving $G(x) - G(1) = y$; `x = 0` where the law has a cutoff."""

    @abc.abstractmethod
    def _terms(self, rho):
        """Per-component entropy contributions $s(\\rho_i)$."""

    def G_inverse(self, y):
        """$G^{-1}(y)$ (0 below a cutoff)."""
        return self.inverse_shifted(y - self.G1())[0]

    def G_shifted(self, x):
        """$G(x) - G(1)$, evaluated without cancellation where a family needs it."""
        return self.G(x) - self.G1()

    def value(self, rho, mask=None):
        return _masked_sum(self._terms(rho), mask)

    def grad(self, rho, mask=None):
        g = -self.G(rho)
        return g if mask is None else jnp.where(mask, g, 0.0)


class Shannon(AbstractSeparableEntropy):
    """$S = -\\sum \\rho\\ln\\rho$; stationary map `softmax(z/T)` (closed form)."""

    realization: ClassVar[str] = "closed form"

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

    def _terms(self, rho):
        log, pos = _safe_log(rho)
        return jnp.where(pos, -rho * log, 0.0)


class Tsallis(AbstractSeparableEntropy):
    """$S_q = (1 - \\sum\\rho^q)/(q-1)$, q > 0, q != 1: the alpha-entmax family (alpha = q).

    For q > 1 the stationary map has compact support (exact zeros past the threshold); for
    0 < q < 1 it is dense with an algebraic tail.
    """

    q: ArrayLike
    realization: ClassVar[str] = "threshold"
    may_have_cutoff: ClassVar[bool] = True

    def __check_init__(self):
        q = _concrete(self.q)
        if q is not None and not (q > 0 and q != 1 and np.isfinite(q)):
            raise ValueError(f"Tsallis needs q > 0 and q != 1 (q = 1 is Shannon); got q={q}.")

    def G(self, x):
        return self.q * x ** (self.q - 1) / (self.q - 1)

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
        p = _concrete(1.0 / (q - 1)) if _concrete(q) is not None else None
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

    def _terms(self, rho):
        # rho (1 - rho^(q-1))/(q-1) = -rho expm1((q-1) ln rho)/(q-1): no cancellation near q=1.
        log, pos = _safe_log(rho)
        val = -rho * jnp.expm1((self.q - 1) * log) / (self.q - 1)
        return jnp.where(pos, val, 0.0)

    def value(self, rho, mask=None):
        # (1 - sum rho^q)/(q-1) = (1 - sum rho)/(q-1) + sum rho (1 - rho^(q-1))/(q-1):
        # the first term vanishes on the simplex but keeps grad(value) exact off it.
        total = _masked_sum(rho, mask)
        return (1.0 - total) / (self.q - 1) + _masked_sum(self._terms(rho), mask)


class Kaniadakis(AbstractSeparableEntropy):
    """$S_\\kappa = -\\sum \\rho(\\rho^\\kappa - \\rho^{-\\kappa})/(2\\kappa)$, 0 < |kappa| < 1.

    Dense, with algebraic tail $\\rho \\approx C_\\kappa |w|^{-1/\\kappa}$; symmetric in
    $\\kappa \\leftrightarrow -\\kappa$ (|kappa| is used).
    """

    kappa: ArrayLike
    realization: ClassVar[str] = "scalar root"

    def tail_reference(self, T):
        return -1 / abs(float(self.kappa)), "-1/kappa"

    def __check_init__(self):
        k = _concrete(self.kappa)
        if k is not None and not (0 < abs(k) < 1):
            raise ValueError(
                f"Kaniadakis needs 0 < |kappa| < 1 (kappa = 0 is Shannon); got kappa={k}."
            )

    @property
    def _k(self):
        return jnp.abs(self.kappa)

    def G(self, x):
        # ((1+k)x^k - (1-k)x^-k)/(2k) = sinh(k ln x)/k + cosh(k ln x)
        log = jnp.log(x)
        return _sinh_ratio(self._k, log) + jnp.cosh(self._k * log)

    def G_prime(self, x):
        k = self._k
        log = jnp.log(x)
        return (jnp.cosh(k * log) + k * jnp.sinh(k * log)) / x

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
        k_c = _concrete(self.kappa)
        plain = k_c is not None and abs(k_c) >= 0.2 and jnp.finfo(jnp.result_type(y)).eps > 1e-10
        if plain:
            # float32 with kappa >= 0.2: ln(k|w| + r) as a plain log, without the divide
            # that forms r - 1, and the exponent as a product. Max relative error over
            # y in [-1e4, 0] against float64: kappa = 0.3, 24.6 eps (25.3 with log1p; the
            # deep tail's exponent dominates both), 3.5 eps in the core (1.6); kappa = 0.2,
            # 46.7 either way. One pass over the benchmark batch: 6.4 -> 4.7 ms.
            L = jnp.log(k * jnp.abs(w) + r)
        else:
            L = jnp.log1p(k * jnp.abs(w) + k**2 * (w * w - 1) / (r + 1))  # r - 1 exactly
        log_u = jnp.where(w >= 0, L, jnp.log1p(-(k**2)) - L) - jnp.log1p(k)
        x = jnp.exp(log_u * (1.0 / k) if plain else log_u / k)
        return x, x / r

    def _terms(self, rho):
        log, pos = _safe_log(rho)
        return jnp.where(pos, -rho * _sinh_ratio(self._k, log), 0.0)


class Burg(AbstractSeparableEntropy):
    """$S = \\sum \\ln\\rho$; stationary map $T/(\\mu - z_i)$ with inverse-linear tail."""

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

    def _terms(self, rho):
        return jnp.log(rho)


def _abe_parts(eps, log):
    """Pieces of the stable Abe law, with eps = |ln q| > 0.

    $G = e^{c\\ell}\\,\\sinh(\\epsilon + s\\ell)/s$, $s = \\sinh\\epsilon$,
    $c = \\cosh\\epsilon - 1 = 2\\sinh^2(\\epsilon/2)$: even in eps, no cancellation as eps -> 0.
    """
    s = jnp.sinh(eps)
    c = 2 * jnp.sinh(eps / 2) ** 2
    return s, c, eps + s * log


class Abe(AbstractSeparableEntropy):
    """$S_A = -\\sum(\\rho^q - \\rho^{1/q})/(q - 1/q)$, q > 0 (q = 1 is Shannon, continuously).

    Reciprocal symmetric: $S_A(q) = S_A(1/q)$, so the map is even in $\\epsilon = \\ln q$.
    Realized by per-component inversion of G plus a scalar normalization root.
    """

    q: ArrayLike
    realization: ClassVar[str] = "component roots"

    def tail_reference(self, T):
        q = float(self.q)
        q = max(q, 1 / q)
        return -q / (q - 1), "-q/(q-1)"

    def __check_init__(self):
        q = _concrete(self.q)
        if q is not None and not (q > 0 and np.isfinite(q)):
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
        $l = y$, or in the deep tail the asymptote $-e^{(c-s)l - \epsilon}/(2s) = 1 + y$."""
        eps = self.eps
        s = jnp.sinh(eps)
        c = 2 * jnp.sinh(eps / 2) ** 2
        w = 1.0 + y
        tail = (jnp.log(jnp.maximum(-w, 1.0)) + eps + jnp.log(2 * s)) / jnp.where(eps == 0, -1.0, c - s)
        tail = jnp.where((eps == 0) | (w > -1.0), -jnp.inf, tail)
        return jnp.minimum(jnp.maximum(y, tail), 0.0)

    def inverse_shifted(self, y):
        """Newton on asinh G(l) = asinh(1 + y) in l = ln x, which is nearly linear both in
        the Shannon core and in the algebraic tails; converges in a handful of steps."""
        import jax

        target = jnp.arcsinh(1.0 + y)
        log0 = self.log_guess(y)

        def body(_, log):
            A, dA = self.asinh_G_of_log(log)
            return jnp.minimum(log - jnp.clip((A - target) / dA, -100.0, 100.0), 1.0)

        log = jax.lax.fori_loop(0, 40, body, log0)
        x = jnp.exp(log)
        _, dA = self.asinh_G_of_log(log)
        # dx/dy = x dl/dy = x * (dA/dy)/(dA/dl), dA/dy = 1/sqrt(1+(1+y)^2)
        slope = x / (dA * jnp.sqrt(1 + (1.0 + y) ** 2))
        return x, slope

    def _terms(self, rho):
        # -(rho^q - rho^(1/q))/(q - 1/q) = -rho^(cosh eps) sinh(sinh(eps) l)/sinh(eps)
        log, pos = _safe_log(rho)
        eps = self.eps
        s = jnp.sinh(eps)
        val = -jnp.exp(jnp.cosh(eps) * log) * _sinh_ratio(s, log)
        return jnp.where(pos, val, 0.0)


class AbstractTsallisShapedEntropy(AbstractEntropy):
    """Moment entropies whose stationary profile is the Tsallis map at an effective,
    self-consistent temperature $T_{eff} = T\\,\\phi(M_q)$ (Renyi, Sharma-Mittal)."""

    q: eqx.AbstractVar[ArrayLike]
    separable: ClassVar[bool] = False
    realization: ClassVar[str] = "self-consistent"
    may_have_cutoff: ClassVar[bool] = True

    @abc.abstractmethod
    def temperature_factor(self, M):
        """$\\phi(M)$ with $T_{eff} = T\\,\\phi(M)$."""

    def tsallis(self) -> Tsallis:
        return Tsallis(self.q)

    def moment(self, rho, mask=None):
        """$M_q(\\rho) = \\sum \\rho^q$."""
        log, pos = _safe_log(rho)
        return _masked_sum(jnp.where(pos, jnp.exp(self.q * log), 0.0), mask)

    def grad(self, rho, mask=None):
        # dS/drho_i = phi(M) * (Tsallis gradient): Renyi phi = 1/M, S-M phi = M^((q-r)/(1-q))
        M = self.moment(rho, mask)[..., None]
        return self.temperature_factor(M) * self.tsallis().grad(rho, mask)


class Renyi(AbstractTsallisShapedEntropy):
    """$S_q = \\ln M_q/(1-q)$; Tsallis profile at $T_{eff} = T/M_q$."""

    q: ArrayLike

    def __check_init__(self):
        q = _concrete(self.q)
        if q is not None and not (q > 0 and q != 1 and np.isfinite(q)):
            raise ValueError(f"Renyi needs q > 0 and q != 1 (q = 1 is Shannon); got q={q}.")

    def temperature_factor(self, M):
        return 1.0 / M

    def value(self, rho, mask=None):
        # ln(1 + sum rho expm1((q-1) ln rho)) / (1-q): exact as q -> 1 on the simplex.
        log, pos = _safe_log(rho)
        dev = _masked_sum(jnp.where(pos, rho * jnp.expm1((self.q - 1) * log), 0.0), mask)
        total = _masked_sum(rho, mask)
        return jnp.log(total + dev) / (1 - self.q)


class SharmaMittal(AbstractTsallisShapedEntropy):
    """$S_{q,r} = (M_q^{(1-r)/(1-q)} - 1)/(1-r)$; r -> 1 is Renyi, r = q is Tsallis.

    Tsallis profile at $T_{eff} = T M_q^{(q-r)/(1-q)}$.
    """

    q: ArrayLike
    r: ArrayLike

    def __check_init__(self):
        q, r = _concrete(self.q), _concrete(self.r)
        if q is not None and not (q > 0 and q != 1 and np.isfinite(q)):
            raise ValueError(f"SharmaMittal needs q > 0 and q != 1; got q={q}.")
        if r is not None and not (r > 0 and r != 1 and np.isfinite(r)):
            raise ValueError(
                f"SharmaMittal needs r > 0 and r != 1 (r -> 1 is Renyi: use Renyi(q)); got r={r}."
            )

    def temperature_factor(self, M):
        return M ** ((self.q - self.r) / (1 - self.q))

    def value(self, rho, mask=None):
        log_M = jnp.log(self.moment(rho, mask))
        return jnp.expm1((1 - self.r) / (1 - self.q) * log_M) / (1 - self.r)


def parse_entropy(spec: str) -> AbstractEntropy:
    """Build an entropy from a string such as ``"kaniadakis:0.3"`` or ``"sharma_mittal:2,1.5"``."""
    name, _, args = spec.strip().partition(":")
    key = name.strip().lower().replace("-", "").replace("_", "").replace("é", "e")
    try:
        values = [float(a) for a in args.split(",")] if args.strip() else []
    except ValueError as e:
        raise ValueError(f"cannot read the parameters of entropy {spec!r}") from e
    table = {
        "shannon": (Shannon, 0),
        "tsallis": (Tsallis, 1),
        "entmax": (Tsallis, 1),
        "renyi": (Renyi, 1),
        "sharmamittal": (SharmaMittal, 2),
        "kaniadakis": (Kaniadakis, 1),
        "burg": (Burg, 0),
        "abe": (Abe, 1),
    }
    if key not in table:
        raise ValueError(f"unknown entropy {name!r}; choose one of {sorted(set(table))}")
    cls, nargs = table[key]
    if len(values) != nargs:
        raise ValueError(f"entropy {name!r} takes {nargs} parameter(s), got {len(values)}")
    return cls(*values)
