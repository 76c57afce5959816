"""The fixed-temperature stationary attention operator, its exact derivative, its Jacobian
and the free energy (`docs/math.md §2-3`).

`stationary(entropy, scores, T)` solves the stationary law $T G(\\rho_i) = z_i + \\lambda$ on
the support with $\\sum\\rho = 1$:

- softmax families (Shannon): the closed form;
- separable families: the batch-native root of `_separable.py`;
- Renyi / Sharma-Mittal: the threshold equation of `_shaped.py`, with its certificate.

The derivative is an exact `custom_jvp` from the saved output (implicit function theorem),
including tangents with respect to the scores, T and the entropy's parameters. The
independent cross-check (`solve_stationary`) shares none of this code.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .._custom_types import Array, ArrayLike, Float, Mask, Scores, Temperature, Weights
from .._entropies import AbstractEntropy, AbstractSeparableEntropy, AbstractTsallisShapedEntropy
from .._misc import check_entropy, param_jvp
from .._results import RESULTS
from ._checks import call_checked, checked_row_sum, prepare, row_T, unmasked_inputs
from ._separable import softmax, solve_separable_rows
from ._shaped import _log_moment, _solve_tsallis_shaped
from ._solution import StationarySolution, finish, no_algorithm, result_where


# The solvers are chosen by the family's base class: a further kind of entropy registers
# its own `_solve`, `_tangent` and `_jacobian`.
@functools.singledispatch
def _solve(entropy, z, keep, T):
    """(rho, T_eff) of prepared rows; T_eff keeps a trailing axis of 1."""
    raise no_algorithm("solver", entropy)


@_solve.register
def _(entropy: AbstractSeparableEntropy, z, keep, T):
    if entropy.closed_form_softmax:
        rho = softmax(z, keep, T)
    else:
        rho = solve_separable_rows(entropy, z, keep, T)
    return rho, T * jnp.ones_like(z[..., :1])


@_solve.register
def _(entropy: AbstractTsallisShapedEntropy, z, keep, T):
    rho, logM = _solve_tsallis_shaped(entropy, z, keep, T)
    return rho, T * entropy.temperature_factor(jnp.exp(logM))


# --------------------------------------------------------------------------- exact derivative


def _project(c, v):
    """$P v = c\\odot v - c\\,(c\\cdot v)/\\sum c$: the tangent response of a separable law."""
    sc = jnp.sum(c, -1, keepdims=True)
    return c * v - c * jnp.sum(c * v, -1, keepdims=True) / jnp.where(sc > 0, sc, 1.0)


def _shifted_G(entropy, rho, active):
    safe = jnp.where(active, rho, 1.0)
    return jnp.where(active, entropy.G_shifted(safe), 0.0)


def _slope(entropy, rho, active):
    """$dx/dy = 1/G'(x)$ on the support (0 off it), overflow-free."""
    safe = jnp.where(active, rho, 1.0)
    return jnp.where(active, entropy.inverse_slope(safe), 0.0)


def _moment_weights(q, rho, active):
    """$dM_q/d\\rho_i = q\\rho_i^{q-1}$ on the support."""
    safe = jnp.where(active, rho, 1.0)
    return jnp.where(active, q * jnp.exp((q - 1) * jnp.log(safe)), 0.0)


@eqx.filter_custom_jvp
def _stationary_core(entropy, z, keep, T):
    rho, _ = _solve(entropy, z, keep, T)
    return rho


@functools.singledispatch
def _tangent(entropy, rho, keep, T, t_z, t_T, t_entropy):
    """The tangent of the stationary weights `rho` (implicit function theorem)."""
    raise no_algorithm("derivative", entropy)


@_tangent.register
def _separable_tangent(entropy: AbstractSeparableEntropy, rho, keep, T, t_z, t_T, t_entropy):
    active = keep & (rho > 0)
    c = _slope(entropy, rho, active) / T
    zeta = jnp.zeros_like(rho) if t_z is None else jnp.where(keep, t_z, 0.0)
    y = _shifted_G(entropy, rho, active)
    if t_T is not None:
        zeta = zeta - y * t_T
    dG = param_jvp(lambda e: _shifted_G(e, rho, active), entropy, t_entropy)
    if dG is not None:
        zeta = zeta - T * dG
    return _project(c, zeta)


