"""Load and validate a TOML size budget.

The budget file holds the spec's figures verbatim. Loading recomputes every
``base + allowance`` sum and refuses a file whose written limit disagrees, so a
typo in a figure cannot silently move a gate.

A budget is input like any other: it is read from a regular file only (opened without blocking, so a
FIFO cannot hang the gate), at most :data:`MAX_BUDGET_BYTES`, its nesting is bounded before the TOML
parser sees it, and every value must have its documented type and range; anything else is a
``bad-budget`` (or ``unreadable``) error, never a traceback and never "over budget".
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from size_gate.errors import SizeGateError, file_kind

SHIPPED = Path(__file__).with_name("budgets")
DEFAULT_BUDGET = SHIPPED / "onnx_proto.toml"
#: A budget file is a few kilobytes; larger files are refused unread.
MAX_BUDGET_BYTES = 64 << 10
#: Nesting of arrays and inline tables, and dots in one line's keys (``a.b.c``): the shipped budgets use
#: two or three. Deeper structures are refused before parsing (the parser's cost grows with the square
#: of a dotted key's depth).
MAX_NESTING = 32
#: Every figure is a 64-bit quantity; a larger one is a typo or hostile, not a limit.
MAX_FIGURE = (1 << 63) - 1

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
_SIZE = re.compile(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*(B|KiB|MiB|GiB)?\s*")
_SIZE_TEXT_LIMIT = 64  # characters of a size string, checked before the pattern runs
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
    exactly when it is at most ``floor(1.2 * 2**20)``. Figures above :data:`MAX_FIGURE` are refused.
    """
    figure = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        figure = value
    elif units and isinstance(value, str) and len(value) <= _SIZE_TEXT_LIMIT:
        m = _SIZE.fullmatch(value)
        if m:
            from decimal import Decimal, localcontext  # imported when a budget is read, not by every command

            with localcontext() as exact:
                exact.prec = 80  # 30 + 30 digits times a unit: exact, so floor() sees the true value
                figure = math.floor(Decimal(m[1]) * _UNITS[m[2] or "B"])
    if figure is not None and figure <= MAX_FIGURE:
        return figure
    kind = 'a non-negative integer or a size such as "128 KiB"' if units else "a non-negative integer"
    raise SizeGateError("bad-budget", path, f"{where} is {shown(value)}; expected {kind} of at most 2**63 - 1")


