"""Property-based fuzz of the public API (hypothesis): nothing silently wrong.

Every family, with parameters drawn across their whole range and near its edges (q -> 1,
|kappa| -> 1, Abe's q -> 1 and far from it, q > 2 ...), scores from 1e-3 to 1e4 in spread,
gaussian, heavy-tailed or tied, T over four decades, masked keys (holding garbage: large
finite values, NaN, +inf) and -inf keys, float64 / float32 / bfloat16. Each property holds
for every draw or the call raises; none may return a wrong number.

Two profiles. `CI` (the default suite) is derandomized, so a run is reproducible, and small
(about 2 minutes in all on two cores). `LONG` (`-m slow`) draws afresh and many times more. Both print how
many examples ran (`pytest -s`). Problems are padded to a fixed width with masked keys, and
family parameters are traced arrays, so each property compiles once per family and dtype.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st

import fisherdyn as fd

WIDTH = 12  # every drawn row is padded with masked keys to this width
ROWS = 3
CI = settings(max_examples=15, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
LONG = settings(CI, max_examples=400, derandomize=False)
COUNTS: collections.Counter = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _print_counts():
    yield
    for k, v in sorted(COUNTS.items()):
        print(f"fuzz examples {k}: {v}")


# ---------------------------------------------------------------------------- strategies


def _near_one(lo, hi):
    """Parameters over [lo, hi] without 1, with draws piled up near 1 from both sides."""
    gaps = st.sampled_from([1e-6, 1e-4, 1e-2]).flatmap(
        lambda g: st.sampled_from([1 + g, 1 - g]))
    spread = st.floats(lo, hi).filter(lambda q: abs(q - 1) > 1e-3)
    return st.one_of(gaps, spread, st.sampled_from([lo, hi]))


FAMILIES = {
    # name: (constructor, strategy of its parameters, cutoff possible)
    "shannon": (lambda: fd.Shannon(), st.just(())),
    "tsallis": (fd.Tsallis, st.tuples(_near_one(0.1, 6.0))),
    "renyi": (fd.Renyi, st.tuples(_near_one(0.2, 4.0))),
    "sharma_mittal": (fd.SharmaMittal, st.tuples(_near_one(0.3, 3.0), _near_one(0.3, 3.0))),
    "kaniadakis": (fd.Kaniadakis, st.tuples(
        st.one_of(st.floats(0.01, 0.95), st.sampled_from([1e-3, 0.99])).flatmap(
            lambda k: st.sampled_from([k, -k])))),
    "burg": (lambda: fd.Burg(), st.just(())),
    "abe": (fd.Abe, st.tuples(st.one_of(_near_one(0.1, 10.0), st.just(1.0000001)))),
}
DENSE = ("shannon", "kaniadakis", "burg", "abe")  # never a cutoff: full support


@st.composite
def problems(draw, dense_only=False, max_spread=4.0):
    """(family name, parameters, scores, keep, T): ROWS rows of WIDTH keys, each row with
    1..WIDTH kept keys at random positions; the rest masked (garbage) or -inf."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    log_spread = draw(st.floats(-3.0, max_spread))
    kind = draw(st.sampled_from(["gaussian", "cauchy", "ties", "one_far"]))
    z = rng.standard_cauchy((ROWS, WIDTH)) if kind == "cauchy" else rng.normal(size=(ROWS, WIDTH))
    if kind == "ties":
        z = np.round(z * 2) / 2
    if kind == "one_far":  # a planted key far above the rest
        z[:, 0] += 10.0
    z = z / max(np.ptp(z), 1e-12) * 10.0**log_spread
    n_keep = draw(st.lists(st.integers(1, WIDTH), min_size=ROWS, max_size=ROWS))
    keep = np.zeros((ROWS, WIDTH), bool)
    for r, n in enumerate(n_keep):
        keep[r, rng.permutation(WIDTH)[:n]] = True
    garbage = draw(st.sampled_from([1e30, np.nan, np.inf, -np.inf]))
    z = np.where(keep, z, garbage)
    log_T = draw(st.lists(st.floats(-2.0, 2.0), min_size=ROWS, max_size=ROWS))
    T = 10.0 ** np.asarray(log_T)[:, None]
    names = DENSE if dense_only else tuple(FAMILIES)
    name = draw(st.sampled_from(names))
    params = draw(FAMILIES[name][1])
    if dense_only and name == "kaniadakis":
        params = (float(np.clip(params[0], -0.9, 0.9)),)
    note(f"{name}{params} kind={kind} spread=1e{log_spread:.2f} T={T.ravel()}")
    return name, params, z, keep, T


