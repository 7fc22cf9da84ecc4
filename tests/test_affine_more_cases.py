"""The affine and payload faults of conformance/audit/faults_affine_more.py that no case, or a single one,
caught are caught by at least two cases of corpus/cases/affine_more.toml, each with its own model: every
case passes on the reference and fails on the fault. The whole catalogue is audited by
``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit import catalogue
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case

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
        "Recommended.AffineMore.Scale.DoubleScaleFloatLogicalRejected",
        "Recommended.AffineMore.Scale.FloatScaleDoubleLogicalRejected"),
    "AFF-PACKING.vector-nibbles-unzipped": (
        _NEW + "Packing.Int4EightyCodesPerAxis", _NEW + "Packing.Uint4ThirtyThreeCodes"),
    "AFF-DQ.float16-output-saturates": (
        _NEW + "Scale.Float16OutputOverflowsToInfinity", _NEW + "Scale.Float16OutputRoundingThreshold"),
    "AFF-DQ.zero-difference-shortcut": (
        "Recommended.AffineMore.Scale.InfiniteScaleZeroCodeIsNaN",
        "Recommended.AffineMore.Scale.NonFiniteScalesWithZeroPoints"),
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

FAULTS = {cls.fault_id: cls for cls in catalogue.faults()}
CASES = {case.id: case for case in load_cases()}


def _params():
    for fault_id, case_ids in CATCHERS.items():
        clause = fault_id.split(".", 1)[0]
        yield pytest.param(fault_id, case_ids, id=fault_id, marks=pytest.mark.clause(clause))


@pytest.mark.parametrize(("fault_id", "case_ids"), list(_params()))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    cases = [CASES[case_id] for case_id in case_ids]
    assert len(cases) >= 2
    assert len({case.model_bytes() for case in cases}) == len(cases), "two of the cases share a model"
    reference = {case.id: run_case(case, ReferenceAdapter(), timeout=60) for case in cases}
    assert all(r.verdict == PASSED for r in reference.values()), {i: r.message for i, r in reference.items()
                                                                 if r.verdict != PASSED}
    faulty = {case.id: run_case(case, FAULTS[fault_id](), timeout=60) for case in cases}
    missed = [case_id for case_id, result in faulty.items() if result.verdict != FAILED]
    assert not missed, f"{fault_id} survives {missed}"


def test_every_new_case_catches_a_fault_listed_here():
    """Each case of the file is one of the catchers above, so none is there without a fault it kills."""
    new = {case.id for case in CASES.values() if case.source == "cases/affine_more.toml"}
    listed = {case_id for case_ids in CATCHERS.values() for case_id in case_ids}
    assert new and new <= listed, sorted(new - listed)
