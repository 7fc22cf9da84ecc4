"""More faults in the closed affine branch and its payloads: edges the happy cases rarely reach (the one
code sign extension misses, the tail of an odd payload, the partial last block, per-axis parameters of a
rank-3 value, subnormal scales, the output's rounding, 8-bit subtraction, the axis range,
external extents past the first page, at the end of the file or of zero length, and checks made on the
inline path only)."""

from __future__ import annotations

import mmap
import os

import numpy as np

from conformance.audit.fault import Fault, Patch, wrap
from conformance.audit.fault import decode_module as decode
from reference_impl import affine, dtypes, payload, verifier
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation


def _finish(result: np.ndarray, out):
    """Write a wrapper's result into the caller's buffer when one was given."""
    if out is None:
        return result
    out[...] = result
    return out


def _raw(codes) -> np.ndarray:
    if isinstance(codes, (bytes, bytearray, memoryview)):
        return np.frombuffer(codes, np.uint8)
    return np.asarray(codes, np.uint8).reshape(-1)


def _per_element(param, shape, axis, block):
    """A parameter expanded to one value per element (the layout DequantizeLinear defines)."""
    param = np.asarray(param)
    if axis is None:
        return np.broadcast_to(param, shape).copy()
    if block:
        expanded = np.repeat(param, block, axis=axis).take(np.arange(shape[axis]), axis=axis)
        return np.ascontiguousarray(expanded)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(param.reshape(view), shape).copy()


def _elementwise(original, codes, storage_type, scale_e, zero_e, shape, output_dtype, out):
    """The oracle's dequantization with one parameter per element: blocks of one along axis 0."""
    flat = tuple(shape) or (1,)  # a scalar value: one element along axis 0
    scale_e = np.asarray(scale_e).reshape(flat)
    zero_e = None if zero_e is None else np.asarray(zero_e).reshape(flat)
    result = original(codes, storage_type, scale_e, zero_e, 0, 1, flat, output_dtype)
    return _finish(result.reshape(shape), out)


# ---------------------------------------------------------------------------------- codes
def _sign_threshold(original):
    def codes_as_float(raw, storage_type, count, dtype):
        values = original(raw, storage_type, count, dtype)
        if storage_type in (dtypes.INT4, dtypes.INT2):
            most_negative = -(1 << (dtypes.BIT_WIDTH[storage_type] - 1))
            values = np.where(values == most_negative, -most_negative, values).astype(values.dtype)
        return values
    return codes_as_float


class SignExtensionMissesMostNegative(Fault):
    """Sign-extends four- and two-bit codes with ``if code > 8: code -= 16`` (``> 2`` for INT2): the most
    negative code (-8, -2) is read as +8 (+2)."""

    fault_id = "AFF-PACKING.most-negative-code-positive"
    clauses = ("AFF-PACKING", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "codes_as_float", _sign_threshold)]


