"""Input checks shared by the stationary operators: keys last, NaN / +inf scores, T > 0,
masks, empty rows."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp


def as_array(x):
    """Python scalars become arrays (traced under jit), so new values of T do not recompile."""
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def keys_last(scores, axis):
    """The scores as a float array with the key axis last (at least one key)."""
    z = jnp.asarray(scores)
    if not jnp.issubdtype(z.dtype, jnp.floating):
        z = z.astype(jnp.result_type(float))
    if z.ndim == 0:
        raise ValueError("scores must have at least one axis (the keys)")
    z = jnp.moveaxis(z, axis, -1)
    if z.shape[-1] == 0:
        raise ValueError(f"scores of shape {jnp.shape(scores)} have no keys on axis {axis}")
    return z


def _broadcasts(small, big):
    """Whether `small` broadcasts against `big` without enlarging it."""
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(small[::-1], big[::-1]))


def row_T(T, shape, axis):
    """T shaped `(*batch, 1)` against the keys-last scores (or a scalar).

    T broadcasts against the scores as in `softmax(z / T)`: the key axis included, so a T
    with a size-1 key axis is per row. A T of the batch shape (the scores' shape without the
    key axis) is also accepted, per row, where the first rule does not apply. A T that varies
    along the keys is refused: the stationary law has one temperature per row."""
    T = jnp.asarray(T)
    if T.ndim == 0:
        return T
    ndim = len(shape)
    axis = axis % ndim
    batch = shape[:axis] + shape[axis + 1:]
    r = ndim - 1 - axis  # the key axis counted from the right
    key_dim = T.shape[T.ndim - 1 - r] if T.ndim > r else 1
    if _broadcasts(T.shape, shape) and key_dim == 1:
        full = jnp.reshape(T, (1,) * (ndim - T.ndim) + T.shape)
        return jnp.moveaxis(full, axis, -1)
    if _broadcasts(T.shape, shape):
        raise ValueError(
            f"T of shape {T.shape} varies along the key axis ({axis}) of scores of shape "
            f"{shape}: the stationary law takes one temperature per row; give T a size-1 "
            f"key axis (as in softmax(z / T)) or the batch shape {batch}"
        )
    if _broadcasts(T.shape, batch):
        return T[..., None]
    raise ValueError(
        f"T of shape {T.shape} does not broadcast against scores of shape {shape} (as in "
        f"softmax(z / T), a size-1 key axis for a per-row T) nor against their batch shape "
        f"{batch}"
    )


def checked_T(T, bad_scores, dtype, shape, axis):
    """T as an array shaped to broadcast against the keys-last scores (`row_T`), carrying
    the input checks. Both checks ride on the small T (every solve reads it): routing the
    full score array through `error_if` would cost an extra pass over it."""
    T = row_T(jnp.asarray(T, dtype=dtype), shape, axis)
    T = eqx.error_if(T, bad_scores, "scores contain NaN or +inf")
    return eqx.error_if(
        T, jnp.any(~(T > 0)) | jnp.any(~jnp.isfinite(T)), "T must be finite and > 0"
    )


def prepare(scores, T, mask, axis):
    """Move `axis` last, validate, and build the effective mask (False = excluded).
    Returns (z, keep, T, empty): masked scores set to 0, empty rows kept (solved as if
    unmasked, zeroed by the caller)."""
    z = keys_last(scores, axis)
    if mask is None:
        # one reduction (the NaN-propagating row max) serves the input check and the
        # empty-row test
        zmax = jnp.max(z, axis=-1, keepdims=True)
        bad_scores = jnp.any(jnp.isnan(zmax) | (zmax == jnp.inf))
        empty = zmax == -jnp.inf
        keep = z > -jnp.inf  # -inf behaves like a masked entry
    else:
        keep = jnp.asarray(mask)
        if keep.dtype != bool:
            raise TypeError(
                f"mask must be boolean (True = keep), got dtype {keep.dtype}: pass a boolean "
                "mask (e.g. `mask != 0`), or add the float mask to the scores as an additive "
                "bias (0 = keep, -inf or a large negative value = drop)"
            )
        try:
            keep = jnp.broadcast_to(keep, jnp.moveaxis(z, -1, axis).shape)
        except ValueError:
            raise ValueError(
                f"mask of shape {keep.shape} does not broadcast to scores of shape "
                f"{jnp.shape(scores)}"
            ) from None
        keep = jnp.moveaxis(keep, axis, -1)
        # a masked entry is ignored whatever it holds (padding may be garbage), as in
        # jax.nn.softmax(where=...)
        bad_scores = jnp.any((jnp.isnan(z) | (z == jnp.inf)) & keep)
        keep = keep & (z > -jnp.inf)  # -inf behaves like a masked entry
        empty = ~jnp.any(keep, axis=-1, keepdims=True)
    T = checked_T(T, bad_scores, z.dtype, jnp.shape(scores), axis)
    # kept entries are finite here (NaN / +inf raise above; -inf is never kept); an empty
    # row is solved on zeros (then zeroed by the caller), so no NaN reaches its gradient
    z = jnp.where(keep, z, 0.0)
    return z, keep | empty, T, empty


def unmasked_inputs(scores, T, axis):
    """`prepare` without a mask: keys last, the NaN/+inf and T checks riding on one row-max
    reduction. Returns (z, zmax, T) with T shaped to broadcast against z."""
    z = keys_last(scores, axis)
    zmax = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))  # NaN-propagating
    bad = jnp.any(jnp.isnan(zmax) | (zmax == jnp.inf))
    T = checked_T(T, bad, z.dtype, jnp.shape(scores), axis)
    return z, zmax, T
