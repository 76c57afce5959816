"""Held-out prediction of attention paths: the Fisher model against its baselines.

One head's paths are split two ways: problems into training and held-out ones, loops into
early ones (seen) and later ones (predicted). Each model has the same few parameters for
every problem of the head, fitted on the training problems' early loops, and predicts the
held-out problems' later loops from their own early loops (the start, and for
`velocity="difference"` the first step):

- `fisher`: the damped Fisher-Lagrangian dynamics `fisherdyn.simulate(entropy, s, T,
  mass=m, damping=gamma)` toward the problem's scores $s$, from $\\rho_0$; parameters
  $(m, \\gamma, T)$.
- `linear`: the equal-parameter linear dynamics in score space,
  $\\ddot z = a(s - z) - b\\dot z$, read out as $\\mathrm{softmax}(z/T)$ (or the family's
  stationary law), from $z_0 = T\\ln\\rho_0$ ($T G(\\rho_0)$); parameters $(a, b, T)$. It has
  the Fisher model's number of parameters and its fixed point, but no Fisher geometry.
- `relaxation`: the first-order linear relaxation of the scores,
  $z(t) = s + (z_0 - s)e^{-kt}$, read out as the linear model is; parameters $(k, T)$. It is
  the overdamped limit of `linear` ($b \\to \\infty$ with its slow rate held at $k$), which
  a second-order model that starts at rest reaches only asymptotically. It enters the
  likelihood comparison only (`LIKELIHOOD_BASELINES`), so the `heldout` ratio keeps its
  definition.
- `constant`: the last seen attention held.
- `geodesic`: the Fisher-Rao geodesic through the last two seen loops, continued at
  constant speed (`geodesic_interpolation` with $s > 1$).

Both fitted models are Levenberg-Marquardt (optimistix) on the residuals
$2(\\sqrt{\\hat\\rho} - \\sqrt\\rho)$ (squared norm: the summed squared Fisher-Rao distance to
second order), from a few fixed initial guesses, in log-parameters. With `temperature`
given, T is held there and only $(m, \\gamma)$ and $(a, b)$ are fitted.

Models are compared on the held-out problems two ways:

- by Fisher-Rao rms (`ratio`: Fisher over the best baseline; the `heldout` criterion);
- by likelihood under Gaussian noise of one standard deviation $\\hat\\sigma$ in
  $\\sqrt\\rho$ (`loglik_ratio`; the `heldout_likelihood` criterion). $\\hat\\sigma$ is the
  rms training residual of the better fitted model (loops after the first, $N - 1$ degrees
  of freedom per loop), never below `noise_floor`. Per held-out problem the log-likelihood
  ratio of the Fisher model to a baseline is
  $(\\lVert r_{base}\\rVert^2 - \\lVert r_{Fisher}\\rVert^2) / 2\\hat\\sigma^2$ over its
  predicted loops. An rms ratio tends to 1 once the noise dominates both errors; the
  likelihood ratio instead weighs the difference of the errors against the noise. The
  models are judged out of sample and have equal parameter counts (0 for the unfitted
  baselines), so no penalty enters.
"""

from __future__ import annotations

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from jaxtyping import ArrayLike, Bool, Float

from fisherdyn import (
    RESULTS,
    AbstractEntropy,
    fisher_rao_distance,
    geodesic_interpolation,
    simulate,
    stationary,
)

from .jit import RUN_ONCE
from .verdict import Interval, bootstrap_ci

__all__ = ["HeldoutPrediction", "heldout_prediction", "METHODS", "LIKELIHOOD_BASELINES",
           "loglik_ratios", "least_mean_loglik"]

METHODS = ("fisher", "linear", "constant", "geodesic")
# the baselines the likelihood ratio compares the Fisher model with
LIKELIHOOD_BASELINES = ("linear", "relaxation", "constant", "geodesic")
FLOOR = 1e-9  # weights are mixed with this much of uniform so that logs and G stay finite
# sigma-hat is not read below the fits' own resolution (rtol 1e-5 solves, 30 LM steps)
NOISE_FLOOR = 1e-3


