"""The closed affine branch: INT8/UINT8/INT4/UINT4/INT2/UINT2 codes with per-tensor, per-axis or
blocked parameters, decoded exactly as ONNX DequantizeLinear: ``(code - zero_point) * scale``.

Decoding runs in cache-sized chunks, each written to the output once, so the extra memory is a few
chunks' scratch whatever the output's size; large values use every core.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from queue import Empty, SimpleQueue

import numpy as np

from reference_impl import dtypes
from reference_impl.bits import pack_sub_byte, unpack_sub_byte
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

STORAGE_TYPES = {dtypes.INT8, dtypes.UINT8, dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2}
SCALE_TYPES = {dtypes.FLOAT, dtypes.FLOAT16, dtypes.BFLOAT16, dtypes.DOUBLE}
#: DequantizeLinear's output_dtype (opset 23): the logical element type may be any of these whatever the
#: (equally DequantizeLinear-typed) scale is; a DOUBLE scale only decodes to DOUBLE.
OUTPUT_DTYPES = {dtypes.FLOAT, dtypes.FLOAT16, dtypes.BFLOAT16}
_RANGE = {dtypes.INT8: (-128, 127), dtypes.UINT8: (0, 255), dtypes.INT4: (-8, 7), dtypes.UINT4: (0, 15),
          dtypes.INT2: (-2, 1), dtypes.UINT2: (0, 3)}


def code_range(storage_type: int) -> tuple[int, int]:
    return _RANGE[storage_type]


def payload_bytes(storage_type: int, count: int) -> int:
    """ceil(n * bit_width(storage_type) / 8)."""
    return (count * dtypes.BIT_WIDTH[storage_type] + 7) // 8


def decode_cost(scale_type: int) -> int:
    """Bytes per logical element a decode is budgeted at (``records.check_budget``): a float32/float64
    working value, plus the converted output when the scale's type is narrower. Chunked decoding now
    allocates only the output and a few chunks' scratch; the budget, and so the limit, is unchanged."""
    work = 8 if scale_type == dtypes.DOUBLE else 4
    return work + (0 if scale_type in (dtypes.FLOAT, dtypes.DOUBLE) else dtypes.BIT_WIDTH[scale_type] // 8)


def normalize_axis(axis: int | None, rank: int, path: str) -> int | None:
    if axis is None:
        return None
    if not -rank <= axis < rank:
        raise violation(E.AFFINE_AXIS_INVALID, path, f"axis {axis} is outside [-{rank}, {rank})")
    return axis % rank


def parameter_shape(shape: tuple[int, ...], axis: int | None, block_size: int | None) -> tuple[int, ...]:
    """The scale/zero_point shape DequantizeLinear requires for this granularity."""
    if axis is None:
        return ()
    if not block_size:
        return (shape[axis],)
    blocked = list(shape)
    blocked[axis] = -(-shape[axis] // block_size)
    return tuple(blocked)


def _byte_lut(storage_type: int) -> np.ndarray:
    """For 4- and 2-bit codes: each byte value -> its codes (low bits first) as int8."""
    width = dtypes.BIT_WIDTH[storage_type]
    per_byte = 8 // width
    byte = np.arange(256, dtype=np.int64)[:, None]
    codes = (byte >> (np.arange(per_byte) * width)[None, :]) & ((1 << width) - 1)
    if storage_type in dtypes.SIGNED_INTEGERS:
        sign = 1 << (width - 1)
        codes = (codes ^ sign) - sign
    return codes.astype(np.int8)


_LUTS = {t: _byte_lut(t) for t in (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)}
#: Below this many codes one table gather per byte is fastest; above, shifting whole bytes apart
#: (``bits.unpack_sub_byte``) is.
_GATHER_CODES = 1 << 14
#: Bytes of one table row (all codes of a byte) -> the scalar type that gathers it in one step.
_ROW_TYPES = {2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.complex128}


def codes_as_float(raw: np.ndarray, storage_type: int, count: int, dtype: np.dtype) -> np.ndarray:
    """The first ``count`` codes of a packed payload as a new array of ``dtype``: a float type for the
    decoded values, or an integer type, which holds them exactly as well."""
    if storage_type in (dtypes.INT8, dtypes.UINT8):
        return raw[:count].view(np.int8 if storage_type == dtypes.INT8 else np.uint8).astype(dtype)
    per_byte = 8 // dtypes.BIT_WIDTH[storage_type]
    nbytes = -(-count // per_byte)
    if count >= _GATHER_CODES:
        codes = unpack_sub_byte(raw, dtypes.BIT_WIDTH[storage_type], count,
                                storage_type in dtypes.SIGNED_INTEGERS).view(np.int8)  # codes fit in int8
        return codes if codes.dtype == dtype else codes.astype(dtype)
    lut = _typed_lut(storage_type, np.dtype(dtype))
    # One gather per payload byte: each table row (all codes of one byte) is viewed as a single wide
    # scalar, so the gather allocates exactly the output once.
    row = _ROW_TYPES.get(per_byte * lut.itemsize)
    if row is None:
        return lut.take(raw[:nbytes], axis=0).reshape(-1)[:count]
    return lut.view(row).reshape(256).take(raw[:nbytes]).view(dtype)[:count]  # take: faster than indexing


@functools.lru_cache(maxsize=64)
def _typed_lut(storage_type: int, dtype: np.dtype) -> np.ndarray:
    lut = np.ascontiguousarray(_LUTS[storage_type].astype(dtype))
    lut.flags.writeable = False
    return lut


# ----------------------------------------------------------------------------------------- decoding
#: Elements one chunk decodes: large enough that the per-chunk calls (about 20 us) are small next to
#: the NumPy work, small enough that the chunk's scratch arrays stay in the processor's cache.
CHUNK_ELEMENTS = 1 << 19
#: Decodes of at least this many elements run their chunks on a thread pool (NumPy releases the GIL).
PARALLEL_ELEMENTS = 1 << 20
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _workers() -> int:
    try:
        return max(1, min(len(os.sched_getaffinity(0)), 8))
    except AttributeError:  # no affinity on this platform
        return max(1, min(os.cpu_count() or 1, 8))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="dequantize")
        return _POOL


def _forget_pool() -> None:
    """A forked child has none of the parent's threads: it starts its own pool when it needs one."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class _Plan:
    """One dequantization, viewed as ``(outer, dim, inner)`` elements around the quantized axis and split
    into chunks, each a contiguous run of elements: whole rows (``outer`` ranges), or for long rows axis
    ranges of one row, or for very long inner runs parts of one axis position. A chunk is decoded
    completely (codes, zero point, scale, output type) and then written to the output, once."""

    def __init__(self, storage_type: int, scale: np.ndarray, zero_point: np.ndarray | None, axis: int | None,
                 block_size: int | None, shape: tuple[int, ...], work: type, out: np.ndarray):
        self.storage_type = storage_type
        self.per_byte = 8 // dtypes.BIT_WIDTH[storage_type]
        self.work = work
        self.out = out.view(np.ndarray).reshape(-1)
        # code - zero_point is exact in int8 for sub-byte codes and in int16 for 8-bit ones
        self.codes = np.int16 if self.per_byte == 1 else np.int8
        self.block = block_size if axis is not None and block_size else None
        if axis is None:
            self.outer, self.dim, self.inner = 1, math.prod(shape), 1
            layout = (1, 1, 1)
        else:
            self.outer, self.dim, self.inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
            if self.block:  # a block longer than the axis is one block: repeating by it would not fit in memory
                self.block = min(self.block, self.dim)
            layout = (self.outer, -(-self.dim // self.block), self.inner) if self.block else (1, self.dim, 1)
        self.per_axis = axis is not None
        self.scale = scale.astype(work).reshape(layout)
        self.zero_point = None if zero_point is None else zero_point.astype(self.codes).reshape(layout)

    def chunks(self, size: int) -> list[tuple[int, int, int, int, int, int]]:
        """(rows, axis positions, inner positions) of each chunk, as start/stop pairs."""
        dim, inner = self.dim, self.inner
        if dim * inner <= size:
            rows = size // (dim * inner)
            return [(o, min(o + rows, self.outer), 0, dim, 0, inner) for o in range(0, self.outer, rows)]
        if inner <= size:
            step = size // inner
            if self.block:
                step = max(self.block, step - step % self.block)
            return [(o, o + 1, a, min(a + step, dim), 0, inner)
                    for o in range(self.outer) for a in range(0, dim, step)]
        return [(o, o + 1, a, a + 1, i, min(i + size, inner))
                for o in range(self.outer) for a in range(dim) for i in range(0, inner, size)]

    def _parameter(self, param: np.ndarray, chunk: tuple[int, ...]) -> np.ndarray:
        """The parameter over the chunk's elements, shaped (rows, axis positions, inner) or broadcastable
        to it. Blocked parameters are repeated over their blocks: multiplying by a contiguous array is
        faster than broadcasting one value over a block of a few elements."""
        o0, o1, a0, a1, i0, i1 = chunk
        if not self.per_axis:
            return param
        if not self.block:
            return param[:, a0:a1]
        first = a0 // self.block
        blocks = param[o0:o1, first:-(-a1 // self.block), i0:i1]
        start = a0 - first * self.block
        return np.repeat(blocks, self.block, axis=1)[:, start:start + a1 - a0]

    def decode(self, raw: np.ndarray, chunk: tuple[int, ...]) -> None:
        o0, o1, a0, a1, i0, i1 = chunk
        start = (o0 * self.dim + a0) * self.inner + i0
        stop = ((o1 - 1) * self.dim + a1 - 1) * self.inner + i1
        skip = start % self.per_byte  # a chunk may begin inside a byte: decode from that byte, drop the rest
        first = start // self.per_byte
        shape = (o1 - o0, a1 - a0, i1 - i0)
        if self.zero_point is None:
            values = codes_as_float(raw[first:], self.storage_type, stop - start + skip, self.work)[skip:]
            values = values.reshape(shape)
        else:
            codes = codes_as_float(raw[first:], self.storage_type, stop - start + skip, self.codes)[skip:]
            codes = codes.reshape(shape)
            codes -= self._parameter(self.zero_point, chunk)
            values = codes.astype(self.work)
        target = self.out[start:stop].reshape(shape)
        scale = self._parameter(self.scale, chunk)
        # IEEE results, not warnings: 0 times an infinite scale is NaN, beyond FLOAT16's range is infinity
        with np.errstate(over="ignore", invalid="ignore"):
            if target.dtype == values.dtype:
                np.multiply(values, scale, out=target)
            else:  # formed in the work type, then cast (as onnx's reference implementation does)
                values *= scale
                target[...] = values


def dequantize(codes, storage_type: int, scale: np.ndarray, zero_point: np.ndarray | None,
               axis: int | None, block_size: int | None, shape: tuple[int, ...],
               output_dtype: np.dtype | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """ONNX DequantizeLinear over a packed code payload; the output dtype is ``output_dtype`` (its
    attribute of that name) or else the scale's dtype. The product is formed in float32 (float64 for a
    DOUBLE scale) and then cast, as onnx's reference implementation does.

    Parameters are assumed validated (see ``check_affine``); the payload must hold at least the codes.
    ``out``, when given, receives the values and is returned; it is checked first (``check_out``).
    Large values are decoded in chunks on a thread pool, each chunk written to the output once.
    """
    raw = np.frombuffer(codes, dtype=np.uint8) if isinstance(codes, (bytes, bytearray, memoryview)) \
        else np.asarray(codes, dtype=np.uint8).reshape(-1)
    shape = tuple(shape)
    count = math.prod(shape)
    scale = np.asarray(scale)
    work = np.float64 if scale.dtype == np.float64 else np.float32
    result_dtype = np.dtype(output_dtype) if output_dtype is not None else scale.dtype
    if zero_point is not None:
        zero_point = np.asarray(zero_point)
        if not np.any(zero_point):
            zero_point = None
    if out is None:
        out = np.empty(shape, result_dtype)
    else:
        check_out(out, shape, result_dtype, (raw, scale, zero_point))
    if not count:
        return out
    plan = _Plan(storage_type, scale, zero_point, axis, block_size, shape, work, out)
    _run_chunks(functools.partial(plan.decode, raw), plan.chunks(CHUNK_ELEMENTS), parallel=count >= PARALLEL_ELEMENTS)
    return out


def _run_chunks(task, chunks: list, parallel: bool) -> None:
    """``task(chunk)`` for every chunk: on the calling thread, or on it and the pool's threads together,
    each taking the next chunk from a shared queue (so a thread slowed by other load takes fewer). Every
    chunk has finished before anything is raised or this returns."""
    workers = min(_workers(), len(chunks)) if parallel else 1
    if workers < 2:
        for chunk in chunks:
            task(chunk)
        return
    pending: SimpleQueue = SimpleQueue()
    for chunk in chunks:
        pending.put(chunk)

    def drain() -> None:
        while True:
            try:
                chunk = pending.get_nowait()
            except Empty:
                return
            task(chunk)

    helpers = [_pool().submit(drain) for _ in range(workers - 1)]
    try:
        drain()
    finally:
        wait(helpers)
    for helper in helpers:
        helper.result()


def check_out(out, shape: tuple[int, ...], dtype: np.dtype, sources=(), path: str = "out") -> None:
    """A caller's output buffer must be exactly what the decoder would allocate: an array of the value's
    dtype and shape (LOGICAL_SHAPE_MISMATCH), C-contiguous and writable, sharing no memory with the
    payload or parameters it is decoded from (STATE_UNRETAINABLE: the decoder neither writes through a
    hidden copy nor into buffers it must only read)."""
    if not isinstance(out, np.ndarray):
        raise violation(E.LOGICAL_SHAPE_MISMATCH, path, f"the output buffer is a {type(out).__name__}, not an array")
    if out.dtype != dtype or out.shape != tuple(shape):
        raise violation(E.LOGICAL_SHAPE_MISMATCH, path, f"the output buffer is {out.dtype}{list(out.shape)}, the "
                        f"decoded value is {np.dtype(dtype)}{list(shape)}")
    if not out.flags.c_contiguous:
        raise violation(E.STATE_UNRETAINABLE, path, f"the output buffer is not C-contiguous (strides {out.strides}); "
                        "decoding into it would need a copy")
    if not out.flags.writeable:
        raise violation(E.STATE_UNRETAINABLE, path, "the output buffer is read-only")
    for source in sources:
        if source is not None and np.may_share_memory(out, source):
            raise violation(E.STATE_UNRETAINABLE, path, "the output buffer overlaps the payload or parameters it is "
                            "decoded from")


def quantize(x: np.ndarray, storage_type: int, scale: np.ndarray, zero_point: np.ndarray | None = None,
             axis: int | None = None, block_size: int | None = None) -> bytes:
    """ONNX QuantizeLinear (round half to even, saturate) returning the packed code payload."""
    x = np.asarray(x)
    shape = x.shape
    scale = np.asarray(scale, dtype=np.float32)
    zp = np.zeros(scale.shape, dtype=np.int64) if zero_point is None else np.asarray(zero_point, np.int64)
    if axis is not None:
        axis %= max(len(shape), 1)
        if block_size:
            block_size = min(block_size, max(shape[axis], 1))  # one block covers a shorter axis
            scale = np.repeat(scale, block_size, axis=axis).take(np.arange(shape[axis]), axis=axis)
            zp = np.repeat(zp, block_size, axis=axis).take(np.arange(shape[axis]), axis=axis)
        else:
            bshape = [1] * len(shape)
            bshape[axis] = shape[axis]
            scale = scale.reshape(bshape)
            zp = zp.reshape(bshape)
    low, high = _RANGE[storage_type]
    codes = np.clip(np.rint(x.astype(np.float32) / scale).astype(np.int64) + zp, low, high)
    width = dtypes.BIT_WIDTH[storage_type]
    if width == 8:
        return codes.astype(np.int8 if storage_type == dtypes.INT8 else np.uint8).tobytes()
    return pack_sub_byte(codes.reshape(-1), width)


def make_affine_value(x: np.ndarray, storage_type: int, scale, zero_point=None, axis: int | None = None,
                      block_size: int | None = None, name: str = ""):
    """An EncodedValueProto holding ``x`` quantized with the given parameters (inline payload)."""
    from onnx import numpy_helper

    from reference_impl import schema

    x = np.asarray(x)
    scale = np.asarray(scale)
    value = schema.EncodedValueProto(name=name)
    layout = value.affine
    layout.storage_type = storage_type
    layout.scale.CopyFrom(schema.from_onnx(numpy_helper.from_array(scale)))
    if zero_point is not None:
        zp = np.asarray(zero_point)
        tensor = schema.TensorProto(data_type=storage_type, dims=list(zp.shape))
        if dtypes.BIT_WIDTH[storage_type] == 8:
            tensor.raw_data = zp.astype(dtypes.NUMPY_DTYPE[storage_type]).tobytes()
        else:
            tensor.raw_data = pack_sub_byte(zp.reshape(-1), dtypes.BIT_WIDTH[storage_type])
        layout.zero_point.CopyFrom(tensor)
    if axis is not None:
        layout.axis = axis
    if block_size is not None:
        layout.block_size = block_size
    tensor_type = value.logical_type.tensor_type
    tensor_type.elem_type = {np.dtype(np.float32): dtypes.FLOAT, np.dtype(np.float16): dtypes.FLOAT16,
                             np.dtype(np.float64): dtypes.DOUBLE}.get(scale.dtype, dtypes.BFLOAT16)
    tensor_type.shape.SetInParent()
    for dim in x.shape:
        tensor_type.shape.dim.add(dim_value=dim)
    value.raw_data = quantize(x, storage_type, scale.astype(np.float32), zero_point, axis, block_size)
    return value
