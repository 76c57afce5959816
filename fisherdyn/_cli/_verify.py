"""The check behind `fisherdyn run`: relax one family from uniform attention and compare.

Per family: the damped dynamics in three regimes set from the relaxation spectrum at the
fixed point (under-damped: 0.3 x critical of the softest mode; critical: the softest mode;
over-damped: 1.5 x critical of the stiffest) and the overdamped flow ($m = 0$) are relaxed to
a steady state; the end points are compared with `stationary` and the independent root
`solve_stationary`, and the measured decay rate (`envelope_rate`) with the predicted one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

import fisherdyn as fd

__all__ = ["FamilyCheck", "check_family", "entropy_label", "failures", "format_table"]

REGIMES = ("under-damped", "critical", "over-damped", "overdamped flow (m=0)")
TOL = 1e-10


class FamilyCheck(NamedTuple):
    """One family's check: its `label`; `rows`, one dict per regime; `paths`, per regime the
    saved `ts`, `rho` and `energy`; `rho_star`, the stationary weights; `free_energy`,
    $F(\\rho^*)$, the energy at rest there."""

    label: str
    rows: list
    paths: list
    rho_star: np.ndarray
    free_energy: float


def entropy_label(entropy) -> str:
    """`Kaniadakis(0.3)`-style name of an entropy instance."""
    params = [f"{float(np.asarray(v)):g}" for v in entropy.parameters.values()]
    return type(entropy).__name__ + (f"({', '.join(params)})" if params else "")


def _regimes(entropy, z, T, m, st):
    """The three dampings of the inertial runs, the flow's damping, the predicted rates."""
    spectrum = lambda mass, g: fd.relaxation_spectrum(  # noqa: E731
        entropy, z, T, mass=mass, damping=g, rho=st
    )
    w2 = np.asarray(spectrum(m, 1.0).omega2)
    gammas = np.array(
        [
            0.3 * 2 * np.sqrt(m * w2.min()),
            2 * np.sqrt(m * w2.min()),
            1.5 * 2 * np.sqrt(m * w2.max()),
        ]
    )
    gamma_flow = 2 * np.sqrt(m * w2.max())
    predicted = [float(spectrum(m, g).slowest_rate) for g in gammas]
    predicted.append(float(spectrum(0.0, gamma_flow).slowest_rate))
    return gammas, gamma_flow, predicted


def check_family(entropy, scores, T: float, mass: float) -> FamilyCheck:
    """Relax `entropy` in the three damped regimes and the overdamped flow; compare."""
    z = np.asarray(scores, float)
    m = mass
    st = np.asarray(fd.stationary(entropy, jnp.asarray(z), T))
    direct = np.asarray(fd.solve_stationary(entropy, jnp.asarray(z), T, method="scipy").rho)
    gammas, gamma_flow, predicted = _regimes(entropy, z, T, m, st)
    grids = np.stack([np.linspace(0.0, 45.0 / r, 2001) for r in predicted])
    kw = dict(tol=1e-9, rtol=1e-10, atol=1e-12)
    # one problem per call: the three inertial runs share one compiled program, and an
    # unbatched program traces and compiles in about half the time of the vmapped one
    sols = [fd.relax(entropy, z, T, mass=m, damping=g, saveat=grid, **kw)
            for g, grid in zip(gammas, grids[:3])]
    sols.append(fd.relax(entropy, z, T, mass=0.0, damping=gamma_flow, saveat=grids[3], **kw))
    label = entropy_label(entropy)
    rows, paths = [], []
    for k, sol in enumerate(sols):
        rho = np.asarray(sol.rho)
        ts = np.asarray(sol.path.ts)
        path_rho = np.asarray(sol.path.rho)
        distance = np.sqrt(np.sum((np.sqrt(path_rho) - np.sqrt(st)) ** 2, -1))
        rows.append(
            dict(
                family=label,
                regime=REGIMES[k],
                gamma=float(gamma_flow if k == 3 else gammas[k]),
                mass=0.0 if k == 3 else m,
                t_conv=float(sol.t),
                drho_stationary=float(np.max(np.abs(rho - st))),
                drho_direct=float(np.max(np.abs(rho - direct))),
                residual=float(sol.residual),
                rate_measured=fd.envelope_rate(ts, distance, hi=1e-3, lo=1e-8),
                rate_predicted=predicted[k],
                support_ok=bool(np.array_equal(rho == 0, st == 0)),
            )
        )
        paths.append(dict(ts=ts, rho=path_rho, energy=np.asarray(sol.path.energy)))
    free_energy = float(fd.free_energy(entropy, z, st, T))
    return FamilyCheck(label, rows, paths, st, free_energy)


def failures(rows, tol: float = TOL) -> list:
    """The rows whose fixed point is off `stationary` or `solve_stationary` by more than
    `tol`, whose residual exceeds it, or whose support differs."""
    return [
        r
        for r in rows
        if not (
            r["drho_stationary"] <= tol
            and r["residual"] <= tol
            and r["support_ok"]
            and (math.isnan(r["drho_direct"]) or r["drho_direct"] <= tol)
        )
    ]


_HEAD = (
    "family",
    "regime",
    "gamma",
    "t_conv",
    "max|drho| stat",
    "max|drho| direct",
    "residual",
    "rate meas.",
    "rate pred.",
    "rel.err",
)


def format_table(rows) -> str:
    """The rows of every family as one fixed-width text table."""
    lines = []
    for r in rows:
        rel = abs(r["rate_measured"] - r["rate_predicted"]) / r["rate_predicted"]
        lines.append(
            [
                r["family"],
                r["regime"],
                f"{r['gamma']:.4g}",
                f"{r['t_conv']:.1f}",
                f"{r['drho_stationary']:.1e}",
                f"{r['drho_direct']:.1e}",
                f"{r['residual']:.1e}",
                f"{r['rate_measured']:.4f}",
                f"{r['rate_predicted']:.4f}",
                f"{rel:.1e}",
            ]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(_HEAD)]

    def fmt(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths))

    out = [fmt(_HEAD), "  ".join("-" * w for w in widths)]
    return "\n".join(out + [fmt(line) for line in lines])
