"""Builders for corpus/cases/declarations/declaration_forms.toml: one malformed declaration body in every place a
declaration can stand, written inline there or as a reference to a catalogue declaration.

The places (``FORMS``) are a field of a catalogue declaration, an array's element, a sequence's element,
a map's value and an optional's element inside a field, a graph input, a sequence-typed graph input, a
graph input bound to an output by ``persistent_bindings``, an encoded value's layout and the output of an
If branch. A rule on declarations holds in each, whichever way the declaration is written: a runtime
that validates only its catalogue, only inline bodies, or only bodies at the top of a type misses some.
"""

from __future__ import annotations

from reference_impl import schema

from . import builder

HEAD = 'ir_version: 13\nopset_import { domain: "" version: 23 }\n'
U8 = 'tensor_type { elem_type: 2 shape { } }'

#: malformed declaration bodies (a StructTypeProto's content, no type_id)
BODIES = {
    "DuplicateField": f'structure {{ field {{ name: "x" type {{ {U8} }} }} '
                      f'field {{ name: "x" type {{ {U8} }} }} }}',
    "BitWidthZero": 'bit_packing { component { name: "c" bit_width: 0 } dimension: 8 }',
    "FieldContentMissing": 'structure { field { name: "x" } }',
    "ArrayDimensionZero": f'array {{ element_type {{ {U8} }} dimension: 0 }}',
}


def _in_declaration(type_text: str) -> str:
    return (f'struct_types {{ type_id: 5 structure {{ field {{ name: "f" type {{ {type_text} }} }} }} }}\n'
            'graph { name: "g" }\n')


def _bound(st: str) -> str:
    io = f'type {{ struct_type {{ {st} }} }}'
    return (f'graph {{ name: "g" input {{ name: "s" {io} }} output {{ name: "s_next" {io} }} '
            'node { op_type: "Identity" input: "s" output: "s_next" } '
            'persistent_bindings { input_name: "s" output_name: "s_next" } }\n')


def _if_branch(st: str) -> str:
    def branch(name: str) -> str:
        return f'g {{ name: "{name}" output {{ name: "o" type {{ struct_type {{ {st} }} }} }} }}'
    return ('graph { name: "g" input { name: "c" type { tensor_type { elem_type: 9 shape { } } } } '
            'node { op_type: "If" input: "c" output: "y" '
            f'attribute {{ name: "then_branch" type: GRAPH {branch("t")} }} '
            f'attribute {{ name: "else_branch" type: GRAPH {branch("e")} }} }} }}\n')


#: where a StructTypeProto ``st`` stands: the rest of the model around it
FORMS = {
    "Field": lambda st: _in_declaration(f'struct_type {{ {st} }}'),
    "ArrayElement": lambda st: f'struct_types {{ type_id: 5 array {{ element_type {{ struct_type {{ {st} }} }} '
                               'dimension: 2 } }\ngraph { name: "g" }\n',
    "SequenceElement": lambda st: _in_declaration(f'sequence_type {{ elem_type {{ struct_type {{ {st} }} }} }}'),
    "MapValue": lambda st: _in_declaration(f'map_type {{ key_type: 7 value_type {{ struct_type {{ {st} }} }} }}'),
    "OptionalElement": lambda st: _in_declaration(f'optional_type {{ elem_type {{ struct_type {{ {st} }} }} }}'),
    "Input": lambda st: f'graph {{ name: "g" input {{ name: "s" type {{ struct_type {{ {st} }} }} }} }}\n',
    "InputSequence": lambda st: f'graph {{ name: "g" input {{ name: "s" type {{ sequence_type {{ elem_type {{ '
                                f'struct_type {{ {st} }} }} }} }} }} }}\n',
    "BoundInput": _bound,
    "Layout": lambda st: f'graph {{ name: "g" encoded_initializer {{ name: "v" struct_type {{ {st} }} '
                         'raw_data: "\\x01\\x02" } }\n',
    "IfBranch": _if_branch,
}


def form_text(form: str, body: str, written: str) -> str:
    """The model text: ``body`` standing in ``form``, ``Inline`` or ``Referenced`` (declaration 20)."""
    if written == "Inline":
        return HEAD + FORMS[form](body)
    return HEAD + f'struct_types {{ type_id: 20 {body} }}\n' + FORMS[form]("type_ref: 20")


@builder
def declaration_form(form: str, fault: str, written: str):
    """The malformed body ``fault`` (see ``BODIES``) in ``form``, written ``Inline`` or ``Referenced``;
    ``fault = "Valid"`` gives a well-formed body (two UINT8 fields)."""
    body = f'structure {{ field {{ name: "x" type {{ {U8} }} }} field {{ name: "y" type {{ {U8} }} }} }}' \
        if fault == "Valid" else BODIES[fault]
    return {"model": schema.parse_text(form_text(form, body, written), "ModelProto")}
