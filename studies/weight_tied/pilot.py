"""Pilot: train one looped model on one task and print the protocol's preconditions.

Before a model design enters the study it has to be able to meet the preconditions at all
(`protocol.PRECONDITIONS`: held-out accuracy, spectral radius of the loop map, end points
from random initial states, depth ratio). This command trains one model of a given
architecture and task (cached like the study's) and reports, with numbers:

- held-out accuracy at the trained depth and after every loop up to 4L, beside two
  reference accuracies on the same problems: chance ($1/C$) and the shortcut of
  answering the most frequent label in the context (which needs no lookup; with labels
  drawn with replacement it is right about a third of the time at 8 nodes);
- the relative residual and the spread of the query attention's end points from random
  initial states (Fisher-Rao) after 4L and 16L loops, and the spectral radius of the loop
  map's Jacobian at the state after 16L loops (first `--jacobians` problems);
- the depth ratio gap(L, 2L) / gap(2L, 4L) of the query attention;
- which preconditions hold;
- with `--follow`, what the heads follow (`study.follow`) on `--follow-problems` problems
  (half fit, half held out), and each head's held-out likelihood statistic of protocol 1.1
  (an interval over this one model's held-out problems, not over seeds: a description of
  the model, not an answer).

    python studies/weight_tied pilot --nodes 8 --hops 3 --leak 1 --steps 3000
    python studies/weight_tied pilot --nodes 8 --hops 3 --classes 8 --width 48 --heads 3 \
        --step 4 --curriculum 4/2:3000,8/2:3000 --steps 4000   # smaller problems first
    python studies/weight_tied pilot ... --seeds 0-7 --families shannon tsallis kaniadakis \
        --figure design.png --json design.json   # the design over seeds and normalizers
    python studies/weight_tied pilot ... --seeds 0-7 --resume design.json ...  # reuse results
    python studies/weight_tied pilot ... --loop-kind fisher --mass 0.05 --substeps 5

With `--seeds` the models are trained (or loaded) one after the other and the run ends, per
family, with how the design replicates: how many seeds meet every precondition, which fail
and why, and each precondition's number over the seeds (median, least, greatest).
`--resume` takes a model's result from earlier `--json` files when its design, training
recipe and evaluation settings match, so that seeds trained in separate runs (two at a time
on two cores, say) join one summary without being evaluated again; it reads single-seed
files (`--seed N --json`) too. With `--cached-only` nothing is trained: a seed without a
model (not cached, or its training diverged) is listed with its reason (`without_a_model`).
`--loop-kind fisher` trains the positive control whose attention is the damped Fisher
dynamics driven by the loop's own scores (`--dose` mixes in the plain normalizer); its
RK4 substeps must resolve the damping rate (`LoopedConfig` refuses too few).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
import time

import numpy as np

FAMILIES = ("shannon", "tsallis", "kaniadakis")


def mode_shortcut_accuracy(batch, dim: int, n_classes: int) -> float:
    """Accuracy of answering the most frequent context label (ties split evenly): what a
    model gets without following any link."""
    tok = np.asarray(batch.tokens)
    labels = np.argmax(tok[:, :-1, 2 * dim:2 * dim + n_classes], -1)
    answer = np.asarray(batch.labels)
    acc = []
    for row, a in zip(labels, answer):
        counts = np.bincount(row, minlength=n_classes)
        acc.append(float(counts[a] == counts.max()) / np.sum(counts == counts.max()))
    return float(np.mean(acc))


def loop_options(args) -> dict:
    """The config fields of the attention's loop kind (left at their defaults for the
    plain transformer, so that its cached weights keep their key)."""
    if args.loop_kind == "transformer":
        if args.dose != 1:
            raise SystemExit("--dose needs --loop-kind fisher or linear")
        return {}
    return dict(loop_kind=args.loop_kind, mass=args.mass, damping=args.damping,
                substeps=args.substeps, dose=args.dose)


def pilot(args, log=print) -> dict:
    import jax.numpy as jnp
    import jax.random as jr

    import fisherdyn as fd

    from .evidence_paths import depth_convergence
    from .fixed_point import fixed_point_report
    from .paths import extract_paths
    from .protocol import PRECONDITIONS, PROTOCOL_VERSION
    from .study import depth_paths, preconditions, to_f64
    from .task import task_batch
    from .training import carried_parameters, host_of

    cfg = design_of(args)
    L = cfg.n_loops
    t0 = time.perf_counter()
    tr = trained(args, cfg, cached_only=args.cached_only, progress=not args.no_progress)
    how = "cached" if tr.from_cache else f"trained in {time.perf_counter() - t0:.0f} s"
    log(f"accuracy {tr.accuracy:.3f} at L = {L} ({how}; median step {tr.step_ms:.0f} ms)")
    m = to_f64(tr.model)
    carried = carried_parameters(m, cfg)
    if carried is not None:
        log("learned per head: " + "; ".join(
            f"{k} {np.array2string(np.asarray(v), precision=3)}" for k, v in carried.items()))
    probe = task_batch(cfg, jr.PRNGKey(20_000 + args.seed), args.problems)
    by_loop = np.asarray(extract_paths(m, probe, 4 * L, dtype=jnp.float64).accuracy)
    chance = 1 / cfg.classes
    shortcut = mode_shortcut_accuracy(probe, cfg.dim, cfg.classes)
    log(f"accuracy by loop 0..4L: {np.array2string(by_loop, precision=2, max_line_width=200)}")
    log(f"chance {chance:.3f}; most frequent context label {shortcut:.3f}")
    tokens = jnp.asarray(task_batch(cfg, jr.PRNGKey(5), args.fp_problems).tokens, jnp.float64)
    fp = {}
    for k in (4, 16):
        rep = fixed_point_report(m, tokens, k * L, n_jacobian=args.jacobians if k == 16 else 0)
        fp[f"{k}L"] = dict(residual=float(np.median(rep.residual)),
                           endpoint_distance=float(np.median(rep.path_distance)),
                           endpoint_distance_max=float(np.max(rep.path_distance)))
        if k == 16:
            fp["spectral_radius"] = rep.spectral_radius.tolist()
            fp["linear_response"] = response_errors(m, rep)
        log(f"after {k}L loops: residual {fp[f'{k}L']['residual']:.2g}, end points from "
            f"random starts {fp[f'{k}L']['endpoint_distance']:.2g} apart (median; max "
            f"{fp[f'{k}L']['endpoint_distance_max']:.2g})"
            + (f"; spectral radius {np.array2string(rep.spectral_radius, precision=3)}"
               if k == 16 else ""))
    errs = np.array([np.nan if e is None else e for e in fp["linear_response"]], float)
    log(f"linear response at 16L (the protocol's statistic, one per problem and head; YES "
        f"<= 0.2, NO >= 0.3): {np.array2string(errs, precision=3)}"
        + (f", median {np.nanmedian(errs):.3g}" if np.any(np.isfinite(errs)) else ""))
    dc = depth_convergence(*depth_paths(fd, m, probe))
    ratio = dc.gap_L_2L / dc.gap_2L_4L
    log(f"depth ratio gap(L, 2L) / gap(2L, 4L) = {ratio:.3g}")
    d = dict(accuracy=tr.accuracy,
             fixed_point=dict(spectral_radius=float(np.median(fp["spectral_radius"])),
                              path_distance_4L=fp["4L"]["endpoint_distance"]))
    values, failed = preconditions(d, ratio)
    log("preconditions (protocol " + PROTOCOL_VERSION + "): "
        + ("all hold" if not failed else "; ".join(failed)))
    follows = describe(fd, m, cfg, args, log) if args.follow else None
    return dict(follow=follows, config=cfg.fingerprint(), recipe=recipe_of(args),
                evaluation=evaluation_of(args), host=host_of(), carried=carried,
                # the run that trained the weights (a cached model keeps its own numbers)
                training=dict(seconds=tr.seconds, step_ms=tr.step_ms, cached=tr.from_cache,
                              trained_by=tr.trained_by),
                accuracy=tr.accuracy,
                accuracy_by_loop=by_loop.tolist(), chance=chance, mode_shortcut=shortcut,
                fixed_point=fp, depth_ratio=ratio,
                preconditions=dict(values=values, failed=failed, thresholds=PRECONDITIONS))


def trained(args, cfg, *, cached_only: bool, progress: bool):
    """The `train_looped` model of the design `cfg` with the options' seed and recipe."""
    from .training import train_looped

    L = cfg.n_loops
    return train_looped(cfg, seed=args.seed, steps=args.steps, batch=args.batch, lr=args.lr,
                        loops=(L, 3 * L), residual_penalty=args.penalty,
                        residual=args.residual, curriculum=args.curriculum,
                        progress=progress, cached_only=cached_only)


