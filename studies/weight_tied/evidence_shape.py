"""Evidence from the shape of attention paths: Shannon's isotropy and support revival.

Both take measured paths as arrays `(P, K, N)` (P problems, K loops, N keys) and return an
`Interval` over units (one label per problem, e.g. the trained model), like the tests of
`evidence_paths.py`.

**Isotropy.** Shannon's overdamped Fisher flow moves its scores $z = T\\ln\\rho$ as
$\\dot z_i = (T/\\gamma)\\,\\delta_i$ with
$\\delta_i = (z^*_i - z_i) - \\langle z^* - z\\rangle_\\rho$: every key approaches at the same
rate. The slope of each key's log rate on $\\ln\\rho_i$ (one intercept per path) is 0; a
mobility that depends on the weight (another family's flow read in Shannon's scores) gives
a slope away from 0. A linear relaxation of the scores is isotropic too (it is the same
flow), so isotropy can only falsify.

**Support revival.** Under the Fisher-Rao flow the square root $x_i = \\sqrt{\\rho_i}$ of a
key at zero stays at zero (the sphere's vector field is proportional to $x_i$ there), so a key
that leaves the support of a cutoff family never re-enters it. A score-space dynamics read
out through the family's stationary law has no such barrier: a key whose score comes back
above the threshold revives. The statistic is the fraction of paths with a revived key,
among the paths in which some key left the support.
"""

from __future__ import annotations

import equinox as eqx
import numpy as np

from jaxtyping import ArrayLike, Float

from .evidence_paths import _per_unit_sum, _units
from .verdict import Interval, bootstrap_ci

__all__ = ["Isotropy", "SupportRevival", "isotropy", "support_revival"]


class Isotropy(eqx.Module):
    """The slope of each key's log rate of approach (Shannon scores) on $\\ln\\rho$.

    **Fields:** `slope` (`Interval` over units), `n_points` (points in the regression),
    `spread` (within-path rms of $\\ln\\rho$ over the points: below 0.1 the slope is not
    identified and NaN).
    """

    slope: Interval
    n_points: int
    spread: float


