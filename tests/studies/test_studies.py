"""The study scripts (`studies/*.py`) and `studies/run_all.py`.

- Every study runs in `--quick` mode, through `studies/run_all.py --quick --out DIR` (the same
  code path as `make figures`), and writes a PNG and a JSON. Each study compares its
  measurements with theory (closed forms of docs/math.md, scipy reference solves, finite
  differences, the predicted relaxation spectrum; the reference is named beside each value
  in the JSON's `comparisons`): in quick mode every check must agree (no `disagreements`).
- Every study JSON carries a `provenance` block (fisherdyn, JAX, jaxlib versions, device,
  precision) and no timings, so that a rerun on one setup writes the same bytes.
- The committed `figures/<study>.json` are full-mode outputs, and every number the README
  gallery quotes (`headline` of each JSON, quoted verbatim) appears in the gallery text
  (`notes/gallery.md`, and README.md once it carries the gallery section).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the paper's argument, in order (`studies/run_all.py --help` lists the same names)
STUDIES = ("stationary_laws", "tails", "tangent_test", "abe_even_order", "renyi_temperature",
           "relaxation", "entropy_invariance", "weight_tied")
PNG = b"\x89PNG\r\n\x1a\n"


def run_all(*args):
    """`python studies/run_all.py ARGS` with this interpreter, in a subprocess, under the
    XLA flags `make figures` would see (not the suite's compile-time ones, conftest.py)."""
    env = dict(os.environ, XLA_FLAGS=os.environ.get("FISHERDYN_TEST_CALLER_XLA_FLAGS", ""))
    return subprocess.run([sys.executable, str(ROOT / "studies" / "run_all.py"), *map(str, args)],
                          capture_output=True, text=True, env=env)


# The studies whose quick runs the default suite checks; the others (the slowest four, the
# weight-tied study's tables, and `run_all.py` over all eight) run with -m slow. The
# weight-tied study's parts are tested by the default suite in tests/studies/test_weight_tied_*.
DEFAULT_STUDIES = ("stationary_laws", "tails", "tangent_test", "entropy_invariance")


def _studies_needed(items):
    """The studies the selected tests of this module read from `quick_run`."""
    names = set()
    for item in items:
        if item.module is None or item.module.__name__ != __name__:
            continue
        if item.originalname == "test_run_all_succeeds":
            return list(STUDIES)
        if item.originalname == "test_quick_study":
            names.add(item.callspec.params["name"])
        elif item.originalname == "test_quick_json_is_byte_reproducible":
            names.add("entropy_invariance")
        elif item.originalname == "test_weight_tied_quick_tables":
            names.add("weight_tied")
    return [n for n in STUDIES if n in names]


@pytest.fixture(scope="module")
def quick_run(request, tmp_path_factory):
    """The studies the selected tests need (all eight with -m slow) in quick mode, via
    `studies/run_all.py` (studies as subprocesses, two at a time)."""
    out = tmp_path_factory.mktemp("figures")
    names = _studies_needed(request.session.items) or list(DEFAULT_STUDIES)
    only = [a for n in names for a in ("--only", n)] if len(names) < len(STUDIES) else []
    proc = run_all("--quick", *only, "--out", out, "--jobs", "2")
    return proc, out, names


@pytest.mark.slow
def test_run_all_succeeds(quick_run):
    proc, out, names = quick_run
    assert names == list(STUDIES)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    images = [img for n in STUDIES
              for img in json.loads((out / f"{n}.json").read_text())["images"]]
    assert sorted(p.name for p in out.glob("*.png")) == sorted(images)


@pytest.mark.parametrize(
    "name", [n if n in DEFAULT_STUDIES else pytest.param(n, marks=pytest.mark.slow)
             for n in STUDIES],
)
def test_quick_study(quick_run, name):
    proc, out, _ = quick_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads((out / f"{name}.json").read_text())
    for img in data["images"]:
        assert (out / img).read_bytes()[:8] == PNG
    assert data["study"] == name and data["quick"] is True
    assert data["title"] and data["caption"] and data["headline"]
    checks = [r for r in data["comparisons"] if r["kind"] != "note"]
    assert checks, "a study must compare at least one measurement with theory"
    bad = [f"{r['key']}: measured {r['measured']}, predicted {r['predicted']} (tol {r['tol']})"
           for r in checks if not r["ok"]]
    assert not bad, "quick-mode disagreement(s) with theory:\n" + "\n".join(bad)
    assert data["disagreements"] == 0
    assert_provenance(data)
    # the quick run produces (a subset of) the headline numbers the full run quotes
    committed = ROOT / "figures" / f"{name}.json"
    if committed.is_file():
        assert set(data["headline"]) <= set(json.loads(committed.read_text())["headline"])


PROVENANCE = ("fisherdyn", "jax", "jaxlib", "numpy", "python", "platform", "device_kind",
              "device_count", "jax_enable_x64", "dtype")


def assert_provenance(data):
    """The JSON says where it was computed (versions, device, precision) and carries no
    wall-clock times."""
    import importlib.metadata

    import jax

    prov = data["provenance"]
    assert set(prov) == set(PROVENANCE)
    assert prov["jax"] == jax.__version__
    assert prov["jaxlib"] == importlib.metadata.version("jaxlib")
    assert prov["fisherdyn"]
    assert prov["platform"] and prov["device_kind"] and prov["device_count"] >= 1
    # the studies verify in float64
    assert prov["jax_enable_x64"] is True and prov["dtype"] == "float64"
    text = json.dumps(data)
    assert '"seconds' not in text and '_seconds"' not in text


def test_quick_json_is_byte_reproducible(quick_run, tmp_path):
    """A second quick run of the cheapest study writes the same JSON bytes (no timestamps,
    no timings)."""
    _, out, _ = quick_run
    proc = run_all("--quick", "--only", "entropy_invariance", "--out", tmp_path, "--jobs", "1")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    name = "entropy_invariance.json"
    assert (tmp_path / name).read_bytes() == (out / name).read_bytes()


def _gallery_texts():
    # the README shows a small selection; notes/gallery.md is the full generated gallery
    return {"notes/gallery.md": (ROOT / "notes" / "gallery.md").read_text()}


def test_readme_figures_exist():
    """Every figure the README shows is a committed study output."""
    import re

    shown = re.findall(r"\(figures/([\w.]+\.png)\)", (ROOT / "README.md").read_text())
    assert shown
    for img in shown:
        assert (ROOT / "figures" / img).read_bytes()[:8] == PNG, img


@pytest.mark.parametrize("name", STUDIES)
def test_committed_figure_matches_gallery(name):
    """The committed JSON is a full-mode run, and the gallery quotes its numbers verbatim."""
    data = json.loads((ROOT / "figures" / f"{name}.json").read_text())
    assert data["quick"] is False
    images = data.get("images", [f"{name}.png"])  # older JSON: one image named after the study
    for img in images:
        assert (ROOT / "figures" / img).read_bytes()[:8] == PNG
    for where, text in _gallery_texts().items():
        for img in images:
            assert f"figures/{img}" in text, f"{where} does not show figures/{img}"
        assert data["caption"] in text, f"{where} lacks the caption of {name}"
        for key, quoted in data["headline"].items():
            assert quoted in text, f"{where} does not quote {name}.{key}: {quoted!r}"


def test_gallery_is_generated_from_the_json():
    """`studies/run_all.py --gallery` reproduces the committed gallery section."""
    proc = run_all("--gallery", "--out", ROOT / "figures")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in (ROOT / "notes" / "gallery.md").read_text()


def test_help_lists_every_study():
    proc = run_all("--help")
    assert proc.returncode == 0
    for option in ("--quick", "--only", "--out", "--jobs", "--gallery"):
        assert option in proc.stdout
    for name in STUDIES:
        assert name in proc.stdout


def test_unknown_study_is_refused():
    proc = run_all("--only", "nonexistent")
    assert proc.returncode == 2
    assert "--only" in proc.stderr


@pytest.mark.slow
def test_weight_tied_quick_tables(quick_run):
    """The weight-tied study writes what it promises: per group (normalizers, the positive
    control, the dose group, two negative controls) every criterion of the protocol with an
    interval over its seeds or, where it has none, NOT EVALUABLE with its reason (never an error of 1); a
    decision read from that interval by the protocol's criteria; each seed's preconditions
    with numbers; and an answer from the admissible criteria only (a family with none is
    UNTESTABLE). The JSON records the protocol's version and hash. (Runs inside
    `quick_run`; its time is printed by `studies/run_all.py`.)"""
    import weight_tied as wt
    from weight_tied import protocol as wp

    _, out, _ = quick_run
    data = json.loads((out / "weight_tied.json").read_text())["data"]
    assert data["protocol_version"] == wp.PROTOCOL_VERSION
    assert data["protocol_sha256"] == wp.protocol_hash()
    roles = [g["role"] for g in data["groups"]]
    assert roles.count("positive") == 1 and roles.count("negative") == 2 and "normalizer" in roles
    assert roles.count("dose") == 1
    crit = {c.name: c for c in wp.PROTOCOL_CRITERIA}
    for g in data["groups"]:
        assert len(g["accuracy"]) == data["settings"]["seeds"] >= 2
        assert set(g["intervals"]) == set(crit)
        for name, iv in g["intervals"].items():
            if iv is None:
                assert g["decisions"][name] == wp.NOT_EVALUABLE and g["not_evaluable"][name]
                continue
            assert iv["units"] == data["settings"]["seeds"]
            # JSON has no infinity: an infinite ratio (step-independent paths) reads null
            lo, est, hi = (float("inf") if iv[k] is None else iv[k]
                           for k in ("low", "estimate", "high"))
            assert lo <= est <= hi
            if g["not_evaluable"].get(name, "").startswith("dose rule"):
                assert g["decisions"][name] == wp.NOT_EVALUABLE
                continue
            assert g["decisions"][name] == crit[name].decide(wt.Interval(
                est, lo, hi, iv["level"], iv["units"], [0.0]))
        for pre in g["preconditions"]:
            assert set(pre["values"]) == {"accuracy", "spectral_radius", "endpoint_distance",
                                          "depth_ratio"}
            # quick mode trains 40 steps: no model reaches the accuracy precondition
            assert any(f.startswith("accuracy") for f in pre["failed"])
        family = g["entropy"].split("(")[0]
        if not wp.ADMISSIBLE.get(family):
            assert g["overall"] == wp.UNTESTABLE
        else:
            assert g["overall"] == wp.NOT_EVALUABLE
        # every protocol version answers from the same measurements, by its own table
        assert set(g["answer_by_protocol"]) == set(wp.PROTOCOLS)
        for ver, p in wp.PROTOCOLS.items():
            want = wp.UNTESTABLE if not p["admissible"].get(family) else wp.NOT_EVALUABLE
            assert g["answer_by_protocol"][ver]["answer"] == want
    assert data["protocol_versions"] == {v: wp.protocol_hash(p) for v, p in wp.PROTOCOLS.items()}


def test_ledger_bounds_decide_as_stated():
    """The studies' ledger: each kind of check agrees exactly where its rule says (values
    on both sides of each bound), and a non-finite measurement never agrees."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_common", ROOT / "studies" / "_common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    led = common.Ledger("t")
    assert led.check("abs in", 1.05, 1.0, tol=0.1) and not led.check("abs out", 1.2, 1.0, tol=0.1)
    assert led.check("rel in", 2.1, 2.0, tol=0.1, kind="rel")
    assert not led.check("rel out", 2.3, 2.0, tol=0.1, kind="rel")
    assert led.check("max in", 0.05, 0.0, tol=0.1, kind="max")
    assert not led.check("max out", 0.15, 0.0, tol=0.1, kind="max")
    assert led.check("min in", 0.15, 0.1, tol=0.1, kind="min")
    assert not led.check("min out", 0.05, 0.1, tol=0.1, kind="min")
    assert not led.check("min nan", float("nan"), 0.1, tol=0.1, kind="min")
    assert [r["key"] for r in led.disagreements] == ["abs out", "rel out", "max out", "min out",
                                                     "min nan"]
