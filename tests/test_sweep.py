"""`fisherdyn.sweep` / `fisherdyn sweep`: the spec, the store, resumption after SIGKILL, a
foreign spec, and two processes sharing the chunks (reference: an uninterrupted
one-process run of the same spec, compared value for value)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fisherdyn as fd
from fisherdyn._sweep import SpecError, StoreMismatch

ROOT = Path(__file__).resolve().parents[1]

SPEC = """\
families = ["shannon", "tsallis:1.5"]
T = [0.5, 1.0]
mass = [1.0]
damping = [0.5]
n_keys = [8]
scores = "gaussian"
seeds = 4
n_save = 16
"""
CHUNK = 2  # 16 problems: 8 chunks
VARS = ("t_converge", "result", "max_abs_err", "residual", "n_steps", "slowest_rate",
        "damping_ratio", "overshoot", "committed")


def _env(cache):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["FISHERDYN_CACHE"] = str(cache)  # later processes load the first one's programs
    env.pop("FISHERDYN_NO_COMPILATION_CACHE", None)
    return env


def _sweep_cmd(spec, out, *extra):
    return [sys.executable, "-m", "fisherdyn", "sweep", str(spec), "--out", str(out),
            "--chunk-size", str(CHUNK), "--no-progress", *extra]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    (root / "spec.toml").write_text(SPEC)
    return root


@pytest.fixture(scope="module")
def reference(work):
    """An uninterrupted one-process run, in this process (so that the restart after the
    kill below reuses its compiled programs)."""
    out = work / "ref.zarr"
    ds = fd.sweep(work / "spec.toml", out, chunk_size=CHUNK, progress=False)
    assert ds.attrs["summary"] == "16 problems: all successful"
    return out


def _open(path):
    import xarray as xr

    return xr.open_zarr(path)


def _assert_same(a, b):
    da, db = _open(a), _open(b)
    for name in VARS:
        np.testing.assert_array_equal(da[name].values, db[name].values, err_msg=name)
    assert da.attrs["sweep_spec"] == db.attrs["sweep_spec"]


def test_spec_validation():
    good = dict(families=["shannon"], T=[1.0], mass=[0.0], damping=[1.0], n_keys=[4], seeds=2)
    spec = fd.SweepSpec.from_dict(good)
    assert spec.n_problems == 2 and spec.shape == (1, 1, 1, 1, 1, 2)
    bad = [
        (dict(good, T=[-1.0]), "T: every value must be > 0"),
        (dict(good, mass=[-1.0]), "mass: every value must be >= 0"),
        (dict(good, damping=[0.0]), "damping: every value must be > 0"),
        (dict(good, n_keys=[1]), "n_keys: expected integers >= 2"),
        (dict(good, families=["nosuch"]), "families: 'nosuch'"),
        (dict(good, scores="uniform"), "scores: one of gaussian, cauchy, planted"),
        (dict(good, seeds=0), "seeds"),
        (dict(good, T=[1.0, 1.0]), "T: values must be distinct"),
        (dict(good, temperature=[1.0]), "unknown key(s) temperature"),
        ({k: v for k, v in good.items() if k != "n_keys"}, "missing key(s): n_keys"),
    ]
    for table, message in bad:
        with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
            fd.SweepSpec.from_dict(table)
    with pytest.raises(SpecError, match="not valid TOML"):
        fd.SweepSpec.from_toml("T = [1.0,")


def test_score_draws_are_deterministic_per_grid_point():
    spec = fd.SweepSpec.from_toml(SPEC)
    a, b = spec.scores_for(8, 3), spec.scores_for(8, 3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, spec.scores_for(8, 2))
    planted = fd.SweepSpec.from_dict(
        dict(families=["shannon"], T=[1.0], mass=[0.0], damping=[1.0], n_keys=[64], seeds=1,
             scores="planted", planted_margin=10.0))
    z = planted.scores_for(64, 0)
    assert np.sum(z > 6) == 1  # one relevant key, far above the distractors


def test_store_layout(reference, work):
    ds = _open(reference)
    assert dict(ds.sizes) == dict(family=2, T=2, mass=1, damping=1, n_keys=1, seed=4)
    assert list(ds["family"].values) == ["shannon", "tsallis:1.5"]
    for name in VARS:
        assert ds[name].dims == ("family", "T", "mass", "damping", "n_keys", "seed")
    assert np.all(ds["committed"].values == 1)
    assert np.all(ds["result"].values == 0)
    assert ds["result"].attrs["flag_meanings"].split()[0] == "successful"
    # the relaxed fixed point against fisherdyn.stationary (an independent solve)
    assert float(ds["max_abs_err"].max()) < 1e-8
    assert np.all(ds["n_steps"].values > 0) and np.all(ds["t_converge"].values > 0)
    assert np.all(ds["overshoot"].values >= 0)
    # Shannon: every stiffness is T, so the slowest rate is gamma/(2m) when underdamped
    # (gamma^2 = 0.25 < 4 m T) and the damping ratio gamma / (2 sqrt(m T))
    sh = ds.sel(family="shannon", mass=1.0, damping=0.5, n_keys=8)
    np.testing.assert_allclose(sh["slowest_rate"].values, 0.25, rtol=1e-10)
    expected = 0.5 / (2 * np.sqrt(ds["T"].values))[:, None]
    np.testing.assert_allclose(sh["damping_ratio"].values, np.broadcast_to(expected, (2, 4)),
                               rtol=1e-8)
    for key in ("sweep_spec", "sweep_spec_toml", "fisherdyn_version", "jax_version",
                "jaxlib_version", "device"):
        assert ds.attrs[key], key
    assert ds.attrs["sweep_spec_toml"] == SPEC
    assert (work / "ref.summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_after_sigkill_matches_uninterrupted(reference, work):
    import zarr

    spec, out = work / "spec.toml", work / "killed.zarr"
    proc = subprocess.Popen(_sweep_cmd(spec, out), env=_env(work / "cache"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, done = time.monotonic() + 300, 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                done = int(zarr.open_group(str(out), mode="r")["committed"][...].sum())
            except Exception:  # not created yet
                done = 0
            if done:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    group = zarr.open_group(str(out), mode="r+")
    marker = group["committed"][...]
    assert 0 < marker.sum() < marker.size, "the kill should land mid-run"
    # a chunk killed between its values and its marker: garbage values, no marker
    todo = np.argwhere(marker == 0)[0]
    idx = tuple(int(i) for i in todo)
    group["t_converge"][idx] = 12345.0
    ds = fd.sweep(spec, out, progress=False)  # the restart: the same spec and store
    assert ds.attrs["summary"] == "16 problems: all successful"
    _assert_same(out, reference)


def test_other_spec_or_chunk_size_on_a_store_is_an_error(reference, work, capsys):
    other = fd.SweepSpec.from_toml(SPEC.replace("T = [0.5, 1.0]", "T = [0.5, 2.0]"))
    with pytest.raises(StoreMismatch, match="spec differs in: T"):
        fd.sweep(other, reference, progress=False)
    with pytest.raises(StoreMismatch, match="chunk size 2, not 8"):
        fd.sweep(work / "spec.toml", reference, chunk_size=8, progress=False)
    (work / "not_a_store").mkdir()
    with pytest.raises(StoreMismatch, match="is not a fisherdyn sweep store"):
        fd.sweep(work / "spec.toml", work / "not_a_store", progress=False)
    (work / "other.toml").write_text(SPEC.replace("seeds = 4", "seeds = 5"))
    from fisherdyn._cli._main import main

    argv = ["sweep", str(work / "other.toml"), "--out", str(reference), "--no-compilation-cache"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds another sweep (spec differs in: seeds)" in err and "\n" == err[-1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # 42-69 s on two loaded cores
def test_two_processes_match_one(reference, work):
    out, port = work / "two.zarr", _free_port()
    procs = [
        subprocess.Popen(
            _sweep_cmd(work / "spec.toml", out, "--coordinator", f"127.0.0.1:{port}",
                       "--num-processes", "2", "--process-id", str(i)),
            env=_env(work / "cache"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (o, e) in zip(procs, outputs):
        assert p.returncode == 0, e
    assert "16 problems: all successful" in outputs[0][0]
    _assert_same(out, reference)


def test_dry_run_writes_nothing(reference, work, capsys):
    from fisherdyn._cli._main import main

    new = work / "dry.zarr"
    argv = ["sweep", str(work / "spec.toml"), "--out", str(new), "--chunk-size", str(CHUNK),
            "--dry-run", "--no-compilation-cache"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "16 problems in 8 chunks of <= 2 (0 committed, 8 to do; 2 compiled programs)" in out
    assert "estimated" in out and not new.exists()
    plan = fd.sweep(work / "spec.toml", reference, dry_run=True)
    assert (plan.n_chunks, plan.n_done, plan.chunk_size) == (8, 8, 2)


@pytest.mark.parametrize(
    "extra,message",
    [
        ([], "--out"),
        (["--out", "x.zarr", "--coordinator", "127.0.0.1:1234"], "--coordinator"),
        (["--out", "x.zarr", "--coordinator", "nohost", "--num-processes", "2",
          "--process-id", "0"], "--coordinator"),
        (["--out", "x.zarr", "--coordinator", "127.0.0.1:1234", "--num-processes", "2",
          "--process-id", "2"], "--process-id"),
        (["--out", "x.zarr", "--chunk-size", "0"], "--chunk-size"),
    ],
)
def test_sweep_usage_errors_exit_2(work, capsys, extra, message):
    from fisherdyn._cli._main import main

    with pytest.raises(SystemExit) as e:
        main(["sweep", str(work / "spec.toml"), *extra])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_chunk_with_as_many_problems_as_keys(tmp_path):
    """8 problems of 8 keys in one chunk: the per-problem temperatures (8,) must be read as
    one per row, not along the key axis (stationary refuses the ambiguous shape). Every
    problem relaxes, its fixed point matches `stationary` to 1e-8, and Shannon's slowest
    rate is the closed form gamma / (2m) = 0.25 of its under-damped modes."""
    spec = dict(families=["shannon"], T=[0.5, 1.0], mass=[1.0], damping=[0.5], n_keys=[8],
                seeds=4)
    ds = fd.sweep(spec, tmp_path / "s.zarr", chunk_size=8, progress=False, figure=False)
    assert np.all(ds["result"].values == 0)
    assert float(ds["max_abs_err"].max()) < 1e-8
    np.testing.assert_allclose(ds["slowest_rate"].values, 0.25, rtol=1e-10)