def response_errors(model, rep) -> list:
    """The `linear_response` statistic (the largest relative error of the predicted mode
    rates) of every linearized problem and head of a `fixed_point_report`, as the study
    computes it (`study.linear_responses`); None where it is not evaluable."""
    from .study import linear_responses

    return [float(lr.max_error) if lr is not None and lr.not_evaluable is None
            and np.isfinite(lr.max_error) else None for lr in linear_responses(model, rep)]


def design_of(args):
    """The looped model's config (`LoopedConfig`) of the command's arguments."""
    import fisherdyn as fd

    from .model import LoopedConfig
    from .study import make_entropy

    return LoopedConfig(task="pointer", n_pairs=args.nodes, hops=args.hops, dim=args.dim,
                        d_model=args.width, n_heads=args.heads, d_mlp=2 * args.width,
                        n_loops=args.loops, step=args.step, leak=args.leak,
                        distinct_labels=args.distinct_labels, n_classes=args.classes,
                        entropy=make_entropy(fd, args.family), **loop_options(args))


def recipe_of(args) -> dict:
    """The training recipe of the command's arguments, as a pilot result records it."""
    return dict(seed=args.seed, steps=args.steps, batch=args.batch, lr=args.lr,
                loops=[args.loops, 3 * args.loops], residual_penalty=args.penalty,
                residual=args.residual, curriculum=[list(c) for c in args.curriculum])


