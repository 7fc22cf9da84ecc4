"""The reference executor: standard operators agree with onnx's evaluator, struct/encoded values reach
tensor operators only through explicit consumers, and transport never copies payloads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from test_state_models import (
    CACHE_TYPE,
    D,
    address,
    cache_declaration,
    empty_cache,
    kv_model,
    opsets,
    set_struct,
    tokens,
)

from reference_impl import schema
from reference_impl.affine import make_affine_value
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.examples import encoded, spec_struct_types
from reference_impl.executor import LOCAL_DOMAIN, CancelToken, Executor, run_model
from reference_impl.graph_utils import export_standard
from reference_impl.values import EncodedValue, StructValue


def model_of(nodes, inputs, outputs, initializers=(), functions=(), extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return schema.from_onnx(helper.make_model(graph, opset_imports=opsets(*extra_opsets),
                                              functions=list(functions)))


def fvi(name, dims):
    return helper.make_tensor_value_info(name, T.FLOAT, dims)


@pytest.mark.clause("STATE-EQUIV-LOOP")
def test_standard_operators_agree_with_onnx_reference_evaluator():
    model = kv_model(bind=False)
    feeds = {"tokens": tokens(3, 1, 4), "past_key": np.random.default_rng(0).random((1, 2, D), np.float32)}
    ours = run_model(model, feeds)
    reference = ReferenceEvaluator(export_standard(model).model)
    theirs = dict(zip(reference.output_names, reference.run(None, feeds)))
    assert set(ours) == set(theirs)
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name])


@pytest.mark.clause("ZC-TRANSPORT")
def test_identity_hands_values_on_by_reference():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = run_model(model_of([helper.make_node("Identity", ["x"], ["y"])], [fvi("x", [2, 3])],
                             [fvi("y", [2, 3])]), {"x": x})
    assert out["y"] is x  # onnx's own Identity returns a copy; transport must not


def _function(name, body_nodes, inputs, outputs, attributes=()):
    return helper.make_function("local", name, inputs, outputs, body_nodes,
                                [helper.make_opsetid("", 21), helper.make_opsetid(LOCAL_DOMAIN, 1)],
                                attributes=list(attributes))


def _transport_model():
    """x -> Carry(function) -> If(c) { Identity } else { Carry } -> y, plus a computed z = x * 2."""
    carry = _function("Carry", [helper.make_node("Identity", ["a"], ["b"])], ["a"], ["b"])
    then_g = helper.make_graph([helper.make_node("Identity", ["carried"], ["t"])], "then", [],
                               [fvi("t", None)])
    else_g = helper.make_graph([helper.make_node("Carry", ["carried"], ["e"], domain="local")], "else", [],
                               [fvi("e", None)])
    nodes = [helper.make_node("Carry", ["x"], ["carried"], domain="local"),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Mul", ["x", "two"], ["z"])]
    return model_of(nodes, [fvi("x", [4]), helper.make_tensor_value_info("c", T.BOOL, [])],
                    [fvi("y", [4]), fvi("z", [4])], [numpy_helper.from_array(np.float32(2), "two")],
                    functions=[carry], extra_opsets=[helper.make_opsetid("local", 1)])


@pytest.mark.clause("ZC-TRANSPORT")
@pytest.mark.parametrize("cond", [True, False])
def test_function_and_if_transport_keep_the_buffer(cond):
    x = np.arange(4, dtype=np.float32)
    out = Executor(_transport_model()).run({"x": x, "c": np.array(cond)})
    assert address(out["y"]) == address(x)
    np.testing.assert_array_equal(out["z"], x * 2)


@pytest.mark.clause("ZC-TRANSPORT", "STATE-WHOLE-STRUCT")
def test_function_and_if_carry_whole_structs():
    model = _transport_model()
    for group in (model.graph.input, model.graph.output):
        for vi in group:
            if vi.name in ("x", "y"):
                set_struct(vi)
    model.struct_types.append(cache_declaration())
    del model.graph.node[2]
    del model.graph.output[1]
    cache = empty_cache(3)
    out = Executor(model).run({"x": cache, "c": np.array(False)})
    assert out["y"] is cache


def _decode_model(value, consumer="Decode"):
    nodes = [helper.make_node(consumer, ["w"], ["dense"], domain=LOCAL_DOMAIN),
             helper.make_node("MatMul", ["x", "dense"], ["y"])]
    model = model_of(nodes, [fvi("x", [1, 4])], [fvi("y", [1, 3])])
    model.graph.encoded_initializer.append(value)
    return model


@pytest.mark.clause("GRAPH-STRUCT-IO", "AFF-DQ")
def test_affine_value_decodes_like_dequantize_linear():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    scale = np.float32(0.05)
    value = make_affine_value(w, T.INT8, scale, name="w")
    x = rng.standard_normal((1, 4)).astype(np.float32)
    ours = run_model(_decode_model(value), {"x": x})["y"]
    codes = np.frombuffer(value.raw_data, np.int8).reshape(4, 3)
    dq = helper.make_node("DequantizeLinear", ["codes", "scale"], ["dense"])
    reference = ReferenceEvaluator(helper.make_model(helper.make_graph(
        [dq, helper.make_node("MatMul", ["x", "dense"], ["y"])], "dq", [fvi("x", [1, 4])], [fvi("y", [1, 3])],
        [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scale, "scale")]),
        opset_imports=[helper.make_opsetid("", 21)]))
    np.testing.assert_array_equal(ours, reference.run(None, {"x": x})[0])


@pytest.mark.clause("ENC-NO-IMPLICIT-TENSOR", "DEC-MISSING", "GRAPH-TENSOR-OPS")
def test_encoded_value_at_tensor_operator_fails_with_consumer_missing():
    value = make_affine_value(np.ones((4, 3), np.float32), T.INT8, np.float32(0.5), name="w")
    model = model_of([helper.make_node("MatMul", ["x", "w"], ["y"])], [fvi("x", [1, 4])], [fvi("y", [1, 3])])
    model.graph.encoded_initializer.append(value)
    with pytest.raises(ContractError) as info:
        run_model(model, {"x": np.ones((1, 4), np.float32)})
    assert info.value.code is ErrorCode.CONSUMER_MISSING and "node[0]" in info.value.path


@pytest.mark.clause("GRAPH-STRUCT-IO", "GRAPH-TENSOR-OPS", "DEC-MISSING-INPUT")
def test_struct_value_at_tensor_operator_fails_with_consumer_missing():
    model = model_of([helper.make_node("Add", ["s", "s"], ["y"])], [fvi("s", None)], [fvi("y", None)])
    model.struct_types.append(cache_declaration())
    set_struct(model.graph.input[0])
    with pytest.raises(ContractError) as info:
        run_model(model, {"s": empty_cache(1)})
    assert info.value.code is ErrorCode.CONSUMER_MISSING


@pytest.mark.clause("DEC-MISSING", "DEC-KEYED")
def test_decode_of_type_without_registered_decoder_fails():
    model = _decode_model(encoded("w", 1101, bytes(8 * 12), None))
    model.struct_types.extend(spec_struct_types())
    with pytest.raises(ContractError) as info:
        run_model(model, {"x": np.ones((1, 4), np.float32)})
    assert info.value.code is ErrorCode.CONSUMER_MISSING


@pytest.mark.clause("DEC-KEYED")
def test_decode_through_registered_codebook_decoder():
    # The spec's worked example: E4 x 8 with FLOAT scale 2.0 decodes to [-2, -0.5, 0.5, 2] x 8.
    value = encoded("w", 1102, bytes([0xE4] * 8 + [0, 0, 0, 0x40]), [32])
    model = model_of([helper.make_node("Decode", ["w"], ["y"], domain=LOCAL_DOMAIN)], [], [fvi("y", [32])])
    model.graph.encoded_initializer.append(value)
    model.struct_types.extend(spec_struct_types())
    out = run_model(model, {})["y"]
    np.testing.assert_array_equal(out, np.tile(np.float32([-2.0, -0.5, 0.5, 2.0]), 8))


@pytest.mark.clause("DEC-MISSING")
def test_registered_consumer_may_take_encoded_values():
    value = make_affine_value(np.ones((4, 3), np.float32), T.INT8, np.float32(0.5), name="w")
    model = _decode_model(value, consumer="PayloadBytes")
    model.graph.node[0].domain = "vendor"
    del model.graph.node[1]
    model.graph.output[0].name = "dense"

    def payload_bytes(inputs, attributes, ctx):
        assert isinstance(inputs[0], EncodedValue)
        return [np.array(inputs[0].nbytes, np.int64)]

    out = Executor(model, kernels={("vendor", "PayloadBytes"): payload_bytes}).run(
        {"x": np.ones((1, 4), np.float32)})
    assert int(out["dense"]) == len(value.raw_data) == 12


@pytest.mark.clause("STATE-WHOLE-STRUCT", "ZC-TRANSPORT")
def test_sequences_of_structs_are_transported_and_fields_read():
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["seq"]),
             helper.make_node("SequenceAt", ["seq", "one"], ["picked"]),
             helper.make_node("GetField", ["picked"], ["keys"], domain=LOCAL_DOMAIN, field="keys"),
             helper.make_node("ReduceSum", ["keys"], ["total"], keepdims=0)]
    model = model_of(nodes, [fvi("a", None), fvi("b", None)], [fvi("total", []), fvi("keys", None)],
                     [numpy_helper.from_array(np.array(1, np.int64), "one")])
    model.struct_types.append(cache_declaration())
    for vi in model.graph.input:
        set_struct(vi)
    b = empty_cache(2).replace(keys=np.full((1, 2, D), 0.5, np.float32))
    out = run_model(model, {"a": empty_cache(1), "b": b})
    assert out["keys"] is b["keys"] and float(out["total"]) == 0.5 * 2 * D


@pytest.mark.clause("ENC-NO-IMPLICIT-TENSOR")
def test_sequence_of_encoded_values_at_tensor_operator_fails():
    nodes = [helper.make_node("SequenceConstruct", ["w", "w"], ["seq"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)]
    model = model_of(nodes, [], [fvi("y", None)])
    model.graph.encoded_initializer.append(make_affine_value(np.ones(4, np.float32), T.INT8, np.float32(1),
                                                             name="w"))
    with pytest.raises(ContractError) as info:
        run_model(model, {})
    assert info.value.code is ErrorCode.CONSUMER_MISSING


@pytest.mark.clause("DEC-INLINE-CODEC")
def test_field_access_on_encoded_records_needs_a_codec():
    model = model_of([helper.make_node("GetField", ["w"], ["y"], domain=LOCAL_DOMAIN, field="scale")], [],
                     [fvi("y", None)])
    model.graph.encoded_initializer.append(encoded("w", 1102, bytes([0xE4] * 8 + [0, 0, 0, 0x40]), [32]))
    model.struct_types.extend(spec_struct_types())
    with pytest.raises(ContractError) as info:
        run_model(model, {})
    assert info.value.code is ErrorCode.CONSUMER_MISSING


def test_make_struct_checks_fields_against_the_catalogue():
    nodes = [helper.make_node("MakeStruct", ["k", "k", "n"], ["s"], domain=LOCAL_DOMAIN, type_id=CACHE_TYPE),
             helper.make_node("GetField", ["s"], ["length"], domain=LOCAL_DOMAIN, field="length")]
    model = model_of(nodes, [fvi("k", [1, "n", D]), helper.make_tensor_value_info("n", T.INT64, [])],
                     [helper.make_tensor_value_info("length", T.INT64, [])])
    model.struct_types.append(cache_declaration())
    k = np.zeros((1, 2, D), np.float32)
    assert int(run_model(model, {"k": k, "n": np.array(2, np.int64)})["length"]) == 2
    with pytest.raises(ContractError) as info:
        run_model(model, {"k": k, "n": np.array(2, np.int32)})
    assert info.value.code in (ErrorCode.EXECUTION_FAILED, ErrorCode.STATE_VALUE_INCOMPATIBLE)


@pytest.mark.clause("ZC-FAILURE")
def test_cancellation_is_checked_between_nodes():
    token = CancelToken()
    seen = []

    def cancel_here(inputs, attributes, ctx):
        seen.append("ran")
        token.cancel()
        return [inputs[0]]

    nodes = [helper.make_node("Cancel", ["x"], ["a"], domain="test"),
             helper.make_node("Neg", ["a"], ["y"])]
    model = model_of(nodes, [fvi("x", [1])], [fvi("y", [1])])
    executor = Executor(model, kernels={("test", "Cancel"): cancel_here})
    with pytest.raises(ContractError) as info:
        executor.run({"x": np.ones(1, np.float32)}, cancel=token)
    assert info.value.code is ErrorCode.STATE_CANCELLED and "node[1]" in info.value.path
    assert seen == ["ran"]


def test_operator_failure_is_classified_with_its_node():
    model = model_of([helper.make_node("Reshape", ["x", "shape"], ["y"])], [fvi("x", [4])], [fvi("y", None)],
                     [numpy_helper.from_array(np.array([3], np.int64), "shape")])
    with pytest.raises(ContractError) as info:
        run_model(model, {"x": np.ones(4, np.float32)})
    assert info.value.code is ErrorCode.EXECUTION_FAILED and "Reshape" in info.value.message


def test_unknown_operator_rejected_at_load():
    model = model_of([helper.make_node("Nope", ["x"], ["y"], domain="nowhere")], [fvi("x", [1])],
                     [fvi("y", [1])])
    with pytest.raises(ContractError) as info:
        Executor(model)
    assert info.value.code is ErrorCode.OPERATOR_UNSUPPORTED


def test_feed_type_mismatch_rejected():
    model = model_of([helper.make_node("Neg", ["x"], ["y"])], [fvi("x", [2])], [fvi("y", [2])])
    with pytest.raises(ContractError) as info:
        run_model(model, {"x": np.ones(3, np.float32)})
    assert info.value.code is ErrorCode.STATE_VALUE_INCOMPATIBLE
    with pytest.raises(ContractError) as info:
        run_model(model, {"x": StructValue({}, None)})
    assert info.value.code is ErrorCode.STATE_VALUE_INCOMPATIBLE


def test_loop_runs_through_standard_control_flow():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc", "x"], ["acc2"])],
        "body", [helper.make_tensor_value_info("i", T.INT64, []),
                 helper.make_tensor_value_info("cond_in", T.BOOL, []), fvi("acc", [2])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), fvi("acc2", [2])])
    loop = helper.make_node("Loop", ["n", "c", "x"], ["y"], body=body)
    model = model_of([loop], [fvi("x", [2]), helper.make_tensor_value_info("n", T.INT64, []),
                              helper.make_tensor_value_info("c", T.BOOL, [])], [fvi("y", [2])])
    feeds = {"x": np.ones(2, np.float32), "n": np.array(3, np.int64), "c": np.array(True)}
    out = run_model(model, feeds)
    expected = ReferenceEvaluator(export_standard(model).model).run(None, feeds)[0]
    np.testing.assert_array_equal(out["y"], expected)
    assert float(out["y"][0]) == 4.0