def _unsigned_tail_from_top(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        width = dtypes.BIT_WIDTH.get(storage_type, 8)
        count = int(np.prod(shape)) if len(shape) else 1
        per_byte = 8 // width
        if storage_type in (dtypes.UINT4, dtypes.UINT2) and count % per_byte:
            raw = _raw(codes).copy()
            tail = count % per_byte
            last = int(raw[(count - 1) // per_byte])
            mask = (1 << width) - 1
            # the tail's codes are taken from the top of the byte down, as a whole byte's would be by a
            # loop that counts from its most-significant group
            read = [(last >> (8 - (k + 1) * width)) & mask for k in range(tail)]
            raw[(count - 1) // per_byte] = sum(code << (k * width) for k, code in enumerate(read))
            codes = raw
        return _finish(original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype), out)
    return dequantize


class UnsignedTailFromHighBits(Fault):
    """The unsigned four- and two-bit unpacker handles whole bytes correctly but reads the codes of a final
    partial byte (an odd UINT4 count, a UINT2 count not a multiple of four) from its high bits."""

    fault_id = "AFF-PACKING.unsigned-tail-high-bits"
    clauses = ("AFF-PACKING",)
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _unsigned_tail_from_top)]


# ------------------------------------------------------------------------------ parameters
def _partial_block_previous(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        if axis is not None and block_size and shape[axis] % block_size and shape[axis] > block_size:
            full = shape[axis] // block_size  # block index clamped to the last full block
            index = np.minimum(np.arange(-(-shape[axis] // block_size)), full - 1)
            scale = np.take(np.asarray(scale), index, axis=axis)
            if zero_point is not None:
                zero_point = np.take(np.asarray(zero_point), index, axis=axis)
        return _finish(original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype), out)
    return dequantize


class PartialBlockTakesPreviousScale(Fault):
    """Computes a blocked element's parameter index as ``min(i // block_size, dim // block_size - 1)``:
    the elements of a partial last block use the previous block's scale and zero point."""

    fault_id = "AFF-BLOCK.partial-block-previous-parameters"
    clauses = ("AFF-BLOCK", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _partial_block_previous)]


def _inner_next_dim_only(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        if axis is None or block_size or axis + 2 >= len(shape):
            return _finish(original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype),
                           out)
        # the stride of the axis taken as the next dimension only, not the product of all later ones
        index = (np.arange(int(np.prod(shape))) // shape[axis + 1]) % shape[axis]
        scale_e = np.asarray(scale).reshape(-1)[index].reshape(shape)
        zero_e = None if zero_point is None else np.asarray(zero_point).reshape(-1)[index].reshape(shape)
        return _elementwise(original, codes, storage_type, scale_e, zero_e, shape, output_dtype, out)
    return dequantize


class PerAxisStrideNextDimOnly(Fault):
    """Finds an element's per-axis parameter with the axis's stride taken as the next dimension alone
    (``shape[axis + 1]``) instead of the product of every later dimension: right for rank 2 and for the
    last two axes, wrong for axis 0 of a rank-3 value."""

    fault_id = "AFF-AXIS.per-axis-stride-next-dim"
    clauses = ("AFF-AXIS", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _inner_next_dim_only)]


def _minus_rank_rejected(axis, rank, path):
    if axis is None:
        return None
    if not -rank < axis < rank:
        raise violation(E.AFFINE_AXIS_INVALID, path, f"axis {axis} is outside (-{rank}, {rank})")
    return axis % rank


class AxisMinusRankRejected(Fault):
    """Checks a negative axis with ``-rank < axis`` (off by one): axis = -rank, which DequantizeLinear
    normalizes to 0, is refused."""

    fault_id = "AFF-AXIS.minus-rank-rejected"
    clauses = ("AFF-AXIS",)
    boundary = True

    def patches(self):
        return [Patch(affine, "normalize_axis", _minus_rank_rejected)]


def _subnormal_scale_flushed(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        scale = np.asarray(scale)
        if scale.dtype == np.float16:
            scale = np.where(np.abs(scale) < np.float16(2.0 ** -14), np.float16(0), scale).astype(np.float16)
        return _finish(original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype), out)
    return dequantize


class Float16SubnormalScaleFlushed(Fault):
    """Converts FLOAT16 scales with a flush-to-zero conversion: a subnormal scale (below 2**-14) becomes 0
    and its values decode to zero."""

    fault_id = "AFF-SCALE.float16-subnormal-flushed"
    clauses = ("AFF-SCALE", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _subnormal_scale_flushed)]


def _bfloat16_truncated(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        result_dtype = np.dtype(output_dtype) if output_dtype is not None else np.asarray(scale).dtype
        if result_dtype.name != "bfloat16":
            return _finish(original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype),
                           out)
        wide = original(codes, storage_type, scale, zero_point, axis, block_size, shape, np.float32)
        bits = np.ascontiguousarray(wide).view(np.uint32) & np.uint32(0xFFFF0000)  # the high half kept
        return _finish(bits.view(np.float32).astype(result_dtype), out)
    return dequantize


class Bfloat16OutputTruncated(Fault):
    """Forms BFLOAT16 values by keeping the high 16 bits of the FLOAT product (truncation) instead of
    rounding it to nearest even."""

    fault_id = "AFF-DQ.bfloat16-output-truncated"
    clauses = ("AFF-DQ", "AFF-SCALE")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _bfloat16_truncated)]


def _saturating_int8_difference(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        if storage_type != dtypes.INT8 or zero_point is None or not np.any(zero_point):
            return _finish(original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype),
                           out)
        count = int(np.prod(shape)) if len(shape) else 1
        values = _raw(codes)[:count].view(np.int8).astype(np.int64).reshape(shape)
        zero_e = _per_element(zero_point, shape, axis, block_size).astype(np.int64)
        difference = np.clip(values - zero_e, -128, 127)  # an int8 saturating subtract
        # fed back as codes with a zero point of zero: INT8 holds every clipped difference
        clipped = difference.astype(np.int8).tobytes()
        scale_e = _per_element(scale, shape, axis, block_size)
        return _elementwise(original, clipped, storage_type, scale_e, None, shape, output_dtype, out)
    return dequantize


class Int8DifferenceSaturated(Fault):
    """Subtracts an INT8 zero point with an 8-bit saturating subtract (``code - zero_point`` clipped to
    [-128, 127]) instead of in a wider integer: differences beyond the INT8 range are wrong."""

    fault_id = "AFF-ZERO-POINT.int8-difference-saturated"
    clauses = ("AFF-ZERO-POINT", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _saturating_int8_difference)]


