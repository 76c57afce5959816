"""One signature convention for every exported function, checked on `fisherdyn.__all__`.

The rule, by kind of function (each exported function is listed under exactly one kind):

- operators, dynamics and analysis of one family: `(entropy, scores, T, *, options)`;
  without scores (the family's own ramp) `(entropy, T, *, ...)`; for the Abe expansion,
  whose family is fixed, `(scores, T, *, ...)`.
- a function evaluated at a point of the simplex (a free energy, a loss) or at a state of
  the dynamics (a step): that point or state right after the scores,
  `(entropy, scores, point, T, *, options)`.
- a fit to measured data: the measurement in the place of the point, and no T, which is
  fitted: `(entropy, scores, path, *, options)`.
- attention: `(q, k, v, *, entropy, T, mask, bias)`, `(q, k, *, ...)` for the weights.
- the `entmax` package's names: the scores, then the target (losses), then the family
  parameter `alpha`, as that package orders them: `(scores, [target], [alpha], *, axis,
  mask)`.
- everything else takes its data positionally (named below) and its options by keyword.

In every kind: the leading parameters are exactly those named, positional-or-keyword, in
that order; every later parameter is keyword-only; every parameter and the return carry an
annotation. Classes are not walked: an Equinox module's `__init__` is its field list.
"""

from __future__ import annotations

import inspect

import pytest

import fisherdyn as fd

OPERATOR = ("entropy", "scores", "T")

# kind -> {function name: its leading (positional) parameters}
LEADING = {
    "operator": {
        name: OPERATOR
        for name in (
            "stationary",
            "stationary_info",
            "stationary_jacobian",
            "stationary_branches",
            "solve_stationary",
            "simulate",
            "relax",
            "relaxation_spectrum",
            "fisher_score_dynamics",
            "linear_score_dynamics",
        )
    },
    "family without scores": {
        "measure_tail": ("entropy", "T"),
        "flax_attention_fn": ("entropy", "T"),
    },
    "fixed family (Abe)": {
        "abe_expansion": ("scores", "T"),
        "abe_series": ("scores", "T"),
    },
    "at a point": {
        "free_energy": ("entropy", "scores", "rho", "T"),
        "fenchel_young_loss": ("entropy", "scores", "target", "T"),
        "fisher_loop_step": ("entropy", "scores", "state", "T"),
    },
    "fit": {
        "fit_path": ("entropy", "scores", "path"),
    },
    "attention": {
        "attention": ("q", "k", "v"),
        "attention_weights": ("q", "k"),
    },
    "entmax names": {
        "sparsemax": ("scores",),
        "entmax15": ("scores",),
        "entmax": ("scores", "alpha"),
        "sparsemax_loss": ("scores", "target"),
        "entmax15_loss": ("scores", "target"),
        "entmax_loss": ("scores", "target", "alpha"),
    },
    "other": {
        "tangent_test": ("entropy_a", "entropy_b", "rho"),  # two families at one point
        "fit_tail": ("scores", "weights"),  # measured weights at their scores
        "envelope_rate": ("ts", "distance"),  # a time series
        "fisher_rao_distance": ("p", "q"),  # two points of the simplex
        "geodesic_interpolation": ("p", "q", "s"),  # ... and the position between them
        "operator_table": (),
        "format_operator_table": ("rows",),
        "parse_entropy": ("spec",),
        "result_name": ("result",),
        "enable_compilation_cache": ("path",),
        "sweep": ("spec", "store"),
        # score space: no family and no temperature (the readout applies them)
        "linear_score_step": ("scores", "state"),
    },
}

# Exported functions that do not follow the rule yet, each with the reason; the entry goes
# when the function is brought in line.
EXCEPTIONS: dict[str, str] = {}


def _exported_functions():
    """{name: function} of every exported function (classes, enumerations and constants
    left out)."""
    return {name: obj for name in fd.__all__ if inspect.isfunction(obj := getattr(fd, name))}


FUNCTIONS = _exported_functions()
CLASSIFIED = {name: lead for kind in LEADING.values() for name, lead in kind.items()}


