"""The damped Fisher-Lagrangian dynamics (docs/math.md §6) against independent references:
trajectories, conservation laws, linear response, input contracts, sharding.

References, none sharing code with `fisherdyn`'s dynamics:
- the equations of motion in simplex coordinates, written out again here from docs/math.md §6
  with each family's $h = dS/d\\rho$ typed in from docs/math.md §2 (`helpers.h_reference`),
  integrated by `scipy.integrate.solve_ivp` (DOP853, rtol 1e-12);
- conservation laws: $H$ constant at $\\gamma = 0$, $dH/dt = -\\gamma\\sum\\dot\\rho^2/\\rho$
  (integrated by scipy's cumulative Simpson rule), $\\sum\\rho = 1$;
- closed forms of the linear response (Shannon: $\\omega^2 = T$, critical damping at
  $\\gamma^2 = 4mT$) and rates fitted (Prony's method) from simulated paths.

The fixed points (`relax`) are tested in `test_relax.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
from helpers import h_reference, run_in_fresh_python

import fisherdyn as fd

# --------------------------------------------------------------------------- independent model


def rhs_reference(entropy, z, T, m, gamma):
    """docs/math.md §6 in simplex coordinates: $m(\\ddot\\rho/\\rho - \\dot\\rho^2/(2\\rho^2)) +
    \\gamma\\dot\\rho/\\rho + E - T h = \\lambda$, $\\lambda = \\sum\\rho(E - Th) -
    (m/2)\\sum\\dot\\rho^2/\\rho$; for m = 0 the replicator
    $\\gamma\\dot\\rho = \\rho(\\lambda - g)$."""
    z = np.asarray(z, float)
    n = z.size

    def rhs(t, y):
        rho = y[:n]
        g = -z - T * h_reference(entropy, rho)
        if m == 0:
            lam = np.sum(rho * g)
            return rho * (lam - g) / gamma
        v = y[n:]
        lam = np.sum(rho * g) - 0.5 * m * np.sum(v**2 / rho)
        acc = (rho * (lam - g) - gamma * v) / m + 0.5 * v**2 / rho
        return np.concatenate([v, acc])

    return rhs


def scipy_path(entropy, z, T, m, gamma, rho0, v0, ts):
    y0 = np.asarray(rho0, float) if m == 0 else np.concatenate([rho0, v0])
    sol = scipy.integrate.solve_ivp(
        rhs_reference(entropy, z, T, m, gamma),
        (0.0, float(ts[-1])),
        y0,
        method="DOP853",
        t_eval=np.asarray(ts),
        rtol=1e-12,
        atol=1e-14,
    )
    assert sol.success
    return sol.y.T


# --------------------------------------------------------------------------- trajectories


# Tests that integrate Kaniadakis(0.3) with N = 4 keys all save on 4001 points with Dopri8,
# so they share one compiled solve (times, tolerances and parameters are traced).
N_SAVE = 4001

CHART_CASES = [
    # (entropy, mass, damping): an interior path (no weight reaches 0), and the overdamped flow
    (fd.Kaniadakis(0.3), 1.0, 1.2),
    (fd.Shannon(), 0.0, 2.0),
]


@pytest.mark.parametrize("entropy,mass,damping", CHART_CASES)
def test_charts_agree_with_each_other_and_scipy(entropy, mass, damping):
    z = np.array([0.9, 0.1, -0.4, 0.3])
    T = 0.7
    rho0 = np.array([0.1, 0.2, 0.3, 0.4])
    v0 = None if mass == 0 else np.array([0.05, -0.1, 0.02, 0.03])
    kw = dict(
        mass=mass,
        damping=damping,
        rho0=rho0,
        velocity0=v0,
        t1=8.0,
        saveat=np.linspace(0.0, 8.0, N_SAVE),
        rtol=1e-11,
        atol=1e-13,
        solver="dopri8",
    )
    sph = fd.simulate(entropy, z, T, coords="sphere", **kw)
    smp = fd.simulate(entropy, z, T, coords="simplex", **kw)
    assert sph.result == fd.RESULTS.successful
    assert smp.result == fd.RESULTS.successful  # interior path: no boundary event
    ref = scipy_path(entropy, z, T, mass, damping, rho0, v0, np.asarray(sph.ts))
    n = z.size
    # reference: scipy DOP853 at rtol 1e-12 on the equations above; tolerance 1e-8 (both
    # integrations run at rtol 1e-11)
    for traj in (sph, smp):
        np.testing.assert_allclose(traj.rho, ref[:, :n], atol=1e-8, rtol=0)
        if mass > 0:
            np.testing.assert_allclose(traj.rho_dot, ref[:, n:], atol=1e-8, rtol=0)
    np.testing.assert_allclose(sph.rho, smp.rho, atol=1e-9, rtol=0)
    np.testing.assert_allclose(sph.lam, smp.lam, atol=1e-8, rtol=0)
    np.testing.assert_allclose(sph.energy, smp.energy, atol=1e-8, rtol=0)
    # sum rho = 1 to round-off in both charts (simplex: Runge-Kutta keeps linear invariants)
    for traj in (sph, smp):
        assert np.max(np.abs(np.sum(traj.rho, -1) - 1)) <= 1e-13
        assert np.min(traj.rho) >= 0


def _energy_problem():
    return fd.Kaniadakis(0.3), np.array([1.1, -0.2, 0.4, -0.9]), 0.6


@pytest.mark.parametrize("damping", [0.0, 1.0])
def test_energy_balance(damping):
    """gamma = 0: H conserved to 1e-8 relative on [0, 100]; gamma > 0: H(t) - H(0) equals
    -gamma * int sum rhodot^2/rho dt on [0, 20] (scipy's cumulative Simpson rule on the saved
    path, step 0.005: 1e-8 relative), H decreasing. One compiled solve serves both."""
    entropy, z, T = _energy_problem()
    t1 = 100.0 if damping == 0 else 20.0
    ts = np.linspace(0.0, t1, N_SAVE)
    tr = fd.simulate(
        entropy,
        z,
        T,
        mass=1.0,
        damping=damping,
        rho0=[0.4, 0.1, 0.3, 0.2],
        velocity0=[0.1, -0.05, 0.0, -0.05],
        t1=t1,
        saveat=ts,
        rtol=1e-12,
        atol=1e-14,
        solver="dopri8",
    )
    assert tr.result == fd.RESULTS.successful
    H = np.asarray(tr.energy)
    rho, rho_dot = np.asarray(tr.rho), np.asarray(tr.rho_dot)
    assert np.max(np.abs(rho.sum(-1) - 1)) <= 1e-14 and rho.min() >= 0
    if damping == 0:
        assert np.max(np.abs(H - H[0])) <= 1e-8 * abs(H[0])
        # the path is not trivially at rest: it swings through a good part of the simplex,
        # close to its boundary (where the sphere chart's force is least smooth)
        assert np.ptp(rho[:, 0]) > 0.1 and rho.min() < 1e-3
    else:
        D = np.where(rho > 0, rho_dot**2 / np.where(rho > 0, rho, 1.0), 0.0).sum(-1)
        loss = damping * scipy.integrate.cumulative_simpson(D, x=ts, initial=0.0)
        drop = H[0] - H
        assert np.max(np.abs(drop - loss)) <= 1e-8 * drop[-1]
        assert np.all(np.diff(H) <= 1e-12)
        assert drop[-1] > 0.1


def test_simplex_chart_reports_boundary_hit_sphere_passes_through():
    """Large score gap, little damping: a weight reaches 0 in finite time (Laraki &
    Mertikopoulos 2015). The simplex chart stops there with `boundary_reached` and no NaN;
    the sphere chart integrates through ($x_i$ crosses 0) and agrees with it before the hit."""
    entropy, z, T = fd.Tsallis(2.0), np.array([3.0, 0.0, -3.0]), 1.0
    kw = dict(mass=1.0, damping=0.05, t1=10.0, saveat=101, rtol=1e-10, atol=1e-12)
    smp = fd.simulate(entropy, z, T, coords="simplex", **kw)
    sph = fd.simulate(entropy, z, T, coords="sphere", **kw)
    assert smp.result == fd.RESULTS.boundary_reached
    assert sph.result == fd.RESULTS.successful
    t_hit = float(smp.t_final)
    assert 0 < t_hit < 10.0
    for leaf in jax.tree_util.tree_leaves(smp):
        if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating):
            assert not np.any(np.isnan(np.asarray(leaf)))
    reached = np.isfinite(np.asarray(smp.ts))
    assert reached.sum() >= 2 and not reached[-1]
    # before the event both charts follow the same path (reference: each other)
    np.testing.assert_allclose(smp.rho[reached], sph.rho[reached], atol=1e-7, rtol=0)
    # the sphere path goes on: at t_hit the weight is 0 (x_3 crosses 0) and it comes back
    at_hit = fd.simulate(entropy, z, T, coords="sphere", **{**kw, "t1": t_hit})
    assert float(at_hit.rho_final[2]) < 1e-7
    assert np.max(np.asarray(sph.rho)[np.asarray(sph.ts) > t_hit, 2]) > 0.1
    assert np.max(np.abs(np.sum(sph.rho, -1) - 1)) <= 1e-14 and np.min(sph.rho) >= 0


# --------------------------------------------------------------------------- linear response


def prony_rates(delta, h):
    """Fit $\\delta_{n+2} = a\\delta_{n+1} + b\\delta_n$ (least squares) and return the two
    continuous-time rates $\\log(z)/h$, $z^2 = az + b$: exact for a damped 2nd-order mode."""
    A = np.stack([delta[1:-1], delta[:-2]], 1)
    (a, b), *_ = np.linalg.lstsq(A, delta[2:], rcond=None)
    roots = np.roots([1.0, -a, -b]).astype(complex)
    return np.log(roots) / h


def _perturbed(rho_star, mode, eps):
    x = np.sqrt(rho_star) + eps * mode
    return x**2 / np.sum(x**2)


def test_linear_response_matches_spectrum():
    """Kaniadakis, under-damped: the rates fitted from paths started along each mode match
    relaxation_spectrum to 1e-3 relative (decay rate and frequency)."""
    entropy, z, T, m, gamma = fd.Kaniadakis(0.3), np.array([1.0, 0.3, -0.5, 0.2]), 1.0, 1.0, 0.3
    st = np.asarray(fd.stationary(entropy, z, T))
    sp = fd.relaxation_spectrum(entropy, z, T, mass=m, damping=gamma)
    modes = np.asarray(sp.modes)
    assert np.all(sp.regime == fd.REGIMES.underdamped)
    # the spread spectrum of a non-Shannon family (docs/math.md §6)
    assert np.ptp(np.asarray(sp.omega2)) > 0.05
    h, eps = 0.01, 1e-6
    ts = np.arange(N_SAVE) * h
    for k in range(3):
        tr = fd.simulate(
            entropy,
            z,
            T,
            mass=m,
            damping=gamma,
            rho0=_perturbed(st, modes[:, k], eps),
            t1=ts[-1],
            saveat=ts,
            rtol=1e-12,
            atol=1e-16,
            solver="dopri8",
        )
        delta = (np.sqrt(np.asarray(tr.rho)) - np.sqrt(st)) @ modes[:, k]
        fit = prony_rates(delta, h)
        want = np.asarray(sp.rates[k])
        fit = fit[np.argsort(-fit.imag)]
        want = want[np.argsort(-want.imag)]
        np.testing.assert_allclose(fit, want, rtol=1e-3)


def test_shannon_isotropic_and_critical():
    """Shannon: every omega_k^2 = T (closed form); at gamma^2 = 4mT the fitted rates are a
    double real root -gamma/(2m) and the deviation never changes sign; 10% less damping
    oscillates."""
    entropy, z, T, m = fd.Shannon(), np.array([1.0, 0.3, -0.5, 0.2]), 0.8, 1.0
    gc = 2 * np.sqrt(m * T)
    sp = fd.relaxation_spectrum(entropy, z, T, mass=m, damping=gc)
    np.testing.assert_allclose(sp.omega2, T, rtol=1e-12)
    assert np.all(sp.regime == fd.REGIMES.critical)
    st = np.asarray(fd.stationary(entropy, z, T))
    mode = np.asarray(sp.modes)[:, 0]
    h, eps = 0.1, 1e-6
    ts = np.arange(0, 301) * h
    rho0 = _perturbed(st, mode, eps)
    tr = fd.simulate(
        entropy,
        np.broadcast_to(z, (2, 4)),
        T,
        mass=m,
        damping=np.array([gc, 0.9 * gc]),
        rho0=rho0,
        t1=ts[-1],
        saveat=ts,
        rtol=1e-12,
        atol=1e-16,
        solver="dopri8",
    )
    d_crit, d_under = ((np.sqrt(np.asarray(r)) - np.sqrt(st)) @ mode for r in tr.rho)
    fit = prony_rates(d_crit, h)
    np.testing.assert_allclose(fit.real, -gc / (2 * m), rtol=1e-3)
    assert np.all(np.abs(fit.imag) <= 1e-3 * gc / (2 * m))
    # past t ~ 20 the deviation (1e-6 e^{-0.89 t}) is below the rounding of sqrt(rho) ~ 0.5,
    # where its sign is noise: a sign change must exceed that rounding to count
    noise = 16 * np.finfo(float).eps
    assert np.all(d_crit > -noise)
    assert np.any(d_under < -noise)
    fit_u = prony_rates(d_under, h)
    want = np.sqrt(4 * m * T - (0.9 * gc) ** 2) / (2 * m)
    np.testing.assert_allclose(np.sort(np.abs(fit_u.imag)), [want, want], rtol=1e-3)


# --------------------------------------------------------------------------- API contracts


def test_invalid_initial_conditions_are_clear_errors():
    z = np.array([0.5, 0.0, -0.5])
    with pytest.raises(ValueError, match="simplex"):
        fd.simulate(fd.Shannon(), z, rho0=[0.5, 0.4, 0.2])
    with pytest.raises(ValueError, match="simplex"):
        fd.simulate(fd.Shannon(), z, rho0=[1.2, -0.1, -0.1])
    with pytest.raises(ValueError, match="tangent"):
        fd.simulate(fd.Shannon(), z, rho0=[0.5, 0.3, 0.2], velocity0=[0.1, 0.0, 0.0])
    with pytest.raises(ValueError, match="tangent"):
        fd.simulate(fd.Tsallis(2.0), z, rho0=[0.5, 0.5, 0.0], velocity0=[0.1, 0.0, -0.1])
    with pytest.raises(ValueError, match="first order"):
        fd.simulate(fd.Shannon(), z, mass=0.0, velocity0=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="damping > 0"):
        fd.relax(fd.Shannon(), z, mass=1.0, damping=0.0)
    with pytest.raises(ValueError, match="T must"):
        fd.simulate(fd.Shannon(), z, -1.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tol=-1.0), "tol must be finite and > 0"),
        (dict(polish_tol=0.0), "polish_tol must be finite and > 0"),
        (dict(rtol=0.0, atol=0.0), "rtol and atol cannot both be 0"),
        (dict(atol=np.nan), "atol must be finite"),
        (dict(rtol=-1e-3), "rtol must be finite and >= 0"),
        (dict(t1=-2.0), "t1 must be finite and > 0"),
    ],
)
def test_invalid_tolerances_are_clear_errors(kwargs, message):
    """Tolerances out of range raise at the call, instead of running until t1 and only then
    reporting that no steady state was reached."""
    z = np.array([0.5, 0.0, -0.5])
    with pytest.raises(ValueError, match=message):
        fd.relax(fd.Shannon(), z, mass=1.0, damping=1.0, **kwargs)
    if "tol" not in kwargs and "polish_tol" not in kwargs:
        with pytest.raises(ValueError, match=message):
            fd.simulate(fd.Shannon(), z, **kwargs)


def test_half_precision_scores_integrate_in_float32():
    """bfloat16 scores are integrated in float32 (an adaptive solver cannot resolve its
    tolerances in 8 mantissa bits): relax returns float32 weights equal to the float32
    stationary map of the same scores to 1e-5 (float32 polish tolerance)."""
    z = jnp.asarray([1.0, 0.2, -0.5, 0.7], jnp.bfloat16)
    sol = fd.relax(fd.Tsallis(1.5), z, 1.0, mass=1.0, damping=1.0)
    assert sol.rho.dtype == jnp.float32
    ref = fd.stationary(fd.Tsallis(1.5), z.astype(jnp.float32), 1.0)
    np.testing.assert_allclose(sol.rho, ref, atol=1e-5, rtol=0)


_SHARDED_SCRIPT = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import fisherdyn as fd
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    assert len(jax.devices()) == 2
    Z = np.random.default_rng(0).normal(size=(8, 5))
    p = np.exp(Z - Z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((2,), ("batch",), axis_types=(kind,))
        Zs = jax.device_put(Z, NamedSharding(mesh, P("batch")))
        sol = fd.relax(fd.Shannon(), Zs, 1.0, mass=1.0, damping=1.5)
        np.testing.assert_allclose(np.asarray(sol.rho), p, atol=1e-10, rtol=0)
        for out in (sol.rho, fd.stationary(fd.Tsallis(1.5), Zs, 1.0)):
            assert len(out.sharding.device_set) == 2 and not out.sharding.is_fully_replicated
            assert out.sharding.shard_shape(out.shape)[0] == 4, out.sharding
    tr = fd.simulate(fd.Shannon(), Zs, 1.0, t1=2.0, saveat=np.linspace(0.0, 2.0, 3))
    assert tr.rho.sharding.shard_shape(tr.rho.shape)[0] == 4
    print("ok")
    """
)


