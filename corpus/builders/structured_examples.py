"""Builders for the spec's worked examples at full size, and for deep declaration chains.

Expected values follow the spec's formulas with NumPy: Int4Block decodes signed codes times the
record's scale; the linear types decode (code - zero_point) * scale; the codebook parent decodes
scale * codebook[index].
"""

from __future__ import annotations

import numpy as np

from . import builder
from .common import encoded, model, pack_crumbs, pack_nibbles, spec_catalogue


@builder
def reference_chain(depth: int):
    """Types 1..depth where type k holds one UINT8 and a reference to type k+1; type ``depth`` is a leaf.
    The root record is ``depth`` bytes; one record of zeros is the payload."""
    from reference_impl import schema

    m = model("chain")
    for k in range(1, depth + 1):
        decl = m.struct_types.add(type_id=k)
        decl.structure.field.add(name="b").type.tensor_type.elem_type = 2
        decl.structure.field[0].type.tensor_type.shape.SetInParent()
        if k < depth:
            decl.structure.field.add(name="next").type.struct_type.type_ref = k + 1
    value = schema.EncodedValueProto(name="v", raw_data=bytes(depth))
    value.struct_type.type_ref = 1
    m.graph.encoded_initializer.append(value)
    return {"model": m}


def _int4_blocks(records: int, seed: int):
    """Payload, the decoded values our Int4Block decoder gives (signed code times the record's scale,
    blocks in storage order: a decoder-defined mapping), and the fields generic access reads."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-8, 8, size=(records, 32))
    scales = (rng.random(records) + 0.5).astype("<f4")
    payload = b"".join(pack_nibbles(codes[r]) + scales[r:r + 1].tobytes() for r in range(records))
    expected = (codes.astype(np.float32) * scales[:, None]).reshape(-1)
    return payload, expected, {"codes": codes.astype(np.int64), "scale": scales.astype(np.float32)}


@builder
def spec_int4_block(records: int, seed: int = 2001, logical: int | None = None):
    """Type 2001 with ``records`` records of 16 code bytes then a FLOAT scale (20 bytes each)."""
    payload, expected, fields = _int4_blocks(records, seed)
    m = model("int4_block")
    m.struct_types.extend(spec_catalogue())
    m.graph.encoded_initializer.append(encoded("v", 2001, payload, [logical or records * 32]))
    return {"model": m, "expected": expected, "fields": fields}


@builder
def spec_two_lengths(seed: int = 2001):
    """Two values of type 2001 with 128 and 256 records: one type, two payload lengths."""
    a, expected_a, _ = _int4_blocks(128, seed)
    b, expected_b, fields_b = _int4_blocks(256, seed + 1)
    m = model("two_lengths")
    m.struct_types.extend(spec_catalogue())
    m.graph.encoded_initializer.extend([encoded("a", 2001, a, [4096]), encoded("b", 2001, b, [8192])])
    return {"model": m, "expected": expected_b, "expected_a": expected_a, "fields": fields_b}


@builder
def spec_linear(type_id: int, scale: float = 0.25, zero_point: int = -2, seed: int = 1003):
    """Type 1003 (constants 0.25 and -2, 64 code bytes) or 1002 (64 code bytes, FLOAT scale at byte 64,
    INT64 zero point at the unaligned byte 68)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-8, 8, size=128)
    payload = pack_nibbles(codes)
    if type_id == 1002:
        payload += np.array([scale], "<f4").tobytes() + np.array([zero_point], "<i8").tobytes()
    else:
        scale, zero_point = 0.25, -2  # the declaration's constants
    m = model("linear")
    m.struct_types.extend(spec_catalogue())
    m.graph.encoded_initializer.append(encoded("v", type_id, payload, [128]))
    expected = ((codes - zero_point) * np.float32(scale)).astype(np.float32)
    return {"model": m, "expected": expected}


@builder
def spec_codebook(records: int, seed: int = 1102):
    """Type 1102: per record 8 bytes of 2-bit indices and a FLOAT scale (12 bytes)."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, 4, size=(records, 32))
    scales = (rng.random(records) + 0.5).astype("<f4")
    payload = b"".join(pack_crumbs(index[r]) + scales[r:r + 1].tobytes() for r in range(records))
    table = np.array([-1.0, -0.25, 0.25, 1.0], dtype=np.float32)
    m = model("codebook")
    m.struct_types.extend(spec_catalogue())
    m.graph.encoded_initializer.append(encoded("v", 1102, payload, [records * 32]))
    return {"model": m, "expected": (scales[:, None] * table[index]).reshape(-1)}
