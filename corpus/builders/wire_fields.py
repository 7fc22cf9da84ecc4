"""Hand-encoded models for the second wire-numbering cases: every field of AffineLayoutProto, and the
spec's codebook catalogue written StructTypeProto field by field. Bytes come from the field numbers the
spec freezes (conformance/wire.py), never from the extended schema; expected values from the spec's
formulas."""

from __future__ import annotations

import numpy as np

from conformance.wire import field, field_varint

from . import builder
from .affine_scales import expected_values
from .common import IR_VERSION, pack_nibbles
from .wire import _float_tensor_type, string


def _tensor(data_type: int, dims, payload: bytes) -> bytes:
    """TensorProto{dims (1), data_type (2), raw_data (9)}."""
    return b"".join(field_varint(1, d) for d in dims) + field_varint(2, data_type) + field(9, payload)


def _model(graph: bytes, declarations: bytes = b"") -> bytes:
    """ModelProto{ir_version (1), opset_import (8), graph (7), struct_types (1000)...}."""
    return field_varint(1, IR_VERSION) + field(8, field_varint(2, 23)) + field(7, graph) + declarations


@builder
def hand_encoded_blocked_affine():
    """An affine value using every AffineLayoutProto field: storage_type INT4 (1), a [2, 2] FLOAT scale (2),
    an INT4 zero point (3), axis 1 (4) and block_size 2 (5), over INT4 codes of a [2, 4] logical value."""
    codes = np.array([[-8, 7, 1, -1], [3, -3, 0, 5]], dtype=np.int64)
    zero_point = np.array([[1, -2], [0, 3]], dtype=np.int64)
    scale = np.array([[0.5, 0.25], [2.0, 1.5]], dtype=np.float32)
    layout = (field_varint(1, 22) + field(2, _tensor(1, [2, 2], scale.astype("<f4").tobytes()))
              + field(3, _tensor(22, [2, 2], pack_nibbles(zero_point))) + field_varint(4, 1) + field_varint(5, 2))
    value = (field(1, layout) + field(3, _float_tensor_type([2, 4])) + field(4, pack_nibbles(codes))
             + string(7, "w") + string(8, "every affine field"))
    graph = string(2, "hand") + field(1000, value)
    return {"model": _model(graph), "expected": expected_values(codes, zero_point, scale, 1, 2)}


def _field_type(name: str, type_bytes: bytes) -> bytes:
    """Structure.Field{name (1), type (2)}."""
    return field(1, string(1, name) + field(2, type_bytes))


@builder
def hand_encoded_codebook():
    """The spec's CODEBOOK2_BLOCK_32 (1101) and SCALED_CODEBOOK2_BLOCK_32 (1102) as StructTypeProto bytes:
    bit_packing (3) with a component (name 1, bit_width 2) and dimension (2), a constant field (4), a type_ref
    (4) inside a field type, the decoder (5), name (7) and type_id (10); then the spec's first value."""
    component = field(1, string(1, "index") + field_varint(2, 2))
    codes_type = field(1000, field(3, component + field_varint(2, 32)))  # TypeProto.struct_type: bit_packing
    codebook = field(1, string(1, "codebook") + field(4, _tensor(1, [4], np.array(
        [-1.0, -0.25, 0.25, 1.0], "<f4").tobytes())))
    subtype = field_varint(10, 1101) + string(7, "CODEBOOK2_BLOCK_32") + field(2, _field_type("codes", codes_type)
                                                                                + codebook)
    scalar_float = field(1, field_varint(1, 1) + field(2, b""))
    fields = _field_type("quantized", field(1000, field_varint(4, 1101))) + _field_type("scale", scalar_float)
    parent = (field_varint(10, 1102) + string(7, "SCALED_CODEBOOK2_BLOCK_32") + field(2, fields)
              + field(5, string(1, "DecodeScaledCodebookBlocks")))
    value = (field(2, field_varint(4, 1102)) + field(3, _float_tensor_type([32]))
             + field(4, bytes([0xE4] * 8) + np.array([2.0], "<f4").tobytes()) + string(7, "v"))
    graph = string(2, "hand") + field(1000, value)
    return {"model": _model(graph, field(1000, parent) + field(1000, subtype)),
            "expected": np.tile(np.array([-2.0, -0.5, 0.5, 2.0], np.float32), 8)}
