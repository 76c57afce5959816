"""Optional dependencies: the core runs without them, and a feature that needs one says in one
line which extra to install.

The optional packages are hidden from a subprocess by wrapping every finder of `sys.meta_path`
so that it finds none of them: `import zarr` then fails exactly as when zarr is not installed
(`ModuleNotFoundError`, `importlib.util.find_spec` returning None). References: the extras
written in pyproject.toml (read with tomllib), the softmax closed form (scipy.special.softmax)
for Shannon's stationary weights and attention.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import scipy.special

from fisherdyn._optional import MissingExtra, missing, require, require_all

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

CORE = {"numpy", "scipy", "jax", "equinox", "diffrax", "optimistix", "lineax", "jaxtyping"}
# every package some extra installs that fisherdyn or its studies import (import name = name)
OPTIONAL = ("optax", "matplotlib", "tqdm", "platformdirs", "xarray", "zarr", "flatbuffers",
            "flax", "mpmath", "torch", "entmax")

_HIDE = """
import sys
HIDDEN = set(sys.argv[1].split(","))
del sys.argv[1]
assert not HIDDEN & set(sys.modules), "already imported"


class Hide:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
"""

_CORE_RUN = """
import json
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import fisherdyn as fd

z = np.array([1.0, 0.2, -0.7])
out = {"stationary": fd.stationary(fd.Shannon(), z, 0.5).tolist()}
tr = fd.simulate(fd.Kaniadakis(0.3), z, 0.8, mass=1.0, damping=2.0, t1=5.0, saveat=3)
out["simulate"] = np.asarray(tr.rho_final).tolist()
sol = fd.relax(fd.Shannon(), z, 0.5, mass=1.0, damping=2.0)
out["relax"] = np.asarray(sol.rho).tolist()
out["relax_ok"] = bool(sol.result == fd.RESULTS.successful)
q, k, v = (np.random.default_rng(i).normal(size=(4, 2, 3)) for i in range(3))
out["attention"] = np.asarray(fd.attention(q, k, v, entropy=fd.Shannon(), T=1.0)).tolist()
try:
    fd.simulate(fd.Shannon(), z, 0.5, t1=1.0, saveat=2, progress=True)
except ModuleNotFoundError as e:
    out["progress_error"] = str(e)
try:
    fd.sweep(sys.argv[1], sys.argv[2], progress=False)
except ModuleNotFoundError as e:
    out["sweep_error"] = str(e)
out["loaded"] = sorted({m.partition(".")[0] for m in sys.modules} & HIDDEN)
print(json.dumps(out))
"""

_CLI = "from fisherdyn._cli import main\nsys.argv[0] = 'fisherdyn'\nsys.exit(main())\n"


def _hidden_run(code: str, hidden, args=(), cwd=None, env=None):
    """Run `code` in a fresh interpreter (this checkout's fisherdyn) with `hidden` packages
    missing."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-c", _HIDE + code, ",".join(hidden), *map(str, args)],
        check=False, capture_output=True, text=True, cwd=cwd, env=env, timeout=600,
    )


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def _extra(name: str, seen=()) -> set[str]:
    """The packages `pip install "fisherdyn[name]"` installs beyond the core, self-references
    (`fisherdyn[plot,progress]`) followed."""
    out = set()
    for req in PYPROJECT["optional-dependencies"][name]:
        m = re.fullmatch(r"fisherdyn\[([\w,-]+)\]", req.replace(" ", ""))
        if m:
            for sub in m.group(1).split(","):
                assert sub not in seen, f"extra {name} includes itself through {sub}"
                out |= _extra(sub, (*seen, name))
        else:
            out.add(_name(req))
    return out


def test_core_dependencies_are_the_intended_set():
    assert {_name(r) for r in PYPROJECT["dependencies"]} == CORE


def test_extras_install_what_each_feature_needs():
    assert _extra("progress") == {"tqdm"}
    assert _extra("plot") == {"matplotlib"}
    assert _extra("sweep") == {"xarray", "zarr", "tqdm", "matplotlib", "platformdirs"}
    assert _extra("cli") == _extra("sweep") | {"flatbuffers"}
    assert _extra("flax") == {"flax"}
    assert {"optax", "matplotlib", "tqdm", "mpmath", "platformdirs"} <= _extra("studies")
    # make test installs [test] only: it must bring the command line (make run), Flax, studies
    assert _extra("cli") | _extra("flax") | _extra("studies") <= _extra("test")


def test_every_require_names_an_extra_that_installs_the_package():
    sites = []
    for path in (ROOT / "fisherdyn").rglob("*.py"):
        text = path.read_text()
        sites += re.findall(r'require\(\s*"([\w.]+)",\s*extra="([\w-]+)"', text)
    assert len(sites) >= 8, sites  # the sweep's, the command line's and the progress bar's
    for module, extra in sites:
        assert module.partition(".")[0] in _extra(extra), (module, extra)


