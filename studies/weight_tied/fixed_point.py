"""Fixed points of a looped model's loop map: residual, path independence, linearization.

A loop is the map $\\Phi: (x_l, c_l) \\mapsto (x_{l+1}, c_{l+1})$ of the residual stream $x$
(and the carried attention state $c$ of a `"fisher"` / `"linear"` loop) at fixed input. A
model that has learned a fixed point reaches it from any initial state (path independence),
stops moving there (residual), and its linearization $J = D\\Phi$ has spectral radius below 1;
the eigenmodes of $J$, pushed through the attention's derivative, are the loop's linear
response in attention space (compare `relaxation_spectrum`: a mode $J v = \\mu v$ decays at
the continuous rate $-\\log|\\mu|/(c/L)$ and turns at $\\arg\\mu/(c/L)$).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from jaxtyping import ArrayLike, Float

from fisherdyn import fisher_rao_distance

from .jit import RUN_ONCE
from .model import LoopedTransformer

__all__ = ["FixedPointReport", "fixed_point_report", "loop_jacobian"]


@dataclasses.dataclass(frozen=True)
class FixedPointReport:
    """What `fixed_point_report` measured (numpy arrays).

    **Fields:**

    - `n_loops`: N, the loops run (default 4L); `dt`: the depth per loop $c/L$.
    - `residual` `(batch,)`: $\\|x_N - x_{N-1}\\|/\\|x_N\\|$ of the residual stream.
    - `carry_residual` `(batch,)`: the same for the carried attention state (None for the
      plain transformer).
    - `attn_change` `(batch,)`: the largest change of a query attention weight (any
      head) from loop N-1 to loop N.
    - `path_distance` `(batch,)`: the largest Fisher-Rao distance (over heads and random
      initial states) between the query attention at loop N from the default start and from
      `n_inits` random initial states.
    - `jacobian` `(n_jacobian, D, D)`: $D\\Phi$ at the state reached after N loops, for the
      first `n_jacobian` problems, in the flat state layout of `unravel`.
    - `eigenvalues` `(n_jacobian, D)`: its eigenvalues, by decreasing modulus;
      `spectral_radius` `(n_jacobian,)`: the largest modulus.
    - `attn_jacobian` `(n_jacobian, heads, n_ctx, D)`: the derivative of the query's
      attention rows of the loop at that state with respect to the flat state (maps an
      eigenvector of `jacobian` into attention's tangent space).
    - `attn` `(n_jacobian, heads, n_ctx)`, `scores` (same): the query's attention and
      scores there; `state` `(n_jacobian, D)`: the flat state.
    - `unravel`: flat state `(D,)` to the loop state `(x, carry)`.
    """

    n_loops: int
    dt: float
    residual: Float[np.ndarray, " batch"]
    carry_residual: Float[np.ndarray, " batch"] | None
    attn_change: Float[np.ndarray, " batch"]
    path_distance: Float[np.ndarray, " batch"]
    jacobian: Float[np.ndarray, "k D D"]
    eigenvalues: np.ndarray
    spectral_radius: Float[np.ndarray, " k"]
    attn_jacobian: Float[np.ndarray, "k heads n_ctx D"]
    attn: Float[np.ndarray, "k heads n_ctx"]
    scores: Float[np.ndarray, "k heads n_ctx"]
    state: Float[np.ndarray, "k D"]
    unravel: Callable = dataclasses.field(repr=False)


def _norm(tree):
    return jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(tree)))


def _random_state(model, tokens, key, scale):
    """A random loop state: x ~ N(0, scale^2) per coordinate; a Fisher carry at a random
    point of the sphere's positive orthant at rest; a linear carry z ~ N(0, 1) at rest."""
    x0, carry0 = model.initial_state(tokens)
    kx, kc = jr.split(key)
    x = scale * jr.normal(kx, x0.shape, x0.dtype)
    if carry0 is None:
        return x, None
    pos = jr.normal(kc, carry0[0].shape, x0.dtype)
    if model.loop_kind == "fisher":
        pos = jnp.abs(pos)
        pos = pos / jnp.sqrt(jnp.sum(pos * pos, -1, keepdims=True))
    return x, (pos, jnp.zeros_like(pos))


def _query_attention(model, state, e):
    _, _, scores, rho, _ = model._attend(state[0], e, state[1])
    return rho[:, -1], scores[:, -1]


@functools.partial(eqx.filter_jit, **RUN_ONCE)
def _settle(model, tokens, n, keys, scale):
    """Residuals at loop n from the default start, and the largest Fisher-Rao distance of
    the query attention at loop n from random starts to that from the default start.
    `scale` None: the random residual streams get the RMS of the default start's $x_n$."""

    def default(tok):
        e = model.embedding(tok)
        _, xs, state_n = model.run(tok, n)
        state_prev = _run_from(model, tok, n - 1, None)
        res = _norm(xs[-1] - xs[-2]) / _norm(xs[-1])
        if state_n[1] is None:
            cres = jnp.zeros((), xs.dtype)
        else:
            cres = _norm(jax.tree_util.tree_map(jnp.subtract, state_n[1], state_prev[1])) / \
                _norm(state_n[1])
        a_n, _ = _query_attention(model, state_n, e)
        a_prev, _ = _query_attention(model, state_prev, e)
        return res, cres, jnp.max(jnp.abs(a_n - a_prev)), a_n, state_n

    res, cres, change, a_n, state_n = jax.vmap(default)(tokens)
    if scale is None:
        scale = jnp.sqrt(jnp.mean(state_n[0] ** 2))

    def spread(tok, a_ref, ks):
        e = model.embedding(tok)
        starts = jax.vmap(lambda k: _random_state(model, tok, k, scale))(ks)
        a_rand = jax.vmap(lambda s0: _query_attention(model, _run_from(model, tok, n, s0),
                                                      e)[0])(starts)
        return jnp.max(fisher_rao_distance(a_rand, a_ref[None]))

    dist = jax.vmap(spread)(tokens, a_n, keys)
    return res, cres, change, dist, state_n


def _run_from(model, tokens, n, state0):
    return model.run(tokens, n, state0)[2]


def loop_jacobian(model: LoopedTransformer, tokens: Float[ArrayLike, "n_tok token_dim"],
                  state) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Callable]:
    """The Jacobian of one loop at a loop state, by forward-mode autodiff (`jax.jacfwd`).

    **Arguments:**

    - `model`: a `LoopedTransformer`; `tokens`: one problem; `state`: a loop state
      `(x, carry)` (e.g. the one reached after many loops).

    **Returns:**

    `(J, A, attn, scores, unravel)`: `J` `(D, D)` the derivative of the flat next state
    with respect to the flat state; `A` `(heads, n_ctx, D)` that of the query's attention
    rows of the loop; the attention rows and scores `(heads, n_ctx)`; `unravel` from
    the flat layout to `(x, carry)`.
    """
    tokens = jnp.asarray(tokens)
    flat, unravel = jax.flatten_util.ravel_pytree(state)
    J, A, attn, scores = _jacobians(model, tokens, flat, unravel)
    return np.asarray(J), np.asarray(A), np.asarray(attn), np.asarray(scores), unravel


