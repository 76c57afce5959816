"""`fisherdyn simulate`: one trajectory, summarized as text or JSON, optionally plotted."""

from __future__ import annotations

import argparse
import json
import math
import sys
from types import SimpleNamespace

import numpy as np

import fisherdyn as fd

from . import _exported
from ._options import DEFAULT_SCORES
from ._verify import entropy_label

__all__ = ["simulate_command"]

_HINTS = {
    "boundary_reached": (
        "a weight reached 0, where the simplex chart cannot continue: use --coords sphere "
        "(the default) to integrate through it"
    ),
    "boundary_singular": (
        "a weight reached 0 where the force diverges: raise --damping, use --mass 0, or "
        "--coords simplex"
    ),
}
# a linear mode faster than this over t1: its time scale, not the path, sets the steps
_FAR_SCALE = 1e4
# from this many keys on, the relaxation spectrum takes seconds: say so first
_SPECTRUM_NOTICE_KEYS = 50_000


def _spectrum_notice(n_keys: int) -> str | None:
    """The progress line printed before a run whose spectrum will take seconds, or None."""
    if n_keys < _SPECTRUM_NOTICE_KEYS:
        return None
    return (f"fisherdyn simulate: {n_keys} keys: the relaxation spectrum takes seconds "
            "(time grows as N^2), computed with the run")


def _mode_rates(omega2, mass, damping, scale=1.0):
    """The linear modes' rates $s$, roots of $m s^2 + \\gamma s + \\omega^2/c = 0$ (at
    $m = 0$, $s = -\\omega^2/(c\\gamma)$), with the scores and T divided by $c$ = `scale`."""
    w2 = np.asarray(omega2, float).ravel() / scale
    if mass == 0:
        return (-w2 / damping).astype(complex)
    root = np.sqrt((damping**2 - 4 * mass * w2).astype(complex))
    return np.concatenate([(-damping + root) / (2 * mass), (-damping - root) / (2 * mass)])


def _max_steps_hint(args, report) -> str:
    """What to do after `max_steps_reached`, from its cause: the linear modes at the fixed
    point (`relaxation_spectrum`'s omega^2) against the integration window t1."""
    t_final, steps = float(report["t_final"]), int(report["num_steps"])
    pace = (f"t1 = {args.t1:g} needs about {steps * args.t1 / t_final:.0e} steps at this pace"
            if t_final > 0 else "not one step succeeded")
    omega2 = np.asarray(report["omega2"], float)
    if not np.all(np.isfinite(omega2)):
        return ("the forces overflow: the scores and T are out of floating-point range; "
                "divide --scores and --T by a common factor (the fixed point depends on "
                "scores/T only)")
    s = _mode_rates(omega2, args.mass, args.damping)
    fast = s[np.argmax(np.abs(s))]
    if abs(fast) * args.t1 <= _FAR_SCALE:
        return f"{pace}: raise --max-steps, or shorten --t1"
    what = (f"the fastest linear mode oscillates at {abs(fast.imag):.1e} radians"
            if abs(fast.imag) > abs(fast.real) else
            f"the fastest linear mode decays at {abs(fast.real):.1e}")
    what += f" per unit time ({pace})"
    stiff = ("" if args.solver == "kvaerno5" or abs(fast.imag) > abs(fast.real) else
             ", or try --solver kvaerno5 (for stiff problems)")
    # (z, T, m, gamma) and (z/c, T/c, m/c, gamma/c) give the same path: the size of the
    # scores and T against the mass and damping sets the speed of the modes
    for exponent in range(1, 309):
        rates = _mode_rates(omega2, args.mass, args.damping, 10.0**exponent)
        if np.max(np.abs(rates)) * args.t1 <= _FAR_SCALE / 10:
            return (f"{what}: divide --scores and --T by about 1e{exponent} to slow it (the "
                    f"fixed point depends on scores/T only){stiff}")
    # no rescaling slows a mode set by the damping alone (rate gamma/m)
    return (f"{what}, set by the damping over the mass: use --mass 0 for the overdamped flow "
            f"that a damping this large approaches{stiff}")


def _jsonable(x):
    a = np.asarray(x)
    if np.iscomplexobj(a):
        return [[float(v.real), float(v.imag)] for v in a.ravel()]
    a = a.astype(float)
    return (
        [v if math.isfinite(v) else None for v in a.ravel().tolist()]
        if a.ndim
        else (float(a) if math.isfinite(float(a)) else None)
    )


