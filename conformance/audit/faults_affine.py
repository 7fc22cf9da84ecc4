"""Faults in the closed affine branch: storage types, packing and padding, parameters, axes, blocks,
the logical type and the payload size, decoded as DequantizeLinear."""

from __future__ import annotations

import numpy as np

from conformance.audit.fault import Fault, Patch, encoded_values, skip, wrap
from conformance.audit.fault import decode_module as decode
from reference_impl import affine, dtypes, schema, verifier
from reference_impl.bits import pack_sub_byte, unpack_sub_byte
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.tensors import to_array

_SUB_BYTE = (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)


def _affine_values(model):
    return [value for value in encoded_values(model) if value.WhichOneof("layout") == "affine"]


def _logical_count(value) -> int | None:
    """The element count of a concrete logical tensor type, or None."""
    if value.logical_type.WhichOneof("value") != "tensor_type" or not value.logical_type.tensor_type.HasField("shape"):
        return None
    count = 1
    for dim in value.logical_type.tensor_type.shape.dim:
        if dim.WhichOneof("value") != "dim_value":
            return None
        count *= dim.dim_value
    return count


def _tensor(values: np.ndarray, data_type: int, dims) -> object:
    """A TensorProto holding ``values`` as ``data_type`` in raw_data (sub-byte types packed)."""
    tensor = schema.TensorProto(data_type=data_type, dims=list(dims))
    width = dtypes.BIT_WIDTH[data_type]
    flat = np.asarray(values).reshape(-1)
    tensor.raw_data = pack_sub_byte(flat, width) if width < 8 else flat.astype(dtypes.NUMPY_DTYPE[data_type]).tobytes()
    return tensor


# ---------------------------------------------------------------------------------- storage
class StorageTypeUnchecked(Fault):
    """Never checks the storage type against the closed set INT8/UINT8/INT4/UINT4/INT2/UINT2: an affine
    layout over INT16, FLOAT or BOOL codes is accepted."""

    fault_id = "AFF-STORAGE.storage-type-unchecked"
    clauses = ("AFF-STORAGE",)

    def patches(self):
        return [skip(verifier, "_verify_affine", "AFFINE_STORAGE_INVALID")]


def _column_major(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None):
        if len(shape) > 1:
            raw = np.frombuffer(bytes(codes), np.uint8)
            count = int(np.prod(shape))
            width = dtypes.BIT_WIDTH[storage_type]
            flat = raw[:count] if width == 8 else unpack_sub_byte(raw, width, count, signed=False)
            reordered = flat.reshape(shape, order="F").reshape(-1)
            codes = reordered.tobytes() if width == 8 else pack_sub_byte(reordered, width)
        return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype)
    return dequantize


class ColumnMajorCodes(Fault):
    """Lays codes out column-major (Fortran order) instead of row-major."""

    fault_id = "AFF-ROW-MAJOR.column-major"
    clauses = ("AFF-ROW-MAJOR",)

    def patches(self):
        return [wrap(affine, "dequantize", _column_major)]


def _reversed_groups(width: int) -> np.ndarray:
    """Byte -> the byte with its ``width``-bit groups in reverse order (nibbles or crumbs swapped)."""
    byte = np.arange(256)
    groups = [(byte >> shift) & ((1 << width) - 1) for shift in range(0, 8, width)]
    return sum(group << (8 - width - shift) for group, shift in zip(groups, range(0, 8, width))).astype(np.uint8)


_REVERSED = {4: _reversed_groups(4), 2: _reversed_groups(2)}


def _high_bits_first(original):
    def codes_as_float(raw, storage_type, count, dtype):
        width = dtypes.BIT_WIDTH[storage_type]
        if width < 8:
            raw = _REVERSED[width][raw]
        return original(raw, storage_type, count, dtype)
    return codes_as_float


class HighBitsFirst(Fault):
    """Unpacks four- and two-bit codes starting with the most-significant bits of each byte (the high
    nibble first), not the least-significant."""

    fault_id = "AFF-PACKING.high-bits-first"
    clauses = ("AFF-PACKING",)

    def patches(self):
        return [wrap(affine, "codes_as_float", _high_bits_first)]


def _zero_point_high_first(original):
    def to_array(tensor, path):
        if tensor.data_type in (dtypes.INT4, dtypes.UINT4) and tensor.HasField("raw_data"):
            swapped = type(tensor)()
            swapped.CopyFrom(tensor)
            raw = np.frombuffer(tensor.raw_data, np.uint8)
            swapped.raw_data = ((raw << 4) | (raw >> 4)).astype(np.uint8).tobytes()
            tensor = swapped
        return original(tensor, path)
    return to_array


