"""Calibration of the weight-tied study's criteria on paths whose truth is graded and known.

Each replicate draws P problems (scores $z^*$, starts $\\rho_0$) in `units` groups, standing
for the trained models a criterion's interval is taken over. For each family $F$ the
attention of the scores

$$z_\\alpha(t) = (1 - \\alpha)\\,z_F(t) + \\alpha\\,z_{lin}(t), \\qquad
  \\rho_\\alpha(t) = \\mathrm{stationary}(F, z_\\alpha(t), T),$$

is measured, where $z_F = T G(\\rho_F)$ are the scores of the damped Fisher-Lagrangian path
$\\rho_F$ of `fisherdyn.simulate` (from rest at $\\rho_0$, toward $z^*$: the library's
dynamics, not the study's fitter) and $z_{lin}(t) = z^* + (z_0 - z^*)e^{-kt}$ the linear
relaxation of the scores from the same $z_0 = T G(\\rho_0)$ to the same $z^*$, at Shannon's
rate $k = T/\\gamma$. $\\alpha = 0$ is the Fisher hypothesis, $\\alpha = 1$ its negation.
Noise of standard deviation $\\sigma$ is added to $\\sqrt\\rho$ at every loop, independently
(then renormalized). Every criterion of `protocol.PROTOCOL_CRITERIA` is run as the study runs
it (the held-out likelihood test with T at its true value and the scores at the true
$z^*$, the study's fixed point); its decision (YES / NO / INCONCLUSIVE / NOT EVALUABLE) is
counted per family, $\\sigma$, $\\alpha$ over replicates. The same replicate's problems and
noise draws serve every $\\alpha$ (paired comparisons).

The linear-response criterion reads the Jacobian of the loop map at the fixed point, which
the study obtains by differentiating the model, not from paths: here it is the map of the
loop's state $(\\rho_F, \\dot\\rho_F, z_{lin})$ over one loop (the Fisher part by central
differences of `simulate`, the linear part $e^{-kh}$), read out through the mixture, so the
noise does not enter it.

    python studies/weight_tied calibrate [--quick] [--out figures]
"""

from __future__ import annotations

import time

import numpy as np

from .evidence_held_response import support_basis
from .evidence_heldout import heldout_prediction
from .evidence_paths import depth_convergence, mobility_regression
from .evidence_response import linear_response
from .evidence_shape import isotropy, support_revival
from .protocol import (
    ADMISSIBLE_FRACTION,
    ADMISSIBLE_SIGMA,
    APPLIES_TO,
    CALIBRATION_VERSION,
    NOT_EVALUABLE,
    PROTOCOL_CRITERIA,
    PROTOCOLS,
    criteria_hash,
)
from .verdict import CRITERION_LEVEL, NO, YES

NAME = "weight_tied_calibration"
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
SIGMAS = (0.0, 0.003, 0.01, 0.03)
FAMILIES = ("shannon", "tsallis", "kaniadakis")
# the dynamics: near the overdamped limit, as the study's positive control (m, gamma), at
# the study's loop step c/L = 2/8 and its 4L loops
DYNAMICS = dict(T=1.0, mass=0.02, damping=1.0, L=8, step=2.0, n_keys=6, score_scale=1.5)
HELDOUT = dict(lm_steps=30, max_steps=1024, rtol=1e-5)
FULL = dict(replicates=4, units=4, per_unit=4, sigmas=SIGMAS, alphas=ALPHAS, n_boot=1000)
# quick mode: one family, no held-out fits (their compilation alone takes minutes)
QUICK = dict(replicates=2, units=4, per_unit=2, sigmas=(0.0, 0.01), alphas=(0.0, 1.0),
             n_boot=200, families=("tsallis",), heldout=False)
FULL.update(families=FAMILIES, heldout=True)


def make_entropy(fd, name):
    return {"shannon": fd.Shannon(), "tsallis": fd.Tsallis(1.5),
            "kaniadakis": fd.Kaniadakis(0.3)}[name]


