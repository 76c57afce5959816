"""`relax` with different numbers of problems per block integrated as one system (CPU).

    python benchmarks/relax_blocks.py --family "Kaniadakis(0.3)" --blocks 64 256 [--rounds 7]

One batch of the family at the settings of `benchmarks/dynamics.py` (Shannon 1024 x 64,
the others 256 x 64), compiled ahead once per block size (the caches cleared in between),
then the sizes alternately over the rounds; prints the median CPU and wall time of each and
the medians over rounds of its ratio to the first size, with the load average before and
after. The block size is an internal setting (`fisherdyn._dynamics._batching`; by default
64, and 256 for an explicit solver on more than one core), set here before each
compilation. Run it pinned (`taskset -c 0`) to see one core.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from dynamics import ATOL, DAMPING, FAMILIES, MASS, RTOL, TOL, T, problems

from fisherdyn import relax
from fisherdyn._dynamics import _batching


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=[f[0] for f in FAMILIES], default="Kaniadakis(0.3)")
    p.add_argument("--blocks", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    jax.config.update("jax_enable_x64", True)
    _, entropy, _, (batch, n), _ = next(f for f in FAMILIES if f[0] == args.family)
    scores = jnp.asarray(problems(batch, n))
    print(f"{args.family}: {batch} x {n}; load average before: "
          f"{open('/proc/loadavg').read().split()[:3]}")
    compiled = {}
    for size in args.blocks:
        _batching._CPU_SYSTEM_BLOCK = _batching._CPU_SYSTEM_BLOCK_MULTICORE = size
        jax.clear_caches()  # the block size is read when relax is traced
        f = jax.jit(lambda z: relax(entropy, z, T, mass=MASS, damping=DAMPING, rtol=RTOL,
                                    atol=ATOL, tol=TOL))
        compiled[size] = f.lower(scores).compile()
    ref = compiled[args.blocks[0]](scores).rho
    times = {size: [] for size in compiled}
    for _ in range(args.rounds):
        for size, c in compiled.items():
            cpu, wall = time.process_time(), time.perf_counter()
            out = jax.block_until_ready(c(scores))
            times[size].append((time.process_time() - cpu, time.perf_counter() - wall))
            assert float(jnp.max(jnp.abs(out.rho - ref))) < 1e-10
    base = np.array(times[args.blocks[0]])
    for size in compiled:
        t = np.array(times[size])
        print(f"  {size:4d} problems per block: CPU {1e3 * np.median(t[:, 0]):7.1f} ms, wall "
              f"{1e3 * np.median(t[:, 1]):7.1f} ms; / {args.blocks[0]}: CPU "
              f"{np.median(t[:, 0] / base[:, 0]):.3f}, wall {np.median(t[:, 1] / base[:, 1]):.3f}")
    print(f"load average after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
