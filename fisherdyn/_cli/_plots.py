"""The figures of `fisherdyn run` and `fisherdyn simulate --out`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .._optional import require

matplotlib = require("matplotlib", extra="cli", what="fisherdyn's figures")
matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["run_figures", "simulate_figure"]


def _grid(n):
    cols = min(4, n)
    return cols, math.ceil(n / cols)


def _settled_time(check):
    """When both the under-damped path and the flow are within 1e-3 of the fixed point."""
    t_vis = 0.0
    for path in (check.paths[0], check.paths[3]):
        ok = np.isfinite(path["ts"])
        off = np.max(np.abs(path["rho"][ok] - check.rho_star), -1) > 1e-3
        if off.any():
            t_vis = max(t_vis, path["ts"][ok][np.flatnonzero(off)[-1]])
    return 1.3 * t_vis if t_vis > 0 else check.rows[0]["t_conv"]


def _paths_figure(checks, z, T, out: Path):
    """Under-damped (solid) against overdamped flow (dashed) paths, per family."""
    n = len(checks)
    cols, rows = _grid(n)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows + 0.9), squeeze=False)
    colors = plt.cm.tab10(np.arange(len(z)) % 10)
    for ax, check in zip(axes.flat, checks):
        t_end = _settled_time(check)
        for path, ls, lw in ((check.paths[0], "-", 1.3), (check.paths[3], "--", 1.0)):
            keep = np.isfinite(path["ts"]) & (path["ts"] <= t_end)
            for i in range(len(z)):
                ax.plot(path["ts"][keep], path["rho"][keep, i], color=colors[i], lw=lw, ls=ls)
        for i in range(len(z)):
            ax.axhline(check.rho_star[i], color=colors[i], lw=0.6, ls=":")
        ax.set_xlim(0, t_end)
        ax.set_title(check.label, fontsize=10)
        ax.set_xlabel("t (continuous layer depth)")
        ax.set_ylabel(r"attention weight $\rho_i(t)$")
    for ax in axes.flat[n:]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=colors[i], lw=1.5) for i in range(len(z))]
    handles += [plt.Line2D([], [], color="gray", ls=s_, lw=1.2) for s_ in ("-", "--", ":")]
    names = [f"key with z={v:+.2g}" for v in z]
    names += ["under-damped (γ = 0.3 γ_crit)", "overdamped flow (m = 0)", "stationary operator"]
    fig.legend(
        handles, names, loc="lower center", ncol=min(len(names), 5), fontsize=8, frameon=False
    )
    fig.suptitle(
        f"From uniform attention, every family's damped Fisher dynamics settles on its "
        f"stationary operator (T={T:g}): inertia overshoots, the replicator flow does not",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.09 if rows == 1 else 0.06, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _energy_figure(checks, out: Path):
    """The energy gap $H(t) - H^*$ of every regime, per family."""
    fig = _energy_plot(checks)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _energy_plot(checks):
    """The figure of `_energy_figure`; each panel's legend names its own dampings, which
    differ between families."""
    n = len(checks)
    cols, rows = _grid(n)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    styles = [("C0", "-"), ("C1", "-"), ("C2", "-"), ("k", "--")]
    for ax, check in zip(axes.flat, checks):
        H_star = check.free_energy
        for (color, ls), path, row in zip(styles, check.paths, check.rows):
            keep = np.isfinite(path["ts"])
            H = path["energy"][keep]
            # below ~10 ulp of H the gap is round-off: stop the curve there
            gap = np.where(H - H_star > 10 * np.finfo(float).eps * abs(H_star), H - H_star, np.nan)
            ax.semilogy(
                path["ts"][keep],
                gap,
                color=color,
                ls=ls,
                lw=1.2,
                label=f"{row['regime']} (γ={row['gamma']:.2g})",
            )
        ax.set_title(check.label, fontsize=10)
        ax.set_xlabel("t")
        ax.set_ylabel(r"$H(t) - H^*$")
        ax.set_ylim(1e-16, None)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, None)
        ax.legend(fontsize=6.5, loc="lower left")
    for ax in axes.flat[n:]:
        ax.axis("off")
    fig.suptitle(
        r"The energy $H = \frac{m}{2}\sum\dot\rho^2/\rho + F$ falls monotonically to the "
        r"stationary free energy ($dH/dt = -\gamma\sum\dot\rho^2/\rho$), fastest near "
        "critical damping",
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def run_figures(checks, z, T, outdir: Path) -> list[Path]:
    """Write `relaxation_paths.png` and `energy.png` to `outdir` (created); return the paths."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths, energy = outdir / "relaxation_paths.png", outdir / "energy.png"
    _paths_figure(checks, z, T, paths)
    _energy_figure(checks, energy)
    return [paths, energy]


def simulate_figure(tr, st, summary, out: Path):
    """$\\rho_i(t)$ against the stationary weights, and $H(t)$, of one trajectory."""
    ts = np.asarray(tr.ts)
    ok = np.isfinite(ts)
    rho = np.asarray(tr.rho)[ok]
    H = np.asarray(tr.energy)[ok]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i in range(rho.shape[1]):
        (line,) = a.plot(ts[ok], rho[:, i], lw=1.3, label=f"z={summary['scores'][i]:+.3g}")
        a.axhline(st[i], color=line.get_color(), ls=":", lw=0.8)
    a.set_xlabel("t")
    a.set_ylabel(r"$\rho_i(t)$")
    a.legend(fontsize=8, title="dotted: stationary", title_fontsize=8)
    a.set_title("attention weights")
    b.plot(ts[ok], H, color="k")
    b.set_xlabel("t")
    b.set_ylabel(r"$H = \frac{m}{2}\sum\dot\rho^2/\rho + F$")
    b.set_title("energy (non-increasing for damping > 0)")
    fig.suptitle(
        f"{summary['entropy']}, T={summary['T']:g}, m={summary['mass']:g}, "
        f"γ={summary['damping']:g}: {summary['result']}"[:160],
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
