"""How well a Fisher loop's RK4 substeps integrate its carried attention: where a diverged
training turned non-finite, and how far a trained loop's attention is from the dynamics.

`substep_error` runs a trained Fisher loop's weights on its own substeps and on finer ones
and reports how far apart their attention is, with the state's turn per substep and its
drift off the sphere (`python studies/weight_tied integration [pilot options]`).

`replay_divergence` rebuilds the step at which a Fisher-loop training's loss turned NaN
(the weights before it, its batch and loop count). `trace_divergence` runs that batch loop
by loop, as the training's scan does, and records for every problem and loop which
quantity is first non-finite: the scores, the carried position or velocity, the weights,
the residual stream or the readout. For the loops before that it linearizes each head's
carried state under that loop's scores and reads the RK4 substep's spurious amplification
$\\max_k |R(h\\lambda_k)| / \\max(1, e^{h\\,\\mathrm{Re}\\,\\lambda_k})$,
$R(w) = 1 + w + w^2/2 + w^3/6 + w^4/24$, over the eigenvalues $\\lambda_k$ of the sphere
chart's vector field: what a substep multiplies a mode by beyond what the dynamics allows.
Above 1 the integrator grows a mode the dynamics damps, from substep to substep however
small it starts, which is how an explicit integrator blows up on a stiff system; the
greatest $\\mathrm{Re}\\,\\lambda$ tells a growth of the dynamics itself apart. The key
that carries the most amplified mode, its weight and its score gap below the row's best
say which stiffness it is.

`python studies/weight_tied divergence [pilot options] [--replay-substeps K ...]` prints
this for the training that the same options ran and that diverged (its record in the
weight cache), and the step's loss recomputed on K RK4 substeps per loop: finite on finer
substeps of the same dynamics, the step diverged in the integrator.
"""

from __future__ import annotations

import dataclasses

import numpy as np

QUANTITIES = ("scores", "position", "velocity", "weights", "stream", "logits")


def rk4_amplification(w):
    """$|R(w)|$ of the classical RK4 step at $w = h\\lambda$: the factor by which one step
    multiplies a linear mode of rate $\\lambda$ (stable where it is at most 1). NumPy and JAX
    arrays alike (the builtin `abs` dispatches to either)."""
    return abs(1 + w + w**2 / 2 + w**3 / 6 + w**4 / 24)


def row_modes(entropy, x, v, z, T, mass, damping):
    """The eigenvalues and eigenvectors of the sphere chart's vector field (the one
    `fisher_loop_step` integrates) linearized at the state `(x, v)` of one row under scores
    `z`: `(lam (2n,), vec (2n, 2n))`, position components first."""
    import jax
    import jax.numpy as jnp

    import fisherdyn as fd

    system = fd.FisherSystem(entropy, z, T, mass, damping)
    n = x.shape[-1]

    def f(y):
        return jnp.concatenate(fd.SphereCoordinates().vector_field(None, (y[:n], y[n:]), system))

    return jnp.linalg.eig(jax.jacfwd(f)(jnp.concatenate([x, v])))


@dataclasses.dataclass(frozen=True)
class DivergenceTrace:
    """`trace_divergence`'s result.

    **Fields:**

    - `finite` `(problems, loops, quantities)` bool: each quantity of `QUANTITIES` finite
      after that loop.
    - `first_loop` `(problems,)`: the first loop (from 1) with a non-finite quantity, 0
      where every loop stays finite; `first_quantity`: its first non-finite quantity
      (in the order of `QUANTITIES`), '' where none.
    - `amplification` `(problems, loops, heads)`: the largest spurious RK4 amplification
      $|R(h\\lambda)|/\\max(1, e^{h\\mathrm{Re}\\lambda})$ over the rows and modes of each head
      at the start of each loop (NaN once the state is non-finite).
    - `worst` `(problems, loops, heads, 5)`: for that mode, the eigenvalue's real and
      imaginary parts, the weight $\\rho$ of the key that carries it most and that key's
      score gap below its row's greatest score; last, the greatest $\\mathrm{Re}\\lambda$
      of any mode of the head (above 0: the dynamics itself grows).
    - `turn` `(problems, loops, heads)`: the greatest angle a substep turns a row through
      on the sphere, $h\\,\\|\\dot\\psi\\|$, after each loop; `drift`: the greatest
      $|\\,\\|\\psi\\|^2 - 1|$ after each loop (the chart's state leaving its sphere);
      `spread`: the greatest score spread of a row, $\\max z - \\min z$, at each loop; `jump`:
      the greatest change of a score from the loop before (0 at the first).
    - `h`, `mass`, `damping`, `T` (per head): the substep and the learned parameters.
    """

    finite: np.ndarray
    first_loop: np.ndarray
    first_quantity: np.ndarray
    amplification: np.ndarray
    worst: np.ndarray
    turn: np.ndarray
    drift: np.ndarray
    spread: np.ndarray
    jump: np.ndarray
    h: float
    mass: np.ndarray
    damping: np.ndarray
    T: np.ndarray


