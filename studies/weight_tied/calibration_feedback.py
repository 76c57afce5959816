"""Calibration of the linear-response criterion on loops whose scores respond to the attention.

In a looped model the scores are computed from a state that the attention itself feeds, so
the loop map's attention modes are those of the coupled system, not the Fisher spectrum at
fixed scores. This calibration measures what that does to the `linear_response` criterion
and whether its feedback-aware form (`feedback=C`, evidence_response.py) repairs it.

Per family, replicate and unit (one problem $z^*$ of `calibration.draw_problems`, the same
draws as the criteria's calibration) the scores respond to the attention through a symmetric

$$C = \\epsilon\\,T\\,\\mathrm{diag}\\sqrt{G'(\\rho^*)}\\;W\\;\\mathrm{diag}\\sqrt{G'(\\rho^*)},$$

$W$ a random symmetric matrix of spectral norm 1 on the support, so that $X C X$ is
$\\epsilon$ times the scale of the stiffness operator $T X G' X$ (any $\\epsilon < 1$ keeps the
fixed point stable). Two loops of step $h = c/L$, the scores held over each loop and updated
from the attention at its start (as a looped model computes them):

- **Fisher** (the hypothesis): the damped Fisher-Lagrangian step of `fisherdyn.simulate` at
  the calibration's $(m, \\gamma)$, $\\delta a' = J_F\\,\\delta a + J_z\\,C\\,Q\\,\\delta a$
  ($J_F$, $J_z$ its derivatives in the state and in the scores by central differences of
  `simulate`, $\\delta\\rho = Q\\,\\delta a$);
- **linear** (its negation): scores relaxing linearly toward $z^* + C\\,\\delta\\rho$ at
  Shannon's rate $k = T/\\gamma$, attention $\\mathrm{stationary}(z)$:
  $\\delta z' = e^{-kh}\\delta z + (1 - e^{-kh})\\,C S\\,\\delta z$.

Each loop's map is read by five forms of the criterion: `plain` (no feedback: what protocol
1.1 calibrated and the study applies), `feedback` (given the true $C$) and `feedback_err`
(given $C$ with an error of relative size `c_error` in the same units, a measured $C$), and
`held` / `held_err`: `held_score_response` (evidence_held_response.py), which fits the
held-score Fisher map itself, rates and attention mode shapes, with the true or the
erroneous $C$. The
decision per replicate is the protocol's: a bootstrap interval of the mean `max_error` over
the units at the criteria's level, YES if its upper end is at most 0.2. A criterion form
tells at strength $\\epsilon$ when it says YES on the Fisher loop and NO on the linear loop in
at least 3 of 4 replicates (`protocol.ADMISSIBLE_FRACTION`).

The loop map is exact (noise enters only paths), so no noise axis. The held-out and path
criteria are not recalibrated here: feedback does not change what a path is, only what the
scores do along it, and they are given the scores.

    python studies/weight_tied calibrate-feedback [--quick] [--out figures]
"""

from __future__ import annotations

import time

import numpy as np

from .calibration import DYNAMICS, FAMILIES, decide, draw_problems, fisher_step_jacobian
from .calibration import make_entropy
from .evidence_held_response import held_score_response
from .evidence_response import linear_response
from .protocol import ADMISSIBLE_FRACTION, NOT_EVALUABLE
from .verdict import CRITERION_LEVEL, NO, YES

NAME = "weight_tied_feedback_calibration"
STRENGTHS = (0.0, 0.1, 0.3, 0.6)
FORMS = ("plain", "feedback", "feedback_err", "held", "held_err")
LOOPS = ("fisher", "linear")
FULL = dict(replicates=8, units=4, strengths=STRENGTHS, c_error=0.1, n_boot=1000,
            families=FAMILIES)
QUICK = dict(replicates=2, units=4, strengths=(0.0, 0.3), c_error=0.1, n_boot=200,
             families=("kaniadakis",))


def symmetric_unit(rng, n):
    """A random symmetric (n, n) matrix of spectral norm 1."""
    W = rng.normal(size=(n, n))
    W = (W + W.T) / 2
    return W / np.linalg.norm(W, 2)


def feedback_matrix(e, rs, strength, W):
    """$C$ of the module docstring on the support of `rs` (zero off it), from the symmetric
    `W` of the support's size."""
    act = rs > 1e-12
    sg = np.sqrt(np.asarray(e.G_prime(np.where(act, rs, 1.0))))[act]
    C = np.zeros((len(rs), len(rs)))
    C[np.ix_(act, act)] = strength * DYNAMICS["T"] * sg[:, None] * W * sg[None, :]
    return C


