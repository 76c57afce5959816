"""Study 5: the temperature Renyi and Sharma-Mittal attention realize at a fixed external T.

- Renyi (q = 2) at fixed external T realizes the Tsallis map at T_eff = T/M_q(rho): T_eff/T
  against the score spread and the number of keys N, between the uniform limit N^(q-1) and
  the one-hot limit 1.
- The self-consistency M = M_q(Tsallis(z, T/M)) for q = 3 with two tightly separated top
  scores has a fold: three branches (two stable, one unstable). Which branch minimizes F,
  and which the damped dynamics (`relax`) reaches from several initial conditions.
- Sharma-Mittal (q, r) interpolates between Renyi (r -> 1) and Tsallis (r = q).

    python studies/renyi_temperature.py [--quick] [--out figures]
"""

from __future__ import annotations

import numpy as np
from _common import color, setup, write_outputs

NAME = "renyi_temperature"


def main(argv=None):
    args, ledger = setup(NAME, __doc__.splitlines()[0], argv)
    import jax
    import jax.numpy as jnp
    import matplotlib.pyplot as plt

    import fisherdyn as fd

    rng = np.random.default_rng(5)
    q2 = 2.0
    renyi2 = fd.Renyi(q2)

    # ------------------------------------------------ (a) T_eff/T against spread and N
    T = 1.0
    Ns = [4, 64] if args.quick else [4, 16, 64, 256]
    spreads = np.geomspace(0.01, 300.0, 12 if args.quick else 40)
    width = max(Ns)
    rows_z, rows_m, meta = [], [], []
    for N in Ns:
        g = rng.normal(size=N)
        g = (g - g.mean()) / g.std()  # unit spread, so z = s g has standard deviation s
        for s in spreads:
            zr = np.zeros(width)
            mr = np.zeros(width, bool)
            zr[:N], mr[:N] = s * g, True
            rows_z.append(zr)
            rows_m.append(mr)
            meta.append((N, s))
    # the Sharma-Mittal example's scores ride along in the same batch (one compilation)
    z_sm = np.array([1.2, 0.8, 0.5, 0.1, -0.3, -0.6, -1.0, -1.7])
    T_sm = 0.5
    zr = np.zeros(width)
    mr = np.zeros(width, bool)
    zr[: z_sm.size], mr[: z_sm.size] = z_sm, True
    rows_z.append(zr)
    rows_m.append(mr)
    Zb, Mb = jnp.asarray(np.array(rows_z)), jnp.asarray(np.array(rows_m))
    Tb = jnp.asarray([T] * len(meta) + [T_sm])
    info = fd.stationary_info(renyi2, Zb, Tb, mask=Mb)
    rho_b, Teff_b = np.asarray(info.rho), np.asarray(info.T_eff)
    ratio = (Teff_b[:-1] / T).reshape(len(Ns), spreads.size)
    M_b = np.asarray(renyi2.moment(jnp.asarray(rho_b), mask=Mb))
    self_consistency = np.max(np.abs(Teff_b / np.asarray(Tb) * M_b - 1))
    ledger.check("Renyi(2): max over (N, spread) |T_eff M_q(rho)/T - 1|", self_consistency, 0.0,
                 tol=1e-9, kind="max", fmt=".1e", explain="T_eff = T/M_q of the output")
    for jn, N in enumerate(Ns):
        ledger.check(f"Renyi(2), N={N}: T_eff/T at spread {spreads[0]:g} (uniform limit N^(q-1))",
                     ratio[jn, 0], N ** (q2 - 1), tol=1e-3, kind="rel")
        ledger.check(f"Renyi(2), N={N}: T_eff/T at spread {spreads[-1]:g} (one-hot limit 1)",
                     ratio[jn, -1], 1.0, tol=1e-6, kind="rel")
    rho_sm_renyi = rho_b[-1, : z_sm.size]

    # ------------------------------------------------ (b) the fold: q = 3, two close top scores
    q3 = 3.0
    renyi3 = fd.Renyi(q3)
    gap = 0.05
    z3 = np.array([1.0, 1.0 - gap, 0.0, -0.2, -0.5, -1.0])
    T3 = 0.95 * (2 * gap / q3)
    br = fd.stationary_branches(renyi3, jnp.asarray(z3), T3)
    valid = np.asarray(br.valid)
    bM, bF = np.asarray(br.M)[valid], np.asarray(br.free_energy)[valid]
    bstable, brho = np.asarray(br.stable)[valid], np.asarray(br.rho)[valid]
    order = np.argsort(bM)
    bM, bF, bstable, brho = bM[order], bF[order], bstable[order], brho[order]
    n_br = int(valid.sum())
    ledger.check(f"Renyi(3), T={T3:.4g}: number of self-consistent branches", n_br, 3, tol=0,
                 fmt=".0f", explain="fold")
    best = int(np.argmin(bF))
    ledger.check("least-F branch is stable (1 = yes)", float(bstable[best]), 1.0, tol=0,
                 fmt=".0f", explain=f"M = {bM[best]:.4g}")
    if not args.quick:  # (one more compilation)
        st = np.asarray(fd.stationary(renyi3, jnp.asarray(z3), T3))
        ledger.check("stationary() returns the least-F branch: max|drho|",
                     np.max(np.abs(st - brho[best])), 0.0, tol=1e-10, kind="max", fmt=".1e")
    # the consistency curve M -> M_q(Tsallis(z, T/M)), from the public Tsallis map
    Mg = np.geomspace(len(z3) ** (1 - q3), 1.0, 120 if args.quick else 400)
    ts3 = fd.Tsallis(q3)
    rho_curve = np.asarray(fd.stationary(ts3, jnp.broadcast_to(jnp.asarray(z3), (Mg.size, 6)),
                                         jnp.asarray(T3 / Mg)))
    Mq_curve = np.sum(rho_curve**q3, -1)
    # the damped dynamics from several initial conditions
    starts = {
        "uniform": np.full(6, 1 / 6),
        "mass on key 1": np.array([0.9, 0.02, 0.02, 0.02, 0.02, 0.02]),
        "mass on key 2": np.array([0.02, 0.9, 0.02, 0.02, 0.02, 0.02]),
        "split top two": np.array([0.45, 0.45, 0.025, 0.025, 0.025, 0.025]),
        "mass on the low keys": np.array([0.05, 0.05, 0.3, 0.3, 0.15, 0.15]),
    }
    if args.quick:
        starts = {k: starts[k] for k in ("uniform", "mass on key 1")}
    rho0 = jnp.asarray(np.array(list(starts.values())))
    sol = fd.relax(renyi3, jnp.broadcast_to(jnp.asarray(z3), rho0.shape), T3, mass=1.0,
                   damping=2 * np.sqrt(T3), rho0=rho0, throw=False)
    reached = {}
    ok = np.asarray(sol.result == fd.RESULTS.successful)
    for k, (name, r_end) in enumerate(zip(starts, np.asarray(sol.rho))):
        dist = np.max(np.abs(brho - r_end), -1)
        j = int(np.argmin(dist))
        reached[name] = dict(branch_M=float(bM[j]), stable=bool(bstable[j]), least_F=j == best,
                             distance=float(dist[j]), converged=bool(ok[k]))
        ledger.check(f"dynamics from '{name}' ends on a stable branch: max|drho|", dist[j], 0.0,
                     tol=1e-8, kind="max", fmt=".1e",
                     explain=f"M = {bM[j]:.4g}{' (least F)' if j == best else ' (not least F)'}"
                     + ("" if bstable[j] else " UNSTABLE"))
    # the fold diagram: branches against T
    T_scan = np.linspace(0.5, 1.6, 12 if args.quick else 45) * (2 * gap / q3)
    fold = []
    for Tk in T_scan:
        b = fd.stationary_branches(renyi3, jnp.asarray(z3), float(Tk))
        v = np.asarray(b.valid)
        fold.append(dict(T=float(Tk), M=np.asarray(b.M)[v], stable=np.asarray(b.stable)[v],
                         F=np.asarray(b.free_energy)[v]))
    three = [f["T"] for f in fold if len(f["M"]) >= 3]
    ledger.note("fold: T range with three branches (min)", min(three) if three else np.nan)
    ledger.note("fold: T range with three branches (max)", max(three) if three else np.nan)

    # ------------------------------------------------ (c) Sharma-Mittal between Renyi and Tsallis
    r_grid = np.linspace(1.0, q2, 21 if args.quick else 81)[1:]  # r = 1 is Renyi itself

    @jax.jit
    def sm_map(rs):
        def one(r):
            inf = fd.stationary_info(fd.SharmaMittal(jnp.asarray(q2), r), jnp.asarray(z_sm), T_sm)
            return inf.rho, inf.T_eff
        return jax.vmap(one)(rs)

    # one call: the grid and, last, r = 1 + 1e-6 next to Renyi
    rho_sm, Teff_sm = (np.asarray(a) for a in sm_map(jnp.asarray(np.append(r_grid, 1 + 1e-6))))
    near, rho_sm, Teff_sm = rho_sm[-1], rho_sm[:-1], Teff_sm[:-1]
    rho_ts = np.asarray(fd.stationary(fd.Tsallis(q2), jnp.asarray(z_sm), T_sm))
    ledger.check("Sharma-Mittal(2, r = 2) vs Tsallis(2): max|drho|",
                 np.max(np.abs(rho_sm[-1] - rho_ts)), 0.0, tol=1e-12, kind="max", fmt=".1e")
    ledger.check("Sharma-Mittal(2, r = 1 + 1e-6) vs Renyi(2): max|drho|",
                 np.max(np.abs(near - rho_sm_renyi)), 0.0, tol=1e-5, kind="max", fmt=".1e",
                 explain="O(r - 1)")
    ledger.note("Sharma-Mittal(2, r): T_eff/T at r = 1 (Renyi)", Teff_b[-1] / T_sm)

    # ---------------------------------------------------------------- figure
    fig, axes = plt.subplots(2, 2, figsize=(13.5, 9.6))
    (a1, a2), (a3, a4) = axes
    cmap = plt.get_cmap("viridis")
    for jn, N in enumerate(Ns):
        c = cmap(jn / max(len(Ns) - 1, 1))
        a1.loglog(spreads / T, ratio[jn], "o-", ms=2.5, color=c, label=f"N = {N}")
        a1.axhline(N ** (q2 - 1), color=c, lw=0.7, ls=":")
    a1.axhline(1.0, color="k", lw=0.7, ls=":")
    a1.set_xlabel("score spread std(z)/T")
    a1.set_ylabel(r"realized $T_{eff}/T = 1/M_2(\rho)$")
    a1.legend(title="dotted: uniform limit N^(q-1) and one-hot limit 1", title_fontsize=7)
    a1.set_title("Renyi(2) at fixed T: the realized temperature depends on the scores and N\n"
                 "(jumps: the least-F branch switches)", fontsize=9.5)

    a2.plot(Mg, Mq_curve - Mg, "k-", lw=1.3,
            label=r"residual $r(M) = M_3(\mathrm{Tsallis}_3(z, T/M)) - M$")
    a2.axhline(0, color="0.5", lw=0.9, ls="--")
    lines = []
    for j in range(n_br):
        a2.plot(bM[j], 0.0, "o", ms=9, mfc="C2" if bstable[j] else "w",
                mec="C2" if bstable[j] else "C3", mew=1.8)
        a2.annotate(str(j + 1), (bM[j], 0.0), xytext=(-4, 9), textcoords="offset points",
                    fontsize=9, weight="bold")
        tag = ("stable" if bstable[j] else "unstable") + (", least F" if j == best else "")
        hits = [n for n, rr in reached.items() if abs(rr["branch_M"] - bM[j]) < 1e-9]
        lines.append(f"{j + 1}: M = {bM[j]:.3f}, F = {bF[j]:.5f}, {tag}"
                     + (f"\n    reached from: {', '.join(hits)}" if hits else ""))
    a2.text(0.98, 0.97, "\n".join(lines), transform=a2.transAxes, fontsize=7.2, va="top",
            ha="right", bbox=dict(fc="w", ec="0.7", alpha=0.9))
    a2.set_xlim(0.2, 1.02)
    a2.set_xlabel("trial moment M (a branch is a zero of r)")
    a2.set_ylabel(r"self-consistency residual $r(M)$")
    a2.legend(loc="upper left")
    a2.set_title(f"Renyi(3), z = {z3.tolist()}, T = {T3:.4f}:\nthree self-consistent branches "
                 "(filled: stable, open: unstable)", fontsize=9.5)

    for f in fold:
        for M_, s_ in zip(f["M"], f["stable"]):
            a3.plot(f["T"], M_, "o", ms=4, mfc="C2" if s_ else "w", mec="C2" if s_ else "C3")
        Fmin = np.argmin(f["F"])
        a3.plot(f["T"], f["M"][Fmin], "k+", ms=8)
    a3.axvline(T3, color="0.5", lw=0.8, ls="--")
    a3.plot([], [], "o", mfc="C2", mec="C2", label="stable branch")
    a3.plot([], [], "o", mfc="w", mec="C3", label="unstable branch")
    a3.plot([], [], "k+", label="least free energy")
    a3.set_yscale("log")
    a3.set_xlabel("external temperature T")
    a3.set_ylabel(r"branch moment $M_3(\rho)$")
    a3.legend(loc="lower left")
    a3.set_title("the fold: three branches over a window of T (dashed: the T above)", fontsize=9.5)

    a4b = a4.twinx()
    r_all = np.concatenate([[1.0], r_grid])
    rho_all = np.vstack([rho_sm_renyi[None], rho_sm])
    for i in range(z_sm.size):
        a4.plot(r_all, rho_all[:, i], lw=1.3, color=plt.get_cmap("tab10")(i),
                label=f"z={z_sm[i]:+.1f}")
    a4.plot(q2, rho_ts[0], "k*", ms=9, label="Tsallis(2) (r = q)")
    a4.plot(1.0, rho_sm_renyi[0], "ks", ms=6, label="Renyi(2) (r = 1)")
    a4b.plot(r_all, np.concatenate([[Teff_b[-1]], Teff_sm]) / T_sm, color=color(fd.Renyi(2.0)),
             lw=2.2, ls="--")
    a4b.set_ylabel(r"$T_{eff}/T$ (dashed)", color=color(fd.Renyi(2.0)))
    a4b.grid(False)
    a4.set_xlabel("Sharma-Mittal r (q = 2)")
    a4.set_ylabel(r"weights $\rho_i$")
    a4.set_ylim(-0.02, 1.0)
    a4b.set_ylim(0.9, 4.6)
    a4.legend(fontsize=6.5, ncol=4, loc="upper center")
    a4.set_title(f"Sharma-Mittal(2, r) interpolates from Renyi (r = 1) to Tsallis (r = q), "
                 f"T = {T_sm:g}", fontsize=9.5)
    fig.suptitle("Renyi attention at a fixed external T realizes T_eff = T/M_q, which moves with "
                 "the scores and N; for q = 3 the self-consistency folds\ninto three branches, "
                 "and the damped dynamics can settle on a stable branch that does not minimize F",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94))

    ledger.headline("branches", f"Renyi(3): {n_br} branches at T = {T3:.4f}, M = "
                    + ", ".join(f"{m:.3f}" for m in bM)
                    + f"; least F at M = {bM[best]:.3f}")
    hit_other = [n for n, rr in reached.items() if not rr["least_F"]]
    ledger.headline("dynamics_branch", "the dynamics reaches the least-F branch from "
                    f"{len(reached) - len(hit_other)}/{len(reached)} starts; "
                    + ("from " + ", ".join(hit_other) + " it settles on M = 1 (one-hot)"
                       if hit_other else "always"))
    ledger.headline("uniform_limit", f"Renyi(2) T_eff/T from {ratio[-1, 0]:.1f} (N = {Ns[-1]}, "
                    f"uniform limit {Ns[-1] ** (q2 - 1):g}) to {ratio[-1, -1]:.3f} (one-hot)")
    write_outputs(args, ledger, fig,
                  title="Renyi and Sharma-Mittal temperature",
                  caption="The realized temperature T_eff = T/M_q against the score spread and N, "
                  "the three-branch fold of the q = 3 self-consistency with the branch each "
                  "initial condition relaxes to, and Sharma-Mittal between Renyi and Tsallis.",
                  data=dict(Ns=Ns, spreads=spreads, T_eff_over_T=ratio,
                            fold_example=dict(scores=z3, T=T3, M=bM, F=bF, stable=bstable,
                                              least_F_index=best),
                            reached=reached, fold_scan=fold,
                            sharma_mittal=dict(r=r_grid, T_eff_over_T=Teff_sm / T_sm)))


if __name__ == "__main__":
    main()
