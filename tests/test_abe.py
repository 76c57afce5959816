"""Abe expansion about softmax (docs/math.md §4).

References: conservation laws (sum p c2 = sum p c4 = 0, constant lambda0), the exact Abe map
from `fisherdyn.stationary` and from the independent `solve_stationary(method="scipy")`
fitted in eps^2, a 50-digit mpmath solve of the exact map, finite differences, and the
two-valued reduction of a broad score vector solved in mpmath.
"""

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
from helpers import jit_stationary  # one compilation; the Abe parameter is traced

import fisherdyn as fd

Z = np.array([1.3, 0.4, -0.2, -1.1, 0.8, -2.5])
T = 0.7


def _exact(eps, z=Z, T=T):
    return np.asarray(jit_stationary(fd.Abe(float(np.exp(eps))), jnp.asarray(z), T))


def _mp_abe_map(z, T, eps):
    """The exact Abe map at 50 digits: component roots of G(e^l) = (z_i + lam)/T by Newton,
    lam by the secant method, started from the softmax solution. Returns (rho, lam)."""
    with mp.workdps(50):
        q = mp.e ** mp.mpf(eps)
        den = q - 1 / q

        def G(ell):
            return (q * mp.e ** ((q - 1) * ell) - mp.e ** ((1 / q - 1) * ell) / q) / den

        def dG(ell):
            return (q * (q - 1) * mp.e ** ((q - 1) * ell)
                    - (1 / q - 1) * mp.e ** ((1 / q - 1) * ell) / q) / den

        zs = [mp.mpf(float(x)) for x in z]
        T = mp.mpf(T)
        logZ = mp.log(mp.fsum(mp.e ** (x / T) for x in zs))

        def rho_of(lam):
            out = []
            for x in zs:
                y = (x + lam) / T
                ell = mp.findroot(lambda l_: G(l_) - y, y - 1, df=dG, solver="newton")
                out.append(mp.e**ell)
            return out

        lam0 = T * (1 - logZ)
        lam = mp.findroot(lambda lam_: mp.fsum(rho_of(lam_)) - 1, (lam0, lam0 + mp.mpf("1e-6")),
                          solver="secant")
        return rho_of(lam), lam


def test_corrections_are_mean_free_and_lambda0_is_constant():
    ex = fd.abe_expansion(jnp.asarray(Z), T)
    # reference: normalization order by order (conservation law); tolerance 1e-14 * scale
    assert abs(float(jnp.sum(ex.p * ex.c2))) <= 1e-14 * float(jnp.max(jnp.abs(ex.c2)))
    assert abs(float(jnp.sum(ex.p * ex.c4))) <= 1e-14 * float(jnp.max(jnp.abs(ex.c4)))
    # reference: lambda0 = T(1 + ln p_i) - z_i is the same for every i; tolerance 1e-13
    lam0_i = T * (1 + np.log(np.asarray(ex.p))) - Z
    np.testing.assert_allclose(lam0_i, float(ex.lam0), rtol=0, atol=1e-13)