def _eight_bit_at_least(original):
    def verify_affine(value, path, extent):
        storage = value.affine.storage_type
        if storage in (dtypes.INT8, dtypes.UINT8) and not extent.external:
            try:
                count = int(np.prod(verifier.logical_tensor_shape(value, path)[1]))
            except Exception:  # noqa: BLE001 - the original reports a malformed logical type
                count = None
            if count is not None and extent.length > count:
                extent = type(extent)(count, None, 0, bytes(extent.inline or value.raw_data)[:count])
        return original(value, path, extent)
    return verify_affine


class EightBitPayloadAtLeast(Fault):
    """Checks the inline payload of INT8/UINT8 codes with ``length >= n`` (the byte-wide path reads the
    first n bytes), while the packed types keep the exact ``ceil(n * bits / 8)`` check."""

    fault_id = "AFF-PAYLOAD-SIZE.eight-bit-at-least"
    clauses = ("AFF-PAYLOAD-SIZE",)

    def patches(self):
        return [wrap(verifier, "_verify_affine", _eight_bit_at_least)]


# --------------------------------------------------------------------------------- payloads
def _external_size_unchecked(original):
    def verify_affine(value, path, extent):
        if extent.external:
            try:
                count = int(np.prod(verifier.logical_tensor_shape(value, path)[1]))
                needed = affine.payload_bytes(value.affine.storage_type, count)
            except Exception:  # noqa: BLE001 - the original reports what is malformed
                needed = None
            if needed is not None and extent.length > needed:
                extent = type(extent)(needed, extent.location, extent.offset)
        return original(value, path, extent)
    return verify_affine


class ExternalPayloadLongerAccepted(Fault):
    """Checks the exact payload size ``ceil(n * bits / 8)`` on raw_data only: an external extent longer
    than the codes is accepted and its first bytes decoded."""

    fault_id = "AFF-PAYLOAD-SIZE.external-longer-accepted"
    clauses = ("AFF-PAYLOAD-SIZE", "PAY-EXTERNAL-EXTENT")

    def patches(self):
        def make(original):
            def decode_affine(value, payload_bytes, count, path, out):
                needed = affine.payload_bytes(value.affine.storage_type, count)
                return original(value, payload_bytes[:needed], count, path, out)
            return decode_affine
        return [wrap(verifier, "_verify_affine", _external_size_unchecked),
                wrap(decode, "_decode_affine", make)]


def _padding_masked_external(original):
    def decode_affine(value, payload_bytes, count, path, out):
        bits = count * dtypes.BIT_WIDTH.get(value.affine.storage_type, 8)
        if value.data_location == payload.EXTERNAL and bits % 8 and len(payload_bytes):
            masked = np.array(payload_bytes, np.uint8)
            masked[-1] &= (1 << (bits % 8)) - 1
            payload_bytes = masked
        return original(value, payload_bytes, count, path, out)
    return decode_affine


class ExternalPaddingUnchecked(Fault):
    """Checks that the unused final high bits are zero on raw_data only: an external payload with nonzero
    padding bits decodes."""

    fault_id = "AFF-PADDING-ZERO.external-unchecked"
    clauses = ("AFF-PADDING-ZERO",)

    def patches(self):
        return [wrap(decode, "_decode_affine", _padding_masked_external)]


def _mapping_indexed_with_offset(original):
    def open_payload(value, extent, base_dir, path):
        granularity = mmap.ALLOCATIONGRANULARITY
        if extent.external and extent.length and extent.offset >= granularity:
            start = extent.offset - extent.offset % granularity  # the mapping starts at the page below ...
            fd = payload.open_external(extent, base_dir, path)
            try:
                size = os.fstat(fd).st_size
                if start + extent.offset + extent.length > size:  # ... and is indexed at the whole offset
                    raise violation(E.EXTERNAL_FILE_INVALID, path, "read past the end of the mapping")
                data = os.pread(fd, extent.length, start + extent.offset)
            finally:
                os.close(fd)
            array = np.frombuffer(data, np.uint8)
            return array
        return original(value, extent, base_dir, path)
    return open_payload


class MappingIndexedWithWholeOffset(Fault):
    """Maps an external extent from the allocation-granularity boundary below its offset, as mmap requires,
    then indexes the mapping with the whole offset instead of ``offset - start``: right for offsets below
    one page (4096 bytes), wrong beyond."""

    fault_id = "PAY-EXTERNAL-EXTENT.mapping-offset-twice"
    clauses = ("PAY-EXTERNAL-EXTENT",)
    boundary = True

    def patches(self):
        return [wrap(payload, "open_payload", _mapping_indexed_with_offset)]