def _summary(args, z, tr, result, st, sp) -> dict:
    ts = np.asarray(tr.ts)
    H = np.asarray(tr.energy)[np.isfinite(ts)]
    return dict(
        entropy=entropy_label(args.entropy),
        scores=z.tolist(),
        T=args.T,
        mass=args.mass,
        damping=args.damping,
        coords=args.coords,
        result=result,
        t_final=float(tr.t_final),
        rho_initial=_jsonable(np.asarray(tr.rho)[0]),
        rho_final=_jsonable(tr.rho_final),
        rho_stationary=_jsonable(st),
        max_abs_final_minus_stationary=float(np.max(np.abs(np.asarray(tr.rho_final) - st))),
        # a run stopped before its first saved time has none
        energy_initial=_jsonable(H[0]) if H.size else None,
        energy_final=_jsonable(H[-1]) if H.size else None,
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


def _print_text(args, summary, tr, st):
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
    H0, H1 = (f"{h:.6g}" if h is not None else "n/a"
              for h in (summary["energy_initial"], summary["energy_final"]))
    print(f"  H: {H0} -> {H1}; slowest linear rate {summary['spectrum']['slowest_rate']:.4g}")
    if args.save is not None:
        print(f"  wrote {args.save}")


def _report_program(args, z, rho0):
    """The run as one function of arrays (scores, T, damping, mass unless 0, rho0 if given)
    returning a dict of arrays, and the static options it closes over."""
    entropy = args.entropy
    overdamped = args.mass == 0
    static = dict(
        entropy=type(entropy).__name__,
        params={k: float(np.asarray(v)) for k, v in entropy.parameters.items()},
        overdamped=overdamped,
        rho0=rho0 is not None,
        t1=args.t1,
        n_save=args.n_save,
        coords=args.coords,
        rtol=args.rtol,
        atol=args.atol,
        max_steps=args.max_steps,
        solver=args.solver,
        progress=args.progress,
    )
    arrays = [z, args.T, args.damping]
    if not overdamped:
        arrays.append(args.mass)
    if rho0 is not None:
        arrays.append(rho0)

    def program(z, T, damping, *rest):
        rest = list(rest)
        mass = 0.0 if overdamped else rest.pop(0)
        r0 = rest.pop(0) if rho0 is not None else None
        tr = fd.simulate(
            entropy, z, T, mass=mass, damping=damping, rho0=r0, t1=args.t1,
            saveat=args.n_save, coords=args.coords, rtol=args.rtol, atol=args.atol,
            max_steps=args.max_steps, solver=args.solver, throw=False,
            progress=args.progress,
        )
        st = fd.stationary(entropy, z, T)
        sp = fd.relaxation_spectrum(entropy, z, T, mass=mass, damping=damping, rho=st)
        return dict(
            ts=tr.ts, rho=tr.rho, energy=tr.energy, t_final=tr.t_final,
            rho_final=tr.rho_final, constraint_drift=tr.constraint_drift,
            rho_dot=tr.rho_dot, lam=tr.lam, rho_dot_final=tr.rho_dot_final,
            num_steps=tr.stats["num_steps"], result=tr.result._value, stationary=st,
            omega2=sp.omega2, rates=sp.rates, regime=sp.regime._value, slowest_rate=sp.slowest_rate,
        )

    return program, tuple(np.asarray(a, float) for a in arrays), static


def _names():
    """The words for the integer codes in a report (stored with an exported program)."""
    from .._dynamics import REGIME_NAMES
    from .._results import result_names

    return dict(results={str(k): v for k, v in result_names().items()},
                regimes=list(REGIME_NAMES))


def _as_run(report, names):
    """The report's arrays as the trajectory and spectrum the summary reads."""
    tr = SimpleNamespace(
        **{k: report[k] for k in ("ts", "rho", "energy", "t_final", "rho_final",
                                  "constraint_drift")},
        stats={"num_steps": report["num_steps"]},
    )
    sp = SimpleNamespace(
        omega2=report["omega2"], rates=report["rates"], slowest_rate=report["slowest_rate"],
        regime_names=[names["regimes"][int(r)] for r in report["regime"].ravel()],
    )
    return tr, names["results"][str(int(report["result"]))], sp


def simulate_command(args: argparse.Namespace) -> int:
    if args.entropy is None:
        args.entropy = fd.Shannon()
    z = np.asarray(args.scores_file or args.scores or DEFAULT_SCORES, float)
    rho0 = None if args.rho0 is None else np.asarray(args.rho0, float)
    program, arrays, static = _report_program(args, z, rho0)
    notice = _spectrum_notice(z.shape[-1])
    if notice is not None:
        print(notice, file=sys.stderr, flush=True)
    directory = None if args.no_compilation_cache else _exported.exported_dir()
    report, names, _ = _exported.cached_call(
        "simulate", program, arrays, static, meta=_names, directory=directory
    )
    tr, result, sp = _as_run(report, names)
    if args.save is not None:  # whatever the result, which the file records
        from ._save import save_trajectory

        save_trajectory(args.save, report, names, args, z)
    st = report["stationary"]
    if not (np.all(np.isfinite(tr.rho_final)) and np.all(np.isfinite(st))):
        # a runtime check that fired as NaN (EQX_ON_ERROR=nan), never printed as a result
        print(f"fisherdyn simulate: error: the computation returned non-finite weights "
              f"({result}); the scores or T may be out of range: divide --scores and --T by "
              "a common factor", file=sys.stderr)
        return 1
    summary = _summary(args, z, tr, result, st, sp)
    if args.save is not None:
        summary["trajectory"] = str(args.save)
    if args.out is not None:
        summary["figure"] = str(args.out)
    # the text first: it is out even if the figure then fails
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_text(args, summary, tr, st)
    sys.stdout.flush()
    if args.out is not None:
        from ._plots import simulate_figure

        simulate_figure(tr, st, summary, args.out)
        if not args.json:
            print(f"  wrote {args.out}")
    if result == "successful":
        return 0
    # every other result stopped before t1: the summary above is of the part computed
    hint = (_max_steps_hint(args, report) if result == "max_steps_reached"
            else _HINTS.get(result, "see the result's name"))
    print(f"fisherdyn simulate: stopped early at t = {float(tr.t_final):.4g} of "
          f"{args.t1:g}: {result}; {hint}", file=sys.stderr)
    return 1
