"""`fisherdyn run`: the operator table, then the dynamics check of every family and figures."""

from __future__ import annotations

import argparse
import os
import sys

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


def _run_jobs(table_families, families, z, T, mass, workers):
    """The operator table's rows and `check_family` of every family, in order. Each is
    many programs compiled and run once; XLA compiles with Python's lock released, so threads
    overlap the compilations of different families on several cores. The table's rows are
    submitted first, so the table prints while the families still relax."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    n = len(table_families) + len(families)
    bar = tqdm(total=n, desc="fisherdyn run", unit="job", file=sys.stderr, disable=None,
               leave=False)
    with bar, ThreadPoolExecutor(max_workers=workers) as pool:
        rows = [pool.submit(fd.operator_table, families=[f]) for f in table_families]
        checks = [pool.submit(_verify.check_family, e, z, T, mass) for e in families]
        if rows:
            table = []
            for fut in rows:
                table += fut.result()
                bar.update()
            bar.write(fd.format_operator_table(table) + "\n", file=sys.stdout)
        bar.write(
            f"Damped Fisher-Lagrangian relaxation from uniform attention: N={z.size}, "
            f"T={T:g}, m={mass:g}; regimes set from the spectrum at the fixed point (under: "
            "0.3 x critical of the softest mode, critical: softest mode, over: 1.5 x critical "
            "of the stiffest; flow: m=0)",
            file=sys.stdout,
        )
        sys.stdout.flush()
        out = []
        for fut in checks:
            out.append(fut.result())
            bar.update()
            bar.write(f"  relaxed {out[-1].label}", file=sys.stdout)
            sys.stdout.flush()
    return out


def run_command(args: argparse.Namespace) -> int:
    from .._analysis._operator_table import DEFAULT_FAMILIES as TABLE_FAMILIES

    families = args.family or [fd.parse_entropy(s) for s in DEFAULT_FAMILIES]
    z = np.asarray(args.scores, float)
    table_families = [] if args.no_operator_table else list(TABLE_FAMILIES)
    workers = max(1, os.cpu_count() or 1)
    print(
        f"fisherdyn run: {'' if args.no_operator_table else 'the operator table, then '}"
        f"the relaxation of {len(families)} families in 4 regimes each "
        f"({workers} threads); the first results take a few seconds of compilation",
        flush=True,
    )
    checks = _run_jobs(table_families, families, z, args.T, args.mass, workers)
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
