"""Affine values past any internal chunk: sizes past any internal chunk a runtime could tile, slab, page or
thread its decoding by (SIMD widths, 64 KiB and 1 MiB chunks, 2^16, 2^20 and 2^24 elements), with odd
element counts, so every power-of-two chunk size leaves a non-empty partial last piece.

Every element's expected value depends on its position: the codes repeat with a prime period (``PERIOD``)
that divides no power of two, the per-axis and blocked parameters (scale and zero point) differ for every
axis index up to 8191 and repeat with prime periods beyond, so a dropped, duplicated or shifted chunk, a
parameter index that restarts after the first chunk, or a packing order error in the tail changes values.

Expected values come from the formulas below, written from the spec (DequantizeLinear's
``(code - zero_point) * scale``, rounded once to the scale's type; four- and two-bit codes packed from the
least-significant bits), never from the oracle: the case states the SHA-256 of the whole expected value
(``values_digest``, computed by ``expected_digest``) and the builder adds the expected elements at the
standard sample positions (conformance/digests.py).
"""

from __future__ import annotations

import math

import numpy as np

from conformance.digests import Digest, sample_indices
from reference_impl import schema

from . import builder
from .common import model

#: The codes' period: a prime, so no power-of-two shift maps the pattern onto itself.
PERIOD = 10007
RANGES = {3: (-128, 127), 2: (0, 255), 22: (-8, 7), 21: (0, 15), 26: (-2, 1), 25: (0, 3)}
WIDTH = {3: 8, 2: 8, 22: 4, 21: 4, 26: 2, 25: 2}
#: scale_type -> the output (and scale) dtype: DequantizeLinear's result has the scale's type
OUTPUT = {1: np.dtype(np.float32), 10: np.dtype(np.float16)}
#: Bytes of other data in front of an external payload, when a case does not say.
FILLER = 0x5A


# ------------------------------------------------------------------------------------------ formulas
def code_at(index: np.ndarray, storage: int) -> np.ndarray:
    """The code of flat element ``index``: a quadratic residue pattern of period ``PERIOD``, offset by the
    storage type's number (so a signed type and its unsigned twin decode to different values), in the
    storage type's range."""
    low, high = RANGES[storage]
    j = np.asarray(index, dtype=np.int64) % PERIOD
    return low + ((7 * j * j + 3 * j + 1) % PERIOD + storage) % (high - low + 1)


def scale_at(p: np.ndarray, scale_type: int) -> np.ndarray:
    """The scale of flat parameter index ``p``: positive normal numbers, distinct for 8191 consecutive
    indices (their bit patterns step through a permutation of 0..8190)."""
    step = (np.asarray(p, dtype=np.int64) * 1237 + 611) % 8191
    if scale_type == 10:
        return (0x1400 + step).astype(np.uint16).view(np.float16)
    return (0x3A800000 + step * 1021).astype(np.uint32).view(np.float32)


def zero_point_at(p: np.ndarray, storage: int) -> np.ndarray:
    """The zero point of flat parameter index ``p``: period 251 (a prime) within the storage range."""
    low, high = RANGES[storage]
    return low + (np.asarray(p, dtype=np.int64) * 37 + 11) % 251 % (high - low + 1)


