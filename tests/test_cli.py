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


def fisherdyn_inprocess_plain(*args):
    """`--help` text of a command, in-process, without pytest's capture fixtures."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit):
        console_script()([str(a) for a in args])
    return buffer.getvalue()


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
    to `run/` under the working directory (ignored by git), which the command names. The
    operator table holds that family's row alone, in the order `--help` states (after the
    relaxed families, before the relaxation table), and the verdict precedes the figures."""
    out = fisherdyn("run", "--family", "shannon", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "relaxation of 1 family in 4 regimes" in lines[0], lines[0]
    assert "under-damped" in out.stdout and "overdamped flow" in out.stdout
    relaxed = lines.index("  relaxed Shannon")
    table = next(i for i, line in enumerate(lines) if line.startswith("family ") and
                 "realization" in line)
    dynamics = next(i for i, line in enumerate(lines) if line.startswith("family ") and
                    "regime" in line)
    assert relaxed < table < dynamics
    operator_rows = [line for line in lines[table + 2:dynamics] if line.strip()
                     and not line.startswith("Damped")]
    assert len(operator_rows) == 1 and operator_rows[0].startswith("Shannon"), operator_rows
    run_help = " ".join(fisherdyn_inprocess_plain("run", "--help").split())
    assert "printed first" not in run_help and "after the relaxed families" in run_help
    verdict = next(i for i, line in enumerate(lines) if "fixed points match" in line)
    for name in ("relaxation_paths.png", "energy.png"):
        assert lines.index(f"wrote {Path('run') / name}") > verdict
        assert (tmp_path / "run" / name).read_bytes()[:8] == PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert "tests/" not in out.stdout  # the closing note cites what a wheel's user has


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


@pytest.mark.slow
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


def test_early_stops_share_one_exit_status(capsys):
    """The rule `simulate --help` states: 0 when the run reached --t1, 1 when it stopped
    before for any reason (out of steps, or at the simplex boundary), with the summary of
    the part computed on stdout and one line naming the reason and what to do on stderr."""
    assert "1: stopped before --t1, for any reason" in " ".join(
        fisherdyn_inprocess_plain("simulate", "--help").split())
    out = fisherdyn_inprocess(capsys, "simulate", "--max-steps", "3", "--t1", "50")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "max_steps_reached" in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout.splitlines()[0].endswith(": max_steps_reached"), out.stdout
    # Tsallis(2) from uniform weights: a weight reaches 0 in finite time, where the simplex
    # chart stops (the sphere chart integrates through)
    out = fisherdyn_inprocess(
        capsys, "simulate", "--entropy", "tsallis:2", "--coords", "simplex", "--t1", "50"
    )
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines()[0].endswith(": boundary_reached"), out.stdout
    (line,) = out.stderr.strip().splitlines()
    assert "stopped early" in line and "boundary_reached" in line and "--coords sphere" in line
    t_stop = float(line.split("at t = ")[1].split()[0])
    assert 0 < t_stop < 50
    out = fisherdyn_inprocess(capsys, "simulate", "--t1", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].endswith(": successful"), out.stdout
    assert out.stderr == ""


@pytest.mark.parametrize(
    "args,scale",
    [
        # Shannon at T = 1e10: omega^2 = 1e10, the fastest mode oscillates at 1e5 radians
        # per unit time; with scores and T divided by 1e8, at 10
        (["--T", "1e10", "--scores", "1,0.5"], "1e8"),
        # a score gap of 1e8 at T = 1: omega^2 = 5e7 at the fixed point
        (["--scores", "1e8,0"], "1e6"),
    ],
)
def test_max_steps_advice_matches_the_cause(capsys, args, scale):
    """Out of steps because the problem's own time scale is far below t1: the advice says
    so and names the rescaling that helps, not `--max-steps`/`--t1`. Reference: the advice
    followed (scores and T divided by the factor named) reaches t1 and the softmax of
    scores/T (Shannon's closed form), which the rescaling leaves unchanged."""
    out = fisherdyn_inprocess(capsys, "simulate", *args, "--max-steps", "2000")
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert "max_steps_reached" in line and "oscillates" in line, line
    assert f"divide --scores and --T by about {scale}" in line, line
    assert "raise --max-steps" not in line and "shorten --t1" not in line, line
    c = float(scale)
    T = float(args[args.index("--T") + 1]) if "--T" in args else 1.0
    z = np.array([float(v) for v in args[args.index("--scores") + 1].split(",")])
    scaled = ",".join(repr(float(v)) for v in z / c)
    out = fisherdyn_inprocess(capsys, "simulate", "--T", repr(T / c), "--scores", scaled,
                              "--max-steps", "2000", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["result"] == "successful"
    # settled well below 1e-9 by t1 = 50 (slowest rate 0.5, so e^-25 of the start)
    np.testing.assert_allclose(summary["rho_final"], scipy.special.softmax(z / T), atol=1e-9)


def test_max_steps_advice_for_a_stiff_flow_and_a_short_budget(capsys):
    """The overdamped flow at T = 1e10 decays at 1e10 per unit time: the advice is to
    divide the scores and T by about 1e9 (the run then finishes with the default solver)
    or to try the implicit solver (not asserted to finish: on a flow this stiff its step
    is rejected at random where round-off decides Newton's convergence); a budget of 3
    steps on an ordinary problem is what --max-steps is for."""
    out = fisherdyn_inprocess(capsys, "simulate", "--T", "1e10", "--scores", "1,0.5",
                              "--mass", "0", "--max-steps", "2000")
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 1 and "decays at" in line and "--solver kvaerno5" in line, line
    assert "divide --scores and --T by about 1e9" in line, line
    out = fisherdyn_inprocess(capsys, "simulate", "--T", "10", "--scores", "1e-9,5e-10",
                              "--mass", "0", "--max-steps", "2000")
    assert out.returncode == 0, out.stderr
    out = fisherdyn_inprocess(capsys, "simulate", "--max-steps", "3")
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 1 and "raise --max-steps" in line, line


def test_usage_error_punctuation(capsys):
    """A message that ends in a sentence's period reads `...=1.5 (see --help)`."""
    out = fisherdyn_inprocess(capsys, "simulate", "--entropy", "kaniadakis:1.5")
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "1.5" in line and line.endswith(" (see --help)"), line
    assert ". (see --help)" not in line and ".." not in line, line


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


# --------------------------------------------------------------------------- output paths

SWEEP_SPEC = """\
families = ["shannon"]
T = [1.0]
mass = [1.0]
damping = [0.5]
n_keys = [4]
scores = "gaussian"
seeds = 2
n_save = 16
"""


def _output_cases(root):
    (root / "f.txt").write_text("a file")
    (root / "d.png").mkdir()
    (root / "good.toml").write_text(SWEEP_SPEC)
    cases = [
        (["simulate", "--scores", "1,2", "--out", root / "f.txt" / "x.png"], "--out"),
        (["simulate", "--out", root / "d.png"], "--out"),
        (["run", "--family", "shannon", "--figures-dir", root / "f.txt"], "--figures-dir"),
        (["sweep", root / "good.toml", "--out", root / "f.txt" / "s.zarr"], "--out"),
    ]
    if Path("/proc/self").is_dir():  # a directory where nothing can be created
        cases.append((["sweep", root / "good.toml", "--out", "/proc/s.zarr"], "--out"))
    return cases


def test_output_paths_are_checked_before_computing(tmp_path, capsys, monkeypatch):
    """A path that cannot be written is a usage error (exit 2, one line naming the option)
    before the command computes anything: the commands are replaced by a sentinel that
    fails the test if reached. Valid paths, in directories still to be created, reach it."""
    from fisherdyn._cli import _run, _simulate, _sweep

    reached = []
    for module, name in ((_simulate, "simulate_command"), (_run, "run_command"),
                         (_sweep, "sweep_command")):
        monkeypatch.setattr(module, name, lambda args, name=name: reached.append(name) or 0)
    for args, option in _output_cases(tmp_path):
        out = fisherdyn_inprocess(capsys, *args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, (args, out.stderr)
        assert f"argument {option}:" in lines[0], lines[0]
        assert reached == [], args
    new = tmp_path / "new" / "deeper"
    for args in (["simulate", "--out", new / "x.png"], ["run", "--figures-dir", new],
                 ["sweep", tmp_path / "good.toml", "--out", new / "s.zarr"]):
        assert fisherdyn_inprocess(capsys, *args).returncode == 0
    assert reached == ["simulate_command", "run_command", "sweep_command"]
    assert not (tmp_path / "new").exists()  # checked, not created, before the run


def test_simulate_prints_the_summary_before_the_figure(tmp_path, capsys, monkeypatch):
    """The text is out before the figure is written: a figure that fails (here, a disk
    that fills) still leaves the summary on stdout."""
    from fisherdyn._cli import _plots

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_plots, "simulate_figure", full_disk)
    with pytest.raises(OSError):
        console_script()(["simulate", "--t1", "1", "--out", str(tmp_path / "x.png")])
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(": successful"), out
    assert "wrote" not in out


# --------------------------------------------------------------------------- pipes and Ctrl-C


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_closed_pipe_is_quiet():
    """`fisherdyn simulate --json | head -0`: the reader has gone before the summary is
    written; the command exits 141 (as a process ended by SIGPIPE) with nothing on stderr,
    where Python would print a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "fisherdyn", "simulate", "--t1", "1",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env())
    proc.stdout.close()  # no reader from the start: the first write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert err == "", err


def _children(pid):
    """The process ids of `pid`'s children (Linux: /proc/PID/task/TID/children)."""
    out = set()
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out |= {int(v) for v in path.read_text().split()}
        except OSError:  # a thread that ended meanwhile
            pass
    return out


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended, waiting only to be reaped


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_ctrl_c_in_run_is_quiet_and_ends_the_workers(tmp_path):
    """Ctrl-C in a terminal sends SIGINT to every process of the group: `fisherdyn run`,
    interrupted once its worker processes run, exits 130 with one line on stderr, and none
    of its child processes survives it."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "fisherdyn", "run", "--family", "shannon",
                             "--no-figures"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env=_env(), start_new_session=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("fisherdyn run:"), first + proc.stderr.read()
        deadline = time.monotonic() + 120
        while not _children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        children = _children(proc.pid)
        assert children, "no worker process started"
        time.sleep(1.0)  # every worker started (they start together), none finished
        children |= _children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["fisherdyn run: interrupted"], err
    deadline = time.monotonic() + 10  # the resource tracker leaves when it sees EOF
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [c for c in children if _alive(c)]


# --------------------------------------------------------------------------- figures, suite


def test_energy_figure_legend_per_panel():
    """Every panel of energy.png carries the legend of its own curves: the dampings differ
    between families (each is set from that family's spectrum)."""
    from fisherdyn._cli._plots import _energy_plot
    from fisherdyn._cli._verify import REGIMES, FamilyCheck

    ts = np.linspace(0.0, 10.0, 50)
    checks = []
    for k, label in enumerate(["A", "B", "C"]):
        gammas = [0.1 * (k + 1), 1.0 * (k + 1), 3.0 * (k + 1), 2.0 * (k + 1)]
        rows = [dict(regime=r, gamma=g) for r, g in zip(REGIMES, gammas)]
        paths = [dict(ts=ts, energy=1.0 + np.exp(-ts)) for _ in REGIMES]
        checks.append(FamilyCheck(label, rows, paths, np.ones(2) / 2, 1.0))
    fig = _energy_plot(checks)
    try:
        for ax, check in zip(fig.axes, checks):
            legend = ax.get_legend()
            assert legend is not None, check.label
            texts = [t.get_text() for t in legend.get_texts()]
            assert texts == [f"{r['regime']} (γ={r['gamma']:.2g})" for r in check.rows]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_suite_keeps_the_user_cache_clean(monkeypatch):
    """tests/conftest.py points FISHERDYN_CACHE (the CLI's compiled programs, and the weight
    cache of the studies the suite runs: tests/studies/test_weight_tied_cache.py) at a
    directory of the run, so the suite leaves nothing in the user cache directory."""
    import platformdirs

    from fisherdyn._cli._exported import exported_dir

    cache = Path(os.environ["FISHERDYN_CACHE"]).resolve()
    # where the programs would go with the cache on (the suite switches it off)
    monkeypatch.delenv("FISHERDYN_NO_COMPILATION_CACHE", raising=False)
    assert exported_dir().resolve().parent == cache
    assert not cache.is_relative_to(Path(platformdirs.user_cache_dir("fisherdyn")).resolve())


def test_simulate_figure_labels_stay_short(tmp_path):
    """Scores far from 1 label their curves in a few characters (with two decimals, 1e200
    was a 200-digit label that no layout can fit)."""
    import warnings
    from types import SimpleNamespace
    from unittest import mock

    import matplotlib.pyplot as plt

    from fisherdyn._cli import _plots

    ts = np.linspace(0.0, 1.0, 5)
    tr = SimpleNamespace(ts=ts, rho=np.full((5, 2), 0.5), energy=np.zeros(5))
    summary = dict(scores=[1e200, -1e200], entropy="Shannon", T=1.0, mass=1.0, damping=1.0,
                   result="successful")
    figures = []
    close = plt.close
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns when the layout cannot fit
        with mock.patch.object(plt, "close", lambda fig: figures.append(fig)):
            _plots.simulate_figure(tr, np.array([1.0, 0.0]), summary, tmp_path / "x.png")
    (fig,) = figures
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    close(fig)
    assert labels == ["z=+1e+200", "z=-1e+200"]
