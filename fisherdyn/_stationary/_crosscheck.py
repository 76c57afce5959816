"""An independent realization of the fixed-T stationary map by direct root solving.

`solve_stationary` solves the stationary conditions of docs/math.md §2,

$$T\\,G(\\rho_i) - z_i - \\lambda = 0 \\ (\\rho_i > 0), \\qquad \\sum_i \\rho_i = 1,$$

with general-purpose root finders (optimistix in `_crosscheck_optx.py`, scipy in
`_crosscheck_scipy.py`) and nothing else. It shares no solver code with the fast operator
(`_operator.py`, `_separable.py`, `_shaped.py`) and exists to cross-check it:

- The multiplier is the unknown of a scalar monotone equation. It is solved in the gauge of
  the shifted law $\\hat G = G - G(1)$ (`entropy.G_shifted`), $\\nu = \\lambda - T G(1)$:
  $\\sum_i \\hat G^{-1}((z_i + \\nu)/T) = 1$, bracketed by
  $[T\\hat G(1/(2n)) - \\max z,\\ T\\hat G(2) - \\max z]$ (top weight $1/(2n)$ and 2 at the
  ends: the sum is below and above 1 even for a one-hot solution). The shift keeps the
  near-Shannon limits (Tsallis q -> 1, where G(1) = q/(q-1)) well conditioned; `lam` is
  reported in the convention $T G(\\rho_i) - z_i = \\lambda$.
- Each weight is $\\rho_i = \\hat G^{-1}(y_i)$, found by a component root solve in
  $\\ell = \\ln\\rho_i$ of $\\mathrm{asinh}\\,\\hat G(e^\\ell) = \\mathrm{asinh}\\,y_i$ (nearly
  linear in $\\ell$ for every family) on $\\ell \\in [-700, 1]$; weights whose law value lies
  below $\\hat G(e^{-700})$ are exactly 0 (this is the Tsallis q > 1 cutoff
  $T G(0^+) - z_i \\ge \\lambda$).
- Renyi / Sharma-Mittal: the Tsallis map at $T_{eff} = T\\phi(M)$ with the self-consistency
  $\\ln M_q(\\rho) = \\ln M$ solved in $\\ln M$: a grid scan (`n_grid` points) over the whole
  range of $M$ brackets every root, each bracket is refined, and the root of least free
  energy is returned (or, with `M0=`, the root nearest to $M_0$ in $\\ln M$).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optimistix as optx

from .._custom_types import ArrayLike, Float, Mask, RealScalarLike, Scores, Temperature
from .._entropies import AbstractEntropy, AbstractSeparableEntropy, AbstractTsallisShapedEntropy
from .._misc import check_entropy
from .._results import RESULTS
from ._checks import EMPTY_MESSAGE, SCORES_MESSAGE, T_MESSAGE, check_concrete, row_T
from ._crosscheck_optx import solve_optx
from ._crosscheck_scipy import solve_scipy
from ._solution import StationarySolution, finish, result_where


def _check(entropy, scores, mask, method):
    check_entropy(entropy)
    if not isinstance(entropy, (AbstractSeparableEntropy, AbstractTsallisShapedEntropy)):
        raise TypeError(f"no stationary conditions known for {type(entropy).__name__}")
    if method not in ("optimistix", "scipy"):
        raise ValueError(f"method must be 'optimistix' or 'scipy', got {method!r}")
    if jnp.ndim(scores) == 0:
        raise ValueError("scores must have at least one axis (the keys)")
    if mask is not None and jnp.broadcast_shapes(jnp.shape(mask), jnp.shape(scores)) != (
        jnp.shape(scores)
    ):
        raise ValueError(
            f"mask of shape {jnp.shape(mask)} does not broadcast to scores of shape "
            f"{jnp.shape(scores)}"
        )


def _result(ok):
    failed = RESULTS.promote(optx.RESULTS.nonlinear_divergence)
    return result_where(ok, RESULTS.successful, failed)


def _per_row(x, batch, dtype):
    """`x` as an array of the batch shape (one value per row)."""
    return jnp.broadcast_to(jnp.asarray(x, dtype), batch)


def _solve_rows_optx(entropy, z, keep, T, M0, n_grid):
    """The optimistix solve of every row: one `vmap` per batch axis."""
    dtype = z.dtype
    # parameters as arrays: one compilation per family, whatever the parameter value
    ent = jtu.tree_map(lambda x: jnp.asarray(x, dtype), entropy)
    solve = lambda z, keep, T, M0: solve_optx(ent, z, keep, T, M0, n_grid)  # noqa: E731
    for _ in range(z.ndim - 1):
        solve = jax.vmap(solve)
    return solve(z, keep, T, M0)


def _solve_rows_scipy(entropy, z, keep, T, M0, n_grid):
    """The scipy solve of every row, one after the other (NumPy, not traceable)."""
    dtype = z.dtype
    z, keep, T, M0 = (np.asarray(x) for x in (z, keep, T, M0))
    rho, lam = np.zeros(z.shape), np.zeros(z.shape[:-1])
    ok = np.zeros(z.shape[:-1], bool)
    for i in np.ndindex(z.shape[:-1]):
        m0 = None if np.isnan(M0[i]) else float(M0[i])
        rho[i], lam[i], ok[i] = solve_scipy(entropy, z[i], keep[i], T[i], m0, n_grid)
    rho, lam, ok, T = (jnp.asarray(x) for x in (rho, lam, ok, T))
    rho, lam, T = (x.astype(dtype) for x in (rho, lam, T))
    T_eff = entropy.effective_temperature(T, rho)
    return rho, lam, ok, T_eff


def solve_stationary(
    entropy: AbstractEntropy,
    scores: Scores,
    T: Temperature = 1.0,
    *,
    method: str = "optimistix",
    mask: Mask | None = None,
    M0: Float[ArrayLike, "*#batch"] | RealScalarLike | None = None,
    n_grid: int = 64,
    throw: bool = True,
) -> StationarySolution:
    """Solve the fixed-T stationary conditions of docs/math.md §2 by direct root finding.

    An independent realization of `fisherdyn.stationary`, meant for cross-checks: it solves
    $T G(\\rho_i) - z_i - \\lambda = 0$ on the support and $\\sum\\rho = 1$ with general-purpose
    root finders (see the module docstring) and is much slower.

    **Arguments:**
    - `entropy`: an entropy family, e.g. `Abe(1.5)`.
    - `scores`: the scores $z$, keys on the last axis; leading batch axes are solved row by
      row (`vmap` with `method="optimistix"`, a loop with `"scipy"`).
    - `T`: temperature > 0, a scalar or one per row, broadcasting as in `stationary`.
    - `method`: `"optimistix"` (JAX; optx.Bisection + optx.Newton; jit/vmap compatible) or
      `"scipy"` (numpy float64; scipy.optimize.brentq).
    - `mask`: boolean, broadcastable to the scores, True = keep; masked entries get exactly
      zero weight.
    - `M0`: Renyi / Sharma-Mittal only: return the self-consistent root whose moment
      $M_q$ is nearest to `M0` (in log M) instead of the branch of least free energy; a
      scalar or one per row.
    - `n_grid`: Renyi / Sharma-Mittal: number of points of the log-M scan that brackets the
      self-consistent roots (two roots closer than one grid cell may be missed).
    - `throw`: raise a runtime error (`eqx.error_if`) unless every root solve converged;
      with `throw=False` inspect `result` instead.

    **Returns:** a `StationarySolution(rho, lam, T_eff, result, stats)` batched like the
    rows, with `stats["residual"]`. Renyi / Sharma-Mittal: by default the root of least
    free energy $F = -\\sum\\rho_i z_i - T S(\\rho)$ among all roots found by the scan.
    """
    _check(entropy, scores, mask, method)
    check_concrete(scores, T, mask, need_keys=True)
    dtype = jnp.result_type(float)
    z = jnp.asarray(scores, dtype)
    batch = z.shape[:-1]
    kept = True if mask is None else jnp.broadcast_to(jnp.asarray(mask, bool), z.shape)
    keep = jnp.isfinite(z) & kept
    bad = jnp.any((jnp.isnan(z) | (z == jnp.inf)) & kept)
    z = eqx.error_if(z, bad, SCORES_MESSAGE.format(count=""))
    z = eqx.error_if(z, ~jnp.all(jnp.any(keep, -1)), EMPTY_MESSAGE)
    T = row_T(jnp.asarray(T, dtype), z.shape, -1)
    T = _per_row(T[..., 0] if T.ndim else T, batch, dtype)
    T = eqx.error_if(T, jnp.any(~(T > 0) | ~jnp.isfinite(T)), T_MESSAGE)
    M0 = _per_row(jnp.nan if M0 is None else M0, batch, dtype)
    z = jnp.where(keep, z, 0.0)
    solve_rows = _solve_rows_optx if method == "optimistix" else _solve_rows_scipy
    rho, lam, ok, T_eff = solve_rows(entropy, z, keep, T, M0, n_grid)
    T_eff = jnp.asarray(T_eff, dtype)
    return finish(entropy, rho, z, keep, lam, T_eff, _result(ok), throw)
