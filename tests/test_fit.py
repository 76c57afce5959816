"""Fitting the damped Fisher-Lagrangian dynamics to measured paths (`fisherdyn.fit_path`).

The recovery tests simulate paths with `fisherdyn.simulate` (an independent integration of
docs/math.md §6, not the fitter's forward model), add noise, and check that the fitter returns
the generating parameters. All fits share one data shape, so the fitter compiles once.
"""

import numpy as np
import pytest
from helpers import run_in_fresh_python

import fisherdyn as fd

N, K = 6, 11
TIMES = np.linspace(0.0, 5.0, K)
NOISE = 0.005  # multiplicative log-normal noise on every weight (then renormalized)
TRUE_INERTIAL = dict(entropy=fd.Kaniadakis(0.3), mass=0.5, damping=0.8, T=1.5)
TRUE_OVERDAMPED = dict(entropy=fd.Tsallis(1.5), mass=0.0, damping=1.2, T=0.8)
# every fit below shares one compiled program (same data shape and family set)
SHARED = dict(compile_with=(fd.Kaniadakis(0.5), fd.Tsallis(1.7), fd.Shannon()))


def _noisy(rho, rng):
    out = np.asarray(rho) * np.exp(NOISE * rng.normal(size=np.shape(rho)))
    return out / out.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(2, N)) * 1.5
    rho0 = rng.dirichlet(np.full(N, 4.0), size=2)
    v0 = rng.normal(size=(2, N)) * 0.5 * rho0
    v0 -= rho0 * v0.sum(-1, keepdims=True) / rho0.sum(-1, keepdims=True)  # tangent
    p = TRUE_INERTIAL
    inertial = fd.simulate(p["entropy"], z, p["T"], mass=p["mass"], damping=p["damping"],
                           rho0=rho0, velocity0=v0, saveat=TIMES, t1=TIMES[-1])
    p = TRUE_OVERDAMPED
    over = fd.simulate(p["entropy"], z, p["T"], mass=0.0, damping=p["damping"], rho0=rho0,
                       saveat=TIMES, t1=TIMES[-1])
    return dict(z=z, v0=v0, inertial=_noisy(inertial.rho, rng), overdamped=_noisy(over.rho, rng))


@pytest.fixture(scope="module")
def inertial_fit(data):
    return fd.fit_path(fd.Kaniadakis(0.5), data["z"], data["inertial"], times=TIMES,
                       restarts=4, steps=40, seed=0, **SHARED)


def test_fisher_rao_distance():
    # References: the definition 2 arccos(sum sqrt(p q)) in NumPy at moderate distances
    # (1e-12); the Fisher metric d^2 ~ sum(drho^2 / rho) for a small step (relative 1e-3
    # at |drho_i| ~ 1e-4 rho_i); pi for disjoint supports (exact).
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7), size=(2, 5))
    ref = 2 * np.arccos(np.sum(np.sqrt(p * q), -1))
    np.testing.assert_allclose(np.asarray(fd.fisher_rao_distance(p, q)), ref, rtol=1e-12)
    step = 1e-4 * p * rng.normal(size=p.shape)
    step -= p * step.sum(-1, keepdims=True)  # tangent to the simplex, |step_i| << p_i
    small = np.asarray(fd.fisher_rao_distance(p, p + step))
    np.testing.assert_allclose(small, np.sqrt(np.sum(step**2 / p, -1)), rtol=1e-3)
    np.testing.assert_array_equal(np.asarray(fd.fisher_rao_distance(p, p)), 0.0)
    a, b = np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.0, 1.0])
    assert float(fd.fisher_rao_distance(a, b)) == pytest.approx(np.pi, abs=1e-14)


def test_geodesic_interpolation():
    # Reference: constant-speed geodesic, d(p, g(s)) = s d(p, q) and d(g(s), q) = (1-s) d
    # for s in [0, 1], continuing past q at the same speed (1e-10), endpoints exact (1e-13).
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.full(5, 3.0), size=2)
    d = float(fd.fisher_rao_distance(p, q))
    np.testing.assert_allclose(np.asarray(fd.geodesic_interpolation(p, q, 0.0)), p, atol=1e-13)
    np.testing.assert_allclose(np.asarray(fd.geodesic_interpolation(p, q, 1.0)), q, atol=1e-13)
    s = np.array([0.25, 0.5, 0.9, 1.3])
    g = np.asarray(fd.geodesic_interpolation(p[None], q[None], s))
    np.testing.assert_allclose(g.sum(-1), 1.0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(fd.fisher_rao_distance(p, g)), s * d, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(fd.fisher_rao_distance(g, q)), np.abs(1 - s) * d,
                               rtol=1e-9)


