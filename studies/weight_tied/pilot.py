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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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


def pilot(args, log=print) -> dict:
    import jax
    import jax.numpy as jnp
    import jax.random as jr

    import fisherdyn as fd

    from .evidence_paths import depth_convergence
    from .fixed_point import fixed_point_report
    from .model import LoopedConfig
    from .paths import extract_paths
    from .protocol import PRECONDITIONS, PROTOCOL_VERSION
    from .study import depth_paths, make_entropy, preconditions, to_f64
    from .task import task_batch
    from .training import train_looped

    cfg = LoopedConfig(task="pointer", n_pairs=args.nodes, hops=args.hops, dim=args.dim,
                       d_model=args.width, n_heads=args.heads, d_mlp=2 * args.width,
                       n_loops=args.loops, step=args.step, leak=args.leak,
                       distinct_labels=args.distinct_labels, n_classes=args.classes,
                       entropy=make_entropy(fd, args.family))
    L = cfg.n_loops
    t0 = time.perf_counter()
    tr = train_looped(cfg, seed=args.seed, steps=args.steps, batch=args.batch, lr=args.lr,
                      loops=(L, 3 * L), residual_penalty=args.penalty,
                      residual=args.residual, curriculum=args.curriculum,
                      progress=not args.no_progress)
    how = "cached" if tr.from_cache else f"trained in {time.perf_counter() - t0:.0f} s"
    log(f"accuracy {tr.accuracy:.3f} at L = {L} ({how}; median step {tr.step_ms:.0f} ms)")
    m = to_f64(tr.model)
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
        log(f"after {k}L loops: residual {fp[f'{k}L']['residual']:.2g}, end points from "
            f"random starts {fp[f'{k}L']['endpoint_distance']:.2g} apart (median; max "
            f"{fp[f'{k}L']['endpoint_distance_max']:.2g})"
            + (f"; spectral radius {np.array2string(rep.spectral_radius, precision=3)}"
               if k == 16 else ""))
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
    return dict(follow=follows,config=cfg.fingerprint(), recipe=dict(
        seed=args.seed, steps=args.steps, batch=args.batch, lr=args.lr, loops=[L, 3 * L],
        residual_penalty=args.penalty, residual=args.residual,
        curriculum=[list(c) for c in args.curriculum]),
        accuracy=tr.accuracy, accuracy_by_loop=by_loop.tolist(), chance=chance,
        mode_shortcut=shortcut, fixed_point=fp, depth_ratio=ratio,
        preconditions=dict(values=values, failed=failed, thresholds=PRECONDITIONS))


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


def main(argv=None):
    p = argparse.ArgumentParser(prog="studies/weight_tied pilot",
                                description=__doc__.splitlines()[0])
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
    p.add_argument("--leak", type=float, default=1.0, help="lambda of the leaky residual")
    p.add_argument("--residual", choices=("absolute", "relative"), default="absolute")
    p.add_argument("--penalty", type=float, default=0.1, help="residual penalty")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--problems", type=int, default=512, help="problems for the accuracies")
    p.add_argument("--fp-problems", type=int, default=16,
                   help="problems for the fixed-point diagnostics")
    p.add_argument("--jacobians", type=int, default=3, help="problems linearized")
    p.add_argument("--follow", action="store_true",
                   help="also fit every family's Fisher model and the baselines to each "
                        "head's paths: what the heads follow")
    p.add_argument("--follow-problems", type=int, default=128,
                   help="problems for --follow (half fit, half held out)")
    p.add_argument("--json", type=str, default=None, help="also write the result here")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    out = pilot(args, log=lambda s: print(f"[weight_tied pilot] {s}", flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    return out


if __name__ == "__main__":  # pragma: no cover
    main()
