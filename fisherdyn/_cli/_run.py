"""`fisherdyn run`: the dynamics check of every family, the operator table, and figures."""

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


def _start_worker(cache: bool):
    """A worker process verifies in float64, with the command's compilation cache."""
    from ._options import enable_x64

    enable_x64()
    if cache:
        from .._sweep import enable_compilation_cache

        enable_compilation_cache()


def _table_row(family):
    return fd.operator_table(families=[family])


def _run_jobs(table_families, families, z, T, mass, workers, cache):
    """`check_family` of every family and the operator table's rows, over `workers`
    processes: (the checks, the table's rows). Each job is many programs traced, compiled
    and run once; tracing holds Python's lock, so threads would trace one at a time,
    processes trace side by side. The checks, the longest jobs, go first, so that the
    workers' queues end close together; the relaxed families print as they finish."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    n = len(table_families) + len(families)
    bar = tqdm(total=n, desc="fisherdyn run", unit="job", file=sys.stderr, disable=None,
               leave=False)
    # spawn: a forked child would inherit JAX's threads and state from this process
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                               initargs=(cache,), mp_context=multiprocessing.get_context("spawn"))
    try:
        with bar:
            checks = [pool.submit(_verify.check_family, e, z, T, mass) for e in families]
            rows = [pool.submit(_table_row, f) for f in table_families]
            out, table = [], []
            for fut in checks:
                out.append(fut.result())
                bar.update()
                bar.write(f"  relaxed {out[-1].label}", file=sys.stdout)
                sys.stdout.flush()
            for fut in rows:
                table += fut.result()
                bar.update()
    finally:
        # the workers' exit (JAX's teardown) overlaps the figures; after a failure nothing
        # queued starts
        pool.shutdown(wait=False, cancel_futures=True)
    return out, table


def run_command(args: argparse.Namespace) -> int:
    from .._analysis._operator_table import DEFAULT_FAMILIES as TABLE_FAMILIES

    families = args.family or [fd.parse_entropy(s) for s in DEFAULT_FAMILIES]
    z = np.asarray(args.scores, float)
    table_families = [] if args.no_operator_table else list(TABLE_FAMILIES)
    workers = max(1, os.cpu_count() or 1)
    print(
        f"fisherdyn run: the relaxation of {len(families)} families in 4 regimes each"
        f"{'' if args.no_operator_table else ' and the operator table'} "
        f"({workers} processes); the first results take a few seconds of compilation",
        flush=True,
    )
    checks, table = _run_jobs(table_families, families, z, args.T, args.mass, workers,
                              not args.no_compilation_cache)
    if table:
        print(fd.format_operator_table(table) + "\n")
    print(
        f"Damped Fisher-Lagrangian relaxation from uniform attention: N={z.size}, "
        f"T={args.T:g}, m={args.mass:g}; regimes set from the spectrum at the fixed point "
        "(under: 0.3 x critical of the softest mode, critical: softest mode, over: 1.5 x "
        "critical of the stiffest; flow: m=0)"
    )
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
