"""Floating-point formats: half-precision inputs, float32 scores under x64, and the float32
accuracy of Kaniadakis' law.

References: the float32 solve of the same scores, the simplex, and the closed form of the
Kaniadakis inverse evaluated in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ONE_PER_CLASS, SPECS, make, spec_id

import fisherdyn as fd


# bfloat16 on a separable family with and without a cutoff and a self-consistent one by
# default; the other families and float16 with -m slow
_HALF_DEFAULT = ("shannon", "tsallis", "renyi")


@pytest.mark.parametrize(
    "dtype, spec",
    [pytest.param(d, spec, id=f"{name}-{spec_id(spec)}",
                  marks=[] if d == jnp.bfloat16 and spec[0] in _HALF_DEFAULT
                  else [pytest.mark.slow])
     for d, name in ((jnp.bfloat16, "bfloat16"), (jnp.float16, "float16"))
     for spec in ONE_PER_CLASS],
)
def test_half_precision_inputs(dtype, spec):
    """bfloat16 / float16 scores are solved in float32 and the weights rounded back: each
    weight equals the float32 solve of the same (upcast) scores to within its own rounding,
    |rho - rho32| <= 2^-(mantissa bits) |rho32| (a solve in half precision itself missed the
    simplex by up to 0.1); gradients are finite and keep the input dtype."""
    rng = np.random.default_rng(5)
    z = jnp.asarray(rng.normal(size=(6, 16)), dtype)
    rel = 2.0 ** -(jnp.finfo(dtype).nmant)
    e = make(spec)
    rho = fd.stationary(e, z, 0.8)
    assert rho.dtype == dtype
    ref = np.asarray(fd.stationary(e, z.astype(jnp.float32), 0.8))
    err = np.abs(np.asarray(rho, np.float32) - ref)
    assert np.all(err <= rel * ref + 1e-30), (spec, float(err.max()))
    g = jax.grad(lambda s: jnp.sum(fd.stationary(e, s, 0.8)[:, 0].astype(jnp.float32)))(z)
    assert g.dtype == dtype and bool(jnp.all(jnp.isfinite(g)))


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_float32_scores_stay_float32_with_x64_enabled(spec):
    """float32 scores with a Python-float T while jax_enable_x64 is on (how the benchmark and
    a float64-verifying user call it): the solve stays in float32 and returns float32 weights
    on the simplex. Tsallis q = 2 is the case to watch: a weakly typed float64 slope handed
    to its solver would break the root loop's carry types."""
    z = jnp.asarray(np.random.default_rng(3).normal(size=(4, 32)), jnp.float32)
    rho = fd.stationary(make(spec), z, 1.0)
    assert rho.dtype == jnp.float32
    assert np.abs(np.asarray(rho, np.float64).sum(-1) - 1).max() <= 1e-5


@pytest.mark.parametrize("kappa", [0.01, 0.05, 0.2, 0.3, 0.8, 0.95])
def test_kaniadakis_float32_law_accuracy(kappa):
    """Kaniadakis' float32 law takes a plain log (no divide) for kappa >= 0.2 and the
    log1p form below, where a plain log loses ~1/kappa ulps in the core (93 eps at 0.01).
    Reference: the closed form ((k w + r)/(1 + k))^(1/k) in float64 at the float32 inputs.
    Bounds, in float32 eps: 8 in the core (y in [-1.5, 0]; measured <= 4.7); 64 overall
    down to y = -1e4 (measured <= 86 with log1p at kappa <= 0.05 and <= 47 above, from the
    magnified exponent in the deep tail), so 96 at kappa < 0.2."""
    eps = np.finfo(np.float32).eps
    y = np.concatenate([-np.linspace(0, 1.5, 20001), -np.geomspace(1.5, 1e4, 20001)])
    y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
    w = 1 + y
    k = kappa
    ref = np.exp(np.log((k * w + np.sqrt((k * w) ** 2 + 1 - k * k)) / (1 + k)) / k)
    x, slope = fd.Kaniadakis(kappa).inverse_shifted(jnp.asarray(y, jnp.float32))
    assert x.dtype == jnp.float32
    keep = ref > 1e-30  # float32's normal range
    rel = np.abs(np.asarray(x, np.float64)[keep] / ref[keep] - 1) / eps
    core = (y > -1.5)[keep]
    assert rel[core].max() <= 8, rel[core].max()
    assert rel.max() <= (64 if kappa >= 0.2 else 96), rel.max()
    # the slope dx/dy = x / r
    r = np.sqrt((k * w) ** 2 + 1 - k * k)
    np.testing.assert_allclose(np.asarray(slope, np.float64)[keep], (ref / r)[keep],
                               rtol=128 * eps, atol=0)


def test_renyi_value_far_from_one_in_float32():
    """The Renyi and Sharma-Mittal values where M_q = sum rho^q is tiny (large q, long
    rows): the near-q=1 form ln(sum rho + sum rho expm1((q-1) ln rho)) cancels to 0 there
    and each rho^q underflows float32. Reference: the closed forms on a uniform row,
    S_Renyi = ln N and S_SM = (N^(1-r) - 1)/(1-r) (M_q = N^(1-q)); relative error <= 1e-6
    (a few float32 eps)."""
    for n in (64, 100_000):
        rho = jnp.full(n, 1.0 / n, jnp.float32)
        for q in (7.28, 8.0):
            got = float(fd.Renyi(q).value(rho))
            assert abs(got / np.log(n) - 1) <= 1e-6, (n, q, got)
            r = 1.5
            ref = (n ** (1 - r) - 1) / (1 - r)
            got = float(fd.SharmaMittal(q, r).value(rho))
            assert abs(got / ref - 1) <= 1e-6, (n, q, got)