def score_step_jacobian(fd, e, z, Q, rs, eps=1e-5):
    """The derivative of the Fisher step's end state (a, b) (tangent coordinates of the
    attention and its velocity, basis `Q`) with respect to the scores held over the step,
    from rest at the fixed point: `(2n, N)`, by central differences of `simulate`."""
    D = DYNAMICS
    h = D["step"] / D["L"]
    N = len(z)
    dz = np.concatenate([np.eye(N), -np.eye(N)]) * eps
    tr = fd.simulate(e, z + dz, D["T"], mass=D["mass"], damping=D["damping"],
                     rho0=np.broadcast_to(rs, (2 * N, N)), t1=h, saveat=np.array([h]),
                     rtol=1e-12, atol=1e-14, solver="dopri8")
    out = np.concatenate([(np.asarray(tr.rho_final) - rs) @ Q,
                          np.asarray(tr.rho_dot_final) @ Q], -1)
    return ((out[:N] - out[N:]) / (2 * eps)).T


def loop_maps(fd, e, z, JF, Jz, Q, rs, C):
    """(jacobian, readout) of the Fisher and the linear loop with score response `C`."""
    D = DYNAMICS
    T, h = D["T"], D["step"] / D["L"]
    N, n = Q.shape
    Jf = JF.copy()
    Jf[:, :n] += Jz @ C @ Q
    Rf = np.concatenate([Q, np.zeros((N, n))], 1)
    S = np.asarray(fd.stationary_jacobian(e, z, T))
    decay = np.exp(-T / D["damping"] * h)
    Jl = decay * np.eye(N) + (1 - decay) * C @ S
    return {"fisher": (Jf, Rf), "linear": (Jl, S)}


def replicate(fd, fam, rep, S, log):
    """The max_error of every unit for every strength, loop and criterion form."""
    e = make_entropy(fd, fam)
    z, _ = draw_problems(rep, S["units"])
    rng = np.random.default_rng([rep, 17])
    stats = {(s, lp, f): [] for s in S["strengths"] for lp in LOOPS for f in FORMS}
    why = []
    for u in range(S["units"]):
        JF, Q, rs = fisher_step_jacobian(fd, e, z[u])
        Jz = score_step_jacobian(fd, e, z[u], Q, rs)
        k = int(np.sum(rs > 1e-12))
        W, W_err = symmetric_unit(rng, k), symmetric_unit(rng, k)
        for s in S["strengths"]:
            C = feedback_matrix(e, rs, s, W)
            C_err = C + feedback_matrix(e, rs, S["c_error"], W_err)
            given = {"plain": None, "feedback": C, "feedback_err": C_err, "held": C,
                     "held_err": C_err}
            h = DYNAMICS["step"] / DYNAMICS["L"]
            for lp, (J, R) in loop_maps(fd, e, z[u], JF, Jz, Q, rs, C).items():
                for form, Cg in given.items():
                    try:
                        if form.startswith("held"):
                            r = held_score_response(J, rs, e, DYNAMICS["T"], step=h,
                                                    readout=R, feedback=Cg)
                            if r.not_evaluable:
                                why.append(r.not_evaluable)
                        else:
                            r = linear_response(J, rs, e, DYNAMICS["T"], step=h, readout=R,
                                                scores=z[u], feedback=Cg)
                        err = r.max_error
                    except ValueError as exc:
                        err = np.nan
                        why.append(str(exc))
                    stats[(s, lp, form)].append(err)
    log(f"{e.name} rep {rep}: " + " ".join(
        f"eps={s}/{lp}/{f}={np.nanmean(v):.3g}" for (s, lp, f), v in stats.items()
        if f != "feedback_err"))
    return e.name, stats, why


def decision(errors, S):
    from .verdict import bootstrap_ci

    errors = np.asarray(errors, float)
    if np.sum(np.isfinite(errors)) < 2:
        return NOT_EVALUABLE
    iv = bootstrap_ci(errors[np.isfinite(errors)], level=CRITERION_LEVEL, n_boot=S["n_boot"])
    return decide("linear_response", iv)[0]


