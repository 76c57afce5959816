"""Statistics and the pre-registered verdict of the weight-tied study.

The unit of replication is the trained model (one seed): `bootstrap_ci` resamples units,
`holm` corrects p-values across the tests, and `verdict` applies criteria that are fixed
here, before any data, to the intervals. The tests themselves (depth convergence, mobility,
linear response, held-out prediction) live in `evidence_paths.py`,
`evidence_response.py` and `evidence_heldout.py`; each returns the per-unit statistic
that a criterion below reads.

**The criteria** (`CRITERIA`; regions are closed intervals of the statistic). A criterion
says YES when the whole bootstrap interval lies in its YES region, NO when the whole
interval lies in its NO region, and INCONCLUSIVE otherwise (the point estimate never
decides). The intervals are taken at `CRITERION_LEVEL` $= 1 - 0.05/4$, so that the four
criteria hold jointly at 95% (Bonferroni). Alongside, the verdict reports each criterion's
bootstrap p-value of the null "the statistic is on the NO side of its threshold"
(`Criterion.null`), Holm-corrected across the criteria (`holm`).

1. `depth_convergence`: $r = \\mathrm{gap}(L, 2L)/\\mathrm{gap}(2L, 4L)$, the Fisher-Rao
   rms gap of paths run at L, 2L, 4L loops compared at equal $t$ (step $c/n$). First-order
   convergence gives $r = 2$, second order 4; no continuum limit gives $r \\approx 1$.
   YES: $r \\in [1.5, \\infty)$; NO: $r \\in (-\\infty, 1.2]$.
2. `mobility_slope`: the slope $b$ of each key's log rate of approach in score space on
   $\\log(T\\rho G'(\\rho))$ of the trained family. The family's own Fisher flow predicts
   $b = 1$, a mobility that ignores the family (Shannon-like, or linear relaxation in
   score space) $b = 0$. YES: $b \\in [0.75, 1.25]$; NO: $b \\in (-\\infty, 0.5]$ or
   $[1.5, \\infty)$. Not applicable to Shannon (its $\\rho G' = 1$: no regressor).
3. `linear_response`: $e$, the largest relative error of the other modes' rates predicted
   by `relaxation_spectrum` with $(m, \\gamma)$ fitted on the slowest mode (a damping regime
   predicted wrongly counts as $e = 1$). YES: $e \\in [0, 0.2]$; NO: $e \\in [0.3, \\infty)$.
4. `heldout`: $\\rho_{rms}$, the held-out Fisher-Rao rms of the Fisher model divided by the
   best of the baselines (constant, geodesic, linear score-space). YES: $\\in [0, 0.9]$
   (at least 10% better than every baseline); NO: $\\in [1, \\infty)$ (a baseline is as good).

Overall: NO if any applicable criterion says NO, YES if all say YES, INCONCLUSIVE
otherwise. A pipeline that does not answer YES on the positive control and NO (on at
least one criterion) on each negative control has not shown that it can tell the two
apart: `verdict(..., controls_ok=False)` then reports the overall answer as INCONCLUSIVE
whatever the criteria say.

**Exact small-sample tests.** With 4-12 units the percentile bootstrap interval is close
to the range and its p-values sit at their floor $1/(B+1)$, which says nothing about the
units. `sign_test`, `sign_flip_test` (`ExactTest`) and `median_interval` are exact over
units and report the smallest p (or the coverage) the number of units allows; they are
meant to be reported beside the bootstrap, not to replace the decisions above.
"""

from __future__ import annotations

import math
import warnings

from collections.abc import Callable, Mapping, Sequence

import equinox as eqx
import numpy as np

from jaxtyping import ArrayLike, Float

__all__ = [
    "YES",
    "NO",
    "INCONCLUSIVE",
    "NOT_APPLICABLE",
    "CRITERION_LEVEL",
    "CRITERIA",
    "Criterion",
    "ExactTest",
    "Interval",
    "Verdict",
    "bootstrap_ci",
    "holm",
    "median_interval",
    "sign_flip_test",
    "sign_test",
    "verdict",
]

YES, NO, INCONCLUSIVE, NOT_APPLICABLE = "YES", "NO", "INCONCLUSIVE", "N/A"


