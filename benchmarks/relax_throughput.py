"""Benchmark: relaxations per second against batch size, per family, on the default device.

For each family of `benchmarks/dynamics.py` (Shannon, Tsallis(1.5), Kaniadakis(0.3); N = 64
keys, m = 1, gamma = 2, T = 1, rtol 1e-8, float64) and each batch size B, one compiled
`fisherdyn.relax` call on B gaussian score rows: the first call (compilation included),
then the median of `--repeats` calls, and relaxations per second = B / median. The
saturating batch is the smallest B whose throughput is within 10 % of the family's
largest (not reached where only the largest B is). A problem that does not converge is
counted by its result and the run goes on. Every fixed point is checked against
`fisherdyn.stationary` (1e-10).

Beside it, what one host CPU core does with scipy's `solve_ivp` (RK45 and LSODA, the
same equations and stop as `benchmarks/dynamics.py`, `--scipy-problems` per family): the
ratio relax throughput / scipy's problems per CPU-second.

With `--solvers`, the cutoff families are also timed with each named solver at the
largest batch (the default picks Kvaerno5 for them; an explicit solver may win where a
step's fixed costs dominate). Written for a GPU, runs anywhere: on a CPU use small
`--batches`. The numbers are written to `--out` after every measurement, so an interrupted
run keeps what it measured.

    python benchmarks/relax_throughput.py --batches 1024 4096 16384 65536 --out gpu.json
    python benchmarks/relax_throughput.py --batches 64 256 --repeats 2   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import fisherdyn as fd  # noqa: E402
from dynamics import (  # noqa: E402
    ATOL,
    DAMPING,
    FAMILIES,
    FIXED_POINT_TOL,
    MASS,
    RTOL,
    TOL,
    T,
    loadavg,
    problems,
    scipy_relax,
)

SATURATION = 0.9  # within 10 % of the largest throughput


def relax_call(entropy, Z, solver=None):
    # throw=False: a problem that fails is counted, and the run goes on to the next size
    sol = fd.relax(entropy, Z, T, mass=MASS, damping=DAMPING, rtol=RTOL, atol=ATOL, tol=TOL,
                   solver=solver, throw=False)
    return jax.block_until_ready(sol)


def measure(entropy, B, N, repeats, solver=None):
    """First call, median compiled call, steps and the fixed point's error for B problems."""
    Z = jax.device_put(problems(B, N))
    start = time.perf_counter()
    sol = relax_call(entropy, Z, solver)
    first = time.perf_counter() - start
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        relax_call(entropy, Z, solver)
        walls.append(time.perf_counter() - start)
    wall = float(np.median(walls))
    exact = np.asarray(fd.stationary(entropy, Z, T))
    names = np.asarray(sol.result_name)
    failed = {str(n): int(np.sum(names == n)) for n in np.unique(names) if n != "successful"}
    good = names == "successful"
    err = float(np.max(np.abs(np.asarray(sol.rho) - exact)[good], initial=0.0))
    ok = not failed and err <= FIXED_POINT_TOL
    steps = np.asarray(sol.stats["num_steps"])
    return dict(batch=B, first_call_s=first, run_s=wall, runs_s=walls,
                relaxations_per_s=B / wall, median_steps=float(np.median(steps)),
                max_err_vs_stationary=err, failed=failed, ok=ok)


def scipy_rate(h, N, n):
    """scipy's problems per CPU-second on one host core, RK45 and LSODA."""
    Z = problems(n, N, seed=7)
    out = {}
    for method in ("RK45", "LSODA"):
        start = time.process_time()
        for z in Z:
            scipy_relax(h, z, method)
        out[method] = n / (time.process_time() - start)
    return out


