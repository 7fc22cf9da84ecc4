"""Every Required case stands on the spec's own words: its ``quote`` is verbatim spec text and belongs
to a clause the case cites (issue: a case whose expectation the spec does not force is Recommended)."""

from __future__ import annotations

from conformance import spec
from conformance.cases import load_cases
from reference_impl.clauses import CLAUSES

CASES = load_cases()


def test_every_quote_is_verbatim_spec_text():
    wrong = [(case.id, quote) for case in CASES for quote in case.quote if not spec.quoted(quote)]
    assert not wrong


def test_every_quote_belongs_to_a_cited_clause():
    """A quote is (part of) a statement of one of the clauses the case cites, so clause coverage and the
    reason for the expectation never drift apart."""
    stray = []
    for case in CASES:
        statements = [spec.normalize(q) for cid in case.clauses for q in CLAUSES[cid].quotes]
        for quote in case.quote:
            text = spec.normalize(quote)
            if not any(text in s or s in text for s in statements):
                stray.append((case.id, quote))
    assert not stray


def test_every_required_case_has_a_quote():
    """A Required case stands on the spec's words: it quotes the sentence(s) that force its expectation.
    A case the spec does not force is Recommended."""
    unquoted = [case.id for case in CASES if case.level == "Required" and not case.quote]
    assert not unquoted, f"{len(unquoted)} Required cases quote no spec sentence: {unquoted[:20]}"