class HeldoutPrediction(eqx.Module):
    """Held-out errors of the Fisher model and its baselines.

    **Fields:**
    - `rms`: method -> `Interval` of the mean held-out Fisher-Rao rms (bootstrap over the
      held-out problems' units).
    - `per_problem`: method -> `(P_heldout,)` rms over the later loops of each held-out
      problem.
    - `ratio`: `Interval` of mean rms(fisher) / min over the baselines of mean rms (the
      `heldout` criterion's statistic); `best`: the method of least mean rms.
    - `fisher_params`: $(m, \\gamma, T)$; `linear_params`: $(a, b, T)$;
      `relaxation_params`: $(k, T)$.
    - `train_loss`: method -> summed squared residual on the training data (fitted ones).
    - `predictions`: method -> `(P, K, N)` paths of every problem (the fitted models from
      each problem's own start).
    - `noise`: $\\hat\\sigma$, the noise in $\\sqrt\\rho$ the likelihoods assume.
    - `sq_error`: method -> `(P_heldout,)` summed squared error in $\\sqrt\\rho$ over the
      predicted loops of each held-out problem.
    - `loglik_ratio`: `Interval` of the mean log-likelihood ratio per held-out problem of
      the Fisher model to the best baseline (the least of the three means).
    """

    rms: dict
    per_problem: dict
    ratio: Interval
    best: str
    fisher_params: tuple
    linear_params: tuple
    relaxation_params: tuple
    train_loss: dict
    predictions: dict
    noise: float
    sq_error: dict
    loglik_ratio: Interval


def loglik_ratios(sq_error: dict, noise: float) -> np.ndarray:
    """Per held-out problem, the log-likelihood ratio of the Fisher model to each of
    `LIKELIHOOD_BASELINES` under Gaussian noise `noise` in $\\sqrt\\rho$: `(P, 4)`."""
    return np.stack([(sq_error[k] - sq_error["fisher"]) / (2 * noise**2)
                     for k in LIKELIHOOD_BASELINES], -1)


def least_mean_loglik(per_unit: np.ndarray) -> float:
    """The `heldout_likelihood` statistic from per-unit rows (summed ratios against each
    baseline, then the count of problems): the least, over the baselines, of the mean
    ratio per problem."""
    nb = per_unit.shape[1] - 1
    return float((per_unit[:, :nb].sum(0) / per_unit[:, nb].sum()).min())


def _velocity(rho, t, rule):
    """The initial velocity by a fixed rule: zero, or the first step's difference."""
    if rule == "zero":
        return jnp.zeros_like(rho[:, 0])
    if rule == "difference":
        return (rho[:, 1] - rho[:, 0]) / (t[1] - t[0])
    raise ValueError(f"velocity must be 'zero' or 'difference', got {rule!r}")


LOG_BOX = 30.0  # log-parameters beyond +-30 (or non-finite) price the model as failed


def _parameters(logp):
    """exp of the log-parameters kept inside the box (so the solvers' checks of T, m and
    gamma never see inf, 0 or NaN while the optimizer wanders), and whether they were."""
    inside = jnp.all(jnp.isfinite(logp) & (jnp.abs(logp) <= LOG_BOX))
    p = jnp.exp(jnp.clip(jnp.where(jnp.isfinite(logp), logp, 0.0), -LOG_BOX, LOG_BOX))
    return (*p, inside)


def _fisher_paths(logp, entropy, scores, rho0, v0, ts, max_steps, solver=None, rtol=1e-7):
    """`simulate` of every problem at the times `ts`, and whether each solve succeeded."""
    m, gamma, T, inside = _parameters(logp)
    tr = simulate(entropy, scores, T, mass=m, damping=gamma, rho0=rho0, velocity0=v0,
                  t1=ts[-1], saveat=ts, rtol=rtol, atol=rtol / 100, max_steps=max_steps,
                  solver=solver, adjoint=diffrax.ForwardMode(), throw=False)
    ok = (tr.result == RESULTS.successful) & jnp.all(jnp.isfinite(tr.rho), (-2, -1)) & inside
    return jnp.where(ok[:, None, None], tr.rho, rho0[:, None, :]), ok


