"""Study: do the attention paths of a weight-tied transformer follow damped Fisher-Lagrangian
dynamics, and does the fit recognize the normalizer the model was trained with?

Trains looped transformers (`fisherdyn.LoopedTransformer` on in-context recall) whose
attention normalizer is Shannon, Tsallis(q=1.5) or Kaniadakis(kappa=0.3), records the query's
attention row per loop and head, and fits every entropy family's damped dynamics (m > 0)
and its overdamped replicator flow (m = 0) to each path with `fisherdyn.fit_path`, under
two energy models (A: the last fitted layer's scores held fixed, pure relaxation; B: the
measured scores interpolated in depth). Reports the fit errors, AIC/BIC of first vs second
order, damping ratio and relaxation time, held-out prediction (fit the first half of the
loops, predict the rest) against a constant and a geodesic baseline, the identification
confusion table, and the depth test (a Shannon model retrained with 2L loops at half the
step, and the L model's weights run at half the step, compared at equal depth t).
Quick mode (the test suite's run) skips the 2L retraining and the depth fits: its depth
test compares only the L model's weights at half the step.

    python studies/weight_tied.py [--quick] [--out figures]

The full mode trains with the weight cache (`FISHERDYN_CACHE`), so reruns only fit.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from _common import color, draw_table, label, setup, write_outputs

NAME = "weight_tied"

FULL = dict(config={}, steps=1200, batch=64, eval_batch=1024, problems=2, restarts=3,
            lm_steps=30, families=None, depth_retrain=True)
QUICK = dict(config=dict(n_pairs=4, dim=8, corrupt=0.125, d_model=16, n_heads=2, d_mlp=32,
                         n_loops=4, step=2.0),
             steps=60, batch=32, eval_batch=256, problems=1, restarts=1, lm_steps=6,
             families=("Shannon", "Tsallis", "Kaniadakis"), depth_retrain=False)
# fitting precision (traced: changing them does not recompile)
ODE = dict(rtol=1e-5, atol=1e-7, max_ode_steps=160)
VARIANTS = (("A", "full"), ("B", "full"), ("A", "held"), ("B", "held"))
ORDERS = ((True, "m=0"), (False, "m>0"))  # m=0 first: it warm-starts m>0


def normalizers(fd):
    return [fd.Shannon(), fd.Tsallis(1.5), fd.Kaniadakis(0.3)]


def train_all(fd, S):
    """Every model of the study: (name, model, accuracy, role, true entropy)."""
    import jax.random as jr

    models = []
    base = None
    for e in normalizers(fd):
        cfg = fd.LoopedConfig(entropy=e, **S["config"])
        tr = fd.train_looped(cfg, seed=0, steps=S["steps"], batch=S["batch"],
                             eval_batch=S["eval_batch"], progress=True)
        models.append(dict(name=label(e), model=tr.model, accuracy=tr.accuracy, role="main",
                           entropy=e, seconds=tr.seconds, cached=tr.from_cache))
        if base is None:
            base = (cfg, tr.model)
    cfg, model = base
    L = cfg.n_loops
    if S["depth_retrain"]:
        cfg2 = dataclasses.replace(cfg, n_loops=2 * L)
        tr2 = fd.train_looped(cfg2, seed=0, steps=S["steps"], batch=S["batch"],
                              eval_batch=S["eval_batch"], progress=True)
        models.append(dict(name="Shannon, 2L retrained", model=tr2.model,
                           accuracy=tr2.accuracy, role="depth", entropy=cfg.entropy,
                           seconds=tr2.seconds, cached=tr2.from_cache))
    half = model.with_loops(2 * L)
    models.append(dict(name="Shannon, L weights at h/2", model=half,
                       accuracy=fd.evaluate_looped(half, jr.PRNGKey(5), S["eval_batch"]),
                       role="depth", entropy=cfg.entropy, seconds=0.0, cached=True))
    return models, L, cfg.step


def extract(fd, models, L, S):
    """Paths on the same problems: the fit grid t_l = l c/L (l = 0..L) and, for the figure,
    every loop up to 2c."""
    import jax.numpy as jnp
    import jax.random as jr

    cfg = models[0]["model"].config
    problems = fd.recall_task(jr.PRNGKey(2024), S["problems"], cfg.n_pairs, cfg.dim,
                              cfg.corrupt)
    for m in models:
        n = m["model"].n_loops
        lp = fd.extract_paths(m["model"], problems, 2 * n, dtype=jnp.float64)
        stride = n // L
        attn = np.moveaxis(np.asarray(lp.attn), 0, -2)  # (P, H, loops+1, N)
        scores = np.moveaxis(np.asarray(lp.scores), 0, -2)
        m["t_ext"] = np.asarray(lp.t)
        m["attn_ext"] = attn
        m["fit_rows"] = np.arange(L + 1) * stride
        m["attn"] = attn[..., m["fit_rows"], :]
        m["scores"] = scores[..., m["fit_rows"], :]
        m["t"] = np.asarray(lp.t)[m["fit_rows"]]
        m["loop_accuracy"] = np.asarray(lp.accuracy)
        m["T_model"] = float(lp.T)
        m["target"] = np.asarray(problems.target)
    return problems


def rms(x, axis=-1):
    return np.sqrt(np.mean(np.asarray(x) ** 2, axis=axis))


def fit_batch(fd, fam, paths, scores, t, L, S, *, overdamped, families, init=None):
    """All four variants (A/B x full/held-out) of a batch of paths in one call."""
    V = len(VARIANTS)
    K = L + 1
    shape = (V,) + paths.shape[:-2]
    energy = np.broadcast_to(np.array([v[0] for v in VARIANTS]).reshape((V,) + (1,) * (len(shape) - 1)), shape)
    half = L // 2 + 1
    masks = np.array([np.ones(K, bool) if v[1] == "full" else np.arange(K) < half
                      for v in VARIANTS]).reshape((V,) + (1,) * (len(shape) - 1) + (K,))
    return fd.fit_path(
        np.broadcast_to(paths, shape + paths.shape[-2:]), fam,
        scores=np.broadcast_to(scores, shape + scores.shape[-2:]), times=t,
        energy_model=energy, overdamped=overdamped, fit_layers=np.broadcast_to(masks, shape + (K,)),
        restarts=S["restarts"], steps=S["lm_steps"], seed=0, init=init, compile_with=families,
        **ODE)


def baselines(fd, attn, L):
    """Held-out rms FR distance of the constant and the geodesic-extrapolation baselines
    (fit layers 0..L/2, predict L/2+1..L)."""
    h = L // 2
    held = np.arange(h + 1, L + 1)
    last, prev = attn[..., h, :], attn[..., h - 1, :]
    const = np.asarray(fd.fisher_rao_distance(last[..., None, :], attn[..., held, :]))
    s = (1.0 + (held - h)).astype(float)
    geo_pred = np.asarray(fd.geodesic_interpolation(prev[..., None, :], last[..., None, :], s))
    geo = np.asarray(fd.fisher_rao_distance(geo_pred, attn[..., held, :]))
    return rms(const), rms(geo)


def summarize_fit(f, L):
    """Per-path numbers of one (family, order) fit, arrays with the batch shape (V, M, H, P)."""
    d = np.asarray(f.distances)
    h = L // 2
    fitted = np.where(np.asarray(f.success), 1.0, np.nan)
    out = dict(
        rms_fit=np.concatenate([rms(d[:2, ..., 1:]), rms(d[2:, ..., 1:h + 1])]) * fitted,
        held=rms(d[..., h + 1:]) * fitted,
        aic=np.where(np.asarray(f.success), np.asarray(f.aic), np.inf),
        bic=np.where(np.asarray(f.success), np.asarray(f.bic), np.inf),
        m=np.asarray(f.mass), gamma=np.asarray(f.damping), T=np.asarray(f.T),
        shape=np.asarray(f.shape), zeta=np.asarray(f.zeta),
        tau=np.asarray(f.relaxation_time), at_bound=np.asarray(f.at_bound),
        success=np.asarray(f.success), k=f.n_params,
    )
    return out


def med(x):
    """Median of the finite entries (NaN if none)."""
    x = np.asarray(x, float).ravel()
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def fmt(x, f=".3f"):
    x = float(x)
    if not np.isfinite(x):
        return "inf" if x > 0 else "-"
    return format(x, f)


def main(argv=None):
    args, ledger = setup(NAME, __doc__.splitlines()[0], argv)
    import jax
    import matplotlib.pyplot as plt

    import fisherdyn as fd

    S = QUICK if args.quick else FULL
    families = tuple(S["families"] or fd.fit_families)
    clock = {}
    t0 = time.perf_counter()
    models, L, c = train_all(fd, S)
    clock["train"] = time.perf_counter() - t0
    problems = extract(fd, models, L, S)
    main_models = [m for m in models if m["role"] == "main"]
    depth_models = [models[0]] + [m for m in models if m["role"] == "depth"]
    t = main_models[0]["t"]
    h = L // 2
    H = main_models[0]["attn"].shape[1]
    P = S["problems"]
    print(f"[{NAME}] L={L}, c={c}, heads={H}, problems={P}, N={main_models[0]['attn'].shape[-1]}"
          f", families={families}", flush=True)
    # (M, H, P, K, N) batches
    stack = lambda ms, key: np.stack([np.swapaxes(m[key], 0, 1) for m in ms])  # noqa: E731
    paths_main, scores_main = stack(main_models, "attn"), stack(main_models, "scores")
    paths_depth, scores_depth = stack(depth_models, "attn"), stack(depth_models, "scores")

    # ---------------------------------------------------------------- fits
    t0 = time.perf_counter()
    fits, summ = {}, {}
    for fam in families:
        for overdamped, order in ORDERS:
            t1 = time.perf_counter()
            init = None if overdamped else fits[fam, "m=0"]
            f = fit_batch(fd, fam, paths_main, scores_main, t, L, S, overdamped=overdamped,
                          families=families,
                          init=init)
            fits[fam, order] = f
            summ[fam, order] = summarize_fit(f, L)
            print(f"[{NAME}] fit {fam:<10} {order}: {time.perf_counter() - t1:6.1f} s, "
                  f"median rms (A, full) {np.nanmedian(summ[fam, order]['rms_fit'][0]):.4f}",
                  flush=True)
    depth_fits, prev = {}, None
    for overdamped, order in ORDERS if S["depth_retrain"] else ():
        prev = fit_batch(fd, "Shannon", paths_depth, scores_depth, t, L, S, families=families,
                         overdamped=overdamped, init=None if overdamped else prev)
        depth_fits[order] = summarize_fit(prev, L)
    clock["fit"] = time.perf_counter() - t0

    names = [m["name"] for m in main_models]
    true_fam = [type(m["entropy"]).__name__ for m in main_models]
    const_b, geo_b = baselines(fd, paths_main, L)  # (M, H, P)

    # ---------------------------------------------------------------- selection
    cands = [(fam, order) for fam in families for _, order in ORDERS]
    selection, confusion = {}, {}
    for vi, (em, split) in enumerate(VARIANTS[:2]):
        for crit in ("aic", "bic"):
            table = np.stack([summ[cd][crit][vi] for cd in cands])  # (C, M, H, P)
            pick = np.argmin(table, 0)
            fam_pick = np.array([cands[i][0] for i in pick.ravel()]).reshape(pick.shape)
            order_pick = np.array([cands[i][1] for i in pick.ravel()]).reshape(pick.shape)
            conf = np.zeros((len(names), len(families)), int)
            for mi in range(len(names)):
                for fi, fam in enumerate(families):
                    conf[mi, fi] = int(np.sum(fam_pick[mi] == fam))
            selection[em, crit] = dict(family=fam_pick, order=order_pick)
            confusion[em, crit] = conf

    # ---------------------------------------------------------------- per model/head table
    rows = []
    for mi, name in enumerate(names):
        tf = true_fam[mi]
        for hh in range(H):
            r = dict(model=name, head=hh, true_family=tf)
            for vi, (em, split) in enumerate(VARIANTS[:2]):
                r[f"rms_{em}"] = {f"{fam} {order}": float(med(summ[fam, order]["rms_fit"][vi, mi, hh]))
                                  for fam in families for _, order in ORDERS}
                sel = selection[em, "aic"]
                r[f"selected_{em}"] = [f"{a} {b}" for a, b in zip(sel["family"][mi, hh], sel["order"][mi, hh])]
                r[f"selected_{em}_bic"] = [
                    f"{a} {b}" for a, b in zip(selection[em, "bic"]["family"][mi, hh],
                                               selection[em, "bic"]["order"][mi, hh])]
                # second vs first order for the true family: AIC, BIC differences (negative:
                # inertia pays for its extra parameters)
                for crit in ("aic", "bic"):
                    r[f"d{crit}_{em}"] = float(med(summ[tf, "m>0"][crit][vi, mi, hh]
                                                  - summ[tf, "m=0"][crit][vi, mi, hh]))
                s1 = summ[tf, "m>0"]
                r[f"zeta_{em}"] = float(med(s1["zeta"][vi, mi, hh]))
                r[f"tau_layers_{em}"] = float(med(s1["tau"][vi, mi, hh])) * L / c
                r[f"m_{em}"] = float(med(s1["m"][vi, mi, hh]))
                r[f"gamma_{em}"] = float(med(s1["gamma"][vi, mi, hh]))
                r[f"T_{em}"] = float(med(s1["T"][vi, mi, hh]))
                r[f"shape_{em}"] = float(med(s1["shape"][vi, mi, hh]))
                r[f"at_bound_{em}"] = bool(np.any(s1["at_bound"][vi, mi, hh]))
            # held-out (fit loops 0..L/2, predict L/2+1..L)
            r["held"] = {f"{fam} {order} {em}": float(med(summ[fam, order]["held"][vi, mi, hh]))
                         for fam in families for _, order in ORDERS
                         for vi, (em, _) in list(enumerate(VARIANTS))[2:]}
            r["held_constant"] = float(med(const_b[mi, hh]))
            r["held_geodesic"] = float(med(geo_b[mi, hh]))
            rows.append(r)

    # ---------------------------------------------------------------- depth test
    def path_gap(a, b):
        """Mean FR distance of two (H, P, K, N) path sets at equal t (layers 1..L), for the
        identity and the swapped head pairing."""
        out = {}
        for pairing, perm in (("same heads", np.arange(H)), ("swapped heads", np.arange(H)[::-1])):
            d = np.asarray(fd.fisher_rao_distance(a, b[perm]))[..., 1:]
            out[pairing] = float(np.mean(d))
        return out

    ref = np.swapaxes(depth_models[0]["attn"], 0, 1)
    depth = dict(models=[m["name"] for m in depth_models], accuracy=[m["accuracy"] for m in depth_models])
    depth["path_gap"] = {m["name"]: path_gap(ref, np.swapaxes(m["attn"], 0, 1)) for m in depth_models[1:]}
    depth["params"] = {}
    for di, m in enumerate(depth_models if depth_fits else ()):
        for vi, (em, split) in enumerate(VARIANTS[:2]):
            for order in ("m>0", "m=0"):
                s = depth_fits[order]
                depth["params"][f"{m['name']} | {em} {order}"] = {
                    key: [float(med(s[key][vi, di, hh])) for hh in range(H)]
                    for key in ("m", "gamma", "T", "zeta", "rms_fit")}

    # ---------------------------------------------------------------- checks and notes
    # Every loop's attention is the trained normalizer's stationary law of that loop's
    # scores at the model's T, so the overdamped flow under energy model B (the measured
    # scores, interpolated) with a short relaxation time describes the path: its fitted T
    # and shape should be the model's. (Quick mode: barely trained, near-uniform attention;
    # the numbers are reported, not tested.)
    for mi, name in enumerate(names):
        tf = true_fam[mi]
        T_true = main_models[mi]["T_model"]
        e = main_models[mi]["entropy"]
        for order in ("m=0", "m>0"):
            Tb = float(med(summ[tf, order]["T"][1, mi].ravel()))
            key = f"{name}: T fitted (own family, B, {order}) / model T"
            if args.quick or order == "m>0":
                ledger.note(key, Tb / T_true)
            else:
                ledger.check(key, Tb / T_true, 1.0, tol=0.1, explain="1: each loop's "
                             "attention is the family's law of its scores at the model's T")
            if tf != "Shannon":
                true_shape = float(np.asarray(list(vars(e).values())[0]))
                sb = float(med(summ[tf, order]["shape"][1, mi].ravel()))
                key = f"{name}: shape fitted (own family, B, {order})"
                if args.quick or order == "m>0":
                    ledger.note(key, sb)
                else:
                    ledger.check(key, sb, true_shape, tol=0.2 * true_shape, explain="the "
                                 "trained normalizer's parameter")
        for em, vi in (("A", 0), ("B", 1)):
            diag = confusion[em, "aic"][mi, families.index(tf)] if tf in families else 0
            ledger.note(f"{name}: fraction of paths whose AIC picks {tf} ({em})",
                        diag / max(1, H * P), fmt=".2f")
    # nesting: restart 0 of the m>0 fit starts next to the m=0 optimum (inertial time 1/20
    # of its relaxation time, at least 1/50 of a layer step, zero velocity) and
    # Levenberg-Marquardt only accepts decreasing steps, so it should not end worse. That is
    # testable only where the explicit solver resolves that start within its step budget:
    # when the overdamped optimum relaxes in a small fraction of a layer the start is too
    # stiff, fails, and the m>0 fit cannot reach the overdamped limit (counted, not tested).
    for em, vis in (("A", [0, 2]), ("B", [1, 3])):
        worse, n_stiff, n_all = [], 0, 0
        for fam in families:
            lo = np.asarray(fits[fam, "m=0"].loss)[vis]
            l1 = np.asarray(fits[fam, "m>0"].loss)[vis]
            warm_ok = np.isfinite(np.asarray(fits[fam, "m>0"].restart_losses)[vis][..., 0])
            ok = np.isfinite(lo) & np.isfinite(l1) & warm_ok
            n_stiff += int(np.sum(np.isfinite(lo) & ~warm_ok))
            n_all += int(np.sum(np.isfinite(lo)))
            worse.append(np.max(np.where(ok, l1 / np.maximum(lo, 1e-300), 0.0)))
        ledger.check(f"energy model {em}: max over paths and families of loss(m>0) / "
                     "loss(m=0), where the m>0 start near the m=0 optimum was resolved",
                     max(worse), 1.0, tol=1.05, kind="max",
                     explain="the inertial model nests the overdamped one")
        ledger.note(f"energy model {em}: fraction of fits whose near-overdamped m>0 start was "
                    f"too stiff for {ODE['max_ode_steps']} explicit steps (nesting untested)",
                    n_stiff / max(1, n_all), fmt=".2f")
        tau0 = np.concatenate([np.ravel(summ[f_, "m=0"]["tau"][vis]) for f_ in families])
        ledger.note(f"energy model {em}: median relaxation time of the m=0 fits [layers]",
                    med(tau0) * L / c)
    for em, vi in (("A", 0), ("B", 1)):
        best_inertial = np.nanmin(np.stack([summ[f_, "m>0"]["aic"][vi] for f_ in families]), 0)
        best_over = np.nanmin(np.stack([summ[f_, "m=0"]["aic"][vi] for f_ in families]), 0)
        ledger.note(f"fraction of paths where m>0 beats m=0 by AIC ({em})",
                    float(np.mean(best_inertial < best_over)), fmt=".2f")
    for name, gap in depth["path_gap"].items():
        ledger.note(f"depth: mean FR gap at equal t, {name} (best pairing)",
                    min(gap.values()), fmt=".3f")
    # ---------------------------------------------------------------- headlines (README)
    acc = ", ".join(f"{m['name']} {m['accuracy']:.3f}" for m in main_models)
    ledger.headline("models", f"looped transformers, L = {L} loops, {H} heads: held-out "
                    f"accuracy {acc}")
    for em in ("A", "B"):
        conf = confusion[em, "aic"]
        diag = ", ".join(f"{n}: {conf[mi, families.index(true_fam[mi])]}/{H * P}"
                         for mi, n in enumerate(names) if true_fam[mi] in families)
        picks = {}
        for fam in selection[em, "aic"]["family"].ravel():
            picks[fam] = picks.get(fam, 0) + 1
        common = ", ".join(f"{f_} {c_}" for f_, c_ in sorted(picks.items(), key=lambda x: -x[1]))
        ledger.headline(f"identification_{em}", f"energy model {em}: AIC picks the trained "
                        f"family for {diag} paths (all picks: {common})")
        vi = ("A", "B").index(em)
        bi = np.nanmin(np.stack([summ[f_, "m>0"]["aic"][vi] for f_ in families]), 0)
        bo = np.nanmin(np.stack([summ[f_, "m=0"]["aic"][vi] for f_ in families]), 0)
        ledger.headline(f"inertia_{em}", f"energy model {em}: second order (m>0) beats the "
                        f"overdamped flow by AIC on {int(np.sum(bi < bo))}/{bi.size} paths")
    rec = []
    for mi, name in enumerate(names):
        tf = true_fam[mi]
        txt = f"{name} T x{med(summ[tf, 'm=0']['T'][1, mi]) / main_models[mi]['T_model']:.3f}"
        if tf != "Shannon":
            txt += f", shape {med(summ[tf, 'm=0']['shape'][1, mi]):.3f}"
        rec.append(txt)
    taus = [med(np.concatenate([np.ravel(summ[f_, "m=0"]["tau"][vis]) for f_ in families]))
            * L / c for vis in ([0, 2], [1, 3])]
    ledger.headline("recovery_B", "energy model B, own family m=0 fit recovers the trained "
                    f"normalizer: {'; '.join(rec)}; its relaxation time is {taus[1]:.3f} "
                    f"layers (A: {taus[0]:.2f}): attention follows the current scores")
    own_held = [r["held"][f"{r['true_family']} m>0 B"] for r in rows]
    ledger.headline("held_out", "held-out loops (fit the first half): own family m>0, B: rms "
                    f"FR {med(own_held):.3f}; constant {med([r['held_constant'] for r in rows]):.3f};"
                    f" geodesic {med([r['held_geodesic'] for r in rows]):.3f} (medians)")
    gaps = "; ".join(f"{n} {min(g.values()):.3f}" for n, g in depth["path_gap"].items())
    ledger.headline("depth", f"depth test, mean FR gap to the L model at equal t: {gaps}")
    ledger.timing("training (or loading)", clock["train"])
    ledger.timing("fitting", clock["fit"])

    # ---------------------------------------------------------------- figures
    fig_paths(fd, plt, fits, main_models, families, L, c, args)
    fig = fig_tables(plt, rows, names, families, confusion, depth, H, P, L)
    data = dict(
        settings=dict(quick=args.quick, L=L, c=c, heads=H, problems=P, families=families,
                      restarts=S["restarts"], lm_steps=S["lm_steps"], **ODE,
                      variants=[f"{a} {b}" for a, b in VARIANTS],
                      held_out=f"fit loops 0..{h}, predict {h + 1}..{L}"),
        models=[dict(name=m["name"], accuracy=m["accuracy"], role=m["role"],
                     loop_accuracy=m["loop_accuracy"], T=m["T_model"],
                     cached=m["cached"]) for m in models],
        rows=rows,
        confusion={f"{em} {crit}": dict(rows=names, columns=list(families), counts=conf)
                   for (em, crit), conf in confusion.items()},
        depth=depth,
        per_path={f"{fam} {order}": {k: v for k, v in s.items() if k != "k"} | {"k": s["k"]}
                  for (fam, order), s in summ.items()},
        baselines=dict(constant=const_b, geodesic=geo_b),
    )
    write_outputs(args, ledger, fig, title="Weight-tied transformer attention paths vs "
                  "damped Fisher-Lagrangian dynamics", caption=FIG_CAPTION, data=data,
                  png_name=f"{NAME}_fits.png", images=[f"{NAME}_paths.png", f"{NAME}_fits.png"])


FIG_CAPTION = (
    "Fits of every entropy family's damped Fisher-Lagrangian dynamics (m>0) and overdamped "
    "replicator flow (m=0) to the query's attention path per loop of looped transformers "
    "trained with Shannon, Tsallis(1.5) and Kaniadakis(0.3) normalizers. Energy model A: "
    "last fitted scores held fixed; B: measured scores interpolated in depth. rms = root "
    "mean square Fisher-Rao distance per fitted layer (medians over problems)."
)


def fig_paths(fd, plt, fits, main_models, families, L, c, args):
    """Measured attention (dots, every loop to 2c) with the fitted trajectories (lines)."""
    import jax

    M = len(main_models)
    F = len(families)
    fig, axes = plt.subplots(M, F, figsize=(2.6 * F + 0.5, 2.3 * M + 0.6), squeeze=False,
                             sharex=True, sharey="row")
    # full mode: the fitted model integrated on a fine grid to 2c; quick mode: its values at
    # the fitted layers only (saves compiling the prediction program)
    t_dense = main_models[0]["t"] if args.quick else np.linspace(0.0, 2 * c, 121)
    # one example per model: problem 0, the head with the most concentrated final attention
    heads = [int(np.argmax(m["attn"][0, :, -1].max(-1))) for m in main_models]
    styles = [((0, "m>0"), "-", "A, m>0"), ((0, "m=0"), "--", "A, m=0"),
              ((1, "m>0"), ":", "B, m>0")]
    for fi, fam in enumerate(families):
        curves = {}
        for (vi, order), _, _ in styles:
            f = fits[fam, order]
            idx = (vi, np.arange(M), np.asarray(heads), 0)
            sub = jax.tree_util.tree_map(lambda x: x[idx], f)
            curves[vi, order] = np.asarray(sub.rho if args.quick else sub.predict(t_dense))
        for mi, m in enumerate(main_models):
            ax = axes[mi, fi]
            a = m["attn_ext"][0, heads[mi]]  # (loops+1, N)
            top = np.argsort(-a.max(0))[:3]
            for j, k in enumerate(top):
                col = f"C{j}"
                ax.plot(m["t_ext"], a[:, k], "o", ms=2.5, color=col, alpha=0.8)
                for (vi, order), ls, _ in styles:
                    ax.plot(t_dense, curves[vi, order][mi, :, k], ls, lw=1.0, color=col)
            ax.axvline(c, color="k", lw=0.6, alpha=0.5)
            ax.axvline(c / 2, color="k", lw=0.4, alpha=0.3, ls=":")
            if mi == 0:
                ax.set_title(f"fit: {fam}", color=color(type(fam, (), {})()))
            if fi == 0:
                ax.set_ylabel(f"trained {m['name']}\nhead {heads[mi]}: weight")
            if mi == M - 1:
                ax.set_xlabel("depth t (trained to t = c)")
    handles = [plt.Line2D([], [], color="k", ls=ls, label=lab) for _, ls, lab in styles]
    handles.append(plt.Line2D([], [], color="k", ls="", marker="o", ms=3, label="measured"))
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("Attention on the 3 largest keys per loop (dots) and fitted Fisher-Lagrangian "
                 "trajectories (lines)\nfits use loops up to t = c (solid vertical line); beyond "
                 "it is extrapolation", fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(args.out / f"{NAME}_paths.png", dpi=110)
    plt.close(fig)


def fig_tables(plt, rows, names, families, confusion, depth, H, P, L):
    short = {"Shannon": "Sh", "Tsallis": "Ts", "Renyi": "Re", "Kaniadakis": "Ka", "Abe": "Ab",
             "Burg": "Bu"}
    fig = plt.figure(figsize=(13, 15.5))
    gs = fig.add_gridspec(6, 2, height_ratios=[1.2, 1.2, 1.2, 1.2, 0.8, 0.9])
    lab = lambda r: f"{r['model']} h{r['head']}"  # noqa: E731
    for k, em in enumerate(("A", "B")):
        ax = fig.add_subplot(gs[k, :])
        header = ["model / head"] + [f"{short.get(f_, f_)} m>0 / m=0" for f_ in families]
        body = []
        for r in rows:
            best = min(r[f"rms_{em}"].values())
            cells = []
            for f_ in families:
                a, b = r[f"rms_{em}"][f"{f_} m>0"], r[f"rms_{em}"][f"{f_} m=0"]
                s = f"{fmt(a)} / {fmt(b)}"
                if min(a, b) == best:
                    s += " *"
                cells.append(s)
            body.append([lab(r)] + cells)
        draw_table(ax, header, body, fontsize=7.5, title=(
            f"Energy model {em}: fit error, rms Fisher-Rao distance per layer (loops 1..{L}), "
            f"median over {P} problem(s); * = smallest"))
    ax = fig.add_subplot(gs[2, :])
    header = ["model / head", "AIC picks (A)", "AIC picks (B)", "dAIC 2nd-1st A / B",
              "dBIC A / B", "zeta A / B", "tau [layers] A / B", "T fit A / B", "shape A / B"]
    body = []
    for r in rows:
        picks = lambda key: ", ".join(  # noqa: E731
            f"{short.get(s.split()[0], s)} {s.split()[1]}" for s in r[key])
        body.append([
            lab(r), picks("selected_A"), picks("selected_B"),
            f"{fmt(r['daic_A'], '.1f')} / {fmt(r['daic_B'], '.1f')}",
            f"{fmt(r['dbic_A'], '.1f')} / {fmt(r['dbic_B'], '.1f')}",
            f"{fmt(r['zeta_A'], '.2f')} / {fmt(r['zeta_B'], '.2f')}",
            f"{fmt(r['tau_layers_A'], '.2f')} / {fmt(r['tau_layers_B'], '.2f')}"
            + (" (bound)" if r["at_bound_A"] or r["at_bound_B"] else ""),
            f"{fmt(r['T_A'], '.2f')} / {fmt(r['T_B'], '.2f')}",
            f"{fmt(r['shape_A'], '.2f')} / {fmt(r['shape_B'], '.2f')}",
        ])
    draw_table(ax, header, body, fontsize=7, title=(
        "Model selection per path (AIC over every family and order) and the trained family's "
        "own m>0 fit: dAIC/dBIC < 0 favours inertia; zeta, tau about the final energies' fixed "
        "point"))
    ax = fig.add_subplot(gs[3, :])
    header = ["model / head", "own fam. A m>0", "own A m=0", "own B m>0", "own B m=0",
              "best fam. A m>0", "constant", "geodesic"]
    body = []
    for r in rows:
        tf = r["true_family"]
        hd = r["held"]
        best_a = min((hd[f"{f_} m>0 A"], f_) for f_ in families)
        own = lambda o, em: hd.get(f"{tf} {o} {em}", np.nan)  # noqa: E731
        body.append([lab(r), fmt(own("m>0", "A")), fmt(own("m=0", "A")), fmt(own("m>0", "B")),
                     fmt(own("m=0", "B")), f"{fmt(best_a[0])} ({short.get(best_a[1])})",
                     fmt(r["held_constant"]), fmt(r["held_geodesic"])])
    draw_table(ax, header, body, fontsize=7.5, title=(
        f"Held-out prediction: fit loops 0..{L // 2}, rms FR distance on loops {L // 2 + 1}.."
        f"{L} (B holds the last fitted scores: no future scores are used)"))
    for k, em in enumerate(("A", "B")):
        ax = fig.add_subplot(gs[4, k])
        conf = confusion[em, "aic"]
        header = ["trained \\ selected"] + [short.get(f_, f_) for f_ in families]
        body = [[n] + [str(v) for v in conf[i]] for i, n in enumerate(names)]
        draw_table(ax, header, body, fontsize=8, title=(
            f"Identification (energy model {em}, AIC over families x orders; "
            f"{H * P} paths per model)"))
    ax = fig.add_subplot(gs[5, :])
    header = ["model", "accuracy", "FR gap to L model (same / swapped heads)",
              "A m>0: m, gamma, T (per head)", "B m>0: m, gamma, T (per head)"]
    body = []
    for i, name in enumerate(depth["models"]):
        gap = depth["path_gap"].get(name)
        gs_ = "-" if gap is None else f"{gap['same heads']:.3f} / {gap['swapped heads']:.3f}"
        cells = []
        for em in ("A", "B"):
            p = depth["params"].get(f"{name} | {em} m>0")
            if p is None:
                cells.append("(full mode only)")
                continue
            cells.append("; ".join(f"{p['m'][hh]:.2g}, {p['gamma'][hh]:.2g}, {p['T'][hh]:.2g}"
                                   for hh in range(H)))
        body.append([name, f"{depth['accuracy'][i]:.3f}", gs_] + cells)
    draw_table(ax, header, body, fontsize=7.5, title=(
        "Depth test (Shannon): paths at equal t = l c/L and the fitted parameters (Shannon "
        "family, medians over problems)"))
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