class Interval(eqx.Module):
    """A point estimate with a percentile bootstrap interval.

    **Fields:** `estimate` (the statistic of the data as given), `low`, `high`, `level`,
    `n_units` (units resampled), `replicates` (the bootstrap statistics, for p-values),
    `unit_values` (the statistic of each unit on its own, for the exact tests over units;
    None where the interval was not made from units).
    """

    estimate: float
    low: float
    high: float
    level: float
    n_units: int
    replicates: np.ndarray
    unit_values: np.ndarray | None = None

    def pvalue(self, null: float, alternative: str = "greater") -> float:
        """The bootstrap p-value of `H0: statistic <= null` (`"greater"`), `>= null`
        (`"less"`) or `= null` (`"two-sided"`): the fraction of replicates on the null's
        side (at least $1/(B+1)$), doubled for two-sided."""
        r = self.replicates[np.isfinite(self.replicates)]
        if r.size == 0:
            return float("nan")
        lower = (1 + np.sum(r <= null)) / (r.size + 1)
        upper = (1 + np.sum(r >= null)) / (r.size + 1)
        if alternative == "greater":
            return float(lower)
        if alternative == "less":
            return float(upper)
        if alternative == "two-sided":
            return float(min(1.0, 2 * min(lower, upper)))
        raise ValueError(
            f"alternative must be 'greater', 'less' or 'two-sided', got {alternative!r}")


def _nanmean(a):
    return float(np.nanmean(a))


def bootstrap_ci(
    values: Float[ArrayLike, "units ..."],
    statistic: Callable[[np.ndarray], float] | None = None,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of a statistic, resampling units (the leading axis).

    The unit is the independent replicate: a trained model (seed), not a problem or a
    head of one model, whose values are correlated. Everything on the other axes of a unit
    travels with it.

    **Arguments:**

    - `values`: shape `(units, ...)`; NaN entries are allowed if `statistic` ignores them
      (the default does). Replicates whose statistic is NaN are left out of the
      quantiles; infinite ones are kept.
    - `statistic`: maps an array of the same shape (resampled units) to a float; default
      the mean over everything (`np.nanmean`). A ratio of means, e.g.
      `lambda a: a[:, 0].mean() / a[:, 1].mean()`, is a statistic of pairs.
    - `level`: two-sided coverage; `n_boot`: replicates; `seed`: NumPy generator seed.

    **Returns:**

    An `Interval`, with `unit_values` the statistic of each unit alone. With a single
    unit no spread can be estimated: the interval is $(-\\infty, \\infty)$, so that no
    criterion can decide on one model.
    """
    a = np.asarray(values, np.float64)
    if a.ndim == 0 or a.shape[0] < 1:
        raise ValueError("values need a leading axis of at least one unit")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    stat = _nanmean if statistic is None else statistic
    est = float(stat(a))
    n = a.shape[0]
    with warnings.catch_warnings():  # a unit of NaNs alone has a NaN statistic, not an error
        warnings.simplefilter("ignore", RuntimeWarning)
        units = np.array([float(stat(a[i:i + 1])) for i in range(n)])
    if n == 1:
        return Interval(est, -np.inf, np.inf, float(level), 1, np.full(1, est), units)
    idx = np.random.default_rng(seed).integers(0, n, size=(int(n_boot), n))
    reps = np.array([float(stat(a[i])) for i in idx])
    kept = reps[~np.isnan(reps)]
    if kept.size == 0:
        return Interval(est, float("nan"), float("nan"), float(level), n, reps, units)
    alpha = 1 - level
    # an infinite replicate (e.g. a ratio over a zero gap) is a value, not a gap: quantiles
    # without interpolation keep it
    method = "linear" if np.all(np.isfinite(kept)) else "inverted_cdf"
    lo, hi = np.quantile(kept, [alpha / 2, 1 - alpha / 2], method=method)
    return Interval(est, float(lo), float(hi), float(level), n, reps, units)


def holm(pvalues: Float[ArrayLike, " k"], alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm-Bonferroni step-down correction of `k` p-values.

    Sorted ascending, $\\tilde p_{(j)} = \\max_{i \\le j}\\min(1, (k - i + 1)p_{(i)})$; a
    hypothesis is rejected when $\\tilde p \\le \\alpha$ (family-wise error $\\le\\alpha$
    under any dependence). NaN p-values are never rejected and do not count in $k$.

    **Returns:** `(adjusted p-values, rejected)` in the input order.
    """
    p = np.asarray(pvalues, np.float64).ravel()
    ok = np.isfinite(p)
    adj = np.full(p.shape, np.nan)
    k = int(np.sum(ok))
    if k:
        idx = np.flatnonzero(ok)[np.argsort(p[ok], kind="stable")]
        scaled = np.minimum(1.0, (k - np.arange(k)) * p[idx])
        adj[idx] = np.maximum.accumulate(scaled)
    return adj, np.where(ok, adj <= alpha, False)


class ExactTest(eqx.Module):
    """The result of an exact one-sided test over units (`sign_test`, `sign_flip_test`).

    **Fields:** `p` (the exact p-value), `min_p` (the smallest p these units could give
    whatever their values: a p at `min_p` is as strong as the data can be), `n_units`
    (units the test used, after the documented drops), `statistic` (the number of units
    on the YES side for `"sign"`, the mean of `values - null` for `"sign-flip"`), `method`.
    """

    p: float
    min_p: float
    n_units: int
    statistic: float
    method: str


def _units(values, name: str) -> np.ndarray:
    """The per-unit values as a 1-D float array, NaN units dropped (infinite ones kept)."""
    a = np.asarray(values, np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name}: values must be 1-D (one number per unit), got shape "
                         f"{a.shape}")
    if a.size == 0:
        raise ValueError(f"{name}: values are empty (no units)")
    a = a[~np.isnan(a)]
    if a.size == 0:
        raise ValueError(f"{name}: every unit is NaN")
    return a


