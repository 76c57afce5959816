"""fisherdyn: entropy-generated attention operators and their Fisher-Lagrangian dynamics."""

from ._results import RESULTS as RESULTS, result_name as result_name
from ._entropies import (
    AbstractEntropy as AbstractEntropy,
    AbstractSeparableEntropy as AbstractSeparableEntropy,
    AbstractTsallisShapedEntropy as AbstractTsallisShapedEntropy,
    Abe as Abe,
    Burg as Burg,
    Kaniadakis as Kaniadakis,
    Renyi as Renyi,
    Shannon as Shannon,
    SharmaMittal as SharmaMittal,
    Tsallis as Tsallis,
    parse_entropy as parse_entropy,
)
from ._stationary import (
    Branches as Branches,
    StationaryInfo as StationaryInfo,
    free_energy as free_energy,
    stationary as stationary,
    stationary_branches as stationary_branches,
    stationary_info as stationary_info,
    stationary_jacobian as stationary_jacobian,
)

__version__ = "0.1.0"
from ._dynamics import (
    RelaxSolution as RelaxSolution,
    Trajectory as Trajectory,
    relax as relax,
    simulate as simulate,
)
from ._dynamics import (
    CRITICAL as CRITICAL,
    OVERDAMPED as OVERDAMPED,
    UNDERDAMPED as UNDERDAMPED,
    RelaxationSpectrum as RelaxationSpectrum,
    relaxation_spectrum as relaxation_spectrum,
)
from ._attention import (
    attention as attention,
    attention_weights as attention_weights,
)
from ._weight_tied import (
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
from ._stationary import (
    StationarySolution as StationarySolution,
    solve_stationary as solve_stationary,
)
from ._analysis import (
    TangentTest as TangentTest,
    tangent_test as tangent_test,
)
from ._analysis import (
    AbeExpansion as AbeExpansion,
    abe_expansion as abe_expansion,
    abe_series as abe_series,
)
from ._analysis import (
    format_operator_table as format_operator_table,
    measure_tail as measure_tail,
    operator_table as operator_table,
)
from ._weight_tied import (
    PathFit as PathFit,
    fisher_rao_distance as fisher_rao_distance,
    fit_families as fit_families,
    fit_path as fit_path,
    geodesic_interpolation as geodesic_interpolation,
)
