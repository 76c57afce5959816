"""The Zarr store of a sweep: created whole and atomically (built beside it, then renamed
into place), one Zarr chunk per sweep chunk, and a `committed` marker per chunk written
after the chunk's values, so a killed run leaves either a whole chunk or none."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path

import numpy as np

from ._spec import DIMS, Chunk, SweepSpec

__all__ = [
    "create_store",
    "open_store",
    "wait_for_store",
    "write_chunk",
    "committed_chunks",
    "StoreMismatch",
]

MARKER = "committed"


class StoreMismatch(ValueError):
    """A store that holds another sweep (its spec or chunking differs)."""


def _result_flags():
    from .._results import RESULTS

    items = sorted(
        (int(np.asarray(item._value)), name) for name, item in RESULTS._name_to_item.items()
    )
    return [v for v, _ in items], " ".join(n for _, n in items)


def _versions() -> dict[str, str]:
    import importlib.metadata

    import jax
    import jaxlib

    from .. import __version__

    device = jax.local_devices()[0]
    return {
        "fisherdyn_version": __version__,
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "numpy_version": np.__version__,
        "xarray_version": importlib.metadata.version("xarray"),
        "zarr_version": importlib.metadata.version("zarr"),
        "device": f"{device.platform}:{getattr(device, 'device_kind', '')}"
        f" x{len(jax.local_devices())} per process, {jax.process_count()} process(es)",
        "dtype": str(np.dtype(jax.numpy.result_type(float))),
    }


def _template(spec: SweepSpec, spec_toml: str, chunk_size: int, block):
    from .._optional import require
    from ._engine import VARIABLES

    xr = require("xarray", extra="sweep", what="fisherdyn.sweep")

    shape = spec.shape
    zchunks = (1, block[0], 1, block[1], 1, block[2])
    values, meanings = _result_flags()
    data, encoding = {}, {}
    for name, (dtype, fill, description) in VARIABLES.items():
        attrs = {"description": description}
        if name == "result":
            attrs.update(flag_values=values, flag_meanings=meanings)
        data[name] = (DIMS, np.full(shape, fill, dtype), attrs)
        encoding[name] = {"chunks": zchunks, "fill_value": fill}
    data[MARKER] = (
        DIMS,
        np.zeros(shape, "i1"),
        {"description": "1 where the problem's chunk is committed (written last)"},
    )
    encoding[MARKER] = {"chunks": zchunks, "fill_value": 0}
    attrs = {
        "title": "fisherdyn sweep",
        "sweep_spec": spec.to_json(),
        "sweep_spec_toml": spec_toml,
        "chunk_size": chunk_size,
        "chunk_shape": json.dumps(dict(zip(DIMS, zchunks))),
        "n_problems": spec.n_problems,
        **_versions(),
    }
    ds = xr.Dataset(data, coords=spec.coords(), attrs=attrs)
    return ds, encoding


def _check_matches(attrs, spec: SweepSpec, chunk_size: int | None, path: Path) -> int:
    stored = attrs.get("sweep_spec")
    if stored is None:
        raise StoreMismatch(f"{path} exists and is not a fisherdyn sweep store")
    if stored != spec.to_json():
        old, new = json.loads(stored), json.loads(spec.to_json())
        diff = [k for k in sorted(new) if old.get(k) != new.get(k)]
        raise StoreMismatch(
            f"{path} holds another sweep (spec differs in: {', '.join(diff)}); "
            "point --out at a new store, or delete this one"
        )
    stored_size = int(attrs["chunk_size"])
    if chunk_size is not None and chunk_size != stored_size:
        raise StoreMismatch(
            f"{path} was written with chunk size {stored_size}, not {chunk_size}: resume "
            "with the same chunk size (or omit it)"
        )
    return stored_size


def open_store(path: Path, spec: SweepSpec, chunk_size: int | None):
    """The Zarr group of an existing store holding this sweep, and its chunk size."""
    from .._optional import require

    zarr = require("zarr", extra="sweep", what="fisherdyn.sweep")
    try:
        group = zarr.open_group(str(path), mode="r+")
    except Exception:  # not a Zarr group at all
        raise StoreMismatch(f"{path} exists and is not a fisherdyn sweep store") from None
    return group, _check_matches(dict(group.attrs), spec, chunk_size, path)


def create_store(path: Path, spec: SweepSpec, spec_toml: str, chunk_size: int, block):
    """Write the empty store (coordinates, fill values, attributes) beside `path` and
    rename it into place; a store that appeared meanwhile (another process) is opened."""
    ds, encoding = _template(spec, spec_toml, chunk_size, block)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        with warnings.catch_warnings():
            # consolidated metadata is zarr-python's extension of the v3 format, read by
            # xarray.open_zarr; the store's metadata never changes after this
            warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
            ds.to_zarr(str(tmp), mode="w", encoding=encoding, consolidated=True)
        os.rename(tmp, path)
    except OSError:
        if not path.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return open_store(path, spec, chunk_size)


def wait_for_store(path: Path, spec: SweepSpec, chunk_size: int | None, timeout: float):
    """Open a store that another process (the first) is creating."""
    deadline = time.monotonic() + timeout
    while not (path / "zarr.json").exists() and not (path / ".zgroup").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no store appeared at {path} within {timeout:g} s")
        time.sleep(0.2)
    return open_store(path, spec, chunk_size)


def write_chunk(group, chunk: Chunk, values: dict[str, np.ndarray]):
    """Write one chunk's values, then its marker: each is one Zarr chunk (one file, which
    zarr's local store writes atomically), so a chunk whose marker is set is whole."""
    region = chunk.region
    for name, v in values.items():
        group[name][region] = v.reshape([s.stop - s.start for s in region])
    group[MARKER][region] = np.ones([s.stop - s.start for s in region], "i1")


def committed_chunks(group, chunks: list[Chunk]) -> set[int]:
    """Indices of the chunks whose marker is set."""
    try:
        marker = group[MARKER][...]
    except Exception:  # a damaged marker file (a store without atomic writes): read each
        marker = None
    done = set()
    for c in chunks:
        if marker is not None:
            ok = bool(np.all(marker[c.region]))
        else:
            try:
                ok = bool(np.all(group[MARKER][c.region]))
            except Exception:
                ok = False
        if ok:
            done.add(c.index)
    return done