def isotropy(
    paths: Float[ArrayLike, "P K N"],
    times: Float[ArrayLike, "*#P K"],
    target_scores: Float[ArrayLike, "*#P N"],
    T: float = 1.0,
    *,
    units: ArrayLike | None = None,
    rho_min: float = 1e-4,
    rel_min: float = 1e-2,
    min_spread: float = 0.1,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> Isotropy:
    """Regress each key's log rate of approach in Shannon's scores on $\\ln\\rho$.

    The rates are those of `mobility_regression` with $G = \\ln$: between loops $l$ and
    $l+1$, $(z_{i,l+1} - z_{i,l})/(t_{l+1} - t_l)$ over the mean $\\delta_i$ of the two
    loops; steps with a weight below `rho_min`, a $|\\delta_i|$ below `rel_min` of the path's
    initial largest, or a non-positive rate are left out.

    **Arguments:** `paths` `(P, K, N)`; `times` `(K,)` or `(P, K)`; `target_scores` the
    scores $z^*$ the paths relax to; `T`; `units`, `level`, `n_boot`, `seed` as
    `mobility_regression`.

    **Returns:** an `Isotropy`.
    """
    rho = np.asarray(paths, np.float64)
    if rho.ndim != 3 or rho.shape[1] < 2:
        raise ValueError(f"paths must have shape (P, K >= 2, N), got {rho.shape}")
    P, K, N = rho.shape
    t = np.broadcast_to(np.asarray(times, np.float64), (P, K))
    safe = np.clip(rho, rho_min, None)
    z = T * np.log(safe)
    zs = np.broadcast_to(np.asarray(target_scores, np.float64), (P, N))[:, None, :]
    d = zs - z
    delta = d - np.sum(rho * d, -1, keepdims=True)
    dzdt = np.diff(z, axis=1) / np.diff(t, axis=1)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = dzdt / (0.5 * (delta[:, 1:] + delta[:, :-1]))
    x = np.log(0.5 * (safe[:, 1:] + safe[:, :-1]))
    scale = np.max(np.abs(delta[:, 0]), -1)[:, None, None]
    ok = ((rho[:, 1:] > rho_min) & (rho[:, :-1] > rho_min)
          & (np.minimum(np.abs(delta[:, 1:]), np.abs(delta[:, :-1])) > rel_min * scale)
          & (rate > 0) & np.isfinite(rate))
    y = np.where(ok, np.log(np.where(ok, rate, 1.0)), 0.0)
    x = np.where(ok, x, 0.0)
    cnt = ok.sum((1, 2))
    xm = (x.sum((1, 2)) / np.maximum(cnt, 1))[:, None, None]
    ym = (y.sum((1, 2)) / np.maximum(cnt, 1))[:, None, None]
    xc, yc = np.where(ok, x - xm, 0.0), np.where(ok, y - ym, 0.0)
    inv, n = _units(units, P)
    sums = _per_unit_sum(np.stack([(xc * yc).sum((1, 2)), (xc * xc).sum((1, 2))], -1), inv, n)
    spread = float(np.sqrt(sums[:, 1].sum() / max(int(ok.sum()), 1)))

    def slope(s):
        sxx = s[:, 1].sum()
        return float(s[:, 0].sum() / sxx) if spread >= min_spread and sxx > 0 else float("nan")

    return Isotropy(bootstrap_ci(sums, slope, level=level, n_boot=n_boot, seed=seed),
                    int(ok.sum()), spread)


class SupportRevival(eqx.Module):
    """Keys that leave the support and come back.

    **Fields:** `fraction` (`Interval` over units of the fraction of paths with a revived
    key, among the paths where a key left the support; None when no key left in any
    path: not evaluable), `n_left` (paths where a key left), `n_revived` (paths with a
    revival).
    """

    fraction: Interval | None
    n_left: int
    n_revived: int


def support_revival(
    paths: Float[ArrayLike, "P K N"],
    *,
    units: ArrayLike | None = None,
    off: float = 1e-3,
    on: float = 1e-2,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> SupportRevival:
    """Count the paths in which a key that left the support re-enters it.

    A key has left at loop $l$ if its weight is below `off` there after being above `on`
    at an earlier loop; it revives if its weight is above `on` at a loop after $l$. The two
    thresholds keep a weight that hovers near one of them from counting.

    **Arguments:** `paths` `(P, K, N)`; `units` a label per problem; `off`, `on` the
    thresholds; `level`, `n_boot`, `seed` the bootstrap.

    **Returns:** a `SupportRevival`.
    """
    rho = np.asarray(paths, np.float64)
    if rho.ndim != 3:
        raise ValueError(f"paths must have shape (P, K, N), got {rho.shape}")
    was_in = np.maximum.accumulate(rho > on, axis=1)
    left = (rho < off) & np.concatenate([np.zeros_like(was_in[:, :1]), was_in[:, :-1]], 1)
    left_before = np.maximum.accumulate(left, axis=1)
    revived = (rho > on) & np.concatenate([np.zeros_like(left[:, :1]), left_before[:, :-1]], 1)
    path_left = left.any((1, 2))
    path_rev = revived.any((1, 2))
    inv, n = _units(units, rho.shape[0])
    per_unit = _per_unit_sum(np.stack([path_rev & path_left, path_left], -1).astype(float),
                             inv, n)
    if not path_left.any():
        return SupportRevival(None, 0, 0)

    def fraction(s):
        den = s[:, 1].sum()
        return float(s[:, 0].sum() / den) if den > 0 else float("nan")

    iv = bootstrap_ci(per_unit, fraction, level=level, n_boot=n_boot, seed=seed)
    return SupportRevival(iv, int(path_left.sum()), int((path_rev & path_left).sum()))
