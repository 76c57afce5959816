"""Shared test helpers: independent references, the family lists, compiled wrappers.

The references share no code with `fisherdyn`:
- `RefFamily` and the `mp_*` solves: docs/math.md §2-3 transcribed in mpmath at `DPS` digits (the
  stationary law `T G(rho_i) = z_i + lambda`, `sum rho = 1`, by a bracketed Illinois root on
  the multiplier; Renyi / Sharma-Mittal: every root of the self-consistency in M, by a scan of
  its whole range);
- `sparsemax`: the sort-based closed form of Tsallis q = 2;
- `h_reference`: $h = dS/d\\rho$ typed in from docs/math.md §2 (numpy);
and, for the tests themselves:
- the family specs and the named lists the test files pick from;
- jitted wrappers of the public operator, compiled once per process and shared by the files;
- `record`: the measured maximum of an error, printed by `conftest.py` (run with -s).
"""

from __future__ import annotations

import functools
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np

import fisherdyn as fd

# jit options for programs a test compiles once: XLA level 0 gives the same results to
# round-off and compiles in about half the time.
RUN_ONCE = dict(compiler_options={"xla_backend_optimization_level": 0})

DPS = 40  # digits of the mpmath reference

# --------------------------------------------------------------------------- families


class Battery(NamedTuple):
    """A family's entries in the shared battery: `key`, its first parse name (specs are
    `(key, *parameters)`); `specs`, its parameter sets in `SPECS`; `one`, its parameters in
    `ONE_PER_CLASS` (compilation is per class: parameters are traced leaves); `solve`, in
    `SOLVE_FAMILIES`; `dynamics`, in `DYNAMICS_FAMILIES`."""

    key: str
    specs: tuple[tuple[float, ...], ...]
    one: tuple[float, ...]
    solve: tuple[tuple[float, ...], ...]
    dynamics: tuple[float, ...]


_REFERENCES: dict[str, type[RefFamily]] = {}  # key -> the family's reference, in battery order


class RefFamily:
    """High-precision transcription of docs/math.md §2 (independent of `fisherdyn`), one
    subclass per family holding its `battery` entry and its law; `RefFamily(spec)` is the
    subclass of the spec's key. A separable family defines `G` ($-ds/dx$), its inverse `Ginv`
    and `formula` (S over the positive weights)."""

    battery: ClassVar[Battery]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "battery" in cls.__dict__:
            _REFERENCES[cls.battery.key] = cls

    def __new__(cls, spec):
        return super().__new__(_REFERENCES[spec[0]] if cls is RefFamily else cls)

    def __init__(self, spec):
        self.name = spec[0]
        self.p = [mp.mpf(v) for v in spec[1:]]

    def S(self, rho):
        """The defining formula of S(rho) (docs/math.md §2 table)."""
        return self.formula([mp.mpf(r) for r in rho if r > 0])

    def G_at_zero(self):
        """G(0+): -inf, but where the family has a cutoff."""
        return -mp.inf

    def minus_grad(self, rho, i):
        """-dS/drho_i, i.e. the (global) G of the stationary law."""
        x = mp.mpf(rho[i])
        return self.G_at_zero() if x == 0 else self.G(x)


class _RefShannon(RefFamily):
    battery = Battery("shannon", specs=((),), one=(), solve=((),), dynamics=())

    def G(self, x):
        return 1 + mp.log(x)

    def Ginv(self, y):
        return mp.exp(y - 1)

    def formula(self, rho):
        return -mp.fsum(r * mp.log(r) for r in rho)


class _RefTsallis(RefFamily):
    battery = Battery("tsallis", specs=((0.5,), (1.5,), (2.0,), (3.0,)), one=(1.5,),
                      solve=((1.5,), (2.0,), (0.7,)), dynamics=(2.0,))

    def G(self, x):
        (q,) = self.p
        return q * x ** (q - 1) / (q - 1)

    def Ginv(self, y):
        """0 past the q > 1 threshold."""
        (q,) = self.p
        base = (q - 1) * y / q
        return base ** (1 / (q - 1)) if base > 0 else mp.mpf(0)

    def formula(self, rho):
        (q,) = self.p
        return (1 - mp.fsum(r**q for r in rho)) / (q - 1)

    def G_at_zero(self):
        return mp.mpf(0) if self.p[0] > 1 else -mp.inf


class _RefTsallisShaped(RefFamily):
    """-dS/drho_i carries the moment factor phi(M) = T_eff / T of the Tsallis law."""

    def minus_grad(self, rho, i):
        rho = [mp.mpf(r) for r in rho]
        q = self.p[0]
        M = mp.fsum(r**q for r in rho if r > 0)
        x = rho[i]
        g = q * x ** (q - 1) / (q - 1) if x > 0 else (mp.mpf(0) if q > 1 else -mp.inf)
        return self.phi(M) * g


