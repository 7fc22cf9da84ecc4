"""docs/spec-coverage.md is rendered from the audit's committed kill matrix and cannot go stale."""

from __future__ import annotations

from conformance import spec
from conformance.audit import coverage
from conformance.audit.audit import clause_table
from reference_impl.clauses import CLAUSES


def test_the_document_is_current():
    assert coverage.DOCUMENT.read_text() == coverage.render(coverage.load_matrix()), \
        "run python -m conformance spec-coverage --write"


def test_every_statement_is_listed_with_its_spec_line():
    text = coverage.DOCUMENT.read_text()
    for clause in CLAUSES.values():
        for quote in clause.quotes:
            line = spec.line_of(quote)
            assert line is not None
            assert f"| {line} | {coverage._cell(quote)} | {clause.id} |" in text


def test_statuses_come_from_the_audit():
    matrix = coverage.load_matrix()
    status = coverage.statuses(matrix)
    table = clause_table(matrix["faults"])
    for cid, clause in CLAUSES.items():
        row = table[cid]
        if clause.kind in ("internal", "native", "size", "process"):
            assert status[cid].startswith("not testable")
        elif row["faults"] and not row["surviving"]:
            assert status[cid].startswith("full")
        else:
            assert status[cid].startswith("partial")
    total = coverage.counts(matrix)
    assert total["full"] >= 140
    assert total["full"] + total["partial"] + total["not testable"] == total["statements"]


def test_a_surviving_fault_makes_its_statements_partial():
    matrix = coverage.load_matrix()
    fault = next(f for f in matrix["faults"] if f["clauses"][0] == "EX-CODEBOOK")
    fault["caught_by"] = []
    fault["pending"] = "a case decoding E4"
    assert coverage.statuses(matrix)["EX-CODEBOOK"].startswith("partial: `EX-CODEBOOK")
