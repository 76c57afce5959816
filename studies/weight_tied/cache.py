"""Where trained looped-transformer weights and the study's per-model results are cached,
and how they are written."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import pickle
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


def _digest(blob: str, n: int) -> str:
    """The first `n` hex digits of the SHA-256 of `blob`: the name of a cache entry."""
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def cache_paths(fingerprint: dict, name: str, recipe: dict,
                cache_dir: str | os.PathLike) -> tuple[pathlib.Path, pathlib.Path, str]:
    """(weights file, metadata file, the JSON key) of one config and training recipe."""
    blob = json.dumps({"v": _FORMAT_VERSION, "config": fingerprint, "recipe": recipe},
                      sort_keys=True)
    stem = f"looped-{name.lower()}-{_digest(blob, 20)}"
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


def source_digest(*packages) -> str:
    """SHA-256 of the Python sources of the given packages (modules with `__file__`): a
    cached result computed by other code is never read back."""
    h = hashlib.sha256()
    for pkg in packages:
        root = pathlib.Path(pkg.__file__).parent
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def result_path(key: dict, cache_dir: str | os.PathLike) -> pathlib.Path:
    """The file of one model's cached study result, named by a hash of `key` (a JSON-able
    description of everything the result depends on)."""
    blob = json.dumps(key, sort_keys=True, default=repr)
    return pathlib.Path(cache_dir) / "weight_tied_results" / f"{_digest(blob, 24)}.pkl"


def load_result(path: pathlib.Path):
    """The cached result at `path`, or None (missing or unreadable: then it is recomputed)."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None


def save_result(path: pathlib.Path, result) -> None:
    atomic_write(path, lambda f: pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL))
