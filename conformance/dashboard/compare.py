"""Two runs of one runtime side by side: which cases newly fail, newly pass, changed verdict otherwise,
changed message only, or are in one run only."""

from __future__ import annotations

from dataclasses import dataclass, field

from conformance.dashboard.runs import Outcome, Run
from conformance.execute import NOT_SUPPORTED, PASSING

#: The comparison's sections, in the order the page shows them: (key, title).
SECTIONS = (("newly_failing", "Newly failing"), ("newly_passing", "Newly passing"),
            ("verdict_changed", "Other verdict changes"), ("message_changed", "Changed messages"),
            ("only_baseline", "Only in the baseline"), ("only_current", "Only in the current run"))


@dataclass
class Change:
    case_id: str
    before: Outcome | None
    after: Outcome | None


@dataclass
class Comparison:
    baseline: Run
    current: Run
    changes: dict[str, list[Change]] = field(default_factory=lambda: {key: [] for key, _ in SECTIONS})

    @property
    def total(self) -> int:
        return sum(len(items) for items in self.changes.values())


def _failing(outcome: Outcome) -> bool:
    """A verdict that is neither a pass nor "not supported": failed, and anything else a bundle records."""
    return outcome.verdict not in PASSING and outcome.verdict != NOT_SUPPORTED


def compare(baseline: Run, current: Run) -> Comparison:
    """Every case whose outcome differs between ``baseline`` and ``current``, each in one section."""
    result = Comparison(baseline, current)
    for case_id in sorted(set(baseline.outcomes) | set(current.outcomes)):
        before, after = baseline.outcomes.get(case_id), current.outcomes.get(case_id)
        if before is None or after is None:
            key = "only_current" if before is None else "only_baseline"
        elif _failing(after) and not _failing(before):
            key = "newly_failing"
        elif after.verdict in PASSING and before.verdict not in PASSING:
            key = "newly_passing"
        elif after.verdict != before.verdict or after.expected_failure != before.expected_failure:
            key = "verdict_changed"
        elif after.message != before.message:
            key = "message_changed"
        else:
            continue
        result.changes[key].append(Change(case_id, before, after))
    return result


def pick_current(baseline: Run, runs: list[Run]) -> Run | None:
    """The run the baseline is compared with: the last one given of the baseline's runtime."""
    same = [run for run in runs if run.runtime == baseline.runtime]
    return same[-1] if same else None

