"""Building the dashboard site: bundles in, static HTML, one stylesheet and one script out.

Pages: ``index.html`` (runs, certification per profile, the matrix of runs by area and level, and every
case with each run's verdict, filterable), ``areas/AREA.html`` (the area's clauses and their cases),
``cases/ID.html`` (one case in full), ``compare.html`` (with a baseline) and ``spec.html`` (the spec's text
with line anchors). Every string from a bundle reaches a page through Jinja2's autoescaping; the index's
data for its script is JSON with ``<``, ``>`` and ``&`` escaped, in a non-executed ``<script>`` element.
Page names are derived from case IDs only when the ID is a plain name; any other ID gets a hashed name.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from conformance.dashboard import compare as comparing
from conformance.dashboard import deviations as peer_deviations
from conformance.dashboard import runs as bundles
from conformance.dashboard.areas import area_of, level_of
from conformance.dashboard.details import CaseDetail, collect
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, PASSED_WITHOUT_CODE

HERE = pathlib.Path(__file__).resolve().parent
LEVEL_ORDER = ("Required", "Recommended")


@dataclass(frozen=True)
class Style:
    """How a verdict is shown: a symbol (never colour alone), a short code for the script and CSS class."""

    name: str
    code: str
    symbol: str


#: The suite's verdicts; any other verdict a bundle records is shown with ``OTHER_SYMBOL``.
KNOWN = (Style(PASSED, "p", "✓"), Style(PASSED_WITHOUT_CODE, "w", "◐"), Style(FAILED, "f", "✗"),
         Style(NOT_SUPPORTED, "n", "∅"))
OTHER_SYMBOL = "⚠"
ABSENT = Style("not in this run", "a", "·")
#: What a trace cell (``trace_cells``) says, by its kind.
TRACE_MARKS = {"held": "✓ held", "failed": "✗ failed here", "unreached": "· not reached",
               "unknown": "? the message names no step", "not-supported": "∅ not supported",
               "absent": "· not in this run"}
#: Profile statuses (conformance.certificate) and their symbols.
STATUS_SYMBOLS = {"certified": "✓", "certified-with-waivers": "✓", "not certified": "✗", "partial": "◐",
                  "not run": "·"}


@dataclass
class Site:
    """What was written: the counts a caller reports."""

    directory: pathlib.Path
    runs: int
    cases: int
    pages: int
    size: int  # bytes
    comparison: comparing.Comparison | None = None


@dataclass
class CaseRow:
    """One case across the runs, as the index and area pages list it."""

    id: str
    level: str
    area: str
    profile: str
    clauses: list[str]
    outcomes: list[bundles.Outcome | None]
    page: str
    detail: CaseDetail | None = None
    text: str = field(default="", repr=False)


# ------------------------------------------------------------------------------------------------ names
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,150}$")


def page_name(key: str) -> str:
    """A file name for the page of ``key`` (a case ID or area): the key itself when it is a plain name, else
    ``_`` and its digest (no plain name starts with ``_``, so the two never collide)."""
    if _PLAIN.match(key):
        return f"{key}.html"
    return f"_{hashlib.sha256(key.encode()).hexdigest()[:24]}.html"


def script_json(value) -> str:
    """JSON safe inside an HTML ``<script>`` element: no ``<``, ``>`` or ``&`` left to end or open a tag."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def _level_key(level: str) -> tuple[int, str]:
    return (LEVEL_ORDER.index(level) if level in LEVEL_ORDER else len(LEVEL_ORDER), level)


# ------------------------------------------------------------------------------------------------ build
def build(bundle_dirs: list[str], out: str | os.PathLike, baseline: str | None = None,
          trusted_keys: list | None = None, corpus: str | None = None, jobs: int | None = None) -> Site:
    """Read the bundles (and the baseline), and write the site to ``out``. Raises ``BundleError`` (one line)
    for a malformed bundle and ``SuiteError`` for a baseline whose runtime no bundle has."""
    from conformance.adapters import SuiteError

    if pathlib.Path(out).exists() and not pathlib.Path(out).is_dir():
        raise SuiteError(f"--out {out} exists and is not a directory")
    runs = [bundles.load(directory) for directory in bundle_dirs]
    bundles.label_runs(runs)
    comparison = None
    if baseline:
        before = bundles.load(baseline)
        current = comparing.pick_current(before, runs)
        if current is None:
            raise SuiteError(f"the baseline {baseline} is a run of {before.runtime!r}, and no bundle given is")
        before.label = f"{before.runtime} (baseline)"
        comparison = comparing.compare(before, current)
    for run in runs + ([comparison.baseline] if comparison else []):
        bundles.verify(run, list(trusted_keys or []), corpus)
    case_ids = sorted({case_id for run in runs for case_id in run.outcomes})
    details = collect(case_ids, corpus, jobs)
    rows = _rows(runs, case_ids, details)
    styles = _styles(runs + ([comparison.baseline] if comparison else []))
    return _write(pathlib.Path(out), runs, rows, styles, comparison)


