"""A deliberately wrong adapter is caught: built-in faults of the audit catalogue (the reference with one
injected bug each) fail the cases written for their rule, while the same cases pass on the unmodified
reference. The whole catalogue is audited by ``python -m conformance audit`` (see tests/test_audit.py)."""

from __future__ import annotations

import pytest

from conformance.adapters import Rejected
from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.faults.affine import HighBitsFirst
from conformance.audit.faults.catalogue import LastDuplicateWins
from conformance.audit.faults.state import AllowsConcurrentCalls, PublishesAfterFailure
from conformance.audit.faults.zero_copy import InitialValuesCopied, ValuesAreSnapshots
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, PASSED_WITHOUT_CODE, run_case


def _run(adapter, *patterns):
    cases = select(load_cases(), list(patterns))
    assert cases, patterns
    return {case.id: run_case(case, adapter) for case in cases}


def _caught(adapter, *patterns) -> list[str]:
    baseline = _run(ReferenceAdapter(), *patterns)
    assert all(r.verdict == PASSED for r in baseline.values()), [r.message for r in baseline.values()
                                                                  if r.verdict != PASSED]
    faulty = _run(adapter, *patterns)
    return [case_id for case_id, result in faulty.items() if result.verdict == FAILED]


@pytest.mark.clause("CAT-ID-UNIQUE")
def test_skipped_rule_is_caught():
    caught = _caught(LastDuplicateWins(), "Required.Catalogue.Identity")
    assert "Required.Catalogue.Identity.DuplicateTypeId" in caught


@pytest.mark.clause("AFF-PACKING")
def test_nibbles_read_high_first_is_caught():
    caught = _caught(HighBitsFirst(), "Required.Affine.Storage", "Required.Affine.AgreesWithDequantizeLinear")
    assert "Required.Affine.Storage.Int4LowNibbleFirst" in caught


@pytest.mark.clause("ZC-RETAIN", "ZC-VIEWS")
def test_copies_instead_of_retained_buffers_are_caught():
    assert "Required.ZeroCopy.Retain.InitialValueRetainedByBuffer" in _caught(
        InitialValuesCopied(), "Required.ZeroCopy.Retain")
    assert "Required.ZeroCopy.Views.ValuesAreSharedViews" in _caught(ValuesAreSnapshots(), "Required.ZeroCopy")


@pytest.mark.clause("STATE-ATOMIC", "ZC-FAILURE")
def test_state_published_after_failed_run_is_caught():
    caught = _caught(PublishesAfterFailure(), "Required.State.Atomic", "Required.State.Publication")
    assert "Required.State.Atomic.OutputFailsValidation" in caught  # executes fine, then fails validation


@pytest.mark.clause("STATE-NO-CONCURRENCY")
def test_concurrent_call_allowed_is_caught():
    faulty = _run(AllowsConcurrentCalls(), "Required.State.Concurrency")
    assert faulty["Required.State.Concurrency.SecondRunRejected"].verdict == FAILED
    assert "queued" in faulty["Required.State.Concurrency.SecondRunRejected"].message
    # waiting for the active run is what reset and close may do
    assert faulty["Required.State.Concurrency.ResetDuringRunDoesNotRace"].verdict == PASSED
    assert faulty["Required.State.Concurrency.CloseDuringRunDoesNotRace"].verdict == PASSED


def test_rejection_without_code_is_not_a_pass_under_require_codes():
    class Uncoded(ReferenceAdapter):
        def classify(self, exc):
            found = super().classify(exc)
            return Rejected(None, found.message) if found is not None else None

    case = select(load_cases(), ["Required.Catalogue.Identity.TypeIdZero"])[0]
    assert run_case(case, Uncoded()).verdict == PASSED_WITHOUT_CODE
    assert run_case(case, Uncoded()).code_checked is False
    assert run_case(case, Uncoded(), require_codes=True).verdict == FAILED
