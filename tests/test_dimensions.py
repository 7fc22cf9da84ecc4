"""The dimension table (corpus/dimensions.toml): every area decides every dimension, every pattern selects
a case, and docs/audit/dimensions.md is rendered from the current table and corpus."""

from __future__ import annotations

import pytest

from conformance import dimensions
from conformance.areas import AREAS
from conformance.locations import corpus_dir


def _table_text() -> str:
    return (corpus_dir() / "dimensions.toml").read_text(encoding="utf-8")


def test_the_committed_document_is_current():
    assert dimensions.main(["--check"]) == 0


def test_every_area_decides_every_dimension_and_every_pattern_selects_a_case():
    cells = dimensions.load_table(_table_text())
    assert len(cells) == len(AREAS) * len(dimensions.DIMENSIONS)
    ids = [f"Required.{area.name}.Topic.Name" for area in AREAS]
    with pytest.raises(dimensions.DimensionsError, match="selects no case"):
        for cell in cells:
            dimensions.covered_ids(cell, ids)


def test_an_undecided_dimension_is_refused():
    text = _table_text().replace('identity = { cases = ["*.State.Identity.*"] }\n', "")
    with pytest.raises(dimensions.DimensionsError, match=r"\[State\] identity"):
        dimensions.load_table(text)


@pytest.mark.parametrize("cell, message", [
    ('sizes = { cases = [] }', "non-empty list"),
    ('sizes = { not-applicable = "" }', "reason in words"),
    ('sizes = { maybe = "later" }', "must be one of"),
])
def test_a_malformed_cell_is_refused(cell, message):
    text = _table_text().replace(
        'sizes = { not-applicable = "export rewrites graphs; payload bytes pass through unchanged" }', cell)
    with pytest.raises(dimensions.DimensionsError, match=message):
        dimensions.load_table(text)


def test_an_area_outside_the_outline_is_refused():
    with pytest.raises(dimensions.DimensionsError, match="outside the outline"):
        dimensions.load_table(_table_text() + '\n[KVMore]\npositions = { lacking = "x" }\n')


def test_a_family_lists_the_dimensions_its_cases_cover():
    cells = [dimensions.Cell("Wire", name, not_applicable="n/a") for name in dimensions.DIMENSIONS]
    cells[0] = dimensions.Cell("Wire", "positions", patterns=("*.Wire.Walk.*",))
    text = dimensions.render(cells, ["Required.Wire.Walk.Last", "Required.Wire.Other.One"])
    assert "| Wire.Walk | Required | positions |" in text
    assert "| Wire.Other | Required | — |" in text
