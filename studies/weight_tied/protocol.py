"""The weight-tied study's protocol: criteria, preconditions, decision rule, admissibility.

Everything that decides an answer is fixed here, as data (`PROTOCOL`), and its SHA-256
(`protocol_hash`) is recorded in every study and calibration JSON beside `PROTOCOL_VERSION`;
docs/guides/weight_tied_protocol.md states the same version and hash. A change to any entry
is a new version, reported beside the old one: `PROTOCOLS` holds every version, and the
study reports each version's answer from the same measurements.

Versions: 1.0, the seven criteria below; 1.1 adds `heldout_likelihood`, held-out prediction
with T held at the model's own, the scores at the fixed point, and the models compared by
likelihood on the estimated noise (`evidence_heldout.py`), and its calibration's table;
1.2 keeps 1.1's criteria and table (so 1.1's calibration stands for it,
`CALIBRATION_VERSION`) and adds two rules read on trained models: the dose rule
(`dose_response`) and the control rule (`controls_hold`).

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

**Noise rule** (1.2, `gate_by_noise`): an admissible criterion enters a group's answer only
if the group's measured noise in $\\sqrt\\rho$ is at most the largest noise at which the
calibration still admits it (`NOISE_LIMITS`); otherwise NOT EVALUABLE.

**Dose rule** (1.2, `dose_response`): a normalizer's admissible criterion is read only if it
responds to the architectural dose of its family's Fisher dynamics, $\\beta$ = 0 (the
normalizer itself), 0.5, 1 (the family's positive control): YES at $\\beta = 1$, and no step
of $\\beta$ that moves the estimate away from the YES region with the two intervals disjoint.
Otherwise the criterion is NOT EVALUABLE for the normalizer, with the reason.

**Control rule** (1.2, `controls_hold`): every positive control says YES, and every negative
control that meets the preconditions says NO, at least one of them (a negative control that
fails a precondition cannot tell, so it neither passes nor fails the controls).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

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
    "dose_response",
    "gate_by_dose",
    "gate_by_noise",
    "NOISE_LIMITS",
    "controls_hold",
    "DOSES",
    "CALIBRATION_VERSION",
    "protocol_hash",
    "criteria_hash",
]

PROTOCOL_VERSION = "1.2"
# the version whose criteria the calibration ran: 1.2 adds rules read on trained models only
CALIBRATION_VERSION = "1.1"
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


# 1.2: the architectural dose series and the rule that reads it, and the control rule
DOSES = (0.0, 0.5, 1.0)
DOSE_RULE = dict(
    doses=list(DOSES),
    series=("beta 0: the normalizer; beta 0.5: its family's Fisher loop with attention "
            "(1 - beta) stationary(z) + beta (Fisher state); beta 1: the family's positive "
            "control (the Fisher state alone, driven by the loop's own scores)"),
    rule=("an admissible criterion enters a normalizer's answer only if it says YES at "
          "beta 1 and no step of beta moves its estimate away from the YES region with "
          "the two intervals disjoint; otherwise NOT EVALUABLE; a dose whose model fails a "
          "precondition has no interval"),
)
# the largest calibrated noise in sqrt(rho) up to which each admissible criterion stays
# admissible (figures/weight_tied_calibration.json to 0.03, its Tsallis extension
# weight_tied_calibration_noise.json to 0.2); linear response reads the loop's Jacobian,
# not its paths, so noise on the paths does not limit it
NOISE_LIMITS: dict[str, dict[str, float]] = {
    "Shannon": {},
    "Tsallis": {"linear_response": _INF, "heldout_likelihood": 0.03},
    "Kaniadakis": {},
}
NOISE_RULE = dict(
    limits=NOISE_LIMITS,
    noise=("the median over a group's seeds and heads of the held-out likelihood fit's noise "
           "estimate"),
    rule=("an admissible criterion enters a group's answer only if the group's measured "
          "noise is at most the criterion's limit; otherwise NOT EVALUABLE"),
)
CONTROL_RULE = ("every positive control YES; every negative control that meets the "
                "preconditions NO, and at least one does")

PROTOCOL_1_1 = _protocol("1.1", PROTOCOL_CRITERIA, ADMISSIBLE,
                         heldout_likelihood=HELDOUT_LIKELIHOOD)
PROTOCOL = _protocol(PROTOCOL_VERSION, PROTOCOL_CRITERIA, ADMISSIBLE,
                     heldout_likelihood=HELDOUT_LIKELIHOOD, noise=NOISE_RULE, dose=DOSE_RULE,
                     controls=CONTROL_RULE)
# every version, reported side by side: version -> (protocol, admissible table)
PROTOCOLS = {
    "1.0": _protocol("1.0", CRITERIA_1_0, ADMISSIBLE_1_0),
    "1.1": PROTOCOL_1_1,
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


def yes_distance(criterion: Criterion, x: float) -> float:
    """How far `x` lies from the criterion's YES region (0 inside it)."""
    return min(max(a - x, 0.0, x - b) for a, b in criterion.yes)


