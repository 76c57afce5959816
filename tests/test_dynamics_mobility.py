"""The score-space form of the overdamped Fisher flow (docs/math.md §6).

`simulate(..., mass=0)` integrates $\\gamma\\dot\\rho_i = \\rho_i(\\lambda - g_i)$ with
$g_i = -z^*_i + T G(\\rho_i)$ (separable families, $h = -G$) and $\\lambda = \\sum\\rho g$. The
"current scores" of a state are the scores for which it is stationary,
$z_i = T G(\\rho_i) + \\mu$ (the gauge $\\mu$ is free). Differentiating,

$$\\dot z_i - \\dot\\mu = \\frac{T\\rho_i G'(\\rho_i)}{\\gamma}
  \\big[(z^*_i - z_i) - \\langle z^* - z\\rangle_\\rho\\big],$$

and for Shannon ($\\rho G' = 1$) the bracket's mean is a gauge, so with $z_0 = T\\ln\\rho_0$
exactly $\\rho(t) = \\mathrm{softmax}((z^* + (z_0 - z^*)e^{-Tt/\\gamma})/T)$: the library's time
unit is the one in which the rate of every Shannon mode is $T/\\gamma$ (the overdamped root
$-\\omega^2/\\gamma$ of `relaxation_spectrum` with $\\omega^2 = T$). The references below are
typed in from docs/math.md §2 ($G'$) and share no code with the integrator.
"""

import numpy as np
import pytest
from scipy.special import softmax

import fisherdyn as fd


def _G_prime(name, p, x):
    """$G'(x)$ from docs/math.md §2, typed in (numpy)."""
    if name == "shannon":
        return 1.0 / x
    if name == "tsallis":
        return p * x ** (p - 2)
    if name == "kaniadakis":
        return ((1 + p) * p * x ** (p - 1) + (1 - p) * p * x ** (-p - 1)) / (2 * p)
    raise AssertionError(name)


def _G(name, p, x):
    if name == "shannon":
        return 1.0 + np.log(x)
    if name == "tsallis":
        return p * x ** (p - 1) / (p - 1)
    if name == "kaniadakis":
        return ((1 + p) * x**p - (1 - p) * x ** (-p)) / (2 * p)
    raise AssertionError(name)


Z_STAR = np.array([1.2, 0.4, -0.3, 0.1, -0.9])
RHO0 = np.array([0.05, 0.15, 0.4, 0.3, 0.1])


@pytest.mark.parametrize("T, gamma", [(1.0, 1.0), (0.7, 2.5)])
def test_shannon_closed_form(T, gamma):
    """Shannon: simulate(mass=0) equals softmax((z* + (z0 - z*) e^{-Tt/gamma})/T) to 1e-8
    (the solve runs at rtol 1e-11; the closed form is exact), at times spanning three
    relaxation times; the ratio of time scales gamma/T is what sets the decay."""
    t1 = 3.0 * gamma / T
    ts = np.linspace(0.0, t1, 31)
    tr = fd.simulate(fd.Shannon(), Z_STAR, T, mass=0.0, damping=gamma, rho0=RHO0, t1=t1,
                     saveat=ts, rtol=1e-11, atol=1e-13, solver="dopri8")
    z0 = T * np.log(RHO0)
    decay = np.exp(-T * ts / gamma)[:, None]
    want = softmax((Z_STAR + (z0 - Z_STAR) * decay) / T, axis=-1)
    np.testing.assert_allclose(np.asarray(tr.rho), want, rtol=0, atol=1e-8)
    # a wrong time convention (rate T/(2 gamma), the sphere chart's x-rate) is far away
    wrong = softmax((Z_STAR + (z0 - Z_STAR) * np.sqrt(decay)) / T, axis=-1)
    assert np.max(np.abs(np.asarray(tr.rho) - wrong)) > 1e-2


@pytest.mark.parametrize("name, p", [("tsallis", 1.5), ("kaniadakis", 0.3), ("shannon", None)])
def test_score_equation(name, p):
    """d/dt[T G(rho_i)] (central differences of a simulate path, step 1e-3: error O(h^2)
    ~ 1e-6 relative to rates of order 1) equals the score equation's right side with the
    gauge mu = 0, to 1e-5 absolute; subtracting the bracket's mean matters (without it the
    check fails by far more)."""
    entropy = {"shannon": fd.Shannon(), "tsallis": fd.Tsallis(1.5),
               "kaniadakis": fd.Kaniadakis(0.3)}[name]
    T, gamma, h = 0.8, 1.3, 1e-3
    ts = np.concatenate([np.array([c - h, c, c + h]) for c in (0.2, 0.6, 1.5)])
    tr = fd.simulate(entropy, Z_STAR, T, mass=0.0, damping=gamma, rho0=RHO0, t1=2.0,
                     saveat=ts, rtol=1e-12, atol=1e-14, solver="dopri8")
    rho = np.asarray(tr.rho).reshape(3, 3, -1)
    assert np.all(rho > 1e-3)  # full support along the path: G' is finite
    z = T * _G(name, p, rho)  # current scores in the gauge mu = 0
    dz = (z[:, 2] - z[:, 0]) / (2 * h)
    r, zc = rho[:, 1], z[:, 1]
    d = Z_STAR - zc
    bracket = d - np.sum(r * d, -1, keepdims=True)
    rhs = T * r * _G_prime(name, p, r) / gamma * bracket
    np.testing.assert_allclose(dz, rhs, rtol=0, atol=1e-5)
    assert np.max(np.abs(dz - T * r * _G_prime(name, p, r) / gamma * d)) > 1e-2
