"""Binary-size gate for the proto library: ELF metrics, TOML budgets, baseline/candidate deltas.

``measure_path`` measures a library file, a directory or a wheel; ``load_budget``
reads a budget; ``evaluate`` judges metrics against a budget stage; ``compare``
diffs two measurements. All input problems raise :class:`SizeGateError`.

The names are imported on first use (PEP 562), so ``python -m size_gate measure``
loads only the modules measuring needs: start-up time counts for a command-line tool.
"""

from __future__ import annotations

import importlib
import sys
import types

#: public name -> the submodule that defines it
_EXPORTS = {
    "Budget": "budget", "Stage": "budget", "load_budget": "budget", "needed_allowed": "budget",
    "parse_size": "budget", "soname_family": "budget", "Comparison": "compare", "compare": "compare",
    "ERROR_CODES": "errors", "SizeGateError": "errors", "Finding": "gate", "delta_findings": "gate",
    "evaluate": "gate", "passed": "gate", "METRICS": "metrics", "LibraryMetrics": "metrics",
    "measure_elf": "metrics", "measure_path": "sources",
}

__all__ = sorted(_EXPORTS, key=lambda name: (name[0].islower(), name))


def __getattr__(name: str):
    """A public name from its submodule; nothing is cached, so it is always the submodule's own."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = sys.modules.get(f"{__name__}.{module}")
    return getattr(loaded if loaded is not None else importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """The package module. ``compare`` is the public function of the submodule of the same name: importing
    that submodule binds the name to the module on its parent, which must not replace the function."""

    @property
    def compare(self):
        from size_gate.compare import compare

        return compare

    @compare.setter
    def compare(self, value) -> None:
        pass  # the import system binding the submodule


sys.modules[__name__].__class__ = _Package