def evaluation_of(args) -> dict:
    """The settings a pilot result's numbers depend on besides the design and the recipe."""
    return dict(problems=args.problems, fp_problems=args.fp_problems,
                jacobians=args.jacobians, follow=args.follow,
                follow_problems=args.follow_problems if args.follow else None)


def result_key(config: dict, recipe: dict, evaluation: dict) -> str:
    """What identifies a pilot result: its design, recipe and evaluation settings (through
    JSON, so that a result read back from a file matches the one it was written from)."""
    return json.dumps(json.loads(json.dumps(
        dict(config=config, recipe=recipe, evaluation=evaluation), default=float)),
        sort_keys=True)


def earlier_results(paths) -> dict[str, tuple[dict, str]]:
    """The per-model results of earlier runs, keyed by `result_key`, each with the file it
    came from: a `--seeds` run's `models`, or the one model of a single-seed run (`--seed`),
    so that seeds trained one per process join one summary. A result without its
    evaluation settings (an older file) cannot be matched and is left out."""
    found = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        single = "config" in data and "recipe" in data
        for results in [[data]] if single else data.get("models", {}).values():
            for r in results:
                if "evaluation" in r:
                    found[result_key(r["config"], r["recipe"], r["evaluation"])] = (r, path)
    return found


def describe(fd, m, cfg, args, log):
    """What each head of one model follows, and its held-out likelihood statistic: per
    head a dict of `study.follow`'s fields plus `loglik_ratio` (estimate, low, high)."""
    import jax.random as jr

    from .study import follow, likelihood_fits, timeline
    from .task import task_batch

    L = cfg.n_loops
    batch = task_batch(cfg, jr.PRNGKey(30_000 + args.seed), args.follow_problems)
    attn, _, t, _ = timeline(fd, m, batch, L)
    a_fp, s_fp, _, _ = timeline(fd, m, batch, 16 * L)
    P = attn.shape[0]
    train = np.arange(P) < P // 2
    T_own = m.dynamics_parameters()["T"]
    velocity = "zero" if m.loop is not None else "difference"  # as the study's measure
    own = likelihood_fits(attn, t, s_fp[:, :, -1], m.entropy, T_own, train, L, velocity,
                          args.seed)
    d = dict(attn=attn, t=t, velocity=velocity, heldout_likelihood=own)
    out = follow(fd, d, a_fp[:, :, -1], T_own, train, L, args.seed, m.entropy)
    for h, (f, hp) in enumerate(zip(out, own)):
        iv = hp.loglik_ratio
        f["loglik_ratio"] = dict(estimate=iv.estimate, low=iv.low, high=iv.high)
        errs = ", ".join(f"{k} {v:.3g}" for k, v in sorted(f["mean_sq_error"].items(),
                                                            key=lambda kv: kv[1]))
        log(f"head {h}: follows {f['best']} (margin {f['margin']:.3g} per problem over the "
            f"runner-up; noise {f['noise']:.3g}); held-out log-likelihood ratio, Fisher "
            f"{m.entropy.name} over the best baseline, {iv.estimate:.3g} [{iv.low:.3g}, "
            f"{iv.high:.3g}]; mean held-out squared error: {errs}")
    return out


