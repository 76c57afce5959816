"""The weight-tied study's protocol: criteria, preconditions, decision rule, admissibility.

Everything that decides an answer is fixed here, as data (`PROTOCOL`), and its SHA-256
(`protocol_hash`) is recorded in every study and calibration JSON beside `PROTOCOL_VERSION`;
docs/guides/weight_tied_protocol.md states the same version and hash. A change to any entry
is a new version, reported beside the old one: `PROTOCOLS` holds every version, and the
study reports each version's answer from the same measurements.

Versions: 1.0, the seven criteria below; 1.1 adds `heldout_likelihood`, held-out prediction
with T held at the model's own, the scores at the fixed point, and the models compared by
likelihood on the estimated noise (`evidence_heldout.py`), and its calibration's table.

**Criteria** (`PROTOCOL_CRITERIA`): the four of `verdict.CRITERIA` and three tests of the
shape of the paths (`evidence_shape.py` and the free mobility exponent). Each reads the
bootstrap interval of one statistic over units, at `CRITERION_LEVEL`.

`criteria_hash` is the hash of everything but the admissible table: the calibration records
it, since the table is its output.

**Admissibility** (`ADMISSIBLE`): a criterion enters a family's verdict only if the
calibration (`calibration.py`: synthetic paths of graded truth) found it saying YES on the
family's own Fisher paths ($\\alpha = 0$) and NO on linear score relaxation ($\\alpha = 1$) in
at least `ADMISSIBLE_FRACTION` of the replicates at noise `ADMISSIBLE_SIGMA` in
$\\sqrt\\rho$. The table is copied from the calibration run named in `CALIBRATION_RUN`
(tests check that it matches the committed `figures/weight_tied_calibration.json`).

**Decision rule** (`decide_family`): NO if an admissible, evaluable criterion says NO; YES if
every admissible criterion is evaluable and says YES; a family with no admissible criterion
is UNTESTABLE (never NO); a model whose preconditions fail, or a criterion that cannot be
computed, is NOT EVALUABLE with its reason.
"""

from __future__ import annotations

import hashlib
import json

from .verdict import CRITERIA, INCONCLUSIVE, NO, YES, Criterion

__all__ = [
    "PROTOCOL_VERSION",
    "PROTOCOL",
    "PROTOCOLS",
    "PROTOCOL_CRITERIA",
    "ADMISSIBLE",
    "NOT_EVALUABLE",
    "UNTESTABLE",
    "decide_family",
    "protocol_hash",
    "criteria_hash",
]

PROTOCOL_VERSION = "1.1"
NOT_EVALUABLE, UNTESTABLE = "NOT EVALUABLE", "UNTESTABLE"
_INF = float("inf")

CRITERIA_1_0: tuple[Criterion, ...] = CRITERIA + (
    Criterion("mobility_exponent", "free exponent b of rates ~ (T rho G'(rho))^b, no spread rule",
              ((0.75, 1.25),), ((-_INF, 0.5), (1.5, _INF)), 0.5, "greater"),
    Criterion("isotropy", "slope of log rate (Shannon scores) on log rho", ((-0.1, 0.1),),
              ((-_INF, -0.25), (0.25, _INF)), 0.25, "less"),
    Criterion("support_revival", "fraction of paths where a key re-enters the support",
              ((0.0, 0.05),), ((0.25, 1.0),), 0.25, "less"),
)
# 1.1: held-out prediction judged by likelihood on the noise, T fixed, z* at the fixed point
PROTOCOL_CRITERIA: tuple[Criterion, ...] = CRITERIA_1_0 + (
    Criterion("heldout_likelihood", "mean held-out log-likelihood ratio per problem, Fisher "
              "over the best baseline (T fixed, z* at the fixed point)", ((2.0, _INF),),
              ((-_INF, -2.0),), 0.0, "greater"),
)
HELDOUT_LIKELIHOOD = dict(
    temperature="the model's own (calibration: the true T)",
    scores="at the fixed point (calibration: the true z*)",
    noise="rms training residual of the best fitted model in sqrt(rho), at least 1e-3",
    baselines=["linear", "relaxation", "constant", "geodesic"],
)

# which family each criterion is defined for (None: every family)
APPLIES_TO = {"isotropy": ("Shannon",)}

ADMISSIBLE_SIGMA = 0.01
ADMISSIBLE_FRACTION = 0.75