def _check_alternative(alternative: str, name: str) -> None:
    if alternative not in ("greater", "less"):
        raise ValueError(f"{name}: alternative must be 'greater' (YES above the null) or "
                         f"'less' (YES below it), got {alternative!r}")


def _binom_sf_half(k: int, n: int) -> float:
    """$P(\\mathrm{Binom}(n, 1/2) \\ge k)$, exactly (integer sums, one rounding)."""
    # integers: no cancellation in the tail sum, one correctly rounded division at the end
    return sum(math.comb(n, j) for j in range(max(k, 0), n + 1)) / 2**n


def sign_test(
    values: Float[ArrayLike, " units"], null: float, alternative: str = "greater"
) -> ExactTest:
    """Exact one-sided binomial sign test of the median of the units.

    H0 is "the median is on the NO side of `null`": $\\mathrm{median} \\le$ `null` for
    `"greater"`, $\\ge$ `null` for `"less"`. With $s$ the number of units strictly on the
    YES side and $n$ the units that differ from `null`,
    $p = P(\\mathrm{Binom}(n, 1/2) \\ge s)$. It assumes only independent units.

    **Arguments:**

    - `values`: one number per unit, shape `(units,)`. NaN units are dropped; units equal
      to `null` are dropped too (the standard convention for ties: they carry no sign).
      Infinite values are allowed (they have a sign).
    - `null`: the threshold (`Criterion.null`).
    - `alternative`: `"greater"` (YES lies above `null`) or `"less"` (below).

    **Returns:**

    An `ExactTest` with `method="sign"`, `statistic` $= s$, `n_units` $= n$ and
    `min_p` $= 2^{-n}$. If every unit ties with `null`, $n = 0$ and $p = 1$: no evidence.
    """
    _check_alternative(alternative, "sign_test")
    a = _units(values, "sign_test")
    d = a - null if alternative == "greater" else null - a
    n = int(np.sum(d != 0))
    s = int(np.sum(d > 0))
    return ExactTest(_binom_sf_half(s, n), 0.5**n, n, s, "sign")


