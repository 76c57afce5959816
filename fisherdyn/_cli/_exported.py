"""Traced programs kept across processes with `jax.export`, beside the compilation cache.

JAX's persistent compilation cache saves XLA's compilation, but a new process still traces
and lowers the program before it can look the compiled one up: for `fisherdyn simulate`
that is most of a second run's time. `cached_call` serializes the lowered program itself
(`jax.export`, StableHLO) the first time and calls the deserialized one afterwards, so a
second process neither traces nor imports the libraries the tracing needs.

An entry is found by a key over everything that shapes the program: the name and the
static options the caller passes, the shapes and dtypes of the arguments, the source of
the installed fisherdyn, the versions of JAX and of the libraries it traces through, and
the settings read at trace time (x64, `EQX_ON_ERROR`, the backend). Outputs are a dict of
arrays (pytrees of Equinox modules do not serialize). A damaged entry is exported again; a
program that cannot be exported (a host callback, e.g. a progress bar) is called as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["cached_call", "exported_dir"]


_FORMAT = 1
_TRACED_THROUGH = ("jax", "jaxlib", "equinox", "diffrax", "optimistix", "lineax")
_source_digest: str | None = None


def exported_dir() -> Path | None:
    """`exported/` beside the compilation cache (`$FISHERDYN_CACHE/exported`, or the user
    cache directory's `fisherdyn/exported`); None when the cache is switched off."""
    from .._sweep import compilation_cache_dir

    jax_dir = compilation_cache_dir()
    return None if jax_dir is None else jax_dir.parent / "exported"


def _package_digest() -> str:
    """A digest of the installed package's source: an edited fisherdyn is a new program."""
    global _source_digest
    if _source_digest is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        _source_digest = h.hexdigest()
    return _source_digest


def _key(name: str, static: dict, args) -> str:
    import importlib.metadata

    import jax

    versions = {}
    for dist in _TRACED_THROUGH:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    parts = dict(
        format=_FORMAT,
        name=name,
        static=static,
        args=[(tuple(a.shape), str(a.dtype)) for a in args],
        source=_package_digest(),
        versions=versions,
        x64=bool(jax.config.jax_enable_x64),
        eqx_on_error=os.environ.get("EQX_ON_ERROR", ""),
        backend=jax.default_backend(),
    )
    blob = json.dumps(parts, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:40]


def _write_atomically(path: Path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def cached_call(
    name: str,
    fn: Callable,
    args: tuple,
    static: dict,
    meta: Callable[[], dict] | None = None,
    directory: Path | None = None,
) -> tuple[dict, dict, str]:
    """`fn(*args)`, through a serialized copy of its traced program when there is one.

    **Arguments:**

    - `name`: the program's name (part of the key); `fn`: a function of the arrays `args`
      returning a dict of arrays; everything else it depends on must be in `static`
      (JSON-able values, part of the key).
    - `meta`: computes JSON-able facts stored with the program and returned with every call
      (for instance the names of result codes, so that a later process needs not import
      the module that defines them); called only when the program is exported.
    - `directory`: where entries live (None: no cache, `fn(*args)` is called as it is).

    **Returns:** `(outputs, meta, how)`: the outputs as NumPy arrays, the stored facts, and
    `"loaded"`, `"exported"` or `"called"` (no cache, or the program cannot be exported).
    """
    import jax
    import numpy as np

    as_numpy = lambda out: {k: np.asarray(v) for k, v in out.items()}  # noqa: E731
    if directory is None:
        return as_numpy(fn(*args)), (meta() if meta else {}), "called"
    args = tuple(jax.numpy.asarray(a) for a in args)
    key = _key(name, static, args)
    program, facts = directory / f"{name}-{key}.jaxexport", directory / f"{name}-{key}.json"
    try:
        stored = json.loads(facts.read_text())
        exported = jax.export.deserialize(bytearray(program.read_bytes()))
    except Exception:  # noqa: BLE001 - no entry yet, or a damaged one: export it again
        pass
    else:
        return as_numpy(exported.call(*args)), stored, "loaded"
    try:
        exported = jax.export.export(jax.jit(fn))(*args)
        data = exported.serialize()
    except (ValueError, TypeError, NotImplementedError):
        # called as it is, its jitted parts stay cached in this process as usual
        return as_numpy(fn(*args)), (meta() if meta else {}), "called"
    stored = meta() if meta else {}
    # the facts last: an entry is complete once its facts are there
    _write_atomically(program, bytes(data))
    _write_atomically(facts, json.dumps(stored).encode())
    return as_numpy(exported.call(*args)), stored, "exported"
