"""Helpers shared by builders: model skeletons and little-endian packing written from the spec."""

from __future__ import annotations

import numpy as np

from reference_impl import schema

#: The IR version case models declare: 13 is the first with every element type the contract uses (INT2 and
#: UINT2; FLOAT4E2M1 came with 11, FLOAT8E8M0 with 12), so a runtime that checks types against it accepts them.
IR_VERSION = 13


def model(name: str = "built", opset: int = 23):
    m = schema.ModelProto(ir_version=IR_VERSION)
    m.opset_import.add(domain="", version=opset)
    m.graph.name = name
    return m


def pack_nibbles(codes) -> bytes:
    """Two 4-bit codes per byte, the first in the low nibble (the spec's TensorProto.raw_data packing)."""
    codes = np.asarray(codes, dtype=np.int64).reshape(-1) & 0xF
    if codes.size % 2:
        codes = np.append(codes, 0)
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8).tobytes()


def pack_crumbs(codes) -> bytes:
    """Four 2-bit codes per byte, least-significant pair first."""
    codes = np.asarray(codes, dtype=np.int64).reshape(-1) & 0x3
    pad = (-codes.size) % 4
    codes = np.append(codes, np.zeros(pad, dtype=np.int64)).reshape(-1, 4)
    return (codes[:, 0] | codes[:, 1] << 2 | codes[:, 2] << 4 | codes[:, 3] << 6).astype(np.uint8).tobytes()


def add_float_logical(value, dims) -> None:
    tensor = value.logical_type.tensor_type
    tensor.elem_type = 1
    tensor.shape.SetInParent()
    for dim in dims:
        tensor.shape.dim.add(dim_value=int(dim))


def spec_catalogue():
    """The spec's worked catalogue, read from the corpus's own template (one source of truth)."""
    import pathlib

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    path = pathlib.Path(__file__).resolve().parents[1] / "cases" / "_templates.toml"
    text = tomllib.loads(path.read_text())["templates"]["spec_catalogue"]
    return list(schema.parse_text(text, "ModelProto").struct_types)


def encoded(name: str, type_ref: int, payload: bytes, logical_dims=None):
    value = schema.EncodedValueProto(name=name, raw_data=payload)
    value.struct_type.type_ref = type_ref
    if logical_dims is not None:
        add_float_logical(value, logical_dims)
    return value
