"""A referenced declaration is compiled once per layout and placed at every reference: the placed
layout must equal the layout of the same struct written out inline (no references), leaf for leaf,
constant for constant, with the same count of type nodes against the limits."""

from __future__ import annotations

import copy

import pytest

from reference_impl import ContractError, ErrorCode, dtypes, schema
from reference_impl.records import MAX_LEAVES, compile_layout
from reference_impl.structs import Catalogue


def _tensor(field, elem: int, dims=()) -> None:
    tensor = field.type.tensor_type
    tensor.elem_type = elem
    shape = tensor.shape
    shape.SetInParent()
    for dim in dims:
        shape.dim.add(dim_value=dim)


def _catalogue() -> list:
    """1: a struct of an INT4 pair, a packed byte and a constant; 2: an array of three 1s;
    3: two references to 1 and one to 2 (a diamond through 1)."""
    leaf = schema.StructTypeProto(type_id=1)
    _tensor(leaf.structure.field.add(name="pair"), dtypes.INT4, (2,))
    packed = leaf.structure.field.add(name="packed").type.struct_type.bit_packing
    packed.dimension = 1
    packed.component.add(name="lo", bit_width=3)
    packed.component.add(name="hi", bit_width=5)
    leaf.structure.field.add(name="k").constant.CopyFrom(
        schema.TensorProto(data_type=dtypes.INT64, int64_data=[7]))
    array = schema.StructTypeProto(type_id=2)
    array.array.dimension = 3
    array.array.element_type.struct_type.type_ref = 1
    root = schema.StructTypeProto(type_id=3)
    for name, ref in (("a", 1), ("b", 2), ("c", 1)):
        root.structure.field.add(name=name).type.struct_type.type_ref = ref
    _tensor(root.structure.field.add(name="tail"), dtypes.FLOAT16)
    return [leaf, array, root]


def _inlined(st, declarations: dict):
    """``st`` with every type_ref replaced by a copy of its declaration (without its type_id)."""
    st = copy.deepcopy(st)

    def expand(node) -> None:
        if node.WhichOneof("kind") == "type_ref":
            decl = copy.deepcopy(declarations[node.type_ref])
            decl.ClearField("type_id")
            node.CopyFrom(decl)
        kind = node.WhichOneof("kind")
        if kind == "structure":
            for fld in node.structure.field:
                if fld.HasField("type") and fld.type.WhichOneof("value") == "struct_type":
                    expand(fld.type.struct_type)
        elif kind == "array" and node.array.element_type.WhichOneof("value") == "struct_type":
            expand(node.array.element_type.struct_type)

    expand(st)
    st.ClearField("type_id")
    return st


def _summary(layout) -> tuple:
    return (layout.record_bits, [(leaf.path, leaf.elem_type, leaf.width, leaf.offset, leaf.dims)
                                 for leaf in layout.leaves.values()],
            [(path, tensor.SerializeToString()) for path, tensor in layout.constants.items()],
            layout.nodes_visited)


@pytest.mark.clause("ENC-SIZE-TABLE")
def test_placed_references_equal_the_inline_layout():
    declarations = {decl.type_id: decl for decl in _catalogue()}
    catalogue = Catalogue(list(declarations.values()))
    placed = compile_layout(schema.StructTypeProto(type_ref=3), catalogue, "v")
    inline = compile_layout(_inlined(declarations[3], declarations), catalogue, "v")
    assert _summary(placed) == _summary(inline)  # type nodes included: a reference counts as its body
    paths = [leaf.path for leaf in placed.leaves.values()]
    assert paths == ["a.pair", "a.packed.lo", "a.packed.hi", "b.pair", "b.packed.lo", "b.packed.hi",
                     "c.pair", "c.packed.lo", "c.packed.hi", "tail"]
    # 1 is 16 bits (two INT4 codes, one packed byte), 2 is three of them: c starts at 16 + 48 bits
    assert placed.leaves["b.pair"].dims == ((3, 16), (2, 4))
    assert placed.leaves["b.packed.hi"].dims == ((3, 16), (1, 8)) and placed.leaves["b.packed.hi"].offset == 16 + 11
    assert placed.leaves["c.packed.lo"].offset == 64 + 8 and placed.leaves["tail"].offset == 80
    assert set(placed.constants) == {"a.k", "b.k", "c.k"}


@pytest.mark.clause("RESOURCE-LIMITS")
def test_a_diamond_deeper_than_the_limits_is_still_refused():
    """Placement counts every path: a chain of declarations each holding the previous one twice has
    2**levels paths, and its layout fails with RESOURCE_LIMIT like a walk would, without walking them."""
    declarations = [schema.StructTypeProto(type_id=1)]
    _tensor(declarations[0].structure.field.add(name="x"), dtypes.UINT8)
    for type_id in range(2, 24):
        decl = schema.StructTypeProto(type_id=type_id)
        for name in ("l", "r"):
            decl.structure.field.add(name=name).type.struct_type.type_ref = type_id - 1
        declarations.append(decl)
    catalogue = Catalogue(declarations)
    assert len(compile_layout(schema.StructTypeProto(type_ref=12), catalogue, "v").leaves) == 2 ** 11 <= MAX_LEAVES
    with pytest.raises(ContractError) as caught:
        compile_layout(schema.StructTypeProto(type_ref=23), catalogue, "v")
    assert caught.value.code is ErrorCode.RESOURCE_LIMIT
