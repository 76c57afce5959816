"""Timescales: whose modes are the slow attention-bearing modes of cached looped models with
a carried attention state (the Fisher controls of the pilot): the residual stream's or
the attention state's own (`evidence_timescales.loop_timescales`).

Takes the pilot's design, recipe and `--seeds`/`--families` options and reads the models
from the weight cache (it trains nothing; a seed without a model is listed with its
reason). Per model it linearizes the loop at the state after 16L loops for the first
`--jacobians` problems and, per problem and head, labels the `--modes` slowest
attention-bearing modes, and reads `linear_response` on the whole loop map beside it on the
attention state's own map with the stream held (`attention_block_response`), whose fitted
$(m, \\gamma)$ are compared with the loop's learned ones:

    python studies/weight_tied timescales $D --loop-kind fisher --mass 0.1 --damping 1 \\
        --substeps 5 --seeds 0-7 --families shannon tsallis kaniadakis \\
        --json figures/weight_tied_timescales.json --figure figures/weight_tied_timescales.png

`--resume` takes a model's result from earlier `--json` files of this command when its
design, training recipe and settings (`--modes`, `--jacobians`, `--fp-problems`) match, so
that a seed trained later joins the summary without the others' weights being needed.
"""

from __future__ import annotations

import argparse
import json
import textwrap

import numpy as np

from .evidence_timescales import LABELS, attention_block_response, loop_timescales
from .pilot import (design_of, design_title, parser, recipe_of, result_key, trained,
                    write_outputs)


def earlier_timescales(paths) -> dict[str, tuple[dict, str]]:
    """The per-model results of earlier `timescales --json` files, keyed by the pilot's
    `result_key` (the file's settings as the evaluation), each with the file it came
    from. A result without its design (`config`) cannot be matched and is left out."""
    found = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for results in data.get("models", {}).values():
            for r in results:
                if "config" in r:
                    found[result_key(r["config"], r["recipe"], data["settings"])] = (r, path)
    return found


def _response(lr) -> dict:
    """A `LinearResponse` as its statistic and fitted (m, gamma), or why not evaluable (a
    string: the reason it could not be formed)."""
    if isinstance(lr, str):
        return dict(max_error=None, mass=None, damping=None, not_evaluable=lr)
    ok = lr.not_evaluable is None and np.isfinite(lr.max_error)
    return dict(max_error=float(lr.max_error) if ok else None,
                mass=float(lr.mass) if ok else None,
                damping=float(lr.damping) if ok else None,
                not_evaluable=lr.not_evaluable if lr.not_evaluable is not None
                else None if ok else "no rate besides the fitted ones")


def model_timescales(model, tokens, n_loops, n_jacobian, modes) -> dict:
    """Every linearized problem's and head's `loop_timescales` of one model, and
    `linear_response` on the whole loop map (the study's statistic) beside it on the
    attention state's own map (`attention_block_response`), as lists."""
    from .fixed_point import fixed_point_report
    from .study import linear_responses

    rep = fixed_point_report(model, tokens, n_loops, n_jacobian=n_jacobian)
    n_stream = tokens.shape[1] * model.d_model  # the stream x comes first in the flat state
    dyn = model.dynamics_parameters()
    reasons = []
    whole = iter(linear_responses(model, rep, reasons.append))
    out = []
    for k in range(rep.jacobian.shape[0]):
        for h in range(model.n_heads):
            J, R, rho = rep.jacobian[k], rep.attn_jacobian[k, h], rep.attn[k, h]
            ts = loop_timescales(J, n_stream, R, step=model.dt, rho_star=rho, k=modes)
            # the head's own T: (m, gamma) fitted with it are the loop's learned ones
            T = float(dyn["T"][h])
            try:
                held = attention_block_response(J, n_stream, R, rho, model.entropy, T,
                                                 step=model.dt, scores=rep.scores[k, h])
            except ValueError as err:
                held = str(err)
            lr = next(whole)
            out.append(dict(problem=k, head=h, rates=[[z.real, z.imag] for z in ts.rates],
                            labels=list(ts.labels),
                            stream_distance=ts.stream_distance.tolist(),
                            attention_distance=ts.attention_distance.tolist(),
                            off_support=ts.off_support.tolist(),
                            slowest_stream=ts.slowest_stream,
                            slowest_attention=ts.slowest_attention,
                            learned=dict(mass=float(dyn["mass"][h]),
                                         damping=float(dyn["damping"][h]), T=T),
                            response=_response(str(reasons.pop(0)) if lr is None else lr),
                            held_stream=_response(held)))
    return dict(heads=out, spectral_radius=rep.spectral_radius.tolist())