class PackedZeroPointHighFirst(Fault):
    """Unpacks codes correctly but reads four-bit zero points (the decoder's separate parameter path) high
    nibble first."""

    fault_id = "AFF-PACKING.zero-point-high-nibble"
    clauses = ("AFF-PACKING", "AFF-ZERO-POINT")
    boundary = True

    def patches(self):
        return [wrap(decode, "to_array", _zero_point_high_first, aliases=False)]


class PaddingBitsIgnored(Fault):
    """Never looks at the unused final high bits of a packed payload, so nonzero padding passes."""

    fault_id = "AFF-PADDING-ZERO.padding-ignored"
    clauses = ("AFF-PADDING-ZERO",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            count = _logical_count(value)
            width = dtypes.BIT_WIDTH.get(value.affine.storage_type)
            if count is None or width is None or not value.raw_data:
                continue
            used = count * width % 8
            if used and len(value.raw_data) == (count * width + 7) // 8:
                value.raw_data = value.raw_data[:-1] + bytes([value.raw_data[-1] & ((1 << used) - 1)])


# --------------------------------------------------------------------------------- parameters
class IntegerScaleConverted(Fault):
    """Converts an integer scale to float instead of rejecting a scale without a floating element type."""

    fault_id = "AFF-SCALE.integer-scale-converted"
    clauses = ("AFF-SCALE",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            scale = value.affine.scale
            if value.affine.HasField("scale") and scale.data_type in dtypes.INTEGERS:
                try:
                    values = to_array(scale, "scale")
                except Exception:  # noqa: BLE001 - a malformed scale stays as it is
                    continue
                converted = schema.TensorProto(data_type=dtypes.FLOAT, dims=list(scale.dims))
                converted.float_data.extend(values.astype(np.float32).reshape(-1).tolist())
                scale.CopyFrom(converted)


def _always_float32(original):
    def dequantize(*args, **kwargs):
        return original(*args, **kwargs).astype(np.float32)
    return dequantize


class DecodesToFloat32(Fault):
    """Always decodes to FLOAT: the output type follows neither a FLOAT16, BFLOAT16 or DOUBLE scale nor the
    logical element type (DequantizeLinear's output_dtype)."""

    fault_id = "AFF-SCALE.output-always-float32"
    clauses = ("AFF-SCALE", "AFF-DQ")
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _always_float32)]


