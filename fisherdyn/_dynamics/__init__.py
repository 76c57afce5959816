from ._system import (
    AbstractCoordinates as AbstractCoordinates,
    FisherSystem as FisherSystem,
    SimplexCoordinates as SimplexCoordinates,
    SphereCoordinates as SphereCoordinates,
)
from ._integrate import (
    RelaxSolution as RelaxSolution,
    Trajectory as Trajectory,
    relax as relax,
    simulate as simulate,
)
from ._spectrum import (
    CRITICAL as CRITICAL,
    OVERDAMPED as OVERDAMPED,
    UNDERDAMPED as UNDERDAMPED,
    RelaxationSpectrum as RelaxationSpectrum,
    relaxation_spectrum as relaxation_spectrum,
)
