"""Type aliases for the public signatures (jaxtyping shape annotations).

Dimension names used throughout: `*batch` for leading batch axes, `N` for the keys of one
problem (the last axis unless `axis=` says otherwise), `K` for a number of branches or saved
times.
"""

from __future__ import annotations

from typing import Union

import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Complex, Float, Int, PyTree

__all__ = [
    "Array",
    "ArrayLike",
    "Bool",
    "Complex",
    "Float",
    "Int",
    "PyTree",
    "RealScalarLike",
    "Scores",
    "Weights",
    "Mask",
    "Temperature",
]

RealScalarLike = Union[float, int, np.floating, np.integer, Float[ArrayLike, ""]]
"""A real scalar: a Python number, a NumPy scalar or a 0-d array."""

Scores = Float[ArrayLike, "*batch N"]
"""Attention scores $z$, keys on the last axis (or the axis named by `axis=`)."""

Weights = Float[Array, "*batch N"]
"""A probability vector (or a batch of them) on the simplex."""

Mask = Bool[ArrayLike, "*#batch N"]
"""True where a key takes part; broadcasts against the scores."""

Temperature = Float[ArrayLike, "*#batch"] | RealScalarLike
"""A temperature $T > 0$: a scalar, or one per problem broadcasting against the scores."""
