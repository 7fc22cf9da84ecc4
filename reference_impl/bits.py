"""Vectorized bit-field extraction: bits least-significant first, multi-byte values little-endian.

Two primitives serve every decoder: ``unpack_elements`` turns a tightly packed run of leaves (the
TensorProto.raw_data packing) into NumPy values, and ``read_bits`` gathers arbitrary bit fields at
computed bit positions from a byte buffer. Neither loops in Python over elements.
"""

from __future__ import annotations

import numpy as np

from reference_impl import dtypes

_SUB_BYTE_INTS = {dtypes.UINT4, dtypes.INT4, dtypes.UINT2, dtypes.INT2}


def sign_extend(values: np.ndarray, width: int) -> np.ndarray:
    """Interpret unsigned ``width``-bit integers as two's complement signed values (int64)."""
    values = values.astype(np.int64, copy=False)
    if width >= 64:
        return values
    sign = np.int64(1) << np.int64(width - 1)
    return (values ^ sign) - sign


def read_bits(buffer: np.ndarray, bit_positions: np.ndarray, width: int) -> np.ndarray:
    """Unsigned ``width``-bit fields (1..64) starting at each bit position of a uint8 buffer.

    Every position must satisfy ``position + width <= 8 * len(buffer)``; callers check the extent first.
    Returns uint64 values of the same shape as ``bit_positions``.
    """
    positions = np.asarray(bit_positions, dtype=np.uint64)
    padded = np.concatenate([buffer, np.zeros(9, dtype=np.uint8)])
    first = (positions >> np.uint64(3)).astype(np.intp)
    shift = (positions & np.uint64(7)).astype(np.uint64)
    window = np.zeros(positions.shape, dtype=np.uint64)
    # assemble the little-endian bytes a field can touch (shift + width bits, at most 8 of them); k bounds
    # a window, not the data
    for k in range(min(8, (width + 14) // 8)):
        window |= padded[first + k].astype(np.uint64) << np.uint64(8 * k)
    low = window >> shift
    if width + 7 > 64:  # the field may spill into a ninth byte
        ninth = padded[first + 8].astype(np.uint64)
        spill = np.where(shift > 0, ninth << ((np.uint64(64) - shift) & np.uint64(63)), np.uint64(0))
        low = low | spill
    if width == 64:
        return low
    return low & np.uint64((1 << width) - 1)


def unsigned_to_leaf(values: np.ndarray, elem_type: int) -> np.ndarray:
    """Raw little-endian bit patterns (uint64) to the leaf's NumPy values."""
    width = dtypes.BIT_WIDTH[elem_type]
    if elem_type in dtypes.SIGNED_INTEGERS:
        return sign_extend(values, width).astype(dtypes.NUMPY_DTYPE[elem_type])
    if elem_type in dtypes.UNSIGNED_INTEGERS:
        return values.astype(dtypes.NUMPY_DTYPE[elem_type])
    if elem_type == dtypes.BOOL:
        return values != 0
    if elem_type in (dtypes.COMPLEX64, dtypes.COMPLEX128):
        raise ValueError("complex leaves are read as byte-aligned views")
    storage = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}.get(width, np.uint8)
    return values.astype(storage).view(dtypes.NUMPY_DTYPE[elem_type])


def unpack_elements(data: np.ndarray, elem_type: int, count: int) -> np.ndarray:
    """``count`` leaves packed tightly from bit 0 of ``data`` (the TensorProto.raw_data packing)."""
    width = dtypes.BIT_WIDTH[elem_type]
    if width % 8 == 0:
        itemsize = width // 8
        raw = np.ascontiguousarray(data[: count * itemsize])
        if elem_type == dtypes.BOOL:
            return raw.view(np.uint8) != 0
        return raw.view(dtypes.NUMPY_DTYPE[elem_type])
    if elem_type in _SUB_BYTE_INTS:
        return unpack_sub_byte(data, width, count, elem_type in dtypes.SIGNED_INTEGERS)
    positions = np.arange(count, dtype=np.uint64) * np.uint64(width)
    return unsigned_to_leaf(read_bits(data, positions, width), elem_type)


def unpack_sub_byte(data: np.ndarray, width: int, count: int, signed: bool) -> np.ndarray:
    """4- and 2-bit integer codes (int8 when ``signed``, else uint8), low bits first. Each byte is widened
    to a little-endian lane of ``8 // width`` bytes and its bit groups are shifted into bytes of their
    own: a few whole-array operations, however many codes."""
    per_byte = 8 // width
    nbytes = -(-count // per_byte)
    raw = np.asarray(data[:nbytes], dtype=np.uint8)
    lane = np.dtype("<u2") if per_byte == 2 else np.dtype("<u4")
    wide = raw.astype(lane)
    lanes = wide << (8 - width)  # group g (bits g * width ..) moves to bit 8 * g of the lane
    lanes |= wide
    for group in range(2, per_byte):
        lanes |= wide << (group * (8 - width))
    lanes &= int.from_bytes(bytes([(1 << width) - 1]) * per_byte, "little")
    if not signed:
        return lanes.view(np.uint8)[:count]
    codes = lanes.view(np.int8)  # two's complement: (code ^ sign) - sign
    sign = 1 << (width - 1)
    codes ^= sign
    codes -= sign
    return codes[:count]


def pack_sub_byte(codes: np.ndarray, width: int) -> bytes:
    """Inverse of unpack_sub_byte: low bits first, unused final high bits zero."""
    per_byte = 8 // width
    flat = (np.asarray(codes).astype(np.int64).reshape(-1) & ((1 << width) - 1)).astype(np.uint8)
    padded = np.zeros(-(-flat.size // per_byte) * per_byte, dtype=np.uint8)
    padded[: flat.size] = flat
    grouped = padded.reshape(-1, per_byte)
    shifts = np.arange(0, 8, width, dtype=np.uint8)
    return np.bitwise_or.reduce(grouped << shifts[None, :], axis=1).astype(np.uint8).tobytes()
