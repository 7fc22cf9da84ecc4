"""Leaves off byte boundaries (corpus/cases/structured/unaligned_leaves.toml): the stated bytes are the fields' bit
patterns assembled least significant first, the reference passes the case, and it fails a reader that keeps
an unaligned bit pattern in a byte before reinterpreting it as FLOAT16 or DOUBLE, and one that takes a
BOOL's truth from the top bit of its byte."""

from __future__ import annotations

import functools
import struct

import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import bits, dtypes

CASE_ID = "Required.Structured.Fields.UnalignedBoolHalfDouble"
NINE_BYTES = "Required.Structured.Fields.FiftyEightBitsAcrossNineBytes"


@functools.cache
def _case(case_id: str = CASE_ID):
    return next(case for case in load_cases() if case.id == case_id)


class FloatPatternNarrowed(Fault):
    """Carries an unaligned float's bit pattern through a byte-sized temporary (the default of a storage
    table listing only FLOAT's 32 bits) before widening it back and reinterpreting it: a FLOAT16 or DOUBLE
    keeps only its low byte."""

    fault_id = "ENC-UNALIGNED.float-pattern-narrowed"

    def patches(self):
        def make(original):
            def unsigned_to_leaf(values, elem_type):
                if elem_type in (dtypes.FLOAT16, dtypes.DOUBLE):
                    storage = {16: np.uint16, 64: np.uint64}[dtypes.BIT_WIDTH[elem_type]]
                    return values.astype(np.uint8).astype(storage).view(dtypes.NUMPY_DTYPE[elem_type])
                return original(values, elem_type)
            return unsigned_to_leaf
        return [wrap(bits, "unsigned_to_leaf", make)]


class BoolFromTopBit(Fault):
    """Takes an unaligned BOOL's truth from the most significant bit of its byte (as packed masks do), so
    the byte 0x01 reads as false."""

    fault_id = "ENC-UNALIGNED.bool-from-top-bit"

    def patches(self):
        def make(original):
            def unsigned_to_leaf(values, elem_type):
                if elem_type == dtypes.BOOL:
                    return (values & np.uint64(0x80)) != 0
                return original(values, elem_type)
            return unsigned_to_leaf
        return [wrap(bits, "unsigned_to_leaf", make)]


class EightByteWindow(Fault):
    """Reads every bit field narrower than 64 bits from the eight bytes starting at its first byte: a field
    that starts late in its byte and reaches past them loses its top bits."""

    fault_id = "ENC-UNALIGNED.eight-byte-window"

    def patches(self):
        def make(original):
            def read_bits(buffer, bit_positions, width):
                if width >= 64:
                    return original(buffer, bit_positions, width)
                data = bytes(np.asarray(buffer, np.uint8)) + bytes(8)
                positions = np.asarray(bit_positions)
                return np.array([int.from_bytes(data[int(p) // 8:int(p) // 8 + 8], "little") >> (int(p) % 8)
                                 & ((1 << width) - 1) for p in positions.reshape(-1)],
                                np.uint64).reshape(positions.shape)
            return read_bits
        return [wrap(bits, "read_bits", make)]


def test_the_bytes_are_the_fields_bit_patterns_least_significant_first():
    half_one = 0x3C00  # sign 0, exponent 15 (bias 15), mantissa 0
    double = struct.unpack("<Q", struct.pack("<d", -2.5))[0]
    pattern = 3 | 1 << 4 | half_one << 12 | double << 28 | 0xF << 92
    assert _case().model_bytes().count(pattern.to_bytes(12, "little")) == 1


def test_the_nine_bytes_are_the_three_components_least_significant_first():
    pattern = 85 | (1 << 57 | 1) << 7 | 127 << 65
    assert _case(NINE_BYTES).model_bytes().count(pattern.to_bytes(9, "little")) == 1


@pytest.mark.parametrize("case_id", [CASE_ID, NINE_BYTES])
def test_the_reference_passes(case_id):
    result = run_case(_case(case_id), ReferenceAdapter())
    assert result.verdict == PASSED, result.message


def test_an_eight_byte_window_fails_the_nine_byte_case():
    assert run_case(_case(NINE_BYTES), ReferenceAdapter()).verdict == PASSED
    result = run_case(_case(NINE_BYTES), EightByteWindow())
    assert result.verdict == FAILED and not result.traceback, result.message


@pytest.mark.parametrize("fault", [FloatPatternNarrowed(), BoolFromTopBit()], ids=lambda f: f.fault_id)
def test_an_unaligned_leaf_bug_fails_the_case(fault):
    result = run_case(_case(), fault)
    assert result.verdict == FAILED, f"{fault.fault_id} passes {CASE_ID}"
    assert not result.traceback, result.message
