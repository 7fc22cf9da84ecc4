"""Faults in the closed affine branch: packing of quantized codes, scales, zero points, axes and blocks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from conformance.audit.fault import Patch, encoded_values, fault, name_faults, skip, wrap
from conformance.audit.fault import decode_module as decode
from conformance.audit.faults.shared import _SUB_BYTE, _name
from conformance.audit.faults.wire import cleared, refusing
from reference_impl import ContractError, affine, dtypes, payload, schema, verifier
from reference_impl.bits import pack_sub_byte, unpack_sub_byte
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.tensors import to_array


# --------------------------------------------------------------------------------- the model as read
def _affine_values(model) -> list:
    return [value for value in encoded_values(model) if value.WhichOneof("layout") == "affine"]


def _each_value(edit):
    """A transform or precheck applying ``edit(value)`` to every affine encoded value of the model."""
    def each(model, base_dir):
        for value in _affine_values(model):
            edit(value)
    return each


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


def _array(tensor, path: str) -> np.ndarray | None:
    """A parameter's values, or None when it is malformed (the oracle's to report; the fault leaves it as it is)."""
    try:
        return to_array(tensor, path)
    except Exception:  # noqa: BLE001
        return None


def _tensor(values: np.ndarray, data_type: int, dims) -> object:
    """A TensorProto holding ``values`` as ``data_type`` in raw_data (sub-byte types packed)."""
    tensor = schema.TensorProto(data_type=data_type, dims=list(dims))
    width = dtypes.BIT_WIDTH[data_type]
    flat = np.asarray(values).reshape(-1)
    tensor.raw_data = pack_sub_byte(flat, width) if width < 8 else flat.astype(dtypes.NUMPY_DTYPE[data_type]).tobytes()
    return tensor


def _parameters(layout) -> list:
    """The scale and, when there is one, the zero point of a layout."""
    return [layout.scale] + ([layout.zero_point] if layout.HasField("zero_point") else [])


def _value_shape(value):
    """(the value's logical shape, its normalized axis), or None when they are malformed (the oracle reports them)."""
    try:
        _, shape = verifier.logical_tensor_shape(value, "value")
        axis = affine.normalize_axis(value.affine.axis, len(shape), "axis") if value.affine.HasField("axis") else None
    except Exception:  # noqa: BLE001
        return None
    return shape, axis


# ----------------------------------------------------------------------------- the kernel as run
_ARGS = ("codes", "storage_type", "scale", "zero_point", "axis", "block_size", "shape", "output_dtype")


def _dequantize(kernel, finish: bool = False) -> Patch:
    """``affine.dequantize`` as ``kernel(original, args)`` runs it (``args``: a namespace of the arguments by name).
    The kernel returns the buggy result, or None after editing ``args``: the oracle then runs on them, given the
    caller's buffer, or with ``finish`` computing apart with the result copied into it (as the buggy kernel does)."""
    def make(original):
        def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
            args = SimpleNamespace(**dict(zip(_ARGS, (codes, storage_type, scale, zero_point, axis, block_size, shape,
                                                      output_dtype))))
            result = kernel(original, args)
            if result is not None:
                return _finish(result, out)
            values = [getattr(args, name) for name in _ARGS]
            return _finish(original(*values), out) if finish else original(*values, out)
        return dequantize
    return wrap(affine, "dequantize", make)


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


def _count(shape) -> int:
    return int(np.prod(shape)) if len(shape) else 1


def _recoded(codes, storage_type: int, shape, reorder) -> bytes:
    """A value's codes unpacked, put in the order ``reorder(flat codes)`` gives, and packed again."""
    width = dtypes.BIT_WIDTH[storage_type]
    raw = np.frombuffer(bytes(codes), np.uint8)
    count = int(np.prod(shape))
    flat = reorder(raw[:count] if width == 8 else unpack_sub_byte(raw, width, count, signed=False))
    return flat.tobytes() if width == 8 else pack_sub_byte(flat, width)


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


def _indexed(args, index: np.ndarray) -> tuple:
    """The scale and zero point of each element, found at the flat parameter ``index`` of each."""
    def take(param):
        return None if param is None else np.asarray(param).reshape(-1)[index].reshape(args.shape)
    return take(args.scale), take(args.zero_point)


def _elementwise(original, args, scale_e, zero_e, codes=None) -> np.ndarray:
    """The oracle's dequantization with one parameter per element (blocks of one along axis 0), of ``codes`` when
    given instead of the arguments' own."""
    flat = tuple(args.shape) or (1,)  # a scalar value: one element along axis 0
    scale_e = np.asarray(scale_e).reshape(flat)
    zero_e = None if zero_e is None else np.asarray(zero_e).reshape(flat)
    codes = args.codes if codes is None else codes
    return original(codes, args.storage_type, scale_e, zero_e, 0, 1, flat, args.output_dtype).reshape(args.shape)


def _in_float32(original, args) -> np.ndarray:
    """The oracle's values as FLOAT, before a buggy narrowing to the result type."""
    return original(*[getattr(args, name) for name in _ARGS[:-1]], np.float32)


def _result_dtype(args) -> np.dtype:
    return np.dtype(args.output_dtype) if args.output_dtype is not None else np.asarray(args.scale).dtype


def _parameters_read(read) -> Patch:
    """The decoder's parameter reader (scales, zero points) as ``read(original, tensor, path)``."""
    return wrap(decode, "to_array", lambda original: lambda tensor, path: read(original, tensor, path), aliases=False)


# ------------------------------------------------------------------------------------ storage and packing
StorageTypeUnchecked = fault("AFF-STORAGE.storage-type-unchecked", ("AFF-STORAGE",),
    """Never checks the storage type against the closed set INT8/UINT8/INT4/UINT4/INT2/UINT2: an affine layout over
    INT16, FLOAT or BOOL codes is accepted.""",
    patches=lambda: [skip(verifier, "_verify_affine", "AFFINE_STORAGE_INVALID")])


def _e8m0_as_uint8(value):
    if value.affine.storage_type == dtypes.FLOAT8E8M0:
        value.affine.storage_type = dtypes.UINT8
        if value.affine.HasField("zero_point") and value.affine.zero_point.data_type == dtypes.FLOAT8E8M0:
            value.affine.zero_point.data_type = dtypes.UINT8


E8M0StorageAccepted = fault("AFF-STORAGE.e8m0-accepted", ("AFF-STORAGE",),
    """Checks the storage type as 'an 8-bit or narrower type that is not floating' against a list of floating types
    that predates FLOAT8E8M0: E8M0 storage passes and its codes are read as UINT8.""",
    transform=_each_value(_e8m0_as_uint8))


def _two_bit_refused(value):
    if value.affine.storage_type in (dtypes.INT2, dtypes.UINT2):
        raise violation(E.AFFINE_STORAGE_INVALID, f"{_name(value)}.affine.storage_type",
                        "INT2/UINT2 storage is not supported")


TwoBitStorageRefused = fault("AFF-STORAGE.two-bit-refused", ("AFF-STORAGE",),
    """Supports only the storage types of the ONNX release it was built against: INT2 and UINT2 are refused as storage
    types.""", precheck=_each_value(_two_bit_refused))


def _column_major(original):
    # the kernel takes no caller's buffer
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None):
        if len(shape) > 1:
            codes = _recoded(codes, storage_type, shape, lambda flat: flat.reshape(shape, order="F").reshape(-1))
        return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype)
    return dequantize


