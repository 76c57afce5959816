"""The `fisherdyn` command (also `python -m fisherdyn`).

Subcommands are registered with `register_command`; a module that defines more of them is
listed in `_COMMAND_MODULES` and imported when the parser is built (so `fisherdyn --help`
shows them). Every bad argument exits with status 2 and one line naming the argument.

- `fisherdyn run`: the verification run behind `make run` (operator table, then the
  dynamics table and figures).
- `fisherdyn simulate`: one trajectory, summarized as text or JSON, optionally plotted.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["main", "register_command", "build_parser"]

# Modules that register further subcommands on import (e.g. issue 4's `fisherdyn figures`).
_COMMAND_MODULES: list[str] = ["fisherdyn._cli._figures"]


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


_COMMANDS: dict[str, Command] = {}


def register_command(name: str, *, help: str, configure: Callable[[argparse.ArgumentParser], None]):
    """Register `fisherdyn <name>`: `configure(parser)` adds its options, the decorated
    function `run(args) -> exit status` does the work."""

    def decorator(run):
        _COMMANDS[name] = Command(name, help, configure, run)
        return run

    return decorator


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line: `fisherdyn simulate: error: argument --T: ...`."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# --------------------------------------------------------------------------- argument types


def _number(name, *, positive=False, nonneg=False):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        if nonneg and not value >= 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    parse.__name__ = name
    return parse


def _entropy_arg(text):
    from .._entropies import parse_entropy

    try:
        return parse_entropy(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _vector_arg(text):
    try:
        values = [float(v) for v in text.replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as '1.3,0.2,-0.7', got {text!r}"
        ) from None
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected at least 2 finite numbers, got {text!r}")
    return values


def _scores_file_arg(text):
    import numpy as np

    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    try:
        if path.suffix == ".npy":
            values = np.load(path)
        else:
            values = np.loadtxt(path, delimiter=",", ndmin=1)
    except Exception as e:  # unreadable content: say so, in one line
        raise argparse.ArgumentTypeError(f"cannot read {text}: {e}".splitlines()[0]) from None
    values = np.asarray(values, float).ravel()
    if values.size < 2 or not np.all(np.isfinite(values)):
        raise argparse.ArgumentTypeError(f"{text} must hold at least 2 finite scores")
    return values.tolist()


def _png_arg(text):
    if Path(text).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise argparse.ArgumentTypeError(f"must end in .png, .pdf or .svg, got {text!r}")
    return Path(text)


# --------------------------------------------------------------------------- shared helpers

DEFAULT_SCORES = [1.3, 0.2, -0.7, 0.5, -1.6, 0.9]
DEFAULT_T = 0.8
DEFAULT_FAMILIES = [
    "shannon",
    "tsallis:1.5",
    "tsallis:2",
    "renyi:2",
    "sharma_mittal:2,1.5",
    "kaniadakis:0.3",
    "burg",
    "abe:1.5",
]


def _label(entropy) -> str:
    import numpy as np

    params = [f"{float(np.asarray(v)):g}" for v in vars(entropy).values()]
    return type(entropy).__name__ + (f"({', '.join(params)})" if params else "")


def _solve_stationary_fn():
    """`fisherdyn.solve_stationary` (the direct root solver) when the package has it."""
    import fisherdyn

    return getattr(fisherdyn, "solve_stationary", None)


def _envelope_rate(ts, d, hi=1e-3, lo=1e-8):
    """Asymptotic decay rate of a distance d(t): slope of log of its upper envelope (the
    running max from the end, which tracks the peaks of an oscillation) over the window
    where it falls from `hi` to `lo`. NaN if the window holds < 5 points."""
    import numpy as np

    ok = np.isfinite(ts) & np.isfinite(d) & (d > 0)
    ts, d = ts[ok], d[ok]
    env = np.maximum.accumulate(d[::-1])[::-1]
    window = (env <= hi) & (env >= lo)
    if window.sum() < 5:
        return float("nan")
    slope = np.polyfit(ts[window], np.log(env[window]), 1)[0]
    return float(-slope)


# --------------------------------------------------------------------------- fisherdyn run


def _configure_run(p):
    p.add_argument(
        "--family",
        action="append",
        type=_entropy_arg,
        metavar="SPEC",
        help="entropy to check, e.g. 'kaniadakis:0.3' (repeat for several; default: "
        + ", ".join(DEFAULT_FAMILIES)
        + ")",
    )
    p.add_argument(
        "--scores",
        type=_vector_arg,
        default=DEFAULT_SCORES,
        help=f"comma-separated scores (default {','.join(map(str, DEFAULT_SCORES))})",
    )
    p.add_argument(
        "--T",
        type=_number("T", positive=True),
        default=DEFAULT_T,
        help=f"temperature > 0 (default {DEFAULT_T})",
    )
    p.add_argument(
        "--mass",
        type=_number("mass", positive=True),
        default=1.0,
        help="mass m > 0 of the inertial runs (default 1)",
    )
    p.add_argument(
        "--figures-dir",
        type=Path,
        default=Path("figures"),
        help="where to write relaxation_paths.png and energy.png (default figures/)",
    )
    p.add_argument("--no-figures", action="store_true", help="skip the figures")
    p.add_argument(
        "--no-operator-table", action="store_true", help="skip the operator table printed first"
    )


def _family_run(entropy, z, T, m):
    """Relax one family in the three damped regimes and the overdamped flow; compare."""
    import jax.numpy as jnp
    import numpy as np

    import fisherdyn as fd

    st = np.asarray(fd.stationary(entropy, jnp.asarray(z), T))
    solve = _solve_stationary_fn()
    direct = (
        None if solve is None else np.asarray(solve(entropy, jnp.asarray(z), T, method="scipy").rho)
    )
    w2 = np.asarray(fd.relaxation_spectrum(entropy, z, T, mass=m, damping=1.0, rho=st).omega2)
    gammas = np.array(
        [
            0.3 * 2 * np.sqrt(m * w2.min()),
            2 * np.sqrt(m * w2.min()),
            1.5 * 2 * np.sqrt(m * w2.max()),
        ]
    )
    regimes = ["under-damped", "critical", "over-damped", "overdamped flow (m=0)"]
    gamma_flow = 2 * np.sqrt(m * w2.max())
    predicted = [
        float(fd.relaxation_spectrum(entropy, z, T, mass=m, damping=g, rho=st).slowest_rate)
        for g in gammas
    ]
    predicted.append(
        float(
            fd.relaxation_spectrum(entropy, z, T, mass=0.0, damping=gamma_flow, rho=st).slowest_rate
        )
    )
    grids = np.stack([np.linspace(0.0, 45.0 / r, 2001) for r in predicted])
    kw = dict(tol=1e-9, rtol=1e-10, atol=1e-12)
    inertial = fd.relax(
        entropy, np.broadcast_to(z, (3, len(z))), T, mass=m, damping=gammas, saveat=grids[:3], **kw
    )
    flow = fd.relax(entropy, z, T, mass=0.0, damping=gamma_flow, saveat=grids[3], **kw)
    rows, paths = [], []
    for k in range(4):
        sol = flow if k == 3 else _index(inertial, k)
        path = sol.path
        rho = np.asarray(sol.rho)
        ts = np.asarray(path.ts)
        d = np.sqrt(np.sum((np.sqrt(np.asarray(path.rho)) - np.sqrt(st)) ** 2, -1))
        measured = _envelope_rate(ts, d)
        rows.append(
            dict(
                family=_label(entropy),
                regime=regimes[k],
                gamma=float(gamma_flow if k == 3 else gammas[k]),
                mass=0.0 if k == 3 else m,
                t_conv=float(sol.t),
                drho_stationary=float(np.max(np.abs(rho - st))),
                drho_direct=float("nan") if direct is None else float(np.max(np.abs(rho - direct))),
                residual=float(sol.residual),
                rate_measured=measured,
                rate_predicted=predicted[k],
                support_ok=bool(np.array_equal(rho == 0, st == 0)),
            )
        )
        paths.append(dict(ts=ts, rho=np.asarray(path.rho), energy=np.asarray(path.energy)))
    return rows, paths, st


def _index(tree, k):
    import jax

    return jax.tree_util.tree_map(lambda x: x[k] if hasattr(x, "shape") and x.ndim else x, tree)


def _format_table(rows):
    head = [
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
    ]
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
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [fmt(head), "  ".join("-" * w for w in widths)]
    out += [fmt(line) for line in lines]
    return "\n".join(out)


def _figures(results, z, T, outdir: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    outdir.mkdir(parents=True, exist_ok=True)
    n = len(results)
    cols = min(4, n)
    rows_ = math.ceil(n / cols)
    # --- relaxation paths: under-damped (solid) vs overdamped flow (dashed)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 3.3 * rows_ + 0.9), squeeze=False)
    colors = plt.cm.tab10(np.arange(len(z)) % 10)
    for ax, (label, paths, st, rows, _) in zip(axes.flat, results):
        under, flow = paths[0], paths[3]
        # show the paths until both are visually settled (within 1e-3 of the fixed point)
        t_vis = 0.0
        for path in (under, flow):
            ok = np.isfinite(path["ts"])
            off = np.max(np.abs(path["rho"][ok] - st), -1) > 1e-3
            if off.any():
                t_vis = max(t_vis, path["ts"][ok][np.flatnonzero(off)[-1]])
        t_end = 1.3 * t_vis if t_vis > 0 else rows[0]["t_conv"]
        for path, ls, lw in ((under, "-", 1.3), (flow, "--", 1.0)):
            keep = np.isfinite(path["ts"]) & (path["ts"] <= t_end)
            for i in range(len(z)):
                ax.plot(path["ts"][keep], path["rho"][keep, i], color=colors[i], lw=lw, ls=ls)
        for i in range(len(z)):
            ax.axhline(st[i], color=colors[i], lw=0.6, ls=":")
        ax.set_xlim(0, t_end)
        ax.set_title(label, fontsize=10)
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
    fig.tight_layout(rect=(0, 0.09 if rows_ == 1 else 0.06, 1, 1))
    fig.savefig(outdir / "relaxation_paths.png", dpi=120)
    plt.close(fig)
    # --- energy
    fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 3.4 * rows_), squeeze=False)
    styles = [("C0", "-"), ("C1", "-"), ("C2", "-"), ("k", "--")]
    for ax, (label, paths, st, rows, H_star) in zip(axes.flat, results):
        for (color, ls), path, row in zip(styles, paths, rows):
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
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("t")
        ax.set_ylabel(r"$H(t) - H^*$")
        ax.set_ylim(1e-16, None)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, None)
    for ax in axes.flat[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="lower left")
    fig.suptitle(
        r"The energy $H = \frac{m}{2}\sum\dot\rho^2/\rho + F$ falls monotonically to the "
        r"stationary free energy ($dH/dt = -\gamma\sum\dot\rho^2/\rho$), fastest near "
        "critical damping",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(outdir / "energy.png", dpi=120)
    plt.close(fig)
    return [outdir / "relaxation_paths.png", outdir / "energy.png"]


@register_command(
    "run",
    help="verify the dynamics: relax every family in three damping regimes and the "
    "overdamped flow, compare with the stationary operators, write figures",
    configure=_configure_run,
)
def _run(args) -> int:
    import numpy as np

    import fisherdyn as fd

    from .._entropies import parse_entropy

    if not args.no_operator_table and importlib.util.find_spec("fisherdyn._analysis._operator_table") is not None:
        table = importlib.import_module("fisherdyn._analysis._operator_table")
        print(table.format_operator_table(table.operator_table()))
        print()
    families = args.family or [parse_entropy(s) for s in DEFAULT_FAMILIES]
    z = np.asarray(args.scores, float)
    if _solve_stationary_fn() is None:
        print("note: fisherdyn.solve_stationary is not available; 'direct' column is NaN")
    print(
        f"Damped Fisher-Lagrangian relaxation from uniform attention: N={z.size}, T={args.T:g}, "
        f"m={args.mass:g}; regimes set from the spectrum at the fixed point (under: "
        "0.3 x critical of the softest mode, critical: softest mode, over: 1.5 x critical "
        "of the stiffest; flow: m=0)",
        flush=True,
    )
    all_rows, results = [], []
    for entropy in families:
        rows, paths, st = _family_run(entropy, z, args.T, args.mass)
        all_rows += rows
        H_star = float(fd.free_energy(entropy, st, z, args.T))  # H at rest at rho*
        results.append((_label(entropy), paths, st, rows, H_star))
        print(f"  relaxed {_label(entropy)}", flush=True)
    print(_format_table(all_rows))
    bad = [
        r
        for r in all_rows
        if not (
            r["drho_stationary"] <= 1e-10
            and r["residual"] <= 1e-10
            and r["support_ok"]
            and (math.isnan(r["drho_direct"]) or r["drho_direct"] <= 1e-10)
        )
    ]
    print(
        "rate meas.: slope of the upper envelope of ||sqrt(rho) - sqrt(rho*)|| from 1e-3 to "
        "1e-8 along the path; rate pred.: slowest -Re(s_k) of relaxation_spectrum. Expected "
        "gaps: critical, the (1 + a t) prefactor biases the fit low; where the two slowest "
        "rates lie within a few % (over-damped Kaniadakis, Burg, Abe), the fit sees their "
        "blend. The per-mode check to 1e-3 is tests/test_dynamics.py::"
        "test_linear_response_matches_spectrum."
    )
    if not args.no_figures:
        for path in _figures(results, z, args.T, args.figures_dir):
            print(f"wrote {path}")
    if bad:
        print(f"FAILED: {len(bad)} fixed point(s) off by more than 1e-10")
        return 1
    print(
        f"all {len(all_rows)} fixed points match stationary"
        + ("" if _solve_stationary_fn() is None else " and solve_stationary")
        + " to <= 1e-10"
    )
    return 0


# --------------------------------------------------------------------------- fisherdyn simulate


def _configure_simulate(p):
    p.add_argument(
        "--entropy",
        type=_entropy_arg,
        default="shannon",
        help="entropy family and parameters, e.g. shannon, tsallis:2, kaniadakis:0.3, "
        "renyi:2, sharma_mittal:2,1.5, burg, abe:1.5 (default shannon)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--scores",
        type=_vector_arg,
        default=None,
        help=f"comma-separated scores (default {','.join(map(str, DEFAULT_SCORES))})",
    )
    src.add_argument(
        "--scores-file",
        type=_scores_file_arg,
        default=None,
        help="scores from a .npy or .csv file (one vector)",
    )
    p.add_argument(
        "--T", type=_number("T", positive=True), default=1.0, help="temperature > 0 (default 1)"
    )
    p.add_argument(
        "--mass",
        type=_number("mass", nonneg=True),
        default=1.0,
        help="mass m >= 0; 0 integrates the overdamped replicator flow (default 1)",
    )
    p.add_argument(
        "--damping",
        type=_number("damping", nonneg=True),
        default=1.0,
        help="damping gamma >= 0 (> 0 when m = 0) (default 1)",
    )
    p.add_argument(
        "--t1", type=_number("t1", positive=True), default=50.0, help="final time (default 50)"
    )
    p.add_argument(
        "--rho0",
        type=_vector_arg,
        default=None,
        help="initial weights, comma-separated, on the simplex (default uniform)",
    )
    p.add_argument(
        "--coords",
        choices=["sphere", "simplex"],
        default="sphere",
        help="chart: sphere (x = sqrt(rho), default) or simplex",
    )
    p.add_argument(
        "--solver",
        choices=["tsit5", "dopri5", "dopri8", "kvaerno5"],
        default="tsit5",
        help="diffrax solver (kvaerno5: stiff, implicit)",
    )
    p.add_argument(
        "--rtol",
        type=_number("rtol", positive=True),
        default=1e-8,
        help="relative tolerance (default 1e-8)",
    )
    p.add_argument(
        "--atol",
        type=_number("atol", positive=True),
        default=1e-10,
        help="absolute tolerance (default 1e-10)",
    )
    p.add_argument("--n-save", type=int, default=501, help="number of saved times (default 501)")
    p.add_argument(
        "--out",
        type=_png_arg,
        default=None,
        help="write a figure of rho_i(t) and H(t) to this .png/.pdf/.svg",
    )
    p.add_argument(
        "--json", action="store_true", help="print the trajectory summary as JSON instead of text"
    )
    p.add_argument("--progress", action="store_true", help="show a progress bar")


def _jsonable(x):
    import numpy as np

    a = np.asarray(x)
    if np.iscomplexobj(a):
        return [[float(v.real), float(v.imag)] for v in a.ravel()]
    a = a.astype(float)
    return (
        [v if math.isfinite(v) else None for v in a.ravel().tolist()]
        if a.ndim
        else (float(a) if math.isfinite(float(a)) else None)
    )


@register_command(
    "simulate",
    help="integrate one trajectory of the damped Fisher-Lagrangian dynamics",
    configure=_configure_simulate,
)
def _simulate_cmd(args) -> int:
    import numpy as np

    import fisherdyn as fd

    parser = args._parser
    scores = args.scores_file or args.scores or DEFAULT_SCORES
    z = np.asarray(scores, float)
    if args.mass == 0 and args.damping == 0:
        parser.error("argument --damping: must be > 0 when --mass is 0 (overdamped flow)")
    if args.n_save < 2:
        parser.error(f"argument --n-save: must be >= 2, got {args.n_save}")
    rho0 = None
    if args.rho0 is not None:
        rho0 = np.asarray(args.rho0, float)
        if rho0.size != z.size:
            parser.error(
                f"argument --rho0: needs {z.size} weights (one per score), got {rho0.size}"
            )
        if np.any(rho0 < 0) or abs(rho0.sum() - 1) > 1e-9 * z.size:
            parser.error("argument --rho0: must lie on the simplex (>= 0, summing to 1)")
    tr = fd.simulate(
        args.entropy,
        z,
        args.T,
        mass=args.mass,
        damping=args.damping,
        rho0=rho0,
        t1=args.t1,
        saveat=args.n_save,
        coords=args.coords,
        rtol=args.rtol,
        atol=args.atol,
        solver=args.solver,
        progress=args.progress,
    )
    st = np.asarray(fd.stationary(args.entropy, z, args.T))
    sp = fd.relaxation_spectrum(
        args.entropy, z, args.T, mass=args.mass, damping=args.damping, rho=st
    )
    ts = np.asarray(tr.ts)
    ok = np.isfinite(ts)
    H = np.asarray(tr.energy)[ok]
    summary = dict(
        entropy=_label(args.entropy),
        scores=z.tolist(),
        T=args.T,
        mass=args.mass,
        damping=args.damping,
        coords=args.coords,
        result=fd.RESULTS[tr.result] or "successful",
        t_final=float(tr.t_final),
        rho_initial=_jsonable(np.asarray(tr.rho)[0]),
        rho_final=_jsonable(tr.rho_final),
        rho_stationary=_jsonable(st),
        max_abs_final_minus_stationary=float(np.max(np.abs(np.asarray(tr.rho_final) - st))),
        energy_initial=float(H[0]),
        energy_final=float(H[-1]),
        max_energy_increase=float(np.max(np.diff(H), initial=0.0)),
        constraint_drift=float(tr.constraint_drift),
        num_steps=int(tr.stats["num_steps"]),
        spectrum=dict(
            omega2=_jsonable(sp.omega2),
            rates=_jsonable(sp.rates[:, 0]),
            regimes=sp.regime_names,
            slowest_rate=float(sp.slowest_rate),
        ),
    )
    if args.out is not None:
        _simulate_figure(tr, st, summary, args.out)
        summary["figure"] = str(args.out)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"{summary['entropy']}  T={args.T:g}  m={args.mass:g}  gamma={args.damping:g}  "
            f"coords={args.coords}: {summary['result']}"
        )
        print(f"  t_final = {summary['t_final']:.4g}, steps = {summary['num_steps']}")
        print(f"  rho(t_final) = {np.array2string(np.asarray(tr.rho_final), precision=6)}")
        print(
            f"  stationary   = {np.array2string(st, precision=6)}  "
            f"(max diff {summary['max_abs_final_minus_stationary']:.2e})"
        )
        print(
            f"  H: {summary['energy_initial']:.6g} -> {summary['energy_final']:.6g}; "
            f"slowest linear rate {summary['spectrum']['slowest_rate']:.4g}"
        )
        if args.out is not None:
            print(f"  wrote {args.out}")
    return 0


def _simulate_figure(tr, st, summary, out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ts = np.asarray(tr.ts)
    ok = np.isfinite(ts)
    rho = np.asarray(tr.rho)[ok]
    H = np.asarray(tr.energy)[ok]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i in range(rho.shape[1]):
        (line,) = a.plot(ts[ok], rho[:, i], lw=1.3, label=f"z={summary['scores'][i]:+.2f}")
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


# --------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    for name in _COMMAND_MODULES:
        importlib.import_module(name)
    parser = _Parser(
        prog="fisherdyn",
        description="Entropy-generated attention: stationary operators and their damped "
        "Fisher-Lagrangian dynamics.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for cmd in _COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.configure(p)
        p.set_defaults(_command=cmd, _parser=p)
    return parser


_VECTOR_OPTIONS = ("--scores", "--rho0")


def _glue_negative_vectors(argv):
    """`--scores -0.5,1` would read as an option to argparse: glue it to `--scores=-0.5,1`."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in _VECTOR_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            try:
                [float(v) for v in argv[i + 1].split(",")]
            except ValueError:
                out.append(a)
                i += 1
                continue
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def main(argv=None) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)  # the command verifies in float64
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(_glue_negative_vectors(argv))
    status = args._command.run(args)
    return int(status or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
