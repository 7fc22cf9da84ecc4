"""The clause registry tells the truth: every quote is the spec's own words, every normative sentence
of the spec belongs to a clause, codes and tests cite real clauses, and the tables are current."""

from __future__ import annotations

import re

import clause_coverage
import pytest

from conformance import spec
from reference_impl.clauses import CLAUSES, INFORMATIVE, KINDS
from reference_impl.errors import ContractError, ErrorCode

#: words that make a sentence normative (or restrictive enough to need a clause or a reason)
NORMATIVE = re.compile(r"\b(must|requires?|required|rejects?|rejected|invalid|cannot|never|only|errors?|fails?|"
                       r"fail|exactly|mutually|may|unsupported|is not|are not|no)\b", re.I)


def test_the_vendored_spec_is_the_authoritative_one():
    if not spec.AUTHORITATIVE.exists():
        pytest.skip(f"no authoritative copy at {spec.AUTHORITATIVE} on this machine")
    assert spec.VENDORED.read_bytes() == spec.AUTHORITATIVE.read_bytes(), \
        "the spec changed: copy it to docs/spec/ and review every clause and case quote"


def test_every_clause_quote_is_verbatim_spec_text():
    wrong = [(clause.id, quote) for clause in CLAUSES.values() for quote in clause.quotes
             if not spec.quoted(quote)]
    assert not wrong


def test_clauses_are_well_formed():
    for clause in CLAUSES.values():
        assert clause.kind in KINDS, clause.id
        assert clause.quotes or clause.kind == "limit", f"{clause.id} quotes no spec text"
        assert clause.text


def test_every_normative_sentence_belongs_to_a_clause():
    quotes = [spec.normalize(q) for clause in CLAUSES.values() for q in clause.quotes]
    reasons = [spec.normalize(key) for key in INFORMATIVE]
    orphans = []
    for line, sentence in spec.sentences():
        if not NORMATIVE.search(sentence):
            continue
        text = spec.normalize(sentence)
        if any(q in text or text in q for q in quotes) or any(key in text for key in reasons):
            continue
        orphans.append(f"line {line}: {sentence}")
    assert not orphans, "normative sentences without a clause (add a clause or an INFORMATIVE reason):\n" + \
        "\n".join(orphans)


def test_informative_entries_are_spec_text():
    assert [key for key in INFORMATIVE if not spec.quoted(key)] == []


def test_every_error_code_names_a_known_clause():
    for code in ErrorCode:
        assert code.clause in CLAUSES, code
        assert code.summary


def test_error_codes_are_stable_strings():
    assert len({c.value for c in ErrorCode}) == len(ErrorCode)
    for code in ErrorCode:
        assert code.value == code.name and code.value.isupper()
    error = ContractError(ErrorCode.TYPE_ID_ZERO, "model.struct_types[0]", "zero")
    assert (error.code, error.path, error.clause) == (ErrorCode.TYPE_ID_ZERO, "model.struct_types[0]",
                                                      "CAT-ID-NONZERO")
    assert str(error) == "[TYPE_ID_ZERO] model.struct_types[0]: zero"


def test_tests_cite_only_known_clauses():
    unknown = set(clause_coverage.collect()) - set(CLAUSES)
    assert not unknown


def test_every_checkable_clause_has_a_test():
    """Native and process clauses are statements no test of this project can exercise (see their notes)."""
    missing = [cid for cid, tests in clause_coverage.collect().items()
               if not tests and CLAUSES[cid].kind not in ("native", "process")]
    assert not missing, f"clauses without a test: {missing}"


def test_clause_table_is_current():
    if not clause_coverage.TABLE.exists():
        pytest.fail("docs/clauses.md is missing: python tests/clause_coverage.py --write")
    assert clause_coverage.TABLE.read_text() == clause_coverage.render(clause_coverage.collect()), \
        "docs/clauses.md is stale: python tests/clause_coverage.py --write"


def test_error_code_reference_is_current():
    assert clause_coverage.CODES.exists() and clause_coverage.CODES.read_text() == clause_coverage.render_codes(), \
        "docs/error-codes.md is stale: python tests/clause_coverage.py --write"
