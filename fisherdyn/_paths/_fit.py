"""Fitting the damped Fisher-Lagrangian dynamics to a measured attention path (docs/math.md §6).

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
$\\gamma = e^b$, temperature $T = e^c$ (each a smooth box of +-6 e-folds, `LOG_BOX`, around
a reference scale set by the data: $\\theta$ around $e^{-2}$ x the fitted span, so that it
reaches far below one layer step and the overdamped limit $\\theta \\to 0$ is approached
whatever gamma is; a box on m itself would tie the smallest reachable $\\theta$ to gamma),
the family's shape parameter in the unconstrained chart the family declares (Tsallis / Renyi
$q = 1.01 + \\mathrm{softplus}(u)$, Kaniadakis $\\kappa = 0.01 + 0.94\\,\\sigma(u)$, Abe
$q = e^{0.01 + \\mathrm{softplus}(u)}$) and the initial velocity (a tangent vector of the
sphere at $x_0$; $N - 1$ numbers). The layer-to-time scale is *not* a free parameter:
rescaling time $t \\to s t$ is exactly $m \\to m/s^2$, $\\gamma \\to \\gamma/s$, so it is not
identifiable next to $(m, \\gamma)$; the time unit is the one of `times` (default: one unit
per layer).

The fit is Levenberg-Marquardt (optimistix) on the residual vector whose squared norm is
the loss, with the Jacobian from forward-mode differentiation through the Diffrax solve
(`diffrax.ForwardMode`), vmapped over restarts and over a batch of paths. One compiled
program serves both orders (a `lax.switch` on a traced index), both energy models (a score
schedule) and every family named in `compile_with`: it is compiled once per data shape
(paths, restarts, layers, keys) and family set, and a small summary program once per
family. The programs are in `_fit_model.py`; `_charts.py` reads the families' charts
(`shape_chart`) from the registry.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._custom_types import Array, ArrayLike, Bool, Float
from .._entropies import AbstractEntropy
from ._charts import FAMILIES, Family, family_index, family_of
from ._fit_model import (
    FLOOR,
    LOG_BOX,
    FitData,
    FitStatic,
    fit_program,
    predict_program,
    summarize,
)

__all__ = ["PathFit", "fit_path"]


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

    **Methods:**

    - `predict(times)` integrates the fitted model to other times (after the last
    fitted layer the energies stay at their last fitted value).
    """

    family: str = eqx.field(static=True)
    overdamped: bool = eqx.field(static=True)
    energy_model: str = eqx.field(static=True)
    n_params: int = eqx.field(static=True)
    _static: FitStatic = eqx.field(static=True)
    _tols: tuple = eqx.field(static=True)
    entropy: AbstractEntropy
    shape: Float[Array, "*batch"]
    mass: Float[Array, "*batch"]
    damping: Float[Array, "*batch"]
    T: Float[Array, "*batch"]
    velocity0: Float[Array, "*batch N"]
    loss: Float[Array, "*batch"]
    distances: Float[Array, "*batch K"]
    restart_losses: Float[Array, "*batch R"]
    rho: Float[Array, "*batch K N"]
    success: Bool[Array, "*batch"]
    n_obs: Float[Array, "*batch"]
    aic: Float[Array, "*batch"]
    bic: Float[Array, "*batch"]
    zeta: Float[Array, "*batch"]
    relaxation_time: Float[Array, "*batch"]
    at_bound: Bool[Array, "*batch"]
    times: Float[Array, "*batch K"]
    scores: Float[Array, "*batch K N"]
    weights: Float[Array, "*batch K"]
    rho0: Float[Array, "*batch N"]
    predict_times: Float[Array, " P"] | None
    prediction: Float[Array, "*batch P N"] | None
    _params: Float[Array, "*batch n_params"]
    _data: FitData

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.loss.shape

    def predict(self, times: Float[ArrayLike, " P"]) -> Float[Array, "*batch P N"]:
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
            a, ok = predict_program(
                jnp.asarray(self._static.compiled.index(family_index(self.family)), jnp.int32),
                jnp.asarray(self.overdamped), flat(self._params), data, times, self._static,
                *(jnp.asarray(v, jnp.float64) for v in self._tols),
            )
            rho = jnp.where(ok[:, None, None], a * a, jnp.nan)
            return rho.reshape(shape + rho.shape[1:])


