"""Binary-size gate for the proto library: ELF metrics, TOML budgets, baseline/candidate deltas.

``measure_path`` measures a library file, a directory or a wheel; ``load_budget``
reads a budget; ``evaluate`` judges metrics against a budget stage; ``compare``
diffs two measurements. All input problems raise :class:`SizeGateError`.

The names are imported on first use (PEP 562), so ``python -m size_gate measure``
loads only the modules measuring needs: start-up time counts for a command-line tool.
"""

from __future__ import annotations

from reference_impl.lazy_package import keep_function_over_submodule, lazy_exports

#: public name -> the submodule that defines it
_EXPORTS = {
    "Budget": "budget", "Stage": "budget", "load_budget": "budget", "needed_allowed": "budget",
    "parse_size": "budget", "soname_family": "budget", "Comparison": "compare", "compare": "compare",
    "ERROR_CODES": "errors", "SizeGateError": "errors", "Finding": "gate", "delta_findings": "gate",
    "evaluate": "gate", "passed": "gate", "METRICS": "metrics", "LibraryMetrics": "metrics",
    "measure_elf": "metrics", "measure_path": "sources",
}

__all__ = sorted(_EXPORTS, key=lambda name: (name[0].islower(), name))


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
keep_function_over_submodule(__name__, "compare")
