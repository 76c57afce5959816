"""The `fisherdyn` command, run as `python -m fisherdyn` in a subprocess.

References: argparse's contract (exit status 2, the argument named in a one-line message),
the softmax closed form (scipy.special.softmax) for where a damped Shannon run ends, and the
PNG file signature for the figures.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.special


ROOT = Path(__file__).resolve().parent.parent


def fisherdyn(*args, cwd=None, timeout=600):
    """`python -m fisherdyn ARGS` in a subprocess (end to end), importing this checkout's
    package from any working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "fisherdyn", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env=env,
    )


def console_script():
    """The installed `fisherdyn` console script's entry point (pyproject [project.scripts]),
    called in-process: the parser checks need no fresh interpreter."""
    (ep,) = importlib.metadata.entry_points(group="console_scripts", name="fisherdyn")
    return ep.load()


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def fisherdyn_inprocess(capsys, *args):
    main = console_script()
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


PNG = b"\x89PNG\r\n\x1a\n"


def test_help_documents_every_option(capsys):
    fisherdyn = lambda *a: fisherdyn_inprocess(capsys, *a)  # noqa: E731
    top = fisherdyn("--help")
    assert top.returncode == 0 and "run" in top.stdout and "simulate" in top.stdout
    sim = fisherdyn("simulate", "--help")
    assert sim.returncode == 0
    for option in (
        "--entropy",
        "--scores",
        "--scores-file",
        "--T",
        "--mass",
        "--damping",
        "--t1",
        "--rho0",
        "--coords",
        "--solver",
        "--rtol",
        "--atol",
        "--max-steps",
        "--n-save",
        "--out",
        "--json",
        "--progress",
    ):
        assert option in sim.stdout, option
    run = fisherdyn("run", "--help")
    for option in ("--family", "--scores", "--T", "--mass", "--figures-dir", "--no-figures"):
        assert option in run.stdout, option