def parameter_shape(shape: tuple[int, ...], axis: int | None, block: int | None) -> tuple[int, ...]:
    """DequantizeLinear's parameter shape: scalar, [shape[axis]], or shape with ceil(dim / block) along axis."""
    if axis is None:
        return ()
    if not block:
        return (shape[axis],)
    blocked = list(shape)
    blocked[axis] = -(-shape[axis] // block)
    return tuple(blocked)


def parameter_index(index: np.ndarray, shape: tuple[int, ...], axis: int | None, block: int | None) -> np.ndarray:
    """The flat parameter index of flat element ``index``: element (outer, a, inner) around the axis uses
    parameter a (per axis) or (outer, a // block, inner) (blocked)."""
    index = np.asarray(index, dtype=np.int64)
    if axis is None:
        return np.zeros_like(index)
    dim, inner = shape[axis], math.prod(shape[axis + 1:])
    position = index // inner % dim
    if not block:
        return position
    blocks = -(-dim // block)
    return (index // (dim * inner) * blocks + position // block) * inner + index % inner


def expected_at(index: np.ndarray, storage: int, shape, axis=None, block=None, scale_type: int = 1,
                zero_point: bool = True) -> np.ndarray:
    """The decoded value of flat element ``index``: (code - zero_point) * scale, exact in float64 (a code
    difference of at most 9 bits times a 24-bit significand), then rounded once to the output type."""
    p = parameter_index(index, tuple(shape), axis, block)
    difference = code_at(index, storage) - (zero_point_at(p, storage) if zero_point else 0)
    return (difference * scale_at(p, scale_type).astype(np.float64)).astype(OUTPUT[scale_type])


def expected_digest(storage: int, shape, axis=None, block=None, scale_type: int = 1, zero_point: bool = True,
                    external: dict | None = None, part: int = 1 << 20) -> str:
    """SHA-256 of the whole expected value (conformance/digests.py), computed ``part`` elements at a time."""
    count = math.prod(shape)
    digest = Digest(OUTPUT[scale_type])
    for start in range(0, count, part):
        digest.update(expected_at(np.arange(start, min(start + part, count)), storage, shape, axis, block,
                                  scale_type, zero_point))
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------ packing
def pack(codes: np.ndarray, width: int) -> np.ndarray:
    """Codes packed as TensorProto.raw_data packs them: 8-bit codes as bytes, four- and two-bit codes two or
    four to a byte starting with the least-significant bits, unused final high bits zero."""
    codes = np.asarray(codes, dtype=np.int64).reshape(-1) & ((1 << width) - 1)
    per_byte = 8 // width
    padded = np.zeros(-(-codes.size // per_byte) * per_byte, np.uint8)
    padded[:codes.size] = codes
    padded = padded.reshape(-1, per_byte)
    packed = np.zeros(padded.shape[0], np.uint8)
    for slot in range(per_byte):
        packed |= padded[:, slot] << (width * slot)
    return packed


def packed_codes(storage: int, count: int) -> np.ndarray:
    """The packed codes of ``count`` elements. The codes repeat every ``PERIOD`` elements, so their bytes
    repeat every ``PERIOD`` bytes: one period is packed and tiled, then the unused bits of a partial last
    byte are cleared (the result equals ``pack(code_at(arange(count)))``)."""
    width = WIDTH[storage]
    per_byte = 8 // width
    period = pack(code_at(np.arange(per_byte * PERIOD), storage), width)
    nbytes = -(-count * width // 8)
    data = np.tile(period, -(-nbytes // PERIOD))[:nbytes]
    used = count % per_byte
    if used:
        data[-1] &= (1 << (width * used)) - 1
    return data


def _scale_tensor(p: np.ndarray, scale_type: int):
    values = scale_at(p, scale_type)
    return schema.TensorProto(data_type=scale_type, dims=list(p.shape),
                              raw_data=values.astype(values.dtype.newbyteorder("<")).tobytes())


def affine_value(value, storage: int, shape, axis, block, scale_type: int, zero_point: bool):
    """Fill ``value`` (an EncodedValueProto) with the layout and logical type of the formulas above."""
    shape = tuple(shape)
    params = parameter_shape(shape, axis, block)
    p = np.arange(math.prod(params)).reshape(params)
    layout = value.affine
    layout.storage_type = storage
    layout.scale.CopyFrom(_scale_tensor(p, scale_type))
    if zero_point:
        codes = zero_point_at(p, storage)
        width = WIDTH[storage]
        raw = pack(codes, width) if width < 8 else codes.astype(np.int8 if storage == 3 else np.uint8)
        layout.zero_point.CopyFrom(schema.TensorProto(data_type=storage, dims=list(params), raw_data=raw.tobytes()))
    if axis is not None:
        layout.axis = axis
    if block:
        layout.block_size = block
    tensor = value.logical_type.tensor_type
    tensor.elem_type = scale_type
    tensor.shape.SetInParent()
    for dim in shape:
        tensor.shape.dim.add(dim_value=int(dim))


@builder
def affine_chunks(storage: int, shape: list, axis: int | None = None, block: int | None = None, scale_type: int = 1,
                  zero_point: bool = True, external: dict | None = None):
    """One affine value "w" of the formulas above: per tensor (no ``axis``), per axis, or blocked. With
    ``external = {offset}``, its payload sits at that byte offset of ``codes.bin`` behind filler bytes."""
    count = math.prod(shape)
    m = model("affine_chunks")
    value = m.graph.encoded_initializer.add(name="w")  # filled in place: appending would copy the payload
    affine_value(value, storage, shape, axis, block, scale_type, zero_point)
    payload = packed_codes(storage, count)
    files = {}
    if external is None:
        value.raw_data = payload.tobytes()
    else:
        offset = int(external["offset"])
        value.data_location = 1
        value.external_data.add(key="location", value="codes.bin")
        value.external_data.add(key="offset", value=str(offset))
        value.external_data.add(key="length", value=str(payload.size))
        files["codes.bin"] = bytes([FILLER]) * offset + payload.tobytes()
    index = sample_indices(count)
    samples = {"index": index, "values": expected_at(index, storage, shape, axis, block, scale_type, zero_point)}
    return {"model": m, "files": files, "samples": samples}