def test_every_exported_function_is_classified_once():
    names = [name for kind in LEADING.values() for name in kind]
    assert len(names) == len(set(names)), "a function listed under two kinds"
    assert not set(names) & set(EXCEPTIONS), "a function both classified and excepted"
    unlisted = sorted(set(FUNCTIONS) - set(names) - set(EXCEPTIONS))
    assert not unlisted, f"exported functions not classified in test_signatures: {unlisted}"
    stale = sorted((set(names) | set(EXCEPTIONS)) - set(FUNCTIONS))
    assert not stale, f"classified but not exported functions: {stale}"


def test_every_exported_function_is_the_librarys_own():
    """The studies (studies/, imported by their own names) use the library and are not
    re-exported by it: every exported function is defined in a module of fisherdyn."""
    foreign = {name: f.__module__ for name, f in FUNCTIONS.items()
               if f.__module__.split(".")[0] != "fisherdyn"}
    assert not foreign, f"exported functions defined outside fisherdyn: {foreign}"


def test_the_kinds_follow_their_rule():
    """The table itself holds to the rule of each kind, so an entry cannot drift from it."""
    assert all(lead == OPERATOR for lead in LEADING["operator"].values())
    for lead in LEADING["at a point"].values():
        assert lead[:2] == OPERATOR[:2] and lead[3:] == OPERATOR[2:] and len(lead) == 4
    for lead in LEADING["fit"].values():
        assert lead[:2] == OPERATOR[:2] and len(lead) == 3 and "T" not in lead
    for lead in LEADING["family without scores"].values():
        assert lead == ("entropy", "T")
    for lead in LEADING["fixed family (Abe)"].values():
        assert lead == ("scores", "T")
    for lead in LEADING["entmax names"].values():
        assert lead[0] == "scores" and set(lead[1:]) <= {"target", "alpha"}
        assert list(lead[1:]) == sorted(lead[1:], key=["target", "alpha"].index)
    assert LEADING["attention"] == {"attention": ("q", "k", "v"), "attention_weights": ("q", "k")}
    # wherever they appear, `entropy` is first and `T` right after the scores (or the point)
    for kind, table in LEADING.items():
        for name, lead in table.items():
            if "entropy" in lead:
                assert lead[0] == "entropy", name
            if "T" in lead and "scores" in lead:
                assert lead.index("T") == len(lead) - 1, name


@pytest.mark.parametrize("name", sorted(CLASSIFIED))
def test_leading_parameters_then_keyword_only(name):
    if name not in FUNCTIONS:
        pytest.skip(f"{name} is not exported")
    params = list(inspect.signature(FUNCTIONS[name]).parameters.values())
    lead = CLASSIFIED[name]
    got = tuple(p.name for p in params[: len(lead)])
    assert got == lead, f"{name}: leading parameters {got}, the convention says {lead}"
    for p in params[: len(lead)]:
        assert p.kind is p.POSITIONAL_OR_KEYWORD, f"{name}: {p.name} should be positional"
    rest = [p for p in params[len(lead):] if p.kind is not p.KEYWORD_ONLY]
    assert not rest, f"{name}: {[p.name for p in rest]} should be keyword-only"


@pytest.mark.parametrize("name", sorted(CLASSIFIED))
def test_every_parameter_and_the_return_annotated(name):
    if name not in FUNCTIONS:
        pytest.skip(f"{name} is not exported")
    sig = inspect.signature(FUNCTIONS[name])
    bare = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    assert not bare, f"{name}: parameters without an annotation: {bare}"
    assert sig.return_annotation is not inspect.Signature.empty, f"{name}: no return annotation"


def test_the_exceptions_still_break_the_rule():
    """An exception that already follows the rule belongs in the table instead."""
    for name in EXCEPTIONS:
        if name not in FUNCTIONS:
            continue
        params = list(inspect.signature(FUNCTIONS[name]).parameters.values())
        positional = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        assert positional[:3] != OPERATOR or len(positional) > 3, name