def calibrate(S, log=print):
    """The JSON payload: per family, form, loop and strength the fraction of replicates
    with each decision, the median max_error, and whether the form tells."""
    import fisherdyn as fd

    power, tells, reasons = {}, {}, {}
    for fam in S["families"]:
        reps = []
        for rep in range(S["replicates"]):
            name, stats, why = replicate(fd, fam, rep, S, log)
            reps.append(stats)
            reasons.setdefault(name, set()).update(why)
        P, Tl = {}, {}
        for form in FORMS:
            for lp in LOOPS:
                for s in S["strengths"]:
                    dec = [decision(st[(s, lp, form)], S) for st in reps]
                    allv = np.concatenate([st[(s, lp, form)] for st in reps])
                    P.setdefault(form, {}).setdefault(lp, {})[str(s)] = dict(
                        yes=dec.count(YES) / len(dec), no=dec.count(NO) / len(dec),
                        not_evaluable=dec.count(NOT_EVALUABLE) / len(dec),
                        median_error=float(np.nanmedian(allv)) if np.any(np.isfinite(allv))
                        else None)
            Tl[form] = {str(s): bool(P[form]["fisher"][str(s)]["yes"] >= ADMISSIBLE_FRACTION
                                     and P[form]["linear"][str(s)]["no"] >= ADMISSIBLE_FRACTION)
                        for s in S["strengths"]}
        power[name], tells[name] = P, Tl
    return dict(settings=dict(dynamics=DYNAMICS, level=CRITERION_LEVEL,
                              admissible_fraction=ADMISSIBLE_FRACTION, **S),
                power=power, tells=tells,
                not_evaluable_reasons={k: sorted(v) for k, v in reasons.items()})


def figure(plt, data):
    """P(YES) on the Fisher loop and P(NO) on the linear loop against the strength, per
    family (columns) and criterion form (lines)."""
    fams = list(data["power"])
    fig, axes = plt.subplots(2, len(fams), figsize=(4.2 * len(fams), 6.4), squeeze=False,
                             sharey=True)
    err = f"C off by {data['settings']['c_error']:g}"
    style = {"plain": ("C3", "o", "plain (scores fixed)"),
             "feedback": ("C0", "s", "feedback-aware, true C"),
             "feedback_err": ("C2", "^", f"feedback-aware, {err}"),
             "held": ("C1", "D", "held-score map, true C"),
             "held_err": ("C4", "v", f"held-score map, {err}")}
    for j, fam in enumerate(fams):
        for i, (lp, key, what) in enumerate((("fisher", "yes", "P(YES), Fisher loop"),
                                             ("linear", "no", "P(NO), linear loop"))):
            ax = axes[i, j]
            for form, (c, mk, label) in style.items():
                row = data["power"][fam][form][lp]
                xs = [float(s) for s in row]
                ax.plot(xs, [row[s][key] for s in row], color=c, marker=mk, label=label)
            frac = data["settings"]["admissible_fraction"]
            ax.axhline(frac, color="0.6", ls=":", lw=1, label=f"{frac:g}: tells when both reach it")
            ax.set_ylim(-0.05, 1.05)
            ax.set_title(f"{fam}: {what}", fontsize=10)
            if i == 1:
                ax.set_xlabel("feedback strength $\\epsilon$")
            if j == 0:
                ax.set_ylabel("fraction of replicates")
    # below the panels: inside, it hides the lines it names
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8.5,
               frameon=False)
    fig.suptitle("linear_response on loops whose scores respond to the attention "
                 f"({data['settings']['replicates']} replicates x "
                 f"{data['settings']['units']} problems)", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def main(argv=None):
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="studies/weight_tied calibrate-feedback",
                                description="calibrate linear_response on loops with "
                                            "score feedback")
    p.add_argument("--quick", action="store_true", help="2 replicates, Kaniadakis, strengths "
                   "0 and 0.3: for the tests")
    p.add_argument("--out", type=Path, default=Path("figures"))
    p.add_argument("--c-error", type=float, default=None,
                   help="size of the error in the given C of the *_err forms (default 0.1)")
    args = p.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    S = dict(QUICK if args.quick else FULL)
    if args.c_error is not None:
        if not args.c_error >= 0:
            p.error("--c-error must be >= 0")
        S["c_error"] = args.c_error
    t0 = time.perf_counter()
    data = calibrate(S, log=lambda s: print(f"[{NAME}] {s}", flush=True))
    data["quick"] = bool(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.json").write_text(json.dumps(data, indent=1) + "\n")
    figure(plt, data).savefig(args.out / f"{NAME}.png", dpi=110)
    for fam, t in data["tells"].items():
        print(f"[{NAME}] {fam}: tells at strengths " + "; ".join(
            f"{form}: {[s for s, ok in d.items() if ok] or 'none'}" for form, d in t.items()))
    print(f"[{NAME}] wrote {args.out / NAME}.json and .png in {time.perf_counter() - t0:.0f} s")
