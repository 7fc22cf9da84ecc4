"""The logical element type may differ from the scale's type where DequantizeLinear's ``output_dtype``
(opset 23) defines the result: the oracle accepts such values and decodes them exactly as onnx's
reference evaluator runs DequantizeLinear with that attribute."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import reference_impl
from reference_impl import affine, dtypes, schema
from reference_impl.bits import pack_sub_byte
from reference_impl.errors import ContractError, ErrorCode

FLOATS = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16,
          TensorProto.BFLOAT16: ml_dtypes.bfloat16}


def _model(codes, storage, scale, zero_point, axis, block, elem_type) -> bytes:
    width = dtypes.BIT_WIDTH[storage]
    value = schema.EncodedValueProto(name="w")
    layout = value.affine
    layout.storage_type = storage
    layout.scale.CopyFrom(schema.from_onnx(numpy_helper.from_array(scale)))
    if zero_point is not None:
        raw = zero_point.astype(dtypes.NUMPY_DTYPE[storage]).tobytes() if width == 8 else \
            pack_sub_byte(zero_point.reshape(-1), width)
        layout.zero_point.CopyFrom(schema.TensorProto(data_type=storage, dims=list(zero_point.shape), raw_data=raw))
    if axis is not None:
        layout.axis = axis
    if block is not None:
        layout.block_size = block
    tensor = value.logical_type.tensor_type
    tensor.elem_type = elem_type
    tensor.shape.SetInParent()
    for dim in codes.shape:
        tensor.shape.dim.add(dim_value=dim)
    value.raw_data = codes.astype(dtypes.NUMPY_DTYPE[storage]).tobytes() if width == 8 else \
        pack_sub_byte(codes.reshape(-1), width)
    model = schema.ModelProto(ir_version=10)
    model.opset_import.add(domain="", version=23)
    model.graph.name = "g"
    model.graph.encoded_initializer.append(value)
    return model.SerializeToString()


def _onnx_dequantize(codes, storage, scale, zero_point, axis, block, elem_type) -> np.ndarray:
    width = dtypes.BIT_WIDTH[storage]
    raw = codes.astype(dtypes.NUMPY_DTYPE[storage]).tobytes() if width == 8 else pack_sub_byte(codes.reshape(-1), width)
    inits = [helper.make_tensor("x", storage, list(codes.shape), raw, raw=True), numpy_helper.from_array(scale, "s")]
    names = ["x", "s"]
    if zero_point is not None:
        zraw = zero_point.astype(dtypes.NUMPY_DTYPE[storage]).tobytes() if width == 8 else \
            pack_sub_byte(zero_point.reshape(-1), width)
        inits.append(helper.make_tensor("z", storage, list(zero_point.shape), zraw, raw=True))
        names.append("z")
    attrs = {"output_dtype": elem_type}
    if axis is not None:
        attrs["axis"] = axis
    if block is not None:
        attrs["block_size"] = block
    node = helper.make_node("DequantizeLinear", names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", elem_type, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    return ReferenceEvaluator(model).run(None, {})[0]


@pytest.mark.clause("AFF-DQ")
@pytest.mark.parametrize("scale_type,elem_type", list(itertools.product(FLOATS, FLOATS)),
                         ids=lambda t: dtypes.type_name(t))
@pytest.mark.parametrize("storage", [dtypes.INT8, dtypes.UINT4, dtypes.INT2], ids=dtypes.type_name)
@pytest.mark.parametrize("granularity", ["tensor", "axis", "blocked"])
def test_decoded_like_dequantize_linear_with_output_dtype(scale_type, elem_type, storage, granularity):
    rng = np.random.default_rng(scale_type * 1000 + elem_type * 10 + storage)
    shape = (3, 5)
    low, high = affine.code_range(storage)
    codes = rng.integers(low, high + 1, size=shape)
    axis = block = None
    if granularity != "tensor":
        axis = 1
        block = 2 if granularity == "blocked" else None
    param_shape = affine.parameter_shape(shape, axis, block)
    scale = (rng.random(param_shape) * 3 + 0.01).astype(FLOATS[scale_type])  # values that round
    zero_point = rng.integers(low, high + 1, size=param_shape)
    expected = _onnx_dequantize(codes, storage, scale, zero_point, axis, block, elem_type)
    decoded = reference_impl.decode(_model(codes, storage, scale, zero_point, axis, block, elem_type), "w")
    assert decoded.dtype == expected.dtype == np.dtype(FLOATS[elem_type])
    np.testing.assert_array_equal(decoded.astype(np.float64), expected.astype(np.float64))


@pytest.mark.clause("AFF-SCALE")
@pytest.mark.parametrize("scale_type,elem_type", [(TensorProto.DOUBLE, TensorProto.FLOAT),
                                                  (TensorProto.FLOAT, TensorProto.DOUBLE)])
def test_double_only_pairs_with_double(scale_type, elem_type):
    """DequantizeLinear has neither a DOUBLE scale nor a DOUBLE output_dtype: the suite decodes a DOUBLE
    scale only to DOUBLE, and refuses mixing DOUBLE with another type."""
    scale = np.asarray(0.5, dtype=np.float64 if scale_type == TensorProto.DOUBLE else np.float32)
    model = _model(np.array([1, 2]), dtypes.INT8, scale, None, None, None, elem_type)
    with pytest.raises(ContractError) as caught:
        reference_impl.verify_model(model)
    assert caught.value.code is ErrorCode.AFFINE_SCALE_INVALID
