"""Declaration well-formedness: fields, components, names, counts, types and constants."""

from __future__ import annotations

import numpy as np

from fuzz import layouts as L
from fuzz.cases import FuzzCase
from fuzz.mutators.base import (
    Site,
    Work,
    fresh_declaration,
    kind_of,
    move_last_to,
    mutator,
    pick_site,
    struct_sites,
    type_sites,
)
from reference_impl import dtypes
from reference_impl.errors import ErrorCode as E


# ------------------------------------------------------------------------------- declaration rules
def _structure_site(src, work) -> Site:
    return pick_site(src, work, lambda s: kind_of(s) == "structure",
                      lambda: fresh_declaration(src, work, "structure"))


def _packing_site(src, work) -> Site:
    return pick_site(src, work, lambda s: kind_of(s) == "bit_packing",
                      lambda: fresh_declaration(src, work, "packing"))


def _array_site(src, work) -> Site:
    return pick_site(src, work, lambda s: kind_of(s) == "array",
                      lambda: fresh_declaration(src, work, "array"))


@mutator(E.STRUCTURE_EMPTY)
def _structure_empty(src, generated) -> FuzzCase:
    work = Work(generated, E.STRUCTURE_EMPTY)
    site = _structure_site(src, work)
    del site.st.structure.field[:]
    return work.case(f"structure without fields ({site.role})")


@mutator(E.BIT_PACKING_EMPTY)
def _packing_empty(src, generated) -> FuzzCase:
    work = Work(generated, E.BIT_PACKING_EMPTY)
    site = _packing_site(src, work)
    del site.st.bit_packing.component[:]
    return work.case(f"bit packing without components ({site.role})")


def _named_items(src, work):
    if src.boolean():
        return list(_packing_site(src, work).st.bit_packing.component)
    return list(_structure_site(src, work).st.structure.field)


@mutator(E.NAME_EMPTY)
def _name_empty(src, generated) -> FuzzCase:
    work = Work(generated, E.NAME_EMPTY)
    item = src.choice(_named_items(src, work))
    item.name = ""
    return work.case("field or component with an empty name")


@mutator(E.NAME_DUPLICATE)
def _name_duplicate(src, generated) -> FuzzCase:
    work = Work(generated, E.NAME_DUPLICATE)
    if src.boolean():
        site = _packing_site(src, work)
        items = site.st.bit_packing.component
        clone = items.add()
    else:
        site = _structure_site(src, work)
        items = site.st.structure.field
        clone = items.add()
    clone.CopyFrom(items[src.integer(0, len(items) - 2)])
    move_last_to(items, src.integer(0, len(items) - 1))
    return work.case(f"name repeated in a {site.st.WhichOneof('kind')}")


@mutator(E.FIELD_CONTENT_MISSING)
def _field_content(src, generated) -> FuzzCase:
    work = Work(generated, E.FIELD_CONTENT_MISSING)
    fields = _structure_site(src, work).st.structure.field
    if src.boolean():
        fld = work.placed(src, list(fields))
        fld.ClearField(fld.WhichOneof("content"))
    else:
        names = {f.name for f in fields}
        fields.add(name=next(n for n in ("empty", "empty1", "empty2", "empty3", "empty4") if n not in names),
                   doc_string="no content")
        move_last_to(fields, work.place_index(src, len(fields)))
    return work.case("field with neither type nor constant")


@mutator(E.BIT_WIDTH_INVALID)
def _bit_width(src, generated) -> FuzzCase:
    work = Work(generated, E.BIT_WIDTH_INVALID)
    component = work.placed(src, list(_packing_site(src, work).st.bit_packing.component))
    component.bit_width = src.choice((0, 65, 128, 2**31, 2**32 - 1))
    return work.case(f"bit width {component.bit_width}")


@mutator(E.DIMENSION_INVALID)
def _dimension(src, generated) -> FuzzCase:
    work = Work(generated, E.DIMENSION_INVALID)
    if src.boolean():
        site = _array_site(src, work)
        site.st.array.ClearField("dimension") if src.boolean() else setattr(site.st.array, "dimension", 0)
        return work.case("array without a dimension")
    site = _packing_site(src, work)
    site.st.bit_packing.dimension = 0
    return work.case("bit packing with dimension 0")


@mutator(E.ARRAY_ELEMENT_MISSING)
def _array_element(src, generated) -> FuzzCase:
    work = Work(generated, E.ARRAY_ELEMENT_MISSING)
    site = _array_site(src, work)
    site.st.array.ClearField("element_type")
    return work.case("array without element_type")