ColumnMajorCodes = fault("AFF-ROW-MAJOR.column-major", ("AFF-ROW-MAJOR",),
    """Lays codes out column-major (Fortran order) instead of row-major.""",
    patches=lambda: [wrap(affine, "dequantize", _column_major)])


def _rows_byte_aligned(original, args):
    width, shape = dtypes.BIT_WIDTH[args.storage_type], args.shape
    if width < 8 and len(shape) > 1 and all(shape) and (shape[-1] * width) % 8:  # no rows: nothing is read
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        stride = (cols * width + 7) // 8
        raw = np.frombuffer(bytes(args.codes), np.uint8)
        padded = np.zeros(rows * stride, np.uint8)  # reads past the tight payload see zeros
        padded[: min(len(raw), len(padded))] = raw[: len(padded)]
        flat = np.concatenate([unpack_sub_byte(row, width, cols, signed=False) for row in padded.reshape(rows, stride)])
        args.codes = pack_sub_byte(flat, width)


def _blocked_rows_transposed(original, args):
    shape = args.shape
    if args.block_size is not None and args.axis == 0 and len(shape) == 2:  # stored as (columns, rows)
        args.codes = _recoded(args.codes, args.storage_type, shape,
                              lambda flat: flat.reshape(shape[1], shape[0]).T.reshape(-1))


RowsByteAligned = fault("AFF-ROW-MAJOR.rows-byte-aligned", ("AFF-ROW-MAJOR",),
    """Unpacks four- and two-bit codes row by row, each row starting on a fresh byte (a row stride of ceil(columns *
    bits / 8)), instead of one tight row-major run over the whole tensor.""", boundary=True,
    patches=lambda: [_dequantize(_rows_byte_aligned)])
BlockedAlongRowsTransposed = fault("AFF-ROW-MAJOR.blocked-axis0-column-major", ("AFF-ROW-MAJOR",),
    """For blocks along axis 0 of a matrix, reads the codes in a weight-kernel layout where each column's blocks are
    contiguous (column-major), as a MatMulNBits-style packer stores them; other paths stay row-major.""",
    patches=lambda: [_dequantize(_blocked_rows_transposed)])


def _reversed_groups(width: int) -> np.ndarray:
    """Byte -> the byte with its ``width``-bit groups in reverse order (nibbles or crumbs swapped)."""
    byte = np.arange(256)
    groups = [(byte >> shift) & ((1 << width) - 1) for shift in range(0, 8, width)]
    return sum(group << (8 - width - shift) for group, shift in zip(groups, range(0, 8, width))).astype(np.uint8)


_REVERSED = {4: _reversed_groups(4), 2: _reversed_groups(2)}


def _high_bits_first(original):
    def codes_as_float(raw, storage_type, count, dtype):
        width = dtypes.BIT_WIDTH[storage_type]
        return original(_REVERSED[width][raw] if width < 8 else raw, storage_type, count, dtype)
    return codes_as_float


def _sign_threshold(original):
    def codes_as_float(raw, storage_type, count, dtype):
        values = original(raw, storage_type, count, dtype)
        if storage_type in (dtypes.INT4, dtypes.INT2):
            most_negative = -(1 << (dtypes.BIT_WIDTH[storage_type] - 1))
            values = np.where(values == most_negative, -most_negative, values).astype(values.dtype)
        return values
    return codes_as_float


HighBitsFirst = fault("AFF-PACKING.high-bits-first", ("AFF-PACKING",),
    """Unpacks four- and two-bit codes starting with the most-significant bits of each byte (the high nibble first), not
    the least-significant.""", patches=lambda: [wrap(affine, "codes_as_float", _high_bits_first)])
SignExtensionMissesMostNegative = fault("AFF-PACKING.most-negative-code-positive", ("AFF-PACKING", "AFF-DQ"),
    """Sign-extends four- and two-bit codes with ``if code > 8: code -= 16`` (``> 2`` for INT2): the most negative code
    (-8, -2) is read as +8 (+2).""", boundary=True, patches=lambda: [wrap(affine, "codes_as_float", _sign_threshold)])


