"""Wire-level builders: models whose bytes are assembled by hand from field numbers, so the cases check
the frozen numbering (1000, 1001) and the survival of unknown fields independently of any schema."""

from __future__ import annotations

import numpy as np

from conformance.wire import field, field_varint, varint

from . import builder
from .common import IR_VERSION


def string(number: int, text: str) -> bytes:
    return field(number, text.encode())


def _float_tensor_type(dims) -> bytes:
    """TypeProto{tensor_type: Tensor{elem_type: FLOAT, shape: {dim...}}}."""
    shape = b"".join(field(1, field_varint(1, d)) for d in dims)
    return field(1, field_varint(1, 1) + field(2, shape))


def _uint8_scalar_type() -> bytes:
    return field(1, field_varint(1, 2) + field(2, b""))


@builder
def hand_encoded_struct_model():
    """ModelProto with struct_types (field 1000) holding a two-UINT8-field declaration 7, and a graph
    whose encoded_initializer (GraphProto field 1000) references it with two records."""
    decl = field_varint(10, 7) + field(2, field(1, string(1, "a") + field(2, _uint8_scalar_type()))
                                       + field(1, string(1, "b") + field(2, _uint8_scalar_type())))
    layout = field_varint(4, 7)  # StructTypeProto.type_ref
    value = field(2, layout) + field(4, bytes([1, 2, 3, 4])) + string(7, "v")  # struct_type, raw_data, name
    graph = string(2, "hand") + field(1000, value)
    opset = field(8, string(1, "") + field_varint(2, 23))
    model = field_varint(1, IR_VERSION) + opset + field(7, graph) + field(1000, decl)
    return {"model": model, "expected_fields": {"a": [[1], [3]], "b": [[2], [4]]}}


@builder
def hand_encoded_affine_model():
    """An affine encoded initializer written at GraphProto field 1000 by hand: INT8 codes [2, -4]
    with scale 0.5 (expected [1.0, -2.0])."""
    scale = field_varint(2, 1) + field(4, np.array([0.5], "<f4").tobytes())  # data_type, float_data (packed)
    affine = field_varint(1, 3) + field(2, scale)
    value = field(1, affine) + field(3, _float_tensor_type([2])) + field(4, bytes([2, 0xFC])) + string(7, "w")
    graph = string(2, "hand") + field(1000, value)
    model = field_varint(1, IR_VERSION) + field(8, field_varint(2, 23)) + field(7, graph)
    return {"model": model, "expected": np.array([1.0, -2.0], dtype=np.float32)}


@builder
def hand_encoded_bindings_model():
    """A pass-through graph with a persistent binding written at GraphProto field 1001 by hand."""
    from reference_impl import schema

    base = schema.parse_text('''
      ir_version: 13 opset_import { domain: "" version: 23 }
      graph { name: "g" node { op_type: "Add" input: "past" input: "x" output: "present" }
        input { name: "past" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }
        input { name: "x" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }
        output { name: "present" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } } }''')
    graph = base.graph.SerializeToString() + field(1001, string(1, "past") + string(2, "present"))
    base.ClearField("graph")
    return {"model": base.SerializeToString() + field(7, graph)}


#: graphs whose bindings the builder below writes at GraphProto field 1001 by hand: two tensor
#: accumulators, or a whole struct cache forwarded unchanged beside an INT64 call counter
_BOUND_GRAPHS = {
    "two_tensors": ("""
      ir_version: 13 opset_import { domain: "" version: 23 }
      graph { name: "two_bindings"
        node { op_type: "Add" input: "a" input: "x" output: "a_next" }
        node { op_type: "Mul" input: "b" input: "x" output: "b_next" }
        input { name: "a" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }
        input { name: "b" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }
        input { name: "x" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }
        output { name: "a_next" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }
        output { name: "b_next" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } } }""",
                    [("a", "a_next"), ("b", "b_next")]),
    "struct_and_counter": ("""
      ir_version: 13 opset_import { domain: "" version: 23 }
      struct_types { type_id: 7 name: "Cache" structure {
        field { name: "keys" type { tensor_type { elem_type: 1 shape { dim { dim_param: "n" } } } } } } }
      graph { name: "struct_and_counter"
        node { op_type: "Identity" input: "cache" output: "next_cache" }
        node { op_type: "Add" input: "calls" input: "one" output: "calls_next" }
        initializer { name: "one" data_type: 7 int64_data: 1 }
        input { name: "cache" type { struct_type { type_ref: 7 } } }
        input { name: "calls" type { tensor_type { elem_type: 7 shape { } } } }
        output { name: "next_cache" type { struct_type { type_ref: 7 } } }
        output { name: "calls_next" type { tensor_type { elem_type: 7 shape { } } } } }""",
                           [("cache", "next_cache"), ("calls", "calls_next")]),
}


