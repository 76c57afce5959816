"""Fitting the damped Fisher-Lagrangian dynamics to a measured attention path (MATH.md §6).

A measured path $\\rho_l$, $l = 0..K-1$ at times $t_l$ (e.g. the attention row of one head of
a looped transformer, loop by loop) is compared with the trajectory of

$$4m\\ddot x_i = 2x_i(\\lambda - g_i) - 4\\gamma\\dot x_i,\\qquad g_i = E_i(t) - T h_i(x^2)$$

(sphere chart $\\rho = x^2$; $m = 0$ is the overdamped replicator flow
$\\gamma\\dot\\rho_i = \\rho_i(\\lambda - g_i)$) started at the measured $\\rho_0$, by the summed
squared Fisher-Rao distance $\\sum_l d(\\rho^{model}(t_l), \\rho_l)^2$,
$d(p, q) = 2\\arccos\\sum_i\\sqrt{p_i q_i}$. Energies $E = -z$ come from the measured scores:
energy model "A" holds the last fitted scores fixed (pure relaxation towards their
stationary law), "B" interpolates the per-layer scores linearly in t (non-autonomous) and
holds the last fitted ones beyond the fitted layers.

Free parameters: the inertial time $\\theta = m/\\gamma = e^a$ (so $m = \\gamma\\theta$), damping
$\\gamma = e^b$, temperature $T = e^c$ (each a smooth box of +-`_LOG_BOX` e-folds around a
reference scale set by the data: $\\theta$ around $e^{-2}$ x the fitted span, so that it
reaches far below one layer step and the overdamped limit $\\theta \\to 0$ is approached
whatever gamma is; a box on m itself would tie the smallest reachable $\\theta$ to gamma), the family's shape
parameter in an unconstrained chart (Tsallis / Renyi $q = 1.01 + \\mathrm{softplus}(u)$,
Kaniadakis $\\kappa = 0.01 + 0.94\\,\\sigma(u)$, Abe $q = e^{0.01 + \\mathrm{softplus}(u)}$) and
the initial velocity (a tangent vector of the sphere at $x_0$; $N - 1$ numbers). The
layer-to-time scale is *not* a free parameter: rescaling time $t \\to s t$ is exactly
$m \\to m/s^2$, $\\gamma \\to \\gamma/s$, so it is not identifiable next to $(m, \\gamma)$; the time
unit is the one of `times` (default: one unit per layer).

The fit is Levenberg-Marquardt (optimistix) on the residual vector whose squared norm is
the loss, with the Jacobian from forward-mode differentiation through the Diffrax solve
(`diffrax.ForwardMode`), vmapped over restarts and over a batch of paths. One compiled
program serves both orders (a `lax.switch` on a traced index), both energy models (a score
schedule) and every family named in `compile_with`: it is compiled once per data shape
(paths, restarts, layers, keys) and family set, and a small summary program once per
family.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array

from .._misc import RUN_ONCE
from .._dynamics import FisherSystem, SphereCoordinates
from .._entropies import Abe, AbstractEntropy, Burg, Kaniadakis, Renyi, Shannon, Tsallis
from .._dynamics import relaxation_spectrum

__all__ = [
    "fit_path",
    "PathFit",
    "fisher_rao_distance",
    "geodesic_interpolation",
    "fit_families",
]

# --------------------------------------------------------------------------- geometry


def _chord2(x, y):
    """$\\|x - y\\|^2$ of two sphere points (last axis)."""
    return jnp.sum((x - y) ** 2, -1)


def _angle_from_chord2(c2):
    """The Fisher-Rao distance $4\\arcsin(c/2)$ from the squared chord $c^2$ of the unit
    vectors $\\sqrt\\rho$ (exact, no cancellation at small distances)."""
    return 4.0 * jnp.arcsin(jnp.minimum(jnp.sqrt(c2), 2.0) / 2.0)


def fisher_rao_distance(p, q):
    """The Fisher-Rao distance $d(p, q) = 2\\arccos\\sum_i\\sqrt{p_i q_i}$ of two points of the
    simplex (last axis; other axes broadcast).

    Evaluated as $4\\arcsin(\\|\\sqrt p - \\sqrt q\\|/2)$, the same number without the
    cancellation of arccos near 1. It is the geodesic distance of the Fisher metric
    $\\sum\\dot\\rho_i^2/\\rho_i$ (4 x the great-circle distance of $\\sqrt\\rho$ on the unit
    sphere); its maximum is $\\pi$ (disjoint supports).

    **Arguments:** `p`, `q`: probability vectors (nonnegative, summing to 1).

    **Returns:** the distances, shape `broadcast(p, q).shape[:-1]`.
    """
    p, q = jnp.asarray(p), jnp.asarray(q)
    return _angle_from_chord2(_chord2(jnp.sqrt(p), jnp.sqrt(q)))


def geodesic_interpolation(p, q, s):
    """The point at fraction `s` of the Fisher-Rao geodesic from `p` to `q`.

    The geodesic is the great circle through $\\sqrt p$ and $\\sqrt q$ on the unit sphere,
    traversed at constant speed: $x(s) = [\\sin((1-s)\\theta)\\sqrt p + \\sin(s\\theta)\\sqrt q]
    /\\sin\\theta$, $\\theta = d(p, q)/2$, returned as $\\rho = x^2/\\|x\\|^2$. `s` in [0, 1]
    interpolates; `s > 1` continues past `q` (the constant-speed extrapolation used as a
    naive baseline for predicting the next layers). `d(p, result) = |s| d(p, q)` while the
    arc stays in the positive orthant.

    **Arguments:** `p`, `q`: probability vectors (last axis); `s`: scalar or array
    broadcasting against their batch axes.

    **Returns:** probability vectors of the broadcast shape.
    """
    x, y = jnp.sqrt(jnp.asarray(p)), jnp.sqrt(jnp.asarray(q))
    s = jnp.asarray(s, x.dtype)[..., None]
    theta = _angle_from_chord2(_chord2(x, y))[..., None] / 2
    small = theta < 1e-6
    th = jnp.where(small, 1.0, theta)
    slerp = (jnp.sin((1 - s) * th) * x + jnp.sin(s * th) * y) / jnp.sin(th)
    z = jnp.where(small, (1 - s) * x + s * y, slerp)
    z2 = z * z
    return z2 / jnp.sum(z2, -1, keepdims=True)


# --------------------------------------------------------------------------- families


class _Family(NamedTuple):
    """An entropy family as the fitter sees it: its unconstrained shape chart."""

    name: str
    cls: type
    n_shape: int
    shape_name: str | None
    build: Callable  # u (scalar array) -> entropy instance
    value: Callable  # u -> the shape parameter's value
    chart: Callable  # value -> u (for initial guesses)


_Q_LO, _K_LO, _K_HI, _E_LO = 0.01, 0.01, 0.95, 0.01


def _softplus_inv(y):
    y = np.asarray(y, float)
    return np.log(np.expm1(y))


def _q_of(u):
    return 1.0 + _Q_LO + jax.nn.softplus(u)


def _kappa_of(u):
    return _K_LO + (_K_HI - _K_LO) * jax.nn.sigmoid(u)


def _abe_q_of(u):
    return jnp.exp(_E_LO + jax.nn.softplus(u))


_FAMILIES: tuple[_Family, ...] = (
    _Family("Shannon", Shannon, 0, None, lambda u: Shannon(), lambda u: jnp.nan * u,
            lambda v: 0.0),
    _Family("Tsallis", Tsallis, 1, "q", lambda u: Tsallis(_q_of(u)), _q_of,
            lambda v: _softplus_inv(v - 1.0 - _Q_LO)),
    _Family("Renyi", Renyi, 1, "q", lambda u: Renyi(_q_of(u)), _q_of,
            lambda v: _softplus_inv(v - 1.0 - _Q_LO)),
    _Family("Kaniadakis", Kaniadakis, 1, "kappa", lambda u: Kaniadakis(_kappa_of(u)),
            _kappa_of,
            lambda v: float(np.log((abs(v) - _K_LO) / (_K_HI - abs(v))))),
    _Family("Abe", Abe, 1, "q", lambda u: Abe(_abe_q_of(u)), _abe_q_of,
            lambda v: _softplus_inv(abs(math.log(v)) - _E_LO)),
    _Family("Burg", Burg, 0, None, lambda u: Burg(), lambda u: jnp.nan * u, lambda v: 0.0),
)

fit_families = tuple(f.name for f in _FAMILIES)
"""Names of the families `fit_path` can fit (Sharma-Mittal is not among them: it has two
shape parameters and contains Renyi (r -> 1) and Tsallis (r = q) as limits)."""


def _resolve_family(family) -> tuple[int, float | None]:
    """(index into `_FAMILIES`, initial shape value or None) from a class, an instance or a
    name."""
    init = None
    if isinstance(family, AbstractEntropy):
        init_leaves = [float(np.asarray(v)) for v in vars(family).values()]
        init = init_leaves[0] if init_leaves else None
        family = type(family)
    if isinstance(family, str):
        key = family.strip().lower().replace("-", "").replace("_", "").replace("é", "e")
        names = {f.name.lower(): i for i, f in enumerate(_FAMILIES)}
        names["entmax"] = names["tsallis"]
        if key not in names:
            raise ValueError(f"cannot fit family {family!r}; choose one of {fit_families}")
        return names[key], init
    for i, f in enumerate(_FAMILIES):
        if family is f.cls:
            return i, init
    raise ValueError(f"cannot fit family {family!r}; choose one of {fit_families}")


# --------------------------------------------------------------------------- the model

_LOG_BOX = 6.0  # each of log(m/gamma), log gamma, log T stays within +-6 e-folds of its scale
_FLOOR = 1e-6  # rho0 is mixed with this much of the uniform law (keeps zeros movable)
_COORDS = SphereCoordinates()


class _Data(NamedTuple):
    """One path, arrays only (the fit program is vmapped over a batch of these)."""

    times: Array  # (K,)
    sqrt_rho: Array  # (K, N) measured sqrt(rho)
    weights: Array  # (K,) 1 on the fitted layers, 0 elsewhere (layer 0 included)
    scores: Array  # (K, N) the energy schedule actually used (-E)
    x0: Array  # (N,) initial sphere point
    scale: Array  # (3,) reference log m, log gamma, log T


def _unpack(p, data: _Data, overdamped):
    """Physical parameters from the unconstrained vector p = (a_m, a_gamma, a_T, u, w).

    `overdamped` may be traced: then the mass and the velocity entries are ignored (their
    Jacobian columns vanish) and m = 0, v0 = 0 are reported."""
    box = lambda a, ref: ref + _LOG_BOX * jnp.tanh(a / _LOG_BOX)  # noqa: E731
    damping = jnp.exp(box(p[1], data.scale[1]))
    # p[0] charts the inertial time m/gamma (see the module docstring)
    mass = jnp.where(overdamped, 0.0, damping * jnp.exp(box(p[0], data.scale[0])))
    T = jnp.exp(box(p[2], data.scale[2]))
    u = p[3]
    w = p[4:]
    span = data.times[-1] - data.times[0]
    v0 = jnp.where(overdamped, 0.0, (w - data.x0 * jnp.dot(data.x0, w)) / span)
    return mass, damping, T, u, v0


def _score_at(t, times, scores):
    """Piecewise-linear interpolation of the score schedule (held constant outside)."""
    return jax.vmap(lambda col: jnp.interp(t, times, col), in_axes=1)(scores)


class _Static(eqx.Module):
    max_steps: int = eqx.field(static=True)
    # the families compiled into the program's lax.switch (indices into _FAMILIES); the
    # traced family index is a position in this tuple
    compiled: tuple = eqx.field(static=True)


def _branches(fam: _Family, u, T, mass, damping):
    """(inertial, overdamped) vector fields of one family on the state (x, v)."""

    def inertial(t, y, z):
        return _COORDS.vector_field(t, y, FisherSystem(fam.build(u), z, T, mass, damping))

    def overdamped(t, y, z):
        x, v = y
        # the mass is a placeholder here (the overdamped field does not read it)
        system = FisherSystem(fam.build(u), z, T, jnp.ones_like(T), damping)
        return _COORDS.overdamped_field(t, x, system), jnp.zeros_like(v)

    return inertial, overdamped


def _solve(family_index, overdamped, p, data: _Data, grids, static: _Static, rtol, atol):
    """The model's unit sphere points |x|/||x|| on each time grid of `grids` (a tuple of
    non-decreasing arrays, one solve), and a success flag.

    One program for every compiled family and both orders: `lax.switch` on the traced index
    `2 * family_index + overdamped` (`family_index`: a position in `static.compiled`); the
    state is (x, v) in both (v frozen at 0 when overdamped)."""
    mass, damping, T, u, v0 = _unpack(p, data, overdamped)
    branches = [b for i in static.compiled for b in _branches(_FAMILIES[i], u, T, mass, damping)]
    index = 2 * family_index + overdamped.astype(family_index.dtype)

    def vector_field(t, y, args):
        z = _score_at(t, data.times, data.scores)
        return jax.lax.switch(index, branches, t, y, z)

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vector_field),
        diffrax.Tsit5(scan_kind="lax"),
        data.times[0],
        jnp.max(jnp.stack([g[-1] for g in grids])),
        None,
        (data.x0, v0),
        saveat=diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=g, fn=lambda t, y, a: y[0])
                                    for g in grids]),
        # no jump_ts at the layer-time kinks of model B: the forced stops spend the step
        # budget and measurably worsened the B fits (rms 0.014 -> 0.024 on Shannon paths)
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=0.3, icoeff=0.3),
        max_steps=static.max_steps,
        adjoint=diffrax.ForwardMode(),
        throw=False,
    )
    xs = sol.ys
    ok = (sol.result == diffrax.RESULTS.successful) & jnp.all(
        jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs]))
    out = []
    for x in xs:
        x = jnp.where(ok, x, data.x0)
        out.append(jnp.abs(x) / jnp.linalg.norm(x, axis=-1, keepdims=True))
    return out, ok


def _residuals(p, args):
    """Residual vector whose squared norm is the weighted summed squared FR distance: per
    layer, $(a - \\sqrt\\rho)\\,d/\\|a - \\sqrt\\rho\\|$ (smooth; the ratio is 2 at 0)."""
    family_index, overdamped, data, static, rtol, atol = args
    (a,), ok = _solve(family_index, overdamped, p, data, (data.times,), static, rtol, atol)
    return _residuals_of(a, ok, data)


def _residuals_of(a, ok, data):
    diff = a - data.sqrt_rho
    c2 = jnp.sum(diff**2, -1, keepdims=True)
    small = c2 < 1e-10
    c2s = jnp.where(small, 1.0, c2)
    ratio = jnp.where(small, 2.0 + c2 / 12.0, _angle_from_chord2(c2s) / jnp.sqrt(c2s))
    r = diff * ratio * jnp.sqrt(data.weights)[:, None]
    # a failed solve costs more than any path can (max distance is pi per layer)
    return jnp.where(ok, r, jnp.pi).reshape(-1)


@eqx.filter_jit
def _fit_program(family_index, overdamped, data: _Data, inits, predict_times, static: _Static,
                 lm_tol, rtol, atol, max_lm_steps):
    """Levenberg-Marquardt from every initial guess (vmapped over paths and restarts);
    returns the best parameters, each restart's loss and the best fitted path (at the data
    times and at `predict_times`)."""
    solver = optx.LevenbergMarquardt(rtol=lm_tol, atol=lm_tol)

    def one_restart(p0, d):
        args = (family_index, overdamped, d, static, rtol, atol)
        sol = optx.least_squares(
            _residuals, solver, p0, args, max_steps=max_lm_steps, throw=False
        )
        (a, b), ok = _solve(family_index, overdamped, sol.value, d, (d.times, predict_times),
                            static, rtol, atol)
        loss = jnp.sum(_residuals_of(a, ok, d) ** 2)
        return sol.value, jnp.where(ok, loss, jnp.inf), a, b, ok

    # one vmap over (path, restart) pairs: a second, nested vmap would transform the whole
    # program twice (tracing time)
    n_paths, restarts = inits.shape[:2]
    rep = lambda x: jnp.repeat(x, restarts, axis=0)  # noqa: E731
    flat = jax.tree_util.tree_map(rep, data)
    ps, losses, a, b, ok = jax.vmap(one_restart)(inits.reshape((-1,) + inits.shape[2:]), flat)
    losses = losses.reshape(n_paths, restarts)
    best = jnp.argmin(losses, -1) + restarts * jnp.arange(n_paths)
    return ps[best], losses, a[best], b[best], ok[best]


@functools.partial(eqx.filter_jit, **RUN_ONCE)
def _predict_program(family_index, overdamped, params, data: _Data, times, static: _Static,
                     rtol, atol):
    def one(p, d):
        (a,), ok = _solve(family_index, overdamped, p, d, (times,), static, rtol, atol)
        return a, ok

    return jax.vmap(one)(params, data)


# --------------------------------------------------------------------------- the result


class PathFit(eqx.Module):
    """A fitted Fisher-Lagrangian trajectory (one path, or a batch with leading axes).

    **Fields:**
    - `family`: the family's name; `entropy`: the fitted instance (its shape parameter
      batched like the fit); `shape`: that parameter's value (NaN for Shannon / Burg).
    - `mass` ($m$; 0 for the overdamped fit), `damping` ($\\gamma$), `T`: fitted values, in
      the time unit of `times`; `velocity0`: the fitted $\\dot\\rho(0)$ (0 when overdamped).
    - `loss`: $\\sum_l w_l\\,d_l^2$ over the fitted layers; `distances` `(..., K)`: $d_l$ at
      every given layer, fitted or held out; `restart_losses` `(..., R)`.
    - `rho` `(..., K, N)`: the fitted trajectory at `times`; `success`: the final solve
      succeeded (a failed fit has `loss = inf`).
    - `n_params`, `n_obs`: the counts behind `aic` $= n\\ln(\\mathrm{RSS}/n) + 2k$ and
      `bic` $= n\\ln(\\mathrm{RSS}/n) + k\\ln n$: $n = (N - 1)\\times$ (fitted layers after the
      first) independent coordinates, k the free parameters ($m, \\gamma, T$, the shape, the
      $N - 1$ velocity components; $\\gamma, T$, the shape when overdamped).
    - `zeta`: damping ratio $\\gamma/(2\\sqrt{m\\,\\omega^2_{min}})$ of the softest tangent mode
      about the fixed point of the final energies (inf when overdamped);
      `relaxation_time`: $1/\\min_k(-\\mathrm{Re}\\,s_k)$ there, in the time unit of `times`.
    - `at_bound`: a log-parameter (m/gamma, gamma or T) ended within 5% of its box edge
      (+-6 e-folds around the data's reference scale): the value is a limit, not an estimate.
    - `times`, `scores` (the energy schedule used), `weights` (1 = fitted layer), `rho0`.
    - `predict_times`, `prediction` `(..., len, N)`: the trajectory at `predict_times` when
      they were given to `fit_path` (else None).
    - `overdamped`, `energy_model`: how it was fitted (`"mixed"`: per path, see `fit_path`).

    **Methods:** `predict(times)` integrates the fitted model to other times (after the last
    fitted layer the energies stay at their last fitted value).
    """

    family: str = eqx.field(static=True)
    overdamped: bool = eqx.field(static=True)
    energy_model: str = eqx.field(static=True)
    n_params: int = eqx.field(static=True)
    _static: _Static = eqx.field(static=True)
    _tols: tuple = eqx.field(static=True)
    entropy: AbstractEntropy
    shape: Array
    mass: Array
    damping: Array
    T: Array
    velocity0: Array
    loss: Array
    distances: Array
    restart_losses: Array
    rho: Array
    success: Array
    n_obs: Array
    aic: Array
    bic: Array
    zeta: Array
    relaxation_time: Array
    at_bound: Array
    times: Array
    scores: Array
    weights: Array
    rho0: Array
    predict_times: Array | None
    prediction: Array | None
    _params: Array
    _data: _Data

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.loss.shape

    def predict(self, times):
        """The fitted trajectory at `times` (non-decreasing, >= the first layer time), shape
        `(..., len(times), N)`; NaN where the solve failed."""
        with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
            times = jnp.asarray(times, jnp.float64)
            if times.ndim != 1 or np.any(np.diff(np.asarray(times)) < 0):
                raise ValueError("times must be a non-decreasing 1-D array")
            if float(times[0]) < float(np.max(np.asarray(self._data.times[..., 0]))):
                raise ValueError("times must start at or after the first layer time")
            shape = self.batch_shape
            flat = lambda x: x.reshape((-1,) + x.shape[len(shape):])  # noqa: E731
            data = jax.tree_util.tree_map(flat, self._data)
            a, ok = _predict_program(
                jnp.asarray(self._static.compiled.index(_resolve_family(self.family)[0]),
                            jnp.int32),
                jnp.asarray(self.overdamped), flat(self._params), data, times, self._static,
                *(jnp.asarray(v, jnp.float64) for v in self._tols),
            )
            rho = jnp.where(ok[:, None, None], a * a, jnp.nan)
            return rho.reshape(shape + rho.shape[1:])


# --------------------------------------------------------------------------- fitting


def _prepare(path, scores, times, fit_layers, energy_model):
    """Validate the inputs and build the (flattened) `_Data` batch, in NumPy float64."""
    path = np.asarray(path, np.float64)
    if path.ndim < 2:
        raise ValueError("path must have shape (..., K, N): K layers of N weights")
    K, N = path.shape[-2:]
    if K < 3 or N < 2:
        raise ValueError(f"need at least 3 layers and 2 weights, got path shape {path.shape}")
    if not np.all(np.isfinite(path)) or np.any(path < -1e-12):
        raise ValueError("path must hold finite nonnegative weights")
    batch = path.shape[:-2]
    path = np.clip(path, 0.0, None)
    path = path / np.sum(path, -1, keepdims=True)
    scores = np.asarray(scores, np.float64)
    if scores.shape[-1:] != (N,) or not np.all(np.isfinite(scores)):
        raise ValueError(f"scores must be finite with {N} entries on the last axis, "
                         f"got shape {scores.shape}")
    times = np.arange(K, dtype=np.float64) if times is None else np.asarray(times, np.float64)
    times = np.broadcast_to(times, batch + (K,))
    if np.any(np.diff(times, axis=-1) <= 0):
        raise ValueError("times must be strictly increasing")
    if fit_layers is None:
        weights = np.ones(batch + (K,))
    elif np.asarray(fit_layers).dtype == bool:
        weights = np.broadcast_to(np.asarray(fit_layers, np.float64), batch + (K,))
    else:
        n_fit = int(fit_layers)
        if not 3 <= n_fit <= K:
            raise ValueError(f"fit_layers must be in [3, {K}], got {n_fit}")
        weights = np.broadcast_to((np.arange(K) < n_fit).astype(np.float64), batch + (K,))
    if np.any(weights[..., 0] == 0) or np.any(np.sum(weights > 0, -1) < 3):
        raise ValueError("the fitted layers must include layer 0 and at least 3 layers")
    last = np.max(np.where(weights > 0, np.arange(K), -1), -1)  # (batch,)
    # the energy schedule never looks at scores past the last fitted layer
    use_b = np.broadcast_to(np.asarray(energy_model) == "B", batch)
    if scores.ndim == path.ndim - 1:  # one score vector per path
        if np.any(use_b):
            raise ValueError("energy model B needs per-layer scores of shape (..., K, N)")
        z_last = np.broadcast_to(scores, batch + (N,))
        schedule = np.broadcast_to(z_last[..., None, :], batch + (K, N))
    else:
        scores = np.broadcast_to(scores, batch + (K, N))
        z_last = np.take_along_axis(scores, last[..., None, None], -2)[..., 0, :]
        beyond = (np.arange(K) > last[..., None]) | ~use_b[..., None]
        schedule = np.where(beyond[..., None], z_last[..., None, :], scores)
    x0 = np.sqrt((1 - _FLOOR) * path[..., 0, :] + _FLOOR / N)
    # reference scales: energies by the spread of the final scores, time by the fitted span
    sigma = np.maximum(np.std(z_last, -1), 1e-3)
    span = np.take_along_axis(times, last[..., None], -1)[..., 0] - times[..., 0]
    # (log inertial time m/gamma, log gamma, log T)
    scale = np.stack([np.log(span) - 2.0, np.log(sigma * span), np.log(sigma)], -1)
    size = int(np.prod(batch)) if batch else 1

    def flat(x):
        return jnp.asarray(np.reshape(x, (size,) + np.shape(x)[len(batch):]), jnp.float64)

    data = _Data(flat(times), flat(np.sqrt(path)), flat(weights), flat(schedule), flat(x0),
                 flat(scale))
    return data, batch, (K, N)


@functools.partial(jax.jit, static_argnames=("fam_index",), **RUN_ONCE)
def _summarize(params, losses, a, ok, data: _Data, overdamped, k, *, fam_index):
    """Physical parameters, distances, information criteria and the linear response
    (compiled once per family: `overdamped` and the parameter count `k` are traced)."""
    fam = _FAMILIES[fam_index]
    N = a.shape[-1]
    mass, damping, T, u, v0x = jax.vmap(lambda p, d: _unpack(p, d, overdamped))(params, data)
    entropy = fam.build(u)
    ok = ok & jnp.isfinite(jnp.min(losses, -1))
    dist = _angle_from_chord2(_chord2(a, data.sqrt_rho))
    loss = jnp.where(ok, jnp.sum(data.weights * dist**2, -1), jnp.inf)
    n_obs = (jnp.sum(data.weights[:, 1:] > 0, -1) * (N - 1)).astype(a.dtype)
    misfit = n_obs * jnp.log(jnp.maximum(loss, 1e-300) / n_obs)
    aic = misfit + 2 * k
    bic = misfit + k * jnp.log(n_obs)
    velocity0 = 2 * data.x0 * v0x  # rho_dot(0) = 2 x x_dot
    # linear response about the fixed point of the final energies
    spec = jax.vmap(lambda e, z, t, m, g: relaxation_spectrum(e, z, t, mass=m, damping=g))(
        entropy, data.scores[:, -1], T, mass, damping)
    soft = jnp.min(spec.omega2, -1)
    safe_m = jnp.where(overdamped, 1.0, mass)
    zeta = jnp.where(overdamped, jnp.inf,
                     damping / (2 * jnp.sqrt(safe_m * jnp.maximum(soft, 1e-300))))
    logs = jnp.stack([jnp.where(overdamped, data.scale[:, 0], jnp.log(safe_m / damping)),
                      jnp.log(damping), jnp.log(T)], -1)
    at_bound = jnp.any(jnp.abs(logs - data.scale) > 0.95 * _LOG_BOX, -1)
    return dict(entropy=entropy, shape=fam.value(u), mass=mass, damping=damping, T=T,
                velocity0=velocity0, loss=loss, distances=dist, rho=a * a, success=ok,
                n_obs=n_obs, aic=aic, bic=bic, zeta=zeta,
                relaxation_time=1.0 / spec.slowest_rate, at_bound=at_bound)


def _initial_guesses(seed, n_paths, restarts, n, u0, warm=None):
    """Restart 0 sits at the reference scales, zero initial velocity and shape `u0` (or at
    `warm`, per path); the others are perturbed by standard normals around the reference
    (log-parameters and shape; the velocity by half of one)."""
    base = np.zeros(4 + n)
    base[3] = u0
    # NumPy's generator: a jax.random draw would compile a program per shape
    noise = np.random.default_rng(seed).standard_normal((n_paths, restarts, 4 + n))
    noise[..., 4:] *= 0.5
    guesses = base + noise
    guesses[:, 0] = base if warm is None else warm
    return jnp.asarray(guesses)


def _warm_start(init: "PathFit", data: _Data, overdamped: bool):
    """Restart 0 from a previous fit. From an overdamped fit to an inertial one: the same
    (gamma, T, shape), zero initial velocity and an inertial time m/gamma of 1/20 of the
    overdamped fit's relaxation time (kept between 1/50 and 1/2 of the shortest layer step),
    so the trajectory starts out close to the overdamped one. When the overdamped flow relaxes
    much faster than a layer, that start is stiff: the explicit solver may not resolve it
    within `max_ode_steps` (the restart then fails and the others decide)."""
    p = np.array(init._params, np.float64).reshape(-1, init._params.shape[-1])
    if init.overdamped and not overdamped:
        step = np.min(np.diff(np.asarray(data.times), axis=-1), -1)
        tau = np.asarray(init.relaxation_time, np.float64).reshape(-1)
        tau = np.where(np.isfinite(tau) & (tau > 0), tau, step)
        log_theta = np.log(np.clip(tau / 20, step / 50, step / 2))
        rel = np.clip((log_theta - np.asarray(data.scale[:, 0])) / _LOG_BOX, -0.99, 0.99)
        p[:, 0] = _LOG_BOX * np.arctanh(rel)
        p[:, 4:] = 0.0
    return p


def fit_path(
    path,
    entropy_family,
    *,
    scores,
    times=None,
    energy_model: str = "A",
    overdamped: bool = False,
    fit_layers=None,
    predict_times=None,
    restarts: int = 4,
    steps: int = 30,
    seed: int = 0,
    init: "PathFit | None" = None,
    tol: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_ode_steps: int = 256,
    compile_with=None,
) -> PathFit:
    """Fit the damped Fisher-Lagrangian dynamics of one entropy family to measured paths.

    Minimizes $\\sum_l d(\\rho^{model}(t_l), \\rho_l)^2$ over the fitted layers,
    $d(p, q) = 2\\arccos\\sum\\sqrt{p q}$ the Fisher-Rao distance, over $m, \\gamma, T$, the
    family's shape parameter and the initial velocity (MATH.md §6; the charts are in the
    module docstring). The model starts at the measured $\\rho_0$ (mixed with $10^{-6}$ of
    the uniform law so that exact zeros can move). Levenberg-Marquardt (optimistix) from
    `restarts` initial guesses, Jacobians by forward-mode differentiation through Diffrax;
    the best restart is kept. Runs in float64 whatever the global x64 flag. One compiled
    program serves both orders, both energy models and the families of `compile_with`
    (per data shape).

    **Arguments:**
    - `path`: measured weights, shape `(..., K, N)` (leading axes: independent paths, fitted
      in one vmapped call).
    - `entropy_family`: a class (`fisherdyn.Tsallis`), an instance (its shape parameter is
      the first restart's initial guess) or a name; one of `fit_families`.
    - `scores`: the measured scores $z = -E$, `(..., K, N)` per layer, or `(..., N)` (energy
      model A only).
    - `times`: `(K,)` or `(..., K)` increasing layer times (default `0, 1, ..., K-1`: time
      measured in layers). The fitted m and gamma are in this time unit.
    - `energy_model`: `"A"` fixed energies from the scores at the last fitted layer (pure
      relaxation); `"B"` the per-layer scores interpolated linearly in t (non-autonomous),
      held at the last fitted layer's value after it. An array of `"A"`/`"B"` broadcasting
      to the batch shape chooses per path (one call, one compiled program).
    - `overdamped`: fit the first-order replicator flow ($m = 0$; parameters gamma, T, shape).
    - `fit_layers`: None (all), an int n (the first n layers; the others are held out: their
      distances are predictions) or a boolean mask `(K,)` / `(..., K)` that includes layer 0.
    - `predict_times`: optional increasing times (>= the first time) at which to also
      return the fitted trajectory (`.prediction`) without another compilation.
    - `restarts`, `steps`: initial guesses and Levenberg-Marquardt iterations per guess;
      `seed`: the restarts' PRNG seed; `tol`: LM tolerance (relative and absolute).
    - `init`: a previous `PathFit` of the same paths (same batch shape and family) whose
      parameters become the first initial guess; from an overdamped fit, an inertial fit
      starts at the same (gamma, T, shape), zero velocity and a short inertial time (m/gamma
      = 1/20 of the overdamped relaxation time, between 1/50 and 1/2 of a layer step), close
      to the first-order fit it nests in the limit m/gamma -> 0.
    - `rtol`, `atol`, `max_ode_steps`: Diffrax step control; a solve that needs more steps
      counts as a failed trajectory (priced as a path at distance pi from every layer).
    - `compile_with`: families (classes, instances or names) to compile into the same
      program as `entropy_family`, so that fitting each of them afterwards (with the same
      `compile_with` and data shape) reuses it; default: only `entropy_family`. Compilation
      time grows with the number of families in the program.

    **Returns:** a `PathFit` (batched like `path`).
    """
    fam_index, init_shape = _resolve_family(entropy_family)
    fam = _FAMILIES[fam_index]
    models = np.unique(np.asarray(energy_model))
    if not set(models.tolist()) <= {"A", "B"}:
        raise ValueError(f"energy_model must be 'A' or 'B' (or an array of them), got "
                         f"{energy_model!r}")
    model_label = str(models[0]) if models.size == 1 else "mixed"
    if restarts < 1 or steps < 1:
        raise ValueError("restarts and steps must be >= 1")
    overdamped = bool(overdamped)
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        data, batch, (K, N) = _prepare(path, scores, times, fit_layers, energy_model)
        size = data.times.shape[0]
        if predict_times is None:
            ptimes = data.times[0]
        else:
            ptimes = np.asarray(predict_times, np.float64)
            if ptimes.ndim != 1 or np.any(np.diff(ptimes) < 0):
                raise ValueError("predict_times must be a non-decreasing 1-D array")
            if ptimes[0] < float(np.max(np.asarray(data.times[:, 0]))):
                raise ValueError("predict_times must start at or after the first layer time")
            ptimes = jnp.asarray(ptimes)
        u0 = 0.0 if init_shape is None or fam.n_shape == 0 else float(fam.chart(init_shape))
        warm = None
        if init is not None:
            if not isinstance(init, PathFit) or init.family != fam.name:
                raise ValueError("init must be a PathFit of the same family")
            if init.batch_shape != batch or init._params.shape[-1] != 4 + N:
                raise ValueError(f"init has batch shape {init.batch_shape}, expected {batch}")
            warm = _warm_start(init, data, overdamped)
        inits = _initial_guesses(int(seed), size, int(restarts), N, u0, warm)
        compiled = {fam_index} | {_resolve_family(f)[0] for f in (compile_with or ())}
        static = _Static(int(max_ode_steps), tuple(sorted(compiled)))
        tols = (float(rtol), float(atol))
        f64 = lambda v: jnp.asarray(v, jnp.float64)  # noqa: E731
        params, losses, a, b, ok = _fit_program(
            jnp.asarray(static.compiled.index(fam_index), jnp.int32), jnp.asarray(overdamped), data, inits, ptimes,
            static, f64(tol), f64(rtol), f64(atol), int(steps),
        )
        k = fam.n_shape + (2 if overdamped else 3 + (N - 1))
        out = _summarize(params, losses, a, ok, data, jnp.asarray(overdamped),
                         jnp.asarray(k, jnp.float64), fam_index=fam_index)
        prediction = jnp.where(ok[:, None, None], b * b, jnp.nan)

    def unflat(x):
        return x.reshape(batch + x.shape[1:])

    ub = lambda tree: jax.tree_util.tree_map(unflat, tree)  # noqa: E731
    o = {key: ub(v) for key, v in out.items()}
    return PathFit(
        fam.name, overdamped, model_label, int(k), static, tols,
        o["entropy"], o["shape"], o["mass"], o["damping"], o["T"], o["velocity0"], o["loss"],
        o["distances"], unflat(losses), o["rho"], o["success"], o["n_obs"], o["aic"],
        o["bic"], o["zeta"], o["relaxation_time"], o["at_bound"], unflat(data.times),
        unflat(data.scores), unflat(data.weights), unflat(data.x0**2),
        None if predict_times is None else ptimes,
        None if predict_times is None else unflat(prediction),
        unflat(params), ub(data),
    )