def _companion_flow(a, b, t):
    """$(\\Phi_{00}, \\Phi_{01})(t)$ of $\\ddot u + b\\dot u + a u = 0$: $u(t) = \\Phi_{00}u_0
    + \\Phi_{01}\\dot u_0$. With $q = (b^2/4 - a)t^2$, $C = \\cosh\\sqrt q$ and
    $S = \\sinh\\sqrt q/\\sqrt q$ (cos / sin for $q < 0$, a series near 0 so that the
    critical case is smooth): $\\Phi_{00} = e^{-bt/2}(C + \\tfrac{bt}{2}S)$,
    $\\Phi_{01} = e^{-bt/2}\\,t\\,S$."""
    q = (b * b / 4 - a) * t * t
    small = jnp.abs(q) < 1e-4
    r = jnp.sqrt(jnp.abs(jnp.where(small, 1.0, q)))
    C = jnp.where(small, 1 + q / 2 + q * q / 24, jnp.where(q > 0, jnp.cosh(r), jnp.cos(r)))
    S = jnp.where(small, 1 + q / 6 + q * q / 120,
                  jnp.where(q > 0, jnp.sinh(r), jnp.sin(r)) / r)
    decay = jnp.exp(-b * t / 2)
    return decay * (C + b * t / 2 * S), decay * t * S


def _linear_paths(logp, entropy, scores, rho0, dz0_unit, ts, readout):
    """$\\ddot u = -a u - b\\dot u$, $u = z - s$, in closed form, read out at temperature T."""
    a, b, T, inside = _parameters(logp)
    if readout == "softmax":
        z0, dz0 = T * jnp.log(rho0), T * dz0_unit
    else:
        z0, dz0 = T * entropy.G(rho0), T * dz0_unit
    p00, p01 = _companion_flow(a, b, ts - ts[0])  # (K,)
    z = scores[:, None] + p00[None, :, None] * (z0 - scores)[:, None] \
        + p01[None, :, None] * dz0[:, None]
    ok = jnp.all(jnp.isfinite(z), (-2, -1)) & inside
    z = jnp.where(ok[:, None, None], z, scores[:, None])
    if readout == "softmax":
        return jax.nn.softmax(z / T, -1), ok
    return stationary(entropy, z, T), ok


def _relaxation_paths(logp, entropy, scores, rho0, ts, readout):
    """$z = s + (z_0 - s)e^{-k(t - t_0)}$ read out at temperature T; log-parameters
    $(\\log k, \\log T)$."""
    k, T, inside = _parameters(logp)
    z0 = T * (jnp.log(rho0) if readout == "softmax" else entropy.G(rho0))
    decay = jnp.exp(-k * (ts - ts[0]))
    z = scores[:, None] + decay[None, :, None] * (z0 - scores)[:, None]
    ok = jnp.all(jnp.isfinite(z), (-2, -1)) & inside
    z = jnp.where(ok[:, None, None], z, scores[:, None])
    if readout == "softmax":
        return jax.nn.softmax(z / T, -1), ok
    return stationary(entropy, z, T), ok


def _model_paths(kind, logp, entropy, scores, rho0, init_vel, ts, max_steps, readout,
                 solver, rtol):
    """The paths of one fitted model (`kind` "fisher", "linear" or "relaxation") and their
    success."""
    if kind == "fisher":
        return _fisher_paths(logp, entropy, scores, rho0, init_vel, ts, max_steps, solver, rtol)
    if kind == "relaxation":
        return _relaxation_paths(logp, entropy, scores, rho0, ts, readout)
    return _linear_paths(logp, entropy, scores, rho0, init_vel, ts, readout)