def summary(models: list[dict]) -> dict:
    """Per family: the labels of the slowest and of all read modes, and per seed the
    median ratio of the attention state's slowest decay rate to the stream's."""
    heads = [h for m in models for h in m["heads"]]
    first = [h["labels"][0] for h in heads if h["labels"]]
    every = [lab for h in heads for lab in h["labels"]]
    att_off = [o for h in heads for lab, o in zip(h["labels"], h["off_support"])
               if lab == "attention"]
    return dict(
        seeds=[m["seed"] for m in models],
        slowest_mode={lab: first.count(lab) for lab in LABELS},
        all_modes={lab: every.count(lab) for lab in LABELS},
        # > 1: the attention state alone decays faster than the stream alone
        speed_ratio_by_seed=[float(np.median([h["slowest_attention"] / h["slowest_stream"]
                                              for h in m["heads"]])) for m in models],
        attention_modes_off_support=(None if not att_off
                                     else dict(median=float(np.median(att_off)),
                                               min=float(np.min(att_off)),
                                               max=float(np.max(att_off)))),
        response=_responses(models, "response"),
        held_stream=_responses(models, "held_stream"))


def _responses(models: list[dict], which: str) -> dict:
    """One response form over a family's models: how many problem-heads say YES (the
    protocol's <= 0.2), the per-seed medians, and how far the fitted (m, gamma) of the
    inertial fits (m > 0) lie from the loop's learned ones (relative)."""
    rs = [(h[which], h["learned"]) for m in models for h in m["heads"]]
    ok = [(r, le) for r, le in rs if r["max_error"] is not None]
    err = np.array([r["max_error"] for r, _ in ok])
    off = {k: np.array([abs(r[k] / le[k] - 1) for r, le in ok if r["mass"] > 0])
           for k in ("mass", "damping")}
    by_seed = [[h[which]["max_error"] for h in m["heads"] if h[which]["max_error"] is not None]
               for m in models]
    return dict(
        problem_heads=len(rs), evaluable=len(ok), yes=int(np.sum(err <= 0.2)),
        median_by_seed=[float(np.median(b)) if b else None for b in by_seed],
        first_order_fits=int(sum(r["mass"] == 0 for r, _ in ok)),
        **{f"{k}_off_learned": (None if not len(v) else dict(
            median=float(np.median(v)), max=float(np.max(v)))) for k, v in off.items()})


def figure(plt, out: dict, title: str):
    fams = [f for f in out["families"] if out["models"][f]]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6))
    for i, fam in enumerate(fams):
        s = out["families"][fam]
        x = np.asarray(s["seeds"]) + (i - (len(fams) - 1) / 2) * 0.15
        r = np.asarray(s["speed_ratio_by_seed"])
        axes[0].scatter(x[r > 0], r[r > 0], color=f"C{i}", label=fam)
        # a ratio <= 0: the attention state alone does not decay (an eigenvalue >= 1)
        axes[0].scatter(x[r <= 0], np.full((r <= 0).sum(), 1e-3), color=f"C{i}", marker="v",
                        label=f"{fam}: attention alone not decaying" if np.any(r <= 0)
                        else None)
        for m, xi in zip(out["models"][fam], x):
            labs = [lab for h in m["heads"] for lab in h["labels"]]
            n = max(len(labs), 1)
            axes[1].scatter([xi], [labs.count("stream") / n], color=f"C{i}", marker="o",
                            label=f"{fam}: stream" if xi == x[0] else None)
            axes[1].scatter([xi], [labs.count("attention") / n], color=f"C{i}", marker="o",
                            facecolors="none",
                            label=f"{fam}: attention" if xi == x[0] else None)
        for which, face, name in (("response", None, "whole loop"),
                                  ("held_stream", "none", "stream held")):
            med = np.array([np.nan if v is None else v for v in s[which]["median_by_seed"]])
            axes[2].scatter(x, med, color=f"C{i}", facecolors=face, marker="s",
                            label=f"{fam}: {name}")
    axes[0].axhline(1, color="gray", ls="--", lw=1)
    axes[2].axhline(0.2, color="gray", ls="--", lw=1)
    axes[2].set(yscale="log", xlabel="seed",
                title="linear response, median of problems and heads (largest relative\n"
                      "rate error; YES <= 0.2, dashed): the whole loop map (filled) and\n"
                      "the attention state's own map with the stream held (open)")
    floor = any(v <= 0 for f in fams for v in out["families"][f]["speed_ratio_by_seed"])
    axes[0].set(yscale="log", xlabel="seed", ylim=(5e-4, None) if floor else (None, None),
                title="slowest decay rate, attention state alone / stream alone\n(median of "
                      "problems and heads; above 1: the attention is faster)")
    axes[1].set(ylim=(-0.03, 1.03), xlabel="seed",
                title="the loop's slowest attention-bearing modes: share that are the\n"
                      "stream's (filled) or the attention state's (open); the rest mixed")
    for ax in axes:
        ax.title.set_fontsize(8)
        ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 200), fontsize=8)
    fig.tight_layout()
    return fig


