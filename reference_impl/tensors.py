"""Exact checks and NumPy views of TensorProto values (constants, scales, zero points).

Counts are compared before anything is converted, so a tensor declaring 2**62 elements is rejected by
arithmetic rather than by an attempted allocation.
"""

from __future__ import annotations

import numpy as np

from reference_impl import dtypes
from reference_impl.dtypes import UINT64_MAX
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

_INT32_FIELD = {dtypes.INT32, dtypes.INT16, dtypes.INT8, dtypes.UINT16, dtypes.UINT8, dtypes.BOOL,
                dtypes.FLOAT16, dtypes.BFLOAT16, dtypes.FLOAT8E4M3FN, dtypes.FLOAT8E4M3FNUZ,
                dtypes.FLOAT8E5M2, dtypes.FLOAT8E5M2FNUZ, dtypes.UINT4, dtypes.INT4, dtypes.FLOAT4E2M1,
                dtypes.FLOAT8E8M0, dtypes.UINT2, dtypes.INT2, dtypes.FLOAT6E2M3, dtypes.FLOAT6E3M2}
_PACKED_IN_INT32 = {dtypes.UINT4: 2, dtypes.INT4: 2, dtypes.FLOAT4E2M1: 2, dtypes.UINT2: 4, dtypes.INT2: 4}
_PLAIN_INT32 = {dtypes.INT32, dtypes.INT16, dtypes.INT8, dtypes.UINT16, dtypes.UINT8, dtypes.BOOL}
_SUB_BYTE = {dtypes.UINT4, dtypes.INT4, dtypes.FLOAT4E2M1, dtypes.UINT2, dtypes.INT2,
             dtypes.FLOAT6E2M3, dtypes.FLOAT6E3M2}

#: Constants and affine parameters larger than this are rejected rather than materialized.
MAX_PARAMETER_ELEMENTS = 1 << 26
_INTP_MAX = int(np.iinfo(np.intp).max)


def array_shape(dims, itemsize: int, path: str) -> tuple[int, ...]:
    """``dims`` as a NumPy shape, or RESOURCE_LIMIT when NumPy cannot represent it: NumPy requires the
    product of the non-zero dimensions times the item size to fit in a signed size, even for an
    empty array (a zero dimension times 2**62 is a legal tensor the oracle cannot hold)."""
    shape = tuple(int(d) for d in dims)
    span = itemsize
    for dim in shape:
        if dim:
            span *= dim
            if span > _INTP_MAX:
                raise violation(E.RESOURCE_LIMIT, path,
                                f"shape {list(shape)} is beyond what a NumPy array can describe")
    return shape


def element_count(dims, path: str) -> int:
    count = 1
    for dim in dims:
        count *= dim
        if count > UINT64_MAX:
            raise violation(E.SIZE_OVERFLOW, path, "element count overflows uint64")
    return count


def _typed_field(tensor) -> tuple[str, int]:
    """The populated typed data field and the number of values it holds."""
    t = tensor.data_type
    if t == dtypes.FLOAT or t == dtypes.COMPLEX64:
        return "float_data", len(tensor.float_data)
    if t == dtypes.DOUBLE or t == dtypes.COMPLEX128:
        return "double_data", len(tensor.double_data)
    if t == dtypes.INT64:
        return "int64_data", len(tensor.int64_data)
    if t in (dtypes.UINT32, dtypes.UINT64):
        return "uint64_data", len(tensor.uint64_data)
    if t == dtypes.STRING:
        return "string_data", len(tensor.string_data)
    return "int32_data", len(tensor.int32_data)


def expected_raw_bytes(elem_type: int, count: int) -> int:
    return (count * dtypes.BIT_WIDTH[elem_type] + 7) // 8


def check_tensor_data(tensor, path: str) -> int:
    """Exactly one data representation whose size matches dims; returns the element count."""
    return _checked(tensor, path)[0]