@_tangent.register
def _tsallis_shaped_tangent(
    entropy: AbstractTsallisShapedEntropy, rho, keep, T, t_z, t_T, t_entropy
):
    q = entropy.q
    ts = entropy.tsallis()
    active = keep & (rho > 0)
    logM = _log_moment(q, rho, active)
    M = jnp.exp(logM)
    t = T * entropy.temperature_factor(M)
    c = _slope(ts, rho, active) / t
    y = _shifted_G(ts, rho, active)
    zeta = jnp.zeros_like(rho) if t_z is None else jnp.where(keep, t_z, 0.0)
    dG = param_jvp(lambda e: _shifted_G(e.tsallis(), rho, active), entropy, t_entropy)
    if dG is not None:
        zeta = zeta - t * dG
    # direct change of T_eff at fixed M
    t_dot0 = jnp.zeros_like(M) if t_T is None else t_T * entropy.temperature_factor(M)
    dphi = param_jvp(lambda e: e.temperature_factor(M), entropy, t_entropy)
    if dphi is not None:
        t_dot0 = t_dot0 + T * dphi
    Py = _project(c, y)
    A = _project(c, zeta) - Py * t_dot0
    dphi_dM = jnp.vectorize(jax.grad(lambda m: entropy.temperature_factor(m)))(M)
    B = -Py * T * dphi_dM
    w = _moment_weights(q, rho, active)
    m_q = param_jvp(lambda e: jnp.exp(_log_moment(e.q, rho, active)), entropy, t_entropy)
    num = jnp.sum(w * A, -1, keepdims=True)
    if m_q is not None:
        num = num + m_q
    M_dot = num / (1.0 - jnp.sum(w * B, -1, keepdims=True))
    return A + B * M_dot


@_stationary_core.def_jvp
def _stationary_core_jvp(primals, tangents):
    entropy, z, keep, T = primals
    t_entropy, t_z, _, t_T = tangents
    rho = _stationary_core(entropy, z, keep, T)
    if t_T is not None:
        t_T = jnp.broadcast_to(t_T, T.shape)
    return rho, _tangent(entropy, rho, keep, T, t_z, t_T, t_entropy)


# --------------------------------------------------------------------------- the operator


def stationary(
    entropy: AbstractEntropy,
    scores: Scores,
    T: Temperature = 1.0,
    *,
    mask: Mask | None = None,
    axis: int = -1,
    where: Mask | None = None,
) -> Weights:
    """The fixed-temperature stationary attention map of an entropy family.

    Solves $T G(\\rho_i) = z_i + \\lambda$ on the support, $\\sum_i\\rho_i = 1$
    (docs/math.md §2), batched over every axis but `axis`; jit/vmap/grad compatible with the
    exact Jacobian of docs/math.md §3 as a custom JVP.

    **Arguments:**
    - `entropy`: an entropy family, e.g. `Kaniadakis(0.3)`.
    - `scores`: the scores $z$, any batch shape: float64 / float32, or bfloat16 / float16
      (solved in float32, the weights returned in the input's precision).
    - `T`: temperature > 0, a scalar or an array broadcasting against `scores` as in
      `softmax(z / T)` (a size-1 key axis: one T per row), or of the batch shape (the
      scores' shape without `axis`). A T that varies along the keys is an error.
    - `mask`: boolean, True = keep; masked entries (whatever they hold, NaN included) and
      `-inf` scores get exactly zero weight and zero gradient; an all-masked row returns
      zeros.
    - `axis`: the key axis.
    - `where`: an alias of `mask`, as in `jax.nn.softmax(x, axis, where=...)`; give one
      of the two.

    **Returns:** $\\rho$ with the shape of `scores`. Renyi / Sharma-Mittal return the
    self-consistent branch of least free energy (see `stationary_branches`). A row of a
    separable family whose normalization root has not converged after 200 iterations, or
    whose weights do not sum to 1 in its dtype (Tsallis in float32 with a threshold below
    float32's smallest normal number from the top score), is returned as NaN, never as an
    unconverged answer or zeros; `stationary_info` reports it as a result code.
    """
    check_entropy(entropy)
    if where is not None:
        if mask is not None:
            raise TypeError("give `mask` or its alias `where`, not both")
        mask = where
    return call_checked(_stationary_jit, entropy, scores, T, mask, axis, axis=axis)


@eqx.filter_jit
def _stationary_jit(entropy, scores, T, mask, axis):
    # half-precision scores are solved in float32 and the weights rounded back: the
    # solvers' stopping tests need more than 8 bits
    low = jnp.issubdtype(scores.dtype, jnp.floating) and jnp.finfo(scores.dtype).bits < 32
    z_in = scores.astype(jnp.float32) if low else scores
    if mask is None and entropy.closed_form_softmax:
        rho = _softmax_unmasked(z_in, T, axis)
    elif mask is None and entropy.row_block_bytes is None:
        # (a row-blocked family keeps one path: its blocked loop would be compiled twice)
        rho = _solve_unmasked(entropy, z_in, T, axis)
    else:
        z, keep, T, empty = prepare(z_in, T, mask, axis)
        rho = _stationary_core(entropy, z, keep, T)
        if mask is None:
            # no mask: the solver already gives -inf keys weight 0, so only rows of all
            # -inf (solved as uniform) need zeroing, and without any, no pass over the output
            rho = jax.lax.cond(jnp.any(empty), lambda r: jnp.where(empty, 0.0, r),
                               lambda r: r, rho)
        else:
            rho = jnp.where(empty | ~keep, 0.0, rho)
        rho = jnp.moveaxis(rho, -1, axis)
    return rho.astype(scores.dtype) if low else rho