def _rows(runs: list[bundles.Run], case_ids: list[str], details: dict[str, CaseDetail]) -> list[CaseRow]:
    rows = []
    for case_id in case_ids:
        outcomes = [run.outcomes.get(case_id) for run in runs]
        detail = details.get(case_id)
        first = next(o for o in outcomes if o is not None)
        clauses = list(detail.clauses) if detail else list(first.clauses)
        messages = {o.message[:300] for o in outcomes if o is not None and o.verdict != PASSED}
        texts = [*clauses, *sorted(messages)]
        rows.append(CaseRow(id=case_id, level=level_of(case_id), area=area_of(case_id),
                            profile=detail.profile if detail else first.profile, clauses=clauses,
                            outcomes=outcomes, page=page_name(case_id), detail=detail,
                            text=" ".join(texts).lower()))
    rows.sort(key=lambda row: (_level_key(row.level), row.id))
    return rows


def _styles(runs: list[bundles.Run]) -> dict[str, Style]:
    styles = {style.name: style for style in KNOWN}
    others = sorted({o.verdict for run in runs for o in run.outcomes.values()} - set(styles))
    for index, name in enumerate(others):
        styles[name] = Style(name, f"o{index}", OTHER_SYMBOL)
    return styles


# ------------------------------------------------------------------------------------------------ write
def _environment():
    import jinja2

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                                     keep_trailing_newline=True)
    environment.filters["markdown"] = peer_deviations.inline_markdown
    environment.filters["page"] = page_name
    environment.filters["failed_step"] = failed_step
    return environment


_STEP = re.compile(r"^step (\d+)\b")


def failed_step(message: str) -> int | None:
    """The step a state case failed at, when its message starts with ``step N`` (as the trace runner's do)."""
    match = _STEP.match(message)
    return int(match.group(1)) if match and len(match.group(1)) < 7 else None


def _counts(rows: list[CaseRow], runs: list[bundles.Run]) -> dict:
    """level -> area -> per run a Counter of verdicts (the matrix)."""
    matrix: dict[str, dict[str, list[Counter]]] = defaultdict(dict)
    for row in rows:
        cells = matrix[row.level].setdefault(row.area, [Counter() for _ in runs])
        for index, outcome in enumerate(row.outcomes):
            if outcome is not None:
                cells[index][outcome.verdict] += 1
    return {level: dict(sorted(areas.items())) for level, areas in sorted(matrix.items(),
                                                                           key=lambda item: _level_key(item[0]))}