# family -> criteria admissible at ADMISSIBLE_SIGMA; copied from CALIBRATION_RUN
ADMISSIBLE: dict[str, tuple[str, ...]] = {
    "Shannon": (),
    "Tsallis": ("linear_response", "heldout_likelihood"),
    "Kaniadakis": (),
}
# protocol 1.0's table, from its own calibration (figures/weight_tied_calibration_1.0.json)
ADMISSIBLE_1_0: dict[str, tuple[str, ...]] = {
    "Shannon": (),
    "Tsallis": ("linear_response",),
    "Kaniadakis": (),
}
CALIBRATION_RUN = "python studies/weight_tied calibrate (full mode)"

PRECONDITIONS = dict(
    accuracy_min=0.95,
    spectral_radius_max=1.0,
    endpoint_distance_max=0.05,
    depth_ratio_min=1.5,
)


def _protocol(version, criteria, admissible, **extra):
    return dict(
        version=version,
        criteria=[dict(name=c.name, statistic=c.statistic, yes=c.yes, no=c.no, null=c.null,
                       alternative=c.alternative) for c in criteria],
        applies_to=APPLIES_TO,
        admissibility=dict(sigma=ADMISSIBLE_SIGMA, fraction=ADMISSIBLE_FRACTION,
                           rule="YES at alpha = 0 and NO at alpha = 1"),
        admissible=admissible,
        preconditions=PRECONDITIONS,
        decision_rule=("NO if an admissible evaluable criterion says NO; YES if every "
                       "admissible criterion is evaluable and says YES; UNTESTABLE if the "
                       "family has no admissible criterion; NOT EVALUABLE if a precondition "
                       "fails or no admissible criterion could be computed; INCONCLUSIVE "
                       "otherwise"),
        **extra,
    )


PROTOCOL = _protocol(PROTOCOL_VERSION, PROTOCOL_CRITERIA, ADMISSIBLE,
                     heldout_likelihood=HELDOUT_LIKELIHOOD)
# every version, reported side by side: version -> (protocol, admissible table)
PROTOCOLS = {
    "1.0": _protocol("1.0", CRITERIA_1_0, ADMISSIBLE_1_0),
    PROTOCOL_VERSION: PROTOCOL,
}


def protocol_hash(protocol: dict = PROTOCOL) -> str:
    """SHA-256 of the protocol as canonical JSON (sorted keys, infinities as strings)."""
    text = json.dumps(protocol, sort_keys=True, default=str,
                      allow_nan=True).replace("Infinity", '"inf"')
    return hashlib.sha256(text.encode()).hexdigest()


def criteria_hash(protocol: dict = PROTOCOL) -> str:
    """SHA-256 of the protocol without its admissible table: what the calibration ran and
    records (the table is the calibration's result, so it cannot be part of its input)."""
    return protocol_hash({k: v for k, v in protocol.items() if k != "admissible"})


def decide_family(decisions: dict, family: str, admissible: dict | None = None,
                  preconditions_failed: list | None = None) -> tuple[str, str]:
    """The overall answer of one family from per-criterion decisions, and why.

    **Arguments:** `decisions` criterion name -> YES / NO / INCONCLUSIVE / NOT EVALUABLE (or
    N/A); `family` the entropy's name; `admissible` family -> admissible criteria (default
    `ADMISSIBLE`); `preconditions_failed` the reasons of failed preconditions, if any.

    **Returns:** `(answer, reason)`.
    """
    adm = (ADMISSIBLE if admissible is None else admissible).get(family, ())
    if not adm:
        return UNTESTABLE, f"no criterion is admissible for {family} (calibration)"
    if preconditions_failed:
        return NOT_EVALUABLE, "; ".join(preconditions_failed)
    used = {n: decisions.get(n, NOT_EVALUABLE) for n in adm}
    evaluable = {n: d for n, d in used.items() if d in (YES, NO, INCONCLUSIVE)}
    if not evaluable:
        return NOT_EVALUABLE, f"no admissible criterion could be computed ({sorted(used)})"
    if NO in evaluable.values():
        return NO, "NO on " + ", ".join(n for n, d in evaluable.items() if d == NO)
    if len(evaluable) == len(used) and all(d == YES for d in evaluable.values()):
        return YES, "YES on every admissible criterion"
    return INCONCLUSIVE, "admissible criteria: " + ", ".join(f"{n} {d}" for n, d in used.items())
