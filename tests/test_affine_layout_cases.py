"""The affine and payload faults of conformance/audit/faults/ that no case, or a single one,
caught are caught by at least two cases of corpus/cases/affine/axes_and_tails.toml, each with its own model: every
case passes on the reference and fails on the fault. The whole catalogue is audited by
``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a faulty runtime's arithmetic may overflow

#: fault ID -> the new cases that must catch it
CATCHERS = {
    "AFF-AXIS.minus-rank-rejected": (
        "Required.Affine.Axis.MinusRankRank1", "Required.Affine.Axis.MinusRankBlockedRows",
        "Required.Affine.Axis.Rank3MinusRankInt4"),
    "AFF-AXIS.per-axis-stride-next-dim": (
        "Required.Affine.Axis.Rank3FirstAxis", "Required.Affine.Axis.Rank4SecondAxisZeroPoint",
        "Required.Affine.Axis.Rank3MinusRankInt4"),
    "AFF-PACKING.unsigned-tail-high-bits": (
        "Required.Affine.Packing.Uint4OddCountLastCode", "Required.Affine.Packing.Uint2PartialByteLastCodes",
        "Required.External.AffinePayload.OffsetPastFirstPageUint4"),
    "AFF-PADDING-ZERO.external-unchecked": (
        "Required.External.AffinePayload.Int4NonzeroPaddingNotDecoded",
        "Required.External.AffinePayload.Int2NonzeroPaddingNotDecoded"),
    "AFF-PAYLOAD-SIZE.external-longer-accepted": (
        "Required.External.AffinePayload.LongerExtentInt8", "Required.External.AffinePayload.LongerExtentUint4Decode"),
    "AFF-SCALE.float16-subnormal-flushed": (
        "Required.Affine.Scale.Float16SubnormalScale", "Required.Affine.Scale.Float16SubnormalScalePerAxisToFloat"),
    "AFF-SCALE.bfloat16-raw-as-float16": (
        "Required.Affine.Scale.Bfloat16ScaleInRawData", "Required.Affine.Scale.Bfloat16ScalesInRawDataPerAxis"),
    "AFF-SCALE.empty-scale-rejected": ("Required.Affine.Scale.EmptyPerAxisScale",
    "Required.Affine.Scale.EmptyBlockedScale"),
    "AFF-SCALE.non-positive-scale-rejected": (
        "Required.Affine.Scale.NegativeScalePerTensor", "Required.Affine.Scale.ZeroAndNegativeScalesPerAxis"),
    "AFF-ZERO-POINT.int32-data-one-code-per-entry": (
        "Required.Affine.ZeroPoint.Uint4ZeroPointsInInt32Data", "Required.Affine.ZeroPoint.Int2ZeroPointsInInt32Data"),
    "AFF-BLOCK.block-count-overflows": (
        "Required.Affine.Block.Int64MaxBlockIsOneBlock", "Required.Affine.Block.Int64MaxBlockUint4ZeroPoint"),
    "AFF-AXIS.axis-on-scalar-ignored": (
        "Required.Affine.Axis.AxisOnScalarRejected", "Required.Affine.Axis.NegativeAxisOnScalarRejected"),
    "AFF-SCALE.double-output-dtype-mixed": (
        "Recommended.Affine.Scale.DoubleScaleFloatLogicalRejected",
        "Recommended.Affine.Scale.FloatScaleDoubleLogicalRejected"),
    "AFF-PACKING.vector-nibbles-unzipped": (
        "Required.Affine.Packing.Int4EightyCodesPerAxis", "Required.Affine.Packing.Uint4ThirtyThreeCodes"),
    "AFF-DQ.float16-output-saturates": (
        "Required.Affine.Scale.Float16OutputOverflowsToInfinity",
        "Required.Affine.Scale.Float16OutputRoundingThreshold"),
    "AFF-DQ.zero-difference-shortcut": (
        "Recommended.Affine.Scale.InfiniteScaleZeroCodeIsNaN",
        "Recommended.Affine.Scale.NonFiniteScalesWithZeroPoints"),
    "PAY-EXTERNAL-EXTENT.empty-extent-offset-unchecked": (
        "Required.External.AffinePayload.EmptyExtentBeyondFile",
        "Required.External.AffinePayload.EmptyExtentOneByteBeyondFileDecode"),
    "AFF-PADDING-ZERO.nibble-mask-for-two-bit": (
        "Required.Affine.Packing.Int2ThreeCodesInLastByte",
        "Required.Affine.Packing.Uint2OneCodeInLastBytePaddingNonzero"),
    "PAY-EXTERNAL-EXTENT.extent-keyed-by-location": (
        "Required.External.AffinePayload.SecondValueOfOneFile",
        "Required.External.AffinePayload.SecondValueOfOneFileUint4",
        "Required.External.AffinePayload.OverlappingExtents"),
    "PAY-EXTERNAL-EXTENT.overlap-rejected": (
        "Required.External.AffinePayload.TwoValuesShareOneExtent",
        "Required.External.AffinePayload.OverlappingExtents"),
    "AFF-BLOCK.blocked-parameters-broadcast": (
        "Required.Affine.Block.BroadcastScaleRejected", "Required.Affine.Block.BroadcastZeroPointRejected"),
    "AFF-PACKING.chunk-starts-at-byte-boundary": (
        "Required.Affine.Packing.Int4LongOddRowsPerAxis", "Required.Affine.Packing.Uint2LongOddRowsZeroPoints"),
    "AFF-ZERO-POINT.scalar-zero-point-broadcast": (
        "Required.Affine.ZeroPoint.ScalarWithBlockedScaleRejected",
        "Required.Affine.ZeroPoint.ScalarWithRank3PerAxisScaleRejected"),
    "PAY-EMPTY.empty-external-refused": (
        "Required.External.AffinePayload.EmptyExtentZeroElements",
        "Required.External.AffinePayload.EmptyExtentPerAxis"),
    "PAY-EXTERNAL-EXTENT.mapping-offset-twice": (
        "Required.External.AffinePayload.OffsetPastFirstPage",
        "Required.External.AffinePayload.OffsetPastFirstPageUint4",
        "Required.External.AffinePayload.Int4NonzeroPaddingNotDecoded"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    """Each case of the file is one of the catchers above, so none is there without a fault it kills."""
    assert_every_case_listed(CATCHERS, "cases/affine/axes_and_tails.toml")