def dose_response(criterion: Criterion, intervals) -> tuple[bool | None, str]:
    """Whether `criterion` responds to the architectural dose (protocol 1.2's dose rule).

    **Arguments:** `intervals` the criterion's `Interval` at each of `DOSES` in order, or
    None where it has none (not computed, or the dose's model fails a precondition).

    **Returns:** `(responds, reason)`: None when a dose has no interval (the rule cannot
    be read), False when the Fisher dose does not say YES or a step moves away from the
    YES region with disjoint intervals, True otherwise.
    """
    missing = [b for b, iv in zip(DOSES, intervals) if iv is None
               or not (np.isfinite(iv.low) or np.isfinite(iv.high))]
    if missing:
        return None, f"no interval at dose {', '.join(f'{b:g}' for b in missing)}"
    full = criterion.decide(intervals[-1])
    if full != YES:
        return False, f"the Fisher control (dose 1) says {full}"
    for (b0, a), (b1, b) in zip(zip(DOSES, intervals), zip(DOSES[1:], intervals[1:])):
        away = yes_distance(criterion, b.estimate) > yes_distance(criterion, a.estimate)
        disjoint = a.high < b.low or b.high < a.low
        if away and disjoint:
            return False, (f"moves away from YES from dose {b0:g} ({a.estimate:.3g}) to "
                           f"{b1:g} ({b.estimate:.3g})")
    return True, "responds to the dose"


def gate_by_noise(decisions: dict, family: str, noise: float,
                  limits: dict | None = None) -> tuple[dict, dict]:
    """Protocol 1.2's noise rule: a group's decisions with each criterion whose calibrated
    noise limit (`NOISE_LIMITS`) lies below the group's measured `noise` set NOT
    EVALUABLE. A criterion without a limit for the family is left as it is (it is not
    admissible, so it does not decide). **Returns:** `(decisions, reasons)`."""
    lim = (NOISE_LIMITS if limits is None else limits).get(family, {})
    out, reasons = dict(decisions), {}
    for name, limit in lim.items():
        if not noise <= limit and out.get(name) in (YES, NO, INCONCLUSIVE):
            out[name] = NOT_EVALUABLE
            reasons[name] = (f"noise rule: measured noise {noise:.3g} in sqrt(rho) beyond the "
                             f"calibrated {limit:g}")
    return out, reasons


def gate_by_dose(decisions: dict, family: str, responses: dict,
                 admissible: dict | None = None) -> tuple[dict, dict]:
    """A normalizer's decisions with each admissible criterion that does not respond to the
    dose (`responses`: criterion -> `dose_response` result; a missing one has no dose
    series) set NOT EVALUABLE. **Returns:** `(decisions, reasons)`."""
    adm = (ADMISSIBLE if admissible is None else admissible).get(family, ())
    out, reasons = dict(decisions), {}
    for name in adm:
        ok, why = responses.get(name, (None, "no dose series"))
        if ok is not True and out.get(name) in (YES, NO, INCONCLUSIVE):
            out[name] = NOT_EVALUABLE
            reasons[name] = f"dose rule: {why}"
    return out, reasons


def controls_hold(positive: list[str], negative: list[tuple[str, bool]]) -> tuple[bool, str]:
    """Protocol 1.2's control rule. `positive`: the positive controls' answers; `negative`:
    each negative control's answer and whether it meets the preconditions.
    **Returns:** `(hold, reason)`."""
    if not all(a == YES for a in positive):
        return False, "a positive control's answer is not YES"
    evaluable = [a for a, ok in negative if ok]
    if not evaluable:
        return False, "no negative control meets the preconditions"
    if not all(a == NO for a in evaluable):
        return False, "a negative control that meets the preconditions is not NO"
    return True, "positive controls YES, evaluable negative controls NO"
