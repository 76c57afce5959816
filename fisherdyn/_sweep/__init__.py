"""Parameter sweeps: a TOML grid of relaxation problems, computed in chunks into a resumable
Zarr store (`fisherdyn.sweep`, `fisherdyn sweep`)."""

from ._cache import compilation_cache_dir as compilation_cache_dir
from ._cache import enable_compilation_cache as enable_compilation_cache
from ._driver import SweepPlan as SweepPlan
from ._driver import summary_figure_path as summary_figure_path
from ._driver import sweep as sweep
from ._spec import SpecError as SpecError
from ._spec import SweepSpec as SweepSpec
from ._spec import block_shape as block_shape
from ._store import StoreMismatch as StoreMismatch
from ._store import create_store as create_store