def _has_neg_inf(z):
    # through the row minimum: one reduction XLA:CPU vectorizes, where `any(z == -inf)` is
    # an elementwise compare plus a boolean reduction
    return jnp.any(jnp.min(z, axis=-1) == -jnp.inf)


@jax.custom_batching.custom_vmap
def _any_neg_inf(z):
    return _has_neg_inf(z)


@_any_neg_inf.def_vmap
def _any_neg_inf_vmap(axis_size, in_batched, z):
    # one answer for the whole vmapped batch (unbatched), so that the `lax.cond` below
    # stays a branch under vmap instead of becoming a select that runs both sides
    return _has_neg_inf(z), False


def _solve_unmasked(entropy, scores, T, axis):
    """The stationary map without a mask. When no score is -inf (the common case) the
    solvers run with a keep mask that is the constant True, which XLA folds away: no mask
    reads, no where-copies of the scores, no empty-row pass. A batch with any -inf score
    takes the general path; under vmap the test covers the whole batch."""
    z, zmax, T = unmasked_inputs(scores, T, axis)

    def general(z, T):
        empty = zmax == -jnp.inf
        keep = (z > -jnp.inf) | empty  # empty rows: solved as unmasked zeros, zeroed after
        rho = _stationary_core(entropy, jnp.where(keep & ~empty, z, 0.0), keep, T)
        return jnp.where(empty | ~keep, 0.0, rho)

    def finite(z, T):
        return _stationary_core(entropy, z, jnp.ones(z.shape, bool), T)

    rho = jax.lax.cond(_any_neg_inf(jax.lax.stop_gradient(z)), general, finite, z, T)
    return jnp.moveaxis(rho, -1, axis)


def _softmax_unmasked(scores, T, axis):
    """softmax(z/T) without a mask: the same input checks as `prepare` riding on one
    row-max reduction, then one fused exp-sum-divide (plain autodiff is the exact softmax
    Jacobian), instead of the general path's keep mask and custom JVP."""
    z, zmax, T = unmasked_inputs(scores, T, axis, nan_check=False)
    empty = zmax == -jnp.inf  # every key -inf (masked): a zero row, zero gradient
    d = z - jnp.where(empty, 0.0, zmax)
    # double where: -inf keys get weight 0 and no NaN in d/dT; a NaN key is kept, so that
    # the row sum carries the NaN check
    keep = d != -jnp.inf
    e = jnp.where(keep, jnp.exp(jnp.where(keep, d, 0.0) / T), 0.0)
    rho = e / jnp.where(empty, 1.0, checked_row_sum(jnp.sum(e, -1, keepdims=True)))
    return jnp.moveaxis(rho, -1, axis)


def stationary_info(
    entropy: AbstractEntropy,
    scores: Scores,
    T: Temperature = 1.0,
    *,
    mask: Mask | None = None,
    throw: bool = True,
) -> StationarySolution:
    """`stationary` with its multiplier, realized temperature and a result code.

    **Arguments:** as `stationary` (keys on the last axis), and
    - `throw`: raise a runtime error (`eqx.error_if`) unless every row succeeded; with
      `throw=False` inspect `result` instead.

    **Returns:** a `StationarySolution` batched like the rows: `rho`, `lam` (from the top
    weight through the family's law), `T_eff`, `result` (`nonlinear_divergence` for a row
    whose root did not converge) and `stats["residual"]`. No gradient.
    """
    check_entropy(entropy)
    return call_checked(_stationary_info_jit, entropy, scores, T, mask, throw)


@eqx.filter_jit
def _stationary_info_jit(entropy, scores, T, mask, throw):
    z, keep, T, empty = prepare(scores, T, mask, -1)
    rho, T_eff = _solve(entropy, z, keep, T)
    keep = keep & ~empty
    rho = jnp.where(keep, rho, 0.0)
    law = entropy.stationary_law()
    top = jnp.argmax(rho, -1, keepdims=True)
    rho_top = jnp.take_along_axis(rho, top, -1)
    G_top = law.G(jnp.where(rho_top > 0, rho_top, 1.0))
    lam = (T_eff * G_top - jnp.take_along_axis(z, top, -1))[..., 0]
    ok = jnp.all(jnp.isfinite(rho), -1)
    result = result_where(ok, RESULTS.successful, RESULTS.nonlinear_divergence)
    return finish(entropy, rho, z, keep, lam, T_eff[..., 0], result, throw)


