"""The faults of conformance/audit/faults/ that the older cases missed (or caught with one case) are
each caught by at least two cases, the new ones from corpus/cases/affine/boundaries.toml (with the older case where one
already catches it), each with its own model: every listed case passes on the reference and fails on the
fault. The whole catalogue is audited by ``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import numpy as np
import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case

#: fault ID -> the cases that must catch it
CATCHERS = {
    "AFF-SCALE.product-in-scale-type": (
        "Required.Affine.Boundaries.Float16MaxScaleToFloat", "Required.Affine.Boundaries.Bfloat16ScaleMantissaToFloat",
        "Required.Affine.Boundaries.Float16ScalesPerAxisToFloat"),
    "AFF-AXIS.negative-axis-against-parameter-rank": (
        "Required.Affine.Boundaries.NegativeAxisSquare", "Required.Affine.Boundaries.NegativeAxisRank3Int4ZeroPoint",
        "Required.Affine.Axis.NegativeNormalized"),
    "AFF-PAYLOAD-SIZE.bit-count-32-bits": (
        "Required.Affine.Boundaries.PayloadSize.Int4TwoToThe32BitsEmpty",
        "Required.Affine.Boundaries.PayloadSize.Uint8TwoToThe32BitsEmpty",
        "Required.Affine.Boundaries.PayloadSize.Int2TwoToThe32PlusEightBitsOneByte"),
    "AFF-ZERO-POINT.most-negative-zero-point-positive": (
        "Required.Affine.Boundaries.NegativeAxisRank3Int4ZeroPoint",
        "Required.Affine.Boundaries.Int4ThreeChannelZeroPoints",
        "Required.Affine.ZeroPoint.Int2ZeroPointsInInt32Data"),
    "AFF-ZERO-POINT.sub-byte-zero-point-tail-dropped": (
        "Required.Affine.Boundaries.Int4ThreeChannelZeroPoints",
        "Required.Affine.ZeroPoint.Uint4ZeroPointsInInt32Data"),
    "PAY-EXTERNAL-EXTENT.offset-at-end-refused": (
        "Required.External.AffineBoundaries.EmptyExtentAtEndOfFile", "Required.External.Struct.ZeroLength"),
    # a missing file, besides an offset past the end of a present one
    "PAY-EXTERNAL-EXTENT.empty-extent-file-not-opened": (
        "Required.External.AffineBoundaries.EmptyExtentFileMissing",
        "Required.External.AffinePayload.EmptyExtentBeyondFile"),
    "PAY-EXTERNAL-EXTENT.offset-truncated-32-bits": (
        "Required.External.AffineBoundaries.EmptyExtentAtTwoToThe32",
        "Required.External.KVCacheWide.AffineOffsetTwoToThe32"),
    "ENC-UNALIGNED.window-of-own-width": (
        "Required.Encoding.RecordBoundaries.Int16AndFloatInsideBytes",
        "Required.Encoding.BitFields.Int64AndFloatAtBit4"),
    # the UINT64 at bit 4 is the last field but one of a one-record payload whose last field ends it
    "ENC-RECORD-COUNT.bit-field-at-payload-end-rejected": (
        "Required.Encoding.RecordBoundaries.Uint64TopBitAtBit4", "Required.Encoding.BitFields.SignedFieldsInsideBytes"),
    "ENC-RECORD-COUNT.single-record-squeezed": (
        "Required.Encoding.RecordBoundaries.Uint64TopBitAtBit4",
        "Recommended.Structured.SpecExamples.Int4BlockOneRecord"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    assert_every_case_listed(CATCHERS, "cases/affine/boundaries.toml")


class _Uint64ReadSigned(ReferenceAdapter):
    """The reference, except that it hands UINT64 fields back as INT64 (the same bits, read signed)."""

    def read_fields(self, model_bytes, value_name, base_dir):
        fields = super().read_fields(model_bytes, value_name, base_dir)
        return {name: value.view(np.int64) if getattr(value, "dtype", None) == np.uint64 else value
                for name, value in fields.items()}


@pytest.mark.clause("ENC-LEAVES")
def test_a_uint64_field_read_as_a_negative_int64_is_a_different_value():
    """Fields may come back in any integer width that holds their values, but a UINT64 above 2**63 read
    signed is negative: the harness compares values, so the wrap is a failure, not a width."""
    case = next(c for c in load_cases() if c.id == "Required.Encoding.RecordBoundaries.Uint64TopBitAtBit4")
    assert run_case(case, _Uint64ReadSigned()).verdict == FAILED
    assert run_case(case, ReferenceAdapter()).verdict == PASSED