class _RefRenyi(_RefTsallisShaped):
    battery = Battery("renyi", specs=((0.5,), (2.0,)), one=(2.0,), solve=((2.0,), (0.7,)),
                      dynamics=(2.0,))

    def phi(self, M):
        return 1 / M

    def formula(self, rho):
        (q,) = self.p
        return mp.log(mp.fsum(r**q for r in rho)) / (1 - q)


class _RefSharmaMittal(_RefTsallisShaped):
    battery = Battery("sharma_mittal", specs=((2.0, 1.5), (0.7, 0.4)), one=(0.7, 0.4),
                      solve=((2.0, 1.5),), dynamics=(2.0, 1.5))

    def phi(self, M):
        q, s = self.p
        return M ** ((q - s) / (1 - q))

    def formula(self, rho):
        q, s = self.p
        M = mp.fsum(r**q for r in rho)
        return (M ** ((1 - s) / (1 - q)) - 1) / (1 - s)


class _RefKaniadakis(RefFamily):
    battery = Battery("kaniadakis", specs=((0.1,), (0.3,), (0.7,), (-0.3,)), one=(0.3,),
                      solve=((0.3,),), dynamics=(0.3,))

    def G(self, x):
        k = abs(self.p[0])
        return ((1 + k) * x**k - (1 - k) * x ** (-k)) / (2 * k)

    def Ginv(self, y):
        k = abs(self.p[0])
        s = mp.sqrt(k * k * y * y + 1 - k * k)
        num = k * y + s if y >= 0 else (1 - k * k) / (s - k * y)  # rationalized tail
        return (num / (1 + k)) ** (1 / k)

    def formula(self, rho):
        k = self.p[0]
        return -mp.fsum(r * (r**k - r ** (-k)) / (2 * k) for r in rho)


class _RefBurg(RefFamily):
    battery = Battery("burg", specs=((),), one=(), solve=((),), dynamics=())

    def G(self, x):
        return -1 / x

    def Ginv(self, y):
        return -1 / y

    def formula(self, rho):
        return mp.fsum(mp.log(r) for r in rho)


class _RefAbe(RefFamily):
    battery = Battery("abe", specs=((0.5,), (1.5,), (3.0,)), one=(1.5,),
                      solve=((1.5,), (0.5,)), dynamics=(1.5,))

    def G(self, x):
        (q,) = self.p
        return (q * x ** (q - 1) - x ** (1 / q - 1) / q) / (q - 1 / q)

    def Ginv(self, y):
        """No closed inverse: the root of G(e^l) = y in l (G increasing)."""
        f = lambda l: self.G(mp.exp(l)) - y  # noqa: E731
        lo = mp.mpf(-1)
        while f(lo) > 0:
            lo *= 2
        return mp.exp(bracket_root(f, lo, mp.mpf(1)))

    def formula(self, rho):
        (q,) = self.p
        return -mp.fsum((r**q - r ** (1 / q)) / (q - 1 / q) for r in rho)


# every concrete family fisherdyn exports; tests/test_structure.py checks that each one has a
# reference above, hence a place in every list below
EXPORTED_FAMILIES = [
    getattr(fd, n) for n in fd.__all__
    if isinstance(getattr(fd, n), type) and issubclass(getattr(fd, n), fd.AbstractEntropy)
    and not n.startswith("Abstract")
]
_CLASSES = {c.parse_names[0]: c for c in EXPORTED_FAMILIES}
_BATTERY = [ref.battery for ref in _REFERENCES.values()]

# (key, *parameters): the family instances every reference test covers
SPECS = [(b.key, *p) for b in _BATTERY for p in b.specs]
# one representative per class (compilation is per class: parameters are traced leaves)
ONE_PER_CLASS = [(b.key, *b.one) for b in _BATTERY]


def make(spec):
    return _CLASSES[spec[0]](*spec[1:])


def spec_id(spec):
    return spec[0] + "".join(f"_{p:g}" for p in spec[1:])


def tsallis_shaped(spec):
    return issubclass(_CLASSES[spec[0]], fd.AbstractTsallisShapedEntropy)


def compact_q(spec):
    """q > 1 moment/Tsallis families have a finite G(0+) = 0, hence exact zeros."""
    return _CLASSES[spec[0]].may_have_cutoff and spec[1] > 1


# solve_stationary's families, by the name its tests are parametrized with (`tsallis1.5`)
SOLVE_FAMILIES = {
    b.key + ",".join(f"{p:g}" for p in params): make((b.key, *params))
    for b in _BATTERY for params in b.solve
}

# the dynamics' fixed-point families: one instance per class
DYNAMICS_FAMILIES = [make((b.key, *b.dynamics)) for b in _BATTERY]