def draw_problems(rep, P):
    """Scores and starts of one replicate: $z^* \\sim N(0, s^2)$, $\\rho_0 \\sim$ Dirichlet(2)."""
    rng = np.random.default_rng(1000 + rep)
    N = DYNAMICS["n_keys"]
    z = DYNAMICS["score_scale"] * rng.normal(size=(P, N))
    return z, rng.dirichlet(2 * np.ones(N), size=P)


def time_grids():
    """The loop times 0..4L at step c/L, and the depth test's three grids over [0, c]."""
    L, c = DYNAMICS["L"], DYNAMICS["step"]
    h = c / L
    main = np.arange(4 * L + 1) * h
    fine = np.arange(4 * L + 1) * (c / (4 * L))
    return main, fine


def fisher_paths(fd, e, z, rho0, ts):
    """The library's damped Fisher-Lagrangian paths from rest, at the times `ts`."""
    D = DYNAMICS
    tr = fd.simulate(e, z, D["T"], mass=D["mass"], damping=D["damping"], rho0=rho0,
                     t1=float(ts[-1]), saveat=ts, rtol=1e-9, atol=1e-11)
    return np.asarray(tr.rho)


def graded(fd, e, z, rho0, rho_F, ts, alpha):
    """$\\rho_\\alpha(t)$: the stationary law of the mixed scores, `(P, K, N)`."""
    T, k = DYNAMICS["T"], DYNAMICS["T"] / DYNAMICS["damping"]
    if alpha == 0.0:
        return rho_F
    zF = T * np.asarray(e.G(np.clip(rho_F, 1e-300, None)))
    z0 = T * np.asarray(e.G(rho0))
    zl = z[:, None] + (z0 - z)[:, None] * np.exp(-k * ts)[None, :, None]
    return np.asarray(fd.stationary(e, (1 - alpha) * zF + alpha * zl, T))


def add_noise(rho, sigma, rng):
    """Gaussian noise of sd `sigma` on $\\sqrt\\rho$, renormalized."""
    if sigma == 0:
        return rho
    x = np.sqrt(rho) + sigma * rng.normal(size=rho.shape)
    return x * x / np.sum(x * x, -1, keepdims=True)


def fisher_step_jacobian(fd, e, z, eps=1e-5):
    """The Fisher loop's map over one loop at the fixed point, in coordinates of the
    support's tangent space (position, velocity), by central differences of `simulate`;
    with the support basis `Q` `(N, n)` and the fixed point."""
    D = DYNAMICS
    h = D["step"] / D["L"]
    rs = np.asarray(fd.stationary(e, z, D["T"]))
    Q = support_basis(rs)
    n = Q.shape[1]
    dirs = np.concatenate([np.eye(2 * n), -np.eye(2 * n)]) * eps
    # padded to the batch of a full support, so that one compiled solve serves every support
    B = 4 * (len(z) - 1)
    r0 = np.concatenate([rs + dirs[:, :n] @ Q.T, np.broadcast_to(rs, (B - 4 * n, len(z)))])
    v0 = np.concatenate([dirs[:, n:] @ Q.T, np.zeros((B - 4 * n, len(z)))])
    tr = fd.simulate(e, np.broadcast_to(z, (B, len(z))), D["T"], mass=D["mass"],
                     damping=D["damping"], rho0=r0, velocity0=v0, t1=h, saveat=np.array([h]),
                     rtol=1e-12, atol=1e-14, solver="dopri8")
    out = np.concatenate([(np.asarray(tr.rho_final)[:4 * n] - rs) @ Q,
                          np.asarray(tr.rho_dot_final)[:4 * n] @ Q], -1)
    return ((out[:2 * n] - out[2 * n:]) / (2 * eps)).T, Q, rs


