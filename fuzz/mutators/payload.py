"""Payload rules: layout choice, inline versus external bytes, extents, files and record counts."""

from __future__ import annotations

from fuzz import gen
from fuzz import layouts as L
from fuzz.cases import FuzzCase
from fuzz.mutators.base import (
    Work,
    any_value,
    entries,
    explicit_affine,
    is_external,
    make_external,
    move_last_to,
    mutator,
    payload_length,
    set_entry,
    spec_value,
)
from reference_impl import dtypes
from reference_impl.dtypes import UINT64_MAX
from reference_impl.errors import ErrorCode as E


# ------------------------------------------------------------------------------ encoded value rules
@mutator(E.LAYOUT_MISSING)
def _layout_missing(src, generated) -> FuzzCase:
    work = Work(generated, E.LAYOUT_MISSING)
    values = work.values() or [work.add_affine(src)]
    value = src.choice(values)
    value.ClearField(value.WhichOneof("layout"))
    return work.case("encoded value without a layout")


@mutator(E.PAYLOAD_BOTH)
def _payload_both(src, generated) -> FuzzCase:
    work = Work(generated, E.PAYLOAD_BOTH)
    value = any_value(src, work)
    if is_external(value):
        value.raw_data = src.choice((b"", b"\x01"))
        return work.case("EXTERNAL payload that also carries raw_data")
    value.raw_data = value.raw_data
    value.external_data.add(key="location", value=gen.EXTERNAL_FILE)
    value.external_data.add(key="length", value=str(len(value.raw_data)))
    return work.case("inline raw_data plus external_data")


@mutator(E.PAYLOAD_LOCATION_MISMATCH)
def _location_mismatch(src, generated) -> FuzzCase:
    work = Work(generated, E.PAYLOAD_LOCATION_MISMATCH)
    value = any_value(src, work, external=True)
    value.ClearField("data_location") if src.boolean() else setattr(value, "data_location", 0)
    return work.case("external_data without data_location EXTERNAL")


@mutator(E.EXTERNAL_LOCATION_MISSING)
def _location_missing(src, generated) -> FuzzCase:
    work = Work(generated, E.EXTERNAL_LOCATION_MISSING)
    value = any_value(src, work, external=True)
    set_entry(value, "location", "" if src.boolean() else None)
    return work.case("external payload without location")


@mutator(E.EXTERNAL_LENGTH_MISSING)
def _length_missing(src, generated) -> FuzzCase:
    work = Work(generated, E.EXTERNAL_LENGTH_MISSING)
    value = any_value(src, work, external=True)
    set_entry(value, "length", None)
    return work.case("external payload without explicit length")


@mutator(E.EXTERNAL_KEY_INVALID)
def _key_invalid(src, generated) -> FuzzCase:
    work = Work(generated, E.EXTERNAL_KEY_INVALID)
    value = any_value(src, work, external=True)
    if src.boolean():
        key = src.choice(("Location", "size", "offset ", "", "basepath", "length\x00"))
        value.external_data.add(key=key, value="0")
        rule = f"unknown external_data key {key!r}"
    else:
        existing = src.choice(list(value.external_data))
        value.external_data.add(key=existing.key, value=existing.value)
        rule = f"external_data key {existing.key!r} repeated"
    move_last_to(value.external_data, src.integer(0, len(value.external_data) - 1))
    return work.case(rule)


@mutator(E.EXTERNAL_NUMBER_INVALID)
def _number_invalid(src, generated) -> FuzzCase:
    work = Work(generated, E.EXTERNAL_NUMBER_INVALID)
    value = any_value(src, work, external=True)
    key = src.choice(("length", "offset"))
    text = src.choice(("-1", "+5", " 5", "5 ", "0x10", "1e3", "", "١٢", "5.0", str(2**64), "12a"))
    set_entry(value, key, text)
    return work.case(f"external {key} {text!r} is not a decimal uint64")


@mutator(E.EXTERNAL_EXTENT_OVERFLOW)
def _extent_overflow(src, generated) -> FuzzCase:
    work = Work(generated, E.EXTERNAL_EXTENT_OVERFLOW)
    candidates = work.values(lambda v: is_external(v) and int(entries(v)["length"]) > 0)
    if candidates and src.chance(3, 4):
        value = src.choice(candidates)
    else:
        value = work.add_affine(src)
        if not value.raw_data:  # an empty payload cannot overflow
            work.graph.encoded_initializer.remove(value)
            value = explicit_affine(work, dtypes.INT8, src.integer(1, 9))
        make_external(value, work.files)
    length = int(entries(value)["length"])
    set_entry(value, "offset", str(UINT64_MAX - length + 1 + src.integer(0, length - 1)))
    return work.case("offset + length overflows uint64")


@mutator(E.EXTERNAL_PATH_INVALID)
def _path_invalid(src, generated) -> FuzzCase:
    work = Work(generated, E.EXTERNAL_PATH_INVALID)
    value = any_value(src, work, external=True)
    location = src.choice(("/etc/passwd", "/" + gen.EXTERNAL_FILE, "C:\\weights.bin", "c:weights.bin",
                           "../" + gen.EXTERNAL_FILE, "..\\" + gen.EXTERNAL_FILE, "sub/../../x.bin",
                           "weights\x00.bin", "\\\\server\\share\\w.bin", "//server/w.bin"))
    set_entry(value, "location", location)
    return work.case(f"location {location!r} is absolute or escapes the model directory")


