"""The representation faults of conformance/audit/faults/ that the older cases missed are each
caught by at least two cases of corpus/cases/encoding/catalogue_rules.toml, each with its own model: every case passes
on the reference and fails on the fault. The whole catalogue is audited by ``python -m conformance audit``
(tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

#: fault ID -> the new cases that must catch it
CATCHERS = {
    "ENC-ROOT-SIZE.checked-only-with-records": (
        "Required.Encoding.EmptyPayload.ConstantOnlyRoot", "Required.Encoding.EmptyPayload.RootOfTwelveBits",
        "Required.Encoding.EmptyPayload.InlineRootOfThreeBits"),
    "ENC-ROOT-SIZE.packing-element-whole-bytes": (
        "Required.Encoding.PackingRoot.TwoFourBitElements", "Required.Encoding.PackingRoot.FourSixBitElements",
        "Required.Encoding.PackingRoot.InlineEightOneBitElements"),
    "CAT-REF-ONLY-ID.metadata-props-ignored": (
        "Required.Catalogue.TypeRefExtras.LayoutRefWithMetadata",
        "Required.Catalogue.TypeRefExtras.ArrayElementRefWithMetadata"),
    "DECL-CONSTANT.sub-byte-raw-unpacked": (
        "Required.Declarations.SubByteConstant.Uint4FourCodesTwoBytes",
        "Required.Declarations.SubByteConstant.Int2FiveCodesTwoBytes",
        "Required.Declarations.SubByteConstant.Int4ThreeCodesThreeBytes"),
    "ENC-FIXED-SIZE.kindless-sized-zero": (
        "Required.Encoding.KindlessInLayout.ArrayOfCategories",
        "Required.Encoding.KindlessInLayout.InlineCategoryBesideByte"),
    "DECL-TYPE-RULES.zero-tensor-dim-rejected": (
        "Required.Declarations.ZeroSizeTensor.EmptyFieldBesideBytes",
        "Required.Declarations.ZeroSizeTensor.ArrayOfEmptyTensors"),
    "DECL-WELLFORMED.bit-width-over-64-accepted": (
        "Recommended.Declarations.BitWidth.Width72InlineLayout", "Recommended.Declarations.BitWidth.MaxUint32Nested"),
    "ENC-LOGICAL-EXACT.logical-shape-not-applied": (
        "Required.Encoding.LogicalShape.Linear3D", "Required.Encoding.LogicalShape.CodebookColumn"),
    "DEC-KEYED.leaf-types-not-compared": (
        "Recommended.Structured.BindingLeafType.Int4BlockCodesUint4",
        "Recommended.Structured.BindingLeafType.LinearZeroPointUint64"),
    "CAT-REF-RESOLVED.logical-type-unvalidated": (
        "Required.Catalogue.LogicalTypeRef.StructLogicalTypeUnresolved",
        "Required.Catalogue.LogicalTypeRef.SequenceElementUnresolvedBesideInlineLayout"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    assert_every_case_listed(CATCHERS, "cases/encoding/catalogue_rules.toml")
