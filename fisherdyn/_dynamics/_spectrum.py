"""Linear response of the damped dynamics about a fixed point (docs/math.md §6).

Each tangent mode of the sphere equation obeys $m s^2 + \\gamma s + \\omega_k^2 = 0$, with
$\\omega_k^2$ the eigenvalues of the tangent stiffness $K$ (`_system.stiffness_matrix`):
$P\\,T\\mathrm{diag}(\\rho^*G'(\\rho^*))P$ on a full support, plus the decoupled boundary modes
$(g_i(0) - \\lambda^*)/2$ of the components a sparse (Tsallis / Renyi, q > 1) fixed point
leaves at 0.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._custom_types import (
    Array, ArrayLike, Bool, Complex, Float, RealScalarLike, Scores, Temperature,
)
from .._entropies import AbstractEntropy
from .._misc import check_entropy, is_concrete
from .._results import _ReadableEnumeration
from .._stationary import check_concrete, refuse_complex, row_T
from ._problem import arrayify_entropy, parameters
from ._system import stiffness_matrix, tangent_basis

__all__ = ["relaxation_spectrum", "RelaxationSpectrum", "REGIMES"]


class REGIMES(eqx.Enumeration, metaclass=_ReadableEnumeration):  # pyright: ignore[reportGeneralTypeIssues]
    """The damping regime of each mode of `relaxation_spectrum` (`RelaxationSpectrum.regime`),
    from the sign of $\\gamma^2 - 4m\\omega^2$; compare with `==`, as `RESULTS`:
    `spectrum.regime == fisherdyn.REGIMES.overdamped` is a boolean array per mode."""

    underdamped = "gamma^2 < 4 m omega^2: the mode oscillates as it decays"
    critical = "gamma^2 = 4 m omega^2 within critical_rtol: the fastest decay, no oscillation"
    overdamped = "gamma^2 > 4 m omega^2: two real decay rates, no oscillation"


# printed as `fisherdyn.REGIMES<...>`, the public name
REGIMES.__module__ = "fisherdyn"
# the words of `regime_names`, in the order of the items' values
_REGIME_NAMES = ("under-damped", "critical", "over-damped")


def _regime_where(pred, if_true, if_false):
    """`REGIMES.where` for an array predicate: one item per mode."""
    return jtu.tree_map(lambda a, b: jnp.where(pred, a, b), if_true, if_false)


class RelaxationSpectrum(eqx.Module):
    """Tangent modes of the linearized dynamics about a fixed point, softest first.

    **Fields:**
    - `omega2`: stiffnesses $\\omega_k^2$, shape (N-1,).
    - `rates`: the roots $s_k$ of $m s^2 + \\gamma s + \\omega_k^2 = 0$, shape (N-1, 2),
      complex; `rates[:, 0]` is the slower root (larger real part). For $m = 0$ the only
      root is $-\\omega_k^2/\\gamma$ and `rates[:, 1]` is $-\\infty$.
    - `regime`: per mode, a `REGIMES` item: `REGIMES.underdamped` ($\\gamma^2 < 4m\\omega^2$),
      `REGIMES.critical` (equal to `critical_rtol`) or `REGIMES.overdamped`.
    - `boundary`: the mode lives on components off the support ($\\rho^*_i = 0$).
    - `modes`: the mode shapes as tangent vectors of the sphere chart $x = \\sqrt\\rho$, (N, N-1).
    - `rho`, `lam`: the fixed point and its multiplier.

    With a `mask`, the masked keys carry no modes: their N - n slots come last, with
    `omega2` $= +\\infty$, `rates` $= -\\infty$, zero `modes`, and the other modes are
    exactly 0 on the masked keys.
    """

    omega2: Float[Array, "*batch N-1"]
    rates: Complex[Array, "*batch N-1 2"]
    regime: REGIMES
    boundary: Bool[Array, "*batch N-1"]
    modes: Float[Array, "*batch N N-1"]
    rho: Float[Array, "*batch N"]
    lam: Float[Array, "*batch"]

    @property
    def decay_rates(self) -> Float[Array, "*batch N-1"]:
        """$-\\mathrm{Re}\\,s_k$ of the slower root: the asymptotic decay of each mode."""
        return -jnp.real(self.rates[..., 0])

    @property
    def slowest_rate(self) -> Float[Array, "*batch"]:
        """The asymptotic relaxation rate of the whole state: $\\min_k -\\mathrm{Re}\\,s_k$."""
        return jnp.min(self.decay_rates, -1)

    @property
    def frequencies(self) -> Float[Array, "*batch N-1"]:
        """$|\\mathrm{Im}\\,s_k|$: the damped oscillation frequency of each mode."""
        return jnp.abs(jnp.imag(self.rates[..., 0]))

    @property
    def regime_names(self) -> list[str]:
        """`regime` as words ("under-damped", "critical", "over-damped"), flattened."""
        return [_REGIME_NAMES[int(r)] for r in np.asarray(self.regime._value).ravel()]


@eqx.filter_jit
def _batched(entropy, rho, z, T, mass, damping, critical_rtol, mask=None):
    """`_single` mapped over the leading axes; T, mass and damping hold one value per row."""
    fn = _single
    for _ in range(rho.ndim - 1):
        mask_axis = None if mask is None else 0
        fn = jax.vmap(fn, in_axes=(None, 0, 0, 0, 0, 0, None, mask_axis))
    return fn(entropy, rho, z, T, mass, damping, critical_rtol, mask)


def _decouple_masked(K, mask):
    """`K` with the masked keys decoupled at a stiffness above every other (so that their
    modes sort last): they are tangent directions of the sphere ($x_i = 0$) of no problem."""
    sentinel = 1 + 2 * jnp.max(jnp.abs(K))
    both = mask[:, None] & mask[None, :]
    return jnp.where(both, K, 0.0) + jnp.diag(jnp.where(mask, 0.0, sentinel))


def _single(entropy, rho, z, T, mass, damping, critical_rtol, mask=None):
    K, x, lam, active = stiffness_matrix(entropy, rho, z, T)
    if mask is not None:
        K = _decouple_masked(K, mask)
    Q = tangent_basis(x)
    w, V = jnp.linalg.eigh(Q.T @ K @ Q)
    modes = Q @ V
    if mask is not None:
        masked_mode = jnp.sum(jnp.where(mask[:, None], 0.0, modes**2), 0) > 0.5
        modes = jnp.where(masked_mode[None, :] | ~mask[:, None], 0.0, modes)
        norm = jnp.sqrt(jnp.sum(modes**2, 0))
        modes = modes / jnp.where(norm > 0, norm, 1.0)
        w = jnp.where(masked_mode, jnp.inf, w)
        active = active | ~mask
    boundary = jnp.sum(jnp.where(active[:, None], 0.0, modes**2), 0) > 0.5
    disc = damping**2 - 4 * mass * w
    root = jnp.sqrt(jnp.abs(disc))
    inertial = mass > 0
    m_safe = jnp.where(inertial, mass, 1.0)
    re_slow = jnp.where(
        inertial, (-damping + jnp.where(disc > 0, root, 0.0)) / (2 * m_safe), -w / damping
    )
    re_fast = jnp.where(
        inertial, (-damping - jnp.where(disc > 0, root, 0.0)) / (2 * m_safe), -jnp.inf
    )
    im = jnp.where(inertial & (disc < 0), root / (2 * m_safe), 0.0)
    rates = jnp.stack([jax.lax.complex(re_slow, im), jax.lax.complex(re_fast, -im)], -1)
    crit = jnp.abs(disc) <= critical_rtol * (damping**2 + 4 * mass * jnp.abs(w))
    damped = _regime_where(disc < 0, REGIMES.underdamped, REGIMES.overdamped)
    regime = _regime_where(crit, REGIMES.critical, damped)
    if mask is not None:
        none = jax.lax.complex(jnp.full_like(w, -jnp.inf), jnp.zeros_like(w))
        rates = jnp.where(masked_mode[:, None], none[:, None], rates)
        regime = _regime_where(masked_mode, REGIMES.overdamped, regime)
    return RelaxationSpectrum(w, rates, regime, boundary, modes, rho, lam)


def relaxation_spectrum(
    entropy: AbstractEntropy,
    scores: Scores,
    T: Temperature = 1.0,
    *,
    mass: Float[ArrayLike, "*#batch"] | RealScalarLike,
    damping: Float[ArrayLike, "*#batch"] | RealScalarLike,
    rho: Float[ArrayLike, "*#batch N"] | None = None,
    critical_rtol: RealScalarLike = 1e-6,
    mask: Bool[ArrayLike, "*#batch N"] | None = None,
) -> RelaxationSpectrum:
    """Stiffnesses and complex rates of the tangent modes about a fixed point (docs/math.md §6).

    Linearizes the sphere equation $4m\\ddot x = 2x(\\lambda - g) - 4\\gamma\\dot x$ at
    $x^* = \\sqrt{\\rho^*}$: $m\\ddot\\delta + \\gamma\\dot\\delta + K\\delta = 0$ on the tangent
    space, so each mode has $m s^2 + \\gamma s + \\omega_k^2 = 0$. For Shannon every
    $\\omega_k^2 = T$ (critical damping at $\\gamma^2 = 4mT$). Components a sparse fixed point
    leaves at 0 contribute boundary modes $\\omega^2 = (E_i - \\lambda^*)/2$.

    **Arguments:**

    - `entropy`, `scores` (..., N), `T`: the problem, T broadcasting as in `stationary`
      (a scalar or one per row).
    - `mass` $\\ge 0$ and `damping` $\\ge 0$ (> 0 where m = 0): scalars or one per row,
      broadcasting against the batch shape (the scores' shape without the keys).
    - `rho`: the fixed point; default `fisherdyn.stationary(entropy, scores, T)` (for Renyi /
      Sharma-Mittal that is the least-free-energy branch: pass another branch explicitly).
    - `critical_rtol`: relative band of $|\\gamma^2 - 4m\\omega^2|$ called critical.
    - `mask`: boolean, True where the key takes part (`-inf` scores are masked too); the
      masked keys carry no modes (see `RelaxationSpectrum`) and `rho` is 0 there.

    **Returns:**

    A `RelaxationSpectrum`, batched like the rows: leading batch axes of the scores (and
    of `rho`, T, mass and damping) are mapped over.
    """
    check_entropy(entropy)
    refuse_complex(scores)
    z = jnp.asarray(scores)
    z = z if jnp.issubdtype(z.dtype, jnp.floating) else z.astype(jnp.result_type(float))
    if z.ndim == 0 or z.shape[-1] < 2:
        raise ValueError("relaxation_spectrum needs scores with at least 2 keys")
    # the checks and messages of `simulate`: ValueError now for concrete inputs, a runtime
    # error under jit; each mode's rates hold for m = 0 too, so a batch may mix m = 0 and m > 0
    check_concrete(z, T, mask)
    T = row_T(jnp.asarray(T, z.dtype), z.shape, -1)  # (*batch, 1): as `stationary` reads it
    m = np.asarray(mass) if is_concrete(mass) else None
    overdamped = m is not None and bool(np.all(m == 0))
    T, mass, damping = parameters(
        T, mass, damping, z.dtype, overdamped, need_damping=False, mass_may_vanish=True
    )
    if mask is not None or (is_concrete(z) and bool(np.any(np.isneginf(np.asarray(z))))):
        mask = jnp.broadcast_to(True if mask is None else jnp.asarray(mask, bool), z.shape)
        mask = mask & (z != -jnp.inf)
    if rho is None:
        from .._stationary import stationary

        rho = stationary(entropy, z, T) if mask is None else stationary(entropy, z, T, mask=mask)
    rho = jnp.asarray(rho, z.dtype)
    if mask is not None:
        z = jnp.where(mask, z, jnp.zeros((), z.dtype))
        rho = jnp.where(mask, rho, jnp.zeros((), z.dtype))
    dtype = z.dtype
    T = T[..., 0] if T.ndim else T
    batch = jnp.broadcast_shapes(
        z.shape[:-1], rho.shape[:-1], T.shape, mass.shape, damping.shape,
        () if mask is None else jnp.shape(mask)[:-1],
    )
    full = batch + z.shape[-1:]
    entropy = arrayify_entropy(entropy, dtype)
    return _batched(
        entropy,
        jnp.broadcast_to(rho, full),
        jnp.broadcast_to(z, full),
        jnp.broadcast_to(T, batch),
        jnp.broadcast_to(mass, batch),
        jnp.broadcast_to(damping, batch),
        jnp.asarray(critical_rtol, dtype),
        None if mask is None else jnp.broadcast_to(mask, full),
    )
