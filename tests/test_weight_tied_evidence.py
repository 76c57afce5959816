"""The statistical tests and the pre-registered verdict of the weight-tied study (issue 17).

Each test function of the evidence modules is checked on controls whose answer is known by
construction: paths of the library's own dynamics (where the Fisher hypothesis is true) and
paths of other dynamics (where it is false).
"""

import numpy as np
import pytest

from fisherdyn._weight_tied._evidence import (
    CRITERIA,
    CRITERION_LEVEL,
    INCONCLUSIVE,
    NO,
    NOT_APPLICABLE,
    YES,
    Interval,
    bootstrap_ci,
    holm,
    verdict,
)

# --------------------------------------------------------------------------- statistics


def test_bootstrap_ci_covers_the_true_mean():
    """Percentile bootstrap of the mean of 40 N(0, 1) draws: over 200 data sets the 95%
    interval covers 0 in 88-99% of them (binomial sd of the coverage is 1.5%; the
    percentile interval undercovers slightly at small n), and its half-width agrees with
    the normal-theory 1.96 s/sqrt(n) to 15%."""
    rng = np.random.default_rng(1)
    covered, ratio = 0, []
    for k in range(200):
        x = rng.standard_normal(40)
        iv = bootstrap_ci(x, n_boot=600, seed=k)
        covered += iv.low <= 0.0 <= iv.high
        ratio.append((iv.high - iv.low) / 2 / (1.96 * x.std(ddof=1) / np.sqrt(40)))
    assert 0.88 <= covered / 200 <= 0.99
    assert abs(np.mean(ratio) - 1) < 0.15


def test_bootstrap_ci_resamples_units_and_single_unit():
    """A statistic of pairs (a ratio of means) sees whole units; one unit gives an infinite
    interval (no spread can be estimated from one trained model)."""
    rng = np.random.default_rng(0)
    a = np.stack([rng.uniform(1.9, 2.1, 8), np.ones(8)], -1)
    iv = bootstrap_ci(a, lambda v: v[:, 0].mean() / v[:, 1].mean())
    assert 1.9 < iv.low < iv.estimate < iv.high < 2.1
    one = bootstrap_ci(a[:1])
    assert one.low == -np.inf and one.high == np.inf and one.n_units == 1
    # one-sided bootstrap p-values: the data are far above 1.5, not above 2.5
    assert iv.pvalue(1.5) < 0.01 and iv.pvalue(2.5) > 0.99


def test_holm_against_hand_computation():
    """p = (0.01, 0.04, 0.03, 0.005): sorted 0.005*4, 0.01*3, 0.03*2, 0.04*1, made
    monotone: (0.03, 0.06, 0.06, 0.02); a NaN is never rejected and does not count."""
    adj, rej = holm([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adj, [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
    np.testing.assert_array_equal(rej, [True, False, False, True])
    adj, rej = holm([0.01, np.nan, 0.02])
    np.testing.assert_allclose(adj, [0.02, np.nan, 0.02], rtol=1e-12)
    np.testing.assert_array_equal(rej, [True, False, True])
    # Holm rejects at least what Bonferroni rejects
    p = np.random.default_rng(3).uniform(0, 0.05, 20)
    assert np.all(holm(p)[1] >= (np.minimum(1, 20 * p) <= 0.05))


# --------------------------------------------------------------------------- verdict


def _iv(lo, hi):
    return Interval(0.5 * (lo + hi), lo, hi, CRITERION_LEVEL, 4, np.array([lo, hi]))


YES_IVS = {"depth_convergence": _iv(1.8, 2.3), "mobility_slope": _iv(0.85, 1.1),
           "linear_response": _iv(0.02, 0.15), "heldout": _iv(0.4, 0.7)}


def test_verdict_three_outcomes():
    """Constructed intervals: all inside the YES regions -> YES; one inside a NO region ->
    NO; one straddling a threshold -> INCONCLUSIVE; the point estimate never decides
    (an interval straddling 1.5 with its estimate at 2 is INCONCLUSIVE)."""
    v = verdict(YES_IVS)
    assert v.overall == YES and set(v.decisions.values()) == {YES}
    no = dict(YES_IVS, mobility_slope=_iv(-0.2, 0.3))
    v = verdict(no)
    assert v.overall == NO and v.decisions["mobility_slope"] == NO
    assert verdict(dict(YES_IVS, depth_convergence=_iv(0.9, 1.1))).overall == NO
    assert verdict(dict(YES_IVS, heldout=_iv(1.0, 1.4))).overall == NO
    wide = Interval(2.0, 1.2, 2.8, CRITERION_LEVEL, 4, np.array([2.0]))
    v = verdict(dict(YES_IVS, depth_convergence=wide))
    assert v.overall == INCONCLUSIVE and v.decisions["depth_convergence"] == INCONCLUSIVE
    # a NO elsewhere outweighs an inconclusive criterion
    assert verdict(dict(no, depth_convergence=wide)).overall == NO
    assert "INCONCLUSIVE" in v.table()


def test_verdict_not_applicable_controls_and_names():
    """Shannon's mobility criterion is N/A and does not block YES; failed controls make
    the overall answer INCONCLUSIVE; a single unit (infinite interval) never decides;
    misnamed criteria are refused."""
    v = verdict(dict(YES_IVS, mobility_slope=None))
    assert v.decisions["mobility_slope"] == NOT_APPLICABLE and v.overall == YES
    assert verdict(YES_IVS, controls_ok=False).overall == INCONCLUSIVE
    single = bootstrap_ci(np.array([2.0]))
    assert verdict(dict(YES_IVS, depth_convergence=single)).overall == INCONCLUSIVE
    with pytest.raises(ValueError, match="exactly the criteria"):
        verdict({"depth": _iv(1, 2)})
    assert len(CRITERIA) == 4 and abs(CRITERION_LEVEL - 0.9875) < 1e-12
