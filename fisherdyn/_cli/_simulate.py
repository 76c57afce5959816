"""`fisherdyn simulate`: one trajectory, summarized as text or JSON, optionally plotted."""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

import fisherdyn as fd

from ._options import DEFAULT_SCORES
from ._verify import entropy_label

__all__ = ["simulate_command"]

# a run that stops at the simplex boundary has a result to report, not a failure
_REPORTED = ("successful", "boundary_reached")
_HINTS = {
    "max_steps_reached": " (raise --max-steps, or shorten --t1)",
    "boundary_singular": (
        " (a weight reached 0 where the force diverges: raise --damping, use --mass 0, or"
        " --coords simplex)"
    ),
}


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


def _summary(args, z, tr, st, sp) -> dict:
    ts = np.asarray(tr.ts)
    H = np.asarray(tr.energy)[np.isfinite(ts)]
    return dict(
        entropy=entropy_label(args.entropy),
        scores=z.tolist(),
        T=args.T,
        mass=args.mass,
        damping=args.damping,
        coords=args.coords,
        result=fd.result_name(tr.result),
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
    print(
        f"  H: {summary['energy_initial']:.6g} -> {summary['energy_final']:.6g}; "
        f"slowest linear rate {summary['spectrum']['slowest_rate']:.4g}"
    )
    if args.out is not None:
        print(f"  wrote {args.out}")


def simulate_command(args: argparse.Namespace) -> int:
    if args.entropy is None:
        args.entropy = fd.Shannon()
    z = np.asarray(args.scores_file or args.scores or DEFAULT_SCORES, float)
    rho0 = None if args.rho0 is None else np.asarray(args.rho0, float)
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
        max_steps=args.max_steps,
        solver=args.solver,
        throw=False,
        progress=args.progress,
    )
    result = fd.result_name(tr.result)
    if result not in _REPORTED:
        hint = _HINTS.get(result, "")
        print(f"fisherdyn simulate: error: the solver stopped: {result}{hint}", file=sys.stderr)
        return 1
    st = np.asarray(fd.stationary(args.entropy, z, args.T))
    if not (np.all(np.isfinite(np.asarray(tr.rho_final))) and np.all(np.isfinite(st))):
        # a runtime check that fired as NaN (EQX_ON_ERROR=nan), never printed as a result
        print("fisherdyn simulate: error: the computation returned non-finite weights",
              file=sys.stderr)
        return 1
    sp = fd.relaxation_spectrum(
        args.entropy, z, args.T, mass=args.mass, damping=args.damping, rho=st
    )
    summary = _summary(args, z, tr, st, sp)
    if args.out is not None:
        from ._plots import simulate_figure

        simulate_figure(tr, st, summary, args.out)
        summary["figure"] = str(args.out)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_text(args, summary, tr, st)
    return 0