def trace_divergence(model, tokens, n_loops: int, *, linearize: bool = True
                     ) -> DivergenceTrace:
    """Run a Fisher-loop model on `tokens` `(problems, n_tok, token_dim)` for `n_loops`
    loops, in its own dtype, recording per loop which quantities are finite, the carried
    state's motion and (`linearize`; else NaN) each head's RK4 amplification (a
    `DivergenceTrace`)."""
    import jax
    import jax.numpy as jnp

    import fisherdyn as fd

    cfg = model.config
    if cfg.loop_kind != "fisher":
        raise ValueError(f"trace_divergence reads a Fisher loop, got loop_kind {cfg.loop_kind!r}")
    loop = model.loop
    h = cfg.substep
    mass, damping = loop.mass, loop.damping
    T = loop.temperature(cfg.temperature)

    def head_worst(x, v, z, T_, m, g):
        # rows (n_tok, n) of one head: the most amplified mode over its rows
        lam, vec = jax.vmap(lambda *a: row_modes(cfg.entropy, *a),
                            in_axes=(0, 0, 0, None, None, None))(x, v, z, T_, m, g)
        w = h * lam
        # what one substep multiplies a mode by beyond what the dynamics allows it: 1 for a
        # mode it damps, its true growth e^{h Re lambda} for one it grows
        amp = rk4_amplification(w) / jnp.maximum(1.0, jnp.exp(jnp.minimum(w.real, 50.0)))
        r, k = jnp.unravel_index(jnp.argmax(amp), amp.shape)
        n = x.shape[-1]
        # the key whose position and velocity carry the mode most
        key = jnp.argmax(jnp.abs(vec[r, :n, k]) + jnp.abs(vec[r, n:, k]))
        rho = x[r] ** 2 / jnp.sum(x[r] ** 2)
        gap = jnp.max(z[r]) - z[r, key]
        return amp[r, k], jnp.stack([lam[r, k].real, lam[r, k].imag, rho[key], gap,
                                     jnp.max(lam.real)])

    def one_problem(tokens_b):
        e = model.embedding(tokens_b)
        state0 = model.initial_state(tokens_b)

        def body(state, _):
            x, carry, last = state
            u, a, scores, rho, new = model._attend(x, e, carry)
            x_new = model._step(x, u, a)
            ok = lambda t: jnp.all(jnp.isfinite(t))  # noqa: E731
            finite = jnp.stack([ok(scores), ok(new[0]), ok(new[1]), ok(rho), ok(x_new),
                                ok(model._logits(x_new))])
            f64 = lambda t: t.astype(jnp.float64)  # noqa: E731
            if linearize:
                amp, worst = jax.vmap(head_worst)(f64(carry[0]), f64(carry[1]), f64(scores),
                                                  f64(T), f64(mass), f64(damping))
            else:
                amp = jnp.full(cfg.n_heads, jnp.nan)
                worst = jnp.full((cfg.n_heads, 5), jnp.nan)
            rows = lambda t: jnp.max(t, axis=-1)  # noqa: E731
            turn = rows(h * jnp.linalg.norm(new[1], axis=-1))
            drift = rows(jnp.abs(jnp.sum(new[0] ** 2, -1) - 1))
            spread = rows(jnp.max(scores, -1) - jnp.min(scores, -1))
            jump = jnp.max(jnp.where(jnp.isnan(last), 0.0, jnp.abs(scores - last)), (-2, -1))
            return (x_new, new, scores), (finite, amp, worst, turn, drift, spread, jump)

        n = e.shape[0]
        first_scores = jnp.full((cfg.n_heads, n, n), jnp.nan, e.dtype)
        _, out = jax.lax.scan(body, state0 + (first_scores,), length=n_loops)
        return out

    with jax.numpy_dtype_promotion("standard"):
        finite, amp, worst, *motion = jax.jit(jax.vmap(one_problem))(jnp.asarray(tokens))
    finite = np.asarray(finite)
    bad = ~finite.all(-1)
    first = np.where(bad.any(1), bad.argmax(1) + 1, 0)
    names = np.array([""] + list(QUANTITIES))
    which = np.array([0 if f == 0 else 1 + int(np.argmin(finite[b, f - 1]))
                      for b, f in enumerate(first)])
    return DivergenceTrace(finite, first, names[which], np.asarray(amp), np.asarray(worst),
                           *(np.asarray(a) for a in motion), float(h), np.asarray(mass),
                           np.asarray(damping), np.asarray(T))


