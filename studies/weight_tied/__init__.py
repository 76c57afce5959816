"""The weight-tied study: does the layer-by-layer attention of a looped transformer follow the
damped Fisher-Lagrangian dynamics, with depth as continuous time?

A study, not part of the library: it calls fisherdyn's public API only. Run it with

    python studies/weight_tied [--quick] [--out figures] [--workers 2]

(or through `studies/run_all.py`, as `make figures` does). Its modules, by concept:

- `task.py`: the in-context tasks (`recall_task`, `pointer_task`, `task_batch`).
- `model.py`: `LoopedConfig`, `LoopedTransformer`, `init_looped`: one block applied in a
  loop, whose attention is `fisherdyn.stationary` of each loop's scores or a carried
  `fisherdyn.FisherLoop` / `fisherdyn.LinearScoreLoop`.
- `training.py`: `train_looped` (optax; the only module that imports it, loaded on first
  use), `TrainedLooped`; `cache.py`: where the trained weights are kept
  (`default_cache_dir`).
- `paths.py`: `extract_paths`, `LoopedPaths`, `evaluate_looped`: the attention, loop by loop.
- `integration.py`: how well a Fisher loop's RK4 substeps integrate its carried attention:
  `trace_divergence` of a diverged training's step (`training.replay_divergence`;
  `python studies/weight_tied divergence`) and `substep_error` of a trained loop
  (`python studies/weight_tied integration`).
- `fixed_point.py`: `fixed_point_report`, `loop_jacobian`: residuals and the linearized loop.
- `evidence_paths.py` (depth convergence, mobility), `evidence_response.py` (linear
  response), `evidence_held_response.py` (the held-score Fisher map fitted to a loop map
  whose scores respond to the attention), `evidence_heldout.py` (held-out prediction, by
  rms and by likelihood): the path criteria;
  `evidence_shape.py` (`isotropy`, `support_revival`): tests of the paths' shape;
  `evidence_timescales.py` (`loop_timescales`, `attention_block_response`): whose modes a
  carried loop's slow attention modes are, and linear response with the stream held
  (`python studies/weight_tied timescales`).
- `verdict.py`: `bootstrap_ci`, `holm`, the first four `CRITERIA` and `verdict`.
- `protocol.py`: `PROTOCOL` (criteria, preconditions, admissible criteria per family,
  decision rule; from 1.2 the noise, dose and control rules: `gate_by_noise`,
  `dose_response`, `controls_hold`), its version and hash, and every earlier version
  (`PROTOCOLS`);
  `calibration.py`: the criteria run on synthetic paths of graded truth
  (`python studies/weight_tied calibrate [--quick]`); `calibration_feedback.py`: linear
  response's forms on loops whose scores respond to the attention
  (`python studies/weight_tied calibrate-feedback [--quick]`).
- `study.py`: the study's groups, measurements and report, and what the heads follow
  (`--follow`); `figures.py`: its two figures; `pilot.py`: one model against the
  preconditions (`python studies/weight_tied pilot`).
"""

import typing

from .cache import default_cache_dir as default_cache_dir
from .evidence_heldout import (
    LIKELIHOOD_BASELINES as LIKELIHOOD_BASELINES,
    METHODS as METHODS,
    HeldoutPrediction as HeldoutPrediction,
    heldout_prediction as heldout_prediction,
)
from .evidence_paths import (
    DepthConvergence as DepthConvergence,
    MobilityRegression as MobilityRegression,
    depth_convergence as depth_convergence,
    mobility_regression as mobility_regression,
)
from .evidence_shape import (
    Isotropy as Isotropy,
    SupportRevival as SupportRevival,
    isotropy as isotropy,
    support_revival as support_revival,
)
from .evidence_held_response import (
    HeldScoreResponse as HeldScoreResponse,
    held_score_map as held_score_map,
    held_score_response as held_score_response,
)
from .evidence_response import (
    LinearResponse as LinearResponse,
    linear_response as linear_response,
)
from .evidence_timescales import (
    LoopTimescales as LoopTimescales,
    attention_block_response as attention_block_response,
    loop_timescales as loop_timescales,
)
from .fixed_point import (
    FixedPointReport as FixedPointReport,
    fixed_point_report as fixed_point_report,
    loop_jacobian as loop_jacobian,
)
from .model import (
    LoopedConfig as LoopedConfig,
    LoopedTransformer as LoopedTransformer,
    init_looped as init_looped,
)
from .paths import (
    LoopedPaths as LoopedPaths,
    evaluate_looped as evaluate_looped,
    extract_paths as extract_paths,
)
from .protocol import (
    ADMISSIBLE as ADMISSIBLE,
    PROTOCOL as PROTOCOL,
    PROTOCOL_CRITERIA as PROTOCOL_CRITERIA,
    PROTOCOLS as PROTOCOLS,
    PROTOCOL_VERSION as PROTOCOL_VERSION,
    controls_hold as controls_hold,
    decide_family as decide_family,
    dose_response as dose_response,
    gate_by_noise as gate_by_noise,
    protocol_hash as protocol_hash,
)
from .task import (
    PointerBatch as PointerBatch,
    RecallBatch as RecallBatch,
    pointer_task as pointer_task,
    recall_task as recall_task,
    task_batch as task_batch,
)
from .verdict import (
    CRITERIA as CRITERIA,
    CRITERION_LEVEL as CRITERION_LEVEL,
    Criterion as Criterion,
    Interval as Interval,
    Verdict as Verdict,
    bootstrap_ci as bootstrap_ci,
    holm as holm,
    verdict as verdict,
)

if typing.TYPE_CHECKING:
    from .training import TrainedLooped as TrainedLooped, train_looped as train_looped

_LAZY = {"TrainedLooped": ".training", "train_looped": ".training"}


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
