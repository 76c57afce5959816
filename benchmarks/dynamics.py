"""Benchmark: relaxing a batch of attention problems to steady state, against scipy.

`fisherdyn.relax` on a batch of problems (one compiled call) against a Python loop of
`scipy.integrate.solve_ivp`, RK45 and LSODA, on the same sphere-chart equations
(docs/math.md §6, written in numpy here with each family's h from its closed form), the same
rtol / atol, the same uniform start at rest and the same steady-state stop (max |f| < tol, a
terminal event). Families and sizes: Shannon at B = 1024, Tsallis(1.5) and Kaniadakis(0.3)
at B = 256, all with N = 64 keys, m = 1, gamma = 2, T = 1, float64.

The two sides are timed interleaved in one process, so that the machine's load falls on
both alike: each round runs scipy on a fresh subset of the problems (both methods), then
`relax` on the whole batch. A round's ratio is scipy's time per problem x B over relax's
time; the printed ratio is the median over rounds, in wall time and in CPU time
(`time.process_time`, all threads of the process). CPU time is the primary number: it does
not count the time other jobs take the cores away. `/proc/loadavg` is printed before and
after, with a warning when the load was above 1.

Printed first (unless `--no-field`): the CPU time of one evaluation of the sphere chart's
vector field on a block of 64 problems (what `relax` integrates as one system), per key,
beside the cost of the elementary operations it is built from.

Checked on every run: every relax fixed point equals `fisherdyn.stationary` to 1e-10, and
scipy's end point agrees with it to the steady-state tolerance. Printed as well: the first
call's compilation time and, unless `--no-scaling`, the cost exponents in N and in B.
Writes the numbers to `benchmarks/dynamics.json` (not in `--quick` mode).

    python benchmarks/dynamics.py               # full run (several minutes on 2 cores)
    python benchmarks/dynamics.py --no-scaling  # the three families only
    python benchmarks/dynamics.py --quick       # small sizes, a smoke run
    python benchmarks/dynamics.py --pin         # the whole process on one core

On a CPU with few cores XLA spreads a block's small kernels over all of them, which costs
more CPU time (and here more wall time) than it saves: `--pin` measures the process
confined to one core, as `taskset -c 0` would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# `--pin`: the whole process on one core, set before JAX creates its CPU client, whose
# thread pool is sized by the process's affinity
if "--pin" in sys.argv[1:] and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.integrate  # noqa: E402

import fisherdyn as fd  # noqa: E402

RTOL, ATOL, TOL = 1e-8, 1e-10, 1e-6
T, MASS, DAMPING = 1.0, 1.0, 2.0  # Shannon: critical damping is 2 sqrt(m T) = 2
A = DAMPING / (2 * MASS) + np.sqrt(T / MASS)  # the return rate to the sphere
FIXED_POINT_TOL = 1e-10
# the targets the performance page states (CPU-time ratios, compiled, on a quiet machine)
TARGET_RK45, TARGET_LSODA = 40.0, 20.0


def _shannon_h(rho):
    return -(1.0 + np.log(rho))


def _tsallis_h(q):
    return lambda rho: -q / (q - 1.0) * rho ** (q - 1.0)


def _kaniadakis_h(k):
    return lambda rho: -((1 + k) * rho**k - (1 - k) * rho ** (-k)) / (2 * k)


# name, fisherdyn entropy, numpy h(rho) on rho > 0, batch (full, quick), keys (full, quick)
FAMILIES = [
    ("Shannon", fd.Shannon(), _shannon_h, (1024, 64), (64, 16)),
    ("Tsallis(1.5)", fd.Tsallis(1.5), _tsallis_h(1.5), (256, 64), (32, 16)),
    ("Kaniadakis(0.3)", fd.Kaniadakis(0.3), _kaniadakis_h(0.3), (256, 64), (32, 16)),
]


def problems(batch, n, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, n))


def relax_batch(entropy, Z):
    sol = fd.relax(entropy, Z, T, mass=MASS, damping=DAMPING, rtol=RTOL, atol=ATOL, tol=TOL)
    return jax.block_until_ready(sol)


def scipy_relax(h, z, method):
    """The sphere chart of docs/math.md §6 (the library's `SphereCoordinates`) for the family
    with entropy gradient `h`, uniform start at rest, until max|f| < TOL, by
    `solve_ivp(method=...)` at the same rtol/atol."""
    n = z.size
    E = -z

    def f(t, y):
        x, v = y[:n], y[n:]
        rho = x * x
        pos = rho > 0
        g = np.where(pos, E - T * h(np.where(pos, rho, 1.0)), E)
        # the multiplier on the sphere plus a critically damped return to it (rate a), as
        # in the library: without it the cutoff families drift off the sphere
        c, xv = np.sum(rho), np.sum(x * v)
        lam = (np.sum(rho * g) - 2 * MASS * np.sum(v * v) + (2 * DAMPING - 4 * MASS * A) * xv
               - MASS * A**2 * (c - 1)) / c
        acc = (2 * x * (lam - g) - 4 * DAMPING * v) / (4 * MASS)
        return np.concatenate([v, acc])

    def steady(t, y):
        return np.max(np.abs(f(t, y))) - TOL

    steady.terminal = True
    steady.direction = -1
    y0 = np.concatenate([np.full(n, 1 / np.sqrt(n)), np.zeros(n)])
    sol = scipy.integrate.solve_ivp(
        f, (0.0, 1e5), y0, method=method, rtol=RTOL, atol=ATOL, events=steady
    )
    if sol.status != 1:
        raise RuntimeError(f"scipy {method} did not reach the steady state: {sol.message}")
    x = sol.y[:n, -1]
    return x * x / np.sum(x * x)


def loadavg():
    """The 1-, 5- and 15-minute load averages (None where /proc/loadavg is missing)."""
    try:
        return tuple(float(v) for v in Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return None


def clocks():
    return time.perf_counter(), time.process_time()


def since(start):
    w, c = clocks()
    return w - start[0], c - start[1]


def bench_family(name, entropy, h, B, N, rounds, n_scipy):
    """Interleaved rounds of scipy (both methods, a fresh subset each round) and relax."""
    Z = problems(B, N)
    start = clocks()
    sol = relax_batch(entropy, Z)
    first = since(start)

    exact = np.asarray(fd.stationary(entropy, Z, T))
    fp_err = float(np.max(np.abs(np.asarray(sol.rho) - exact)))
    ok = bool(np.all(np.asarray(sol.result_name) == "successful"))
    steps = np.asarray(sol.stats["num_steps"])
    t_end = np.asarray(sol.t)

    methods = ("RK45", "LSODA")
    relax_times, scipy_times = [], {m: [] for m in methods}
    scipy_err = {m: 0.0 for m in methods}
    for r in range(rounds):
        idx = [(r * n_scipy + i) % B for i in range(n_scipy)]
        for m in methods:
            start = clocks()
            ends = [scipy_relax(h, Z[i], m) for i in idx]
            wall, cpu = since(start)
            scipy_times[m].append((wall / n_scipy, cpu / n_scipy))
            scipy_err[m] = max(scipy_err[m], float(np.max(np.abs(np.asarray(ends) - exact[idx]))))
        start = clocks()
        relax_batch(entropy, Z)
        relax_times.append(since(start))

    run_wall = float(np.median([w for w, _ in relax_times]))
    run_cpu = float(np.median([c for _, c in relax_times]))
    ratios = {}
    for m in methods:
        wall = [s[0] * B / rt[0] for s, rt in zip(scipy_times[m], relax_times)]
        cpu = [s[1] * B / rt[1] for s, rt in zip(scipy_times[m], relax_times)]
        ratios[m] = dict(
            wall=float(np.median(wall)),
            cpu=float(np.median(cpu)),
            per_problem_ms=1e3 * float(np.median([s[0] for s in scipy_times[m]])),
            per_problem_cpu_ms=1e3 * float(np.median([s[1] for s in scipy_times[m]])),
        )
    compile_wall = first[0] - run_wall
    compile_cpu = first[1] - run_cpu

    print(f"\n{name}: B={B} problems, N={N} keys, {rounds} interleaved rounds, "
          f"scipy on {n_scipy} problems per round")
    print(f"  relax steps per problem: median {np.median(steps):.0f}, max {steps.max()}; "
          f"steady state at t: median {np.median(t_end):.0f}, max {t_end.max():.0f}")
    print(f"  max |rho_relax - stationary| = {fp_err:.1e}  (must be <= {FIXED_POINT_TOL:.0e}; "
          f"{'ok' if fp_err <= FIXED_POINT_TOL and ok else 'FAILED'});  max |rho_scipy - "
          f"stationary|: RK45 {scipy_err['RK45']:.1e}, LSODA {scipy_err['LSODA']:.1e}")
    print(f"  first call: {first[0]:.2f} s (compilation ~{compile_wall:.2f} s wall, "
          f"{compile_cpu:.2f} s CPU)")
    print(f"  relax, compiled: {run_wall:.3f} s wall, {run_cpu:.3f} s CPU "
          f"({1e3 * run_wall / B:.2f} ms/problem)")
    for m, target in (("RK45", TARGET_RK45), ("LSODA", TARGET_LSODA)):
        r = ratios[m]
        print(f"  vs scipy {m:5s} ({r['per_problem_ms']:6.1f} ms/problem): "
              f"{r['cpu']:6.1f}x CPU time, {r['wall']:6.1f}x wall   (target >= {target:.0f}x CPU)")
    if fp_err > FIXED_POINT_TOL or not ok:
        raise SystemExit(f"{name}: relax did not reach the stationary fixed point")
    return dict(
        batch=B, keys=N, rounds=rounds, scipy_problems_per_round=n_scipy,
        first_call_s=first[0], compile_s=compile_wall, compile_cpu_s=compile_cpu,
        run_s=run_wall, run_cpu_s=run_cpu, median_steps=float(np.median(steps)),
        median_t=float(np.median(t_end)), max_err_vs_stationary=fp_err,
        max_err_scipy_vs_stationary=scipy_err, vs_scipy=ratios,
    )


def timed_both(fn, *args, repeat=3):
    """Best wall time and best CPU time of `repeat` calls."""
    best, best_cpu = np.inf, np.inf
    for _ in range(repeat):
        start = clocks()
        fn(*args)
        wall, cpu = since(start)
        best, best_cpu = min(best, wall), min(best_cpu, cpu)
    return best, best_cpu


def scaling(quick):
    """Cost exponents of a Shannon relax in N (at fixed B) and in B (at N = 64)."""
    Ns = [8, 16] if quick else [16, 64, 256, 1024]
    Bs = [16, 32] if quick else [128, 256, 512, 1024]
    B_scan, N = (16, 16) if quick else (256, 64)
    out = {}
    for axis, sizes in (("N", Ns), ("B", Bs)):
        walls, cpus = [], []
        for s in sizes:
            Z = problems(B_scan, s, seed=1) if axis == "N" else problems(s, N, seed=2)
            relax_batch(fd.Shannon(), Z)
            wall, cpu = timed_both(relax_batch, fd.Shannon(), Z)
            walls.append(wall)
            cpus.append(cpu)
        slope = np.polyfit(np.log(sizes), np.log(walls), 1)[0]
        slope_cpu = np.polyfit(np.log(sizes), np.log(cpus), 1)[0]
        at = f"B={B_scan}" if axis == "N" else f"N={N}"
        print(f"  Shannon cost vs {axis} ({at}): "
              + ", ".join(f"{axis}={s}: {w:.3f}s" for s, w in zip(sizes, walls))
              + f" -> exponent {slope:.2f} (CPU time: exponent {slope_cpu:.2f})")
        out[axis] = dict(sizes=sizes, wall=walls, cpu=cpus, exponent=slope,
                         exponent_cpu=slope_cpu)
    return out


FIELD_BLOCK = 64  # relax integrates a batch in blocks of 64 problems on the CPU
FIELD_EVALS = 1000


def per_element_ns(fn, x, *args, evals=FIELD_EVALS):
    """CPU ns per element of `x` of one `fn(x, *args)`, chained `evals` times in a compiled
    loop (the best of 5 runs)."""

    @jax.jit
    def loop(x, *args):
        def body(i, x):
            return jax.tree.map(lambda a, d: a + 1e-12 * d, x, fn(x, *args))
        return jax.lax.fori_loop(0, evals, body, x)

    jax.block_until_ready(loop(x, *args))
    best = np.inf
    for _ in range(5):
        start = clocks()
        jax.block_until_ready(loop(x, *args))
        best = min(best, since(start)[1])
    size = sum(leaf.size for leaf in jax.tree.leaves(x))
    return 1e9 * best / evals / size


def field_costs(quick):
    """One evaluation of the sphere chart's field on a block of problems, per key, beside
    the elementary operations it is made of (the arithmetic floor is a few flops per key)."""
    n = 16 if quick else 64
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.uniform(0.01, 1.0, (FIELD_BLOCK, 64)))
    out = dict(block=FIELD_BLOCK, keys=n, ops={}, field={})
    for op, fn in (("exp", lambda a, p: jnp.exp(-a)),
                   ("log", lambda a, p: jnp.log(a)),
                   ("power (traced exponent)", lambda a, p: a**p)):
        out["ops"][op] = per_element_ns(fn, x, jnp.asarray(0.5))
    coords = fd.SphereCoordinates()
    for name, entropy, _, _, _ in FAMILIES:
        Z = jnp.asarray(problems(FIELD_BLOCK, n))
        rho = jax.nn.softmax(Z, -1)
        y = (jnp.sqrt(rho), 0.01 * jnp.asarray(rng.normal(size=(FIELD_BLOCK, n))))

        def field(y, entropy, Z):
            # one problem per row, as relax evaluates a block
            def one(y, z):
                return coords.vector_field(None, y, fd.FisherSystem(entropy, z, T, MASS, DAMPING))
            return jax.vmap(one)(y, Z)

        # (the entropy's parameters are traced, as in relax, after `for_tracing`)
        out["field"][name] = 2 * per_element_ns(field, y, entropy.for_tracing(), Z)
    print(f"  one field evaluation, block of {FIELD_BLOCK} x {n} keys, CPU ns per key: "
          + ", ".join(f"{k} {v:.1f}" for k, v in out["field"].items()))
    print("  elementary operations, CPU ns per element: "
          + ", ".join(f"{k} {v:.2f}" for k, v in out["ops"].items()))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per family (default 3; --quick 2)")
    parser.add_argument("--scipy-problems", type=int, default=None,
                        help="scipy problems per round and method (default 12; --quick 4)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="family names to run (default all), e.g. Shannon Tsallis(1.5)")
    parser.add_argument("--pin", action="store_true",
                        help="run the whole process (scipy and relax) on one core")
    parser.add_argument("--out", type=Path, default=None,
                        help="default benchmarks/dynamics.json (--pin: dynamics_pinned.json)")
    parser.add_argument("--no-field", action="store_true",
                        help="skip the cost of one vector-field evaluation")
    parser.add_argument("--no-scaling", action="store_true",
                        help="skip the cost-vs-N and cost-vs-B fits (each size compiles anew)")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    n_scipy = args.scipy_problems or (4 if args.quick else 12)

    if args.out is None:
        stem = "dynamics_pinned" if args.pin else "dynamics"
        args.out = Path(__file__).with_name(stem + ".json")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    dev = jax.devices()[0]
    print(f"device: {dev.platform} ({dev.device_kind}), {jax.device_count()} device(s), "
          f"{os.cpu_count()} CPU(s), this process on cores {cores}; jax {jax.__version__}")
    print(f"m={MASS} gamma={DAMPING} T={T}, rtol={RTOL}, atol={ATOL}, steady state at "
          f"max|f| < {TOL}, float64; targets (CPU time, compiled): >= {TARGET_RK45:.0f}x "
          f"scipy RK45, >= {TARGET_LSODA:.0f}x LSODA")
    load_before = loadavg()
    print(f"load average before: {load_before}")

    results = dict(device=f"{dev.platform} ({dev.device_kind})", jax=jax.__version__,
                   cores=cores, pinned=args.pin,
                   rtol=RTOL, atol=ATOL, tol=TOL, load_before=load_before, families={})
    if not args.no_field:
        print()
        results["field"] = field_costs(args.quick)
    for name, entropy, h, full, small in FAMILIES:
        if args.only and name not in args.only:
            continue
        B, N = small if args.quick else full
        results["families"][name] = bench_family(name, entropy, h, B, N, rounds, n_scipy)
    if not args.no_scaling:
        print()
        results["scaling"] = scaling(args.quick)

    load_after = loadavg()
    results["load_after"] = load_after
    print(f"\nload average after: {load_after}")
    loads = [v[0] for v in (load_before, load_after) if v is not None]
    if loads and max(loads) > 1:
        print("WARNING: the load average was above 1: other jobs shared the cores; compare "
              "the CPU-time ratios, and rerun on a quiet machine for the wall-time ones")
    if not args.quick:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
