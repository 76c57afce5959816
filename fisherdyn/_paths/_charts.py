"""The entropy families `fit_path` can fit, each with an unconstrained chart of its shape
parameter (so that Levenberg-Marquardt can move it freely): every registered family without
a parameter, and every one-parameter family that declares its chart (`shape_chart`)."""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from .._entropies import AbstractEntropy, families

__all__ = ["fit_families"]


class Family(NamedTuple):
    """An entropy family as the fitter sees it: its unconstrained shape chart."""

    name: str
    cls: type
    n_shape: int
    shape_name: str | None
    build: Callable  # u (scalar array) -> entropy instance
    value: Callable  # u -> the shape parameter's value
    chart: Callable  # value -> u (for initial guesses)


def _family(cls: type[AbstractEntropy]) -> Family | None:
    """`cls` as the fitter sees it, or None where it cannot fit it."""
    if not cls.parse_defaults:
        return Family(cls.__name__, cls, 0, None, lambda u: cls(), lambda u: jnp.nan * u,
                      lambda v: 0.0)
    chart = cls.shape_chart()
    if chart is None or len(cls.parse_defaults) != 1:
        return None
    shape, inverse = chart
    name = dataclasses.fields(cls)[0].name
    return Family(cls.__name__, cls, 1, name, lambda u: cls(shape(u)), shape, inverse)


FAMILIES: tuple[Family, ...] = tuple(f for f in map(_family, families()) if f is not None)

fit_families: tuple[str, ...] = tuple(f.name for f in FAMILIES)
"""Names of the families `fit_path` can fit: those without a parameter, and those with one
whose class declares an unconstrained chart of it (`shape_chart`). Sharma-Mittal is not
among them: it has two shape parameters and contains Renyi (r -> 1) and Tsallis (r = q) as
limits."""


def family_of(entropy: AbstractEntropy, argument: str = "entropy") -> tuple[int, float | None]:
    """(index into `FAMILIES`, the instance's shape parameter or None) of an entropy instance;
    a name or a class is refused, since the instance also gives the fit its starting shape."""
    if not isinstance(entropy, AbstractEntropy):
        what = f"the name {entropy!r}" if isinstance(entropy, str) else repr(entropy)
        raise TypeError(f"{argument} must be an entropy instance such as fisherdyn.Tsallis(1.5) "
                        f"(the family and its starting shape), got {what}")
    for i, f in enumerate(FAMILIES):
        if type(entropy) is f.cls:
            leaves = [float(np.asarray(v)) for v in entropy.parameters.values()]
            return i, (leaves[0] if leaves else None)
    raise ValueError(f"cannot fit family {type(entropy).__name__}; choose one of {fit_families}")


def family_index(name: str) -> int:
    """The index into `FAMILIES` of a family's name as `PathFit.family` records it."""
    return [f.name for f in FAMILIES].index(name)
