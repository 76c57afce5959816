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
from ._fisher_loop import (
    AbstractCarriedLoop as AbstractCarriedLoop,
    FisherLoop as FisherLoop,
    LinearScoreLoop as LinearScoreLoop,
    fisher_loop_step as fisher_loop_step,
    fisher_score_dynamics as fisher_score_dynamics,
    linear_score_dynamics as linear_score_dynamics,
    linear_score_step as linear_score_step,
)
from ._fixed_point import (
    FixedPointReport as FixedPointReport,
    fixed_point_report as fixed_point_report,
    loop_jacobian as loop_jacobian,
)
from ._evidence import (
    CRITERIA as CRITERIA,
    CRITERION_LEVEL as CRITERION_LEVEL,
    Criterion as Criterion,
    Interval as Interval,
    Verdict as Verdict,
    bootstrap_ci as bootstrap_ci,
    holm as holm,
    verdict as verdict,
)
from ._evidence_paths import (
    DepthConvergence as DepthConvergence,
    MobilityRegression as MobilityRegression,
    depth_convergence as depth_convergence,
    mobility_regression as mobility_regression,
)
from ._evidence_response import (
    LinearResponse as LinearResponse,
    linear_response as linear_response,
)
from ._evidence_heldout import (
    HeldoutPrediction as HeldoutPrediction,
    heldout_prediction as heldout_prediction,
)
from ._task import (
    PointerBatch as PointerBatch,
    RecallBatch as RecallBatch,
    pointer_task as pointer_task,
    recall_task as recall_task,
    task_batch as task_batch,
)

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
