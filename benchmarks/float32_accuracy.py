"""float32 accuracy of every family's stationary map against float64, with entmax's bisection.

    python benchmarks/float32_accuracy.py [--rows 1024]

Each family solves the same float32 scores in float32 (jitted, as in use); the reference is
the float64 solve of the same scores (cast exactly to float64), so the error is the float32
arithmetic's alone, not the rounding of the inputs. Printed: the largest |rho32 - rho64| over
every weight of four batches (normal scores at N = 512 and N = 5, wider normal scores at
N = 64, uniform scores at N = 10). For Tsallis q > 1 (alpha-entmax) two more columns: the
bisection of `entmax.entmax_bisect` (50 bisection steps on the threshold in float32, then a
division by the sum), written out in NumPy float32 here so that it runs without PyTorch, and
`entmax.entmax_bisect` itself where the `entmax` package (extra `entmax`) is installed.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import fisherdyn as fd

FAMILIES = [
    ("Shannon()", fd.Shannon()),
    ("Tsallis(0.5)", fd.Tsallis(0.5)),
    ("Tsallis(1.1)", fd.Tsallis(1.1)),
    ("Tsallis(1.25)", fd.Tsallis(1.25)),
    ("Tsallis(1.5) entmax15", fd.Tsallis(1.5)),
    ("Tsallis(1.75)", fd.Tsallis(1.75)),
    ("Tsallis(2) sparsemax", fd.Tsallis(2.0)),
    ("Tsallis(2.5)", fd.Tsallis(2.5)),
    ("Kaniadakis(0.3)", fd.Kaniadakis(0.3)),
    ("Burg()", fd.Burg()),
    ("Abe(1.5)", fd.Abe(1.5)),
    ("Renyi(2.0)", fd.Renyi(2.0)),
    ("SharmaMittal(2.0,1.5)", fd.SharmaMittal(2.0, 1.5)),
]


def bisect_float32(x, alpha, n_iter=50):
    """`entmax.entmax_bisect(x, alpha, n_iter)` in NumPy float32: the threshold tau of
    p = [(alpha - 1) x - tau]_+^(1/(alpha - 1)) bisected from [max - 1, max - (1/d)^(alpha-1)],
    then p divided by its sum (`ensure_sum_one`)."""
    one = np.float32(1)
    a = np.float32(alpha)
    X = x.astype(np.float32) * (a - one)
    top = X.max(-1, keepdims=True)
    tau_lo = top - one
    tau_hi = top - (one / np.float32(X.shape[-1])) ** (a - one)

    def p(tau):
        return np.maximum(X - tau, np.float32(0)) ** (one / (a - one))

    f_lo = p(tau_lo).sum(-1, keepdims=True) - one
    dm = tau_hi - tau_lo
    for _ in range(n_iter):
        dm = dm / np.float32(2)
        tau_m = tau_lo + dm
        p_m = p(tau_m)
        f_m = p_m.sum(-1, keepdims=True) - one
        tau_lo = np.where(f_m * f_lo >= 0, tau_m, tau_lo)
    return p_m / p_m.sum(-1, keepdims=True)


def entmax_package(x, alpha):
    try:
        import torch
        from entmax import entmax_bisect
    except ImportError:
        return None
    return entmax_bisect(torch.tensor(x), alpha=alpha, dim=-1).numpy()


def batches(rows, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.normal(size=(rows, 512)).astype(np.float32),
        (4 * rng.normal(size=(rows, 64))).astype(np.float32),
        rng.uniform(-1, 1, size=(rows, 10)).astype(np.float32),
        rng.normal(size=(rows, 5)).astype(np.float32),
    ]


def table(rows=1024, T=1.0):
    """[(label, float32 error, bisection error or None, entmax package error or None)]."""
    zs = batches(rows)
    out = []
    for label, entropy in FAMILIES:
        solve32 = jax.jit(lambda z, e=entropy: fd.stationary(e, z, T))
        solve64 = jax.jit(lambda z, e=entropy: fd.stationary(e, z, T))
        q = getattr(entropy, "q", None) if isinstance(entropy, fd.Tsallis) else None
        ours = bis = pkg = 0.0
        have_pkg = True
        for z in zs:
            ref = np.asarray(solve64(jnp.asarray(z, jnp.float64)))
            ours = max(ours, float(np.abs(np.asarray(solve32(jnp.asarray(z)), np.float64)
                                          - ref).max()))
            if q is not None and q > 1:
                x = z / np.float32(q * T)  # entmax's scores: <p, x> + H_alpha(p) / (alpha(alpha-1))
                bis = max(bis, float(np.abs(bisect_float32(x, q).astype(np.float64) - ref).max()))
                got = entmax_package(x, q)
                have_pkg = have_pkg and got is not None
                if got is not None:
                    pkg = max(pkg, float(np.abs(got.astype(np.float64) - ref).max()))
        has_ref = q is not None and q > 1
        out.append((label, ours, bis if has_ref else None,
                    pkg if has_ref and have_pkg else None))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--T", type=float, default=1.0)
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)  # for the float64 reference only
    print(f"max |rho_float32 - rho_float64| over {args.rows} rows each of N = 512, 64, 10, 5; "
          f"T = {args.T}")
    print(f"| {'family':24s} | {'fisherdyn':>9s} | {'bisection':>9s} | {'entmax':>9s} |")
    print(f"|{'-' * 26}|{'-' * 11}|{'-' * 11}|{'-' * 11}|")
    fmt = lambda x, missing: missing if x is None else f"{x:.1e}"  # noqa: E731
    for label, ours, bis, pkg in table(args.rows, args.T):
        print(f"| {label:24s} | {ours:9.1e} | {fmt(bis, '-'):>9s} | "
              f"{fmt(pkg, '-' if bis is None else 'n/i'):>9s} |")
    print("bisection: entmax_bisect's algorithm (50 steps) in NumPy float32; entmax: the "
          "package itself ('n/i': not installed)")


if __name__ == "__main__":
    main()
