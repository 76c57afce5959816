from ._branches import (
    Branch as Branch,
    Branches as Branches,
    stationary_branches as stationary_branches,
)
from ._checks import (
    check_concrete as check_concrete,
    keys_last as keys_last,
    refuse_complex as refuse_complex,
    row_T as row_T,
)
from ._crosscheck import solve_stationary as solve_stationary
from ._operator import (
    free_energy as free_energy,
    stationary as stationary,
    stationary_info as stationary_info,
    stationary_jacobian as stationary_jacobian,
)
from ._solution import StationarySolution as StationarySolution

