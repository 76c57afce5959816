"""Adding a family without touching the library: a toy separable entropy defined here alone.

The toy family is Shannon plus a Gini-Simpson (quadratic) term,

    S_c(rho) = -sum_i rho_i ln rho_i - (c/2) sum_i rho_i^2,   c >= 0,

so G(x) = -s'(x) = 1 + ln x + c x (increasing), G(1) = 1 + c, and the stationary law
T G(rho_i) = z_i + lambda has the closed form rho_i = W(c e^{u_i}) / c with
u_i = (z_i + lambda)/T - 1 (W: Lambert's function). The family implements only the required
interface (`G`, `G_prime`, `G1`, `inverse_shifted`, `terms`) and none of the optional solver
hooks, so every generic default of the separable solver is exercised.

References: the Lambert-W closed form with the multiplier found by `scipy.optimize.brentq`
(independent of fisherdyn), central finite differences for the Jacobian, and `stationary`
itself for the end points of `simulate` and `relax`.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.special

import fisherdyn as fd


class ShannonGini(fd.AbstractSeparableEntropy):
    """$S = -\\sum\\rho\\ln\\rho - (c/2)\\sum\\rho^2$: Shannon with a quadratic penalty."""

    c: float
    parse_names: ClassVar[tuple[str, ...]] = ("toy_shannon_gini",)
    parse_defaults: ClassVar[tuple[float, ...]] = (1.0,)

    def G(self, x):
        return 1.0 + jnp.log(x) + self.c * x

    def G_prime(self, x):
        return 1.0 / x + self.c

    def G1(self):
        return 1.0 + self.c

    def inverse_shifted(self, y):
        # ln x + c (x - 1) = y, Newton in l = ln x on f(l) = l + c (e^l - 1) - y: f is convex
        # and increasing, and l0 = y / (1 + c) lies right of the root (e^t - 1 >= t), so the
        # iteration decreases monotonically to it; 40 steps reach round-off from any start
        def step(_, log):
            x = jnp.exp(log)
            return log - (log + self.c * (x - 1.0) - y) / (1.0 + self.c * x)

        x = jnp.exp(jax.lax.fori_loop(0, 40, step, y / (1.0 + self.c)))
        return x, x / (1.0 + self.c * x)  # dx/dy = 1/G'(x)

    def terms(self, rho):
        safe = jnp.where(rho > 0, rho, 1.0)
        return jnp.where(rho > 0, -rho * jnp.log(safe), 0.0) - 0.5 * self.c * rho**2


def reference(c, z, T):
    """rho_i = W(c e^{u_i})/c, u_i = (z_i + lambda)/T - 1, with sum rho = 1 by brentq on
    lambda (float64 NumPy / scipy, nothing from fisherdyn). The bracket is exact: at its
    ends the top weight is 1/N and 1."""
    z = np.asarray(z, np.float64)
    n, zmax = z.size, z.max()

    def weights(lam):
        u = (z + lam) / T - 1.0
        return np.real(scipy.special.lambertw(c * np.exp(u))) / c

    lo = T * (1.0 + np.log(1.0 / n) + c / n) - zmax
    hi = T * (1.0 + c) - zmax
    lam = scipy.optimize.brentq(lambda a: weights(a).sum() - 1.0, lo, hi, xtol=1e-15, rtol=1e-15)
    return weights(lam)


CASES = [(0.5, 1.0), (3.0, 0.3), (1.0, 4.0)]  # (c, T)


def _scores(n=12, seed=0):
    return np.random.default_rng(seed).normal(size=n)


@pytest.mark.parametrize("c,T", CASES)
def test_stationary_matches_the_lambert_w_reference(c, T):
    """Weights to 1e-13: the reference multiplier is resolved to ~1e-15 and d rho/d lambda
    is at most 1/T, so 1e-13 leaves a margin for the round-off of both solves; batched rows
    and a mask give the same weights as the rows solved alone."""
    entropy = ShannonGini(c)
    Z = np.stack([_scores(seed=s) for s in range(3)])
    rho = np.asarray(fd.stationary(entropy, jnp.asarray(Z), T))
    for z, r in zip(Z, rho):
        np.testing.assert_allclose(r, reference(c, z, T), rtol=0, atol=1e-13)
    mask = np.arange(Z.shape[-1]) < 8
    masked = np.asarray(fd.stationary(entropy, jnp.asarray(Z), T, mask=jnp.asarray(mask)))
    np.testing.assert_allclose(masked[:, 8:], 0.0, rtol=0, atol=0)
    for z, r in zip(Z, masked):
        np.testing.assert_allclose(r[:8], reference(c, z[:8], T), rtol=0, atol=1e-13)


@pytest.mark.parametrize("c,T", CASES)
def test_info_and_independent_solvers(c, T):
    """`stationary_info` and both independent root solvers of `solve_stationary` agree with
    the operator to 1e-12 (each converges its roots to ~1e-13), succeed, and satisfy the
    stationary law itself to 1e-12."""
    entropy = ShannonGini(c)
    z = jnp.asarray(_scores())
    rho = np.asarray(fd.stationary(entropy, z, T))
    info = fd.stationary_info(entropy, z, T)
    assert bool(info.converged) and float(info.residual) <= 1e-12
    np.testing.assert_allclose(np.asarray(info.rho), rho, rtol=0, atol=1e-15)
    for method in ("optimistix", "scipy"):
        sol = fd.solve_stationary(entropy, z, T, method=method)
        assert bool(sol.converged) and float(sol.residual) <= 1e-12
        np.testing.assert_allclose(np.asarray(sol.rho), rho, rtol=0, atol=1e-12)
        np.testing.assert_allclose(float(sol.lam), float(info.lam), rtol=0, atol=1e-11)


@pytest.mark.parametrize("c,T", CASES)
def test_jacobian_matches_finite_differences(c, T):
    """`stationary_jacobian` against central differences of `stationary` (step 1e-5: the
    truncation error ~ h^2 |rho'''| ~ 1e-10 and round-off ~ eps/h ~ 1e-11, tolerance 1e-8),
    equal to autodiff through the custom JVP (1e-13), symmetric, with rows summing to 0."""
    entropy = ShannonGini(c)
    z = _scores()
    J = np.asarray(fd.stationary_jacobian(entropy, jnp.asarray(z), T))
    h = 1e-5
    fd_cols = []
    for i in range(z.size):
        e = np.zeros_like(z)
        e[i] = h
        plus = np.asarray(fd.stationary(entropy, jnp.asarray(z + e), T))
        minus = np.asarray(fd.stationary(entropy, jnp.asarray(z - e), T))
        fd_cols.append((plus - minus) / (2 * h))
    np.testing.assert_allclose(J, np.stack(fd_cols, 1), rtol=0, atol=1e-8)
    J_ad = np.asarray(jax.jacfwd(lambda z: fd.stationary(entropy, z, T))(jnp.asarray(z)))
    np.testing.assert_allclose(J_ad, J, rtol=0, atol=1e-13)
    np.testing.assert_allclose(J, J.T, rtol=0, atol=1e-15)
    np.testing.assert_allclose(J.sum(-1), 0.0, rtol=0, atol=1e-15)


def test_simulate_and_relax_reach_the_stationary_point():
    """`simulate` (sphere chart, over-damped enough to settle by t1 = 60) ends within 1e-6
    of `stationary` (the integrator's tolerances are 1e-8 / 1e-10 and the slowest mode has
    decayed by ~e^-30); `relax` polishes its end point by Newton to the stationary
    conditions, so it equals `stationary` to 1e-10 (its polish tolerance is 1e-12, the
    conditioning of the law near 1/T)."""
    entropy = ShannonGini(1.5)
    z = jnp.asarray(_scores(8, seed=3))
    T = 0.7
    st = np.asarray(fd.stationary(entropy, z, T))
    tr = fd.simulate(entropy, z, T, mass=1.0, damping=3.0, t1=60.0, saveat=5)
    assert tr.result == fd.RESULTS.successful
    np.testing.assert_allclose(np.asarray(tr.rho_final), st, rtol=0, atol=1e-6)
    sol = fd.relax(entropy, z, T, mass=1.0, damping=3.0)
    assert sol.result == fd.RESULTS.successful
    np.testing.assert_allclose(np.asarray(sol.rho), st, rtol=0, atol=1e-10)


def test_parse_and_traced_parameters():
    """The family is registered by its declared name (with its default parameter), and a
    traced parameter (jit, vmap, d/dc) goes through the generic solver: d rho/d c against
    a central difference in c (step 1e-5, tolerance 1e-8 as for the Jacobian)."""
    entropy = fd.parse_entropy("toy-shannon-gini")
    assert isinstance(entropy, ShannonGini) and entropy.c == 1.0
    z = jnp.asarray(_scores())
    batched = jax.vmap(lambda c: fd.stationary(ShannonGini(c), z, 0.8))(jnp.asarray([0.5, 3.0]))
    np.testing.assert_allclose(np.asarray(batched[1]), reference(3.0, np.asarray(z), 0.8),
                               rtol=0, atol=1e-13)
    d_c = np.asarray(jax.jacfwd(lambda c: fd.stationary(ShannonGini(c), z, 0.8))(jnp.asarray(1.0)))
    h = 1e-5
    z_np = np.asarray(z)
    fd_c = (reference(1.0 + h, z_np, 0.8) - reference(1.0 - h, z_np, 0.8)) / (2 * h)
    np.testing.assert_allclose(d_c, fd_c, rtol=0, atol=1e-8)
