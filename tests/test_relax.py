"""Fixed points of the damped dynamics (`relax`, docs/math.md §6) against the stationary
operators, and the contracts of `relax`: batching, tracing, derivatives, scaling in N.

References: `fisherdyn.stationary` and the direct root solver
`fisherdyn.solve_stationary(method="scipy")` (scipy brentq), `stationary_branches`, closed
forms (softmax and its Jacobian), central differences.

Compiled solves dominate the runtime: every fixed-point test uses N = 5 keys and batches all
its cases into one call per family, so each family compiles once per (inertial, overdamped).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DYNAMICS_FAMILIES as FAMILIES

import fisherdyn as fd


# --------------------------------------------------------------------------- fixed points

FP_SCORES = np.array([[1.3, 0.2, -0.7, 0.5, -1.6], [0.4, 2.0, -0.3, 1.1, 0.0]])
FP_TEMPS = np.array([0.5, 1.5])


def _references(entropy):
    """stationary (one batched call) and solve_stationary(method="scipy") for the 4 cases."""
    Z = np.repeat(FP_SCORES, 2, 0)
    TT = np.tile(FP_TEMPS, 2)
    st = np.asarray(fd.stationary(entropy, Z, TT))
    solve = getattr(fd, "solve_stationary", None)
    direct = (
        [None] * 4
        if solve is None
        else [np.asarray(solve(entropy, z, T, method="scipy").rho) for z, T in zip(Z, TT)]
    )
    if isinstance(entropy, (fd.Renyi, fd.SharmaMittal)):
        # the comparison is meaningful only where the self-consistent branch is unique
        for z, T in zip(Z, TT):
            assert int(fd.stationary_branches(entropy, z, T).count) == 1
    return Z, TT, st, direct


# one solve per family compiles a program each: four families run by default, Abe, Burg
# and Sharma-Mittal (covered by the same code paths) with -m slow
_SLOW_FAMILIES = (fd.Abe, fd.Burg, fd.SharmaMittal)


def _family_params():
    return [pytest.param(e, id=type(e).__name__,
                         marks=[pytest.mark.slow] if isinstance(e, _SLOW_FAMILIES) else [])
            for e in FAMILIES]


def _check_fixed_points(got, st, direct, residual):
    for rho, ref, ref_direct in zip(got, st, direct):
        np.testing.assert_allclose(rho, ref, atol=1e-10, rtol=0)
        if ref_direct is not None:
            np.testing.assert_allclose(rho, ref_direct, atol=1e-10, rtol=0)
        np.testing.assert_array_equal(rho == 0, ref == 0)  # Tsallis: the exact support
    assert np.all(np.asarray(residual) <= 1e-12)


@pytest.mark.parametrize("entropy", _family_params())
def test_relax_matches_stationary(entropy):
    """relax = stationary = solve_stationary to 1e-10 for 2 score vectors x 2 temperatures x
    {under-damped, critical, over-damped} (one batched call)."""
    Z, TT, st, direct = _references(entropy)
    # damping regimes from the softest / stiffest mode at the stationary point
    m = 1.0
    w2 = np.stack(
        [  # the spectrum at each case's own temperature
            np.asarray(fd.relaxation_spectrum(entropy, z, T, mass=m, damping=1.0, rho=r).omega2)
            for z, T, r in zip(Z, TT, st)
        ]
    )
    assert np.all(w2 > 0)
    G = np.stack(
        [
            0.3 * 2 * np.sqrt(m * w2.min(1)),
            2 * np.sqrt(m * w2.min(1)),
            1.5 * 2 * np.sqrt(m * w2.max(1)),
        ],
        1,
    )  # (case, regime)
    sol = fd.relax(entropy, np.repeat(Z, 3, 0), np.repeat(TT, 3), mass=m, damping=G.ravel())
    _check_fixed_points(
        np.asarray(sol.rho),
        np.repeat(st, 3, 0),
        [d for d in direct for _ in range(3)],
        sol.residual,
    )
    if isinstance(entropy, fd.Tsallis):
        assert np.any(np.asarray(sol.rho) == 0)  # the cases do exercise a sparse support


# The overdamped flow compiles a second program per family: four families run by default,
# the others with -m slow (keeps this file under its time budget).
_FAST_FLOW = (fd.Shannon, fd.Tsallis, fd.Renyi, fd.Kaniadakis)


@pytest.mark.parametrize(
    "entropy",
    [
        pytest.param(
            p.values[0],
            id=p.id,
            marks=list(p.marks)
            + ([] if isinstance(p.values[0], _FAST_FLOW) else [pytest.mark.slow]),
        )
        for p in _family_params()
    ],
)
def test_overdamped_flow_matches_stationary(entropy):
    """The replicator flow (m = 0): relax = stationary = solve_stationary to 1e-10."""
    Z, TT, st, direct = _references(entropy)
    sol = fd.relax(entropy, Z, TT, mass=0.0, damping=1.0)
    _check_fixed_points(np.asarray(sol.rho), st, direct, sol.residual)


def test_renyi_dynamics_lands_on_stable_branches():
    """Renyi q = 3 with tightly separated top scores has three self-consistent branches; the
    damped dynamics from 12 random starts (and the overdamped flow from 4) lands only on the
    two stable ones, reaches both, and the free-energy minimum is among them (reference:
    stationary_branches). Batch sizes match test_relax_matches_stationary[Renyi]: no
    recompilation."""
    entropy, z, T = fd.Renyi(3.0), np.array([1.0, 0.95, 0.0, -0.5, -1.0]), 1.0
    br = fd.stationary_branches(entropy, z, T)
    valid = np.asarray(br.valid)
    rho_b, stable, F = (
        np.asarray(br.rho)[valid],
        np.asarray(br.stable)[valid],
        np.asarray(br.free_energy)[valid],
    )
    assert valid.sum() == 3 and stable.sum() == 2
    rng = np.random.default_rng(0)
    rho0 = rng.dirichlet(0.7 * np.ones(5), size=12)
    landed = set()
    for mass, starts in ((1.0, rho0), (0.0, rho0[:4])):
        b = len(starts)
        sol = fd.relax(
            entropy,
            np.broadcast_to(z, (b, 5)),
            np.full(b, T),
            mass=mass,
            damping=np.ones(b),
            rho0=starts,
        )
        dist = np.abs(np.asarray(sol.rho)[:, None, :] - rho_b[None]).max(-1)
        assert np.all(dist.min(1) <= 1e-10)
        which = dist.argmin(1)
        assert np.all(stable[which])
        landed |= set(which.tolist())
    assert landed == set(np.flatnonzero(stable).tolist())
    assert int(np.argmin(F)) in landed


# --------------------------------------------------------------------------- contracts


def test_batch_of_1024_in_one_compiled_call():
    """jax.vmap of relax over 1024 score vectors and dampings, under one jit; each fixed
    point equals softmax(z/T) (closed form) to 1e-10."""
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(1024, 6))
    gammas = rng.uniform(0.5, 3.0, size=1024)
    fn = jax.jit(jax.vmap(lambda z, g: fd.relax(fd.Shannon(), z, 1.0, mass=1.0, damping=g).rho))
    rho = np.asarray(fn(Z, gammas))
    p = np.exp(Z - Z.max(1, keepdims=True))
    np.testing.assert_allclose(rho, p / p.sum(1, keepdims=True), atol=1e-10, rtol=0)


def test_sweeping_parameters_does_not_recompile(caplog):
    """T, mass, damping, the entropy's parameter and the tolerances are traced: a new sweep
    point reuses the compiled solve (a batch of 12 with N = 5, as in the fixed-point tests)."""
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(12, 5))
    fd.relax(fd.Tsallis(1.5), Z, 1.0, mass=1.0, damping=np.ones(12))
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        caplog.clear()
        sol = fd.relax(
            fd.Tsallis(2.5), Z, 0.7, mass=2.0, damping=np.full(12, 0.5), tol=1e-7, rtol=1e-9
        )
        sol.rho.block_until_ready()
    compiled = [r.getMessage() for r in caplog.records if "_jit_batch" in r.getMessage()]
    assert compiled == []
    np.testing.assert_allclose(sol.rho, fd.stationary(fd.Tsallis(2.5), Z, 0.7), atol=1e-10)
    # never report a run that did not settle as converged (same compiled solve, t1 traced)
    short = fd.relax(
        fd.Tsallis(2.5), Z, 0.7, mass=2.0, damping=np.full(12, 0.5), t1=0.5, throw=False
    )
    assert np.all(np.asarray(short.result == fd.RESULTS.steady_state_not_reached))
    with pytest.raises(Exception, match="steady state"):
        fd.relax(fd.Tsallis(2.5), Z, 0.7, mass=2.0, damping=np.full(12, 0.5), t1=0.5)


def test_fixed_point_is_differentiable():
    """d rho*/dz of relax (forward mode, implicit function theorem through the Newton polish)
    equals the softmax Jacobian (diag(p) - p p^T)/T (closed form), and d rho*/dT matches central
    differences of softmax(z/T)."""
    z, T = np.array([1.0, 0.3, -0.5, 0.2]), 0.8

    def fixed_point(z, T):
        return fd.relax(fd.Shannon(), z, T, mass=1.0, damping=1.0).rho

    J, dT = jax.jacfwd(fixed_point, argnums=(0, 1))(z, T)
    p = np.exp(z / T) / np.sum(np.exp(z / T))
    np.testing.assert_allclose(J, (np.diag(p) - np.outer(p, p)) / T, atol=1e-12)
    h = 1e-6
    sm = lambda t: np.exp(z / t) / np.sum(np.exp(z / t))  # noqa: E731
    np.testing.assert_allclose(dT, (sm(T + h) - sm(T - h)) / (2 * h), atol=1e-8)


@pytest.mark.parametrize(
    "entropy",
    [pytest.param(fd.Kaniadakis(0.3), id="Kaniadakis"), pytest.param(fd.Renyi(2.0), id="Renyi")],
)
def test_fixed_point_reverse_mode_matches_stationary_jacobian(entropy):
    """jax.grad through relax (reverse mode: the polish's implicit adjoint, solved by GMRES)
    equals the same derivative of `stationary`, whose custom JVP is the closed-form Jacobian
    of docs/math.md §3 (with the rank-one M_q correction for Renyi), to 1e-12: the polish's
    Newton tolerance (measured: <= 4e-15)."""
    z, T = FP_SCORES[0], FP_TEMPS[0]
    assert int(fd.stationary_branches(entropy, z, T).count) == 1
    w = np.linspace(1.0, -1.0, z.size)

    def loss_relax(z, T):
        return jnp.dot(w, fd.relax(entropy, z, T, mass=1.0, damping=1.0).rho)

    def loss_stationary(z, T):
        return jnp.dot(w, fd.stationary(entropy, z, T))

    got = jax.grad(loss_relax, argnums=(0, 1))(z, T)
    ref = jax.grad(loss_stationary, argnums=(0, 1))(z, T)
    np.testing.assert_allclose(got[0], ref[0], atol=1e-12)
    np.testing.assert_allclose(got[1], ref[1], atol=1e-12)


def _largest_intermediate(jaxpr):
    """The largest array size in a jaxpr and every jaxpr nested in its equations."""
    big = 0
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            big = max(big, int(np.prod(getattr(v.aval, "shape", ()), dtype=np.int64)))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax.extend.core.Jaxpr):
                    big = max(big, _largest_intermediate(inner))
    return big


def test_relax_is_linear_in_n():
    """The polish solves its bordered-diagonal Newton system matrix-free: nothing of N^2
    entries is ever built, and at N = 2048 relax still matches softmax (closed form) and
    stationary (Kaniadakis) to 1e-10."""
    N = 2048
    Z = np.random.default_rng(5).normal(size=(2, N))
    for entropy in (fd.Shannon(), fd.Kaniadakis(0.3), fd.Renyi(2.0)):
        jaxpr = jax.make_jaxpr(
            lambda z: fd.relax(entropy, z, 1.0, mass=1.0, damping=2.0, throw=False).rho
        )(Z[0]).jaxpr
        assert _largest_intermediate(jaxpr) < N * N // 8, type(entropy).__name__
    p = np.exp(Z - Z.max(1, keepdims=True))
    sol = fd.relax(fd.Shannon(), Z, 1.0, mass=1.0, damping=2.0)
    np.testing.assert_allclose(sol.rho, p / p.sum(1, keepdims=True), atol=1e-10, rtol=0)
    sol = fd.relax(fd.Kaniadakis(0.3), Z, 1.0, mass=1.0, damping=2.0)
    np.testing.assert_allclose(sol.rho, fd.stationary(fd.Kaniadakis(0.3), Z, 1.0), atol=1e-10)
    assert np.all(np.asarray(sol.residual) <= 1e-12)


def test_relax_polish_drops_a_marginal_key():
    """A Renyi(2) problem at N = 4096 (gaussian scores, T = 1) relaxes slowly (boundary modes
    with omega^2 ~ 1e-6, t ~ 530) and its steady-state end point leaves one key just past the
    cutoff on the polish's support (3749 keys instead of 3748). The polish retries on the
    support its Newton multiplier selects: converged, and equal to `stationary` (a separate
    solver) to 1e-10 with the same support."""
    z = np.random.default_rng(0).normal(size=(4, 4096))[3]
    sol = fd.relax(fd.Renyi(2.0), z, 1.0, mass=1.0, damping=2.0, rtol=1e-8, atol=1e-10, tol=1e-6)
    ref = np.asarray(fd.stationary(fd.Renyi(2.0), z, 1.0))
    np.testing.assert_allclose(sol.rho, ref, atol=1e-10, rtol=0)
    np.testing.assert_array_equal(np.asarray(sol.rho) == 0, ref == 0)
    assert float(sol.residual) <= 1e-12


def _tsallis15_closed_form(z, T=1.0):
    """Tsallis(1.5): rho_i = max(0, (z_i + lam) / (3 T))^2 with sum 1, lam by scipy's brentq
    (a closed form and a bracketing root finder, nothing of the library's)."""
    from scipy.optimize import brentq

    def excess(lam):
        return np.sum(np.maximum(0.0, (z + lam) / (3 * T)) ** 2) - 1.0

    lam = brentq(excess, -np.max(z), -np.max(z) + 3 * T + 1.0, xtol=1e-16, rtol=1e-15)
    return np.maximum(0.0, (z + lam) / (3 * T)) ** 2, lam


@pytest.mark.parametrize("row", [41667, 51533])
def test_relax_polish_settles_a_key_within_tolerance_of_the_cutoff(row):
    """Rows of 65,536 gaussian Tsallis(1.5) problems (N = 64, T = 1) with a key whose score
    lies 4.7e-7 (row 41667) or 1.1e-6 (row 51533) inside the cutoff, about the steady-state
    tolerance 1e-6: the run stops with that key's weight near 1e-6, while its exact weight
    is (margin / 3)^2 ~ 1e-13. Row 41667's end point put the key off the support, so Newton
    converged to a point that pulls it inward (support_inconsistent); row 51533's Newton
    reached the weight, but rounding blurs its log beyond Newton's own test in u
    (polish_failed). The fixed point must equal the closed form to 1e-15 with the same
    support, alone and in a block."""
    Z = np.random.default_rng(0).normal(size=(65536, 64))
    z = Z[row]
    ref, lam = _tsallis15_closed_form(z)
    assert 0 < np.min(np.abs(z + lam)) < 2e-6
    kw = dict(mass=1.0, damping=2.0, rtol=1e-8, atol=1e-10, tol=1e-6, throw=False)
    batch = np.concatenate([z[None], Z[:15]])
    for sol in (fd.relax(fd.Tsallis(1.5), z, 1.0, **kw),
                jax.tree.map(lambda a: a[0], fd.relax(fd.Tsallis(1.5), batch, 1.0, **kw))):
        assert sol.result_name == "successful"
        np.testing.assert_allclose(sol.rho, ref, atol=1e-15, rtol=0)
        np.testing.assert_array_equal(np.asarray(sol.rho) > 0, ref > 0)


def test_batch_block_keeps_each_problems_time_and_result():
    """A batch is integrated in blocks as one system, yet each problem keeps its own outcome:
    the problem whose own t1 (1.0) ends long before its steady state (t ~ 15) is
    steady_state_not_reached while the others of its block succeed, at `stationary`'s fixed
    point to 1e-10 (the polish tolerance is 1e-12); each successful problem's `t` is its own
    time of reaching the steady state, within 5 % of the unbatched solve's (the block's steps
    near t ~ 15 are ~0.2 long, so the event times differ by about one step)."""
    z = np.random.default_rng(7).normal(size=(3, 16))
    t1 = jnp.asarray([1e3, 1.0, 1e3])
    sol = fd.relax(fd.Shannon(), z, 1.0, mass=1.0, damping=2.0, t1=t1, throw=False)
    assert list(sol.result_name) == ["successful", "steady_state_not_reached", "successful"]
    exact = np.asarray(fd.stationary(fd.Shannon(), z, 1.0))
    for i in (0, 2):
        np.testing.assert_allclose(sol.rho[i], exact[i], atol=1e-10, rtol=0)
        one = fd.relax(fd.Shannon(), z[i], 1.0, mass=1.0, damping=2.0)
        assert abs(float(sol.t[i]) - float(one.t)) <= 0.05 * float(one.t)
    assert float(sol.t[1]) <= 1.0 + 1e-12


@pytest.mark.parametrize("entropy", [fd.Shannon(), fd.Tsallis(1.5)], ids=["Shannon", "Tsallis"])
def test_batch_block_follows_the_path(entropy):
    """A batch is integrated in blocks by relax's own stepper (Dopri8 written out stage by
    stage for Shannon, Tsit5 for the cutoff family Tsallis in a batch this small; the stiff
    path is tested in test_stiff.py); stopped by t1 = 3, long
    before the steady state, its end point is the state of the dynamics at t = 3:
    `simulate` at rtol 1e-12 (diffrax's Tsit5) agrees to 1e-9 (measured about 5e-12; the
    default rtol 1e-8 bounds each step's error, so a wrong stage, weight or error estimate
    shows up at 1e-8 or above)."""
    z = np.random.default_rng(11).normal(size=(3, 16))
    kw = dict(mass=1.0, damping=2.0, t1=3.0)
    sol = fd.relax(entropy, z, 1.0, throw=False, **kw)
    assert list(sol.result_name) == ["steady_state_not_reached"] * 3
    ref = fd.simulate(entropy, z, 1.0, saveat=2, rtol=1e-12, atol=1e-14, **kw)
    np.testing.assert_allclose(sol.rho_end, ref.rho_final, atol=1e-9, rtol=0)


def test_block_size_follows_solver_and_cores(monkeypatch):
    """On the CPU a block integrated as one system holds 64 problems, or 256 for an explicit
    solver when the process has more than one core (relax uses it: the problems of a block
    share its step count); either way a batch of 300 problems ends where `simulate` at
    rtol 1e-12 does at t1 = 3 (to 1e-9, as above) and relaxes to `stationary` (to 1e-10)."""
    from fisherdyn._dynamics import _batching

    if jax.default_backend() != "cpu":
        pytest.skip("the block sizes are the CPU's")
    z = np.random.default_rng(12).normal(size=(300, 6))
    ref = fd.simulate(fd.Shannon(), z, 1.0, mass=1.0, damping=2.0, t1=3.0, saveat=2,
                      rtol=1e-12, atol=1e-14)
    exact = np.asarray(fd.stationary(fd.Shannon(), z, 1.0))
    for cores, size in ((1, 64), (2, 256)):
        monkeypatch.setattr(_batching, "_cores", lambda cores=cores: cores)
        assert _batching._block_size(system=True, explicit=True) == size
        assert _batching._block_size(system=True, explicit=False) == 64
        jax.clear_caches()  # the block size is read when relax is traced
        end = fd.relax(fd.Shannon(), z, 1.0, mass=1.0, damping=2.0, t1=3.0, throw=False)
        np.testing.assert_allclose(end.rho_end, ref.rho_final, atol=1e-9, rtol=0)
        sol = fd.relax(fd.Shannon(), z, 1.0, mass=1.0, damping=2.0)
        np.testing.assert_allclose(sol.rho, exact, atol=1e-10, rtol=0)
        steps = np.asarray(sol.stats["num_steps"])
        assert all(len(set(steps[i:i + size])) == 1 for i in range(0, 300, size))
        # blocks of 64 stop at their own slowest members: their counts differ
        assert (len(set(steps[:256])) == 1) == (size == 256)