def sign_flip_test(
    values: Float[ArrayLike, " units"],
    null: float,
    alternative: str = "greater",
    max_exact: int = 20,
) -> ExactTest:
    """Exact sign-flip permutation test of the mean of `values - null`.

    Under H0 ("the units are symmetric about `null`", which contains the NO side's
    boundary) each $d_i = x_i - \\text{null}$ is as likely $\\pm|d_i|$; the p-value is the
    fraction of all $2^n$ sign patterns whose mean is at least the observed one
    (`"greater"`) or at most it (`"less"`), the observed pattern included. More powerful
    than `sign_test` when the magnitudes carry information, at the price of symmetry.

    **Arguments:**

    - `values`: one number per unit, shape `(units,)`; NaN units are dropped. Infinite
      values are an error (a mean with $\\pm\\infty$ terms has no sign pattern); use
      `sign_test` for them.
    - `null`: the threshold; `alternative`: `"greater"` or `"less"`, as in `sign_test`.
    - `max_exact`: the most units enumerated ($2^n$ patterns); more is an error, never a
      silent Monte-Carlo approximation.

    **Returns:**

    An `ExactTest` with `method="sign-flip"`, `statistic` the observed mean of
    `values - null`, `n_units` the units used (NaN dropped; units equal to `null` are kept,
    they flip to themselves) and `min_p` $= 2^{-m}$ with $m$ the units that differ from
    `null` ($= 2^{-n}$ without ties: tied units only duplicate patterns).
    """
    _check_alternative(alternative, "sign_flip_test")
    a = _units(values, "sign_flip_test")
    if not np.all(np.isfinite(a)):
        raise ValueError("sign_flip_test: values must be finite (NaN is dropped, +-inf is "
                         "not); use sign_test for infinite units")
    n = a.size
    if n > max_exact:
        raise ValueError(f"sign_flip_test: {n} units need 2**{n} sign patterns, more than "
                         f"max_exact={max_exact} allows; raise max_exact explicitly")
    d = a - null
    sums = np.zeros(1)
    for di in d:  # the sums of all 2^n patterns, one unit at a time
        sums = np.concatenate([sums + di, sums - di])
    observed = float(np.sum(d))
    # patterns tied with the observed sum in exact arithmetic may differ by rounding
    tol = 1e-12 * max(float(np.sum(np.abs(d))), 1e-300)
    if alternative == "greater":
        count = int(np.sum(sums >= observed - tol))
    else:
        count = int(np.sum(sums <= observed + tol))
    m = int(np.sum(d != 0))
    return ExactTest(count / 2**n, 0.5**m, n, observed / n, "sign-flip")