def saturating(rows):
    """The smallest batch within 10 % of the largest throughput; None where that is the
    largest batch measured and the one before it is not within 10 % (still growing)."""
    best = max(r["relaxations_per_s"] for r in rows)
    batch = min(r["batch"] for r in rows if r["relaxations_per_s"] >= SATURATION * best)
    return None if batch == max(r["batch"] for r in rows) and len(rows) > 1 else batch


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="*", default=None, help="family names, e.g. Shannon")
    p.add_argument("--scipy-problems", type=int, default=8)
    p.add_argument("--solvers", nargs="*", default=[],
                   help="also time the cutoff families with these solvers (largest batch)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    import diffrax
    import jaxlib

    jax.print_environment_info()
    dev = jax.devices()[0]
    out = dict(device=f"{dev.platform}: {dev.device_kind}", jax=jax.__version__,
               jaxlib=jaxlib.__version__, diffrax=diffrax.__version__,
               host=platform.processor() or platform.machine(),
               keys=args.keys, rtol=RTOL, atol=ATOL, tol=TOL, loadavg_before=loadavg(),
               families={})
    print(f"device {out['device']}, JAX {jax.__version__}, diffrax {diffrax.__version__}; "
          f"N = {args.keys}, float64, rtol {RTOL:g}; load average {out['loadavg_before']}")

    def save():
        if args.out is not None:
            args.out.write_text(json.dumps(out, indent=1))

    failed = []
    for name, entropy, h, _, _ in FAMILIES:
        if args.only and name not in args.only:
            continue
        fam = out["families"][name] = dict(rows=[])
        fam["scipy_per_cpu_s"] = scipy_rate(h, args.keys, args.scipy_problems)
        print(f"\n{name}: scipy on one host core, problems per CPU-second: "
              + ", ".join(f"{m} {v:.1f}" for m, v in fam["scipy_per_cpu_s"].items()))
        for B in args.batches:
            row = measure(entropy, B, args.keys, args.repeats)
            fam["rows"].append(row)
            rk45, lsoda = (row["relaxations_per_s"] / fam["scipy_per_cpu_s"][m]
                           for m in ("RK45", "LSODA"))
            print(f"  B = {B:6d}: {row['run_s']:8.4f} s, {row['relaxations_per_s']:10.0f} "
                  f"relaxations/s ({rk45:7.0f}x RK45, {lsoda:6.0f}x LSODA per core); "
                  f"first call {row['first_call_s']:.1f} s; steps {row['median_steps']:.0f}; "
                  f"max |rho - stationary| {row['max_err_vs_stationary']:.1e}"
                  + ("" if row["ok"] else f"  FAILED {row['failed']}"), flush=True)
            if not row["ok"]:
                failed.append(f"{name} B={B}")
            save()
        fam["saturating_batch"] = saturating(fam["rows"])
        sat = fam["saturating_batch"]
        print("  saturating batch (within 10 % of the largest throughput): "
              + (str(sat) if sat else f"not reached up to B = {max(args.batches)}"))
        save()

    for name, entropy, _, _, _ in FAMILIES:
        if not args.solvers or not entropy.may_have_cutoff or name not in out["families"]:
            continue
        B = max(args.batches)
        fam = out["families"][name]
        fam["solvers"] = {}
        for solver in args.solvers:
            row = measure(entropy, B, args.keys, args.repeats, solver=solver)
            fam["solvers"][solver] = row
            print(f"  {name} with {solver}, B = {B}: {row['run_s']:.4f} s, "
                  f"{row['relaxations_per_s']:.0f} relaxations/s, steps "
                  f"{row['median_steps']:.0f}, first call {row['first_call_s']:.1f} s, max err "
                  f"{row['max_err_vs_stationary']:.1e}"
                  + ("" if row["ok"] else f"  FAILED {row['failed']}"),
                  flush=True)
            if not row["ok"]:
                failed.append(f"{name} {solver}")
            save()

    out["loadavg_after"] = loadavg()
    print(f"\nload average before {out['loadavg_before']}, after {out['loadavg_after']}")
    save()
    if failed:
        raise SystemExit("relax did not reach the stationary fixed point: " + ", ".join(failed))


if __name__ == "__main__":
    main()
