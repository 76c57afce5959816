"""The scipy cross-check of the stationary map: float64 NumPy, `scipy.optimize.brentq` for
the multiplier, for $\\ln M$ and for component laws without a closed form; the closed-form
inverses are written here from docs/math.md §2, keyed on the family's parse name (any other
family: its own `G_shifted` through JAX, inverted by brentq). Shares no code with the fast
operator; `scipy.optimize` is imported only when a solve runs.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from .._entropies import AbstractSeparableEntropy, AbstractTsallisShapedEntropy
from ._solution import no_algorithm

_L_LO = -700.0  # exp(-700) ~ 1e-304: weights below this are reported as exact zeros
_L_HI = 1.0
_BIG = 1e300
_EPS = np.finfo(np.float64).eps

def _np_abe_G(q):
    """Abe law. For eps = |ln q| <= 1/2 in the cancellation-free form (s = sinh eps)
    $G = e^{(\\cosh\\epsilon - 1)\\ell}\\sinh(\\epsilon + s\\ell)/s$ (= 1 + l at eps = 0);
    beyond, where q - 1/q >= 1 cannot cancel, as written in docs/math.md §2 with q = e^eps (its
    two powers of x stay finite for l >= -700, unlike the product form)."""
    eps = abs(np.log(q))
    if eps == 0.0:
        return lambda x: 1.0 + np.log(x)
    if eps > 0.5:
        q = np.exp(eps)

        def G_direct(x):
            ell = np.log(x)
            return (q * np.exp((q - 1) * ell) - np.exp((1 / q - 1) * ell) / q) / (q - 1 / q)

        return G_direct
    s = np.sinh(eps)
    c = 2.0 * np.sinh(eps / 2) ** 2

    def G(x):
        ell = np.log(x)
        return np.exp(c * ell) * np.sinh(eps + s * ell) / s

    return G


def _np_shannon(entropy):
    return np.log, np.exp, 1.0


def _np_tsallis(entropy):
    q = float(entropy.q)

    def inv(y):
        # [1 + (q-1) y/q]_+^(1/(q-1)), through log1p: exact as q -> 1
        u = (q - 1) * y / q
        pos = u > -1
        return np.where(pos, np.exp(np.log1p(np.where(pos, u, 0.0)) / (q - 1)), 0.0)

    return (lambda x: q * np.expm1((q - 1) * np.log(x)) / (q - 1)), inv, q / (q - 1)


def _np_kaniadakis(entropy):
    k = abs(float(entropy.kappa))

    def inv(y):
        w = y + 1.0  # G(x) = w
        root = np.sqrt(k**2 * w**2 + 1 - k**2)
        # k w + root, rationalized for w < 0 (no cancellation in the deep tail)
        num = np.where(w >= 0, k * w + root, (1 - k**2) / (root - k * w))
        return (num / (1 + k)) ** (1 / k)

    def G_hat(x):
        return ((1 + k) * x**k - (1 - k) * x ** (-k)) / (2 * k) - 1.0

    return G_hat, inv, 1.0


def _np_burg(entropy):
    return (lambda x: 1.0 - 1.0 / x), (lambda y: 1.0 / (1.0 - y)), -1.0


def _np_abe(entropy):
    G = _np_abe_G(float(entropy.q))
    return (lambda x: G(x) - 1.0), None, 1.0


# (G^, G^ inverse or None, G(1)) in numpy, written from the table of docs/math.md §2, in the
# shifted gauge G^ = G - G(1), by the family's first parse name
_NP_LAWS = dict(
    shannon=_np_shannon, tsallis=_np_tsallis, kaniadakis=_np_kaniadakis, burg=_np_burg,
    abe=_np_abe,
)


def _family_key(entropy):
    names = type(entropy).parse_names
    return names[0] if names else None


def _np_law(entropy):
    """The family's shifted law in numpy; any family without one here: its own
    `G_shifted` through JAX, inverted by brentq."""
    law = _NP_LAWS.get(_family_key(entropy))
    if law is not None:
        return law(entropy)

    def G_hat(x):
        return np.asarray(entropy.G_shifted(jnp.asarray(x, jnp.float64)))

    return G_hat, None, float(entropy.G1())


def _np_invert(G, y, flags):
    """$G^{-1}(y)$ componentwise by brentq in l = ln x on [-700, 1] (0 below G(e^-700))."""
    import scipy.optimize

    g_lo = G(np.exp(_L_LO))
    out = np.zeros_like(y)
    for i, yi in enumerate(y):
        if yi <= g_lo:
            continue
        target = np.arcsinh(yi)

        def f(ell):
            return np.arcsinh(np.clip(G(np.exp(ell)), -_BIG, _BIG)) - target

        ell, r = scipy.optimize.brentq(
            f, _L_LO, _L_HI, xtol=1e-15, rtol=4 * _EPS, maxiter=200, full_output=True
        )
        flags.append(r.converged)
        out[i] = np.exp(ell)
    return out


def _np_solve_multiplier(law, z, T, flags):
    """brentq for the shifted multiplier nu (T G^(rho_i) = z_i + nu) in the exact bracket;
    component brentq where the law has no closed-form inverse. Returns (rho, lambda)."""
    import scipy.optimize

    G_hat, inv, G1 = law
    n = z.size
    zmax = np.max(z)
    nu_hi = T * G_hat(2.0) - zmax
    nu_lo = T * G_hat(1.0 / (2.0 * n)) - zmax

    def profile(nu):
        y = (z + nu) / T
        return inv(y) if inv is not None else _np_invert(G_hat, y, flags)

    def f(nu):
        return np.sum(profile(nu)) - 1.0

    xtol = 1e-2 * _EPS * T  # the relative part (4 eps |nu|) dominates
    nu, r = scipy.optimize.brentq(
        f, nu_lo, nu_hi, xtol=xtol, rtol=4 * _EPS, maxiter=200, full_output=True
    )
    flags.append(r.converged)
    return profile(nu), nu + T * G1


def _np_value(entropy, rho):
    """Renyi / Sharma-Mittal entropy in numpy (for the branch choice); any other family:
    its own `value` through JAX."""
    q = float(entropy.q)
    M = np.sum(rho[rho > 0] ** q)
    key = _family_key(entropy)
    if key == "renyi":
        return np.log(M) / (1 - q)
    if key == "sharma_mittal":
        r = float(entropy.r)
        return (M ** ((1 - r) / (1 - q)) - 1) / (1 - r)
    return float(entropy.value(jnp.asarray(rho, jnp.float64)))


def _np_phi(entropy, M):
    q = float(entropy.q)
    key = _family_key(entropy)
    if key == "renyi":
        return 1.0 / M
    if key == "sharma_mittal":
        r = float(entropy.r)
        return M ** ((q - r) / (1 - q))
    return float(entropy.temperature_factor(M))


def _np_solve_shaped(entropy, z, T, M0, n_grid, flags):
    import scipy.optimize

    q = float(entropy.q)
    law = _np_tsallis(entropy)  # the Tsallis law of the same q
    end = (1 - q) * np.log(z.size)
    lo, hi = min(end, 0.0), max(end, 0.0)

    def solve_at(logM):
        T_eff = T * _np_phi(entropy, np.exp(logM))
        return _np_solve_multiplier(law, z, T_eff, flags)

    def r(logM):
        rho, _ = solve_at(logM)
        return np.log(np.sum(rho[rho > 0] ** q)) - logM

    grid = np.linspace(lo, hi, n_grid)
    rg = np.array([r(x) for x in grid])
    best = None
    for k in range(n_grid - 1):
        if rg[k] * rg[k + 1] > 0:
            continue
        if rg[k] == 0:
            logM = grid[k]
        elif rg[k + 1] == 0:
            logM = grid[k + 1]
        else:
            logM, res = scipy.optimize.brentq(
                r, grid[k], grid[k + 1], xtol=1e-15, rtol=4 * _EPS, maxiter=200,
                full_output=True,
            )
            flags.append(res.converged)
        rho, lam = solve_at(logM)
        if M0 is None:
            score = -np.dot(rho, z) - T * _np_value(entropy, rho)
        else:
            score = abs(logM - np.log(M0))
        if best is None or score < best[0]:
            best = (score, rho, lam)
    return best[1], best[2]


def solve_scipy(entropy, z, keep, T, M0, n_grid):
    """(rho, lambda, ok) of one score vector in float64 NumPy (`M0 = None`: least F)."""
    z = np.asarray(z, np.float64)
    keep = np.asarray(keep, bool)
    T = float(T)
    flags: list[bool] = []
    rho_k, lam = _np_solve(entropy, z[keep], T, M0, n_grid, flags)
    rho = np.zeros_like(z)
    rho[keep] = rho_k
    return rho, lam, all(flags)



@functools.singledispatch
def _np_solve(entropy, zk, T, M0, n_grid, flags):
    """(rho, lambda) on the kept keys, by the algorithm of the family's base class."""
    raise no_algorithm("cross-check", entropy)


@_np_solve.register
def _(entropy: AbstractSeparableEntropy, zk, T, M0, n_grid, flags):
    return _np_solve_multiplier(_np_law(entropy), zk, T, flags)


@_np_solve.register
def _(entropy: AbstractTsallisShapedEntropy, zk, T, M0, n_grid, flags):
    return _np_solve_shaped(entropy, zk, T, M0, n_grid, flags)
