"""The exact small-sample statistics of the weight-tied study (`studies/weight_tied/verdict.py`:
`sign_test`, `sign_flip_test`, `median_interval`), checked against independent references:
SciPy's binomial test and distribution, a brute-force enumeration of sign patterns, and
Monte-Carlo coverage.
"""

import itertools

import numpy as np
import pytest
from scipy import stats

from weight_tied.verdict import (
    ExactTest,
    bootstrap_ci,
    holm,
    median_interval,
    sign_flip_test,
    sign_test,
)

# --------------------------------------------------------------------------- sign test


@pytest.mark.parametrize("alternative", ["greater", "less"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 12, 17])
def test_sign_test_matches_scipy_binomtest(n, alternative):
    """Integer-valued data (so that some units tie with the null) with a NaN unit added:
    p equals `scipy.stats.binomtest(#above, n', 0.5, alternative)` on the n' units that
    differ from the null (ties and NaN dropped), to 1e-12 relative; min_p = 2^-n'."""
    rng = np.random.default_rng(100 + n)
    for null in (0.0, 0.5, 1.0):
        for _ in range(5):
            v = rng.integers(-2, 4, size=n).astype(float)
            with_nan = np.append(v, np.nan)
            r = sign_test(with_nan, null, alternative)
            used = v[v != null]
            s = int(np.sum(used > null) if alternative == "greater" else np.sum(used < null))
            assert isinstance(r, ExactTest) and r.method == "sign"
            assert r.n_units == used.size and r.statistic == s
            assert r.min_p == 0.5**used.size
            if used.size == 0:
                assert r.p == 1.0
                continue
            # scipy's own framing: successes = units above the null, whatever the side
            above = int(np.sum(used > null))
            ref = stats.binomtest(above, used.size, 0.5, alternative=alternative).pvalue
            np.testing.assert_allclose(r.p, ref, rtol=1e-12)
            assert r.p >= r.min_p


def test_sign_test_extremes_and_ties():
    """All 6 units above the null: p = 2^-6 for "greater", 1 for "less"; units equal to the
    null are dropped (so two ties leave p = 2^-4); all tied: no evidence, p = 1."""
    v = np.arange(1.0, 7.0)
    assert sign_test(v, 0.0).p == 2.0**-6
    assert sign_test(v, 0.0, "less").p == 1.0
    r = sign_test([1.0, 1.0, 2.0, 3.0, 4.0, 5.0], 1.0)
    assert (r.n_units, r.statistic, r.p, r.min_p) == (4, 4, 2.0**-4, 2.0**-4)
    r = sign_test([2.0, 2.0, 2.0], 2.0)
    assert (r.n_units, r.p, r.min_p) == (0, 1.0, 1.0)
    # an infinite unit has a sign (a ratio over a zero gap)
    assert sign_test([np.inf, 3.0, 2.0], 1.2).p == 2.0**-3


# --------------------------------------------------------------------------- sign-flip test


def _brute_sign_flip(values, null, alternative):
    """All 2^n sign patterns by itertools.product; the p-value as a fraction of patterns
    whose mean is at least (at most) the observed one, the observed pattern included."""
    d = [x - null for x in values]
    obs = sum(d) / len(d)
    means = [sum(s * x for s, x in zip(signs, d)) / len(d)
             for signs in itertools.product((1, -1), repeat=len(d))]
    tol = 1e-9 * (sum(abs(x) for x in d) + 1e-300)
    if alternative == "greater":
        hits = sum(m >= obs - tol for m in means)
    else:
        hits = sum(m <= obs + tol for m in means)
    return hits / len(means)


@pytest.mark.parametrize("alternative", ["greater", "less"])
def test_sign_flip_matches_brute_force(alternative):
    """Continuous data (n = 1..10, normal around the null shifted by 0 or 0.7) and
    integer data with exact ties among the pattern sums and with the null: p equals the
    brute-force enumeration exactly (both are counts over 2^n)."""
    rng = np.random.default_rng(7)
    for n in range(1, 11):
        for shift in (0.0, 0.7):
            v = 1.3 + shift + rng.standard_normal(n)
            r = sign_flip_test(v, 1.3, alternative)
            assert r.method == "sign-flip" and r.n_units == n
            assert r.p == _brute_sign_flip(list(v), 1.3, alternative)
            np.testing.assert_allclose(r.statistic, np.mean(v - 1.3), rtol=1e-12)
        w = rng.integers(-3, 4, size=n).astype(float)
        r = sign_flip_test(w, 0.0, alternative)
        assert r.p == _brute_sign_flip(list(w), 0.0, alternative)
        assert r.min_p == 0.5 ** int(np.sum(w != 0))


