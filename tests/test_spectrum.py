"""relaxation_spectrum against the finite-difference Jacobian of the equations of motion.

Reference: the sphere-chart equations of docs/math.md §6, $4m\\ddot x = 2x(\\lambda - g) -
4\\gamma\\dot x$, $\\lambda = \\sum x^2 g - 2m\\sum\\dot x^2$ (overdamped: $2\\gamma\\dot x =
x(\\lambda - g)$, $\\lambda = \\sum x^2 g$), written here in numpy with each family's
$h = dS/d\\rho$ typed in from docs/math.md §2; central differences (h = 1e-6) of the vector field at
the fixed point, restricted to the tangent space of the constraint (an invariant subspace);
its eigenvalues must be the rates $s_k$ of `relaxation_spectrum`.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import central_jacobian, h_reference

import fisherdyn as fd


def sphere_field(entropy, z, T, m, gamma):
    n = z.size

    def f(y):
        x = y[:n]
        g = -z - T * h_reference(entropy, x * x)
        if m == 0:
            lam = np.sum(x * x * g)
            return x * (lam - g) / (2 * gamma)
        v = y[n:]
        lam = np.sum(x * x * g) - 2 * m * np.sum(v * v)
        return np.concatenate([v, (2 * x * (lam - g) - 4 * gamma * v) / (4 * m)])

    return f


def fd_tangent_eigenvalues(f, x_star, inertial, step=1e-6):
    n = x_star.size
    y0 = np.concatenate([x_star, np.zeros(n)]) if inertial else x_star.copy()
    J = central_jacobian(f, y0, step)
    # orthonormal basis of {x* . dx = 0} (and {x* . dv = 0})
    Q = np.linalg.svd(x_star[None, :])[2][1:].T  # (n, n-1)
    B = np.block([[Q, np.zeros_like(Q)], [np.zeros_like(Q), Q]]) if inertial else Q
    return np.linalg.eigvals(B.T @ J @ B)


def _sorted(v):
    v = np.asarray(v, complex)
    return v[np.lexsort((np.round(v.imag, 6), np.round(v.real, 6)))]


CASES = [
    # (entropy, scores, T): full support, moment-coupled, and sparse with boundary modes
    (fd.Kaniadakis(0.3), np.array([1.0, 0.3, -0.5, 0.2, -1.1]), 0.9),
    (fd.Renyi(2.0), np.array([0.8, 0.1, -0.2, 0.5, 0.3]), 1.5),
    (fd.Tsallis(1.5), np.array([1.0, 0.3, -0.5, 0.2, -1.1]), 0.3),
    (fd.Shannon(), np.array([1.0, 0.3, -0.5, 0.2, -1.1]), 0.7),
]


@pytest.mark.parametrize(
    "entropy,z,T",
    CASES,
    ids=lambda c: type(c).__name__ if isinstance(c, fd.AbstractEntropy) else "",
)
@pytest.mark.parametrize("mass,damping", [(1.0, 0.4), (2.0, 3.0), (0.0, 1.3)])
def test_rates_match_finite_difference_jacobian(entropy, z, T, mass, damping):
    # the fixed point from the direct root solver (scipy brentq), independent of the dynamics
    rho = np.asarray(fd.solve_stationary(entropy, z, T, method="scipy").rho)
    sp = fd.relaxation_spectrum(entropy, z, T, mass=mass, damping=damping, rho=rho)
    inertial = mass > 0
    fd_eigs = fd_tangent_eigenvalues(
        sphere_field(entropy, z, T, mass, damping), np.sqrt(rho), inertial
    )
    rates = np.asarray(sp.rates)
    want = rates.ravel() if inertial else rates[:, 0]
    # tolerance 1e-6 x the largest rate: central differences with step 1e-6
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(_sorted(fd_eigs), _sorted(want), atol=1e-6 * scale, rtol=0)
    # each mode satisfies m s^2 + gamma s + omega^2 = 0
    s = rates[:, 0]
    np.testing.assert_allclose(
        mass * s**2 + damping * s + np.asarray(sp.omega2), 0, atol=1e-12 * scale**2 + 1e-12
    )
    # boundary modes are exactly the components a sparse fixed point leaves at 0
    assert int(np.sum(sp.boundary)) == int(np.sum(rho == 0))
    if isinstance(entropy, fd.Tsallis):
        assert np.sum(rho == 0) >= 1


def test_shannon_isotropic_and_regimes():
    """Shannon: omega_k^2 = T for every mode (closed form); regimes flip at gamma^2 = 4 m T."""
    z, T, m = np.array([2.0, 0.1, -0.4, 0.9, -3.0, 0.0]), 1.7, 0.6
    gc = 2 * np.sqrt(m * T)
    R = fd.REGIMES
    for gamma, regime in ((0.5 * gc, R.underdamped), (gc, R.critical), (2 * gc, R.overdamped)):
        sp = fd.relaxation_spectrum(fd.Shannon(), z, T, mass=m, damping=gamma)
        np.testing.assert_allclose(sp.omega2, T, rtol=1e-12)
        assert np.all(sp.regime == regime)
    # Kaniadakis spreads the spectrum (docs/math.md §6), stiffest at the low-weight keys
    sp = fd.relaxation_spectrum(fd.Kaniadakis(0.5), z, T, mass=m, damping=1.0)
    assert np.ptp(np.asarray(sp.omega2)) > 0.1 * T


# --------------------------------------------------------------------------- input checks

BAD_DYNAMICS_INPUTS = [
    (dict(T=0.8, mass=-1.0, damping=0.5), "mass must be finite and >= 0"),
    (dict(T=0.8, mass=0.0, damping=0.0), "needs damping > 0"),
    (dict(T=0.8, mass=1.0, damping=-0.5), "damping must be finite and >= 0"),
    (dict(T=0.8, mass=np.inf, damping=0.5), "mass must be finite and >= 0"),
    (dict(T=0.0, mass=1.0, damping=0.5), "T must be finite and > 0"),
    (dict(T=np.nan, mass=1.0, damping=0.5), "T must be finite and > 0"),
]


@pytest.mark.parametrize("kwargs, message", BAD_DYNAMICS_INPUTS)
def test_spectrum_checks_inputs_like_simulate(kwargs, message):
    """The inputs `simulate` and `relax` refuse, `relaxation_spectrum` refuses with the same
    one-line ValueError (it returned rates of 1.6, inf and -0.25 for the first three)."""
    z = np.array([1.0, 0.5, -0.2])
    rho = fd.stationary(fd.Shannon(), z, 1.0)  # given, so that the spectrum's own checks act
    for fn, extra in ((fd.simulate, {}), (fd.relaxation_spectrum, dict(rho=rho))):
        with pytest.raises(ValueError, match=message) as info:
            fn(fd.Shannon(), z, **kwargs, **extra)
        assert len(str(info.value).splitlines()) == 1


def test_spectrum_checks_scores():
    # NaN / +inf scores are refused even with the fixed point given (nothing else reads them)
    rho = np.full(3, 1 / 3)
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match=r"scores contain NaN or \+inf \(1 of 3"):
            fd.relaxation_spectrum(fd.Shannon(), np.array([1.0, bad, 0.0]), 1.0, mass=1.0,
                                   damping=1.0, rho=rho)


def test_spectrum_traced_mass_may_vanish():
    """Under vmap the mass is traced: m = 0 stays the overdamped limit, and the closed form
    holds (Shannon, omega^2 = T: slowest rate T/gamma at m = 0, else the slower root of
    m s^2 + gamma s + T; rtol 1e-12, round-off)."""
    import jax
    import jax.numpy as jnp

    z, T, gamma = jnp.array([1.0, 0.5, -0.2]), 0.8, 1.5
    masses = jnp.array([0.0, 0.25, 1.0])
    rates = jax.vmap(lambda m: fd.relaxation_spectrum(fd.Shannon(), z, T, mass=m,
                                                      damping=gamma).slowest_rate)(masses)
    m = np.array([0.25, 1.0])
    disc = np.sqrt(np.maximum(gamma**2 - 4 * m * T, 0))
    ref = np.r_[T / gamma, (gamma - disc) / (2 * m)]
    np.testing.assert_allclose(rates, ref, rtol=1e-12)
    # a traced m = 0 without damping: the runtime check, its reason in the message
    f = jax.jit(lambda m, g: fd.relaxation_spectrum(fd.Shannon(), z, T, mass=m, damping=g))
    with pytest.raises(Exception, match="damping > 0 where mass = 0"):
        jax.block_until_ready(f(0.0, 0.0))


@pytest.mark.parametrize("entropy", [fd.Kaniadakis(0.3), fd.Tsallis(1.5)])
def test_batches_equal_per_row_calls(entropy):
    """Leading batch axes of the scores with one T (size-1 key axis, as in `stationary`),
    one mass and one damping per row, m = 0 mixed with m > 0: each row as its own call
    (reference: the same function on one row; tolerance 1e-12, round-off between the
    batched and the single program)."""
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(2, 3, 5))
    T = np.array([[0.6], [1.1]])[..., None]  # (2, 1, 1): one per row of the first axis
    mass = np.array([0.0, 0.5, 2.0])  # (3,): one per row of the last batch axis
    damping = np.array([[1.3], [0.4]])  # (2, 1)
    sp = fd.relaxation_spectrum(entropy, Z, T, mass=mass, damping=damping)
    assert sp.rates.shape == (2, 3, 4, 2)
    for i, j in np.ndindex(2, 3):
        one = fd.relaxation_spectrum(entropy, Z[i, j], float(T[i, 0, 0]), mass=float(mass[j]),
                                     damping=float(damping[i, 0]))
        for field in ("omega2", "rates", "boundary", "modes", "rho", "lam"):
            got, want = np.asarray(getattr(sp, field))[i, j], np.asarray(getattr(one, field))
            finite = np.isfinite(want)
            np.testing.assert_array_equal(np.isfinite(got), finite)
            np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=1e-12)
        assert sp.regime_names[12 * i + 4 * j: 12 * i + 4 * j + 4] == one.regime_names


def test_regime_is_an_enumeration_item():
    """`regime` is a `REGIMES` item in the style of `RESULTS` (per mode, also from a jitted
    call), compared with `==` and printed by name. Reference: the Shannon closed form,
    omega^2 = T for every mode, so gamma^2 = 4 m T / 4 is under-damped in every mode."""
    import jax

    z, T = np.array([1.0, 0.3, -0.5, 0.2]), 0.7
    gamma = np.sqrt(4 * T) / 2

    def spec(z):
        return fd.relaxation_spectrum(fd.Shannon(), z, T, mass=1.0, damping=gamma)

    for sp in (spec(z), jax.jit(spec)(z)):
        assert isinstance(sp.regime, fd.REGIMES)
        assert np.all(sp.regime == fd.REGIMES.underdamped)
        assert not np.any(sp.regime == fd.REGIMES.overdamped)
        assert repr(sp.regime) == "fisherdyn.REGIMES<['underdamped' 'underdamped' 'underdamped']>"
        assert sp.regime_names == ["under-damped"] * 3


# ------------------------------------------------- secular spectrum against a dense eigensolve


def dense_omega2(entropy, z, T, rho, mask):
    """The eigenvalues of the tangent stiffness built densely (docs/math.md §6): the Hessian
    $\\partial h/\\partial\\rho$ by forward-mode autodiff of the family's gradient on the
    support, $K = P[\\tfrac12\\mathrm{diag}(g - \\lambda) + D_x(-T\\,\\partial h/\\partial\\rho)
    D_x]P$ in numpy, restricted to the tangent space of the unmasked keys, `eigvalsh`."""
    import jax
    import jax.numpy as jnp

    act = (rho > 0) & mask
    safe = np.where(act, rho, 1.0)
    H = np.asarray(jax.jacfwd(lambda r: entropy.grad(r, mask=jnp.asarray(act)))(
        jnp.asarray(safe)))
    H = np.where(act[:, None] & act[None, :], H, 0.0)
    H = 0.5 * (H + H.T)
    h = np.asarray(entropy.grad(jnp.asarray(safe), mask=jnp.asarray(act)))
    g = np.where(act, -z - T * h, -z)
    lam = np.sum(np.where(act, rho * g, 0.0))
    x = np.sqrt(np.where(act, rho, 0.0))
    core = x[:, None] * (-T * H) * x[None, :] + np.diag(np.where(act, 0.0, 0.5 * (g - lam)))
    keep = np.flatnonzero(mask)
    xs = x[keep]
    Q = np.linalg.svd(xs[None, :])[2][1:].T  # orthonormal basis of x-perp among the kept keys
    return np.linalg.eigvalsh(Q.T @ core[np.ix_(keep, keep)] @ Q)


_SLOW_SECULAR = ("Renyi(q=2.0)", "SharmaMittal(q=2.0, r=1.5)")
SECULAR_FAMILIES = [
    fd.Shannon(), fd.Tsallis(1.5), fd.Tsallis(2.0), fd.Kaniadakis(0.3), fd.Abe(0.5),
    fd.Burg(), fd.Renyi(2.0), fd.Renyi(0.6), fd.SharmaMittal(2.0, 1.5),
]


@pytest.mark.parametrize(
    "entropy",
    # Renyi(2) and Sharma-Mittal (the bordered system Renyi(0.6) checks) run with -m slow
    [pytest.param(e, marks=pytest.mark.slow) if repr(e) in _SLOW_SECULAR else e
     for e in SECULAR_FAMILIES],
    ids=lambda e: repr(e),
)
def test_secular_spectrum_matches_dense_eigensolve(entropy, n=400):
    """omega2 from the secular equations equals the eigenvalues of the dense tangent
    stiffness (numpy eigvalsh), with tied scores (equal weights: deflation), masked keys
    and, for the cutoff families at this temperature, keys off the support (boundary
    modes). Tolerance 1e-10 of the largest stiffness: eigvalsh is accurate to rounding
    relative to the matrix norm, the secular roots to rounding relative to each root."""
    rng = np.random.default_rng(n)
    z = rng.normal(size=n) * 1.5
    z[1::5] = z[0::5][: len(z[1::5])]  # ties
    mask = np.ones(n, bool)
    mask[3::11] = False
    T = 0.4
    sp = fd.relaxation_spectrum(entropy, z, T, mass=1.0, damping=1.0, mask=mask)
    rho = np.asarray(sp.rho)
    ref = dense_omega2(entropy, z, T, rho, mask)
    w = np.asarray(sp.omega2)
    n_kept = int(mask.sum())
    assert np.all(np.isinf(w[n_kept - 1:])) and np.all(np.isfinite(w[: n_kept - 1]))
    scale = np.max(np.abs(ref))
    np.testing.assert_allclose(w[: n_kept - 1], ref, rtol=0, atol=1e-10 * scale)
    # boundary modes: one per kept key the fixed point leaves at 0
    assert int(np.sum(sp.boundary)) == int(np.sum((rho == 0) & mask))
    if isinstance(entropy, fd.Tsallis):
        assert np.sum((rho == 0) & mask) >= 1


def test_secular_spectrum_float32():
    """float32 scores give a float32 spectrum equal to the float64 one to 1e-4 of the
    largest stiffness (a few hundred float32 roundings)."""
    z = np.random.default_rng(0).normal(size=300)
    e = fd.Kaniadakis(0.3)
    sp32 = fd.relaxation_spectrum(e, z.astype(np.float32), 0.7, mass=1.0, damping=1.0)
    sp64 = fd.relaxation_spectrum(e, z, 0.7, mass=1.0, damping=1.0)
    assert sp32.omega2.dtype == np.float32
    w64 = np.asarray(sp64.omega2)
    np.testing.assert_allclose(sp32.omega2, w64, rtol=0, atol=1e-4 * np.max(w64))


def test_cli_announces_a_long_spectrum():
    """`fisherdyn simulate` prints one progress line before a spectrum of 50,000 keys or
    more (seconds of work), nothing below."""
    from fisherdyn._cli._simulate import _spectrum_notice

    assert _spectrum_notice(20_000) is None
    line = _spectrum_notice(100_000)
    assert "100000 keys" in line and "relaxation spectrum" in line and "\n" not in line


# --------------------------------------- the far-field series of large spectra (N > ~900)


@pytest.mark.parametrize("inv_sigma", [0.0, 0.7])
def test_secular_far_field_matches_dense_rank_one_update(inv_sigma):
    """Past ~900 poles each block of roots sums its far poles through one Taylor series
    (`_far_field`). On 1,500 heavy-tailed poles (Student t with 2 degrees of freedom: blocks
    in the tails fall back to every pole one by one, the rest use the series; both asserted)
    with ties, the eigenvalues of diag(d) + sigma z z^T (and its z-perp compression) equal
    numpy's eigvalsh of the dense matrix to 1e-12 of the largest |eigenvalue| (eigvalsh's
    own accuracy is ~1e-13 of the norm at this size)."""
    import jax
    import jax.numpy as jnp

    from fisherdyn._dynamics._far_field import far_fields
    from fisherdyn._dynamics._secular import _root_blocks, _secular_poles, secular_eigenvalues

    n = 1500
    rng = np.random.default_rng(5)
    d = rng.standard_t(2, size=n)
    d[1::7] = d[0::7][: len(d[1::7])]  # ties (deflation)
    z2 = rng.random(n) + 0.05
    valid = np.ones(n, bool)
    args = (jnp.asarray(d), jnp.asarray(z2), jnp.asarray(valid), jnp.asarray(inv_sigma))
    vals, ok = jax.jit(secular_eigenvalues, static_argnums=4)(*args, 1e-13)[:2]
    P = _secular_poles(*args, 1e-13)
    far = far_fields(P["pv"], P["pw"], *_root_blocks(n, P["k"], P["a"], P["b"]))
    used = np.asarray(far.ok)
    assert 0 < used.sum() < used.size, "both the series and the per-pole sums are exercised"
    got = np.sort(np.asarray(vals)[np.asarray(ok)])
    z = np.sqrt(z2)
    if inv_sigma > 0:
        ref = np.linalg.eigvalsh(np.diag(d) + np.outer(z, z) / inv_sigma)
    else:
        # a Householder reflection H maps z to a multiple of e_1: H D H without its first
        # row and column is D compressed onto z-perp
        v = z.copy()
        v[0] += np.copysign(np.linalg.norm(z), z[0])
        H = np.eye(n) - 2 * np.outer(v, v) / (v @ v)
        ref = np.linalg.eigvalsh(((H * d) @ H)[1:, 1:])
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * np.max(np.abs(ref)))


def test_large_spectrum_matches_dense_eigensolve():
    """A Kaniadakis spectrum at N = 1,500 (the far-field path) against the dense tangent
    stiffness's eigvalsh, with masked keys: 1e-10 of the largest stiffness, as at N = 400."""
    n = 1500
    e = fd.Kaniadakis(0.3)
    rng = np.random.default_rng(n)
    z = rng.normal(size=n) * 1.5
    mask = np.ones(n, bool)
    mask[3::11] = False
    sp = fd.relaxation_spectrum(e, z, 0.4, mass=1.0, damping=1.0, mask=mask)
    ref = dense_omega2(e, z, 0.4, np.asarray(sp.rho), mask)
    w = np.asarray(sp.omega2)[: int(mask.sum()) - 1]
    np.testing.assert_allclose(w, ref, rtol=0, atol=1e-10 * np.max(np.abs(ref)))
