"""The abstract entropy families and the hooks the stationary solvers ask them.

A family is a small final `eqx.Module` on one of these bases. The solvers in
`fisherdyn/_stationary/` never test for a concrete family: whatever they need to know (the
component law and its inverse, the normalization power, the warm start, the row-block size,
the threshold exponent, ...) is a method or a class variable here, with a generic default that
a new family may override. See `docs/math.md §2` for the families themselves.

Parameters may be Python floats (kept exact, validated at construction) or JAX arrays (then
they are differentiable and vmappable; validation happens only when the value is concrete).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Bool, Float, PyTree

# parse name -> family class, filled by `AbstractEntropy.__init_subclass__`
_REGISTRY: dict[str, type] = {}


def _parse_key(name: str) -> str:
    """A family name as `parse_entropy` compares it: lower case, no '-', '_' or accent."""
    return name.strip().lower().replace("-", "").replace("_", "").replace("é", "e")


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

    **Class variables:**
    - `parse_names`: the names `parse_entropy` knows the family by (a family that declares
      them is registered when its class is defined); `parse_defaults`: its parameters when a
      specification omits them (their number is the number of parameters);
      `example_parameters`: further parameter sets `fisherdyn run` relaxes by default.
    - `realization`: how the stationary map is computed, in words (for tables).
    - `may_have_cutoff`: whether the family can put keys at exactly zero weight.
    - `finite_at_boundary`: whether the free energy stays finite where a weight reaches 0.
    - `closed_form_softmax`: whether the stationary map is softmax(z/T) (the operator then
      uses the closed form).
    - `row_block_bytes`: solve the rows in blocks of this many bytes of scores (a law whose
      evaluation chains many intermediates stays in cache), or None for one pass.

    What a separable family and a Tsallis-shaped one do differently is a method of their
    base (`stationary_law`, `effective_temperature`); the stationary solvers choose their
    algorithm by that base class, never by a flag.
    """

    parse_names: ClassVar[tuple[str, ...]] = ()
    parse_defaults: ClassVar[tuple[float, ...]] = ()
    example_parameters: ClassVar[tuple[tuple[float, ...], ...]] = ()
    realization: ClassVar[str] = "scalar root"
    may_have_cutoff: ClassVar[bool] = False
    finite_at_boundary: ClassVar[bool] = True
    closed_form_softmax: ClassVar[bool] = False
    row_block_bytes: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.__dict__.get("parse_names", ()):
            key = _parse_key(name)
            other = _REGISTRY.get(key)
            if other is not None and other.__qualname__ != cls.__qualname__:
                raise ValueError(f"entropy name {name!r} is taken by {other.__qualname__}")
            _REGISTRY[key] = cls

    @property
    def parameters(self) -> dict[str, ArrayLike]:
        """The family's parameters by field name, in declaration order (`{"kappa": 0.3}`);
        static fields that `for_tracing` records are not parameters."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not f.metadata.get("static", False)
        }

    def for_tracing(self) -> AbstractEntropy:
        """This entropy before its parameters become traced arrays (as `relax` and
        `relaxation_spectrum` make them, so that new values do not recompile): a family may
        record, as static fields, what its concrete parameters say about which formulas are
        accurate. The default records nothing."""
        return self

    def tail_reference(self, T: float) -> tuple[float | None, str]:
        """The known far-tail law of the stationary map, as (value, formula): the exponent
        of an algebraic tail $\\rho \\sim |z|^{p}$, or the rate $d\\ln\\rho/dz$ of an
        exponential one; `(None, "")` where no closed form is known."""
        return None, ""

    @classmethod
    def shape_chart(
        cls,
    ) -> tuple[Callable[[Float[Array, ""]], Float[Array, ""]], Callable[[float], float]] | None:
        """An unconstrained chart of the family's one shape parameter, for a fit that moves
        it freely (`fit_path`): `(shape, chart)`, where `shape(u)` is a valid parameter for
        every real `u` and `chart(value)` is its inverse (for initial guesses). None (the
        default): the family is fit only if it has no parameter."""
        return None

    @abc.abstractmethod
    def value(
        self, rho: Float[ArrayLike, "*batch N"], mask: Bool[ArrayLike, "*#batch N"] | None = None
    ) -> Float[Array, "*batch"]:
        """$S(\\rho)$, reduced over the last axis."""

    @abc.abstractmethod
    def grad(
        self, rho: Float[ArrayLike, "*batch N"], mask: Bool[ArrayLike, "*#batch N"] | None = None
    ) -> Float[Array, "*batch N"]:
        """$\\partial S/\\partial \\rho_i$ on the last axis."""

    @abc.abstractmethod
    def stationary_law(self) -> AbstractSeparableEntropy:
        """The separable family whose law $T_{eff}\\,G(\\rho_i) = z_i + \\lambda$ the
        stationary weights obey on their support (docs/math.md §2)."""

    @abc.abstractmethod
    def effective_temperature(
        self,
        T: Float[ArrayLike, "*#batch"],
        rho: Float[ArrayLike, "*batch N"],
        mask: Bool[ArrayLike, "*#batch N"] | None = None,
    ) -> Float[Array, "*batch"]:
        """$T_{eff}$ of that law at weights `rho` and temperature `T` (one per row)."""

    @property
    def name(self) -> str:
        return type(self).__name__


class AbstractComponentLaw(eqx.Module):
    """How the separable solver evaluates the component law $y \\mapsto (x, dx/dy)$,
    $\\hat G(x) = y$, at every key on each pass.

    `state` is carried between the solver's evaluations (one array per key, or a scalar
    placeholder); a law that iterates returns its error estimate relative to $x$ so that
    the solver only trusts converged sums.
    """

    # The state warm-starts the next evaluation: the solver then refines an inexact S(nu)
    # in place (same nu) instead of stepping on it, which could cycle.
    warm_start: ClassVar[bool] = False
    # The law's argument: False, $y = G(x) - G(1)$ (zero at weight 1); True, $u = G(x) -
    # G(0^+)$ (zero at a finite cutoff, see `AbstractCutoffComponentLaw`).
    from_cutoff: ClassVar[bool] = False

    def init(
        self, y: Float[Array, "*batch N"], keep: Bool[Array, "*batch N"] | None = None
    ) -> PyTree[Array]:
        """The cold-start state for targets `y` (`keep`: the keys taking part, or None)."""
        return jnp.zeros((), y.dtype)

    @abc.abstractmethod
    def __call__(
        self, y: Float[Array, "*batch N"], state: PyTree[Array], cold: bool
    ) -> tuple[Float[Array, "*batch N"], Float[Array, "*batch N"], PyTree[Array],
               Float[Array, "*batch N"] | None]:
        """`(x, dx/dy, state, error)` at the targets `y`; `error` is None for an exact law.
        `cold`: the first evaluation, from `init`'s state."""

    def cold(
        self, y: Float[Array, "*batch N"]
    ) -> tuple[Float[Array, "*batch N"], Float[Array, "*batch N"]]:
        """`(x, dx/dy)` as the first evaluation gives it (used for the solver's start)."""
        x, slope, _, _ = self(y, self.init(y), True)
        return x, slope