class ZeroPointCastToStorage(Fault):
    """Casts a zero point of any numeric type to the storage type instead of requiring that type."""

    fault_id = "AFF-ZERO-POINT.cast-to-storage-type"
    clauses = ("AFF-ZERO-POINT",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            layout = value.affine
            if layout.HasField("zero_point") and layout.zero_point.data_type != layout.storage_type \
                    and layout.storage_type in affine.STORAGE_TYPES:
                try:
                    values = to_array(layout.zero_point, "zero_point")
                except Exception:  # noqa: BLE001 - a malformed zero point stays as it is
                    continue
                low, high = affine.code_range(layout.storage_type)
                cast = np.clip(values.astype(np.int64), low, high)
                layout.zero_point.CopyFrom(_tensor(cast, layout.storage_type, layout.zero_point.dims))


class UnsignedDefaultMidpoint(Fault):
    """Defaults a missing zero point to the middle of the code range for unsigned storage (128 for
    UINT8, 8 for UINT4, 2 for UINT2) instead of zero."""

    fault_id = "AFF-ZERO-POINT.unsigned-default-midpoint"
    clauses = ("AFF-ZERO-POINT",)
    boundary = True

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            layout = value.affine
            if layout.storage_type in dtypes.UNSIGNED_INTEGERS and layout.storage_type in affine.STORAGE_TYPES \
                    and not layout.HasField("zero_point") and layout.HasField("scale"):
                _, high = affine.code_range(layout.storage_type)
                count = int(np.prod(list(layout.scale.dims))) if layout.scale.dims else 1
                middle = np.full(count, (high + 1) // 2, np.int64)
                layout.zero_point.CopyFrom(_tensor(middle, layout.storage_type, layout.scale.dims))


def _non_negative_axis(axis, rank, path):
    if axis is None:
        return None
    if not 0 <= axis < rank:
        raise violation(E.AFFINE_AXIS_INVALID, path, f"axis {axis} is outside [0, {rank})")
    return axis


class NegativeAxisRejected(Fault):
    """Accepts only axes in [0, rank): a negative axis is not normalized as DequantizeLinear does."""

    fault_id = "AFF-AXIS.negative-axis-rejected"
    clauses = ("AFF-AXIS",)

    def patches(self):
        return [Patch(affine, "normalize_axis", _non_negative_axis)]


class BlockSizeWithoutAxisIgnored(Fault):
    """Ignores a block_size given without an axis (decodes per tensor) instead of rejecting it."""

    fault_id = "AFF-BLOCK.block-without-axis-ignored"
    clauses = ("AFF-BLOCK",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            if value.affine.HasField("block_size") and not value.affine.HasField("axis"):
                value.affine.ClearField("block_size")


def _floor_blocks(shape, axis, block_size):
    if axis is None:
        return ()
    if not block_size:
        return (shape[axis],)
    blocked = list(shape)
    blocked[axis] = shape[axis] // block_size
    return tuple(blocked)


class BlockCountRoundedDown(Fault):
    """Counts blocks as ``dim // block_size``: a partial last block has no parameters of its own."""

    fault_id = "AFF-BLOCK.partial-block-dropped"
    clauses = ("AFF-BLOCK",)
    boundary = True

    def patches(self):
        return [Patch(affine, "parameter_shape", _floor_blocks)]


def _zero_point_after_scaling(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None):
        if zero_point is None:
            return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype)
        ones = np.ones_like(np.asarray(scale))
        scaled = original(codes, storage_type, scale, None, axis, block_size, shape, output_dtype)
        shift = original(codes, storage_type, ones, None, axis, block_size, shape, output_dtype) - \
            original(codes, storage_type, ones, zero_point, axis, block_size, shape, output_dtype)
        return (scaled - shift).astype(scaled.dtype)
    return dequantize


class ZeroPointAfterScaling(Fault):
    """Computes ``code * scale - zero_point`` instead of DequantizeLinear's ``(code - zero_point) * scale``."""

    fault_id = "AFF-DQ.zero-point-after-scaling"
    clauses = ("AFF-DQ",)

    def patches(self):
        return [wrap(affine, "dequantize", _zero_point_after_scaling)]


class LogicalShapeInferred(Fault):
    """Infers a one-dimensional FLOAT logical type from the payload when the declared one is missing or
    not concrete, instead of requiring a concrete tensor type."""

    fault_id = "AFF-LOGICAL.shape-inferred"
    clauses = ("AFF-LOGICAL",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            width = dtypes.BIT_WIDTH.get(value.affine.storage_type)
            logical = value.logical_type
            tensorish = not value.HasField("logical_type") or logical.WhichOneof("value") == "tensor_type"
            if width is None or not tensorish or _logical_count(value) is not None:
                continue
            elem = logical.tensor_type.elem_type if value.HasField("logical_type") else dtypes.FLOAT
            value.logical_type.tensor_type.elem_type = elem or dtypes.FLOAT
            value.logical_type.tensor_type.shape.Clear()
            value.logical_type.tensor_type.shape.dim.add(dim_value=len(value.raw_data) * 8 // width)


class LongPayloadTruncated(Fault):
    """Reads the codes it needs and ignores extra trailing payload bytes instead of requiring exactly
    ``ceil(n * bits / 8)`` bytes."""

    fault_id = "AFF-PAYLOAD-SIZE.trailing-bytes-ignored"
    clauses = ("AFF-PAYLOAD-SIZE",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            count = _logical_count(value)
            width = dtypes.BIT_WIDTH.get(value.affine.storage_type)
            if count is not None and width is not None and value.HasField("raw_data"):
                value.raw_data = value.raw_data[: (count * width + 7) // 8]


class PayloadSizeRoundedDown(Fault):
    """Computes the payload size as ``floor(n * bits / 8)``: a payload with a partial final byte (an
    odd number of four-bit codes) is refused."""

    fault_id = "AFF-PAYLOAD-SIZE.floor-bytes"
    clauses = ("AFF-PAYLOAD-SIZE",)
    boundary = True

    def precheck(self, model, base_dir):
        for value in _affine_values(model):
            count = _logical_count(value)
            width = dtypes.BIT_WIDTH.get(value.affine.storage_type)
            if count is not None and width is not None and count * width % 8:
                raise violation(E.AFFINE_PAYLOAD_SIZE, value.name, f"{count} codes need {count * width // 8} bytes")


def _round_half_up(original):
    def quantize(x, storage_type, scale, zero_point=None, axis=None, block_size=None):
        nudged = np.nextafter(np.asarray(x, np.float32), np.float32(np.inf))  # ties go up, not to even
        return original(nudged, storage_type, scale, zero_point, axis, block_size)
    return quantize


class QuantizeTiesRoundUp(Fault):
    """Quantizes (when it converts or encodes values) with ties rounded up, ``floor(x / scale + 0.5)``,
    instead of QuantizeLinear's round half to even."""

    fault_id = "AFF-DQ.quantize-ties-round-up"
    clauses = ("AFF-DQ",)
    boundary = True
    pending = ("no case can place a value exactly halfway between two codes: the only values a runtime "
               "quantizes are KV blocks it converts, and the spec leaves the scale of a converted block to the "
               "runtime, so conversion is checked within one quantization step, where a tie rounded up or to "
               "even both pass")

    def patches(self):
        return [wrap(affine, "quantize", _round_half_up)]
