"""Expected-failure lists, as in protobuf's conformance suite, with hygiene.

One entry per line: ``CASE_ID  # message`` (the message is a fragment the failure message must still
contain; glob patterns are allowed). Blank lines and lines starting with ``#`` are comments.

Hygiene: an entry that matches no case, a listed case that now passes (or is not supported), or a
listed failure whose message no longer contains the recorded fragment fails the run.
"""

from __future__ import annotations

import fnmatch
import pathlib
from dataclasses import dataclass

from conformance.adapters import SuiteError
from conformance.execute import FAILED, PASSING, Result
from conformance.text import clip


@dataclass
class Entry:
    pattern: str
    message: str
    line: int

    def matches(self, case_id: str) -> bool:
        return fnmatch.fnmatchcase(case_id, self.pattern)


def read(path: str | pathlib.Path) -> list[Entry]:
    entries = []
    try:
        text = pathlib.Path(path).read_text()
    except FileNotFoundError:
        raise SuiteError(f"failure list {path} does not exist (create it, or write it with "
                         "--update-failure-list)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SuiteError(f"failure list {path} cannot be read: {error}") from None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pattern, _, message = stripped.partition("#")
        entries.append(Entry(pattern.strip(), message.strip(), number))
    return entries


def upgrade(entries: list[Entry], all_ids: list[str], renames: dict[str, str]) -> tuple[list[Entry], list[str]]:
    """The entries with each one that names cases only by their IDs before a rename replaced by one entry
    per current ID (same message and line), and a one-line note per such entry."""
    from conformance.renames import note, renamed_targets

    upgraded: list[Entry] = []
    notes: list[str] = []
    for entry in entries:
        targets = renamed_targets(entry.pattern, renames, all_ids, _glob) if renames else []
        if not targets:
            upgraded.append(entry)
            continue
        upgraded += [Entry(target, entry.message, entry.line) for target in targets]
        notes.append(f"line {entry.line}: {note('entry', entry.pattern, targets)} (--update-failure-list "
                     "rewrites the list)")
    return upgraded, notes


def _glob(pattern: str, case_id: str) -> bool:
    return fnmatch.fnmatchcase(case_id, pattern)


def apply(entries: list[Entry], results: list[Result], all_ids: list[str]) -> list[str]:
    """Mark listed failures as expected; return the hygiene problems (empty when the list is clean)."""
    problems = []
    selected = {r.id: r for r in results}
    for entry in entries:
        if not any(entry.matches(case_id) for case_id in all_ids):
            problems.append(f"line {entry.line}: {entry.pattern!r} matches no case")
    for result in results:
        entry = next((e for e in entries if e.matches(result.id)), None)
        if entry is None:
            continue
        if result.verdict in PASSING:
            how = "now passes" if result.verdict == PASSING[0] else "now passes without code"
            problems.append(f"line {entry.line}: {result.id} is listed as failing but {how}")
        elif result.verdict == FAILED:
            if entry.message and entry.message not in result.message:
                problems.append(f"line {entry.line}: {result.id} fails with a different message: "
                                f"{result.message!r} (listed: {entry.message!r})")
            else:
                result.expected_failure = True
        else:
            problems.append(f"line {entry.line}: {result.id} is listed as failing but is {result.verdict}")
    del selected
    return problems


def write(path: str | pathlib.Path, results: list[Result], header: str = "") -> int:
    """Write every failing case with its message; returns how many were written."""
    failing = [r for r in results if r.verdict == FAILED]
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    lines += [f"{r.id}  # {_fragment(r.message)}" for r in sorted(failing, key=lambda r: r.id)]
    pathlib.Path(path).write_text("\n".join(lines) + ("\n" if lines else ""))
    return len(failing)


def _fragment(message: str) -> str:
    """A stable, single-line prefix of a failure message, cut at a word boundary."""
    text = " ".join(message.split()).replace("#", "")
    clipped = clip(text, 160)
    return clipped[: -len(" …")] if clipped != text else text
