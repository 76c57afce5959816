"""One result enumeration for every solve in fisherdyn: stationary roots, simulations and
relaxations. It extends Diffrax's (which extends optimistix's and lineax's), so codes those
libraries return can be stored in it with `RESULTS.promote`."""

from __future__ import annotations

import diffrax
import numpy as np

__all__ = ["RESULTS", "result_name", "result_names"]


class RESULTS(diffrax.RESULTS):  # pyright: ignore[reportGeneralTypeIssues]
    """Result codes of `simulate` and `relax`: Diffrax's, plus the dynamics' own."""

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


def result_names() -> dict[int, str]:
    """Every result code's integer value and its name."""
    return {int(np.asarray(item._value)): name for name, item in RESULTS._name_to_item.items()}


def result_name(result) -> str | np.ndarray:
    """The name of a result code as a word (`"successful"`, `"boundary_reached"`, ...).

    Equinox prints a code by its message, and the successful code has none; this gives the
    item's name instead. A batched code gives an array of names of its shape.

    **Arguments:**
    - `result`: an item of `fisherdyn.RESULTS` (or of Diffrax / optimistix `RESULTS`).

    **Returns:** a `str` for a scalar code, else a NumPy array of `str`.
    """
    names = result_names()
    values = np.asarray(result._value)
    if values.ndim == 0:
        return names[int(values)]
    return np.vectorize(lambda v: names[int(v)], otypes=[object])(values).astype(str)
