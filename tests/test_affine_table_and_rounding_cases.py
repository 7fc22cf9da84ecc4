"""Two affine decode paths the other cases left unchecked (docs/audit/mutation.md, the affine shard):

* two-bit codes decoded straight to a DOUBLE scale's type (corpus/cases/affine/scales.toml, the
  ``TwoBitPerTensor`` rows): the only combination whose per-byte table rows are four DOUBLE values;
* a FLOAT scale decoded to a FLOAT16 logical type (corpus/cases/affine/output_rounding.toml), where onnx's
  reference DequantizeLinear rounds the FLOAT product before casting it.

Each case's expected values are checked against a formula written here (NumPy, or onnx's reference
evaluator), the reference passes it, and a runtime with the matching bug fails it with a wrong value."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import affine, dtypes

TWO_BIT = tuple(f"Required.Affine.ScaleType.{t}.TwoBitPerTensor" for t in ("Float", "Float16", "Bfloat16", "Double"))
ROUNDING = ("Recommended.Affine.Scale.Float16OutputFromFloatProduct",
            "Recommended.Affine.Scale.Float16OutputFromFloatProductWithZeroPoint")


@functools.cache
def _cases() -> dict:
    wanted = set(TWO_BIT + ROUNDING)
    return {case.id: case for case in load_cases() if case.id in wanted}


def _sub_byte_table(original, storage_type: int, dtype) -> np.ndarray:
    """Every byte value's codes (low bits first) as a [256, codes per byte] table of ``dtype``."""
    per_byte = 8 // dtypes.BIT_WIDTH[storage_type]
    return original(np.arange(256, dtype=np.uint8), storage_type, 256 * per_byte, dtype).reshape(256, per_byte)


class TwoBitTableGatheredFlat(Fault):
    """Gathers two- and four-bit codes of a wide output type through a per-byte table, but indexes the
    flattened table with the payload bytes (``take`` without ``axis=0``): byte b gives entry b, not row b."""

    fault_id = "AFF-PACKING.code-table-indexed-flat"

    def patches(self):
        def make(original):
            def codes_as_float(raw, storage_type, count, dtype):
                if dtypes.BIT_WIDTH[storage_type] == 8 or np.dtype(dtype).itemsize < 8:
                    return original(raw, storage_type, count, dtype)
                nbytes = -(-count // (8 // dtypes.BIT_WIDTH[storage_type]))
                return _sub_byte_table(original, storage_type, dtype).take(np.asarray(raw[:nbytes])).reshape(-1)[:count]
            return codes_as_float
        return [wrap(affine, "codes_as_float", make)]


class TwoBitTableRowsReversed(Fault):
    """Gathers two- and four-bit codes of a wide output type through a per-byte table whose rows list each
    byte's codes most-significant first."""

    fault_id = "AFF-PACKING.code-table-rows-reversed"

    def patches(self):
        def make(original):
            def codes_as_float(raw, storage_type, count, dtype):
                if dtypes.BIT_WIDTH[storage_type] == 8 or np.dtype(dtype).itemsize < 8:
                    return original(raw, storage_type, count, dtype)
                nbytes = -(-count // (8 // dtypes.BIT_WIDTH[storage_type]))
                table = _sub_byte_table(original, storage_type, dtype)[:, ::-1]
                return table.take(np.asarray(raw[:nbytes]), axis=0).reshape(-1)[:count]
            return codes_as_float
        return [wrap(affine, "codes_as_float", make)]


class ProductRoundedOnce(Fault):
    """Forms (code - zero_point) * scale in DOUBLE, where it is exact, and rounds it once to the logical
    type: the same values wherever the output is the scale's type, not where a FLOAT product is cast."""

    fault_id = "AFF-DQ.product-rounded-once"

    def patches(self):
        def make(original):
            def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None,
                           out=None):
                scale = np.asarray(scale)
                narrow = np.dtype(output_dtype if output_dtype is not None else scale.dtype)
                return original(codes, storage_type, scale.astype(np.float64), zero_point, axis, block_size, shape,
                                narrow, out=out)
            return dequantize
        return [wrap(affine, "dequantize", make)]


@pytest.mark.parametrize("case_id", TWO_BIT + ROUNDING)
def test_the_reference_passes(case_id):
    result = run_case(_cases()[case_id], ReferenceAdapter())
    assert result.verdict == PASSED, result.message


def test_the_two_bit_values_are_the_formula():
    """INT2 codes -2, -1, 0, 1, 1, 0, -2 times 0.1 in each scale type, rounded once to it."""
    from conformance.values import dtype_of

    codes = np.array([-2, -1, 0, 1, 1, 0, -2], np.float64)
    for case_id, name in zip(TWO_BIT, ("float32", "float16", "bfloat16", "float64")):
        expected = _cases()[case_id].extras()["expected"]
        scale = np.float64(np.asarray(0.1).astype(dtype_of(name)))
        assert expected.dtype == dtype_of(name)
        assert np.array_equal(expected.astype(np.float64), (codes * scale).astype(dtype_of(name)).astype(np.float64))


@pytest.mark.clause("AFF-PACKING")
def test_a_two_bit_table_bug_fails_the_double_case():
    """The flat gather (what the oracle's table path does with its ``axis`` dropped) leaves too few codes and
    fails the case however the runtime reports it; reversed rows give wrong values."""
    case = _cases()["Required.Affine.ScaleType.Double.TwoBitPerTensor"]
    assert run_case(case, TwoBitTableGatheredFlat()).verdict == FAILED
    result = run_case(case, TwoBitTableRowsReversed())
    assert result.verdict == FAILED and not result.traceback and "differ" in result.message, result.message


def test_the_float16_values_are_the_float_product_cast():
    """onnx's evaluator gives the FLOAT product cast to FLOAT16; rounding the exact product once differs."""
    from corpus.builders.affine_layouts import onnx_dequantize

    scale = np.float32(0.3357747197151184)
    diff = np.array([3, -3, 1, 0])
    twice = (diff.astype(np.float32) * scale).astype(np.float16)
    once = (diff * np.float64(scale)).astype(np.float16)
    assert twice.tolist() == [1.0078125, -1.0078125, np.float16(scale), 0.0]
    assert once[0] == 1.0068359375 and not np.array_equal(twice, once)
    assert np.array_equal(onnx_dequantize(diff, 3, np.asarray(scale), None, None, None, 10), twice)
    for case_id in ROUNDING:
        expected = _cases()[case_id].extras()["expected"]
        assert expected.dtype == np.float16 and np.array_equal(expected, twice)


@pytest.mark.clause("AFF-DQ")
@pytest.mark.parametrize("case_id", ROUNDING)
def test_a_product_rounded_once_fails_the_float16_cases(case_id):
    result = run_case(_cases()[case_id], ProductRoundedOnce())
    assert result.verdict == FAILED and not result.traceback, result.message
    assert "differ" in result.message
