"""Family expansion: a ``[[family]]`` table is a case template expanded over an explicit list of ``rows``
or the cartesian product of a ``matrix`` of variables."""

from __future__ import annotations

import copy
import itertools
import re
from typing import Any

from conformance.templates import substitute


def expand_family(family: dict) -> list[dict]:
    """A family is a case template plus ``matrix`` (cartesian) or ``rows`` (explicit) of variables."""
    body = {k: v for k, v in family.items() if k not in ("matrix", "rows")}
    rows = list(family.get("rows", []))
    if "matrix" in family:
        names = list(family["matrix"])
        rows += [dict(zip(names, combo)) for combo in itertools.product(*(family["matrix"][n] for n in names))]
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
