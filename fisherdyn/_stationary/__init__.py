from ._operator import (
    Branches as Branches,
    StationaryInfo as StationaryInfo,
    free_energy as free_energy,
    stationary as stationary,
    stationary_branches as stationary_branches,
    stationary_info as stationary_info,
    stationary_jacobian as stationary_jacobian,
)
from ._crosscheck import (
    StationarySolution as StationarySolution,
    solve_stationary as solve_stationary,
)
