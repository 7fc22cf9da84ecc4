"""What the site shows of a case from the corpus: its clauses, spec sentences with their lines, model in
text form, inputs and, for a state case, its steps.

Building the models of the builder-made cases is most of a site's build time, so ``collect`` spreads the
cases over worker processes, and ``model_head`` stops formatting a model once it has the lines it shows.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from conformance.cases import Case, file_bytes, load_cases
from conformance.spec import normalize, spec_text

#: Model text lines a case page shows, and the width of one.
MODEL_LINES = 120
LINE_WIDTH = 160
#: Steps of a state trace a case page shows, and the characters of one step's literal.
MAX_STEPS = 200
STEP_WIDTH = 600


@dataclass
class Quote:
    text: str
    first_line: int | None
    last_line: int | None


@dataclass
class Step:
    index: int
    op: str
    state: str
    given: str
    expected: str


@dataclass
class CaseDetail:
    """The corpus's side of a case page (the runs' side comes from the bundles)."""

    id: str
    level: str
    profile: str
    op: str
    source: str
    description: str
    summary: str
    expectation_source: str
    clauses: list[str]
    quotes: list[Quote]
    expect: str
    inputs: list[tuple[str, str]]
    model: list[str]
    model_more: bool
    steps: list[Step] = field(default_factory=list)
    steps_more: int = 0


# ------------------------------------------------------------------------------------------ spec lines
@functools.lru_cache(maxsize=1)
def _spec_words() -> tuple[str, list[int], list[int]]:
    """The spec with whitespace normalized, each word's offset in it, and each word's line number."""
    words, lines = [], []
    for number, line in enumerate(spec_text().splitlines(), 1):
        for word in line.split():
            words.append(word)
            lines.append(number)
    offsets, at = [], 0
    for word in words:
        offsets.append(at)
        at += len(word) + 1
    return " ".join(words), offsets, lines


def quote_lines(quote: str) -> tuple[int, int] | None:
    """The first and last spec line of ``quote`` (matched up to whitespace), or None when it is not there."""
    text, offsets, lines = _spec_words()
    wanted = normalize(quote)
    at = text.find(wanted) if wanted else -1
    if at < 0:
        return None
    first = bisect.bisect_right(offsets, at) - 1
    last = bisect.bisect_right(offsets, at + len(wanted) - 1) - 1
    return lines[first], lines[last]


# ------------------------------------------------------------------------------------------ model text
class _Enough(Exception):
    """Raised by ``_HeadWriter`` once it holds the lines shown: ends the formatting early."""


class _HeadWriter:
    def __init__(self, lines: int):
        self.parts: list[str] = []
        self.newlines = 0
        self.limit = lines

    def write(self, text: str) -> None:
        self.parts.append(text)
        self.newlines += text.count("\n")
        if self.newlines > self.limit:
            raise _Enough


def model_head(case: Case, lines: int = MODEL_LINES) -> tuple[list[str], bool]:
    """The case's model in protobuf text format, at most ``lines`` lines of ``LINE_WIDTH`` characters, and
    whether it goes on. A text-defined case shows its own text; a built one is formatted from its bytes."""
    from google.protobuf import text_format

    from reference_impl import schema

    if case.model_text is not None and not case.merge and not case.builder:
        text = case.model_text.strip().splitlines()
    else:
        try:
            model = schema.parse_model(case.model_bytes())
        except Exception as error:  # noqa: BLE001 - raw-byte builders may not parse as a model
            return [f"({len(case.model_bytes())} bytes that do not parse as a model: {error})"], False
        writer = _HeadWriter(lines)
        try:
            text_format.PrintMessage(model, writer)
        except _Enough:
            pass
        text = "".join(writer.parts).splitlines()
    shown = [line if len(line) <= LINE_WIDTH else line[:LINE_WIDTH] + " …" for line in text[:lines]]
    return shown, len(text) > lines


# ------------------------------------------------------------------------------------------ one case
def detail(case: Case) -> CaseDetail:
    """Everything the case page shows from the corpus for ``case``."""
    from conformance.explain import expected_text, literal_text

    model, more = model_head(case)
    quotes = [Quote(text, *(quote_lines(text) or (None, None))) for text in case.quote]
    inputs = [("operation", case.op)]
    if case.value:
        inputs.append(("value", case.value))
    if case.target:
        inputs.append(("export target", case.target))
    if case.rewrite:
        inputs.append(("rewrite", json.dumps(case.rewrite, default=str)))
    if case.builder:
        inputs.append(("built by", f"{case.builder}({json.dumps(case.args, default=str)})"))
    # a text case's files are its manifest's (building it just to list them would parse its model text)
    files = case.external_files() if case.builder else {relative: file_bytes(spec, case.id)
                                                        for relative, spec in case.files.items()}
    for relative, data in sorted(files.items()):
        inputs.append(("external file", f"{relative} ({len(data)} bytes)"))
    steps = [Step(index, str(step.get("op", "")), str(step.get("state", "")), _cut(literal_text(step)),
                  _cut(expected_text(step))) for index, step in enumerate(case.state_steps()[:MAX_STEPS])]
    return CaseDetail(id=case.id, level=case.level, profile=case.profile, op=case.op, source=case.source,
                      description=case.description, summary=case.summary(),
                      expectation_source=case.expectation_source, clauses=list(case.clauses), quotes=quotes,
                      expect=json.dumps(case.expect, default=str) if case.expect else "", inputs=inputs,
                      model=model, model_more=more, steps=steps,
                      steps_more=max(len(case.state_steps()) - MAX_STEPS, 0))


def _cut(text: str) -> str:
    return text if len(text) <= STEP_WIDTH else f"{text[:STEP_WIDTH]} … ({len(text) - STEP_WIDTH} more characters)"


_CORPUS: dict = {}


def _details_of(ids: list[str]) -> list[CaseDetail]:
    cases = _CORPUS["cases"]
    return [detail(cases[case_id]) for case_id in ids]


def collect(case_ids: list[str], corpus: str | None = None, jobs: int | None = None) -> dict[str, CaseDetail]:
    """The details of the ``case_ids`` that are cases of the corpus (others are left out), over ``jobs``
    worker processes (default: up to two, as the models are built in parallel)."""
    cases = {case.id: case for case in load_cases(corpus)}
    wanted = [case_id for case_id in case_ids if case_id in cases]
    jobs = jobs or min(2, os.cpu_count() or 1)
    _CORPUS["cases"] = cases
    if jobs <= 1 or len(wanted) < 50 or not _can_fork():
        found = _details_of(wanted)
    else:
        import multiprocessing

        chunks = [wanted[index::jobs * 4] for index in range(jobs * 4)]
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            found = [item for chunk in pool.map(_details_of, chunks) for item in chunk]
    return {item.id: item for item in found}


def _can_fork() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()
