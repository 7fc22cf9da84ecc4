"""The clause registry is consistent: codes cite real clauses, tests cite real clauses, the table is current."""

from __future__ import annotations

import clause_coverage
import pytest

from reference_impl.clauses import CLAUSES
from reference_impl.errors import ContractError, ErrorCode


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


def test_every_clause_has_a_test():
    missing = [cid for cid, tests in clause_coverage.collect().items() if not tests]
    assert not missing, f"clauses without a test: {missing}"


def test_clause_table_is_current():
    if not clause_coverage.TABLE.exists():
        pytest.fail("docs/clauses.md is missing: python tests/clause_coverage.py --write")
    assert clause_coverage.TABLE.read_text() == clause_coverage.render(clause_coverage.collect()), \
        "docs/clauses.md is stale: python tests/clause_coverage.py --write"


def test_error_code_reference_is_current():
    assert clause_coverage.CODES.exists() and clause_coverage.CODES.read_text() == clause_coverage.render_codes(), \
        "docs/error-codes.md is stale: python tests/clause_coverage.py --write"
