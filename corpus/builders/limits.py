"""Builders for the implementation-limit cases (corpus/cases/limits/nesting.toml, and the depth and diamond
cases of corpus/cases/declarations/ and corpus/cases/catalogue/): nesting measured through reference chains
whether or not a value uses them, inline and reference levels adding up (in a declaration or a graph input),
a layout whose deepest level is a type_ref expansion, a catalogue of nested diamonds, and bindings carrying
the field-path tags of an earlier draft. Levels are counted by hand in each docstring: every TypeProto and
every type_ref expansion is one level (onnx-light's kMaxStructTypeDepth = 64).
"""

from __future__ import annotations

from conformance.wire import field

from . import builder
from .common import model


def _chain(m, first_id: int, depth: int) -> None:
    """Declarations first_id .. first_id + depth - 1: each holds one UINT8 ``b`` and, except the last,
    ``next`` referencing the one after it. The last declaration reaches 1 level (its ``b`` field);
    each one before it 2 more (the ``next`` TypeProto and the type_ref expansion): the first reaches
    2 * depth - 1 levels."""
    for k in range(first_id, first_id + depth):
        decl = m.struct_types.add(type_id=k)
        leaf = decl.structure.field.add(name="b").type.tensor_type
        leaf.elem_type = 2
        leaf.shape.SetInParent()
        if k < first_id + depth - 1:
            decl.structure.field.add(name="next").type.struct_type.type_ref = k + 1


@builder
def unused_reference_chain(depth: int, used: bool = False):
    """A ``depth``-declaration chain (type 1 reaches 2 * depth - 1 levels). With ``used``, one record of
    zeros uses type 1 as its layout, which adds the layout's own type_ref expansion (2 * depth levels)."""
    from reference_impl import schema

    m = model("chain")
    _chain(m, 1, depth)
    if used:
        value = schema.EncodedValueProto(name="v", raw_data=bytes(depth))
        value.struct_type.type_ref = 1
        m.graph.encoded_initializer.append(value)
    return {"model": m}


@builder
def inline_and_reference_nesting(sequences: int, chain: int, graph_input: bool = False):
    """Declaration 100 holds a field typed by ``sequences`` nested sequence types around a reference to
    a ``chain``-declaration chain starting at type 1: its deepest level is the field's TypeProto (1),
    each sequence element type (``sequences``), the type_ref expansion (1) and the chain
    (2 * chain - 1): sequences + 2 * chain + 1 levels, while each part alone stays far below 64.
    With ``graph_input`` the same type is graph input ``deep``'s instead, counted the same way from the
    input's TypeProto (1): no declaration holds the whole depth, only the input's type reaches it."""
    m = model("mixed")
    _chain(m, 1, chain)
    if graph_input:
        tp = m.graph.input.add(name="deep").type
    else:
        tp = m.struct_types.add(type_id=100).structure.field.add(name="deep").type
    for _ in range(sequences):
        tp = tp.sequence_type.elem_type
    tp.struct_type.type_ref = 1
    return {"model": m}


@builder
def reference_chain_to_packing(depth: int):
    """Declarations 1 .. ``depth``: each but the last holds one UINT8 ``b`` and ``next`` referencing the one
    after it; the last is a bit packing of one 8-bit component. Value ``v``'s inline layout holds field
    ``f`` referencing type 1. Levels: ``f``'s TypeProto (1), the type_ref expansion to type 1 (2), and per
    declaration after it its ``next`` TypeProto and type_ref expansion (2 each): the expansion to the bit
    packing, the deepest level (nothing below it), is level 2 * depth. One record of ``depth`` bytes."""
    from reference_impl import schema

    m = model("chain_to_packing")
    for k in range(1, depth + 1):
        decl = m.struct_types.add(type_id=k)
        if k == depth:
            decl.bit_packing.component.add(name="a", bit_width=8)
            decl.bit_packing.dimension = 1
            continue
        leaf = decl.structure.field.add(name="b").type.tensor_type
        leaf.elem_type = 2
        leaf.shape.SetInParent()
        decl.structure.field.add(name="next").type.struct_type.type_ref = k + 1
    value = schema.EncodedValueProto(name="v", raw_data=bytes(depth))
    value.struct_type.structure.field.add(name="f").type.struct_type.type_ref = 1
    m.graph.encoded_initializer.append(value)
    return {"model": m}


@builder
def reference_diamonds(levels: int):
    """``levels`` layers of two declarations each (types 2k - 1 and 2k in layer k), every one a structure of
    fields ``a`` and ``b`` referencing the two declarations of the next layer, and type 2 * ``levels`` + 1, one
    UINT8, below the last layer (both fields of the last layer reference it): 2 ** (``levels`` - 1) reference
    paths lead from type 1 to it, through distinct declarations at every step. Type 1 reaches 2 * ``levels``
    + 1 levels (a TypeProto and a type_ref expansion per layer, then the leaf's TypeProto). No value uses
    them: only the catalogue is verified."""
    m = model("diamonds")
    leaf_id = 2 * levels + 1
    for k in range(1, levels + 1):
        below = (2 * k + 1, 2 * k + 2) if k < levels else (leaf_id, leaf_id)
        for type_id in (2 * k - 1, 2 * k):
            fields = m.struct_types.add(type_id=type_id).structure.field
            for name, ref in zip(("a", "b"), below):
                fields.add(name=name).type.struct_type.type_ref = ref
    leaf = m.struct_types.add(type_id=leaf_id).structure.field.add(name="x").type.tensor_type
    leaf.elem_type = 2
    leaf.shape.SetInParent()
    return {"model": m}


@builder
def legacy_binding_field_path(tag: int):
    """A struct cache bound back to itself, whose PersistentBindingProto also carries field ``tag`` (3
    input_field_path or 4 output_field_path of an earlier draft) selecting ``keys``, spliced in by hand:
    text format cannot write a field the frozen message does not have."""
    from reference_impl import schema

    m = schema.parse_text('''
      ir_version: 13 opset_import { domain: "" version: 23 }
      struct_types { type_id: 7 name: "Cache" structure {
        field { name: "keys" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }
        field { name: "length" type { tensor_type { elem_type: 7 shape { } } } } } }
      graph { name: "g" node { op_type: "Identity" input: "cache" output: "next" }
        input { name: "cache" type { struct_type { type_ref: 7 } } }
        output { name: "next" type { struct_type { type_ref: 7 } } }
        persistent_bindings { input_name: "cache" output_name: "next" } }''')
    binding = m.graph.persistent_bindings[0].SerializeToString() + field(tag, b"keys")
    del m.graph.persistent_bindings[:]
    graph = m.graph.SerializeToString() + field(1001, binding)
    m.ClearField("graph")
    return {"model": m.SerializeToString() + field(7, graph)}
