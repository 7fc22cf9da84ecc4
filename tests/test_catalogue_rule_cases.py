"""The representation faults of conformance/audit/faults/ that the older cases missed are each
caught by at least two cases of corpus/cases/encoding/catalogue_rules.toml, each with its own model: every case passes
on the reference and fails on the fault. The whole catalogue is audited by ``python -m conformance audit``
(tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

_REQ, _REC = "Required.CatalogueMore.", "Recommended.CatalogueMore."
#: fault ID -> the new cases that must catch it
CATCHERS = {
    "ENC-ROOT-SIZE.checked-only-with-records": (
        _REQ + "EmptyPayload.ConstantOnlyRoot", _REQ + "EmptyPayload.RootOfTwelveBits",
        _REQ + "EmptyPayload.InlineRootOfThreeBits"),
    "ENC-ROOT-SIZE.packing-element-whole-bytes": (
        _REQ + "PackingRoot.TwoFourBitElements", _REQ + "PackingRoot.FourSixBitElements",
        _REQ + "PackingRoot.InlineEightOneBitElements"),
    "CAT-REF-ONLY-ID.metadata-props-ignored": (
        _REQ + "TypeRefExtras.LayoutRefWithMetadata", _REQ + "TypeRefExtras.ArrayElementRefWithMetadata"),
    "DECL-CONSTANT.sub-byte-raw-unpacked": (
        _REQ + "SubByteConstant.Uint4FourCodesTwoBytes", _REQ + "SubByteConstant.Int2FiveCodesTwoBytes",
        _REQ + "SubByteConstant.Int4ThreeCodesThreeBytes"),
    "ENC-FIXED-SIZE.kindless-sized-zero": (
        _REQ + "KindlessInLayout.ArrayOfCategories", _REQ + "KindlessInLayout.InlineCategoryBesideByte"),
    "DECL-TYPE-RULES.zero-tensor-dim-rejected": (
        _REQ + "ZeroSizeTensor.EmptyFieldBesideBytes", _REQ + "ZeroSizeTensor.ArrayOfEmptyTensors"),
    "DECL-WELLFORMED.bit-width-over-64-accepted": (
        _REC + "BitWidth.Width72InlineLayout", _REC + "BitWidth.MaxUint32Nested"),
    "ENC-LOGICAL-EXACT.logical-shape-not-applied": (
        _REQ + "LogicalShape.Linear3D", _REQ + "LogicalShape.CodebookColumn"),
    "DEC-KEYED.leaf-types-not-compared": (
        _REC + "BindingLeafType.Int4BlockCodesUint4", _REC + "BindingLeafType.LinearZeroPointUint64"),
    "CAT-REF-RESOLVED.logical-type-unvalidated": (
        _REQ + "LogicalTypeRef.StructLogicalTypeUnresolved",
        _REQ + "LogicalTypeRef.SequenceElementUnresolvedBesideInlineLayout"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    assert_every_case_listed(CATCHERS, "cases/encoding/catalogue_rules.toml")
