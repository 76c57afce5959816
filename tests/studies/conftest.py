"""The tests of the studies in `studies/`: they import a study's modules (`_common`, the
package `weight_tied`) from that folder, as the studies themselves do."""

import sys
from pathlib import Path

STUDIES = Path(__file__).resolve().parents[2] / "studies"
if str(STUDIES) not in sys.path:
    sys.path.insert(0, str(STUDIES))
