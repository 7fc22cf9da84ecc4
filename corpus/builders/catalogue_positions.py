"""Builders for the position cases (corpus/cases/<area>/positions.toml): every list a runtime walks, with one
offending item placed first, in the middle or last among valid ones.

A slot is a model frame with one list in it (catalogue entries, the fields of a declaration, the
components of a bit packing, graph inputs, outputs and value infos, If and Loop nodes with subgraphs,
encoded initializers, affine initializers, external payloads); ``valid(i)`` is item ``i`` when it is
well formed, and each fault names the item that breaks one rule. ``position_model(slot, fault,
position)`` puts the faulty item at index 0, 1 or 2 of three. A check that looks only at the first item,
only at the last, or only at both ends, accepts one of the three models; the rule rejects them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference_impl import schema

from . import builder

HEAD = 'ir_version: 13\nopset_import { domain: "" version: 23 }\n'
#: one UINT8 scalar: a fixed-size leaf of one byte
U8 = 'tensor_type { elem_type: 2 shape { } }'
#: declaration 6: two UINT8 fields, records of two bytes
LEAF6 = (f'struct_types {{ type_id: 6 structure {{ field {{ name: "a" type {{ {U8} }} }} '
         f'field {{ name: "b" type {{ {U8} }} }} }} }}\n')
POSITIONS = {"First": 0, "Middle": 1, "Last": 2}
COUNT = 3


@dataclass(frozen=True)
class Slot:
    """A model ``frame`` whose ``ITEMS`` is replaced by three items, ``valid`` or faulty (by fault name)."""

    frame: str
    valid: object
    faults: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)


def _field(i: int, content: str) -> str:
    return f'field {{ name: "f{i}" {content} }}'


def _if_node(i: int, branch_type: str) -> str:
    def branch(name: str) -> str:
        return f'g {{ name: "{name}{i}" output {{ name: "o{i}" type {{ {branch_type} }} }} }}'
    return (f'node {{ op_type: "If" input: "c" output: "y{i}" '
            f'attribute {{ name: "then_branch" type: GRAPH {branch("t")} }} '
            f'attribute {{ name: "else_branch" type: GRAPH {branch("e")} }} }}')


def _loop_node(i: int, carried_type: str) -> str:
    scalar = 'tensor_type { elem_type: %d shape { } }'
    body = (f'g {{ name: "body{i}" input {{ name: "n{i}" type {{ {scalar % 7} }} }} '
            f'input {{ name: "c{i}" type {{ {scalar % 9} }} }} input {{ name: "s{i}" type {{ {carried_type} }} }} '
            f'output {{ name: "k{i}" type {{ {scalar % 9} }} }} output {{ name: "r{i}" type {{ {carried_type} }} }} '
            f'node {{ op_type: "Identity" input: "c{i}" output: "k{i}" }} '
            f'node {{ op_type: "Identity" input: "s{i}" output: "r{i}" }} }}')
    return (f'node {{ op_type: "Loop" input: "m" input: "c" input: "s" output: "z{i}" '
            f'attribute {{ name: "body" type: GRAPH {body} }} }}')


def _encoded(i: int, layout: str, raw: str) -> str:
    return f'encoded_initializer {{ name: "v{i}" {layout} raw_data: "{raw}" }}'


def _affine(i: int, layout: str, raw: str = "\\x01\\x02\\x03\\x04") -> str:
    logical = 'logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 4 } } } }'
    return f'encoded_initializer {{ name: "w{i}" affine {{ {layout} }} {logical} raw_data: "{raw}" }}'


def _external(i: int, keys: str) -> str:
    return f'encoded_initializer {{ name: "v{i}" struct_type {{ type_ref: 6 }} data_location: EXTERNAL {keys} }}'


def _ext_keys(i: int, length: str | None = "2", offset: int | None = None) -> str:
    keys = 'external_data { key: "location" value: "payload.bin" } '
    keys += f'external_data {{ key: "offset" value: "{2 * i if offset is None else offset}" }} '
    if length is not None:
        keys += f'external_data {{ key: "length" value: "{length}" }}'
    return keys


def _decl(i: int, body: str) -> str:
    return f'struct_types {{ type_id: {10 + i} {body} }}'


def _one_field(content: str) -> str:
    return f'structure {{ field {{ name: "x" {content} }} }}'


def _typed(group: str, name: str, type_text: str) -> str:
    return f'{group} {{ name: "{name}" type {{ {type_text} }} }}'


_REF6, _REF99 = 'struct_type { type_ref: 6 }', 'struct_type { type_ref: 99 }'
_DUPLICATE = (f'struct_type {{ structure {{ field {{ name: "x" type {{ {U8} }} }} '
              f'field {{ name: "x" type {{ {U8} }} }} }} }}')
_INLINE_WITH_ID = f'type {{ struct_type {{ type_id: 9 {_one_field(f"type {{ {U8} }}")} }} }}'
_INT8 = "storage_type: 3 scale { data_type: 1 float_data: 0.5 }"
_PER_AXIS_INT8 = "storage_type: 3 scale { dims: 4 data_type: 1 float_data: [0.5, 0.5, 0.5, 0.5] }"
_STRUCT_IO = f'struct_type {{ structure {{ field {{ name: "x" type {{ {U8} }} }} }} }}'
_DENSE_IO = 'tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } }'

SLOTS: dict[str, Slot] = {
    # ModelProto.struct_types: declarations 10, 11, 12
    "catalogue": Slot(
        HEAD + 'ITEMS\ngraph { name: "g" }\n',
        lambda i: _decl(i, _one_field(f'type {{ {U8} }}')),
        {"UnresolvedRef": lambda i: _decl(i, _one_field(f'type {{ {_REF99} }}')),
         "Kindless": lambda i: _decl(i, 'name: "category"'),
         "TypeRefDeclaration": lambda i: _decl(i, "type_ref: 6"),
         "StructureEmpty": lambda i: _decl(i, "structure { }")}),
    # the fields of declaration 5 (declaration 6 is a valid target for references)
    "field": Slot(
        HEAD + LEAF6 + 'struct_types { type_id: 5 structure { ITEMS } }\ngraph { name: "g" }\n',
        lambda i: _field(i, f'type {{ {U8} }}'),
        {"UnresolvedRef": lambda i: _field(i, 'type { struct_type { type_ref: 99 } }'),
         "SelfReference": lambda i: _field(i, 'type { struct_type { type_ref: 5 } }'),
         "RefWithName": lambda i: _field(i, 'type { struct_type { type_ref: 6 name: "n" } }'),
         "InlineWithTypeId": lambda i: _field(i, _INLINE_WITH_ID),
         "ContentMissing": lambda i: _field(i, ""),
         "ConstantNegativeDims": lambda i: _field(i, 'constant { dims: -1 data_type: 1 }'),
         "UnresolvedRefInSequence": lambda i: _field(i, f'type {{ sequence_type {{ elem_type {{ {_REF99} }} }} }}'),
         "UnresolvedRefInMap": lambda i: _field(i, f'type {{ map_type {{ key_type: 7 value_type {{ {_REF99} }} }} }}'),
         }),
    # the components of a bit packing
    "component": Slot(
        HEAD + 'struct_types { type_id: 5 bit_packing { ITEMS dimension: 8 } }\ngraph { name: "g" }\n',
        lambda i: f'component {{ name: "c{i}" bit_width: 2 }}',
        {"BitWidthZero": lambda i: f'component {{ name: "c{i}" bit_width: 0 }}',
         "BitWidth65": lambda i: f'component {{ name: "c{i}" bit_width: 65 }}'}),
    # graph inputs, outputs and value infos typed by declaration 6
    "input": Slot(
        HEAD + LEAF6 + 'graph { name: "g" ITEMS }\n',
        lambda i: _typed("input", f"in{i}", _REF6),
        {"UnresolvedRef": lambda i: _typed("input", f"in{i}", _REF99),
         "InlineDuplicateField": lambda i: _typed("input", f"in{i}", _DUPLICATE)}),
    "output": Slot(
        HEAD + LEAF6 + 'graph { name: "g" ITEMS }\n',
        lambda i: _typed("output", f"out{i}", _REF6),
        {"UnresolvedRef": lambda i: _typed("output", f"out{i}", _REF99)}),
    "value_info": Slot(
        HEAD + LEAF6 + 'graph { name: "g" ITEMS }\n',
        lambda i: _typed("value_info", f"t{i}", f"sequence_type {{ elem_type {{ {_REF6} }} }}"),
        {"UnresolvedRef": lambda i: _typed("value_info", f"t{i}", f"sequence_type {{ elem_type {{ {_REF99} }} }}")}),
    # If nodes whose branches output a struct, Loop nodes whose bodies carry one
    "if_node": Slot(
        HEAD + LEAF6 + 'graph { name: "g" ' + _typed("input", "c", "tensor_type { elem_type: 9 shape { } }")
        + ' ITEMS }\n',
        lambda i: _if_node(i, _REF6),
        {"UnresolvedRef": lambda i: _if_node(i, _REF99)}),
    "loop_node": Slot(
        HEAD + LEAF6 + 'graph { name: "g" ITEMS }\n',
        lambda i: _loop_node(i, _REF6),
        {"UnresolvedRef": lambda i: _loop_node(i, _REF99)}),
    # encoded initializers of declaration 6 (two-byte records)
    "encoded": Slot(
        HEAD + LEAF6 + 'graph { name: "g" ITEMS }\n',
        lambda i: _encoded(i, 'struct_type { type_ref: 6 }', "\\x01\\x02\\x03\\x04"),
        {"PartialRecord": lambda i: _encoded(i, 'struct_type { type_ref: 6 }', "\\x01\\x02\\x03"),
         "UnresolvedLayout": lambda i: _encoded(i, 'struct_type { type_ref: 99 }', "\\x01\\x02"),
         "LayoutMissing": lambda i: _encoded(i, "", "\\x01\\x02")}),
    # the fields of an encoding root (declaration 5, one value of one record of three bytes)
    "encoded_field": Slot(
        HEAD + 'struct_types { type_id: 5 structure { ITEMS } }\n'
        'graph { name: "g" encoded_initializer { name: "v" struct_type { type_ref: 5 } '
        'raw_data: "\\x01\\x02\\x03" } }\n',
        lambda i: _field(i, f'type {{ {U8} }}'),
        {"SequenceField": lambda i: _field(i, f'type {{ sequence_type {{ elem_type {{ {U8} }} }} }}'),
         "StringLeaf": lambda i: _field(i, 'type { tensor_type { elem_type: 8 shape { } } }'),
         "DynamicDim": lambda i: _field(i, 'type { tensor_type { elem_type: 2 shape { dim { dim_param: "n" } } } }'),
         }),
    # affine initializers: INT8 codes, FLOAT[4]
    "affine": Slot(
        HEAD + 'graph { name: "g" ITEMS }\n',
        lambda i: _affine(i, _INT8),
        {"PayloadShort": lambda i: _affine(i, _INT8, "\\x01\\x02\\x03"),
         "ZeroPointType": lambda i: _affine(i, _INT8 + " zero_point { data_type: 2 int32_data: 0 }"),
         "ScaleNotFloat": lambda i: _affine(i, "storage_type: 3 scale { data_type: 6 int32_data: 1 }"),
         # a per-axis scale of the one dimension's length: the axis is the only thing wrong (a scalar scale
         # with an axis would break AFFINE_PARAM_SHAPE too, and the spec orders no two checks)
         "AxisOutOfRange": lambda i: _affine(i, _PER_AXIS_INT8 + " axis: 1")}),
    # external payloads of declaration 6, two bytes each from payload.bin (six bytes)
    "external": Slot(
        HEAD + LEAF6 + 'graph { name: "g" ITEMS }\n',
        lambda i: _external(i, _ext_keys(i)),
        {"LengthMissing": lambda i: _external(i, _ext_keys(i, None)),
         "BeyondFile": lambda i: _external(i, _ext_keys(i, offset=6)),
         "LengthNotNumber": lambda i: _external(i, _ext_keys(i, "two"))},
        files={"payload.bin": bytes(range(1, 7))}),
    # graph inputs for a standard ONNX export: dense, or one inline struct
    "export_input": Slot(
        HEAD + 'graph { name: "g" ITEMS node { op_type: "Identity" input: "in0" output: "y" } '
        f'output {{ name: "y" type {{ {_DENSE_IO} }} }} }}\n',
        lambda i: _typed("input", f"in{i}", _DENSE_IO),
        {"StructInput": lambda i: _typed("input", f"in{i}", _STRUCT_IO)}),
}


def position_text(slot: str, fault: str, position: str) -> str:
    """The model text of ``slot`` with the item breaking ``fault`` at ``position`` (First, Middle, Last)."""
    frame = SLOTS[slot]
    bad = POSITIONS[position]
    items = [frame.faults[fault](i) if i == bad else frame.valid(i) for i in range(COUNT)]
    return frame.frame.replace("ITEMS", "\n".join(items))


@builder
def position_model(slot: str, fault: str, position: str):
    """Three items of one list, the one at ``position`` breaking ``fault`` (see ``SLOTS``)."""
    model = schema.parse_text(position_text(slot, fault, position), "ModelProto")
    return {"model": model, "files": dict(SLOTS[slot].files)}


@builder
def position_valid(slot: str):
    """The slot's three valid items: the model every position case differs from in one item."""
    frame = SLOTS[slot]
    model = schema.parse_text(frame.frame.replace("ITEMS", "\n".join(frame.valid(i) for i in range(COUNT))),
                              "ModelProto")
    return {"model": model, "files": dict(frame.files)}