def test_sign_flip_known_values():
    """All n units on the YES side: only the observed pattern is as extreme, p = 2^-n = min_p
    (n = 1..12 and the default max_exact = 20); the other direction gives 1. A NaN unit is
    dropped. More units than max_exact is an error, not a Monte-Carlo estimate."""
    rng = np.random.default_rng(0)
    for n in list(range(1, 13)) + [20]:
        v = 0.5 + rng.uniform(0.1, 2.0, n)
        r = sign_flip_test(v, 0.5)
        assert r.p == r.min_p == 2.0**-n
        assert sign_flip_test(v, 0.5, "less").p == 1.0
        assert sign_flip_test(0.5 - (v - 0.5), 0.5, "less").p == 2.0**-n
    assert sign_flip_test([1.0, 2.0, np.nan], 0.0).n_units == 2
    with pytest.raises(ValueError, match="max_exact"):
        sign_flip_test(np.ones(6), 0.0, max_exact=5)
    with pytest.raises(ValueError, match="max_exact"):
        sign_flip_test(np.ones(21), 0.0)
    with pytest.raises(ValueError, match="finite"):
        sign_flip_test([1.0, np.inf], 0.0)


# --------------------------------------------------------------------------- median interval


def _reference_k(n, level):
    """The largest k <= (n+1)/2 with 1 - 2 binom.cdf(k-1, n, 1/2) >= level, else 1."""
    ok = [k for k in range(1, (n + 1) // 2 + 1)
          if 1 - 2 * stats.binom.cdf(k - 1, n, 0.5) >= level]
    return max(ok) if ok else 1


@pytest.mark.parametrize("level", [0.5, 0.8, 0.9, 0.95, 0.99, 1 - 0.05 / 4])
def test_median_interval_order_statistics_and_coverage(level):
    """n = 1..30: the returned pair is (x_(k), x_(n+1-k)) for the reference k, and the
    coverage equals 1 - 2 binom.cdf(k-1, n, 1/2) to 1e-12; it is >= level unless k = 1
    (the range), where it is the range's own coverage."""
    rng = np.random.default_rng(int(level * 1e4))
    for n in range(1, 31):
        x = rng.standard_normal(n)
        lo, hi, cov = median_interval(x, level)
        k = _reference_k(n, level)
        xs = np.sort(x)
        assert (lo, hi) == (xs[k - 1], xs[n - k])
        ref = 1 - 2 * stats.binom.cdf(k - 1, n, 0.5)
        np.testing.assert_allclose(cov, ref, rtol=1e-12, atol=1e-15)
        assert cov >= level or k == 1


def test_median_interval_small_n_reports_its_true_coverage():
    """With 4 units the range is all there is: its coverage 1 - 2/16 = 0.875 is reported
    at level 0.95, not 0.95; one unit gives a point of coverage 0; NaN units are dropped."""
    assert median_interval([3.0, 1.0, 4.0, 2.0], 0.95) == (1.0, 4.0, 0.875)
    assert median_interval([2.5], 0.9) == (2.5, 2.5, 0.0)
    assert median_interval([3.0, np.nan, 1.0, 4.0, 2.0], 0.95) == (1.0, 4.0, 0.875)


def test_median_interval_monte_carlo_coverage():
    """20,000 samples of n = 8 N(0, 1) (level 0.9: k = 2, coverage 1 - 18/256 = 0.9297) and
    of n = 5 Exp(1) (true median ln 2; level 0.95: the range, 1 - 2/32 = 0.9375): the
    fraction of intervals covering the true median is within 0.01 of the returned coverage
    (binomial sd <= 0.0018, so 0.01 is over 5 sd)."""
    rng = np.random.default_rng(11)
    for draw, n, level, median in ((rng.standard_normal, 8, 0.9, 0.0),
                                   (rng.standard_exponential, 5, 0.95, np.log(2))):
        samples = draw((20_000, n))
        covered, coverages = 0, set()
        for x in samples:
            lo, hi, cov = median_interval(x, level)
            covered += lo <= median <= hi
            coverages.add(cov)
        (cov,) = coverages
        assert abs(covered / len(samples) - cov) < 0.01, (n, covered / len(samples), cov)
    np.testing.assert_allclose(median_interval(np.arange(8.0), 0.9)[2], 1 - 18 / 256)


# --------------------------------------------------------------------------- input errors


@pytest.mark.parametrize("fn", [sign_test, sign_flip_test])
def test_tests_reject_bad_input(fn):
    """Empty input, all-NaN input, non-1-D input and an alternative other than "greater" /
    "less" are ValueErrors that say what was wrong."""
    with pytest.raises(ValueError, match="empty"):
        fn([], 0.0)
    with pytest.raises(ValueError, match="NaN"):
        fn([np.nan, np.nan], 0.0)
    with pytest.raises(ValueError, match="1-D"):
        fn(np.ones((3, 2)), 0.0)
    for alt in ("two-sided", "greeter", None):
        with pytest.raises(ValueError, match="alternative must be 'greater'.*'less'"):
            fn([1.0, 2.0], 0.0, alt)


def test_median_interval_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        median_interval([], 0.9)
    with pytest.raises(ValueError, match="NaN"):
        median_interval([np.nan], 0.9)
    for level in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="level"):
            median_interval([1.0, 2.0], level)


