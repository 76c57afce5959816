"""Evidence from attention paths: depth convergence and the score-space mobility.

Both take measured paths as arrays, `(P, K, N)`: P problems (rows of attention of one head,
or several heads and models stacked), K loops, N keys. The unit of the bootstrap is given by
`units` (one label per problem, e.g. the seed of the trained model); by default each
problem is its own unit.

**Depth convergence.** If depth is a discretization of continuous time, the same weights
run at n loops with step $c/n$ give paths $\\rho^{(n)}(t)$ that converge as $n$ grows. For a
scheme of order $p$ the gap at equal $t$ shrinks by $2^p$ from $(L, 2L)$ to $(2L, 4L)$, so
$r = \\mathrm{gap}(L, 2L)/\\mathrm{gap}(2L, 4L)$ is 2 for first-order convergence and
$\\approx 1$ where there is no depth limit.

**Mobility.** The overdamped Fisher flow of family $F$ toward fixed scores $z^*$ reads, in
the current scores $z_i = T G(\\rho_i)$ (the scores for which $\\rho$ is stationary, gauge
$\\mu = 0$; docs/math.md §6),

$$\\dot z_i = \\frac{T\\rho_i G'(\\rho_i)}{\\gamma}\\,\\delta_i, \\qquad
  \\delta_i = (z^*_i - z_i) - \\langle z^* - z\\rangle_\\rho .$$

The rate of approach $\\dot z_i/\\delta_i$ of each key is thus $T\\rho_iG'(\\rho_i)/\\gamma$:
regressed on $\\log(T\\rho G'(\\rho))$ with one intercept per path ($-\\log\\gamma$) its slope is
1. A mobility that does not follow the family — Shannon's Fisher flow seen through $F$'s
scores, or a linear relaxation $\\dot z = a(z^* - z)$ in score space — has a rate that does
not grow with $\\rho G'(\\rho)$: slope near 0. Shannon has $\\rho G' = 1$, no regressor, and
the slope is undefined (NaN). The same holds where the regressor varies too little to
identify a slope: each rate is a finite difference over a loop step, with a relative bias of
a few percent that varies between keys, and the slope error is about that variation over the
regressor's spread, so a slope error below the criterion's tolerance of 0.25 needs a
within-path spread of at least 0.1; below `min_spread` the slope is NaN too. A family
whose $\\rho G'(\\rho)$ stays close to 1 on dense fixed points (Kaniadakis with a small
$\\kappa$) falls there, where even the exact overdamped flow does not regress to slope 1.
"""

from __future__ import annotations

import equinox as eqx
import numpy as np

from jaxtyping import ArrayLike, Float

from fisherdyn import AbstractEntropy, AbstractSeparableEntropy, fisher_rao_distance

from .verdict import Interval, bootstrap_ci

__all__ = ["DepthConvergence", "MobilityRegression", "depth_convergence", "mobility_regression"]


def _units(units, P):
    """Integer unit labels `(P,)` and their number."""
    if units is None:
        return np.arange(P), P
    u = np.asarray(units).reshape(-1)
    if u.shape != (P,):
        raise ValueError(f"units must have one label per problem ({P}), got shape {u.shape}")
    labels, inv = np.unique(u, return_inverse=True)
    return inv, len(labels)


def _per_unit_sum(values, inv, n):
    """Sums of `values` (P, ...) per unit, shape (n, ...)."""
    out = np.zeros((n,) + values.shape[1:])
    np.add.at(out, inv, values)
    return out


class DepthConvergence(eqx.Module):
    """The gaps of paths run at L, 2L and 4L loops, at equal times.

    **Fields:**
    - `gap_L_2L`, `gap_2L_4L`: Fisher-Rao rms over problems and common times (t = 0
      excluded: all start at the same state).
    - `ratio`: `Interval` of `gap_L_2L / gap_2L_4L` (bootstrap over units); `order`:
      $\\log_2$ of its estimate.
    - `curve_L_2L`, `curve_2L_4L`: rms over problems at each common time (for the figure).
    - `unit_gaps`: `(units, 2)` rms gaps per unit.
    """

    gap_L_2L: float
    gap_2L_4L: float
    ratio: Interval
    order: float
    curve_L_2L: np.ndarray
    curve_2L_4L: np.ndarray
    unit_gaps: np.ndarray


def _on_grid(coarse, fine, name):
    """`fine` (P, Kf, N) subsampled at the times of `coarse` (P, Kc, N): with t = 0
    included both grids are $c\\,l/n$, $l = 0..n$ ($K_f = 2K_c - 1$); without it
    $l = 1..n$ ($K_f = 2K_c$)."""
    Kc, Kf = coarse.shape[1], fine.shape[1]
    if Kf == 2 * Kc - 1:
        return fine[:, ::2]
    if Kf == 2 * Kc:
        return fine[:, 1::2]
    raise ValueError(f"{name} has {Kf} loops for {Kc} of the shorter run: expected "
                     f"{2 * Kc - 1} (grids with t = 0) or {2 * Kc} (without)")


