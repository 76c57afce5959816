"""Time `relaxation_spectrum` against the number of keys N.

    python benchmarks/spectrum.py [--sizes 1000 5000 20000 100000] [--family kaniadakis:0.3]
                                  [--dense-up-to 5000]

For each N: one row of standard-normal scores at T = 1, the fixed point given (so only the
spectrum is timed), float64. The first call compiles; the next is timed, wall and CPU
time of this process side by side (CPU above wall means both cores worked). With
`--dense-up-to`, the dense eigendecomposition of the tangent stiffness (what the spectrum's
`modes` still costs) is timed too at those sizes. Prints the cost exponent fitted to the
last sizes and the load average before and after: numbers from a machine with load above
1 are not the machine's own.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import fisherdyn as fd

jax.config.update("jax_enable_x64", True)


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().strip()


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000, 100000])
    ap.add_argument("--family", default="kaniadakis:0.3")
    ap.add_argument("--dense-up-to", type=int, default=0)
    args = ap.parse_args()
    entropy = fd.parse_entropy(args.family)
    print(f"load average before: {loadavg()}")
    print(f"relaxation_spectrum, {args.family}, float64, jax {jax.__version__}")
    print(f"{'N':>8} {'first call s':>13} {'wall s':>9} {'CPU s':>9} {'slowest rate':>13}"
          f"{'  dense wall s':>15}")
    walls = []
    for n in args.sizes:
        z = jnp.asarray(np.random.default_rng(n).normal(size=n))
        rho = fd.stationary(entropy, z, 1.0)

        def spec(z=z, rho=rho):
            return fd.relaxation_spectrum(entropy, z, 1.0, mass=1.0, damping=1.0,
                                          rho=rho).omega2

        first, _ = timed(spec)
        wall, cpu = timed(spec)
        walls.append(wall)
        slow = float(jnp.min(spec()))
        dense = ""
        if n <= args.dense_up_to:
            # the mode shapes (`modes`) come from the dense eigendecomposition of the stiffness
            f = jax.jit(lambda r, s: fd.relaxation_spectrum(entropy, s, 1.0, mass=1.0,
                                                            damping=1.0, rho=r).modes)
            jax.block_until_ready(f(rho, z))
            dense = f"{timed(lambda: f(rho, z))[0]:15.3f}"
        print(f"{n:>8} {first:13.3f} {wall:9.3f} {cpu:9.3f} {slow:13.6g}{dense}", flush=True)
    if len(walls) >= 2:
        k = min(3, len(walls))
        slope = np.polyfit(np.log(args.sizes[-k:]), np.log(walls[-k:]), 1)[0]
        print(f"fitted exponent (wall time ~ N^p over the last {k} sizes): p = {slope:.2f}")
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
