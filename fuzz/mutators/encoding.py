"""Byte-encoding rules of record layouts and the logical type of encoded values."""

from __future__ import annotations

from fuzz import gen
from fuzz import layouts as L
from fuzz.cases import FuzzCase
from fuzz.mutators.base import (
    Work,
    mutator,
    struct_value,
    wrap_layout,
)
from reference_impl import dtypes, schema
from reference_impl.dtypes import UINT64_MAX
from reference_impl.errors import ErrorCode as E


# ------------------------------------------------------------------------------ byte-encoding rules
@mutator(E.NOT_FIXED_SIZE)
def _not_fixed(src, generated) -> FuzzCase:
    work = Work(generated, E.NOT_FIXED_SIZE)
    value = struct_value(src, work)
    how = src.choice(("sequence", "map", "optional", "category", "no shape", "dim_param"))
    if how in ("no shape", "dim_param"):
        extra = L.tensor_type(dtypes.FLOAT, None if how == "no shape" else ("n",))
    else:
        extra = L.type_proto(L.Dynamic(how))
    if src.boolean():
        wrap_layout(value, "dynamic", extra)
        return work.case(f"layout with a {how} field")
    decl = work.add_declaration(schema.StructTypeProto(type_id=work.fresh_id(src)))
    decl.structure.field.add(name="dynamic").type.CopyFrom(extra)
    value.struct_type.Clear()
    value.struct_type.type_ref = decl.type_id
    return work.case(f"layout references a declaration with a {how} field")


@mutator(E.UNSUPPORTED_LEAF)
def _unsupported_leaf(src, generated) -> FuzzCase:
    work = Work(generated, E.UNSUPPORTED_LEAF)
    value = struct_value(src, work)
    dims = src.choice(((), (2,), (1, 3)))
    if src.boolean():
        wrap_layout(value, "text", L.tensor_type(dtypes.STRING, dims))
    else:
        array = schema.TypeProto()
        array.struct_type.array.element_type.CopyFrom(L.tensor_type(dtypes.STRING, dims))
        array.struct_type.array.dimension = 2
        wrap_layout(value, "texts", array)
    return work.case("layout with a STRING leaf")


@mutator(E.SIZE_OVERFLOW)
def _size_overflow(src, generated) -> FuzzCase:
    work = Work(generated, E.SIZE_OVERFLOW)
    value = struct_value(src, work)
    how = src.integer(0, 2)
    extra = schema.TypeProto()
    if how == 0:
        extra.struct_type.array.element_type.CopyFrom(L.tensor_type(dtypes.INT64, ()))
        extra.struct_type.array.dimension = 2**58
    elif how == 1:
        extra.CopyFrom(L.tensor_type(dtypes.FLOAT, (2**32, 2**30)))
    else:
        extra.struct_type.bit_packing.component.add(name="c", bit_width=64)
        extra.struct_type.bit_packing.dimension = UINT64_MAX // 32
    wrap_layout(value, "huge", extra)
    return work.case("layout size overflows uint64")


@mutator(E.ROOT_SIZE_ZERO)
def _root_zero(src, generated) -> FuzzCase:
    work = Work(generated, E.ROOT_SIZE_ZERO)
    value = struct_value(src, work)
    constant = gen.gen_constant(src).tensor
    st = schema.StructTypeProto()
    st.structure.field.add(name="only").constant.CopyFrom(constant)
    if src.boolean():
        st.structure.field.add(name="empty_group").type.struct_type.structure.field.add(
            name="c").constant.CopyFrom(constant)
    if src.boolean():
        decl = work.add_declaration(st)
        decl.type_id = work.fresh_id(src)
        value.struct_type.Clear()
        value.struct_type.type_ref = decl.type_id
    else:
        value.struct_type.CopyFrom(st)
    return work.case("constant-only struct as an encoding root")


@mutator(E.ROOT_SIZE_NOT_BYTES)
def _root_bits(src, generated) -> FuzzCase:
    work = Work(generated, E.ROOT_SIZE_NOT_BYTES)
    value = struct_value(src, work)
    odd = schema.TypeProto()
    odd.struct_type.bit_packing.component.add(name="c", bit_width=src.choice((1, 2, 3, 5, 7, 9)))
    odd.struct_type.bit_packing.dimension = src.choice((1, 3, 5))
    wrap_layout(value, "odd", odd)
    return work.case("root size not a whole number of bytes")