@builder
def hand_encoded_bindings_state(graph: str):
    """A stateful model whose two persistent bindings are written by hand, each a PersistentBindingProto
    (input_name = 1, output_name = 2) at GraphProto field 1001; the rest of the model is ordinary."""
    from reference_impl import schema

    text, pairs = _BOUND_GRAPHS[graph]
    base = schema.parse_text(text)
    bindings = b"".join(field(1001, string(1, name) + string(2, output)) for name, output in pairs)
    encoded = base.graph.SerializeToString() + bindings
    base.ClearField("graph")
    return {"model": base.SerializeToString() + field(7, encoded)}


@builder
def hand_encoded_value_pair(layout: str):
    """Two encoded initializers, each its own GraphProto field 1000 written by hand: two affine INT8 values
    ("w1": codes [2, -4], scale 0.5; "w2": codes [6], scale 2.0), or two records of a two-UINT8-field struct
    declaration 7 (ModelProto field 1000) in "v1" ([1, 2], [3, 4]) and one in "v2" ([5, 6]). The cases read
    the first value, which a reader keeping only the last occurrence of field 1000 loses."""
    opset = field(8, string(1, "") + field_varint(2, 23))
    if layout == "affine":
        def affine(name, codes, scale, count):
            params = field_varint(2, 1) + field(4, np.array([scale], "<f4").tobytes())  # FLOAT scalar scale
            return field(1000, field(1, field_varint(1, 3) + field(2, params)) + field(3, _float_tensor_type([count]))
                         + field(4, bytes(codes)) + string(7, name))
        graph = string(2, "pair") + affine("w1", [2, 0xFC], 0.5, 2) + affine("w2", [6], 2.0, 1)
        return {"model": field_varint(1, IR_VERSION) + opset + field(7, graph),
                "expected": np.array([1.0, -2.0], dtype=np.float32)}
    decl = field_varint(10, 7) + field(2, field(1, string(1, "a") + field(2, _uint8_scalar_type()))
                                       + field(1, string(1, "b") + field(2, _uint8_scalar_type())))
    def struct_value(name, payload):
        return field(1000, field(2, field_varint(4, 7)) + field(4, bytes(payload)) + string(7, name))
    graph = string(2, "pair") + struct_value("v1", [1, 2, 3, 4]) + struct_value("v2", [5, 6])
    return {"model": field_varint(1, IR_VERSION) + opset + field(7, graph) + field(1000, decl)}


@builder
def unknown_fields(where: str):
    """The spec example catalogue model with unknown fields spliced in at ``where``: model (field 1099),
    graph (field 1098), encoded value (field 99), struct declaration (field 99) or all of them."""
    from reference_impl import schema

    from .common import encoded, model, spec_catalogue

    m = model("unknown")
    m.struct_types.extend(spec_catalogue())
    m.graph.encoded_initializer.append(encoded("v", 1102, bytes([0xE4] * 8) + np.array([2.0], "<f4").tobytes(),
                                               [32]))
    extra = field(1099, b"future model data") if where in ("model", "all") else b""
    graph = m.graph.SerializeToString()
    if where in ("graph", "all"):
        graph += field(1098, b"future graph data") + field_varint(1097, 5)
    if where in ("value", "all"):
        value = m.graph.encoded_initializer[0].SerializeToString() + field(99, b"future value data")
        head = schema.GraphProto()
        head.ParseFromString(graph)
        head.ClearField("encoded_initializer")
        graph = head.SerializeToString() + field(1000, value)
    decls = b""
    for decl in m.struct_types:
        decls += field(1000, decl.SerializeToString() + (field(99, b"future decl") if where in ("decl", "all")
                                                          else b""))
    m.ClearField("graph")
    m.ClearField("struct_types")
    return {"model": m.SerializeToString() + field(7, graph) + decls + extra,
            "expected": np.tile(np.array([-2.0, -0.5, 0.5, 2.0], np.float32), 8)}


@builder
def garbage(kind: str):
    """Bytes that are not a valid ModelProto: a length prefix running past the end."""
    return {"model": field_varint(1, IR_VERSION) + varint(7 << 3 | 2) + varint(50) + b"\x00\x01"}


@builder
def raw_model(base64: str):
    """A model given as raw bytes (base64): inputs that protobuf text format cannot express, such as
    string fields holding invalid UTF-8 (proto2 does not validate them)."""
    import base64 as b64

    return {"model": b64.b64decode(base64)}
