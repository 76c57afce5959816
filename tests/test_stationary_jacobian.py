"""Derivatives of the stationary operators (docs/math.md §3): Jacobian, JVP / VJP, and the
gradients in the temperature and in the family parameters.

References: central finite differences of the operator, autodiff through its custom JVP
(linearized and transposed), the structure $J = J^T$, $J 1 = 0$, and the symmetry of the Abe
map in $\\ln q$.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import SPECS, Z_A, central_jacobian, derivs, make, record, spec_id, stat

import fisherdyn as fd


Z_DENSE = 0.01 * Z_A  # every family has full support at T = 1 here
JAC_CASES = [(spec, Z_DENSE, 1.0) for spec in SPECS] + [
    (("tsallis", 1.5), Z_A, 1.0),  # inactive entries (exact zeros)
    (("tsallis", 2.0), Z_A, 1.0),
    (("tsallis", 3.0), Z_A, 1.0),
    (("renyi", 2.0), Z_A, 1.0),
    (("sharma_mittal", 2.0, 1.5), Z_A, 1.0),
]


def _fd_jacobian(entropy, z, T, h=1e-6):
    return central_jacobian(lambda z_: stat(entropy, z_, T), z, h)


def _case_id(spec, z):
    return spec_id(spec) + ("-dense" if z is Z_DENSE else "-sparse")


# the three slowest dense cases (the same code paths as the other dense ones) run with -m slow
_SLOW_JAC = ("abe_0.5-dense", "sharma_mittal_2_1.5-dense", "renyi_0.5-dense")


@pytest.mark.parametrize(
    "spec, z, T",
    [pytest.param(*c, marks=pytest.mark.slow) if _case_id(c[0], c[1]) in _SLOW_JAC else c
     for c in JAC_CASES],
    ids=[_case_id(s, z) for s, z, _ in JAC_CASES],
)
def test_jacobian(spec, z, T):
    # References: central finite differences (h = 1e-6, tolerance 1e-7), autodiff of the
    # operator (its custom JVP, linearized and transposed; tolerance 1e-12), and the structure
    # J = J^T, J 1 = 0 (tolerance 1e-13).
    entropy = make(spec)
    v, w, (rho, J, J_ad, jvp, vjp, _, _) = derivs(entropy, z, T)
    if z is Z_DENSE:
        assert np.all(rho > 0)
    else:  # the inactive entries sit away from the threshold (finite differences stay valid)
        assert np.any(rho == 0)
    J_fd = _fd_jacobian(entropy, z, T)
    record("|J - J_fd|", np.max(np.abs(J - J_fd)))
    record("|J - jax.jacobian|", np.max(np.abs(J - J_ad)))
    record("|J - J^T|", np.max(np.abs(J - J.T)))
    record("|J 1|", np.max(np.abs(J.sum(1))))
    np.testing.assert_allclose(J, J_fd, rtol=0, atol=1e-7)
    np.testing.assert_allclose(J, J_ad, rtol=0, atol=1e-12)
    np.testing.assert_allclose(J, J.T, rtol=0, atol=1e-13)
    np.testing.assert_allclose(J.sum(1), 0.0, rtol=0, atol=1e-13)
    if np.any(rho == 0):  # exact zeros have exactly zero rows and columns
        assert np.all(J[rho == 0] == 0) and np.all(J[:, rho == 0] == 0)
    # JVP = J v, VJP = J^T w (tolerance 1e-12)
    np.testing.assert_allclose(jvp, J @ v, rtol=0, atol=1e-12)
    np.testing.assert_allclose(vjp, J.T @ w, rtol=0, atol=1e-12)


def _param_fd(spec, k, z, T, h=1e-6):
    """Central difference of rho along parameter k (k = None: along T)."""
    def at(d):
        p = list(spec[1:])
        if k is None:
            return stat(make(spec), z, T + d)
        p[k] += d
        return stat(make((spec[0], *p)), z, T)
    return (at(h) - at(-h)) / (2 * h)


PARAM_SPECS = [
    ("kaniadakis", 0.3),
    ("kaniadakis", -0.3),
    ("tsallis", 1.5),
    ("tsallis", 0.5),
    ("tsallis", 3.0),
    ("abe", 1.5),
    ("abe", 0.5),
    ("renyi", 2.0),
    ("renyi", 0.5),
    ("sharma_mittal", 2.0, 1.5),
    ("sharma_mittal", 0.7, 0.4),
    ("shannon",),
    ("burg",),
]


@pytest.mark.parametrize("spec", PARAM_SPECS, ids=spec_id)
@pytest.mark.parametrize("z", [Z_DENSE, Z_A], ids=["dense", "sparse"])
def test_gradient_wrt_temperature_and_parameter(spec, z):
    # Reference: central finite differences in T and in each parameter (h = 1e-6; tolerance
    # 1e-7 (1 + |g|)) of w . rho; the parameters enter as traced jnp arrays, e.g.
    # Kaniadakis(jnp.array(0.3)), and the gradient is the transpose of the custom JVP.
    _, w, (_, _, _, _, _, g_e, g_T) = derivs(make(spec), z, 1.0)
    fd_T = float(w @ _param_fd(spec, None, z, 1.0))
    record("|d(w.rho)/dT - FD|", abs(float(g_T) - fd_T))
    assert abs(float(g_T) - fd_T) <= 1e-7 * (1 + abs(fd_T))
    g_p = jax.tree.leaves(g_e)
    assert len(g_p) == len(spec) - 1
    for k, g in enumerate(g_p):
        fd_p = float(w @ _param_fd(spec, k, z, 1.0))
        record("|d(w.rho)/dparam - FD|", abs(float(g) - fd_p))
        assert abs(float(g) - fd_p) <= 1e-7 * (1 + abs(fd_p))


def test_abe_parameter_gradient_at_q_equal_one():
    # The Abe map is even in eps = ln q (S_A(q) = S_A(1/q)), so d rho/dq = 0 at q = 1 exactly;
    # references: that symmetry (tolerance 1e-9) and central differences (tolerance 1e-8).
    _, w, (_, _, _, _, _, g_e, _) = derivs(fd.Abe(1.0), Z_A, 1.0)
    g = float(g_e.q)
    fd_g = float(w @ _param_fd(("abe", 1.0), 0, Z_A, 1.0, h=1e-5))
    assert np.isfinite(g) and abs(g) <= 1e-9 and abs(fd_g) <= 1e-8