def test_renyi_float32_picks_the_branch_of_least_free_energy():
    """One score far above the rest at T ~ ptp/9: float32 returned the dense branch (the
    float32 free energy of every dense candidate came out -inf, from the cancelling Renyi
    value) where float64 returns the one-hot branch of least free energy. Reference: the
    float64 solve of the same (float32-rounded) scores; max |rho32 - rho64| <= 1e-5 (float32
    rounding of weights <= 1)."""
    rng = np.random.default_rng(1)
    e = fd.Renyi(7.278340748630027)
    for _ in range(3):
        z = rng.normal(size=64)
        z[0] += 10
        z = (z / np.ptp(z) * 296.35).astype(np.float32)
        r32 = np.asarray(fd.stationary(e, jnp.asarray(z), jnp.float32(34.04)), np.float64)
        r64 = np.asarray(fd.stationary(e, jnp.asarray(z, jnp.float64), 34.04))
        assert r64.max() == 1.0  # the one-hot branch
        assert np.abs(r32 - r64).max() <= 1e-5


_LONG_ROW_SCRIPT = """
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np, fisherdyn as fd
rng = np.random.default_rng(53)
z = rng.normal(size=100_000) * 0.0789
z[0] += 0.789
z = z.astype(np.float32)
e = fd.Renyi(5.9241028037192285)
r32 = np.asarray(fd.stationary(e, jnp.asarray(z), jnp.float32(12.0108)), np.float64)
r64 = np.asarray(fd.stationary(e, jnp.asarray(z, jnp.float64), 12.0108))
print(abs(r32.sum() - 1), np.max(np.abs(r32 - r64) / r64))
"""


def test_renyi_float32_long_row_sums_to_one():
    """Renyi in float32 on a dense row of N = 1e5 keys: the weights were normalized by the
    solver's tuple reduction, which XLA:CPU's default fusion emitters sum in one running
    float32 sum (sum(rho) - 1 = -3.8e-4), so the check runs in a fresh interpreter with
    XLA's default flags (the suite turns those emitters off). Bounds: |sum - 1| <= 2e-6
    (~16 float32 eps, a pairwise sum's rounding) and each weight within 2e-5 relative of
    the float64 solve of the same scores."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", _LONG_ROW_SCRIPT], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    sum_err, rel_err = map(float, out.stdout.split())
    assert sum_err <= 2e-6, sum_err
    assert rel_err <= 2e-5, rel_err


def test_abe_float32_sums_to_one():
    """Abe(2.72) in float32, N = 2: the normalization stopped on a sum computed from
    components converged to their own (looser) tolerance, 1.1e-5 from 1 (90 eps); the final
    pass now takes one Newton step on the sum. Reference: the float64 solve of the same
    scores; |sum - 1| <= 4 float32 eps and max |rho32 - rho64| <= 1e-6."""
    z = np.array([0.10952704, -0.0742847], np.float32)
    T = 0.13174743950366974
    for q in (2.723792840818418, jnp.asarray(2.723792840818418, jnp.float32)):
        r32 = np.asarray(fd.stationary(fd.Abe(q), jnp.asarray(z), jnp.float32(T)), np.float64)
        r64 = np.asarray(fd.stationary(fd.Abe(2.723792840818418),
                                       jnp.asarray(z, jnp.float64), T))
        assert abs(r32.sum() - 1) <= 4 * np.finfo(np.float32).eps, r32.sum() - 1
        assert np.abs(r32 - r64).max() <= 1e-6


@pytest.mark.parametrize("family", ["Shannon", "Tsallis", "Abe"])
def test_nan_scores_in_long_rows_raise_under_jit(family):
    """XLA:CPU's row maximum skips NaN in rows of 4096 keys or more, and the NaN check rode
    on it: under a user's jit Shannon returned a finite row (the NaN key weighted 0) and the
    solvers NaN rows, silently. Each path must raise: the softmax path (Shannon), the
    unmasked solver (Tsallis), the row-blocked prepared path (Abe), and an eager call a
    one-line ValueError. Reference: the error itself (a NaN score is an error, -inf a mask)."""
    e = {"Shannon": fd.Shannon(), "Tsallis": fd.Tsallis(1.5), "Abe": fd.Abe(1.5)}[family]
    z = jnp.zeros((2, 5000), jnp.float32).at[1, 7].set(jnp.nan)
    f = jax.jit(lambda z: fd.stationary(e, z, 1.0))
    with pytest.raises(Exception, match=r"scores contain NaN or \+inf"):
        jax.block_until_ready(f(z))
    with pytest.raises(ValueError, match=r"^scores contain NaN or \+inf \(1 of 10000"):
        fd.stationary(e, z, 1.0)
    masked = jnp.zeros((2, 5000), jnp.float32).at[1, 7].set(-jnp.inf)
    rho = np.asarray(f(masked))
    assert rho[1, 7] == 0 and np.allclose(rho.sum(-1), 1, atol=1e-5)
