"""The entropy families `fit_path` can fit, each with an unconstrained chart of its shape
parameter (so that Levenberg-Marquardt can move it freely)."""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._entropies import Abe, AbstractEntropy, Burg, Kaniadakis, Renyi, Shannon, Tsallis

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


_Q_LO, _K_LO, _K_HI, _E_LO = 0.01, 0.01, 0.95, 0.01


def _softplus_inv(y):
    y = np.asarray(y, float)
    return np.log(np.expm1(y))


def _q_of(u):
    return 1.0 + _Q_LO + jax.nn.softplus(u)


def _kappa_of(u):
    return _K_LO + (_K_HI - _K_LO) * jax.nn.sigmoid(u)


def _abe_q_of(u):
    return jnp.exp(_E_LO + jax.nn.softplus(u))


FAMILIES: tuple[Family, ...] = (
    Family("Shannon", Shannon, 0, None, lambda u: Shannon(), lambda u: jnp.nan * u,
           lambda v: 0.0),
    Family("Tsallis", Tsallis, 1, "q", lambda u: Tsallis(_q_of(u)), _q_of,
           lambda v: _softplus_inv(v - 1.0 - _Q_LO)),
    Family("Renyi", Renyi, 1, "q", lambda u: Renyi(_q_of(u)), _q_of,
           lambda v: _softplus_inv(v - 1.0 - _Q_LO)),
    Family("Kaniadakis", Kaniadakis, 1, "kappa", lambda u: Kaniadakis(_kappa_of(u)),
           _kappa_of,
           lambda v: float(np.log((abs(v) - _K_LO) / (_K_HI - abs(v))))),
    Family("Abe", Abe, 1, "q", lambda u: Abe(_abe_q_of(u)), _abe_q_of,
           lambda v: _softplus_inv(abs(math.log(v)) - _E_LO)),
    Family("Burg", Burg, 0, None, lambda u: Burg(), lambda u: jnp.nan * u, lambda v: 0.0),
)

fit_families: tuple[str, ...] = tuple(f.name for f in FAMILIES)
"""Names of the families `fit_path` can fit (Sharma-Mittal is not among them: it has two
shape parameters and contains Renyi (r -> 1) and Tsallis (r = q) as limits)."""


def family_of(entropy: AbstractEntropy, argument: str = "entropy") -> tuple[int, float | None]:
    """(index into `FAMILIES`, the instance's shape parameter or None) of an entropy instance;
    a name or a class is refused, since the instance also gives the fit its starting shape."""
    if not isinstance(entropy, AbstractEntropy):
        what = f"the name {entropy!r}" if isinstance(entropy, str) else repr(entropy)
        raise TypeError(f"{argument} must be an entropy instance such as fisherdyn.Tsallis(1.5) "
                        f"(the family and its starting shape), got {what}")
    for i, f in enumerate(FAMILIES):
        if type(entropy) is f.cls:
            leaves = [float(np.asarray(v)) for v in vars(entropy).values()]
            return i, (leaves[0] if leaves else None)
    raise ValueError(f"cannot fit family {type(entropy).__name__}; choose one of {fit_families}")


def family_index(name: str) -> int:
    """The index into `FAMILIES` of a family's name as `PathFit.family` records it."""
    return [f.name for f in FAMILIES].index(name)
