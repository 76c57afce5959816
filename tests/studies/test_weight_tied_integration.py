"""The divergence trace against closed forms: the RK4 stability function at the ends of
its stability interval, the linearized Tsallis row's off-support modes (a damped
oscillator whose stiffness is the key's score gap below the support's threshold), and the
growth of a perturbation under `fisher_loop_step` itself; then the trace of a training that
diverged."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisherdyn as fd
from weight_tied.integration import QUANTITIES, rk4_amplification, row_modes, summarize

M, GAMMA, T = 0.1, 1.0, 1.0
Z = jnp.array([3.0, 2.6, 2.0, 1.0, -4.0, -60.0])  # two keys below Tsallis(1.5)'s support


def _tsallis_row():
    """The stationary Tsallis(1.5) row of `Z`, its off-support keys nudged off 0 (the chart's
    forces drop their derivative at exactly 0), and its multiplier lambda."""
    S = fd.Tsallis(1.5)
    rho = fd.stationary(S, Z, T)
    off = rho == 0
    x = jnp.where(off, 1e-9, jnp.sqrt(rho))
    g = -Z - T * S.grad(jnp.where(off, 1.0, rho), mask=~off)
    lam = float(jnp.mean(g[~off]))  # equal on the support: the stationarity condition
    assert float(jnp.max(g[~off]) - jnp.min(g[~off])) < 1e-10
    return S, x, off, lam


def test_rk4_amplification_is_one_at_the_ends_of_its_stability_interval():
    # Reference: RK4's real stability boundary -2.7853 (the root of |R(w)| = 1 on the
    # negative axis) and imaginary boundary 2 sqrt 2, known constants; tolerance 1e-4 for
    # the 5 digits of the real one.
    assert rk4_amplification(-2.785293563) == pytest.approx(1.0, abs=1e-4)
    assert rk4_amplification(2j * np.sqrt(2)) == pytest.approx(1.0, abs=1e-12)
    assert rk4_amplification(-1.0) < 1 < rk4_amplification(-3.0)
    # a resolved mode: R is e^w's Taylor series to w^4, so they differ by ~|w|^5/120
    w = -0.01 + 0.02j
    assert rk4_amplification(w) == pytest.approx(abs(np.exp(w)), abs=abs(w) ** 5 / 100)


def test_off_support_modes_are_damped_oscillators_stiffened_by_the_score_gap():
    # Reference: at x_i -> 0 the sphere chart's equation 4m x_i'' = 2 x_i (lambda - g_i) -
    # 4 gamma x_i' with g_i = -z_i (Tsallis: h(0) = 0) is m s^2 + gamma s + k_i = 0,
    # k_i = -(lambda + z_i)/2, solved here by numpy's quadratic roots, not by linearizing
    # the code; tolerance 1e-6 relative (double precision eigenvalues of a 12 x 12 matrix).
    S, x, off, lam = _tsallis_row()
    assert int(off.sum()) == 2
    modes, _ = row_modes(S, x, jnp.zeros_like(x), Z, T, M, GAMMA)
    modes = np.asarray(modes)
    for z in np.asarray(Z)[np.asarray(off)]:
        k = -(lam + z) / 2
        assert k > 0  # below the threshold: a restoring stiffness that grows with the gap
        for s in np.roots([M, GAMMA, k]):
            assert np.min(np.abs(modes - s)) < 1e-6 * abs(s)


@pytest.mark.parametrize("h, grows", [(0.18, True), (0.1, False)])
def test_amplification_predicts_the_growth_under_fisher_loop_step(h, grows):
    # Reference: fisherdyn's own RK4 loop step, run on a small random perturbation of the
    # stationary row: its growth per substep against the greatest |R(h s)|
    # over the linearized modes. The stiffest is the key at -60, an underdamped oscillator
    # (s = -5 +- 16.7i); at h 0.18 (h|s| 3.1) its |R| is 1.69 and the perturbation grows,
    # at h 0.1 (|R| 0.62; every mode below 1) it decays. Growth rate within 2 % once that
    # mode dominates (the next is 0.99).
    S, x, off, lam = _tsallis_row()
    modes, _ = row_modes(S, x, jnp.zeros_like(x), Z, T, M, GAMMA)
    amp = float(np.max(rk4_amplification(h * np.asarray(modes))))
    top = np.roots([M, GAMMA, -(lam + float(Z[-1])) / 2])
    key = float(np.max(rk4_amplification(h * top)))
    assert (amp > 1) == grows and (key > 1) == grows
    if grows:  # the key's mode is the row's most amplified
        assert amp == pytest.approx(key, rel=1e-9)
    # the key's own mode: a kick to its velocity alone, read in (x_i, v_i / |s|), where the
    # oscillator's orbit is nearly a circle
    # oscillator's orbit is nearly a circle; from the exact equilibrium (x_i = 0: the nudge
    # of 1e-9 would grow too)
    x0 = jnp.where(off, 0.0, x)
    kick = jnp.zeros_like(x).at[-1].set(1e-18)
    speed = float(np.abs(top[0]))

    def deviation(n):  # after n substeps of h
        end = fd.fisher_loop_step(S, Z, (x0, kick), T, mass=M, damping=GAMMA, dt=n * h,
                                  substeps=n)
        return float(np.hypot(end[0][-1], end[1][-1] / speed))

    # per substep between substeps 10 and 50 (the kick stays below 1e-6, linear; a
    # perturbation left to grow turns the row NaN)
    measured = (deviation(50) / deviation(10)) ** (1 / 40)
    assert (measured > 1) == grows
    assert measured == pytest.approx(key, rel=0.02)


def test_trace_of_a_diverged_training_names_the_loop_and_quantity(tmp_path):
    # A Fisher loop trained at a learning rate of 10 diverges within a few steps; replayed,
    # its batch turns non-finite in the carried attention state (position or velocity, the
    # RK4 substeps) at a loop where the linearization says the integrator grows modes the
    # dynamics damps (spurious amplification > 1) or the dynamics itself grows. Control:
    # the initial weights on the same batch stay finite with amplification <= 1.
    from weight_tied.integration import trace_divergence
    from weight_tied.model import LoopedConfig, init_looped
    from weight_tied.training import replay_divergence, train_looped

    cfg = LoopedConfig(task="pointer", n_pairs=4, hops=2, dim=8, d_model=8, n_heads=2,
                       d_mlp=16, n_loops=2, loop_kind="fisher", mass=0.5, damping=1.0,
                       substeps=2, entropy=fd.Tsallis(1.5))
    kw = dict(steps=30, batch=4, lr=10.0, loops=(2, 5), residual_penalty=0.1)
    with pytest.raises(FloatingPointError, match="diverged"):
        train_looped(cfg, cache_dir=tmp_path, progress=False, **kw)
    step = replay_divergence(cfg, cache_dir=tmp_path, **kw)
    tr = trace_divergence(step.model, step.tokens, step.scan_loops)
    assert tr.finite.shape == (4, step.scan_loops, len(QUANTITIES))
    bad = tr.first_loop > 0
    assert bad.any()
    assert set(tr.first_quantity[bad]) <= {"position", "velocity"}
    out = summarize(step, tr)
    assert out["non_finite_problems"] == int(bad.sum())
    for c in out["cases"]:
        assert c["amplification_by_loop"][-1] > 1 or c["greatest_growth_rate"] > 0
    with jax.numpy_dtype_promotion("standard"):
        fresh = init_looped(cfg, jax.random.PRNGKey(0))
    ctl = trace_divergence(fresh, step.tokens, step.scan_loops)
    assert np.all(ctl.first_loop == 0) and np.all(ctl.finite)
    assert np.nanmax(ctl.amplification) <= 1 + 1e-9
    # the scores' spread and change per loop against the model's own trace of its scores
    with jax.numpy_dtype_promotion("standard"):
        scores = np.asarray(jax.vmap(lambda t: fresh.trace(t, step.scan_loops).scores)(
            jnp.asarray(step.tokens)))[:, :-1]  # (problems, loops, heads, n, n)
    np.testing.assert_allclose(ctl.spread, np.max(np.ptp(scores, -1), -1), rtol=1e-6)
    jump = np.abs(np.diff(scores, axis=1)).max((-2, -1))
    np.testing.assert_allclose(ctl.jump[:, 1:], jump, rtol=1e-6, atol=1e-6)
    assert np.all(ctl.jump[:, 0] == 0)
    # the control's state stays near its sphere (0.020 measured: RK4 on 2 substeps of h 0.5)
    # against 0.98 before the NaN of the Tsallis(1.5) control seed 4 (docs)
    assert np.max(ctl.drift) < 0.05 and np.all(ctl.turn >= 0)
    # loss_under re-runs the step on other substeps: from the initial weights the loss
    # converges as RK4 does, its change shrinking ~16x per halving of h (15.6x measured from
    # 2 -> 4 -> 8 substeps; asserted 8x: the float32 loss's change at 8 -> 16 is 3 ulps)
    ctl_step = dataclasses.replace(step, model=fresh)
    losses = [ctl_step.loss_under(substeps=k) for k in (2, 4, 8)]
    diffs = np.abs(np.diff(losses))
    assert np.all(np.isfinite(losses)) and diffs[0] > 8 * diffs[1] > 0
    assert not np.isfinite(step.loss_under())  # the recorded step itself, unchanged


def test_substep_error_falls_as_rk4_and_reads_the_sphere():
    # Reference: RK4's global error is O(h^4), so the attention's distance from a 4x finer
    # run falls ~16x when the model's own substeps double (asserted >= 8x); a loop on
    # resolved substeps stays on its sphere (drift below 1e-3) and changes no answer.
    from weight_tied.integration import substep_error
    from weight_tied.model import LoopedConfig, init_looped
    from weight_tied.study import to_f64
    from weight_tied.task import task_batch

    errs = []
    for k in (4, 8):
        cfg = LoopedConfig(task="pointer", n_pairs=4, hops=2, dim=8, d_model=8, n_heads=2,
                           d_mlp=16, n_loops=4, loop_kind="fisher", mass=0.5, damping=1.0,
                           substeps=k, entropy=fd.Tsallis(1.5))
        with jax.numpy_dtype_promotion("standard"):
            model = to_f64(init_looped(cfg, jax.random.PRNGKey(1)))
        tokens = task_batch(cfg, jax.random.PRNGKey(2), 8).tokens
        errs.append(substep_error(model, tokens, 8, factor=4))
    coarse, finer = (np.max(e["tv_max"]) for e in errs)
    assert 0 < finer and coarse > 8 * finer
    for e in errs:
        assert e["substeps"][1] == 4 * e["substeps"][0] and e["problems"] == 8
        assert max(e["drift_max"]) < 1e-3 and e["answers_changed"] == 0.0
        assert len(e["tv_max"]) == len(e["turn_max"]) == 2
        assert np.all(np.array(e["tv_last_max"]) <= np.array(e["tv_max"]))
