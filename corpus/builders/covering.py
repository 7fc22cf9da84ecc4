"""Covering arrays: few rows that still bring every pair (or chosen triple) of option values together.

A runtime can be right about each feature alone and wrong where two meet (a softcap wrong only with INT4
blocks, a causal frontier wrong only in decode with grouped heads). Testing every combination of ten
features is thousands of cases; a covering array of strength 2 puts every pair of values of any two
factors into at least one row, in a few dozen rows, and ``groups`` name factor sets covered at a higher
strength where that stays cheap.

The construction is greedy and deterministic (no randomness, no dependency): take the first uncovered
combination, then give each remaining factor, in declaration order, the value that completes the most
still-uncovered combinations (on a tie, the value the rows so far use least, so the options spread over
the rows instead of piling into one), keeping the row completable under ``allowed``. Combinations no allowed row
can hold are not targets. ``seed`` rows are kept first, so an array over a subset of the options (the
Required ones, say) can be extended to cover the rest without losing its own coverage.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Row = dict[str, Any]
#: one value of each of some factors: ((factor, value), ...) in factor order
Combination = tuple[tuple[str, Any], ...]
#: whether a partial row (only some factors assigned) can still become an allowed row; it must reject a
#: row only when every completion would be rejected (checks look at the factors assigned so far)
Allowed = Callable[[Mapping[str, Any]], bool]


def _always(row: Mapping[str, Any]) -> bool:
    return True


def factor_sets(factors: Mapping[str, Sequence], strength: int = 2,
                groups: Iterable[Sequence[str]] = ()) -> list[tuple[str, ...]]:
    """The factor sets to cover: every ``strength``-subset of the factors, then each group (in factor order)."""
    names = list(factors)
    sets = list(itertools.combinations(names, strength))
    for group in groups:
        unknown = set(group) - set(names)
        if unknown:
            raise ValueError(f"group {tuple(group)} names unknown factors {sorted(unknown)}")
        ordered = tuple(name for name in names if name in group)
        if ordered not in sets:
            sets.append(ordered)
    return sets


def complete(row: Mapping[str, Any], factors: Mapping[str, Sequence], allowed: Allowed = _always) -> Row | None:
    """The first allowed full row extending ``row`` (factors in order, values in order), or None."""
    if not allowed(row):
        return None
    missing = [name for name in factors if name not in row]
    if not missing:
        return dict(row)
    name = missing[0]
    for value in factors[name]:
        found = complete({**row, name: value}, factors, allowed)
        if found is not None:
            return found
    return None


def targets(factors: Mapping[str, Sequence], strength: int = 2, groups: Iterable[Sequence[str]] = (),
            allowed: Allowed = _always) -> list[Combination]:
    """Every combination of the factor sets that some allowed row can hold, in a fixed order."""
    found = []
    for names in factor_sets(factors, strength, groups):
        for values in itertools.product(*(factors[name] for name in names)):
            combination = tuple(zip(names, values))
            if complete(dict(combination), factors, allowed) is not None:
                found.append(combination)
    return found


def holds(row: Mapping[str, Any], combination: Combination) -> bool:
    return all(name in row and row[name] == value for name, value in combination)


def missing(rows: Sequence[Mapping[str, Any]], factors: Mapping[str, Sequence], strength: int = 2,
            groups: Iterable[Sequence[str]] = (), allowed: Allowed = _always) -> list[Combination]:
    """The coverable combinations no row holds (empty for a covering array)."""
    return [c for c in targets(factors, strength, groups, allowed) if not any(holds(row, c) for row in rows)]


def covering_array(factors: Mapping[str, Sequence], strength: int = 2, groups: Iterable[Sequence[str]] = (),
                   allowed: Allowed = _always, seed: Sequence[Mapping[str, Any]] = ()) -> list[Row]:
    """Rows (``seed`` first) holding every coverable combination of ``strength`` factors and of each group.

    ``factors`` maps each factor to its values, in the order rows are built and values preferred.
    """
    groups = list(groups)
    for row in seed:
        if set(row) != set(factors) or not allowed(row):
            raise ValueError(f"seed row {dict(row)} is not an allowed full row")
    rows = [{name: row[name] for name in factors} for row in seed]
    uncovered = [c for c in targets(factors, strength, groups, allowed) if not any(holds(r, c) for r in rows)]
    index: dict[tuple[str, Any], list[Combination]] = {}
    for combination in uncovered:
        for pair in combination:
            index.setdefault(pair, []).append(combination)
    remaining = set(uncovered)
    used = {(name, value): sum(row[name] == value for row in rows) for name in factors for value in factors[name]}
    while remaining:
        start = next(c for c in uncovered if c in remaining)
        row: Row = dict(start)
        for name in factors:
            if name in row:
                continue
            best, best_key = None, None
            for value in factors[name]:
                candidate = {**row, name: value}
                if complete(candidate, factors, allowed) is None:
                    continue
                gain = sum(1 for c in index.get((name, value), ()) if c in remaining and holds(candidate, c))
                key = (gain, -used[name, value])
                if best_key is None or key > best_key:
                    best, best_key = value, key
            row[name] = best  # ``start`` is completable, so some value keeps the row completable
        row = {name: row[name] for name in factors}
        for pair in row.items():
            used[pair] += 1
        rows.append(row)
        remaining -= {c for c in remaining if holds(row, c)}
    return rows
