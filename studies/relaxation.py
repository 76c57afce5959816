"""Study 6: relaxation of the damped Fisher-Lagrangian dynamics to the stationary laws.

For each family at the same scores: the paths rho_i(t) from uniform attention in the
under-damped, critical and over-damped regimes (`simulate`, sphere chart), the energy
H(t) - H* (non-increasing, dH/dt = -gamma sum rho_dot^2/rho) and the multiplier lambda(t);
the relaxation spectrum omega_k^2 about the fixed point (`relaxation_spectrum`: Shannon
isotropic, omega^2 = T; Kaniadakis stiff low-weight modes; Tsallis boundary modes of the
keys outside the support), and per-mode decay rates measured from a simulated run started
near the fixed point, overlaid on the predicted -Re s_k of m s^2 + gamma s + omega_k^2 = 0.

    python studies/relaxation.py [--quick] [--out figures]
"""

from __future__ import annotations

import numpy as np
from _common import color, label, setup, write_outputs

NAME = "relaxation"


def mode_rates(fd, ts, x, x_star, modes, lo=1e-9, drop=1e-3):
    """Decay rate of each mode amplitude a_k(t) = modes[:, k].(x(t) - x*), by
    `fd.envelope_rate` over the window where it has fallen by `drop` from its largest value
    and is still above `lo`."""
    a = np.abs((x - x_star) @ modes)  # (K_t, modes)
    return np.array([fd.envelope_rate(ts, a[:, k], hi=drop * np.max(a[:, k]), lo=lo)
                     for k in range(modes.shape[1])])


