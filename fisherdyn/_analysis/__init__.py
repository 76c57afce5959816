from ._tangent import TangentTest as TangentTest, tangent_test as tangent_test
from ._abe_expansion import (
    AbeExpansion as AbeExpansion,
    abe_expansion as abe_expansion,
    abe_series as abe_series,
)
from ._operator_table import (
    format_operator_table as format_operator_table,
    operator_table as operator_table,
)
from ._rates import envelope_rate as envelope_rate
from ._tails import fit_tail as fit_tail, measure_tail as measure_tail
