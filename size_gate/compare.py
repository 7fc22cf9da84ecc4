"""Baseline-versus-candidate differences of two measured libraries."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from size_gate.metrics import METRICS, LibraryMetrics


@dataclass(frozen=True)
class DeltaRow:
    """One numeric metric side by side; ``delta``/``percent`` are None when either side is unmeasured."""

    metric: str
    label: str
    baseline: int | None
    candidate: int | None

    @property
    def delta(self) -> int | None:
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate - self.baseline

    @property
    def percent(self) -> float | None:
        if self.delta is None or not self.baseline:
            return None
        return 100.0 * self.delta / self.baseline

    def to_json(self) -> dict:
        return {"metric": self.metric, "label": self.label, "baseline": self.baseline,
                "candidate": self.candidate, "delta": self.delta, "percent": self.percent}


@dataclass(frozen=True)
class Comparison:
    """Metric deltas plus added/removed dynamic symbols and DT_NEEDED entries."""

    baseline: LibraryMetrics
    candidate: LibraryMetrics
    rows: tuple[DeltaRow, ...]
    symbols_added: tuple[str, ...]
    symbols_removed: tuple[str, ...]
    needed_added: tuple[str, ...]
    needed_removed: tuple[str, ...]


def _added(before: tuple[str, ...], after: tuple[str, ...]) -> tuple[str, ...]:
    """Entries of ``after`` not in ``before``, as a multiset difference (duplicates count)."""
    return tuple(sorted((Counter(after) - Counter(before)).elements()))


def compare(baseline: LibraryMetrics, candidate: LibraryMetrics) -> Comparison:
    rows = tuple(DeltaRow(key, label, baseline.value(key), candidate.value(key))
                 for key, (label, _d) in METRICS.items()
                 if baseline.value(key) is not None or candidate.value(key) is not None)
    return Comparison(baseline, candidate, rows,
                      symbols_added=_added(baseline.symbols, candidate.symbols),
                      symbols_removed=_added(candidate.symbols, baseline.symbols),
                      needed_added=_added(baseline.needed, candidate.needed),
                      needed_removed=_added(candidate.needed, baseline.needed))