@pytest.mark.parametrize(
    "args,name",
    [
        (["simulate", "--T", "-1"], "--T"),
        (["simulate", "--T", "abc"], "--T"),
        (["simulate", "--entropy", "nosuch:1"], "--entropy"),
        (["simulate", "--entropy", "tsallis:1"], "--entropy"),
        (["simulate", "--scores", "1,x,2"], "--scores"),
        (["simulate", "--scores", "1,,2"], "--scores"),
        (["simulate", "--scores", "-1,2,"], "--scores"),
        (["simulate", "--max-steps", "0"], "--max-steps"),
        (["simulate", "--scores-file", "/no/such/file.npy"], "--scores-file"),
        (["simulate", "--mass", "-2"], "--mass"),
        (["simulate", "--mass", "0", "--damping", "0"], "--damping"),
        (["simulate", "--scores", "1,2,3", "--rho0", "0.5,0.5"], "--rho0"),
        (["simulate", "--out", "figure.txt"], "--out"),
        (["simulate", "--coords", "polar"], "--coords"),
        (["nosuchcommand"], "COMMAND"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, args, name):
    out = fisherdyn_inprocess(capsys, *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "error" in lines[0], out.stderr


def test_simulate_json_and_figure(tmp_path, capsys):
    """A damped Shannon run from --scores-file (.npy and .csv) ends at softmax(z/T)."""
    z = np.array([1.3, 0.2, -0.7, 0.4])
    np.save(tmp_path / "z.npy", z)
    (tmp_path / "z.csv").write_text(",".join(map(str, z)))
    png = tmp_path / "path.png"
    out = fisherdyn(
        "simulate",
        "--entropy",
        "shannon",
        "--scores-file",
        tmp_path / "z.npy",
        "--T",
        "0.8",
        "--mass",
        "1",
        "--damping",
        "1.5",
        "--t1",
        "60",
        "--out",
        png,
        "--json",
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["result"] == "successful"
    rho = np.array(summary["rho_final"])
    # reference: the softmax closed form; the run has relaxed to ~1e-7 by t = 60
    np.testing.assert_allclose(rho, scipy.special.softmax(z / 0.8), atol=1e-6)
    assert abs(rho.sum() - 1) <= 1e-12
    assert summary["max_energy_increase"] <= 1e-12  # damped: H never increases
    assert png.read_bytes()[:8] == PNG
    # the same scores from a CSV file (in-process from here on: one compile for both runs)
    out = fisherdyn_inprocess(
        capsys, "simulate", "--scores-file", tmp_path / "z.csv", "--t1", "1", "--json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["scores"] == z.tolist()
    # a negative first score is not mistaken for an option
    out = fisherdyn_inprocess(
        capsys, "simulate", "--scores", "-0.5,1,0.2,0.3", "--t1", "1", "--json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["scores"] == [-0.5, 1.0, 0.2, 0.3]


def test_run_one_family(tmp_path):
    """`fisherdyn run` on one family: every regime's fixed point matches, and the figures go
    to `run/` under the working directory (ignored by git), which the command names."""
    out = fisherdyn("run", "--no-operator-table", "--family", "shannon", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "under-damped" in out.stdout and "overdamped flow" in out.stdout
    assert "fixed points match" in out.stdout
    for name in ("relaxation_paths.png", "energy.png"):
        assert f"wrote {Path('run') / name}" in out.stdout
        assert (tmp_path / "run" / name).read_bytes()[:8] == PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.slow
def test_run_all_families(tmp_path):
    out = fisherdyn("run", "--figures-dir", tmp_path, timeout=1800)
    assert out.returncode == 0, out.stdout + out.stderr


_TRACERS = (
    "import json, sys\n"
    "from fisherdyn._cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print(json.dumps([m for m in ('diffrax', 'optimistix') if m in sys.modules]),"
    " file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _simulate_in_new_process(cache, *args):
    """`fisherdyn simulate ARGS --json` in a new interpreter with its cache under `cache`:
    the summary and the list of tracing libraries (diffrax, optimistix) it imported."""
    env = dict(os.environ, FISHERDYN_CACHE=str(cache))
    env.pop("FISHERDYN_NO_COMPILATION_CACHE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", _TRACERS, "simulate", *args, "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), json.loads(out.stderr.strip().splitlines()[-1])


def _numbers(summary):
    return np.array([v for k, v in sorted(summary.items()) if isinstance(v, float)]
                    + summary["rho_final"] + summary["rho_stationary"]
                    + summary["spectrum"]["omega2"]
                    + np.ravel(summary["spectrum"]["rates"]).tolist())


def test_simulate_loads_its_exported_program_in_a_new_process(tmp_path):
    """The first `fisherdyn simulate` exports its traced program (jax.export) beside the
    compilation cache; a second process with the same options loads it, so it neither traces
    nor imports Diffrax. Reference: the run with no cache, whose simulate, stationary and
    relaxation_spectrum are called one by one in the process."""
    argv = ["--entropy", "kaniadakis:0.3", "--scores", "1.3,0.2,-0.7", "--T", "0.8",
            "--mass", "0.5", "--t1", "20"]
    first, traced = _simulate_in_new_process(tmp_path, *argv)
    (entry,) = (tmp_path / "exported").glob("simulate-*.jaxexport")
    assert "diffrax" in traced  # the first process traced the program
    second, traced = _simulate_in_new_process(tmp_path, *argv)
    assert traced == [], traced
    assert second == first
    reference, _ = _simulate_in_new_process(tmp_path, *argv, "--no-compilation-cache")
    assert reference["result"] == first["result"] == "successful"
    # the same operations, compiled as one program instead of three: equal to round-off
    np.testing.assert_allclose(_numbers(first), _numbers(reference), rtol=1e-12, atol=1e-15)
    # a damaged entry is exported again, not trusted
    size = entry.stat().st_size
    entry.write_bytes(entry.read_bytes()[: size // 3])
    third, traced = _simulate_in_new_process(tmp_path, *argv)
    assert third == first and "diffrax" in traced and entry.stat().st_size == size
    # another option is another program; a progress bar (a host callback) is not exported
    _simulate_in_new_process(tmp_path, *argv[:-1], "10")
    _simulate_in_new_process(tmp_path, *argv, "--progress")
    assert len(list((tmp_path / "exported").glob("simulate-*.jaxexport"))) == 2


@pytest.mark.parametrize("content,message", [(None, "shape (2, 3)"), ("", "is empty"),
                                             ("  \n", "is empty")])
def test_bad_scores_file_is_one_line(tmp_path, capsys, content, message):
    """A 2-D array or an empty file is a usage error (exit 2, one line, no numpy warning)."""
    if content is None:
        path = tmp_path / "z.npy"
        np.save(path, np.ones((2, 3)))
    else:
        path = tmp_path / "z.csv"
        path.write_text(content)
    out = fisherdyn_inprocess(capsys, "simulate", "--scores-file", path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--scores-file" in lines[0] and message in lines[0], out.stderr


def test_solver_failure_and_boundary_are_reported_as_words(capsys):
    """A run out of steps is one line and exit 1 (no traceback); a run that stops at the
    simplex boundary is a result, printed by its name."""
    out = fisherdyn_inprocess(capsys, "simulate", "--max-steps", "3", "--t1", "50")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "max_steps_reached" in lines[0], out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    out = fisherdyn_inprocess(
        capsys, "simulate", "--entropy", "tsallis:2", "--coords", "simplex", "--t1", "50"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].endswith(": boundary_reached"), out.stdout
    out = fisherdyn_inprocess(capsys, "simulate", "--t1", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].endswith(": successful"), out.stdout


def test_version():
    out = fisherdyn("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"fisherdyn {importlib.metadata.version('fisherdyn')}"


_NO_JAX = (
    "import runpy, sys\n"
    "sys.argv = ['fisherdyn', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('fisherdyn', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "assert 'jax' not in sys.modules, 'imported jax'\n"
    "sys.exit(code)\n"
)


@pytest.mark.parametrize(
    "args,code",
    [(["--help"], 0), (["--version"], 0), (["run", "--help"], 0), (["simulate", "--help"], 0),
     (["simulate", "--T", "-1"], 2), (["simulate", "--mass", "0", "--damping", "0"], 2),
     (["nosuchcommand"], 2)],
)
def test_help_and_usage_errors_do_not_import_jax(args, code):
    """The parser answers before JAX is imported (so at once)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", _NO_JAX, *args], capture_output=True,
                         text=True, env=env)
    assert out.returncode == code, out.stderr


def test_import_loads_neither_jax_nor_optax():
    """`import fisherdyn` defers its subpackages; the core names do not load optax."""
    code = (
        "import sys, fisherdyn as fd\n"
        "assert 'jax' not in sys.modules\n"
        "fd.stationary, fd.simulate, fd.attention, fd.tangent_test, fd.operator_table\n"
        "assert 'optax' not in sys.modules\n"
        "assert set(fd.__all__) <= set(dir(fd))\n"
        "assert all(getattr(fd, name) is not None for name in fd.__all__)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr


def test_lazy_exports_match_the_static_imports():
    """The names `fisherdyn.__getattr__` serves are those its `TYPE_CHECKING` block imports
    (what type checkers and the API docs see), from the same subpackages."""
    import ast

    import fisherdyn

    tree = ast.parse((ROOT / "fisherdyn" / "__init__.py").read_text())
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    static = {a.asname: node.module for node in block.body for a in node.names}
    assert static == {name: module for module, names in fisherdyn._EXPORTS.items()
                      for name in names}
    assert sorted(static) == sorted(fisherdyn.__all__)
