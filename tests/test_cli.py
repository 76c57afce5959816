"""The `fisherdyn` command, run as `python -m fisherdyn` in a subprocess.

References: argparse's contract (exit status 2, the argument named in a one-line message),
the softmax closed form (scipy.special.softmax) for where a damped Shannon run ends, and the
PNG file signature for the figures.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.special


def fisherdyn(*args, cwd=None, timeout=600):
    """`python -m fisherdyn ARGS` in a subprocess (end to end)."""
    return subprocess.run(
        [sys.executable, "-m", "fisherdyn", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
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
    """`fisherdyn run` on one family: every regime's fixed point matches, figures written."""
    out = fisherdyn("run", "--no-operator-table", "--family", "shannon", "--figures-dir", tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "under-damped" in out.stdout and "overdamped flow" in out.stdout
    assert "fixed points match" in out.stdout
    for name in ("relaxation_paths.png", "energy.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


@pytest.mark.slow
def test_run_all_families(tmp_path):
    out = fisherdyn("run", "--figures-dir", tmp_path, timeout=1800)
    assert out.returncode == 0, out.stdout + out.stderr
