"""JAX's persistent compilation cache for the command line and sweeps: a second process
loads the compiled programs of the first instead of compiling them again."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["enable_compilation_cache", "compilation_cache_dir"]

_OFF = ("1", "true", "yes", "on")


def compilation_cache_dir() -> Path | None:
    """`$FISHERDYN_CACHE/jax` when set, else the user cache directory's `fisherdyn/jax`;
    None when `FISHERDYN_NO_COMPILATION_CACHE` is set (to 1, true, yes or on)."""
    if os.environ.get("FISHERDYN_NO_COMPILATION_CACHE", "").strip().lower() in _OFF:
        return None
    root = os.environ.get("FISHERDYN_CACHE")
    if root:
        return Path(root).expanduser() / "jax"
    from .._optional import require

    platformdirs = require("platformdirs", extra="sweep", what="the compilation cache")
    return Path(platformdirs.user_cache_dir("fisherdyn")) / "jax"


def enable_compilation_cache(path: str | Path | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache, for every program however short.

    Call it before the first compilation (JAX fixes its cache when it first compiles).

    **Arguments:**
    - `path`: the cache directory (default `compilation_cache_dir()`).

    **Returns:** the directory in use, or None when the cache is switched off by
    `FISHERDYN_NO_COMPILATION_CACHE`.
    """
    path = compilation_cache_dir() if path is None else Path(path)
    if path is None:
        return None
    import jax

    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    # JAX caches only programs that took a second to compile by default; the command
    # line's programs are many and each compiles faster than that, together for seconds.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