def _empty_extent_refused(original):
    def open_payload(value, extent, base_dir, path):
        if extent.external and extent.length == 0:
            raise violation(E.EXTERNAL_FILE_INVALID, path, "mmap: cannot map an empty extent")
        return original(value, extent, base_dir, path)
    return open_payload


class EmptyExternalExtentRefused(Fault):
    """Maps every external extent with mmap, which refuses a length of zero: an external payload of zero
    bytes (zero records, zero codes) fails instead of reading as empty."""

    fault_id = "PAY-EMPTY.empty-external-refused"
    clauses = ("PAY-EMPTY", "PAY-EXTERNAL-EXTENT")
    boundary = True

    def patches(self):
        return [wrap(payload, "open_payload", _empty_extent_refused)]


def _end_of_file_exclusive(original):
    def open_external(extent, base_dir, path):
        fd = original(extent, base_dir, path)
        if os.fstat(fd).st_size <= extent.offset + extent.length:
            os.close(fd)
            raise violation(E.EXTERNAL_FILE_INVALID, path, "backing file does not cover offset + length")
        return fd
    return open_external


class ExtentAtEndOfFileRefused(Fault):
    """Checks the backing file's size with ``size <= offset + length`` (off by one): an extent ending
    exactly at the end of its file is refused."""

    fault_id = "PAY-EXTERNAL-EXTENT.end-of-file-exclusive"
    clauses = ("PAY-EXTERNAL-EXTENT",)
    boundary = True

    def patches(self):
        return [wrap(payload, "open_external", _end_of_file_exclusive)]


# ------------------------------------------------------------------------------ parameter readers
def _affine_layouts(model):
    from conformance.audit.fault import encoded_values

    return [value.affine for value in encoded_values(model) if value.WhichOneof("layout") == "affine"]


class NonPositiveScaleRejected(Fault):
    """Validates scales as a quantization tool would, refusing a zero or negative scale, although
    DequantizeLinear (and the spec's "floating element type") admits any floating value."""

    fault_id = "AFF-SCALE.non-positive-scale-rejected"
    clauses = ("AFF-SCALE", "AFF-DQ")
    boundary = True

    def precheck(self, model, base_dir):
        from reference_impl.tensors import to_array

        for layout in _affine_layouts(model):
            if layout.scale.data_type not in affine.SCALE_TYPES:
                continue
            try:
                values = to_array(layout.scale, "scale").astype(np.float64)
            except Exception:  # noqa: BLE001 - a malformed scale is the oracle's to report
                continue
            if np.any(values <= 0):
                raise violation(E.AFFINE_SCALE_INVALID, "scale", "scales must be positive")


class EmptyParameterRejected(Fault):
    """Takes a scale with no elements for a missing one and refuses it: a per-axis or blocked value whose
    axis (or another dimension) is 0 needs a scale of shape [0], which DequantizeLinear admits."""

    fault_id = "AFF-SCALE.empty-scale-rejected"
    clauses = ("AFF-SCALE", "AFF-AXIS")
    boundary = True

    def precheck(self, model, base_dir):
        for layout in _affine_layouts(model):
            if layout.HasField("scale") and 0 in list(layout.scale.dims):
                raise violation(E.AFFINE_SCALE_INVALID, "scale", "scale has no values")


def _bfloat16_raw_as_float16(original):
    def to_array(tensor, path):
        if tensor.data_type == dtypes.BFLOAT16 and tensor.HasField("raw_data"):
            halves = original(tensor, path).view(np.uint16).view(np.float16)  # the same bits read as FLOAT16
            return halves.astype(np.float32).astype(dtypes.NUMPY_DTYPE[dtypes.BFLOAT16])
        return original(tensor, path)
    return to_array


class Bfloat16RawScaleReadAsFloat16(Fault):
    """Reads a BFLOAT16 scale stored in raw_data with the FLOAT16 reader (the int32_data path is right):
    the 16-bit patterns are taken as IEEE half-precision numbers."""

    fault_id = "AFF-SCALE.bfloat16-raw-as-float16"
    clauses = ("AFF-SCALE", "AFF-DQ")

    def patches(self):
        return [wrap(decode, "to_array", _bfloat16_raw_as_float16, aliases=False)]


def _uint2_zero_point_signed(original):
    def to_array(tensor, path):
        values = original(tensor, path)
        if tensor.data_type == dtypes.UINT2 and path.endswith("zero_point"):
            wide = values.astype(np.int16)
            return np.where(wide >= 2, wide - 4, wide)
        return values
    return to_array


