"""The sweep specification: a TOML grid of problems, its validation, its chunks and its
score ensembles. Nothing here imports JAX."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SweepSpec",
    "SpecError",
    "load_spec",
    "Chunk",
    "chunks",
    "block_shape",
    "DIMS",
    "ENSEMBLES",
]

# the dimensions of every stored variable, in storage order
DIMS = ("family", "T", "mass", "damping", "n_keys", "seed")
ENSEMBLES = ("gaussian", "cauchy", "planted")
DEFAULT_CHUNK_SIZE = 512

_REQUIRED = ("families", "T", "mass", "damping", "n_keys", "seeds")
_OPTIONAL = {
    "scores": "gaussian",
    "score_scale": 1.0,
    "planted_margin": 3.0,
    "n_save": 128,
    "horizon": 8.0,
    "rtol": None,
    "atol": None,
    "tol": None,
    "max_steps": 200_000,
}


class SpecError(ValueError):
    """A sweep specification that cannot be run; the message names the key."""


def _floats(spec, key, *, positive=False, nonneg=False):
    values = spec[key]
    values = values if isinstance(values, list) else [values]
    if not values:
        raise SpecError(f"{key}: needs at least one value")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SpecError(f"{key}: expected finite numbers, got {v!r}")
        if positive and not v > 0:
            raise SpecError(f"{key}: every value must be > 0, got {v}")
        if nonneg and not v >= 0:
            raise SpecError(f"{key}: every value must be >= 0, got {v}")
        out.append(float(v))
    if len(set(out)) != len(out):
        raise SpecError(f"{key}: values must be distinct, got {values}")
    return tuple(out)


def _ints(values, key, minimum):
    values = values if isinstance(values, list) else [values]
    if not values:
        raise SpecError(f"{key}: needs at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise SpecError(f"{key}: expected integers >= {minimum}, got {v!r}")
    if len(set(values)) != len(values):
        raise SpecError(f"{key}: values must be distinct, got {values}")
    return tuple(int(v) for v in values)


def _families(spec):
    from .._entropies import parse_entropy

    values = spec["families"]
    values = values if isinstance(values, list) else [values]
    if not values or not all(isinstance(v, str) for v in values):
        raise SpecError(f"families: expected a list of entropy names, got {values!r}")
    labels = tuple(v.strip() for v in values)
    for label in labels:
        try:
            parse_entropy(label)
        except (ValueError, TypeError) as e:
            raise SpecError(f"families: {label!r}: {e}") from None
    if len(set(labels)) != len(labels):
        raise SpecError(f"families: values must be distinct, got {list(labels)}")
    return labels


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A grid of relaxation problems: every combination of the axes below, each relaxed
    from the uniform weights by `fisherdyn.relax`.

    **Fields:**
    - `families`: entropy names as `fisherdyn.parse_entropy` reads them (`"kaniadakis:0.3"`).
    - `T` (> 0), `mass` ($\\ge 0$; 0 = the overdamped flow), `damping` (> 0): float axes.
    - `n_keys` ($\\ge 2$): the numbers of keys N.
    - `seeds`: the score draws per grid point (indices; `seeds = 8` means 0..7).
    - `scores`: the ensemble, `"gaussian"` ($z_i \\sim \\mathcal N(0, s^2)$), `"cauchy"`
      ($s \\times$ standard Cauchy) or `"planted"` (Gaussian distractors, one key raised by
      `planted_margin` $\\times s$); $s$ = `score_scale`.
    - `n_save`, `horizon`: the path saved for the overshoot, `n_save` times on
      $[0, \\mathrm{horizon}/r]$ with $r$ the slowest linear rate (0 = no path, no overshoot).
    - `rtol`, `atol`, `tol`, `max_steps`: passed to `fisherdyn.relax` (None: its defaults).
    """

    families: tuple[str, ...]
    T: tuple[float, ...]
    mass: tuple[float, ...]
    damping: tuple[float, ...]
    n_keys: tuple[int, ...]
    seeds: tuple[int, ...]
    scores: str = "gaussian"
    score_scale: float = 1.0
    planted_margin: float = 3.0
    n_save: int = 128
    horizon: float = 8.0
    rtol: float | None = None
    atol: float | None = None
    tol: float | None = None
    max_steps: int = 200_000

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> "SweepSpec":
        """Validate a parsed TOML table (`SpecError`, naming the key, on any problem)."""
        unknown = sorted(set(spec) - set(_REQUIRED) - set(_OPTIONAL))
        if unknown:
            allowed = ", ".join([*_REQUIRED, *_OPTIONAL])
            raise SpecError(f"unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
        missing = [k for k in _REQUIRED if k not in spec]
        if missing:
            raise SpecError(f"missing key(s): {', '.join(missing)}")
        opt = {**_OPTIONAL, **{k: v for k, v in spec.items() if k in _OPTIONAL}}
        seeds = spec["seeds"]
        if isinstance(seeds, int) and not isinstance(seeds, bool):
            if seeds < 1:
                raise SpecError(f"seeds: expected a count >= 1 or a list of seeds, got {seeds}")
            seeds = tuple(range(seeds))
        else:
            seeds = _ints(seeds, "seeds", 0)
        if opt["scores"] not in ENSEMBLES:
            raise SpecError(f"scores: one of {', '.join(ENSEMBLES)}, got {opt['scores']!r}")
        for key in ("score_scale", "planted_margin", "horizon"):
            _floats(opt, key, positive=key != "planted_margin")
        for key in ("rtol", "atol", "tol"):
            if opt[key] is not None:
                _floats(opt, key, positive=True)
        n_save = opt["n_save"]
        if isinstance(n_save, bool) or not isinstance(n_save, int) or n_save == 1 or n_save < 0:
            raise SpecError(f"n_save: expected 0 (no path) or an integer >= 2, got {n_save!r}")
        (max_steps,) = _ints(opt["max_steps"], "max_steps", 1)
        return cls(
            families=_families(spec),
            T=_floats(spec, "T", positive=True),
            mass=_floats(spec, "mass", nonneg=True),
            damping=_floats(spec, "damping", positive=True),
            n_keys=_ints(spec["n_keys"], "n_keys", 2),
            seeds=seeds,
            scores=opt["scores"],
            score_scale=float(opt["score_scale"]),
            planted_margin=float(opt["planted_margin"]),
            n_save=int(n_save),
            horizon=float(opt["horizon"]),
            rtol=None if opt["rtol"] is None else float(opt["rtol"]),
            atol=None if opt["atol"] is None else float(opt["atol"]),
            tol=None if opt["tol"] is None else float(opt["tol"]),
            max_steps=max_steps,
        )

    @classmethod
    def from_toml(cls, text: str) -> "SweepSpec":
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"not valid TOML: {e}") from None
        return cls.from_dict(table)

    def to_json(self) -> str:
        """The canonical form stored with the results (a resumed run must match it)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.coords().values())

    @property
    def n_problems(self) -> int:
        return math.prod(self.shape)

    def coords(self) -> dict[str, np.ndarray]:
        return {
            "family": np.array(self.families, dtype=object),
            "T": np.array(self.T),
            "mass": np.array(self.mass),
            "damping": np.array(self.damping),
            "n_keys": np.array(self.n_keys, dtype=np.int64),
            "seed": np.array(self.seeds, dtype=np.int64),
        }

    def scores_for(self, n_keys: int, seed: int) -> np.ndarray:
        """The scores of one draw: a function of (ensemble, N, seed) alone, so every chunk
        recomputes its own and all families, temperatures, masses and dampings see the same
        draws (paired comparisons)."""
        return _draw(self.scores, self.score_scale, self.planted_margin, n_keys, seed)


@functools.lru_cache(maxsize=1 << 16)
def _draw(ensemble: str, s: float, margin: float, n_keys: int, seed: int) -> np.ndarray:
    # cached: the chunks of other families, temperatures, masses and dampings reuse it
    rng = np.random.default_rng([seed, n_keys, ENSEMBLES.index(ensemble)])
    if ensemble == "gaussian":
        z = s * rng.standard_normal(n_keys)
    elif ensemble == "cauchy":
        z = s * rng.standard_cauchy(n_keys)
    else:
        z = s * rng.standard_normal(n_keys)
        z[rng.integers(n_keys)] += margin * s
    z.flags.writeable = False
    return z


def load_spec(spec: "SweepSpec | str | Path | dict") -> tuple[SweepSpec, str]:
    """A `SweepSpec` and its TOML text (stored as written) from a spec, a path or a dict."""
    if isinstance(spec, SweepSpec):
        return spec, ""
    if isinstance(spec, dict):
        return SweepSpec.from_dict(spec), ""
    path = Path(spec)
    if not path.is_file():
        raise SpecError(f"no such spec file: {path}")
    text = path.read_text()
    try:
        return SweepSpec.from_toml(text), text
    except SpecError as e:
        raise SpecError(f"{path}: {e}") from None


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A rectangular block of problems: one family, N and mass, a block of T x damping x
    seed. It is the unit of work, of commit, and of Zarr storage (one Zarr chunk)."""

    index: int
    family: int
    n_keys: int
    mass: int
    T: slice
    damping: slice
    seed: slice

    @property
    def region(self) -> tuple[slice, ...]:
        """The chunk's slices in `DIMS` order."""
        one = lambda i: slice(i, i + 1)  # noqa: E731
        return (one(self.family), self.T, one(self.mass), self.damping, one(self.n_keys), self.seed)

    @property
    def size(self) -> int:
        return math.prod(s.stop - s.start for s in (self.T, self.damping, self.seed))


