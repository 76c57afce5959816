"""Inputs of `simulate` and `relax`: conversion, checks, default tolerances and solvers.

Every check raises a `ValueError` at the call when its inputs are concrete, and becomes an
`eqx.error_if` runtime check when they are traced (under an outer `jit` or `vmap`).
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._custom_types import Array, Float
from .._entropies import AbstractEntropy
from .._misc import check, check_entropy, is_concrete
from .._stationary import refuse_complex
from ._system import FisherSystem

__all__ = [
    "Problem",
    "prepare",
    "arrayify_entropy",
    "check",
    "default_tols",
    "positive_time",
    "is_overdamped",
    "parameters",
    "resolve_solver",
    "resolve_adjoint",
    "controller",
    "masked_rms_norm",
    "raise_if",
]


def arrayify_entropy(entropy: AbstractEntropy, dtype) -> AbstractEntropy:
    """Python-number parameters become arrays, so they are traced (no recompiles)."""
    entropy = entropy.for_tracing()
    return jtu.tree_map(
        lambda leaf: jnp.asarray(leaf, dtype) if isinstance(leaf, (int, float)) else leaf,
        entropy,
    )


# Default tolerances per itemsize of the float type: (rtol, atol, steady-state tol, Newton tol).
_DEFAULT_TOLS = {8: (1e-8, 1e-10, 1e-6, 1e-12), 4: (1e-5, 1e-7, 1e-3, 1e-5)}


def default_tols(dtype, **given) -> dict[str, Float[Array, "*#batch"]]:
    """Fill the tolerances left as None with the defaults for `dtype`, as checked arrays.

    The float32 defaults apply when JAX's x64 mode is off, where the float64 ones are
    unreachable. Checked: `rtol`, `atol` $\\ge 0$ with `rtol + atol` $> 0$; `tol` and
    `polish_tol` $> 0$; all finite (a tolerance of 0 or below would only surface as a run that
    never settles, long after the call).
    """
    rtol, atol, tol, polish = _DEFAULT_TOLS.get(jnp.dtype(dtype).itemsize, _DEFAULT_TOLS[4])
    defaults = dict(rtol=rtol, atol=atol, tol=tol, polish_tol=polish)
    out = {k: jnp.asarray(defaults[k] if v is None else v, dtype) for k, v in given.items()}
    for k, v in out.items():
        positive = k in ("tol", "polish_tol")
        ok = jnp.all(jnp.isfinite(v)) & jnp.all(v > 0 if positive else v >= 0)
        out[k] = check(ok, f"{k} must be finite and {'> 0' if positive else '>= 0'}", v)
    if "rtol" in out and "atol" in out:
        out["rtol"] = check(
            jnp.all(out["rtol"] + out["atol"] > 0), "rtol and atol cannot both be 0", out["rtol"]
        )
    return out


def positive_time(t1, dtype) -> Float[Array, "*#batch"]:
    """`t1` as an array of `dtype`, checked finite and $> 0$."""
    t1 = jnp.asarray(t1, dtype)
    return check(jnp.all(t1 > 0) & jnp.all(jnp.isfinite(t1)), "t1 must be finite and > 0", t1)


# The explicit solvers loop over their stages with `lax.scan` (one trace of the vector
# field instead of one per stage): faster to compile, same steps. A plain `lax` loop cannot
# be reverse-differentiated, so a solve that may be (any adjoint but `ForwardMode`) uses
# Diffrax's bounded loop instead.
_SOLVERS = {
    "tsit5": lambda kind: diffrax.Tsit5(scan_kind=kind),
    "dopri5": lambda kind: diffrax.Dopri5(scan_kind=kind),
    "dopri8": lambda kind: diffrax.Dopri8(scan_kind=kind),
    "kvaerno5": lambda kind: diffrax.Kvaerno5(),
}


def resolve_solver(
    solver: diffrax.AbstractSolver | str | None, reverse: bool = False
) -> diffrax.AbstractSolver:
    """A Diffrax solver from `solver=`: an instance, a name in `_SOLVERS`, or None (Tsit5);
    `reverse`: the named solvers' stage loop must be reverse-differentiable."""
    kind = "bounded" if reverse else "lax"
    if solver is None:
        return _SOLVERS["tsit5"](kind)
    if isinstance(solver, diffrax.AbstractSolver):
        return solver
    if isinstance(solver, str) and solver.lower() in _SOLVERS:
        return _SOLVERS[solver.lower()](kind)
    raise ValueError(
        f"solver must be a diffrax solver or one of {sorted(_SOLVERS)}, got {solver!r}"
    )


def resolve_adjoint(adjoint: diffrax.AbstractAdjoint | None) -> diffrax.AbstractAdjoint:
    """`adjoint=`: None is Diffrax's checkpointed reverse mode (`RecursiveCheckpointAdjoint`)."""
    if adjoint is None:
        return diffrax.RecursiveCheckpointAdjoint()
    if not isinstance(adjoint, diffrax.AbstractAdjoint):
        raise ValueError(f"adjoint must be a diffrax adjoint, got {adjoint!r}")
    return adjoint


