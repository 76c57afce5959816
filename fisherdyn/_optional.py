"""Optional dependencies: the packages that sweeps, plots, progress bars, the command line and
the Flax layers need beyond the core, each named with the extra that installs it.

The core (entropies, stationary operators, dynamics, attention) imports none of them; the
module that uses one imports it through `require` when it is first needed, so that a missing
package is one line saying what to install, not a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable
from types import ModuleType

__all__ = ["MissingExtra", "missing", "require", "require_all"]


class MissingExtra(ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that installs it."""

    def __init__(self, names: list[str], extra: str, what: str | None = None):
        self.names, self.extra, self.what = list(names), extra, what
        listed = ", ".join(self.names)
        verb = "is" if len(self.names) == 1 else "are"
        install = f'pip install "fisherdyn[{extra}]"'
        if what is None:
            message = f"{listed} {verb} not installed: {install}"
        else:
            message = f"{what} needs {listed}, which {verb} not installed: {install}"
        super().__init__(message, name=self.names[0])


def _top(name: str) -> str:
    return name.partition(".")[0]


def missing(names: Iterable[str]) -> list[str]:
    """The packages among `names` that cannot be imported, found without importing any."""
    out = []
    for name in names:
        top = _top(name)
        if top in sys.modules:
            absent = sys.modules[top] is None  # Python's mark of an import known to fail
        else:
            absent = importlib.util.find_spec(top) is None
        if absent and top not in out:
            out.append(top)
    return out


def require(name: str, *, extra: str, what: str | None = None) -> ModuleType:
    """Import and return the module `name` (e.g. `"matplotlib.pyplot"`).

    **Arguments:**
    - `extra`: the extra of `pip install "fisherdyn[extra]"` that installs it.
    - `what`: what needs it, for the message (e.g. `"fisherdyn.sweep"`).

    **Returns:** the module.

    **Raises:** `MissingExtra` (a `ModuleNotFoundError`) when the package is not installed.
    A package that is installed but fails to import raises its own error unchanged.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or _top(e.name) != _top(name):
            raise  # the package is there; one of its own dependencies is missing
        raise MissingExtra([_top(name)], extra, what) from None


def require_all(names: Iterable[str], *, extra: str, what: str | None = None) -> None:
    """Check, before any work, that every package of `names` is installed; one
    `MissingExtra` naming all those that are not."""
    absent = missing(names)
    if absent:
        raise MissingExtra(absent, extra, what)