# --------------------------------------------------------------------------- compiled once

# Compilation dominates the runtime. Entropy parameters are pytree leaves, converted to strong
# arrays of the score dtype by `arr`, so each jitted function below compiles once per class,
# shape and dtype, and every test reuses it.


def arr(entropy, dtype=jnp.float64):
    return jax.tree.map(lambda x: jnp.asarray(x, dtype), entropy)


jit_stationary = jax.jit(fd.stationary, static_argnames="axis")
jit_branches = jax.jit(fd.stationary_branches)


@jax.jit
def _derivs(entropy, z, T, v, w):
    """Every derivative of the operator at one point, from one linearization.

    Returns rho, the closed-form Jacobian, the autodiff Jacobian, the JVP along v, and the
    VJP of w (= jax.grad of w . rho) with respect to the scores, the entropy and T.
    """
    rho, f_jvp = jax.linearize(lambda e, z_, T_: fd.stationary(e, z_, T_), entropy, z, T)
    zero_e = jax.tree.map(jnp.zeros_like, entropy)
    zero_T = jnp.zeros_like(T)
    jvp = f_jvp(zero_e, v, zero_T)
    J_ad = jax.vmap(lambda e_: f_jvp(zero_e, e_, zero_T), out_axes=1)(jnp.eye(z.shape[-1]))
    g_e, g_z, g_T = jax.linear_transpose(f_jvp, entropy, z, T)(w)
    return rho, fd.stationary_jacobian(entropy, z, T), J_ad, jvp, g_z, g_e, g_T


def stat(entropy, z, T, dtype=jnp.float64):
    """The operator at one point, as a numpy array (the shared compiled program)."""
    z, T = jnp.asarray(z, dtype), jnp.asarray(T, dtype)
    return np.asarray(jit_stationary(arr(entropy, dtype), z, T))


def derivs(entropy, z, T, seed=0):
    """Random directions (v, w) and `_derivs` of the operator at (z, T), as numpy arrays."""
    rng = np.random.default_rng(seed)
    v, w = rng.normal(size=len(z)), rng.normal(size=len(z))
    out = _derivs(arr(entropy), jnp.asarray(z), jnp.asarray(T, jnp.float64), jnp.asarray(v),
                  jnp.asarray(w))
    return v, w, jax.tree.map(np.asarray, out)


# --------------------------------------------------------------------------- numpy references


def central_jacobian(f, x, h):
    """Central finite-difference Jacobian of `f` at `x`, column by column (error O(h^2))."""
    cols = []
    for j in range(len(x)):
        e = np.zeros(len(x))
        e[j] = h
        cols.append((f(x + e) - f(x - e)) / (2 * h))
    return np.stack(cols, axis=1)


def sparsemax(z):
    """Sort-based sparsemax (Martins & Astudillo 2016), the Euclidean simplex projection of
    the last axis."""
    zs = -np.sort(-z, -1)
    cs = np.cumsum(zs, -1)
    r = np.arange(1, z.shape[-1] + 1)
    support = 1 + r * zs > cs
    k = support.sum(-1, keepdims=True)
    tau = (np.take_along_axis(cs, k - 1, -1) - 1) / k
    return np.maximum(z - tau, 0.0)


def h_reference(entropy, rho):
    """$h_i = \\partial S/\\partial\\rho_i$ typed in from docs/math.md §2 (numpy), finite on the
    boundary for the cutoff families."""
    if isinstance(entropy, fd.Shannon):
        return -(1.0 + np.log(rho))
    if isinstance(entropy, fd.Kaniadakis):
        k = abs(float(entropy.kappa))
        return -((1 + k) * rho**k - (1 - k) * rho ** (-k)) / (2 * k)
    if isinstance(entropy, fd.Renyi):
        q = float(entropy.q)
        return q * rho ** (q - 1) / ((1 - q) * np.sum(rho**q))
    if isinstance(entropy, fd.Tsallis):
        q = float(entropy.q)
        return -q * rho ** (q - 1) / (q - 1)
    raise NotImplementedError(type(entropy))


# --------------------------------------------------------------------------- mpmath reference


def bracket_root(f, a, b):
    """Root of a continuous monotone f between a and b (Illinois regula falsi)."""
    tol = mp.mpf(10) ** (-(mp.mp.dps - 3))
    fa, fb = f(a), f(b)
    if abs(fa) <= tol:
        return a
    if abs(fb) <= tol:
        return b
    assert fa * fb < 0, (a, b, fa, fb)
    side = 0
    for _ in range(2000):
        c = b - fb * (b - a) / (fb - fa)
        if not (min(a, b) < c < max(a, b)):
            c = (a + b) / 2
        fc = f(c)
        if fc == 0 or abs(b - a) <= tol * (1 + abs(c)):
            return c
        if fc * fb < 0:
            a, fa, side = b, fb, -1
        else:
            fa = fa / 2 if side == 1 else fa
            side = 1
        b, fb = c, fc
    raise RuntimeError("mpmath reference root did not converge")