def family(name, params, dtype=jnp.float64):
    """The family with traced parameters (one compilation for every drawn value)."""
    return FAMILIES[name][0](*(jnp.asarray(p, dtype) for p in params))


def kkt_residual(entropy, z, keep, T, rho):
    """The stationarity conditions of the free energy, checked with autodiff of the
    family's own entropy value S(rho) (not the solver's inverse law): on the support
    z_i + T dS/drho_i is one constant lambda; off it (a cutoff) z_i + T dS/drho_i <= lambda.
    Returns the worst violation relative to the size of the terms."""
    worst = 0.0
    for r in range(z.shape[0]):
        k = keep[r] & np.isfinite(z[r])
        if not k.any():
            continue
        g = np.asarray(jax.grad(lambda p: entropy.value(p, mask=jnp.asarray(k)))(
            jnp.asarray(rho[r])))
        on = k & (rho[r] > 1e-200)  # below, float64 carries too few digits of rho_i
        terms = z[r][on] + T[r, 0] * g[on]
        lam = np.median(terms)
        scale = np.abs(z[r][on]) + T[r, 0] * np.abs(g[on]) + abs(lam) + T[r, 0]
        worst = max(worst, np.max(np.abs(terms - lam) / scale))
        off = k & (rho[r] == 0)
        if off.any():
            # a zero weight of a dense family is an underflow: its score sits far below lambda
            gap = z[r][off] - lam
            worst = max(worst, np.max(np.maximum(gap, 0.0) / (np.abs(lam) + T[r, 0] +
                                                                np.abs(z[r][off]))))
    return worst


# ----------------------------------------------------------------------------- properties


def check_stationary_float64(problem):
    name, params, z, keep, T = problem
    e = family(name, params)
    rho = np.asarray(fd.stationary(e, jnp.asarray(z), jnp.asarray(T), mask=jnp.asarray(keep)))
    live = keep & (z > -np.inf)
    assert np.all(np.isfinite(rho)) and np.all(rho >= 0)
    assert np.all(rho[~live] == 0.0)  # masked and -inf keys: exactly zero
    sums = rho.sum(-1)
    has = live.any(-1)
    # 1e-12: the solvers normalize to round-off (N = 12 terms of float64)
    assert np.all(np.abs(sums[has] - 1) <= 1e-12), sums
    assert np.all(sums[~has] == 0.0)
    # 1e-9 relative to the terms' size: the KKT terms carry the weights' round-off times
    # the entropy's curvature, e.g. T / rho for Burg (measured up to ~1e-12)
    assert kkt_residual(e, z, live, T, rho) <= 1e-9
    return rho


