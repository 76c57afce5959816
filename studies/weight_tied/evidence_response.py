"""Linear response of a loop map at its fixed point against `relaxation_spectrum`.

A looped model's loop $s_{l+1} = \\Phi(s_l)$ with a fixed point $s^*$ whose attention is
$\\rho^*$ linearizes to $\\delta s_{l+1} = J\\,\\delta s_l$. If the loop is the step $h$ of the
damped Fisher dynamics, each eigenvalue $\\lambda$ of $J$ is $e^{s h}$ for a root $s$ of
$m s^2 + \\gamma s + \\omega_k^2 = 0$, $\\omega_k^2$ the stiffnesses of the tangent modes at
$\\rho^*$ (docs/math.md §6): Shannon has one stiffness $\\omega^2 = T$, the under-damped modes
share the decay rate $\\gamma/2m$, and $(m, \\gamma)$ fitted on the slowest mode fix every
other mode's rates and damping regime. `linear_response` maps the eigenvectors into the
attention's tangent space, fits $(m, \\gamma)$ on the slowest mode, and compares the
remaining rates with the prediction.

Scores that respond to the attention (a looped model's scores are computed from a state the
attention feeds) change the stiffnesses. With a score response
$C = \\partial z/\\partial\\rho$ at the fixed point the force changes by
$\\delta g = (T\\,\\mathrm{diag}\\,G' - C)\\,\\delta\\rho$, so the tangent modes obey
$m s^2 + \\gamma s + \\omega_k^2 = 0$ with $\\omega_k^2$ the eigenvalues of
$P X (T\\,\\mathrm{diag}\\,G'(\\rho^*) - C) X P$ ($X = \\mathrm{diag}\\sqrt{\\rho^*}$, $P$ the
sphere's tangent projector). A symmetric $C$ (scores that are the gradient of an interaction
energy, $z = z^* + C(\\rho - \\rho^*)$) keeps the dynamics a damped Fisher-Lagrangian one
with energy $F - \\tfrac12\\delta\\rho^\\top C\\,\\delta\\rho$, and `feedback=C` predicts its
rates.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from scipy.optimize import linear_sum_assignment

from jaxtyping import ArrayLike, Float

from fisherdyn import REGIMES, AbstractEntropy, relaxation_spectrum

__all__ = ["LinearResponse", "feedback_stiffness", "linear_response"]


class LinearResponse(eqx.Module):
    """Measured against predicted rates of the tangent modes at a fixed point.

    **Fields:**
    - `mass`, `damping`: $(m, \\gamma)$ fitted on the slowest measured mode ($m = 0$ when
      that mode has a single real root: a first-order map).
    - `measured`: the continuous rates $\\log(\\lambda)/h$ of the eigenvalues with an
      attention component, slowest first (complex); `predicted`: the matched prediction
      of each (NaN where no predicted root was left); `errors`: $|s - \\hat s|/|\\hat s|$
      per measured rate, 1 where the damping regime differs, NaN for the fitted mode.
    - `omega2`: the predicted stiffnesses on the support (softest first); `regime_match`:
      per measured rate, whether under-/over-damping agrees with the prediction.
    - `measured_omega2`: the stiffness each measured rate implies at the fitted
      $(m, \\gamma)$, $\\mathrm{Re}(-(m s^2 + \\gamma s))$ (Shannon predicts $T$ for all).
    - `max_error`: the largest error over the non-fitted rates (the statistic of the
      `linear_response` criterion); `within_20`: `max_error <= 0.2`.
    - `not_evaluable`: None, or why the comparison cannot be made. A slowest mode that
      does not decay ($\\mathrm{Re}\\,s \\ge 0$, e.g. a loop map with spectral radius at or
      above 1: no fixed point to linearize at) has no damped counterpart: the errors,
      `max_error`, `mass` and `damping` are then NaN and the reason states the modulus.
    - `n_unmatched`: measured rates without a predicted partner (more attention modes than
      the dynamics has) plus predicted roots without a measured one.
    """

    mass: float
    damping: float
    measured: np.ndarray
    predicted: np.ndarray
    errors: np.ndarray
    omega2: np.ndarray
    measured_omega2: np.ndarray
    regime_match: np.ndarray
    max_error: float
    within_20: bool
    n_unmatched: int
    not_evaluable: str | None = None


# an attention component this small relative to the largest is round-off (float64)
_ROUNDOFF = 1e-9


def _eigenspace_projectors(omega2, modes, rtol):
    """For each mode, the projector onto the eigenspace of its stiffness (degenerate
    stiffnesses, e.g. Shannon's, share one)."""
    out = []
    for w in omega2:
        same = np.abs(omega2 - w) <= rtol * max(abs(w), 1e-300)
        B = modes[:, same]
        out.append(B @ B.T)
    return out


def feedback_stiffness(entropy, rho, T, C):
    """Stiffnesses (ascending) and sphere-chart mode shapes `(N, N-1)` of the tangent modes
    at a full-support `rho` whose scores respond by the symmetric `C` (module docstring)."""
    x = np.sqrt(rho)
    gp = np.asarray(entropy.G_prime(jnp.asarray(rho)), np.float64)
    K = x[:, None] * (T * np.diag(gp) - C) * x[None, :]
    # an orthonormal basis of the sphere's tangent space at x
    Q = np.linalg.svd(np.eye(len(x)) - np.outer(x, x))[0][:, :len(x) - 1]
    w, V = np.linalg.eigh(Q.T @ K @ Q)
    return w, Q @ V


def _roots(omega2, m, gamma):
    """The roots of $m s^2 + \\gamma s + \\omega^2 = 0$ per stiffness (slower first; one root
    when $m = 0$), and whether each mode is under-damped."""
    w = np.asarray(omega2, np.float64)
    if m == 0:
        return (-w / gamma)[:, None].astype(complex), np.zeros(len(w), bool)
    disc = np.sqrt((gamma * gamma - 4 * m * w).astype(complex))
    roots = np.stack([(-gamma + disc) / (2 * m), (-gamma - disc) / (2 * m)], 1)
    return roots, gamma * gamma < 4 * m * w


def loop_map_inputs(jacobian, rho_star, readout, feedback, *, symmetric_feedback):
    """The checked float64 arrays (J, rho, R, C) of a loop-map criterion: a finite square
    `jacobian` (D, D), `rho_star` (N,), `readout` (N, D) (None: the identity) and
    `feedback` (N, N) or None (`symmetric_feedback`: C must be symmetric)."""
    J = np.asarray(jacobian, np.float64)
    rho = np.asarray(rho_star, np.float64)
    N = rho.shape[-1]
    R = np.eye(N) if readout is None else np.asarray(readout, np.float64)
    if rho.ndim != 1 or J.ndim != 2 or J.shape[0] != J.shape[1] or R.shape != (N, J.shape[0]):
        raise ValueError(f"need a square jacobian (D, D), readout (N, D) and rho_star (N,); "
                         f"got {J.shape}, {R.shape}, {rho.shape}")
    if not (np.all(np.isfinite(J)) and np.all(np.isfinite(R)) and np.all(np.isfinite(rho))):
        raise ValueError("jacobian, readout and rho_star must be finite")
    if feedback is None:
        return J, rho, R, None
    C = np.asarray(feedback, np.float64)
    if C.shape != (N, N):
        raise ValueError(f"feedback must be (N, N) = ({N}, {N}); got {C.shape}")
    if not np.all(np.isfinite(C)):
        raise ValueError("feedback has non-finite entries")
    if symmetric_feedback and (
        np.max(np.abs(C - C.T), initial=0.0) > 1e-8 * max(np.max(np.abs(C)), 1e-300)
    ):
        raise ValueError("feedback must be symmetric (the response of scores that are "
                         "the gradient of an interaction energy)")
    return J, rho, R, C


def linear_response(
    jacobian: Float[ArrayLike, "D D"],
    rho_star: Float[ArrayLike, " N"],
    entropy: AbstractEntropy,
    T: float,
    *,
    step: float,
    readout: Float[ArrayLike, "N D"] | None = None,
    scores: Float[ArrayLike, " N"] | None = None,
    first_order: bool | None = None,
    feedback: Float[ArrayLike, "N N"] | None = None,
    attention_tol: float = 1e-3,
    min_eigenvalue: float = 1e-6,
    degenerate_rtol: float = 1e-6,
    support_tol: float = 1e-12,
) -> LinearResponse:
    """Compare a loop map's linear response at its fixed point with the Fisher spectrum.

    **Arguments:**

    - `jacobian`: $J = \\partial\\Phi/\\partial s$ at the fixed point, `(D, D)`, of a map on a
      state $s$ from which the attention is linear to first order, $\\delta\\rho = R\\,\\delta s$.
    - `rho_star`: the fixed point's attention `(N,)`. Of a sparse one only the support
      (weights above `support_tol`) enters: the modes are those of the attention restricted
      to it, and the rows of the readout off the support are ignored (a cutoff family's
      zeros stay zero to first order).
    - `entropy`, `T`: the hypothesised family and temperature (the stiffnesses
      $\\omega_k^2$ of `relaxation_spectrum` at $\\rho^*$).
    - `step`: the loop's time step $h$ ($c/L$); rates are $\\log(\\lambda)/h$ (principal
      branch: a negative real eigenvalue, an overshooting map, reads as frequency $\\pi/h$).
    - `readout`: $R$, `(N, D)`; default the identity (the map on the attention row, D = N).
      For a map on $(\\rho, \\dot\\rho)$ it is `[I, 0]`; for coordinates $a$ in a basis $Q$ of
      the simplex's tangent space, `[Q, 0]`.
    - `scores`: the fixed point's scores (default $T G(\\rho^*)$, which makes it stationary;
      they matter only for boundary modes).
    - `first_order`: force $m = 0$ (True) or an inertial fit (False); default: inertial if
      the slowest mode shows both roots (a complex pair or a second real root in its
      eigenspace), else first order.
    - `feedback`: the scores' response to the attention at the fixed point,
      $C = \\partial z/\\partial\\rho$ `(N, N)`, symmetric; the prediction's stiffnesses are
      then those of the interaction energy above (module docstring). Default: scores that
      do not respond (the plain Fisher spectrum).
    - `attention_tol`: eigenvectors whose tangent attention component is below this
      fraction of the largest one are left out (modes of the rest of the state). The fast
      root of an overdamped mode can be among them (its eigenvector is mostly velocity, or
      the rest of the state it drives): the inertial partner of the slowest mode is also
      looked for among the left-out eigenvectors above round-off (1e-9) whose attention
      lies in the slowest mode's eigenspace.
    - `min_eigenvalue`: eigenvalues below this fraction of the largest modulus are left out
      (a mode that decays by that much in one loop is not observable; the directions off
      the simplex, which a map onto attention annihilates, land here).
    - `degenerate_rtol`: stiffnesses this close count as one eigenspace.

    **Returns:** a `LinearResponse`.
    """
    J, rho, R, C = loop_map_inputs(jacobian, rho_star, readout, feedback,
                                   symmetric_feedback=True)
    N = rho.shape[-1]
    # a sparse fixed point: the modes live on its support (the boundary modes of the
    # zeros are second order in the attention, rho = x^2, and not observable in it)
    active = rho > support_tol
    if active.sum() < 2:
        raise ValueError("rho_star needs at least 2 keys above support_tol")
    rho = rho[active] / rho[active].sum()
    R = R[active]
    z = (T * np.asarray(entropy.G(rho)) if scores is None
         else np.asarray(scores, np.float64)[active])
    # C = 0 is the plain spectrum (the same numbers, so the two forms agree there exactly)
    plain = feedback is None or not np.any(C != 0)
    if plain:
        sp = relaxation_spectrum(entropy, jnp.asarray(z), T, mass=1.0, damping=1.0,
                                 rho=jnp.asarray(rho))
        omega2, modes = np.asarray(sp.omega2), np.asarray(sp.modes)
    else:
        omega2, modes = feedback_stiffness(entropy, rho, T, C[np.ix_(active, active)])
    proj = _eigenspace_projectors(omega2, modes, degenerate_rtol)

    lam_all, V = np.linalg.eig(J)
    x = np.sqrt(rho)
    dx_all = (R @ V) / (2 * x[:, None])  # sphere-chart tangent vector of each eigenvector
    dx_all = dx_all - np.outer(x, x @ dx_all)
    size = np.linalg.norm(dx_all, axis=0) / np.linalg.norm(V, axis=0)
    observable = np.abs(lam_all) > min_eigenvalue * np.max(np.abs(lam_all))
    keep = observable & (size > attention_tol * size.max())
    # the fast root of an inertial mode moves attention little against the velocity (and
    # the rest of the state) it carries, so it can fall below attention_tol; it is still
    # looked for as a partner among every eigenvector whose attention is above round-off
    candidate = observable & ~keep & (size > _ROUNDOFF * size.max())
    with np.errstate(divide="ignore", invalid="ignore"):
        dx_all = dx_all / np.linalg.norm(dx_all, axis=0)
    s_extra = np.log(lam_all[candidate].astype(complex)) / step
    dx_extra = dx_all[:, candidate]
    lam, dx = lam_all[keep], dx_all[:, keep]
    s = np.log(lam.astype(complex)) / step
    order = np.argsort(-s.real, kind="stable")
    s, dx = s[order], dx[:, order]
    overlap = np.array([[np.linalg.norm(Pk @ dx[:, j]) for Pk in proj] for j in range(len(s))])

    if s.size == 0:
        raise ValueError("no eigenvector of the jacobian has an attention component")
    if s[0].real >= 0:
        # a mode that does not decay: a failed precondition (no fixed point to linearize
        # at), not a measured disagreement with the damped dynamics
        nan = np.full(len(s), np.nan)
        why = (f"the slowest attention mode does not decay: |lambda| = "
               f"{float(np.abs(lam[order[0]])):.4g} >= 1 (spectral radius "
               f"{float(np.max(np.abs(lam_all))):.4g})")
        return LinearResponse(float("nan"), float("nan"), s, nan + 0j, nan, omega2, nan,
                              np.zeros(len(s), bool), float("nan"), False, len(s), why)
    # the slowest measured rate belongs to the eigenspace it overlaps most
    k0 = int(np.argmax(overlap[0]))
    fast_hidden = False
    w0, s0 = omega2[k0], s[0]
    same = np.flatnonzero(overlap[:, k0] > 0.9)
    is_complex = abs(s0.imag) > 1e-9 * abs(s0)
    partners = [j for j in same if j != 0 and abs(s[j].imag) <= 1e-9 * abs(s[j])
                and abs(s[j] - s0) > 1e-6 * abs(s0)]
    extra = [s_extra[j] for j in range(len(s_extra))
             if np.linalg.norm(proj[k0] @ dx_extra[:, j]) > 0.9
             and abs(s_extra[j].imag) <= 1e-9 * abs(s_extra[j]) and s_extra[j].real < s0.real]
    if first_order or (first_order is None and not is_complex and not partners
                       and not extra):
        m, gamma, fitted = 0.0, float(w0 / -s0.real), [0]
    elif is_complex:
        m = float(w0 / abs(s0) ** 2)
        gamma, fitted = float(-2 * s0.real * m), [0, int(np.argmin(np.abs(s - np.conj(s0))))]
    else:
        if not partners and not extra:
            raise ValueError("first_order=False, but the slowest mode shows a single root")
        if partners:
            j1 = max(partners, key=lambda j: s[j].real)
            s1, fitted = s[j1].real, [0, j1]
        else:
            s1, fitted, fast_hidden = max(v.real for v in extra), [0], True
        m = float(w0 / (s0.real * s1))
        gamma = float(-(s0.real + s1) * m)

    if plain:
        pred = relaxation_spectrum(entropy, jnp.asarray(z), T, mass=m, damping=gamma,
                                   rho=jnp.asarray(rho))
        roots = np.asarray(pred.rates)[:, :1 if m == 0 else 2]  # (N-1, 1 or 2)
        underdamped = np.asarray(pred.regime == REGIMES.underdamped)
    else:
        roots, underdamped = _roots(omega2, m, gamma)
    p_rate = roots.ravel()
    p_mode = np.repeat(np.arange(len(omega2)), roots.shape[1])
    if fast_hidden:
        # the fast branch was not among the measured modes: predict only what is measured,
        # the slow root of each over-damped mode (both roots of an under-damped one)
        fast = np.zeros(roots.shape, bool)
        if roots.shape[1] == 2:
            real = np.all(np.abs(roots.imag) <= 1e-12 * np.abs(roots), 1)
            fast[real, np.argmin(roots[real].real, 1)] = True
        p_rate, p_mode = p_rate[~fast.ravel()], p_mode[~fast.ravel()]
    cost = (np.abs(s[:, None] - p_rate[None]) / np.abs(p_rate)[None]
            + (1 - overlap[:, p_mode]))
    rows, cols = linear_sum_assignment(cost)
    predicted = np.full(len(s), np.nan + 0j)
    predicted[rows] = p_rate[cols]
    meas_under = np.abs(s.imag) > 1e-6 * np.abs(s)
    match = np.zeros(len(s), bool)
    match[rows] = meas_under[rows] == underdamped[p_mode[cols]]
    with np.errstate(invalid="ignore"):
        errors = np.abs(s - predicted) / np.abs(predicted)
    errors = np.where(np.isnan(predicted.real), np.nan, np.where(match, errors, 1.0))
    errors[fitted] = np.nan
    others = errors[np.isfinite(errors)]
    max_error = float(np.max(others)) if others.size else float("nan")
    n_unmatched = (len(s) - len(rows)) + (len(p_rate) - len(cols))
    implied = np.real(-(m * s * s + gamma * s))
    return LinearResponse(m, gamma, s, predicted, errors, omega2, implied, match, max_error,
                          bool(max_error <= 0.2), int(n_unmatched))
