"""Measured attention paths: the Fisher-Rao geometry of the simplex and the fit of the damped
Fisher-Lagrangian dynamics to a path (e.g. one head's attention, layer by layer).

- `_geometry.py`: `fisher_rao_distance`, `geodesic_interpolation`.
- `_charts.py`: the families `fit_path` can fit (`fit_families`), each with an unconstrained
  chart of its shape parameter.
- `_fit_model.py`: the compiled programs (trajectory, residuals, Levenberg-Marquardt, summary).
- `_fit.py`: `fit_path` and its result `PathFit`.
"""

from ._charts import fit_families as fit_families
from ._fit import PathFit as PathFit, fit_path as fit_path
from ._geometry import (
    fisher_rao_distance as fisher_rao_distance,
    geodesic_interpolation as geodesic_interpolation,
)