def _normalized_path(path):
    """The measured weights `(..., K, N)` in float64, validated, clipped at 0 and summing
    to 1."""
    path = np.asarray(path, np.float64)
    if path.ndim < 2:
        raise ValueError("path must have shape (..., K, N): K layers of N weights")
    K, N = path.shape[-2:]
    if K < 3 or N < 2:
        raise ValueError(f"need at least 3 layers and 2 weights, got path shape {path.shape}")
    if not np.all(np.isfinite(path)) or np.any(path < -1e-12):
        raise ValueError("path must hold finite nonnegative weights")
    path = np.clip(path, 0.0, None)
    return path / np.sum(path, -1, keepdims=True)


def _layer_weights(fit_layers, batch, K):
    """1 on the fitted layers, 0 on the held-out ones, shape `batch + (K,)`."""
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
    return weights


def _energy_schedule(scores, per_layer, last, energy_model, batch, K, N):
    """(the last fitted layer's scores, the score schedule `batch + (K, N)` the model
    sees); the schedule never looks at scores past the last fitted layer."""
    use_b = np.broadcast_to(np.asarray(energy_model) == "B", batch)
    if not per_layer:  # one score vector per path
        if np.any(use_b):
            raise ValueError("energy model B needs per-layer scores of shape (..., K, N)")
        z_last = np.broadcast_to(scores, batch + (N,))
        return z_last, np.broadcast_to(z_last[..., None, :], batch + (K, N))
    scores = np.broadcast_to(scores, batch + (K, N))
    z_last = np.take_along_axis(scores, last[..., None, None], -2)[..., 0, :]
    beyond = (np.arange(K) > last[..., None]) | ~use_b[..., None]
    return z_last, np.where(beyond[..., None], z_last[..., None, :], scores)


def _prepare(path, scores, times, fit_layers, energy_model):
    """Validate the inputs and build the (flattened) `FitData` batch, in NumPy float64."""
    path = _normalized_path(path)
    K, N = path.shape[-2:]
    batch = path.shape[:-2]
    scores = np.asarray(scores, np.float64)
    if scores.shape[-1:] != (N,) or not np.all(np.isfinite(scores)):
        raise ValueError(f"scores must be finite with {N} entries on the last axis, "
                         f"got shape {scores.shape}")
    times = np.arange(K, dtype=np.float64) if times is None else np.asarray(times, np.float64)
    times = np.broadcast_to(times, batch + (K,))
    if np.any(np.diff(times, axis=-1) <= 0):
        raise ValueError("times must be strictly increasing")
    weights = _layer_weights(fit_layers, batch, K)
    last = np.max(np.where(weights > 0, np.arange(K), -1), -1)  # (batch,)
    z_last, schedule = _energy_schedule(scores, scores.ndim != path.ndim - 1, last,
                                        energy_model, batch, K, N)
    x0 = np.sqrt((1 - FLOOR) * path[..., 0, :] + FLOOR / N)
    # reference scales: energies by the spread of the final scores, time by the fitted span
    sigma = np.maximum(np.std(z_last, -1), 1e-3)
    span = np.take_along_axis(times, last[..., None], -1)[..., 0] - times[..., 0]
    # (log inertial time m/gamma, log gamma, log T)
    scale = np.stack([np.log(span) - 2.0, np.log(sigma * span), np.log(sigma)], -1)
    size = int(np.prod(batch)) if batch else 1

    def flat(x):
        return jnp.asarray(np.reshape(x, (size,) + np.shape(x)[len(batch):]), jnp.float64)

    data = FitData(flat(times), flat(np.sqrt(path)), flat(weights), flat(schedule), flat(x0),
                   flat(scale))
    return data, batch, (K, N)


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