_STATIC = ("kind", "lm_steps", "max_steps", "readout", "solver", "rtol")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _fit_program(guesses, entropy, scores, rho0, init_vel, ts, target, log_T, *, kind,
                 lm_steps, max_steps, readout, solver, rtol):
    """Levenberg-Marquardt from every guess (vmapped): (log-parameters, losses). The data
    are arguments, so one compiled program serves every head of the same shapes. With
    `log_T` (not None) the guesses hold two log-parameters and T is fixed there."""
    lm = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8)

    def residuals(logp, _):
        if log_T is not None:
            logp = jnp.concatenate([logp, jnp.reshape(log_T, (1,))])
        rho, ok = _model_paths(kind, logp, entropy, scores, rho0, init_vel, ts, max_steps,
                               readout, solver, rtol)
        r = 2 * (jnp.sqrt(rho) - jnp.sqrt(target))
        return jnp.where(ok[:, None, None], r, jnp.pi).reshape(-1)

    def one(g0):
        sol = optx.least_squares(residuals, lm, g0, max_steps=lm_steps, throw=False)
        return sol.value, jnp.sum(residuals(sol.value, None) ** 2)

    return jax.vmap(one)(guesses)


@functools.partial(jax.jit, static_argnames=("max_steps", "readout", "solver", "rtol"),
                   **RUN_ONCE)
def _predict_program(pf, pl, entropy, scores, rho0, v0, dz0, ts, *, max_steps, readout,
                     solver, rtol):
    """Both fitted models' paths of every problem at the times `ts`."""
    f = _fisher_paths(pf, entropy, scores, rho0, v0, ts, max_steps, solver, rtol)[0]
    return f, _linear_paths(pl, entropy, scores, rho0, dz0, ts, readout)[0]


def _best(values, losses):
    losses = np.where(np.isfinite(np.asarray(losses)), np.asarray(losses), np.inf)
    j = int(np.argmin(losses))
    return values[j], float(losses[j])


