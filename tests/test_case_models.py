"""Case models are valid ONNX apart from the one rule each case tests.

A model with a second, unintended fault lets a correct runtime refuse it for that fault first, with a
code of its own, and fail a Required case the spec does not let it fail."""

from __future__ import annotations

import onnx
import pytest
from google.protobuf.message import DecodeError, Message
from plain_models import plain_onnx

from conformance.cases import load_cases, select
from reference_impl import schema

#: The first IR version with each element type (onnx.proto's IR version history): FLOAT8 types came
#: with 9, INT4/UINT4 with 10, FLOAT4E2M1 with 11, FLOAT8E8M0 with 12, UINT2/INT2 with 13.
_FIRST_IR = {onnx.TensorProto.FLOAT8E4M3FN: 9, onnx.TensorProto.FLOAT8E4M3FNUZ: 9, onnx.TensorProto.FLOAT8E5M2: 9,
             onnx.TensorProto.FLOAT8E5M2FNUZ: 9, onnx.TensorProto.UINT4: 10, onnx.TensorProto.INT4: 10,
             onnx.TensorProto.FLOAT4E2M1: 11, onnx.TensorProto.FLOAT8E8M0: 12, onnx.TensorProto.UINT2: 13,
             onnx.TensorProto.INT2: 13}
_TYPE_FIELDS = {"data_type", "elem_type", "storage_type", "key_type"}
_TYPE_ATTRIBUTES = {"to", "output_dtype", "dtype"}


def _element_types(message: Message, found: set[int]) -> set[int]:
    """Every element type a model names: tensor and value types, affine storage, map keys, type attributes."""
    for field, value in message.ListFields():
        if isinstance(value, Message):
            _element_types(value, found)
        elif field.message_type is not None:
            for item in value:
                _element_types(item, found)
        elif field.name in _TYPE_FIELDS and isinstance(value, int):
            found.add(value)
    if message.DESCRIPTOR.name == "AttributeProto" and message.name in _TYPE_ATTRIBUTES and message.HasField("i"):
        found.add(message.i)
    return found


def _models():
    """Every case model that parses (the wire cases' deliberately corrupt bytes do not)."""
    for case in load_cases():
        model_bytes = case.model_bytes()
        if model_bytes is None:
            continue
        try:
            model = schema.parse_model(model_bytes)
        except DecodeError:
            continue
        yield case, model


def test_every_case_model_declares_an_ir_version_that_has_its_element_types():
    too_old = {}
    for case, model in _models():
        types = _element_types(model, set())
        if model.ir_version < max((_FIRST_IR.get(t, 0) for t in types), default=0):
            too_old[case.id] = (model.ir_version, sorted(types))
    assert not too_old, too_old


def test_every_case_model_declares_an_ir_version_that_has_its_opsets():
    """Opset 23 came with IR 11, 24 with 12, 25 with 13 (onnx's own version table)."""
    too_old = {}
    for case, model in _models():
        standard = [onnx.helper.make_opsetid(o.domain, o.version) for o in model.opset_import
                    if o.domain in ("", "ai.onnx", "ai.onnx.ml")]
        needed = onnx.helper.find_min_ir_version_for(standard) if standard else 0
        if model.ir_version < needed:
            too_old[case.id] = (model.ir_version, needed)
    assert not too_old, too_old


def test_the_element_type_scan_sees_affine_storage_and_cast_targets():
    """The check above is only as good as its scan: it must find a type named only as affine storage or as
    a Cast target."""
    case = select(load_cases(), ["Required.Affine.AgreesWithDequantizeLinear.Int2_*"])[0]
    model = schema.parse_model(case.model_bytes())
    assert onnx.TensorProto.INT2 in _element_types(model, set())
    node = onnx.helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.UINT2)
    assert _element_types(node, set()) == {onnx.TensorProto.UINT2}


@pytest.mark.clause("BIND-COMPATIBLE")
def test_binding_mismatch_models_are_otherwise_valid_onnx():
    """A binding mismatch must be the only fault of its model: a runtime that type-checks the graph first
    (onnx's strict shape inference does) would otherwise refuse it for an ill-typed node instead. Checked
    on every mismatch and string row whose types onnx knows (tensors, maps, and sequences and optionals of
    them)."""
    checked = []
    for case in select(load_cases(), ["Required.Bindings.Dimensions.*", "Required.Bindings.Rank.*",
                                      "Required.Bindings.ElementTypes.*", "Required.Bindings.Nested.*",
                                      "Required.Bindings.Strings.*"]):
        model = schema.parse_model(case.model_bytes())
        if model.struct_types or any("struct_type" in str(value.type)
                                     for value in (*model.graph.input, *model.graph.output)):
            continue  # an onnx-light struct type
        onnx.checker.check_model(plain_onnx(case), full_check=True)
        checked.append(case.id)
    assert {"Required.Bindings.Dimensions.MapValueDimConflict", "Required.Bindings.Strings.OptionalMapOfStrings",
            "Required.Bindings.Nested.MapKeyInt32ForInt64"} <= set(checked), checked
    assert len(checked) >= 10, checked


