from ._fit import (
    PathFit as PathFit,
    fisher_rao_distance as fisher_rao_distance,
    fit_families as fit_families,
    fit_path as fit_path,
    geodesic_interpolation as geodesic_interpolation,
)
from ._looped import (
    LoopedConfig as LoopedConfig,
    LoopedPaths as LoopedPaths,
    LoopedTransformer as LoopedTransformer,
    RecallBatch as RecallBatch,
    TrainedLooped as TrainedLooped,
    default_cache_dir as default_cache_dir,
    evaluate_looped as evaluate_looped,
    extract_paths as extract_paths,
    init_looped as init_looped,
    recall_task as recall_task,
    train_looped as train_looped,
)
