"""Faults that a single case used to catch are now caught by at least two independent cases (their models
differ), each of which the unmodified reference passes: one edited case no longer leaves the bug unseen.
The cases are in corpus/cases/kv/state_paths.toml next to the ones they back up."""

from __future__ import annotations

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.faults.bindings import ElementTypesNotCompared
from conformance.audit.faults.catalogue import StructFirstFieldToTensorOps
from conformance.audit.faults.kv_contiguous import BranchAppendsInPlace, MaxTokensPerCall, ZeroBlockSizeDefaulted
from conformance.audit.faults.state import AllowsConcurrentCalls, MissingFeedsZeroFilled
from conformance.audit.faults.structured import StructsFlattenedForTensorOps
from conformance.audit.faults.zero_copy import StringFeedsRefused
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case

#: fault -> every case that must catch it (the one that caught it alone before, then the new ones)
CATCHERS = {
    StructsFlattenedForTensorOps: ("Required.State.Consumers.StructFeedToTensorOp",
                                   "Required.State.Consumers.RetainedStructToAdd"),
    StructFirstFieldToTensorOps: ("Required.State.Consumers.StructFeedToTensorOp",
                                  "Required.State.Consumers.RetainedStructToAdd"),
    ElementTypesNotCompared: ("Required.Bindings.Declaration.ElementTypeDiffers",
                              "Required.Bindings.ElementTypes.InlineStructFieldInt32ForFloat",
                              "Required.Bindings.ElementTypes.SequenceElementInt32ForFloat"),
    MissingFeedsZeroFilled: ("Required.State.Feeds.MissingFreshInput",
                             "Required.State.Feeds.FreshScalarMissingAfterRuns"),
    AllowsConcurrentCalls: ("Required.State.Concurrency.SecondRunRejected",
                            "Required.State.Concurrency.SecondRunAgainstTwoBindingsRejected"),
    StringFeedsRefused: ("Required.ZeroCopy.Strings.NonPersistentStringFeedAndOutput",
                         "Required.ZeroCopy.Strings.StringFeedSteersRetainedValue"),
    BranchAppendsInPlace: ("Required.KV.Contiguous.BranchesFromASharedPrefix",
                           "Required.KV.Contiguous.ResetToAnEarlierPresentKeepsHeldOutputs",
                           "Required.KV.Contiguous.BranchFromAnOlderPresent"),
    ZeroBlockSizeDefaulted: ("Required.KV.PagedCapacity.ZeroBlockSize",
                             "Required.KV.PagedCapacity.ZeroBlockSizeUnderCallerBlocks"),
    MaxTokensPerCall: ("Required.KV.PagedCapacity.MaxTokensExceededWritesNothing",
                       "Required.KV.PagedCapacity.MaxTokensCountsCallerBlocks"),
}


def _cases(case_ids):
    found = {case.id: case for case in select(load_cases(), list(case_ids))}
    assert sorted(found) == sorted(case_ids), "every listed case exists and no pattern matched another"
    return [found[case_id] for case_id in case_ids]


@pytest.mark.parametrize("fault", list(CATCHERS), ids=lambda fault: fault.fault_id)
def test_fault_is_caught_by_two_independent_cases_the_reference_passes(fault):
    cases = _cases(CATCHERS[fault])
    assert len({case.model_bytes() for case in cases}) == len(cases), "each case runs its own model"
    reference = {case.id: run_case(case, ReferenceAdapter()) for case in cases}
    assert {cid: r.verdict for cid, r in reference.items()} == dict.fromkeys(reference, PASSED), \
        {cid: r.message for cid, r in reference.items() if r.verdict != PASSED}
    faulty = {case.id: run_case(case, fault()) for case in cases}
    caught = sorted(cid for cid, result in faulty.items() if result.verdict == FAILED)
    assert len(caught) >= 2
    assert caught == sorted(CATCHERS[fault]), {cid: r.message for cid, r in faulty.items() if r.verdict != FAILED}