def depth_convergence(
    paths_L: Float[ArrayLike, "P K1 N"],
    paths_2L: Float[ArrayLike, "P K2 N"],
    paths_4L: Float[ArrayLike, "P K4 N"],
    *,
    units: ArrayLike | None = None,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    floor: float = 1e-9,
) -> DepthConvergence:
    """Whether paths run at L, 2L, 4L loops (step $c/n$) converge at equal $t$.

    **Arguments:**

    - `paths_L`, `paths_2L`, `paths_4L`: attention at every loop, `(P, K, N)`, of the same P
      problems, on the grids $t = c\\,l/n$ with $l = 0..n$ (K = n + 1) or $l = 1..n$ (K = n).
    - `units`: a label per problem (the trained model it came from); default one unit
      per problem.
    - `level`, `n_boot`, `seed`: the bootstrap of the ratio (see `bootstrap_ci`).
    - `floor`: a pooled gap(L, 2L) at or below this Fisher-Rao rms means the paths do not
      depend on the step (an exact integrator: the continuum limit is reached at L), and
      the ratio is $+\\infty$ rather than a ratio of round-off.

    **Returns:** a `DepthConvergence`.
    """
    a = np.asarray(paths_L, np.float64)
    full_2L = np.asarray(paths_2L, np.float64)
    b = _on_grid(a, full_2L, "paths_2L")
    c = _on_grid(a, _on_grid(full_2L, np.asarray(paths_4L, np.float64), "paths_4L"),
                 "paths_4L")
    if not (a.shape == b.shape == c.shape) or a.ndim != 3:
        raise ValueError(f"the three runs must hold the same (P, K, N) problems, got "
                         f"{a.shape}, {np.shape(paths_2L)}, {np.shape(paths_4L)}")
    # drop t = 0 where the grids include it: every run starts from the same state there
    start = 1 if np.shape(paths_2L)[1] == 2 * a.shape[1] - 1 else 0
    d1 = np.asarray(fisher_rao_distance(a, b))[:, start:] ** 2
    d2 = np.asarray(fisher_rao_distance(b, c))[:, start:] ** 2
    inv, n = _units(units, a.shape[0])
    # per unit: summed squared gaps and counts, so the pooled rms is a ratio of sums
    ss = _per_unit_sum(np.stack([d1.sum(1), d2.sum(1), np.full(len(d1), d1.shape[1])], -1),
                       inv, n)

    def ratio(s):
        num, den = s[:, 0].sum(), s[:, 1].sum()
        if num <= floor**2 * s[:, 2].sum():
            return float("inf")
        return float(np.sqrt(num / den))

    iv = bootstrap_ci(ss, ratio, level=level, n_boot=n_boot, seed=seed)
    g1, g2 = np.sqrt(d1.mean()), np.sqrt(d2.mean())
    return DepthConvergence(
        float(g1), float(g2), iv, float(np.log2(iv.estimate)),
        np.sqrt(d1.mean(0)), np.sqrt(d2.mean(0)), np.sqrt(ss[:, :2] / ss[:, 2:]),
    )


class MobilityRegression(eqx.Module):
    """The slope of each key's log rate of approach on $\\log(T\\rho G'(\\rho))$.

    **Fields:**
    - `slope`: `Interval` (bootstrap over units; NaN where the regressor does not vary,
      e.g. Shannon, or varies less than `min_spread`).
    - `spread`: the within-path rms of the regressor $\\log(T\\rho G'(\\rho))$.
    - `damping`: $e^{-\\bar c}$, $\\bar c$ the mean per-path intercept at the fitted slope
      (the flow's $\\gamma$ when the slope is 1).
    - `n_points`: points in the regression; `x`, `y`: their regressor and log rate
      (for the figure); `unit_slopes`: the slope of each unit alone.
    """

    slope: Interval
    spread: float
    damping: float
    n_points: int
    x: np.ndarray
    y: np.ndarray
    unit_slopes: np.ndarray