def test_recovers_inertial_parameters(data, inertial_fit):
    # Reference: the parameters that generated the paths (fd.simulate, Kaniadakis(0.3),
    # m = 0.5, gamma = 0.8, T = 1.5, a nonzero initial velocity), 0.5% noise. Tolerances:
    # 10% on m and gamma, 5% on T, 0.05 on kappa, 0.02 on each component of rho_dot(0)
    # (their spread over noise seeds is a few times smaller).
    f = inertial_fit
    p = TRUE_INERTIAL
    assert f.family == "Kaniadakis" and not f.overdamped and f.batch_shape == (2,)
    assert np.all(np.asarray(f.success)) and not np.any(np.asarray(f.at_bound))
    np.testing.assert_allclose(np.asarray(f.mass), p["mass"], rtol=0.10)
    np.testing.assert_allclose(np.asarray(f.damping), p["damping"], rtol=0.10)
    np.testing.assert_allclose(np.asarray(f.T), p["T"], rtol=0.05)
    np.testing.assert_allclose(np.asarray(f.shape), 0.3, atol=0.05)
    np.testing.assert_allclose(np.asarray(f.velocity0), data["v0"], atol=0.02)
    # the residual is the noise: rms FR distance per layer ~ NOISE sqrt(N - 1) / 2 x 2
    rms = np.sqrt(np.asarray(f.loss) / (K - 1))
    assert np.all(rms < 3 * NOISE * np.sqrt(N - 1))
    # damping ratio about the fixed point: zeta = gamma / (2 sqrt(m omega_min^2)), with
    # omega^2 from fd.relaxation_spectrum at the generating parameters (rel 15%)
    spec = fd.relaxation_spectrum(p["entropy"], data["z"][0], p["T"], mass=p["mass"],
                                  damping=p["damping"])
    zeta = p["damping"] / (2 * np.sqrt(p["mass"] * float(np.min(spec.omega2))))
    assert float(f.zeta[0]) == pytest.approx(zeta, rel=0.15)
    assert float(f.relaxation_time[0]) == pytest.approx(1 / float(spec.slowest_rate), rel=0.15)


def test_fit_bookkeeping(inertial_fit):
    # References: the definitions. loss = sum of squared distances over the fitted layers;
    # n_obs = (fitted layers after layer 0) x (N - 1); AIC = n ln(RSS/n) + 2k,
    # BIC = n ln(RSS/n) + k ln n with k = 3 + 1 + (N - 1); predict() at the data times
    # reproduces the fitted trajectory (same integrator, 1e-6).
    f = inertial_fit
    d = np.asarray(f.distances)
    np.testing.assert_allclose(np.asarray(f.loss), np.sum(d**2, -1), rtol=1e-12)
    n = (K - 1) * (N - 1)
    k = 3 + 1 + (N - 1)
    assert f.n_params == k
    np.testing.assert_array_equal(np.asarray(f.n_obs), n)
    rss = np.asarray(f.loss)
    np.testing.assert_allclose(np.asarray(f.aic), n * np.log(rss / n) + 2 * k, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(f.bic), n * np.log(rss / n) + k * np.log(n),
                               rtol=1e-12)
    np.testing.assert_allclose(np.asarray(f.predict(TIMES)), np.asarray(f.rho), atol=1e-6)


def test_recovers_overdamped_parameters_and_family(data, inertial_fit):
    # Reference: the replicator flow (m = 0) that generated the paths, Tsallis(1.5),
    # gamma = 1.2, T = 0.8, 0.5% noise: gamma and T within 5%, q within 0.05. The same
    # paths are not explained by Shannon as well: its loss is > 5x larger. The inertial
    # Kaniadakis paths are not explained by Kaniadakis' overdamped flow either (> 5x).
    f = fd.fit_path(fd.Tsallis(1.7), data["z"], data["overdamped"], times=TIMES,
                    overdamped=True, restarts=4, steps=40, seed=0, **SHARED)
    assert f.overdamped and f.n_params == 3
    np.testing.assert_array_equal(np.asarray(f.mass), 0.0)
    np.testing.assert_allclose(np.asarray(f.damping), 1.2, rtol=0.05)
    np.testing.assert_allclose(np.asarray(f.T), 0.8, rtol=0.05)
    np.testing.assert_allclose(np.asarray(f.shape), 1.5, atol=0.05)
    assert np.all(np.isinf(np.asarray(f.zeta)))
    g = fd.fit_path(fd.Shannon(), data["z"], data["overdamped"], times=TIMES,
                    overdamped=True, restarts=4, steps=40, seed=0, **SHARED)
    assert np.all(np.asarray(g.loss) > 5 * np.asarray(f.loss))
    h = fd.fit_path(fd.Kaniadakis(0.5), data["z"], data["inertial"], times=TIMES,
                    overdamped=True, restarts=4, steps=40, seed=0, **SHARED)
    assert np.all(np.asarray(h.loss) > 5 * np.asarray(inertial_fit.loss))


