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
from .._entropies import (
    AbstractEntropy, AbstractSeparableEntropy, AbstractTsallisShapedEntropy,
)
from .._misc import check_entropy, is_concrete
from .._results import _ReadableEnumeration
from .._stationary import check_concrete, refuse_complex, row_T
from ._problem import arrayify_entropy, parameters
from ._secular import _blocked, row_sums, secular_eigenvalues
from ._system import forces, stiffness_matrix, tangent_basis

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
    - `modes`: the mode shapes as tangent vectors of the sphere chart $x = \\sqrt\\rho$, (N, N-1),
      computed when read (a dense eigendecomposition, $O(N^3)$ time and $O(N^2)$ memory;
      the stiffnesses and rates above cost $O(N)$ memory and time growing as $N^2/64$).
    - `rho`, `lam`: the fixed point and its multiplier.

    With a `mask`, the masked keys carry no modes: their N - n slots come last, with
    `omega2` $= +\\infty$, `rates` $= -\\infty$, zero `modes`, and the other modes are
    exactly 0 on the masked keys.
    """

    omega2: Float[Array, "*batch N-1"]
    rates: Complex[Array, "*batch N-1 2"]
    regime: REGIMES
    boundary: Bool[Array, "*batch N-1"]
    rho: Float[Array, "*batch N"]
    lam: Float[Array, "*batch"]
    # the problem, kept for `modes`
    _entropy: AbstractEntropy
    _scores: Float[Array, "*batch N"]
    _T: Float[Array, "*batch"]
    _mask: Bool[Array, "*batch N"] | None

    @property
    def modes(self) -> Float[Array, "*batch N N-1"]:
        """The mode shapes (see the class), in the order of `omega2`."""
        return _modes(self._entropy, self.rho, self._scores, self._T, self._mask)

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
def _modes(entropy, rho, z, T, mask):
    """`_dense_eigh`'s mode shapes, mapped over the leading axes (every argument batched,
    as `_batched` returns them)."""
    fn = lambda e, r, s, t, m: _dense_eigh(e, r, s, t, m)[1]  # noqa: E731
    for _ in range(rho.ndim - 1):
        fn = jax.vmap(fn)
    return fn(entropy, rho, z, T, mask)


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


def _dense_eigh(entropy, rho, z, T, mask=None):
    """Eigenvalues and mode shapes of the dense tangent stiffness (O(N^3): the mode shapes,
    and the families without a diagonal-plus-rank-one structure)."""
    K, x, lam, active = stiffness_matrix(entropy, rho, z, T)
    if mask is not None:
        K = _decouple_masked(K, mask)
    Q = tangent_basis(x)
    w, V = jnp.linalg.eigh(Q.T @ K @ Q)
    modes = Q @ V
    masked_mode = jnp.zeros(w.shape, bool)
    if mask is not None:
        masked_mode = jnp.sum(jnp.where(mask[:, None], 0.0, modes**2), 0) > 0.5
        modes = jnp.where(masked_mode[None, :] | ~mask[:, None], 0.0, modes)
        norm = jnp.sqrt(jnp.sum(modes**2, 0))
        modes = modes / jnp.where(norm > 0, norm, 1.0)
        w = jnp.where(masked_mode, jnp.inf, w)
        active = active | ~mask
    boundary = jnp.sum(jnp.where(active[:, None], 0.0, modes**2), 0) > 0.5
    return w, modes, boundary, masked_mode, lam


def _structure(entropy, rho, z, T):
    """The tangent stiffness as $P(\\mathrm{diag}(c) + \\sigma ww^T)P$ (docs/math.md §6),
    `(c, sigma, w, x, lam, active)` (`sigma`, `w` None for a separable family), or None
    for a family without that structure.

    On the support $c_i = \\rho_i\\,\\partial g_i/\\partial\\rho_i$ (the diagonal of
    `stiffness_matrix`'s core); off it the boundary stiffness $(g_i - \\lambda)/2$. A
    Tsallis-shaped family has $h = \\phi(M_q)\\,t(\\rho)$ with the Tsallis gradient
    $t_i = -v_i/(q-1)$, $v_i = \\partial M_q/\\partial\\rho_i = q\\rho_i^{q-1}$, so
    $-T\\,\\partial h/\\partial\\rho = -T\\phi\\,\\mathrm{diag}(t') + T\\phi'(M_q)/(q-1)\\,vv^T$:
    $\\sigma = T\\phi'/(q-1)$, $w = x v$.
    """
    active = rho > 0
    x = jnp.sqrt(rho)
    g = forces(entropy, rho, z, T)
    lam = jnp.sum(jnp.where(active, rho * g, 0.0))
    safe = jnp.where(active, rho, 1.0)
    ones = jnp.ones_like(rho)
    if isinstance(entropy, AbstractSeparableEntropy):
        # the gradient is elementwise: its directional derivative along ones is its diagonal
        dh = jax.jvp(lambda r: entropy.grad(r, mask=active), (safe,), (ones,))[1]
        sigma, w = None, None
    elif isinstance(entropy, AbstractTsallisShapedEntropy):
        M = entropy.moment(safe, active)
        phi = entropy.temperature_factor(M)
        tsallis = entropy.tsallis()
        dh = phi * jax.jvp(lambda r: tsallis.grad(r, mask=active), (safe,), (ones,))[1]
        q = jnp.asarray(entropy.q, rho.dtype)
        sigma = T * jax.grad(entropy.temperature_factor)(M) / (q - 1)
        w = jnp.where(active, x * q * safe ** (q - 1), 0.0)
    else:
        return None
    c = jnp.where(active, -T * rho * dh, 0.5 * (g - lam))
    return c, sigma, w, x, lam, active


def _tie_rtol(dtype):
    # poles this close (relative to the largest) are one: the eigenvalue error it makes is
    # of the order of the rounding of the stiffness itself
    return 16 * jnp.finfo(dtype).eps


def _secular_spectrum(structure, mask=None):
    """`(omega2, boundary, masked_mode)` from the secular equations: the compression of
    diag(c) onto the tangent space of the support, then the rank-one moment coupling."""
    c, sigma, w, x, lam, active = structure
    n = c.shape[-1]
    tol = _tie_rtol(c.dtype)
    vals, ok, group_of, gval, pole_order, pv, origin, tau = secular_eigenvalues(
        c, x * x, active, jnp.zeros((), c.dtype), tol
    )
    if sigma is None:
        vals2, ok2 = vals, ok
    else:
        vals2, ok2 = _moment_coupling(c, sigma, w, x, active, tol, vals, ok, group_of, gval,
                                      pole_order, pv, origin, tau)
    # the decoupled directions: boundary components (x_i = 0) and masked keys
    off = ~active
    masked = jnp.zeros(n, bool) if mask is None else ~mask
    dec = jnp.where(masked, jnp.inf, c)
    allv = jnp.concatenate([vals2, dec])
    allok = jnp.concatenate([ok2, off])
    bnd = jnp.concatenate([jnp.zeros_like(ok2), off & ~masked])
    msk = jnp.concatenate([jnp.zeros_like(ok2), masked])
    order = jnp.lexsort((allv, ~allok))[: n - 1]
    return allv[order], bnd[order], msk[order]


def _moment_coupling(c, sigma, w, x, active, tol, vals, ok, group_of, gval, pole_order, pv,
                     origin, tau):
    """The eigenvalues of the compression plus the rank-one coupling $\\sigma ww^T$."""
    # the moment coupling in the eigenbasis of the compression: z_k = v_k . w for the
    # secular modes v_k ~ (c - mu_k)^-1 x, and for each tie group the part of w on the
    # group orthogonal to x (the deflated modes), at the group's own pole
    n = c.shape[-1]
    m = n + 1
    gid = jnp.where(active, group_of, n)
    xi_g = jax.ops.segment_sum(jnp.where(active, x * w, 0.0), gid, m)[:n]
    x2_g = jax.ops.segment_sum(jnp.where(active, x * x, 0.0), gid, m)[:n]
    resid = w - x * (xi_g / jnp.where(x2_g > 0, x2_g, 1.0))[jnp.clip(gid, 0, n - 1)]
    zg2 = jax.ops.segment_sum(jnp.where(active, resid**2, 0.0), gid, m)[:n]
    size_g = jax.ops.segment_sum(active.astype(c.dtype), gid, m)[:n]
    xi_p = xi_g[pole_order]
    x2_p = jnp.where(jnp.arange(n) < jnp.sum(x2_g > 0), x2_g[pole_order], 0.0)
    ov = pv[origin]

    def projections(ovb, taub):
        dl = (pv[None, :] - ovb[:, None]) - taub[:, None]
        u = 1.0 / jnp.where(x2_p[None, :] > 0, dl, 1.0)
        return row_sums(jnp.where(x2_p > 0, xi_p, 0.0)[None, :] * u, x2_p[None, :] * u * u)

    zk, nk2 = _blocked(projections, n, ov, tau)
    z2_roots = zk * zk / jnp.where(nk2 > 0, nk2, 1.0)
    # the deflated members of a group share its leftover weight (they are one pole again)
    gi = jnp.clip(gid, 0, n - 1)
    z2_defl = jnp.where(active, zg2[gi] / jnp.maximum(size_g[gi] - 1, 1.0), 0.0)
    mu = jnp.where(jnp.arange(2 * n) < n, vals, jnp.concatenate([vals[:n], gval[gi]]))
    z2 = jnp.concatenate([z2_roots, z2_defl])
    keep = jnp.argsort(~ok, stable=True)[:n]  # the n - 1 eigenvalues (and one slot)
    mu, z2, ok1 = mu[keep], jnp.where(ok[keep], z2[keep], 0.0), ok[keep]
    coupled = sigma != 0
    sgn = jnp.where(sigma < 0, -1.0, 1.0).astype(c.dtype)
    inv = jnp.where(coupled, 1 / jnp.where(coupled, jnp.abs(sigma), 1.0), 1.0)
    vals2, ok2, *_ = secular_eigenvalues(
        sgn * mu, jnp.where(coupled, z2, 0.0), ok1, inv.astype(c.dtype), tol
    )
    return sgn * vals2, ok2


def _rates(w, mass, damping, critical_rtol, masked_mode):
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
    none = jax.lax.complex(jnp.full_like(w, -jnp.inf), jnp.zeros_like(w))
    rates = jnp.where(masked_mode[:, None], none[:, None], rates)
    regime = _regime_where(masked_mode, REGIMES.overdamped, regime)
    return rates, regime


def _single(entropy, rho, z, T, mass, damping, critical_rtol, mask=None):
    structure = _structure(entropy, rho, z, T)
    if structure is None:
        w, _, boundary, masked_mode, lam = _dense_eigh(entropy, rho, z, T, mask)
    else:
        w, boundary, masked_mode = _secular_spectrum(structure, mask)
        lam = structure[4]
    rates, regime = _rates(w, mass, damping, critical_rtol, masked_mode)
    return RelaxationSpectrum(w, rates, regime, boundary, rho, lam, entropy, z, T, mask)


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