class Uint2ZeroPointSignExtended(Fault):
    """Unpacks UINT2 zero points with the two-bit reader written for INT2, which sign-extends: zero
    points 2 and 3 become -2 and -1 (the codes themselves are read right)."""

    fault_id = "AFF-ZERO-POINT.uint2-zero-point-signed"
    clauses = ("AFF-ZERO-POINT", "AFF-PACKING")
    boundary = True

    def patches(self):
        return [wrap(decode, "to_array", _uint2_zero_point_signed, aliases=False)]


_PER_INT32 = {dtypes.INT4: 2, dtypes.UINT4: 2, dtypes.INT2: 4, dtypes.UINT2: 4}


class PackedInt32DataOnePerEntry(Fault):
    """Reads a four- or two-bit zero point stored in int32_data as one code per entry (the low bits of
    each), as for 8-bit types, instead of two (four) codes per entry as TensorProto packs them: a
    correctly packed zero point of several codes is refused for its entry count."""

    fault_id = "AFF-ZERO-POINT.int32-data-one-code-per-entry"
    clauses = ("AFF-ZERO-POINT", "AFF-PACKING")
    boundary = True

    def precheck(self, model, base_dir):
        for layout in _affine_layouts(model):
            zero_point = layout.zero_point
            if not layout.HasField("zero_point") or zero_point.data_type not in _PER_INT32 \
                    or zero_point.HasField("raw_data") or not len(zero_point.int32_data):
                continue
            count = int(np.prod(list(zero_point.dims))) if zero_point.dims else 1
            if len(zero_point.int32_data) != count:
                raise violation(E.TENSOR_DATA_INVALID, "zero_point.int32_data",
                                f"{len(zero_point.int32_data)} values for {count} elements")

    def transform(self, model, base_dir):
        from reference_impl.bits import pack_sub_byte

        for layout in _affine_layouts(model):
            zero_point = layout.zero_point
            if not layout.HasField("zero_point") or zero_point.data_type not in _PER_INT32 \
                    or zero_point.HasField("raw_data") or not len(zero_point.int32_data):
                continue
            width = dtypes.BIT_WIDTH[zero_point.data_type]
            codes = np.asarray(zero_point.int32_data, np.int64) & ((1 << width) - 1)
            packed = np.frombuffer(pack_sub_byte(codes, width), np.uint8)
            zero_point.ClearField("int32_data")
            zero_point.int32_data.extend(packed.astype(np.int32).tolist())


# --------------------------------------------------------------------------- granularity arithmetic
_INT64_MAX = (1 << 63) - 1


def _ceil_int64(original):
    def parameter_shape(shape, axis, block_size):
        if axis is None or not block_size:
            return original(shape, axis, block_size)
        total = shape[axis] + block_size - 1  # formed in int64, where it wraps past INT64_MAX
        if total > _INT64_MAX:
            total -= 1 << 64
        blocks = abs(total) // block_size * (1 if total >= 0 else -1)  # C division truncates toward zero
        blocked = list(shape)
        blocked[axis] = blocks
        return tuple(blocked)
    return parameter_shape


class BlockCountOverflows(Fault):
    """Counts blocks as ``(dim + block_size - 1) / block_size`` in int64: a block_size near INT64_MAX
    (one block covering the whole axis) wraps the sum negative, so the one-block parameters are refused."""

    fault_id = "AFF-BLOCK.block-count-overflows"
    clauses = ("AFF-BLOCK", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "parameter_shape", _ceil_int64)]


def _axis_on_scalar_ignored(original):
    def normalize_axis(axis, rank, path):
        if axis is not None and rank == 0:
            return None  # a scalar has no axis: taken as per tensor
        return original(axis, rank, path)
    return normalize_axis


class AxisOnScalarIgnored(Fault):
    """Decodes a scalar (rank-0) value whose layout sets an axis as per-tensor instead of rejecting the
    axis, which DequantizeLinear requires to lie in [-rank, rank)."""

    fault_id = "AFF-AXIS.axis-on-scalar-ignored"
    clauses = ("AFF-AXIS", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "normalize_axis", _axis_on_scalar_ignored)]