def mp_separable(fam, z, T):
    """(rho, lambda) with T G(rho_i) = z_i + lambda on the support, sum rho = 1."""
    z = [mp.mpf(float(v)) for v in z]
    T = mp.mpf(float(T))
    zmax = max(z)
    # With mu = -lambda the top weight is 1 at mu = a and 1/N at mu = b: the root is between.
    a = zmax - T * fam.G(mp.mpf(1))
    b = zmax - T * fam.G(mp.mpf(1) / len(z))
    f = lambda mu: mp.fsum(fam.Ginv((zi - mu) / T) for zi in z) - 1  # noqa: E731
    mu = bracket_root(f, a, b) if b > a else a
    rho = [fam.Ginv((zi - mu) / T) for zi in z]
    return rho, -mu


def mp_free_energy(fam, rho, z, T):
    return -mp.fsum(r * mp.mpf(float(v)) for r, v in zip(rho, z)) - mp.mpf(float(T)) * fam.S(rho)


def mp_tsallis_shaped(fam, z, T, n_grid=48):
    """Every root of M = M_q(Tsallis(z, T phi(M))), scanned over log M in its whole range;
    returns [(F, rho, M)] sorted by free energy."""
    q = fam.p[0]
    ts = RefFamily(("tsallis", q))
    T = mp.mpf(float(T))

    def profile(logM):
        return mp_separable(ts, z, T * fam.phi(mp.exp(logM)))[0]

    def resid(logM):
        return mp.log(mp.fsum(r**q for r in profile(logM) if r > 0)) - logM

    end = (1 - q) * mp.log(len(z))
    lo, hi = min(end, 0), max(end, 0)
    grid = [lo + (hi - lo) * mp.mpf(k) / (n_grid - 1) for k in range(n_grid)]
    vals = [resid(g) for g in grid]
    tol = mp.mpf(10) ** (-(mp.mp.dps - 5))
    roots = [g for g, v in zip(grid, vals) if abs(v) <= tol]
    for k in range(n_grid - 1):
        if vals[k] * vals[k + 1] < 0 and abs(vals[k]) > tol and abs(vals[k + 1]) > tol:
            roots.append(bracket_root(resid, grid[k], grid[k + 1]))
    out = []
    for x in roots:
        rho = profile(x)
        out.append((mp_free_energy(fam, rho, z, T), rho, mp.exp(x)))
    return sorted(out, key=lambda t: t[0])


# score vectors (N = 7: one compiled shape) and temperatures of the reference cases
Z_A = np.array([1.3, -0.4, 0.8, 2.1, -1.7, 0.05, 0.6])
Z_B = np.array([0.251, -0.264, 1.281, 0.21, -1.071, 0.723, 2.608])
Z_C = np.array([3.0, 3.0, -2.0, 0.0, 1.0, -5.0, 0.5])  # a tie at the top
CASES = [(Z_A, 1.0), (Z_B, 0.25), (Z_C, 4.0)]

# Multi-branch self-consistency (found by a scan of stationary_branches, confirmed in mpmath):
# (spec, scores, T, points of the mpmath scan in log M).
MULTI = [
    (("renyi", 2.0), [2.84, -9.25, -11.81, 1.48, -15.02, -0.43, 23.16], 10.0, 64),
    (("renyi", 2.0), [-1.51, 6.81, -2.05, -2.2, -1.2, 0.67, 1.47], 3.0, 160),
    (("sharma_mittal", 3.0, 1.5), [0.15, 0.62, 0.01, 0.06, 0.77, -0.05, -0.07], 0.1, 48),
]


@functools.lru_cache(maxsize=None)
def mp_reference(spec, case):
    """(rho, F, number of self-consistent branches) of the reference solve, in mpmath."""
    z, T = CASES[case]
    fam = RefFamily(spec)
    with mp.workdps(DPS):
        if tsallis_shaped(spec):
            branches = mp_tsallis_shaped(fam, z, T)
            F, rho, _ = branches[0]
            return rho, F, len(branches)
        rho, _ = mp_separable(fam, z, T)
        return rho, mp_free_energy(fam, rho, z, T), 1


MAX_ERR: dict[str, float] = {}  # measured maxima, printed with -s (conftest.py)


def record(key, value):
    MAX_ERR[key] = max(MAX_ERR.get(key, 0.0), float(value))


def run_in_fresh_python(script: str):
    """Run `script` in a new interpreter that imports this checkout's fisherdyn: what it
    compiles, and what XLA logs to stderr, are that process's own."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600)