def test_input_validation(data):
    with pytest.raises(ValueError, match="cannot fit family"):
        fd.fit_path(fd.SharmaMittal(1.5, 0.5), data["z"], data["inertial"])
    with pytest.raises(ValueError, match="energy model B"):
        fd.fit_path(fd.Shannon(), data["z"], data["inertial"], energy_model="B")
    with pytest.raises(ValueError, match="energy_model"):
        fd.fit_path(fd.Shannon(), data["z"], data["inertial"], energy_model="C")
    with pytest.raises(ValueError, match="increasing"):
        fd.fit_path(fd.Shannon(), data["z"], data["inertial"], times=TIMES[::-1])
    with pytest.raises(ValueError, match="layer 0"):
        mask = np.ones(K, bool)
        mask[0] = False
        fd.fit_path(fd.Shannon(), data["z"], data["inertial"], fit_layers=mask)
    # the family comes as an instance (it also gives the starting shape), not a name or class
    for family in ("tsallis", fd.Tsallis):
        with pytest.raises(TypeError, match=r"entropy instance such as fisherdyn\.Tsallis"):
            fd.fit_path(family, data["z"], data["inertial"])
    with pytest.raises(TypeError, match="compile_with must be an entropy instance"):
        fd.fit_path(fd.Shannon(), data["z"], data["inertial"], compile_with=["Tsallis"])



@pytest.mark.slow
def test_stiff_inertial_fit_nests_in_the_overdamped_one(data):
    # Nesting: the overdamped flow is the m/gamma -> 0 limit of the inertial dynamics, so an
    # inertial fit started next to the overdamped optimum (init=, restart 0) can always get
    # at least as close. Paths of a fast overdamped Shannon flow (relaxation ~0.1 layer):
    # that start is stiff; with the implicit solver the inertial fit ends no worse than the
    # overdamped one (tolerance 1e-6 relative: LM only accepts decreasing steps, and the
    # difference between the two models at m/gamma ~ 1/50 layer is far below the noise).
    rng = np.random.default_rng(3)
    fast = fd.simulate(fd.Shannon(), data["z"], 1.0, mass=0.0, damping=0.1,
                       rho0=rng.dirichlet(np.full(N, 4.0), size=2), saveat=TIMES, t1=TIMES[-1])
    paths = _noisy(fast.rho, rng)
    kw = dict(times=TIMES, restarts=2, steps=30, seed=0, **SHARED)
    over = fd.fit_path(fd.Shannon(), data["z"], paths, overdamped=True, **kw)
    stiff = fd.fit_path(fd.Shannon(), data["z"], paths, init=over, solver="kvaerno5", **kw)
    assert np.all(np.asarray(stiff.success))
    assert np.all(np.asarray(stiff.loss) <= np.asarray(over.loss) * (1 + 1e-6))
    with pytest.raises(ValueError, match="solver"):
        fd.fit_path(fd.Shannon(), data["z"], paths, solver="euler", **kw)


@pytest.mark.slow
def test_fit_program_compiles_without_xla_log_noise():
    """One path (no batch axes) fitted from two restarts: the restarts' copies of its data
    were a broadcast XLA's algebraic simplifier looped on (it printed a page of "circular
    simplification loop" lines to stderr per fit). Run in a fresh interpreter, so that the
    program is compiled here and stderr is the process's own."""
    script = (
        "import numpy as np, fisherdyn as fd\n"
        "times = np.linspace(0.0, 4.0, 9)\n"
        "z = np.array([1.2, 0.3, -0.5, 0.8, -1.1])\n"
        "path = fd.simulate(fd.Shannon(), z, 1.0, mass=0.0, damping=1.0, saveat=times,\n"
        "                   t1=times[-1]).rho\n"
        "fit = fd.fit_path(fd.Shannon(), z, np.asarray(path), times=times,\n"
        "                  overdamped=True, restarts=2, steps=2)\n"
        "print(float(fit.loss))\n"
    )
    out = run_in_fresh_python(script)
    assert out.returncode == 0, out.stderr
    assert np.isfinite(float(out.stdout.split()[-1]))
    assert "circular simplification loop" not in out.stderr, out.stderr[:2000]
