"""`fisherdyn.sweep`: every chunk of a spec not yet committed to the store, this process's
share of them, with a progress bar; then the summary of the whole store."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._optional import require, require_all
from ._spec import DEFAULT_CHUNK_SIZE, Chunk, SweepSpec, block_shape, chunks, load_spec
from ._store import committed_chunks, create_store, open_store, wait_for_store, write_chunk

if TYPE_CHECKING:  # an optional dependency, named only in the annotation
    import xarray

__all__ = ["sweep", "SweepPlan", "failure_summary", "summary_figure_path"]


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """What a sweep would do (`sweep(..., dry_run=True)`).

    **Fields:** `n_problems`, `n_chunks`, `chunk_size` (problems per chunk, at most),
    `n_groups` (distinct compiled programs: family x N x overdamped-or-not),
    `n_done` (chunks already committed to the store), `first_chunk_s` (the first chunk,
    compilation included), `compiled_chunk_s` (the same chunk again, compiled), and
    `estimate_s`: $n_\\text{groups}(t_1 - t_2) + n_\\text{todo}\\,t_2$.
    """

    n_problems: int
    n_chunks: int
    chunk_size: int
    n_groups: int
    n_done: int
    first_chunk_s: float
    compiled_chunk_s: float
    estimate_s: float

    def __str__(self):
        todo = self.n_chunks - self.n_done
        return (
            f"{self.n_problems} problems in {self.n_chunks} chunks of <= {self.chunk_size} "
            f"({self.n_done} committed, {todo} to do; {self.n_groups} compiled programs); "
            f"first chunk {self.first_chunk_s:.2f} s, again {self.compiled_chunk_s:.3f} s: "
            f"estimated {_duration(self.estimate_s)} on this process"
        )


def _duration(s):
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _groups(spec: SweepSpec, all_chunks: list[Chunk]) -> int:
    return len({(c.family, c.n_keys, spec.mass[c.mass] == 0) for c in all_chunks})


def summary_figure_path(store: Path) -> Path:
    """Where the summary figure of `store` goes: beside it, `NAME.summary.png`."""
    store = Path(store)
    return store.with_name(store.stem + ".summary.png")


def failure_summary(result: np.ndarray) -> str:
    """One line: how many problems failed, by result name (not-computed ones as missing)."""
    from .._results import RESULTS

    names = {int(np.asarray(i._value)): n for n, i in RESULTS._name_to_item.items()}
    codes, counts = np.unique(np.asarray(result).ravel(), return_counts=True)
    total = int(np.sum(counts))
    ok = int(sum(n for c, n in zip(codes, counts) if c == 0))
    bad = [(names.get(int(c), "missing" if c < 0 else f"code {c}"), int(n))
           for c, n in zip(codes, counts) if c != 0]
    if not bad:
        return f"{total} problems: all successful"
    detail = ", ".join(f"{name}: {n}" for name, n in sorted(bad, key=lambda x: -x[1]))
    return f"{total} problems: {ok} successful, {total - ok} failed ({detail})"


def _dry_run(spec, all_chunks, done, chunk_size, padded):
    from ._engine import compute_chunk

    first = next((c for c in all_chunks if c.index not in done), all_chunks[0])
    t0 = time.perf_counter()
    compute_chunk(spec, first, padded)
    t1 = time.perf_counter()
    compute_chunk(spec, first, padded)
    t2 = time.perf_counter()
    n_groups = _groups(spec, all_chunks)
    todo = len(all_chunks) - len(done)
    first_s, again_s = t1 - t0, t2 - t1
    estimate = n_groups * max(first_s - again_s, 0.0) + todo * again_s
    return SweepPlan(
        spec.n_problems, len(all_chunks), chunk_size, n_groups, len(done), first_s, again_s,
        estimate,
    )


def _wait_for_all(group, all_chunks, timeout):
    deadline = time.monotonic() + timeout
    while True:
        done = committed_chunks(group, all_chunks)
        if len(done) == len(all_chunks) or time.monotonic() > deadline:
            return done
        time.sleep(0.5)


def sweep(
    spec: SweepSpec | dict[str, Any] | str | Path,
    store: str | Path,
    *,
    chunk_size: int | None = None,
    progress: bool = True,
    dry_run: bool = False,
    figure: bool = True,
    process_id: int | None = None,
    num_processes: int | None = None,
    wait_timeout: float = 3600.0,
) -> xarray.Dataset | SweepPlan | None:
    """Relax every problem of a parameter grid into a resumable Zarr store.

    Problems run in chunks, each one batched call of `fisherdyn.relax` (split over the
    local devices when there are several) and committed atomically; a run started again
    on the same store computes only the chunks not yet committed. Needs the `sweep` extra
    (`pip install "fisherdyn[sweep]"`). Several processes (`jax.distributed`) share the
    chunks, chunk $i$ going to process $i \\bmod P$.

    **Arguments:**
    - `spec`: a `SweepSpec`, a dict of the TOML table, or the path of a TOML file.
    - `store`: the Zarr store's directory (created if absent).
    - `chunk_size`: problems per chunk, at most (default 512; a resumed run takes the
      store's, and a different one is an error).
    - `progress`: a progress bar over this process's chunks, on stderr.
    - `dry_run`: write nothing; time the first chunk (twice: compiling, then compiled) and
      return a `SweepPlan`.
    - `figure`: write the summary figure beside the store (`summary_figure_path`).
    - `process_id`, `num_processes`: this process's share (default: `jax.process_index()`
      and `jax.process_count()`).
    - `wait_timeout`: how long process 0 waits for the others' chunks before summarizing.

    **Returns:** the store as an `xarray.Dataset` (`xarray.open_zarr(store)`) on process 0,
    None on the others; a `SweepPlan` for a dry run.
    """
    import jax

    # before any work: a missing package is one line, not a traceback after the last chunk
    require_all(["xarray", "zarr", "tqdm"] + (["matplotlib"] if figure and not dry_run else []),
                extra="sweep", what="fisherdyn.sweep")
    spec, spec_toml = load_spec(spec)
    store = Path(store)
    pid = jax.process_index() if process_id is None else int(process_id)
    nproc = jax.process_count() if num_processes is None else int(num_processes)
    if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) < 1):
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    if not 0 <= pid < nproc:
        raise ValueError(f"process_id must be in [0, {nproc}), got {pid}")
    group = None
    if store.exists():
        group, size = open_store(store, spec, chunk_size)
    else:
        size = DEFAULT_CHUNK_SIZE if chunk_size is None else int(chunk_size)
    block = block_shape(spec, size)
    all_chunks = chunks(spec, size)
    padded = math.prod(block)
    if dry_run:
        done = committed_chunks(group, all_chunks) if group is not None else set()
        return _dry_run(spec, all_chunks, done, size, padded)
    if group is None:
        if pid == 0:
            group, size = create_store(store, spec, spec_toml, size, block)
        else:
            group, size = wait_for_store(store, spec, chunk_size, wait_timeout)
        # a store another process created meanwhile has its own chunk size
        block, all_chunks = block_shape(spec, size), chunks(spec, size)
        padded = math.prod(block)
    mine = [c for c in all_chunks if c.index % nproc == pid]
    done = committed_chunks(group, mine)
    todo = [c for c in mine if c.index not in done]
    _compute(spec, group, todo, padded, progress, initial=len(mine) - len(todo), total=len(mine))
    if pid != 0:
        return None
    if nproc > 1:
        _wait_for_all(group, all_chunks, wait_timeout)
    return _finish(store, figure, progress)


def _compute(spec, group, todo, padded, progress, *, initial, total):
    """Compute the chunks in order; each chunk is written (values, then marker) by a
    writer thread while the next one computes."""
    from concurrent.futures import ThreadPoolExecutor

    from ._engine import compute_chunk

    tqdm = require("tqdm", extra="sweep", what="fisherdyn.sweep").tqdm

    bar = tqdm(
        total=total,
        initial=initial,
        unit="chunk",
        desc="sweep",
        disable=not progress,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    with bar, ThreadPoolExecutor(max_workers=1) as writer:
        pending = None
        for chunk in todo:
            values = compute_chunk(spec, chunk, padded)
            if pending is not None:
                pending.result()  # one write in flight at a time, committed in order
                bar.update(1)
            pending = writer.submit(write_chunk, group, chunk, values)
        if pending is not None:
            pending.result()
            bar.update(1)


def _finish(store, figure, progress):
    xr = require("xarray", extra="sweep", what="fisherdyn.sweep")
    ds = xr.open_zarr(str(store))
    line = failure_summary(ds["result"].values)
    missing = int(np.sum(ds["committed"].values == 0))
    if missing:
        line += f"; {missing} not computed yet (run again to complete)"
    if progress:
        print(line, file=sys.stderr)
    if figure and not missing:
        from ._figure import summary_figure

        summary_figure(ds, summary_figure_path(store))
    ds.attrs["summary"] = line
    return ds
