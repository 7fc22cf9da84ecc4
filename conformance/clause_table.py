"""The clause table: every normative clause of the spec with the cases that cover it.

The suite's self-check fails when a rule or a limit has no case, or a case cites an unknown clause.
Permissions are proved by tests in which runtimes taking each allowed alternative pass; internal,
native, size-gate and process clauses are checked elsewhere (tests, ``size_gate``).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

from reference_impl.clauses import CLAUSES


def coverage(cases) -> dict[str, list[str]]:
    table: dict[str, list[str]] = {cid: [] for cid in CLAUSES}
    for case in cases:
        for clause in case.clauses:
            table.setdefault(clause, []).append(case.id)
    return table


CASE_KINDS = ("rule", "limit")


def uncovered(cases) -> list[str]:
    """Clauses that need a case (see the module docstring) and have none."""
    return [cid for cid, ids in coverage(cases).items() if not ids and CLAUSES[cid].kind in CASE_KINDS]


def independent(cases) -> dict[str, int]:
    """Rule clause -> how many independent Required cases cover it. Cases are independent when their
    inputs differ: the model bytes and external files (two traces over one model count once, so a
    runtime special-casing one model cannot pass a clause twice)."""
    inputs: dict[str, set[str]] = {cid: set() for cid, clause in CLAUSES.items() if clause.kind == "rule"}
    for case in cases:
        if case.level != "Required":
            continue
        digest = hashlib.sha256(case.model_bytes())
        for relative, data in sorted(case.external_files().items()):
            digest.update(relative.encode() + b"\0" + data)
        for cid in case.clauses:
            if cid in inputs:
                inputs[cid].add(digest.hexdigest())
    return {cid: len(found) for cid, found in inputs.items()}


def render_independent(cases, at_least: int = 2) -> str:
    """The rule clauses covered by fewer than ``at_least`` independent Required cases, and the count."""
    counts = independent(cases)
    short = {cid: n for cid, n in counts.items() if n < at_least}
    lines = [f"  {cid:28s} {n} independent case(s)" for cid, n in short.items()]
    lines.append(f"{len(counts) - len(short)} of {len(counts)} rule clauses are covered by at least {at_least} "
                 "independent Required cases (distinct models)")
    return "\n".join(lines)


def render(cases, markdown: bool = False, with_cases: bool = False) -> str:
    table = coverage(cases)
    by_section: dict[str, list[str]] = defaultdict(list)
    for cid, clause in CLAUSES.items():
        by_section[clause.section].append(cid)
    lines = []
    if markdown:
        lines += ["| Clause | Section | Normative text | Cases |", "| --- | --- | --- | ---: |"]
    for section, ids in by_section.items():
        if not markdown:
            lines.append(section)
        for cid in ids:
            count = len(table[cid])
            if markdown:
                text = CLAUSES[cid].text.replace("|", "\\|")
                lines.append(f"| {cid} | {section} | {text} | {count} |")
            else:
                mark = " " if count or CLAUSES[cid].kind not in CASE_KINDS else "!"
                lines.append(f" {mark} {cid:24s} {count:4d} case(s)")
                if with_cases:
                    lines += [f"        {case_id}" for case_id in table[cid]]
    missing = uncovered(cases)
    needing = sum(clause.kind in CASE_KINDS for clause in CLAUSES.values())
    lines.append("")
    lines.append(f"{needing - len(missing)} of {needing} clauses covered"
                 + (f"; uncovered: {', '.join(missing)}" if missing else "")
                 + f" ({len(CLAUSES) - needing} permissions, internal, native, size-gate and process clauses are "
                   "checked outside cases)")
    return "\n".join(lines)
