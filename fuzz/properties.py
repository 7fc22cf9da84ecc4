"""Representation and KV properties as Hypothesis tests, shared by ``tests/test_properties*.py`` and the
``properties`` atheris target (which feeds them fuzzer bytes through ``fuzz_one_input``).

Each property states a law of the contract and checks the oracle against it with expectations that
come from the generators or from an independent implementation (NumPy, onnx's reference evaluator).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fuzz import checks, gen, kvscript
from fuzz.cases import FuzzCase, run_case, scratch
from fuzz.source import HypothesisSource
from fuzz.strategies import affine_values, near_valid_cases, profile, valid_models
from reference_impl import ContractError, affine, decode_value, dtypes, schema, verify_model
from reference_impl.structs import Catalogue


@profile()
@given(valid_models())
def valid_models_decode_as_generated(generated):
    """Every valid model verifies; every value decodes (or reads field by field) to what was encoded;
    bindings resolve as declared."""
    checks.check_valid(generated, scratch().populate(generated.files))


@profile()
@given(near_valid_cases())
def near_valid_models_fail_with_their_code(case):
    verdict, _ = run_case(case)
    assert verdict.code == case.expected, f"{case.rule}: {verdict}"


@profile()
@given(valid_models())
def serialization_round_trip(generated):
    """bytes -> message -> bytes is the identity, text format round-trips, and the verdict and record
    counts are the same whether the verifier is given the message or its bytes."""
    model = generated.model
    data = model.SerializeToString()
    parsed = schema.parse_model(data)
    assert parsed == model
    assert parsed.SerializeToString() == data
    assert schema.parse_text(schema.to_text(model), "ModelProto") == model
    base_dir = scratch().populate(generated.files)
    from_message = verify_model(model, base_dir=base_dir).encoded
    from_bytes = verify_model(data, base_dir=base_dir).encoded
    assert {k: (v.element_bytes, v.record_count, v.logical_count) for k, v in from_message.items()} == \
        {k: (v.element_bytes, v.record_count, v.logical_count) for k, v in from_bytes.items()}


@profile()
@given(valid_models(), st.randoms(use_true_random=False))
def catalogue_reordering_changes_nothing(generated, rng):
    """Permuting ModelProto.struct_types keeps every verdict, record count, field and decoded value."""
    base_dir = scratch().populate(generated.files)
    original = run_case(FuzzCase(generated.model, "all", files=generated.files), base_dir)
    shuffled = schema.ModelProto()
    shuffled.CopyFrom(generated.model)
    order = list(shuffled.struct_types)
    rng.shuffle(order)
    shuffled.ClearField("struct_types")
    shuffled.struct_types.extend(order)
    permuted = run_case(FuzzCase(shuffled, "all", files=generated.files), base_dir)
    assert original[0] == permuted[0]
    from fuzz.invariants import digest

    assert digest(original[1]) == digest(permuted[1])
    reordered = gen.Generated(shuffled, generated.files, generated.values, generated.catalogue, generated.bindings)
    checks.check_valid(reordered, base_dir)


@profile()
@given(valid_models())
def record_count_is_payload_length_over_element_size(generated):
    base_dir = scratch().populate(generated.files)
    verified = verify_model(generated.model, base_dir=base_dir)
    for value in generated.model.graph.encoded_initializer:
        info = verified.encoded[value.name]
        if value.WhichOneof("layout") != "struct_type":
            continue
        expected = generated.values[value.name]
        assert info.element_bytes == expected.record_bytes
        assert info.extent.length == expected.records * expected.record_bytes
        assert info.record_count == info.extent.length // info.element_bytes


def _float_input(draw_bytes: bytes, shape: tuple, low: float, high: float) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    raw = np.frombuffer(draw_bytes.ljust(count, b"\0"), np.uint8)[:count].astype(np.float64)
    return (low + (high - low) * raw / 255.0).reshape(shape)


@profile()
@given(st.sampled_from(sorted(gen.STORAGE_TYPES)), st.sampled_from(["tensor", "axis", "blocked"]),
       st.data())
def encode_then_decode_within_rounding(storage, granularity, data):
    """QuantizeLinear then decode returns every in-range input within half a step of its scale; each
    code is the nearest one (ties to even) and out-of-range inputs saturate."""
    value, _, _ = data.draw(affine_values(storage, granularity))
    layout = value.affine
    shape = tuple(d.dim_value for d in value.logical_type.tensor_type.shape.dim)
    from reference_impl.tensors import to_array

    scale = to_array(layout.scale, "scale").astype(np.float32)
    scale = np.where((scale == 0) | ~np.isfinite(scale), np.float32(0.5), np.abs(scale)).astype(np.float32)
    zp = to_array(layout.zero_point, "zp").astype(np.int64) if layout.HasField("zero_point") else None
    axis = layout.axis % len(shape) if layout.HasField("axis") else None
    block = layout.block_size if layout.HasField("block_size") else None
    lo, hi = gen.CODE_RANGE[storage]
    per_element_scale = gen.expected_dequantize(np.ones(shape), None, scale, axis, block, shape, np.float64)
    per_element_zp = np.zeros(shape) if zp is None else -gen.expected_dequantize(
        np.zeros(shape), zp, np.ones(np.shape(zp)), axis, block, shape, np.float64)
    x = _float_input(data.draw(st.binary(max_size=256)), shape, lo - 2, hi + 2)
    x = ((x - per_element_zp) * per_element_scale).astype(np.float32)
    encoded = affine.make_affine_value(x, storage, scale, zp, axis, block, name="x")
    decoded = decode_value(encoded, Catalogue([])).astype(np.float64)
    codes_float = x.astype(np.float64) / per_element_scale + per_element_zp
    inside = (codes_float >= lo) & (codes_float <= hi)
    error = np.abs(decoded - x.astype(np.float64))
    assert np.all(error[inside] <= per_element_scale[inside] * (0.5 + 1e-6)), "rounding beyond half a step"
    saturated = np.clip(np.rint(codes_float), lo, hi)
    np.testing.assert_array_equal(decoded[~inside], ((saturated - per_element_zp) * per_element_scale)[~inside]
                                  .astype(np.float32).astype(np.float64))


@profile(scale=0.5)
@given(affine_values())
def encoded_and_decoded_computation_agree(generated_value):
    """MatMul over DequantizeLinear(codes) in onnx's reference evaluator equals MatMul over the
    oracle's decoded tensor: the encoded and the decoded computation agree."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    value, expected, payload = generated_value
    value.raw_data = payload
    shape = tuple(d.dim_value for d in value.logical_type.tensor_type.shape.dim)
    decoded = decode_value(value, Catalogue([]))
    if not shape or decoded.dtype == dtypes.NUMPY_DTYPE[dtypes.BFLOAT16] or 0 in shape:
        return  # MatMul needs rank >= 1; onnx's evaluator has no bfloat16 MatMul
    if not np.all(np.isfinite(decoded)):
        return
    layout = value.affine
    codes = schema.TensorProto(name="codes", data_type=layout.storage_type, dims=list(shape), raw_data=payload)
    scale = schema.TensorProto()
    scale.CopyFrom(layout.scale)
    scale.name = "scale"
    initializers = [schema.to_onnx(codes), schema.to_onnx(scale)]
    inputs = ["codes", "scale"]
    if layout.HasField("zero_point"):
        zp = schema.TensorProto()
        zp.CopyFrom(layout.zero_point)
        zp.name = "zp"
        initializers.append(schema.to_onnx(zp))
        inputs.append("zp")
    attrs = {}
    if layout.HasField("axis"):
        attrs["axis"] = layout.axis
    if layout.HasField("block_size"):
        attrs["block_size"] = layout.block_size
    rng = np.random.default_rng(len(payload))
    x = rng.standard_normal(shape[-1:]).astype(decoded.dtype)
    out_type = helper.np_dtype_to_tensor_dtype(decoded.dtype)
    nodes = [helper.make_node("DequantizeLinear", inputs, ["w"], **attrs),
             helper.make_node("MatMul", ["w", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", out_type, list(x.shape))],
                              [helper.make_tensor_value_info("y", out_type, None)], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    encoded_result = ReferenceEvaluator(model).run(None, {"x": x})[0]
    dense_graph = helper.make_graph([helper.make_node("MatMul", ["w", "x"], ["y"])], "g",
                                    [helper.make_tensor_value_info("x", out_type, list(x.shape))],
                                    [helper.make_tensor_value_info("y", out_type, None)],
                                    initializer=[numpy_helper.from_array(decoded, "w")])
    dense = helper.make_model(dense_graph, opset_imports=[helper.make_opsetid("", 23)])
    decoded_result = ReferenceEvaluator(dense).run(None, {"x": x})[0]
    np.testing.assert_array_equal(encoded_result, decoded_result)
    assert TensorProto  # the plain onnx message classes back both graphs


@profile(scale=0.5)
@given(valid_models(max_values=3), affine_values(), st.data())
def executor_encoded_and_decoded_models_agree(generated, extra, data):
    """A model computing Sum(Decode(w)) over each encoded initializer gives the same result as the same
    model over dense initializers holding the decoded tensors (the oracle's executor, both ways)."""
    from onnx import numpy_helper

    from reference_impl.executor import Executor

    value, expected, payload = extra
    value.name, expected.name, value.raw_data = "extra_affine", "extra_affine", payload
    generated.model.graph.encoded_initializer.append(value)
    generated.values["extra_affine"] = expected
    base_dir = scratch().populate(generated.files)
    decodable = [name for name, exp in generated.values.items() if exp.kind in ("affine", "decoded")
                 and exp.decoded.size and exp.decoded.dtype in (np.float32, np.float64, np.float16)]
    if not decodable:
        return
    name = data.draw(st.sampled_from(decodable))
    encoded = schema.ModelProto()
    encoded.CopyFrom(generated.model)
    graph = encoded.graph
    del graph.node[:], graph.input[:], graph.output[:], graph.persistent_bindings[:]
    graph.node.add(op_type="Decode", domain="onnx_light", input=[name], output=["dense"])
    graph.node.add(op_type="ReduceSum", input=["dense"], output=["total"], name="sum")
    graph.node[-1].attribute.add(name="keepdims", type=2, i=0)
    out = graph.output.add(name="total")
    out.type.tensor_type.elem_type = {np.dtype(np.float32): 1, np.dtype(np.float64): 11,
                                      np.dtype(np.float16): 10}[generated.values[name].decoded.dtype]
    encoded.opset_import.add(domain="onnx_light", version=1)
    dense = schema.ModelProto()
    dense.CopyFrom(encoded)
    values = [v for v in dense.graph.encoded_initializer if v.name != name]
    dense.graph.ClearField("encoded_initializer")
    dense.graph.encoded_initializer.extend(values)
    tensor = schema.from_onnx(numpy_helper.from_array(generated.values[name].decoded, "dense"))
    dense.graph.initializer.append(tensor)
    del dense.graph.node[0]
    got = Executor(encoded, base_dir=base_dir).run({})["total"]
    want = Executor(dense, base_dir=base_dir).run({})["total"]
    np.testing.assert_array_equal(got, want)


def verdict_of(model) -> str:
    try:
        verify_model(model)
    except ContractError as error:
        return error.code.value
    return "accept"


@profile(scale=0.5)
@given(st.data())
def kv_scripts_equal_concatenation_and_dense_attention(data):
    """A KV script (``fuzz.kvscript``: appends, branches from old caches, held views, block conversions,
    attention) keeps its laws: every present equals the concatenation of what was appended, and paged
    attention equals dense Attention over the dequantized cache. Bridged so that campaigns explore the
    KV kernels too, not only the tests' state machine."""
    runner = kvscript.KVRunner.create(HypothesisSource(data.draw))
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        runner.step(HypothesisSource(data.draw))
        runner.check()


#: Properties the ``properties`` atheris target bridges, by index of the input's first byte.
BRIDGED = (valid_models_decode_as_generated, near_valid_models_fail_with_their_code, serialization_round_trip,
           catalogue_reordering_changes_nothing, record_count_is_payload_length_over_element_size,
           encode_then_decode_within_rounding, kv_scripts_equal_concatenation_and_dense_attention)