def test_require_returns_the_module_or_one_line_naming_the_extra(tmp_path, monkeypatch):
    assert require("numpy.linalg", extra="plot") is np.linalg
    with pytest.raises(MissingExtra) as e:
        require("no_such_package_xyz.sub", extra="sweep", what="fisherdyn.sweep")
    assert str(e.value) == ('fisherdyn.sweep needs no_such_package_xyz, which is not '
                            'installed: pip install "fisherdyn[sweep]"')
    assert isinstance(e.value, ModuleNotFoundError)
    with pytest.raises(MissingExtra, match=r'^a, b are not installed: pip install "fisherdyn'
                                           r'\[cli\]"$'):
        require_all(["numpy", "a", "b.c", "a"], extra="cli")
    # an installed package whose own dependency is missing is that package's error, unchanged
    (tmp_path / "broken_pkg_xyz").mkdir()
    (tmp_path / "broken_pkg_xyz" / "__init__.py").write_text("import its_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        require("broken_pkg_xyz", extra="plot")
    assert not isinstance(e.value, MissingExtra) and e.value.name == "its_dependency_xyz"
    assert missing(["numpy", "broken_pkg_xyz", "nope_xyz"]) == ["nope_xyz"]


def test_core_runs_without_the_optional_packages(tmp_path):
    store = tmp_path / "grid.zarr"
    proc = _hidden_run(_CORE_RUN, OPTIONAL, [ROOT / "examples" / "grid.toml", store])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    z = np.array([1.0, 0.2, -0.7])
    # Shannon's stationary weights are softmax(z / T): closed form, to rounding
    np.testing.assert_allclose(out["stationary"], scipy.special.softmax(z / 0.5), rtol=1e-12)
    # relaxed to its fixed point: within the relax's default tolerance of the closed form
    assert out["relax_ok"]
    np.testing.assert_allclose(out["relax"], scipy.special.softmax(z / 0.5), atol=1e-6)
    rho = np.asarray(out["simulate"])
    assert rho.shape == (3,) and np.all(rho > 0) and abs(rho.sum() - 1) < 1e-9
    # attention with Shannon at T = 1 is softmax(q k^T) v over the keys, per leading index
    q, k, v = (np.random.default_rng(i).normal(size=(4, 2, 3)) for i in range(3))
    w = scipy.special.softmax(q @ np.swapaxes(k, -1, -2), axis=-1)
    np.testing.assert_allclose(out["attention"], w @ v, rtol=1e-10)
    assert out["progress_error"] == ('progress=True needs tqdm, which is not installed: '
                                     'pip install "fisherdyn[progress]"')
    # fisherdyn.sweep refuses before any work, naming all it needs and the extra with them
    need, _, install = out["sweep_error"].removeprefix("fisherdyn.sweep needs ").partition(
        ", which are not installed: ")
    assert install == 'pip install "fisherdyn[sweep]"', out["sweep_error"]
    assert set(need.split(", ")) == {"xarray", "zarr", "tqdm", "matplotlib"} <= _extra("sweep")
    assert not store.exists()
    assert out["loaded"] == []


def _one_error_line(proc):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    return lines[0]


def test_cli_sweep_without_the_sweep_extra_says_what_to_install(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FISHERDYN_CACHE", "FISHERDYN_NO_COMPILATION_CACHE")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the user cache, were anything written
    store = tmp_path / "grid.zarr"
    proc = _hidden_run(_CLI, OPTIONAL, ["sweep", ROOT / "examples" / "grid.toml", "--out",
                                        store], cwd=tmp_path, env=env)
    line = _one_error_line(proc)
    assert line.startswith("fisherdyn sweep: error: ") and line.endswith(
        'are not installed: pip install "fisherdyn[sweep]"'), line
    names = line.removeprefix("fisherdyn sweep: error: ").split(" are not")[0].split(", ")
    assert set(names) == _extra("sweep")  # all of them, and each installed by the extra named
    assert not store.exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "args, hidden, names",
    [
        (["simulate", "--out", "{tmp}/fig.png"], ("matplotlib",), ["matplotlib"]),
        (["simulate", "--save", "{tmp}/traj.nc"], ("xarray",), ["xarray"]),
        (["simulate", "--progress"], OPTIONAL, ["tqdm"]),
        (["run"], ("tqdm", "matplotlib"), ["tqdm", "matplotlib"]),
    ],
)
def test_cli_without_the_cli_extra_says_what_to_install(tmp_path, args, hidden, names):
    args = [a.format(tmp=tmp_path) for a in args] + ["--no-compilation-cache"]
    line = _one_error_line(_hidden_run(_CLI, hidden, args, cwd=tmp_path))
    command = args[0]
    verb = "is" if len(names) == 1 else "are"
    assert line == (f"fisherdyn {command}: error: {', '.join(names)} {verb} not installed: "
                    'pip install "fisherdyn[cli]"')
    assert set(names) <= _extra("cli")
    assert list(tmp_path.iterdir()) == []  # refused before writing anything


def test_cli_stationary_runs_on_the_core_alone(tmp_path):
    proc = _hidden_run(_CLI, OPTIONAL, ["stationary", "--scores", "1,0.2,-0.7", "--T", "0.5",
                                        "--no-compilation-cache"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # softmax(z / T): the closed form, to the JSON's printed precision
    z = np.array([1.0, 0.2, -0.7])
    rho = np.asarray(json.loads(proc.stdout)["weights"]).ravel()
    np.testing.assert_allclose(rho, scipy.special.softmax(z / 0.5), rtol=1e-12)
