"""The closed affine branch: INT8/UINT8/INT4/UINT4/INT2/UINT2 codes with per-tensor, per-axis or
blocked parameters, decoded exactly as ONNX DequantizeLinear: ``(code - zero_point) * scale``.

Decoding works in place on the output array so the peak extra memory stays a fraction of the output.
"""

from __future__ import annotations

import numpy as np

from reference_impl import dtypes
from reference_impl.bits import pack_sub_byte
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import fail

STORAGE_TYPES = {dtypes.INT8, dtypes.UINT8, dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2}
SCALE_TYPES = {dtypes.FLOAT, dtypes.FLOAT16, dtypes.BFLOAT16, dtypes.DOUBLE}
#: DequantizeLinear's output_dtype (opset 23): the logical element type may be any of these whatever the
#: (equally DequantizeLinear-typed) scale is; a DOUBLE scale only decodes to DOUBLE.
OUTPUT_DTYPES = {dtypes.FLOAT, dtypes.FLOAT16, dtypes.BFLOAT16}
_RANGE = {dtypes.INT8: (-128, 127), dtypes.UINT8: (0, 255), dtypes.INT4: (-8, 7), dtypes.UINT4: (0, 15),
          dtypes.INT2: (-2, 1), dtypes.UINT2: (0, 3)}


def code_range(storage_type: int) -> tuple[int, int]:
    return _RANGE[storage_type]


def payload_bytes(storage_type: int, count: int) -> int:
    """ceil(n * bit_width(storage_type) / 8)."""
    return (count * dtypes.BIT_WIDTH[storage_type] + 7) // 8


