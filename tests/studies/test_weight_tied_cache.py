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
