"""Kernels the executor adds to onnx's reference operators.

Transport kernels (Identity, sequences, optionals) hand values on by reference, whatever they hold:
onnx's own Identity copies, which the contract forbids for state transport (clause ZC-TRANSPORT).
The local ``onnx_light`` domain holds the explicit consumers: ``Decode`` (encoded value -> its logical
tensor through a registered decoder), ``GetField`` and ``MakeStruct`` (whole structs by field).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from onnx import helper as onnx_helper
from onnx import numpy_helper

from reference_impl.decode import decode_value
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.values import EncodedValue, StructSpec, StructValue, check_value, compile_struct

LOCAL_DOMAIN = "onnx_light"

#: A kernel: (inputs, context) -> outputs. Attributes are bound when the node is compiled.
Kernel = Callable[[list, Any], Sequence]


def attribute_values(node) -> dict[str, Any]:
    """Static attribute values of a plain onnx node, in the forms onnx's reference ops use."""
    return {att.name: convert_attribute(att) for att in node.attribute if not att.ref_attr_name}


def convert_attribute(att) -> Any:
    value = onnx_helper.get_attribute_value(att)
    if att.type == att.FLOAT:
        return np.float32(value)
    if att.type == att.FLOATS:
        return [np.float32(v) for v in value]
    if att.type == att.STRING:
        return value.decode("utf-8")
    if att.type == att.STRINGS:
        return [v.decode("utf-8") for v in value]
    if att.type == att.TENSOR:
        return numpy_helper.to_array(value)
    return value


# ------------------------------------------------------------------------------------ transport ops
def _identity(inputs, ctx):
    return [inputs[0]]


def _sequence_construct(inputs, ctx):
    return [list(inputs)]


def _sequence_empty(inputs, ctx):
    return [[]]


def _sequence_at(inputs, ctx):
    seq, index = inputs
    return [seq[int(index)]]


def _sequence_length(inputs, ctx):
    return [np.array(len(inputs[0]), dtype=np.int64)]


def _sequence_insert(inputs, ctx):
    seq = list(inputs[0])
    if len(inputs) > 2 and inputs[2] is not None:
        position = int(inputs[2])
        seq.insert(position + len(seq) if position < 0 else position, inputs[1])
    else:
        seq.append(inputs[1])
    return [seq]


def _sequence_erase(inputs, ctx):
    seq = list(inputs[0])
    index = int(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else -1
    del seq[index]
    return [seq]


def _optional(inputs, ctx):
    return [inputs[0] if inputs else None]


def _optional_has_element(inputs, ctx):
    return [np.array(bool(inputs) and inputs[0] is not None)]


def _optional_get_element(inputs, ctx):
    if inputs[0] is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return [inputs[0]]


TRANSPORT: dict[str, Kernel] = {
    "Identity": _identity,
    "SequenceConstruct": _sequence_construct,
    "SequenceEmpty": _sequence_empty,
    "SequenceAt": _sequence_at,
    "SequenceLength": _sequence_length,
    "SequenceInsert": _sequence_insert,
    "SequenceErase": _sequence_erase,
    "Optional": _optional,
    "OptionalHasElement": _optional_has_element,
    "OptionalGetElement": _optional_get_element,
}


# ------------------------------------------------------------------------------ local-domain consumers
def make_decode(node, session) -> Kernel:
    def decode(inputs, ctx):
        value = inputs[0]
        if not isinstance(value, EncodedValue):
            raise violation(E.CONSUMER_MISSING if isinstance(value, StructValue) else E.EXECUTION_FAILED,
                            ctx.path, f"Decode needs an encoded value, got {type(value).__name__}")
        return [decode_value(value.to_proto(), session.catalogue, base_dir=value.base_dir or session.base_dir,
                             registry=session.registry)]
    return decode


def make_get_field(node, session) -> Kernel:
    name = attribute_values(node).get("field")
    if not name:
        raise violation(E.OPERATOR_UNSUPPORTED, "GetField", "GetField needs a 'field' attribute")

    def get_field(inputs, ctx):
        value = inputs[0]
        if isinstance(value, EncodedValue):
            raise violation(E.CONSUMER_MISSING, ctx.path,
                            f"field {name!r} of byte-encoded records needs a decoder or codec")
        if not isinstance(value, StructValue):
            raise violation(E.EXECUTION_FAILED, ctx.path, f"GetField needs a struct, got {type(value).__name__}")
        if name in value:
            return [value[name]]
        constant = session.struct_constant(value.type_id, name)
        if constant is None:
            raise violation(E.FIELD_NOT_FOUND, ctx.path, f"struct has no field {name!r}")
        return [constant]
    return get_field


def make_make_struct(node, session) -> Kernel:
    attrs = attribute_values(node)
    type_id = attrs.get("type_id")
    spec = None
    if type_id is not None:
        from reference_impl import schema

        spec = compile_struct(schema.StructTypeProto(type_ref=type_id), session.catalogue, "MakeStruct")
    names = attrs.get("fields")
    if names is None:
        if not isinstance(spec, StructSpec):
            raise violation(E.OPERATOR_UNSUPPORTED, "MakeStruct",
                            "MakeStruct needs 'fields' or a structure type_id")
        names = [field for field, _ in spec.fields]
    if len(names) != len(node.input):
        raise violation(E.OPERATOR_UNSUPPORTED, "MakeStruct", f"{len(node.input)} inputs for {len(names)} fields")

    def make_struct(inputs, ctx):
        value = StructValue(dict(zip(names, inputs)), type_id)
        if spec is not None:
            check_value(value, spec, ctx.path, E.EXECUTION_FAILED)
        return [value]
    return make_struct


LOCAL_KERNELS: dict[str, Callable[[Any, Any], Kernel]] = {
    "Decode": make_decode,
    "GetField": make_get_field,
    "MakeStruct": make_make_struct,
}
