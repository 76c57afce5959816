"""The operator table is measured: its tail column must recover the analytic tail laws.

References: docs/math.md §2 tail laws (softmax rate 1/T; Kaniadakis exponent -1/kappa; Abe
exponent -q/(q-1); Burg exponent -1; Tsallis q > 1 exact zeros past the threshold) and the
independent solver `solve_stationary` for the agreement column.
"""

import pytest

import fisherdyn as fd


@pytest.mark.parametrize(
    "entropy, kind, value, tol",
    [
        # tolerances: Shannon is exactly exponential (fit round-off); the algebraic laws are
        # asymptotic with O(1/|w|) corrections on z in [-200, -100]: 1e-3 relative
        (fd.Shannon(), "exponential", 1 / 0.8, 1e-9),
        (fd.Burg(), "inverse-linear", -1.0, 1e-6),
        (fd.Kaniadakis(0.3), "algebraic", -1 / 0.3, 1e-3),
        (fd.Tsallis(1.5), "cutoff", None, None),
    ],
)
def test_measured_tails(entropy, kind, value, tol):
    tail = fd.measure_tail(entropy, T=0.8)
    assert tail["kind"] == kind, tail
    if value is not None:
        assert abs(tail["value"] - value) <= tol * abs(value), tail


@pytest.mark.slow
def test_full_table():
    rows = fd.operator_table()
    text = fd.format_operator_table(rows)
    assert len(rows) == 7 and all(r["family"] in text for r in rows)
    for r in rows:
        # reference: solve_stationary (optimistix and scipy); tolerance 1e-12
        assert r["err_optimistix"] <= 1e-12 and r["err_scipy"] <= 1e-12, r
    kinds = {r["family"]: r["tail"]["kind"] for r in rows}
    assert kinds["Shannon"] == "exponential" and kinds["Burg"] == "inverse-linear"
    assert kinds["Kaniadakis kappa=0.3"] == kinds["Abe q=1.5"] == "algebraic"
    assert kinds["Tsallis q=1.5"] == kinds["Renyi q=2"] == "cutoff"
    abe = next(r for r in rows if r["family"] == "Abe q=1.5")
    assert abs(abe["tail"]["value"] + 3.0) <= 1e-2  # -q/(q-1) = -3, asymptotic
    shannon = next(r for r in rows if r["family"] == "Shannon")
    assert shannon["support"] == shannon["n"]  # dense