class BroadcastableParametersAccepted(Fault):
    """Accepts any parameter shape with the right number of elements (a [1, C] or [C, 1] per-axis scale,
    a [1] per-tensor scale), reshaping it, instead of DequantizeLinear's exact shapes."""

    fault_id = "AFF-DQ.broadcastable-parameters"
    clauses = ("AFF-DQ", "AFF-AXIS")

    def transform(self, model, base_dir):
        from conformance.audit.fault import encoded_values

        for value in encoded_values(model):
            if value.WhichOneof("layout") != "affine" or value.affine.HasField("block_size"):
                continue
            try:
                _, shape = verifier.logical_tensor_shape(value, "value")
                axis = affine.normalize_axis(value.affine.axis, len(shape), "axis") \
                    if value.affine.HasField("axis") else None
            except Exception:  # noqa: BLE001 - the oracle reports what is malformed
                continue
            expected = affine.parameter_shape(shape, axis, None)
            params = [value.affine.scale] + ([value.affine.zero_point] if value.affine.HasField("zero_point") else [])
            for tensor in params:
                dims = list(tensor.dims)
                if tuple(dims) != expected and int(np.prod(dims)) == int(np.prod(expected)) and dims:
                    del tensor.dims[:]
                    tensor.dims.extend(expected)


class DoubleScaleToNarrowerOutput(Fault):
    """Treats DOUBLE like the other floating types for output_dtype: a DOUBLE scale decoding to a FLOAT
    logical type (or a FLOAT scale to DOUBLE) is accepted and cast, where DequantizeLinear has no such
    combination."""

    fault_id = "AFF-SCALE.double-output-dtype-mixed"
    clauses = ("AFF-SCALE",)

    def patches(self):
        return [Patch(affine, "OUTPUT_DTYPES", affine.OUTPUT_DTYPES | {dtypes.DOUBLE})]


# ------------------------------------------------------------------------ vector paths and overflow
#: codes one 16-byte vector of four-bit codes holds
_VECTOR_CODES = 32


def _nibbles_unzipped(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        count = int(np.prod(shape)) if len(shape) else 1
        if storage_type in (dtypes.INT4, dtypes.UINT4) and count >= _VECTOR_CODES:
            from reference_impl.bits import pack_sub_byte, unpack_sub_byte

            right = unpack_sub_byte(_raw(codes), 4, count, signed=False).astype(np.uint8)
            body = count // _VECTOR_CODES * _VECTOR_CODES
            groups = right[:body].reshape(-1, _VECTOR_CODES)
            # each vector's low nibbles are stored first, then its high nibbles (unzipped, not interleaved)
            read = np.concatenate([groups[:, 0::2], groups[:, 1::2]], axis=1).reshape(-1)
            codes = pack_sub_byte(np.concatenate([read, right[body:]]), 4)
        return _finish(original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype), out)
    return dequantize


class VectorNibblesUnzipped(Fault):
    """The vectorized four-bit unpacker (16 payload bytes, 32 codes at a time) writes each vector's 16 low
    nibbles and then its 16 high nibbles instead of interleaving them; the scalar tail (and every value
    of fewer than 32 codes) is right."""

    fault_id = "AFF-PACKING.vector-nibbles-unzipped"
    clauses = ("AFF-PACKING", "AFF-ROW-MAJOR")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _nibbles_unzipped)]


def _narrowing_saturates(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        result_dtype = np.dtype(output_dtype) if output_dtype is not None else np.asarray(scale).dtype
        if result_dtype != np.float16 or np.asarray(scale).dtype == np.float16:
            return _finish(original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype),
                           out)
        wide = original(codes, storage_type, scale, zero_point, axis, block_size, shape, np.float32)
        limit = np.float32(np.finfo(np.float16).max)
        return _finish(np.clip(wide, -limit, limit).astype(np.float16), out)  # a saturating conversion
    return dequantize


class Float16OutputSaturates(Fault):
    """Converts a FLOAT product to a FLOAT16 logical type (output_dtype) with a saturating conversion:
    products beyond 65504 become +-65504 instead of rounding to infinity."""

    fault_id = "AFF-DQ.float16-output-saturates"
    clauses = ("AFF-DQ", "AFF-SCALE")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _narrowing_saturates)]


def _zero_difference_shortcut(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        result = original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype)
        if not np.all(np.isfinite(np.asarray(scale, np.float64))):
            ones = np.ones_like(np.asarray(scale))
            differences = original(codes, storage_type, ones, zero_point, axis, block_size, shape, np.float32)
            result = np.where(differences == 0, np.zeros((), result.dtype), result).astype(result.dtype)
        return _finish(result, out)
    return dequantize


class ZeroDifferenceShortcut(Fault):
    """Writes 0 for a code equal to its zero point without multiplying (a shortcut for the common case),
    so a zero difference times an infinite or NaN scale gives 0 instead of NaN."""

    fault_id = "AFF-DQ.zero-difference-shortcut"
    clauses = ("AFF-DQ",)
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _zero_difference_shortcut)]


