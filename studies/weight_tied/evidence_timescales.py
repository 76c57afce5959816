"""Whose modes are a looped model's slow attention-bearing modes: the residual stream's or
the carried attention state's?

A loop with a carried attention state (`loop_kind` "fisher" or "linear") has the state
$(x, c)$, $x$ the residual stream and $c$ the attention's own state, and its loop map at a
fixed point has the blocks

$$J = \\begin{pmatrix} J_{xx} & J_{xc} \\\\ J_{cx} & J_{cc} \\end{pmatrix},$$

$J_{cc}$ the attention state's map with the scores held (for a Fisher loop the held-score
Fisher map at $C = 0$), $J_{xx}$ the stream's map with the attention state held. Where the
coupling is weak or one side is much faster, each eigenvalue of $J$ lies near one of
$J_{xx}$'s or of $J_{cc}$'s (exactly, for a block-triangular $J$). `loop_timescales`
labels the slowest attention-bearing modes of $J$ by the nearer of the two spectra, in
rates $s = \\log(\\lambda)/h$: a criterion that reads the slow modes of the attention
(`linear_response`, `held_score_response`) reads the attention's own dynamics only where
they are labelled "attention"; where they are "stream", the attention follows a slower
residual stream and the criterion measures the stream.

With the scores held each attention row and head evolves on its own, so $J_{cc}$ is block
diagonal over them and one row's own modes are the eigenvectors of $J_{cc}$ that carry its
attention: those are the attention side a row's modes are compared with (the rates of
other rows and heads would make any rate look like an attention one).

`attention_block_response` is `linear_response` on $J_{cc}$ alone: the model's own carried
attention map with the stream held. For a Fisher loop it is the held-score Fisher map at
$C = 0$, so the criterion must say YES there and return the loop's learned $(m, \\gamma)$
(a control of the instrument on the trained model itself); a NO on the full $J$ beside a
YES on $J_{cc}$ locates the disagreement in the coupling through the stream.
"""

from __future__ import annotations

import equinox as eqx
import numpy as np

from jaxtyping import ArrayLike, Float

from fisherdyn import AbstractEntropy

from .evidence_response import LinearResponse, linear_response

__all__ = ["LoopTimescales", "attention_block_response", "loop_timescales"]

LABELS = ("stream", "attention", "mixed")


class LoopTimescales(eqx.Module):
    """The slow attention-bearing modes of a loop map and whose they are.

    **Fields:**
    - `rates` `(k,)`: the rates $\\log(\\lambda)/h$ of the `k` slowest attention-bearing
      eigenvalues of $J$ (largest real part first).
    - `stream_distance`, `attention_distance` `(k,)`: the distance of each to the nearest
      rate of $J_{xx}$ and of the read row's own modes of $J_{cc}$ (those that carry its
      attention), relative to $|s|$.
    - `labels` `(k,)`: "stream" or "attention" where that distance is at most `tol` and the
      other's is not; else "mixed".
    - `slowest_stream`, `slowest_attention`: the largest real part among $J_{xx}$'s rates
      and among the read row's own rates of $J_{cc}$ (the slowest decay of each side
      alone).
    - `off_support` `(k,)`: each mode's share of its attention component $\\|R v\\|^2$ on
      keys whose fixed-point weight is below `support_tol` (NaN without `rho_star`).
    """

    rates: np.ndarray
    stream_distance: np.ndarray
    attention_distance: np.ndarray
    labels: tuple
    slowest_stream: float
    slowest_attention: float
    off_support: np.ndarray


def _rates(lam, step):
    return np.log(lam.astype(complex)) / step


def _split(jacobian, n_stream, readout):
    """The checked float64 `jacobian` `(D, D)` and `readout` `(N, D)`, and the stream's size."""
    J = np.asarray(jacobian, np.float64)
    R = np.asarray(readout, np.float64)
    D = J.shape[0] if J.ndim == 2 else -1
    if J.ndim != 2 or J.shape != (D, D) or R.ndim != 2 or R.shape[1] != D:
        raise ValueError(f"need a square jacobian (D, D) and readout (N, D); got {J.shape}, "
                         f"{R.shape}")
    if not 0 < int(n_stream) < D:
        raise ValueError(f"n_stream must split the state (0 < n_stream < {D}); got "
                         f"{n_stream}: a loop without a carried attention state has no "
                         "attention timescale of its own")
    if not (np.all(np.isfinite(J)) and np.all(np.isfinite(R))):
        raise ValueError("jacobian and readout must be finite")
    return J, R, int(n_stream)


