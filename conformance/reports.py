"""Reports of a run: per-case JSON, JUnit XML, and a Markdown summary fit for a CI job summary."""

from __future__ import annotations

import json
import pathlib
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import asdict

from conformance.execute import CRASHED, FAILED, NOT_SUPPORTED, PASSED, PASSED_WITHOUT_CODE, Result
from conformance.runner import RunInfo, summary_line
from conformance.text import clip

MAX_LISTED_FAILURES = 50


def safe_name(case_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", case_id)


def write_json(directory: pathlib.Path, results: list[Result], info: RunInfo,
               problems: list[str] | None = None) -> None:
    cases_dir = directory / "cases"
    cases_dir.mkdir(parents=True, exist_ok=True)
    for result in results:
        (cases_dir / f"{safe_name(result.id)}.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    payload = {"run": asdict(info), "summary": summary_line(results), "problems": list(problems or []),
               "results": [r.to_json() for r in results]}
    (directory / "results.json").write_text(json.dumps(payload, indent=1) + "\n")


def junit_xml(results: list[Result], info: RunInfo) -> bytes:
    suites = ET.Element("testsuites", name=info.suite.get("name", "conformance"))
    by_area: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        by_area[".".join(result.id.split(".")[:2])].append(result)
    for area, group in sorted(by_area.items()):
        failures = sum(r.verdict == FAILED and not r.expected_failure for r in group)
        skipped = sum(r.verdict == NOT_SUPPORTED or r.expected_failure for r in group)
        errors = sum(r.verdict == CRASHED for r in group)
        suite = ET.SubElement(suites, "testsuite", name=area, tests=str(len(group)), failures=str(failures),
                              skipped=str(skipped), errors=str(errors), time=f"{sum(r.duration for r in group):.3f}")
        for result in group:
            case = ET.SubElement(suite, "testcase", classname=area, name=result.id, time=f"{result.duration:.4f}")
            if result.verdict == PASSED_WITHOUT_CODE:
                # JUnit has no such outcome: a passed test case that says so in a property and its output.
                properties = ET.SubElement(case, "properties")
                ET.SubElement(properties, "property", name="verdict", value=PASSED_WITHOUT_CODE)
                ET.SubElement(case, "system-out").text = f"{PASSED_WITHOUT_CODE}: {result.message}"
            if result.verdict == FAILED and not result.expected_failure:
                failure = ET.SubElement(case, "failure", message=clip(result.message, 500))
                failure.text = "\n".join(filter(None, [f"expected: {result.expected}", f"actual: {result.actual}",
                                                        result.detail, result.traceback]))
            elif result.verdict == FAILED:
                ET.SubElement(case, "skipped", message=f"expected failure: {clip(result.message, 400)}")
            elif result.verdict == NOT_SUPPORTED:
                ET.SubElement(case, "skipped", message=f"not supported: {clip(result.message, 400)}")
            elif result.verdict == CRASHED:  # the process running the case died: JUnit's error, not a failure
                error = ET.SubElement(case, "error", type=CRASHED, message=clip(result.message, 500))
                error.text = "\n".join(filter(None, [f"actual: {result.actual}", result.traceback]))
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


def markdown(results: list[Result], info: RunInfo, problems: list[str] | None = None,
             statuses: dict[str, str] | None = None) -> str:
    adapter = info.adapter
    lines = [f"## Conformance: {adapter.get('name')} ({adapter.get('version')})", "",
             f"**{summary_line(results)}** in {info.duration:.1f} s — suite {info.suite.get('version')}, "
             f"spec revision {info.spec.get('revision')}", ""]
    crashes = any(r.verdict == CRASHED for r in results)
    lines += ["| Profile | Passed | Passed without code | Failed | Not supported | Expected failures |"
              + (" Crashed |" if crashes else ""),
              "| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if crashes else "")]
    by_profile: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        by_profile[result.profile].append(result)
    for profile, group in sorted(by_profile.items()):
        counts = _counts(group)
        lines.append(f"| {profile} | {counts[PASSED]} | {counts[PASSED_WITHOUT_CODE]} | {counts[FAILED]} | "
                     f"{counts[NOT_SUPPORTED]} | {counts['xfail']} |" + (f" {counts[CRASHED]} |" if crashes else ""))
    if statuses is not None:
        lines += _certification(results, statuses, bool(info.selection.get("full",
                                                                          _full(info.selection))))
    crashed = [r for r in results if r.verdict == CRASHED]
    if crashed:
        lines += ["", f"### Crashed ({len(crashed)})", "",
                  "The process running each of these cases died; the run went on in a new one.", ""]
        lines += [f"- `{r.id}` — {_md(r.message)}" for r in crashed[:MAX_LISTED_FAILURES]]
        if len(crashed) > MAX_LISTED_FAILURES:
            lines.append(f"- … and {len(crashed) - MAX_LISTED_FAILURES} more (see results.json)")
    failing = [r for r in results if r.verdict == FAILED and not r.expected_failure]
    if failing:
        lines += ["", f"### Failures ({len(failing)})", ""]
        for result in failing[:MAX_LISTED_FAILURES]:
            lines.append(f"- `{result.id}` — {_md(result.message)}")
        if len(failing) > MAX_LISTED_FAILURES:
            lines.append(f"- … and {len(failing) - MAX_LISTED_FAILURES} more (see results.json)")
    uncoded = [r for r in results if r.verdict == PASSED_WITHOUT_CODE]
    if uncoded:
        lines += ["", f"### Passed without code ({len(uncoded)})", "",
                  "Rejected as expected, but without an error code: the suite cannot tell the rejection was for "
                  "the reason the case tests, so these cases do not certify their profile.", ""]
        lines += [f"- `{r.id}`" for r in uncoded[:MAX_LISTED_FAILURES]]
        if len(uncoded) > MAX_LISTED_FAILURES:
            lines.append(f"- … and {len(uncoded) - MAX_LISTED_FAILURES} more (see results.json)")
    if problems:
        lines += ["", "### Failure-list problems", ""] + [f"- {_md(p)}" for p in problems]
    return "\n".join(lines) + "\n"


def _full(selection: dict) -> bool:
    from conformance.certificate import is_full_selection

    return is_full_selection(selection)


def _certification(results: list[Result], statuses: dict[str, str], full: bool) -> list[str]:
    """Each claimed profile's status and what blocks it; Required cases answered "not supported" in a
    claimed profile are listed one by one, with the checks they needed, since they silently cost it."""
    lines = ["", "### Certification", "", "| Profile | Status | Blocking |", "| --- | --- | --- |"]
    for profile, status in sorted(statuses.items()):
        group = [r for r in results if r.profile == profile]
        lines.append(f"| {profile} | {status} | {_blocking(group, status, full)} |")
    if not full:
        lines += ["", "A partial run (`--cases`, `--level`, `--profile` or a single `--shard`) certifies no profile."]
    unsupported = [r for r in results if r.profile in statuses and r.level == "Required" and r.verdict == NOT_SUPPORTED]
    if unsupported:
        lines += ["", f"### Not supported in a claimed profile ({len(unsupported)})", "",
                  "The runtime claims these cases' profiles but not the check each needs: each blocks its "
                  "profile's certification.", ""]
        lines += [f"- `{r.id}` ({r.profile}; needs {', '.join(r.clauses) or 'its operation'}) — {_md(r.message)}"
                  for r in unsupported[:MAX_LISTED_FAILURES]]
        if len(unsupported) > MAX_LISTED_FAILURES:
            lines.append(f"- … and {len(unsupported) - MAX_LISTED_FAILURES} more (see results.json)")
    return lines


def _blocking(group: list[Result], status: str, full: bool) -> str:
    from conformance.certificate import EARNED, NOT_RUN, PARTIAL

    if status in EARNED:
        return "—"
    if status == NOT_RUN:
        return "no case of the profile ran"
    blockers = [r for r in group if r.verdict != PASSED and (r.level == "Required" or not r.expected_failure)]
    kinds: dict[str, int] = defaultdict(int)
    for result in blockers:
        kinds[f"{result.level} {result.verdict}"] += 1
    text = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    if status == PARTIAL:
        text = (text + "; " if text else "") + ("the run's selection was partial" if not full
                                                else "the run did not cover every case of the profile")
    return text or status


def _counts(group: list[Result]) -> dict:
    return {PASSED: sum(r.verdict == PASSED for r in group),
            PASSED_WITHOUT_CODE: sum(r.verdict == PASSED_WITHOUT_CODE for r in group),
            FAILED: sum(r.verdict == FAILED and not r.expected_failure for r in group),
            NOT_SUPPORTED: sum(r.verdict == NOT_SUPPORTED for r in group),
            CRASHED: sum(r.verdict == CRASHED for r in group),
            "xfail": sum(r.verdict == FAILED and r.expected_failure for r in group)}


#: Characters a runtime's message could use for Markdown or HTML markup in a summary.
_MARKUP = str.maketrans({**{c: "\\" + c for c in "\\`*_[]<>|#!~"}, "\n": " ", "\r": " "})


def _md(text: str) -> str:
    """A runtime's text, inert in Markdown: every markup character escaped, one line."""
    return clip(text, 300).translate(_MARKUP)


def write_all(directory: str | pathlib.Path, results: list[Result], info: RunInfo,
              problems: list[str] | None = None, statuses: dict[str, str] | None = None) -> pathlib.Path:
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory, results, info, problems)
    (directory / "junit.xml").write_bytes(junit_xml(results, info))
    (directory / "summary.md").write_text(markdown(results, info, problems, statuses))
    return directory
