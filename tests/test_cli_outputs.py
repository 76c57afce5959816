"""`fisherdyn stationary` and `fisherdyn simulate --save`, called in-process through
`fisherdyn._cli.main`.

References: `fisherdyn.solve_stationary(method="scipy")` (brentq on the stationary law, no
code shared with the operator) and `scipy.special.softmax` for the weights; a direct call of
the public `fisherdyn.simulate` with the same options for a saved trajectory (the file must
hold what the library returns); argparse's contract (exit status 2, one line) for bad input.
"""

from __future__ import annotations

import io
import json
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import fisherdyn as fd
from fisherdyn._cli import main

# rows = independent problems; row 2 has ties, row 3 a dropped (-inf) key
ROWS = np.array(
    [
        [1.3, 0.2, -0.7, 0.9, -2.0],
        [0.5, 0.5, 0.5, -1.0, 0.0],
        [2.0, -np.inf, 0.1, -0.4, 1.1],
    ]
)
FAMILIES = [
    "shannon",
    "tsallis:1.5",
    "tsallis:2",
    "renyi:2",
    "sharma_mittal:2,1.5",
    "kaniadakis:0.3",
    "burg",
    "abe:1.5",
]


def cli(capsys, *args):
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def write_rows(path, rows):
    path.write_text("\n".join(",".join(repr(float(v)) for v in r) for r in rows) + "\n")
    return path


# --------------------------------------------------------------------------- stationary


@pytest.mark.parametrize("family", FAMILIES)
def test_stationary_every_family_matches_an_independent_solver(family, tmp_path, capsys):
    scores = write_rows(tmp_path / "z.csv", ROWS)
    code, out, err = cli(capsys, "stationary", "--entropy", family, "--scores-file", scores,
                         "--T", "0.8")
    assert code == 0, err
    doc = json.loads(out)
    w = np.array(doc["weights"])
    assert doc["shape"] == [3, 5] and w.shape == (3, 5)
    entropy = fd.parse_entropy(family)
    for row, got in zip(ROWS, w):
        ref = np.asarray(fd.solve_stationary(entropy, jnp.asarray(row), 0.8, method="scipy").rho)
        # brentq's tolerance, well above both solvers' float64 round-off
        np.testing.assert_allclose(got, ref, atol=1e-10)
    assert w[2, 1] == 0.0  # the -inf key


def test_stationary_inline_scores_against_softmax(capsys):
    code, out, err = cli(capsys, "stationary", "--scores", "-0.5,1,2.25", "--T", "0.7")
    assert code == 0, err
    w = np.array(json.loads(out)["weights"])
    # softmax(z/T) is the closed form of the Shannon operator (float64 round-off)
    np.testing.assert_allclose(w, scipy.special.softmax(np.array([-0.5, 1, 2.25]) / 0.7),
                               rtol=1e-13)


def test_stationary_formats_round_trip_exactly(tmp_path, capsys):
    scores = write_rows(tmp_path / "z.txt", ROWS[:2])
    got = {}
    for name, extra in [
        ("w.json", []),
        ("w.csv", []),
        ("w.npy", []),
        ("w.dat", ["--format", "csv"]),
    ]:
        out_path = tmp_path / name
        code, out, err = cli(capsys, "stationary", "--entropy", "kaniadakis:0.3",
                             "--scores-file", scores, "--out", out_path, *extra)
        assert code == 0, err
        assert str(out_path) in out
        if name.endswith(".json"):
            got[name] = np.array(json.loads(out_path.read_text())["weights"])
        elif name.endswith(".npy"):
            got[name] = np.load(out_path)
        else:
            got[name] = np.loadtxt(out_path, delimiter=",", ndmin=2)
    code, out, _ = cli(capsys, "stationary", "--entropy", "kaniadakis:0.3", "--scores-file",
                       scores, "--format", "csv")
    got["stdout.csv"] = np.loadtxt(io.StringIO(out), delimiter=",", ndmin=2)
    ref = np.asarray(fd.stationary(fd.Kaniadakis(0.3), jnp.asarray(ROWS[:2]), 1.0))
    for name, w in got.items():
        # JSON and %.17g text hold a float64 exactly, .npy is the array itself
        np.testing.assert_array_equal(w, ref, err_msg=name)


def test_stationary_mask_and_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("1.0 2.0 3.0\n0.0 0.0 1.0\n"))
    code, out, err = cli(capsys, "stationary", "--scores-file", "-", "--mask", "1,0,1")
    assert code == 0, err
    w = np.array(json.loads(out)["weights"])
    # a masked key takes no part: softmax over the kept keys (float64 round-off)
    np.testing.assert_allclose(w[:, [0, 2]], scipy.special.softmax([[1.0, 3.0], [0.0, 1.0]],
                                                                   axis=-1), rtol=1e-13)
    assert np.all(w[:, 1] == 0.0)


