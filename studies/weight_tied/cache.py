"""Where trained looped-transformer weights are cached, and how they are written."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile
from typing import Callable, IO

import platformdirs

__all__ = ["default_cache_dir"]

_FORMAT_VERSION = 1  # bump when the architecture or the training recipe changes


def default_cache_dir() -> pathlib.Path:
    """The directory `train_looped` caches weights in by default.

    `$FISHERDYN_CACHE` when set, else the user cache directory of the platform
    (`platformdirs.user_cache_dir("fisherdyn")`, e.g. `~/.cache/fisherdyn` on Linux); never
    a path inside the installed package. Nothing is created until weights are written.

    **Returns:**

    The cache directory, as a `pathlib.Path`.
    """
    env = os.environ.get("FISHERDYN_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path(platformdirs.user_cache_dir("fisherdyn"))


def cache_paths(fingerprint: dict, name: str, recipe: dict,
                cache_dir: str | os.PathLike) -> tuple[pathlib.Path, pathlib.Path, str]:
    """(weights file, metadata file, the JSON key) of one config and training recipe."""
    blob = json.dumps({"v": _FORMAT_VERSION, "config": fingerprint, "recipe": recipe},
                      sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
    stem = f"looped-{name.lower()}-{digest}"
    root = pathlib.Path(cache_dir)
    return root / f"{stem}.eqx", root / f"{stem}.json", blob


def atomic_write(path: pathlib.Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write `path` through a temporary file in the same directory and an atomic rename, so
    that a reader (or a concurrent run) never sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