def mixed_response(fd, e, z, JF, Q, rs, alpha):
    """`linear_response` of the graded loop: state (Fisher position, velocity, linear
    scores), readout $\\partial\\rho_\\alpha = S[(1-\\alpha) T G'(\\rho^*) Q\\,\\delta a
    + \\alpha\\,\\delta z_{lin}]$ with $S = \\partial\\rho/\\partial z$ at $z^*$."""
    D = DYNAMICS
    T, h = D["T"], D["step"] / D["L"]
    N, n = Q.shape
    S = np.asarray(fd.stationary_jacobian(e, z, T))
    act = rs > 1e-12
    gp = np.where(act, np.asarray(e.G_prime(np.where(act, rs, 1.0))), 0.0)
    J = np.zeros((2 * n + N, 2 * n + N))
    J[:2 * n, :2 * n] = JF
    J[2 * n:, 2 * n:] = np.exp(-T / D["damping"] * h) * np.eye(N)
    R = np.concatenate([(1 - alpha) * S @ (T * gp[:, None] * Q), np.zeros((N, n)),
                        alpha * S], 1)
    return linear_response(J, rs, e, T, step=h, readout=R, scores=z)


def decide(name, iv, reason=None):
    """(decision, estimate, reason) of one criterion from its interval (None: not
    evaluable, with `reason`)."""
    crit = {c.name: c for c in PROTOCOL_CRITERIA}[name]
    if iv is None or not np.isfinite(iv.estimate) and not np.isinf(iv.estimate):
        return NOT_EVALUABLE, None, reason or "statistic undefined (NaN)"
    est = float(iv.estimate)
    return crit.decide(iv), (est if np.isfinite(est) else str(est)), None


def path_criteria(e, rho, depth_runs, z, units, ts, S):
    """Decisions of every path-based criterion on one noisy graded data set."""
    import fisherdyn as fd

    D = DYNAMICS
    L, T = D["L"], D["T"]
    kw = dict(level=CRITERION_LEVEL, n_boot=S["n_boot"])
    out = {}
    dc = depth_convergence(*depth_runs, units=units, **kw)
    out["depth_convergence"] = decide("depth_convergence", dc.ratio)
    for name, spread in (("mobility_slope", 0.1), ("mobility_exponent", 0.0)):
        if isinstance(e, fd.AbstractSeparableEntropy):
            mr = mobility_regression(rho[:, :2 * L + 1], ts[:2 * L + 1], z, e, T, units=units,
                                     min_spread=spread, **kw)
            out[name] = decide(name, mr.slope, f"regressor spread {mr.spread:.3g}")
        else:
            out[name] = (NOT_EVALUABLE, None, "not a separable family")
    if e.name in APPLIES_TO["isotropy"]:
        iso = isotropy(rho[:, :2 * L + 1], ts[:2 * L + 1], z, T, units=units, **kw)
        out["isotropy"] = decide("isotropy", iso.slope, f"log rho spread {iso.spread:.3g}")
    else:
        out["isotropy"] = (NOT_EVALUABLE, None, "defined for Shannon only")
    sr = support_revival(rho, units=units, **kw)
    out["support_revival"] = decide("support_revival", sr.fraction,
                                    "no key left the support")
    if not S["heldout"]:
        out["heldout"] = (NOT_EVALUABLE, None, "not run in quick mode")
        out["heldout_likelihood"] = (NOT_EVALUABLE, None, "not run in quick mode")
        return out
    P = rho.shape[0]
    train = np.arange(P) % 2 == 0
    fit = dict(train=train, n_early=L // 2 + 1, velocity="zero", units=units,
               linear_readout="family", **HELDOUT, **kw)
    hp = heldout_prediction(rho[:, :L + 1], ts[:L + 1], z, e, **fit)
    out["heldout"] = decide("heldout", hp.ratio)
    # protocol 1.1: T held at the truth, the scores z* the paths relax to, by likelihood
    hp = heldout_prediction(rho[:, :L + 1], ts[:L + 1], z, e, temperature=T, **fit)
    out["heldout_likelihood"] = decide("heldout_likelihood", hp.loglik_ratio)
    return out


