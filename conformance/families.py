"""Family expansion: a ``[[family]]`` table is a case template expanded over an explicit list of ``rows``
or the cartesian product of a ``matrix`` of variables; ``cross`` (a table of variable lists) takes every
such row once per combination of its values (the three positions of an offending item, say)."""

from __future__ import annotations

import copy
import itertools
import re
from typing import Any

from conformance.templates import substitute


def expand_family(family: dict) -> list[dict]:
    """A family is a case template plus ``matrix`` (cartesian) or ``rows`` (explicit) of variables."""
    body = {k: v for k, v in family.items() if k not in ("matrix", "rows", "cross")}
    rows = list(family.get("rows", []))
    if "matrix" in family:
        rows += _combinations(family["matrix"])
    if "cross" in family:
        rows = [{**row, **extra} for row in rows for extra in _combinations(family["cross"])]
    entries = []
    for row in rows:
        entry = substitute(copy.deepcopy(body), row)
        entry["vars"] = {**substitute(body.get("vars", {}), row), **row}
        # args/expect keep their native TOML types where a row supplies a whole value
        for key in ("args", "expect", "step", "rewrite", "clause", "quote"):
            if key in body:
                entry[key] = _typed_substitute(body[key], row)
        entries.append(entry)
    return entries


def _combinations(table: dict) -> list[dict]:
    """Every combination of a table of variable lists, in order."""
    names = list(table)
    return [dict(zip(names, combo)) for combo in itertools.product(*(table[n] for n in names))]


def _typed_substitute(obj: Any, row: dict) -> Any:
    if isinstance(obj, str):
        match = re.fullmatch(r"\$(\w+)|\$\{(\w+)\}", obj)
        if match:
            name = match.group(1) or match.group(2)
            if name in row:
                return row[name]
        return substitute(obj, row)
    if isinstance(obj, list):
        return [_typed_substitute(item, row) for item in obj]
    if isinstance(obj, dict):
        return {key: _typed_substitute(item, row) for key, item in obj.items()}
    return obj
