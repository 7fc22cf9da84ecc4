"""The spec's own text, for checking that clause quotes and case quotes are verbatim.

A copy of ``custom-quantized-persistent-values.txt`` lives in ``docs/spec/`` so checks run on any
machine (an installed suite carries it as package data: ``conformance.locations``);
``tests/test_clauses.py`` fails when it differs from the authoritative copy next to the project
(``../shared/spec/``) where that exists.
"""

from __future__ import annotations

import functools
import pathlib
import re

from conformance.locations import docs_file, source_tree
from reference_impl.clauses import SPEC_FILE

VENDORED = docs_file("spec", SPEC_FILE)
#: The authoritative copy beside a source checkout (None when the suite is installed).
AUTHORITATIVE: pathlib.Path | None = (source_tree().parent / "shared" / "spec" / SPEC_FILE
                                      if source_tree() else None)


def normalize(text: str) -> str:
    """Whitespace-insensitive form: quotes may wrap lines differently from the spec."""
    return " ".join(text.split())


@functools.lru_cache(maxsize=1)
def spec_text() -> str:
    return VENDORED.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _normalized() -> str:
    return normalize(spec_text())


def quoted(quote: str) -> bool:
    """True when ``quote`` occurs verbatim (up to whitespace) in the spec."""
    return bool(quote.strip()) and normalize(quote) in _normalized()


def line_of(quote: str) -> int | None:
    """The 1-based spec line where ``quote`` starts, or None when it is not in the spec."""
    wanted = normalize(quote)
    for number, line in enumerate(spec_text().splitlines(), 1):
        if wanted[:60] in normalize(line):
            return number
    return None


_SENTENCE_END = re.compile(r"(?<=[.;:])\s+(?=[A-Z•])")


def sentences() -> list[tuple[int, str]]:
    """(line, sentence) for every sentence of the spec, split at sentence ends within each line."""
    found = []
    for number, line in enumerate(spec_text().splitlines(), 1):
        line = line.strip().lstrip("•").strip()
        for part in _SENTENCE_END.split(line):
            if part.strip():
                found.append((number, part.strip()))
    return found