def check_low_precision(problem, dtype):
    name, params, z, keep, T = problem
    live = keep & (z > -np.inf)
    zc = np.where(live, z, 0.0).astype(np.float32)  # low-precision callers pad with finite values
    e = family(name, params, jnp.float32)
    rho = fd.stationary(e, jnp.asarray(zc, dtype), jnp.asarray(T, dtype), mask=jnp.asarray(live))
    assert rho.dtype == dtype
    rho = np.asarray(rho, np.float64)
    assert np.all(np.isfinite(rho)) and np.all(rho >= 0)
    assert np.all(rho[~live] == 0.0)
    has = live.any(-1)
    # float32: 1e-5 (12 terms of 6e-8, plus the final normalization); bfloat16 output: each
    # weight rounded to 8 bits, 12 of them: 2e-2
    bound = 1e-5 if dtype == jnp.float32 else 2e-2
    assert np.all(np.abs(rho.sum(-1)[has] - 1) <= bound)
    # Against the float64 solve of the same rounded scores and T, where the problem is well
    # conditioned in float32 (spread / T <= 100: float32 arithmetic moves the exponent by at
    # most ~100 x 6e-8): 2e-3 absolute on float32, 2e-2 on bfloat16 (its output rounding).
    cond = np.ptp(np.where(live, zc, 0.0), axis=-1) / T[:, 0] <= 100.0
    # Sharma-Mittal within 1e-3 of q = 1 in float32 is a documented limit (the threshold
    # Newton's slope cancels like 1/(q-1)^2; docs/guides/operators.md): float64 there
    near_one_sm = name == "sharma_mittal" and abs(params[0] - 1) < 1e-3
    if cond.any() and not near_one_sm:
        # the reference solves the inputs as rounded to `dtype` (bfloat16 keeps 8 bits)
        zr = np.asarray(jnp.asarray(zc, dtype), np.float64)
        Tr = np.asarray(jnp.asarray(T, dtype), np.float64)
        ref = np.asarray(fd.stationary(family(name, params), jnp.asarray(zr), jnp.asarray(Tr),
                                       mask=jnp.asarray(live)))
        tol = 2e-3 if dtype == jnp.float32 else 2e-2
        if name in ("tsallis", "renyi", "sharma_mittal") and params[0] > 2:
            # q > 2: the weights near the support's edge go as (z - lambda)^(1/(q-1)), only
            # Hoelder-continuous, so an arithmetic error e in the scores moves them by ~e^p
            e = WIDTH * float(jnp.finfo(jnp.float32).eps) * np.max(np.abs(zr)) / Tr.min()
            tol += 3 * e ** (1 / (params[0] - 1))
        assert np.max(np.abs(rho - ref)[cond]) <= tol


def check_bad_input_raises(problem):
    """A NaN or +inf on a kept key, or T <= 0 / NaN, raises; never a number."""
    name, params, z, keep, T = problem
    e = family(name, params)
    z = np.where(keep, z, 0.0)
    r, c = np.argwhere(keep)[0]
    for bad in (np.nan, np.inf):
        zb = z.copy()
        zb[r, c] = bad
        with pytest.raises(Exception, match="NaN or \\+inf"):
            jax.block_until_ready(fd.stationary(e, jnp.asarray(zb), jnp.asarray(T),
                                                mask=jnp.asarray(keep)))
    for bad_T in (0.0, -1.0, np.nan):
        Tb = T.copy()
        Tb[0, 0] = bad_T
        with pytest.raises(Exception, match="T must be finite and > 0"):
            jax.block_until_ready(fd.stationary(e, jnp.asarray(z), jnp.asarray(Tb),
                                                mask=jnp.asarray(keep)))


def check_jvp_against_differences(problem):
    """The custom JVP (implicit function theorem) against central differences of the
    operator itself, in a random direction of the kept scores and of T."""
    name, params, z, keep, T = problem
    e = family(name, params)
    live = keep & (z > -np.inf)
    z = np.where(live, z, 0.0)
    rng = np.random.default_rng(0)
    dz = np.where(live, rng.normal(size=z.shape), 0.0)
    dT = T * rng.normal(size=T.shape) * 0.1
    f = lambda z, T: np.asarray(fd.stationary(e, jnp.asarray(z), jnp.asarray(T),  # noqa: E731
                                              mask=jnp.asarray(live)))
    _, tangent = jax.jvp(lambda z, T: fd.stationary(e, z, T, mask=jnp.asarray(live)),
                         (jnp.asarray(z), jnp.asarray(T)), (jnp.asarray(dz), jnp.asarray(dT)))
    tangent = np.asarray(tangent)
    # a step on the scale of the smallest T (the weights move on the scale z / T):
    # truncation ~ eps^2 / T^3 ~ 1e-10 / T and round-off ~ 1e-16 / eps, both <= 1e-8 here
    eps = 1e-5 * T.min()
    num = (f(z + eps * dz, T + eps * dT) - f(z - eps * dz, T - eps * dT)) / (2 * eps)
    np.testing.assert_allclose(tangent, num, rtol=0, atol=1e-6 * (1 + np.abs(tangent).max()))


