"""Held-score linear response: the loop map of the Fisher dynamics whose scores are computed
once per loop, from the attention at the loop's start, and held over it.

A looped model computes its scores from its state once per loop and then moves the
attention with them, so its loop map at a fixed point is not $e^{Ah}$ of a continuous
dynamics but the map of a linear system driven by held scores. About a fixed point
$\\rho^*$ of the damped Fisher dynamics (docs/math.md §6) with tangent coordinates
$\\delta\\rho = Q a$ ($Q$ an orthonormal sum-zero basis of the support), the sphere equation
linearizes to

$$m\\,\\ddot a + \\gamma\\,\\dot a
  = Q^\\top M\\,(\\delta z - T\\,\\mathrm{diag}\\,G'(\\rho^*)\\,Q a),
\\qquad M = \\mathrm{diag}\\,\\rho^* - \\rho^*\\rho^{*\\top}$$

(the multiplier removes the mean force; $Q^\\top M T\\,\\mathrm{diag}\\,G'\\,Q$ has the
stiffnesses of `relaxation_spectrum` as eigenvalues). Over one loop of step $h$ with the
scores held at $z^* + C\\,\\delta\\rho_0$:

$$\\begin{pmatrix}a\\\\ \\dot a\\end{pmatrix}_1 = \\big(e^{Ah} + \\Psi\\,C\\,Q\\,[I\\;0]\\big)
\\begin{pmatrix}a\\\\ \\dot a\\end{pmatrix}_0,\\qquad
\\Psi = \\int_0^h e^{As}\\,ds\\begin{pmatrix}0\\\\ Q^\\top M/m\\end{pmatrix},$$

both blocks from one matrix exponential of the augmented system (`held_score_map`).
`held_score_response` fits $(m, \\gamma)$ so that this map's eigenvalues match a measured
loop map's attention-bearing ones (one to one, by `linear_sum_assignment`) and reports the
largest relative error of the matched rates $\\log(\\lambda)/h$: with the true $C$ the
Fisher loop's map is reproduced exactly, whatever the feedback does to the modes
(overshooting ones included), which the continuous form of `evidence_response` cannot do.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import scipy.linalg
import scipy.optimize
from scipy.optimize import linear_sum_assignment

from jaxtyping import ArrayLike, Float

from fisherdyn import AbstractEntropy

from .evidence_response import loop_map_inputs

__all__ = ["HeldScoreResponse", "held_score_map", "held_score_response", "support_basis"]


def support_basis(rho, support_tol=1e-12):
    """An orthonormal basis `(N, n)` of the sum-zero vectors on the support of `rho`
    (n = support size - 1), zero off the support (Helmert, as the calibration uses)."""
    rho = np.asarray(rho, np.float64)
    act = rho > support_tol
    k = int(act.sum())
    H = np.linalg.qr(np.concatenate([np.ones((k, 1)), np.eye(k)[:, :-1]], 1))[0][:, 1:]
    Q = np.zeros((len(rho), k - 1))
    Q[act] = H
    return Q


def held_score_map(
    entropy: AbstractEntropy,
    rho_star: Float[ArrayLike, " N"],
    T: float,
    *,
    mass: float,
    damping: float,
    step: float,
    feedback: Float[ArrayLike, "N N"] | None = None,
    basis: Float[ArrayLike, "N n"] | None = None,
) -> np.ndarray:
    """The linearized Fisher loop map on (a, da/dt), `(2n, 2n)`, over one loop of `step`
    with the scores held at $z^* + C\\,\\delta\\rho_0$ (module docstring); `feedback` $C$
    `(N, N)` (default 0: the continuous dynamics' $e^{Ah}$), `basis` $Q$ (default
    `support_basis(rho_star)`). Needs `mass > 0`."""
    if not mass > 0 or not damping >= 0 or not step > 0:
        raise ValueError(f"need mass > 0, damping >= 0, step > 0; got {mass}, {damping}, "
                         f"{step}")
    rho = np.asarray(rho_star, np.float64)
    Q = support_basis(rho) if basis is None else np.asarray(basis, np.float64)
    return _map(*_pieces(entropy, rho, T, Q), Q, mass, damping, step, feedback)


def _pieces(entropy, rho, T, Q):
    """The stiffness operator $Q^\\top M T\\,\\mathrm{diag}\\,G'\\,Q$ and the score coupling
    $Q^\\top M$ (module docstring)."""
    pos = rho > 0
    gp = np.zeros(len(rho))
    gp[pos] = np.asarray(entropy.G_prime(jnp.asarray(rho[pos])), np.float64)
    M = np.diag(rho) - np.outer(rho, rho)
    return Q.T @ M @ (T * gp[:, None] * Q), Q.T @ M


def _map(K, B, Q, mass, damping, step, C):
    N, n = Q.shape
    aug = np.zeros((2 * n + N, 2 * n + N))
    aug[:n, n:2 * n] = np.eye(n)
    aug[n:2 * n, :n] = -K / mass
    aug[n:2 * n, n:2 * n] = -damping / mass * np.eye(n)
    aug[n:2 * n, 2 * n:] = B / mass
    E = scipy.linalg.expm(aug * step)
    J = E[:2 * n, :2 * n].copy()
    if C is not None:
        J[:, :n] += E[:2 * n, 2 * n:] @ np.asarray(C, np.float64) @ Q
    return J


class HeldScoreResponse(eqx.Module):
    """A measured loop map's attention-bearing eigenvalues against the held-score Fisher map.

    **Fields:**
    - `mass`, `damping`: the fitted $(m, \\gamma)$.
    - `measured`: the rates $\\log(\\lambda)/h$ of the measured eigenvalues kept (complex,
      slowest first); `predicted`: the matched rate of the fitted map for each.
    - `rate_errors`: $|s - \\hat s|/|\\hat s|$ per measured rate; `shape_errors`: the sine
      of the angle between the measured mode's attention component and the matched
      predicted eigenspace's; `errors`: the larger of the two per mode; `max_error`: the
      largest (the statistic, read as `linear_response`'s: YES if a bootstrap interval's
      upper end is at most 0.2); `within_20`.
    - `n_unmatched`: predicted eigenvalues above `min_eigenvalue` of the largest with no
      measured partner (fast roots a measured map may hide), reported, not scored.
    - `not_evaluable`: None, or why no comparison is made (fewer than three measured rates
      for two fitted parameters; a measured eigenvalue of modulus >= 1: no fixed point).
    """

    mass: float
    damping: float
    measured: np.ndarray
    predicted: np.ndarray
    rate_errors: np.ndarray
    shape_errors: np.ndarray
    errors: np.ndarray
    max_error: float
    within_20: bool
    n_unmatched: int
    not_evaluable: str | None = None


def _kept_modes(J, R, attention_tol, min_eigenvalue):
    """The eigenvalues of `J` with an attention component, and those components `(N, k)`."""
    lam, V = np.linalg.eig(J)
    U = R @ V
    att = np.linalg.norm(U, axis=0)
    big = np.abs(lam) >= min_eigenvalue * np.max(np.abs(lam))
    keep = big & (att >= attention_tol * np.max(att[big]))
    return lam[keep], U[:, keep]


def _shape_errors(U, pred_vals, pred_U, matched, rtol):
    """Per measured mode (column of `U`), the sine of its angle to the predicted eigenspace
    of its matched eigenvalue (predicted attention components `pred_U`; eigenvalues within
    `rtol` count as one eigenspace)."""
    out = np.empty(U.shape[1])
    for k, j in enumerate(matched):
        same = np.abs(pred_vals - pred_vals[j]) <= rtol * np.abs(pred_vals[j])
        B = np.linalg.svd(pred_U[:, same], full_matrices=False)[0]
        B = B[:, :np.linalg.matrix_rank(pred_U[:, same])]
        u = U[:, k] / np.linalg.norm(U[:, k])
        out[k] = np.linalg.norm(u - B @ (B.conj().T @ u))
    return out


def _match(s, mu):
    """One-to-one matching of measured rates `s` to predicted `mu` minimizing the summed
    squared relative errors: (errors per measured rate, matched predictions)."""
    cost = np.abs(s[:, None] - mu[None, :]) / np.maximum(np.abs(mu[None, :]), 1e-300)
    cost = np.minimum(np.nan_to_num(cost, nan=1e6), 1e6)  # an overflowed map matches nothing
    if len(mu) < len(s):
        return np.ones(len(s)), np.full(len(s), np.nan + 0j), None
    r, c = linear_sum_assignment(cost ** 2)
    err = np.empty(len(s))
    pred = np.empty(len(s), complex)
    idx = np.empty(len(s), int)
    err[r], pred[r], idx[r] = cost[r, c], mu[c], c
    return err, pred, idx


def held_score_response(
    jacobian: Float[ArrayLike, "D D"],
    rho_star: Float[ArrayLike, " N"],
    entropy: AbstractEntropy,
    T: float,
    *,
    step: float,
    readout: Float[ArrayLike, "N D"] | None = None,
    feedback: Float[ArrayLike, "N N"] | None = None,
    attention_tol: float = 1e-3,
    min_eigenvalue: float = 1e-3,
    shape_rtol: float = 0.1,
    grid: tuple[np.ndarray, np.ndarray] = (np.geomspace(1e-3, 10.0, 7),
                                           np.geomspace(0.1, 10.0, 7)),
) -> HeldScoreResponse:
    """Fit the held-score Fisher map (`held_score_map`, score response `feedback`) to the
    attention-bearing eigenvalues of a measured loop map `jacobian` `(D, D)` with attention
    readout `readout` $\\delta\\rho = R\\,\\delta s$ `(N, D)` (default the identity), over
    $(\\log m, \\log\\gamma)$ by Nelder-Mead from the best point of the `grid` of masses and
    dampings (the matching makes the loss piecewise smooth, with local minima); eigenvalues
    below `min_eigenvalue` of the largest modulus (modes that fall by more than that in one
    loop, such as the fast roots of a near-overdamped loop, which a model's noise hides and
    which move most with an error in $C$), or with an attention component below
    `attention_tol` of the largest, are left out, in the measured and the predicted map.
    Predicted rates within `shape_rtol` of the matched one count as one eigenspace for the
    mode-shape comparison (nearly equal stiffnesses leave the shapes undetermined)."""
    J, rho, R, C = loop_map_inputs(jacobian, rho_star, readout, feedback,
                                   symmetric_feedback=False)
    lam, U = _kept_modes(J, R, attention_tol, min_eigenvalue)
    nan = float("nan")

    def not_evaluable(why):
        k = len(lam)
        return HeldScoreResponse(nan, nan, np.log(lam.astype(complex)) / step,
                                 np.full(k, np.nan + 0j), np.full(k, np.nan),
                                 np.full(k, np.nan), np.full(k, np.nan), nan, False, 0, why)

    if len(lam) < 3:
        return not_evaluable(f"{len(lam)} attention-bearing eigenvalues: fewer than three "
                             "for two fitted parameters")
    if np.max(np.abs(lam)) >= 1:
        return not_evaluable(f"an eigenvalue of modulus {np.max(np.abs(lam)):.4f} >= 1: no "
                             "decaying fixed point")
    s = np.log(lam.astype(complex)) / step
    order = np.argsort(-s.real)
    s, U = s[order], U[:, order]
    Q = support_basis(rho)
    n = Q.shape[1]

    K, B = _pieces(entropy, rho, T, Q)

    def predicted(p, vectors=False):
        Jp = _map(K, B, Q, float(np.exp(p[0])), float(np.exp(p[1])), step, C)
        mu, W = np.linalg.eig(Jp)
        big = np.abs(mu) >= min_eigenvalue * np.max(np.abs(mu))
        rates = np.log(mu[big].astype(complex)) / step
        return (rates, Q @ W[:n, big]) if vectors else rates

    def loss(p):
        return float(np.sum(_match(s, predicted(p))[0] ** 2))

    start = min(((loss(np.log([m0, g0])), (m0, g0)) for m0 in grid[0] for g0 in grid[1]),
                key=lambda t: t[0])[1]
    best = scipy.optimize.minimize(loss, np.log(start), method="Nelder-Mead",
                                   options=dict(xatol=1e-7, fatol=1e-16, maxiter=200))
    mu, P = predicted(best.x, vectors=True)
    rate_err, pred, idx = _match(s, mu)
    shape_err = np.ones(len(s)) if idx is None else _shape_errors(U, mu, P, idx, shape_rtol)
    err = np.maximum(rate_err, shape_err)
    max_error = float(np.max(err))
    return HeldScoreResponse(float(np.exp(best.x[0])), float(np.exp(best.x[1])), s, pred,
                             rate_err, shape_err, err, max_error, bool(max_error <= 0.2),
                             int(max(len(mu) - len(s), 0)))