def _warm_start(init: PathFit, data: FitData, overdamped: bool):
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
        rel = np.clip((log_theta - np.asarray(data.scale[:, 0])) / LOG_BOX, -0.99, 0.99)
        p[:, 0] = LOG_BOX * np.arctanh(rel)
        p[:, 4:] = 0.0
    return p


def fit_path(
    entropy: AbstractEntropy,
    scores: Float[ArrayLike, "*#batch K N"] | Float[ArrayLike, "*#batch N"],
    path: Float[ArrayLike, "*batch K N"],
    *,
    times: Float[ArrayLike, "*#batch K"] | None = None,
    energy_model: str | ArrayLike = "A",
    overdamped: bool = False,
    fit_layers: int | Bool[ArrayLike, "*#batch K"] | None = None,
    predict_times: Float[ArrayLike, " P"] | None = None,
    restarts: int = 4,
    steps: int = 30,
    seed: int = 0,
    init: PathFit | None = None,
    tol: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_ode_steps: int = 256,
    solver: str = "tsit5",
    compile_with: Sequence[AbstractEntropy] | None = None,
) -> PathFit:
    """Fit the damped Fisher-Lagrangian dynamics of one entropy family to measured paths.

    Minimizes $\\sum_l d(\\rho^{model}(t_l), \\rho_l)^2$ over the fitted layers,
    $d(p, q) = 2\\arccos\\sum\\sqrt{p q}$ the Fisher-Rao distance, over $m, \\gamma, T$, the
    family's shape parameter and the initial velocity (docs/math.md §6; the charts are in the
    module docstring). The model starts at the measured $\\rho_0$ (mixed with $10^{-6}$ of
    the uniform law so that exact zeros can move). Levenberg-Marquardt (optimistix) from
    `restarts` initial guesses, Jacobians by forward-mode differentiation through Diffrax;
    the best restart is kept. Runs in float64 whatever the global x64 flag. One compiled
    program serves both orders, both energy models and the families of `compile_with`
    (per data shape).

    **Arguments:**

    - `entropy`: an instance of one of `fit_families`: the family to fit, its shape
      parameter the first restart's initial guess (`fisherdyn.Tsallis(1.5)` starts $q$ at
      1.5).
    - `scores`: the measured scores $z = -E$, `(..., K, N)` per layer, or `(..., N)` (energy
      model A only).
    - `path`: measured weights, shape `(..., K, N)` (leading axes: independent paths, fitted
      in one vmapped call).
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
    - `solver`: `"tsit5"` (explicit, the default) or `"kvaerno5"` (implicit, for stiff
      fits: an inertial fit whose m/gamma is far below a layer step, near its overdamped
      limit, which the explicit solver cannot resolve within `max_ode_steps`).
    - `compile_with`: entropy instances whose families are compiled into the same program
      as `entropy`'s, so that fitting each of them afterwards (with the same
      `compile_with` and data shape) reuses it; default: only `entropy`'s family. Compilation
      time grows with the number of families in the program.

    **Returns:**

    A `PathFit` (batched like `path`).
    """
    fam_index, init_shape = family_of(entropy)
    fam = FAMILIES[fam_index]
    model_label = _energy_label(energy_model)
    if restarts < 1 or steps < 1:
        raise ValueError("restarts and steps must be >= 1")
    overdamped = bool(overdamped)
    compiled = {fam_index} | {family_of(f, "compile_with")[0] for f in (compile_with or ())}
    if solver not in ("tsit5", "kvaerno5"):
        raise ValueError(f"solver must be 'tsit5' or 'kvaerno5', got {solver!r}")
    static = FitStatic(int(max_ode_steps), tuple(sorted(compiled)), solver)
    tols = (float(rtol), float(atol))
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        data, batch, (_, N) = _prepare(path, scores, times, fit_layers, energy_model)
        ptimes = _predict_grid(predict_times, data)
        inits = _guesses(fam, init_shape, init, data, batch, overdamped, int(seed),
                         int(restarts))
        k = fam.n_shape + (2 if overdamped else 3 + (N - 1))
        params, losses, out, prediction = _run(fam_index, overdamped, data, inits, ptimes,
                                               static, k, tol, rtol, atol, steps)
    if predict_times is None:
        ptimes = prediction = None
    return _assemble(fam, overdamped, model_label, k, static, tols, out, losses, data,
                     ptimes, prediction, params, batch)