def masked_rms_norm(mask):
    """The RMS norm over the unmasked keys only, so that padding a problem with masked keys
    leaves its step sizes unchanged (Diffrax's norm would average over the padding too)."""

    def norm(tree):
        leaves = jtu.tree_leaves(tree)
        total = sum(jnp.sum(jnp.where(mask, leaf * leaf, 0.0)) for leaf in leaves)
        count = len(leaves) * jnp.sum(mask, dtype=total.dtype)
        mean = total / count
        positive = mean > 0
        return jnp.where(positive, jnp.sqrt(jnp.where(positive, mean, 1.0)), 0.0)

    return norm


def controller(solver: diffrax.AbstractSolver, rtol, atol, mask=None) -> diffrax.PIDController:
    """The step-size controller: for the explicit solvers a less sensitive PI controller (one
    of Diffrax's suggested sets for error estimates that do not vary smoothly), Diffrax's
    default coefficients for the implicit ones. With a `mask`, its norm skips masked keys."""
    kwargs = {} if mask is None else dict(norm=masked_rms_norm(mask))
    if isinstance(solver, diffrax.AbstractImplicitSolver):
        return diffrax.PIDController(rtol=rtol, atol=atol, **kwargs)
    return diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=0.3, icoeff=0.3, **kwargs)


def is_overdamped(mass) -> bool:
    """`mass == 0` (concretely) selects the first-order replicator flow."""
    if not is_concrete(mass):
        return False
    m = np.asarray(mass)
    if np.any(m < 0) or not np.all(np.isfinite(m)):
        raise ValueError(f"mass must be finite and >= 0, got {mass}")
    if np.all(m == 0):
        return True
    if np.any(m == 0):
        raise ValueError(
            "mass = 0 (the overdamped flow, a first-order system) and mass > 0 cannot be "
            "mixed in one batch: solve them in separate calls"
        )
    return False


class Problem(eqx.Module):
    """A checked problem: the system, the initial state and the broadcast batch shape."""

    system: FisherSystem
    rho0: Float[Array, "*#batch N"]
    velocity0: Float[Array, "*#batch N"] | None
    batch_shape: tuple[int, ...] = eqx.field(static=True)


def _scores(scores, mask):
    """The scores as a float array and the mask (None: every key takes part).

    A `-inf` score (in concrete scores) is a masked key, as in `jax.nn.softmax`; masked
    scores are stored as 0 so that nothing non-finite enters the forces.
    """
    refuse_complex(scores)
    z = jnp.asarray(scores)
    z = z.astype(jnp.result_type(float)) if not jnp.issubdtype(z.dtype, jnp.floating) else z
    if jnp.finfo(z.dtype).bits < 32:
        # bfloat16 / float16: integrated in float32 (an adaptive solver cannot resolve
        # its tolerances in 8-10 mantissa bits); results come back in float32
        z = z.astype(jnp.float32)
    if z.ndim == 0:
        raise ValueError("scores must have at least one axis (the keys)")
    if z.shape[-1] < 2:
        raise ValueError(f"the dynamics needs at least 2 keys, got scores of shape {z.shape}")
    if mask is None and is_concrete(z) and bool(np.any(np.isneginf(np.asarray(z)))):
        mask = True
    if mask is None:
        return check(jnp.all(jnp.isfinite(z)), "scores must be finite", z), None
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise ValueError(f"mask must be boolean (True: the key takes part), got {mask.dtype}")
    shape = jnp.broadcast_shapes(z.shape, mask.shape)
    mask = jnp.broadcast_to(mask, shape) & (jnp.broadcast_to(z, shape) != -jnp.inf)
    z = jnp.where(mask, z, jnp.zeros((), z.dtype))
    z = check(jnp.all(jnp.isfinite(z)), "scores must be finite (or -inf: masked)", z)
    mask = check(
        jnp.all(jnp.any(mask, -1)),
        "every key of a problem is masked (mask all False, or all scores -inf): there is "
        "nothing to integrate",
        mask,
    )
    return z, mask


def parameters(T, mass, damping, dtype, overdamped, need_damping, mass_may_vanish=False):
    """T, mass and damping as checked arrays of `dtype` (`overdamped`: `is_overdamped`'s
    answer; `need_damping`: relax; `mass_may_vanish`: a traced mass may be 0, the
    overdamped limit, as `relaxation_spectrum` takes it)."""
    for value, name in ((T, "T"), (mass, "mass"), (damping, "damping")):
        refuse_complex(value, name)
    T = jnp.asarray(T, dtype)
    T = check(jnp.all(T > 0) & jnp.all(jnp.isfinite(T)), "T must be finite and > 0", T)
    mass = jnp.asarray(mass, dtype)
    damping = jnp.asarray(damping, dtype)
    damping = check(
        jnp.all(damping >= 0) & jnp.all(jnp.isfinite(damping)),
        "damping must be finite and >= 0",
        damping,
    )
    if overdamped or need_damping:
        what = "the overdamped flow (mass = 0)" if overdamped else "relax"
        damping = check(jnp.all(damping > 0), f"{what} needs damping > 0", damping)
    if not overdamped and mass_may_vanish:
        ok = (mass >= 0) & jnp.isfinite(mass) & ((mass > 0) | (damping > 0))
        mass = check(
            jnp.all(ok), "mass must be finite and >= 0, and damping > 0 where mass = 0", mass
        )
    elif not overdamped:
        mass = check(jnp.all(mass > 0), "mass must be > 0 (or exactly 0: overdamped)", mass)
    return T, mass, damping


