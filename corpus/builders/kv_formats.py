"""K/V block formats written from the spec and docs/kv.md in NumPy, for expected values that do not
come from the oracle: each encoder returns the block's EncodedValueProto (header and payload) and the
values a correct consumer decodes from it.

* ``dense``: the FLOAT tensor itself (no encoded value).
* affine (``int8``, ``uint8``, ``int4``, ``uint4``, ``int2``, ``uint2``, optional ``/group``): the built-in
  affine branch along head_size (axis 2) with one scale per group; signed types are symmetric
  (scale = max|x| / max code), unsigned types add a zero point covering [min(x, 0), max(x, 0)]. Codes
  are QuantizeLinear's (round half to even, saturate) and decode as DequantizeLinear: (code - zp) * scale.
* ``codebook2``: the spec's SCALED_CODEBOOK2_BLOCK_32 (1102 -> 1101), records of 32 two-bit indices
  (least-significant pair first) then a FLOAT scale; a value is codebook[index] * scale with the
  codebook [-1, -0.25, 0.25, 1] of type 1101.
"""

from __future__ import annotations

import numpy as np

from reference_impl import schema

from .common import add_float_logical, pack_crumbs, pack_nibbles

SCALED_CODEBOOK2_BLOCK_32 = 1102
CODEBOOK = np.array([-1.0, -0.25, 0.25, 1.0], np.float32)
#: name -> (TensorProto data type, bit width, lowest code, highest code)
AFFINE = {"int8": (3, 8, -128, 127), "uint8": (2, 8, 0, 255), "int4": (22, 4, -8, 7), "uint4": (21, 4, 0, 15),
          "int2": (26, 2, -2, 1), "uint2": (25, 2, 0, 3)}
FORMATS = ("dense", *AFFINE, "codebook2")


def pack(codes: np.ndarray, width: int) -> bytes:
    """Codes in row-major order, sub-byte widths packed least-significant first (two's complement)."""
    codes = np.asarray(codes, np.int64).reshape(-1)
    if width == 8:
        return (codes & 0xFF).astype(np.uint8).tobytes()
    return pack_nibbles(codes) if width == 4 else pack_crumbs(codes)


def float_tensor(array: np.ndarray):
    """A FLOAT TensorProto of ``array`` (raw little-endian data)."""
    return _tensor(array, 1)


def _tensor(array: np.ndarray, data_type: int, width: int | None = None):
    tensor = schema.TensorProto(data_type=data_type, dims=list(array.shape))
    tensor.raw_data = array.astype("<f4").tobytes() if width is None else pack(array, width)
    return tensor


def affine_parameters(groups: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-group float32 scale (and int64 zero point for unsigned types) over the last axis."""
    _, _, low, high = AFFINE[fmt]
    if low < 0:
        amax = np.max(np.abs(groups), axis=-1)
        return np.where(amax > 0, amax / np.float32(high), np.float32(1)).astype(np.float32), None
    lo = np.minimum(np.min(groups, axis=-1), np.float32(0))
    hi = np.maximum(np.max(groups, axis=-1), np.float32(0))
    scale = np.where(hi > lo, (hi - lo) / np.float32(high - low), np.float32(1)).astype(np.float32)
    return scale, np.clip(np.rint(low - lo / scale), low, high).astype(np.int64)


def encode(x: np.ndarray, fmt: str):
    """(block value, decoded float32 values) of a FLOAT[tokens, heads, size] block: the block value is an
    EncodedValueProto with raw_data, or for ``dense`` the float32 tensor itself."""
    x = np.ascontiguousarray(x, np.float32)
    name, _, group_text = fmt.partition("/")
    if name == "dense":
        return x.copy(), x.copy()
    value = schema.EncodedValueProto()
    add_float_logical(value, x.shape)
    if name == "codebook2":
        groups = x.reshape(-1, 32)
        scale = np.max(np.abs(groups), axis=1).astype(np.float32)
        normalized = groups / np.where(scale > 0, scale, np.float32(1))[:, None]
        index = np.argmin(np.abs(normalized[:, :, None] - CODEBOOK), axis=2)
        records = [pack(row, 2) + np.float32(s).astype("<f4").tobytes() for row, s in zip(index, scale)]
        value.struct_type.type_ref = SCALED_CODEBOOK2_BLOCK_32
        value.raw_data = b"".join(records)
        return value, (CODEBOOK[index] * scale[:, None]).astype(np.float32).reshape(x.shape)
    data_type, width, low, high = AFFINE[name]
    tokens, heads, size = x.shape
    group = int(group_text) if group_text else size
    if size % group:
        raise ValueError(f"head size {size} is not a multiple of the group {group}")
    scale, zero_point = affine_parameters(x.reshape(tokens, heads, size // group, group), name)
    full_scale = np.repeat(scale, group, axis=2)
    full_zero = np.zeros_like(x, np.int64) if zero_point is None else np.repeat(zero_point, group, axis=2)
    codes = np.clip(np.rint(x / full_scale).astype(np.int64) + full_zero, low, high)
    layout = value.affine
    layout.storage_type = data_type
    layout.scale.CopyFrom(_tensor(scale, 1))
    if zero_point is not None:
        layout.zero_point.CopyFrom(_tensor(zero_point, data_type, width))
    layout.axis = 2
    layout.block_size = group
    value.raw_data = pack(codes, width)
    return value, ((codes - full_zero).astype(np.float32) * full_scale).astype(np.float32)


def dequantize_affine(value) -> np.ndarray:
    """Decode an affine block header + payload with the formula alone (for cross-checks in tests)."""
    layout = value.affine
    data_type = layout.storage_type
    name = next(k for k, v in AFFINE.items() if v[0] == data_type)
    _, width, low, _ = AFFINE[name]
    shape = tuple(d.dim_value for d in value.logical_type.tensor_type.shape.dim)
    count = int(np.prod(shape))
    codes = _unpack(value.raw_data, width, low < 0, count).reshape(shape)
    scale = np.frombuffer(layout.scale.raw_data, "<f4").reshape(tuple(layout.scale.dims))
    zero = np.zeros(scale.shape, np.int64)
    if layout.HasField("zero_point"):
        zero = _unpack(layout.zero_point.raw_data, width, low < 0, scale.size).reshape(scale.shape)
    group = layout.block_size
    return ((codes - np.repeat(zero, group, axis=2)).astype(np.float32)
            * np.repeat(scale, group, axis=2)).astype(np.float32)


def _unpack(data: bytes, width: int, signed: bool, count: int) -> np.ndarray:
    raw = np.frombuffer(data, np.uint8)
    if width == 8:
        return raw.view(np.int8 if signed else np.uint8).astype(np.int64)[:count]
    per = 8 // width
    codes = ((raw[:, None] >> (np.arange(per) * width)) & ((1 << width) - 1)).astype(np.int64).reshape(-1)[:count]
    return np.where(codes >= 1 << (width - 1), codes - (1 << width), codes) if signed else codes
