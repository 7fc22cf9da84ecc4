"""The cases of corpus/cases/zero_copy/lifetime.toml: every case passes on the reference, and each fault of
conformance/audit/faults/ they were written for fails at least two of them."""

from __future__ import annotations

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.faults.external_ownership import (
    ClosedStateBuffersPooled,
    ResetAcceptsOwnerless,
    SequenceOwnershipUnchecked,
    StridedStructFieldsCopied,
    StructFieldOwnershipUnchecked,
    UnboundOutputsOwnershipUnchecked,
)
from conformance.audit.faults.state import (
    CloseReleasesSiblings,
    ResetCloseGuardedPerModel,
    ResetIgnoresUnknownNames,
    ResetPublishedBindingByBinding,
    ResetSharedAcrossStates,
    ValuesCachedAcrossReset,
)
from conformance.audit.faults.zero_copy import (
    EncodedAdoptionCountedAsCopy,
    EncodedScrubbedOnClose,
    ResetValuesLeftWritable,
    SequenceElementsCopied,
    StructFeedStringsRefused,
)
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case

PATTERN = "*.ZeroCopy.Lifetime.*"
REQ = "Required.ZeroCopy.Lifetime."
REC = "Recommended.ZeroCopy.Lifetime."


@pytest.fixture(scope="module")
def cases():
    found = select(load_cases(), [PATTERN])
    assert found
    return found


def test_every_case_passes_on_the_reference(cases):
    for case in cases:
        result = run_case(case, ReferenceAdapter())
        assert result.verdict == PASSED, (case.id, result.message)


#: fault -> (a clause it breaks, the cases of this file that must catch it; with the cases of other files
#: each fault is caught by at least two)
CAUGHT = {
    ResetAcceptsOwnerless: ("PAY-OWNERLESS", {REQ + "OwnerlessStructFieldResetRejected"}),
    StructFieldOwnershipUnchecked: ("PAY-OWNERLESS", {REQ + "OwnerlessStructFieldInitialRejected",
                                                        REQ + "OwnerlessStructFieldResetRejected"}),
    EncodedScrubbedOnClose: ("ZC-OUTSTANDING", {REQ + "EncodedViewsSurviveClose",
                                                  REQ + "EncodedResetValueSurvivesClose"}),
    ResetValuesLeftWritable: ("ZC-READ-ONLY", {REC + "ResetViewsReadOnly",
                                                 REC + "ResetEncodedViewsReadOnly"}),
    ValuesCachedAcrossReset: ("STATE-RESET", {REQ + "ValuesAfterResetShowResetValues",
                                                REQ + "StructValuesAfterResetShowResetValues"}),
    CloseReleasesSiblings: ("STATE-ISOLATION", {REQ + "ResetAndCloseStayInTheirState",
                                                  REQ + "StructStatesStayApart"}),
    ResetSharedAcrossStates: ("STATE-ISOLATION", {REQ + "ResetAndCloseStayInTheirState",
                                                    REQ + "StructStatesStayApart"}),
    ClosedStateBuffersPooled: ("PAY-ARENA", {REQ + "ClosedStateOutputsSurviveNextState",
                                               REQ + "ClosedStateOutputsSurviveOtherState"}),
    SequenceOwnershipUnchecked: ("PAY-OWNERLESS", {REQ + "OwnerlessSequenceElementInitialRejected",
                                                     REQ + "OwnerlessSequenceElementResetRejected"}),
    ResetPublishedBindingByBinding: ("STATE-ATOMIC", {REQ + "ResetWithLaterValueInvalidChangesNothing",
                                                        REQ + "ResetWithLaterStructInvalidChangesNothing"}),
    ResetIgnoresUnknownNames: ("STATE-RESET", {REC + "ResetUnboundNameRejected",
                                                 REC + "ResetUnboundStructNameRejected"}),
    ResetCloseGuardedPerModel: ("STATE-ISOLATION", {REQ + "ResetOfOtherStateDuringRun",
                                                      REQ + "CloseOfOtherStateDuringRun"}),
    StridedStructFieldsCopied: ("PAY-UNSUPPORTED-OWNERSHIP", {REQ + "StridedStructFieldInitialRetainedOrRejected",
                                                                REQ + "StridedStructFieldResetRetainedOrRejected"}),
    UnboundOutputsOwnershipUnchecked: ("PAY-OWNERLESS", {REQ + "OwnerlessFeedReturnedDirectlyRejected",
                                                           REQ + "OwnerlessFeedReturnedAfterRunsRejected"}),
    EncodedAdoptionCountedAsCopy: ("ZC-NO-PAYLOAD-COPY", {REQ + "EncodedStateCopiesNothing",
                                                            REQ + "EncodedResetCopiesNothing"}),
    StructFeedStringsRefused: ("ZC-STRINGS-NONPERSISTENT", {REQ + "StringFieldInFreshStructFeed",
                                                              REQ + "FreshStructWithStringReturnedWhole"}),
    SequenceElementsCopied: ("ZC-RETAIN", {REQ + "SequenceElementsRetainedByBuffer"}),
}


@pytest.mark.parametrize("fault", list(CAUGHT), ids=lambda cls: cls.fault_id)
def test_fault_is_caught(fault, cases):
    clause, expected = CAUGHT[fault]
    assert clause in fault.clauses
    caught = {case.id for case in cases if run_case(case, fault()).verdict == FAILED}
    assert expected <= caught, sorted(caught)
