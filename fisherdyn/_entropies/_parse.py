from __future__ import annotations

import numpy as np

from ._base import _REGISTRY, AbstractEntropy, _parse_key


def families() -> tuple[type[AbstractEntropy], ...]:
    """The library's registered families (those that declare `parse_names`), in the order
    their classes are defined: the one list the command line and the operator table read."""
    # a family registered from outside the package is parsed, not shown by default
    return tuple(c for c in dict.fromkeys(_REGISTRY.values())
                 if c.__module__.startswith("fisherdyn."))


def default_entropies(*, examples: bool = False) -> list[AbstractEntropy]:
    """One entropy per registered family at its `parse_defaults`, each followed by its
    `example_parameters` when `examples` is true."""
    return [
        cls(*params)
        for cls in families()
        for params in (cls.parse_defaults, *(cls.example_parameters if examples else ()))
    ]


def entropy_label(entropy: AbstractEntropy) -> str:
    """`Kaniadakis kappa=0.3`: the class name and each parameter by its field name."""
    params = [f"{name}={float(np.asarray(v)):g}" for name, v in entropy.parameters.items()]
    return " ".join([type(entropy).__name__, *params])


def parse_entropy(spec: str) -> AbstractEntropy:
    """Build an entropy from a string such as `"kaniadakis:0.3"` or `"sharma_mittal:2,1.5"`.

    The names and default parameters are those the families declare (`parse_names`,
    `parse_defaults`); omitted trailing parameters take their defaults.

    **Arguments:**
    - `spec`: `"name"` or `"name:p1,p2,..."` (case, `-` and `_` ignored).

    **Returns:** the entropy instance.
    """
    name, _, args = spec.strip().partition(":")
    key = _parse_key(name)
    try:
        values = [float(a) for a in args.split(",")] if args.strip() else []
    except ValueError as e:
        raise ValueError(f"cannot read the parameters of entropy {spec!r}") from e
    if key not in _REGISTRY:
        # the names as the families declare (and the docs spell) them, not the lookup keys
        names = sorted({n for c in _REGISTRY.values() for n in c.parse_names})
        raise ValueError(f"unknown entropy {name!r}; choose one of: {', '.join(names)}")
    cls = _REGISTRY[key]
    defaults = tuple(cls.parse_defaults)
    if len(values) > len(defaults):
        raise ValueError(
            f"entropy {name!r} takes {len(defaults)} parameter(s), got {len(values)}"
        )
    return cls(*values, *defaults[len(values):])
