"""The operator table: every family's stationary map, measured (docs/math.md §2).

Each row is computed, not typed in: the support size of `stationary` at fixed scores, the
tail class fitted on a long synthetic score ramp, and the distance between `stationary` and
the independent root-solver realization `solve_stationary` (both of its methods).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax.typing import DTypeLike

from .._custom_types import ArrayLike, Float
from .._entropies import AbstractEntropy, default_entropies, entropy_label
from .._stationary import solve_stationary, stationary
from ._tails import measure_tail

__all__ = ["operator_table", "format_operator_table", "DEFAULT_FAMILIES", "DEFAULT_SCORES"]

# every registered family at its default parameters
DEFAULT_FAMILIES = tuple((entropy_label(e), e) for e in default_entropies())
DEFAULT_SCORES = (2.0, 1.2, 0.9, 0.3, -0.1, -0.8, -1.5, -2.6)


def operator_table(
    *,
    dtype: DTypeLike = jnp.float64,
    scores: Float[ArrayLike, " N"] = DEFAULT_SCORES,
    T: float = 1.0,
    families: Sequence[tuple[str, AbstractEntropy]] | None = None,
) -> list[dict]:
    """Measure one row per entropy family (default parameters, docs/math.md §2).

    **Arguments** (keyword only):

    - `dtype`: the dtype of the scores fed to `stationary`.
    - `scores`: the fixed scores of the support / agreement columns (8 by default).
    - `T`: temperature.
    - `families`: optional sequence of (label, entropy); default `DEFAULT_FAMILIES`.

    **Returns:** a list of dicts with keys `family`, `realization`, `support` (count of
    $\\rho_i > 0$ at the scores), `tail` (dict from `measure_tail`), `tail_reference`
    (the expected exponent/rate and its formula, where one is known), `err_optimistix`,
    `err_scipy` ($\\max|$stationary - solve_stationary$|$ per method), `residual` (the
    stationarity residual of the scipy solve).
    """
    families = DEFAULT_FAMILIES if families is None else families
    z = jnp.asarray(scores, dtype)
    z64 = jnp.asarray(scores, jnp.float64)
    rows = []
    for label, entropy in families:
        rho = stationary(entropy, z, T)
        rho64 = jnp.asarray(rho, jnp.float64)
        errs = {}
        residual = None
        for method in ("optimistix", "scipy"):
            sol = solve_stationary(entropy, z64, T, method=method)
            errs[method] = float(jnp.max(jnp.abs(rho64 - sol.rho)))
            residual = float(sol.residual)
        ref, ref_text = entropy.tail_reference(T)
        rows.append(
            dict(
                family=label,
                realization=type(entropy).realization,
                support=int(jnp.sum(rho > 0)),
                n=int(z.size),
                tail=measure_tail(entropy, T=T, dtype=dtype),
                tail_reference=(ref, ref_text),
                err_optimistix=errs["optimistix"],
                err_scipy=errs["scipy"],
                residual=residual,
            )
        )
    return rows


def format_operator_table(rows: list[dict]) -> str:
    """Render `operator_table()` rows as a fixed-width text table."""
    head = ("family", "realization", "support", "tail (measured on a ramp)", "expected",
            "|stat-optx|", "|stat-scipy|")
    body = []
    for r in rows:
        ref, ref_text = r["tail_reference"]
        expected = f"{ref_text}={ref:.4g}" if ref is not None else ""
        body.append((r["family"], r["realization"], f"{r['support']}/{r['n']}",
                     r["tail"]["text"], expected, f"{r['err_optimistix']:.1e}",
                     f"{r['err_scipy']:.1e}"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]

    def line(cells):
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), sep] + [line(b) for b in body])
