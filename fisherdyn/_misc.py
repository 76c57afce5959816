"""Small helpers shared across the subpackages."""

from __future__ import annotations

import reprlib

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

RUN_ONCE = dict(compiler_options={"xla_backend_optimization_level": 0})
"""`jax.jit` / `eqx.filter_jit` keyword arguments for programs that run once or a few times
(initialization, evaluation, short training runs): on a CPU, XLA's optimizing compiler takes
far longer than such a program runs, and level 0 gives the same results to round-off."""


def concrete_float(x) -> float | None:
    """The float value of `x` when it is known at trace time, else None."""
    try:
        return float(np.asarray(x))
    except Exception:  # a tracer: validated later, or not at all
        return None


def softplus_inverse(y):
    """The inverse of `jax.nn.softplus` for y > 0, written so that large y do not overflow."""
    y = jnp.asarray(y)
    return y + jnp.log(-jnp.expm1(-y))


def is_concrete(tree) -> bool:
    """Whether no leaf of `tree` is a tracer (its values can be checked in Python)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jtu.tree_leaves(tree))


def check(cond_ok, message: str, value):
    """Raise `ValueError(message)` now when `cond_ok` is concrete, else attach a runtime check
    (`eqx.error_if`) to `value`: the one rule every public entry point follows."""
    if is_concrete(cond_ok):
        if not bool(np.all(np.asarray(cond_ok))):
            raise ValueError(message)
        return value
    return eqx.error_if(value, ~jnp.all(cond_ok), message)


def real_parameter(value, name: str, family: str) -> np.ndarray | None:
    """Check that an entropy parameter is real: a Python or NumPy number, or a real (integer
    or floating) NumPy / JAX array or tracer. Anything else (a string, a complex number, a
    bool, None, a list) raises a one-line `TypeError` naming the parameter, at construction
    rather than as a JAX error inside the first solve.

    **Returns:** the values as a float NumPy array when they are known now, else None."""
    if isinstance(value, (bool, np.bool_)):
        kind = None
    elif isinstance(value, (int, float, np.integer, np.floating)):
        kind = "f"
    else:
        dtype = getattr(value, "dtype", None)
        is_array = isinstance(value, (jax.Array, np.ndarray, jax.core.Tracer))
        kind = np.dtype(dtype).kind if is_array and dtype is not None else None
    if kind not in ("f", "i", "u"):
        dtype = getattr(value, "dtype", None)
        got = f"an array of dtype {dtype}" if dtype is not None else (
            f"{type(value).__name__} {reprlib.repr(value)}")
        raise TypeError(
            f"{family}'s parameter {name} must be a real number or a real array, got {got}"
        )
    if isinstance(value, jax.core.Tracer):
        return None
    return np.asarray(value, dtype=float)


def check_entropy(entropy) -> None:
    """Raise a `TypeError` unless `entropy` is a fisherdyn entropy instance."""
    from ._entropies import AbstractEntropy

    if not isinstance(entropy, AbstractEntropy):
        raise TypeError(f"expected a fisherdyn entropy (e.g. fd.Shannon()), got {entropy!r}")


def param_jvp(fn, entropy, t_entropy):
    """Directional derivative of `fn(entropy)` along the entropy tangent (None = zero)."""
    if t_entropy is None:
        return None
    leaves, treedef = jtu.tree_flatten(entropy)
    t_leaves = treedef.flatten_up_to(t_entropy)
    idx = [i for i, t in enumerate(t_leaves) if t is not None]
    if not idx:
        return None

    def f(*vals):
        new = list(leaves)
        for i, v in zip(idx, vals):
            new[i] = v
        return fn(jtu.tree_unflatten(treedef, new))

    return jax.jvp(f, [leaves[i] for i in idx], [t_leaves[i] for i in idx])[1]