def replicate(fd, fam, rep, S, log):
    """Every criterion's decision at every (sigma, alpha) for one family and replicate."""
    e = make_entropy(fd, fam)
    P = S["units"] * S["per_unit"]
    units = np.arange(P) // S["per_unit"]
    z, rho0 = draw_problems(rep, P)
    ts, fine = time_grids()
    grid = np.union1d(ts, fine)
    rho_F_all = fisher_paths(fd, e, z, rho0, grid)
    at = lambda a, tt: a[:, np.searchsorted(grid, tt)]  # noqa: E731
    L = DYNAMICS["L"]
    # linear response: one problem per unit, the Fisher step map once per problem
    jac = []
    for u in range(S["units"]):
        i = u * S["per_unit"]
        try:
            jac.append((i,) + fisher_step_jacobian(fd, e, z[i]))
        except ValueError as err:
            jac.append((i, None, str(err), None))
    results = {}
    for alpha in S["alphas"]:
        rho_a = graded(fd, e, z, rho0, rho_F_all, grid, alpha)
        lr, why = [], []
        for i, JF, Q, rs in jac:
            try:
                lr.append(mixed_response(fd, e, z[i], JF, Q, rs, alpha).max_error
                          if JF is not None else np.nan)
            except ValueError as err:
                lr.append(np.nan)
                why.append(str(err))
            if JF is None:
                why.append(Q)
            elif not np.isfinite(lr[-1]) and len(why) < len(lr):
                why.append("a single attention mode: nothing left to predict")
        lr = np.asarray(lr)
        for sigma in S["sigmas"]:
            rng = np.random.default_rng([rep, int(round(sigma * 1e6)), 7])
            noisy = add_noise(at(rho_a, ts), sigma, rng)
            depth_runs = [add_noise(at(rho_a, np.arange(n + 1) * DYNAMICS["step"] / n), sigma,
                                    rng) for n in (L, 2 * L, 4 * L)]
            t0 = time.perf_counter()
            d = path_criteria(e, noisy, depth_runs, z, units, ts, S)
            # the study's rule: the mean over the problems that have a statistic
            if np.sum(np.isfinite(lr)) >= 2:
                from .verdict import bootstrap_ci

                d["linear_response"] = decide("linear_response", bootstrap_ci(
                    lr, level=CRITERION_LEVEL, n_boot=S["n_boot"]))
            else:
                d["linear_response"] = (NOT_EVALUABLE, None,
                                        f"{int(np.sum(~np.isfinite(lr)))} of {len(lr)} "
                                        "problems without a spectrum: "
                                        + "; ".join(sorted(set(why))))
            results[(sigma, alpha)] = d
            log(f"{e.name} rep {rep} sigma {sigma} alpha {alpha}: "
                + " ".join(f"{k}={v[0]}" for k, v in d.items())
                + f" ({time.perf_counter() - t0:.1f} s)")
    return e.name, results


def tabulate(runs, S):
    """P(YES), P(NO), P(not evaluable) per family, criterion, sigma, alpha, and each
    criterion's admissibility per family and sigma."""
    table, admissible = {}, {}
    names = [c.name for c in PROTOCOL_CRITERIA]
    for fam, reps in runs.items():
        table[fam], admissible[fam] = {}, {}
        for name in names:
            curves, adm = {}, {}
            for sigma in S["sigmas"]:
                rows = []
                for alpha in S["alphas"]:
                    dec = [r[(sigma, alpha)][name][0] for r in reps]
                    est = [r[(sigma, alpha)][name][1] for r in reps]
                    rows.append(dict(alpha=alpha, p_yes=dec.count(YES) / len(dec),
                                     p_no=dec.count(NO) / len(dec),
                                     p_not_evaluable=dec.count(NOT_EVALUABLE) / len(dec),
                                     estimates=est))
                curves[str(sigma)] = rows
                a0, a1 = rows[0], rows[-1]
                adm[str(sigma)] = bool(S["alphas"][0] == 0.0 and S["alphas"][-1] == 1.0
                                       and a0["p_yes"] >= ADMISSIBLE_FRACTION
                                       and a1["p_no"] >= ADMISSIBLE_FRACTION)
            table[fam][name] = curves
            admissible[fam][name] = adm
    return table, admissible


