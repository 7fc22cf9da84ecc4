"""The spec's worked examples as messages: the catalogue of types 2001, 1002, 1003, 1101 and 1102 and a
model with one encoded value per example. Tests, the demonstration command and conformance cases share
them so every figure quoted by the spec is checked against the same declarations.
"""

from __future__ import annotations

import functools

import numpy as np

from reference_impl import dtypes, schema
from reference_impl.bits import pack_sub_byte

CATALOGUE_TEXT = """
struct_types {
  type_id: 2001
  name: "Int4Block"
  structure {
    field { name: "codes" type { tensor_type { elem_type: 22 shape { dim { dim_value: 32 } } } } }
    field { name: "scale" type { tensor_type { elem_type: 1 shape { } } } }
  }
}
struct_types {
  type_id: 1003
  name: "LINEAR_INT4_128_FIXED_PARAMETERS"
  structure {
    field {
      name: "values"
      type { struct_type { array { element_type { tensor_type { elem_type: 22 shape { } } } dimension: 128 } } }
    }
    field { name: "scale" constant { data_type: 1 float_data: 0.25 } }
    field { name: "zero_point" constant { data_type: 7 int64_data: -2 } }
  }
  decoder { name: "DecodeLinearInt4" }
}
struct_types {
  type_id: 1002
  name: "LINEAR_INT4_128_WITH_PARAMETERS"
  structure {
    field {
      name: "values"
      type { struct_type { array { element_type { tensor_type { elem_type: 22 shape { } } } dimension: 128 } } }
    }
    field { name: "scale" type { tensor_type { elem_type: 1 shape { } } } }
    field { name: "zero_point" type { tensor_type { elem_type: 7 shape { } } } }
  }
  decoder { name: "DecodeLinearInt4" }
}
struct_types {
  type_id: 1101
  name: "CODEBOOK2_BLOCK_32"
  structure {
    field {
      name: "codes"
      type { struct_type { bit_packing { component { name: "index" bit_width: 2 } dimension: 32 } } }
    }
    field { name: "codebook" constant { dims: 4 data_type: 1 float_data: [-1.0, -0.25, 0.25, 1.0] } }
  }
}
struct_types {
  type_id: 1102
  name: "SCALED_CODEBOOK2_BLOCK_32"
  structure {
    field { name: "quantized" type { struct_type { type_ref: 1101 } } }
    field { name: "scale" type { tensor_type { elem_type: 1 shape { } } } }
  }
  decoder { name: "DecodeScaledCodebookBlocks" }
}
"""


def spec_struct_types() -> list:
    """Fresh copies of the spec's catalogue declarations (the text is parsed once: parsing protobuf text
    takes a thousand times as long as copying the messages)."""
    catalogue = type(_catalogue())()
    catalogue.CopyFrom(_catalogue())
    return list(catalogue.struct_types)


@functools.cache
def _catalogue():
    return schema.parse_text(CATALOGUE_TEXT)


def _logical(value, dims: list[int]) -> None:
    tensor = value.logical_type.tensor_type
    tensor.elem_type = dtypes.FLOAT
    tensor.shape.SetInParent()
    for dim in dims:
        tensor.shape.dim.add(dim_value=dim)


def encoded(name: str, type_id: int, payload: bytes, logical_dims: list[int] | None):
    value = schema.EncodedValueProto(name=name, raw_data=payload)
    value.struct_type.type_ref = type_id
    if logical_dims is not None:
        _logical(value, logical_dims)
    return value


def int4_block_payload(codes: np.ndarray, scales: np.ndarray) -> bytes:
    """Records of 16 bytes of INT4 codes (low nibble first) then a little-endian FLOAT scale."""
    codes = np.asarray(codes).reshape(-1, 32)
    packed = np.frombuffer(pack_sub_byte(codes, 4), np.uint8).reshape(-1, 16)
    scale_bytes = np.asarray(scales, "<f4").reshape(-1, 1).view(np.uint8)
    return np.hstack([packed, scale_bytes]).tobytes()


def linear_int4_with_parameters_payload(codes: np.ndarray, scale: float, zero_point: int) -> bytes:
    """Type 1002: 64 code bytes, FLOAT scale at byte 64, INT64 zero_point at (unaligned) byte 68."""
    return pack_sub_byte(np.asarray(codes), 4) + np.array([scale], "<f4").tobytes() + \
        np.array([zero_point], "<i8").tobytes()


def spec_example_model():
    """A model holding the spec's example values (catalogue order as written in the spec)."""
    model = schema.ModelProto(ir_version=10)
    model.opset_import.add(domain="", version=23)
    model.struct_types.extend(spec_struct_types())
    graph = model.graph
    graph.name = "spec_examples"
    rng = np.random.default_rng(2001)
    codes_a = rng.integers(-8, 8, size=4096)
    codes_b = rng.integers(-8, 8, size=8192)
    graph.encoded_initializer.extend([
        encoded("int4_block_4096", 2001, int4_block_payload(codes_a, rng.random(128) + 0.5), [4096]),
        encoded("int4_block_8192", 2001, int4_block_payload(codes_b, rng.random(256) + 0.5), [8192]),
        encoded("weight_a", 1003, pack_sub_byte(rng.integers(-8, 8, size=128), 4), [128]),
        encoded("weight_b", 1003, pack_sub_byte(rng.integers(-8, 8, size=128), 4), [128]),
        encoded("weight_c", 1002, linear_int4_with_parameters_payload(rng.integers(-8, 8, 128), 0.125, 0),
                [128]),
        encoded("weight_d", 1002, linear_int4_with_parameters_payload(rng.integers(-8, 8, 128), 0.25, -2),
                [128]),
        encoded("codebook_32", 1102, bytes([0xE4] * 8 + [0x00, 0x00, 0x00, 0x40]), [32]),
        encoded("codebook_4096", 1102, _codebook_payload(rng, 128), [4096]),
    ])
    return model


def _codebook_payload(rng, records: int) -> bytes:
    indices = rng.integers(0, 4, size=(records, 32))
    packed = np.frombuffer(pack_sub_byte(indices, 2), np.uint8).reshape(-1, 8)
    scales = (rng.random(records) + 0.5).astype("<f4").reshape(-1, 1).view(np.uint8)
    return np.hstack([packed, scales]).tobytes()