def _guesses(fam: Family, init_shape, init, data: FitData, batch, overdamped, seed, restarts):
    """The initial guesses `(paths, restarts, 4 + N)`: restart 0 from `init` (validated)
    or from the shape `init_shape`, the others perturbed."""
    N = data.x0.shape[-1]
    u0 = 0.0 if init_shape is None or fam.n_shape == 0 else float(fam.chart(init_shape))
    warm = None
    if init is not None:
        if not isinstance(init, PathFit) or init.family != fam.name:
            raise ValueError("init must be a PathFit of the same family")
        if init.batch_shape != batch or init._params.shape[-1] != 4 + N:
            raise ValueError(f"init has batch shape {init.batch_shape}, expected {batch}")
        warm = _warm_start(init, data, overdamped)
    return _initial_guesses(seed, data.times.shape[0], restarts, N, u0, warm)


def _run(fam_index, overdamped, data: FitData, inits, ptimes, static: FitStatic, k, tol, rtol,
         atol, steps):
    """The fit and summary programs: (best parameters, restart losses, summary, the fitted
    paths at `ptimes`)."""
    f64 = lambda v: jnp.asarray(v, jnp.float64)  # noqa: E731
    params, losses, a, b, ok = fit_program(
        jnp.asarray(static.compiled.index(fam_index), jnp.int32), jnp.asarray(overdamped),
        data, inits, ptimes, static, f64(tol), f64(rtol), f64(atol), int(steps),
    )
    out = summarize(params, losses, a, ok, data, jnp.asarray(overdamped),
                    jnp.asarray(k, jnp.float64), fam_index=fam_index)
    return params, losses, out, jnp.where(ok[:, None, None], b * b, jnp.nan)


def _energy_label(energy_model) -> str:
    """`"A"`, `"B"` or `"mixed"` (validated)."""
    models = np.unique(np.asarray(energy_model))
    if not set(models.tolist()) <= {"A", "B"}:
        raise ValueError(f"energy_model must be 'A' or 'B' (or an array of them), got "
                         f"{energy_model!r}")
    return str(models[0]) if models.size == 1 else "mixed"


def _predict_grid(predict_times, data: FitData):
    """The validated `predict_times` as a float64 array; without them, the first path's
    layer times stand in (the fit program always saves a second grid)."""
    if predict_times is None:
        return data.times[0]
    ptimes = np.asarray(predict_times, np.float64)
    if ptimes.ndim != 1 or np.any(np.diff(ptimes) < 0):
        raise ValueError("predict_times must be a non-decreasing 1-D array")
    if ptimes[0] < float(np.max(np.asarray(data.times[:, 0]))):
        raise ValueError("predict_times must start at or after the first layer time")
    return jnp.asarray(ptimes)


def _assemble(fam: Family, overdamped, model_label, k, static, tols, out, losses,
              data: FitData, ptimes, prediction, params, batch) -> PathFit:
    """The `PathFit` of the flat fit outputs, with the batch axes restored."""

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
        ptimes, None if prediction is None else unflat(prediction),
        unflat(params), ub(data),
    )