@mutator(E.EXTERNAL_FILE_INVALID)
def _file_invalid(src, generated) -> FuzzCase:
    work = Work(generated, E.EXTERNAL_FILE_INVALID)
    candidates = work.values(lambda v: is_external(v))
    value = src.choice(candidates) if candidates and src.chance(3, 4) else any_value(src, work, True)
    extent = entries(value)
    end = int(extent.get("offset", "0")) + int(extent["length"])
    how = src.integer(0, 2)
    if how == 0 or end == 0:
        set_entry(value, "location", src.choice(("missing.bin", "sub/missing.bin", "nested/")))
        rule = "backing file does not exist"
    elif how == 1:
        work.files[extent["location"]] = work.files.get(extent["location"], b"")[: end - 1]
        rule = "backing file shorter than offset + length"
    else:
        work.files.pop(extent["location"], None)
        rule = "backing file removed"
    return work.case(rule)


@mutator(E.PAYLOAD_PARTIAL_RECORD)
def _partial_record(src, generated) -> FuzzCase:
    work = Work(generated, E.PAYLOAD_PARTIAL_RECORD)
    from reference_impl import verify_model

    info = verify_model(work.model).encoded
    candidates = [v for v in work.values(lambda v: v.WhichOneof("layout") == "struct_type")
                  if info[v.name].element_bytes >= 2]
    value = src.choice(candidates) if candidates and src.chance(3, 4) else work.add_struct(src, min_bytes=2)
    element = verify_model(work.model).encoded[value.name].element_bytes
    length = payload_length(value, work.files)
    delta = src.integer(1, element - 1)
    if length >= delta and src.boolean():
        delta = -delta
    if is_external(value):
        set_entry(value, "length", str(length + delta))
        extent = entries(value)
        work.files[extent["location"]] = work.files.get(extent["location"], b"") + bytes(max(delta, 0))
    else:
        value.raw_data = value.raw_data[:length + delta] if delta < 0 else value.raw_data + bytes(delta)
    return work.case(f"payload of {length + delta} bytes with {element}-byte records")


@mutator(E.LOGICAL_TYPE_INVALID)
def _logical_invalid(src, generated) -> FuzzCase:
    work = Work(generated, E.LOGICAL_TYPE_INVALID)
    affine = work.values(lambda v: v.WhichOneof("layout") == "affine")
    value = src.choice(affine) if affine and src.chance(3, 4) else work.add_affine(src)
    how = src.integer(0, 5)
    tensor = value.logical_type.tensor_type
    if how == 0:
        value.ClearField("logical_type")
        rule = "affine value without logical_type"
    elif how == 1:
        value.logical_type.Clear()
        value.logical_type.sequence_type.elem_type.CopyFrom(L.tensor_type(dtypes.FLOAT, ()))
        rule = "affine logical_type is a sequence"
    elif how == 2:
        tensor.elem_type = src.choice((dtypes.INT32, dtypes.INT8, dtypes.STRING, dtypes.FLOAT8E4M3FN))
        rule = "affine logical element type is not floating"
    elif how == 3:
        tensor.ClearField("shape")
        rule = "affine logical_type without shape"
    elif how == 4 and len(tensor.shape.dim):
        tensor.shape.dim[src.integer(0, len(tensor.shape.dim) - 1)].dim_param = "n"
        rule = "affine logical dimension is symbolic"
    else:
        tensor.shape.dim.add(dim_value=-1)
        move_last_to(tensor.shape.dim, src.integer(0, len(tensor.shape.dim) - 1))
        rule = "affine logical dimension is negative"
    return work.case(rule)


#: Record bytes and decoded values per record of the registered spec types.
_SPEC_RECORDS = {2001: (20, 32), 1002: (76, 128), 1003: (64, 128), 1102: (12, 32)}


def _decoded_count(value) -> int:
    """How many values the registered decoder produces, from the payload length alone (the declared
    logical shape may be absent, scalar or symbolic, so it cannot stand in for the count)."""
    record_bytes, per_record = _SPEC_RECORDS[value.struct_type.type_ref]
    length = len(value.raw_data)
    if value.data_location == 1:
        length = int(next(e.value for e in value.external_data if e.key == "length"))
    return length // record_bytes * per_record


@mutator(E.LOGICAL_SHAPE_MISMATCH)
def _logical_mismatch(src, generated) -> FuzzCase:
    work = Work(generated, E.LOGICAL_SHAPE_MISMATCH)
    value = spec_value(src, work)
    if value is None:  # the model reuses the spec's IDs: use a fresh copy of the spec catalogue
        work.model.ClearField("struct_types")
        work.graph.ClearField("encoded_initializer")
        work.graph.ClearField("persistent_bindings")
        del work.graph.input[1:]
        del work.graph.output[1:]
        del work.graph.node[1:]
        value = spec_value(src, work)
    count = _decoded_count(value)
    how = src.integer(0, 3)
    if how == 0:
        value.logical_type.CopyFrom(L.tensor_type(dtypes.FLOAT, (count + src.integer(1, 40),)))
        rule = "logical shape has more elements than decoded"
    elif how == 1 and count:
        value.logical_type.CopyFrom(L.tensor_type(dtypes.FLOAT, (count - 1,) if count > 1 else (2,)))
        rule = "logical shape has fewer elements than decoded"
    elif how == 2:
        value.logical_type.tensor_type.elem_type = src.choice((dtypes.DOUBLE, dtypes.FLOAT16, dtypes.INT8))
        rule = "logical element type differs from the decoder's"
    else:
        value.logical_type.Clear()
        value.logical_type.sequence_type.elem_type.CopyFrom(L.tensor_type(dtypes.FLOAT, ()))
        rule = "logical type is not a tensor but the decoder produces one"
    return work.case(rule, op="decode", name=value.name)
