"""One result enumeration for every solve in fisherdyn: stationary roots, simulations and
relaxations. It extends Diffrax's (which extends optimistix's and lineax's), so codes those
libraries return can be stored in it with `RESULTS.promote`."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import numpy as np

__all__ = ["RESULTS", "result_name", "result_names"]


class _ReadableEnumeration(type(diffrax.RESULTS)):
    """Equinox prints an item as `<module>.<class><RESULTS[item]>`, its message, and the
    successful code has none (it printed as `RESULTS<>`): here an item reads as its name,
    then its message where it has one; a batch of items as their names."""

    def __getitem__(cls, item) -> str:
        value = getattr(item, "_value", None)
        if getattr(item, "_enumeration", None) is not cls or not isinstance(
            value, (np.ndarray, jax.Array)
        ) or isinstance(value, jax.core.Tracer):
            return super().__getitem__(item)  # Equinox's errors, "traced" or "unknown"
        names = {int(np.asarray(i._value)): n for n, i in cls._name_to_item.items()}
        values = np.asarray(value)
        if values.ndim == 0:
            name, message = names[int(values)], cls._index_to_message[int(values)]
            return f"{name}: {message}" if message else name
        # a batch: the names alone, so that it reads as one short array
        return str(np.vectorize(lambda v: names[int(v)], otypes=[object])(values).astype(str))


class RESULTS(diffrax.RESULTS, metaclass=_ReadableEnumeration):  # pyright: ignore[reportGeneralTypeIssues]
    """Result codes of `simulate` and `relax`: Diffrax's, plus the dynamics' own.

    An item prints as its name and message (`fisherdyn.RESULTS<successful>`, a batch as
    its names); `RESULTS[item]` gives that text, `fisherdyn.result_name(item)` the name."""

    boundary_reached = (
        "A weight reached the boundary of the simplex in finite time (inertial replicator, "
        "Laraki & Mertikopoulos 2015); the simplex chart cannot continue there. The "
        "trajectory stops at the event: use coords='sphere' to integrate through it."
    )
    boundary_singular = (
        "A weight reached 0 in finite time where the family's force diverges (finite free "
        "energy, infinite force: the inertial dynamics is not well-posed there), so the "
        "trajectory stops at the event: increase the damping, use the overdamped flow "
        "(mass=0), or coords='simplex' to stop at its boundary event."
    )
    steady_state_not_reached = (
        "No steady state was reached before t1: increase t1 (or max_steps), or the damping."
    )
    polish_failed = (
        "The Newton polish of the integrated end point did not converge: the run had not "
        "settled near a fixed point (tighten `tol`)."
    )
    support_inconsistent = (
        "The polished fixed point violates the stationarity conditions off its support "
        "(a component at the boundary is pulled inward): the run had not settled."
    )


# printed as `fisherdyn.RESULTS<...>`, the public name
RESULTS.__module__ = "fisherdyn"


def result_names() -> dict[int, str]:
    """Every result code's integer value and its name."""
    return {int(np.asarray(item._value)): name for name, item in RESULTS._name_to_item.items()}


def result_name(result: eqx.EnumerationItem) -> str | np.ndarray:
    """The name of a result code as a word (`"successful"`, `"boundary_reached"`, ...).

    The item's name alone (its repr adds the message); a batched code gives an array of
    names of its shape.

    **Arguments:**
    - `result`: an item of `fisherdyn.RESULTS` (or of Diffrax / optimistix `RESULTS`).

    **Returns:** a `str` for a scalar code, else a NumPy array of `str`.
    """
    names = result_names()
    values = np.asarray(result._value)
    if values.ndim == 0:
        return names[int(values)]
    return np.vectorize(lambda v: names[int(v)], otypes=[object])(values).astype(str)
