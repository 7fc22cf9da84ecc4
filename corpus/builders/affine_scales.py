"""Affine values whose scale has each floating element type the spec admits: FLOAT, FLOAT16, BFLOAT16 and
DOUBLE, per tensor, per axis and blocked.

Expected values follow DequantizeLinear's formula ``(code - zero_point) * scale`` with the result in the
scale's type. The documented arithmetic (docs/conformance.md, "Affine scales"): the exact product of the
integer ``code - zero_point`` and the scale's value, rounded once to the scale's type. Here it is computed in
float64, where every such product is exact for FLOAT, FLOAT16 and BFLOAT16 scales (at most 9 + 24
significant bits) and is the one correctly rounded product for DOUBLE scales. For the three types ONNX
admits, ``tests/test_conformance_coverage.py`` checks these values equal onnx's reference DequantizeLinear.

The scale values sit where reading them in the wrong type shows: a BFLOAT16 scale's bits read as FLOAT16
(or the reverse) give a different number, and a DOUBLE scale of 0.1 rounded to FLOAT first gives a
different product.
"""

from __future__ import annotations

import numpy as np

from . import builder
from .affine_sweep import packed
from .common import model

#: scale element type name -> (TensorProto data type, NumPy dtype name)
SCALE_TYPES = {"float": (1, "float32"), "float16": (10, "float16"), "bfloat16": (16, "bfloat16"),
               "double": (11, "float64")}

#: granularity -> (storage type, logical shape, axis, block size, codes, zero point, scale values)
GRANULARITIES = {
    # INT8 codes with a zero point of 3: (code - 3) runs from -131 to 124.
    "tensor": (3, (6,), None, None, [-128, -1, 0, 1, 127, 77], 3, 0.1),
    # UINT8 codes, per-column parameters on axis 1 of a [2, 3] value.
    "axis": (2, (2, 3), 1, None, [[0, 128, 255], [7, 200, 13]], [128, 0, 255], [0.1, 2.5, 0.003]),
    # INT4 codes in blocks of 2 along axis 1 of a [2, 4] value, no zero point.
    "block": (22, (2, 4), 1, 2, [[-8, 7, 1, -1], [3, -3, 0, 5]], None, [[0.1, 1.5], [0.3, 7.0]]),
    # INT2 codes (four a byte) per tensor, no zero point: a few codes of the narrowest type decoded straight
    # to the scale's type, the one combination whose per-byte table rows (four DOUBLE values) are 32 bytes.
    "two_bit": (26, (7,), None, None, [-2, -1, 0, 1, 1, 0, -2], None, 0.1),
}


def scale_array(scale_type: str, values) -> np.ndarray:
    from conformance.values import dtype_of

    return np.asarray(values, dtype=np.float64).astype(dtype_of(SCALE_TYPES[scale_type][1]))


def expected_values(codes: np.ndarray, zero_point, scale: np.ndarray, axis, block) -> np.ndarray:
    """(code - zero_point) * scale, exact in float64, rounded once to the scale's type."""
    diff = codes.astype(np.float64)
    wide = scale.astype(np.float64)
    if zero_point is not None:
        zp = np.asarray(zero_point, dtype=np.float64)
    if axis is None:
        result = (diff - (zp if zero_point is not None else 0)) * wide
    elif not block:
        shape = [1] * codes.ndim
        shape[axis] = codes.shape[axis]
        result = (diff - (zp.reshape(shape) if zero_point is not None else 0)) * wide.reshape(shape)
    else:
        per_element = np.repeat(wide, block, axis=axis).take(np.arange(codes.shape[axis]), axis=axis)
        offset = 0 if zero_point is None else \
            np.repeat(zp, block, axis=axis).take(np.arange(codes.shape[axis]), axis=axis)
        result = (diff - offset) * per_element
    return result.astype(scale.dtype)


def scale_tensor(scale: np.ndarray, data_type: int, shape):
    """The scale as a TensorProto in the field ONNX uses for its type (bit patterns for 16-bit floats)."""
    from reference_impl import schema

    tensor = schema.TensorProto(data_type=data_type, dims=list(shape))
    flat = scale.reshape(-1)
    if data_type == 1:
        tensor.float_data.extend(flat.tolist())
    elif data_type == 11:
        tensor.double_data.extend(flat.tolist())
    else:
        tensor.int32_data.extend(flat.view(np.uint16).astype(np.int32).tolist())
    return tensor


@builder
def affine_scale(scale_type: str, granularity: str):
    """One affine value ``w`` with a ``scale_type`` scale at the given granularity; ``expected`` by formula."""
    from reference_impl import schema

    storage, shape, axis, block, codes, zero_point, scales = GRANULARITIES[granularity]
    data_type = SCALE_TYPES[scale_type][0]
    codes = np.asarray(codes, dtype=np.int64)
    scale = scale_array(scale_type, scales)
    value = schema.EncodedValueProto(name="w", raw_data=packed(codes, storage))
    layout = value.affine
    layout.storage_type = storage
    layout.scale.CopyFrom(scale_tensor(scale, data_type, scale.shape))
    if zero_point is not None:
        zp = np.asarray(zero_point, dtype=np.int64)
        layout.zero_point.data_type = storage
        layout.zero_point.dims.extend(zp.shape if axis is not None else ())
        layout.zero_point.raw_data = packed(zp, storage)
    if axis is not None:
        layout.axis = axis
    if block:
        layout.block_size = block
    logical = value.logical_type.tensor_type
    logical.elem_type = data_type
    logical.shape.SetInParent()
    for dim in shape:
        logical.shape.dim.add(dim_value=dim)
    m = model(f"affine_{scale_type}_{granularity}")
    m.graph.encoded_initializer.append(value)
    return {"model": m, "expected": expected_values(codes, zero_point, scale, axis, block),
            "codes": codes, "zero_point": zero_point, "scale": scale, "axis": axis, "block": block}
