"""`fisherdyn run`: the dynamics check of every family, the operator table, and figures."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys

import numpy as np

import fisherdyn as fd

from . import _verify

__all__ = ["run_command"]

_RATE_NOTE = (
    "rate meas.: slope of the upper envelope of ||sqrt(rho) - sqrt(rho*)|| from 1e-3 to "
    "1e-8 along the path; rate pred.: slowest -Re(s_k) of relaxation_spectrum. Expected "
    "gaps: critical, the (1 + a t) prefactor biases the fit low; where the two slowest "
    "rates lie within a few % (over-damped Kaniadakis, Burg, Abe), the fit sees their "
    "blend. The per-mode check to 1e-3 is listed on the documentation's verification page "
    "(Dynamics: decay rates and frequencies fitted from simulated paths)."
)


def _start_worker(cache: bool):
    """A worker process verifies in float64, with the command's compilation cache, and
    leaves Ctrl-C to the main process, which ends it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ._options import enable_x64

    enable_x64()
    if cache:
        from .._sweep import enable_compilation_cache

        enable_compilation_cache()


def _table_row(family):
    return fd.operator_table(families=[family])


def _end_workers(pool):
    """End the worker processes now: `shutdown` alone lets each finish its running job."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=10)


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored while worker processes start: a child started so ignores it from its
    first instruction (Python installs no KeyboardInterrupt handler then), so that Ctrl-C in
    a terminal, sent to every process of the group, reaches only the main process."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals are not ours to set
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_jobs(table_families, families, z, T, mass, workers, cache):
    """`check_family` of every family and the operator table's rows, over `workers`
    processes: (the checks, the table's rows). Each job is many programs traced, compiled
    and run once; tracing holds Python's lock, so threads would trace one at a time,
    processes trace side by side. The checks, the longest jobs, go first, so that the
    workers' queues end close together; the relaxed families print as they finish."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from .._optional import require

    tqdm = require("tqdm", extra="cli", what="fisherdyn run").tqdm

    n = len(table_families) + len(families)
    bar = tqdm(total=n, desc="fisherdyn run", unit="job", file=sys.stderr, disable=None,
               leave=False)
    # spawn: a forked child would inherit JAX's threads and state from this process
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                               initargs=(cache,), mp_context=multiprocessing.get_context("spawn"))
    ok = False
    try:
        with bar:
            with _sigint_ignored():  # the workers start at the first submits
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
        ok = True
    finally:
        if ok:  # the workers' exit (JAX's teardown) overlaps the figures
            pool.shutdown(wait=False)
        else:  # Ctrl-C, a closed pipe or a failure: no worker outlives the command
            _end_workers(pool)
    return out, table


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def run_command(args: argparse.Namespace) -> int:
    from .._entropies import default_entropies, entropy_label

    families = args.family or default_entropies(examples=True)
    z = np.asarray(args.scores, float)
    # the table covers the families asked for, or its own default set
    table_families = (
        []
        if args.no_operator_table
        else [(_verify.entropy_label(e), e) for e in args.family]
        if args.family
        else [(entropy_label(e), e) for e in default_entropies()]
    )
    workers = max(1, os.cpu_count() or 1)
    print(
        f"fisherdyn run: the relaxation of {_plural(len(families), 'family', 'families')} "
        "in 4 regimes each"
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
    bad = _verify.failures(rows)
    if bad:
        print(f"FAILED: {_plural(len(bad), 'fixed point', 'fixed points')} off by more than "
              f"{_verify.TOL:g}")
    else:
        print(f"all {len(rows)} fixed points match stationary and solve_stationary to "
              f"<= {_verify.TOL:g}")
    sys.stdout.flush()  # the verdict is out before the figures take their time
    if not args.no_figures:
        from ._plots import run_figures

        for path in run_figures(checks, z, args.T, args.figures_dir):
            print(f"wrote {path}")
    return 1 if bad else 0
