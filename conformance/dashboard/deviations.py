"""The classification of peer failures, read from docs/peer-deviations.md.

The document has one ``## <runtime> <version>`` section per peer with a table ``| `case` | class |
[FINDING](#anchor) |`` and ``### FINDING`` sections (in the peer's section or under "Shared findings")
that explain the finding in prose and give a standalone reproduction in fenced code blocks. This module
reads both into plain data; nothing in the document is executed.
"""

from __future__ import annotations

import functools
import pathlib
import re
from dataclasses import dataclass

from conformance.locations import docs_file

DOCUMENT = docs_file("peer-deviations.md")
#: Section title prefix in the document -> the adapter name its runs record.
SECTIONS = {"onnxruntime": "onnxruntime", "onnx reference evaluator": "onnx-reference", "OpenVINO": "openvino",
            "tract": "tract"}
_ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+?) \| \[([^\]]+)\]\(#[^)]*\) \|")


@dataclass(frozen=True)
class Classification:
    """How the document classifies one case's failure on one peer."""

    kind: str  # runtime deviation, adapter limitation, suite case under review, documented waiver
    finding: str  # the finding's heading, e.g. OV-SCATTER
    section: str  # the document's section title, e.g. "OpenVINO 2026.4.1"


@dataclass(frozen=True)
class Finding:
    """A finding's explanation: paragraphs of prose and code blocks, in the document's order."""

    name: str
    blocks: tuple[tuple[str, str], ...]  # ("text", paragraph) or ("code", source)


@dataclass(frozen=True)
class Deviations:
    classes: dict[str, dict[str, Classification]]  # adapter name -> case ID -> classification
    findings: dict[str, Finding]

    def of(self, runtime: str, case_id: str) -> tuple[Classification, Finding | None] | None:
        classification = self.classes.get(runtime, {}).get(case_id)
        if classification is None:
            return None
        return classification, self.findings.get(classification.finding)


def parse(text: str) -> Deviations:
    """The classifications and findings of the document ``text``."""
    classes: dict[str, dict[str, Classification]] = {}
    findings: dict[str, list[tuple[str, str]]] = {}
    adapter = section = finding = None
    paragraph: list[str] = []
    code: list[str] | None = None

    def flush() -> None:
        if finding and paragraph:
            findings[finding].append(("text", " ".join(paragraph)))
        paragraph.clear()

    for line in text.splitlines():
        if code is not None:
            if line.startswith("```"):
                if finding:
                    findings[finding].append(("code", "\n".join(code)))
                code = None
            else:
                code.append(line)
            continue
        if line.startswith("```"):
            flush()
            code = []
        elif line.startswith("## "):
            flush()
            finding, section = None, line[3:].strip()
            adapter = next((name for title, name in SECTIONS.items() if section.startswith(title)), None)
        elif line.startswith("### "):
            flush()
            finding = line[4:].strip()
            findings.setdefault(finding, [])
        elif adapter and not finding and (row := _ROW.match(line)):
            classes.setdefault(adapter, {})[row.group(1)] = Classification(row.group(2).strip(), row.group(3),
                                                                           section or "")
        elif not line.strip():
            flush()
        elif finding:
            paragraph.append(line.strip())
    flush()
    return Deviations(classes, {name: Finding(name, tuple(blocks)) for name, blocks in findings.items()})


@functools.lru_cache(maxsize=2)
def load(path: str | None = None) -> Deviations:
    """The document at ``path`` (default: the suite's own), or no classification when it is missing."""
    document = pathlib.Path(path) if path else DOCUMENT
    if not document.is_file():
        return Deviations({}, {})
    return parse(document.read_text(encoding="utf-8"))


_INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`|\[([^\]]+)\]\([^)]*\)")


def inline_markdown(text: str):
    """A paragraph with its bold, code and link text kept as markup (a ``markupsafe.Markup``): the text is
    escaped first, so only the tags this function writes are markup."""
    from markupsafe import Markup, escape

    out, last = [], 0
    for match in _INLINE.finditer(text):
        out.append(escape(text[last:match.start()]))
        bold, code, link = match.groups()
        if bold is not None:
            out.append(Markup("<strong>%s</strong>") % inline_markdown(bold))
        elif code is not None:
            out.append(Markup("<code>%s</code>") % code)
        else:
            out.append(escape(link))
        last = match.end()
    out.append(escape(text[last:]))
    return Markup("").join(out)