def substep_error(model, tokens, n_loops: int, factor: int = 4) -> dict:
    """How far a trained Fisher loop's attention is from the dynamics it integrates: the
    same weights run `n_loops` loops on `tokens` with the model's RK4 substeps and with
    `factor` times as many (the reference: RK4's error falls as the 4th power of h), in
    float64.

    **Returns:** a dict with, per head, the greatest and the median (over problems) of the
    greatest total-variation distance $\\tfrac12\\sum_k|\\rho_k - \\rho^{\\rm fine}_k|$ of an
    attention row over the loops (`tv_max`, `tv_median`), and its greatest at the last
    loop (`tv_last_max`: RK4 keeps the dynamics' fixed points); the readout's answer at
    `n_loops` disagreeing with the finer run (`answers_changed`, a fraction); the greatest
    turn per substep and drift off the sphere of the model's own run (`turn_max`,
    `drift_max`, per head), and the substeps compared.
    """
    import dataclasses as dc

    import jax
    import jax.numpy as jnp

    from .model import _with_config

    cfg = model.config
    fine = _with_config(model, dc.replace(cfg, substeps=cfg.substeps * int(factor)))

    def run(m):
        tr = jax.jit(jax.vmap(lambda t: m.trace(t, n_loops)))(jnp.asarray(tokens))
        return np.asarray(tr.attn), np.asarray(tr.logits[:, -1])

    with jax.numpy_dtype_promotion("standard"):
        (a, lg), (b, lf) = run(model), run(fine)
        motion = trace_divergence(model, tokens, n_loops, linearize=False)
    rows = 0.5 * np.abs(a - b).sum(-1)  # (problems, loops + 1, heads, rows)
    tv = rows.max(axis=(1, 3))  # (problems, heads)
    return dict(substeps=[cfg.substeps, cfg.substeps * int(factor)], loops=int(n_loops),
                problems=int(tv.shape[0]), tv_max=tv.max(0).tolist(),
                tv_median=np.median(tv, 0).tolist(),
                tv_last_max=rows[:, -1].max(axis=(0, 2)).tolist(),
                answers_changed=float(np.mean(lg.argmax(-1) != lf.argmax(-1))),
                turn_max=np.max(motion.turn, (0, 1)).tolist(),
                drift_max=np.max(motion.drift, (0, 1)).tolist())


