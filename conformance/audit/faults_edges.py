"""Boundary faults in value decoding and payload arithmetic: bugs a runtime passes on every middle value
and shows only at an edge (a partial last block of a multi-row value, a zero point at the end of its
range, the final partial byte of codes or zero points, a negative axis, a FLOAT16 product past its
range, a narrow bit field straddling a byte, a wide one starting inside a byte, one record, an external
extent at the end of its file or beyond 2**32, a code count whose bit count passes 2**32)."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np

from conformance.audit.fault import Fault, wrap
from conformance.audit.fault import decode_module as decode
from conformance.audit.faults_affine_more import _elementwise, _finish, _per_element, _raw
from reference_impl import ContractError, affine, bits, dtypes, payload, records, schema, verifier
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

_SUB_BYTE = (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)


# ------------------------------------------------------------------------------------- affine
def _flat_block_index(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        shape = tuple(shape)
        if axis is None or not block_size or axis != len(shape) - 1 or shape[axis] % block_size == 0 \
                or shape[axis] <= block_size:
            return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, out)
        # the last-axis fast path: parameter index = flat element index // block_size, over the parameters
        # stored row-major; exact while every row is a whole number of blocks
        count = int(np.prod(shape))
        index = np.minimum(np.arange(count) // block_size, np.asarray(scale).size - 1)
        scale_e = np.asarray(scale).reshape(-1)[index].reshape(shape)
        zero_e = None if zero_point is None else np.asarray(zero_point).reshape(-1)[index].reshape(shape)
        return _elementwise(original, codes, storage_type, scale_e, zero_e, shape, output_dtype, out)
    return dequantize


class BlockIndexFromFlatPosition(Fault):
    """Blocked along the last axis, the parameter of element ``f`` (flat index) is taken as
    ``params.flat[f // block_size]``: right while each row is whole blocks, wrong from the second row on
    when the last block of a row is partial."""

    fault_id = "AFF-BLOCK.flat-index-blocks"
    clauses = ("AFF-BLOCK", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _flat_block_index)]


def _difference_wraps(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        if storage_type not in (dtypes.INT8, dtypes.UINT8) or zero_point is None:
            return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, out)
        shape = tuple(shape)
        count = int(np.prod(shape)) if shape else 1
        values = affine.codes_as_float(_raw(codes), storage_type, count, np.int64)
        zero_e = _per_element(zero_point, shape or (1,), axis, block_size).reshape(-1).astype(np.int64)
        storage = np.int8 if storage_type == dtypes.INT8 else np.uint8
        wrapped = (values - zero_e).astype(storage)  # code - zero_point in the storage type's lane, wrapping
        scale_e = _per_element(scale, shape or (1,), axis, block_size)
        return _elementwise(original, wrapped.tobytes(), storage_type, scale_e, None, shape, output_dtype, out)
    return dequantize


class DifferenceWrapsInStorageType(Fault):
    """Subtracts the zero point from 8-bit codes in the storage type itself (``int8_t d = code - zp``,
    ``uint8_t`` for UINT8): a difference outside the type's range wraps (UINT8 code 0 - zero point 1 is
    255; INT8 -128 - 127 is 1)."""

    fault_id = "AFF-ZERO-POINT.difference-wraps-in-storage-type"
    clauses = ("AFF-ZERO-POINT", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _difference_wraps)]


def _axis_against_parameters(value):
    """The value as the buggy runtime reads it: a negative axis normalized against the rank of the scale."""
    layout = value.affine
    if value.WhichOneof("layout") != "affine" or not layout.HasField("axis") or layout.axis >= 0:
        return value
    rank = max(len(layout.scale.dims), 1)
    if not -rank <= layout.axis < 0:
        return value
    copy = schema.EncodedValueProto()
    copy.CopyFrom(value)
    copy.affine.axis = layout.axis % rank
    return copy


class NegativeAxisAgainstParameterRank(Fault):
    """Normalizes a negative axis with the rank of the scale tensor instead of the value's rank: for
    per-axis parameters (rank one) axis -1 becomes 0, the first axis; blocked parameters (same rank as
    the value) are unaffected."""

    fault_id = "AFF-AXIS.negative-axis-against-parameter-rank"
    clauses = ("AFF-AXIS",)
    boundary = True

    def patches(self):
        def verifying(original):
            def verify_affine(value, path, extent):
                return original(_axis_against_parameters(value), path, extent)
            return verify_affine

        def decoding(original):
            def decode_affine(value, payload_bytes, count, path, out):
                return original(_axis_against_parameters(value), payload_bytes, count, path, out)
            return decode_affine
        return [wrap(verifier, "_verify_affine", verifying), wrap(decode, "_decode_affine", decoding)]


def _partial_byte_zero(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        count = int(np.prod(shape)) if len(shape) else 1
        if storage_type in _SUB_BYTE:
            per_byte = 8 // dtypes.BIT_WIDTH[storage_type]
            if count % per_byte:
                raw = _raw(codes).copy()
                raw[count // per_byte] = 0  # the unpack loop runs over count // per_byte whole bytes only
                codes = raw
        return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, out)
    return dequantize


class PartialFinalByteCodesZero(Fault):
    """Unpacks four- and two-bit codes over ``count // codes_per_byte`` whole bytes (the buffer was
    zero-initialized): the codes of a final partial byte (an odd INT4 count) decode as code 0."""

    fault_id = "AFF-PACKING.partial-final-byte-zero"
    clauses = ("AFF-PACKING",)
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _partial_byte_zero)]


def _zero_point_tail_dropped(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        if zero_point is not None and storage_type in _SUB_BYTE:
            per_byte = 8 // dtypes.BIT_WIDTH[storage_type]
            zero_point = np.array(zero_point)
            flat = zero_point.reshape(-1)
            tail = flat.size % per_byte
            if tail and flat.size > 1:
                flat[flat.size - tail:] = 0  # the parameter unpacker reads only whole bytes
        return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, out)
    return dequantize


class SubByteZeroPointTailDropped(Fault):
    """Unpacks a four- or two-bit zero-point tensor of several entries over its whole bytes only: when
    the entry count is not a multiple of the codes per byte (three INT4 channels), the last entries read
    as zero. A scalar zero point takes a separate path and is right."""

    fault_id = "AFF-ZERO-POINT.sub-byte-zero-point-tail-dropped"
    clauses = ("AFF-ZERO-POINT", "AFF-PACKING")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _zero_point_tail_dropped)]


def _product_in_scale_type(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        narrow = np.asarray(scale).dtype
        if output_dtype is None or narrow.itemsize != 2 or np.dtype(output_dtype) == narrow:
            return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, out)
        with np.errstate(over="ignore", invalid="ignore"):
            result = original(codes, storage_type, scale, zero_point, axis, block_size, shape, narrow)
            return _finish(result.astype(output_dtype), out)
    return dequantize


class ProductInScaleType(Fault):
    """With a FLOAT16 or BFLOAT16 scale and a FLOAT logical type, forms the product in the scale's type
    and widens it afterwards: a product beyond FLOAT16's range becomes infinity, one needing more than
    the narrow mantissa is rounded."""

    fault_id = "AFF-SCALE.product-in-scale-type"
    clauses = ("AFF-SCALE", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _product_in_scale_type)]


def _zero_point_threshold(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        if zero_point is not None and storage_type in (dtypes.INT4, dtypes.INT2):
            most_negative = -(1 << (dtypes.BIT_WIDTH[storage_type] - 1))
            zero_point = np.asarray(zero_point).astype(np.int16)
            zero_point = np.where(zero_point == most_negative, -most_negative, zero_point)
        return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, out)
    return dequantize


class MostNegativeZeroPointPositive(Fault):
    """The zero-point unpacker (separate from the code unpacker, which is right) sign-extends four- and
    two-bit entries with ``if zp > 8: zp -= 16`` (``> 2`` for INT2): a zero point of -8 (-2), the low end
    of its range, is read as +8 (+2)."""

    fault_id = "AFF-ZERO-POINT.most-negative-zero-point-positive"
    clauses = ("AFF-ZERO-POINT", "AFF-PACKING")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _zero_point_threshold)]


def _uint8_zero_point_signed(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        if zero_point is not None and storage_type == dtypes.UINT8:
            zero_point = np.asarray(zero_point).astype(np.uint8).view(np.int8).astype(np.int16)
        return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, out)
    return dequantize


class Uint8ZeroPointReadSigned(Fault):
    """Keeps every 8-bit zero point in an ``int8_t``: a UINT8 zero point of 128 or more (the upper half of
    its range, 255 at the end) is read as that value minus 256."""

    fault_id = "AFF-ZERO-POINT.uint8-zero-point-read-signed"
    clauses = ("AFF-ZERO-POINT",)
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _uint8_zero_point_signed)]


# ------------------------------------------------------------------------------------ records
def _first_byte_only(original):
    def read_bits(buffer, bit_positions, width):
        if width > 8:
            return original(buffer, bit_positions, width)
        positions = np.asarray(bit_positions, dtype=np.uint64)
        padded = np.concatenate([np.asarray(buffer, np.uint8), np.zeros(1, np.uint8)])
        first = (positions >> np.uint64(3)).astype(np.intp)
        shift = positions & np.uint64(7)
        return (padded[first].astype(np.uint64) >> shift) & np.uint64((1 << width) - 1)
    return read_bits


class StraddlingFieldFirstByteOnly(Fault):
    """Reads a bit field of at most eight bits from the one byte it starts in (``(b[p >> 3] >> (p & 7))
    & mask``): right while it fits that byte, its high bits lost when it straddles a byte boundary."""

    fault_id = "ENC-BIT-ORDER.straddling-field-first-byte-only"
    clauses = ("ENC-BIT-ORDER", "ENC-TIGHT")
    boundary = True

    def patches(self):
        return [wrap(bits, "read_bits", _first_byte_only)]


def _single_record_squeezed(original):
    def read_leaf(payload_array, record_bits, leaf):
        result = original(payload_array, record_bits, leaf)
        return result[0] if result.ndim and result.shape[0] == 1 else result
    return read_leaf


class SingleRecordSqueezed(Fault):
    """Drops the record axis of a field read when the payload holds exactly one record (a NumPy-style
    squeeze): a one-record payload's fields lose their leading dimension."""

    fault_id = "ENC-RECORD-COUNT.single-record-squeezed"
    clauses = ("ENC-RECORD-COUNT",)
    boundary = True

    def patches(self):
        return [wrap(records, "read_leaf", _single_record_squeezed)]


