"""Scan: does `relax` converge on every problem of a large gaussian batch, per cutoff family?

A cutoff family's rare problems (a key whose score lies within the steady-state tolerance
of the cutoff, a self-consistent temperature with several branches) show only in large
batches. For each family, `--batch` rows of N = 64 gaussian scores (`--seed`), relaxed at
the settings of `benchmarks/dynamics.py` (m = 1, gamma = 2, T = 1, rtol 1e-8, atol 1e-10,
steady state 1e-6, float64) with `throw=False`, then per family:

- the problems that did not converge, counted by result (with up to 8 rows of each);
- the converged problems whose fixed point differs from `fisherdyn.stationary` by more than
  1e-10, split into those equal (to 1e-10) to another stable branch of
  `fisherdyn.stationary_branches` (the dynamics' basin is not the least free energy: not an
  error) and the rest (wrong: should be none).

Not a timing; it prints the wall time per family for orientation. Exits with status 1 if a
problem failed or converged to a wrong point.

    python benchmarks/relax_robustness.py                       # 8,192 rows per family
    python benchmarks/relax_robustness.py --batch 65536 --seed 0 --only "Tsallis(1.5)"
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import fisherdyn as fd  # noqa: E402

FAMILIES = [
    ("Tsallis(1.2)", fd.Tsallis(1.2)),
    ("Tsallis(1.5)", fd.Tsallis(1.5)),
    ("Tsallis(2.0)", fd.Tsallis(2.0)),
    ("Tsallis(3.0)", fd.Tsallis(3.0)),
    ("Renyi(2.0)", fd.Renyi(2.0)),
    ("SharmaMittal(2.0, 1.5)", fd.SharmaMittal(2.0, 1.5)),
]
KW = dict(mass=1.0, damping=2.0, rtol=1e-8, atol=1e-10, tol=1e-6, throw=False)
TOL_POINT = 1e-10


def other_stable_branch(entropy, z, rho):
    """Whether `rho` equals a stable branch of `stationary_branches` to `TOL_POINT`."""
    br = fd.stationary_branches(entropy, z, 1.0)
    valid, stable = np.asarray(br.valid), np.asarray(br.stable)
    dist = np.max(np.abs(np.asarray(br.rho) - rho), -1)
    return bool(np.any(valid & stable & (dist <= TOL_POINT)))


def scan(name, entropy, Z):
    start = time.perf_counter()
    sol = fd.relax(entropy, Z, 1.0, **KW)
    names = np.asarray(sol.result_name)
    wall = time.perf_counter() - start
    rho = np.asarray(sol.rho)
    err = np.max(np.abs(rho - np.asarray(fd.stationary(entropy, Z, 1.0))), -1)
    good = names == "successful"
    failed = {str(n): np.flatnonzero(names == n).tolist() for n in np.unique(names[~good])}
    apart = np.flatnonzero(good & (err > TOL_POINT))
    branch = [int(i) for i in apart if other_stable_branch(entropy, Z[i], rho[i])]
    wrong = [int(i) for i in apart if i not in branch]
    print(f"{name}: {len(Z)} problems in {wall:.0f} s; not converged: "
          + (", ".join(f"{n} {len(r)} (rows {r[:8]})" for n, r in failed.items()) or "none")
          + f"; max |rho - stationary| elsewhere {np.max(err[good & (err <= TOL_POINT)]):.1e}; "
          f"on another stable branch: {len(branch)} (rows {branch[:8]}); wrong: {len(wrong)}"
          + (f" (rows {wrong[:8]})" if wrong else ""), flush=True)
    return bool(failed) or bool(wrong)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", nargs="*", default=None, help='family names, e.g. "Tsallis(1.5)"')
    args = p.parse_args()
    Z = np.random.default_rng(args.seed).normal(size=(args.batch, args.keys))
    bad = [name for name, entropy in FAMILIES
           if (not args.only or name in args.only) and scan(name, entropy, Z)]
    if bad:
        raise SystemExit("failed or wrong fixed points: " + ", ".join(bad))


if __name__ == "__main__":
    main()
