import atexit
import os
import shutil
import sys
import tempfile

# the CLI commands tests call in-process would otherwise write compiled programs into the
# user cache directory
os.environ.setdefault("FISHERDYN_NO_COMPILATION_CACHE", "1")
# Models the tests and the studies they run train (and any program a test caches) go to a
# directory of this run, removed at its end, never the user's cache, unless the caller names
# one (FISHERDYN_CACHE=DIR make test keeps them). Set before pytest-xdist starts its
# workers and the tests their subprocesses, which inherit it.
if not os.environ.get("FISHERDYN_CACHE"):
    _cache = tempfile.mkdtemp(prefix="fisherdyn-test-cache-")
    os.environ["FISHERDYN_CACHE"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
# The suite is mostly compilation of small programs, each run a few times: XLA's CPU fusion
# emitters and LLVM's optimization passes cost more compile time than they save. A caller's
# XLA_FLAGS naming an option wins (`--xla_cpu_use_fusion_emitters=true
# --xla_backend_optimization_level=2`: XLA's defaults). Read when JAX creates its CPU
# client; subprocesses inherit it.
_flags = os.environ.get("XLA_FLAGS", "")
# the study scripts the tests run as subprocesses train models (run time, not compilation):
# they get the caller's flags back (`tests/studies/test_studies.py`)
os.environ.setdefault("FISHERDYN_TEST_CALLER_XLA_FLAGS", _flags)
for _option in ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0"):
    if _option.split("=")[0] not in _flags:
        _flags = f"{_flags} {_option}".strip()
os.environ["XLA_FLAGS"] = _flags

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Drop JAX's compiled programs after each module. Every XLA CPU executable holds ~3
    memory maps; a worker that runs the whole suite compiles ~13,000 programs and reaches
    the kernel's vm.max_map_count (65,530), where the next compilation aborts the process."""
    yield
    import gc

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="module", autouse=True)
def _report_max_errors():
    """Print the error maxima a test module measured with `helpers.record` (run with -s)."""
    yield
    helpers = sys.modules.get("helpers")  # only the modules that use it have imported it
    if helpers is not None:
        for k, v in sorted(helpers.MAX_ERR.items()):
            print(f"max {k}: {v:.2e}")
        helpers.MAX_ERR.clear()