def decode_cost(scale_type: int) -> int:
    """Bytes per logical element ``dequantize`` allocates: its float32/float64 working array, plus the
    converted output when the scale's type is narrower."""
    work = 8 if scale_type == dtypes.DOUBLE else 4
    return work + (0 if scale_type in (dtypes.FLOAT, dtypes.DOUBLE) else dtypes.BIT_WIDTH[scale_type] // 8)


def normalize_axis(axis: int | None, rank: int, path: str) -> int | None:
    if axis is None:
        return None
    if not -rank <= axis < rank:
        raise fail(E.AFFINE_AXIS_INVALID, path, f"axis {axis} is outside [-{rank}, {rank})")
    return axis % rank


def parameter_shape(shape: tuple[int, ...], axis: int | None, block_size: int | None) -> tuple[int, ...]:
    """The scale/zero_point shape DequantizeLinear requires for this granularity."""
    if axis is None:
        return ()
    if not block_size:
        return (shape[axis],)
    blocked = list(shape)
    blocked[axis] = -(-shape[axis] // block_size)
    return tuple(blocked)


def _byte_lut(storage_type: int) -> np.ndarray:
    """For 4- and 2-bit codes: each byte value -> its codes (low bits first) as float32."""
    width = dtypes.BIT_WIDTH[storage_type]
    per_byte = 8 // width
    byte = np.arange(256, dtype=np.int64)[:, None]
    codes = (byte >> (np.arange(per_byte) * width)[None, :]) & ((1 << width) - 1)
    if storage_type in dtypes.SIGNED_INTEGERS:
        sign = 1 << (width - 1)
        codes = (codes ^ sign) - sign
    return codes.astype(np.float32)


_LUTS = {t: _byte_lut(t) for t in (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)}


def codes_as_float(raw: np.ndarray, storage_type: int, count: int, dtype: np.dtype) -> np.ndarray:
    """The ``count`` codes of a packed payload as a new float array (the decoder's output buffer)."""
    if storage_type in (dtypes.INT8, dtypes.UINT8):
        return raw[:count].view(np.int8 if storage_type == dtypes.INT8 else np.uint8).astype(dtype)
    lut = _LUTS[storage_type].astype(dtype, copy=False)
    per_byte = lut.shape[1]
    nbytes = -(-count // per_byte)
    # One gather per payload byte: each LUT row (all codes of one byte) is viewed as a single wide scalar,
    # so fancy indexing allocates exactly the output once and stays fast.
    row = {8: np.uint64, 16: np.complex128}.get(lut.shape[1] * lut.itemsize)
    if row is None:
        return lut.take(raw[:nbytes], axis=0).reshape(-1)[:count]
    wide = np.ascontiguousarray(lut).view(row).reshape(256)
    return wide.take(raw[:nbytes]).view(dtype)[:count]  # take: about twice as fast as fancy indexing


def _view_blocks(out: np.ndarray, axis: int, start: int, stop: int, nblocks: int, block: int) -> np.ndarray:
    """A view of out[..., start:stop, ...] split on ``axis`` into (nblocks, block); never a copy."""
    view = out[(slice(None),) * axis + (slice(start, stop),)]
    split = view.view()
    split.shape = view.shape[:axis] + (nblocks, block) + view.shape[axis + 1:]  # raises if a copy were needed
    return split


def dequantize(codes, storage_type: int, scale: np.ndarray, zero_point: np.ndarray | None,
               axis: int | None, block_size: int | None, shape: tuple[int, ...],
               output_dtype: np.dtype | None = None) -> np.ndarray:
    """ONNX DequantizeLinear over a packed code payload; the output dtype is ``output_dtype`` (its
    attribute of that name) or else the scale's dtype. The product is formed in float32 (float64 for a
    DOUBLE scale) and then cast, as onnx's reference implementation does.

    Parameters are assumed validated (see ``check_affine``); the payload must hold at least the codes.
    """
    raw = np.frombuffer(codes, dtype=np.uint8) if isinstance(codes, (bytes, bytearray, memoryview)) \
        else np.asarray(codes, dtype=np.uint8).reshape(-1)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    scale = np.asarray(scale)
    work_dtype = np.float64 if scale.dtype == np.float64 else np.float32
    out = codes_as_float(raw, storage_type, count, work_dtype).reshape(shape)
    zp = None
    if zero_point is not None and np.any(zero_point):
        zp = np.asarray(zero_point).astype(work_dtype)
    work_scale = scale.astype(work_dtype)
    if axis is None:
        if zp is not None:
            out -= zp
        out *= work_scale
    elif not block_size:
        bshape = [1] * len(shape)
        bshape[axis] = shape[axis]
        if zp is not None:
            out -= zp.reshape(bshape)
        out *= work_scale.reshape(bshape)
    else:
        dim = shape[axis]
        full = dim // block_size
        if full:
            view = _view_blocks(out, axis, 0, full * block_size, full, block_size)
            index = (slice(None),) * axis + (slice(0, full),)
            expand = lambda p: np.expand_dims(p[index], axis + 1)  # noqa: E731
            if zp is not None:
                view -= expand(zp)
            view *= expand(work_scale)
        if dim % block_size:
            tail = out[(slice(None),) * axis + (slice(full * block_size, dim),)]
            index = (slice(None),) * axis + (slice(full, full + 1),)
            if zp is not None:
                tail -= zp[index]
            tail *= work_scale[index]
    result_dtype = np.dtype(output_dtype) if output_dtype is not None else scale.dtype
    if out.dtype != result_dtype:
        return out.astype(result_dtype)
    return out


def quantize(x: np.ndarray, storage_type: int, scale: np.ndarray, zero_point: np.ndarray | None = None,
             axis: int | None = None, block_size: int | None = None) -> bytes:
    """ONNX QuantizeLinear (round half to even, saturate) returning the packed code payload."""
    x = np.asarray(x)
    shape = x.shape
    scale = np.asarray(scale, dtype=np.float32)
    zp = np.zeros(scale.shape, dtype=np.int64) if zero_point is None else np.asarray(zero_point, np.int64)
    if axis is not None:
        axis %= max(len(shape), 1)
        if block_size:
            scale = np.repeat(scale, block_size, axis=axis).take(np.arange(shape[axis]), axis=axis)
            zp = np.repeat(zp, block_size, axis=axis).take(np.arange(shape[axis]), axis=axis)
        else:
            bshape = [1] * len(shape)
            bshape[axis] = shape[axis]
            scale = scale.reshape(bshape)
            zp = zp.reshape(bshape)
    low, high = _RANGE[storage_type]
    codes = np.clip(np.rint(x.astype(np.float32) / scale).astype(np.int64) + zp, low, high)
    width = dtypes.BIT_WIDTH[storage_type]
    if width == 8:
        return codes.astype(np.int8 if storage_type == dtypes.INT8 else np.uint8).tobytes()
    return pack_sub_byte(codes.reshape(-1), width)


def make_affine_value(x: np.ndarray, storage_type: int, scale, zero_point=None, axis: int | None = None,
                      block_size: int | None = None, name: str = ""):
    """An EncodedValueProto holding ``x`` quantized with the given parameters (inline payload)."""
    from onnx import numpy_helper

    from reference_impl import schema

    x = np.asarray(x)
    scale = np.asarray(scale)
    value = schema.EncodedValueProto(name=name)
    layout = value.affine
    layout.storage_type = storage_type
    layout.scale.CopyFrom(schema.from_onnx(numpy_helper.from_array(scale)))
    if zero_point is not None:
        zp = np.asarray(zero_point)
        tensor = schema.TensorProto(data_type=storage_type, dims=list(zp.shape))
        if dtypes.BIT_WIDTH[storage_type] == 8:
            tensor.raw_data = zp.astype(dtypes.NUMPY_DTYPE[storage_type]).tobytes()
        else:
            tensor.raw_data = pack_sub_byte(zp.reshape(-1), dtypes.BIT_WIDTH[storage_type])
        layout.zero_point.CopyFrom(tensor)
    if axis is not None:
        layout.axis = axis
    if block_size is not None:
        layout.block_size = block_size
    tensor_type = value.logical_type.tensor_type
    tensor_type.elem_type = {np.dtype(np.float32): dtypes.FLOAT, np.dtype(np.float16): dtypes.FLOAT16,
                             np.dtype(np.float64): dtypes.DOUBLE}.get(scale.dtype, dtypes.BFLOAT16)
    tensor_type.shape.SetInParent()
    for dim in x.shape:
        tensor_type.shape.dim.add(dim_value=dim)
    value.raw_data = quantize(x, storage_type, scale.astype(np.float32), zero_point, axis, block_size)
    return value
