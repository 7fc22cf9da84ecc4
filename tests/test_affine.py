"""The affine branch against ONNX DequantizeLinear: backend cases and the reference evaluator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import node_cases

from reference_impl import affine, dtypes

pytestmark = pytest.mark.clause("AFF-DQ", "AFF-PACKING", "AFF-ROW-MAJOR", "AFF-AXIS", "AFF-BLOCK", "AFF-ZERO-POINT")


def _backend_cases():
    return [c for c in node_cases("DequantizeLinear") if c.name.startswith("test_dequantizelinear")]


def _as_tensor(value) -> onnx.TensorProto:
    return value if isinstance(value, onnx.TensorProto) else numpy_helper.from_array(np.asarray(value))


BACKEND = _backend_cases()
STORAGE_CASES = [c for c in BACKEND if _as_tensor(c.data_sets[0][0][0]).data_type in affine.STORAGE_TYPES]


def test_backend_collection_covers_every_storage_type():
    seen = {_as_tensor(c.data_sets[0][0][0]).data_type for c in STORAGE_CASES}
    # onnx ships no INT8 DequantizeLinear case; INT8 is covered by the randomized comparison below.
    assert seen == affine.STORAGE_TYPES - {dtypes.INT8}
    assert any("blocked" in c.name for c in STORAGE_CASES)


@pytest.mark.parametrize("case", STORAGE_CASES, ids=lambda c: c.name)
def test_backend_dequantizelinear_case(case):
    node = case.model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs, outputs = case.data_sets[0]
    codes = _as_tensor(inputs[0])
    if not codes.raw_data:  # sub-byte cases may carry int32_data; re-pack through onnx's own reading
        codes = _packed_tensor(numpy_helper.to_array(codes).astype(np.int64), codes.data_type, "x")
    scale = np.asarray(inputs[1])
    zero_point = numpy_helper.to_array(_as_tensor(inputs[2])).astype(np.int64) if len(inputs) > 2 else None
    shape = tuple(codes.dims)
    axis = attrs.get("axis", 1) % len(shape) if scale.ndim > 0 else None
    block = attrs.get("block_size") or None
    decoded = affine.dequantize(codes.raw_data, codes.data_type, scale, zero_point, axis, block, shape)
    assert decoded.dtype == outputs[0].dtype
    np.testing.assert_array_equal(decoded, outputs[0])


def _onnx_dequantize(codes_tensor, scale, zero_point, axis, block):
    feeds_names = ["x", "s"]
    initializers = [codes_tensor]
    scale_init = numpy_helper.from_array(scale, "s")
    initializers.append(scale_init)
    if zero_point is not None:
        feeds_names.append("z")
        initializers.append(zero_point)
    kwargs = {}
    if axis is not None:
        kwargs["axis"] = axis
    if block:
        kwargs["block_size"] = block
    node = helper.make_node("DequantizeLinear", feeds_names, ["y"], **kwargs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", 1, None)],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    return ReferenceEvaluator(model).run(None, {})[0]


def _packed_tensor(codes: np.ndarray, storage_type: int, name: str) -> onnx.TensorProto:
    from reference_impl.bits import pack_sub_byte

    width = dtypes.BIT_WIDTH[storage_type]
    raw = codes.astype(dtypes.NUMPY_DTYPE[storage_type]).tobytes() if width == 8 else \
        pack_sub_byte(codes.reshape(-1), width)
    return helper.make_tensor(name, storage_type, list(codes.shape), raw, raw=True)


@pytest.mark.parametrize("storage_type", sorted(affine.STORAGE_TYPES), ids=dtypes.type_name)
@pytest.mark.parametrize("granularity", ["tensor", "axis", "blocked"])
@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_agree_with_onnx_reference(storage_type, granularity, seed):
    rng = np.random.default_rng(seed * 97 + storage_type)
    rank = int(rng.integers(1, 4))
    shape = tuple(int(d) for d in rng.integers(1, 9, size=rank))
    if seed == 0:
        shape = shape[:-1] + (7,)  # odd element count, ragged blocks
    low, high = affine.code_range(storage_type)
    codes = rng.integers(low, high + 1, size=shape)
    axis = block = None
    if granularity == "tensor":
        param_shape = ()
    else:
        axis = int(rng.integers(0, rank))
        if granularity == "blocked":
            block = int(rng.integers(1, 5))
        param_shape = affine.parameter_shape(shape, axis, block)
    scale = (rng.random(param_shape) + 0.05).astype(np.float32)
    zp_codes = rng.integers(low, high + 1, size=param_shape)
    zero_point = _packed_tensor(np.asarray(zp_codes), storage_type, "z")
    codes_tensor = _packed_tensor(codes, storage_type, "x")
    expected = _onnx_dequantize(codes_tensor, scale, zero_point, axis, block)
    ours = affine.dequantize(codes_tensor.raw_data, storage_type, scale, np.asarray(zp_codes), axis, block,
                             shape)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("storage_type", sorted(affine.STORAGE_TYPES), ids=dtypes.type_name)
def test_quantize_then_dequantize_within_half_a_step(storage_type):
    rng = np.random.default_rng(storage_type)
    x = rng.standard_normal((6, 10)).astype(np.float32)
    scale = np.full((6, 3), 0.5, np.float32)
    low, high = affine.code_range(storage_type)
    zero_point = np.full((6, 3), (low + high) // 2, np.int64)
    payload = affine.quantize(x, storage_type, scale, zero_point, axis=1, block_size=4)
    assert len(payload) == affine.payload_bytes(storage_type, x.size)
    y = affine.dequantize(payload, storage_type, scale, zero_point, 1, 4, x.shape)
    representable = (x >= (low - zero_point[:, :1]) * 0.5) & (x <= (high - zero_point[:, :1]) * 0.5)
    assert np.all(np.abs(y - x)[representable] <= 0.25 + 1e-7)


@pytest.mark.parametrize("block_size", [3, 4, 2**63 - 1, 2**64 - 1])
def test_a_block_longer_than_the_axis_is_one_block(block_size):
    """block_size may exceed the axis (one block covers it): decoding and quantizing such a value must not
    try to repeat each parameter block_size times (a bare NumPy error for sizes near 2**63 and 2**64)."""
    codes = np.array([[1, 2, 3], [-1, -2, -3]], dtype=np.int8)
    scale = np.array([[0.5], [2.0]], dtype=np.float32)
    decoded = affine.dequantize(codes.tobytes(), dtypes.INT8, scale, None, 1, block_size, (2, 3))
    np.testing.assert_array_equal(decoded, codes.astype(np.float32) * scale)
    packed = affine.quantize(codes.astype(np.float32) * scale, dtypes.INT8, scale, axis=1, block_size=block_size)
    assert packed == codes.tobytes()