def replication(results: list[dict]) -> dict:
    """How a design replicates over seeds: how many models meet every precondition, which
    fail and why, and the range of each precondition's number over the seeds."""
    from .protocol import PRECONDITIONS

    values = [r["preconditions"]["values"] for r in results]
    greatest = [r["fixed_point"]["4L"]["endpoint_distance_max"] for r in results]
    return dict(
        seeds=[r["recipe"]["seed"] for r in results],
        meeting_all=sum(not r["preconditions"]["failed"] for r in results),
        failed={str(r["recipe"]["seed"]): r["preconditions"]["failed"]
                for r in results if r["preconditions"]["failed"]},
        **{name: spread_of([x[name] for x in values]) for name in values[0]},
        after_one_loop=spread_of([r["accuracy_by_loop"][1] for r in results]),
        # the precondition reads the median problem; the greatest shows several fixed points
        endpoint_distance_greatest=spread_of(greatest),
        seeds_with_a_problem_beyond=sum(g > PRECONDITIONS["endpoint_distance_max"]
                                        for g in greatest),
        linear_response=linear_response_spread(results),
    )


def linear_response_spread(results: list[dict]) -> dict | None:
    """The linear-response statistic over every seed's linearized problems and heads
    (median, least, greatest), and how many were evaluable; None for results recorded
    without it. Over seeds (the units: a model's problems and heads are not independent),
    each seed's median statistic (`per_seed`, None where none was evaluable), the median's
    distribution-free 95 % interval with its exact coverage (`median_interval`), and the
    exact sign test that the seeds' median lies above the criterion's YES region
    (`above_yes`: p, the least p these seeds could give, units, seeds above)."""
    from .protocol import PROTOCOL_CRITERIA
    from .verdict import median_interval, sign_test

    if any("linear_response" not in r["fixed_point"] for r in results):
        return None
    per_model = [[e for e in r["fixed_point"]["linear_response"] if e is not None]
                 for r in results]
    finite = [e for own in per_model for e in own]
    total = sum(len(r["fixed_point"]["linear_response"]) for r in results)
    out = dict(spread_of(finite) if finite else {}, evaluable=len(finite), total=total)
    per_seed = [float(np.median(own)) if own else None for own in per_model]
    out["per_seed"] = per_seed
    units = [v for v in per_seed if v is not None]
    if units:
        criterion = {c.name: c for c in PROTOCOL_CRITERIA}["linear_response"]
        yes_top = max(b for _, b in criterion.yes)
        low, high, coverage = median_interval(units, 0.95)
        out["median_interval"] = dict(low=low, high=high, coverage=coverage)
        t = sign_test(units, yes_top, "greater")
        out["above_yes"] = dict(threshold=yes_top, p=t.p, min_p=t.min_p, units=t.n_units,
                                above=int(t.statistic))
    return out


