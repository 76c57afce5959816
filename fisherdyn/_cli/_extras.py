"""The packages each command needs beyond the core, checked after parsing and before any work:
one that is missing is one line naming the extra that installs it (exit status 2).

`fisherdyn sweep` needs what the `sweep` extra installs; every other command what the `cli`
extra installs (which includes `sweep`'s)."""

from __future__ import annotations

import argparse
import os

from .._optional import require_all

__all__ = ["check_extras"]

_OFF = ("1", "true", "yes", "on")  # as FISHERDYN_NO_COMPILATION_CACHE is read by the cache


def _cache_on(args: argparse.Namespace) -> bool:
    off = os.environ.get("FISHERDYN_NO_COMPILATION_CACHE", "").strip().lower() in _OFF
    return not (args.no_compilation_cache or off)


def check_extras(args: argparse.Namespace) -> None:
    """Raise `MissingExtra` when a package the command of `args` will import is missing."""
    cache = _cache_on(args)
    # the cache finds the user cache directory with platformdirs unless $FISHERDYN_CACHE is set
    names = ["platformdirs"] if cache and not os.environ.get("FISHERDYN_CACHE") else []
    if args.command == "sweep":
        names += ["xarray", "zarr", "tqdm"]
        if not (args.no_figure or args.dry_run):
            names.append("matplotlib")
        require_all(names, extra="sweep")
        return
    if args.command == "run":
        names += ["tqdm"] + ([] if args.no_figures else ["matplotlib"])
    if args.command == "simulate":
        if cache:
            names.append("flatbuffers")  # jax.export serializes the traced program with it
        if args.out is not None:
            names.append("matplotlib")
        if args.progress:
            names.append("tqdm")
        if args.save is not None and args.save.suffix.lower() == ".nc":
            names.append("xarray")
    require_all(names, extra="cli")
