"""The extended schema: field numbers, wire compatibility with plain onnx, text format, shipped .proto."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from google.protobuf import descriptor_pb2, unknown_fields
from onnx import helper, numpy_helper

from reference_impl import examples, proto_render, schema

pytestmark = pytest.mark.clause("WIRE-FIELDS", "WIRE-BINDINGS-FIELD", "WIRE-LOCAL-EXTENSION")


def _number(message_cls, field: str) -> int:
    return message_cls.DESCRIPTOR.fields_by_name[field].number


@pytest.mark.clause("WIRE-SCHEMA", "WIRE-LOCAL-RANGE", "WIRE-NO-PREPARED", "BIND-GRAPH-LEVEL", "BIND-NO-CONTENTS")
def test_extension_field_numbers_are_the_frozen_ones():
    assert _number(schema.TypeProto, "struct_type") == 1000
    assert schema.TypeProto.DESCRIPTOR.fields_by_name["struct_type"].containing_oneof.name == "value"
    assert _number(schema.GraphProto, "encoded_initializer") == 1000
    assert _number(schema.GraphProto, "persistent_bindings") == 1001
    assert _number(schema.ModelProto, "struct_types") == 1000
    expected = {
        "AffineLayoutProto": {"storage_type": 1, "scale": 2, "zero_point": 3, "axis": 4, "block_size": 5},
        "EncodedValueProto": {"affine": 1, "struct_type": 2, "logical_type": 3, "raw_data": 4,
                              "external_data": 5, "data_location": 6, "name": 7, "doc_string": 8},
        "StructTypeProto": {"array": 1, "structure": 2, "bit_packing": 3, "type_ref": 4, "decoder": 5,
                            "encoder": 6, "name": 7, "doc_string": 8, "metadata_props": 9, "type_id": 10},
        "PersistentBindingProto": {"input_name": 1, "output_name": 2},
    }
    for name, fields in expected.items():
        cls = schema.MESSAGE_CLASSES[name]
        assert {f.name: f.number for f in cls.DESCRIPTOR.fields} == fields
    nested = schema.StructTypeProto.DESCRIPTOR.nested_types_by_name
    assert {f.name: f.number for f in nested["Array"].fields} == {"element_type": 1, "dimension": 2}
    assert {f.name: f.number for f in nested["BitPacking"].fields} == {"component": 1, "dimension": 2}
    field = nested["Structure"].nested_types_by_name["Field"]
    assert {f.name: f.number for f in field.fields} == {"name": 1, "type": 2, "constant": 4, "doc_string": 3}
    assert {f.name for f in field.oneofs_by_name["content"].fields} == {"type", "constant"}
    kinds = schema.StructTypeProto.DESCRIPTOR.oneofs_by_name["kind"].fields
    assert {f.name for f in kinds} == {"array", "structure", "bit_packing", "type_ref"}


def test_every_onnx_message_keeps_its_fields():
    for name, descriptor in onnx.onnx_ml_pb2.DESCRIPTOR.message_types_by_name.items():
        ours = schema.MESSAGE_CLASSES[name].DESCRIPTOR
        theirs = {f.number: (f.name, f.type) for f in descriptor.fields}
        assert {n: v for n, v in ((f.number, (f.name, f.type)) for f in ours.fields) if n in theirs} == theirs


def _plain_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, "n"])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, "n"])
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    node = helper.make_node("Add", ["x", "x"], ["y"], doc_string="double")
    graph = helper.make_graph([node], "g", [x], [y], initializer=[w])
    return helper.make_model(graph, producer_name="test", opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.clause("REP-TENSORPROTO-COMPAT")
def test_plain_onnx_bytes_reserialize_byte_identically():
    data = _plain_model().SerializeToString()
    assert schema.parse_model(data).SerializeToString() == data


def test_extended_model_loads_in_plain_onnx_with_extensions_as_unknown_fields():
    model = examples.spec_example_model()
    model.graph.persistent_bindings.add(input_name="past", output_name="present")
    data = model.SerializeToString()
    plain = onnx.ModelProto()
    plain.ParseFromString(data)
    assert [f.field_number for f in unknown_fields.UnknownFieldSet(plain)] == [1000] * 5
    graph_unknown = sorted({f.field_number for f in unknown_fields.UnknownFieldSet(plain.graph)})
    assert graph_unknown == [1000, 1001]
    assert plain.SerializeToString() == data  # the extensions survive a plain onnx round trip
    assert schema.parse_model(plain.SerializeToString()) == model


@pytest.mark.clause("WIRE-ROUNDTRIP")
def test_text_format_round_trips_every_extension_message():
    model = examples.spec_example_model()
    model.graph.persistent_bindings.add(input_name="a.b", output_name="c\\d")
    text = schema.to_text(model)
    assert schema.parse_text(text) == model
    for name in ("AffineLayoutProto", "EncodedValueProto", "StructTypeProto", "PersistentBindingProto"):
        message = schema.MESSAGE_CLASSES[name]()
        assert schema.parse_text(schema.to_text(message), name) == message


def test_to_onnx_and_back_preserves_extensions():
    model = examples.spec_example_model()
    assert schema.from_onnx(schema.to_onnx(model)) == model


def test_shipped_proto_file_is_current():
    assert proto_render.PROTO_PATH.read_text() == proto_render.render()


def _strip_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        field.ClearField("json_name")
    for nested in message.nested_type:
        _strip_json_names(nested)


def test_shipped_proto_compiles_to_the_same_descriptor(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc")
    source = tmp_path / "onnx-light.proto"
    shutil.copy(proto_render.PROTO_PATH, source)
    out = tmp_path / "out.pb"
    result = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path}",
                             f"--descriptor_set_out={out}", str(source)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert protoc is not None
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    ours = schema.build_file_descriptor()
    compiled.name = ours.name
    for fdp in (compiled, ours):
        fdp.ClearField("source_code_info")
        for message in fdp.message_type:
            _strip_json_names(message)
    assert compiled == ours
