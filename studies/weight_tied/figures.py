"""The weight-tied study's two figures: the criteria and their decisions per group
(`<name>.png`), and measured against predicted held-out paths with the task control's
accuracy by loop (`<name>_paths.png`)."""

from __future__ import annotations

import numpy as np
from _common import draw_table

from .protocol import PROTOCOL_CRITERIA
from .verdict import CRITERIA

# the table's columns: the four original criteria and protocol 1.1's held-out likelihood
TABLE_CRITERIA = CRITERIA + tuple(c for c in PROTOCOL_CRITERIA if c.name == "heldout_likelihood")


def fmt_iv(iv, digits=3):
    if iv is None:
        return "N/A"
    f = lambda x: "inf" if np.isinf(x) else f"{x:.{digits}g}"  # noqa: E731
    return f"{f(iv.estimate)} [{f(iv.low)}, {f(iv.high)}]"



SHORT = {"depth_convergence": "depth", "mobility_slope": "mobility",
         "linear_response": "lin. resp.", "heldout": "held-out",
         "heldout_likelihood": "held-out likelihood"}


def figure(plt, rows, controls_ok, level, L, cfg, min_spread):
    """The criteria table, depth convergence, mobility, linear response, held-out rms
    and spectral radius of every group (`rows`: (group, seeds' data, analysis,
    verdict))."""
    fig = plt.figure(figsize=(14, 11))
    gsp = fig.add_gridspec(3, 3, height_ratios=[1.1, 1, 1])
    ax = fig.add_subplot(gsp[0, :])
    header = (["group (seeds)", "accuracy"] + [SHORT[c.name] for c in TABLE_CRITERIA]
              + ["overall"])
    body = []
    for g, ds, a, v in rows:
        body.append([f"{g['name']} ({len(ds)})", f"{np.mean([d['accuracy'] for d in ds]):.2f}"]
                    + [("not evaluable" if v.intervals.get(c.name) is None else
                        f"{fmt_iv(v.intervals[c.name], 2)} {v.decisions[c.name]}")
                       for c in TABLE_CRITERIA] + [v.overall])
    draw_table(ax, header, body, fontsize=7, col_widths=[0.2, 0.05] + [0.13] * 5 + [0.1],
               title=(
        f"Criteria, {100 * level:.2f}% bootstrap intervals over seeds (YES: depth >= 1.5, "
        f"mobility in [0.75, 1.25], lin. resp. <= 0.2, held-out <= 0.9, held-out "
        f"likelihood >= 2)"
        + ("" if controls_ok else " - CONTROLS FAILED: answers INCONCLUSIVE")))
    # depth convergence curves
    ax = fig.add_subplot(gsp[1, 0])
    for i, (g, ds, a, v) in enumerate(rows):
        dc = a["depth"]
        tt = np.arange(1, len(dc.curve_L_2L) + 1) * cfg.step / L
        line, = ax.semilogy(tt, dc.curve_L_2L, "-", color=f"C{i}", label=g["name"])
        ax.semilogy(tt, dc.curve_2L_4L, "--", color=line.get_color())
    ax.set(xlabel="depth t", ylabel="Fisher-Rao rms gap",
           title="gap(L, 2L) solid, gap(2L, 4L) dashed")
    ax.legend(fontsize=6)
    # mobility regression
    ax = fig.add_subplot(gsp[1, 1])
    for i, (g, ds, a, v) in enumerate(rows):
        mob = a["mobility"]
        if mob is None:
            continue
        x, y = mob.x, mob.y
        lab = (f"slope {fmt_iv(mob.slope)}" if np.isfinite(mob.slope.estimate) else
               f"spread {mob.spread:.3f} < {min_spread}: slope not identified")
        ax.plot(x, y - np.mean(y) + np.mean(x), ".", ms=2, alpha=0.3, color=f"C{i}",
                label=f"{g['name']}: {lab}")
    if not any(a["mobility"] is not None for _, _, a, _ in rows):
        ax.text(0.5, 0.5, "not applicable: every group is Shannon (rho G' = 1)",
                transform=ax.transAxes, ha="center", fontsize=8)
    lim = ax.get_xlim()
    ax.plot(lim, lim, "k-", lw=0.8, label="slope 1 (own Fisher flow)")
    ax.set(xlabel="log(T rho G'(rho))", ylabel="log rate of approach (centred)",
           title="score-space mobility (points centred per group)")
    ax.legend(fontsize=6)
    # predicted against measured mode rates
    ax = fig.add_subplot(gsp[1, 2])
    for i, (g, ds, a, v) in enumerate(rows):
        meas, pred = [], []
        for d in ds:
            for lr in d["lr"]:
                if lr is None:
                    continue
                ok = np.isfinite(lr.predicted.real)
                meas.append(-lr.measured.real[ok]), pred.append(-lr.predicted.real[ok])
        if meas:
            ax.loglog(np.concatenate(pred), np.concatenate(meas), ".", ms=3, color=f"C{i}",
                      label=g["name"])
    lim = ax.get_xlim()
    ax.plot(lim, lim, "k-", lw=0.8)
    ax.set(xlabel="predicted decay rate (relaxation_spectrum)",
           ylabel="measured decay rate (loop Jacobian)",
           title="linear response (a seed whose slowest mode does\nnot decay is not "
                 "evaluable: not drawn)")
    ax.legend(fontsize=6)
    # held-out rms per method
    ax = fig.add_subplot(gsp[2, :2])
    methods = ("fisher", "linear", "constant", "geodesic")
    w = 0.8 / len(methods)
    for j, meth in enumerate(methods):
        ax.bar(np.arange(len(rows)) + j * w, [a["heldout_means"][meth] for _, _, a, _ in rows],
               w, label=meth)
    ax.set_xticks(np.arange(len(rows)) + 0.4 - w / 2)
    ax.set_xticklabels([g["name"] for g, *_ in rows], fontsize=7, rotation=12)
    ax.set_yscale("log")
    ax.set(ylabel="held-out Fisher-Rao rms", title="held-out prediction (later loops of "
           "held-out problems; log scale)")
    ax.legend(fontsize=7)
    # spectral radius
    ax = fig.add_subplot(gsp[2, 2])
    for i, (g, ds, a, v) in enumerate(rows):
        r = [d["fixed_point"]["spectral_radius"] for d in ds]
        ax.plot(np.full(len(r), i), r, "o", color=f"C{i}")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([str(i) for i in range(len(rows))])
    ax.set(xlabel="group (table order)", ylabel="spectral radius of the loop map",
           title="spectral radius of the whole loop map\n(residual stream included)")
    fig.tight_layout()
    return fig