def log_replication(family: str, summary: dict, log) -> None:
    acc = summary["accuracy"]
    log(f"{family}: {summary['meeting_all']} of {len(summary['seeds'])} seeds meet every "
        f"precondition; accuracy {acc['median']:.3f} [{acc['min']:.3f}, {acc['max']:.3f}] "
        f"(median [least, greatest]); spectral radius up to "
        f"{summary['spectral_radius']['max']:.3f}; end points up to "
        f"{summary['endpoint_distance']['max']:.2g} apart (median problem; on "
        f"{summary['seeds_with_a_problem_beyond']} seeds a problem's end points lie beyond "
        "the threshold); depth ratio "
        f"{summary['depth_ratio']['min']:.3g} to {summary['depth_ratio']['max']:.3g}")
    lr = summary.get("linear_response")
    if lr is not None and lr["evaluable"]:
        log(f"  linear response (YES <= 0.2, NO >= 0.3) on {lr['evaluable']} of {lr['total']} "
            f"linearized problems and heads: median {lr['median']:.3g} [{lr['min']:.3g}, "
            f"{lr['max']:.3g}]")
        if "above_yes" in lr:
            t, iv = lr["above_yes"], lr["median_interval"]
            log(f"  over seeds: median per seed {iv['low']:.3g} to {iv['high']:.3g} "
                f"(interval of the median, coverage {iv['coverage']:.3f}); above the YES "
                f"region (> {t['threshold']:g}) on {t['above']} of {t['units']} seeds, sign "
                f"test p = {t['p']:.3g} (least possible {t['min_p']:.3g})")
    for seed, why in summary["failed"].items():
        log(f"{family}, seed {seed} fails: " + "; ".join(why))


def design_title(model: dict) -> str:
    """A pilot result's design, for a figure's title: its config (without the normalizer)
    and training recipe (without the seed)."""
    config = {k: v for k, v in model["config"].items() if k != "entropy"}
    recipe = {k: v for k, v in model["recipe"].items() if k != "seed"}
    return ", ".join(f"{k} {v}" for k, v in {**config, **recipe}.items())


def replication_figure(plt, models: dict):
    """Each precondition's number per seed and family, beside the protocol's threshold."""
    from .protocol import PRECONDITIONS as P

    panels = (("accuracy", "held-out accuracy at L", P["accuracy_min"], "linear"),
              ("spectral_radius", "spectral radius at the fixed point (median of problems)",
               P["spectral_radius_max"], "linear"),
              ("endpoint_distance", "end points from random starts after 4L (Fisher-Rao)",
               P["endpoint_distance_max"], "log"),
              ("depth_ratio", "depth ratio gap(L,2L) / gap(2L,4L)", P["depth_ratio_min"],
               "linear"))
    families = list(models)
    # the linear-response statistic, where every result recorded it
    response = all("linear_response" in r["fixed_point"] for f in families for r in models[f])
    fig, axes = plt.subplots(1, 4 + response, figsize=(16 + 4 * response, 4.4))
    for ax, (name, label, threshold, scale) in zip(axes, panels):
        for i, fam in enumerate(families):
            seeds = [r["recipe"]["seed"] for r in models[fam]]
            v = [r["preconditions"]["values"][name] for r in models[fam]]
            ok = [not r["preconditions"]["failed"] for r in models[fam]]
            x = np.asarray(seeds) + (i - (len(families) - 1) / 2) * 0.15
            ax.scatter(x, v, color=f"C{i}", marker="o", label=fam,
                       facecolors=[f"C{i}" if o else "none" for o in ok])
            if name == "endpoint_distance":  # the median is read; the greatest shows more
                worst = [r["fixed_point"]["4L"]["endpoint_distance_max"] for r in models[fam]]
                ax.scatter(x, worst, color=f"C{i}", marker="x", s=18,
                           label="greatest of the problems" if i == 0 else None)
        ax.axhline(threshold, color="gray", ls="--", lw=1, label="threshold")
        every_seed = sorted({r["recipe"]["seed"] for fam in families for r in models[fam]})
        ax.set(title=label, xlabel="seed", yscale=scale, xticks=every_seed)
        ax.title.set_fontsize(9)
    if response:
        ax = axes[4]
        for i, fam in enumerate(families):
            for r in models[fam]:
                errs = [e for e in r["fixed_point"]["linear_response"] if e is not None]
                x = r["recipe"]["seed"] + (i - (len(families) - 1) / 2) * 0.15
                ax.scatter(np.full(len(errs), x), errs, color=f"C{i}", marker="_", s=60)
                if errs:  # the seed's median: the unit of the sign test over seeds
                    ax.scatter([x], [np.median(errs)], color=f"C{i}", marker="D", s=14)
        # a log axis: the statistic spans 0.1 to hundreds over these models
        ax.set_yscale("log")
        bottom, top = min(0.05, ax.get_ylim()[0]), max(2.0, ax.get_ylim()[1])
        ax.axhspan(bottom, 0.2, color="C2", alpha=0.12, label="YES (<= 0.2)")
        ax.axhspan(0.3, top, color="C3", alpha=0.08, label="NO (>= 0.3)")
        ax.scatter([], [], color="gray", marker="D", s=14, label="median of a seed")
        ax.set_ylim(bottom, top)
        ax.set(title="linear response at 16L, per problem and head",
               xlabel="seed", xticks=sorted({r["recipe"]["seed"] for f in families
                                             for r in models[f]}))
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
    axes[0].legend(fontsize=8, title="filled: every precondition holds", title_fontsize=7)
    # headroom above the points on the log axis, so that the legend covers none of them
    axes[2].set_ylim(top=axes[2].get_ylim()[1] * 100)
    axes[2].legend(fontsize=7, loc="upper right")
    fig.suptitle(textwrap.fill(design_title(next(iter(models.values()))[0]), 230), fontsize=8)
    fig.tight_layout()
    return fig


