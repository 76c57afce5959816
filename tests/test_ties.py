"""Tied scores for every family: exact ties, a few distinct values repeated, large N, q up
to 8, float32 and float64.

Every row sums to 1 within its dtype's tolerance, has no negative weight, gives equal
scores equal weights, and matches an independent reference: the closed form 1/N on an
all-tied row, and otherwise an mpmath solve of the stationary law over the distinct values
with their multiplicities (80 digits, so that a threshold within 1e-35 of the top score is
still resolved), or for Renyi / Sharma-Mittal the mpmath Tsallis law at the realized
temperature $T\\phi(M_q(\\rho))$. A row that cannot be represented in its dtype is NaN and
reported by `stationary_info`, never zeros.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
from helpers import (
    RefFamily,
    arr,
    bracket_root,
    jit_branches,
    jit_stationary,
    make,
    record,
    spec_id,
)
from hypothesis import HealthCheck, given, note, settings, strategies as st

import fisherdyn as fd

ROWS, N = 4, 2048  # one shape for every family and dtype: one compilation each
# The weights are normalized by the library's own sum of N terms, which this float64 sum
# differs from by that sum's rounding: float64 1e-12, float32 3e-5 (~250 eps; N up to 1e5).
SUM_TOL = {jnp.float64: 1e-12, jnp.float32: 3e-5}
# an all-tied row: one weight, its rounding and the root's tolerance on the sum (16 eps in
# float32) spread over N equal keys
UNIFORM_RTOL = {jnp.float64: 1e-13, jnp.float32: 2e-5}

# every family, q up to 8 for the moment families
SPECS = [
    ("shannon",),
    ("tsallis", 0.5),
    ("tsallis", 1.2),
    ("tsallis", 1.5),
    ("tsallis", 2.0),
    ("tsallis", 3.0),
    ("tsallis", 4.0),
    ("tsallis", 8.0),
    ("renyi", 0.5),
    ("renyi", 8.0),
    ("sharma_mittal", 0.7, 0.4),
    ("sharma_mittal", 8.0, 3.0),
    ("kaniadakis", 0.3),
    ("kaniadakis", -0.9),
    ("burg",),
    ("abe", 0.5),
    ("abe", 3.0),
]


def _solve(spec, z, T, dtype):
    """The operator on (ROWS, N) rows with traced parameters (compiled once per class)."""
    e = arr(make(spec), dtype)
    return np.asarray(jit_stationary(e, jnp.asarray(z, dtype), jnp.asarray(T, dtype)),
                      np.float64)


# --------------------------------------------------------------------------- the reference


def mp_grouped(spec, values, counts, T):
    """Weights of the distinct scores `values` (each held by `counts` keys) of a separable
    family: T G(rho_g) = v_g + lambda, sum_g counts_g rho_g = 1, by Illinois on -lambda."""
    fam = RefFamily(spec)
    with mp.workdps(80):
        v = [mp.mpf(float(x)) for x in values]
        T = mp.mpf(float(T))
        n = sum(int(c) for c in counts)
        top = max(v)
        a = top - T * fam.G(mp.mpf(1))  # top weight 1
        b = top - T * fam.G(mp.mpf(1) / n)  # top weight 1/n
        f = lambda mu: mp.fsum(int(c) * fam.Ginv((x - mu) / T)  # noqa: E731
                               for x, c in zip(v, counts)) - 1
        mu = bracket_root(f, a, b) if b > a else a
        return np.array([float(fam.Ginv((x - mu) / T)) for x in v])


def reference(spec, values, counts, T, rho_groups):
    """The reference weights per distinct score; Renyi / Sharma-Mittal: the Tsallis law at
    the temperature the solution `rho_groups` realizes (a check of its self-consistency)."""
    if spec[0] not in ("renyi", "sharma_mittal"):
        return mp_grouped(spec, values, counts, T)
    q = spec[1]
    with mp.workdps(80):
        M = mp.fsum(int(c) * mp.mpf(float(r)) ** q for r, c in zip(rho_groups, counts) if r > 0)
        phi = 1 / M if spec[0] == "renyi" else M ** ((q - spec[2]) / (1 - q))
        T_eff = mp.mpf(float(T)) * phi
    return mp_grouped(("tsallis", q), values, counts, T_eff)


# --------------------------------------------------------------------------- the properties


def check_rows(spec, z, T, dtype, rho):
    """Sum, sign, ties and the reference, row by row."""
    eps = float(jnp.finfo(dtype).eps)
    assert np.all(np.isfinite(rho)), "a valid row came back NaN"
    assert np.all(rho >= 0)
    sums = rho.sum(-1)
    record(f"ties |sum - 1| {jnp.dtype(dtype).name}", np.max(np.abs(sums - 1)))
    assert np.all(np.abs(sums - 1) <= SUM_TOL[dtype]), sums
    for r in range(z.shape[0]):
        values, inverse, counts = np.unique(z[r], return_inverse=True, return_counts=True)
        # equal scores, equal weights: the same arithmetic on the same inputs (4 ulps: XLA
        # may evaluate vectorized and remainder keys with differently contracted products)
        lo = np.full(len(values), np.inf)
        hi = np.zeros(len(values))
        np.minimum.at(lo, inverse, rho[r])
        np.maximum.at(hi, inverse, rho[r])
        assert np.all(hi - lo <= 4 * eps * hi), (spec, r)
        if len(values) == 1:
            # the closed form of an all-tied row
            err = np.max(np.abs(rho[r] * z.shape[1] - 1))
            record(f"ties uniform {jnp.dtype(dtype).name}", err)
            assert err <= UNIFORM_RTOL[dtype], (spec, r, err)
            continue
        ref = reference(spec, values, counts, T[r, 0], hi)
        err = np.max(np.abs(hi - ref)) / ref.max()
        if dtype == jnp.float64:
            # the weights carry the scores' rounding times the law's conditioning: 1e-11 of
            # the top weight for spreads up to 1e3 T
            record("ties reference float64", err)
            assert err <= 1e-11, (spec, r, err)
        else:
            # float32 where it is well conditioned (spread / T <= 100, as in test_fuzz): the
            # scores' arithmetic moves the weights by ~100 eps relative; q > 2 weights at the
            # support's edge are Hoelder in that error, (e)^p with p = 1/(q-1)
            cond = np.ptp(z[r]) / T[r, 0]
            if cond > 100:
                continue
            tol = 1e-4
            if spec[0] in ("tsallis", "renyi", "sharma_mittal") and spec[1] > 2:
                tol += 3 * (8 * eps * np.max(np.abs(z[r])) / T[r, 0]) ** (1 / (spec[1] - 1))
            record("ties reference float32", err)
            assert err <= tol, (spec, r, err, tol)


DTYPES = [jnp.float64, jnp.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_all_tied_rows_are_uniform(spec, dtype):
    # the same value on every key (0, a large one, a negative one), T over four decades
    z = np.zeros((ROWS, N)) + np.array([[0.0], [1e3], [-7.3], [0.25]])
    T = np.array([[0.01], [1.0], [100.0], [3.0]])
    z = z.astype(dtype).astype(np.float64)
    check_rows(spec, z, T.astype(dtype).astype(np.float64), dtype, _solve(spec, z, T, dtype))


COUNTS: collections.Counter = collections.Counter()


@st.composite
def tied_problems(draw):
    """ROWS rows of N keys, each holding 1 to 5 distinct values (so hundreds of keys per
    value), one row sometimes with a small group at the top; T over four decades."""
    spec = draw(st.sampled_from(SPECS))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    z = np.empty((ROWS, N))
    for r in range(ROWS):
        k = draw(st.integers(1, 5))
        values = rng.normal(size=k) * 10.0 ** draw(st.floats(-3.0, 3.0))
        z[r] = values[rng.integers(0, k, N)]
        if k > 1 and draw(st.booleans()):  # a few keys above all the others
            z[r, rng.permutation(N)[: draw(st.integers(1, 3))]] = values.max() + np.ptp(values)
    T = 10.0 ** np.asarray(draw(st.lists(st.floats(-2.0, 2.0), min_size=ROWS,
                                         max_size=ROWS)))[:, None]
    z, T = z.astype(dtype).astype(np.float64), T.astype(dtype).astype(np.float64)
    note(f"{spec} {jnp.dtype(dtype).name} T={T.ravel()}")
    return spec, dtype, z, T


@settings(max_examples=24, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck), print_blob=True)
@given(tied_problems())
def test_many_ties(problem):
    spec, dtype, z, T = problem
    COUNTS[spec[0]] += 1
    check_rows(spec, z, T, dtype, _solve(spec, z, T, dtype))


# --------------------------------------------------------------------------- large N


@pytest.mark.parametrize(
    "spec, n, dtype",
    [
        # the reported rows: all zeros (Tsallis 4, 3, 8) or a sum of 1.00136 (Tsallis 2)
        (("tsallis", 4.0), 2048, jnp.float32),
        (("tsallis", 3.0), 100_000, jnp.float32),
        (("tsallis", 2.0), 100_000, jnp.float32),
        (("tsallis", 8.0), 2048, jnp.float64),
        (("tsallis", 8.0), 100_000, jnp.float32),
        (("renyi", 8.0), 100_000, jnp.float32),
    ],
    ids=lambda x: (spec_id(x) if isinstance(x, tuple) else
                   str(x) if isinstance(x, int) else jnp.dtype(x).name),
)
def test_tied_rows_at_large_n(spec, n, dtype):
    """Concrete parameters (the integer-exponent paths of q = 2, 3/2 included), the exact
    inputs of the defect: uniform 1/n."""
    rho = np.asarray(fd.stationary(make(spec), jnp.zeros(n, dtype), 1.0), np.float64)
    assert np.all(np.isfinite(rho)) and np.all(rho >= 0)
    assert abs(rho.sum() - 1) <= SUM_TOL[dtype]
    np.testing.assert_allclose(rho * n, 1.0, rtol=UNIFORM_RTOL[dtype], atol=0)


@pytest.mark.parametrize(
    "dtype", [jnp.float64, pytest.param(jnp.float32, marks=pytest.mark.slow)],
    ids=lambda d: jnp.dtype(d).name,
)
def test_few_values_at_large_n(dtype):
    """N = 1e5 in three groups of ties (the top one small), every family class with q up
    to 8: against the grouped mpmath reference."""
    rng = np.random.default_rng(3)
    n = 100_000
    z = np.array([0.0, -0.3, -2.0])[rng.integers(1, 3, n)]
    z[:40] = 0.0
    z = z[None]
    T = np.array([[0.5]])
    for spec in [("shannon",), ("tsallis", 8.0), ("tsallis", 2.0), ("renyi", 4.0),
                 ("sharma_mittal", 8.0, 3.0), ("kaniadakis", 0.3), ("burg",), ("abe", 3.0)]:
        rho = np.asarray(fd.stationary(make(spec), jnp.asarray(z, dtype), 0.5), np.float64)
        check_rows(spec, z, T, dtype, rho)


def test_row_beyond_the_dtype_is_reported_not_zero():
    """float32 cannot hold a threshold 1e-40 below the top score (Tsallis 8, 4e5 tied keys:
    (1/n)^(q-1) is below its smallest normal number): NaN and a result code, never zeros."""
    z = jnp.zeros(400_000, jnp.float32)
    rho = np.asarray(fd.stationary(fd.Tsallis(8.0), z, 1.0))
    assert np.all(np.isnan(rho))
    sol = fd.stationary_info(fd.Tsallis(8.0), z, 1.0, throw=False)
    assert sol.result == fd.RESULTS.nonlinear_divergence
    # the same row in float64 is uniform
    rho64 = np.asarray(fd.stationary(fd.Tsallis(8.0), z.astype(jnp.float64), 1.0))
    np.testing.assert_allclose(rho64 * 400_000, 1.0, rtol=1e-13, atol=0)


# --------------------------------------------------------------------------- branches

BRANCH_SPECS = [("renyi", 8.0), ("sharma_mittal", 2.0, 1.5)]


@pytest.mark.parametrize("spec", BRANCH_SPECS, ids=spec_id)
def test_branches_of_tied_rows(spec):
    """An all-tied row's uniform profile sits at the end of the scanned range of M (M_q =
    N^(1-q)), where the residual is 0: it is the one branch, stable."""
    n = 2048
    branches = list(jit_branches(arr(make(spec)), jnp.zeros(n), jnp.asarray(1.0)))
    assert len(branches) == 1, spec
    np.testing.assert_allclose(branches[0].rho * n, 1.0, rtol=1e-13, atol=0)
    assert branches[0].stable