@functools.partial(eqx.filter_jit, **RUN_ONCE)
def _jacobians(model, tokens, flat, unravel):
    e = model.embedding(tokens)

    def step(f):
        return jax.flatten_util.ravel_pytree(model.loop_map(unravel(f), e))[0]

    def attn(f):
        return _query_attention(model, unravel(f), e)[0]

    a, s = _query_attention(model, unravel(flat), e)
    return jax.jacfwd(step)(flat), jax.jacfwd(attn)(flat), a, s


def fixed_point_report(model: LoopedTransformer,
                       tokens: Float[ArrayLike, "batch n_tok token_dim"],
                       n_loops: int | None = None, *, key: jax.Array | None = None,
                       n_inits: int = 2, init_scale: float | None = None,
                       n_jacobian: int = 1) -> FixedPointReport:
    """Measure how well the loop map has a fixed point on these problems.

    Runs N = `n_loops` loops (default 4L) at the trained step: the relative residual
    $\\|x_N - x_{N-1}\\|/\\|x_N\\|$ (and of the carried attention state), the last loop's
    largest attention change, path independence (Fisher-Rao distance of the query
    attention at loop N from `n_inits` random initial states to that from the default
    start), and the Jacobian of one loop at the state reached, with its eigenvalues.

    **Arguments:**

    - `model`: a `LoopedTransformer` (any `loop_kind`); `tokens` `(batch, n_tok,
      token_dim)` (e.g. `batch.tokens` of a task).
    - `n_loops`: N (default `4 * model.n_loops`); N >= 2.
    - `key`: for the random initial states (default `PRNGKey(0)`); `n_inits`: how many;
      `init_scale`: their residual stream's standard deviation per coordinate (default:
      the RMS of the default start's $x_N$ over the batch).
    - `n_jacobian`: for how many of the first problems to compute the Jacobian (0: none;
      the linearization fields are then empty).

    **Returns:**

    A `FixedPointReport`.
    """
    n = 4 * model.n_loops if n_loops is None else int(n_loops)
    if n < 2:
        raise ValueError(f"n_loops must be >= 2, got {n}")
    if int(n_jacobian) < 0:
        raise ValueError(f"n_jacobian must be >= 0, got {n_jacobian}")
    tokens = jnp.asarray(tokens)
    key = jr.PRNGKey(0) if key is None else key
    keys = jr.split(key, tokens.shape[0] * n_inits).reshape(tokens.shape[0], n_inits, -1)
    scale = None if init_scale is None else jnp.asarray(init_scale, tokens.dtype)
    res, cres, change, dist, state_n = _settle(model, tokens, n, keys, scale)
    Js, As, attns, scs, flats = [], [], [], [], []
    unravel = None
    for b in range(min(int(n_jacobian), tokens.shape[0])):
        st = jax.tree_util.tree_map(lambda x: x[b], state_n)
        J, A, a, s, unravel = loop_jacobian(model, tokens[b], st)
        Js.append(J), As.append(A), attns.append(a), scs.append(s)
        flats.append(np.asarray(jax.flatten_util.ravel_pytree(st)[0]))
    if Js:
        J, A, attn, scores, state = (np.stack(v) for v in (Js, As, attns, scs, flats))
    else:  # n_jacobian=0: the residuals and path independence only, empty linearization
        flat, unravel = jax.flatten_util.ravel_pytree(
            jax.tree_util.tree_map(lambda x: x[0], state_n))
        H, n_ctx, D = model.n_heads, model.config.n_ctx, flat.size
        J, A, attn, scores, state = (np.zeros((0,) + shape) for shape in
                                     ((D, D), (H, n_ctx, D), (H, n_ctx), (H, n_ctx), (D,)))
    # a state that is not finite (a loop that blew up) has no spectrum: NaN, which fails the
    # precondition with its reason instead of stopping the report
    finite = np.all(np.isfinite(J), axis=(-2, -1))
    eig = np.full(J.shape[:-1], np.nan, complex)
    if finite.any():
        eig[finite] = np.linalg.eigvals(J[finite])  # an empty stack gives (0, D)
    eig = np.take_along_axis(eig, np.argsort(-np.abs(eig), -1), -1)
    return FixedPointReport(
        n_loops=n, dt=model.dt, residual=np.asarray(res),
        carry_residual=None if model.loop is None else np.asarray(cres),
        attn_change=np.asarray(change), path_distance=np.asarray(dist), jacobian=J,
        eigenvalues=eig, spectral_radius=np.abs(eig[:, 0]),
        attn_jacobian=A, attn=attn, scores=scores, state=state, unravel=unravel)