# ------------------------------------------------------------------------------------- value positions
#: a retained input of each shape: a sequence of three structs 7 {a: FLOAT[2]}, or struct 8 with three
#: FLOAT[2] fields; the graph forwards it to the output bound back to it
_VALUE_FRAMES = {
    "sequence": 'sequence_type { elem_type { struct_type { type_ref: 7 } } }',
    "struct": 'struct_type { type_ref: 8 }',
}
_VALUE_CATALOGUE = (
    'struct_types { type_id: 7 structure { field { name: "a" type { tensor_type { elem_type: 1 '
    'shape { dim { dim_value: 2 } } } } } } }\n'
    'struct_types { type_id: 8 structure { '
    + " ".join(f'field {{ name: "{n}" type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 2 }} }} }} }} }}'
               for n in "abc") + ' } }\n')


def _tensor(fault: str | None) -> dict:
    """A FLOAT[2] literal, or one breaking the declared type: INT64 elements or three of them."""
    if fault == "ElementType":
        return {"dtype": "int64", "shape": [2], "data": [1, 2]}
    if fault == "Shape":
        return {"dtype": "float32", "shape": [3], "data": [1.0, 2.0, 3.0]}
    return {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}


@builder
def value_position(container: str, fault: str, position: str):
    """A state whose retained input is a ``container`` of three items (sequence elements or struct
    fields), the one at ``position`` breaking its declared type (``fault``): the open is rejected."""
    io = _VALUE_FRAMES[container]
    text = (HEAD + 'opset_import { domain: "onnx_light" version: 1 }\n' + _VALUE_CATALOGUE
            + f'graph {{ name: "g" input {{ name: "s" type {{ {io} }} }} output {{ name: "s_next" type {{ {io} }} }} '
            'node { op_type: "Identity" input: "s" output: "s_next" } '
            'persistent_bindings { input_name: "s" output_name: "s_next" } }\n')
    bad = POSITIONS[position]
    items = [_tensor(fault if index == bad else None) for index in range(COUNT)]
    if container == "sequence":
        initial = {"sequence": [{"struct": {"a": item}, "type_id": 7} for item in items]}
    else:
        initial = {"struct": dict(zip("abc", items)), "type_id": 8}
    return {"model": schema.parse_text(text, "ModelProto"),
            "steps": [{"op": "open", "initial": {"s": initial}, "error": "STATE_VALUE_INCOMPATIBLE"}]}
