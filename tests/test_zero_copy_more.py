"""The cases of corpus/cases/zero_copy_more.toml: every case passes on the reference, and each fault of
conformance/audit/faults_zc_more.py they were written for fails at least two of them."""

from __future__ import annotations

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit import faults_zc_more as F
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case

PATTERN = "*.ZeroCopy.More.*"


@pytest.fixture(scope="module")
def cases():
    found = select(load_cases(), [PATTERN])
    assert found
    return found


def test_every_case_passes_on_the_reference(cases):
    for case in cases:
        result = run_case(case, ReferenceAdapter())
        assert result.verdict == PASSED, (case.id, result.message)


#: fault -> (clause, two of the cases of this file that must catch it)
CAUGHT = {
    F.ResetAcceptsOwnerless: ("PAY-OWNERLESS", {"Required.ZeroCopy.More.OwnerlessStructFieldResetRejected"}),
    F.StructFieldOwnershipUnchecked: ("PAY-OWNERLESS", {"Required.ZeroCopy.More.OwnerlessStructFieldInitialRejected",
                                                        "Required.ZeroCopy.More.OwnerlessStructFieldResetRejected"}),
    F.EncodedScrubbedOnClose: ("ZC-OUTSTANDING", {"Required.ZeroCopy.More.EncodedViewsSurviveClose",
                                                  "Required.ZeroCopy.More.EncodedResetValueSurvivesClose"}),
    F.ResetValuesLeftWritable: ("ZC-READ-ONLY", {"Recommended.ZeroCopy.More.ResetViewsReadOnly",
                                                 "Recommended.ZeroCopy.More.ResetEncodedViewsReadOnly"}),
    F.ValuesCachedAcrossReset: ("STATE-RESET", {"Required.ZeroCopy.More.ValuesAfterResetShowResetValues",
                                                "Required.ZeroCopy.More.StructValuesAfterResetShowResetValues"}),
    F.CloseReleasesSiblings: ("STATE-ISOLATION", {"Required.ZeroCopy.More.ResetAndCloseStayInTheirState",
                                                  "Required.ZeroCopy.More.StructStatesStayApart"}),
    F.ResetSharedAcrossStates: ("STATE-ISOLATION", {"Required.ZeroCopy.More.ResetAndCloseStayInTheirState",
                                                    "Required.ZeroCopy.More.StructStatesStayApart"}),
    F.ClosedStateBuffersPooled: ("PAY-ARENA", {"Required.ZeroCopy.More.ClosedStateOutputsSurviveNextState",
                                               "Required.ZeroCopy.More.ClosedStateOutputsSurviveOtherState"}),
    F.SequenceOwnershipUnchecked: ("PAY-OWNERLESS", {"Required.ZeroCopy.More.OwnerlessSequenceElementInitialRejected",
                                                     "Required.ZeroCopy.More.OwnerlessSequenceElementResetRejected"}),
    F.ResetPublishedBindingByBinding: ("STATE-ATOMIC", {"Required.ZeroCopy.More.ResetWithLaterValueInvalidChangesNothing",
                                                        "Required.ZeroCopy.More.ResetWithLaterStructInvalidChangesNothing"}),
    F.ResetIgnoresUnknownNames: ("STATE-RESET", {"Recommended.ZeroCopy.More.ResetUnboundNameRejected",
                                                 "Recommended.ZeroCopy.More.ResetUnboundStructNameRejected"}),
    F.SequenceElementsCopied: ("ZC-RETAIN", {"Required.ZeroCopy.More.SequenceElementsRetainedByBuffer"}),
}


@pytest.mark.parametrize("fault", list(CAUGHT), ids=lambda cls: cls.fault_id)
def test_fault_is_caught(fault, cases):
    clause, expected = CAUGHT[fault]
    assert clause in fault.clauses
    caught = {case.id for case in cases if run_case(case, fault()).verdict == FAILED}
    assert expected <= caught, sorted(caught)