def main(argv=None):
    p = parser(prog="studies/weight_tied timescales", description=__doc__.splitlines()[0])
    p.add_argument("--modes", type=int, default=6,
                   help="the slowest attention-bearing modes labelled per problem and head")
    args = p.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import jax.random as jr

    from .study import to_f64
    from .task import task_batch

    log = lambda s: print(f"[weight_tied timescales] {s}", flush=True)  # noqa: E731
    if args.loop_kind == "transformer":
        raise SystemExit("--loop-kind transformer has no carried attention state: its "
                         "attention is a function of the stream, with no timescale of its own")
    out = dict(families={}, models={}, without_a_model={}, settings=dict(
        modes=args.modes, jacobians=args.jacobians, fp_problems=args.fp_problems))
    earlier = earlier_timescales(args.resume)
    for family in args.families or [args.family]:
        done, missing = [], {}
        for seed in (args.seeds if args.seeds is not None else (args.seed,)):
            one = argparse.Namespace(**dict(vars(args), seed=seed, family=family))
            cfg = design_of(one)
            L = cfg.n_loops
            key = result_key(cfg.fingerprint(), recipe_of(one), out["settings"])
            if key in earlier:
                log(f"{family}, seed {seed}: result reused from {earlier[key][1]}")
                done.append(earlier[key][0])
                continue
            try:
                tr = trained(one, cfg, cached_only=True, progress=False)
            except (LookupError, FloatingPointError) as err:
                log(f"{family}, seed {seed}: no model: {err}")
                missing[str(seed)] = str(err)
                continue
            tokens = jnp.asarray(task_batch(cfg, jr.PRNGKey(5), args.fp_problems).tokens,
                                 jnp.float64)
            m = dict(model_timescales(to_f64(tr.model), tokens, 16 * L, args.jacobians,
                                      args.modes), seed=seed, recipe=recipe_of(one),
                     config=cfg.fingerprint())
            labs = [h["labels"][0] for h in m["heads"] if h["labels"]]
            ratio = np.median([h["slowest_attention"] / h["slowest_stream"]
                               for h in m["heads"]])
            held = [h["held_stream"]["max_error"] for h in m["heads"]]
            whole = [h["response"]["max_error"] for h in m["heads"]]
            fmt = lambda v: ", ".join("n/e" if e is None else f"{e:.2g}" for e in v)  # noqa
            log(f"{family}, seed {seed}: linear response, whole loop: {fmt(whole)}; stream "
                f"held: {fmt(held)}")
            log(f"{family}, seed {seed}: slowest attention-bearing mode is the stream's in "
                f"{labs.count('stream')}, the attention state's in {labs.count('attention')}, "
                f"mixed in {labs.count('mixed')} of {len(labs)} problem-heads; attention alone "
                f"/ stream alone slowest decay {ratio:.3g} (median)")
            done.append(m)
        out["models"][family] = done
        out["without_a_model"][family] = missing
        if done:
            out["families"][family] = s = summary(done)
            log(f"{family}: slowest mode {s['slowest_mode']}; all read modes {s['all_modes']}")
            for which in ("response", "held_stream"):
                r = s[which]
                log(f"{family}: linear response ({which}): YES in {r['yes']} of "
                    f"{r['evaluable']} evaluable problem-heads (of {r['problem_heads']}); "
                    f"fitted mass off the learned {r['mass_off_learned']}, damping "
                    f"{r['damping_off_learned']}")
    draw = None
    if any(out["models"].values()):
        first = next(m for ms in out["models"].values() for m in ms)
        title = design_title(dict(config=design_of(args).fingerprint(), recipe=first["recipe"]))
        draw = lambda plt: figure(plt, out, title)  # noqa: E731
    write_outputs(args, out, draw, log)
    return out