def _checked(tensor, path: str) -> tuple[int, bytes | None]:
    """``check_tensor_data``, also returning the raw bytes it measured (read once: reading ``raw_data``
    copies it out of the message)."""
    t = tensor.data_type
    if t not in dtypes.KNOWN_TYPES:
        raise violation(E.TENSOR_DATA_INVALID, f"{path}.data_type", f"element type {t} is not defined")
    if tensor.data_location == 1 or tensor.external_data:
        raise violation(E.TENSOR_DATA_INVALID, path, "an inline tensor value is required, not external data")
    if tensor.HasField("segment"):
        raise violation(E.TENSOR_DATA_INVALID, f"{path}.segment", "segmented tensors are not values")
    count = element_count(tensor.dims, f"{path}.dims")
    populated = [name for name in ("float_data", "int32_data", "string_data", "int64_data",
                                   "double_data", "uint64_data") if len(getattr(tensor, name))]
    has_raw = tensor.HasField("raw_data")
    if has_raw and t == dtypes.STRING:
        raise violation(E.TENSOR_DATA_INVALID, f"{path}.raw_data", "string tensors cannot use raw_data")
    if len(populated) + has_raw > 1:
        raise violation(E.TENSOR_DATA_INVALID, path, "tensor data is stored in more than one field")
    if has_raw:
        expected = expected_raw_bytes(t, count)
        raw = tensor.raw_data
        if len(raw) != expected:
            raise violation(E.TENSOR_DATA_INVALID, f"{path}.raw_data",
                            f"{len(raw)} bytes for {count} elements; expected {expected}")
        return count, raw
    field, held = _typed_field(tensor)
    if populated and populated[0] != field:
        raise violation(E.TENSOR_DATA_INVALID, f"{path}.{populated[0]}",
                        f"{dtypes.type_name(t)} data belongs in {field}")
    per_value = 2 if t in (dtypes.COMPLEX64, dtypes.COMPLEX128) else 1
    expected = count * per_value
    if t in _PACKED_IN_INT32:
        expected = -(-count // _PACKED_IN_INT32[t])
    if held != expected:
        raise violation(E.TENSOR_DATA_INVALID, f"{path}.{field}",
                        f"{held} values for {count} elements; expected {expected}")
    return count, None


def to_array(tensor, path: str) -> np.ndarray:
    """The tensor's values as NumPy (after check_tensor_data), bounded by MAX_PARAMETER_ELEMENTS."""
    count, raw = _checked(tensor, path)
    if count > MAX_PARAMETER_ELEMENTS:
        raise violation(E.RESOURCE_LIMIT, path, f"{count} elements exceed the parameter limit")
    t = tensor.data_type
    shape = array_shape(tensor.dims, dtypes.NUMPY_DTYPE[t].itemsize if t in dtypes.NUMPY_DTYPE else 8, path)
    if t == dtypes.STRING:
        return np.array(list(tensor.string_data), dtype=object).reshape(shape)
    if raw is not None:
        from reference_impl.bits import unpack_elements

        return unpack_elements(np.frombuffer(raw, dtype=np.uint8), t, count).reshape(shape)
    field, _ = _typed_field(tensor)
    values = np.asarray(getattr(tensor, field))
    if t in (dtypes.COMPLEX64, dtypes.COMPLEX128):
        pairs = values.reshape(-1, 2)
        return (pairs[:, 0] + 1j * pairs[:, 1]).astype(dtypes.NUMPY_DTYPE[t]).reshape(shape)
    from reference_impl.bits import unpack_elements

    if t in _PACKED_IN_INT32:
        # int32_data holds several codes per entry, low bits first, like the raw byte packing.
        return unpack_elements(values.astype(np.uint8), t, count).reshape(shape)
    if t in _INT32_FIELD and t not in _PLAIN_INT32:
        # Float16-family and 6/8-bit float values travel as their bit patterns in int32_data.
        width = dtypes.BIT_WIDTH[t]
        raw = values.astype(np.uint16 if width == 16 else np.uint8)
        return raw.view(dtypes.NUMPY_DTYPE[t]).reshape(shape)
    return values.astype(dtypes.NUMPY_DTYPE[t]).reshape(shape)
