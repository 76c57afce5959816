"""Parameter sweeps: a TOML grid of relaxation problems, computed in chunks into a resumable
Zarr store (`fisherdyn.sweep`, `fisherdyn sweep`)."""

from ._cache import compilation_cache_dir as compilation_cache_dir
from ._cache import enable_compilation_cache as enable_compilation_cache
from ._driver import SweepPlan as SweepPlan
from ._driver import sweep as sweep
from ._spec import SpecError as SpecError
from ._spec import SweepSpec as SweepSpec
from ._store import StoreMismatch as StoreMismatch
