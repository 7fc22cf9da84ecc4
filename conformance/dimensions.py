"""Which generalization dimensions each spec area's cases cover, read from ``corpus/dimensions.toml``.

A rule is tested along dimensions a runtime author can get wrong without thinking of any particular bug:
the offending item at every position, sizes past every internal chunk, every identity a runtime may
cache, features in combination, every form of a declaration, every caller layout, and cost observed from
outside. For each area the table decides every dimension once: the case patterns that cover it, why it
does not apply, or what is still lacking. This module checks the table against the corpus (every pattern
must select a case, every area and dimension must be decided) and renders ``docs/audit/dimensions.md``,
which lists each case family (``Area.Topic``) with the dimensions its cases cover.

``python -m conformance.dimensions --write`` regenerates the document; ``--check`` fails when it is stale
or the table is inconsistent.
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import dataclass

from conformance import renames
from conformance.areas import AREAS
from conformance.locations import corpus_dir, source_tree

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

#: The dimensions, in the order the document shows them, with what each asks of a rule's cases.
DIMENSIONS: dict[str, str] = {
    "positions": "the offending item first, in the middle and last of whatever a runtime walks",
    "sizes": "values past any internal tile, chunk or page size, with a non-empty partial last piece",
    "identity": "a second input differing from an accepted one in one part of its identity is judged afresh",
    "interactions": "options that combine are tested in combination (at least pairwise)",
    "declaration-forms": "inline and referenced declarations, inside bindings and nested types alike",
    "caller-layouts": "every buffer layout a caller may hand in is used zero-copy or refused explicitly",
    "measured": "cost rules observed from outside (buffer identity, allocations, file opens), not self-reported",
}
#: How a cell of the table decides a dimension for an area.
DECISIONS = ("cases", "not-applicable", "lacking")
DOCUMENT = ("docs", "audit", "dimensions.md")


class DimensionsError(Exception):
    """The table is malformed or disagrees with the corpus; the message names the cell."""


@dataclass(frozen=True)
class Cell:
    """One area's decision for one dimension: covering case patterns, or a reason, or what is missing."""

    area: str
    dimension: str
    patterns: tuple[str, ...] = ()
    not_applicable: str = ""
    lacking: str = ""


