"""Measured decay rates of a relaxation, to compare with `relaxation_spectrum`."""

from __future__ import annotations

import numpy as np

from .._custom_types import ArrayLike, Float

__all__ = ["envelope_rate"]


def envelope_rate(
    ts: Float[ArrayLike, " K"],
    distance: Float[ArrayLike, " K"],
    *,
    hi: float = 1e-3,
    lo: float = 1e-8,
    min_points: int = 5,
) -> float:
    """Asymptotic decay rate of a distance $d(t)$ to a fixed point.

    The rate is minus the least-squares slope of $\\ln$ of the upper envelope of $d$ (the
    running maximum from the end, which follows the peaks of an oscillation) over the window
    where the envelope lies in `[lo, hi]`. Non-finite times and values and exact zeros are
    dropped first (a padded saveat).

    **Arguments:**

    - `ts`: the saved times, increasing.
    - `distance`: $d(t) \\ge 0$ at those times, e.g. $\\|\\sqrt\\rho(t) - \\sqrt{\\rho^*}\\|$ or
        the amplitude of one mode.
    - `hi`, `lo`: the window of the fit, in units of $d$.
    - `min_points`: fewer saved points in the window give NaN.

    **Returns:** the rate (> 0 for a decay), or NaN.
    """
    ts = np.asarray(ts)
    d = np.asarray(distance)
    ok = np.isfinite(ts) & np.isfinite(d) & (d > 0)
    ts, d = ts[ok], d[ok]
    env = np.maximum.accumulate(d[::-1])[::-1]
    window = (env <= hi) & (env >= lo)
    if window.sum() < min_points:
        return float("nan")
    slope = np.polyfit(ts[window], np.log(env[window]), 1)[0]
    return float(-slope)