def main(argv=None):
    args, ledger = setup(NAME, __doc__.splitlines()[0], argv)
    import jax.numpy as jnp
    import matplotlib.pyplot as plt

    import fisherdyn as fd

    z = np.array([1.3, 0.2, -0.7, 0.5, -1.6, 0.9])
    T, m = 0.8, 1.0
    N = z.size
    fams = [fd.Shannon(), fd.Tsallis(1.5), fd.Kaniadakis(0.3), fd.Burg(), fd.Abe(1.5)]
    if args.quick:
        fams = fams[:2]
    n_save = 600 if args.quick else 2000
    regimes = ["under-damped", "critical", "over-damped"]
    out, spectra = {}, {}
    rng = np.random.default_rng(6)
    for e in fams:
        lab = label(e)
        rho_st = np.asarray(fd.stationary(e, jnp.asarray(z), T))
        sp0 = fd.relaxation_spectrum(e, jnp.asarray(z), T, mass=m, damping=1.0,
                                     rho=jnp.asarray(rho_st))
        w2 = np.asarray(sp0.omega2)
        g_crit = 2 * np.sqrt(m * w2.min())
        gammas = np.array([0.3 * g_crit, g_crit, 1.5 * 2 * np.sqrt(m * w2.max())])
        # the near-fixed-point run for the per-mode rates: over-damped, every mode excited
        g_modes = 3 * 2 * np.sqrt(m * w2.max())
        sp = [fd.relaxation_spectrum(e, jnp.asarray(z), T, mass=m, damping=float(g),
                                     rho=jnp.asarray(rho_st)) for g in (*gammas, g_modes)]
        slow = [float(s.slowest_rate) for s in sp]
        modes = np.asarray(sp[3].modes)
        x_star = np.sqrt(rho_st)
        coef = rng.choice([-1.0, 1.0], size=N - 1) * (1 + rng.uniform(size=N - 1))
        x0 = np.abs(x_star + 1e-4 * modes @ coef)
        rho0_near = x0**2 / np.sum(x0**2)
        t1 = np.array([28 / slow[0], 28 / slow[1], 28 / slow[2], 30 / slow[3]])
        rho0 = np.vstack([np.full((3, N), 1 / N), rho0_near])
        tr = fd.simulate(e, jnp.broadcast_to(jnp.asarray(z), (4, N)), T, mass=m,
                         damping=jnp.asarray(np.append(gammas, g_modes)),
                         rho0=jnp.asarray(rho0), t1=jnp.asarray(t1), saveat=n_save,
                         rtol=1e-10, atol=1e-13)
        ts, rho, H, lam = (np.asarray(a) for a in (tr.ts, tr.rho, tr.energy, tr.lam))
        F_star = float(fd.free_energy(e, jnp.asarray(z), jnp.asarray(rho_st), T))
        res = dict(t_show=10 / np.array(slow[:3]), rho_star=rho_st, omega2=w2,
                   boundary=np.asarray(sp0.boundary), gammas=gammas, gamma_modes=g_modes,
                   regimes={})
        for k, reg in enumerate(regimes):
            end = np.max(np.abs(rho[k, -1] - rho_st))
            rise = float(np.max(np.diff(H[k]), initial=0.0))
            ledger.check(f"{lab} {reg}: max|rho(t1) - rho*|", end, 0.0, tol=1e-8, kind="max",
                         fmt=".1e", explain=f"t1 = 28/slowest rate = {t1[k]:.3g}")
            ledger.check(f"{lab} {reg}: max increase of H between saves", rise, 0.0,
                         tol=1e-9 * max(1.0, abs(F_star)), kind="max", fmt=".1e",
                         explain="dH/dt = -gamma sum rho_dot^2/rho <= 0")
            res["regimes"][reg] = dict(gamma=gammas[k], t1=t1[k], end_error=end,
                                       max_energy_rise=rise, predicted_slowest=slow[k])
        pred = np.asarray(sp[3].decay_rates)
        meas = mode_rates(fd, ts[3], np.sqrt(rho[3]), x_star, modes)
        ok = np.isfinite(meas)
        rel = np.abs(meas[ok] / pred[ok] - 1)
        ledger.check(f"{lab}: per-mode decay rate, max rel. dev. from -Re s_k", rel.max(), 0.0,
                     tol=0.02, kind="max", fmt=".1e",
                     explain=f"{int(ok.sum())}/{N - 1} modes measured, gamma = {g_modes:.3g}")
        res.update(rates_predicted=pred, rates_measured=meas)
        if type(e).__name__ == "Shannon":
            ledger.check("Shannon: max|omega_k^2 - T|", np.max(np.abs(w2 - T)), 0.0, tol=1e-12,
                         kind="max", fmt=".1e", explain="isotropic relaxation")
        if type(e).__name__ == "Tsallis":
            nb = int(np.sum(np.asarray(sp0.boundary)))
            ledger.check(f"{lab}: boundary modes = keys off the support", nb,
                         int(np.sum(rho_st == 0)), tol=0, fmt=".0f")
        out[lab] = dict(ts=ts, rho=rho, H=H - F_star, lam=lam)
        spectra[lab] = res
        print(f"  {lab}: omega^2 = {np.array2string(w2, precision=3)}", flush=True)

    # ---------------------------------------------------------------- figure
    nf = len(fams)
    fig = plt.figure(figsize=(max(3.9 * nf + 1.5, 17), 19))
    gs = fig.add_gridspec(6, nf, height_ratios=[1, 1, 1, 1, 1, 1.35])
    key_cols = plt.get_cmap("tab10")(np.arange(N))
    reg_cols = ["C0", "C1", "C2"]
    for j, e in enumerate(fams):
        lab = label(e)
        o, s = out[lab], spectra[lab]
        for k, reg in enumerate(regimes):
            ax = fig.add_subplot(gs[k, j])
            keep = np.isfinite(o["ts"][k])
            for i in range(N):
                ax.plot(o["ts"][k][keep], o["rho"][k][keep, i], color=key_cols[i], lw=1.2)
                ax.axhline(s["rho_star"][i], color=key_cols[i], lw=0.6, ls=":")
            ax.set_xlim(0, s["t_show"][k])
            ax.set_title(f"{lab}: {reg} (gamma = {s['gammas'][k]:.3g})", fontsize=8.5)
            ax.set_ylabel(r"$\rho_i(t)$")
            if k == 2:
                ax.set_xlabel("t (continuous depth)")
        ax = fig.add_subplot(gs[3, j])
        for k, reg in enumerate(regimes):
            keep = np.isfinite(o["ts"][k])
            ax.semilogy(o["ts"][k][keep], np.maximum(o["H"][k][keep], 1e-16), color=reg_cols[k],
                        lw=1.2, label=reg)
        ax.set_xlim(0, max(s["t_show"]) * 1.5)
        ax.set_ylim(1e-14, None)
        ax.set_xlabel("t")
        ax.set_ylabel(r"$H(t) - F(\rho^*)$")
        ax.set_title(f"{lab}: energy (monotone)", fontsize=8.5)
        if j == 0:
            ax.legend(fontsize=7)
        ax = fig.add_subplot(gs[4, j])
        for k, reg in enumerate(regimes):
            keep = np.isfinite(o["ts"][k])
            ax.plot(o["ts"][k][keep], o["lam"][k][keep], color=reg_cols[k], lw=1.2, label=reg)
        ax.set_xlim(0, max(s["t_show"]))
        ax.set_xlabel("t")
        ax.set_ylabel(r"multiplier $\lambda(t)$")
        ax.set_title(f"{lab}: lambda(t)", fontsize=8.5)
    handles = [plt.Line2D([], [], color=key_cols[i], lw=1.5) for i in range(N)]
    handles.append(plt.Line2D([], [], color="k", ls=":", lw=0.8))
    fig.legend(handles, [f"key z = {v:+.1f}" for v in z] + ["stationary weight"],
               loc="upper center", ncol=N + 1, fontsize=8, bbox_to_anchor=(0.5, 0.952))

    half = max(nf // 2, 1)
    ax = fig.add_subplot(gs[5, :half])
    for j, e in enumerate(fams):
        s = spectra[label(e)]
        xs = j + np.linspace(-0.18, 0.18, N - 1)
        bnd = s["boundary"]
        ax.scatter(xs[~bnd], s["omega2"][~bnd], color=color(e), s=30, zorder=3)
        ax.scatter(xs[bnd], s["omega2"][bnd], facecolor="w", edgecolor=color(e), s=40,
                   zorder=3, marker="s")
    ax.axhline(T, color="k", lw=0.8, ls="--", label=r"$\omega^2 = T$ (Shannon, isotropic)")
    ax.scatter([], [], facecolor="w", edgecolor="k", marker="s", label="boundary mode (key off "
               "the support)")
    ax.set_xticks(range(nf))
    ax.set_xticklabels([label(e) for e in fams], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(r"stiffness $\omega_k^2$ at $\rho^*$")
    ax.legend(fontsize=7.5)
    ax.set_title(f"relaxation spectra at the same scores (T = {T:g}): Shannon isotropic, "
                 "the others spread", fontsize=9)
    ax = fig.add_subplot(gs[5, half:])
    lo, hi = np.inf, 0
    for e in fams:
        s = spectra[label(e)]
        p, mm = s["rates_predicted"], s["rates_measured"]
        ax.loglog(p, mm, "o", color=color(e), ms=6, mfc="none", mew=1.5,
                  label=f"{label(e)} (gamma = {s['gamma_modes']:.3g})")
        ok = np.isfinite(mm)
        lo, hi = min(lo, p[ok].min()), max(hi, p[ok].max())
    g = np.geomspace(lo / 1.5, hi * 1.5, 10)
    ax.loglog(g, g, "k-", lw=0.8, label="measured = predicted")
    ax.set_xlabel(r"predicted decay rate $-\mathrm{Re}\,s_k$ (slow root of "
                  r"$m s^2 + \gamma s + \omega_k^2$)")
    ax.set_ylabel("measured decay rate of mode k (simulated)")
    ax.legend(fontsize=7.5)
    ax.set_title("per-mode decay rates from a run started near rho* (over-damped)", fontsize=9)
    fig.suptitle("Damped Fisher dynamics relaxes every family onto its stationary law: "
                 "inertia overshoots below critical damping, the energy falls monotonically,\n"
                 "and the simulated decay rates match the predicted spectrum (Shannon isotropic, "
                 "Kaniadakis stiff low-weight modes, Tsallis boundary modes)", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.935))

    sh = spectra["Shannon"]
    ledger.headline("shannon_isotropic", f"Shannon omega^2 = {sh['omega2'].min():.6f} ... "
                    f"{sh['omega2'].max():.6f} (theory T = {T:g})")
    worst = max(np.nanmax(np.abs(s["rates_measured"] / s["rates_predicted"] - 1))
                for s in spectra.values())
    n_modes = sum(int(np.isfinite(s["rates_measured"]).sum()) for s in spectra.values())
    ledger.headline("rates", f"simulated per-mode decay rates match the spectrum within "
                    f"{100 * worst:.2f}% ({n_modes} modes)")
    if "Tsallis(1.5)" in spectra:
        t15 = spectra["Tsallis(1.5)"]
        ledger.headline("tsallis_boundary", f"Tsallis(1.5): {int(t15['boundary'].sum())} boundary "
                        f"modes (keys off the support), omega^2 = "
                        + ", ".join(f"{w:.3g}" for w in t15["omega2"][t15["boundary"]]))
    if "Kaniadakis(0.3)" in spectra:
        k3 = spectra["Kaniadakis(0.3)"]["omega2"]
        ledger.headline("kaniadakis_spread", f"Kaniadakis(0.3) omega^2 from {k3.min():.3g} to "
                        f"{k3.max():.3g}")
    write_outputs(args, ledger, fig,
                  title="Relaxation",
                  caption="Paths, energy and multiplier of the damped dynamics in three regimes "
                  "for every family, the relaxation spectra, and the simulated per-mode decay "
                  "rates against the predicted ones.",
                  data=dict(scores=z, T=T, mass=m,
                            families={k: {kk: vv for kk, vv in v.items()}
                                      for k, v in spectra.items()}))


if __name__ == "__main__":
    main()