def block_shape(spec: SweepSpec, chunk_size: int) -> tuple[int, int, int]:
    """(T, damping, seed) extents of a chunk: at most `chunk_size` problems, filling the
    seeds first, then dampings, then temperatures."""
    nT, nD, nS = len(spec.T), len(spec.damping), len(spec.seeds)
    bS = min(nS, chunk_size)
    bD = min(nD, chunk_size // nS) if bS == nS else 1
    bT = min(nT, chunk_size // (nS * nD)) if bD == nD else 1
    return max(bT, 1), max(bD, 1), bS


def chunks(spec: SweepSpec, chunk_size: int) -> list[Chunk]:
    """Every chunk, grouped by (family, N, mass) so that consecutive chunks share one
    compiled program."""
    bT, bD, bS = block_shape(spec, chunk_size)

    def blocks(n, b):
        return [slice(i, min(i + b, n)) for i in range(0, n, b)]

    out = []
    grid = itertools.product(
        range(len(spec.families)),
        range(len(spec.n_keys)),
        range(len(spec.mass)),
        blocks(len(spec.T), bT),
        blocks(len(spec.damping), bD),
        blocks(len(spec.seeds), bS),
    )
    for f, n, m, t, d, s in grid:
        out.append(Chunk(len(out), f, n, m, t, d, s))
    return out
