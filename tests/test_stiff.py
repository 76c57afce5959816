"""The stiff path of `relax` (`fisherdyn/_dynamics/_stiff.py`, docs/math.md §6): the sphere
chart's Jacobian in structured form, its O(N) Newton solve, and the implicit block
integration built on them.

References: the dense Jacobian of the chart's own vector field by forward-mode autodiff
(`jax.jacfwd`), numpy's dense linear solve, the explicit solver Tsit5 (relax's block
stepper and Diffrax's own `simulate`) for the path and the branch, `fisherdyn.stationary`
for the fixed points.
"""

from __future__ import annotations


import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd
from fisherdyn._dynamics._coordinates import SphereCoordinates
from fisherdyn._dynamics._stiff import linearize, split_field, structured_solve
from fisherdyn._dynamics._system import FisherSystem

N = 7
# the cutoff families (the stiff default's) by default; the others share the code path
FAMILIES = [
    pytest.param(fd.Shannon(), id="Shannon", marks=pytest.mark.slow),
    pytest.param(fd.Tsallis(1.5), id="Tsallis"),
    pytest.param(fd.Kaniadakis(0.3), id="Kaniadakis", marks=pytest.mark.slow),
    pytest.param(fd.Renyi(2.0), id="Renyi"),
    pytest.param(fd.SharmaMittal(1.5, 0.5), id="SharmaMittal"),
]


def _state(rng, overdamped):
    """An arbitrary state: one key exactly at 0 (a face of the simplex), off the unit sphere
    by 1 % (the chart's return terms are active), moving."""
    rho = rng.dirichlet(np.ones(N))
    rho[2] = 0.0
    x = jnp.asarray(np.sqrt(rho) * 1.01)
    return x if overdamped else (x, jnp.asarray(0.1 * rng.normal(size=N)))


def _dense(lin):
    n = lin.L.shape[0]
    J = np.zeros((n * N, n * N))
    for i in range(n):
        for j in range(n):
            J[i * N:(i + 1) * N, j * N:(j + 1) * N] += np.diag(np.asarray(lin.L[i, j]))
    return J + np.asarray(lin.P).reshape(n * N, -1) @ np.asarray(lin.W).reshape(-1, n * N)


@pytest.mark.parametrize("overdamped", [False, True], ids=["inertial", "overdamped"])
@pytest.mark.parametrize("entropy", FAMILIES)
def test_structured_jacobian_is_the_fields_jacobian(entropy, overdamped):
    """`split_field` reproduces the chart's field, and `linearize`'s L + P W^T equals the
    dense Jacobian of `SphereCoordinates`' field (jax.jacfwd) to 1e-13 (measured <= 4.4e-16:
    both are exact derivatives of the same arithmetic, summed in another order); the
    Woodbury solve of (I - cJ) r equals numpy's dense solve to 1e-12 (measured <= 4.4e-16)."""
    rng = np.random.default_rng(3)
    system = FisherSystem(entropy, jnp.asarray(rng.normal(size=N)), jnp.asarray(0.7),
                          jnp.asarray(1.3), jnp.asarray(2.0))
    coords = SphereCoordinates()
    y = _state(rng, overdamped)
    f = coords.overdamped_field if overdamped else coords.vector_field
    s, F = split_field(overdamped)
    for a, b in zip(jax.tree.leaves(F(y, s(y, system), system)), jax.tree.leaves(f(None, y, system))):
        np.testing.assert_allclose(a, b, atol=1e-14, rtol=0)

    def flat_field(u):
        state = u if overdamped else (u[:N], u[N:])
        return jnp.concatenate(jax.tree.leaves(f(None, state, system)))

    J = np.asarray(jax.jacfwd(flat_field)(jnp.concatenate(jax.tree.leaves(y))))
    lin = linearize(y, system, overdamped)
    np.testing.assert_allclose(_dense(lin), J, atol=1e-13, rtol=0)
    n = 1 if overdamped else 2
    r = rng.normal(size=(n, N))
    for c in (0.37, 25.0):
        got = np.asarray(structured_solve(lin, c, jnp.asarray(r))).reshape(-1)
        ref = np.linalg.solve(np.eye(n * N) - c * J, r.reshape(-1))
        np.testing.assert_allclose(got, ref, atol=1e-12 * np.abs(ref).max(), rtol=0)


@pytest.mark.parametrize("mass, times", [
    pytest.param(1.0, (3.0, 30.0, 300.0), id="inertial"),
    pytest.param(0.0, (3.0, 30.0), id="overdamped", marks=pytest.mark.slow),
])
def test_kvaerno5_block_follows_the_tsit5_path(mass, times):
    """Stopped by t1 before the steady state, the block's end point is the state of the
    dynamics at t1: relax with the stiff default (Kvaerno5, its stages solved with the
    structured Newton matrix) and with Tsit5, both at rtol 1e-10, agree to 1e-8 at each t1
    (where both bound each step's error near 1e-10; a wrong stage weight or error estimate
    shows up at 1e-4 or above; the Jacobian, which only sets how fast Newton converges, is
    checked on its own above)."""
    z = np.random.default_rng(11).normal(size=(3, 12))
    entropy = fd.Tsallis(1.5)
    for t1 in times:
        kw = dict(mass=mass, damping=2.0, t1=t1, rtol=1e-10, atol=1e-12, throw=False)
        stiff = fd.relax(entropy, z, 1.0, solver="kvaerno5", **kw)
        explicit = fd.relax(entropy, z, 1.0, solver="tsit5", **kw)
        assert set(stiff.result_name) <= {"steady_state_not_reached", "successful"}
        np.testing.assert_allclose(stiff.rho_end, explicit.rho_end, atol=1e-8, rtol=0)