def median_interval(
    values: Float[ArrayLike, " units"], level: float = 0.95
) -> tuple[float, float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    $(x_{(k)}, x_{(n+1-k)})$ covers the median of any continuous distribution with
    probability exactly $1 - 2P(\\mathrm{Binom}(n, 1/2) \\le k - 1)$ (at least that for a
    discrete one). The largest $k$ (the narrowest pair) whose coverage is at least `level`
    is taken.

    **Arguments:**

    - `values`: one number per unit, shape `(units,)`; NaN units are dropped.
    - `level`: the coverage wanted, in $(0, 1)$.

    **Returns:**

    `(low, high, coverage)`, with `coverage` the exact coverage achieved, never the level
    asked for: when even the range ($k = 1$, coverage $1 - 2^{1-n}$) falls short, the
    range is returned with its own coverage (with 4 units, 0.875; with 1 unit, 0: a single
    point).
    """
    if not 0 < level < 1:
        raise ValueError(f"median_interval: level must be in (0, 1), got {level}")
    x = np.sort(_units(values, "median_interval"))
    n = x.size

    def coverage(k):
        # P(B <= k-1) = P(B >= n-k+1) by symmetry: a tail sum, not 1 minus one
        return 1 - 2 * _binom_sf_half(n - k + 1, n)

    k = 1
    # coverage falls as k grows; k stops at the middle pair (or the middle point, n odd)
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return float(x[k - 1]), float(x[n - k]), float(coverage(k))


class Criterion(eqx.Module):
    """A pre-registered criterion: YES / NO regions of one statistic (closed intervals,
    `±inf` allowed). YES when the interval lies inside one YES region, NO when inside one
    NO region, else INCONCLUSIVE. `null`, `alternative`: the one-sided null hypothesis
    "the statistic is on the NO side of `null`" whose bootstrap p-value (`Interval.pvalue`)
    the verdict reports, Holm-corrected across the criteria."""

    name: str
    statistic: str
    yes: tuple[tuple[float, float], ...]
    no: tuple[tuple[float, float], ...]
    null: float
    alternative: str

    def decide(self, interval: Interval | None) -> str:
        if interval is None:
            return NOT_APPLICABLE
        lo, hi = interval.low, interval.high
        if np.isnan(lo) or np.isnan(hi):
            return INCONCLUSIVE
        inside = lambda regions: any(a <= lo and hi <= b for a, b in regions)  # noqa: E731
        if inside(self.yes):
            return YES
        if inside(self.no):
            return NO
        return INCONCLUSIVE


_INF = float("inf")
CRITERIA: tuple[Criterion, ...] = (
    Criterion("depth_convergence", "gap(L,2L) / gap(2L,4L)", ((1.5, _INF),), ((-_INF, 1.2),),
              1.2, "greater"),
    Criterion("mobility_slope", "slope of log rate on log(T rho G'(rho))", ((0.75, 1.25),),
              ((-_INF, 0.5), (1.5, _INF)), 0.5, "greater"),
    Criterion("linear_response", "max relative error of predicted mode rates", ((0.0, 0.2),),
              ((0.3, _INF),), 0.3, "less"),
    Criterion("heldout", "held-out rms: Fisher / best baseline", ((0.0, 0.9),),
              ((1.0, _INF),), 1.0, "less"),
)
CRITERION_LEVEL = 1 - 0.05 / len(CRITERIA)


class Verdict(eqx.Module):
    """Per-criterion decisions and the overall answer.

    **Fields:** `overall` (YES / NO / INCONCLUSIVE), `decisions` (criterion name -> YES /
    NO / INCONCLUSIVE / N/A), `intervals` (name -> `Interval` or None), `controls_ok`,
    `pvalues` (name -> bootstrap p-value of the criterion's null, NaN where N/A) and
    `holm_pvalues` (the same, Holm-corrected across the applicable criteria). The
    p-values are reported alongside; the decisions read the intervals only.
    """

    overall: str
    decisions: dict
    intervals: dict
    controls_ok: bool
    pvalues: dict
    holm_pvalues: dict

    def table(self) -> str:
        """The verdict as a small text table (criterion, interval, decision)."""
        rows = []
        for name, dec in self.decisions.items():
            iv = self.intervals.get(name)
            span = "-" if iv is None else f"{iv.estimate:.3g} [{iv.low:.3g}, {iv.high:.3g}]"
            p = self.holm_pvalues.get(name, float("nan"))
            rows.append(f"{name:<20} {span:<30} {dec:<13} p_holm={p:.3g}")
        rows.append(f"{'overall':<20} {'':<30} {self.overall}"
                    + ("" if self.controls_ok else " (controls failed)"))
        return "\n".join(rows)


def verdict(
    intervals: Mapping[str, Interval | None],
    *,
    criteria: Sequence[Criterion] = CRITERIA,
    controls_ok: bool = True,
) -> Verdict:
    """Apply the pre-registered criteria to the intervals of one normalizer (or control).

    **Arguments:**

    - `intervals`: criterion name -> `Interval` (from `bootstrap_ci` at `CRITERION_LEVEL`)
      or None (not applicable, e.g. the mobility slope of Shannon). Every criterion must be
      named; unknown names are an error.
    - `criteria`: the criteria (default `CRITERIA`, the pre-registered ones).
    - `controls_ok`: whether the same pipeline answered YES on the positive control and NO
      on the negative ones; if not, the overall answer is INCONCLUSIVE.

    **Returns:** a `Verdict`.
    """
    names = [c.name for c in criteria]
    unknown = set(intervals) - set(names)
    missing = set(names) - set(intervals)
    if unknown or missing:
        raise ValueError(f"intervals must name exactly the criteria {names}; "
                         f"unknown {sorted(unknown)}, missing {sorted(missing)}")
    decisions = {c.name: c.decide(intervals[c.name]) for c in criteria}
    applicable = [d for d in decisions.values() if d != NOT_APPLICABLE]
    if not applicable:
        overall = INCONCLUSIVE
    elif NO in applicable:
        overall = NO
    elif all(d == YES for d in applicable):
        overall = YES
    else:
        overall = INCONCLUSIVE
    if not controls_ok:
        overall = INCONCLUSIVE
    pv = {c.name: (float("nan") if intervals[c.name] is None
                   else intervals[c.name].pvalue(c.null, c.alternative)) for c in criteria}
    adj, _ = holm([pv[n] for n in names])
    return Verdict(overall, decisions, dict(intervals), bool(controls_ok), pv,
                   dict(zip(names, (float(a) for a in adj))))
