"""Chunked, parallel decoding and decoding into a caller's buffer (``out=``): the same exact values as
onnx's DequantizeLinear whatever the chunking, and a wrong buffer refused before it is touched."""

from __future__ import annotations

import multiprocessing
import sys

import ml_dtypes
import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from reference_impl import ContractError, ErrorCode, affine, bits, dtypes, examples, schema
from reference_impl.decode import decode, decode_value
from reference_impl.structs import Catalogue
from reference_impl.verifier import verify_model

SUB_BYTE = (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)


def _packed(codes: np.ndarray, storage_type: int) -> bytes:
    width = dtypes.BIT_WIDTH[storage_type]
    flat = np.asarray(codes).reshape(-1)
    return flat.astype(dtypes.NUMPY_DTYPE[storage_type]).tobytes() if width == 8 else bits.pack_sub_byte(flat, width)


def _onnx_dequantize(payload: bytes, storage_type: int, shape, scale, zero_point, axis, block, output_dtype):
    """onnx's reference DequantizeLinear (opset 25, output_dtype) on the same codes and parameters."""
    inputs = [helper.make_tensor("x", storage_type, list(shape), payload, raw=True),
              numpy_helper.from_array(scale, "s")]
    if zero_point is not None:
        inputs.append(helper.make_tensor("z", storage_type, list(np.shape(zero_point)),
                                         _packed(zero_point, storage_type), raw=True))
    attributes = {"output_dtype": helper.np_dtype_to_tensor_dtype(np.dtype(output_dtype))}
    if axis is not None:
        attributes["axis"] = axis
    if block:
        attributes["block_size"] = block
    node = helper.make_node("DequantizeLinear", [t.name for t in inputs], ["y"], **attributes)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", 0, None)], initializer=inputs)
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])).run(None, {})[0]


# (shape, axis, block): whole-row chunks, axis ranges of one row, parts of one axis position; blocks split
# by chunk edges, chunks starting inside a byte, ragged last blocks
GEOMETRIES = [((9, 13), None, None), ((9, 13), 1, None), ((9, 13), 0, None), ((6, 50), 1, 4), ((6, 50), 1, 7),
              ((50, 3), 0, 6), ((3, 41, 5), 1, 3), ((2, 3, 37), 0, None), ((2, 3, 37), 2, 5), ((1, 101), 1, 8)]


def _random_values(rng, storage_type: int):
    """Per geometry: (shape, axis, block, packed codes, float32 scale, zero point), drawn from ``rng``."""
    low, high = affine.code_range(storage_type)
    for shape, axis, block in GEOMETRIES:
        codes = rng.integers(low, high + 1, size=shape)
        payload = _packed(codes, storage_type)
        param_shape = affine.parameter_shape(shape, axis, block)
        scale = (rng.standard_normal(param_shape) * 4).astype(np.float32)
        zero_point = rng.integers(low, high + 1, size=param_shape)
        yield shape, axis, block, payload, scale, zero_point