def _own_width_window(original):
    def read_bits(buffer, bit_positions, width):
        if not 8 < width < 64:
            return original(buffer, bit_positions, width)
        # the window is the field's own byte width (2 bytes for 9..16 bits, ...), loaded from its first
        # byte: right at a byte boundary, the top bits lost when the field starts inside a byte
        window_bits = 8 * -(-width // 8)
        positions = np.asarray(bit_positions, dtype=np.uint64)
        start = positions - (positions & np.uint64(7))
        shift = positions & np.uint64(7)
        raw = original(buffer, start, window_bits)
        return (raw >> shift) & np.uint64((1 << width) - 1)
    return read_bits


class UnalignedWindowOfOwnWidth(Fault):
    """Loads an unaligned field wider than a byte through a window of its own byte width (two bytes for
    an INT16, four for a FLOAT), starting at the byte it begins in: a field starting inside a byte loses
    the top bits that spill into one more byte. Byte-aligned fields and 64-bit ones are read right."""

    fault_id = "ENC-UNALIGNED.window-of-own-width"
    clauses = ("ENC-UNALIGNED", "ENC-BIT-ORDER")
    boundary = True

    def patches(self):
        return [wrap(bits, "read_bits", _own_width_window)]


def _end_bit_exclusive(original):
    def read_leaf(payload_array, record_bits, leaf):
        record_bytes = record_bits // 8
        count = len(payload_array) // record_bytes if record_bytes else 0
        gathered = leaf.offset % 8 or leaf.width % 8
        if count and gathered:
            last = (count - 1) * record_bits + leaf.offset + sum((c - 1) * s for c, s in leaf.dims) + leaf.width
            if all(c > 0 for c, _ in leaf.dims) and last >= len(payload_array) * 8:  # '>=' for '>'
                raise violation(E.PAYLOAD_PARTIAL_RECORD, leaf.path, "field extends beyond the payload")
        return original(payload_array, record_bits, leaf)
    return read_leaf


class BitFieldEndingAtPayloadEndRejected(Fault):
    """The bounds check of the bit-field path (fields not starting on a byte or not whole bytes) tests
    ``end_bit >= 8 * payload_bytes``: a bit field ending exactly at the end of the payload (the last
    field of the last record) is refused as beyond it."""

    fault_id = "ENC-RECORD-COUNT.bit-field-at-payload-end-rejected"
    clauses = ("ENC-RECORD-COUNT", "ENC-TIGHT")
    boundary = True

    def patches(self):
        return [wrap(records, "read_leaf", _end_bit_exclusive)]


# ----------------------------------------------------------------------------------- external
def _offset_at_end_refused(original):
    def open_external(extent, base_dir, path):
        fd = original(extent, base_dir, path)
        if extent.offset >= os.fstat(fd).st_size:
            os.close(fd)
            raise violation(E.EXTERNAL_FILE_INVALID, path, f"offset {extent.offset} is not inside the backing file")
        return fd
    return open_external


class OffsetAtEndOfFileRefused(Fault):
    """Checks ``offset < file_size`` as well as ``offset + length <= file_size``: an empty extent at the
    very end of its backing file is refused."""

    fault_id = "PAY-EXTERNAL-EXTENT.offset-at-end-refused"
    clauses = ("PAY-EXTERNAL-EXTENT", "PAY-EMPTY")
    boundary = True

    def patches(self):
        return [wrap(payload, "open_external", _offset_at_end_refused)]


def _offset_32_bits(original):
    def payload_extent(value, path):
        extent = original(value, path)
        if extent.external and extent.offset >= 1 << 32:
            return replace(extent, offset=extent.offset & 0xFFFFFFFF)
        return extent
    return payload_extent


class ExternalOffsetTruncatedTo32Bits(Fault):
    """Keeps the external offset in a 32-bit field: an offset of 2**32 or more is read modulo 2**32,
    so an extent beyond the end of a small file reads bytes near its start instead of being refused."""

    fault_id = "PAY-EXTERNAL-EXTENT.offset-truncated-32-bits"
    clauses = ("PAY-EXTERNAL-EXTENT",)
    boundary = True

    def patches(self):
        return [wrap(payload, "payload_extent", _offset_32_bits)]


# ------------------------------------------------------------------------------- payload size
def _bit_count_32(original):
    def verify_affine(value, path, extent):
        layout = value.affine
        try:
            return original(value, path, extent)
        except ContractError as error:
            if error.code != E.AFFINE_PAYLOAD_SIZE:
                raise
            count = math.prod(d.dim_value for d in value.logical_type.tensor_type.shape.dim)
            bits = (count * dtypes.BIT_WIDTH[layout.storage_type]) & 0xFFFFFFFF  # n * bit_width in 32 bits
            if extent.length != (bits + 7) // 8:
                raise
            return verifier.EncodedInfo(path, extent, logical_count=count)
    return verify_affine


class AffineBitCountIn32Bits(Fault):
    """Computes the affine payload size ``ceil(n * bit_width / 8)`` with ``n * bit_width`` in 32 bits:
    for 2**30 INT4 codes (2**32 bits) it expects an empty payload and accepts one; below 2**32 bits the
    size is right."""

    fault_id = "AFF-PAYLOAD-SIZE.bit-count-32-bits"
    clauses = ("AFF-PAYLOAD-SIZE",)
    boundary = True

    def patches(self):
        return [wrap(verifier, "_verify_affine", _bit_count_32)]