# --------------------------------------------------------------------------- holm and NaN


def test_holm_nan_stays_nan_and_does_not_count():
    """NaN p-values (a criterion not applicable) stay NaN, are never rejected and do not
    count in k: one finite p among NaNs is left as it is; all NaN is all NaN."""
    adj, rej = holm([np.nan, 0.02, np.nan])
    np.testing.assert_array_equal(np.isnan(adj), [True, False, True])
    assert adj[1] == 0.02 and list(rej) == [False, True, False]
    adj, rej = holm([np.nan, np.nan])
    assert np.all(np.isnan(adj)) and not np.any(rej)
    # exact p-values at their floor 2^-4 (4 units), two finite among three: k = 2
    adj, _ = holm([2.0**-4, np.nan, 2.0**-4])
    np.testing.assert_allclose(adj[[0, 2]], [2 * 2.0**-4] * 2)


def test_bootstrap_interval_carries_each_units_statistic():
    # Reference: the statistic of each unit computed by hand (a ratio of means per unit is
    # that unit's own ratio), which the exact tests read.
    rng = np.random.default_rng(3)
    a = rng.uniform(1, 2, size=(5, 2))
    iv = bootstrap_ci(a, lambda x: x[:, 0].mean() / x[:, 1].mean(), level=0.9)
    np.testing.assert_allclose(iv.unit_values, a[:, 0] / a[:, 1], rtol=1e-15)
    np.testing.assert_allclose(bootstrap_ci(a[:, 0]).unit_values, a[:, 0], rtol=0)


def test_study_reports_exact_tests_and_holm_across_groups():
    # References: scipy's binomial test for each criterion's sign test toward YES, the
    # order-statistic interval of 4 seeds (the range, coverage 1 - 2/16), and Holm over the
    # normalizers' tests by hand; a criterion without units is left out.
    from weight_tied.protocol import PROTOCOL_CRITERIA
    from weight_tied.study import exact_tests, holm_over

    crit = {c.name: c for c in PROTOCOL_CRITERIA}
    depth = bootstrap_ci(np.array([2.1, 2.0, 1.9, 2.3]))
    lr = bootstrap_ci(np.array([0.05, 0.4, 0.1, 0.02]))
    ex = exact_tests({"depth_convergence": depth, "linear_response": lr, "heldout": None},
                     0.9875)
    assert set(ex) == {"depth_convergence", "linear_response"}
    for name, iv in (("depth_convergence", depth), ("linear_response", lr)):
        c = crit[name]
        k = int(np.sum(iv.unit_values > c.null) if c.alternative == "greater"
                else np.sum(iv.unit_values < c.null))
        want = stats.binomtest(k, 4, 0.5, alternative="greater").pvalue
        assert ex[name]["sign_p"] == pytest.approx(want, rel=1e-12)
        assert ex[name]["sign_min_p"] == 1 / 16
        assert ex[name]["median_interval"] == [iv.unit_values.min(), iv.unit_values.max()]
        assert ex[name]["coverage"] == pytest.approx(0.875)
    other = {"depth_convergence": dict(ex["depth_convergence"], sign_p=0.5)}
    exact = {"a": ex, "b": other}
    holm_over(exact, ["a", "b"])
    ps = [ex["depth_convergence"]["sign_p"], ex["linear_response"]["sign_p"], 0.5]
    order = np.argsort(ps)
    adj = np.maximum.accumulate([min(1, (3 - i) * ps[j]) for i, j in enumerate(order)])
    want = np.empty(3)
    want[order] = adj
    got = [exact["a"]["depth_convergence"]["sign_p_holm"],
           exact["a"]["linear_response"]["sign_p_holm"],
           exact["b"]["depth_convergence"]["sign_p_holm"]]
    np.testing.assert_allclose(got, want, rtol=1e-12)
