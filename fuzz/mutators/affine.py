"""The closed affine branch: storage types, scales, zero points, granularity, code payload."""

from __future__ import annotations

import numpy as np

from fuzz import gen
from fuzz.cases import FuzzCase
from fuzz.mutators.base import (
    Work,
    entries,
    explicit_affine,
    is_external,
    logical_shape,
    mutator,
    payload_length,
    pick_affine,
    rank_of,
    set_entry,
)
from reference_impl import affine, dtypes, schema
from reference_impl.errors import ErrorCode as E


# ------------------------------------------------------------------------------------- affine rules
@mutator(E.AFFINE_STORAGE_INVALID)
def _storage(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_STORAGE_INVALID)
    value = pick_affine(src, work)
    value.affine.storage_type = src.choice((dtypes.FLOAT, dtypes.INT16, dtypes.INT32, dtypes.FLOAT8E4M3FN,
                                            dtypes.BOOL, dtypes.UNDEFINED, dtypes.FLOAT4E2M1, dtypes.STRING))
    return work.case(f"storage_type {dtypes.type_name(value.affine.storage_type)}")


def _retype_float_tensor(tensor, new_type: int) -> None:
    """Re-encode a float tensor's values under another element type (data stays consistent)."""
    from reference_impl.tensors import to_array

    values = to_array(tensor, "scale").astype(np.float64)
    with np.errstate(over="ignore"):
        converted = values.astype(dtypes.NUMPY_DTYPE[new_type])
    tensor.CopyFrom(gen.tensor_with_raw(converted, new_type))