def spread_of(v) -> dict:
    """Median, least and greatest of the numbers `v`."""
    v = np.asarray(v, float)
    return dict(median=float(np.median(v)), min=float(v.min()), max=float(v.max()))


def _seeds(text: str) -> tuple[int, ...]:
    """`"0-7"` -> (0, ..., 7); `"0,3,5"` -> (0, 3, 5)."""
    try:
        if "-" in text:
            lo, hi = text.split("-")
            return tuple(range(int(lo), int(hi) + 1))
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seeds as LO-HI or a comma-separated list, got {text!r}") from None


def _stages(text: str) -> tuple[tuple[int, int, int], ...]:
    """`"4/2:3000,6/2:2000"` -> ((4, 2, 3000), (6, 2, 2000))."""
    try:
        out = []
        for part in text.split(","):
            shape, steps = part.split(":")
            nodes, hops = shape.split("/")
            out.append((int(nodes), int(hops), int(steps)))
        return tuple(out)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected stages NODES/HOPS:STEPS separated by commas, got {text!r}") from None


def parser(prog="studies/weight_tied pilot", description=None) -> argparse.ArgumentParser:
    """The pilot's options: a model design, its training recipe and its evaluation (also
    read by `timescales`, which evaluates the same cached models)."""
    p = argparse.ArgumentParser(prog=prog, description=description or __doc__.splitlines()[0])
    p.add_argument("--family", choices=FAMILIES, default="shannon")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--hops", type=int, default=3)
    p.add_argument("--distinct-labels", action="store_true",
                   help="distinct node labels (no most-frequent-label shortcut)")
    p.add_argument("--classes", type=int, default=None,
                   help="labels (default: the node count; set it for a curriculum over nodes)")
    p.add_argument("--curriculum", type=_stages, default=(),
                   help="stages NODES/HOPS:STEPS,... trained first (e.g. 4/2:3000)")
    p.add_argument("--dim", type=int, default=16, help="key dimension")
    p.add_argument("--width", type=int, default=32, help="d_model (the MLP is twice as wide)")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--loops", type=int, default=8, help="L, the trained loops")
    p.add_argument("--step", type=float, default=2.0, help="c, the depth of L loops")
    p.add_argument("--loop-kind", choices=("transformer", "fisher", "linear"),
                   default="transformer",
                   help="the attention: the normalizer, the damped Fisher dynamics driven by "
                        "the loop's own scores (a positive control), or linear score dynamics")
    p.add_argument("--mass", type=float, default=0.02, help="m of a carried loop")
    p.add_argument("--damping", type=float, default=1.0, help="gamma of a carried loop")
    p.add_argument("--substeps", type=int, default=8, help="RK4 steps per loop (fisher)")
    p.add_argument("--dose", type=float, default=1.0,
                   help="beta: attention (1 - beta) stationary + beta carried state")
    p.add_argument("--leak", type=float, default=1.0, help="lambda of the leaky residual")
    p.add_argument("--residual", choices=("absolute", "relative"), default="absolute")
    p.add_argument("--penalty", type=float, default=0.1, help="residual penalty")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=_seeds, default=None,
                   help="replicate over these seeds (LO-HI or a list; weights cached per "
                        "seed) and summarize how many meet every precondition")
    p.add_argument("--problems", type=int, default=512, help="problems for the accuracies")
    p.add_argument("--fp-problems", type=int, default=16,
                   help="problems for the fixed-point diagnostics")
    p.add_argument("--jacobians", type=int, default=3, help="problems linearized")
    p.add_argument("--follow", action="store_true",
                   help="also fit every family's Fisher model and the baselines to each "
                        "head's paths: what the heads follow")
    p.add_argument("--follow-problems", type=int, default=128,
                   help="problems for --follow (half fit, half held out)")
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=None,
                   help="with --seeds: replicate the design for each of these normalizers")
    p.add_argument("--figure", type=str, default=None,
                   help="with --seeds: plot each precondition per seed and family here")
    p.add_argument("--json", type=str, default=None, help="also write the result here")
    p.add_argument("--resume", nargs="+", default=(), metavar="JSON",
                   help="with --seeds: reuse the results in these earlier --json files (of "
                        "--seeds or single --seed runs) whose design, recipe and evaluation "
                        "settings match (written by the same code); train and evaluate only "
                        "the other seeds")
    p.add_argument("--cached-only", action="store_true",
                   help="with --seeds: train nothing; a seed neither in --resume nor in the "
                        "weight cache is listed as without a model")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    log = lambda s: print(f"[weight_tied pilot] {s}", flush=True)  # noqa: E731
    if args.seeds is None:
        if args.families or args.figure or args.resume or args.cached_only:
            raise SystemExit("--families, --figure, --resume and --cached-only need --seeds")
        out = pilot(args, log=log)
    else:
        out = dict(replication={}, models={})
        earlier = earlier_results(args.resume)
        for family in args.families or [args.family]:
            results, missing = [], {}
            for seed in args.seeds:
                log(f"{family}, seed {seed}")
                one = argparse.Namespace(**dict(vars(args), seed=seed, family=family))
                key = result_key(design_of(one).fingerprint(), recipe_of(one),
                                 evaluation_of(one))
                if key in earlier:
                    log(f"result reused from {earlier[key][1]}")
                    results.append(earlier[key][0])
                    continue
                try:
                    results.append(pilot(one, log=log))
                except (LookupError, FloatingPointError) as err:
                    # a seed without a model (not cached, or its training diverged) is
                    # reported with its reason; the summary covers the seeds that have one
                    log(f"{family}, seed {seed}: no model: {err}")
                    missing[str(seed)] = str(err)
            if results:
                summary = replication(results)
                log_replication(family, summary, log)
            else:
                summary = dict(seeds=[], meeting_all=0)
            summary["without_a_model"] = missing
            out["replication"][family] = summary
            out["models"][family] = results
    draw = None if args.seeds is None else lambda plt: replication_figure(
        plt, {f: r for f, r in out["models"].items() if r})
    write_outputs(args, out, draw, log)
    return out


def write_outputs(args, out: dict, draw, log) -> None:
    """Write `out` to `--json` and, where `--figure` is given and `draw` is not None, the
    figure `draw(plt)` to it."""
    if args.figure and draw is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        draw(plt).savefig(args.figure, dpi=120)
        log(f"wrote {args.figure}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)


if __name__ == "__main__":  # pragma: no cover
    main()
