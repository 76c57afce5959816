"""Benchmark: relaxing a batch of attention problems to steady state.

`fisherdyn.relax` on B = 1024 problems with N = 64 keys (one vmapped, compiled call), against
a Python loop of `scipy.integrate.solve_ivp` (RK45, the same rtol/atol, the same sphere-chart
equations of docs/math.md §6 written in numpy here, the same steady-state stop as a terminal
event). The scipy loop runs on a subset of the problems and is extrapolated linearly (a loop
costs the same per problem by construction); the subset size is printed.

Prints: compile time of the first `relax` call, run time once compiled, the scipy time, the
speed-up ratios with and without compilation, and the fitted exponents of the cost in N and
in B. Writes the numbers to `benchmarks/dynamics.json`.

    python benchmarks/dynamics.py            # full run (a few minutes on 2 cores)
    python benchmarks/dynamics.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import scipy.integrate  # noqa: E402

import fisherdyn as fd  # noqa: E402

RTOL, ATOL, TOL = 1e-8, 1e-10, 1e-6
T, MASS, DAMPING = 1.0, 1.0, 2.0  # Shannon: critical damping is 2 sqrt(m T) = 2


def problems(batch, n, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, n))


def relax_batch(Z):
    sol = fd.relax(fd.Shannon(), Z, T, mass=MASS, damping=DAMPING, rtol=RTOL, atol=ATOL, tol=TOL)
    return jax.block_until_ready(sol)


def scipy_relax(z):
    """The sphere chart of docs/math.md §6 (Shannon: h = -(1 + ln rho)), uniform start at rest,
    until max|f| < TOL, by solve_ivp RK45 at the same rtol/atol."""
    n = z.size
    E = -z

    def f(t, y):
        x, v = y[:n], y[n:]
        rho = x * x
        g = E + T * (1.0 + np.log(rho))
        lam = np.sum(rho * g) - 2 * MASS * np.sum(v * v)
        acc = (2 * x * (lam - g) - 4 * DAMPING * v) / (4 * MASS)
        return np.concatenate([v, acc])

    def steady(t, y):
        return np.max(np.abs(f(t, y))) - TOL

    steady.terminal = True
    steady.direction = -1
    y0 = np.concatenate([np.full(n, 1 / np.sqrt(n)), np.zeros(n)])
    sol = scipy.integrate.solve_ivp(
        f, (0.0, 1e4), y0, method="RK45", rtol=RTOL, atol=ATOL, events=steady
    )
    assert sol.status == 1, "scipy did not reach the steady state"
    x = sol.y[:n, -1]
    return x * x / np.sum(x * x)


def timed(fn, *args, repeat=3):
    """Best wall time of `repeat` calls."""
    return timed_both(fn, *args, repeat=repeat)[0]


def timed_both(fn, *args, repeat=3):
    """Best wall time and best CPU time of `repeat` calls (CPU time is far less sensitive to
    other jobs on a shared machine: the scaling fits are printed for both)."""
    best, best_cpu = np.inf, np.inf
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best, best_cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--scipy-problems",
        type=int,
        default=48,
        help="problems in the scipy loop (extrapolated to the batch)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    parser.add_argument("--no-scaling", action="store_true",
                        help="skip the cost-vs-N and cost-vs-B fits (each size compiles anew)")
    args = parser.parse_args()
    dev = jax.devices()[0]
    print(f"device: {dev.platform} ({dev.device_kind}), {jax.device_count()} device(s); "
          f"jax {jax.__version__}")
    B, N = (64, 16) if args.quick else (1024, 64)
    n_scipy = min(args.scipy_problems, B) if not args.quick else 8
    Z = problems(B, N)

    t0, c0 = time.perf_counter(), time.process_time()
    sol = relax_batch(Z)
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    c0 = time.process_time()
    run = timed(relax_batch, Z)
    run_cpu = (time.process_time() - c0) / 3
    compile_s = first - run
    compile_cpu = first_cpu - run_cpu
    steps = np.asarray(sol.stats["num_steps"])
    err = np.max(np.abs(np.asarray(sol.rho) - np.asarray(jax.nn.softmax(Z / T, -1))))

    t0, c0 = time.perf_counter(), time.process_time()
    ref = [scipy_relax(z) for z in Z[:n_scipy]]
    scipy_per = (time.perf_counter() - t0) / n_scipy
    scipy_per_cpu = (time.process_time() - c0) / n_scipy
    scipy_total = scipy_per * B
    ref_err = np.max(np.abs(np.asarray(ref) - np.asarray(sol.rho)[:n_scipy]))

    print(
        f"relax: B={B} problems, N={N} keys, Shannon T={T} m={MASS} gamma={DAMPING}, "
        f"rtol={RTOL}, atol={ATOL}, steady state at max|f| < {TOL}"
    )
    print(f"  integration steps per problem: median {np.median(steps):.0f}, max {steps.max()}")
    print(f"  max |rho - softmax(z/T)| = {err:.1e};  max |rho_jax - rho_scipy| = {ref_err:.1e}")
    print(
        f"  first call (compile + run): {first:8.2f} s   (compile ~{compile_s:.2f} s wall, "
        f"{compile_cpu:.2f} s CPU; target <= 15 s)"
    )
    print(f"  compiled run:               {run:8.3f} s")
    print(
        f"  scipy solve_ivp loop:       {scipy_total:8.2f} s   ({scipy_per * 1e3:.1f} ms/problem, "
        f"measured on {n_scipy}, extrapolated to {B})"
    )
    print(
        f"  speed-up once compiled:     {scipy_total / run:8.1f} x   (target >= 100; "
        f"CPU-time ratio {scipy_per_cpu * B / run_cpu:.1f} x)"
    )
    print(
        f"  speed-up incl. compilation: {scipy_total / first:8.1f} x   (target >= 10; "
        f"CPU-time ratio {scipy_per_cpu * B / first_cpu:.1f} x)"
    )

    results = dict(
        device=f"{dev.platform} ({dev.device_kind})",
        batch=B,
        keys=N,
        rtol=RTOL,
        atol=ATOL,
        tol=TOL,
        first_call_s=first,
        compile_s=compile_s,
        compile_cpu_s=compile_cpu,
        run_cpu_s=run_cpu,
        scipy_per_problem_cpu_s=scipy_per_cpu,
        run_s=run,
        scipy_total_s=scipy_total,
        scipy_per_problem_s=scipy_per,
        scipy_problems_measured=n_scipy,
        speedup_compiled=scipy_total / run,
        speedup_with_compile=scipy_total / first,
        max_err_vs_softmax=float(err),
        max_err_vs_scipy=float(ref_err),
        median_steps=float(np.median(steps)),
    )
    if args.no_scaling:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")
        return

    # scaling in N (at B) and in B (at N)
    # N up to 1024: a polish that built the N x N Newton matrix showed only beyond N ~ 256
    Ns = [8, 16] if args.quick else [16, 64, 256, 1024]
    Bs = [16, 32] if args.quick else [128, 256, 512, 1024]
    B_scan = 16 if args.quick else 256
    cost_N, cpu_N = [], []
    for n in Ns:
        Zn = problems(B_scan, n, seed=1)
        relax_batch(Zn)
        wall, cpu = timed_both(relax_batch, Zn)
        cost_N.append(wall)
        cpu_N.append(cpu)
    cost_B, cpu_B = [], []
    for b in Bs:
        Zb = problems(b, N, seed=2)
        relax_batch(Zb)
        wall, cpu = timed_both(relax_batch, Zb)
        cost_B.append(wall)
        cpu_B.append(cpu)
    slope_N = np.polyfit(np.log(Ns), np.log(cost_N), 1)[0]
    slope_B = np.polyfit(np.log(Bs), np.log(cost_B), 1)[0]
    slope_N_cpu = np.polyfit(np.log(Ns), np.log(cpu_N), 1)[0]
    slope_B_cpu = np.polyfit(np.log(Bs), np.log(cpu_B), 1)[0]
    print(
        "  cost vs N (B=%d): %s -> exponent %.2f (CPU time: exponent %.2f)"
        % (B_scan, ", ".join(f"N={n}: {c:.3f}s" for n, c in zip(Ns, cost_N)), slope_N, slope_N_cpu)
    )
    print(
        "  cost vs B (N=%d): %s -> exponent %.2f (CPU time: exponent %.2f)"
        % (N, ", ".join(f"B={b}: {c:.3f}s" for b, c in zip(Bs, cost_B)), slope_B, slope_B_cpu)
    )

    results.update(
        cost_vs_N=dict(zip(map(str, Ns), cost_N)),
        cost_vs_B=dict(zip(map(str, Bs), cost_B)),
        exponent_N=slope_N,
        exponent_B=slope_B,
        cpu_cost_vs_N=dict(zip(map(str, Ns), cpu_N)),
        cpu_cost_vs_B=dict(zip(map(str, Bs), cpu_B)),
        exponent_N_cpu=slope_N_cpu,
        exponent_B_cpu=slope_B_cpu,
    )
    if not args.quick:
        args.out.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