def shown(value: Any) -> str:
    """A short description of a budget value for a message, whatever its size or depth."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length():,} bits"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:80]}... ({len(text):,} characters)"


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


def budget_path(name_or_path: str | os.PathLike[str] | None) -> Path:
    """The budget file meant: a shipped budget by bare name (``onnx_proto`` is
    ``size_gate/budgets/onnx_proto.toml``), else a path; None is the default budget."""
    if name_or_path is None:
        return DEFAULT_BUDGET
    text = os.fspath(name_or_path)
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text) and (SHIPPED / f"{text}.toml").is_file():
        return SHIPPED / f"{text}.toml"
    return Path(text)


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.toml"))


def load_budget(path: str | os.PathLike[str] | None = None) -> Budget:
    """Read, validate and resolve a budget: a file path or a shipped budget's name (the default budget
    when None)."""
    if sys.version_info >= (3, 11):  # imported here: measuring a library file reads no budget
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib

    p = budget_path(path)
    text = read_budget_text(p)
    _check_nesting(text, str(p))
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SizeGateError("bad-budget", p, f"not valid TOML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4,300 digits
        raise SizeGateError("bad-budget", p, f"not a usable TOML document: {type(exc).__name__}: {exc}") from None
    return _resolve(raw, str(p))


def read_budget_text(p: Path) -> str:
    """The text of a regular file of at most MAX_BUDGET_BYTES, checked on the opened descriptor."""
    try:
        # O_NONBLOCK: a FIFO opens at once (and is then refused) instead of waiting for a writer.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        shipped = ", ".join(shipped_names())
        raise SizeGateError("not-found", p, f"budget file does not exist (shipped budgets: {shipped})") from None
    except (OSError, ValueError) as exc:
        raise SizeGateError("unreadable", p, getattr(exc, "strerror", None) or str(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # checked before reading: a directory cannot even be wrapped
            raise SizeGateError("unreadable", p, f"a budget is a regular file, not {file_kind(info.st_mode)}")
        if info.st_size > MAX_BUDGET_BYTES:
            raise SizeGateError("bad-budget", p, f"{info.st_size:,} bytes; a budget file is at most "
                                                 f"{MAX_BUDGET_BYTES:,}")
        data = b""
        while len(data) <= MAX_BUDGET_BYTES:
            chunk = os.read(fd, MAX_BUDGET_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise SizeGateError("unreadable", p, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if len(data) > MAX_BUDGET_BYTES:
        raise SizeGateError("bad-budget", p, f"more than {MAX_BUDGET_BYTES:,} bytes; a budget file is at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SizeGateError("bad-budget", p, f"not UTF-8 text (byte {exc.start:,})") from None


def _check_nesting(text: str, path: str) -> None:
    """Refuse arrays and inline tables nested, or keys dotted, deeper than MAX_NESTING, before parsing.

    A small scan of the TOML text: strings and comments are skipped, ``[``/``{`` in value position
    open a container, and dots are counted only in key position (a line's start, a table header, after
    ``{`` or ``,`` in an inline table), so a value's float never counts."""
    containers: list[str] = []
    key, dots, i, n = True, 0, 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i = _string_end(text, i)
            continue
        if c == "#":
            i = text.find("\n", i)
            if i < 0:
                return
            continue
        if c == "\n" and not containers:
            key, dots = True, 0
        elif c == "." and key:
            dots += 1
            if dots > MAX_NESTING:
                _bad(path, f"a key dotted more than {MAX_NESTING} levels deep (line {text.count(chr(10), 0, i) + 1})")
        elif c == "=":
            key = False
        elif c in "[{" and not key:
            containers.append(c)
            if len(containers) > MAX_NESTING:
                _bad(path, f"arrays or inline tables nested more than {MAX_NESTING} levels deep "
                           f"(line {text.count(chr(10), 0, i) + 1})")
            if c == "{":
                key, dots = True, 0
        elif c in "]}" and containers:
            containers.pop()
            key = False
        elif c == "," and containers and containers[-1] == "{":
            key, dots = True, 0
        i += 1


def _string_end(text: str, start: int) -> int:
    """The index just past the TOML string starting at ``start`` (or the end of its line if unclosed)."""
    quote = text[start]
    if text.startswith(quote * 3, start):
        j = start + 3
        while j < len(text):
            if quote == '"' and text[j] == "\\":
                j += 2
            elif text.startswith(quote * 3, j):
                end = j + 3
                while end < len(text) and text[end] == quote and end - j < 5:  # up to two quotes of content
                    end += 1
                return end
            else:
                j += 1
        return len(text)
    j = start + 1
    while j < len(text) and text[j] != "\n":
        if quote == '"' and text[j] == "\\":
            j += 2
        elif text[j] == quote:
            return j + 1
        else:
            j += 1
    return j


def _table(raw: dict, key: str, path: str, required: bool = True) -> dict:
    value = raw.get(key, None if required else {})
    if not isinstance(value, dict):
        raise SizeGateError("bad-budget", path, f"[{key}] must be a table")
    return value


def _figures(table: Any, where: str, path: str, allow_names: tuple[str, ...] = ()) -> tuple[dict, dict]:
    if not isinstance(table, dict):
        _bad(path, f"{where} must be a table, not {shown(table)}")
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
    if type(raw.get("format")) is not int or raw["format"] != 1:
        raise SizeGateError("bad-budget", path, f"format is {shown(raw.get('format'))}; this tool reads format 1")
    pattern = _table(raw, "library", path).get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise SizeGateError("bad-budget", path, "[library] pattern must be a non-empty string")
    base_table = _table(raw, "baseline", path)
    baseline_name = base_table.get("name", "baseline")
    if not isinstance(baseline_name, str):
        _bad(path, f"[baseline] name must be a string, not {shown(baseline_name)}")
    baseline, _ = _figures(base_table, "baseline", path, allow_names=("name",))
    ceiling, ceiling_text = _figures(_table(raw, "ceiling", path, required=False), "ceiling", path)
    stages: dict[str, Stage] = {}
    for name, spec in _table(raw, "stages", path).items():
        stages[name] = _stage(name, spec, baseline, stages, ceiling, path)
    if not stages:
        raise SizeGateError("bad-budget", path, "[stages] defines no stage")
    default = _table(raw, "gate", path).get("stage")
    if not isinstance(default, str) or default not in stages:
        raise SizeGateError("bad-budget", path, f"[gate] stage {shown(default)} is not one of {', '.join(stages)}")
    allowed = _table(raw, "dt_needed", path).get("allowed")
    if not isinstance(allowed, list) or not all(isinstance(e, str) and e for e in allowed):
        raise SizeGateError("bad-budget", path, "[dt_needed] allowed must be a list of non-empty strings")
    measurements = {}
    for key, value in _table(raw, "measurements", path, required=False).items():
        if not isinstance(value, dict):
            _bad(path, f"measurements.{key} must be a table")
        measurements[key] = _figures(value, f"measurements.{key}", path)[0]
    return Budget(path=path, pattern=pattern, baseline_name=baseline_name,
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
    if base is not None and not isinstance(base, str):
        _bad(path, f"[{where}] base must be a stage name, not {shown(base)}")
    description, gate_deltas, within = (spec.get("description", ""), spec.get("gate_deltas", False),
                                        spec.get("within_ceiling", False))
    if not isinstance(description, str):
        _bad(path, f"[{where}] description must be a string, not {shown(description)}")
    if not isinstance(gate_deltas, bool) or not isinstance(within, bool):
        _bad(path, f"[{where}] gate_deltas and within_ceiling must be true or false")
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
    if within:
        for key, cap in ceiling.items():
            if limits.get(key, -1) > cap:
                _bad(path, f"[{where}] is within_ceiling but its {key} limit {limits[key]:,} "
                           f"exceeds the ceiling {cap:,}")
    return Stage(name=name, description=description, limits=limits, base=base,
                 allowance=allowance, allowance_text=allowance_text, within_ceiling=within,
                 gate_deltas=gate_deltas)
