"""`tangent_test` (docs/math.md §5).

References: the closed forms a* = 1/M_q (Renyi) and a* = M_q^((q-r)/(1-q)) (Sharma-Mittal),
and an independent formulation (explicit projector, least squares, gradients by autodiff of
the entropy values).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd

_rng = np.random.default_rng(11)
RHO = jnp.asarray(_rng.dirichlet(np.ones(6), size=20))  # generic interior points, N = 6


def _moment(rho, q):
    return np.sum(np.asarray(rho) ** q, -1)


def _reference(ea, eb, rho):
    """a*, R from P = I - 11^T/N, gradients by jax.grad of S, and np.linalg.lstsq."""
    rho = np.asarray(rho)
    N = rho.size
    P = np.eye(N) - np.ones((N, N)) / N
    u = P @ np.asarray(jax.grad(ea.value)(jnp.asarray(rho)))
    v = P @ np.asarray(jax.grad(eb.value)(jnp.asarray(rho)))
    a = np.linalg.lstsq(v[:, None], u, rcond=None)[0][0]
    return a, np.linalg.norm(u - a * v) / np.linalg.norm(u)


@pytest.mark.parametrize("q", [0.7, 2.0, 3.0])
def test_renyi_vs_tsallis(q):
    a_star, R = fd.tangent_test(fd.Renyi(q), fd.Tsallis(q), RHO)
    assert a_star.shape == R.shape == (RHO.shape[0],)
    # reference: R = 0 exactly (same profile shape); tolerance 1e-12
    assert float(jnp.max(R)) <= 1e-12
    # reference: a* = 1/M_q(rho), closed form; relative tolerance 1e-12
    np.testing.assert_allclose(a_star, 1 / _moment(RHO, q), rtol=1e-12)


@pytest.mark.parametrize("q, r", [(2.0, 1.5), (0.7, 0.3), (3.0, 0.5)])
def test_sharma_mittal_vs_tsallis(q, r):
    a_star, R = fd.tangent_test(fd.SharmaMittal(q, r), fd.Tsallis(q), RHO)
    # reference: R = 0 exactly; tolerance 1e-12
    assert float(jnp.max(R)) <= 1e-12
    # reference: a* = M_q^((q-r)/(1-q)), closed form; relative tolerance 1e-12
    np.testing.assert_allclose(a_star, _moment(RHO, q) ** ((q - r) / (1 - q)), rtol=1e-12)


@pytest.mark.parametrize("name", ["kaniadakis", "abe", "burg"])
@pytest.mark.parametrize("q", [0.7, 1.5, 2.0])
def test_distinct_shapes_have_positive_residual(name, q):
    entropy = {"kaniadakis": fd.Kaniadakis(0.3), "abe": fd.Abe(1.5), "burg": fd.Burg()}[name]
    a_star, R = fd.tangent_test(entropy, fd.Tsallis(q), RHO)
    # threshold R > 1e-3: over 200 Dirichlet(1) points with N = 6 the smallest R of these
    # pairs is 1.7e-2 (R -> 0 only on a measure-zero set)
    assert float(jnp.min(R)) > 1e-3
    # reference: explicit projector + least squares + autodiff gradients; tolerance 1e-10
    for k in range(3):
        a_ref, R_ref = _reference(entropy, fd.Tsallis(q), RHO[k])
        np.testing.assert_allclose([a_star[k], R[k]], [a_ref, R_ref], rtol=1e-10)


def test_grad_of_R_matches_finite_differences():
    # reference: central finite differences along a tangent direction; rel tolerance 1e-6
    ea, eb = fd.Kaniadakis(0.3), fd.Tsallis(1.5)
    rho = RHO[0]
    d = jnp.asarray(_rng.normal(size=6))
    d = d - jnp.mean(d)
    g = jax.grad(lambda r: fd.tangent_test(ea, eb, r).R)(rho)
    h = 1e-6
    R_up, R_down = fd.tangent_test(ea, eb, rho + h * d).R, fd.tangent_test(ea, eb, rho - h * d).R
    fd_ = (R_up - R_down) / (2 * h)
    np.testing.assert_allclose(float(jnp.dot(g, d)), float(fd_), rtol=1e-6)


def test_two_components_are_refused():
    with pytest.raises(ValueError, match="N >= 3"):
        fd.tangent_test(fd.Renyi(2.0), fd.Tsallis(2.0), jnp.array([0.3, 0.7]))
    with pytest.raises(ValueError, match="N >= 3"):
        fd.tangent_test(fd.Burg(), fd.Tsallis(2.0), jnp.ones((4, 2)) / 2)