def mobility_regression(
    paths: Float[ArrayLike, "P K N"],
    times: Float[ArrayLike, "*#P K"],
    target_scores: Float[ArrayLike, "*#P N"] | None,
    entropy: AbstractEntropy,
    T: float = 1.0,
    *,
    target_rho: Float[ArrayLike, "*#P N"] | None = None,
    units: ArrayLike | None = None,
    rho_min: float = 1e-4,
    rel_min: float = 1e-2,
    min_spread: float = 0.1,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> MobilityRegression:
    """Regress each key's log rate of approach in score space on $\\log(T\\rho G'(\\rho))$.

    Between loops $l$ and $l+1$ the rate of key $i$ is
    $(z_{i,l+1} - z_{i,l})/(t_{l+1} - t_l)$ divided by the mean of $\\delta_i$ at the two
    loops, with $z = T G(\\rho)$ the current scores of `entropy` and
    $\\delta_i = (z^*_i - z_i) - \\langle z^* - z\\rangle_\\rho$; the regressor is
    $\\log(T\\rho G'(\\rho))$ at the mean weight. One intercept per path (its damping), one
    slope for all (see the module docstring for what each hypothesis predicts).

    **Arguments:**

    - `paths`: attention `(P, K, N)`; `times`: `(K,)` or `(P, K)` loop times.
    - `target_scores`: the fixed scores $z^*$ the flow relaxes to, `(N,)` or `(P, N)`
      (for a looped model: the loop's scores at its fixed point, so that the fixed point is
      `stationary(entropy, z*, T)`); or None with `target_rho`, a fixed point of full
      support, read as the scores $T G(\\rho^*)$ of `entropy` that make it stationary.
    - `entropy`: the hypothesised family (separable: it needs `G`, `G_prime`); `T` its
      temperature.
    - `units`: a label per problem; default one unit per problem.
    - `rho_min`: keys below this weight at either end of a step are left out (a cutoff
      family's zeros, and weights whose $G$ is dominated by round-off); `rel_min`: steps
      where $|\\delta_i|$ is below this fraction of the path's initial
      $\\max_i|\\delta_i|$ are left out (converged: the rate is noise over noise).
    - `min_spread`: below this within-path rms of the regressor the slope is not
      identified (see the module docstring) and reported as NaN.
    - `level`, `n_boot`, `seed`: the bootstrap (see `bootstrap_ci`).

    **Returns:** a `MobilityRegression`.
    """
    if not isinstance(entropy, AbstractSeparableEntropy):
        raise ValueError("mobility_regression needs a separable family (G, G_prime)")
    rho = np.asarray(paths, np.float64)
    if rho.ndim != 3 or rho.shape[1] < 2:
        raise ValueError(f"paths must have shape (P, K >= 2, N), got {rho.shape}")
    P, K, N = rho.shape
    t = np.broadcast_to(np.asarray(times, np.float64), (P, K))
    safe = np.clip(rho, rho_min, None)
    G = lambda x: np.asarray(entropy.G(x))  # noqa: E731
    z = T * G(safe)
    if target_scores is None:
        if target_rho is None:
            raise ValueError("give target_scores or target_rho")
        target_rho = np.asarray(target_rho, np.float64)
        if np.any(target_rho <= rho_min):
            raise ValueError("target_rho has weights <= rho_min: a sparse fixed point does not "
                             "determine the scores of its zeros; pass target_scores")
        zs = T * G(target_rho)
    else:
        zs = np.asarray(target_scores, np.float64)
    zs = np.broadcast_to(zs, (P, N))[:, None, :]
    d = zs - z
    delta = d - np.sum(rho * d, -1, keepdims=True)
    dzdt = np.diff(z, axis=1) / np.diff(t, axis=1)[..., None]
    rate = dzdt / (0.5 * (delta[:, 1:] + delta[:, :-1]))
    mid = 0.5 * (safe[:, 1:] + safe[:, :-1])
    x = np.log(T * mid * np.asarray(entropy.G_prime(mid)))
    scale = np.max(np.abs(delta[:, 0]), -1)[:, None, None]
    ok = ((rho[:, 1:] > rho_min) & (rho[:, :-1] > rho_min)
          & (np.minimum(np.abs(delta[:, 1:]), np.abs(delta[:, :-1])) > rel_min * scale)
          & (rate > 0) & np.isfinite(rate) & np.isfinite(x))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(ok, np.log(np.where(ok, rate, 1.0)), 0.0)
    x = np.where(ok, x, 0.0)
    cnt = ok.sum((1, 2))
    # within-path centering: one intercept per path
    xm = np.where(cnt > 0, x.sum((1, 2)) / np.maximum(cnt, 1), 0.0)[:, None, None]
    ym = np.where(cnt > 0, y.sum((1, 2)) / np.maximum(cnt, 1), 0.0)[:, None, None]
    xc, yc = np.where(ok, x - xm, 0.0), np.where(ok, y - ym, 0.0)
    inv, n = _units(units, P)
    sums = _per_unit_sum(np.stack([(xc * yc).sum((1, 2)), (xc * xc).sum((1, 2))], -1), inv, n)
    spread = float(np.sqrt(sums[:, 1].sum() / max(int(ok.sum()), 1)))
    identified = spread >= min_spread

    def slope(s):
        sxx = s[:, 1].sum()
        ok_ = identified and sxx > 1e-12 * max(1, len(s))
        return float(s[:, 0].sum() / sxx) if ok_ else float("nan")

    iv = bootstrap_ci(sums, slope, level=level, n_boot=n_boot, seed=seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        unit_slopes = sums[:, 0] / np.where(sums[:, 1] > 0, sums[:, 1], np.nan)
    used = cnt > 0
    b = iv.estimate if np.isfinite(iv.estimate) else 0.0
    c = (ym - b * xm)[used, 0, 0]
    damping = float(np.exp(-np.mean(c))) if c.size else float("nan")
    return MobilityRegression(iv, spread, damping, int(ok.sum()), x[ok], y[ok], unit_slopes)
