"""The weight-tied (looped) transformer experiment and the fit of Fisher-Lagrangian dynamics
to measured attention paths.

Everything is imported eagerly except the training entry points (`train_looped`,
`TrainedLooped`), which need optax: they load on first access, so that importing this
subpackage (or fisherdyn) does not import optax.
"""

import typing

from ._cache import default_cache_dir as default_cache_dir
from ._charts import fit_families as fit_families
from ._fit import PathFit as PathFit, fit_path as fit_path
from ._geometry import (
    fisher_rao_distance as fisher_rao_distance,
    geodesic_interpolation as geodesic_interpolation,
)
from ._model import (
    LoopedConfig as LoopedConfig,
    LoopedTransformer as LoopedTransformer,
    init_looped as init_looped,
)
from ._paths import (
    LoopedPaths as LoopedPaths,
    evaluate_looped as evaluate_looped,
    extract_paths as extract_paths,
)
from ._task import RecallBatch as RecallBatch, recall_task as recall_task

if typing.TYPE_CHECKING:
    from ._training import TrainedLooped as TrainedLooped, train_looped as train_looped

_LAZY = {"TrainedLooped": "._training", "train_looped": "._training"}


def __getattr__(name):
    # PEP 562: the optax-dependent names are imported when first asked for
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