def _write(out: pathlib.Path, runs: list[bundles.Run], rows: list[CaseRow], styles: dict[str, Style],
           comparison: comparing.Comparison | None) -> Site:
    from conformance.spec import spec_text
    from reference_impl.clauses import CLAUSES

    for sub in ("cases", "areas", "static"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("cases", "areas"):  # pages of an earlier build in the same directory
        for stale in (out / sub).glob("*.html"):
            if stale.is_file() and not stale.is_symlink():
                stale.unlink()
    for asset in (HERE / "static").iterdir():
        target = out / "static" / asset.name
        if target.is_symlink():
            target.unlink()
        shutil.copyfile(asset, target)
    environment = _environment()
    deviations = peer_deviations.load()
    matrix = _counts(rows, runs)
    by_area: dict[str, list[CaseRow]] = defaultdict(list)
    for row in rows:
        by_area[row.area].append(row)
    verdicts = list(styles.values())
    common = {"runs": runs, "styles": styles, "verdicts": verdicts, "absent": ABSENT,
              "status_symbols": STATUS_SYMBOLS, "trace_marks": TRACE_MARKS, "comparison": comparison,
              "clauses": CLAUSES}
    profiles = sorted({profile for run in runs for profile in run.profiles} | {row.profile for row in rows})
    levels = list(matrix)
    areas = sorted(by_area)
    data = {"runs": [run.label for run in runs],
            "verdicts": [{"code": s.code, "name": s.name, "symbol": s.symbol} for s in verdicts],
            "cases": [[row.id, row.level, row.area, row.profile,
                       [styles[o.verdict].code if o else ABSENT.code for o in row.outcomes], row.text]
                      for row in rows]}
    written = 0

    def page(path: str, template: str, root: str, **values) -> None:
        nonlocal written
        text = environment.get_template(template).render(root=root, **common, **values)
        target = out / path
        if target.is_symlink():
            target.unlink()
        target.write_text(text, encoding="utf-8")
        written += 1

    totals = {level: [sum((cells[run] for cells in matrix[level].values()), Counter()) for run in range(len(runs))]
              for level in levels}
    page("index.html", "index.html.j2", "", rows=rows, matrix=matrix, totals=totals, levels=levels, areas=areas,
         profiles=profiles, data=script_json(data),
         mixed=len({(run.suite_version, run.corpus_sha256) for run in runs}) > 1)
    for area, members in by_area.items():
        page(f"areas/{page_name(area)}", "area.html.j2", "../", area=area,
             levels=[(level, matrix[level][area]) for level in levels if area in matrix[level]],
             groups=_clause_groups(members))
    for index, row in enumerate(rows):
        previous = rows[index - 1] if index else None
        following = rows[index + 1] if index + 1 < len(rows) else None
        classified = [deviations.of(run.runtime, row.id) for run in runs]
        page(f"cases/{row.page}", "case.html.j2", "../", row=row, detail=row.detail, previous=previous,
             following=following, classified=classified, findings=_findings(classified),
             trace=trace_cells(row.outcomes, len(row.detail.steps)) if row.detail else [],
             baseline=_baseline_of(comparison, row.id))
    if comparison:
        pages = {row.id: row.page for row in rows}
        page("compare.html", "compare.html.j2", "", sections=comparing.SECTIONS, pages=pages)
    elif (out / "compare.html").is_file():
        (out / "compare.html").unlink()
    page("spec.html", "spec.html.j2", "", lines=spec_text().splitlines())
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    return Site(out, len(runs), len(rows), written, size, comparison)


def _clause_groups(rows: list[CaseRow]) -> list[tuple[str, list[CaseRow]]]:
    """(clause, its cases) for the clauses the cases cite, in the spec's order (unknown clauses last)."""
    groups: dict[str, list[CaseRow]] = {}
    for row in rows:
        for clause in row.clauses or ["(no clause)"]:
            groups.setdefault(clause, []).append(row)
    from reference_impl.clauses import CLAUSES

    order = {clause: index for index, clause in enumerate(CLAUSES)}
    return sorted(groups.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))


@dataclass(frozen=True)
class TraceCell:
    """One run's cell in a state trace table, spanning ``rows`` steps: what the run's result says of them."""

    run: int
    rows: int
    kind: str  # held, failed, unreached, unknown, not-supported, absent


def trace_cells(outcomes: list[bundles.Outcome | None], steps: int) -> list[list[TraceCell]]:
    """Per step, the cells that start at it: a run that passed held every step; one whose message starts
    with ``step N`` held the steps before N and failed at N (the trace stops at its first failure)."""
    starts: list[list[TraceCell]] = [[] for _ in range(steps)]
    if not steps:
        return starts
    for run, outcome in enumerate(outcomes):
        if outcome is None or outcome.verdict == NOT_SUPPORTED or outcome.verdict in (PASSED, PASSED_WITHOUT_CODE):
            kind = "absent" if outcome is None else "not-supported" if outcome.verdict == NOT_SUPPORTED else "held"
            starts[0].append(TraceCell(run, steps, kind))
            continue
        at = failed_step(outcome.message)
        if at is None:
            starts[0].append(TraceCell(run, steps, "unknown"))
            continue
        if at:
            starts[0].append(TraceCell(run, min(at, steps), "held"))
        if at < steps:
            starts[at].append(TraceCell(run, 1, "failed"))
            if at + 1 < steps:
                starts[at + 1].append(TraceCell(run, steps - at - 1, "unreached"))
    for cells in starts:
        cells.sort(key=lambda cell: cell.run)
    return starts


def _findings(classified: list) -> list:
    """The distinct findings of a case's classified runs, in the order of the runs."""
    seen: dict[str, object] = {}
    for found in classified:
        if found and found[1] is not None:
            seen.setdefault(found[1].name, found[1])
    return list(seen.values())


def _baseline_of(comparison: comparing.Comparison | None, case_id: str) -> tuple[str, bundles.Outcome] | None:
    """The compared runtime's label and its baseline outcome for the case, when there is a comparison."""
    if comparison is None or case_id not in comparison.baseline.outcomes:
        return None
    return comparison.current.label, comparison.baseline.outcomes[case_id]
