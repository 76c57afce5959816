"""`solve_stationary`: the independent root-solver realization of the stationary map.

References: the other method of the same function (optimistix vs scipy), the closed forms
softmax and sparsemax (hand-written; `helpers.sparsemax`), the stationarity law itself
(residual, off-support inequality), and `fisherdyn.stationary` (the production operator).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import SOLVE_FAMILIES as FAMILIES
from helpers import jit_stationary, sparsemax

import fisherdyn as fd

CUTOFF = {"tsallis1.5", "tsallis2", "renyi2", "sharma_mittal2,1.5"}  # Tsallis-shaped, q > 1

_rng = np.random.default_rng(20240611)
# N = 8 everywhere: one compilation per family for the optimistix path
SCORES = [
    np.array([2.0, 1.2, 0.9, 0.3, -0.1, -0.8, -1.5, -2.6]),
    np.round(_rng.normal(size=8) * 1.5, 6),
    np.array([0.5, 0.5, 0.49, -3.0, -3.0, 0.0, -10.0, 1.0]),  # ties and a far score
]
TEMPS = [0.5, 1.7]
CASES = [(i, T) for i in range(len(SCORES)) for T in TEMPS]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_methods_agree_and_satisfy_the_law(name):
    entropy = FAMILIES[name]
    worst = dict(methods=0.0, residual=0.0, stationary=0.0)
    for i, T in CASES:
        z = jnp.asarray(SCORES[i])
        a = fd.solve_stationary(entropy, z, T, method="optimistix")
        b = fd.solve_stationary(entropy, z, T, method="scipy")
        assert bool(a.converged) and bool(b.converged)
        ref = jit_stationary(entropy, z, T)
        # reference: the other method (optimistix vs scipy brentq); tolerance 1e-12
        worst["methods"] = max(worst["methods"], float(jnp.max(jnp.abs(a.rho - b.rho))))
        assert abs(float(a.lam - b.lam)) <= 1e-12 * (1 + abs(float(b.lam)))
        # reference: the stationary law T G(rho_i) - z_i = lambda itself; tolerance 1e-12
        worst["residual"] = max(worst["residual"], float(a.residual), float(b.residual))
        # reference: normalization, a conservation law; tolerance 1e-13
        assert abs(float(jnp.sum(a.rho)) - 1) <= 1e-13
        assert abs(float(jnp.sum(b.rho)) - 1) <= 1e-13
        assert bool(jnp.all(a.rho >= 0)) and bool(jnp.all(b.rho >= 0))
        # reference: fisherdyn.stationary (separate solver code); tolerance 1e-12
        worst["stationary"] = max(worst["stationary"], float(jnp.max(jnp.abs(a.rho - ref))))
        worst["stationary"] = max(worst["stationary"], float(jnp.max(jnp.abs(b.rho - ref))))
    assert worst["methods"] <= 1e-12, worst
    assert worst["residual"] <= 1e-12, worst
    assert worst["stationary"] <= 1e-12, worst


@pytest.mark.parametrize("name", sorted(CUTOFF))
def test_cutoff_support_condition(name):
    # reference: the KKT condition of docs/math.md §2 off the support, T G(0+) - z_i >= lambda,
    # with G(0+) = 0 for Tsallis q > 1 (Renyi / S-M: the Tsallis G at T_eff); tol 1e-12
    entropy = FAMILIES[name]
    zeros = 0
    for i, T in CASES:
        z = SCORES[i]
        for method in ("optimistix", "scipy"):
            s = fd.solve_stationary(entropy, jnp.asarray(z), T, method=method)
            off = np.asarray(s.rho) == 0
            zeros += int(off.sum())
            assert np.all(-z[off] >= float(s.lam) - 1e-12)
            assert np.all(-z[~off] < float(s.lam))  # and strictly inside on the support
    assert zeros > 0  # the cases do exercise the cutoff


@pytest.mark.parametrize("method", ["optimistix", "scipy"])
def test_closed_forms(method):
    for i, T in CASES:
        z = SCORES[i]
        # reference: softmax(z/T), closed form; tolerance 1e-13
        e = np.exp((z - z.max()) / T)
        s = fd.solve_stationary(fd.Shannon(), jnp.asarray(z), T, method=method)
        np.testing.assert_allclose(np.asarray(s.rho), e / e.sum(), rtol=0, atol=1e-13)
        # reference: Tsallis q = 2 is sparsemax of z/(2T) (sort-based); tolerance 1e-13
        s = fd.solve_stationary(fd.Tsallis(2.0), jnp.asarray(z), T, method=method)
        np.testing.assert_allclose(np.asarray(s.rho), sparsemax(z / (2 * T)), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["tsallis1.5", "abe1.5", "renyi2"])
def test_mask_equals_the_reduced_problem(name):
    # reference: the scipy solve of the score vector with the masked keys removed; tol 1e-12
    entropy = FAMILIES[name]
    z = SCORES[1]
    mask = np.array([True, False, True, True, False, True, True, True])
    reduced = fd.solve_stationary(entropy, jnp.asarray(z[mask]), 0.9, method="scipy")
    for method in ("optimistix", "scipy"):
        s = fd.solve_stationary(entropy, jnp.asarray(z), 0.9, method=method, mask=mask)
        assert np.all(np.asarray(s.rho)[~mask] == 0)
        np.testing.assert_allclose(np.asarray(s.rho)[mask], reduced.rho, rtol=0, atol=1e-12)


def test_vmap_batches_the_optimistix_path():
    # reference: one scipy solve per row; tolerance 1e-12
    entropy = fd.Kaniadakis(0.3)
    Z = jnp.asarray(np.stack(SCORES))
    batched = jax.vmap(lambda z: fd.solve_stationary(entropy, z, 0.8).rho)(Z)
    for z, rho in zip(SCORES, batched):
        ref = fd.solve_stationary(entropy, jnp.asarray(z), 0.8, method="scipy").rho
        np.testing.assert_allclose(np.asarray(rho), ref, rtol=0, atol=1e-12)


def test_renyi_branches_and_the_M0_hint():
    """Renyi q=2 on z = (1, 0, ..., 0) has three self-consistent roots at these T
    (spread, unstable middle, one-hot); the default is the root of least free energy."""
    entropy = fd.Renyi(2.0)
    z = jnp.asarray(np.r_[1.0, np.zeros(7)])
    for T in (0.36, 0.43):
        by_method = {}
        for method in ("optimistix", "scipy"):
            roots = []
            for M0 in (0.1, 0.5, 1.0):  # one hint near each branch
                s = fd.solve_stationary(entropy, z, T, method=method, M0=M0)
                assert bool(s.converged)
                assert float(s.residual) <= 1e-12  # reference: the law itself; tol 1e-12
                roots.append(np.asarray(s.rho))
            M = np.array([np.sum(r**2) for r in roots])
            assert np.all(np.diff(M) > 0.05), M  # three distinct branches
            # reference: F = -sum rho z - T S(rho) evaluated by fd.free_energy
            F = np.array([float(fd.free_energy(entropy, z, jnp.asarray(r), T)) for r in roots])
            default = fd.solve_stationary(entropy, z, T, method=method)
            np.testing.assert_allclose(default.rho, roots[int(np.argmin(F))], atol=1e-12)
            by_method[method] = np.stack(roots)
        # reference: the other method; tolerance 1e-12
        np.testing.assert_allclose(by_method["optimistix"], by_method["scipy"], atol=1e-12)
        # reference: fisherdyn.stationary (least-F branch, separate code); tolerance 1e-12
        ref = jit_stationary(entropy, z, T)
        np.testing.assert_allclose(default.rho, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["optimistix", "scipy"])
@pytest.mark.parametrize("entropy", [fd.Kaniadakis(0.3), fd.Renyi(2.0)])
def test_batches_equal_per_row_calls(entropy, method):
    """Leading batch axes, a T per row (size-1 key axis, as in `stationary`), a broadcast
    mask and an M0 per row: each row as its own call (reference, the same solver on one
    row; tolerance 1e-13, float64 round-off between the batched and the single program)."""
    rng = np.random.default_rng(11)
    Z = rng.normal(size=(2, 3, 6))
    T = np.array([0.5, 0.9, 1.4])[:, None]  # one per row of the last batch axis
    mask = np.ones(6, bool)
    mask[4] = False
    M0 = np.array([[0.2, 0.5, 1.0], [1.0, 0.5, 0.2]])
    sol = fd.solve_stationary(entropy, jnp.asarray(Z), jnp.asarray(T), method=method,
                              mask=jnp.asarray(mask), M0=jnp.asarray(M0))
    assert sol.rho.shape == Z.shape and sol.lam.shape == sol.T_eff.shape == Z.shape[:2]
    assert np.all(np.asarray(sol.converged))
    for i, j in np.ndindex(2, 3):
        one = fd.solve_stationary(entropy, jnp.asarray(Z[i, j]), float(T[j, 0]),
                                  method=method, mask=jnp.asarray(mask), M0=float(M0[i, j]))
        for field in ("rho", "lam", "T_eff"):
            np.testing.assert_allclose(np.asarray(getattr(sol, field))[i, j],
                                       np.asarray(getattr(one, field)), rtol=0, atol=1e-13)


def test_input_errors():
    with pytest.raises(ValueError, match="at least one axis"):
        fd.solve_stationary(fd.Shannon(), jnp.zeros(()))
    with pytest.raises(ValueError, match="method"):
        fd.solve_stationary(fd.Shannon(), jnp.zeros(3), method="newton")


def test_derivative_of_the_self_consistent_map():
    """A JVP through the optimistix path (implicit differentiation of every root solve).
    References, along a random direction d: central finite differences of the scipy path
    (tolerance 1e-8, set by the O(h^2) + round-off/h error of h = 1e-6) and
    fd.stationary_jacobian with its rank-one Renyi correction (tolerance 1e-12)."""
    entropy, T = fd.Renyi(2.0), 0.9
    z = jnp.asarray(SCORES[0])
    d = jnp.asarray(np.random.default_rng(4).normal(size=z.size))
    _, Jd = jax.jvp(lambda z: fd.solve_stationary(entropy, z, T).rho, (z,), (d,))
    h = 1e-6
    up = fd.solve_stationary(entropy, z + h * d, T, method="scipy").rho
    down = fd.solve_stationary(entropy, z - h * d, T, method="scipy").rho
    np.testing.assert_allclose(Jd, (up - down) / (2 * h), rtol=0, atol=1e-8)
    np.testing.assert_allclose(Jd, fd.stationary_jacobian(entropy, z, T) @ d, rtol=0, atol=1e-12)