@pytest.mark.parametrize("source", ["stationary", "scipy"])
def test_coefficients_against_a_fit_of_the_exact_map(source):
    """Richardson-style fit of (rho/p - 1)/eps^2 = c2 + c4 eps^2 + c6 eps^4 + c8 eps^6 on 8
    values of eps in [0.01, 0.08]. The neglected O(eps^8) terms grow like (ln p)^(3k) for the
    low-weight keys (here ln p down to -6.1): measured fit error 4e-8 (c2) and 3e-5 (c4)
    relative for both exact maps, so tolerance 1e-6 (c2, lam2) and 1e-3 (c4, lam4) relative
    to max|c|; the tight check is the mpmath test below."""
    ex = fd.abe_expansion(jnp.asarray(Z), T)
    p = np.asarray(ex.p)
    eps = np.linspace(0.01, 0.08, 8)
    rows, lams = [], []
    for e in eps:
        if source == "stationary":
            rows.append(_exact(e))
        else:
            s = fd.solve_stationary(fd.Abe(float(np.exp(e))), jnp.asarray(Z), T, method="scipy")
            rows.append(np.asarray(s.rho))
            lams.append(float(s.lam))
    A = (np.stack(rows) / p - 1) / eps[:, None] ** 2
    V = np.stack([eps**0, eps**2, eps**4, eps**6], 1)
    coef = np.linalg.lstsq(V, A, rcond=None)[0]
    c2, c4 = np.asarray(ex.c2), np.asarray(ex.c4)
    np.testing.assert_allclose(coef[0], c2, rtol=0, atol=1e-6 * np.max(np.abs(c2)))
    np.testing.assert_allclose(coef[1], c4, rtol=0, atol=1e-3 * np.max(np.abs(c4)))
    if lams:
        L = (np.asarray(lams) - float(ex.lam0)) / eps**2
        lc = np.linalg.lstsq(V, L, rcond=None)[0]
        np.testing.assert_allclose(lc[0], float(ex.lam2), rtol=1e-6)
        np.testing.assert_allclose(lc[1], float(ex.lam4), rtol=1e-3)


def test_coefficients_against_mpmath():
    """50-digit exact solves at eps = 1, 2, 3 x 1e-3; the three-point fit in eps^2 leaves
    O(eps^6) ~ 1e-17 on c2 and O(eps^4) ~ 1e-11 on c4 (relative): tolerance 1e-10 relative
    (float64 evaluation of the polynomials in ln p)."""
    z = Z[:4]
    ex = fd.abe_expansion(jnp.asarray(z), T)
    eps = [mp.mpf("1e-3"), mp.mpf("2e-3"), mp.mpf("3e-3")]
    with mp.workdps(50):
        p = [mp.e ** (mp.mpf(float(x)) / T) for x in z]
        s = mp.fsum(p)
        p = [x / s for x in p]
        A, L = [], []
        for e in eps:
            rho, lam = _mp_abe_map(z, T, e)
            A.append([(r / pi - 1) / e**2 for r, pi in zip(rho, p)])
            L.append(lam)
        V = mp.matrix([[1, e**2, e**4] for e in eps])
        lam0 = mp.mpf(T) * (1 - mp.log(s))
        lc = mp.lu_solve(V, mp.matrix([(lam - lam0) / e**2 for lam, e in zip(L, eps)]))
        c2_ref, c4_ref = [], []
        for i in range(len(z)):
            ci = mp.lu_solve(V, mp.matrix([A[k][i] for k in range(3)]))
            c2_ref.append(float(ci[0]))
            c4_ref.append(float(ci[1]))
    np.testing.assert_allclose(ex.c2, c2_ref, rtol=0, atol=1e-10 * np.max(np.abs(c2_ref)))
    np.testing.assert_allclose(ex.c4, c4_ref, rtol=0, atol=1e-10 * np.max(np.abs(c4_ref)))
    np.testing.assert_allclose(float(ex.lam0), float(lam0), rtol=1e-14)
    np.testing.assert_allclose(float(ex.lam2), float(lc[0]), rtol=1e-10)
    np.testing.assert_allclose(float(ex.lam4), float(lc[1]), rtol=1e-10)


def test_truncation_error_orders():
    # reference: the exact map; the order-2 (order-4) truncation error must scale as
    # eps^4 (eps^6): log-log slope over eps in [0.02, 0.2], tolerance +-0.15
    eps = np.geomspace(0.02, 0.2, 6)
    e2, e4 = [], []
    for e in eps:
        exact = _exact(e)
        for order, errs in ((2, e2), (4, e4)):
            series = fd.abe_series(jnp.asarray(Z), T, eps=e, order=order)
            errs.append(np.max(np.abs(exact - np.asarray(series))))
    slope2 = np.polyfit(np.log(eps), np.log(e2), 1)[0]
    slope4 = np.polyfit(np.log(eps), np.log(e4), 1)[0]
    assert abs(slope2 - 4) <= 0.15, slope2
    assert abs(slope4 - 6) <= 0.15, slope4