def reasons(runs):
    """The distinct not-evaluable reasons per family and criterion."""
    out = {}
    for fam, reps in runs.items():
        for r in reps:
            for d in r.values():
                for name, (dec, _, why) in d.items():
                    if dec == NOT_EVALUABLE:
                        out.setdefault(fam, {}).setdefault(name, set()).add(why)
    return {f: {n: sorted(v) for n, v in d.items()} for f, d in out.items()}


def figure(plt, table, admissible, S):
    """Power curves: P(YES) (solid) and P(NO) (dashed) against alpha, one colour per sigma;
    rows families, columns criteria; a criterion admissible at sigma = 0.01 is titled so."""
    names = [c.name for c in PROTOCOL_CRITERIA]
    fams = list(table)
    fig, axes = plt.subplots(len(fams), len(names), figsize=(2.3 * len(names),
                                                            2.2 * len(fams) + 0.6),
                             sharex=True, sharey=True, squeeze=False)
    colors = plt.cm.viridis(np.linspace(0, 0.85, len(S["sigmas"])))
    for i, fam in enumerate(fams):
        for j, name in enumerate(names):
            ax = axes[i, j]
            for c, sigma in zip(colors, S["sigmas"]):
                rows = table[fam][name][str(sigma)]
                a = [r["alpha"] for r in rows]
                ax.plot(a, [r["p_yes"] for r in rows], "-o", color=c, ms=3,
                        label=f"YES, sigma {sigma}")
                ax.plot(a, [r["p_no"] for r in rows], "--s", color=c, ms=3,
                        label=f"NO, sigma {sigma}")
            adm = admissible[fam][name].get(str(ADMISSIBLE_SIGMA), False)
            ax.set_title(f"{name}\n{fam}: {'ADMISSIBLE' if adm else 'not admissible'}",
                         fontsize=7, color="green" if adm else "black")
            ax.set_ylim(-0.05, 1.05)
            if i == len(fams) - 1:
                ax.set_xlabel("alpha (0 Fisher, 1 linear)")
            if j == 0:
                ax.set_ylabel("P(decision)")
    axes[0, 0].legend(fontsize=5, loc="center left")
    fig.suptitle(f"Calibration of the weight-tied criteria (protocol {CALIBRATION_VERSION}): "
                 f"P(YES) solid, P(NO) dashed, over {S['replicates']} replicates; admissible: "
                 f"YES at alpha 0 and NO at alpha 1 in >= {ADMISSIBLE_FRACTION:.0%} at sigma "
                 f"{ADMISSIBLE_SIGMA}", fontsize=9)
    fig.tight_layout()
    return fig


def calibrate(S, log=print):
    """Run the calibration with settings `S` (`FULL` or `QUICK`): the JSON payload."""
    import fisherdyn as fd

    runs = {}
    for fam in S["families"]:
        for rep in range(S["replicates"]):
            name, res = replicate(fd, fam, rep, S, log)
            runs.setdefault(name, []).append(res)
    table, admissible = tabulate(runs, S)
    at = str(ADMISSIBLE_SIGMA)
    # the version whose criteria this runs (later versions add rules on trained models only)
    calibrated = PROTOCOLS[CALIBRATION_VERSION]
    return dict(
        protocol_version=CALIBRATION_VERSION, criteria_sha256=criteria_hash(calibrated),
        protocol={k: v for k, v in calibrated.items() if k != "admissible"},
        settings=dict(dynamics=DYNAMICS, heldout_fit=HELDOUT, level=CRITERION_LEVEL,
                      **{k: v for k, v in S.items()}),
        power=table, admissible_by_sigma=admissible,
        admissible={fam: [n for n, d in adm.items() if d.get(at, False)]
                    for fam, adm in admissible.items()},
        not_evaluable_reasons=reasons(runs),
    )


