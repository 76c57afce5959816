"""Study 2: tails and low-score sensitivity.

The stationary weights rho_i and their sensitivities d rho_i / d z_i (the diagonal of the
exact Jacobian, `stationary_jacobian`) against the score gap z_max - z_i, on semilog and
log-log axes, with fitted slopes against theory:
- Kaniadakis: rho ~ C_kappa |w|^(-1/kappa), C_kappa = ((1-kappa)/(2 kappa))^(1/kappa),
  w = (z - mu)/T; sensitivity ~ 2 C^(1+kappa)/(T(1-kappa)) |w|^(-(1+kappa)/kappa);
- Burg: rho = T/(mu - z) (inverse-linear), sensitivity rho^2/T ~ gap^-2;
- Shannon (softmax): exponential, d ln rho/d gap = -1/T, sensitivity rho(1 - rho)/T;
- Tsallis q = 1.5 (entmax): exactly zero weight and zero sensitivity past the threshold.

The multiplier mu is read off the top key through the family's own law,
mu = z_top - T G(rho_top) (a consistency identity, not a fit).

    python studies/tails.py [--quick] [--out figures]
"""

from __future__ import annotations

import numpy as np
from _common import color, label, loglog_slope, setup, write_outputs

NAME = "tails"


def main(argv=None):
    args, ledger = setup(NAME, __doc__.splitlines()[0], argv)
    import jax.numpy as jnp
    import matplotlib.pyplot as plt
    import scipy.optimize

    import fisherdyn as fd

    T = 1.0
    n = 60 if args.quick else 160
    gap = np.concatenate([[0.0], np.geomspace(1e-2, 1e3, n - 1)])
    z = -gap
    far = gap >= 100.0  # the fit window: the last decade of gaps
    kappas = [0.3] if args.quick else [0.2, 0.3, 0.5]
    # Kaniadakis' kappa as an array: one compilation for every kappa
    fams = [fd.Shannon(), fd.Tsallis(1.5)] + [fd.Kaniadakis(jnp.asarray(k)) for k in kappas]
    fams += [fd.Burg()]

    fig, axes = plt.subplots(2, 2, figsize=(13.5, 9.5))
    (a_lin, a_log), (s_lin, s_log) = axes
    data, shade = {}, {}
    for e in fams:
        lab = label(e)
        kind = type(e).__name__
        sh = shade.setdefault(kind, 0)
        shade[kind] += 1
        info = fd.stationary_info(e, jnp.asarray(z), T)
        rho = np.asarray(info.rho)
        J = np.asarray(fd.stationary_jacobian(e, jnp.asarray(z), T))
        sens = np.diag(J).copy()
        d = dict(rho=rho, sensitivity=sens)
        c = color(e, 0.35 * sh)
        ls = ["-", "--", ":"][sh % 3]
        fit_lab = lab
        theory_rho = theory_sens = None
        mu = z[0] - T * float(e.G(jnp.asarray(rho[0])))  # the law at the top key
        w = np.abs(z - mu) / T  # |w_i| = (mu - z_i)/T
        d["mu"] = mu
        if kind == "Kaniadakis":
            k = float(e.kappa)
            C = ((1 - k) / (2 * k)) ** (1 / k)
            theory_rho = C * w ** (-1 / k)
            theory_sens = 2 * C ** (1 + k) / (T * (1 - k)) * w ** (-(1 + k) / k)
            # docs/math.md §3 closed form of the diagonal: c_i - c_i^2/sum(c)
            cc = 2 * rho / (T * ((1 + k) * rho**k + (1 - k) * rho ** (-k)))
            ledger.check(f"{lab}: max rel|dJ_ii - (c_i - c_i^2/sum c)|",
                         np.max(np.abs(sens - (cc - cc**2 / cc.sum())) / (cc - cc**2 / cc.sum())),
                         0.0, tol=1e-9, kind="max", fmt=".1e", explain="exact Jacobian")
            slope, _ = loglog_slope(w[far], rho[far])
            slope_s, _ = loglog_slope(w[far], sens[far])
            # prefactor with the exponent fixed at theory (deepest decade)
            C_fit = float(np.exp(np.mean(np.log(rho[far]) + np.log(w[far]) / k)))
            ledger.check(f"{lab}: weight exponent vs |w|", slope, -1 / k, tol=2e-3, kind="rel",
                         explain="theory -1/kappa; fit on gaps [100, 1000]")
            ledger.check(f"{lab}: prefactor C_kappa", C_fit, C, tol=2e-3, kind="rel",
                         explain="((1-k)/(2k))^(1/k)")
            ledger.check(f"{lab}: sensitivity exponent vs |w|", slope_s, -(1 + k) / k, tol=2e-3,
                         kind="rel", explain="theory -(1+kappa)/kappa")
            ledger.check(f"{lab}: max rel. dev. from C|w|^(-1/k) at the deepest key",
                         abs(rho[-1] / theory_rho[-1] - 1), 0.0, tol=1e-3, kind="max",
                         fmt=".1e", explain="O(1/w^2) correction")
            slope_gap, _ = loglog_slope(gap[far], rho[far])
            d.update(kappa=k, exponent=slope, exponent_theory=-1 / k, C_fit=C_fit, C_theory=C,
                     sens_exponent=slope_s, sens_exponent_theory=-(1 + k) / k,
                     exponent_vs_gap=slope_gap)
            fit_lab = (f"{lab}: slope {slope:.3f} (-1/k={-1 / k:.3f}), C={C_fit:.3g} "
                       f"(theory {C:.3g})")
            sens_lab = f"{lab}: slope {slope_s:.3f} (-(1+k)/k={-(1 + k) / k:.3f})"
        elif kind == "Burg":
            theory_rho = T / (mu - z)
            theory_sens = theory_rho**2 / T
            slope, _ = loglog_slope(w[far], rho[far])
            slope_s, _ = loglog_slope(w[far], sens[far])
            ledger.check(f"{lab}: weight exponent vs |w|", slope, -1.0, tol=1e-9, kind="abs")
            ledger.check(f"{lab}: sensitivity exponent vs |w|", slope_s, -2.0, tol=5e-3,
                         kind="abs", explain="asymptotic; c_i^2/sum c bends it at finite gap")
            cc = rho**2 / T
            ledger.check(f"{lab}: max rel|dJ_ii - (c_i - c_i^2/sum c)|",
                         np.max(np.abs(sens - (cc - cc**2 / cc.sum())) / (cc - cc**2 / cc.sum())),
                         0.0, tol=1e-9, kind="max", fmt=".1e", explain="exact Jacobian")
            ledger.check(f"{lab}: max|rho - T/(mu - z)|", np.max(np.abs(rho - theory_rho)), 0.0,
                         tol=1e-14, kind="max", fmt=".1e")
            d.update(exponent=slope, sens_exponent=slope_s)
            fit_lab = f"{lab}: slope {slope:.4f} (theory -1)"
            sens_lab = f"{lab}: slope {slope_s:.4f} (theory -2)"
        elif kind == "Shannon":
            ok = rho > 1e-300
            sel = ok & (gap >= 10)
            rate = -np.polyfit(gap[sel], np.log(rho[sel]), 1)[0]
            rate_s = -np.polyfit(gap[sel], np.log(sens[sel]), 1)[0]
            theory_rho = np.exp(-w)  # rho = exp((z - mu)/T) with mu = log-sum-exp
            theory_sens = theory_rho * (1 - theory_rho) / T
            ledger.check(f"{lab}: -d ln(rho)/d(gap)", rate, 1 / T, tol=1e-9, kind="rel")
            ledger.check(f"{lab}: -d ln(sensitivity)/d(gap)", rate_s, 1 / T, tol=1e-9, kind="rel")
            d.update(rate=rate, sens_rate=rate_s)
            fit_lab = f"{lab}: rate {rate:.6f} (1/T = {1 / T:g})"
            sens_lab = f"{lab}: rate {rate_s:.6f} (1/T)"
        else:  # Tsallis (entmax)
            q = float(e.q)
            zeros = rho == 0
            first = int(np.argmax(zeros))
            # independent reference: the threshold of sum_i [(q-1)(z_i - th)/(qT)]_+^(1/(q-1))
            # = 1 by scipy's brentq on the closed form
            def f(th):
                return np.sum(np.maximum((q - 1) * (z - th) / (q * T), 0) ** (1 / (q - 1))) - 1

            theta = scipy.optimize.brentq(f, z[0] - q * T / (q - 1), z[0], xtol=1e-15)
            gap_star = z[0] - theta
            ledger.check(f"{lab}: threshold gap (weights zero beyond)", gap[first - 1] < gap_star
                         <= gap[first], 1.0, tol=0, fmt=".0f",
                         explain=f"brentq threshold gap {gap_star:.5g} between last nonzero "
                         f"{gap[first - 1]:.5g} and first zero {gap[first]:.5g}")
            ledger.check(f"{lab}: all weights past the threshold exactly 0",
                         float(np.all(rho[gap > gap_star] == 0)), 1.0, tol=0, fmt=".0f")
            ledger.check(f"{lab}: max|d rho_i/d z_i| past the threshold",
                         np.max(np.abs(sens[gap > gap_star])), 0.0, tol=0.0, kind="max",
                         fmt=".1e", explain="exactly 0")
            theory_rho = np.maximum((q - 1) * (z - theta) / (q * T), 0) ** (1 / (q - 1))
            ledger.check(f"{lab}: max|rho - closed form at brentq threshold|",
                         np.max(np.abs(rho - theory_rho)), 0.0, tol=1e-12, kind="max", fmt=".1e")
            d.update(threshold_gap=gap_star, support=int(np.sum(~zeros)))
            fit_lab = f"{lab}: exactly 0 past gap {gap_star:.3f} ({int(np.sum(~zeros))} keys)"
            sens_lab = f"{lab}: exactly 0 past gap {gap_star:.3f}"
            for a in axes.flat:
                a.axvline(gap_star, color=c, lw=0.8, ls=":")
        data[lab] = d
        r_plot = np.where(rho > 0, rho, np.nan)
        s_plot = np.where(sens > 0, sens, np.nan)
        lin = gap <= 40
        a_lin.semilogy(gap[lin], r_plot[lin], color=c, ls=ls, lw=1.6, label=fit_lab)
        a_log.loglog(gap[1:], r_plot[1:], color=c, ls=ls, lw=1.6, label=lab)
        s_lin.semilogy(gap[lin], s_plot[lin], color=c, ls=ls, lw=1.6, label=sens_lab)
        s_log.loglog(gap[1:], s_plot[1:], color=c, ls=ls, lw=1.6, label=lab)
        if theory_rho is not None and kind in ("Kaniadakis", "Burg"):
            a_log.loglog(gap[1:], theory_rho[1:], color="k", lw=0.7, ls=(0, (2, 2)))
            s_log.loglog(gap[1:], theory_sens[1:], color="k", lw=0.7, ls=(0, (2, 2)))
        print(f"  {fit_lab}", flush=True)

    for a in (a_lin, a_log):
        a.set_ylabel(r"weight $\rho_i$")
    for a in (s_lin, s_log):
        a.set_ylabel(r"low-score sensitivity $\partial\rho_i/\partial z_i$")
    for a in (a_lin, s_lin):
        a.set_xlabel(r"score gap $z_{max} - z_i$ (T = 1)")
        a.set_ylim(1e-20, 2)
        a.legend(loc="lower left", fontsize=7)
    for a in (a_log, s_log):
        a.set_xlabel(r"score gap $z_{max} - z_i$ (log axis, T = 1)")
        a.set_ylim(1e-30, 2)
        a.axvspan(100, 1000, color="0.92", zorder=0)
        a.plot([], [], color="k", lw=0.7, ls=(0, (2, 2)),
               label=r"theory: $C_\kappa|w|^{-1/\kappa}$, $T/(\mu - z)$ (and $c_i$)")
        a.legend(loc="lower left", fontsize=7, title="shaded: fit window", title_fontsize=7)
    a_lin.set_title("weights, semilog: softmax is the straight line (exponential)")
    a_log.set_title("weights, log-log: Kaniadakis and Burg are straight lines (algebraic)")
    s_lin.set_title("sensitivities, semilog")
    s_log.set_title("sensitivities, log-log: Kaniadakis keeps |w|^(-(1+k)/k)")
    fig.suptitle("Low scores keep algebraic weight and sensitivity under Kaniadakis "
                 r"($\rho \sim C_\kappa|w|^{-1/\kappa}$) and Burg ($\sim$ 1/gap); softmax "
                 "suppresses them exponentially, entmax exactly", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))

    k3 = data.get("Kaniadakis(0.3)")
    ledger.headline("kaniadakis_0.3_exponent",
                    f"Kaniadakis(0.3): weight exponent {k3['exponent']:.4f} (theory "
                    f"{k3['exponent_theory']:.4f}), C_kappa {k3['C_fit']:.4g} (theory "
                    f"{k3['C_theory']:.4g}), sensitivity exponent {k3['sens_exponent']:.4f} "
                    f"(theory {k3['sens_exponent_theory']:.4f})")
    ledger.headline("burg_exponent", f"Burg: weight exponent {data['Burg']['exponent']:.4f}, "
                    f"sensitivity {data['Burg']['sens_exponent']:.4f} (theory -1, -2)")
    ledger.headline("entmax_threshold", f"entmax (Tsallis 1.5): exactly zero weight and "
                    f"sensitivity past gap {data['Tsallis(1.5)']['threshold_gap']:.4f}")
    write_outputs(args, ledger, fig,
                  title="Tails and low-score sensitivity",
                  caption="Weights and low-score sensitivities against the score gap on "
                  "semilog and log-log axes, with the fitted slopes against theory.",
                  data=dict(T=T, gap=gap, families=data))


if __name__ == "__main__":
    main()
