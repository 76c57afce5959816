"""fisherdyn: entropy-generated attention operators and their Fisher-Lagrangian dynamics.

Every public name below, and every entropy family the library registers, is imported from its
subpackage on first use (PEP 562), so that `import fisherdyn` and the `fisherdyn` command
start without loading JAX; the first use of a name costs the import of its subpackage (and
of JAX), as an eager import would.
"""

from __future__ import annotations

from importlib import import_module as _import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# the subpackage that exports each public name, but for the entropy families: those are the
# families the library registers (one file each in fisherdyn/_entropies/), read by `_exports`
_EXPORTS = {
    "_results": ("RESULTS", "result_name"),
    "_entropies": (
        "AbstractEntropy",
        "AbstractSeparableEntropy",
        "AbstractTsallisShapedEntropy",
        "parse_entropy",
    ),
    "_stationary": (
        "Branches",
        "Branch",
        "StationarySolution",
        "free_energy",
        "solve_stationary",
        "stationary",
        "stationary_branches",
        "stationary_info",
        "stationary_jacobian",
    ),
    "_dynamics": (
        "AbstractCoordinates",
        "FisherSystem",
        "SimplexCoordinates",
        "SphereCoordinates",
        "REGIMES",
        "RelaxSolution",
        "RelaxationSpectrum",
        "Trajectory",
        "relax",
        "relaxation_spectrum",
        "simulate",
        "fisher_loop_step",
        "fisher_score_dynamics",
        "linear_score_dynamics",
        "linear_score_step",
    ),
    "_attention": (
        "MultiheadAttention",
        "attention",
        "attention_weights",
        "entmax",
        "entmax15",
        "entmax15_loss",
        "entmax_loss",
        "fenchel_young_loss",
        "flax_attention_fn",
        "sparsemax",
        "sparsemax_loss",
        "AbstractCarriedLoop",
        "FisherLoop",
        "LinearScoreLoop",
    ),
    "_sweep": ("SweepPlan", "SweepSpec", "enable_compilation_cache", "sweep"),
    "_analysis": (
        "AbeExpansion",
        "TangentTest",
        "abe_expansion",
        "abe_series",
        "envelope_rate",
        "fit_tail",
        "format_operator_table",
        "measure_tail",
        "operator_table",
        "tangent_test",
    ),
    "_paths": (
        "PathFit",
        "fisher_rao_distance",
        "fit_families",
        "fit_path",
        "geodesic_interpolation",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def _exports() -> dict[str, str]:
    """Every public name and the subpackage that exports it, the registered families after
    the entropies' other names (reading the registry imports the entropies, hence JAX)."""
    from ._entropies import families

    exports = {}
    for module, names in _EXPORTS.items():
        exports.update(dict.fromkeys(names, module))
        if module == "_entropies":
            exports.update(dict.fromkeys((cls.__name__ for cls in families()), module))
    return exports


def __getattr__(name: str) -> Any:
    if name == "__all__":  # computed on first use, so that `import fisherdyn` stays light
        value: Any = list(_exports())
    else:
        module = _MODULE_OF.get(name)
        if module is None and name[:1].isupper():  # perhaps a family: ask the registry
            module = _exports().get(name)
        if module is None:
            raise AttributeError(f"module 'fisherdyn' has no attribute {name!r}")
        value = getattr(_import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_exports()))


# What type checkers and the API documentation see; a family the block does not name is
# exported all the same, its static type then `Any`.
if TYPE_CHECKING:
    from ._analysis import (
        AbeExpansion as AbeExpansion,
        TangentTest as TangentTest,
        abe_expansion as abe_expansion,
        abe_series as abe_series,
        envelope_rate as envelope_rate,
        fit_tail as fit_tail,
        format_operator_table as format_operator_table,
        measure_tail as measure_tail,
        operator_table as operator_table,
        tangent_test as tangent_test,
    )
    from ._attention import (
        MultiheadAttention as MultiheadAttention,
        attention as attention,
        attention_weights as attention_weights,
        entmax as entmax,
        entmax15 as entmax15,
        entmax15_loss as entmax15_loss,
        entmax_loss as entmax_loss,
        fenchel_young_loss as fenchel_young_loss,
        flax_attention_fn as flax_attention_fn,
        sparsemax as sparsemax,
        sparsemax_loss as sparsemax_loss,
        AbstractCarriedLoop as AbstractCarriedLoop,
        FisherLoop as FisherLoop,
        LinearScoreLoop as LinearScoreLoop,
    )
    from ._dynamics import (
        AbstractCoordinates as AbstractCoordinates,
        FisherSystem as FisherSystem,
        SimplexCoordinates as SimplexCoordinates,
        SphereCoordinates as SphereCoordinates,
        REGIMES as REGIMES,
        RelaxationSpectrum as RelaxationSpectrum,
        RelaxSolution as RelaxSolution,
        Trajectory as Trajectory,
        relax as relax,
        relaxation_spectrum as relaxation_spectrum,
        simulate as simulate,
        fisher_loop_step as fisher_loop_step,
        fisher_score_dynamics as fisher_score_dynamics,
        linear_score_dynamics as linear_score_dynamics,
        linear_score_step as linear_score_step,
    )
    from ._entropies import (
        Abe as Abe,
        AbstractEntropy as AbstractEntropy,
        AbstractSeparableEntropy as AbstractSeparableEntropy,
        AbstractTsallisShapedEntropy as AbstractTsallisShapedEntropy,
        Burg as Burg,
        Kaniadakis as Kaniadakis,
        Renyi as Renyi,
        Shannon as Shannon,
        SharmaMittal as SharmaMittal,
        Tsallis as Tsallis,
        parse_entropy as parse_entropy,
    )
    from ._paths import (
        PathFit as PathFit,
        fisher_rao_distance as fisher_rao_distance,
        fit_families as fit_families,
        fit_path as fit_path,
        geodesic_interpolation as geodesic_interpolation,
    )
    from ._results import RESULTS as RESULTS, result_name as result_name
    from ._sweep import (
        SweepPlan as SweepPlan,
        SweepSpec as SweepSpec,
        enable_compilation_cache as enable_compilation_cache,
        sweep as sweep,
    )
    from ._stationary import (
        Branches as Branches,
        Branch as Branch,
        StationarySolution as StationarySolution,
        free_energy as free_energy,
        solve_stationary as solve_stationary,
        stationary as stationary,
        stationary_branches as stationary_branches,
        stationary_info as stationary_info,
        stationary_jacobian as stationary_jacobian,
    )