def test_stiff_path_selects_the_same_branch():
    """Renyi q = 3 with close top scores has two stable self-consistent branches; from 12
    random starts the stiff block (Kvaerno5) and Tsit5 land on the same branch every time,
    at the same fixed point to 1e-10 (the polish tolerance is 1e-12), and both branches are
    reached (so the check can fail)."""
    entropy, z = fd.Renyi(3.0), np.array([1.0, 0.95, 0.0, -0.5, -1.0])
    rho0 = np.random.default_rng(0).dirichlet(0.7 * np.ones(5), size=12)
    Z = np.broadcast_to(z, (12, 5))
    kw = dict(mass=1.0, damping=np.ones(12), rho0=rho0)
    stiff = np.asarray(fd.relax(entropy, Z, 1.0, solver="kvaerno5", **kw).rho)
    explicit = np.asarray(fd.relax(entropy, Z, 1.0, solver="tsit5", **kw).rho)
    np.testing.assert_allclose(stiff, explicit, atol=1e-10, rtol=0)
    assert len({tuple(np.round(r, 6)) for r in stiff}) == 2


@pytest.mark.parametrize("entropy", [
    pytest.param(fd.Tsallis(1.5), id="Tsallis"),
    pytest.param(fd.SharmaMittal(1.5, 0.5), id="SharmaMittal", marks=pytest.mark.slow),
])
def test_stiff_path_with_masked_keys(entropy):
    """Padding each problem with masked keys leaves the stiff block's fixed point exact: 0
    on the masked keys and `stationary`'s on the others, to 1e-10."""
    z = np.random.default_rng(5).normal(size=(4, 9))
    mask = np.ones((4, 9), bool)
    mask[:, 6:] = False
    mask[1, 3] = False
    sol = fd.relax(entropy, np.where(mask, z, -np.inf), 1.0, mass=1.0, damping=2.0, mask=mask,
                   solver="kvaerno5")
    rho = np.asarray(sol.rho)
    assert np.all(rho[~mask] == 0)
    for i in range(4):
        ref = np.asarray(fd.stationary(entropy, z[i][mask[i]], 1.0))
        np.testing.assert_allclose(rho[i][mask[i]], ref, atol=1e-10, rtol=0)


def test_block_rejects_implicit_solvers_it_cannot_write_out():
    """A batch integrated in blocks takes Diffrax's ESDIRK methods as its implicit solvers;
    another implicit solver is refused, with the way out (saveat)."""
    z = np.random.default_rng(2).normal(size=(2, 6))
    with pytest.raises(ValueError, match="ESDIRK.*saveat"):
        fd.relax(fd.Tsallis(1.5), z, 1.0, mass=1.0, damping=2.0, t1=0.5,
                 solver=diffrax.ImplicitEuler(), throw=False)


@pytest.mark.slow
def test_other_implicit_solvers_run_with_saveat():
    """With saveat each problem is solved on its own by Diffrax's own step: implicit Euler
    at rtol 1e-6 to t1 = 0.5 agrees with Tsit5 at rtol 1e-12 to 1e-4 (measured 1.7e-5, the
    first-order method's accumulated error)."""
    z = np.random.default_rng(2).normal(size=(2, 6))
    kw = dict(mass=1.0, damping=2.0, t1=0.5, throw=False)
    got = fd.relax(fd.Tsallis(1.5), z, 1.0, solver=diffrax.ImplicitEuler(), rtol=1e-6,
                   atol=1e-8, saveat=[0.5], **kw)
    ref = fd.relax(fd.Tsallis(1.5), z, 1.0, solver="tsit5", rtol=1e-12, atol=1e-14, **kw)
    np.testing.assert_allclose(got.rho_end, ref.rho_end, atol=1e-4, rtol=0)


def test_stiff_path_in_float32():
    """Float32 scores (a batch of 8: the stiff default) run with float32 tolerances (rtol
    1e-5) and land on `stationary`'s fixed point to 1e-5."""
    z = np.random.default_rng(4).normal(size=(8, 10)).astype(np.float32)
    sol = fd.relax(fd.Tsallis(1.5), z, 1.0, mass=1.0, damping=2.0)
    assert sol.rho.dtype == jnp.float32
    ref = np.asarray(fd.stationary(fd.Tsallis(1.5), z.astype(np.float64), 1.0))
    np.testing.assert_allclose(sol.rho, ref, atol=1e-5, rtol=0)


def test_default_solver_by_batch_size():
    """The cutoff families take the stiff path from 8 problems on (Kvaerno5: about 200
    steps to this batch's steady state at t ~ 10^3) and Tsit5 below it (about 1000 steps);
    the families without a cutoff take Dopri8 either way."""
    z = np.random.default_rng(6).normal(size=(8, 12))
    small = fd.relax(fd.Tsallis(1.5), z[:4], 1.0, mass=1.0, damping=2.0)
    large = fd.relax(fd.Tsallis(1.5), z, 1.0, mass=1.0, damping=2.0)
    n_small, n_large = int(small.stats["num_steps"][0]), int(large.stats["num_steps"][0])
    assert n_large * 3 < n_small, (n_small, n_large)
    np.testing.assert_allclose(large.rho[:4], small.rho, atol=1e-10, rtol=0)
