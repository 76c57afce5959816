"""Benchmark: `relax` of one batch with two solvers, side by side in one process.

For each round and each solver, the compilation cache is cleared (`jax.clear_caches()`),
then `relax` is called twice: the first call (compilation plus run) and the compiled run.
The solvers alternate, so the machine's load falls on both alike. Printed per solver: the
first call, the compiled run (wall and CPU time), their difference (about the compilation),
the steps per problem and the CPU time per step of a block of problems; then the median
ratio of the compiled runs' CPU times. The default compares Tsit5 with Kvaerno5 (the stiff
path of the cutoff families) on 256 Tsallis(1.5) problems of 64 keys, with the settings of
`benchmarks/dynamics.py` (m = 1, gamma = 2, T = 1, rtol 1e-8, atol 1e-10, steady state at
max|f| < 1e-6, float64).

    python benchmarks/relax_solvers.py
    python benchmarks/relax_solvers.py --family renyi:2 --solvers tsit5 kvaerno5
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fisherdyn as fd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dynamics import ATOL, DAMPING, MASS, RTOL, TOL, T, clocks, loadavg, problems, since  # noqa: E402,I001

BLOCK = 64  # relax integrates a batch in blocks of this many problems (CPU)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="tsallis:1.5",
                        help="an entropy as the CLI writes it, e.g. renyi:2")
    parser.add_argument("--solvers", nargs=2, default=["tsit5", "kvaerno5"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    entropy = fd.parse_entropy(args.family)
    Z = jnp.asarray(problems(args.batch, args.keys))
    before = loadavg()
    print(f"jax {jax.__version__}; {entropy}, B={args.batch}, N={args.keys}; load average "
          f"before: {before}")

    def call(solver):
        sol = fd.relax(entropy, Z, T, mass=MASS, damping=DAMPING, rtol=RTOL, atol=ATOL,
                       tol=TOL, solver=solver)
        return jax.block_until_ready(sol)

    out = {s: [] for s in args.solvers}
    for r in range(args.rounds):
        for s in args.solvers:
            jax.clear_caches()
            start = clocks()
            call(s)
            first = since(start)
            start = clocks()
            sol = call(s)
            run = since(start)
            steps = int(np.median(np.asarray(sol.stats["num_steps"])))
            out[s].append((first, run, steps))
            print(f"round {r + 1} {s:>9}: first call {first[0]:.2f} s, compiled {1e3 * run[0]:.1f} ms "
                  f"wall / {1e3 * run[1]:.1f} ms CPU, first - compiled {first[0] - run[0]:.2f} "
                  f"s; {steps} steps, {1e3 * run[1] / steps / -(-args.batch // BLOCK):.3f} ms "
                  "CPU per block step", flush=True)
    a, b = args.solvers
    ratio = np.median([ra[1][1] / rb[1][1] for ra, rb in zip(out[a], out[b])])
    print(f"compiled CPU time {a} / {b}: median {ratio:.2f}x")
    after = loadavg()
    print(f"load average after: {after}")
    if max(before[0], after[0]) > 1:
        print("WARNING: the load average was above 1: rerun on a quiet machine")


if __name__ == "__main__":
    main()