def summarize(step, tr: DivergenceTrace) -> dict:
    """The trace of a `DivergedStep` in numbers: how many problems turn non-finite, at
    which loop and in which quantity first, whether inside the loops the loss counts, and
    the RK4 amplification before that against the problems that stay finite."""
    diverging = np.flatnonzero(tr.first_loop > 0)
    out = dict(loss=step.loss, loops=step.loops, scan_loops=step.scan_loops,
               record={k: step.record.get(k) for k in ("stage", "step", "loops", "message")},
               problems=int(tr.first_loop.size), non_finite_problems=int(diverging.size),
               h=tr.h, mass=tr.mass.tolist(), damping=tr.damping.tolist(), T=tr.T.tolist(),
               substep_damping_rate=(tr.h * tr.damping / tr.mass).tolist())
    stable = np.setdiff1d(np.arange(tr.first_loop.size), diverging)
    if stable.size:  # the control: the batch's problems that stay finite, over all loops
        out["finite_problems"] = dict(
            amplification_max=float(np.nanmax(tr.amplification[stable])),
            amplification_above_1=float(np.mean(tr.amplification[stable] > 1)),
            **{f"{k}_max": float(np.max(getattr(tr, k)[stable]))
               for k in ("turn", "drift", "spread", "jump")},
            drift_max_by_head=np.max(tr.drift[stable], (0, 1)).tolist(),
            turn_max_by_head=np.max(tr.turn[stable], (0, 1)).tolist(),
            problems_drift_above_0_1=int(np.sum(np.max(tr.drift[stable], (1, 2)) > 0.1)))
    if not diverging.size:
        return out
    first = tr.first_loop[diverging]
    out.update(first_loop=dict(least=int(first.min()), median=float(np.median(first)),
                               greatest=int(first.max())),
               first_quantity={q: int(np.sum(tr.first_quantity[diverging] == q))
                               for q in QUANTITIES if np.any(tr.first_quantity[diverging] == q)},
               within_counted_loops=int(np.sum(first <= step.loops)))
    cases = []
    for b in diverging:
        f = tr.first_loop[b]
        # the loops before the first non-finite one, whose states are finite
        amp = tr.amplification[b, :f]
        head = int(np.nanargmax(amp[-1]))
        lam_re, lam_im, rho, gap, growth = tr.worst[b, f - 1, head]
        cases.append(dict(problem=int(b), first_loop=int(f),
                          first_quantity=str(tr.first_quantity[b]),
                          amplification_by_loop=np.nanmax(amp, -1).round(4).tolist(),
                          turn_by_loop=np.max(tr.turn[b, :f - 1], -1).tolist(),
                          drift_by_loop=np.max(tr.drift[b, :f - 1], -1).tolist(),
                          spread_by_loop=np.max(tr.spread[b, :f], -1).tolist(),
                          jump_by_loop=np.max(tr.jump[b, :f], -1).tolist(),
                          head=head, eigenvalue=[float(lam_re), float(lam_im)],
                          h_times_eigenvalue=float(tr.h * np.hypot(lam_re, lam_im)),
                          key_weight=float(rho), key_score_gap=float(gap),
                          greatest_growth_rate=float(growth)))
    out["cases"] = cases
    return out