def check_fenchel_young(problem):
    """L >= 0, L = 0 at the target rho(z), and dL/dz = rho(z) - y by differences."""
    name, params, z, keep, T = problem
    e = family(name, params)
    live = keep & (z > -np.inf)
    z = np.where(live, z, 0.0)
    rng = np.random.default_rng(1)
    y = np.where(live, rng.dirichlet(np.ones(WIDTH), size=ROWS), 0.0)
    y = y / np.where(live.any(-1, keepdims=True), y.sum(-1, keepdims=True), 1.0)
    m = jnp.asarray(live)
    loss = lambda z, y: fd.fenchel_young_loss(e, z, y, jnp.asarray(T), mask=m)  # noqa: E731
    L = np.asarray(loss(jnp.asarray(z), jnp.asarray(y)))
    rho = np.asarray(fd.stationary(e, jnp.asarray(z), jnp.asarray(T), mask=m))
    L0 = np.asarray(loss(jnp.asarray(z), jnp.asarray(rho)))
    scale = np.max(np.abs(z), -1) + T[:, 0] * np.log(WIDTH) + 1.0
    # round-off of a sum of O(scale) terms: 1e-10 relative
    assert np.all(L >= -1e-10 * scale), L
    assert np.all(np.abs(L0) <= 1e-10 * scale), L0
    dz = np.where(live, rng.normal(size=z.shape), 0.0)
    h = 1e-6 * T
    num = (np.asarray(loss(jnp.asarray(z + h * dz), jnp.asarray(y)))
           - np.asarray(loss(jnp.asarray(z - h * dz), jnp.asarray(y)))) / (2 * h[:, 0])
    # differences of L carry its round-off over 2h: for the Tsallis-shaped families
    # S = (1 - sum rho^q)/(q - 1) turns the sum's rounding (~N eps) into N eps T / |q - 1|
    near = abs(params[0] - 1) if name in ("tsallis", "renyi", "sharma_mittal") else 1.0
    noise = WIDTH * np.finfo(np.float64).eps * T[:, 0] / near / h[:, 0]
    np.testing.assert_allclose(num, np.sum((rho - y) * dz, -1), rtol=0, atol=1e-6 + noise.max())


def check_relax_padded(problem):
    """The dynamics' fixed point on a padded, masked row equals the stationary operator,
    with exact zeros on masked keys; a run that does not converge says so."""
    name, params, z, keep, T = problem
    e = family(name, params)
    live = keep & (z > -np.inf)
    sol = fd.relax(e, jnp.asarray(z), jnp.asarray(T[:, 0]), mass=0.5, damping=2.0,
                   mask=jnp.asarray(keep), throw=False)
    ok = np.asarray(sol.result == fd.RESULTS.successful)
    rho = np.asarray(sol.rho)
    assert np.all(rho[~live] == 0.0)
    ref = np.asarray(fd.stationary(e, jnp.asarray(z), jnp.asarray(T), mask=jnp.asarray(keep)))
    # polished by Newton to 1e-12: 1e-9 absolute on the weights
    if ok.any():
        np.testing.assert_allclose(rho[ok], ref[ok], rtol=0, atol=1e-9)
    assert np.all(np.isfinite(rho[ok]))
    return ok


# ---------------------------------------------------------------------------------- tests


def _run(profile, key, check, strategy):
    @profile
    @given(strategy)
    def test(problem):
        COUNTS[key] += 1
        check(problem)

    test()


PROPERTIES = {
    "stationary_float64": (check_stationary_float64, problems()),
    "stationary_float32": (lambda p: check_low_precision(p, jnp.float32), problems()),
    "stationary_bfloat16": (lambda p: check_low_precision(p, jnp.bfloat16), problems()),
    "bad_input_raises": (check_bad_input_raises, problems()),
    "jvp": (check_jvp_against_differences, problems(dense_only=True, max_spread=1.0)),
    "fenchel_young": (check_fenchel_young, problems(max_spread=2.0)),
}


@pytest.mark.parametrize("key", list(PROPERTIES))
def test_fuzz(key):
    _run(CI, key, *PROPERTIES[key])


@pytest.mark.slow
@pytest.mark.parametrize("key", list(PROPERTIES))
def test_fuzz_long(key):
    _run(LONG, key, *PROPERTIES[key])


def test_fuzz_relax_padded():
    # the dynamics compile per family: fewer examples, dense spreads where the flow is fast
    _run(settings(CI, max_examples=6), "relax", check_relax_padded,
         problems(max_spread=1.0))


@pytest.mark.slow
def test_fuzz_relax_padded_long():
    _run(settings(LONG, max_examples=100), "relax", check_relax_padded,
         problems(max_spread=2.0))
