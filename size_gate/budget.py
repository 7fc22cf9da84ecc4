"""Load and validate a TOML size budget.

The budget file holds the spec's figures verbatim. Loading recomputes every
``base + allowance`` sum and refuses a file whose written limit disagrees, so a
typo in a figure cannot silently move a gate.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from size_gate.errors import SizeGateError

DEFAULT_BUDGET = Path(__file__).with_name("budgets") / "onnx_proto.toml"

#: Metrics a budget may limit, and whether their figures are byte sizes (units allowed).
LIMITABLE: dict[str, bool] = {
    "installed_bytes": True,
    "alloc_bytes": True,
    "text_bytes": True,
    "section_bytes_total": True,
    "compressed_bytes": True,
    "defined_symbols": False,
}

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB)?\s*$")
_STAGE_KEYS = {"description", "base", "allowance", "limits", "within_ceiling", "gate_deltas"}
_TOP_KEYS = {"format", "library", "baseline", "ceiling", "stages", "measurements", "gate", "dt_needed"}


@dataclass(frozen=True)
class Stage:
    """One set of absolute, inclusive limits, optionally derived as base + allowance."""

    name: str
    description: str
    limits: dict[str, int]
    base: str | None = None
    allowance: dict[str, int] = field(default_factory=dict)
    allowance_text: dict[str, str] = field(default_factory=dict)
    within_ceiling: bool = False
    gate_deltas: bool = False


@dataclass(frozen=True)
class Budget:
    """A parsed budget file."""

    path: str
    pattern: str
    baseline_name: str
    baseline: dict[str, int]
    ceiling: dict[str, int]
    ceiling_text: dict[str, str]
    stages: dict[str, Stage]
    default_stage: str
    needed_allowed: tuple[str, ...]
    measurements: dict[str, dict[str, int]]

    def stage(self, name: str | None = None) -> Stage:
        name = name or self.default_stage
        if name not in self.stages:
            raise SizeGateError("bad-budget", self.path,
                                f"no stage {name!r}; stages are {', '.join(self.stages)}")
        return self.stages[name]


def parse_size(value: Any, where: str, path: str, units: bool = True) -> int:
    """An inclusive byte or count figure: an integer, or (when ``units``) a string like ``"128 KiB"``.

    Fractional byte figures round down: a whole number of bytes is within ``1.2 MiB``
    exactly when it is at most ``floor(1.2 * 2**20)``.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if units and isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            from decimal import Decimal  # imported when a budget is read, not by every size_gate command

            return math.floor(Decimal(m[1]) * _UNITS[m[2] or "B"])
    kind = 'a non-negative integer or a size such as "128 KiB"' if units else "a non-negative integer"
    raise SizeGateError("bad-budget", path, f"{where} is {value!r}; expected {kind}")


def soname_family(soname: str) -> str:
    """The family of a soname: the text before its first ``.so`` (``libc.so.6`` -> ``libc``)."""
    return soname.split(".so", 1)[0]


def needed_allowed(soname: str, allowed: tuple[str, ...]) -> str | None:
    """The allowlist entry admitting ``soname``, or None.

    Entry ``E`` admits a soname whose family is ``E`` or starts with ``E-``
    (a qualifier such as the architecture in ``ld-linux-x86-64.so.2``).
    """
    family = soname_family(soname)
    return next((e for e in allowed if family == e or family.startswith(e + "-")), None)