@mutator(E.AFFINE_SCALE_INVALID)
def _scale_invalid(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_SCALE_INVALID)
    value = pick_affine(src, work)
    how = src.integer(0, 2)
    scale = value.affine.scale
    if how == 0:
        value.affine.ClearField("scale")
        return work.case("affine value without scale")
    if how == 1:
        count = int(np.prod(scale.dims, dtype=np.int64)) if len(scale.dims) else 1
        new_type = src.choice((dtypes.INT32, dtypes.INT8, dtypes.UINT8, dtypes.INT64))
        dims = list(scale.dims)
        scale.Clear()
        scale.dims.extend(dims)
        scale.data_type = new_type
        scale.raw_data = bytes(count * dtypes.BIT_WIDTH[new_type] // 8)
        return work.case(f"scale of integer type {dtypes.type_name(new_type)}")
    elem_type = value.logical_type.tensor_type.elem_type
    # DequantizeLinear's output_dtype lets FLOAT/FLOAT16/BFLOAT16 scales decode to any of those three,
    # so only a pair involving DOUBLE is invalid
    other = src.choice([t for t in gen.SCALE_TYPES
                        if t != scale.data_type and not {t, elem_type} <= affine.OUTPUT_DTYPES])
    _retype_float_tensor(scale, other)
    return work.case("scale type DequantizeLinear cannot decode to the logical element type")


def _wrong_shape(src, shape: tuple) -> tuple:
    """A parameter shape different from ``shape``."""
    options = [shape + (1,), shape[:-1] if shape else (2,), tuple(d + 1 for d in shape) or (3,)]
    if shape:
        options.append(tuple(reversed(shape)) if len(set(shape)) > 1 else shape + (2,))
    candidate = src.choice(options)
    return candidate if candidate != shape else shape + (2,)


@mutator(E.AFFINE_PARAM_SHAPE)
def _param_shape(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_PARAM_SHAPE)
    value = pick_affine(src, work)
    layout = value.affine
    target = "zero_point" if layout.HasField("zero_point") and src.boolean() else "scale"
    tensor = getattr(layout, target)
    shape = _wrong_shape(src, tuple(tensor.dims))
    if shape == (1,) and not len(tensor.dims):
        shape = (2,)  # a one-element vector is arguably a per-tensor parameter: avoid the edge
    data_type = tensor.data_type
    tensor.Clear()
    tensor.data_type = data_type
    if src.chance(1, 6):  # a negative dimension: rejected before the data is looked at
        shape = (src.choice((-1, -3)),) + shape[1:]
        tensor.dims.extend(shape)
    else:
        tensor.dims.extend(shape)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        tensor.raw_data = bytes((count * dtypes.BIT_WIDTH[data_type] + 7) // 8)
    return work.case(f"{target} shape {list(shape)} does not fit the granularity")


@mutator(E.AFFINE_ZERO_POINT_INVALID)
def _zero_point(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_ZERO_POINT_INVALID)
    value = pick_affine(src, work)
    layout = value.affine
    dims = list(layout.scale.dims)
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    wrong = src.choice([t for t in gen.STORAGE_TYPES + (dtypes.INT32, dtypes.FLOAT, dtypes.INT16)
                        if t != layout.storage_type])
    zp = schema.TensorProto(data_type=wrong, dims=dims)
    zp.raw_data = bytes((count * dtypes.BIT_WIDTH[wrong] + 7) // 8)
    layout.zero_point.CopyFrom(zp)
    return work.case(f"zero_point of type {dtypes.type_name(wrong)} for storage "
                     f"{dtypes.type_name(layout.storage_type)}")


@mutator(E.AFFINE_AXIS_INVALID)
def _axis(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_AXIS_INVALID)
    value = pick_affine(src, work, lambda v: v.affine.HasField("axis"), granularity=src.choice(("axis", "blocked")))
    rank = rank_of(value)
    value.affine.axis = src.choice((rank, rank + 1, -rank - 1, 2**62, -(2**63)))
    return work.case(f"axis {value.affine.axis} outside [-{rank}, {rank})")


@mutator(E.AFFINE_BLOCK_WITHOUT_AXIS)
def _block_without_axis(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_BLOCK_WITHOUT_AXIS)
    value = pick_affine(src, work, lambda v: not v.affine.HasField("axis"), granularity="tensor")
    value.affine.block_size = src.integer(1, 4)
    return work.case("block_size without axis (per-tensor value)")


@mutator(E.AFFINE_BLOCK_INVALID)
def _block_zero(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_BLOCK_INVALID)
    value = pick_affine(src, work, lambda v: v.affine.HasField("axis"), granularity=src.choice(("axis", "blocked")))
    value.affine.block_size = 0
    return work.case("block_size 0")


@mutator(E.AFFINE_PAYLOAD_SIZE)
def _affine_payload(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_PAYLOAD_SIZE)
    value = pick_affine(src, work)
    length = payload_length(value, work.files)
    delta = src.choice((1, 2, 7)) if not length or src.boolean() else -src.integer(1, length)
    if is_external(value):
        set_entry(value, "length", str(length + delta))
        location = entries(value)["location"]
        work.files[location] = work.files.get(location, b"") + bytes(max(delta, 0))
    else:
        value.raw_data = value.raw_data[:length + delta] if delta < 0 else value.raw_data + bytes(delta)
    return work.case(f"code payload of {length + delta} bytes, {length} expected")


@mutator(E.AFFINE_PADDING_NONZERO)
def _padding(src, generated) -> FuzzCase:
    work = Work(generated, E.AFFINE_PADDING_NONZERO)

    def odd(v) -> bool:
        count = int(np.prod(logical_shape(v), dtype=np.int64)) if rank_of(v) else 1
        return not is_external(v) and (count * dtypes.BIT_WIDTH.get(v.affine.storage_type, 8)) % 8 != 0

    value = pick_affine(src, work, odd, storage=dtypes.INT4)
    if not odd(value):
        work.graph.encoded_initializer.remove(value)
        value = explicit_affine(work, src.choice((dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)),
                                 src.choice((1, 3, 5, 7, 9)))
    count = int(np.prod(logical_shape(value), dtype=np.int64)) if rank_of(value) else 1
    used = (count * dtypes.BIT_WIDTH[value.affine.storage_type]) % 8
    high = src.integer(1, (1 << (8 - used)) - 1) << used
    data = bytearray(value.raw_data)
    data[-1] |= high
    value.raw_data = bytes(data)
    return work.case(f"unused final bits 0x{high:02x} set")