def test_sharded_batch_runs_split_over_devices():
    """A batch placed on two devices with `jax.sharding` (explicit and automatic mesh axes)
    is solved where it lies: `relax`, `stationary` and `simulate` return outputs split
    4 + 4 over the two devices (no gather onto one), and the fixed points equal softmax
    (closed form) to 1e-10. Runs in a subprocess with two virtual CPU devices."""
    # the CPU backend explicitly: on a machine with a GPU, JAX would default to that one device
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    run = subprocess.run(
        [sys.executable, "-c", _SHARDED_SCRIPT], env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")


def test_batched_simulate_in_a_jit_compiles_without_xla_log_noise():
    """A batch of problems sharing one end time and save times, simulated inside the caller's
    jit: the problems' copies of those times were broadcasts XLA's algebraic simplifier
    looped on (a page of "circular simplification loop" lines on stderr per compilation).
    Run in a fresh interpreter, so that the program is compiled there and stderr is its own;
    the batch is checked against the same problems simulated one at a time, to 1e-12 (the
    same solver per problem; batching may change only round-off)."""
    script = (
        "import jax, jax.numpy as jnp, numpy as np, fisherdyn as fd\n"
        "jax.config.update('jax_enable_x64', True)\n"
        "rng = np.random.default_rng(0)\n"
        "s, z0 = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))\n"
        "rho0 = np.asarray(jax.nn.softmax(z0, -1))\n"
        "ts = jnp.linspace(0.0, 3.0, 6)\n"
        "def sim(p, s, rho0, ts):\n"
        "    m, g, T = jnp.exp(p)\n"
        "    return fd.simulate(fd.Shannon(), s, T, mass=m, damping=g, rho0=rho0,\n"
        "                       velocity0=jnp.zeros_like(rho0), t1=ts[-1], saveat=ts).rho\n"
        "p = jnp.zeros(3)\n"
        "batch = jax.jit(sim)(p, s, rho0, ts)\n"
        "one = np.stack([sim(p, s[i], rho0[i], ts) for i in range(4)])\n"
        "print(float(np.max(np.abs(np.asarray(batch) - one))))\n"
    )
    out = run_in_fresh_python(script)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) < 1e-12, out.stdout
    assert "circular simplification loop" not in out.stderr, out.stderr[:2000]