@pytest.mark.clause("AFF-DQ", "AFF-PACKING", "AFF-ROW-MAJOR", "AFF-BLOCK", "AFF-ZERO-POINT", "AFF-AXIS")
@pytest.mark.parametrize("storage_type", sorted(affine.STORAGE_TYPES), ids=dtypes.type_name)
@pytest.mark.parametrize("chunk", [1, 5, 16, 64, 1 << 19])
def test_every_chunking_decodes_exactly_like_dequantize_linear(monkeypatch, storage_type, chunk):
    """Tiny chunks force every split (chunk edges inside bytes, blocks and rows) and the thread pool."""
    monkeypatch.setattr(affine, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(affine, "PARALLEL_ELEMENTS", 1)
    rng = np.random.default_rng(chunk * 31 + storage_type)
    for shape, axis, block, payload, scale, zero_point in _random_values(rng, storage_type):
        for zp in (None, zero_point):
            for output_dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
                expected = _onnx_dequantize(payload, storage_type, shape, scale, zp, axis, block, output_dtype)
                ours = affine.dequantize(payload, storage_type, scale, zp, axis, block, shape, output_dtype)
                assert ours.dtype == expected.dtype and ours.shape == expected.shape
                assert ours.tobytes() == expected.tobytes(), (shape, axis, block, output_dtype)


def _random_chunks(plan, rng) -> list[tuple[int, ...]]:
    """Any partition into the three chunk forms, edges anywhere (inside blocks and bytes too)."""
    chunks = []
    for o in range(plan.outer):
        a = 0
        while a < plan.dim:
            if rng.random() < 0.3 and plan.inner > 1:
                cuts = sorted({0, plan.inner, *rng.integers(1, plan.inner, size=2).tolist()})
                chunks += [(o, o + 1, a, a + 1, i0, i1) for i0, i1 in zip(cuts, cuts[1:])]
                a += 1
                continue
            stop = min(plan.dim, a + int(rng.integers(1, 9)))
            chunks.append((o, o + 1, a, stop, 0, plan.inner))
            a = stop
    return chunks


@pytest.mark.clause("AFF-DQ", "AFF-BLOCK")
@pytest.mark.parametrize("storage_type", SUB_BYTE + (dtypes.INT8,), ids=dtypes.type_name)
def test_chunk_edges_anywhere_decode_exactly(monkeypatch, storage_type):
    """The decoder's chunks start on block edges today; a chunk starting inside a block or a byte still
    takes its parameters and codes from the right place."""
    rng = np.random.default_rng(storage_type)
    monkeypatch.setattr(affine._Plan, "chunks", lambda plan, size: _random_chunks(plan, rng))
    for shape, axis, block, payload, scale, zero_point in _random_values(rng, storage_type):
        expected = _onnx_dequantize(payload, storage_type, shape, scale, zero_point, axis, block, np.float32)
        ours = affine.dequantize(payload, storage_type, scale, zero_point, axis, block, shape)
        assert ours.tobytes() == expected.tobytes(), (shape, axis, block)


@pytest.mark.clause("AFF-DQ")
def test_a_double_scale_decodes_in_double_whatever_the_chunking(monkeypatch):
    monkeypatch.setattr(affine, "CHUNK_ELEMENTS", 7)
    rng = np.random.default_rng(3)
    codes = rng.integers(-128, 128, size=(5, 24))
    scale = rng.standard_normal((5, 3))
    zero_point = rng.integers(-128, 128, size=(5, 3))
    ours = affine.dequantize(_packed(codes, dtypes.INT8), dtypes.INT8, scale, zero_point, 1, 8, (5, 24))
    expected = (codes - np.repeat(zero_point, 8, axis=1)).astype(np.float64) * np.repeat(scale, 8, axis=1)
    assert ours.dtype == np.float64 and ours.tobytes() == expected.tobytes()


@pytest.mark.clause("AFF-PACKING")
@pytest.mark.parametrize("storage_type", SUB_BYTE, ids=dtypes.type_name)
@pytest.mark.parametrize("count", [0, 1, 3, 4095, 4096, 16383, 16384, 16385, 40001])
def test_codes_of_every_byte_low_bits_first_on_both_unpacking_paths(storage_type, count):
    """A table gather below ``_GATHER_CODES`` codes, whole-array shifts above: both give every byte's
    codes least-significant first, checked against Python integers."""
    width = dtypes.BIT_WIDTH[storage_type]
    per_byte = 8 // width
    rng = np.random.default_rng(count)
    raw = rng.integers(0, 256, size=-(-count // per_byte), dtype=np.uint8)
    number = int.from_bytes(raw.tobytes(), "little")
    sign = 1 << (width - 1) if storage_type in dtypes.SIGNED_INTEGERS else 0
    expected = [((number >> (i * width)) & ((1 << width) - 1) ^ sign) - sign for i in range(count)]
    for dtype in (np.float32, np.float64, np.int8, np.int16):
        codes = affine.codes_as_float(raw, storage_type, count, dtype)
        assert codes.dtype == dtype and codes.tolist() == expected


def _value(rows: int = 6, cols: int = 40, block: int = 8, scale_type=np.float32, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    scale = np.full((rows, -(-cols // block)), 0.25, scale_type)
    zero_point = rng.integers(-8, 8, size=scale.shape)
    return affine.make_affine_value(x, dtypes.INT4, scale, zero_point, axis=1, block_size=block, name="w")


@pytest.mark.clause("AFF-DQ", "ENC-LOGICAL-EXACT")
@pytest.mark.parametrize("scale_type", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_decoding_into_a_reused_buffer_gives_the_same_values(scale_type):
    first, second = _value(scale_type=scale_type, seed=1), _value(scale_type=scale_type, seed=2)
    catalogue = Catalogue([])
    buffer = np.full((6, 40), 99, np.dtype(scale_type))
    for value in (first, second, first):
        result = decode_value(value, catalogue, out=buffer)
        assert result is buffer
        assert buffer.tobytes() == decode_value(value, catalogue).tobytes()
    model = schema.ModelProto(ir_version=10)
    model.graph.encoded_initializer.append(second)
    assert decode(model, "w", out=buffer) is buffer and buffer.tobytes() == decode(model, "w").tobytes()


def _refused(value, out, code, catalogue=None, **decode_args) -> None:
    before = out.copy() if isinstance(out, np.ndarray) else None
    with pytest.raises(ContractError) as info:
        decode_value(value, catalogue or Catalogue([]), out=out, **decode_args)
    assert info.value.code is code, info.value
    if before is not None:
        assert out.tobytes() == before.tobytes(), "a refused buffer was written"


@pytest.mark.clause("ENC-LOGICAL-EXACT", "PAY-UNSUPPORTED-OWNERSHIP")
def test_a_wrong_buffer_is_refused_before_it_is_touched():
    value = _value()
    wide = np.full((6, 80), 7, np.float32)
    read_only = np.full((6, 40), 7, np.float32)
    read_only.flags.writeable = False
    _refused(value, np.full((6, 40), 7, np.float64), ErrorCode.LOGICAL_SHAPE_MISMATCH)
    _refused(value, np.full((6, 40), 7, np.dtype(">f4")), ErrorCode.LOGICAL_SHAPE_MISMATCH)
    _refused(value, np.full((40, 6), 7, np.float32), ErrorCode.LOGICAL_SHAPE_MISMATCH)
    _refused(value, np.full(240, 7, np.float32), ErrorCode.LOGICAL_SHAPE_MISMATCH)
    _refused(value, [[0.0] * 40] * 6, ErrorCode.LOGICAL_SHAPE_MISMATCH)
    _refused(value, wide[:, ::2], ErrorCode.STATE_UNRETAINABLE)
    _refused(value, np.full((40, 6), 7, np.float32).T, ErrorCode.STATE_UNRETAINABLE)
    _refused(value, read_only, ErrorCode.STATE_UNRETAINABLE)
    assert np.all(wide == 7)  # the strided view's base too


@pytest.mark.clause("PAY-READ-ONLY")
def test_a_buffer_sharing_memory_with_the_payload_or_parameters_is_refused():
    rng = np.random.default_rng(5)
    memory = np.zeros(4096, np.uint8)
    payload = memory[:120]
    payload[:] = rng.integers(0, 256, size=120, dtype=np.uint8)
    scale = np.full((6, 5), 0.5, np.float32)
    before = memory.copy()
    for out in (memory[:960].view(np.float32).reshape(6, 40), memory[64:1024].view(np.float32).reshape(6, 40)):
        with pytest.raises(ContractError) as info:
            affine.dequantize(payload, dtypes.INT4, scale, None, 1, 8, (6, 40), out=out)
        assert info.value.code is ErrorCode.STATE_UNRETAINABLE
    parameters = np.zeros(6 * 40 + 30, np.float32)
    shared_scale = parameters[:30].reshape(6, 5)
    shared_scale[...] = 0.5
    with pytest.raises(ContractError) as info:
        affine.dequantize(payload, dtypes.INT4, shared_scale, None, 1, 8, (6, 40),
                          out=parameters[:240].reshape(6, 40))
    assert info.value.code is ErrorCode.STATE_UNRETAINABLE
    assert memory.tobytes() == before.tobytes()
    out = memory[1024:1984].view(np.float32).reshape(6, 40)  # beside the payload, not over it
    assert affine.dequantize(payload, dtypes.INT4, scale, None, 1, 8, (6, 40), out=out) is out
    assert out.tobytes() == affine.dequantize(payload, dtypes.INT4, scale, None, 1, 8, (6, 40)).tobytes()


@pytest.mark.clause("AFF-PADDING-ZERO", "RESOURCE-LIMITS")
def test_a_value_refused_by_validation_leaves_the_buffer_untouched(monkeypatch):
    value = _value(rows=1, cols=7, block=7)
    raw = bytearray(value.raw_data)
    raw[-1] |= 0xF0  # nonzero unused high bits
    value.raw_data = bytes(raw)
    _refused(value, np.full((1, 7), 7, np.float32), ErrorCode.AFFINE_PADDING_NONZERO)
    from reference_impl import records

    monkeypatch.setattr(records, "MAX_DECODE_BYTES", 100)
    _refused(_value(), np.full((6, 40), 7, np.float32), ErrorCode.RESOURCE_LIMIT)


@pytest.mark.clause("ENC-LOGICAL-EXACT")
def test_a_registered_decoders_result_is_copied_into_the_buffer():
    model = examples.spec_example_model()
    catalogue = Catalogue(model.struct_types)
    value = model.graph.encoded_initializer[0]
    expected = decode_value(value, catalogue)
    buffer = np.full(expected.shape, 7, expected.dtype)
    assert decode_value(value, catalogue, out=buffer) is buffer and np.array_equal(buffer, expected)
    _refused(value, np.full(expected.shape, 7, np.float64), ErrorCode.LOGICAL_SHAPE_MISMATCH, catalogue)
    _refused(value, np.full(expected.shape + (2,), 7, expected.dtype)[..., 0], ErrorCode.STATE_UNRETAINABLE,
             catalogue)


def test_verified_models_keep_no_copy_of_inline_payloads():
    """Measuring an inline payload reads it out of the message; the extent a verified model keeps drops
    those bytes, so verifying never holds a second copy of every payload."""
    model = schema.ModelProto(ir_version=10)
    model.graph.encoded_initializer.append(_value())
    info = verify_model(model).encoded["w"]
    assert info.extent.length == 120 and info.extent.inline is None


def _decode_in_child(queue) -> None:
    value = _value(rows=64, cols=4096, block=32)
    queue.put(decode_value(value, Catalogue([])).tobytes() == decode_value(value, Catalogue([])).tobytes())


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_forked_child_decodes_in_parallel_with_a_pool_of_its_own(monkeypatch):
    """The parent's pool threads do not exist in a forked child: it must start its own pool, not wait
    forever on the parent's."""
    monkeypatch.setattr(affine, "PARALLEL_ELEMENTS", 1)
    monkeypatch.setattr(affine, "CHUNK_ELEMENTS", 1 << 12)
    value = _value(rows=64, cols=4096, block=32)
    decode_value(value, Catalogue([]))  # the parent's pool is running now
    assert affine._POOL is not None or affine._workers() < 2
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_decode_in_child, args=(queue,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung decoding in parallel")
    assert child.exitcode == 0 and queue.get(timeout=5) is True
