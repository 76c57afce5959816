"""Derivatives of `simulate`'s outputs with respect to the scores, T, mass, damping and the
family's parameter: reverse mode (the default `adjoint`, Diffrax's checkpointed adjoint) and
forward mode (`adjoint=diffrax.ForwardMode()`), against central finite differences.

Tolerance: with h = 1e-3 the central difference's truncation error is about
h^2 |f'''| / 6 ~ 1e-7, and the solver's noise (rtol = 1e-10) adds about rtol / h = 1e-7;
the autodiff derivative is that of the computed solution, so it agrees to about 1e-6.
"""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd

jax.config.update("jax_enable_x64", True)

Z = jnp.array([1.3, 0.2, -0.7, 0.5])
# (z_1, T, mass, damping, kappa)
P = jnp.array([0.2, 0.8, 0.7, 0.9, 0.3])
H = 1e-3
TOL = 1e-6


def _final_weight(p, adjoint=None):
    z = Z.at[1].set(p[0])
    out = fd.simulate(
        fd.Kaniadakis(p[4]), z, p[1], mass=p[2], damping=p[3], t1=2.0, saveat=2,
        rtol=1e-10, atol=1e-12, adjoint=adjoint,
    )
    return out.rho_final[0] + out.rho[-1, 2]


@pytest.fixture(scope="module")
def central_differences():
    f = jax.jit(_final_weight)
    eye = np.eye(P.size)
    return np.array([(f(P + H * e) - f(P - H * e)) / (2 * H) for e in eye])


def test_reverse_mode_matches_finite_differences(central_differences):
    g = jax.grad(_final_weight)(P)
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, central_differences, rtol=0, atol=TOL)


def test_forward_mode_matches_finite_differences(central_differences):
    jf = jax.jacfwd(lambda p: _final_weight(p, diffrax.ForwardMode()))(P)
    np.testing.assert_allclose(jf, central_differences, rtol=0, atol=TOL)


def test_bad_adjoint_is_an_error():
    with pytest.raises(ValueError, match="adjoint must be a diffrax adjoint"):
        fd.simulate(fd.Shannon(), Z, adjoint="forward")
