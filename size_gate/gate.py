"""Judge measured metrics against a budget stage.

Every limited metric yields a pass/fail finding whose message names the
metric, the limit, the actual value and any overshoot. Metrics the stage does
not limit are reported, never gated.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from size_gate.budget import Budget, Stage, needed_allowed
from size_gate.errors import SizeGateError
from size_gate.metrics import METRICS, LibraryMetrics

PASS, FAIL, REPORT = "pass", "fail", "report"


@dataclass(frozen=True)
class Finding:
    """One judged (or merely reported) quantity."""

    check: str
    metric: str
    label: str
    actual: int | str | None
    limit: int | None
    status: str
    message: str

    @property
    def overshoot(self) -> int | None:
        if isinstance(self.actual, int) and self.limit is not None and self.actual > self.limit:
            return self.actual - self.limit
        return None

    def to_json(self) -> dict:
        return {**asdict(self), "overshoot": self.overshoot}


def _limit_finding(check: str, metric: str, label: str, actual: int, limit: int, scope: str) -> Finding:
    if actual <= limit:
        return Finding(check, metric, label, actual, limit, PASS,
                       f"{label} ({metric}): {actual:,} is within the {scope} limit of {limit:,} "
                       f"({limit - actual:,} to spare)")
    over = actual - limit
    return Finding(check, metric, label, actual, limit, FAIL,
                   f"{label} ({metric}): {actual:,} exceeds the {scope} limit of {limit:,} "
                   f"by {over:,} ({100 * over / limit:.3f}%)" if limit else
                   f"{label} ({metric}): {actual:,} exceeds the {scope} limit of 0 by {over:,}")


def evaluate(metrics: LibraryMetrics, budget: Budget, stage: Stage) -> list[Finding]:
    """Findings for one library under ``stage``: limits, ceiling, DT_NEEDED allowlist, report-only values."""
    findings = []
    for key, limit in stage.limits.items():
        actual = metrics.value(key)
        if actual is None:
            raise SizeGateError("metric-unavailable", metrics.path,
                                f"stage {stage.name} limits {METRICS[key][0]} ({key}), which cannot be "
                                f"measured on this file (it has no section headers)")
        findings.append(_limit_finding("limit", key, METRICS[key][0], actual, limit, f"{stage.name}"))
    for key, cap in budget.ceiling.items():
        actual = metrics.value(key)
        label = f"{METRICS[key][0]} vs project ceiling {budget.ceiling_text[key]}"
        if stage.within_ceiling and actual is not None:
            findings.append(_limit_finding("ceiling", key, label, actual, cap, "project ceiling"))
        else:
            findings.append(Finding("ceiling", key, label, actual, cap, REPORT,
                                    f"project ceiling {budget.ceiling_text[key]} ({cap:,} bytes) is not "
                                    f"applied by stage {stage.name}; shown for reference"))
    findings.extend(needed_findings(metrics.needed, budget.needed_allowed))
    for key, (label, _definition) in METRICS.items():
        if key not in stage.limits and metrics.value(key) is not None:
            findings.append(Finding("report", key, label, metrics.value(key), None, REPORT,
                                    f"{label} ({key}): {metrics.value(key):,} (report only)"))
    return findings


def needed_findings(needed: tuple[str, ...], allowed: tuple[str, ...]) -> list[Finding]:
    """One finding per DT_NEEDED entry: allowed by which allowlist family, or not."""
    findings = []
    for soname in needed:
        entry = needed_allowed(soname, allowed)
        if entry:
            findings.append(Finding("dt_needed", "needed", "DT_NEEDED", soname, None, PASS,
                                    f"DT_NEEDED {soname} is allowed (family {entry})"))
        else:
            findings.append(Finding("dt_needed", "needed", "DT_NEEDED", soname, None, FAIL,
                                    f"DT_NEEDED {soname} is not on the allowlist "
                                    f"({', '.join(allowed)}); no dependency may be added"))
    return findings


def delta_findings(baseline: LibraryMetrics, candidate: LibraryMetrics, stage: Stage) -> list[Finding]:
    """Candidate-minus-baseline deltas against the stage allowance, plus DT_NEEDED additions.

    Deltas are gated only when the stage says its allowance is a delta over a
    side-by-side baseline build (``gate_deltas``); otherwise they are reported.
    """
    findings = []
    for key, allowance in stage.allowance.items():
        before, after = baseline.value(key), candidate.value(key)
        if before is None or after is None:
            continue
        delta, label = after - before, f"{METRICS[key][0]} delta"
        if stage.gate_deltas:
            findings.append(_limit_finding("allowance", key, label, delta, allowance,
                                           f"{stage.name} allowance"))
        else:
            used = f"{100 * delta / allowance:.1f}% of" if allowance else "vs"
            findings.append(Finding("allowance", key, label, delta, allowance, REPORT,
                                    f"{label} ({key}): {delta:+,} uses {used} the {stage.name} "
                                    f"allowance of {allowance:,} (not gated: the allowance is "
                                    f"relative to {stage.base})"))
    for soname in sorted((Counter(candidate.needed) - Counter(baseline.needed)).elements()):
        findings.append(Finding("dt_needed_added", "needed", "DT_NEEDED added", soname, None, FAIL,
                                f"DT_NEEDED {soname} was added relative to the baseline; "
                                f"no dependency may be added"))
    return findings


def passed(findings: list[Finding]) -> bool:
    return all(f.status != FAIL for f in findings)
