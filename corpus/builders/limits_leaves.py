"""Builders for corpus/cases/limits/representation_rules.toml: a layout whose leaf count exceeds the
suite's bound of 4096 leaves per layout (clause RESOURCE-LIMITS) only because one wide structure is
referenced twice, while no single structure declares more than 2049 fields."""

from __future__ import annotations

from reference_impl import schema

from . import builder
from .common import model

#: fields of the shared structure: two references give 2 * 2049 = 4098 leaves, two more than 4096
WIDE_FIELDS = 2049


@builder
def wide_structure_twice(inline_root: bool = False):
    """Declaration 1 holds WIDE_FIELDS UINT8 fields ``f0`` ... ; the layout (declaration 2 by reference,
    or the same structure inline) holds ``a`` and ``b``, both referencing declaration 1. One record of
    2 * WIDE_FIELDS zero bytes."""
    m = model("wide")
    wide = m.struct_types.add(type_id=1)
    for index in range(WIDE_FIELDS):
        leaf = wide.structure.field.add(name=f"f{index}").type.tensor_type
        leaf.elem_type = 2
        leaf.shape.SetInParent()
    root = schema.StructTypeProto()
    for name in ("a", "b"):
        root.structure.field.add(name=name).type.struct_type.type_ref = 1
    value = schema.EncodedValueProto(name="v", raw_data=bytes(2 * WIDE_FIELDS))
    if inline_root:
        value.struct_type.CopyFrom(root)
    else:
        root.type_id = 2
        m.struct_types.append(root)
        value.struct_type.type_ref = 2
    m.graph.encoded_initializer.append(value)
    return {"model": m}


@builder
def constant_structure_twice():
    """Declaration 1 holds WIDE_FIELDS scalar UINT8 constants ``c0`` ... and no data; the inline layout holds
    ``a`` and ``b``, both referencing declaration 1, then a UINT8 ``x`` (the record's one byte). Placing ``b``
    brings the layout to 2 * WIDE_FIELDS = 4098 constants."""
    m = model("constants")
    wide = m.struct_types.add(type_id=1)
    for index in range(WIDE_FIELDS):
        constant = wide.structure.field.add(name=f"c{index}").constant
        constant.data_type = 2
        constant.raw_data = bytes([index % 256])
    value = schema.EncodedValueProto(name="v", raw_data=b"\x07")
    for name in ("a", "b"):
        value.struct_type.structure.field.add(name=name).type.struct_type.type_ref = 1
    leaf = value.struct_type.structure.field.add(name="x").type.tensor_type
    leaf.elem_type = 2
    leaf.shape.SetInParent()
    m.graph.encoded_initializer.append(value)
    return {"model": m}
