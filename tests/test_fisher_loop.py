"""The attention layers that carry a state across a looped model's loops
(`fisherdyn.FisherLoop`, `fisherdyn.LinearScoreLoop`) and the dynamics under piecewise-constant
scores they step (`fisherdyn.fisher_loop_step`, `fisherdyn.linear_score_dynamics`). Inside
the weight-tied study's looped transformer they are tested in
tests/studies/test_weight_tied_models.py.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import fisherdyn as fd

# Kaniadakis compiles its own simulate program: in the slow suite only
FISHER_FAMILIES = [fd.Shannon(), fd.Tsallis(1.5),
                   pytest.param(fd.Kaniadakis(0.3), marks=pytest.mark.slow)]


@pytest.mark.parametrize("entropy", FISHER_FAMILIES, ids=["Shannon", "Tsallis", "Kaniadakis"])
def test_fisher_loop_matches_simulate_at_fixed_scores(entropy):
    # Reference: fd.simulate (adaptive Tsit5, rtol 1e-10) of the same family and (m, gamma, T)
    # from uniform weights at rest, saved at the loop times t_l = l dt. Tolerance 1e-6 on the
    # weights: RK4 with h = dt/8 = 1/32 has a global error ~ h^4 * (rate)^4 * t ~ 1e-7 for
    # these rates (|z| <= 2, m = 0.5, gamma = 0.8, T = 0.7).
    n, L, dt = 6, 8, 0.25
    scores = jr.normal(jr.PRNGKey(0), (n,), jnp.float64)
    m, gam, T = 0.5, 0.8, 0.7
    loop = fd.FisherLoop(1, m, gam, None, jnp.float64, substeps=8)
    state = loop.init_state((1, 1, n), jnp.float64)
    z = scores[None, None]
    Tv = jnp.full((1,), T)
    step = jax.jit(lambda s: loop.advance(s, z, entropy, Tv, dt))
    rows = [loop.weights(state, entropy, Tv)[0, 0]]
    for _ in range(L):
        state = step(state)
        rows.append(loop.weights(state, entropy, Tv)[0, 0])
    ours = np.asarray(jnp.stack(rows))
    np.testing.assert_allclose(np.asarray(loop.mass), m, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(loop.damping), gam, rtol=1e-12)
    ts = jnp.arange(L + 1, dtype=jnp.float64) * dt
    ref = fd.simulate(entropy, scores, T, mass=m, damping=gam, t1=L * dt, saveat=ts,
                      rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours, np.asarray(ref.rho), rtol=0, atol=1e-6)
    # the dynamics moved the weights (the comparison is not uniform against uniform)
    assert np.max(np.abs(ours[-1] - 1 / n)) > 0.05


def test_fisher_loop_step_gradients_match_finite_differences():
    # Reference: central finite differences (step 1e-6, float64: truncation ~1e-12,
    # agreement 1e-6 relative) of a weighted sum of the weights after one loop, in the
    # mass, the damping and one score.
    n = 5
    z = jr.normal(jr.PRNGKey(8), (n,), jnp.float64)
    w = jr.normal(jr.PRNGKey(9), (n,), jnp.float64)
    x0 = jnp.sqrt(jax.nn.softmax(jr.normal(jr.PRNGKey(10), (n,), jnp.float64)))

    @jax.jit
    def f(p):
        x, _ = fd.fisher_loop_step(fd.Tsallis(1.5), z.at[0].add(p[2]), (x0, jnp.zeros(n)),
                                   0.7, mass=p[0], damping=p[1], dt=0.25, substeps=4)
        return jnp.sum(w * x * x)

    p = jnp.array([0.6, 0.9, 0.0])
    g = np.asarray(jax.jit(jax.grad(f))(p))
    assert np.all(np.isfinite(g)) and np.all(g != 0)
    h = 1e-6
    fdiff = [(float(f(p.at[i].add(h))) - float(f(p.at[i].add(-h)))) / (2 * h) for i in range(3)]
    np.testing.assert_allclose(g, fdiff, rtol=1e-6, atol=1e-10)


def _oscillator(u0, v0, a, b, t):
    """Closed form of u'' + b u' + a u = 0 (under- and overdamped branches)."""
    disc = b * b / 4 - a
    if disc < 0:
        w = np.sqrt(-disc)
        return np.exp(-b * t / 2) * (u0 * np.cos(w * t) + (v0 + b * u0 / 2) / w * np.sin(w * t))
    r1, r2 = -b / 2 + np.sqrt(disc), -b / 2 - np.sqrt(disc)
    A = (v0 - r2 * u0) / (r1 - r2)
    return A * np.exp(r1 * t) + (u0 - A) * np.exp(r2 * t)


@pytest.mark.parametrize("a,b", [(4.0, 1.0), (1.0, 3.0)], ids=["under", "over"])
def test_linear_score_dynamics_is_the_damped_oscillator(a, b):
    # Reference: the closed-form damped oscillator per key, z = s + u(t), and softmax(z/T)
    # (jax.nn.softmax) for the Shannon readout; 1e-12 (float64; the per-interval matrix
    # exponential is exact up to round-off, accumulated over 12 intervals).
    n, T = 5, 0.7
    s = jr.normal(jr.PRNGKey(4), (n,), jnp.float64)
    z0 = jr.normal(jr.PRNGKey(5), (n,), jnp.float64)
    v0 = jr.normal(jr.PRNGKey(6), (n,), jnp.float64)
    times = jnp.sort(jr.uniform(jr.PRNGKey(7), (13,), jnp.float64, 0, 3)).at[0].set(0.0)
    attn, z, v = fd.linear_score_dynamics(fd.Shannon(), jnp.broadcast_to(s, (12, n)), T,
                                          times=times, a=a, b=b, z0=z0, v0=v0)
    t = np.asarray(times)[:, None]
    ref = np.asarray(s) + _oscillator(np.asarray(z0 - s), np.asarray(v0), a, b, t)
    np.testing.assert_allclose(np.asarray(z), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(attn), np.asarray(jax.nn.softmax(ref / T, -1)),
                               rtol=0, atol=1e-12)
    # the velocity is the derivative of the closed form (central difference, 1e-6)
    dt = 1e-6
    dref = (_oscillator(np.asarray(z0 - s), np.asarray(v0), a, b, t + dt)
            - _oscillator(np.asarray(z0 - s), np.asarray(v0), a, b, t - dt)) / (2 * dt)
    np.testing.assert_allclose(np.asarray(v), dref, rtol=0, atol=1e-6)