@mutator(E.TYPE_INVALID)
def _type_invalid(src, generated) -> FuzzCase:
    work = Work(generated, E.TYPE_INVALID)
    sites = type_sites(work.model)
    if not sites or src.chance(1, 8):
        decl = fresh_declaration(src, work, "structure").st
        sites = [decl.structure.field[0].type]
    tp = work.placed(src, sites)
    how = src.integer(0, 6)
    if how == 0:
        tp.Clear()
        tp.tensor_type.elem_type = src.choice((0, 29, 30, 100, 2**31 - 1))
        rule = f"tensor element type {tp.tensor_type.elem_type}"
    elif how == 1:
        tp.Clear()
        tp.tensor_type.elem_type = dtypes.FLOAT
        tp.tensor_type.shape.dim.add(dim_value=src.choice((-1, -(2**63))))
        rule = "negative tensor dimension"
    elif how == 2:
        tp.Clear()
        tp.sequence_type.SetInParent()
        rule = "sequence without elem_type"
    elif how == 3:
        tp.Clear()
        tp.map_type.key_type = src.choice((dtypes.FLOAT, dtypes.BOOL, dtypes.DOUBLE, 0))
        tp.map_type.value_type.CopyFrom(L.tensor_type(dtypes.FLOAT, ()))
        rule = "map with a non-integer, non-string key"
    elif how == 4:
        tp.Clear()
        tp.map_type.key_type = dtypes.INT64
        rule = "map without value_type"
    elif how == 5:
        tp.Clear()
        tp.optional_type.SetInParent()
        rule = "optional without elem_type"
    else:
        tp.Clear()
        tp.denotation = "TENSOR"
        rule = "TypeProto selecting no value"
    return work.case(rule)


def _constant_fields(work) -> list:
    return [f for s in struct_sites(work.model) if kind_of(s) == "structure"
            for f in s.st.structure.field if f.WhichOneof("content") == "constant"]


def _constant_field(src, work):
    fields = _constant_fields(work)
    if fields and src.chance(7, 8):
        return src.choice(fields)
    return fresh_declaration(src, work, "structure").st.structure.field[1]


@mutator(E.CONSTANT_DIMS_INVALID)
def _constant_dims(src, generated) -> FuzzCase:
    work = Work(generated, E.CONSTANT_DIMS_INVALID)
    constant = _constant_field(src, work).constant
    dims = list(constant.dims) or [1]
    dims[src.integer(0, len(dims) - 1)] = src.choice((-1, -2, -(2**63)))
    del constant.dims[:]
    constant.dims.extend(dims)
    return work.case("constant with a negative dimension")


@mutator(E.TENSOR_DATA_INVALID)
def _tensor_data(src, generated) -> FuzzCase:
    work = Work(generated, E.TENSOR_DATA_INVALID)
    affine = work.values(lambda v: v.WhichOneof("layout") == "affine")
    if affine and src.chance(1, 3):
        tensor = work.placed(src, affine).affine.scale
        where = "affine scale"
    else:
        tensor = _constant_field(src, work).constant
        where = "field constant"
    how = src.integer(0, 4)
    if how == 0:  # one value too many, in whatever field currently holds the data
        if tensor.HasField("raw_data"):
            tensor.raw_data += b"\0"
        elif tensor.data_type == dtypes.STRING:
            tensor.string_data.append(b"x")
        elif tensor.data_type in (dtypes.FLOAT, dtypes.COMPLEX64):
            tensor.float_data.append(1.0)
        elif tensor.data_type in (dtypes.DOUBLE, dtypes.COMPLEX128):
            tensor.double_data.append(1.0)
        elif tensor.data_type == dtypes.INT64:
            tensor.int64_data.append(1)
        elif tensor.data_type in (dtypes.UINT32, dtypes.UINT64):
            tensor.uint64_data.append(1)
        else:
            tensor.int32_data.extend([1] * 9)  # more than any packing can absorb
        rule = "one value more than dims"
    elif how == 1:  # data in two representations
        tensor.raw_data = tensor.raw_data if tensor.HasField("raw_data") else b""
        tensor.int64_data.append(0) if tensor.data_type != dtypes.INT64 else tensor.float_data.append(0.0)
        rule = "data in two fields"
    elif how == 2:
        tensor.data_location = 1
        tensor.external_data.add(key="location", value="x.bin")
        rule = "external data in a value tensor"
    elif how == 3:
        tensor.segment.begin = 0
        tensor.segment.end = 1
        rule = "segmented tensor"
    else:
        count = int(np.prod(tensor.dims, dtype=np.int64)) if len(tensor.dims) else 1
        for name in ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data",
                     "raw_data"):
            tensor.ClearField(name)
        if tensor.data_type in (dtypes.INT64, dtypes.STRING):
            tensor.double_data.extend([1.0] * max(count, 1))
        else:
            tensor.int64_data.extend([1] * max(count, 1))
        rule = "data in the wrong typed field"
    return work.case(f"{where}: {rule}")
