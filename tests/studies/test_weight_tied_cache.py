"""The weight-tied study's packaging: where trained weights are cached, and that
importing the study's package does not import optax until training is asked for."""

import os
import pathlib
import subprocess
import sys
import textwrap

import platformdirs
import weight_tied as wt

import fisherdyn as fd

TINY = wt.LoopedConfig(n_pairs=3, dim=4, corrupt=0.25, d_model=8, n_heads=2, d_mlp=8,
                       n_loops=2, step=1.0)
RECIPE = dict(seed=0, steps=2, batch=4, eval_batch=8, progress=False)
PACKAGE = pathlib.Path(fd.__file__).resolve().parent
STUDIES = pathlib.Path(wt.__file__).resolve().parents[1]


def test_default_cache_dir_is_the_user_cache(monkeypatch):
    # Reference: platformdirs' user cache directory, and never a path inside the package.
    monkeypatch.delenv("FISHERDYN_CACHE", raising=False)
    path = wt.default_cache_dir()
    assert path == pathlib.Path(platformdirs.user_cache_dir("fisherdyn"))
    assert PACKAGE not in path.resolve().parents and path.resolve() != PACKAGE


def test_cache_env_variable_overrides(monkeypatch, tmp_path):
    target = tmp_path / "weights"
    monkeypatch.setenv("FISHERDYN_CACHE", str(target))
    assert wt.default_cache_dir() == target
    assert not target.exists()  # resolving the directory creates nothing
    trained = wt.train_looped(TINY, **RECIPE)
    assert not trained.from_cache
    assert pathlib.Path(trained.path).parent == target
    # the weights and their metadata, and no temporary file left behind
    names = sorted(p.suffix for p in target.iterdir())
    assert names == [".eqx", ".json"]
    again = wt.train_looped(TINY, **RECIPE)
    assert again.from_cache and again.path == trained.path


def test_subpackage_imports_optax_only_for_training():
    # The study's package is imported in a fresh interpreter, from the folder of the studies.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(STUDIES)!r})
        import fisherdyn as fd
        import weight_tied as wt
        assert "optax" not in sys.modules, "optax imported by weight_tied"
        wt.LoopedConfig, fd.fit_path, wt.extract_paths, wt.default_cache_dir
        assert "optax" not in sys.modules
        assert "train_looped" in dir(wt)
        wt.train_looped
        assert "optax" in sys.modules
    """)
    subprocess.run([sys.executable, "-c", script], check=True)


def test_suite_keeps_the_user_cache_clean():
    """tests/conftest.py points FISHERDYN_CACHE (the weight cache of `train_looped`, which the
    studies the suite runs use) at a directory of the run, so the suite leaves no trained
    model in the user cache directory."""
    cache = pathlib.Path(os.environ["FISHERDYN_CACHE"]).resolve()
    assert wt.default_cache_dir().resolve() == cache
    user = pathlib.Path(platformdirs.user_cache_dir("fisherdyn")).resolve()
    assert not cache.is_relative_to(user)


def test_study_results_cache_keys_and_roundtrip(monkeypatch, tmp_path):
    """A model's measured results are cached under a key that changes with the seed, the
    settings and the code (the sources are hashed), and read back as written."""
    import numpy as np
    from weight_tied import cache, study

    monkeypatch.setenv("FISHERDYN_CACHE", str(tmp_path))
    S = study.QUICK
    g = study.groups(fd, S)[0]
    p0 = study.result_file(fd, S, g, 0, True)
    assert p0.parent == tmp_path / "weight_tied_results"
    assert study.result_file(fd, S, g, 0, True) == p0  # deterministic
    assert study.result_file(fd, S, g, 1, True) != p0
    assert study.result_file(fd, dict(S, problems=S["problems"] + 2), g, 0, True) != p0
    # which groups run does not change one group's results
    assert study.result_file(fd, dict(S, seeds=S["seeds"] + 1), g, 0, True) == p0
    other = study.groups(fd, S)[1]
    assert study.result_file(fd, S, other, 0, True) != p0
    # a change of the code: the digest of a package's sources moves with one byte
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    mod = type(sys)("pkg")
    mod.__file__ = str(pkg / "__init__.py")
    d1 = cache.source_digest(mod)
    (pkg / "__init__.py").write_text("x = 2\n")
    assert cache.source_digest(mod) != d1
    # the round trip, and a missing or broken file reads as a miss
    result = dict(accuracy=0.5, paths=np.arange(6.0).reshape(2, 3), nested=dict(a=[1, None]))
    cache.save_result(p0, result)
    back = cache.load_result(p0)
    assert back["accuracy"] == 0.5 and back["nested"] == result["nested"]
    np.testing.assert_array_equal(back["paths"], result["paths"])
    assert [q.name for q in p0.parent.iterdir()] == [p0.name]  # no temporary file left
    p0.write_bytes(b"not a pickle")
    assert cache.load_result(p0) is None
    assert cache.load_result(tmp_path / "missing.pkl") is None
    monkeypatch.setenv("FISHERDYN_STUDY_CACHE", "0")
    assert study.result_file(fd, S, g, 0, True) is None


def test_seeds_option_is_checked_before_any_model_runs(tmp_path, capsys):
    """`--seeds` sets the models per group; fewer than two (a group's criteria need two)
    stops with a message before anything is trained."""
    import pytest
    from weight_tied import study

    with pytest.raises(SystemExit, match="at least 2"):
        study.main(["--quick", "--seeds", "1", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())
    assert study.FULL["seeds"] >= 8  # the full study's replication (exact sign tests 2^-8)