def _empty_extent_anywhere(original):
    def open_external(extent, base_dir, path):
        if extent.length == 0:  # nothing to read: only the file itself is checked
            extent = type(extent)(0, extent.location, 0)
        return original(extent, base_dir, path)
    return open_external


class EmptyExtentOffsetUnchecked(Fault):
    """Skips the extent check for a zero-length external payload (there is nothing to read): an offset
    beyond the end of the backing file passes."""

    fault_id = "PAY-EXTERNAL-EXTENT.empty-extent-offset-unchecked"
    clauses = ("PAY-EXTERNAL-EXTENT",)
    boundary = True

    def patches(self):
        return [wrap(payload, "open_external", _empty_extent_anywhere)]


class PaddingMaskAssumesNibble(Fault):
    """Checks the unused final bits with ``last_byte >> 4`` whatever the storage type (the check was written
    for four-bit codes): a two-bit payload with 1 code in its last byte passes with nonzero bits 2-3, and
    one with 3 codes in its last byte is refused when the third code is nonzero."""

    fault_id = "AFF-PADDING-ZERO.nibble-mask-for-two-bit"
    clauses = ("AFF-PADDING-ZERO", "AFF-PACKING")
    boundary = True

    def precheck(self, model, base_dir):
        for value in _two_bit_inline(model):
            count, raw = value
            if count % 4 == 3 and raw[-1] >> 4:  # the third code of the last byte taken for padding
                raise violation(E.AFFINE_PADDING_NONZERO, "raw_data", "unused final high bits must be zero")

    def transform(self, model, base_dir):
        from conformance.audit.fault import encoded_values

        for value in encoded_values(model):
            found = _two_bit_count(value)
            if found is None:
                continue
            count, raw = found
            used = count * 2 % 8
            if used and raw:
                last = raw[-1]
                nibble_ok = not last >> 4
                keep = last & ((1 << used) - 1)
                if nibble_ok:  # what the nibble check lets through reads as if its padding were zero
                    value.raw_data = raw[:-1] + bytes([keep])


def _two_bit_count(value):
    if value.WhichOneof("layout") != "affine" or value.affine.storage_type not in (dtypes.INT2, dtypes.UINT2) \
            or value.data_location == payload.EXTERNAL or not value.HasField("raw_data"):
        return None
    try:
        count = int(np.prod(verifier.logical_tensor_shape(value, "value")[1]))
    except Exception:  # noqa: BLE001 - the oracle reports a malformed logical type
        return None
    if len(value.raw_data) != affine.payload_bytes(value.affine.storage_type, count):
        return None
    return count, value.raw_data


def _two_bit_inline(model):
    from conformance.audit.fault import encoded_values

    return [found for found in map(_two_bit_count, encoded_values(model)) if found is not None]


class ExtentKeyedByLocation(Fault):
    """Maps each backing file once, keyed by its location, and hands every value in that file the extent
    of the first one that named it: a second value at another offset of the same file reads the first
    value's bytes."""

    fault_id = "PAY-EXTERNAL-EXTENT.extent-keyed-by-location"
    clauses = ("PAY-EXTERNAL-EXTENT",)

    def transform(self, model, base_dir):
        from conformance.audit.fault import encoded_values

        first: dict[str, dict[str, str]] = {}
        for value in encoded_values(model):
            if value.data_location != payload.EXTERNAL:
                continue
            entries = {entry.key: entry.value for entry in value.external_data}
            location = entries.get("location")
            if location is None:
                continue
            if location not in first:
                first[location] = entries
                continue
            value.ClearField("external_data")
            for key, text in first[location].items():
                value.external_data.add(key=key, value=text)


class OverlappingExtentsRejected(Fault):
    """Refuses two external values whose extents in one file overlap (as if each byte range had one owner),
    although values may share payload bytes."""

    fault_id = "PAY-EXTERNAL-EXTENT.overlap-rejected"
    clauses = ("PAY-EXTERNAL-EXTENT",)

    def precheck(self, model, base_dir):
        from conformance.audit.fault import encoded_values

        seen: dict[str, list[tuple[int, int]]] = {}
        for value in encoded_values(model):
            if value.data_location != payload.EXTERNAL:
                continue
            entries = {entry.key: entry.value for entry in value.external_data}
            try:
                start = int(entries.get("offset", "0"))
                stop = start + int(entries["length"])
                location = entries["location"]
            except (KeyError, ValueError):
                continue
            for other_start, other_stop in seen.get(location, []):
                if start < other_stop and other_start < stop:
                    raise violation(E.EXTERNAL_FILE_INVALID, value.name, "extent overlaps another value's")
            seen.setdefault(location, []).append((start, stop))


