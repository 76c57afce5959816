"""Long-context attention: the blockwise path's memory and time against the dense path.

One head, d = 64, float32, forward and backward (`jax.grad` of the sum of the output in
q, k and v), as `fd.attention(..., block_size=...)` runs it on this machine's CPU:

1. Shannon, blockwise, N = 4,096 ... 65,536 (queries = keys = N): peak resident memory of
   a fresh process per size (`resource.getrusage` maxrss, which includes the Python/JAX
   runtime: the runtime alone, measured the same way, is printed), the compiled program's
   temporaries (XLA's memory analysis), the time of one forward+backward, and the fitted
   exponents of time and memory in N;
2. at N = 4,096, per family, the time of the dense path and of the blockwise one.

    python benchmarks/long_context.py            # the full table (minutes)
    python benchmarks/long_context.py --quick    # a smoke run at small N

The load average is printed before and after: the times are only comparable on a quiet
machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np

D = 64
FAMILIES = ["shannon", "tsallis:1.5", "tsallis:2", "kaniadakis:0.3", "abe:1.5", "burg",
            "renyi:1.5", "sharma_mittal:0.7,0.4"]


def _child(n, spec, block, repeats):
    """Run in a fresh process: one compiled forward+backward, timed; prints JSON."""
    import resource
    import time

    import jax
    import jax.numpy as jnp

    import fisherdyn as fd

    entropy = fd.parse_entropy(spec)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(n, D)), jnp.float32) for _ in range(3))
    # "dense": one block of all rows, the dense path; "auto": block_size=None
    block = {"dense": n, "auto": None}[block] if block in ("dense", "auto") else int(block)

    def loss(q, k, v):
        return jnp.sum(fd.attention(q, k, v, entropy=entropy, block_size=block))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    compiled = grad.lower(q, k, v).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(compiled(q, k, v))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(q, k, v))
        times.append(time.perf_counter() - start)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"time": min(times), "temp": temp, "rss": rss}))


def _runtime_rss():
    """maxrss of a process that imports JAX and fisherdyn and runs one tiny attention."""
    code = ("import resource, jax.numpy as jnp, fisherdyn as fd; "
            "fd.attention(jnp.ones((4, 64)), jnp.ones((4, 64)), jnp.ones((4, 64)))"
            ".block_until_ready(); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)


def _measure(n, spec, block, repeats):
    out = subprocess.run([sys.executable, __file__, "--child", str(n), spec, str(block),
                          str(repeats)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _loadavg():
    with open("/proc/loadavg") as f:
        return f.read().strip()


def _exponent(ns, ys):
    return float(np.polyfit(np.log(ns), np.log(ys), 1)[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small N, two families")
    args = parser.parse_args()
    sizes = [1024, 2048] if args.quick else [4096, 8192, 16384, 32768, 65536]
    n_compare = 1024 if args.quick else 4096
    families = FAMILIES[:1] + ["kaniadakis:0.3"] if args.quick else FAMILIES
    print(f"loadavg before: {_loadavg()}")
    runtime = _runtime_rss()
    print(f"runtime alone (import + a tiny attention): maxrss {runtime / 2**20:.0f} MiB\n")
    print("Shannon, blockwise (automatic blocks), one head, d = 64, float32, forward+backward")
    print(f"{'N':>7} {'time s':>9} {'maxrss MiB':>11} {'above runtime':>14} {'XLA temp MiB':>13}")
    rows = []
    for n in sizes:
        r = _measure(n, "shannon", "auto" if n > 4096 else 512, 1 if n >= 32768 else 3)
        rows.append(r)
        print(f"{n:>7} {r['time']:>9.3f} {r['rss'] / 2**20:>11.0f} "
              f"{(r['rss'] - runtime) / 2**20:>14.0f} {r['temp'] / 2**20:>13.1f}", flush=True)
    ns = np.array(sizes, float)
    print(f"fitted exponents in N: time {_exponent(ns, [r['time'] for r in rows]):.2f}, "
          f"XLA temporaries {_exponent(ns, [r['temp'] for r in rows]):.2f}, maxrss above "
          f"runtime {_exponent(ns, [max(r['rss'] - runtime, 1) for r in rows]):.2f}\n")
    print(f"N = {n_compare}, forward+backward: dense vs blockwise (blocks of 512 rows)")
    print(f"{'family':>22} {'dense s':>9} {'blockwise s':>12} {'ratio':>7} "
          f"{'dense temp MiB':>15} {'block temp MiB':>15}")
    for spec in families:
        dense = _measure(n_compare, spec, "dense", 3)
        block = _measure(n_compare, spec, 512, 3)
        print(f"{spec:>22} {dense['time']:>9.3f} {block['time']:>12.3f} "
              f"{block['time'] / dense['time']:>7.2f} {dense['temp'] / 2**20:>15.1f} "
              f"{block['temp'] / 2**20:>15.1f}", flush=True)
    print(f"\nloadavg after: {_loadavg()}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
