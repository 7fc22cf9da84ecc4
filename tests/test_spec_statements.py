"""Statements of the spec that the older tests did not exercise on their own: the model stays immutable
and owned by its session, string values outside the retained state keep working, a struct value needs
no logical type, the proto library holds messages only, export preserves structured initializers and
deduplication compares semantic profiles."""

from __future__ import annotations

import gc
import pathlib

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from test_state_models import D, kv_model, tokens

from reference_impl import schema
from reference_impl.bits import pack_sub_byte
from reference_impl.decode import decode, read_fields
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.examples import encoded, spec_example_model
from reference_impl.graph_utils import copy_model, deduplicate_initializers, export_standard
from reference_impl.state import make_state
from reference_impl.structs import Catalogue

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _empty_past() -> np.ndarray:
    return np.zeros((1, 0, D), np.float32)


@pytest.mark.clause("STATE-MODEL-IMMUTABLE")
def test_running_a_state_never_changes_the_model():
    model = kv_model()
    before = model.SerializeToString(deterministic=True)
    state = make_state(model, {"past_key": _empty_past()})
    for step in range(3):
        state.run({"tokens": tokens(step)})
    state.reset({"past_key": _empty_past()})
    state.close()
    assert model.SerializeToString(deterministic=True) == before


@pytest.mark.clause("STATE-MODEL-OWNER")
def test_a_state_keeps_its_model_alive_after_the_caller_lets_go():
    model = kv_model()
    state = make_state(model, {"past_key": _empty_past()})
    del model
    gc.collect()
    first = state.run({"tokens": tokens(1)})
    second = state.run({"tokens": tokens(2)})
    assert second["present_key"].shape == (1, 2, D)
    np.testing.assert_array_equal(second["present_key"][:, :1], first["present_key"])


