"""First call of `relax` (compilation and run) in a fresh process, for comparing versions.

    python benchmarks/first_call.py --family "Kaniadakis(0.3)" [--source DIR]

`--source` imports fisherdyn from another checkout (e.g. a `git worktree` of an older
commit), so two versions can be timed alternately, one process per call. The persistent
compilation cache is off. The family's batch and settings are those of
`benchmarks/dynamics.py` (Shannon 1024 x 64, the others 256 x 64); prints wall and CPU
seconds.
"""

import argparse
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="Shannon",
                   help="a family of benchmarks/dynamics.py, e.g. Shannon, Tsallis(1.5)")
    p.add_argument("--source", default=None,
                   help="a checkout whose fisherdyn is imported (default: the installed one)")
    args = p.parse_args()
    if args.source is not None:
        sys.path.insert(0, args.source)  # before dynamics imports fisherdyn
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    import dynamics

    family = {f[0]: f for f in dynamics.FAMILIES}
    if args.family not in family:
        p.error(f"--family must be one of {sorted(family)}")
    _, entropy, _, (batch, n), _ = family[args.family]
    scores = jax.numpy.asarray(dynamics.problems(batch, n))
    wall, cpu = time.perf_counter(), time.process_time()
    dynamics.relax_batch(entropy, scores)
    print(f"{args.family} {batch} x {n}, fisherdyn from {dynamics.fd.__file__}: "
          f"first call {time.perf_counter() - wall:.2f} s wall, "
          f"{time.process_time() - cpu:.2f} s CPU")


if __name__ == "__main__":
    main()
