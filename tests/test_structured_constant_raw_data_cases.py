"""Declaration constants packed in raw_data (corpus/cases/structured/constant_raw_data.toml): the stated values are
the ONNX encodings decoded by hand, the reference passes the case, and it fails a reader that unpacks BOOL
raw_data as a bit mask (eight elements a byte) and one that takes a 4-bit float's high nibble first."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import bits, dtypes

CASE_ID = "Required.Structured.Fields.RawDataConstantsBoolAndFloat4"


@functools.cache
def _case():
    return next(case for case in load_cases() if case.id == CASE_ID)


def _unpacking(change):
    def make(original):
        def unpack_elements(data, elem_type, count):
            replaced = change(np.asarray(data, np.uint8), elem_type, count)
            return original(data, elem_type, count) if replaced is None else replaced
        return unpack_elements
    return make


class BoolRawDataAsBitMask(Fault):
    """Unpacks BOOL raw_data eight elements a byte, least significant bit first, as a packed mask."""

    fault_id = "DECL-CONSTANT.bool-raw-data-as-bit-mask"

    def patches(self):
        def change(data, elem_type, count):
            if elem_type != dtypes.BOOL:
                return None
            return np.unpackbits(data, bitorder="little")[:count].astype(bool)
        return [wrap(bits, "unpack_elements", _unpacking(change))]


class Float4HighNibbleFirst(Fault):
    """Unpacks FLOAT4E2M1 raw_data high nibble first."""

    fault_id = "DECL-CONSTANT.float4-high-nibble-first"

    def patches(self):
        def change(data, elem_type, count):
            if elem_type != dtypes.FLOAT4E2M1:
                return None
            nibbles = np.stack([data >> 4, data & 0xF], axis=-1).reshape(-1)[:count]
            return nibbles.astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
        return [wrap(bits, "unpack_elements", _unpacking(change))]


def test_the_float4_values_are_the_onnx_encoding():
    # sign, 2 exponent bits (bias 1), 1 mantissa bit: 0x1 = 0.5 (subnormal), 0x2 = 1.0, 0x7 = 6.0, 0xF = -6.0
    codes = np.array([0x1, 0x2, 0xF, 0x7], np.uint8)
    assert codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32).tolist() == [0.5, 1.0, -6.0, 6.0]


def test_the_reference_passes():
    result = run_case(_case(), ReferenceAdapter())
    assert result.verdict == PASSED, result.message


@pytest.mark.parametrize("fault", [BoolRawDataAsBitMask(), Float4HighNibbleFirst()], ids=lambda f: f.fault_id)
def test_a_raw_data_unpacking_bug_fails_the_case(fault):
    result = run_case(_case(), fault)
    assert result.verdict == FAILED and not result.traceback, result.message