def _string_passthrough_model():
    """A bound float accumulator next to a string feed and output that are not retained."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["past", "x"], ["present"]), helper.make_node("Identity", ["label"], ["echo"])],
        "strings", [helper.make_tensor_value_info("past", T.FLOAT, [2]),
                    helper.make_tensor_value_info("x", T.FLOAT, [2]),
                    helper.make_tensor_value_info("label", T.STRING, [1])],
        [helper.make_tensor_value_info("present", T.FLOAT, [2]),
         helper.make_tensor_value_info("echo", T.STRING, [1])])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    model.graph.persistent_bindings.add(input_name="past", output_name="present")
    return model


@pytest.mark.clause("ZC-STRINGS-NONPERSISTENT")
def test_nonpersistent_string_feeds_and_outputs_still_work():
    state = make_state(_string_passthrough_model(), {"past": np.zeros(2, np.float32)})
    out = state.run({"x": np.ones(2, np.float32), "label": np.array([b"caf\xc3\xa9"], dtype=object)})
    assert out["echo"].tolist() == [b"caf\xc3\xa9"]
    assert set(state.values) == {"past"}
    np.testing.assert_array_equal(state.values["past"], [1, 1])


@pytest.mark.clause("ENC-LOGICAL-OPTIONAL")
def test_a_struct_value_without_logical_type_is_valid_and_readable():
    model = spec_example_model()
    codes = np.arange(128) % 16 - 8  # INT4 codes
    value = encoded("untyped", 1003, pack_sub_byte(codes, 4), None)
    assert not value.HasField("logical_type")
    model.graph.encoded_initializer.append(value)
    fields = read_fields(value, Catalogue(model.struct_types))
    np.testing.assert_array_equal(fields["values"].reshape(-1), codes)
    # The registered decoder exposes its own dimensions when no logical type pins them.
    assert decode(model, "untyped").size == 128


@pytest.mark.clause("DEC-OUTSIDE-PROTO")
def test_the_proto_library_source_declares_messages_only():
    """No service, extension or option a codec would need: codecs stay outside the proto library."""
    text = (ROOT / "reference_impl" / "proto" / "onnx-light.proto").read_text()
    statements = [line.split("//")[0].strip() for line in text.splitlines()]
    for word in ("service", "rpc", "extend", "import"):
        assert not any(line.split(" ")[0] == word for line in statements), word
    code = "\n".join(statements)
    assert "option optimize_for" not in code or "LITE_RUNTIME" in code


@pytest.mark.clause("EXP-PRESERVE-STRUCT")
def test_copy_and_standard_export_preserve_structured_initializers():
    model = spec_example_model()
    value = model.graph.encoded_initializer[0]
    value.ClearField("raw_data")
    value.external_data.add(key="location", value="weights.bin")
    value.external_data.add(key="length", value="64")
    value.external_data.add(key="offset", value="8")
    value.data_location = T.EXTERNAL
    clone = copy_model(model)
    assert clone.struct_types == model.struct_types
    assert list(clone.graph.encoded_initializer) == list(model.graph.encoded_initializer)
    kept = clone.graph.encoded_initializer[0]
    assert [(e.key, e.value) for e in kept.external_data] == [("location", "weights.bin"), ("length", "64"),
                                                             ("offset", "8")]
    with pytest.raises(ContractError) as info:  # never exported by silently dropping the values
        export_standard(model)
    assert info.value.code is ErrorCode.EXPORT_UNSUPPORTED


def _affine_value(name: str, scale: float, storage: int = T.INT8) -> schema.EncodedValueProto:
    value = schema.EncodedValueProto(name=name, raw_data=bytes([1, 2, 0x83, 0xFF]))
    value.affine.storage_type = storage
    value.affine.scale.data_type = T.FLOAT
    value.affine.scale.float_data.append(scale)
    value.logical_type.tensor_type.elem_type = T.FLOAT
    value.logical_type.tensor_type.shape.dim.add(dim_value=4)
    return value


@pytest.mark.clause("EXP-DEDUP")
def test_deduplication_compares_semantic_profiles_not_bytes():
    from reference_impl.executor import LOCAL_DOMAIN, run_model

    model = schema.ModelProto(ir_version=10)
    model.opset_import.add(domain="", version=21)
    model.opset_import.add(domain=LOCAL_DOMAIN, version=1)
    model.graph.name = "g"
    values = [_affine_value("a", 0.5), _affine_value("b", 0.25), _affine_value("c", 0.5),
              _affine_value("d", 0.5, T.UINT8)]
    model.graph.encoded_initializer.extend(values)
    for name in "abcd":
        model.graph.node.add(op_type="Decode", domain=LOCAL_DOMAIN, input=[name], output=[f"y_{name}"])
        model.graph.output.add(name=f"y_{name}")
    deduplicated = deduplicate_initializers(model)
    # c equals a in every respect and is merged; b (another scale) and d (another storage type) share
    # a's payload bytes only and stay.
    assert [v.name for v in deduplicated.graph.encoded_initializer] == ["a", "b", "d"]
    assert [n.input[0] for n in deduplicated.graph.node] == ["a", "b", "a", "d"]
    before, after = run_model(model, {}), run_model(deduplicated, {})
    for name in "abcd":
        np.testing.assert_array_equal(after[f"y_{name}"], before[f"y_{name}"])
    assert not np.array_equal(before["y_a"], before["y_b"]) and not np.array_equal(before["y_a"], before["y_d"])


@pytest.mark.clause("DEC-DEFINES-MAPPING")
def test_the_registered_decoder_defines_the_block_to_element_mapping():
    """Two decoders for Int4Block that place a block's codes differently are both the contract's: the
    payload and its validation are the same, only the registered decoder's mapping differs."""
    from reference_impl.decoders import DecoderRegistry, decode_int4_block, spec_catalogue
    from reference_impl.examples import int4_block_payload

    def reversed_within_blocks(layout, payload):
        return decode_int4_block(layout, payload).reshape(-1, 32)[:, ::-1].reshape(-1)

    storage_order, reversed_order = DecoderRegistry(), DecoderRegistry()
    storage_order.register(2001, "Int4Block", spec_catalogue(), decode_int4_block)
    reversed_order.register(2001, "Int4BlockReversed", spec_catalogue(), reversed_within_blocks)
    codes = (np.arange(64) % 16 - 8).reshape(2, 32)
    model = spec_example_model()
    model.graph.encoded_initializer.append(
        encoded("blocks", 2001, int4_block_payload(codes, np.array([1.0, 0.5], np.float32)), [64]))
    ours = decode(model, "blocks", registry=storage_order)
    theirs = decode(model, "blocks", registry=reversed_order)
    np.testing.assert_array_equal(ours, (codes * np.array([[1.0], [0.5]])).reshape(-1))
    np.testing.assert_array_equal(theirs, ours.reshape(2, 32)[:, ::-1].reshape(-1))
