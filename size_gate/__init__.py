"""Binary-size gate for the proto library: ELF metrics, TOML budgets, baseline/candidate deltas.

``measure_path`` measures a library file, a directory or a wheel; ``load_budget``
reads a budget; ``evaluate`` judges metrics against a budget stage; ``compare``
diffs two measurements. All input problems raise :class:`SizeGateError`.
"""

from size_gate.budget import Budget, Stage, load_budget, needed_allowed, parse_size, soname_family
from size_gate.compare import Comparison, compare
from size_gate.errors import ERROR_CODES, SizeGateError
from size_gate.gate import Finding, delta_findings, evaluate, passed
from size_gate.metrics import METRICS, LibraryMetrics, measure_elf
from size_gate.sources import measure_path

__all__ = [
    "ERROR_CODES",
    "METRICS",
    "Budget",
    "Comparison",
    "Finding",
    "LibraryMetrics",
    "SizeGateError",
    "Stage",
    "compare",
    "delta_findings",
    "evaluate",
    "load_budget",
    "measure_elf",
    "measure_path",
    "needed_allowed",
    "parse_size",
    "passed",
    "soname_family",
]
