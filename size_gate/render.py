"""Human and machine renderings: terminal tables, Markdown for CI job summaries, JSON for dashboards.

Names from the measured libraries and the budget are shown through :mod:`size_gate.escape`: one
visible line each on a terminal, inert text or code spans in Markdown (JSON escapes by itself)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from size_gate.escape import md_code, md_text, printable
from size_gate.metrics import METRICS

if TYPE_CHECKING:  # measuring renders without importing the budget and gate modules
    from size_gate.budget import Budget, Stage
    from size_gate.compare import Comparison
    from size_gate.gate import Finding
    from size_gate.metrics import LibraryMetrics

#: At most this many symbols per list in Markdown; the JSON report always lists all.
MARKDOWN_SYMBOL_LIMIT = 500


def _mark(status: str) -> str:
    from size_gate.gate import FAIL, PASS, REPORT

    return {PASS: "✅ pass", FAIL: "❌ FAIL", REPORT: "report only"}[status]


def num(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def signed(value: int | None) -> str:
    return "n/a" if value is None else f"{value:+,}" if value else "0"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}%" if value else "0.00%"


def _unmeasured(metrics: LibraryMetrics) -> str:
    return "n/a (no section headers)" if not metrics.section_headers else "n/a"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


# -- measure ---------------------------------------------------------------------------------------
def measure_text(metrics: LibraryMetrics, with_symbols: bool = False) -> str:
    rows = []
    values = {k: metrics.value(k) for k in METRICS}
    width = max(len(num(v)) for v in values.values() if v is not None)
    for key, (label, _d) in METRICS.items():
        value = values[key]
        if value is None and key in ("wheel_bytes", "compressed_bytes"):
            continue
        rows.append([label, num(value).rjust(width) if value is not None else _unmeasured(metrics)])
    rows += [["DT_NEEDED", ", ".join(printable(n) for n in metrics.needed) or "(none)"],
             ["SONAME", printable(metrics.soname) if metrics.soname else "(none)"],
             ["Build ID", metrics.build_id or "(none)"],
             ["Symbols read from", metrics.symbol_source]]
    lines = [printable(metrics.path)] + _table(rows, right=set())
    if with_symbols:
        lines += ["  Defined dynamic symbols:"] + [f"    {printable(s)}" for s in metrics.symbols]
    return "\n".join(lines)


# -- check -----------------------------------------------------------------------------------------
def check_text(metrics: LibraryMetrics, budget: Budget, stage: Stage, findings: list[Finding]) -> str:
    from size_gate.gate import FAIL, REPORT

    head = [printable(metrics.path),
            printable(f"  budget {budget.path}, stage {stage.name}" + (f" ({stage.description})"
                                                                      if stage.description else ""))]
    rows = [["Check", "Actual", "Limit", "Headroom", f"vs {budget.baseline_name}", "Status"]]
    for f in findings:
        if f.check in ("limit", "ceiling", "report") and isinstance(f.actual, int):
            base = budget.baseline.get(f.metric) if f.check != "ceiling" else None
            versus = "" if base is None else signed(f.actual - base) + (
                f" ({pct(100 * (f.actual - base) / base)})" if base else "")
            headroom = "" if f.limit is None else f"{f.limit - f.actual:,}"
            limit = "" if f.limit is None else num(f.limit)
            rows.append([f.label, num(f.actual), limit, headroom, versus, _mark(f.status)])
        elif f.check == "ceiling":
            rows.append([f.label, "n/a", num(f.limit), "", "", _mark(f.status)])
        elif f.check == "dt_needed":
            rows.append([f"DT_NEEDED {printable(str(f.actual))}", "", "", "", "", _mark(f.status)])
    lines = head + _table(rows, right={1, 2, 3})
    problems = [f for f in findings if f.status == FAIL]
    notes = [f for f in findings if f.check == "ceiling" and f.status == REPORT]
    lines += [f"  note: {printable(f.message)}" for f in notes]
    if problems:
        lines.append(f"FAIL: {len(problems)} problem(s) over budget")
        lines += [f"  - {printable(f.message)}" for f in problems]
    else:
        lines.append(f"PASS: within the {printable(stage.name)} budget")
    return "\n".join(lines)


def check_json(metrics: LibraryMetrics, budget: Budget, stage: Stage, findings: list[Finding]) -> dict:
    from size_gate.gate import passed

    return {"schema": "size_gate.check/1", "budget": budget.path, "stage": stage.name,
            "passed": passed(findings), "library": metrics.to_json(with_symbols=False),
            "findings": [f.to_json() for f in findings]}


# -- compare ---------------------------------------------------------------------------------------
def _fence(lines: list[str]) -> list[str]:
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *lines, fence]


def _symbol_block(title: str, names: tuple[str, ...]) -> list[str]:
    if not names:
        return []
    shown = [printable(name) for name in names[:MARKDOWN_SYMBOL_LIMIT]]
    if len(names) > len(shown):
        shown.append(f"... and {len(names) - len(shown):,} more (see the JSON report)")
    return ["<details>", f"<summary>{title} ({len(names):,})</summary>", "", *_fence(shown), "", "</details>", ""]


def compare_markdown(cmp: Comparison, stage: Stage | None, findings: list[Finding] | None) -> str:
    from size_gate.gate import FAIL

    name = cmp.candidate.soname or cmp.candidate.path.rsplit("/", 1)[-1]
    out = [f"### Binary size: {md_code(name)}", "",
           f"Baseline {md_code(cmp.baseline.path)} vs candidate {md_code(cmp.candidate.path)}", ""]
    limits = stage.limits if stage else {}
    status = {f.metric: f.status for f in findings or [] if f.check == "limit"}
    # A stage that gates deltas against the side-by-side baseline shows its allowance where no limit is.
    allowances = stage.allowance if stage and stage.gate_deltas else {}
    delta_status = {f.metric: f.status for f in findings or [] if f.check == "allowance"}
    header = "| Metric | Baseline | Candidate | Δ | Δ % |"
    if stage:
        header += f" Limit ({md_text(stage.name)}) | Status |"
    out += [header, "|---|---:|---:|---:|---:|" + ("---:|:---|" if stage else "")]
    for row in cmp.rows:
        line = (f"| {row.label} | {num(row.baseline)} | {num(row.candidate)} | {signed(row.delta)} | "
                f"{pct(row.percent)} |")
        if stage:
            if row.metric in limits:
                line += f" {num(limits[row.metric])} | {_mark(status[row.metric])} |"
            elif row.metric in allowances and row.metric in delta_status:
                line += f" Δ ≤ {signed(allowances[row.metric])} | {_mark(delta_status[row.metric])} |"
            else:
                line += " | report only |"
        out.append(line)
    out.append("")
    if findings is not None:
        problems = [f for f in findings if f.status == FAIL]
        verdict = "✅ within budget" if not problems else f"❌ {len(problems)} problem(s)"
        out += [f"**Gate (stage {md_text(stage.name)}):** {verdict}", ""]
        if problems:
            out += [f"- ❌ {md_text(f.message)}" for f in problems] + [""]
        notes = [f for f in findings if f.check in ("allowance", "ceiling") and f.status != FAIL]
        if notes:
            out += ["Notes:", ""] + [f"- {md_text(f.message)}" for f in notes] + [""]
    out += [(f"**Defined dynamic symbols:** {len(cmp.symbols_added):,} added, "
             f"{len(cmp.symbols_removed):,} removed"), ""]
    out += _symbol_block("Added symbols", cmp.symbols_added)
    out += _symbol_block("Removed symbols", cmp.symbols_removed)
    if cmp.needed_added or cmp.needed_removed:
        out.append("**DT_NEEDED:** " + "; ".join(
            part for part in (
                "added " + ", ".join(md_code(n) for n in cmp.needed_added) if cmp.needed_added else "",
                "removed " + ", ".join(md_code(n) for n in cmp.needed_removed) if cmp.needed_removed else "")
            if part))
    else:
        out.append("**DT_NEEDED:** unchanged (" + (", ".join(md_code(n) for n in cmp.candidate.needed)
                                                   or "none") + ")")
    return "\n".join(out) + "\n"


def compare_json(cmp: Comparison, stage: Stage | None, findings: list[Finding] | None) -> dict[str, Any]:
    from size_gate.gate import passed

    return {
        "schema": "size_gate.compare/1",
        "baseline": cmp.baseline.to_json(with_symbols=False),
        "candidate": cmp.candidate.to_json(with_symbols=False),
        "metrics": [row.to_json() for row in cmp.rows],
        "symbols": {"added": list(cmp.symbols_added), "removed": list(cmp.symbols_removed)},
        "needed": {"added": list(cmp.needed_added), "removed": list(cmp.needed_removed)},
        "gate": None if findings is None else {
            "stage": stage.name, "passed": passed(findings), "findings": [f.to_json() for f in findings]},
    }


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
