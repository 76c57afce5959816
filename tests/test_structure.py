"""The package's layout rules, read from the source with `ast` (no module is imported except
where a test says so): one export list, one registry of families in the shared test battery,
docs/architecture.md listing every module, the import rules it states, no function above
100 lines, no measured numbers in comments.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest

import fisherdyn as fd
from helpers import (
    DYNAMICS_FAMILIES,
    EXPORTED_FAMILIES,
    ONE_PER_CLASS,
    SOLVE_FAMILIES,
    SPECS,
    RefFamily,
    make,
)
from test_extras import OPTIONAL, _hidden_run

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "fisherdyn"
MODULES = sorted(PKG.rglob("*.py"))
# the stages of the data flow, in order; a subpackage imports only earlier ones
STAGES = ("_entropies", "_stationary", "_dynamics", ("_attention", "_analysis", "_paths"),
          "_sweep", "_cli")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _exports_literal() -> dict[str, tuple[str, ...]]:
    """`_EXPORTS` of fisherdyn/__init__.py, read as a literal."""
    for node in _tree(PKG / "__init__.py").body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "_EXPORTS":  # type: ignore[attr-defined]
            return ast.literal_eval(node.value)
    raise AssertionError("no _EXPORTS in fisherdyn/__init__.py")


# --------------------------------------------------------------------------- one export list


def test_type_checking_block_and_all_match_the_export_list():
    """`__all__` is `_EXPORTS` and the registered families; the `TYPE_CHECKING` block imports
    every name of `_EXPORTS` from its subpackage, and may leave out a family (whose static
    type is then `Any`), nothing else."""
    exports = _exports_literal()
    block = next(n for n in _tree(PKG / "__init__.py").body
                 if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for a in node.names:
            assert a.asname == a.name, f"{a.name} must be re-exported as itself"
            assert a.name not in seen, f"{a.name} imported twice"
            seen[a.name] = node.module  # type: ignore[assignment]
    flat = {n: module for module, names in exports.items() for n in names}
    assert len(flat) == sum(map(len, exports.values())), "a name exported twice"
    runtime = fd._exports()
    assert fd.__all__ == list(runtime)
    assert {n: runtime.get(n) for n in seen} == seen, "the block and the exports disagree"
    assert set(flat) <= set(seen), f"{set(flat) - set(seen)} missing from TYPE_CHECKING"
    assert {n: runtime[n] for n in flat} == flat
    families = {c.__name__ for c in EXPORTED_FAMILIES}
    assert set(runtime) - set(flat) == families
    assert set(runtime) - set(seen) <= families


def test_every_exported_name_is_exported_by_its_subpackage():
    for module, names in _exports_literal().items():
        init = PKG / module / "__init__.py"
        path = init if init.exists() else PKG / f"{module}.py"
        defined = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom):
                defined |= {a.asname or a.name for a in node.names}
            elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        assert set(names) <= defined, (module, set(names) - defined)


def test_every_public_name_imports_with_the_optional_packages_hidden():
    code = ("import fisherdyn as fd\n"
            "missing = [n for n in fd.__all__ if getattr(fd, n, None) is None]\n"
            "print(len(fd.__all__), missing)\n")
    proc = _hidden_run(code, OPTIONAL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "[]" and int(proc.stdout.split()[0]) == len(fd.__all__)


# --------------------------------------------------------------------------- one registry


def test_every_exported_family_is_registered_and_in_the_shared_battery():
    from fisherdyn._entropies import families

    assert len(EXPORTED_FAMILIES) >= 7  # the families this test was written against
    assert set(families()) == set(EXPORTED_FAMILIES)
    battery = {
        "SPECS": {type(make(s)) for s in SPECS},
        "ONE_PER_CLASS": {type(make(s)) for s in ONE_PER_CLASS},
        "SOLVE_FAMILIES": {type(e) for e in SOLVE_FAMILIES.values()},
        "DYNAMICS_FAMILIES": {type(e) for e in DYNAMICS_FAMILIES},
    }
    for cls in EXPORTED_FAMILIES:
        for name, classes in battery.items():
            assert cls in classes, (f"{cls.__name__} is missing from {name}: give it a "
                                    "RefFamily subclass with a battery entry in tests/helpers.py")
        spec = next(s for s in SPECS if type(make(s)) is cls)
        RefFamily(spec).S([0.25, 0.75])  # the mpmath reference knows the family
    labels = [label for label, _ in fd.operator_table.__globals__["DEFAULT_FAMILIES"]]
    assert len(labels) == len(EXPORTED_FAMILIES) == len(set(labels))


# A family added to the library: its own file in fisherdyn/_entropies/ and nothing else.
_TOY_FAMILY = '''
from typing import ClassVar

import jax
import jax.numpy as jnp

from .._misc import softplus_inverse
from ._base import AbstractSeparableEntropy


class Toy(AbstractSeparableEntropy):
    """Shannon scaled by c > 0, S = -c sum(rho ln rho): softmax at temperature cT."""

    c: float
    parse_names: ClassVar[tuple[str, ...]] = ("toy",)
    parse_defaults: ClassVar[tuple[float, ...]] = (1.0,)

    @classmethod
    def shape_chart(cls):
        return jax.nn.softplus, softplus_inverse

    def G(self, x):
        return self.c * (1.0 + jnp.log(x))

    def G_prime(self, x):
        return self.c / x

    def G1(self):
        return self.c

    def inverse_shifted(self, y):
        x = jnp.exp(y / self.c)
        return x, x / self.c

    def terms(self, rho):
        safe = jnp.where(rho > 0, rho, 1.0)
        return jnp.where(rho > 0, -self.c * rho * jnp.log(safe), 0.0)
'''

_TOY_CHECKS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import jax
jax.config.update("jax_enable_x64", True)
import fisherdyn as fd
from fisherdyn._cli._options import entropy_arg
from fisherdyn._entropies import default_entropies
from fisherdyn._paths._charts import FAMILIES, family_of

assert fd.__file__.startswith(sys.argv[1]), fd.__file__
i, shape = family_of(fd.Toy(2.0))
print(json.dumps(dict(
    exported=fd.Toy.__module__, in_all="Toy" in fd.__all__, in_dir="Toy" in dir(fd),
    parsed=repr(fd.parse_entropy("toy:0.5")), cli=repr(entropy_arg("toy")),
    run=[repr(e) for e in default_entropies(examples=True)][-1],
    table=[label for label, _ in fd.operator_table.__globals__["DEFAULT_FAMILIES"]][-1],
    fit=[fd.fit_families, FAMILIES[i].shape_name,
         float(FAMILIES[i].value(FAMILIES[i].chart(shape)))],
    rho=fd.stationary(fd.Toy(2.5), jax.numpy.asarray([1.3, -0.4, 0.8, 2.1]), 0.7).tolist(),
)))
"""


