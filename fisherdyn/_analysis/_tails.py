"""Tail classes of a stationary map: cutoff, exponential or algebraic (docs/math.md §2)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax.typing import DTypeLike

from .._custom_types import ArrayLike, Bool, Float, RealScalarLike
from .._entropies import AbstractEntropy
from .._stationary import stationary

__all__ = ["fit_tail", "measure_tail"]


def _linfit(x, y):
    """Least-squares line y = a + b x; returns (b, rms residual)."""
    A = np.stack([np.ones_like(x), x], 1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return coef[1], float(np.sqrt(np.mean((A @ coef - y) ** 2)))


def fit_tail(
    scores: Float[ArrayLike, " N"],
    weights: Float[ArrayLike, " N"],
    *,
    far: Bool[ArrayLike, " N"] | None = None,
    shift_origin: float | None = None,
    shift_range: tuple[float, float] | None = None,
) -> dict:
    """Classify the tail of stationary weights $\\rho(z)$ measured along decreasing scores.

    - Exact zeros: `cutoff`; `value` is the lowest score with positive weight, `first_zero`
      the score of the first zero, `support` the number of positive weights.
    - Otherwise, on the `far` keys, two fits of $\\ln\\rho$ are compared and the one with the
      smaller rms residual wins: against $z$ (`exponential`; `value` is the rate
      $d\\ln\\rho/dz$, $1/T$ for Shannon), and against $\\ln(s - z)$ with the shift $s$
      fitted by a log-grid scan refined by a bounded 1-D search (`algebraic`, or
      `inverse-linear` when the exponent is $-1$ within 0.02; `value` is the exponent, e.g.
      $-1/\\kappa$ for Kaniadakis, $-q/(q-1)$ for Abe).

    **Arguments:**

    - `scores`: the scores $z$, in decreasing order (the top key first).
    - `weights`: $\\rho$ at those scores.
    - `far` (keyword only, as the rest): the keys the fits use (default: the lower half of
        the score range).
    - `shift_origin`: the algebraic shift is searched as $s = $ `shift_origin` $+ d$, $d > 0$
        (default: the highest far score, so that $s - z > 0$ on the fitted keys).
    - `shift_range`: the bounds of the scan over $d$ (default: $10^{-6}$ and $10^4$ times the
        score span).

    **Returns:** a dict with `kind`, `value`, `text` (one line), and per kind `first_zero`
    and `support` (cutoff), `rms` and `rms_other` (the losing fit's rms), `shift` (algebraic).
    """
    import scipy.optimize  # imported here so that `import fisherdyn` does not load it

    z = np.asarray(scores, np.float64)
    rho = np.asarray(weights, np.float64)
    n = z.size
    if np.any(rho == 0):
        last = int(np.max(np.nonzero(rho > 0)[0]))
        return dict(kind="cutoff", value=float(z[last]), first_zero=float(z[last + 1]),
                    support=last + 1, n=n,
                    text=f"cutoff: rho=0 for z<={z[last + 1]:.3g} ({last + 1}/{n} > 0)")
    span = float(np.max(z) - np.min(z))
    if far is None:
        far = z <= np.max(z) - span / 2
    far = np.asarray(far, bool)
    lr = np.log(rho[far])
    rate, rms_exp = _linfit(z[far], lr)
    # algebraic: ln rho = a + b ln(s - z), s = origin + d with d > 0 on a log scale
    origin = float(np.max(z[far])) if shift_origin is None else shift_origin
    lo, hi = (1e-6 * span, 1e4 * span) if shift_range is None else shift_range

    def fit_at(log_d):
        return _linfit(np.log(np.exp(log_d) + origin - z[far]), lr)

    grid = np.log(np.geomspace(lo, hi, 241))
    k = int(np.argmin([fit_at(g)[1] for g in grid]))
    log_d = scipy.optimize.minimize_scalar(
        lambda g: fit_at(g)[1],
        bounds=(grid[max(k - 1, 0)], grid[min(k + 1, grid.size - 1)]),
        method="bounded",
        options=dict(xatol=1e-10),
    ).x
    expo, rms_alg = fit_at(log_d)
    if rms_exp <= rms_alg:
        return dict(kind="exponential", value=float(rate), rms=rms_exp, rms_other=rms_alg,
                    text=f"exponential: dln(rho)/dz={rate:.4g}")
    kind = "inverse-linear" if abs(expo + 1) < 0.02 else "algebraic"
    return dict(kind=kind, value=float(expo), rms=rms_alg, rms_other=rms_exp,
                shift=float(np.exp(log_d)), text=f"{kind}: rho ~ |z|^{expo:.4g}")


def measure_tail(
    entropy: AbstractEntropy,
    T: RealScalarLike = 1.0,
    *,
    length: float | None = None,
    n: int = 401,
    dtype: DTypeLike = jnp.float64,
) -> dict:
    """Classify the tail of `stationary(entropy, ramp, T)` on $z = \\mathrm{linspace}(0, -L, n)$.

    The fit is `fit_tail` on the far half of the ramp ($z \\le -L/2$), with the algebraic
    shift searched above $-L/2$ between $10^{-6} L$ and $10^4 L$.

    **Arguments:**

    - `entropy`: the family.
    - `T`: the temperature.
    - `length` (keyword only, as the rest): the ramp length $L$; defaults to
        $\\min(200, 0.45\\,T\\,|\\ln \\mathrm{tiny}(\\mathrm{dtype})|)$, so that an exponential
        tail does not underflow to zero within the ramp (float32: about $39\\,T$).
    - `n`: the number of keys on the ramp.
    - `dtype`: the dtype of the ramp fed to `stationary`.

    **Returns:** the dict of `fit_tail`.
    """
    if length is None:
        length = min(200.0, 0.45 * T * -np.log(np.finfo(np.dtype(dtype)).tiny))
    z = jnp.linspace(0.0, -length, n, dtype=dtype)
    rho = np.asarray(stationary(entropy, z, T), np.float64)
    zn = np.asarray(z, np.float64)
    far = zn <= -length / 2
    return fit_tail(zn, rho, far=far, shift_origin=float(np.max(zn[far])),
                    shift_range=(1e-6 * length, 1e4 * length))
