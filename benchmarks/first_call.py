"""First call of `relax` (compilation and run) in a fresh process, for comparing versions.

    python benchmarks/first_call.py --family shannon [--source DIR]

`--source` imports fisherdyn from another checkout (e.g. a `git worktree` of an older
commit), so two versions can be timed alternately, one process per call. The persistent
compilation cache is off. Shannon runs 1024 x 64 problems, Tsallis(1.5) and Kaniadakis(0.3)
256 x 64, at the settings of `benchmarks/dynamics.py`; prints wall and CPU seconds.
"""

import argparse
import sys
import time

FAMILIES = {"shannon": ("Shannon", (), 1024), "tsallis": ("Tsallis", (1.5,), 256),
            "kaniadakis": ("Kaniadakis", (0.3,), 256)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=sorted(FAMILIES), default="shannon")
    p.add_argument("--source", default=None,
                   help="a checkout whose fisherdyn is imported (default: the installed one)")
    args = p.parse_args()
    if args.source is not None:
        sys.path.insert(0, args.source)
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import fisherdyn as fd

    cls, params, batch = FAMILIES[args.family]
    entropy = getattr(fd, cls)(*params)
    scores = jax.numpy.asarray(np.random.default_rng(0).normal(size=(batch, 64)))
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fd.relax(entropy, scores, 1.0, mass=1.0, damping=2.0, rtol=1e-8,
                                   atol=1e-10, tol=1e-6))
    name = f"{cls}({', '.join(map(str, params))})" if params else cls
    print(f"{name} {batch} x 64, fisherdyn from {fd.__file__}: "
          f"first call {time.perf_counter() - wall:.2f} s wall, "
          f"{time.process_time() - cpu:.2f} s CPU")


if __name__ == "__main__":
    main()