def test_a_family_added_to_the_library_is_its_file_alone(tmp_path):
    """A copy of the package with one more file, `_entropies/_toy.py`, in a fresh interpreter:
    the family is exported, parsed, run by the command line, in the operator table, fit by
    `fit_path`, and `stationary` solves it (reference: scipy's softmax at temperature cT, to
    1e-14: the generic separable solve's round-off, a few ulps of weights below 1)."""
    import shutil
    import subprocess
    import sys

    import scipy.special

    shutil.copytree(PKG, tmp_path / "fisherdyn", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "fisherdyn" / "_entropies" / "_toy.py").write_text(_TOY_FAMILY)
    proc = subprocess.run([sys.executable, "-c", _TOY_CHECKS, str(tmp_path)], timeout=300,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["exported"] == "fisherdyn._entropies._toy"
    assert out["in_all"] and out["in_dir"]
    assert out["parsed"] == "Toy(c=0.5)" and out["cli"] == "Toy(c=1.0)"
    assert out["run"] == "Toy(c=1.0)" and out["table"] == "Toy c=1"
    assert "Toy" in out["fit"][0] and out["fit"][1:] == ["c", pytest.approx(2.0, rel=1e-14)]
    reference = scipy.special.softmax(np.array([1.3, -0.4, 0.8, 2.1]) / (2.5 * 0.7))
    np.testing.assert_allclose(out["rho"], reference, rtol=0, atol=1e-14)


# --------------------------------------------------------------------------- architecture page


def test_architecture_page_lists_every_module():
    """A module is listed by its path, or by its file name in a row whose first path is in
    the same folder, or by a pattern (`_entropies/_<family>.py`: any module of the folder
    that defines a family); a subpackage's __init__.py only re-exports and needs no row."""
    listed: set[str] = set()
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        names = re.findall(r"`([^`]+)`", line.split("|")[1])
        folder = names[0].rsplit("/", 1)[0]
        listed |= {n if "/" in n else f"{folder}/{n}" for n in names}
    patterns = [re.compile(re.sub(r"<\w+>", r"\\w+", re.escape(n).replace(r"\<", "<")
                                  .replace(r"\>", ">")) + "$") for n in listed if "<" in n]
    families = {f"fisherdyn/_entropies/{c.__module__.rsplit('.', 1)[1]}.py"
                for c in EXPORTED_FAMILIES}
    missing = [str(p.relative_to(ROOT)) for p in MODULES
               if str(p.relative_to(ROOT)) not in listed
               and not (str(p.relative_to(ROOT)) in families
                        and any(r.match(str(p.relative_to(ROOT))) for r in patterns))
               and not (p.name == "__init__.py" and p.parent != PKG)]
    assert not missing, f"docs/architecture.md does not list {missing}"


# --------------------------------------------------------------------------- import rules


def _imports(path: Path, package: str | None):
    """(line, absolute module parts) of every `from ... import` of a fisherdyn module."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") if node.module else []
            if node.level:
                here = list(path.relative_to(ROOT).parent.parts)
                parts = here[: len(here) - node.level + 1] + parts
            if parts and parts[0] == "fisherdyn":
                yield node.lineno, parts[1:], [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "fisherdyn":
                    yield node.lineno, a.name.split(".")[1:], []


def _stage(sub: str) -> int | None:
    for i, s in enumerate(STAGES):
        if sub == s or sub in s:
            return i
    return None


def test_no_module_imports_another_subpackages_private_module():
    bad = []
    for path in MODULES:
        rel = path.relative_to(PKG).parts
        own = rel[0] if len(rel) > 1 else None
        for line, parts, _ in _imports(path, own or "fisherdyn"):
            if len(parts) >= 2 and parts[0] != own and parts[1].startswith("_"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports fisherdyn.{'.'.join(parts)}")
    assert not bad, "\n".join(bad)


def test_data_flows_one_way():
    bad = []
    for path in MODULES:
        rel = path.relative_to(PKG).parts
        here = _stage(rel[0]) if len(rel) > 1 else None
        for line, parts, _ in _imports(path, "fisherdyn"):
            there = _stage(parts[0]) if parts else None
            if here is not None and there is not None and there > here:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports the later fisherdyn.{parts[0]}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", ["studies", "examples", "benchmarks"])
def test_scripts_use_public_names(folder):
    """Studies and examples import no private name; a benchmark may time a subpackage's
    internals but imports no private module."""
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, parts, names in _imports(path, None):
            modules = [p for p in parts if p.startswith("_")]
            private = modules + [n for n in names if n.startswith("_")]
            if (len(modules) > 1) if folder == "benchmarks" else private:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports fisherdyn.{'.'.join(parts)}")
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------- dispatch on classes

_CHART_NAMES = {"sphere", "simplex"}


def _flag_branches(path: Path, source: str) -> list[str]:
    """Where a module reads an entropy's `separable` flag (outside fisherdyn/_entropies) or
    compares a chart by its name (with a chart-name string, or `coords.name` / `chart.name`)."""
    rel = path.relative_to(ROOT)
    in_entropies = "_entropies" in rel.parts
    bad = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not in_entropies and (
            (isinstance(node, ast.Attribute) and node.attr == "separable")
            or (isinstance(node, ast.Constant) and node.value == "separable")
        ):
            bad.append(f"{rel}:{node.lineno} reads `separable`")
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            strings = {o.value for o in operands if isinstance(o, ast.Constant)}
            chart_name = any(
                isinstance(o, ast.Attribute) and o.attr == "name"
                and re.search(r"coord|chart", ast.unparse(o.value), re.I)
                for o in operands
            )
            if strings & _CHART_NAMES or chart_name:
                bad.append(f"{rel}:{node.lineno} branches on a chart's name")
    return bad


def test_behaviour_is_on_the_classes_not_on_a_flag_or_a_name():
    """What differs between separable and Tsallis-shaped entropies is a method of their base
    or a solver dispatched on the base class; a chart carries its boundary behaviour."""
    bad = [b for path in MODULES for b in _flag_branches(path, path.read_text())]
    assert not bad, "\n".join(bad)


def test_scripts_do_not_read_the_separable_flag():
    """The studies, benchmarks and examples ask the class (`isinstance(e,
    fd.AbstractSeparableEntropy)`): entropies have no `separable` attribute, so a
    `getattr(e, "separable", False)` would silently say no for every family."""
    scripts = [p for d in ("studies", "benchmarks", "examples") for p in (ROOT / d).rglob("*.py")]
    bad = [b for path in scripts for b in _flag_branches(path, path.read_text())
           if "separable" in b]
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------- readable code


def test_no_function_above_100_lines():
    sizes = sorted(
        ((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.name}")
         for path in MODULES for node in ast.walk(_tree(path))
         if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))),
        reverse=True,
    )
    assert sizes[0][0] <= 100, sizes[:3]


# a number with a unit of time or a percentage: what a measurement writes
_MEASURED = re.compile(r"\d\s*(s|ms|us|µs|ns|%|seconds?|minutes?)(\b|\))|\d\s*x (faster|slower)",
                       re.I)


@pytest.mark.parametrize("folder", ["fisherdyn", "studies"])
def test_no_measured_numbers_in_comments(folder):
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type == tokenize.COMMENT and _MEASURED.search(tok.string):
                bad.append(f"{path.relative_to(ROOT)}:{tok.start[0]}: {tok.string}")
    assert not bad, "\n".join(bad)