class BlockedParametersBroadcast(Fault):
    """Accepts blocked parameters whose other dimensions are 1 and broadcasts them (every row shares the
    blocks of one), where DequantizeLinear requires the input's dimensions except along the axis."""

    fault_id = "AFF-BLOCK.blocked-parameters-broadcast"
    clauses = ("AFF-BLOCK", "AFF-DQ")

    def transform(self, model, base_dir):
        from conformance.audit.fault import encoded_values
        from reference_impl.tensors import to_array

        for value in encoded_values(model):
            layout = value.affine
            if value.WhichOneof("layout") != "affine" or not layout.HasField("block_size") \
                    or not layout.HasField("axis") or not layout.block_size:
                continue
            try:
                _, shape = verifier.logical_tensor_shape(value, "value")
                axis = affine.normalize_axis(layout.axis, len(shape), "axis")
            except Exception:  # noqa: BLE001 - the oracle reports what is malformed
                continue
            expected = affine.parameter_shape(shape, axis, layout.block_size)
            params = [layout.scale] + ([layout.zero_point] if layout.HasField("zero_point") else [])
            for tensor in params:
                dims = tuple(tensor.dims)
                if len(dims) != len(expected) or dims == expected or dims[axis] != expected[axis] or \
                        any(d not in (1, e) for d, e in zip(dims, expected)):
                    continue
                try:
                    values = np.broadcast_to(to_array(tensor, "parameter"), expected)
                except Exception:  # noqa: BLE001 - a malformed parameter stays as it is
                    continue
                _set_values(tensor, values)


def _set_values(tensor, values: np.ndarray) -> None:
    """Rewrite a parameter tensor with ``values`` (its shape), in raw_data, keeping its element type."""
    from reference_impl.bits import pack_sub_byte

    width = dtypes.BIT_WIDTH[tensor.data_type]
    data_type = tensor.data_type
    flat = np.ascontiguousarray(values).reshape(-1)
    tensor.Clear()
    tensor.data_type = data_type
    tensor.dims.extend(values.shape)
    tensor.raw_data = pack_sub_byte(flat, width) if width < 8 else \
        flat.astype(dtypes.NUMPY_DTYPE[data_type]).astype(dtypes.NUMPY_DTYPE[data_type].newbyteorder("<")).tobytes()


def _chunk_from_byte_start(original):
    def decode(self, raw, chunk):
        o0, o1, a0, a1, i0, i1 = chunk
        start = (o0 * self.dim + a0) * self.inner + i0
        if start % self.per_byte == 0:
            return original(self, raw, chunk)
        # the chunk's first code is taken from the first bit of its byte, not from its own position
        shifted = np.concatenate([np.zeros(1, np.uint8), np.asarray(raw, np.uint8)])
        if self.per_byte == 2:
            merged = (shifted[1:] << 4 | shifted[:-1] >> 4).astype(np.uint8)
        else:
            skip = start % self.per_byte
            merged = (shifted[1:] << (2 * skip) | shifted[:-1] >> (8 - 2 * skip)).astype(np.uint8)
        # ``merged`` holds every code one chunk-offset later than ``raw``: reading the chunk's own position
        # in it gives the codes that begin at the byte boundary before the chunk
        return original(self, merged, chunk)
    return decode


class ChunkStartsAtByteBoundary(Fault):
    """Decodes large values in parallel chunks of whole rows; a chunk that begins inside a byte (an odd row
    start of four-bit codes) reads its codes from the start of that byte, one code early."""

    fault_id = "AFF-PACKING.chunk-starts-at-byte-boundary"
    clauses = ("AFF-PACKING", "AFF-ROW-MAJOR")
    boundary = True

    def patches(self):
        return [wrap(affine._Plan, "decode", _chunk_from_byte_start)]


class ScalarZeroPointBroadcast(Fault):
    """Broadcasts a scalar zero point over per-axis or blocked scales (one zero point for every channel)
    instead of requiring the zero point to have the scale's shape."""

    fault_id = "AFF-ZERO-POINT.scalar-zero-point-broadcast"
    clauses = ("AFF-ZERO-POINT", "AFF-DQ")

    def transform(self, model, base_dir):
        from reference_impl.tensors import to_array

        for layout in _affine_layouts(model):
            if not layout.HasField("zero_point") or not layout.HasField("axis") or len(layout.zero_point.dims) \
                    or not len(layout.scale.dims) or layout.zero_point.data_type not in affine.STORAGE_TYPES:
                continue
            try:
                value = to_array(layout.zero_point, "zero_point")
            except Exception:  # noqa: BLE001 - a malformed zero point stays as it is
                continue
            _set_values(layout.zero_point, np.broadcast_to(value, tuple(layout.scale.dims)))