@pytest.mark.parametrize("eps", [0.05, 0.3, 1.0])
def test_exact_map_is_even_in_eps(eps):
    # reference: S_A(q) = S_A(1/q); tolerance 1e-13 (round-off)
    plus, minus = _exact(eps), _exact(-eps)
    np.testing.assert_allclose(plus, minus, rtol=0, atol=1e-13)
    s_plus = fd.solve_stationary(fd.Abe(float(np.exp(eps))), jnp.asarray(Z), T, method="scipy")
    s_minus = fd.solve_stationary(fd.Abe(float(np.exp(-eps))), jnp.asarray(Z), T, method="scipy")
    np.testing.assert_allclose(s_plus.rho, s_minus.rho, rtol=0, atol=1e-13)


def test_order2_goes_negative_for_broad_scores_but_the_exact_map_does_not():
    """One key at half the softmax mass, 999 keys sharing the rest: <g2> is dominated by the
    broad bulk (l ~ -7.6), so c2 of the top key is ~ -11 and p(1 + eps^2 c2) < 0 at
    eps = 0.4. Reference for the exact map: the two-valued reduction (top, bulk) solved in
    mpmath, T G(rho_top) - z_top = T G(rho_bulk), rho_top + 999 rho_bulk = 1; tol 1e-12."""
    K, eps, T_ = 999, 0.4, 1.0
    z = np.r_[np.log(K), np.zeros(K)]
    series = np.asarray(fd.abe_series(jnp.asarray(z), T_, eps=eps, order=2))
    assert series[0] < 0
    exact = _exact(eps, z, T_)
    assert np.all(exact > 0)
    with mp.workdps(30):
        q = mp.e ** mp.mpf(eps)

        def G(x):
            return (q * x ** (q - 1) - x ** (1 / q - 1) / q) / (q - 1 / q)

        top = mp.findroot(
            lambda t: T_ * G(t) - mp.log(K) - T_ * G((1 - t) / K), mp.mpf(0.5), solver="secant"
        )
    np.testing.assert_allclose(exact[0], float(top), rtol=0, atol=1e-12)
    np.testing.assert_allclose(exact[1:], float((1 - top) / K), rtol=0, atol=1e-12)


def test_jit_vmap_grad():
    Zb = jnp.asarray(np.stack([Z, Z[::-1], 0.5 * Z]))
    f = jax.jit(lambda z: fd.abe_series(z, T, eps=0.2, order=4))
    batched = jax.vmap(f)(Zb)
    for k in range(3):
        # reference: the eager, unbatched call; tolerance 1e-15
        np.testing.assert_allclose(
            batched[k], fd.abe_series(Zb[k], T, eps=0.2, order=4), atol=1e-15)
    np.testing.assert_allclose(fd.abe_series(Zb, T, eps=0.2, order=4), batched, atol=1e-15)
    # reference: central finite differences; relative tolerance 1e-7
    w = jnp.asarray(np.linspace(-1, 1, Z.size))
    loss = lambda z: jnp.sum(w * fd.abe_series(z, T, eps=0.2, order=4))  # noqa: E731
    g = jax.grad(loss)(jnp.asarray(Z))
    d = jnp.asarray(np.random.default_rng(3).normal(size=Z.size))
    h = 1e-5
    fdiff = (loss(jnp.asarray(Z) + h * d) - loss(jnp.asarray(Z) - h * d)) / (2 * h)
    np.testing.assert_allclose(float(jnp.dot(g, d)), float(fdiff), rtol=1e-7)
    # the map is flat in eps at eps = 0 (docs/math.md §4): d/deps = 0 there
    dz = jax.jacfwd(lambda e: fd.abe_series(jnp.asarray(Z), T, eps=e, order=4))(0.0)
    assert float(jnp.max(jnp.abs(dz))) == 0.0