def test_stationary_never_writes_weights_that_do_not_sum_to_one(monkeypatch, tmp_path, capsys):
    # a stand-in operator that loses a row's mass: the command must refuse, not write it
    monkeypatch.setattr(fd, "stationary", lambda e, z, T, mask=None: jnp.zeros_like(z))
    out_path = tmp_path / "w.json"
    code, _, err = cli(capsys, "stationary", "--scores", "1,2", "--out", out_path)
    assert code == 1 and "do not sum to 1" in err and len(err.strip().splitlines()) == 1
    assert not out_path.exists()


@pytest.mark.parametrize(
    "content, args, message",
    [
        ("1,nan,3\n", [], "scores must be finite or -inf"),
        ("1,2,3\n1,inf,3\n", [], "at row 1, key 1"),
        ("1,2,3\n4,5\n", [], "cannot read"),
        ("\n# only a comment\n", [], "holds no scores"),
        ("a,b\n", [], "cannot read"),
        ("1,2,3\n", ["--format", "npy"], "npy is binary"),
        ("1,2,3\n", ["--out", "w.dat"], "cannot tell the format"),
        ("1,2,3\n", ["--out", "w.csv", "--format", "json"], "does not match"),
        ("1,2,3\n", ["--out", "z.csv/w.csv"], "is not a directory"),
        ("1,2,3\n", ["--out", "."], "is a directory"),
        ("1,2,3\n", ["--mask", "1,0"], "fits neither"),
        ("1,2,3\n", ["--mask", "1,2,0"], "1 (keep) and 0 (drop)"),
        ("1,2,3\n", ["--T", "0"], "must be > 0"),
        ("1,2,3\n", ["--entropy", "nosuch"], "unknown entropy"),
    ],
)
def test_stationary_bad_input_is_one_line_exit_2(content, args, message, tmp_path, capsys,
                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "z.csv").write_text(content)
    code, out, err = cli(capsys, "stationary", "--scores-file", "z.csv", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_stationary_help_has_an_example(capsys):
    code, out, _ = cli(capsys, "stationary", "--help")
    assert code == 0 and "fisherdyn stationary --entropy" in out
    for option in ("--scores", "--scores-file", "--T", "--mask", "--format", "--out"):
        assert option in out


# --------------------------------------------------------------------------- simulate --save

SIM = dict(entropy="kaniadakis:0.3", scores="1.3,0.2,-0.7,0.9", T=0.8, mass=1.0,
           damping=0.5, t1=20.0, n_save=41)


def simulate_directly(coords="sphere", **over):
    o = {**SIM, **over}
    z = jnp.asarray([float(v) for v in o["scores"].split(",")])
    entropy = fd.parse_entropy(o["entropy"])
    tr = fd.simulate(entropy, z, o["T"], mass=o["mass"], damping=o["damping"], t1=o["t1"],
                     saveat=o["n_save"], coords=coords, rtol=1e-8, atol=1e-10, throw=False)
    return tr, np.asarray(fd.stationary(entropy, z, o["T"]))


def sim_args(coords="sphere", **over):
    o = {**SIM, **over}
    return ["simulate", "--entropy", o["entropy"], "--scores", o["scores"], "--T", o["T"],
            "--mass", o["mass"], "--damping", o["damping"], "--t1", o["t1"],
            "--n-save", o["n_save"], "--coords", coords]


def assert_same_trajectory(saved, tr, st):
    # the same program on the same inputs: equal up to float64 round-off of the compilation
    for key, ref in [("time", tr.ts), ("rho", tr.rho), ("rho_dot", tr.rho_dot),
                     ("lam", tr.lam), ("energy", tr.energy), ("rho_final", tr.rho_final),
                     ("rho_dot_final", tr.rho_dot_final), ("t_final", tr.t_final),
                     ("rho_stationary", st)]:
        np.testing.assert_allclose(saved[key], np.asarray(ref), rtol=1e-12, atol=1e-14,
                                   err_msg=key)
    assert int(saved["result"]) == int(np.asarray(tr.result._value))


def test_simulate_save_netcdf_round_trips(tmp_path, capsys):
    xr = pytest.importorskip("xarray")
    path = tmp_path / "traj.nc"
    code, out, err = cli(capsys, *sim_args(), "--save", path)
    assert code == 0, err
    assert f"wrote {path}" in out
    tr, st = simulate_directly()
    with xr.open_dataset(path) as ds:
        assert ds.rho.dims == ("time", "key") and ds.rho.shape == (41, 4)
        saved = {k: ds[k].values for k in ds.variables}
        assert_same_trajectory(saved, tr, st)
        assert ds.attrs["result_name"] == "successful"
        options = json.loads(ds.attrs["options"])
        assert options["entropy"] == "Kaniadakis(0.3)" and options["damping"] == 0.5
        meanings = ds.result.attrs["flag_meanings"].split()
        assert meanings[list(ds.result.attrs["flag_values"]).index(int(ds.result))] == (
            "successful"
        )
        np.testing.assert_array_equal(ds.scores.values, [1.3, 0.2, -0.7, 0.9])


def test_simulate_save_npz_keeps_an_early_stop(tmp_path, capsys):
    # the simplex chart stops where a weight reaches 0: the saved times past it are inf
    path = tmp_path / "traj.npz"
    over = dict(entropy="tsallis:2", scores="1.3,0.2,-0.7", T=1.0, damping=0.2, n_save=21)
    code, out, err = cli(capsys, *sim_args("simplex", **over), "--save", path, "--json")
    assert json.loads(out)["trajectory"] == str(path)
    tr, st = simulate_directly("simplex", **over)
    with np.load(path, allow_pickle=False) as saved:
        assert str(saved["result_name"]) == "boundary_reached"
        assert np.isinf(saved["time"][-1]) and float(saved["t_final"]) < over.get("t1", 20.0)
        assert_same_trajectory(dict(saved), tr, st)
        assert json.loads(str(saved["options"]))["coords"] == "simplex"


PROC = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


@pytest.mark.parametrize(
    "command, name, message",
    [
        ("simulate", "traj.h5", "must end in .nc or .npz"),
        ("simulate", "f.txt/traj.nc", "is not a directory"),
        ("simulate", "traj.nc/", "is a directory"),
        # writable by its permission bits for root, yet no file can be created there
        pytest.param("simulate", "/proc/traj.nc", "cannot create files", marks=PROC),
        pytest.param("stationary", "/proc/w.json", "cannot create files", marks=PROC),
    ],
)
def test_output_path_is_checked_before_computing(command, name, message, tmp_path, capsys):
    (tmp_path / "traj.nc").mkdir()
    (tmp_path / "f.txt").write_text("")
    option = "--save" if command == "simulate" else "--out"
    extra = ["--scores", "1,2"] if command == "stationary" else []
    code, out, err = cli(capsys, command, *extra, option, tmp_path / name)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err


def test_stationary_program_is_cacheable(tmp_path):
    # Equinox's runtime checks as NaN (no host callback), so JAX may keep the program in its
    # persistent cache; set before the entropy argument imports equinox
    import os
    import subprocess

    code = ("import os; from fisherdyn._cli import main; "
            "c = main(['stationary', '--entropy', 'burg', '--scores', '1,2']); "
            "print(c, os.environ.get('EQX_ON_ERROR'))")
    env = {k: v for k, v in os.environ.items() if k != "EQX_ON_ERROR"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "0 nan"


def test_stationary_npy_input_and_mask_file(tmp_path, capsys):
    np.save(tmp_path / "z.npy", ROWS[:2])
    np.save(tmp_path / "m.npy", np.array([1, 1, 0, 1, 1]))
    code, out, err = cli(capsys, "stationary", "--scores-file", tmp_path / "z.npy",
                         "--mask-file", tmp_path / "m.npy")
    assert code == 0, err
    w = np.array(json.loads(out)["weights"])
    keep = [0, 1, 3, 4]
    # softmax over the kept keys (float64 round-off)
    np.testing.assert_allclose(w[:, keep], scipy.special.softmax(ROWS[:2][:, keep], axis=-1),
                               rtol=1e-13)
    assert np.all(w[:, 2] == 0.0)


def test_outputs_create_missing_directories(tmp_path, capsys):
    # the path rule of every command: a missing folder is created, as `--figures-dir` does
    code, _, err = cli(capsys, "stationary", "--scores", "1,2", "--out", tmp_path / "a/b/w.csv")
    assert code == 0, err
    w = np.loadtxt(tmp_path / "a/b/w.csv", delimiter=",")
    np.testing.assert_allclose(w, scipy.special.softmax([1.0, 2.0]), rtol=1e-13)
    code, _, err = cli(capsys, "simulate", "--scores", "1,2", "--t1", "2", "--n-save", "5",
                       "--save", tmp_path / "c/traj.npz")
    assert code in (0, 1), err
    assert "time" in np.load(tmp_path / "c/traj.npz")