def _initial_weights(rho0, entropy, n, dtype, mask) -> Float[Array, "*#batch N"]:
    if rho0 is None:
        if mask is None:
            return jnp.full((n,), 1.0 / n, dtype)
        n_active = jnp.sum(mask, -1, keepdims=True, dtype=dtype)
        return jnp.where(mask, 1 / n_active, jnp.zeros((), dtype))
    refuse_complex(rho0, "rho0")
    rho0 = jnp.asarray(rho0, dtype)
    if rho0.shape[-1:] != (n,):
        raise ValueError(f"rho0 must have {n} weights on its last axis, got {rho0.shape}")
    if mask is not None:
        rho0 = jnp.where(mask, rho0, jnp.zeros((), dtype))
    ok = (
        jnp.all(rho0 >= 0, -1)
        & jnp.all(jnp.isfinite(rho0), -1)
        & (jnp.abs(jnp.sum(rho0, -1) - 1) <= 1e-9 * n)
    )
    where = "" if mask is None else " on the unmasked keys"
    rho0 = check(ok, f"rho0 must lie on the simplex{where} (rho0 >= 0, sum(rho0) = 1)", rho0)
    if not entropy.finite_at_boundary:
        rho0 = check(
            jnp.all((rho0 > 0) | (False if mask is None else ~mask)),
            f"{entropy.name}'s free energy is infinite on the boundary: rho0 must be > 0"
            + where,
            rho0,
        )
    return rho0


def _initial_velocity(velocity0, rho0, n, dtype, overdamped, mask):
    if velocity0 is None:
        return None if overdamped else jnp.zeros_like(rho0)
    if overdamped:
        raise ValueError("the overdamped flow (mass = 0) is first order: omit velocity0")
    refuse_complex(velocity0, "velocity0")
    v0 = jnp.asarray(velocity0, dtype)
    if v0.shape[-1:] != (n,):
        raise ValueError(f"velocity0 must have {n} entries on its last axis, got {v0.shape}")
    if mask is not None:
        v0 = jnp.where(mask, v0, jnp.zeros((), dtype))
    scale = 1.0 + jnp.max(jnp.abs(v0), -1)
    ok = (
        jnp.all(jnp.isfinite(v0), -1)
        & (jnp.abs(jnp.sum(v0, -1)) <= 1e-9 * n * scale)
        & jnp.all((rho0 > 0) | (v0 == 0), -1)
    )
    return check(
        ok,
        "velocity0 must be tangent to the simplex: sum(velocity0) = 0, and 0 wherever "
        "rho0 = 0 (a weight on the boundary cannot move with finite Fisher speed)",
        v0,
    )


def prepare(
    entropy,
    scores,
    T,
    mass,
    damping,
    rho0,
    velocity0,
    overdamped: bool,
    need_damping: bool,
    mask=None,
) -> Problem:
    """Convert and check the inputs of `simulate` / `relax` (`need_damping`: relax, which
    needs $\\gamma > 0$ to settle; `mask`: boolean, broadcasting against the scores)."""
    check_entropy(entropy)
    z, mask = _scores(scores, mask)
    dtype, n = z.dtype, z.shape[-1]
    T, mass, damping = parameters(T, mass, damping, dtype, overdamped, need_damping)
    entropy = arrayify_entropy(entropy, dtype)
    rho0 = _initial_weights(rho0, entropy, n, dtype, mask)
    v0 = _initial_velocity(velocity0, rho0, n, dtype, overdamped, mask)
    leaves = [z[..., 0], T, mass, damping, rho0[..., 0]]
    leaves += [leaf for leaf in jtu.tree_leaves(entropy)]
    if v0 is not None:
        leaves.append(v0[..., 0])
    batch_shape = jnp.broadcast_shapes(*[jnp.shape(leaf) for leaf in leaves])
    system = FisherSystem(entropy, z, T, mass, damping, mask)
    return Problem(system, rho0, v0, tuple(batch_shape))


def raise_if(out, failed):
    """Raise the result's message where `failed`.

    Called eagerly the check runs now, on the small result array alone (routing the weights
    through it would gather a sharded batch onto one device); under an outer jit it is
    attached to the weights.
    """
    if is_concrete(failed):
        out.result.error_if(jnp.zeros(()), failed)
        return out
    return eqx.tree_at(lambda o: o.rho, out, out.result.error_if(out.rho, failed))
