"""Input checks shared by the stationary operators: keys last, NaN / +inf scores, T > 0,
masks, empty rows."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._misc import is_concrete


def as_array(x):
    """Python scalars become arrays (traced under jit), so new values of T do not recompile."""
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def call_checked(jitted, entropy, scores, T, mask, *rest, axis: int = -1):
    """Call a public entry point's jitted body `jitted(entropy, scores, T, mask, *rest)`
    with its inputs checked: concrete ones raise a one-line `ValueError`, traced ones are
    checked at run time (`prepare`).

    T is checked on the host before any tracing (it is small). The scores are checked by
    the solver's own pass over them (`prepare`): an eager call waits for its result anyway
    (Equinox's `filter_jit` blocks on it), so a failed check is turned into the same
    `ValueError` here at no cost, where a separate pass before the call would read every
    score twice."""
    check_concrete(scores, T, mask, axis, scan_scores=False)
    scores, T = as_array(scores), as_array(T)
    try:
        return jitted(entropy, scores, T, mask, *rest)
    except eqx.EquinoxRuntimeError as e:
        # (also raised here by an eager vmap or grad, whose inputs are tracers)
        text = str(e)
        if f"EquinoxRuntimeError: {T_MESSAGE}\n" in text:
            raise ValueError(T_MESSAGE) from None
        if f"EquinoxRuntimeError: {SCORES_MESSAGE.format(count='')}\n" not in text:
            raise
        if not is_concrete((scores, mask)):
            raise ValueError(SCORES_MESSAGE.format(count="")) from None
        raise ValueError(_scores_message(scores, mask)) from None


def refuse_complex(x, name="scores"):
    """A one-line `TypeError` for complex input, which a cast to float would silently
    reduce to its real part: the stationary law is a probability vector over real scores."""
    dtype = getattr(x, "dtype", None)
    if dtype is None and x is not None:
        try:  # a Python number or a nested list
            dtype = np.asarray(x).dtype
        except Exception:  # e.g. a list of tracers: jnp.asarray's own cast decides
            return
    if dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(
            f"{name} is complex ({dtype}), and the stationary law takes real values: "
            f"pass jnp.real({name}) (or its modulus) explicitly"
        )


def keys_last(scores, axis):
    """The scores as a float array with the key axis last (at least one key)."""
    refuse_complex(scores)
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
    T = eqx.error_if(T, bad_scores, SCORES_MESSAGE.format(count=""))
    return eqx.error_if(T, jnp.any(~(T > 0)) | jnp.any(~jnp.isfinite(T)), T_MESSAGE)


# the reason first: under jit these are the messages Equinox's runtime error carries
SCORES_MESSAGE = (
    "scores contain NaN or +inf{count}: mask the keys that take no part (mask=False, or "
    "a -inf score)"
)
T_MESSAGE = "T must be finite and > 0"
EMPTY_MESSAGE = (
    "every key of a row is masked (mask all False, or all scores -inf): there is no "
    "stationary law"
)


def nan_scores(z, axis=-1):
    """Per row: whether a score is NaN. XLA:CPU's row maximum of a long row skips NaN, so
    the test is a sum of signs (never overflowing, NaN exactly when a score is), which
    XLA fuses into the same pass as the maximum."""
    return jnp.isnan(jnp.sum(jnp.sign(z), axis=axis, keepdims=True))


def checked_row_sum(s):
    """A row sum of the weights, checked: NaN there means NaN scores (the softmax path keeps
    NaN keys in its sum, so that the sum it computes anyway is the test)."""
    return eqx.error_if(s, jnp.any(jnp.isnan(s)), SCORES_MESSAGE.format(count=""))


@functools.partial(jax.jit, static_argnames=("axis", "need_keys"))
def _bad_scores(z, keep, axis, need_keys):
    """(NaN or +inf on a kept key, a row with no kept key) as one small array: one pass
    over the scores (their NaN-propagating row maximum) and one transfer to the host."""
    top = jnp.max(z if keep is None else jnp.where(keep, z, -jnp.inf), axis=axis)
    bad = jnp.any(jnp.isnan(top) | (top == jnp.inf))
    bad = bad | jnp.any(nan_scores(z if keep is None else jnp.where(keep, z, 0.0), axis))
    empty = jnp.any(top == -jnp.inf) if need_keys else jnp.zeros((), bool)
    return jnp.stack([bad, empty])


def _checkable_scores(scores, mask, axis):
    """(scores, mask) as the pre-check reads them, or (None, None) where it leaves the
    inputs to the solver's own errors (no keys, a non-boolean or ill-shaped mask, integer
    scores, which hold no NaN) or to the runtime checks (traced inputs)."""
    z = scores
    if not is_concrete((z, mask)) or jnp.ndim(z) == 0 or jnp.size(z) == 0:
        return None, None
    if not -jnp.ndim(z) <= axis < jnp.ndim(z):
        return None, None
    if not jnp.issubdtype(jnp.result_type(z), jnp.floating):
        return None, None
    if mask is None:
        return z, None
    keep = jnp.asarray(mask)
    if keep.dtype != bool or jnp.broadcast_shapes(keep.shape, jnp.shape(z)) != jnp.shape(z):
        return None, None
    return z, keep


def _scores_message(scores, mask):
    """`SCORES_MESSAGE` with the count of offending entries (read on the host: an error)."""
    values = np.asarray(scores)
    bad = np.isnan(values) | (values == np.inf)
    if mask is not None:
        bad = bad & np.broadcast_to(np.asarray(mask), values.shape)
    return SCORES_MESSAGE.format(count=f" ({int(bad.sum())} of {values.size} entries)")


def check_concrete(
    scores, T, mask=None, axis: int = -1, *, need_keys: bool = False, scan_scores: bool = True
):
    """Raise a one-line `ValueError` now, before any tracing, for inputs known at the call:
    a T that is not finite and > 0; with `scan_scores`, NaN or +inf scores on kept keys;
    with `need_keys`, a row whose keys are all masked. Traced inputs (under jit, vmap or
    grad) are skipped: the runtime checks of `prepare` cover them.

    T is read on the host (it is small). The scores are read on their device, one
    reduction and one boolean to the host: a pass over them, for entry points whose own
    program does not check them (`call_checked` is free for those that do)."""
    refuse_complex(scores)
    refuse_complex(T, "T")
    if isinstance(T, (int, float)) and T > 0 and math.isfinite(T):
        pass  # the common case, without a trip through NumPy
    elif is_concrete(T):
        values = np.asarray(T).astype(float).ravel()
        bad = values[~(values > 0) | ~np.isfinite(values)]
        if bad.size:
            got = f"{bad[0]}" if values.size == 1 else (
                f"{bad[0]} ({bad.size} of its {values.size} values)")
            raise ValueError(f"{T_MESSAGE}, got {got}")
    if not (scan_scores or need_keys):
        return
    try:
        z, keep = _checkable_scores(scores, mask, axis)
    except ValueError:  # a mask that does not broadcast: `prepare` says so
        return
    if z is None:
        return
    with jax.ensure_compile_time_eval():  # inside an outer trace, concrete stays concrete
        flags = _bad_scores(z, keep, axis, need_keys)
    bad, empty = np.asarray(flags)
    if bad and scan_scores:
        raise ValueError(_scores_message(z, keep))
    if empty:
        raise ValueError(EMPTY_MESSAGE)


def prepare(scores, T, mask, axis):
    """Move `axis` last, validate, and build the effective mask (False = excluded).
    Returns (z, keep, T, empty): masked scores set to 0, empty rows kept (solved as if
    unmasked, zeroed by the caller)."""
    z = keys_last(scores, axis)
    if mask is None:
        # one reduction (the NaN-propagating row max) serves the input check and the
        # empty-row test
        zmax = jnp.max(z, axis=-1, keepdims=True)
        bad_scores = jnp.any(jnp.isnan(zmax) | (zmax == jnp.inf) | nan_scores(z))
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


def unmasked_inputs(scores, T, axis, nan_check=True):
    """`prepare` without a mask: keys last, the NaN/+inf and T checks riding on the row-max
    pass. Returns (z, zmax, T) with T shaped to broadcast against z. `nan_check=False`:
    the caller tests NaN itself (`checked_row_sum`), +inf and T are still checked here."""
    z = keys_last(scores, axis)
    zmax = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    bad = jnp.isnan(zmax) | (zmax == jnp.inf)
    if nan_check:
        bad = bad | nan_scores(jax.lax.stop_gradient(z))
    bad = jnp.any(bad)
    T = checked_T(T, bad, z.dtype, jnp.shape(scores), axis)
    return z, zmax, T
