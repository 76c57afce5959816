"""The built wheel works outside the checkout (no file of the repository is read at run time).

The wheel is built with `pip wheel`, unpacked into a temporary directory with
`pip install --no-deps --target`, and run from another temporary directory with that
directory first on `sys.path` (the test environment supplies the dependencies). Slow: it
builds a wheel and compiles the `run` job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    wheels = tmp_path_factory.mktemp("wheels")
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "-w", str(wheels), str(ROOT)], check=True)
    (wheel,) = wheels.glob("fisherdyn-*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)
    env = dict(os.environ, PYTHONPATH=str(target), FISHERDYN_CACHE=str(target / "cache"))
    return target, env, tmp_path_factory.mktemp("work")


def _run(args, installed):
    target, env, cwd = installed
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1200)


def test_wheel_imports_from_its_own_files(installed):
    target, _, _ = installed
    proc = _run(["-c", "import fisherdyn as fd; print(fd.__file__); "
                 "print(float(fd.stationary(fd.Tsallis(1.5), [1.0, 0.0, -1.0], 0.5)[0])); "
                 "import os; os.environ.pop('FISHERDYN_NO_COMPILATION_CACHE', None); "
                 "from fisherdyn._cli._exported import exported_dir; print(exported_dir())"],
                installed)
    assert proc.returncode == 0, proc.stderr
    path, weight, cache = proc.stdout.split()
    assert Path(path).is_relative_to(target) and not Path(path).is_relative_to(ROOT)
    # Tsallis(1.5) at T = 0.5 of (1, 0, -1) is entmax-1.5 of (4/3, 0, -4/3): closed form
    assert abs(float(weight) - 0.9157397) < 1e-6
    assert Path(cache).is_relative_to(target)  # FISHERDYN_CACHE, never site-packages
    assert (target / "fisherdyn" / "py.typed").is_file()


def test_wheel_cli_simulate_and_run(installed):
    _, _, cwd = installed
    proc = _run(["-m", "fisherdyn", "--version"], installed)
    assert proc.returncode == 0 and proc.stdout.startswith("fisherdyn "), proc.stderr
    proc = _run(["-m", "fisherdyn", "simulate", "--entropy", "kaniadakis:0.3", "--scores",
                 "1.3,0.2,-0.7", "--T", "0.8", "--mass", "1", "--damping", "0.5", "--t1",
                 "20", "--json"], installed)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert abs(sum(out["rho_final"]) - 1) < 1e-9
    proc = _run(["-m", "fisherdyn", "run"], installed)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (cwd / "run" / "energy.png").is_file()