def _partial_byte_zero(original, args):
    count = _count(args.shape)
    if args.storage_type in _SUB_BYTE and count % (per_byte := 8 // dtypes.BIT_WIDTH[args.storage_type]):
        raw = _raw(args.codes).copy()
        raw[count // per_byte] = 0  # the unpack loop runs over count // per_byte whole bytes only
        args.codes = raw


def _unsigned_tail_from_top(original, args):
    width = dtypes.BIT_WIDTH.get(args.storage_type, 8)
    count, per_byte = _count(args.shape), 8 // width
    if args.storage_type in (dtypes.UINT4, dtypes.UINT2) and count % per_byte:
        raw = _raw(args.codes).copy()
        last, mask = int(raw[(count - 1) // per_byte]), (1 << width) - 1
        # the tail's codes are taken from the top of the byte down, as a whole byte's would be by a
        # loop that counts from its most-significant group
        read = [(last >> (8 - (k + 1) * width)) & mask for k in range(count % per_byte)]
        raw[(count - 1) // per_byte] = sum(code << (k * width) for k, code in enumerate(read))
        args.codes = raw


#: codes one 16-byte vector of four-bit codes holds
_VECTOR_CODES = 32


def _nibbles_unzipped(original, args):
    count = _count(args.shape)
    if args.storage_type in (dtypes.INT4, dtypes.UINT4) and count >= _VECTOR_CODES:
        right = unpack_sub_byte(_raw(args.codes), 4, count, signed=False).astype(np.uint8)
        body = count // _VECTOR_CODES * _VECTOR_CODES
        groups = right[:body].reshape(-1, _VECTOR_CODES)
        # each vector's low nibbles are stored first, then its high nibbles (unzipped, not interleaved)
        read = np.concatenate([groups[:, 0::2], groups[:, 1::2]], axis=1).reshape(-1)
        args.codes = pack_sub_byte(np.concatenate([read, right[body:]]), 4)


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


PartialFinalByteCodesZero = fault("AFF-PACKING.partial-final-byte-zero", ("AFF-PACKING",),
    """Unpacks four- and two-bit codes over ``count // codes_per_byte`` whole bytes (the buffer was zero-initialized):
    the codes of a final partial byte (an odd INT4 count) decode as code 0.""", boundary=True,
    patches=lambda: [_dequantize(_partial_byte_zero)])
UnsignedTailFromHighBits = fault("AFF-PACKING.unsigned-tail-high-bits", ("AFF-PACKING",),
    """The unsigned four- and two-bit unpacker handles whole bytes correctly but reads the codes of a final partial byte
    (an odd UINT4 count, a UINT2 count not a multiple of four) from its high bits.""", boundary=True,
    patches=lambda: [_dequantize(_unsigned_tail_from_top, finish=True)])
VectorNibblesUnzipped = fault("AFF-PACKING.vector-nibbles-unzipped", ("AFF-PACKING", "AFF-ROW-MAJOR"),
    """The vectorized four-bit unpacker (16 payload bytes, 32 codes at a time) writes each vector's 16 low nibbles and
    then its 16 high nibbles instead of interleaving them; the scalar tail (and every value of fewer than 32 codes) is
    right.""", boundary=True, patches=lambda: [_dequantize(_nibbles_unzipped, finish=True)])
ChunkStartsAtByteBoundary = fault("AFF-PACKING.chunk-starts-at-byte-boundary", ("AFF-PACKING", "AFF-ROW-MAJOR"),
    """Decodes large values in parallel chunks of whole rows; a chunk that begins inside a byte (an odd row start of
    four-bit codes) reads its codes from the start of that byte, one code early.""", boundary=True,
    patches=lambda: [wrap(affine._Plan, "decode", _chunk_from_byte_start)])


# ------------------------------------------------------------------------------------------- zero points
def _zero_point_high_first(original, tensor, path):
    if tensor.data_type in (dtypes.INT4, dtypes.UINT4) and tensor.HasField("raw_data"):
        swapped = type(tensor)()
        swapped.CopyFrom(tensor)
        raw = np.frombuffer(tensor.raw_data, np.uint8)
        swapped.raw_data = ((raw << 4) | (raw >> 4)).astype(np.uint8).tobytes()
        tensor = swapped
    return original(tensor, path)


def _uint2_zero_point_signed(original, tensor, path):
    values = original(tensor, path)
    if tensor.data_type == dtypes.UINT2 and path.endswith("zero_point"):
        wide = values.astype(np.int16)
        return np.where(wide >= 2, wide - 4, wide)
    return values


PackedZeroPointHighFirst = fault("AFF-PACKING.zero-point-high-nibble", ("AFF-PACKING", "AFF-ZERO-POINT"),
    """Unpacks codes correctly but reads four-bit zero points (the decoder's separate parameter path) high nibble
    first.""", boundary=True, patches=lambda: [_parameters_read(_zero_point_high_first)])
Uint2ZeroPointSignExtended = fault("AFF-ZERO-POINT.uint2-zero-point-signed", ("AFF-ZERO-POINT", "AFF-PACKING"),
    """Unpacks UINT2 zero points with the two-bit reader written for INT2, which sign-extends: zero points 2 and 3
    become -2 and -1 (the codes themselves are read right).""", boundary=True,
    patches=lambda: [_parameters_read(_uint2_zero_point_signed)])


def _zero_point_cast(value):
    layout = value.affine
    if layout.HasField("zero_point") and layout.zero_point.data_type != layout.storage_type \
            and layout.storage_type in affine.STORAGE_TYPES:
        values = _array(layout.zero_point, "zero_point")
        if values is not None:
            low, high = affine.code_range(layout.storage_type)
            cast = np.clip(values.astype(np.int64), low, high)
            layout.zero_point.CopyFrom(_tensor(cast, layout.storage_type, layout.zero_point.dims))


def _unsigned_midpoint(value):
    layout = value.affine
    if layout.storage_type in dtypes.UNSIGNED_INTEGERS and layout.storage_type in affine.STORAGE_TYPES \
            and not layout.HasField("zero_point") and layout.HasField("scale"):
        _, high = affine.code_range(layout.storage_type)
        count = int(np.prod(list(layout.scale.dims))) if layout.scale.dims else 1
        layout.zero_point.CopyFrom(_tensor(np.full(count, (high + 1) // 2, np.int64), layout.storage_type,
                                           layout.scale.dims))


def _scalar_zero_point_broadcast(value):
    layout = value.affine
    if layout.HasField("zero_point") and layout.HasField("axis") and not len(layout.zero_point.dims) \
            and len(layout.scale.dims) and layout.zero_point.data_type in affine.STORAGE_TYPES:
        zero_point = _array(layout.zero_point, "zero_point")
        if zero_point is not None:
            dims = tuple(layout.scale.dims)
            layout.zero_point.CopyFrom(_tensor(np.broadcast_to(zero_point, dims), layout.zero_point.data_type, dims))


ZeroPointCastToStorage = fault("AFF-ZERO-POINT.cast-to-storage-type", ("AFF-ZERO-POINT",),
    """Casts a zero point of any numeric type to the storage type instead of requiring that type.""",
    transform=_each_value(_zero_point_cast))
UnsignedDefaultMidpoint = fault("AFF-ZERO-POINT.unsigned-default-midpoint", ("AFF-ZERO-POINT",),
    """Defaults a missing zero point to the middle of the code range for unsigned storage (128 for UINT8, 8 for UINT4,
    2 for UINT2) instead of zero.""", boundary=True, transform=_each_value(_unsigned_midpoint))
ScalarZeroPointBroadcast = fault("AFF-ZERO-POINT.scalar-zero-point-broadcast", ("AFF-ZERO-POINT", "AFF-DQ"),
    """Broadcasts a scalar zero point over per-axis or blocked scales (one zero point for every channel) instead of
    requiring the zero point to have the scale's shape.""", transform=_each_value(_scalar_zero_point_broadcast))

_PER_INT32 = {dtypes.INT4: 2, dtypes.UINT4: 2, dtypes.INT2: 4, dtypes.UINT2: 4}


def _int32_zero_point(value):
    """A four- or two-bit zero point stored in int32_data, or None."""
    zero_point = value.affine.zero_point
    if not value.affine.HasField("zero_point") or zero_point.data_type not in _PER_INT32 \
            or zero_point.HasField("raw_data") or not len(zero_point.int32_data):
        return None
    return zero_point


def _one_code_per_entry(value):
    zero_point = _int32_zero_point(value)
    if zero_point is None:
        return
    count = int(np.prod(list(zero_point.dims))) if zero_point.dims else 1
    if len(zero_point.int32_data) != count:
        raise violation(E.TENSOR_DATA_INVALID, "zero_point.int32_data",
                        f"{len(zero_point.int32_data)} values for {count} elements")


def _codes_packed(value):
    zero_point = _int32_zero_point(value)
    if zero_point is not None:
        width = dtypes.BIT_WIDTH[zero_point.data_type]
        codes = np.asarray(zero_point.int32_data, np.int64) & ((1 << width) - 1)
        packed = np.frombuffer(pack_sub_byte(codes, width), np.uint8)
        zero_point.ClearField("int32_data")
        zero_point.int32_data.extend(packed.astype(np.int32).tolist())


PackedInt32DataOnePerEntry = fault("AFF-ZERO-POINT.int32-data-one-code-per-entry", ("AFF-ZERO-POINT", "AFF-PACKING"),
    """Reads a four- or two-bit zero point stored in int32_data as one code per entry (the low bits of each), as for
    8-bit types, instead of two (four) codes per entry as TensorProto packs them: a correctly packed zero point of
    several codes is refused for its entry count.""", boundary=True,
    precheck=_each_value(_one_code_per_entry), transform=_each_value(_codes_packed))


def _zero_point_tail_dropped(original, args):
    if args.zero_point is not None and args.storage_type in _SUB_BYTE:
        per_byte = 8 // dtypes.BIT_WIDTH[args.storage_type]
        args.zero_point = np.array(args.zero_point)
        flat = args.zero_point.reshape(-1)
        tail = flat.size % per_byte
        if tail and flat.size > 1:
            flat[flat.size - tail:] = 0  # the parameter unpacker reads only whole bytes


def _zero_point_threshold(original, args):
    if args.zero_point is not None and args.storage_type in (dtypes.INT4, dtypes.INT2):
        most_negative = -(1 << (dtypes.BIT_WIDTH[args.storage_type] - 1))
        zero_point = np.asarray(args.zero_point).astype(np.int16)
        args.zero_point = np.where(zero_point == most_negative, -most_negative, zero_point)


def _uint8_zero_point_signed(original, args):
    if args.zero_point is not None and args.storage_type == dtypes.UINT8:
        args.zero_point = np.asarray(args.zero_point).astype(np.uint8).view(np.int8).astype(np.int16)


def _difference_wraps(original, args):
    if args.storage_type not in (dtypes.INT8, dtypes.UINT8) or args.zero_point is None:
        return None
    shape = tuple(args.shape) or (1,)
    values = affine.codes_as_float(_raw(args.codes), args.storage_type, _count(args.shape), np.int64)
    zero_e = _per_element(args.zero_point, shape, args.axis, args.block_size).reshape(-1).astype(np.int64)
    storage = np.int8 if args.storage_type == dtypes.INT8 else np.uint8
    wrapped = (values - zero_e).astype(storage)  # code - zero_point in the storage type's lane, wrapping
    scale_e = _per_element(args.scale, shape, args.axis, args.block_size)
    return _elementwise(original, args, scale_e, None, wrapped.tobytes())


def _saturating_int8_difference(original, args):
    if args.storage_type != dtypes.INT8 or args.zero_point is None or not np.any(args.zero_point):
        return None
    shape, axis, block = args.shape, args.axis, args.block_size
    values = _raw(args.codes)[:_count(shape)].view(np.int8).astype(np.int64).reshape(shape)
    difference = np.clip(values - _per_element(args.zero_point, shape, axis, block).astype(np.int64), -128, 127)
    # fed back as codes with a zero point of zero: INT8 holds every clipped difference (an int8 saturating subtract)
    clipped = difference.astype(np.int8).tobytes()
    return _elementwise(original, args, _per_element(args.scale, shape, axis, block), None, clipped)


SubByteZeroPointTailDropped = fault("AFF-ZERO-POINT.sub-byte-zero-point-tail-dropped",
    ("AFF-ZERO-POINT", "AFF-PACKING"), """Unpacks a four- or two-bit zero-point tensor of several entries over its whole
    bytes only: when the entry count is not a multiple of the codes per byte (three INT4 channels), the last entries
    read as zero. A scalar zero point takes a separate path and is right.""", boundary=True,
    patches=lambda: [_dequantize(_zero_point_tail_dropped)])
MostNegativeZeroPointPositive = fault("AFF-ZERO-POINT.most-negative-zero-point-positive",
    ("AFF-ZERO-POINT", "AFF-PACKING"), """The zero-point unpacker (separate from the code unpacker, which is right)
    sign-extends four- and two-bit entries with ``if zp > 8: zp -= 16`` (``> 2`` for INT2): a zero point of -8 (-2), the
    low end of its range, is read as +8 (+2).""", boundary=True, patches=lambda: [_dequantize(_zero_point_threshold)])
Uint8ZeroPointReadSigned = fault("AFF-ZERO-POINT.uint8-zero-point-read-signed", ("AFF-ZERO-POINT",),
    """Keeps every 8-bit zero point in an ``int8_t``: a UINT8 zero point of 128 or more (the upper half of its range,
    255 at the end) is read as that value minus 256.""", boundary=True,
    patches=lambda: [_dequantize(_uint8_zero_point_signed)])
DifferenceWrapsInStorageType = fault("AFF-ZERO-POINT.difference-wraps-in-storage-type", ("AFF-ZERO-POINT", "AFF-DQ"),
    """Subtracts the zero point from 8-bit codes in the storage type itself (``int8_t d = code - zp``, ``uint8_t`` for
    UINT8): a difference outside the type's range wraps (UINT8 code 0 - zero point 1 is 255; INT8 -128 - 127 is 1).""",
    boundary=True, patches=lambda: [_dequantize(_difference_wraps)])
Int8DifferenceSaturated = fault("AFF-ZERO-POINT.int8-difference-saturated", ("AFF-ZERO-POINT", "AFF-DQ"),
    """Subtracts an INT8 zero point with an 8-bit saturating subtract (``code - zero_point`` clipped to [-128, 127])
    instead of in a wider integer: differences beyond the INT8 range are wrong.""", boundary=True,
    patches=lambda: [_dequantize(_saturating_int8_difference, finish=True)])


# ------------------------------------------------------------------------------------------------ scales
def _integer_scale_converted(value):
    scale = value.affine.scale
    values = _array(scale, "scale") if value.affine.HasField("scale") and scale.data_type in dtypes.INTEGERS else None
    if values is not None:
        converted = schema.TensorProto(data_type=dtypes.FLOAT, dims=list(scale.dims))
        converted.float_data.extend(values.astype(np.float32).reshape(-1).tolist())
        scale.CopyFrom(converted)


def _always_float32(original):
    def dequantize(*args, **kwargs):
        return original(*args, **kwargs).astype(np.float32)
    return dequantize


def _non_positive_scale(model) -> bool:
    scales = (_array(value.affine.scale, "scale") for value in _affine_values(model)
              if value.affine.scale.data_type in affine.SCALE_TYPES)
    return any(np.any(scale.astype(np.float64) <= 0) for scale in scales if scale is not None)


IntegerScaleConverted = fault("AFF-SCALE.integer-scale-converted", ("AFF-SCALE",),
    """Converts an integer scale to float instead of rejecting a scale without a floating element type.""",
    transform=_each_value(_integer_scale_converted))
DecodesToFloat32 = fault("AFF-SCALE.output-always-float32", ("AFF-SCALE", "AFF-DQ"),
    """Always decodes to FLOAT: the output type follows neither a FLOAT16, BFLOAT16 or DOUBLE scale nor the logical
    element type (DequantizeLinear's output_dtype).""", boundary=True,
    patches=lambda: [wrap(affine, "dequantize", _always_float32)])
NonPositiveScaleRejected = fault("AFF-SCALE.non-positive-scale-rejected", ("AFF-SCALE", "AFF-DQ"),
    """Validates scales as a quantization tool would, refusing a zero or negative scale, although DequantizeLinear (and
    the spec's "floating element type") admits any floating value.""", boundary=True,
    precheck=refusing(E.AFFINE_SCALE_INVALID, "scale", "scales must be positive", _non_positive_scale))
EmptyParameterRejected = fault("AFF-SCALE.empty-scale-rejected", ("AFF-SCALE", "AFF-AXIS"),
    """Takes a scale with no elements for a missing one and refuses it: a per-axis or blocked value whose axis (or
    another dimension) is 0 needs a scale of shape [0], which DequantizeLinear admits.""", boundary=True,
    precheck=refusing(E.AFFINE_SCALE_INVALID, "scale", "scale has no values", lambda model: any(
        value.affine.HasField("scale") and 0 in list(value.affine.scale.dims) for value in _affine_values(model))))
DoubleScaleToNarrowerOutput = fault("AFF-SCALE.double-output-dtype-mixed", ("AFF-SCALE",),
    """Treats DOUBLE like the other floating types for output_dtype: a DOUBLE scale decoding to a FLOAT logical type (or
    a FLOAT scale to DOUBLE) is accepted and cast, where DequantizeLinear has no such combination.""",
    patches=lambda: [Patch(affine, "OUTPUT_DTYPES", affine.OUTPUT_DTYPES | {dtypes.DOUBLE})])


def _bfloat16_raw_as_float16(original, tensor, path):
    if tensor.data_type == dtypes.BFLOAT16 and tensor.HasField("raw_data"):
        halves = original(tensor, path).view(np.uint16).view(np.float16)  # the same bits read as FLOAT16
        return halves.astype(np.float32).astype(dtypes.NUMPY_DTYPE[dtypes.BFLOAT16])
    return original(tensor, path)


def _subnormal_scale_flushed(original, args):
    args.scale = np.asarray(args.scale)
    if args.scale.dtype == np.float16:
        args.scale = np.where(np.abs(args.scale) < np.float16(2.0 ** -14), np.float16(0), args.scale).astype(np.float16)


def _product_in_scale_type(original, args):
    narrow = np.asarray(args.scale).dtype
    if args.output_dtype is None or narrow.itemsize != 2 or np.dtype(args.output_dtype) == narrow:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return original(*[getattr(args, name) for name in _ARGS[:-1]], narrow).astype(args.output_dtype)


Bfloat16RawScaleReadAsFloat16 = fault("AFF-SCALE.bfloat16-raw-as-float16", ("AFF-SCALE", "AFF-DQ"),
    """Reads a BFLOAT16 scale stored in raw_data with the FLOAT16 reader (the int32_data path is right): the 16-bit
    patterns are taken as IEEE half-precision numbers.""", patches=lambda: [_parameters_read(_bfloat16_raw_as_float16)])
Float16SubnormalScaleFlushed = fault("AFF-SCALE.float16-subnormal-flushed", ("AFF-SCALE", "AFF-DQ"),
    """Converts FLOAT16 scales with a flush-to-zero conversion: a subnormal scale (below 2**-14) becomes 0 and its
    values decode to zero.""", boundary=True, patches=lambda: [_dequantize(_subnormal_scale_flushed, finish=True)])
ProductInScaleType = fault("AFF-SCALE.product-in-scale-type", ("AFF-SCALE", "AFF-DQ"),
    """With a FLOAT16 or BFLOAT16 scale and a FLOAT logical type, forms the product in the scale's type and widens it
    afterwards: a product beyond FLOAT16's range becomes infinity, one needing more than the narrow mantissa is
    rounded.""", boundary=True, patches=lambda: [_dequantize(_product_in_scale_type)])


# -------------------------------------------------------------------------------------------------- axes
def _non_negative_axis(axis, rank, path):
    if axis is None:
        return None
    if not 0 <= axis < rank:
        raise violation(E.AFFINE_AXIS_INVALID, path, f"axis {axis} is outside [0, {rank})")
    return axis


def _minus_rank_rejected(axis, rank, path):
    if axis is None:
        return None
    if not -rank < axis < rank:
        raise violation(E.AFFINE_AXIS_INVALID, path, f"axis {axis} is outside (-{rank}, {rank})")
    return axis % rank


def _axis_on_scalar_ignored(original):
    # a scalar has no axis: taken as per tensor
    return lambda axis, rank, path: None if axis is not None and rank == 0 else original(axis, rank, path)


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


def _axis_against_parameter_rank(original):
    """Verifying or decoding an affine value (its first argument) as ``_axis_against_parameters`` reads it."""
    return lambda value, *rest: original(_axis_against_parameters(value), *rest)


def _inner_next_dim_only(original, args):
    if args.axis is None or args.block_size or args.axis + 2 >= len(args.shape):
        return None
    # the stride of the axis taken as the next dimension only, not the product of all later ones
    index = (np.arange(int(np.prod(args.shape))) // args.shape[args.axis + 1]) % args.shape[args.axis]
    return _elementwise(original, args, *_indexed(args, index))


NegativeAxisRejected = fault("AFF-AXIS.negative-axis-rejected", ("AFF-AXIS",),
    """Accepts only axes in [0, rank): a negative axis is not normalized as DequantizeLinear does.""",
    patches=lambda: [Patch(affine, "normalize_axis", _non_negative_axis)])
AxisMinusRankRejected = fault("AFF-AXIS.minus-rank-rejected", ("AFF-AXIS",),
    """Checks a negative axis with ``-rank < axis`` (off by one): axis = -rank, which DequantizeLinear normalizes to 0,
    is refused.""", boundary=True, patches=lambda: [Patch(affine, "normalize_axis", _minus_rank_rejected)])
AxisOnScalarIgnored = fault("AFF-AXIS.axis-on-scalar-ignored", ("AFF-AXIS", "AFF-DQ"),
    """Decodes a scalar (rank-0) value whose layout sets an axis as per-tensor instead of rejecting the axis, which
    DequantizeLinear requires to lie in [-rank, rank).""", boundary=True,
    patches=lambda: [wrap(affine, "normalize_axis", _axis_on_scalar_ignored)])
NegativeAxisAgainstParameterRank = fault("AFF-AXIS.negative-axis-against-parameter-rank", ("AFF-AXIS",),
    """Normalizes a negative axis with the rank of the scale tensor instead of the value's rank: for per-axis
    parameters (rank one) axis -1 becomes 0, the first axis; blocked parameters (same rank as the value) are
    unaffected.""", boundary=True, patches=lambda: [wrap(verifier, "_verify_affine", _axis_against_parameter_rank),
                                                    wrap(decode, "_decode_affine", _axis_against_parameter_rank)])
PerAxisStrideNextDimOnly = fault("AFF-AXIS.per-axis-stride-next-dim", ("AFF-AXIS", "AFF-DQ"),
    """Finds an element's per-axis parameter with the axis's stride taken as the next dimension alone (``shape[axis +
    1]``) instead of the product of every later dimension: right for rank 2 and for the last two axes, wrong for axis 0
    of a rank-3 value.""", boundary=True, patches=lambda: [_dequantize(_inner_next_dim_only, finish=True)])


# ------------------------------------------------------------------------------------------------ blocks
def _floor_blocks(shape, axis, block_size):
    if axis is None:
        return ()
    if not block_size:
        return (shape[axis],)
    blocked = list(shape)
    blocked[axis] = shape[axis] // block_size
    return tuple(blocked)


_INT64_MAX = (1 << 63) - 1


def _ceil_int64(original):
    def parameter_shape(shape, axis, block_size):
        if axis is None or not block_size:
            return original(shape, axis, block_size)
        total = shape[axis] + block_size - 1  # formed in int64, where it wraps past INT64_MAX
        if total > _INT64_MAX:
            total -= 1 << 64
        blocked = list(shape)
        blocked[axis] = abs(total) // block_size * (1 if total >= 0 else -1)  # C division truncates toward zero
        return tuple(blocked)
    return parameter_shape


def _partial_block_previous(original, args):
    axis, block, shape = args.axis, args.block_size, args.shape
    if axis is not None and block and shape[axis] % block and shape[axis] > block:
        full = shape[axis] // block  # block index clamped to the last full block
        index = np.minimum(np.arange(-(-shape[axis] // block)), full - 1)
        args.scale = np.take(np.asarray(args.scale), index, axis=axis)
        if args.zero_point is not None:
            args.zero_point = np.take(np.asarray(args.zero_point), index, axis=axis)


def _flat_block_index(original, args):
    args.shape = shape = tuple(args.shape)
    axis, block = args.axis, args.block_size
    if axis is None or not block or axis != len(shape) - 1 or shape[axis] % block == 0 or shape[axis] <= block:
        return None
    # the last-axis fast path: parameter index = flat element index // block_size, over the parameters
    # stored row-major; exact while every row is a whole number of blocks
    index = np.minimum(np.arange(int(np.prod(shape))) // block, np.asarray(args.scale).size - 1)
    return _elementwise(original, args, *_indexed(args, index))


def _blocked_parameters_broadcast(value):
    layout = value.affine
    found = _value_shape(value) if layout.HasField("block_size") and layout.block_size else None
    if not layout.HasField("axis") or found is None:
        return
    shape, axis = found
    expected = affine.parameter_shape(shape, axis, layout.block_size)
    for tensor in _parameters(layout):
        dims = tuple(tensor.dims)
        if len(dims) != len(expected) or dims == expected or dims[axis] != expected[axis] or \
                any(d not in (1, e) for d, e in zip(dims, expected)):
            continue
        values = _array(tensor, "parameter")
        if values is not None:
            tensor.CopyFrom(_tensor(np.broadcast_to(values, expected), tensor.data_type, expected))


BlockSizeWithoutAxisIgnored = fault("AFF-BLOCK.block-without-axis-ignored", ("AFF-BLOCK",),
    """Ignores a block_size given without an axis (decodes per tensor) instead of rejecting it.""",
    transform=cleared(lambda model: [value.affine for value in _affine_values(model) if
                                     value.affine.HasField("block_size") and not value.affine.HasField("axis")],
                      "block_size"))
BlockCountRoundedDown = fault("AFF-BLOCK.partial-block-dropped", ("AFF-BLOCK",),
    """Counts blocks as ``dim // block_size``: a partial last block has no parameters of its own.""", boundary=True,
    patches=lambda: [Patch(affine, "parameter_shape", _floor_blocks)])
BlockCountOverflows = fault("AFF-BLOCK.block-count-overflows", ("AFF-BLOCK", "AFF-DQ"),
    """Counts blocks as ``(dim + block_size - 1) / block_size`` in int64: a block_size near INT64_MAX (one block
    covering the whole axis) wraps the sum negative, so the one-block parameters are refused.""", boundary=True,
    patches=lambda: [wrap(affine, "parameter_shape", _ceil_int64)])
PartialBlockTakesPreviousScale = fault("AFF-BLOCK.partial-block-previous-parameters", ("AFF-BLOCK", "AFF-DQ"),
    """Computes a blocked element's parameter index as ``min(i // block_size, dim // block_size - 1)``: the elements of
    a partial last block use the previous block's scale and zero point.""", boundary=True,
    patches=lambda: [_dequantize(_partial_block_previous, finish=True)])
BlockIndexFromFlatPosition = fault("AFF-BLOCK.flat-index-blocks", ("AFF-BLOCK", "AFF-DQ"),
    """Blocked along the last axis, the parameter of element ``f`` (flat index) is taken as ``params.flat[f //
    block_size]``: right while each row is whole blocks, wrong from the second row on when the last block of a row is
    partial.""", boundary=True, patches=lambda: [_dequantize(_flat_block_index)])
BlockedParametersBroadcast = fault("AFF-BLOCK.blocked-parameters-broadcast", ("AFF-BLOCK", "AFF-DQ"),
    """Accepts blocked parameters whose other dimensions are 1 and broadcasts them (every row shares the blocks of one),
    where DequantizeLinear requires the input's dimensions except along the axis.""",
    transform=_each_value(_blocked_parameters_broadcast))


# ----------------------------------------------------------------------------------------- payload size
def _trailing_bytes_dropped(value):
    count, width = _logical_count(value), dtypes.BIT_WIDTH.get(value.affine.storage_type)
    if count is not None and width is not None and value.HasField("raw_data"):
        value.raw_data = value.raw_data[: (count * width + 7) // 8]


def _floor_bytes(value):
    count, width = _logical_count(value), dtypes.BIT_WIDTH.get(value.affine.storage_type)
    if count is not None and width is not None and count * width % 8:
        raise violation(E.AFFINE_PAYLOAD_SIZE, value.name, f"{count} codes need {count * width // 8} bytes")


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


def _eight_bit_at_least(original):
    def verify_affine(value, path, extent):
        if value.affine.storage_type in (dtypes.INT8, dtypes.UINT8) and not extent.external:
            try:
                count = int(np.prod(verifier.logical_tensor_shape(value, path)[1]))
            except Exception:  # noqa: BLE001 - the original reports a malformed logical type
                count = None
            if count is not None and extent.length > count:
                extent = type(extent)(count, None, 0, bytes(extent.inline or value.raw_data)[:count])
        return original(value, path, extent)
    return verify_affine


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


def _external_prefix_decoded(original):
    def decode_affine(value, payload_bytes, count, path, out):
        needed = affine.payload_bytes(value.affine.storage_type, count)
        return original(value, payload_bytes[:needed], count, path, out)
    return decode_affine


LongPayloadTruncated = fault("AFF-PAYLOAD-SIZE.trailing-bytes-ignored", ("AFF-PAYLOAD-SIZE",),
    """Reads the codes it needs and ignores extra trailing payload bytes instead of requiring exactly ``ceil(n * bits /
    8)`` bytes.""", transform=_each_value(_trailing_bytes_dropped))
PayloadSizeRoundedDown = fault("AFF-PAYLOAD-SIZE.floor-bytes", ("AFF-PAYLOAD-SIZE",),
    """Computes the payload size as ``floor(n * bits / 8)``: a payload with a partial final byte (an odd number of
    four-bit codes) is refused.""", boundary=True, precheck=_each_value(_floor_bytes))
AffineBitCountIn32Bits = fault("AFF-PAYLOAD-SIZE.bit-count-32-bits", ("AFF-PAYLOAD-SIZE",),
    """Computes the affine payload size ``ceil(n * bit_width / 8)`` with ``n * bit_width`` in 32 bits: for 2**30 INT4
    codes (2**32 bits) it expects an empty payload and accepts one; below 2**32 bits the size is right.""",
    boundary=True, patches=lambda: [wrap(verifier, "_verify_affine", _bit_count_32)])
EightBitPayloadAtLeast = fault("AFF-PAYLOAD-SIZE.eight-bit-at-least", ("AFF-PAYLOAD-SIZE",),
    """Checks the inline payload of INT8/UINT8 codes with ``length >= n`` (the byte-wide path reads the first n bytes),
    while the packed types keep the exact ``ceil(n * bits / 8)`` check.""",
    patches=lambda: [wrap(verifier, "_verify_affine", _eight_bit_at_least)])
ExternalPayloadLongerAccepted = fault("AFF-PAYLOAD-SIZE.external-longer-accepted",
    ("AFF-PAYLOAD-SIZE", "PAY-EXTERNAL-EXTENT"), """Checks the exact payload size ``ceil(n * bits / 8)`` on raw_data
    only: an external extent longer than the codes is accepted and its first bytes decoded.""",
    patches=lambda: [wrap(verifier, "_verify_affine", _external_size_unchecked),
                     wrap(decode, "_decode_affine", _external_prefix_decoded)])


# ------------------------------------------------------------------------------------------------ padding
def _padding_masked(value):
    count, width = _logical_count(value), dtypes.BIT_WIDTH.get(value.affine.storage_type)
    if count is None or width is None or not value.raw_data:
        return
    used = count * width % 8
    if used and len(value.raw_data) == (count * width + 7) // 8:
        value.raw_data = value.raw_data[:-1] + bytes([value.raw_data[-1] & ((1 << used) - 1)])


def _padding_masked_external(original):
    def decode_affine(value, payload_bytes, count, path, out):
        bits = count * dtypes.BIT_WIDTH.get(value.affine.storage_type, 8)
        if value.data_location == payload.EXTERNAL and bits % 8 and len(payload_bytes):
            masked = np.array(payload_bytes, np.uint8)
            masked[-1] &= (1 << (bits % 8)) - 1
            payload_bytes = masked
        return original(value, payload_bytes, count, path, out)
    return decode_affine


def _two_bit_count(value):
    """(code count, raw_data) of an inline two-bit value whose payload has the exact size, or None."""
    if value.affine.storage_type not in (dtypes.INT2, dtypes.UINT2) or value.data_location == payload.EXTERNAL \
            or not value.HasField("raw_data"):
        return None
    try:
        count = int(np.prod(verifier.logical_tensor_shape(value, "value")[1]))
    except Exception:  # noqa: BLE001 - the oracle reports a malformed logical type
        return None
    if len(value.raw_data) != affine.payload_bytes(value.affine.storage_type, count):
        return None
    return count, value.raw_data


def _third_code_as_padding(value):
    found = _two_bit_count(value)
    # the third code of the last byte taken for padding
    if found is not None and found[0] % 4 == 3 and found[1][-1] >> 4:
        raise violation(E.AFFINE_PADDING_NONZERO, "raw_data", "unused final high bits must be zero")


def _nibble_padding_masked(value):
    found = _two_bit_count(value)
    if found is None:
        return
    count, raw = found
    used = count * 2 % 8
    if used and raw and not raw[-1] >> 4:  # what the nibble check lets through reads as if its padding were zero
        value.raw_data = raw[:-1] + bytes([raw[-1] & ((1 << used) - 1)])


PaddingBitsIgnored = fault("AFF-PADDING-ZERO.padding-ignored", ("AFF-PADDING-ZERO",),
    """Never looks at the unused final high bits of a packed payload, so nonzero padding passes.""",
    transform=_each_value(_padding_masked))
ExternalPaddingUnchecked = fault("AFF-PADDING-ZERO.external-unchecked", ("AFF-PADDING-ZERO",),
    """Checks that the unused final high bits are zero on raw_data only: an external payload with nonzero padding bits
    decodes.""", patches=lambda: [wrap(decode, "_decode_affine", _padding_masked_external)])
PaddingMaskAssumesNibble = fault("AFF-PADDING-ZERO.nibble-mask-for-two-bit", ("AFF-PADDING-ZERO", "AFF-PACKING"),
    """Checks the unused final bits with ``last_byte >> 4`` whatever the storage type (the check was written for
    four-bit codes): a two-bit payload with 1 code in its last byte passes with nonzero bits 2-3, and one with 3 codes
    in its last byte is refused when the third code is nonzero.""", boundary=True,
    precheck=_each_value(_third_code_as_padding), transform=_each_value(_nibble_padding_masked))


# ----------------------------------------------------------------------------------------- logical types
def _shape_inferred(value):
    width = dtypes.BIT_WIDTH.get(value.affine.storage_type)
    logical = value.logical_type
    tensorish = not value.HasField("logical_type") or logical.WhichOneof("value") == "tensor_type"
    if width is None or not tensorish or _logical_count(value) is not None:
        return
    elem = logical.tensor_type.elem_type if value.HasField("logical_type") else dtypes.FLOAT
    value.logical_type.tensor_type.elem_type = elem or dtypes.FLOAT
    value.logical_type.tensor_type.shape.Clear()
    value.logical_type.tensor_type.shape.dim.add(dim_value=len(value.raw_data) * 8 // width)


def _wrapped_tensor_unwrapped(value):
    logical = value.logical_type
    while logical.WhichOneof("value") in ("optional_type", "sequence_type"):
        inner = logical.optional_type.elem_type if logical.HasField("optional_type") \
            else logical.sequence_type.elem_type
        copy = type(inner)()
        copy.CopyFrom(inner)
        logical.CopyFrom(copy)


def _symbolic_dims_as_one(value):
    if value.logical_type.WhichOneof("value") == "tensor_type":
        for dim in value.logical_type.tensor_type.shape.dim:
            if dim.WhichOneof("value") != "dim_value":
                dim.dim_value = 1


LogicalShapeInferred = fault("AFF-LOGICAL.shape-inferred", ("AFF-LOGICAL",),
    """Infers a one-dimensional FLOAT logical type from the payload when the declared one is missing or not concrete,
    instead of requiring a concrete tensor type.""", transform=_each_value(_shape_inferred))
OptionalLogicalUnwrapped = fault("AFF-LOGICAL.wrapped-tensor-unwrapped", ("AFF-LOGICAL",),
    """Unwraps an optional or sequence logical type to the tensor type inside it (the way its graph inputs are handled)
    instead of requiring the affine branch's logical_type to be a tensor type.""",
    transform=_each_value(_wrapped_tensor_unwrapped))
SymbolicDimsAsOne = fault("AFF-LOGICAL.symbolic-dims-as-one", ("AFF-LOGICAL",),
    """Reads a symbolic or unset logical dimension as 1 (the broadcast default of its shape code) instead of refusing an
    affine logical type that is not concrete.""", transform=_each_value(_symbolic_dims_as_one))


# ------------------------------------------------------------------------------------- DequantizeLinear
def _zero_point_after_scaling(original):
    # the kernel takes no caller's buffer
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None):
        if zero_point is None:
            return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype)
        ones = np.ones_like(np.asarray(scale))
        scaled = original(codes, storage_type, scale, None, axis, block_size, shape, output_dtype)
        shift = original(codes, storage_type, ones, None, axis, block_size, shape, output_dtype) - \
            original(codes, storage_type, ones, zero_point, axis, block_size, shape, output_dtype)
        return (scaled - shift).astype(scaled.dtype)
    return dequantize


def _round_half_up(original):
    def quantize(x, storage_type, scale, zero_point=None, axis=None, block_size=None):
        nudged = np.nextafter(np.asarray(x, np.float32), np.float32(np.inf))  # ties go up, not to even
        return original(nudged, storage_type, scale, zero_point, axis, block_size)
    return quantize


def _bfloat16_truncated(original, args):
    if _result_dtype(args).name != "bfloat16":
        return None
    bits = np.ascontiguousarray(_in_float32(original, args)).view(np.uint32) & np.uint32(0xFFFF0000)  # high half kept
    return bits.view(np.float32).astype(_result_dtype(args))


def _narrowing_saturates(original, args):
    if _result_dtype(args) != np.float16 or np.asarray(args.scale).dtype == np.float16:
        return None
    limit = np.float32(np.finfo(np.float16).max)
    return np.clip(_in_float32(original, args), -limit, limit).astype(np.float16)  # a saturating conversion


def _zero_difference_shortcut(original, args):
    result = original(*[getattr(args, name) for name in _ARGS])
    if not np.all(np.isfinite(np.asarray(args.scale, np.float64))):
        ones = np.ones_like(np.asarray(args.scale))
        differences = original(args.codes, args.storage_type, ones, args.zero_point, args.axis, args.block_size,
                               args.shape, np.float32)
        result = np.where(differences == 0, np.zeros((), result.dtype), result).astype(result.dtype)
    return result


def _broadcastable_parameters(value):
    found = None if value.affine.HasField("block_size") else _value_shape(value)
    if found is None:
        return
    expected = affine.parameter_shape(*found, None)
    for tensor in _parameters(value.affine):
        dims = list(tensor.dims)
        if tuple(dims) != expected and int(np.prod(dims)) == int(np.prod(expected)) and dims:
            del tensor.dims[:]
            tensor.dims.extend(expected)


ZeroPointAfterScaling = fault("AFF-DQ.zero-point-after-scaling", ("AFF-DQ",),
    """Computes ``code * scale - zero_point`` instead of DequantizeLinear's ``(code - zero_point) * scale``.""",
    patches=lambda: [wrap(affine, "dequantize", _zero_point_after_scaling)])
QuantizeTiesRoundUp = fault("AFF-DQ.quantize-ties-round-up", ("AFF-DQ",),
    """Quantizes (when it converts or encodes values) with ties rounded up, ``floor(x / scale + 0.5)``, instead of
    QuantizeLinear's round half to even.""", boundary=True,
    pending="no case can place a value exactly halfway between two codes: the only values a runtime "
               "quantizes are KV blocks it converts, and the spec leaves the scale of a converted block to the "
               "runtime, so conversion is checked within one quantization step, where a tie rounded up or to "
               "even both pass", patches=lambda: [wrap(affine, "quantize", _round_half_up)])
Bfloat16OutputTruncated = fault("AFF-DQ.bfloat16-output-truncated", ("AFF-DQ", "AFF-SCALE"),
    """Forms BFLOAT16 values by keeping the high 16 bits of the FLOAT product (truncation) instead of rounding it to
    nearest even.""", boundary=True, patches=lambda: [_dequantize(_bfloat16_truncated, finish=True)])
Float16OutputSaturates = fault("AFF-DQ.float16-output-saturates", ("AFF-DQ", "AFF-SCALE"),
    """Converts a FLOAT product to a FLOAT16 logical type (output_dtype) with a saturating conversion: products beyond
    65504 become +-65504 instead of rounding to infinity.""", boundary=True,
    patches=lambda: [_dequantize(_narrowing_saturates, finish=True)])
ZeroDifferenceShortcut = fault("AFF-DQ.zero-difference-shortcut", ("AFF-DQ",),
    """Writes 0 for a code equal to its zero point without multiplying (a shortcut for the common case), so a zero
    difference times an infinite or NaN scale gives 0 instead of NaN.""", boundary=True,
    patches=lambda: [_dequantize(_zero_difference_shortcut)])
BroadcastableParametersAccepted = fault("AFF-DQ.broadcastable-parameters", ("AFF-DQ", "AFF-AXIS"),
    """Accepts any parameter shape with the right number of elements (a [1, C] or [C, 1] per-axis scale, a [1]
    per-tensor scale), reshaping it, instead of DequantizeLinear's exact shapes.""",
    transform=_each_value(_broadcastable_parameters))


name_faults(globals())
