"""The files in `examples/` run, and the README and the guides show what they hold.

Each script runs as a user runs it (`python examples/NAME.py`, a new process); the README's
and the attention guide's code blocks must appear verbatim in the matching script, so the
documentation and the files cannot drift apart; the CLI inputs (the sweep spec, the score
files) go through `fisherdyn._cli.main` with outputs in a temporary directory; and every
`examples/...` path the README or the documentation names exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.special

from fisherdyn._cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# script -> (document, the heading whose first python block it holds)
SCRIPTS = {
    "operators.py": ("README.md", "## Operators"),
    "relaxation.py": ("README.md", "## Dynamics"),
    "attention.py": ("README.md", "## Attention"),
    "attention_model.py": ("docs/guides/attention.md", "## Inside an Equinox module"),
}


def first_python_block(document: str, heading: str) -> str:
    text = (ROOT / document).read_text()
    section = text[text.index(heading + "\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_documented_block_is_the_script(script):
    document, heading = SCRIPTS[script]
    assert first_python_block(document, heading) in (EXAMPLES / script).read_text(), (
        f"the code under {heading!r} in {document} differs from examples/{script}"
    )


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_runs(script, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    # these programs run once: XLA's backend optimizations cost more than they save
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0"
    run = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() and "Traceback" not in run.stderr


def test_every_examples_path_in_the_docs_exists():
    named = set()
    for doc in DOCS:
        named |= {m for m in re.findall(r"examples/[\w./-]*\w", doc.read_text())}
    assert "examples/grid.toml" in named  # the README's sweep
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"named in the documentation but absent: {missing}"


def test_every_example_is_named_in_the_docs():
    text = "".join(doc.read_text() for doc in DOCS)
    unnamed = [p.name for p in EXAMPLES.iterdir() if f"examples/{p.name}" not in text]
    assert not unnamed, f"examples no document names: {unnamed}"


def test_grid_spec_is_valid_and_small():
    import fisherdyn as fd

    spec = fd.SweepSpec.from_toml((EXAMPLES / "grid.toml").read_text())
    assert spec.n_problems == 64  # as its comment says


@pytest.mark.slow
def test_grid_spec_sweeps(tmp_path, capsys):
    xr = pytest.importorskip("xarray")
    store = tmp_path / "grid.zarr"
    code = main(["sweep", str(EXAMPLES / "grid.toml"), "--out", str(store), "--no-progress",
                 "--no-figure"])
    assert code == 0, capsys.readouterr().err
    ds = xr.open_zarr(store)
    assert int(ds.committed.sum()) == 64 and int((ds.result == 0).sum()) == 64
    # relax's polished fixed points against the operator (relax's documented accuracy)
    assert float(ds.max_abs_err.max()) < 1e-8


def test_score_files_through_the_cli(tmp_path, capsys):
    out = tmp_path / "w.csv"
    code = main(["stationary", "--scores-file", str(EXAMPLES / "score_rows.csv"), "--T", "0.8",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = np.loadtxt(EXAMPLES / "score_rows.csv", delimiter=",", ndmin=2)
    # Shannon's weights are softmax(z / T) (float64 round-off)
    np.testing.assert_allclose(np.loadtxt(out, delimiter=",", ndmin=2),
                               scipy.special.softmax(rows / 0.8, axis=-1), rtol=1e-13)
    capsys.readouterr()
    code = main(["stationary", "--scores-file", str(EXAMPLES / "scores.csv")])
    got = json.loads(capsys.readouterr().out)["weights"]
    z = np.loadtxt(EXAMPLES / "scores.csv", delimiter=",")
    assert code == 0
    np.testing.assert_allclose(got, scipy.special.softmax(z), rtol=1e-13)
