"""The audit's outputs: the kill matrix (JSON) and a Markdown summary of the mutation score."""

from __future__ import annotations

import json
import pathlib

from conformance.audit.audit import Audit
from conformance.locations import docs_file
from reference_impl.clauses import CLAUSES

#: the committed kill matrix of a full in-process audit; docs/spec-coverage.md is rendered from it (an
#: installed suite carries a copy: ``conformance.locations``)
COMMITTED = docs_file("audit", "kill-matrix.json")
#: the folder holding ``docs/`` (messages name the documents relative to it)
ROOT = COMMITTED.parents[2]


def matrix_text(audit: Audit) -> str:
    return json.dumps(audit.to_json(), indent=1, sort_keys=True) + "\n"


def stale(committed: dict, fresh: dict) -> tuple[list[str], list[str]]:
    """(problems, notes) comparing the committed kill matrix with a fresh one. A problem is a claim the
    committed matrix makes that no longer holds: another catalogue, a fault whose status changed, a case
    named as catching a fault that no longer does. A note is only an omission: cases that now catch a
    fault too (new cases, or a timing-dependent case failing on a fault)."""
    old = {f["id"]: f for f in committed["faults"]}
    new = {f["id"]: f for f in fresh["faults"]}
    problems, notes = [], []
    if set(old) != set(new):
        problems.append(f"the catalogue changed: {sorted(set(old) ^ set(new))}")
    for fault_id in sorted(set(old) & set(new)):
        before, after = old[fault_id], new[fault_id]
        for key in ("adapter", "clauses", "pending", "testee_blind", "boundary"):
            if before[key] != after[key]:
                problems.append(f"{fault_id}: {key} changed")
        lost = sorted(set(before["caught_by"]) - set(after["caught_by"]))
        if lost:
            problems.append(f"{fault_id} is no longer caught by {', '.join(lost)}")
        gained = sorted(set(after["caught_by"]) - set(before["caught_by"]))
        if gained:
            notes.append(f"{fault_id} is now also caught by {', '.join(gained)}")
    return problems, notes


def summary(audit: Audit, timing: dict[str, float]) -> str:
    """The Markdown summary: score, faults per clause and the cases catching them, fragile and missing
    coverage, pending faults and timings."""
    score = audit.score()
    clauses = audit.by_clause()
    excuses = "no case can catch them yet" + (", or blind through the testee" if audit.through_testee else "")
    lines = [
        "# Audit of the conformance suite",
        "",
        f"Mode: {audit.mode}. {len(audit.case_ids)} cases, {score['faults']} built-in faults "
        f"({score['boundary']} boundary faults), {score['pending']} pending.",
        "",
        f"**Mutation score: {score['caught']} of {score['scored']} faults caught ({score['percent']}%).** "
        f"Pending faults ({excuses}): {score['pending']}, of which caught: {score['pending_caught']}.",
        "",
    ]
    problems = audit.problems()
    lines += ["## Gate", ""] + ([f"- {p}" for p in problems] if problems else ["- passed"]) + [""]
    lines += ["## Faults by clause", "", "| clause | kind | fault | caught by |", "| --- | --- | --- | --- |"]
    outcomes = {o.fault_id: o for o in audit.outcomes}
    for cid, row in clauses.items():
        for fault_id in row["faults"]:
            o = outcomes[fault_id]
            excuse = audit.excused(o)
            pending = f" ({'pending' if o.pending else 'blind through the testee'}: {excuse})" if excuse else ""
            caught = _cases(o.caught_by) if o.caught else f"**survives**{pending}"
            boundary = " (boundary)" if o.boundary else ""
            lines.append(f"| {cid} | {row['kind']} | `{fault_id}`{boundary} | {caught} |")
    lines += ["", "## Clauses caught by a single case", "",
              "Every fault of these clauses is caught, but all by the same one case: one edit away from a blind spot.",
              ""]
    lines += [f"- {clause}: only {case}" for clause, case in audit.single_case()] or ["- none"]
    lines += ["", "## Faults caught by a single case", ""]
    lines += [f"- `{fault}`: only {case}" for fault, case in audit.single_case_faults()] or ["- none"]
    lines += ["", "## Faults caught only incidentally", "",
              "A case of another clause fails on these faults, but no case of the fault's own clauses does: they "
              "count as surviving.", ""]
    lines += [f"- `{o.fault_id}` ({', '.join(o.clauses)}): only {_cases(o.incidental)}"
              for o in audit.incidental_only()] or ["- none"]
    lines += ["", "## Faults caught only by Recommended cases", "",
              "Each is justified from the spec in docs/audit/recommended-only.md, or needs a Required catcher.", ""]
    lines += [f"- `{o.fault_id}` ({', '.join(o.clauses)}): {_cases(o.caught_by)}"
              for o in audit.recommended_only()] or ["- none"]
    lines += ["", "## Clauses without a fault", ""]
    lines += [f"- {cid}" for cid in audit.clauses_without_fault()] or ["- none among rules, permissions and limits"]
    lines += ["", "## Not observable through a runtime", "",
              "Clauses of kinds internal, native, size and process have no fault: an adapter cannot see them.", ""]
    lines += [f"- {cid} ({CLAUSES[cid].kind}){': ' + CLAUSES[cid].note if CLAUSES[cid].note else ''}"
              for cid, row in clauses.items() if row["status"] == "not observable"]
    lines += ["", "## Timing", ""] + [f"- {name}: {seconds:.1f} s" for name, seconds in timing.items()]
    slowest = sorted(audit.outcomes, key=lambda o: -o.duration)[:5]
    lines += [f"- slowest fault: `{o.fault_id}` {o.duration:.1f} s" for o in slowest]
    return "\n".join(lines) + "\n"


def _cases(ids: list[str], shown: int = 3) -> str:
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more


def write(directory: str | pathlib.Path, audit: Audit, timing: dict[str, float]) -> pathlib.Path:
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kill-matrix.json").write_text(matrix_text(audit))
    (out / "summary.md").write_text(summary(audit, timing))
    return out
