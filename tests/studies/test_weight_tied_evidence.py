"""The statistical tests and the pre-registered verdict of the weight-tied study
(`studies/weight_tied`).

Each test function of the evidence modules is checked on controls whose answer is known by
construction: paths of the library's own dynamics (where the Fisher hypothesis is true) and
paths of other dynamics (where it is false).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.linalg import expm

import fisherdyn as fd
from fisherdyn._dynamics._coordinates import SphereCoordinates
from fisherdyn._dynamics._system import FisherSystem, tangent_basis
from weight_tied.verdict import (
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
from weight_tied.evidence_heldout import (
    _companion_flow,
    _linear_paths,
    heldout_prediction,
)
from weight_tied.evidence_paths import depth_convergence, mobility_regression
from weight_tied.evidence_response import feedback_stiffness, linear_response

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


def test_verdict_reports_holm_corrected_pvalues():
    """Replicates far on the YES side give p = 1/(B+1) before correction and k/(B+1)
    after Holm (k = 4 applicable criteria, all equal); a criterion whose replicates sit on
    the NO side has p = 1; N/A has NaN and shrinks k."""
    B = 999
    far = {"depth_convergence": 2.0, "mobility_slope": 1.0, "linear_response": 0.05,
           "heldout": 0.5}
    ivs = {k: Interval(v, v, v, CRITERION_LEVEL, 4, np.full(B, v)) for k, v in far.items()}
    v = verdict(ivs)
    assert all(abs(p - 1 / (B + 1)) < 1e-15 for p in v.pvalues.values())
    assert all(abs(p - 4 / (B + 1)) < 1e-15 for p in v.holm_pvalues.values())
    bad = dict(ivs, heldout=Interval(1.2, 1.2, 1.2, CRITERION_LEVEL, 4, np.full(B, 1.2)))
    assert verdict(bad).pvalues["heldout"] == 1.0
    na = verdict(dict(ivs, mobility_slope=None))
    assert np.isnan(na.pvalues["mobility_slope"])
    assert abs(na.holm_pvalues["depth_convergence"] - 3 / (B + 1)) < 1e-15
    assert "p_holm" in na.table()


# --------------------------------------------------------------------------- paths

P_, N_ = 12, 6
_rng = np.random.default_rng(0)
Z = _rng.normal(size=(P_, N_)) * 1.5
R0 = _rng.dirichlet(2 * np.ones(N_), size=P_)
UNITS = np.arange(P_) % 4  # four "trained models" of three problems each


@functools.partial(jax.jit, static_argnums=3)
def _euler_paths(x0, z, h, n):
    """Explicit Euler at step h of the overdamped vector field simulate integrates (the
    sphere chart's), n steps, t = 0 included: a first-order scheme."""
    sys = FisherSystem(fd.Shannon(), z, jnp.asarray(1.0), jnp.asarray(1.0), jnp.asarray(1.0))
    field = SphereCoordinates().overdamped_field

    def step(x, _):
        x = x + h * field(0.0, x, sys)
        return x, x**2 / jnp.sum(x**2)

    return jnp.concatenate([x0[None] ** 2, jax.lax.scan(step, x0, None, length=n)[1]])


def test_depth_convergence_of_step_independent_paths_is_infinite():
    """Paths that do not depend on the step (an exact integrator) up to round-off of 1e-14:
    gap(L, 2L) is below the floor, so the ratio is +inf (YES), not round-off over round-off;
    with the floor at 0 the same data give a ratio near 1 (NO), which is why it exists."""
    rng = np.random.default_rng(0)
    base = rng.dirichlet(np.ones(5), size=(8, 33))
    runs = [base[:, ::4], base[:, ::2], base]
    noisy = [r + 1e-14 * rng.normal(size=r.shape) for r in runs]
    noisy = [np.abs(r) / np.abs(r).sum(-1, keepdims=True) for r in noisy]
    dc = depth_convergence(*noisy, units=np.arange(8) % 4)
    assert np.isinf(dc.ratio.estimate) and CRITERIA[0].decide(dc.ratio) == YES
    raw = depth_convergence(*noisy, units=np.arange(8) % 4, floor=0.0)
    assert raw.ratio.estimate < 3


def test_depth_convergence_controls():
    """Euler paths of the library's flow at steps 2/8, 2/16, 2/32: ratio 2 for a
    first-order scheme (within [1.8, 2.4], interval included; the O(h) term dominates at
    these steps); independent random walks per loop count: no convergence, the interval
    lies in the NO region (<= 1.2)."""
    paths = [np.asarray(jax.vmap(_euler_paths, (0, 0, None, None))(
        jnp.sqrt(jnp.asarray(R0)), jnp.asarray(Z), 2.0 / n, n)) for n in (8, 16, 32)]
    dc = depth_convergence(*paths, units=UNITS)
    assert 1.8 <= dc.ratio.low <= dc.ratio.estimate <= dc.ratio.high <= 2.4
    assert abs(dc.order - 1) < 0.2 and dc.gap_L_2L > dc.gap_2L_4L > 0
    assert CRITERIA[0].decide(dc.ratio) == YES
    # without t = 0 on the grids: the same numbers
    dc0 = depth_convergence(*(p[:, 1:] for p in paths), units=UNITS)
    np.testing.assert_allclose(dc0.ratio.estimate, dc.ratio.estimate, rtol=1e-12)
    rng = np.random.default_rng(5)
    walks = [np.asarray(jax.nn.softmax(jnp.cumsum(0.3 * jnp.asarray(
        rng.normal(size=(P_, n + 1, N_))), 1), -1)) for n in (8, 16, 32)]
    bad = depth_convergence(*walks, units=UNITS)
    assert bad.ratio.high <= 1.2 and CRITERIA[0].decide(bad.ratio) == NO
    with pytest.raises(ValueError, match="loops"):
        depth_convergence(paths[0], paths[0], paths[2])


FAMS = {"shannon": fd.Shannon(), "tsallis": fd.Tsallis(1.5), "kaniadakis": fd.Kaniadakis(0.3)}
TS = np.linspace(0.0, 3.0, 13)


@functools.cache
def _flow_paths(name):
    """Overdamped Fisher flow of one family (T = 1, gamma = 1.3) at 13 loop times."""
    tr = fd.simulate(FAMS[name], Z, 1.0, mass=0.0, damping=1.3, rho0=R0, t1=3.0,
                     saveat=TS, rtol=1e-10, atol=1e-12)
    return np.asarray(tr.rho)


@pytest.mark.parametrize("name", ["tsallis", "kaniadakis"])
def test_mobility_own_family_slope_one(name):
    """Paths of family F's flow regressed with F's mobility: slope 1 to 3%, the interval
    within [0.9, 1.1] (each rate is a finite difference over a step of 0.25 relaxation
    times, an O(h^2) bias of about 1% for Kaniadakis' stiff small weights, which a tight
    interval may exclude 1 by), and the intercept recovers gamma = 1.3 to 10%."""
    mr = mobility_regression(_flow_paths(name), TS, Z, FAMS[name], 1.0, units=UNITS)
    s = mr.slope
    assert abs(s.estimate - 1) < 0.03 and 0.9 <= s.low and s.high <= 1.1
    assert abs(mr.damping / 1.3 - 1) < 0.1 and mr.n_points > 300
    assert CRITERIA[1].decide(s) == YES


@pytest.mark.parametrize("paths, family, how", [
    ("shannon", "tsallis", "rho*"), ("shannon", "kaniadakis", "rho*"), ("linear", "tsallis", "z*"),
    ("linear", "kaniadakis", "z*")])
def test_mobility_wrong_mobility_slope_near_zero(paths, family, how):
    """A mobility that ignores F: Shannon's Fisher flow read in F's scores (target: its
    own fixed point, of full support), and a linear relaxation z(t) = z* + (z0 - z*)e^{-t}
    of F's scores pushed through F's stationary law. Both predict a rate that does not grow
    with rho G'(rho): the slope interval lies below 0.5 (NO region), far from 1."""
    e = FAMS[family]
    if paths == "shannon":
        rho = _flow_paths("shannon")
        target = dict(target_scores=None, target_rho=np.asarray(fd.stationary(fd.Shannon(), Z)))
    else:
        z0 = np.asarray(e.G(R0))
        zt = Z[:, None] + (z0 - Z)[:, None] * np.exp(-TS)[None, :, None]
        rho = np.asarray(fd.stationary(e, zt, 1.0))
        target = dict(target_scores=Z)
    mr = mobility_regression(rho, TS, entropy=e, T=1.0, units=UNITS, **target)
    assert mr.slope.high <= 0.5 and CRITERIA[1].decide(mr.slope) == NO


def test_mobility_shannon_has_no_regressor():
    """Shannon's rho G'(rho) = 1: the slope is undefined (NaN) and the criterion cannot
    say YES or NO; a sparse target_rho is refused."""
    mr = mobility_regression(_flow_paths("shannon"), TS, Z, fd.Shannon(), 1.0, units=UNITS)
    assert np.isnan(mr.slope.estimate) and CRITERIA[1].decide(mr.slope) == INCONCLUSIVE
    with pytest.raises(ValueError, match="sparse"):
        mobility_regression(_flow_paths("tsallis"), TS, None, FAMS["tsallis"],
                            target_rho=np.asarray(fd.stationary(FAMS["tsallis"], Z)))


def test_mobility_slope_withheld_where_the_regressor_barely_varies():
    """Kaniadakis(0.3) at T = 2.83 on mild scores: rho G'(rho) stays within a few percent of
    1, the within-path spread of the regressor is below 0.1 and the slope is reported as
    NaN (INCONCLUSIVE) rather than fitted to finite-difference bias; the same points with
    min_spread = 0 give a finite slope (the rule withholds it, not the data). Shannon's
    spread is exactly 0 (rho G' = 1)."""
    e = FAMS["kaniadakis"]
    z = 0.5 * Z
    tr = fd.simulate(e, z, 2.83, mass=0.0, damping=1.3, rho0=np.full(N_, 1.0 / N_), t1=3.0,
                     saveat=TS, rtol=1e-10, atol=1e-12)
    mr = mobility_regression(np.asarray(tr.rho), TS, z, e, 2.83, units=UNITS)
    assert 0 < mr.spread < 0.1 and mr.n_points > 100
    assert np.isnan(mr.slope.estimate) and CRITERIA[1].decide(mr.slope) == INCONCLUSIVE
    raw = mobility_regression(np.asarray(tr.rho), TS, z, e, 2.83, units=UNITS, min_spread=0.0)
    assert raw.spread == mr.spread and np.isfinite(raw.slope.estimate)
    sh = mobility_regression(_flow_paths("shannon"), TS, Z, fd.Shannon(), 1.0, units=UNITS)
    assert sh.spread < 1e-12
    own = mobility_regression(_flow_paths("tsallis"), TS, Z, FAMS["tsallis"], 1.0, units=UNITS)
    assert own.spread > 0.1


# --------------------------------------------------------------------------- linear response

ZR = np.array([1.0, 0.3, -0.5, 0.2, -1.1])
QR = np.asarray(tangent_basis(jnp.ones(5) / np.sqrt(5)))  # orthonormal, sum-zero columns


def _step_jacobian(entropy, m, gamma, h, eps=1e-5, z=ZR):
    """The Jacobian of simulate's step map over time h at the fixed point, by central
    differences in coordinates (a, b) of the tangent space, rho = rho* + Q a,
    rho_dot = Q b (just a for m = 0); all perturbed starts in one batched solve at rtol
    1e-12, so the Jacobian is exact to ~1e-7."""
    rs = np.asarray(fd.stationary(entropy, z, 1.0))
    n = len(z) - 1
    D = n if m == 0 else 2 * n
    dirs = np.concatenate([np.eye(D), -np.eye(D)]) * eps
    r0 = rs + dirs[:, :n] @ QR.T
    kw = {} if m == 0 else dict(velocity0=dirs[:, n:] @ QR.T)
    tr = fd.simulate(entropy, np.broadcast_to(z, r0.shape), 1.0, mass=m, damping=gamma,
                     rho0=r0, t1=h, saveat=np.array([h]), rtol=1e-12, atol=1e-14,
                     solver="dopri8", **kw)
    out = (np.asarray(tr.rho_final) - rs) @ QR
    if m:
        out = np.concatenate([out, np.asarray(tr.rho_dot_final) @ QR], -1)
    R = QR if m == 0 else np.concatenate([QR, np.zeros((len(z), n))], 1)
    return ((out[:D] - out[D:]) / (2 * eps)).T, rs, R


def test_linear_response_of_the_library_step_map():
    """Kaniadakis 0.3 at m = 1, gamma = 2: two over-damped and two under-damped modes.
    (m, gamma) fitted on the slowest mode come back to 1e-6 and every other rate and regime
    is predicted to 1e-6 relative (the finite-difference Jacobian is exact to ~1e-7), far
    inside the 20% criterion."""
    e = fd.Kaniadakis(0.3)
    regimes = fd.relaxation_spectrum(e, ZR, 1.0, mass=1.0, damping=2.0).regime_names
    assert set(regimes) == {"under-damped", "over-damped"}
    J, rs, R = _step_jacobian(e, 1.0, 2.0, 0.25)
    lr = linear_response(J, rs, e, 1.0, step=0.25, readout=R)
    assert abs(lr.mass - 1) < 1e-6 and abs(lr.damping - 2) < 1e-6
    assert lr.max_error < 1e-6 and lr.within_20 and lr.n_unmatched == 0
    assert np.all(lr.regime_match) and len(lr.measured) == 8
    # each measured root implies its mode's stiffness (both roots of a mode the same one)
    np.testing.assert_allclose(np.sort(lr.measured_omega2), np.repeat(lr.omega2, 2), rtol=1e-6)
    assert CRITERIA[2].decide(Interval(lr.max_error, 0.0, lr.max_error, 0.99, 4,
                                       np.zeros(1))) == YES
    # the same map in attention coordinates (rho, rho_dot), D = 2N: the directions off the
    # simplex are annihilated (eigenvalue 0, left out) and nothing changes
    B = np.kron(np.eye(2), QR)
    att = linear_response(B @ J @ B.T, rs, e, 1.0, step=0.25,
                          readout=np.concatenate([np.eye(5), np.zeros((5, 5))], 1))
    np.testing.assert_allclose(att.measured, lr.measured, rtol=1e-9)
    assert att.max_error < 1e-6 and att.n_unmatched == 0


@pytest.mark.slow
@pytest.mark.parametrize("name, m, gamma", [("shannon", 1.0, 0.3), ("kaniadakis", 0.0, 1.0),
                                            ("tsallis", 0.3, 1.0)])
def test_linear_response_more_regimes(name, m, gamma):
    """Shannon under-damped (one stiffness T: all modes share rate and frequency), the
    first-order map of the overdamped flow (m = 0 fitted), Tsallis 0.7 spread spectrum:
    errors below 1e-6."""
    e = {"shannon": fd.Shannon(), "kaniadakis": fd.Kaniadakis(0.3),
         "tsallis": fd.Tsallis(0.7)}[name]
    J, rs, R = _step_jacobian(e, m, gamma, 0.25)
    lr = linear_response(J, rs, e, 1.0, step=0.25, readout=R)
    assert abs(lr.mass - m) < 1e-6 and abs(lr.damping - gamma) < 1e-6
    assert lr.max_error < 1e-6 and lr.n_unmatched == 0
    if name == "shannon":
        np.testing.assert_allclose(lr.omega2, 1.0, rtol=1e-10)
        np.testing.assert_allclose(lr.measured_omega2, 1.0, rtol=1e-6)


def test_linear_response_finds_a_fast_partner_below_attention_tol():
    """Near the overdamped limit (Tsallis 1.5 on five keys of full support, m = 0.05,
    gamma = 1: fast roots near gamma/m = 20) a fast root's eigenvector is mostly velocity,
    at most 0.055 of the largest attention component here; in a trained loop whose residual
    stream responds to it, far less, below `attention_tol`. With `attention_tol = 0.1` every
    fast root is left out and only the four slow roots (>= 0.38) are measured; the fast
    partner of the slowest mode is still found among the eigenvectors above round-off, so
    (m, gamma) come back to 1e-3 and the other slow rates are predicted to 1e-3 (the
    finite-difference Jacobian of this stiff map is good to ~1e-4), where a first-order fit
    misses them by more than 1 % (inertia adds m omega^2 / gamma^2 ~ 2-5 % to the rates)."""
    e, z = fd.Tsallis(1.5), np.array([0.6, 0.3, 0.0, -0.3, -0.5])
    J, rs, R = _step_jacobian(e, 0.05, 1.0, 0.25, z=z)
    lr = linear_response(J, rs, e, 1.0, step=0.25, readout=R, scores=z, attention_tol=0.1)
    assert len(lr.measured) == 4 and np.all(lr.measured.real > -10)
    assert abs(lr.mass / 0.05 - 1) < 1e-3 and abs(lr.damping - 1) < 1e-3
    assert lr.max_error < 1e-3
    first = linear_response(J, rs, e, 1.0, step=0.25, readout=R, scores=z,
                            attention_tol=0.1, first_order=True)
    assert first.max_error > 0.01


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_linear_response_random_contraction_fails(seed):
    """Random contractions (spectral radius 0.9) on the same state spaces: their rates are
    not those of any (m, gamma) of the family, the error exceeds the 20% criterion."""
    rho = np.asarray(fd.stationary(fd.Kaniadakis(0.3), ZR, 1.0))
    rng = np.random.default_rng(seed)
    for D, R in [(4, QR), (8, np.concatenate([QR, np.zeros((5, 4))], 1))]:
        A = rng.normal(size=(D, D))
        A *= 0.9 / np.max(np.abs(np.linalg.eigvals(A)))
        lr = linear_response(A, rho, fd.Kaniadakis(0.3), 1.0, step=0.25, readout=R)
        assert lr.max_error > 0.2 and not lr.within_20


def test_linear_response_of_an_expanding_map_is_not_evaluable():
    """The library's step map scaled by 1.05 (spectral radius above 1, as measured on
    trained looped transformers whose residual stream does not settle): its slowest mode
    grows, there is no fixed point to linearize at, so the comparison is not evaluable (NaN,
    with the modulus 1.05 in the reason), never an error of 1 read as a NO."""
    e = fd.Kaniadakis(0.3)
    J, rs, R = _step_jacobian(e, 1.0, 2.0, 0.25)
    lam = np.linalg.eigvals(J)
    J = J * 1.05 / np.max(np.abs(lam))
    lr = linear_response(J, rs, e, 1.0, step=0.25, readout=R)
    assert lr.measured[0].real > 0 and np.isnan(lr.max_error) and np.isnan(lr.damping)
    assert "1.05 >= 1" in lr.not_evaluable and not lr.within_20
    ok = linear_response(_step_jacobian(e, 1.0, 2.0, 0.25)[0], rs, e, 1.0, step=0.25,
                         readout=R)
    assert ok.not_evaluable is None


# --------------------------------------------------------------------------- held-out

TH = np.arange(13) * 0.5
TRAIN = np.arange(P_) < 6  # 6 fitting, 6 held-out problems (two per unit)


def test_companion_flow_matches_expm():
    """The closed-form flow of u'' + b u' + a u = 0 against scipy's matrix exponential of
    the companion matrix, under-, over- and (nearly) critically damped: 1e-13."""
    for a, b in [(2.0, 1.0), (0.25, 1.0), (0.25 + 1e-7, 1.0), (0.1, 3.0)]:
        for t in (0.0, 0.5, 3.0):
            E = expm(np.array([[0.0, 1.0], [-a, -b]]) * t)
            p = _companion_flow(jnp.asarray(a), jnp.asarray(b), jnp.asarray(t))
            np.testing.assert_allclose(np.asarray(p), E[0], rtol=0, atol=1e-13)


def test_heldout_refuses_bad_splits():
    """Splits that leave nothing to fit or predict are refused before any compilation."""
    paths = np.full((4, 6, 3), 1 / 3)
    for kw in [dict(train=np.ones(4, bool), n_early=3), dict(train=np.arange(4) < 2, n_early=6),
               dict(train=np.arange(4) < 2, n_early=2)]:
        with pytest.raises(ValueError):
            heldout_prediction(paths, np.arange(6.0), np.zeros((4, 3)), fd.Shannon(), **kw)


@pytest.mark.slow
def test_heldout_fisher_paths_prefer_fisher():
    """Paths of simulate (Kaniadakis 0.3, m = 0.5, gamma = 1, T = 0.8, zero initial
    velocity): the shared-parameter Fisher fit recovers (m, gamma, T) to 1e-4 (the data are
    exact), predicts the held-out problems' later loops best, and its ratio to the best
    baseline lies in the YES region (<= 0.9)."""
    e = fd.Kaniadakis(0.3)
    tr = fd.simulate(e, Z, 0.8, mass=0.5, damping=1.0, rho0=R0, t1=TH[-1], saveat=TH,
                     rtol=1e-10, atol=1e-12)
    hp = heldout_prediction(np.asarray(tr.rho), TH, Z, e, train=TRAIN, n_early=6, units=UNITS)
    np.testing.assert_allclose(hp.fisher_params, (0.5, 1.0, 0.8), rtol=1e-4)
    assert hp.best == "fisher" and hp.rms["fisher"].high < 1e-4
    assert hp.ratio.high <= 0.9 and CRITERIA[3].decide(hp.ratio) == YES
    assert hp.rms["linear"].estimate > 10 * hp.rms["fisher"].estimate


@pytest.mark.slow
def test_heldout_linear_paths_prefer_linear():
    """Paths of the linear score-space baseline (a = 2, b = 1, T = 0.8, softmax readout):
    the baseline recovers its parameters to 1e-4 and wins; the Fisher ratio lies in the NO
    region (>= 1)."""
    lin, _ = _linear_paths(jnp.log(jnp.array([2.0, 1.0, 0.8])), fd.Shannon(), jnp.asarray(Z),
                           jnp.asarray(R0), jnp.zeros((P_, N_)), jnp.asarray(TH), "softmax")
    hp = heldout_prediction(np.asarray(lin), TH, Z, fd.Shannon(), train=TRAIN, n_early=6,
                            units=UNITS)
    np.testing.assert_allclose(hp.linear_params, (2.0, 1.0, 0.8), rtol=1e-4)
    assert hp.best == "linear" and hp.ratio.low >= 1.0
    assert CRITERIA[3].decide(hp.ratio) == NO


def test_heldout_refuses_bad_temperature_and_noise_floor():
    """A fixed temperature must be positive and finite, the noise floor positive: refused
    before any compilation."""
    paths = np.full((4, 6, 3), 1 / 3)
    kw = dict(train=np.arange(4) < 2, n_early=3)
    for bad in [dict(temperature=0.0), dict(temperature=np.nan), dict(noise_floor=0.0)]:
        with pytest.raises(ValueError):
            heldout_prediction(paths, np.arange(6.0), np.zeros((4, 3)), fd.Shannon(), **kw,
                               **bad)


def _noisy(rho, sigma, seed):
    """Gaussian noise of sd sigma on sqrt(rho), renormalized (the calibration's noise)."""
    x = np.sqrt(rho) + sigma * np.random.default_rng(seed).normal(size=rho.shape)
    return x * x / np.sum(x * x, -1, keepdims=True)


LIK_P = 24
_lrng = np.random.default_rng(11)
LIK_Z = 1.5 * _lrng.normal(size=(LIK_P, N_))
LIK_R0 = _lrng.dirichlet(2 * np.ones(N_), size=LIK_P)
LIK_T = np.arange(9) * 0.25  # the calibration's first L + 1 loops at c/L = 2/8
LIK = dict(train=np.arange(LIK_P) % 2 == 0, n_early=5, units=np.arange(LIK_P) // 6,
           linear_readout="family", temperature=1.0, lm_steps=30, max_steps=1024, rtol=1e-5,
           level=CRITERION_LEVEL, n_boot=500)


@pytest.mark.slow
def test_heldout_likelihood_says_yes_on_noisy_fisher_paths():
    """Tsallis(1.5) paths of simulate (m = 0.02, gamma = 1, T = 1, from rest) with noise
    sigma = 0.01 in sqrt(rho): the noise estimate lies within 25% of the true sigma (the
    fit absorbs a few degrees of freedom and the renormalization some variance), the
    fitted gamma within 5% of 1, and the mean log-likelihood ratio per held-out problem
    against the best baseline lies in the YES region (>= 2), where the rms ratio tends to 1
    as the noise dominates both errors."""
    e = fd.Tsallis(1.5)
    tr = fd.simulate(e, LIK_Z, 1.0, mass=0.02, damping=1.0, rho0=LIK_R0, t1=LIK_T[-1],
                     saveat=LIK_T, rtol=1e-10, atol=1e-12)
    hp = heldout_prediction(_noisy(np.asarray(tr.rho), 0.01, 0), LIK_T, LIK_Z, e, **LIK)
    assert 0.75 * 0.01 <= hp.noise <= 1.25 * 0.01
    assert abs(hp.fisher_params[1] - 1.0) < 0.05 and hp.fisher_params[2] == 1.0
    assert hp.loglik_ratio.low >= 2.0
    from weight_tied.protocol import PROTOCOL_CRITERIA

    crit = {c.name: c for c in PROTOCOL_CRITERIA}["heldout_likelihood"]
    assert crit.decide(hp.loglik_ratio) == YES


@pytest.mark.slow
def test_heldout_likelihood_says_no_on_noisy_score_relaxation():
    """Tsallis(1.5) attention of scores that relax at first order, z = z* + (z0 - z*)e^{-t}
    (written here, not with the module's closed form), with noise sigma = 0.01: the
    relaxation baseline recovers its rate to 5%, and the log-likelihood ratio lies in the
    NO region (<= -2)."""
    e = fd.Tsallis(1.5)
    z0 = np.asarray(e.G(LIK_R0))
    z = LIK_Z[:, None] + (z0 - LIK_Z)[:, None] * np.exp(-LIK_T)[None, :, None]
    rho = np.asarray(fd.stationary(e, z, 1.0))
    np.testing.assert_allclose(rho[:, 0], LIK_R0, atol=1e-9)  # the path starts at rho0
    hp = heldout_prediction(_noisy(rho, 0.01, 1), LIK_T, LIK_Z, e, **LIK)
    assert 0.75 * 0.01 <= hp.noise <= 1.25 * 0.01
    assert abs(hp.relaxation_params[0] - 1.0) < 0.05 and hp.relaxation_params[1] == 1.0
    assert hp.loglik_ratio.high <= -2.0
    # the relaxation model's held-out error is at the noise: sum of squares ~ sigma^2 dof
    dof = (len(LIK_T) - 5) * (N_ - 1)
    assert np.mean(hp.sq_error["relaxation"]) < 1.5 * 0.01**2 * dof


@pytest.mark.slow
def test_linear_response_sparse_fixed_point():
    """Tsallis 1.5 with a sparse fixed point: the step map of simulate on the support
    (perturbations that keep the zeros at zero; the sphere chart keeps x_i = 0 invariant)
    is predicted from the modes of the support to 1e-6."""
    e, z = fd.Tsallis(1.5), np.array([1.0, 0.8, 0.3, -1.5, -2.0])
    rs = np.asarray(fd.stationary(e, z, 1.0))
    act = rs > 0
    assert 2 < act.sum() < 5
    Qs = np.zeros((5, act.sum() - 1))
    Qs[act] = np.asarray(tangent_basis(jnp.ones(act.sum()) / np.sqrt(act.sum())))
    n, eps, h = Qs.shape[1], 1e-5, 0.25
    dirs = np.concatenate([np.eye(2 * n), -np.eye(2 * n)]) * eps
    tr = fd.simulate(e, np.broadcast_to(z, (4 * n, 5)), 1.0, mass=1.0, damping=1.5,
                     rho0=rs + dirs[:, :n] @ Qs.T, velocity0=dirs[:, n:] @ Qs.T, t1=h,
                     saveat=np.array([h]), rtol=1e-12, atol=1e-14, solver="dopri8")
    out = np.concatenate([(np.asarray(tr.rho_final) - rs) @ Qs,
                          np.asarray(tr.rho_dot_final) @ Qs], -1)
    J = ((out[:2 * n] - out[2 * n:]) / (2 * eps)).T
    lr = linear_response(J, rs, e, 1.0, step=h,
                         readout=np.concatenate([Qs, np.zeros((5, n))], 1), scores=z)
    assert abs(lr.mass - 1) < 1e-6 and abs(lr.damping - 1.5) < 1e-6
    assert lr.max_error < 1e-6 and lr.n_unmatched == 0 and len(lr.omega2) == n


# --------------------------------------------------------------------------- what they follow


def _head_paths(kind):
    """(P, K, N) paths on LIK_T of one synthetic head relaxing to Tsallis(1.5)'s stationary
    law of LIK_Z: the family's own Fisher dynamics (simulate, m = 0.02, gamma = 1, from rest)
    or a first-order relaxation of the scores (closed form written here)."""
    e = fd.Tsallis(1.5)
    if kind == "fisher":
        return np.asarray(fd.simulate(e, LIK_Z, 1.0, mass=0.02, damping=1.0, rho0=LIK_R0,
                                      t1=LIK_T[-1], saveat=LIK_T, rtol=1e-10,
                                      atol=1e-12).rho)
    z0 = np.asarray(e.G(LIK_R0))
    z = LIK_Z[:, None] + (z0 - LIK_Z)[:, None] * np.exp(-LIK_T)[None, :, None]
    return np.asarray(fd.stationary(e, z, 1.0))


@pytest.mark.slow
def test_follow_names_the_dynamics_that_made_each_head():
    """The study's "what they follow" on two synthetic heads of one Tsallis(1.5) model,
    noise sigma = 0.01 in sqrt(rho): the head made by Tsallis' Fisher dynamics is best
    described by the Tsallis Fisher model (not Shannon's or Kaniadakis', fitted toward the
    same fixed-point attention), the head made by a first-order score relaxation by the
    relaxation baseline, each with a positive margin over the runner-up; the group
    summary counts one of each."""
    from weight_tied import study

    e = fd.Tsallis(1.5)
    heads = [_noisy(_head_paths(k), 0.01, 5 + i) for i, k in enumerate(("fisher", "linear"))]
    attn = np.stack(heads, 1)  # (P, H, K, N)
    L = len(LIK_T) - 1
    train = LIK["train"]
    own = [heldout_prediction(attn[:, h], LIK_T, LIK_Z, e, train=train, n_early=L // 2 + 1,
                              velocity="zero", linear_readout="family", temperature=1.0,
                              **study.HELDOUT) for h in range(2)]
    d = dict(attn=attn, t=LIK_T, velocity="zero", heldout_likelihood=own)
    rho_fp = np.broadcast_to(np.asarray(fd.stationary(e, LIK_Z, 1.0))[:, None],
                             (LIK_P, 2, N_))
    out = study.follow(fd, d, rho_fp, np.ones(2), train, L, 0, e)
    assert out[0]["best"] == "Fisher Tsallis" and out[1]["best"] == "relaxation"
    assert all(o["margin"] > 0 for o in out)
    s = study.follow_summary([dict(follow=out)])
    assert s["heads"] == 2 and s["best_counts"]["Fisher Tsallis"] == 1
    assert s["best_counts"]["relaxation"] == 1


# ------------------------------------------------------- linear response with score feedback

_H = {"kaniadakis": lambda r, k=0.3: -((1 + k) * r**k - (1 - k) * r ** (-k)) / (2 * k),
      "shannon": lambda r: -(1 + np.log(r))}


def _feedback_step_jacobian(name, entropy, C, m, gamma, h, eps=1e-6):
    """The step map over time h at the fixed point of the simplex-chart equation (docs/math.md
    §6, written here in numpy) whose scores respond to the attention,
    z = z* + C (rho - rho*): central differences of scipy DOP853 solves (rtol 1e-13) in the
    coordinates (a, b) of the tangent space, as `_step_jacobian`. Independent of the
    library's integrator and of the stiffness formula under test."""
    rs = np.asarray(fd.stationary(entropy, ZR, 1.0))
    N, n = len(ZR), len(ZR) - 1

    def f(t, y):
        r, v = y[:N], y[N:]
        g = -(ZR + C @ (r - rs)) - _H[name](r)
        lam = r @ g - 0.5 * m * np.sum(v * v / r)
        return np.concatenate([v, r * (lam - g) / m - gamma / m * v + 0.5 * v * v / r])

    cols = []
    for j in range(2 * n):
        d = np.zeros(2 * n)
        d[j] = eps
        ends = [solve_ivp(f, (0, h), np.concatenate([rs + s * QR @ d[:n], s * QR @ d[n:]]),
                          method="DOP853", rtol=1e-13, atol=1e-15).y[:, -1] for s in (1, -1)]
        ends = [np.concatenate([(y[:N] - rs) @ QR, y[N:] @ QR]) for y in ends]
        cols.append((ends[0] - ends[1]) / (2 * eps))
    return np.array(cols).T, rs, np.concatenate([QR, np.zeros((N, n))], 1)


def _symmetric_feedback(entropy, rs, strength, seed=0):
    """C = strength T diag(sqrt G') W diag(sqrt G') (T = 1), W symmetric of spectral norm 1:
    X C X is `strength` times the stiffness operator's own scale, so any strength < 1 keeps
    the fixed point stable."""
    W = np.random.default_rng(seed).normal(size=(len(rs), len(rs)))
    W = (W + W.T) / 2
    W /= np.linalg.norm(W, 2)
    sg = np.sqrt(np.asarray(entropy.G_prime(jnp.asarray(rs))))
    return strength * sg[:, None] * W * sg[None, :]


@pytest.mark.parametrize("name,gamma", [("kaniadakis", 2.0), ("shannon", 2.5)])
@pytest.mark.parametrize("strength", [0.2, 0.5])
def test_linear_response_with_feedback_predicts_the_coupled_loop(name, gamma, strength):
    """A damped Fisher loop whose scores respond to its attention (m = 1, h = 0.25): with
    `feedback=C` the fitted (m, gamma) come back to 1e-6 and every other rate is predicted
    to 1e-6 (measured 1e-9: the finite differences' accuracy); the plain criterion, which
    assumes scores that do not respond, says NO (error 1: a regime it gets wrong) on the
    same map. Shannon's feedback also breaks its isotropy (one stiffness for every mode)."""
    e = fd.Kaniadakis(0.3) if name == "kaniadakis" else fd.Shannon()
    rs = np.asarray(fd.stationary(e, ZR, 1.0))
    C = _symmetric_feedback(e, rs, strength)
    J, rs, R = _feedback_step_jacobian(name, e, C, 1.0, gamma, 0.25)
    fb = linear_response(J, rs, e, 1.0, step=0.25, readout=R, feedback=C)
    assert abs(fb.mass - 1) < 1e-6 and abs(fb.damping - gamma) < 1e-6
    assert fb.max_error < 1e-6 and fb.within_20 and fb.n_unmatched == 0
    plain = linear_response(J, rs, e, 1.0, step=0.25, readout=R)
    assert plain.max_error > 0.2 and not plain.within_20
    if name == "shannon":
        assert np.ptp(fb.omega2) > 0.1  # no longer T for every mode


def test_feedback_stiffness_without_feedback_is_the_relaxation_spectrum():
    """C = 0 gives `relaxation_spectrum`'s stiffnesses (to 1e-15) and the same eigenspaces."""
    e = fd.Kaniadakis(0.3)
    rs = np.asarray(fd.stationary(e, ZR, 1.0))
    w, V = feedback_stiffness(e, rs, 1.0, np.zeros((5, 5)))
    sp = fd.relaxation_spectrum(e, ZR, 1.0, mass=1.0, damping=1.0)
    np.testing.assert_allclose(w, np.asarray(sp.omega2), atol=1e-14)
    M = np.asarray(sp.modes)
    np.testing.assert_allclose(np.abs(np.sum(V * M, 0)), 1.0, atol=1e-10)


def test_linear_response_feedback_is_checked():
    """A feedback matrix of the wrong shape, with NaN, or not symmetric is refused, and so is
    a loop map with NaN (a diverged model's Jacobian must not be read as evidence)."""
    e = fd.Kaniadakis(0.3)
    J, rs, R = _step_jacobian(e, 1.0, 2.0, 0.25)
    for C, msg in ((np.zeros((4, 4)), "must be"), (np.full((5, 5), np.nan), "non-finite"),
                   (np.triu(np.ones((5, 5))), "symmetric")):
        with pytest.raises(ValueError, match=msg):
            linear_response(J, rs, e, 1.0, step=0.25, readout=R, feedback=C)
    with pytest.raises(ValueError, match="finite"):
        linear_response(np.where(np.eye(len(J)) > 0, np.nan, J), rs, e, 1.0, step=0.25,
                        readout=R)