def main(argv=None):

    import jax

    from .pilot import design_of, parser, write_outputs
    from .training import replay_divergence

    p = parser(prog="studies/weight_tied divergence",
               description="Replay the step at which a training with these pilot options "
               "diverged and trace where it turns non-finite.")
    p.add_argument("--replay-substeps", type=int, nargs="*", default=[], metavar="K",
                   help="also recompute the step's loss from the same weights and batch "
                   "with K RK4 substeps per loop")
    args = p.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    cfg = design_of(args)
    L = cfg.n_loops
    step = replay_divergence(cfg, seed=args.seed, steps=args.steps, batch=args.batch,
                             lr=args.lr, loops=(L, 3 * L), residual_penalty=args.penalty,
                             residual=args.residual, curriculum=args.curriculum)
    tr = trace_divergence(step.model, step.tokens, step.scan_loops)
    out = summarize(step, tr)
    # the intervention: the same weights and batch on finer substeps of the same dynamics
    out["loss_by_substeps"] = {str(k): step.loss_under(substeps=k)
                               for k in [cfg.substeps] + list(args.replay_substeps)}
    log = lambda s: print(f"[weight_tied divergence] {s}", flush=True)  # noqa: E731
    log(f"recorded: {step.record['message']}")
    log(f"replayed loss {step.loss:.4g} at n = {step.loops} loops (scan {step.scan_loops}); "
        f"{out['non_finite_problems']} of {out['problems']} problems turn non-finite")
    fmt = lambda v: "[" + ", ".join(f"{a:.3g}" for a in v) + "]"  # noqa: E731
    for c in out.get("cases", []):
        log(f"problem {c['problem']}: first non-finite at loop {c['first_loop']} "
            f"({c['first_quantity']}). By loop: score spread {fmt(c['spread_by_loop'])}, "
            f"greatest score change {fmt(c['jump_by_loop'])}; after each loop before it, "
            f"turn per substep h|psi_dot| {fmt(c['turn_by_loop'])}, off the sphere "
            f"| |psi|^2 - 1 | {fmt(c['drift_by_loop'])}; spurious RK4 amplification "
            f"{fmt(c['amplification_by_loop'])}, at loop {c['first_loop']} head {c['head']} "
            f"eigenvalue {c['eigenvalue'][0]:.4g} {c['eigenvalue'][1]:+.4g}i (h|lambda| "
            f"{c['h_times_eigenvalue']:.3g}), greatest Re lambda {c['greatest_growth_rate']:.3g}")
    log("the step's loss by RK4 substeps per loop: " + ", ".join(
        f"{k}: {v:.4g}" for k, v in out["loss_by_substeps"].items()))
    if "finite_problems" in out:
        f = out["finite_problems"]
        log(f"problems that stay finite, over all loops: score spread at most "
            f"{f['spread_max']:.3g}, score change {f['jump_max']:.3g}, turn per substep "
            f"{f['turn_max']:.3g}, off the sphere {f['drift_max']:.3g} (by head "
            f"{fmt(f['drift_max_by_head'])}; {f['problems_drift_above_0_1']} problems above "
            f"0.1); spurious RK4 amplification at most {f['amplification_max']:.4f} "
            f"({100 * f['amplification_above_1']:.1f} % of their loops and heads above 1)")
    write_outputs(args, out, None, log)
    return out


def main_integration(argv=None):
    """`python studies/weight_tied integration [pilot options] [--seeds ...] [--families
    ...] [--factor K]`: `substep_error` of cached Fisher-loop models over 4L loops."""
    import argparse

    import jax
    import jax.random as jr

    from .pilot import design_of, parser, trained, write_outputs
    from .study import to_f64
    from .task import task_batch
    from .training import host_of

    p = parser(prog="studies/weight_tied integration",
               description="How far cached Fisher-loop models' attention is from the "
               "dynamics their RK4 substeps integrate (against K times finer substeps).")
    p.add_argument("--factor", type=int, default=4, help="K, the finer run's substep factor")
    args = p.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    log = lambda s: print(f"[weight_tied integration] {s}", flush=True)  # noqa: E731
    fmt = lambda v: "[" + ", ".join(f"{a:.3g}" for a in v) + "]"  # noqa: E731
    out = {}
    for family in args.families or [args.family]:
        out[family] = {}
        for seed in args.seeds or [args.seed]:
            one = argparse.Namespace(**dict(vars(args), seed=seed, family=family))
            cfg = design_of(one)
            try:
                model = to_f64(trained(one, cfg, cached_only=True, progress=False).model)
            except (LookupError, FloatingPointError) as err:
                log(f"{family}, seed {seed}: no model: {err}")
                out[family][str(seed)] = dict(without_a_model=str(err))
                continue
            batch = task_batch(cfg, jr.PRNGKey(30_000 + seed), args.problems)
            r = substep_error(model, batch.tokens, 4 * cfg.n_loops, args.factor)
            out[family][str(seed)] = dict(r, host=host_of())
            log(f"{family}, seed {seed}: {r['substeps'][0]} against {r['substeps'][1]} "
                f"substeps over {r['loops']} loops, {r['problems']} problems: attention "
                f"apart by TV {fmt(r['tv_max'])} at most (median problem "
                f"{fmt(r['tv_median'])}; at the last loop {fmt(r['tv_last_max'])}) per "
                f"head; answers changed {100 * r['answers_changed']:.1f} %; turn per "
                f"substep at most {fmt(r['turn_max'])}, off the sphere "
                f"{fmt(r['drift_max'])}")
    write_outputs(args, out, None, log)
    return out