def load_table(text: str) -> list[Cell]:
    """The cells of ``corpus/dimensions.toml``; every area of the outline decides every dimension."""
    data = tomllib.loads(text)
    known = {area.name for area in AREAS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise DimensionsError(f"dimensions.toml: areas outside the outline: {', '.join(unknown)}")
    cells = []
    for area in AREAS:
        table = data.get(area.name)
        if table is None:
            raise DimensionsError(f"dimensions.toml: area {area.name} decides no dimension")
        extra = sorted(set(table) - set(DIMENSIONS))
        if extra:
            raise DimensionsError(f"dimensions.toml [{area.name}]: unknown dimensions {', '.join(extra)}")
        for dimension in DIMENSIONS:
            cells.append(_cell(area.name, dimension, table.get(dimension)))
    return cells


def _cell(area: str, dimension: str, value) -> Cell:
    where = f"dimensions.toml [{area}] {dimension}"
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in DECISIONS:
        raise DimensionsError(f"{where}: must be one of {{cases = [...]}}, {{not-applicable = \"why\"}}, "
                              f"{{lacking = \"what\"}}")
    (kind, payload), = value.items()
    if kind == "cases":
        if not isinstance(payload, list) or not payload or not all(isinstance(p, str) and p for p in payload):
            raise DimensionsError(f"{where}: cases must be a non-empty list of case patterns")
        return Cell(area, dimension, patterns=tuple(payload))
    if not isinstance(payload, str) or not payload.strip():
        raise DimensionsError(f"{where}: {kind} needs its reason in words")
    return Cell(area, dimension, not_applicable=payload) if kind == "not-applicable" else \
        Cell(area, dimension, lacking=payload)


def covered_ids(cell: Cell, ids: list[str]) -> list[str]:
    """The case IDs a cell's patterns select (each pattern must select at least one)."""
    chosen = []
    for pattern in cell.patterns:
        hits = [case_id for case_id in ids if renames.pattern_matches(pattern, case_id)]
        if not hits:
            raise DimensionsError(f"dimensions.toml [{cell.area}] {cell.dimension}: pattern {pattern!r} "
                                  f"selects no case")
        chosen += hits
    return sorted(set(chosen))


def family(case_id: str) -> str:
    """A case's family: ``Area.Topic``."""
    return ".".join(case_id.split(".")[1:3])


def render(cells: list[Cell], ids: list[str]) -> str:
    """The document: the dimensions, each area's decisions, then every family with what it covers."""
    by_family: dict[str, set[str]] = collections.defaultdict(set)
    levels: dict[str, set[str]] = collections.defaultdict(set)
    for case_id in ids:
        levels[family(case_id)].add(case_id.split(".")[0])
    lines = ["# Generalization dimensions by area and case family", "",
             "Generated by `python -m conformance.dimensions --write` from `corpus/dimensions.toml`; "
             "`--check` (run by the tests) fails when this file is stale, a pattern selects no case, or an "
             "area leaves a dimension undecided.", "", "| dimension | what it asks |", "| --- | --- |"]
    lines += [f"| {name} | {about} |" for name, about in DIMENSIONS.items()]
    lines += ["", "## Areas", "", "| area | " + " | ".join(DIMENSIONS) + " |",
              "| --- |" + " --- |" * len(DIMENSIONS)]
    lacking = []
    for area in AREAS:
        row = []
        for cell in (c for c in cells if c.area == area.name):
            if cell.patterns:
                hits = covered_ids(cell, ids)
                for case_id in hits:
                    by_family[family(case_id)].add(cell.dimension)
                required = sum(case_id.startswith("Required.") for case_id in hits)
                row.append(f"{len(hits)} cases ({required} Required)")
            elif cell.not_applicable:
                row.append("n/a")
            else:
                row.append("**lacking**")
                lacking.append(cell)
        lines.append(f"| {area.name} | " + " | ".join(row) + " |")
    lines += ["", "### Not applicable", ""]
    lines += [f"- {c.area} / {c.dimension}: {c.not_applicable}" for c in cells if c.not_applicable]
    lines += ["", "### Lacking", ""]
    lines += [f"- {c.area} / {c.dimension}: {c.lacking}" for c in lacking] or ["- none"]
    lines += ["", "## Case families", "",
              "Each family (`Area.Topic`) with the dimensions its cases cover; a family with none tests its "
              "rule at the point the rule names (a single field, a single value).", "",
              "| family | levels | dimensions covered |", "| --- | --- | --- |"]
    for name in sorted(levels):
        covered = [d for d in DIMENSIONS if d in by_family.get(name, ())]
        lines.append(f"| {name} | {', '.join(sorted(levels[name]))} | {', '.join(covered) or '—'} |")
    return "\n".join(lines) + "\n"


def _case_ids() -> list[str]:
    from conformance.cases import load_cases

    return sorted(case.id for case in load_cases())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.dimensions", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="write docs/audit/dimensions.md")
    group.add_argument("--check", action="store_true", help="fail when docs/audit/dimensions.md is stale")
    args = parser.parse_args(argv)
    try:
        cells = load_table((corpus_dir() / "dimensions.toml").read_text(encoding="utf-8"))
        text = render(cells, _case_ids())
    except (DimensionsError, OSError, tomllib.TOMLDecodeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not (args.write or args.check):
        sys.stdout.write(text)
        return 0
    root = source_tree()
    if root is None:
        print("error: --write and --check need a source checkout (docs/ is not installed)", file=sys.stderr)
        return 2
    target = root.joinpath(*DOCUMENT)
    if args.write:
        target.write_text(text, encoding="utf-8")
        return 0
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        print(f"error: {'/'.join(DOCUMENT)} is stale: python -m conformance.dimensions --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
