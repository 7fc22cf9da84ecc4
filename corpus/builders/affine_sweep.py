"""Affine values over every storage type and granularity, with expectations from onnx's reference
evaluator running DequantizeLinear on the same codes (an independent implementation)."""

from __future__ import annotations

import numpy as np

from . import builder
from .common import add_float_logical, model, pack_crumbs, pack_nibbles

RANGES = {3: (-128, 127), 2: (0, 255), 22: (-8, 7), 21: (0, 15), 26: (-2, 1), 25: (0, 3)}
WIDTH = {3: 8, 2: 8, 22: 4, 21: 4, 26: 2, 25: 2}


def packed(codes: np.ndarray, storage: int) -> bytes:
    width = WIDTH[storage]
    if width == 8:
        return codes.astype(np.int8 if storage == 3 else np.uint8).tobytes()
    return pack_nibbles(codes) if width == 4 else pack_crumbs(codes)


def _onnx_dequantize(codes, storage, scale, zero_point, axis, block):
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    x = helper.make_tensor("x", storage, list(codes.shape), vals=packed(codes, storage), raw=True)
    s = onnx.numpy_helper.from_array(scale, "s")
    inits, inputs = [x, s], ["x", "s"]
    if zero_point is not None:
        inits.append(helper.make_tensor("z", storage, list(zero_point.shape), vals=packed(zero_point, storage),
                                        raw=True))
        inputs.append("z")
    attrs = {}
    if axis is not None:
        attrs["axis"] = axis
    if block:
        attrs["block_size"] = block
    node = helper.make_node("DequantizeLinear", inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", 1, list(codes.shape))], inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    return ReferenceEvaluator(onnx_model).run(None, {})[0]


@builder
def affine_sweep(storage: int, granularity: str, zero_point: bool, seed: int = 7):
    """A [4, 6] value: per-tensor, per-axis (axis 1) or blocked (axis 1, block 4, last block partial)."""
    from reference_impl import schema

    rng = np.random.default_rng(seed * 100 + storage)
    low, high = RANGES[storage]
    shape = (4, 6)
    codes = rng.integers(low, high + 1, size=shape)
    axis, block = None, None
    if granularity == "per_tensor":
        param_shape = ()
    elif granularity == "per_axis":
        axis, param_shape = 1, (6,)
    else:
        axis, block, param_shape = 1, 4, (4, 2)
    scale = (rng.random(param_shape) * 0.5 + 0.05).astype(np.float32)
    zp = rng.integers(low, high + 1, size=param_shape) if zero_point else None
    value = schema.EncodedValueProto(name="w", raw_data=packed(codes, storage))
    layout = value.affine
    layout.storage_type = storage
    layout.scale.data_type = 1
    layout.scale.dims.extend(param_shape)
    layout.scale.raw_data = scale.astype("<f4").tobytes()
    if zp is not None:
        layout.zero_point.data_type = storage
        layout.zero_point.dims.extend(param_shape)
        layout.zero_point.raw_data = packed(np.asarray(zp), storage)
    if axis is not None:
        layout.axis = axis
    if block:
        layout.block_size = block
    add_float_logical(value, shape)
    m = model("affine_sweep")
    m.graph.encoded_initializer.append(value)
    expected = _onnx_dequantize(codes, storage, scale, None if zp is None else np.asarray(zp), axis, block)
    return {"model": m, "expected": expected}
