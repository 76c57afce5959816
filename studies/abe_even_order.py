r"""Study 4: the Abe map is even in eps = ln q, and its softmax expansion is of even order.

- evenness, the independent check: the raw stationary law of Abe's entropy written directly at
  q and at 1/q from its definition, $S_A = -\sum(\rho^q - \rho^{1/q})/(q - 1/q)$,
  $G = -\partial S_A/\partial\rho$, $T G(\rho_i) - z_i = \lambda$, $\sum\rho = 1$, solved
  by mpmath at 30 digits (and once more by scipy's brentq at float64), with no
  symmetrization: max|rho(q) - rho(1/q)| of each, and the agreement of
  `stationary(Abe(q), z, T)` with the mpmath solve at q and at 1/q;
- evenness, the consistency check only: `Abe` stores eps = |ln q|, so `stationary(Abe(e^eps))`
  minus `stationary(Abe(e^-eps))` vanishes by construction (it tests nothing but that);
- the exact Abe map against eps;
- the errors of the order-2 and order-4 truncations (`abe_series`) against the exact map on a
  log-log plot, with fitted slopes (theory 4 and 6);
- a broad-score example where the truncation goes negative while the exact map stays
  positive;
- the shape coordinate lambda = eps^2: the map is smooth in lambda with slope p_i c2_i at 0.

    python studies/abe_even_order.py [--quick] [--out figures]
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
from _common import setup, write_outputs

NAME = "abe_even_order"
DPS = 30  # digits of the independent reference solve


def raw_G(a, x):
    r"""$G = -\partial S_A/\partial x$ of Abe's entropy at parameter `a`, as written (no
    symmetrization in a <-> 1/a; works for mpmath and numpy arguments)."""
    return (a * x ** (a - 1) - x ** (1 / a - 1) / a) / (a - 1 / a)


def raw_S_term(a, x):
    r"""One key's term of $S_A = -\sum(\rho^a - \rho^{1/a})/(a - 1/a)$."""
    return -(x ** a - x ** (1 / a)) / (a - 1 / a)


def _mp_inverse(a, w):
    """The x with G_a(x) = w, by a bracketed root in l = ln x (G increases)."""
    f = lambda ell: raw_G(a, mp.exp(ell)) - w  # noqa: E731
    lo, hi = mp.mpf(-1), mp.mpf(1)
    while f(lo) > 0:
        lo *= 2
    while f(hi) < 0:
        hi *= 2
    return mp.exp(mp.findroot(f, (lo, hi), solver="anderson"))


def mp_stationary(a, z, T):
    r"""Solve $T G_a(\rho_i) - z_i = \lambda$, $\sum\rho_i = 1$ in mpmath at `DPS` digits."""
    with mp.workdps(DPS):
        a, T = mp.mpf(a), mp.mpf(T)
        z = [mp.mpf(float(v)) for v in z]
        zmax = max(z)
        # rho_max between 1/n and 1 brackets the multiplier
        lo, hi = T * raw_G(a, mp.mpf(1) / len(z)) - zmax, T * raw_G(a, mp.mpf(1)) - zmax
        lam = mp.findroot(lambda lam: sum(_mp_inverse(a, (zi + lam) / T) for zi in z) - 1,
                          (lo, hi), solver="anderson")
        return [_mp_inverse(a, (zi + lam) / T) for zi in z]


def f64_stationary(a, z, T):
    """The same raw law at float64, nested scipy brentq solves in l = ln x."""
    from scipy.optimize import brentq

    a, T, z = float(a), float(T), [float(v) for v in z]
    tol = dict(xtol=1e-16, rtol=8.9e-16, maxiter=500)

    def inverse(w):
        f = lambda ell: raw_G(a, math.exp(ell)) - w  # noqa: E731
        lo, hi = -1.0, 1.0
        while f(lo) > 0:
            lo *= 2
        while f(hi) < 0:
            hi *= 2
        return math.exp(brentq(f, lo, hi, **tol))

    lo, hi = T * raw_G(a, 1.0 / len(z)) - max(z), T * raw_G(a, 1.0) - max(z)
    lam = brentq(lambda lam: sum(inverse((zi + lam) / T) for zi in z) - 1, lo, hi, **tol)
    return np.array([inverse((zi + lam) / T) for zi in z])


