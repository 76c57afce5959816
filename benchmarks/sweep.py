"""Throughput of `fisherdyn.sweep`: problems per second through the sweep against the same
problems as plain batched calls (`stationary`, `relaxation_spectrum`, `relax` with the saved
path, which is what a chunk runs; and `relax` alone), against a scipy `solve_ivp` loop, and
the fitted cost exponents of batched `relax` in the number of problems and in N.

Every timing is of compiled programs (each is run once to compile, then timed, median of
`--repeat`); the ratios are of timings taken side by side in this one run. The problems are
Shannon, overdamped by default (`--mass 0`, the flow scipy integrates below), uniform start,
Gaussian scores.

    python benchmarks/sweep.py [--problems 1024] [--chunk-size 256] [--n-keys 16] [--mass 0]
                               [--repeat 3] [--sizes 256,1024,4096] [--keys 8,16,32]
                               [--scipy 8] [--saturation 1024,4096,16384,65536,262144]

`--saturation B1,B2,...` adds relaxations per second of batched `relax` at N = 64
(`--saturation-keys`) for each batch size, and the smallest batch within 10 % of the best
throughput: the batch that saturates the device (on a GPU; the CPU saturates early).

The sweep's fixed costs (creating the store, reading it back for the summary) are timed
apart, so that the per-chunk overhead of the engine shows on its own; the engine overhead is
against plain calls on the same chunks (the sizes a sweep runs), and the one-batch row shows
what the chunk size itself costs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _median_time(fn, repeat):
    fn()  # compile
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _spec(n_problems, n_keys, mass):
    seeds = max(1, n_problems // 4)
    return dict(families=["shannon"], T=[0.5, 0.8, 1.0, 2.0], mass=[mass], damping=[1.0],
                n_keys=[n_keys], seeds=seeds)


def _plain(fd, spec, with_path=True, chunk=None):
    """The sweep's problems as plain batched calls, built from the public API alone: one
    batch, or consecutive batches of `chunk` problems (the sweep's chunk sizes)."""
    import jax
    import jax.numpy as jnp

    s = fd.SweepSpec.from_dict(spec)
    n = s.n_keys[0]
    z = np.stack([s.scores_for(n, k) for k in s.seeds])
    Ts = np.repeat(np.array(s.T), len(s.seeds))
    z = jnp.asarray(np.tile(z, (len(s.T), 1)))
    T = jnp.asarray(Ts)
    m = s.mass[0]
    M = jnp.full_like(T, m)
    D = jnp.full_like(T, s.damping[0])
    entropy = fd.Shannon()

    @jax.jit
    def modes(z, T, M, D):
        rho = fd.stationary(entropy, z, T)
        sp = jax.vmap(lambda *a: fd.relaxation_spectrum(entropy, a[0], a[2], mass=a[3],
                                                        damping=a[4], rho=a[1]))
        out = sp(z, rho, T, M, D)
        return rho, out.slowest_rate

    def batch(z, T, M, D):
        saveat = None
        if with_path:
            rho, rate = modes(z, T, M, D)
            saveat = (s.horizon / rate)[:, None] * jnp.linspace(0.0, 1.0, s.n_save)[None, :]
        sol = fd.relax(entropy, z, T, mass=0.0 if m == 0 else M, damping=D, saveat=saveat,
                       throw=False)
        return jax.block_until_ready(sol.rho)

    def run():
        k = z.shape[0] if chunk is None else chunk
        for i in range(0, z.shape[0], k):
            batch(*(a[i:i + k] for a in (z, T, M, D)))

    return run, z, T


def _scipy_loop(z, T, gamma, tol=1e-6, rtol=1e-8, atol=1e-10):
    """The overdamped Shannon replicator flow $\\gamma\\dot\\rho_i = \\rho_i(g_i - \\bar g)$,
    $g = z - T\\log\\rho$ (fixed point softmax(z/T)), from uniform to a steady state."""
    from scipy.integrate import solve_ivp

    out = []
    for zi, Ti in zip(z, T):
        def f(t, r, zi=zi, Ti=Ti):
            g = zi - Ti * np.log(np.maximum(r, 1e-300))
            return r * (g - r @ g) / gamma

        def steady(t, r):
            return np.max(np.abs(f(t, r))) - tol

        steady.terminal = True
        r0 = np.full(zi.shape, 1.0 / zi.size)
        sol = solve_ivp(f, (0, 1e4), r0, method="RK45", rtol=rtol, atol=atol, events=steady)
        out.append(sol.y[:, -1])
    return np.array(out)


def _fit(xs, ts):
    return float(np.polyfit(np.log(xs), np.log(ts), 1)[0])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--problems", type=int, default=1024)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--n-keys", type=int, default=16)
    p.add_argument("--mass", type=float, default=0.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sizes", default="256,1024,4096", help="problem counts for the exponent")
    p.add_argument("--keys", default="8,16,32", help="N values for the exponent")
    p.add_argument("--scipy", type=int, default=8, help="problems in the scipy loop")
    p.add_argument("--saturation", default="", help="batch sizes for the saturation curve")
    p.add_argument("--saturation-keys", type=int, default=64, help="N of the saturation curve")
    args = p.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    import fisherdyn as fd

    spec = _spec(args.problems, args.n_keys, args.mass)
    n = fd.SweepSpec.from_dict(spec).n_problems
    tmp = Path(tempfile.mkdtemp())
    counter = iter(range(10**6))

    def through_sweep():
        fd.sweep(spec, tmp / f"s{next(counter)}.zarr", chunk_size=args.chunk_size,
                 progress=False, figure=False)

    def fixed_costs():
        # creating an empty store, then a sweep of a complete one (open, check, summary)
        from fisherdyn._sweep import block_shape, create_store  # internals: no public name

        s = fd.SweepSpec.from_dict(spec)
        create_store(tmp / f"e{next(counter)}.zarr", s, "", args.chunk_size,
                     block_shape(s, args.chunk_size))
        fd.sweep(spec, tmp / "s0.zarr", progress=False, figure=False)

    try:
        t_sweep = _median_time(through_sweep, args.repeat)
        t_fixed = _median_time(fixed_costs, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    same_work, z, T = _plain(fd, spec, with_path=True)
    t_same = _median_time(same_work, args.repeat)
    same_chunks, _, _ = _plain(fd, spec, with_path=True, chunk=args.chunk_size)
    t_same_chunks = _median_time(same_chunks, args.repeat)
    relax_only, _, _ = _plain(fd, spec, with_path=False)
    t_relax = _median_time(relax_only, args.repeat)
    print(f"{n} problems, shannon, N = {args.n_keys}, mass = {args.mass:g}, {jax.devices()[0]}")
    t_chunks = t_sweep - t_fixed
    print(f"  sweep, chunks of {args.chunk_size} (total) {t_sweep:8.3f} s  "
          f"{n / t_sweep:9.0f} problems/s")
    print(f"    of which fixed (create store, summary) {t_fixed:.3f} s; chunks {t_chunks:.3f} s")
    print(f"  plain, same work, same chunks {t_same_chunks:8.3f} s  "
          f"{n / t_same_chunks:9.0f} problems/s   engine overhead per chunk "
          f"{t_chunks / t_same_chunks - 1:+.0%} (goal <= 10 %), total "
          f"{t_sweep / t_same_chunks - 1:+.0%}")
    print(f"  plain, same work, one batch {t_same:8.3f} s  {n / t_same:9.0f} problems/s"
          f"   (chunking: {t_same_chunks / t_same - 1:+.0%}; sweep over it "
          f"{t_chunks / t_same - 1:+.0%})")
    print(f"  plain relax (no path/modes) {t_relax:8.3f} s  {n / t_relax:9.0f} problems/s"
          f"   sweep / relax {t_sweep / t_relax:.2f}x")

    if args.scipy and args.mass == 0:
        k = min(args.scipy, n)
        zs, Ts = np.asarray(z)[:k], np.asarray(T)[:k]
        t0 = time.perf_counter()
        rho = _scipy_loop(zs, Ts, 1.0)
        t_scipy = (time.perf_counter() - t0) / k
        ref = np.exp(zs / Ts[:, None])
        ref /= ref.sum(-1, keepdims=True)
        err = float(np.max(np.abs(rho - ref)))
        print(f"  scipy solve_ivp loop ({k} problems, max err vs softmax {err:.1e}): "
              f"{1 / t_scipy:9.0f} problems/s   sweep / scipy {t_scipy * n / t_sweep:.1f}x")

    sizes = [int(v) for v in args.sizes.split(",")]
    keys = [int(v) for v in args.keys.split(",")]
    by_size = [_median_time(_plain(fd, _spec(s, args.n_keys, args.mass), False)[0],
                            args.repeat) for s in sizes]
    by_keys = [_median_time(_plain(fd, _spec(args.problems, k, args.mass), False)[0],
                            args.repeat) for k in keys]
    sizes_text = ", ".join(f"{s}: {t:.3f} s" for s, t in zip(sizes, by_size))
    keys_text = ", ".join(f"{k}: {t:.3f} s" for k, t in zip(keys, by_keys))
    print(f"  batched relax, cost in problems: {sizes_text}  "
          f"exponent {_fit(sizes, by_size):.2f}")
    print(f"  batched relax, cost in N ({n} problems): {keys_text}  "
          f"exponent {_fit(keys, by_keys):.2f}")
    if args.saturation:
        _saturation(fd, [int(v) for v in args.saturation.split(",")], args.saturation_keys,
                    args.mass, args.repeat)


def _saturation(fd, sizes, n_keys, mass, repeat):
    """Relaxations per second of batched `relax` (no path) against the batch size."""
    rates = []
    for size in sizes:
        t = _median_time(_plain(fd, _spec(size, n_keys, mass), False)[0], repeat)
        rates.append(size / t)
        print(f"  saturation, N = {n_keys}: batch {size:8d}  {t:8.3f} s  "
              f"{rates[-1]:10.0f} relaxations/s", flush=True)
    best = max(rates)
    knee = next(b for b, r in zip(sizes, rates) if r >= 0.9 * best)
    print(f"  saturates at batch {knee} (within 10 % of the best, {best:.0f} relaxations/s; "
          "goal >= 200,000/s on an H200-class GPU)")


if __name__ == "__main__":
    main()