def fig_paths(plt, rows, L, out, task, study, follows=None):
    """Attention on the key that holds the most weight at loop L: measured (held-out
    problems of seed 0, head 0: median, 10-90% band, three examples) against the fitted
    Fisher model's prediction; then the task control's accuracy by loop, and what each
    group's heads follow (`follows`: group name -> `follow_summary`, if measured)."""
    fig, axes = plt.subplots(2, (len(rows) + 2) // 2, figsize=(14, 7.5), squeeze=False)
    for ax, (g, ds, a, v) in zip(axes.ravel(), rows):
        d = ds[0]
        hp = d["heldout"][0]
        P = d["attn"].shape[0]
        idx = np.flatnonzero(np.arange(P) >= P // 2)
        t = d["t"][:L + 1]
        path = d["attn"][idx, 0, :L + 1]
        key = np.argmax(path[:, -1], -1)
        rows_ = np.arange(len(idx))
        meas = path[rows_, :, key]
        pred = hp.predictions["fisher"][idx][rows_, :, key]
        for y, c, lab in ((meas, "k", "measured"), (pred, "C3", "Fisher fit")):
            lo, mid, hi = np.quantile(y, [0.1, 0.5, 0.9], axis=0)
            ax.plot(t, mid, "-", color=c, lw=2, label=f"{lab} (median, 10-90%)")
            ax.fill_between(t, lo, hi, color=c, alpha=0.15)
        for j in range(min(3, len(idx))):
            ax.plot(t, meas[j], "o", color="k", ms=3)
            ax.plot(t, pred[j], "-", color="C3", lw=0.8)
        ax.axvline(t[L // 2], color="gray", ls=":", lw=0.8)
        ax.set(title=f"{g['name']}: {v.overall}", xlabel="depth t", ylim=(0, 1),
               ylabel="weight of the final top key")
        ax.legend(fontsize=6, loc="lower right")
    ax = axes.ravel()[len(rows)]
    for i, (name, curves) in enumerate(task["accuracy_by_loop"].items()):
        c = np.array(curves)
        iv = task["gain"][name]
        recall = name == task["name"]
        ax.plot(np.arange(c.shape[1]), c.mean(0), "s--" if recall else "o-",
                color="k" if recall else f"C{i}", label=(
                    f"{name.replace(' transformer', '')}: gain {iv['estimate']:.2f} "
                    f"[{iv['low']:.2f}, {iv['high']:.2f}]"))
    ax.set(xlabel="loop l", ylabel="held-out accuracy (mean over seeds)", ylim=(0, 1.02),
           title="task control: accuracy by loop,\npointer (solid), one-hop recall (dashed)")
    ax.legend(fontsize=6, loc="lower right")
    spare = list(axes.ravel()[len(rows) + 1:])
    if follows and any(follows.values()) and spare:
        ax = spare.pop(0)
        names = [g["name"] for g, *_ in rows if follows.get(g["name"])]
        kinds = list(next(f for f in follows.values() if f)["best_counts"])
        left = np.zeros(len(names))
        for j, k in enumerate(kinds):
            frac = np.array([follows[n]["best_counts"][k] / follows[n]["heads"] for n in names])
            ax.barh(np.arange(len(names)), frac, left=left, color=f"C{j}", label=k)
            left += frac
        ax.set_yticks(np.arange(len(names)))
        ax.set_yticklabels([n.replace(" transformer", "") for n in names], fontsize=6)
        ax.invert_yaxis()
        ax.set(xlabel="fraction of heads (all seeds)", xlim=(0, 1),
               title="what the heads follow: best held-out\nprediction (T fixed, same fixed point)")
        ax.legend(fontsize=5, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4)
    for ax in spare:
        ax.axis("off")
    fig.suptitle("Held-out problems: the fit sees loops left of the dotted line and predicts "
                 "the rest (dots: three measured examples, thin lines: their predictions); "
                 "then the task control and what the heads follow", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / f"{study}_paths.png", dpi=110)
    plt.close(fig)
