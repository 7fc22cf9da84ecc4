"""The second faults of conformance/audit/faults/ that the older cases missed (or caught with one
case) are each caught by at least two cases of corpus/cases/external/representation_rules.toml (with the older case
where one
already catches it), each with its own model: every listed case passes on the reference and fails on the
fault. The whole catalogue is audited by ``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

#: fault ID -> the cases that must catch it
CATCHERS = {
    "AFF-LOGICAL.wrapped-tensor-unwrapped": (
        "Required.Affine.Logical.Rejects_OptionalTensor", "Required.Affine.Logical.Rejects_OptionalTensorDecoded",
        "Required.Affine.Logical.Rejects_OptionalSequenceTensor", "Required.Affine.Logical.Rejects_SequenceType"),
    "AFF-STORAGE.e8m0-accepted": (
        "Required.Affine.Storage.Rejects_Float8E8M0", "Required.Affine.Storage.Rejects_Float8E8M0_Decoded"),
    "ENC-LAYOUT.layoutless-accepted-at-load": (
        "Required.Encoding.Layout.NoLayoutEmptyPayload", "Required.Encoding.Layout.NoLayoutBesideAffineValue",
        "Required.Affine.Layout.NoLayoutSelected"),
    "ENC-NO-IMPLICIT-TENSOR.dense-sized-payload-reinterpreted": (
        "Required.Encoding.NoImplicitTensor.DenseSizedPayloadToRelu_FloatRecords",
        "Required.Encoding.NoImplicitTensor.DenseSizedPayloadToRelu_Float16Array"),
    "PAY-EXCLUSIVE.checked-on-external-branch-only": (
        "Required.External.Exclusive.StructRawAndEntriesDefaultLocation",
        "Required.External.Exclusive.AffineRawAndEntriesDefaultLocationDecoded",
        "Required.External.Keys.RawAndExternalEntriesDefaultLocation"),
    "PAY-DEFAULT-INLINE.explicit-default-read-as-external": (
        "Required.External.DefaultLocation.ExplicitDefaultAffine",
        "Required.External.DefaultLocation.ExplicitDefaultCodebook"),
    "ENC-PER-VALUE-PARAMS.parameters-prepared-per-type-id": (
        "Required.Encoding.PerValueParams.ChangedScaleSameCodesNextCall",
        "Required.State.Parameters.Type1002OwnParameters"),
    "PAY-NO-POINTERS.tail-aligned-records-saved": (
        "Required.External.SavedRecords.Type1002RecordOf76Bytes",
        "Required.External.SavedRecords.InlineInt32AndByteRecords"),
    "PAY-VALIDATE-FIRST.decode-kernel-trusts-feeds": (
        "Required.External.ValidateFirst.PartialRecordFeedToDecode",
        "Required.External.ValidateFirst.PartialRecordRetainedToDecode"),
    "PAY-EXTERNAL-CONTAINED.only-leading-parent-refused": (
        "Recommended.External.PathSafety.DotThenSubdirThenTwoParents",
        "Recommended.External.PathSafety.BackslashSubdirThenTwoParents"),
    "RESOURCE-LIMITS.leaf-bound-per-structure": (
        "Recommended.Limits.SharedLeaves.WideStructureTwice_ReferencedRoot",
        "Recommended.Limits.SharedLeaves.WideStructureTwice_InlineRoot"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    assert_every_case_listed(CATCHERS, "cases/external/representation_rules.toml")