def main(argv=None):
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="studies/weight_tied calibrate",
                                description="calibrate the weight-tied criteria")
    p.add_argument("--quick", action="store_true", help="2 replicates, 2 noise levels, "
                   "alpha 0 and 1: for the tests")
    p.add_argument("--out", type=Path, default=Path("figures"))
    p.add_argument("--families", default=None,
                   help="comma-separated subset of shannon,tsallis,kaniadakis (default all); "
                        "the families are independent, so runs of subsets can be merged")
    p.add_argument("--sigmas", default=None,
                   help="comma-separated noise levels in sqrt(rho) (default "
                        f"{','.join(map(str, SIGMAS))}); admissibility is read at "
                        f"{ADMISSIBLE_SIGMA}, so include it")
    p.add_argument("--name", default=NAME, help=f"output file stem (default {NAME})")
    p.add_argument("--merge", type=Path, nargs="+", default=None,
                   help="merge these JSONs of family subsets (same settings) into --out")
    p.add_argument("--table", type=Path, default=None,
                   help="print the admissibility table of this calibration JSON (markdown)")
    args = p.parse_args(argv)
    if args.table:
        print(table_markdown(json.loads(args.table.read_text())))
        return
    import jax

    jax.config.update("jax_enable_x64", True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    S = dict(QUICK if args.quick else FULL)
    if args.families:
        S["families"] = tuple(args.families.split(","))
    if args.sigmas:
        S["sigmas"] = tuple(float(x) for x in args.sigmas.split(","))
    t0 = time.perf_counter()
    if args.merge:
        data, S = merge([json.loads(f.read_text()) for f in args.merge])
    else:
        data = calibrate(S, log=lambda s: print(f"[{NAME}] {s}", flush=True))
        data["quick"] = bool(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1, default=_json)
                                                + "\n")
    fig = figure(plt, data["power"], data["admissible_by_sigma"], S)
    fig.savefig(args.out / f"{args.name}.png", dpi=110)
    print(f"[{NAME}] admissible at sigma {ADMISSIBLE_SIGMA}: {data['admissible']}")
    print(f"[{NAME}] wrote {args.out / args.name}.json and .png in "
          f"{time.perf_counter() - t0:.0f} s")


def table_markdown(data):
    """Per family and criterion: P(YES) at alpha = 0 / P(NO) at alpha = 1 at every sigma,
    and whether it is admissible at the protocol's sigma (a markdown table)."""
    sigmas = data["settings"]["sigmas"]
    head = ("| family | criterion | " + " | ".join(f"sigma {s}" for s in sigmas)
            + " | admissible |")
    rows = [head, "|" + "---|" * (len(sigmas) + 3)]
    for fam, crits in data["power"].items():
        for name, curves in crits.items():
            cells = []
            for s in sigmas:
                r = curves[str(s)]
                cells.append(f"{r[0]['p_yes']:.2f} / {r[-1]['p_no']:.2f}")
            adm = data["admissible_by_sigma"][fam][name][str(ADMISSIBLE_SIGMA)]
            rows.append(f"| {fam} | {name} | " + " | ".join(cells)
                        + f" | {'**yes**' if adm else 'no'} |")
    return "\n".join(rows)


def merge(parts):
    """One calibration JSON from runs of disjoint family subsets with equal settings (the
    families share nothing: each has its own replicates)."""
    first = parts[0]
    keys = ("power", "admissible_by_sigma", "admissible", "not_evaluable_reasons")
    out = {k: v for k, v in first.items() if k not in keys}
    for k in keys:
        out[k] = {}
    fams = []
    for part in parts:
        same = {k: v for k, v in part["settings"].items() if k != "families"}
        if same != {k: v for k, v in first["settings"].items() if k != "families"} or \
                part["criteria_sha256"] != first["criteria_sha256"]:
            raise ValueError("the parts were run with different settings or protocols")
        fams += part["settings"]["families"]
        for k in keys:
            out[k].update(part[k])
    out["settings"] = dict(first["settings"], families=fams)
    return out, out["settings"]


def _json(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)