def load_budget(path: str | os.PathLike[str] | None = None) -> Budget:
    """Read, validate and resolve the budget file at ``path`` (the packaged budget by default)."""
    if sys.version_info >= (3, 11):  # imported here: measuring a library file reads no budget
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib

    p = Path(path) if path is not None else DEFAULT_BUDGET
    where = str(p)
    try:
        with open(p, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise SizeGateError("not-found", p, "budget file does not exist") from None
    except OSError as exc:
        raise SizeGateError("unreadable", p, exc.strerror or str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise SizeGateError("bad-budget", p, f"not valid TOML: {exc}") from None
    return _resolve(raw, where)


def _table(raw: dict, key: str, path: str, required: bool = True) -> dict:
    value = raw.get(key, None if required else {})
    if not isinstance(value, dict):
        raise SizeGateError("bad-budget", path, f"[{key}] must be a table")
    return value


def _figures(table: dict, where: str, path: str, allow_names: tuple[str, ...] = ()) -> tuple[dict, dict]:
    figures, texts = {}, {}
    for key, value in table.items():
        if key in allow_names:
            continue
        if key not in LIMITABLE:
            raise SizeGateError("bad-budget", path, f"{where}.{key} is not a metric a budget can limit "
                                                    f"({', '.join(LIMITABLE)})")
        figures[key] = parse_size(value, f"{where}.{key}", path, units=LIMITABLE[key])
        texts[key] = value if isinstance(value, str) else f"{value:,}"
    return figures, texts


def _resolve(raw: dict, path: str) -> Budget:
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise SizeGateError("bad-budget", path, f"unknown top-level keys: {', '.join(sorted(unknown))}")
    if raw.get("format") != 1:
        raise SizeGateError("bad-budget", path, f"format is {raw.get('format')!r}; this tool reads format 1")
    pattern = _table(raw, "library", path).get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise SizeGateError("bad-budget", path, "[library] pattern must be a non-empty string")
    base_table = _table(raw, "baseline", path)
    baseline, _ = _figures(base_table, "baseline", path, allow_names=("name",))
    ceiling, ceiling_text = _figures(_table(raw, "ceiling", path, required=False), "ceiling", path)
    stages: dict[str, Stage] = {}
    for name, spec in _table(raw, "stages", path).items():
        stages[name] = _stage(name, spec, baseline, stages, ceiling, path)
    if not stages:
        raise SizeGateError("bad-budget", path, "[stages] defines no stage")
    default = _table(raw, "gate", path).get("stage")
    if default not in stages:
        raise SizeGateError("bad-budget", path, f"[gate] stage {default!r} is not one of {', '.join(stages)}")
    allowed = _table(raw, "dt_needed", path).get("allowed")
    if not isinstance(allowed, list) or not all(isinstance(e, str) and e for e in allowed):
        raise SizeGateError("bad-budget", path, "[dt_needed] allowed must be a list of non-empty strings")
    measurements = {}
    for key, value in _table(raw, "measurements", path, required=False).items():
        if not isinstance(value, dict):
            _bad(path, f"measurements.{key} must be a table")
        measurements[key] = _figures(value, f"measurements.{key}", path)[0]
    return Budget(path=path, pattern=pattern, baseline_name=str(base_table.get("name", "baseline")),
                  baseline=baseline, ceiling=ceiling, ceiling_text=ceiling_text, stages=stages,
                  default_stage=default, needed_allowed=tuple(allowed), measurements=measurements)


def _bad(path: str, message: str) -> NoReturn:
    raise SizeGateError("bad-budget", path, message)


def _stage(name: str, spec: Any, baseline: dict[str, int], earlier: dict[str, Stage],
           ceiling: dict[str, int], path: str) -> Stage:
    where = f"stages.{name}"
    if not isinstance(spec, dict):
        _bad(path, f"[{where}] must be a table")
    unknown = set(spec) - _STAGE_KEYS
    if unknown:
        _bad(path, f"[{where}] has unknown keys: {', '.join(sorted(unknown))}")
    limits, _ = _figures(spec.get("limits", {}), f"{where}.limits", path)
    allowance, allowance_text = _figures(spec.get("allowance", {}), f"{where}.allowance", path)
    base = spec.get("base")
    gate_deltas = bool(spec.get("gate_deltas", False))
    if allowance and base is None and not gate_deltas:
        # Without a base, an allowance only means something against a side-by-side baseline build.
        _bad(path, f"[{where}] has an allowance but neither a base nor gate_deltas = true")
    if base is not None:
        if base == "baseline":
            base_figures = baseline
        elif base in earlier:
            base_figures = earlier[base].limits
        else:
            _bad(path, f"[{where}] base {base!r} is neither 'baseline' nor an earlier stage")
        for key, extra in allowance.items():
            if key not in base_figures:
                _bad(path, f"[{where}] allowance for {key} but base {base!r} has no {key} figure")
            derived = base_figures[key] + extra
            written = limits.setdefault(key, derived)
            if written != derived:
                _bad(path, f"[{where}] limit {key} = {written:,} but {base} {base_figures[key]:,} + "
                           f"allowance {extra:,} = {derived:,}")
    if not limits and not (gate_deltas and allowance):
        _bad(path, f"[{where}] sets no limits")
    within = bool(spec.get("within_ceiling", False))
    if within:
        for key, cap in ceiling.items():
            if limits.get(key, -1) > cap:
                _bad(path, f"[{where}] is within_ceiling but its {key} limit {limits[key]:,} "
                           f"exceeds the ceiling {cap:,}")
    return Stage(name=name, description=str(spec.get("description", "")), limits=limits, base=base,
                 allowance=allowance, allowance_text=allowance_text, within_ceiling=within,
                 gate_deltas=gate_deltas)
