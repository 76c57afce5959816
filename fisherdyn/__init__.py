"""fisherdyn: entropy-generated attention operators and their Fisher-Lagrangian dynamics."""

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
