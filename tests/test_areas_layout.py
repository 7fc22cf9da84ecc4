"""The suite is organized by the spec's outline (conformance/areas.py): every case ID names an area of the
table, every manifest lives in its area's folder, every area comes from real spec headings and owns the
clause prefixes of its rules, and no case ID, file or module name records the round of work it came from."""

from __future__ import annotations

import pathlib
import re

import pytest

from conformance.areas import AREAS, BY_NAME, UNCASED_PREFIXES, area_of_clause
from conformance.cases import load_cases
from reference_impl.clauses import CLAUSES, SPEC_FILE

ROOT = pathlib.Path(__file__).resolve().parents[1]
HISTORY_WORDS = {"more", "thin", "second", "mut", "edges", "gaps", "extra", "new", "v2"}
SCANNED = ("corpus", "conformance", "tests", "fuzz", "reference_impl", "benchmarks")
#: Files exempt from the history-word rule (none).
ALLOWED: set[str] = set()


def _words(name: str) -> set[str]:
    """The words of an identifier or file name: ``_``, ``-``, ``.``, ``/`` separate them, and so do capitals."""
    parts = re.split(r"[/_\-.]", name)
    return {word.lower() for part in parts for word in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", part)}


def test_every_case_id_names_an_area_of_the_outline():
    strays = sorted(c.id for c in load_cases() if c.id.split(".")[1] not in BY_NAME)
    assert strays == []


def test_every_manifest_lives_in_the_folder_of_its_cases_area():
    misplaced = []
    for case in load_cases():
        parts = pathlib.PurePosixPath(case.source).parts  # cases/<folder>/x.toml or regressions/cases/<folder>/..
        if parts[-2] != BY_NAME[case.area].folder:
            misplaced.append(f"{case.id} in {case.source}")
    assert misplaced == []
    top = [p.name for p in (ROOT / "corpus" / "cases").glob("*.toml") if not p.name.startswith("_")]
    assert top == [], "manifests belong in corpus/cases/<area folder>/"


def test_areas_come_from_spec_headings_and_own_their_clauses():
    headings = {line[:-1] for line in (ROOT / "docs" / "spec" / SPEC_FILE).read_text().splitlines()
                if line.endswith("#")}
    prefixes = [p for area in AREAS for p in area.prefixes]
    assert len(prefixes) == len(set(prefixes)), "a clause prefix belongs to one area"
    for area in AREAS:
        assert set(area.sections) <= headings, area.name
    for clause_id, clause in CLAUSES.items():
        area = area_of_clause(clause_id)
        if area is None:
            assert clause_id.split("-")[0] in UNCASED_PREFIXES, clause_id
            continue
        assert clause.section in area.sections, f"{clause_id} ({clause.section}) is outside {area.name}"


def test_no_history_word_in_case_ids():
    found = []
    for case in load_cases():
        level, area, topic, *names = case.id.split(".")
        if (_words(area) | _words(topic)) & HISTORY_WORDS or {n.lower() for n in names} & HISTORY_WORDS:
            found.append(case.id)
    assert found == []


def test_no_history_word_in_file_or_module_names():
    found = []
    for folder in SCANNED:
        for path in (ROOT / folder).rglob("*"):
            relative = path.relative_to(ROOT).as_posix()
            if "__pycache__" in path.parts or relative in ALLOWED:
                continue
            if _words(path.relative_to(ROOT / folder).as_posix()) & HISTORY_WORDS:
                found.append(relative)
    assert found == []


def test_the_history_word_check_sees_camel_case_and_segments():
    assert _words("Required.AffineMore.Axis") & HISTORY_WORDS == {"more"}
    assert _words("corpus/cases/thin_state.toml") & HISTORY_WORDS == {"thin"}
    assert _words("tests/test_zero_copy_lifetime_cases.py") & HISTORY_WORDS == set()


def test_the_outline_table_of_the_guide_is_current():
    """docs/conformance.md's outline names exactly the files each area's name finds."""
    from conformance import outline

    assert outline.main(["--check"]) == 0, "python -m conformance.outline --write"


def test_every_fault_module_is_named_after_an_area():
    """A fault is found by its area's name: each module of conformance/audit/faults/ starts with an area's
    folder (shared.py holds mechanisms several areas use)."""
    from conformance.areas import AREAS

    folders = tuple(area.folder for area in AREAS)
    modules = [path.stem for path in (ROOT / "conformance" / "audit" / "faults").glob("*.py")
               if path.stem not in ("__init__", "shared")]
    assert [name for name in modules if not name.startswith(folders)] == []


def test_a_generated_section_is_replaced_whole_and_missing_markers_are_refused():
    from conformance.generated_section import replace_section

    text = "intro\n<!-- a -->\nold\nlines\n<!-- b -->\nrest\n"
    assert replace_section(text, "<!-- a -->", "<!-- b -->", "new\n") == "intro\n<!-- a -->\nnew\n<!-- b -->\nrest\n"
    with pytest.raises(ValueError, match="no markers"):
        replace_section("no markers here", "<!-- a -->", "<!-- b -->", "new\n")
