"""The one solution type of the stationary problem's diagnostic paths."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu

from .._custom_types import Array, Float, Weights
from .._results import RESULTS


class StationarySolution(eqx.Module):
    """A stationary profile with its multiplier data, as `stationary_info` and
    `solve_stationary` return it (batched like the scores, keys on the last axis).

    **Fields:**
    - `rho`: the stationary weights.
    - `lam`: the multiplier $\\lambda$ of $T G(\\rho_i) - z_i = \\lambda$ on the support
      (Renyi / Sharma-Mittal: $T_{eff} G_{Tsallis}(\\rho_i) - z_i = \\lambda$).
    - `T_eff`: the realized temperature ($T$ for fixed-scale families).
    - `result`: a `fisherdyn.RESULTS` code, `RESULTS.successful` when every root converged.
    - `stats`: a dict of diagnostics; always `"residual"`, $\\max_i |T_{eff} G(\\rho_i) -
      z_i - \\lambda|$ over the support evaluated with the family's own law `G` (for
      Renyi / Sharma-Mittal at $T_{eff} = T\\phi(M_q(\\rho))$ recomputed from the returned
      $\\rho$, so it also measures the self-consistency).

    **Properties:** `residual` (`stats["residual"]`) and `converged`
    (`result == RESULTS.successful`).
    """

    rho: Weights
    lam: Float[Array, "*batch"]
    T_eff: Float[Array, "*batch"]
    result: RESULTS
    stats: dict[str, Array]

    @property
    def residual(self) -> Float[Array, "*batch"]:
        return self.stats["residual"]

    @property
    def converged(self):
        return self.result == RESULTS.successful


def result_where(ok, if_true, if_false):
    """`RESULTS.where` for a batched predicate: one code per row."""
    return jtu.tree_map(lambda a, b: jnp.where(ok, a, b), if_true, if_false)


def law_residual(entropy, rho, z, keep, lam, T_eff):
    """$\\max_{\\rho_i > 0} |T_{eff} G(\\rho_i) - z_i - \\lambda|$ per row, from the family's
    own `G` (the Tsallis law of a Renyi / Sharma-Mittal family): a check of the answer that
    involves neither solver."""
    law = entropy.stationary_law()
    on = keep & (rho > 0)
    G = law.G(jnp.where(on, rho, 1.0))
    lam, T_eff = jnp.asarray(lam)[..., None], jnp.asarray(T_eff)[..., None]
    return jnp.max(jnp.where(on, jnp.abs(T_eff * G - jnp.where(on, z, 0.0) - lam), 0.0), -1)


def no_algorithm(what, entropy):
    """The error of a stationary algorithm chosen by the family's base class, for a family
    on neither base."""
    return TypeError(
        f"no stationary {what} for {type(entropy).__name__}: derive the family from "
        "AbstractSeparableEntropy or AbstractTsallisShapedEntropy"
    )


def finish(entropy, rho, z, keep, lam, T_eff, result, throw, **stats):
    """The `StationarySolution` of a solve, raising (`throw=True`) unless it succeeded."""
    stats = dict(residual=law_residual(entropy, rho, z, keep, lam, T_eff), **stats)
    sol = StationarySolution(rho, lam, T_eff, result, stats)
    if throw:
        sol = result.error_if(sol, result != RESULTS.successful)
    return sol