def loop_timescales(
    jacobian: Float[ArrayLike, "D D"],
    n_stream: int,
    readout: Float[ArrayLike, "N D"],
    *,
    step: float,
    rho_star: Float[ArrayLike, " N"] | None = None,
    k: int = 6,
    tol: float = 0.2,
    attention_tol: float = 1e-3,
    min_eigenvalue: float = 1e-3,
    support_tol: float = 1e-3,
) -> LoopTimescales:
    """Label the `k` slowest attention-bearing modes of the loop map `jacobian` `(D, D)`,
    whose first `n_stream` coordinates are the residual stream and the rest the carried
    attention state, by the nearer of the stream's ($J_{xx}$) and the attention state's
    ($J_{cc}$) own rates (module docstring). `readout` $R$ `(N, D)` maps a state
    perturbation to the attention row's; a mode is attention-bearing as in
    `held_score_response` (attention component at least `attention_tol` of the largest,
    eigenvalue modulus at least `min_eigenvalue` of the largest). `step`: the loop's $h$.
    """
    J, R, n = _split(jacobian, n_stream, readout)
    lam, V = np.linalg.eig(J)
    att = np.linalg.norm(R @ V, axis=0)
    big = np.abs(lam) >= min_eigenvalue * np.max(np.abs(lam))
    keep = big & (att >= attention_tol * np.max(att[big]))
    s, U = _rates(lam[keep], step), (R @ V)[:, keep]
    order = np.argsort(-s.real)[:k]
    s, U = s[order], U[:, order]
    sx = _rates(np.linalg.eigvals(J[:n, :n]), step)
    lam_c, V_c = np.linalg.eig(J[n:, n:])
    att_c = np.linalg.norm(R[:, n:] @ V_c, axis=0)
    if not np.any(att_c > 0):
        raise ValueError("the readout reads none of the attention state's modes (its block "
                         "on the attention state is zero)")
    big_c = np.abs(lam_c) >= min_eigenvalue * np.max(np.abs(lam_c))
    own = big_c & (att_c >= attention_tol * np.max(att_c[big_c]))
    sc = _rates(lam_c[own], step)
    scale = np.maximum(np.abs(s), 1e-300)
    dx = np.min(np.abs(s[:, None] - sx[None, :]), axis=1) / scale
    dc = np.min(np.abs(s[:, None] - sc[None, :]), axis=1) / scale
    labels = tuple("stream" if a <= tol < b else "attention" if b <= tol < a else "mixed"
                   for a, b in zip(dx, dc))
    if rho_star is None:
        off = np.full(len(s), np.nan)
    else:
        rho = np.asarray(rho_star, np.float64)
        if rho.shape != (R.shape[0],):
            raise ValueError(f"rho_star must be (N,) = ({R.shape[0]},); got {rho.shape}")
        w = np.abs(U) ** 2
        off = np.sum(w[rho < support_tol], axis=0) / np.maximum(np.sum(w, axis=0), 1e-300)
    return LoopTimescales(s, dx, dc, labels, float(np.max(sx.real)), float(np.max(sc.real)),
                          off)


def attention_block_response(
    jacobian: Float[ArrayLike, "D D"],
    n_stream: int,
    readout: Float[ArrayLike, "N D"],
    rho_star: Float[ArrayLike, " N"],
    entropy: AbstractEntropy,
    T: float,
    *,
    step: float,
    scores: Float[ArrayLike, " N"] | None = None,
) -> LinearResponse:
    """`linear_response` of the attention state's own map $J_{cc}$ (the loop map with the
    residual stream held; the first `n_stream` coordinates of `jacobian` are the stream),
    read through the readout's block on the attention state (module docstring). The other
    arguments are `linear_response`'s.
    """
    J, R, n = _split(jacobian, n_stream, readout)
    return linear_response(J[n:, n:], rho_star, entropy, T, step=step, readout=R[:, n:],
                           scores=scores)
