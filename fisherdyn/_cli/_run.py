"""`fisherdyn run`: the operator table, then the dynamics check of every family and figures."""

from __future__ import annotations

import argparse

import numpy as np

import fisherdyn as fd

from . import _verify
from ._options import DEFAULT_FAMILIES

__all__ = ["run_command"]

_RATE_NOTE = (
    "rate meas.: slope of the upper envelope of ||sqrt(rho) - sqrt(rho*)|| from 1e-3 to "
    "1e-8 along the path; rate pred.: slowest -Re(s_k) of relaxation_spectrum. Expected "
    "gaps: critical, the (1 + a t) prefactor biases the fit low; where the two slowest "
    "rates lie within a few % (over-damped Kaniadakis, Burg, Abe), the fit sees their "
    "blend. The per-mode check to 1e-3 is tests/test_dynamics.py::"
    "test_linear_response_matches_spectrum."
)


def run_command(args: argparse.Namespace) -> int:
    if not args.no_operator_table:
        print(fd.format_operator_table(fd.operator_table()))
        print()
    families = args.family or [fd.parse_entropy(s) for s in DEFAULT_FAMILIES]
    z = np.asarray(args.scores, float)
    print(
        f"Damped Fisher-Lagrangian relaxation from uniform attention: N={z.size}, T={args.T:g}, "
        f"m={args.mass:g}; regimes set from the spectrum at the fixed point (under: "
        "0.3 x critical of the softest mode, critical: softest mode, over: 1.5 x critical "
        "of the stiffest; flow: m=0)",
        flush=True,
    )
    checks = []
    for entropy in families:
        checks.append(_verify.check_family(entropy, z, args.T, args.mass))
        print(f"  relaxed {checks[-1].label}", flush=True)
    rows = [row for check in checks for row in check.rows]
    print(_verify.format_table(rows))
    print(_RATE_NOTE)
    if not args.no_figures:
        from ._plots import run_figures

        for path in run_figures(checks, z, args.T, args.figures_dir):
            print(f"wrote {path}")
    bad = _verify.failures(rows)
    if bad:
        print(f"FAILED: {len(bad)} fixed point(s) off by more than {_verify.TOL:g}")
        return 1
    print(f"all {len(rows)} fixed points match stationary and solve_stationary to <= 1e-10")
    return 0
