import sys

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(scope="module", autouse=True)
def _report_max_errors():
    """Print the error maxima a test module measured with `helpers.record` (run with -s)."""
    yield
    helpers = sys.modules.get("helpers")  # only the modules that use it have imported it
    if helpers is not None:
        for k, v in sorted(helpers.MAX_ERR.items()):
            print(f"max {k}: {v:.2e}")
        helpers.MAX_ERR.clear()
