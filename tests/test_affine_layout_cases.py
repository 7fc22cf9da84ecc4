"""The affine and payload faults of conformance/audit/faults/ that no case, or a single one,
caught are caught by at least two cases of corpus/cases/affine/axes_and_tails.toml, each with its own model: every
case passes on the reference and fails on the fault. The whole catalogue is audited by
``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a faulty runtime's arithmetic may overflow

_NEW = "Required.AffineMore."
#: fault ID -> the new cases that must catch it
CATCHERS = {
    "AFF-AXIS.minus-rank-rejected": (
        _NEW + "Axis.MinusRankRank1", _NEW + "Axis.MinusRankBlockedRows", _NEW + "Axis.Rank3MinusRankInt4"),
    "AFF-AXIS.per-axis-stride-next-dim": (
        _NEW + "Axis.Rank3FirstAxis", _NEW + "Axis.Rank4SecondAxisZeroPoint", _NEW + "Axis.Rank3MinusRankInt4"),
    "AFF-PACKING.unsigned-tail-high-bits": (
        _NEW + "Packing.Uint4OddCountLastCode", _NEW + "Packing.Uint2PartialByteLastCodes",
        _NEW + "External.OffsetPastFirstPageUint4"),
    "AFF-PADDING-ZERO.external-unchecked": (
        _NEW + "External.Int4NonzeroPaddingNotDecoded", _NEW + "External.Int2NonzeroPaddingNotDecoded"),
    "AFF-PAYLOAD-SIZE.external-longer-accepted": (
        _NEW + "External.LongerExtentInt8", _NEW + "External.LongerExtentUint4Decode"),
    "AFF-SCALE.float16-subnormal-flushed": (
        _NEW + "Scale.Float16SubnormalScale", _NEW + "Scale.Float16SubnormalScalePerAxisToFloat"),
    "AFF-SCALE.bfloat16-raw-as-float16": (
        _NEW + "Scale.Bfloat16ScaleInRawData", _NEW + "Scale.Bfloat16ScalesInRawDataPerAxis"),
    "AFF-SCALE.empty-scale-rejected": (_NEW + "Scale.EmptyPerAxisScale", _NEW + "Scale.EmptyBlockedScale"),
    "AFF-SCALE.non-positive-scale-rejected": (
        _NEW + "Scale.NegativeScalePerTensor", _NEW + "Scale.ZeroAndNegativeScalesPerAxis"),
    "AFF-ZERO-POINT.int32-data-one-code-per-entry": (
        _NEW + "ZeroPoint.Uint4ZeroPointsInInt32Data", _NEW + "ZeroPoint.Int2ZeroPointsInInt32Data"),
    "AFF-BLOCK.block-count-overflows": (
        _NEW + "Block.Int64MaxBlockIsOneBlock", _NEW + "Block.Int64MaxBlockUint4ZeroPoint"),
    "AFF-AXIS.axis-on-scalar-ignored": (
        _NEW + "Axis.AxisOnScalarRejected", _NEW + "Axis.NegativeAxisOnScalarRejected"),
    "AFF-SCALE.double-output-dtype-mixed": (
        "Recommended.Affine.Scale.DoubleScaleFloatLogicalRejected",
        "Recommended.Affine.Scale.FloatScaleDoubleLogicalRejected"),
    "AFF-PACKING.vector-nibbles-unzipped": (
        _NEW + "Packing.Int4EightyCodesPerAxis", _NEW + "Packing.Uint4ThirtyThreeCodes"),
    "AFF-DQ.float16-output-saturates": (
        _NEW + "Scale.Float16OutputOverflowsToInfinity", _NEW + "Scale.Float16OutputRoundingThreshold"),
    "AFF-DQ.zero-difference-shortcut": (
        "Recommended.Affine.Scale.InfiniteScaleZeroCodeIsNaN",
        "Recommended.Affine.Scale.NonFiniteScalesWithZeroPoints"),
    "PAY-EXTERNAL-EXTENT.empty-extent-offset-unchecked": (
        _NEW + "External.EmptyExtentBeyondFile", _NEW + "External.EmptyExtentOneByteBeyondFileDecode"),
    "AFF-PADDING-ZERO.nibble-mask-for-two-bit": (
        _NEW + "Packing.Int2ThreeCodesInLastByte", _NEW + "Packing.Uint2OneCodeInLastBytePaddingNonzero"),
    "PAY-EXTERNAL-EXTENT.extent-keyed-by-location": (
        _NEW + "External.SecondValueOfOneFile", _NEW + "External.SecondValueOfOneFileUint4",
        _NEW + "External.OverlappingExtents"),
    "PAY-EXTERNAL-EXTENT.overlap-rejected": (
        _NEW + "External.TwoValuesShareOneExtent", _NEW + "External.OverlappingExtents"),
    "AFF-BLOCK.blocked-parameters-broadcast": (
        _NEW + "Block.BroadcastScaleRejected", _NEW + "Block.BroadcastZeroPointRejected"),
    "AFF-PACKING.chunk-starts-at-byte-boundary": (
        _NEW + "Packing.Int4LongOddRowsPerAxis", _NEW + "Packing.Uint2LongOddRowsZeroPoints"),
    "AFF-ZERO-POINT.scalar-zero-point-broadcast": (
        _NEW + "ZeroPoint.ScalarWithBlockedScaleRejected", _NEW + "ZeroPoint.ScalarWithRank3PerAxisScaleRejected"),
    "PAY-EMPTY.empty-external-refused": (
        _NEW + "External.EmptyExtentZeroElements", _NEW + "External.EmptyExtentPerAxis"),
    "PAY-EXTERNAL-EXTENT.mapping-offset-twice": (
        _NEW + "External.OffsetPastFirstPage", _NEW + "External.OffsetPastFirstPageUint4",
        _NEW + "External.Int4NonzeroPaddingNotDecoded"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    """Each case of the file is one of the catchers above, so none is there without a fault it kills."""
    assert_every_case_listed(CATCHERS, "cases/affine/axes_and_tails.toml")