def stationary_jacobian(
    entropy: AbstractEntropy,
    scores: Scores,
    T: Temperature = 1.0,
    *,
    mask: Mask | None = None,
) -> Float[Array, "*batch N N"]:
    """The exact Jacobian $J = \\partial\\rho/\\partial z$ from the closed form of
    docs/math.md §3.

    Separable: $J = \\mathrm{diag}(c) - c c^T/\\sum c$, $c_i = 1/(T G'(\\rho_i))$ on the
    support. Renyi / Sharma-Mittal: the same at $T_{eff}$ plus the symmetric rank-one
    correction from $dM = q\\sum\\rho^{q-1}d\\rho$ through $T_{eff}(M)$.

    **Arguments:** as `stationary` (keys on the last axis).

    **Returns:** $J$ of shape `(*batch, N, N)`.
    """
    check_entropy(entropy)
    return call_checked(_jacobian_jit, entropy, scores, T, mask)


@eqx.filter_jit
def _jacobian_jit(entropy, scores, T, mask):
    z, keep, T, empty = prepare(scores, T, mask, -1)
    rho = jax.lax.stop_gradient(_stationary_core(entropy, z, keep, T))
    active = keep & (rho > 0) & ~empty
    return _jacobian(entropy, rho, active, T)


def _projector_matrix(c):
    """$\\mathrm{diag}(c) - c c^T/\\sum c$: the Jacobian of a separable law (`_project`)."""
    sc = jnp.sum(c, -1, keepdims=True)
    sc = jnp.where(sc > 0, sc, 1.0)
    diag = jnp.vectorize(jnp.diag, signature="(n)->(n,n)")(c)
    return diag - c[..., :, None] * c[..., None, :] / sc[..., None]


@functools.singledispatch
def _jacobian(entropy, rho, active, T):
    """$\\partial\\rho/\\partial z$ at the stationary weights `rho` (support `active`)."""
    raise no_algorithm("Jacobian", entropy)


@_jacobian.register
def _(entropy: AbstractSeparableEntropy, rho, active, T):
    return _projector_matrix(_slope(entropy, rho, active) / T)


@_jacobian.register
def _(entropy: AbstractTsallisShapedEntropy, rho, active, T):
    # the separable Jacobian at T_eff plus the rank-one coupling through M_q
    q = entropy.q
    ts = entropy.tsallis()
    M = jnp.exp(_log_moment(q, rho, active))
    t = T * entropy.temperature_factor(M)
    c = _slope(ts, rho, active) / t
    J = _projector_matrix(c)
    Py = _project(c, _shifted_G(ts, rho, active))
    dphi_dM = jnp.vectorize(jax.grad(lambda m: entropy.temperature_factor(m)))(M)
    B = -Py * T * dphi_dM
    w = _moment_weights(q, rho, active)
    wJ = jnp.einsum("...i,...ij->...j", w, J)
    denom = 1.0 - jnp.sum(w * B, -1, keepdims=True)
    return J + B[..., :, None] * (wJ / denom)[..., None, :]


def free_energy(
    entropy: AbstractEntropy,
    scores: Scores,
    rho: Float[ArrayLike, "*#batch N"],
    T: Temperature = 1.0,
    *,
    mask: Mask | None = None,
) -> Float[Array, "*batch"]:
    """$F(\\rho) = \\sum_i \\rho_i E_i - T S(\\rho)$ with $E_i = -z_i$ (last axis = keys).

    **Arguments:** `entropy`; the scores; weights `rho >= 0` (off the simplex too: its
    gradient is used there); T and (keyword only) mask as in `stationary`.

    **Returns:** $F$ per row.
    """
    check_entropy(entropy)
    rho = jnp.asarray(rho)
    if not jnp.issubdtype(rho.dtype, jnp.floating):
        rho = rho.astype(jnp.result_type(float))
    # F is not defined for negative or NaN weights: the entropies' safe logarithms would
    # silently drop them
    rho = eqx.error_if(rho, jnp.any(~(rho >= 0)), "free_energy needs weights rho >= 0 (no NaN)")
    T = row_T(T, jnp.broadcast_shapes(jnp.shape(scores), rho.shape), -1)
    T = T[..., 0] if T.ndim > 0 else T  # per row, like F
    return _free_energy_unchecked(entropy, rho, scores, T, mask)


def _free_energy_unchecked(entropy, rho, scores, T, mask=None):
    z = jnp.asarray(scores, dtype=rho.dtype)
    keep = jnp.ones(z.shape, bool) if mask is None else jnp.asarray(mask)
    keep = keep & jnp.isfinite(z)
    energy = -jnp.sum(jnp.where(keep, rho * jnp.where(keep, z, 0.0), 0.0), -1)
    return energy - jnp.asarray(T) * entropy.value(rho, keep)
