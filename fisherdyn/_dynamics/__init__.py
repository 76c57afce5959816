"""The damped Fisher-Lagrangian dynamics: charts, integration, fixed points, linear response.

- `_system.py`: the problem (`FisherSystem`), forces, free energy, tangent stiffness.
- `_coordinates.py`: the charts (`AbstractCoordinates`, `SphereCoordinates`,
  `SimplexCoordinates`).
- `_problem.py`: input conversion and checks, default tolerances and solvers.
- `_batching.py`: batches in one compiled call (blocks, `jax.sharding`).
- `_integrate.py`: `simulate` and `Trajectory`.
- `_relax.py`: `relax`, its Newton polish, and `RelaxSolution`.
- `_stiff.py`: the stiff path of `relax` (structured Jacobian, O(N) Newton solves, ESDIRK step).
- `_spectrum.py`: `relaxation_spectrum` and `RelaxationSpectrum`.
- `_piecewise.py`: the dynamics under piecewise-constant scores, interval by interval
  (`fisher_loop_step`, `fisher_score_dynamics`, `linear_score_step`,
  `linear_score_dynamics`).
"""

from ._coordinates import (
    AbstractCoordinates as AbstractCoordinates,
    SimplexCoordinates as SimplexCoordinates,
    SphereCoordinates as SphereCoordinates,
)
from ._integrate import Trajectory as Trajectory, simulate as simulate
from ._piecewise import (
    fisher_loop_step as fisher_loop_step,
    fisher_score_dynamics as fisher_score_dynamics,
    linear_score_dynamics as linear_score_dynamics,
    linear_score_step as linear_score_step,
)
from ._relax import RelaxSolution as RelaxSolution, relax as relax
from ._spectrum import (
    _REGIME_NAMES as REGIME_NAMES,
    REGIMES as REGIMES,
    RelaxationSpectrum as RelaxationSpectrum,
    relaxation_spectrum as relaxation_spectrum,
)
from ._system import FisherSystem as FisherSystem