def main(argv=None):
    args, ledger = setup(NAME, __doc__.splitlines()[0], argv)
    import jax
    import jax.numpy as jnp
    import matplotlib.pyplot as plt

    import fisherdyn as fd

    T = 1.0
    z = jnp.asarray([1.0, 0.5, 0.3, -0.2, -1.0, -2.0])
    z_broad = jnp.asarray([0.0, -3.0, -6.0, -9.0, -12.0, -15.0])

    @jax.jit
    def exact(eps, scores):
        """The exact Abe map at q = e^eps_k for scores_k (one compilation for everything)."""
        return jax.vmap(lambda e, s: fd.stationary(fd.Abe(jnp.exp(e)), s, T))(eps, scores)

    n = 41 if args.quick else 161
    eps_line = np.linspace(-1.5, 1.5, n)
    eps_pos = np.geomspace(1e-4, 1.5, 12 if args.quick else 40)
    eps_err = np.geomspace(0.02, 0.6, 12 if args.quick else 30)
    eps_b = np.linspace(0.0, 1.0, 41 if args.quick else 201)
    lam_small = 1e-5
    eps_ind = np.geomspace(0.01, 1.5, 4 if args.quick else 12)  # the independent evenness check
    # every exact solve in one batched call: segments of (eps values, scores)
    segments = [(eps_line, z), (eps_pos, z), (-eps_pos, z), (eps_err, z), (eps_b, z_broad),
                (np.array([np.sqrt(lam_small)]), z), (eps_ind, z), (-eps_ind, z)]
    all_eps = np.concatenate([e for e, _ in segments])
    all_z = np.concatenate([np.broadcast_to(np.asarray(s_), (e.size, z.size))
                            for e, s_ in segments])
    sol = np.asarray(exact(jnp.asarray(all_eps), jnp.asarray(all_z)))
    parts = np.split(sol, np.cumsum([e.size for e, _ in segments])[:-1])
    rho_line, rho_plus, rho_minus, ex, ex_b, r_small, fd_plus, fd_minus = parts
    r_small = r_small[0]
    # evenness, consistency only: Abe stores |ln q|, so this difference vanishes by construction
    odd = np.max(np.abs(rho_plus - rho_minus), -1)
    ledger.check("consistency (symmetrized by construction): fd max|rho(eps) - rho(-eps)|",
                 odd.max(), 0.0, tol=1e-14, kind="max", fmt=".1e",
                 explain="Abe(q) stores eps = |ln q|: not a test of S_A(q) = S_A(1/q)")

    # evenness, the independent check: the raw law at q and at 1/q, no symmetrization
    with mp.workdps(DPS):
        x_ = mp.mpf("0.3")
        G_def = max(abs(raw_G(a, x_) + mp.diff(lambda x: raw_S_term(a, x), x_))
                    for a in (mp.exp(mp.mpf(float(e))) for e in (-eps_ind[-1], eps_ind[0])))
        mp_plus = [mp_stationary(mp.exp(mp.mpf(float(e))), z, T) for e in eps_ind]
        mp_minus = [mp_stationary(mp.exp(-mp.mpf(float(e))), z, T) for e in eps_ind]
        even_mp = np.array([float(max(abs(u - v) for u, v in zip(rp, rm)))
                            for rp, rm in zip(mp_plus, mp_minus)])
        ref_plus = np.array([[float(u) for u in r] for r in mp_plus])
        ref_minus = np.array([[float(u) for u in r] for r in mp_minus])
    f64_plus = np.array([f64_stationary(np.exp(e), z, T) for e in eps_ind])
    f64_minus = np.array([f64_stationary(np.exp(-e), z, T) for e in eps_ind])
    even_f64 = np.max(np.abs(f64_plus - f64_minus), -1)
    fd_vs_mp = np.max(np.abs(np.concatenate([fd_plus, fd_minus])
                             - np.concatenate([ref_plus, ref_minus])), -1)
    ind = f"eps in [{eps_ind[0]:g}, {eps_ind[-1]:g}], {eps_ind.size} values"
    ledger.check("raw G at q: closed form vs -dS_A/drho (mpmath.diff)", float(G_def), 0.0,
                 tol=1e-20, kind="max", fmt=".1e", explain=f"{DPS}-digit numerical derivative")
    ledger.check("independent (mpmath raw law): max|rho(q) - rho(1/q)|", even_mp.max(), 0.0,
                 tol=1e-25, kind="max", fmt=".1e", explain=f"{DPS} digits, {ind}")
    ledger.check("independent (float64 brentq raw law): max|rho(q) - rho(1/q)|",
                 even_f64.max(), 0.0, tol=1e-13, kind="max", fmt=".1e",
                 explain="round-off of the raw law, amplified by 1/(q - 1/q) at small eps")
    ledger.check("fd.stationary(Abe(q)) vs mpmath raw law at q and 1/q: max abs dev",
                 fd_vs_mp.max(), 0.0, tol=1e-14, kind="max", fmt=".1e", explain=ind)
    ledger.check("max|rho(eps=0) - softmax(z/T)|",
                 np.max(np.abs(rho_line[n // 2] - np.asarray(jax.nn.softmax(z / T)))), 0.0,
                 tol=1e-15, kind="max", fmt=".1e")

    # truncation errors
    expn = fd.abe_expansion(z, T)
    err2 = np.max(np.abs(np.asarray(expn.rho(jnp.asarray(eps_err), order=2)) - ex), -1)
    err4 = np.max(np.abs(np.asarray(expn.rho(jnp.asarray(eps_err), order=4)) - ex), -1)
    # fit where the error is well above round-off and eps small (asymptotic regime)
    fit_win = eps_err <= 0.15
    s2 = np.polyfit(np.log(eps_err[fit_win]), np.log(err2[fit_win]), 1)
    w4 = fit_win & (err4 > 1e-13)
    s4 = np.polyfit(np.log(eps_err[w4]), np.log(err4[w4]), 1)
    ledger.check("slope of the order-2 truncation error", s2[0], 4.0, tol=0.05, kind="abs",
                 explain=f"fit eps in [{eps_err[fit_win][0]:.3g}, {eps_err[fit_win][-1]:.3g}]")
    ledger.check("slope of the order-4 truncation error", s4[0], 6.0, tol=0.1, kind="abs",
                 explain=f"fit eps in [{eps_err[w4][0]:.3g}, {eps_err[w4][-1]:.3g}]")
    ledger.check("sum p c2 (normalization at order 2)", abs(float(jnp.sum(expn.p * expn.c2))),
                 0.0, tol=1e-14, kind="max", fmt=".1e")
    ledger.check("sum p c4 (normalization at order 4)", abs(float(jnp.sum(expn.p * expn.c4))),
                 0.0, tol=1e-13, kind="max", fmt=".1e")

    # broad scores: the truncation goes negative, the exact map does not
    exp_b = fd.abe_expansion(z_broad, T)
    tr2_b = np.asarray(exp_b.rho(jnp.asarray(eps_b), order=2))
    tr4_b = np.asarray(exp_b.rho(jnp.asarray(eps_b), order=4))
    neg2 = eps_b[np.argmax(tr2_b.min(-1) < 0)] if np.any(tr2_b < 0) else np.nan
    neg4 = eps_b[np.argmax(tr4_b.min(-1) < 0)] if np.any(tr4_b < 0) else np.nan
    ledger.check("broad scores: min exact weight over eps > 0 (1 = yes)",
                 float(ex_b.min() > 0), 1.0, tol=0, fmt=".0f",
                 explain=f"min exact weight {ex_b.min():.3g}")
    ledger.check("broad scores: order-2 truncation negative somewhere (1 = yes)",
                 float(np.isfinite(neg2)), 1.0, tol=0, fmt=".0f",
                 explain=f"first negative at eps = {neg2:.3g}")
    ledger.note("broad scores: smallest eps where order 4 goes negative", neg4, fmt=".3g")

    # lambda = eps^2: slope of rho at lambda = 0 is p c2 (finite difference in lambda)
    slope_fd = (r_small - np.asarray(expn.p)) / lam_small
    slope_th = np.asarray(expn.p * expn.c2)
    ledger.check("d rho/d lambda at 0 vs p c2 (max rel. dev.)",
                 np.max(np.abs(slope_fd - slope_th)) / np.max(np.abs(slope_th)), 0.0, tol=1e-4,
                 kind="max", fmt=".1e", explain="forward difference, lambda = 1e-5: O(lambda)")

    # ---------------------------------------------------------------- figure
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.4))
    (a1, a2), (a3, a4) = axes
    cols = plt.get_cmap("tab10")(np.arange(z.size))
    for i in range(z.size):
        a1.plot(eps_line, rho_line[:, i], color=cols[i], lw=1.5, label=f"z = {float(z[i]):+g}")
    a1.axvline(0, color="k", lw=0.6)
    a1.set_xlabel(r"$\epsilon = \ln q$")
    a1.set_ylabel(r"exact Abe weight $\rho_i(\epsilon)$")
    a1.legend(ncol=2)
    a1.set_title(r"exact map: even in $\epsilon$ ($q \leftrightarrow 1/q$); the raw law solved "
                 f"independently\nat q and 1/q: max|rho(q) - rho(1/q)| = {even_f64.max():.1e} "
                 f"(float64), {even_mp.max():.0e} (mpmath)", fontsize=9.5)

    a2.loglog(eps_err, err2, "o-", ms=3, color="C0",
              label=f"order 2: fitted slope {s2[0]:.3f} (theory 4)")
    a2.loglog(eps_err, err4, "s-", ms=3, color="C3",
              label=f"order 4: fitted slope {s4[0]:.3f} (theory 6)")
    a2.loglog(eps_err, np.exp(s2[1]) * eps_err ** s2[0], "k:", lw=0.8)
    a2.loglog(eps_err, np.exp(s4[1]) * eps_err ** s4[0], "k:", lw=0.8)
    a2.loglog(eps_ind, np.maximum(even_f64, 1e-18), "^", ms=4, color="0.35",
              label=r"independent: $\max_i|\rho_i(q) - \rho_i(1/q)|$, raw law, float64 brentq")
    a2.loglog(np.concatenate([eps_ind, eps_ind]), np.maximum(fd_vs_mp, 1e-18), "x", ms=4,
              color="C2", label=r"fd.stationary(Abe) vs the mpmath raw law at $q$ and $1/q$")
    a2.plot([], [], " ", label=f"independent, mpmath ({DPS} digits): {even_mp.max():.0e} "
            "(below the axis)")
    a2.axvspan(eps_err[fit_win][0], eps_err[fit_win][-1], color="0.92", zorder=0)
    a2.set_ylim(1e-18, 1e4)  # headroom for the legend
    a2.set_xlabel(r"$|\epsilon|$")
    a2.set_ylabel(r"$\max_i|\rho^{trunc}_i - \rho^{exact}_i|$")
    a2.legend(loc="upper left", title="shaded: fit window", title_fontsize=7, fontsize=7)
    a2.set_title("truncation errors scale as eps^4 and eps^6 (even orders only); the "
                 "independent\nevenness checks sit at round-off", fontsize=9.5)

    # the keys whose truncated weight changes sign, and the lowest key
    k_low = sorted({int(np.argmin(tr2_b.min(0))), int(np.argmin(tr4_b.min(0))), z.size - 1})
    for i in k_low:
        a3.plot(eps_b, ex_b[:, i], color=cols[i], lw=1.8, label=f"exact, z = {float(z_broad[i]):g}")
        a3.plot(eps_b, tr2_b[:, i], color=cols[i], lw=1.0, ls="--")
        a3.plot(eps_b, tr4_b[:, i], color=cols[i], lw=1.0, ls=":")
    a3.plot([], [], "k--", lw=1, label="order-2 truncation")
    a3.plot([], [], "k:", lw=1, label="order-4 truncation")
    a3.axhline(0, color="k", lw=0.8)
    a3.set_yscale("symlog", linthresh=1e-7)
    a3.set_xlabel(r"$\epsilon$")
    a3.set_ylabel(r"$\rho_i$ (symlog axis: linear within $\pm 10^{-7}$)")
    a3.legend(fontsize=7, loc="lower left")
    a3.set_title(f"broad scores z = {np.asarray(z_broad).tolist()}: order 2 goes negative at "
                 f"eps = {neg2:.3g},\norder 4 at eps = {neg4:.3g}; the exact map stays "
                 f"positive (min {ex_b.min():.2g})", fontsize=9)

    lam = eps_line[eps_line >= 0] ** 2
    r_lam = rho_line[eps_line >= 0]
    lam_t = np.linspace(0, 0.35, 20)
    for i in range(z.size):
        a4.plot(lam, r_lam[:, i], color=cols[i], lw=1.5)
        a4.plot(lam_t, float(expn.p[i]) * (1 + lam_t * float(expn.c2[i])), color="k",
                lw=0.9, ls="--")
    a4.plot([], [], "k--", lw=0.9, label=r"tangent $p_i(1 + \lambda c_{2,i})$ at $\lambda = 0$")
    a4.set_xlabel(r"shape coordinate $\lambda = \epsilon^2$")
    a4.set_ylabel(r"$\rho_i$")
    a4.legend()
    a4.set_title(r"in $\lambda = \epsilon^2 \geq 0$ the map has a finite slope $p\,c_2$ at 0 "
                 "(flat in eps)")
    fig.suptitle("Abe attention is even in eps = ln q: the raw law gives rho(q) = rho(1/q) to "
                 "round-off, the "
                 "softmax expansion has only even orders (errors eps^4, eps^6),\nand the "
                 "truncation can go negative where the exact map cannot", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94))

    ledger.headline("slopes", f"truncation error slopes {s2[0]:.2f} (order 2, theory 4) and "
                    f"{s4[0]:.2f} (order 4, theory 6)")
    ledger.headline("evenness", "raw law solved at q and 1/q without symmetrization: "
                    f"max|rho(q) - rho(1/q)| = {even_mp.max():.0e} (mpmath, {DPS} digits), "
                    f"{even_f64.max():.1e} (float64); fd.Abe vs mpmath {fd_vs_mp.max():.1e}")
    ledger.headline("negative", f"broad scores: order-2 truncation negative from eps = "
                    f"{neg2:.3g}, exact min weight {ex_b.min():.2g}")
    write_outputs(args, ledger, fig,
                  title="Abe: even order in eps",
                  caption="The exact Abe map against eps, the order-2 and order-4 truncation "
                  "errors with fitted slopes beside the independent evenness check (the raw law "
                  "solved at q and 1/q), a broad-score example where the truncation goes "
                  "negative, and the lambda = eps^2 coordinate.",
                  data=dict(T=T, scores=z, broad_scores=z_broad, eps=eps_err, err2=err2,
                            err4=err4, slope2=s2[0], slope4=s4[0], odd_max=odd.max(),
                            evenness=dict(eps=eps_ind, dps=DPS, mpmath=even_mp,
                                          float64=even_f64, fd_vs_mpmath=fd_vs_mp),
                            eps_negative_order2=neg2, eps_negative_order4=neg4,
                            min_exact_broad=ex_b.min()))


if __name__ == "__main__":
    main()
