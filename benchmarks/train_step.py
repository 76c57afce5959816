"""Cost of one training step of the weight-tied study's models (CPU or GPU).

    python benchmarks/train_step.py [--families shannon tsallis kaniadakis]
        [--kinds transformer fisher linear] [--rounds 5] [--steps 20]

For each family and loop kind, the study's design (`studies/weight_tied/study.py`: `MODEL`,
`POSITIVE`, `LINEAR`, batch 64, fixed-point training over n in L..3L loops with the
absolute residual penalty, `train_looped`'s default optimizer) compiles the step the
study's training runs (a run of >= 400 steps, so the full optimization level) at each of
its four scan lengths. Then every model runs `--steps` steps at each length, in turn, for
`--rounds` rounds; prints the median wall and CPU milliseconds per step at the shortest
and longest scan, the mean over the drawn loop counts (the lengths weighted as training
draws them), and the load average before and after. A study model's training time is at
most this mean times 10,000 steps (the curriculum's 6,000, on smaller problems, and the
design's 4,000). Run it pinned (`taskset -c 0`) to see one core.
"""

import argparse
import inspect
import pathlib
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "studies"))

from weight_tied import LoopedConfig, init_looped  # noqa: E402
from weight_tied import study  # noqa: E402
from weight_tied import training as tr  # noqa: E402


def load():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def build(family, kind):
    """(config, {scan length: compiled step}, optimizer state, model) of one design."""
    import fisherdyn as fd

    e = study.make_entropy(fd, family)
    extra = dict(transformer={}, fisher=dict(loop_kind="fisher", **study.POSITIVE),
                 linear=dict(loop_kind="linear", **study.LINEAR))[kind]
    cfg = LoopedConfig(entropy=e, **extra, **study.MODEL)
    L = cfg.n_loops
    lo, hi = L, study.DEQ_RANGE * L
    default = {k: p.default for k, p in inspect.signature(tr.train_looped).parameters.items()}
    first = min(int(np.floor(default["loss_from"] * L)), L)
    hyper = (study.FULL["batch"], first, default["lr"], default["weight_decay"],
             study.RECIPE["steps"])
    lengths = tr._loop_buckets(lo, hi)
    steps = {}
    with tr._numeric_mode(cfg):
        model = init_looped(cfg, jr.PRNGKey(0))
        for b in lengths:
            optim, steps[b] = tr._training_step(cfg, *hyper, b, default["loss_from"],
                                                study.DEQ["residual_penalty"],
                                                study.DEQ["residual"] == "absolute")
        state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    counts = tr._loop_counts(jr.PRNGKey(1), 10_000, lo, hi)
    weight = {b: 0 for b in lengths}
    for n in counts:
        weight[next(b for b in lengths if b >= n)] += 1
    return cfg, steps, state, model, {b: w / len(counts) for b, w in weight.items()}


def run(cfg, step, state, model, n, k):
    """`k` steps at loop count `n`: (CPU s, wall s) per step, and the carried state."""
    with tr._numeric_mode(cfg):
        key = jr.PRNGKey(2)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(k):
            model, state, loss = step(model, state, key, jnp.asarray(i, jnp.int32),
                                      jnp.asarray(n, jnp.int32))
        jax.block_until_ready(loss)
        return (time.process_time() - cpu) / k, (time.perf_counter() - wall) / k, model, state


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", default=["shannon", "tsallis", "kaniadakis"],
                   choices=["shannon", "tsallis", "kaniadakis"])
    p.add_argument("--kinds", nargs="+", default=["transformer", "fisher"],
                   choices=["transformer", "fisher", "linear"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="steps per model and round")
    args = p.parse_args()
    print(f"JAX {jax.__version__}, {jax.default_backend()}; load average before: {load()}")
    built = {}
    for fam in args.families:
        for kind in args.kinds:
            t0 = time.perf_counter()
            built[(fam, kind)] = build(fam, kind)
            cfg, steps, state, model, weight = built[(fam, kind)]
            for b in steps:  # the first call of each length compiles
                run(cfg, steps[b], state, model, b, 1)
            print(f"  compiled {fam} {kind}: {len(steps)} scan lengths "
                  f"{sorted(steps)} in {time.perf_counter() - t0:.0f} s", flush=True)
    times = {k: {b: [] for b in v[1]} for k, v in built.items()}
    for _ in range(args.rounds):
        for k, (cfg, steps, state, model, _) in built.items():
            for b, step in steps.items():
                cpu, wall, model, state = run(cfg, step, state, model, b, args.steps)
                times[k][b].append((cpu, wall))
            built[k] = (cfg, steps, state, model, built[k][4])
    print(f"ms per training step (batch 64, median of {args.rounds} rounds of {args.steps}):")
    for (fam, kind), by_len in times.items():
        weight = built[(fam, kind)][4]
        med = {b: np.median(np.array(v), axis=0) * 1e3 for b, v in by_len.items()}
        mean = sum(weight[b] * med[b] for b in med)
        lo, hi = min(med), max(med)
        print(f"  {fam:10s} {kind:11s} {lo:2d} loops: wall {med[lo][1]:6.1f} CPU "
              f"{med[lo][0]:6.1f}; {hi:2d} loops: wall {med[hi][1]:6.1f} CPU "
              f"{med[hi][0]:6.1f}; as drawn: wall {mean[1]:6.1f} CPU {mean[0]:6.1f} "
              f"(10,000 steps: {10 * mean[1]:.0f} s)")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
