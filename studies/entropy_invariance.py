"""Study 7: attention entropy and relevant-key mass across sequence length, every family.

Random dot-product scores z_i = q.k_i with q, k_i ~ N(0, I_d), d = 64, and one planted
relevant key k_0 = q (so z_0 = |q|^2 ~ d, while a distractor's z_i ~ N(0, |q|^2)), for
n = 16 ... 65536 keys. For every family: the Shannon entropy H = -sum rho ln rho of the
attention weights and the mass rho_0 on the relevant key, with
- the fixed temperature T = sqrt(d) (scaled dot-product attention), and
- the length-dependent T = d/(c ln n) of entropy-invariant softmax (Su 2022, second seed;
  c is chosen so that both agree at n = 512).
Measured: whether the ln n rescaling keeps each family's entropy flat (slope dH/d ln n),
and how the aggregate mass of the distractors dilutes the relevant key (fitted exponent
beta of (1 - rho_0)/rho_0 ~ n^beta): the paper's section VI.3 trade-off for algebraic tails.

    python studies/entropy_invariance.py [--quick] [--out figures]
"""

from __future__ import annotations

import numpy as np
from _common import color, label, setup, write_outputs

NAME = "entropy_invariance"


def main(argv=None):
    args, ledger = setup(NAME, __doc__.splitlines()[0], argv)
    import jax.numpy as jnp
    import matplotlib.pyplot as plt

    import fisherdyn as fd

    rng = np.random.default_rng(7)
    d = 64
    n_ref = 512
    c = np.sqrt(d) / np.log(n_ref)  # T = d/(c ln n) equals sqrt(d) at n = n_ref
    if args.quick:
        ns = [16, 64, 256, 1024]
        trials = 2
        buckets = [(1024, [16, 64, 256, 1024])]
        fams = [fd.Shannon(), fd.Tsallis(1.5), fd.Kaniadakis(0.3), fd.Burg()]
    else:
        ns = [16, 64, 256, 1024, 4096, 16384, 65536]
        trials = 4
        buckets = [(1024, [16, 64, 256, 1024]), (16384, [4096, 16384]), (65536, [65536])]
        fams = [fd.Shannon(), fd.Tsallis(1.5), fd.Renyi(2.0), fd.Kaniadakis(0.3), fd.Burg(),
                fd.Abe(1.5)]
    n_max = max(ns)
    Q = rng.normal(size=(trials, d))
    Kd = rng.normal(size=(trials, n_max, d))
    Kd[:, 0] = Q  # the planted relevant key
    Z = np.einsum("td,tnd->tn", Q, Kd)  # (trials, n_max); the first n keys form length n
    del Kd
    schedules = {"fixed T = sqrt(d)": lambda n: np.sqrt(d),
                 "T = d/(c ln n)": lambda n: d / (c * np.log(n))}

    # batched problems: rows = (schedule, n, trial) padded to the bucket width (one
    # compilation per bucket width and family)
    H = {label(e): {s: np.zeros((len(ns), trials)) for s in schedules} for e in fams}
    m0 = {label(e): {s: np.zeros((len(ns), trials)) for s in schedules} for e in fams}
    for e in fams:
        lab = label(e)
        for width, n_list in buckets:
            rows_z, rows_m, rows_T, where = [], [], [], []
            for sname, Tfun in schedules.items():
                for n in n_list:
                    for t in range(trials):
                        zr = Z[t, :width].copy()
                        mr = np.zeros(width, bool)
                        mr[:n] = True
                        rows_z.append(zr)
                        rows_m.append(mr)
                        rows_T.append(Tfun(n))
                        where.append((sname, ns.index(n), t))
            rho = np.asarray(fd.stationary(e, jnp.asarray(np.array(rows_z)),
                                           jnp.asarray(np.array(rows_T)),
                                           mask=jnp.asarray(np.array(rows_m))))
            pos = rho > 0
            ent = -np.sum(np.where(pos, rho * np.log(np.where(pos, rho, 1.0)), 0.0), -1)
            for k, (sname, jn, t) in enumerate(where):
                H[lab][sname][jn, t] = ent[k]
                m0[lab][sname][jn, t] = rho[k, 0]
        print(f"  {lab}: H(n={n_max}) = "
              + ", ".join(f"{s}: {H[lab][s][-1].mean():.3f}" for s in schedules), flush=True)

    # ---------------------------------------------------------------- measurements
    log_n = np.log(np.array(ns, float))
    half = log_n >= np.log(ns[len(ns) // 2])  # the long half of the lengths
    results = {}
    for e in fams:
        lab = label(e)
        res = {}
        for sname in schedules:
            Hm = H[lab][sname].mean(1)
            mm = m0[lab][sname].mean(1)
            slope_H = float(np.polyfit(log_n[half], Hm[half], 1)[0])
            # distractor-to-relevant mass ratio, geometric mean over the draws
            m_all = m0[lab][sname]
            with np.errstate(divide="ignore", invalid="ignore"):
                log_ratio = np.log((1 - m_all) / m_all)
            ok = np.all(np.isfinite(log_ratio), 1) & np.all((m_all > 0) & (m_all < 1), 1)
            sel = half & ok
            beta = (float(np.polyfit(log_n[sel], log_ratio[sel].mean(1), 1)[0])
                    if sel.sum() >= 2 else float("nan"))
            res[sname] = dict(H=Hm, H_std=H[lab][sname].std(1), mass=mm,
                              mass_std=m0[lab][sname].std(1), slope_H=slope_H, beta=beta,
                              flat=abs(slope_H) < 0.1)
            ledger.note(f"{lab}, {sname}: dH/d ln n (n >= {ns[len(ns) // 2]})", slope_H,
                        fmt=".3f", explain="flat" if abs(slope_H) < 0.1 else "not flat")
            ledger.note(f"{lab}, {sname}: dilution exponent beta", beta, fmt=".3f",
                        explain=f"rho_0 at n={n_max}: {mm[-1]:.3g}")
        results[lab] = res
    # the Shannon predictions of the seed: slope 1 at fixed T once distractors dominate is not
    # a prediction of the seed; its prediction is H ~ ln n - (s_max - s_bar)/T, i.e. a flat
    # H under T = d/(c ln n) only in the mean-field regime. Check what the seed does claim:
    sh = results["Shannon"]
    # (1) softmax's entropy at fixed T grows with n; (2) the ln n rescaling reduces that growth
    ledger.check("Shannon: dH/d ln n at fixed T > 0.5 (grows; 1 = yes)",
                 float(sh["fixed T = sqrt(d)"]["slope_H"] > 0.5), 1.0, tol=0, fmt=".0f",
                 explain=f"slope {sh['fixed T = sqrt(d)']['slope_H']:.3f}")
    ledger.check("Shannon: |dH/d ln n| smaller with T = d/(c ln n) (1 = yes)",
                 float(abs(sh["T = d/(c ln n)"]["slope_H"])
                       < abs(sh["fixed T = sqrt(d)"]["slope_H"])), 1.0, tol=0, fmt=".0f",
                 explain=f"slope {sh['T = d/(c ln n)']['slope_H']:.3f}")
    ledger.check("Shannon fixed T: dilution exponent beta (exponential tail: 1)",
                 sh["fixed T = sqrt(d)"]["beta"], 1.0, tol=0.1, kind="abs",
                 explain="sum_i exp((z_i - z_0)/T) grows like n")

    # ---------------------------------------------------------------- figure
    fig, axes = plt.subplots(2, 2, figsize=(13.5, 9.6), sharex=True)
    shades = {}
    for e in fams:
        lab = label(e)
        sh_ = shades.setdefault(type(e).__name__, 0)
        shades[type(e).__name__] += 1
        col = color(e, 0.4 * sh_)
        for k, sname in enumerate(schedules):
            r = results[lab][sname]
            ax = axes[0, k]
            ax.errorbar(ns, r["H"], yerr=r["H_std"], color=col, marker="o", ms=3, lw=1.4,
                        capsize=2, label=f"{lab}: dH/d ln n = {r['slope_H']:.2f}")
            ax = axes[1, k]
            mm = np.maximum(r["mass"], 1e-12)
            beta = (f"beta = {r['beta']:.2f}" if np.isfinite(r["beta"])
                    else "beta n/a (rho0 = 1 in some draws)")
            ax.plot(ns, mm, color=col, marker="o", ms=3, lw=1.4, label=f"{lab}: {beta}")
    for k, sname in enumerate(schedules):
        axes[0, k].plot(ns, np.log(ns), "k:", lw=1, label="ln n (uniform attention)")
        axes[1, k].plot(ns, 1 / np.array(ns, float), "k:", lw=1, label="1/n (uniform attention)")
        axes[0, k].set_ylabel(r"attention entropy $H = -\sum\rho_i\ln\rho_i$ (nats)")
        axes[0, k].set_title(f"{sname}: entropy", fontsize=10)
        axes[0, k].legend(fontsize=7)
        axes[1, k].set_yscale("log")
        axes[1, k].set_ylim(1e-6, 2)
        axes[1, k].set_ylabel(r"mass on the relevant key $\rho_0$")
        axes[1, k].set_xlabel(f"sequence length n (d = {d}, mean of {trials} draws)")
        axes[1, k].set_title(f"{sname}: relevant-key mass; (1 - rho0)/rho0 ~ n^beta",
                             fontsize=10)
        axes[1, k].legend(fontsize=7, loc="lower left")
        for a in axes[:, k]:
            a.set_xscale("log", base=2)
    axes[0, 1].text(0.98, 0.09, f"c = sqrt(d)/ln {n_ref} = {c:.3f}: T = {d / (c * np.log(16)):.1f}"
                    f" at n=16, {d / (c * np.log(n_max)):.2f} at n={n_max}",
                    transform=axes[0, 1].transAxes, fontsize=7.5, va="bottom", ha="right")
    k3 = results.get("Kaniadakis(0.3)")
    s_fx = results["Shannon"]["fixed T = sqrt(d)"]["slope_H"]
    s_ln = results["Shannon"]["T = d/(c ln n)"]["slope_H"]
    fig.suptitle(f"T = d/(c ln n) slows softmax's entropy growth (dH/d ln n {s_fx:.2f} -> "
                 f"{s_ln:.2f}) but does not stop it with a planted key; algebraic tails "
                 "(Kaniadakis, Burg, Abe)\nlet the distractors' aggregate mass swamp the relevant "
                 "key under either T (paper VI.3), while entmax keeps it by its exact cutoff",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94))

    fx, ln_ = "fixed T = sqrt(d)", "T = d/(c ln n)"
    ledger.headline("shannon_slopes", f"Shannon dH/d ln n: {sh[fx]['slope_H']:.2f} at fixed T, "
                    f"{sh[ln_]['slope_H']:.2f} with T = d/(c ln n)")
    ledger.headline("shannon_mass", f"Shannon relevant mass at n = {n_max}: "
                    f"{sh[fx]['mass'][-1]:.3g} (fixed T), {sh[ln_]['mass'][-1]:.3g} (ln n scaling)")
    if k3 is not None:
        ledger.headline("kaniadakis_mass", f"Kaniadakis(0.3) relevant mass at n = {n_max}: "
                        f"{k3[fx]['mass'][-1]:.2g} (fixed T), {k3[ln_]['mass'][-1]:.2g} "
                        f"(ln n scaling); dilution exponent beta = {k3[fx]['beta']:.2f}")
    rn = results.get("Renyi(2)")
    if rn is not None:
        ledger.headline("renyi_collapse", f"Renyi(2) at fixed T: relevant mass "
                        f"{rn[fx]['mass'][-1]:.2g} and entropy {rn[fx]['H'][-1]:.2f} "
                        f"(ln n = {np.log(n_max):.2f}) at n = {n_max}: its least-F branch "
                        "spreads out")
    ts = results.get("Tsallis(1.5)")
    ledger.headline("entmax_mass", f"entmax (Tsallis 1.5) relevant mass at n = {n_max}: "
                    f"{ts[fx]['mass'][-1]:.3f} (fixed T)")
    write_outputs(args, ledger, fig,
                  title="Entropy invariance across length",
                  caption="Attention entropy and relevant-key mass against the sequence length "
                  "for every family, at fixed T = sqrt(d) and with the entropy-invariant "
                  "T = d/(c ln n).",
                  data=dict(d=d, c=c, n_ref=n_ref, ns=ns, trials=trials, results=results))


if __name__ == "__main__":
    main()