def heldout_prediction(
    paths: Float[ArrayLike, "P K N"],
    times: Float[ArrayLike, " K"],
    scores: Float[ArrayLike, "P N"],
    entropy: AbstractEntropy,
    *,
    train: Bool[ArrayLike, " P"],
    n_early: int,
    velocity: str = "zero",
    units: ArrayLike | None = None,
    linear_readout: str = "softmax",
    guesses: Float[ArrayLike, "G 3"] | None = None,
    linear_guesses: Float[ArrayLike, "G 3"] | None = None,
    lm_steps: int = 60,
    max_steps: int = 4096,
    solver: str | None = None,
    rtol: float = 1e-7,
    temperature: float | None = None,
    noise_floor: float = NOISE_FLOOR,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> HeldoutPrediction:
    """Fit one $(m, \\gamma, T)$ per head and predict held-out problems and later loops.

    **Arguments:**

    - `paths`: one head's attention `(P, K, N)` at the loop `times` `(K,)`.
    - `scores`: `(P, N)` the fixed scores each problem relaxes toward (e.g. the loop's
      scores at its fixed point, or at the last early loop: the caller decides what the
      models may see).
    - `entropy`: the family of the Fisher model (and of the linear model's readout with
      `linear_readout="family"`).
    - `train`: `(P,)` True for the fitting problems, False for the held-out ones.
    - `n_early`: loops $0..n_{early}-1$ are seen (fitted on the training problems, starts
      of the held-out ones); loops from $n_{early}$ on are predicted ($\\ge 3$, $< K$).
    - `velocity`: the initial velocity of both fitted models: `"zero"`, or the first
      step's difference $(\\rho_1 - \\rho_0)/(t_1 - t_0)$ (no per-path velocity is fitted).
    - `units`: a label per problem for the bootstrap (default: each problem).
    - `linear_readout`: `"softmax"` (the baseline as specified) or `"family"`
      (`stationary(entropy, z, T)`, for families with exact zeros).
    - `guesses`, `linear_guesses`: initial log-parameters `(G, 3)`, ($\\log m, \\log\\gamma,
      \\log T$) and ($\\log a, \\log b, \\log T$) (`(G, 2)` without $\\log T$ when
      `temperature` is given); default a small fixed grid.
    - `lm_steps`: Levenberg-Marquardt iterations per guess; `max_steps`: ODE step budget
      (a solve that needs more is priced at distance $\\pi$); `solver`: `simulate`'s solver
      (default Tsit5; `"kvaerno5"` for a stiff fit, m/gamma far below a loop step);
      `rtol`: its relative tolerance (absolute: `rtol / 100`).
    - `temperature`: hold T at this value in both fitted models (the model's own
      temperature) instead of fitting it.
    - `noise_floor`: the least $\\hat\\sigma$ the likelihood ratio assumes.
    - `level`, `n_boot`, `seed`: the bootstrap.

    **Returns:** a `HeldoutPrediction`.
    """
    with jax.numpy_dtype_promotion("standard"):
        return _heldout(paths, times, scores, entropy, train, n_early, velocity, units,
                        linear_readout, guesses, linear_guesses, lm_steps, max_steps, solver,
                        float(rtol), temperature, float(noise_floor), level, n_boot, seed)


def _heldout(paths, times, scores, entropy, train, n_early, velocity, units, linear_readout,
             guesses, linear_guesses, lm_steps, max_steps, solver, rtol, temperature,
             noise_floor, level, n_boot, seed):
    rho = np.asarray(paths, np.float64)
    P, K, N = rho.shape
    rho = (1 - FLOOR) * rho / rho.sum(-1, keepdims=True) + FLOOR / N
    t = np.asarray(times, np.float64)
    s = np.broadcast_to(np.asarray(scores, np.float64), (P, N))
    train = np.asarray(train, bool)
    if not 3 <= n_early < K or t.shape != (K,):
        raise ValueError(f"need times (K,) and 3 <= n_early < K = {K}")
    if train.shape != (P,) or train.all() or not train.any():
        raise ValueError("train must mark some (not all) of the P problems")
    if linear_readout not in ("softmax", "family"):
        raise ValueError("linear_readout must be 'softmax' or 'family'")
    if temperature is not None and not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    if not noise_floor > 0:
        raise ValueError(f"noise_floor must be positive, got {noise_floor}")
    rho_j, t_j, s_j = jnp.asarray(rho), jnp.asarray(t), jnp.asarray(s)
    v0 = _velocity(rho_j, t_j, velocity)
    G = (lambda x: jnp.log(x)) if linear_readout == "softmax" else entropy.G
    dz0 = (jnp.zeros_like(v0) if velocity == "zero"
           else (G(rho_j[:, 1]) - G(rho_j[:, 0])) / (t_j[1] - t_j[0]))  # per unit T
    tr_idx = np.flatnonzero(train)
    entropy = jax.tree_util.tree_map(
        lambda x: jnp.asarray(x, jnp.float64) if isinstance(x, (int, float)) else x, entropy)
    span = t[n_early - 1] - t[0]
    sigma = max(float(np.std(s)), 1e-3) if temperature is None else float(temperature)
    if guesses is None:
        guesses = [[np.log(m * span**2), np.log(g * sigma * span), np.log(sigma)]
                   for m, g in ((0.01, 0.3), (0.1, 1.0), (0.01, 3.0))]
    if linear_guesses is None:
        linear_guesses = [[np.log(a / span**2), np.log(b / span), np.log(sigma)]
                          for a, b in ((1.0, 1.0), (10.0, 3.0), (3.0, 10.0))]
    relax_guesses = [[np.log(k / span), np.log(sigma)] for k in (0.3, 1.0, 3.0)]
    n_fit = 3 if temperature is None else 2
    guesses = np.asarray(guesses, np.float64)[:, :n_fit]
    linear_guesses = np.asarray(linear_guesses, np.float64)[:, :n_fit]
    relax_guesses = np.asarray(relax_guesses)[:, :n_fit - 1]
    log_T = None if temperature is None else jnp.asarray(np.log(temperature), jnp.float64)
    early, target = jnp.asarray(t[:n_early]), jnp.asarray(rho[tr_idx, :n_early])
    common = (entropy, s_j[tr_idx], rho_j[tr_idx, 0])
    static = dict(lm_steps=int(lm_steps), max_steps=int(max_steps), readout=linear_readout,
                  solver=solver, rtol=rtol)
    pf, loss_f = _best(*_fit_program(jnp.asarray(guesses), *common, v0[tr_idx], early,
                                     target, log_T, kind="fisher", **static))
    pl, loss_l = _best(*_fit_program(jnp.asarray(linear_guesses), *common, dz0[tr_idx],
                                     early, target, log_T, kind="linear", **static))
    pr, loss_r = _best(*_fit_program(jnp.asarray(relax_guesses), *common, dz0[tr_idx],
                                     early, target, log_T, kind="relaxation", **static))
    if log_T is not None:
        pf, pl, pr = (jnp.concatenate([p, jnp.reshape(log_T, (1,))]) for p in (pf, pl, pr))
    pred_f, pred_l = _predict_program(pf, pl, entropy, s_j, rho_j[:, 0], v0, dz0, t_j,
                                      max_steps=int(max_steps), readout=linear_readout,
                                      solver=solver, rtol=rtol)
    preds = {"fisher": np.asarray(pred_f), "linear": np.asarray(pred_l),
             "relaxation": np.asarray(_relaxation_paths(pr, entropy, s_j, rho_j[:, 0], t_j,
                                                        linear_readout)[0])}
    last, prev = rho[:, n_early - 1], rho[:, n_early - 2]
    const = np.array(rho)
    const[:, n_early:] = last[:, None]
    geo = np.array(rho)
    frac = 1 + (t[n_early:] - t[n_early - 1]) / (t[n_early - 1] - t[n_early - 2])
    geo[:, n_early:] = np.asarray(geodesic_interpolation(prev[:, None], last[:, None],
                                                         frac[None, :]))
    preds.update(constant=const, geodesic=geo)

    held = ~train
    per_problem, sq_error = {}, {}
    for k, p in preds.items():
        d = np.asarray(fisher_rao_distance(p[held, n_early:], rho[held, n_early:]))
        per_problem[k] = np.sqrt(np.mean(d**2, -1))
        sq_error[k] = np.sum((np.sqrt(p[held, n_early:]) - np.sqrt(rho[held, n_early:]))**2,
                             (-2, -1))
    # the losses are sums of (2 dsqrt)^2 over the training problems' early loops; loop 0 is
    # the models' own start, and each loop's sqrt(rho) has N - 1 free components
    dof = len(tr_idx) * (n_early - 1) * (N - 1)
    noise = max(float(np.sqrt(min(loss_f, loss_l, loss_r) / 4 / dof)), noise_floor)
    table = np.stack([per_problem[k] for k in METHODS], -1)  # (P_held, 4)
    u = np.arange(int(held.sum())) if units is None else np.asarray(units)[held]
    labels, inv = np.unique(u, return_inverse=True)
    per_unit = np.zeros((len(labels), 5))
    np.add.at(per_unit, inv, np.concatenate([table, np.ones((len(table), 1))], -1))
    kw = dict(level=level, n_boot=n_boot, seed=seed)
    rms = {k: bootstrap_ci(per_unit, lambda a, j=j: a[:, j].sum() / a[:, 4].sum(), **kw)
           for j, k in enumerate(METHODS)}

    def ratio(a):
        means = a[:, :4].sum(0) / a[:, 4].sum()
        return float(means[0] / means[1:].min())

    llr = loglik_ratios(sq_error, noise)
    llr_unit = np.zeros((len(labels), llr.shape[1] + 1))
    np.add.at(llr_unit, inv, np.concatenate([llr, np.ones((len(llr), 1))], -1))
    loglik = bootstrap_ci(llr_unit, least_mean_loglik, **kw)

    means = {k: v.estimate for k, v in rms.items()}
    return HeldoutPrediction(
        rms, per_problem, bootstrap_ci(per_unit, ratio, **kw), min(means, key=means.get),
        tuple(float(v) for v in np.exp(np.asarray(pf))),
        tuple(float(v) for v in np.exp(np.asarray(pl))),
        tuple(float(v) for v in np.exp(np.asarray(pr))),
        {"fisher": loss_f, "linear": loss_l, "relaxation": loss_r}, preds, noise, sq_error,
        loglik,
    )
