"""The second faults of conformance/audit/faults/ that the older cases missed (or caught with one
case) are each caught by at least two cases of corpus/cases/external/representation_rules.toml (with the older case
where one
already catches it), each with its own model: every listed case passes on the reference and fails on the
fault. The whole catalogue is audited by ``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

_NEW, _REC = "Required.ThinRepr.", "Recommended.ThinRepr."
#: fault ID -> the cases that must catch it
CATCHERS = {
    "AFF-LOGICAL.wrapped-tensor-unwrapped": (
        _NEW + "AffineLogical.Rejects_OptionalTensor", _NEW + "AffineLogical.Rejects_OptionalTensorDecoded",
        _NEW + "AffineLogical.Rejects_OptionalSequenceTensor", "Required.Affine.Logical.Rejects_SequenceType"),
    "AFF-STORAGE.e8m0-accepted": (
        _NEW + "AffineStorage.Rejects_Float8E8M0", _NEW + "AffineStorage.Rejects_Float8E8M0_Decoded"),
    "ENC-LAYOUT.layoutless-accepted-at-load": (
        _NEW + "Layout.NoLayoutEmptyPayload", _NEW + "Layout.NoLayoutBesideAffineValue",
        "Required.Affine.Layout.NoLayoutSelected"),
    "ENC-NO-IMPLICIT-TENSOR.dense-sized-payload-reinterpreted": (
        _NEW + "NoImplicitTensor.DenseSizedPayloadToRelu_FloatRecords",
        _NEW + "NoImplicitTensor.DenseSizedPayloadToRelu_Float16Array"),
    "PAY-EXCLUSIVE.checked-on-external-branch-only": (
        _NEW + "Exclusive.StructRawAndEntriesDefaultLocation",
        _NEW + "Exclusive.AffineRawAndEntriesDefaultLocationDecoded",
        "Required.External.Keys.RawAndExternalEntriesDefaultLocation"),
    "PAY-DEFAULT-INLINE.explicit-default-read-as-external": (
        _NEW + "DefaultLocation.ExplicitDefaultAffine", _NEW + "DefaultLocation.ExplicitDefaultCodebook"),
    "ENC-PER-VALUE-PARAMS.parameters-prepared-per-type-id": (
        _NEW + "PerValueParams.ChangedScaleSameCodesNextCall", "Required.State.Parameters.Type1002OwnParameters"),
    "PAY-NO-POINTERS.tail-aligned-records-saved": (
        _NEW + "SavedRecords.Type1002RecordOf76Bytes", _NEW + "SavedRecords.InlineInt32AndByteRecords"),
    "PAY-VALIDATE-FIRST.decode-kernel-trusts-feeds": (
        _NEW + "ValidateFirst.PartialRecordFeedToDecode", _NEW + "ValidateFirst.PartialRecordRetainedToDecode"),
    "PAY-EXTERNAL-CONTAINED.only-leading-parent-refused": (
        _REC + "PathSafety.DotThenSubdirThenTwoParents", _REC + "PathSafety.BackslashSubdirThenTwoParents"),
    "RESOURCE-LIMITS.leaf-bound-per-structure": (
        _REC + "Limits.WideStructureTwice_ReferencedRoot", _REC + "Limits.WideStructureTwice_InlineRoot"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    assert_every_case_listed(CATCHERS, "cases/external/representation_rules.toml")