class AbstractCutoffComponentLaw(AbstractComponentLaw):
    """A component law of a family with a finite cutoff $G(0^+)$, taking $u = G(x) -
    G(0^+) \\ge 0$ instead of $y = G(x) - G(1)$.

    The solver then measures its multiplier from the top key's cutoff: where many keys share
    the mass, every weight is far below 1 and its $u$ is tiny, which a multiplier measured
    from weight 1 can only resolve to the rounding of $G(1) - G(0^+)$ (all-zero rows when
    the weights' $u$ fall below it), and this gauge resolves to its own relative precision.
    """

    from_cutoff: ClassVar[bool] = True

    @abc.abstractmethod
    def target(self, x: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """$u = G(x) - G(0^+)$ at weight x > 0, without cancellation."""


class ExactComponentLaw(AbstractComponentLaw):
    """The family's own `inverse_shifted`, exact in one evaluation (the default law)."""

    entropy: AbstractSeparableEntropy

    def __call__(self, y, state, cold):
        x, slope = self.entropy.inverse_shifted(y)
        return x, slope, state, None


class ComponentLawSwitch(eqx.Module):
    """One of two component laws, chosen at run time by `pred` (a traced scalar)."""

    pred: Bool[Array, ""]
    if_true: AbstractComponentLaw
    if_false: AbstractComponentLaw


class AbstractSeparableEntropy(AbstractEntropy):
    """$S = \\sum_i s(\\rho_i)$, described by $G(x) = -s'(x)$ (increasing).

    Subclasses implement `G`, `G_prime`, `G1`, `inverse_shifted` and `terms`; `G1 = G(1)`
    is the gauge constant. `inverse_shifted(y)` returns `(x, dx/dy)` with $G(x) - G(1) = y$,
    which is what the stationary solver iterates on: working with the shifted law keeps every
    family well conditioned in its Shannon limit.

    The solver hooks below (after `grad`) have generic defaults; a family overrides one only
    to make its solve cheaper or better conditioned, never to make it correct.
    """

    @abc.abstractmethod
    def G(self, x: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """$G(x) = -\\partial S/\\partial x$."""

    @abc.abstractmethod
    def G_prime(self, x: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """$G'(x) > 0$."""

    @abc.abstractmethod
    def G1(self) -> Float[ArrayLike, ""]:
        """$G(1)$, the gauge constant."""

    @abc.abstractmethod
    def inverse_shifted(
        self, y: Float[Array, "*shape"]
    ) -> tuple[Float[Array, "*shape"], Float[Array, "*shape"]]:
        """`(x, dx/dy)` solving $G(x) - G(1) = y$; `x = 0` where the law has a cutoff."""

    @abc.abstractmethod
    def terms(self, rho: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """Per-component entropy contributions $s(\\rho_i)$."""

    def G_inverse(self, y: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """$G^{-1}(y)$ (0 below a cutoff)."""
        return self.inverse_shifted(y - self.G1())[0]

    def G_shifted(self, x: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """$G(x) - G(1)$, evaluated without cancellation where a family needs it."""
        return self.G(x) - self.G1()

    def value(self, rho, mask=None):
        return _masked_sum(self.terms(rho), mask)

    def stationary_law(self):
        """The family itself: $T\\,G(\\rho_i) = z_i + \\lambda$."""
        return self

    def effective_temperature(self, T, rho, mask=None):
        """`T` itself: a separable law has no self-consistent temperature."""
        return T

    def grad(self, rho, mask=None):
        g = -self.G(rho)
        return g if mask is None else jnp.where(mask, g, 0.0)

    # ----------------------------------------------------------------- solver hooks

    def inverse_slope(self, x: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """$dx/dy = 1/G'(x)$ at $x > 0$, overflow-free (the Jacobian's diagonal)."""
        return 1.0 / self.G_prime(x)

    def normalization_power(self) -> Float[ArrayLike, ""]:
        """Box-Cox power $\\lambda$: the solver zeroes $(S^\\lambda - 1)/\\lambda$ ($\\log S$
        at 0), $S(\\nu) = \\sum_i\\rho_i(\\nu)$. A power that makes it linear in $\\nu$ when
        one key is active needs fewest Newton steps (Shannon: 0)."""
        return 0.0

    def normalization_newton(self) -> bool | Bool[Array, "..."]:
        """Whether Newton steps on the normalization are used (else Illinois only): `True`,
        or a boolean array for a law whose keys enter the support with infinite slope."""
        return True

    def second_order_start(self) -> bool | Bool[Array, "..."]:
        """Whether the start adds the spread correction to Jensen's bound: `True`, or a
        boolean array where the law's expansion near a cutoff is poor."""
        return True

    def component_law(self) -> AbstractComponentLaw | ComponentLawSwitch:
        """The component law the separable solver evaluates (default: `inverse_shifted`)."""
        return ExactComponentLaw(self)


class AbstractTsallisShapedEntropy(AbstractEntropy):
    """Moment entropies whose stationary profile is the Tsallis map at an effective,
    self-consistent temperature $T_{eff} = T\\,\\phi(M_q)$ (Renyi, Sharma-Mittal).

    Subclasses implement `temperature_factor` ($\\phi$) and `value`; `shape_exponent`
    ($s$ with $\\phi = M^{-s}$) opens the one-equation threshold solve, and
    `value_of_log_moment` gives $S$ from $\\ln M_q$ alone.
    """

    q: eqx.AbstractVar[ArrayLike]
    realization: ClassVar[str] = "self-consistent"
    may_have_cutoff: ClassVar[bool] = True

    @abc.abstractmethod
    def temperature_factor(self, M: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        """$\\phi(M)$ with $T_{eff} = T\\,\\phi(M)$."""

    def shape_exponent(self) -> Float[ArrayLike, ""] | None:
        """$s$ with $\\phi(M) = M^{-s}$, or None where $\\phi$ is not a power (then the
        operator has no threshold parametrization for the family)."""
        return None

    def value_of_log_moment(self, logM: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        """$S$ as a function of $\\ln M_q$ (used to rank branches by free energy)."""
        raise NotImplementedError(f"{type(self).__name__} has no value_of_log_moment")

    def tsallis(self) -> AbstractSeparableEntropy:
        from ._tsallis import Tsallis

        return Tsallis(self.q)

    def stationary_law(self):
        """Tsallis at the family's q: $T_{eff}\\,G_q(\\rho_i) = z_i + \\lambda$."""
        return self.tsallis()

    def effective_temperature(self, T, rho, mask=None):
        """$T\\,\\phi(M_q(\\rho))$, the self-consistent temperature."""
        return T * self.temperature_factor(self.moment(rho, mask))

    def moment(
        self, rho: Float[ArrayLike, "*batch N"], mask: Bool[ArrayLike, "*#batch N"] | None = None
    ) -> Float[Array, "*batch"]:
        """$M_q(\\rho) = \\sum \\rho^q$."""
        log, pos = _safe_log(rho)
        return _masked_sum(jnp.where(pos, jnp.exp(self.q * log), 0.0), mask)

    def grad(self, rho, mask=None):
        # dS/drho_i = phi(M) * (Tsallis gradient): Renyi phi = 1/M, S-M phi = M^((q-r)/(1-q))
        M = self.moment(rho, mask)[..., None]
        return self.temperature_factor(M) * self.tsallis().grad(rho, mask)
