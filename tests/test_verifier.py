"""verify_model: one test per rejection rule, each breaking exactly one rule of a valid model."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.wire import field, varint
from reference_impl import ContractError, ErrorCode, affine, dtypes, examples, schema, verify_model
from reference_impl.structs import MAX_DEPTH


def base_model():
    """The spec's examples plus one value of each affine granularity (all valid)."""
    model = examples.spec_example_model()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    model.graph.encoded_initializer.extend([
        affine.make_affine_value(x, dtypes.INT8, np.float32(0.1), name="aff_tensor"),
        affine.make_affine_value(x, dtypes.UINT4, np.full(6, 0.2, np.float32), np.full(6, 8), axis=1,
                                 name="aff_axis"),
        affine.make_affine_value(x[:, :5], dtypes.INT2, np.full((4, 3), 0.5, np.float32),
                                 np.zeros((4, 3), np.int64), axis=1, block_size=2, name="aff_blocked"),
    ])
    return model


def test_base_model_is_valid():
    verified = verify_model(base_model())
    assert len(verified.encoded) == 11


def _value(model, name):
    return next(v for v in model.graph.encoded_initializer if v.name == name)


def _decl(model, type_id):
    return next(d for d in model.struct_types if d.type_id == type_id)


def expect(model, code: ErrorCode, path_prefix: str = ""):
    with pytest.raises(ContractError) as info:
        verify_model(model)
    assert info.value.code == code, str(info.value)
    assert info.value.path.startswith(path_prefix), info.value.path
    return info.value


# ------------------------------------------------------------------------------------------ catalogue
@pytest.mark.clause("CAT-ID-NONZERO")
def test_declaration_without_type_id():
    model = base_model()
    model.struct_types[1].ClearField("type_id")
    expect(model, ErrorCode.TYPE_ID_MISSING, "model.struct_types[1]")


@pytest.mark.clause("CAT-ID-NONZERO")
def test_zero_type_id():
    model = base_model()
    model.struct_types[0].type_id = 0
    expect(model, ErrorCode.TYPE_ID_ZERO, "model.struct_types[0].type_id")


@pytest.mark.clause("CAT-ID-UNIQUE")
def test_duplicate_type_id():
    model = base_model()
    model.struct_types.add().CopyFrom(model.struct_types[0])
    expect(model, ErrorCode.TYPE_ID_DUPLICATE, "model.struct_types[5].type_id")


@pytest.mark.clause("CAT-DECL-CONCRETE")
def test_catalogue_entry_that_is_only_a_reference():
    model = base_model()
    model.struct_types.add(type_id=9, type_ref=2001)
    expect(model, ErrorCode.DECLARATION_NOT_CONCRETE, "model.struct_types[5]")


@pytest.mark.clause("CAT-KINDLESS")
def test_kindless_catalogue_declaration():
    model = base_model()
    model.struct_types.add(type_id=9, name="category")
    expect(model, ErrorCode.KINDLESS_MISPLACED, "model.struct_types[5]")


@pytest.mark.clause("CAT-KINDLESS", "ENC-LAYOUT")
def test_kindless_layout():
    model = base_model()
    value = _value(model, "weight_a")
    value.struct_type.Clear()
    value.struct_type.name = "anything"
    expect(model, ErrorCode.KINDLESS_MISPLACED, "model.graph.encoded_initializer[2].struct_type")


@pytest.mark.clause("CAT-KINDLESS")
def test_kindless_struct_is_allowed_inside_typeproto():
    model = base_model()
    model.struct_types.add(type_id=9).structure.field.add(name="items").type.sequence_type.elem_type \
        .struct_type.SetInParent()
    verify_model(model)


@pytest.mark.clause("CAT-REF-RESOLVED")
def test_unresolved_reference_in_declaration():
    model = base_model()
    _decl(model, 1102).structure.field[0].type.struct_type.type_ref = 4242
    expect(model, ErrorCode.TYPE_REF_UNRESOLVED, "model.struct_types[4].structure.field[0]")


@pytest.mark.clause("CAT-REF-RESOLVED")
def test_unresolved_reference_in_layout():
    model = base_model()
    _value(model, "weight_a").struct_type.type_ref = 4242
    expect(model, ErrorCode.TYPE_REF_UNRESOLVED, "model.graph.encoded_initializer[2].struct_type.type_ref")


@pytest.mark.clause("CAT-REF-ACYCLIC")
def test_reference_cycle():
    model = base_model()
    _decl(model, 1101).structure.field.add(name="back").type.struct_type.type_ref = 1102
    error = expect(model, ErrorCode.TYPE_REF_CYCLE)
    assert "1101" in error.message and "1102" in error.message


@pytest.mark.clause("CAT-REF-ACYCLIC")
def test_self_reference_through_a_sequence_is_a_cycle():
    model = base_model()
    _decl(model, 1101).structure.field.add(name="next").type.sequence_type.elem_type.struct_type.type_ref = 1101
    expect(model, ErrorCode.TYPE_REF_CYCLE)


@pytest.mark.clause("CAT-REF-ONLY-ID")
@pytest.mark.parametrize("extra", ["name", "doc_string", "type_id", "decoder", "metadata_props"])
def test_type_ref_carrying_other_fields(extra):
    model = base_model()
    ref = _value(model, "weight_a").struct_type
    if extra == "decoder":
        ref.decoder.name = "X"
    elif extra == "metadata_props":
        ref.metadata_props.add(key="k", value="v")
    elif extra == "type_id":
        ref.type_id = 5
    else:
        setattr(ref, extra, "x")
    expect(model, ErrorCode.TYPE_REF_EXTRA_FIELDS, "model.graph.encoded_initializer[2].struct_type")


@pytest.mark.clause("CAT-INLINE-NO-ID")
def test_inline_declaration_with_type_id():
    model = base_model()
    inline = _decl(model, 1102).structure.field[0].type.struct_type
    inline.CopyFrom(_decl(model, 1101))
    expect(model, ErrorCode.INLINE_TYPE_ID, "model.struct_types[4].structure.field[0].type.struct_type.type_id")


@pytest.mark.clause("CAT-REORDER")
def test_catalogue_reordering_changes_no_verdict_or_size():
    model = base_model()
    before = {n: (i.element_bytes, i.record_count) for n, i in verify_model(model).encoded.items()}
    reordered = list(model.struct_types)[::-1]
    del model.struct_types[:]
    model.struct_types.extend(reordered)
    after = {n: (i.element_bytes, i.record_count) for n, i in verify_model(model).encoded.items()}
    assert before == after


@pytest.mark.clause("DECL-DEPTH")
def test_nesting_depth_limit():
    model = base_model()
    tp = model.struct_types.add(type_id=77).structure.field.add(name="f").type
    for _ in range(MAX_DEPTH + 2):
        tp = tp.sequence_type.elem_type
    tp.tensor_type.elem_type = dtypes.FLOAT
    expect(model, ErrorCode.NESTING_TOO_DEEP)


@pytest.mark.clause("DECL-DEPTH")
def test_long_reference_chain_is_bounded():
    model = base_model()
    for index in range(MAX_DEPTH + 5):
        decl = model.struct_types.add(type_id=10_000 + index)
        field = decl.structure.field.add(name="inner")
        if index == 0:
            field.type.tensor_type.elem_type = dtypes.FLOAT
            field.type.tensor_type.shape.SetInParent()
        else:
            field.type.struct_type.type_ref = 10_000 + index - 1
    model.graph.encoded_initializer.add(name="deep", raw_data=b"\0" * 4).struct_type.type_ref = 10_000 + MAX_DEPTH + 4
    expect(model, ErrorCode.NESTING_TOO_DEEP)


# ---------------------------------------------------------------------------------------- declarations
@pytest.mark.clause("DECL-WELLFORMED")
def test_empty_structure():
    model = base_model()
    model.struct_types.add(type_id=9).structure.SetInParent()
    expect(model, ErrorCode.STRUCTURE_EMPTY, "model.struct_types[5].structure")


@pytest.mark.clause("DECL-WELLFORMED")
def test_empty_bit_packing():
    model = base_model()
    model.struct_types.add(type_id=9).bit_packing.dimension = 3
    expect(model, ErrorCode.BIT_PACKING_EMPTY, "model.struct_types[5].bit_packing")


@pytest.mark.clause("DECL-WELLFORMED")
def test_empty_field_name():
    model = base_model()
    _decl(model, 2001).structure.field[1].name = ""
    expect(model, ErrorCode.NAME_EMPTY, "model.struct_types[0].structure.field[1].name")


@pytest.mark.clause("DECL-WELLFORMED")
def test_duplicate_field_name():
    model = base_model()
    _decl(model, 2001).structure.field[1].name = "codes"
    expect(model, ErrorCode.NAME_DUPLICATE, "model.struct_types[0].structure.field[1].name")


@pytest.mark.clause("DECL-WELLFORMED")
def test_duplicate_component_name():
    model = base_model()
    packing = _decl(model, 1101).structure.field[0].type.struct_type.bit_packing
    packing.component.add(name="index", bit_width=1)
    expect(model, ErrorCode.NAME_DUPLICATE, "model.struct_types[3].structure.field[0]")


@pytest.mark.clause("DECL-FIELD-CONTENT")
def test_field_without_type_or_constant():
    model = base_model()
    _decl(model, 2001).structure.field.add(name="empty")
    expect(model, ErrorCode.FIELD_CONTENT_MISSING, "model.struct_types[0].structure.field[2]")


@pytest.mark.clause("DECL-WELLFORMED")
@pytest.mark.parametrize("width", [0, 65])
def test_bit_width_outside_range(width):
    model = base_model()
    _decl(model, 1101).structure.field[0].type.struct_type.bit_packing.component[0].bit_width = width
    expect(model, ErrorCode.BIT_WIDTH_INVALID, "model.struct_types[3].structure.field[0]")


@pytest.mark.clause("DECL-WELLFORMED")
def test_bit_width_64_is_valid():
    model = base_model()
    decl = model.struct_types.add(type_id=9)
    decl.bit_packing.component.add(name="wide", bit_width=64)
    decl.bit_packing.dimension = 2
    model.graph.encoded_initializer.add(name="wide", raw_data=bytes(32)).struct_type.type_ref = 9
    assert verify_model(model).encoded["wide"].record_count == 2


@pytest.mark.clause("DECL-COUNTS-CONCRETE")
def test_zero_array_dimension():
    model = base_model()
    _decl(model, 1003).structure.field[0].type.struct_type.array.dimension = 0
    expect(model, ErrorCode.DIMENSION_INVALID, "model.struct_types[1].structure.field[0]")


@pytest.mark.clause("DECL-COUNTS-CONCRETE")
def test_missing_bit_packing_dimension():
    model = base_model()
    _decl(model, 1101).structure.field[0].type.struct_type.bit_packing.ClearField("dimension")
    expect(model, ErrorCode.DIMENSION_INVALID, "model.struct_types[3].structure.field[0]")


@pytest.mark.clause("DECL-WELLFORMED")
def test_array_without_element_type():
    model = base_model()
    _decl(model, 1003).structure.field[0].type.struct_type.array.ClearField("element_type")
    expect(model, ErrorCode.ARRAY_ELEMENT_MISSING, "model.struct_types[1].structure.field[0]")


@pytest.mark.clause("DECL-TYPE-RULES")
@pytest.mark.parametrize("breakage", ["unset", "elem_undefined_enum", "negative_dim", "seq_no_elem",
                                      "map_float_key", "map_no_value", "optional_no_elem"])
def test_typeproto_rules(breakage):
    model = base_model()
    tp = model.struct_types.add(type_id=9).structure.field.add(name="f").type
    if breakage == "unset":
        array = tp.struct_type.array
        array.dimension = 2
        array.element_type.SetInParent()
    elif breakage == "elem_undefined_enum":
        tp.tensor_type.elem_type = 99
    elif breakage == "negative_dim":
        tp.tensor_type.elem_type = dtypes.FLOAT
        tp.tensor_type.shape.dim.add(dim_value=-1)
    elif breakage == "seq_no_elem":
        tp.sequence_type.SetInParent()
    elif breakage == "map_float_key":
        tp.map_type.key_type = dtypes.FLOAT
        tp.map_type.value_type.tensor_type.elem_type = dtypes.FLOAT
    elif breakage == "map_no_value":
        tp.map_type.key_type = dtypes.INT64
    elif breakage == "optional_no_elem":
        tp.optional_type.SetInParent()
    expect(model, ErrorCode.TYPE_INVALID, "model.struct_types[5].structure.field[0].type")


@pytest.mark.clause("DECL-CONSTANT")
def test_constant_with_non_concrete_dims():
    model = base_model()
    _decl(model, 1101).structure.field[1].constant.dims[0] = -4
    expect(model, ErrorCode.CONSTANT_DIMS_INVALID, "model.struct_types[3].structure.field[1].constant.dims[0]")


@pytest.mark.clause("DECL-CONSTANT")
@pytest.mark.parametrize("breakage", ["too_few", "too_many", "wrong_field", "raw_size", "two_fields",
                                      "external", "undefined_type"])
def test_constant_data_must_match(breakage):
    model = base_model()
    constant = _decl(model, 1101).structure.field[1].constant
    if breakage == "too_few":
        del constant.float_data[-1]
    elif breakage == "too_many":
        constant.float_data.append(2.0)
    elif breakage == "wrong_field":
        constant.ClearField("float_data")
        constant.int64_data.extend([1, 2, 3, 4])
    elif breakage == "raw_size":
        constant.ClearField("float_data")
        constant.raw_data = bytes(15)
    elif breakage == "two_fields":
        constant.raw_data = bytes(16)
    elif breakage == "external":
        constant.data_location = 1
    elif breakage == "undefined_type":
        constant.data_type = 99
    expect(model, ErrorCode.TENSOR_DATA_INVALID, "model.struct_types[3].structure.field[1].constant")


# ------------------------------------------------------------------------------------- byte encoding
@pytest.mark.clause("ENC-SIZE-TABLE")
def test_spec_sizes():
    encoded = verify_model(base_model()).encoded
    assert encoded["int4_block_4096"].element_bytes == 20
    assert encoded["weight_a"].element_bytes == 64
    assert encoded["weight_c"].element_bytes == 76
    assert encoded["codebook_32"].element_bytes == 12


@pytest.mark.clause("ENC-OVERFLOW")
@pytest.mark.parametrize("dims", [[2**63 - 1, 4], [2**62, 2**3], [2**32, 2**32]])
def test_size_overflow_is_rejected_by_arithmetic(dims):
    model = base_model()
    decl = model.struct_types.add(type_id=9)
    shape = decl.structure.field.add(name="huge").type.tensor_type
    shape.elem_type = dtypes.INT64
    for d in dims:
        shape.shape.dim.add(dim_value=d)
    model.graph.encoded_initializer.add(name="huge", raw_data=b"").struct_type.type_ref = 9
    expect(model, ErrorCode.SIZE_OVERFLOW)


@pytest.mark.clause("ENC-OVERFLOW")
def test_array_and_bit_packing_overflow():
    model = base_model()
    decl = model.struct_types.add(type_id=9)
    decl.array.element_type.struct_type.type_ref = 2001
    decl.array.dimension = 2**63
    model.graph.encoded_initializer.add(name="huge", raw_data=b"").struct_type.type_ref = 9
    expect(model, ErrorCode.SIZE_OVERFLOW)


@pytest.mark.clause("ENC-FIXED-SIZE", "REP-STATIC-SUBSET", "DECL-DYNAMIC-DIMS")
@pytest.mark.parametrize("field_type", ["sequence", "symbolic_dim", "no_shape", "map", "kindless"])
def test_non_fixed_size_field_cannot_be_a_payload_layout(field_type):
    model = base_model()
    decl = model.struct_types.add(type_id=9)
    decl.structure.field.add(name="scale").type.tensor_type.elem_type = dtypes.FLOAT
    decl.structure.field[0].type.tensor_type.shape.SetInParent()
    tp = decl.structure.field.add(name="dynamic").type
    if field_type == "sequence":
        tp.sequence_type.elem_type.tensor_type.elem_type = dtypes.FLOAT
    elif field_type == "symbolic_dim":
        tp.tensor_type.elem_type = dtypes.FLOAT
        tp.tensor_type.shape.dim.add(dim_param="n")
    elif field_type == "no_shape":
        tp.tensor_type.elem_type = dtypes.FLOAT
    elif field_type == "map":
        tp.map_type.key_type = dtypes.INT64
        tp.map_type.value_type.tensor_type.elem_type = dtypes.FLOAT
    else:
        tp.struct_type.SetInParent()
    verify_model(model)  # still a valid runtime type
    model.graph.encoded_initializer.add(name="dyn", raw_data=bytes(4)).struct_type.type_ref = 9
    expect(model, ErrorCode.NOT_FIXED_SIZE, "model.struct_types[5].structure.field[1]")


@pytest.mark.clause("ENC-LEAVES")
def test_string_leaf_is_unsupported():
    model = base_model()
    decl = model.struct_types.add(type_id=9)
    tensor = decl.structure.field.add(name="s").type.tensor_type
    tensor.elem_type = dtypes.STRING
    tensor.shape.SetInParent()
    verify_model(model)
    model.graph.encoded_initializer.add(name="s", raw_data=bytes(4)).struct_type.type_ref = 9
    expect(model, ErrorCode.UNSUPPORTED_LEAF)


@pytest.mark.clause("ENC-CONSTANT-ONLY")
def test_constant_only_root_is_rejected_but_nested_group_contributes_zero():
    model = base_model()
    constant_only = model.struct_types.add(type_id=9)
    constant_only.structure.field.add(name="c").constant.CopyFrom(_decl(model, 1101).structure.field[1].constant)
    verify_model(model)  # a valid type
    parent = model.struct_types.add(type_id=10)
    parent.structure.field.add(name="group").type.struct_type.type_ref = 9
    scale = parent.structure.field.add(name="scale").type.tensor_type
    scale.elem_type = dtypes.FLOAT
    scale.shape.SetInParent()
    model.graph.encoded_initializer.add(name="ok", raw_data=bytes(8)).struct_type.type_ref = 10
    assert verify_model(model).encoded["ok"].record_count == 2
    model.graph.encoded_initializer.add(name="bad", raw_data=b"").struct_type.type_ref = 9
    expect(model, ErrorCode.ROOT_SIZE_ZERO, "model.graph.encoded_initializer[12].struct_type")


@pytest.mark.clause("ENC-ROOT-SIZE")
def test_root_size_must_be_whole_bytes():
    model = base_model()
    decl = model.struct_types.add(type_id=9)
    decl.bit_packing.component.add(name="x", bit_width=3)
    decl.bit_packing.dimension = 5
    model.graph.encoded_initializer.add(name="odd", raw_data=bytes(2)).struct_type.type_ref = 9
    expect(model, ErrorCode.ROOT_SIZE_NOT_BYTES)


@pytest.mark.clause("ENC-RECORD-COUNT", "PAY-EMPTY")
def test_partial_records_rejected_and_empty_payload_is_zero_records():
    model = base_model()
    _value(model, "int4_block_4096").raw_data = bytes(2561)
    expect(model, ErrorCode.PAYLOAD_PARTIAL_RECORD, "model.graph.encoded_initializer[0]")
    model = base_model()
    _value(model, "int4_block_4096").raw_data = b""
    assert verify_model(model).encoded["int4_block_4096"].record_count == 0


@pytest.mark.clause("ENC-NO-COUNT-IN-TYPE")
def test_one_type_many_payload_lengths():
    encoded = verify_model(base_model()).encoded
    assert (encoded["int4_block_4096"].record_count, encoded["int4_block_8192"].record_count) == (128, 256)
    assert (encoded["codebook_32"].record_count, encoded["codebook_4096"].record_count) == (1, 128)


# ------------------------------------------------------------------------------------------ payloads
@pytest.mark.clause("ENC-LAYOUT")
def test_value_without_layout():
    model = base_model()
    _value(model, "weight_a").ClearField("struct_type")
    expect(model, ErrorCode.LAYOUT_MISSING, "model.graph.encoded_initializer[2]")


def _external(value, **entries):
    value.ClearField("raw_data")
    value.data_location = 1
    for key, text in entries.items():
        value.external_data.add(key=key, value=text)


@pytest.mark.clause("PAY-EXCLUSIVE")
def test_raw_and_external_are_exclusive():
    model = base_model()
    value = _value(model, "weight_a")
    value.external_data.add(key="location", value="w.bin")
    expect(model, ErrorCode.PAYLOAD_BOTH, "model.graph.encoded_initializer[2]")
    model = base_model()
    value = _value(model, "weight_a")
    _external(value, location="w.bin", length="64")
    value.raw_data = b"\0"
    expect(model, ErrorCode.PAYLOAD_BOTH, "model.graph.encoded_initializer[2]")


@pytest.mark.clause("PAY-EXTERNAL-KEYS", "PAY-DEFAULT-INLINE")
def test_external_data_needs_the_external_location():
    model = base_model()
    value = _value(model, "weight_a")
    value.ClearField("raw_data")
    value.external_data.add(key="location", value="w.bin")
    expect(model, ErrorCode.PAYLOAD_LOCATION_MISMATCH, "model.graph.encoded_initializer[2].external_data")


@pytest.mark.clause("PAY-EXTERNAL-KEYS")
@pytest.mark.parametrize("entries,code", [
    ({"length": "64"}, ErrorCode.EXTERNAL_LOCATION_MISSING),
    ({"location": "", "length": "64"}, ErrorCode.EXTERNAL_LOCATION_MISSING),
    ({"location": "w.bin"}, ErrorCode.EXTERNAL_LENGTH_MISSING),
    ({"location": "w.bin", "length": "64", "colour": "red"}, ErrorCode.EXTERNAL_KEY_INVALID),
    ({"location": "w.bin", "length": "0x40"}, ErrorCode.EXTERNAL_NUMBER_INVALID),
    ({"location": "w.bin", "length": "-64"}, ErrorCode.EXTERNAL_NUMBER_INVALID),
    ({"location": "w.bin", "length": "64", "offset": " 1"}, ErrorCode.EXTERNAL_NUMBER_INVALID),
    ({"location": "w.bin", "length": str(2**64)}, ErrorCode.EXTERNAL_NUMBER_INVALID),
])
def test_external_entries(entries, code):
    model = base_model()
    _external(_value(model, "weight_a"), **entries)
    expect(model, code, "model.graph.encoded_initializer[2]")


@pytest.mark.clause("PAY-EXTERNAL-KEYS")
def test_repeated_external_key():
    model = base_model()
    value = _value(model, "weight_a")
    _external(value, location="w.bin", length="64")
    value.external_data.add(key="length", value="64")
    expect(model, ErrorCode.EXTERNAL_KEY_INVALID, "model.graph.encoded_initializer[2].external_data[2]")


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
def test_external_extent_overflow():
    model = base_model()
    _external(_value(model, "weight_a"), location="w.bin", length="64", offset=str(2**64 - 10))
    expect(model, ErrorCode.EXTERNAL_EXTENT_OVERFLOW)


@pytest.mark.clause("PAY-EXTERNAL-CONTAINED")
@pytest.mark.parametrize("location", ["/etc/passwd", "../w.bin", "a/../../w.bin", "..\\w.bin",
                                      "C:\\w.bin", "c:/w.bin", "w\x00.bin", "."])
def test_external_location_must_stay_inside(location):
    model = base_model()
    _external(_value(model, "weight_a"), location=location, length="64")
    expect(model, ErrorCode.EXTERNAL_PATH_INVALID)


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
def test_external_files_checked_with_a_base_dir(tmp_path):
    model = base_model()
    value = _value(model, "weight_a")
    payload = value.raw_data
    _external(value, location="sub/w.bin", length="64", offset="3")
    verify_model(model)  # message-level rules only
    with pytest.raises(ContractError) as info:
        verify_model(model, base_dir=tmp_path)
    assert info.value.code == ErrorCode.EXTERNAL_FILE_INVALID
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(b"abc" + payload[:-1])
    with pytest.raises(ContractError) as info:
        verify_model(model, base_dir=tmp_path)
    assert info.value.code == ErrorCode.EXTERNAL_FILE_INVALID and "shorter" not in info.value.message
    (tmp_path / "sub" / "w.bin").write_bytes(b"abc" + payload)
    verify_model(model, base_dir=tmp_path)


@pytest.mark.clause("PAY-EXTERNAL-CONTAINED")
def test_symlink_escaping_the_base_dir(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(bytes(64))
    base = tmp_path / "model"
    base.mkdir()
    (base / "w.bin").symlink_to(outside)
    model = base_model()
    _external(_value(model, "weight_a"), location="w.bin", length="64")
    with pytest.raises(ContractError) as info:
        verify_model(model, base_dir=base)
    assert info.value.code == ErrorCode.EXTERNAL_PATH_INVALID


# -------------------------------------------------------------------------------------------- affine
def _affine(model, name="aff_axis"):
    return _value(model, name)


@pytest.mark.clause("AFF-STORAGE")
@pytest.mark.parametrize("storage", [dtypes.INT16, dtypes.FLOAT, dtypes.FLOAT8E4M3FN, dtypes.UINT16, 0])
def test_affine_storage_outside_closed_set(storage):
    model = base_model()
    _affine(model).affine.storage_type = storage
    expect(model, ErrorCode.AFFINE_STORAGE_INVALID)


@pytest.mark.clause("AFF-LOGICAL")
@pytest.mark.parametrize("breakage", ["missing", "sequence", "symbolic", "no_shape", "integer"])
def test_affine_logical_type(breakage):
    model = base_model()
    value = _affine(model)
    if breakage == "missing":
        value.ClearField("logical_type")
    elif breakage == "sequence":
        value.logical_type.sequence_type.elem_type.tensor_type.elem_type = dtypes.FLOAT
    elif breakage == "symbolic":
        value.logical_type.tensor_type.shape.dim[0].dim_param = "n"
    elif breakage == "no_shape":
        value.logical_type.tensor_type.ClearField("shape")
    else:
        value.logical_type.tensor_type.elem_type = dtypes.INT32
    expect(model, ErrorCode.LOGICAL_TYPE_INVALID)


@pytest.mark.clause("AFF-SCALE")
@pytest.mark.parametrize("breakage", ["missing", "integer", "other_float"])
def test_affine_scale(breakage):
    model = base_model()
    layout = _affine(model).affine
    if breakage == "missing":
        layout.ClearField("scale")
    elif breakage == "integer":
        layout.scale.data_type = dtypes.INT32
    else:  # DequantizeLinear has no DOUBLE output_dtype: a DOUBLE scale cannot decode to FLOAT
        layout.scale.data_type = dtypes.DOUBLE
        layout.scale.ClearField("raw_data")
        layout.scale.double_data.extend([0.0] * 6)
    expect(model, ErrorCode.AFFINE_SCALE_INVALID)


@pytest.mark.clause("AFF-DQ")
@pytest.mark.parametrize("name,dims", [("aff_tensor", [1]), ("aff_axis", [4]), ("aff_axis", []),
                                       ("aff_blocked", [4, 2]), ("aff_blocked", [3])])
def test_affine_parameter_shapes(name, dims):
    model = base_model()
    scale = _affine(model, name).affine.scale
    count = int(np.prod(dims)) if dims else 1
    scale.ClearField("dims")
    scale.dims.extend(dims)
    scale.raw_data = np.ones(count, np.float32).tobytes()
    expect(model, ErrorCode.AFFINE_PARAM_SHAPE)


@pytest.mark.clause("AFF-ZERO-POINT")
def test_zero_point_has_storage_type_and_scale_shape():
    model = base_model()
    zp = _affine(model).affine.zero_point
    zp.data_type = dtypes.INT4
    expect(model, ErrorCode.AFFINE_ZERO_POINT_INVALID)
    model = base_model()
    zp = _affine(model).affine.zero_point
    zp.dims[0] = 3
    zp.raw_data = bytes(2)
    expect(model, ErrorCode.AFFINE_PARAM_SHAPE)


@pytest.mark.clause("AFF-AXIS")
@pytest.mark.parametrize("axis", [2, -3, 100])
def test_axis_out_of_range(axis):
    model = base_model()
    _affine(model).affine.axis = axis
    expect(model, ErrorCode.AFFINE_AXIS_INVALID)


@pytest.mark.clause("AFF-AXIS")
def test_negative_axis_is_normalized():
    model = base_model()
    _affine(model).affine.axis = -1
    verify_model(model)


@pytest.mark.clause("AFF-BLOCK")
def test_block_size_needs_axis_and_is_positive():
    model = base_model()
    _affine(model, "aff_blocked").affine.ClearField("axis")
    expect(model, ErrorCode.AFFINE_BLOCK_WITHOUT_AXIS)
    model = base_model()
    _affine(model, "aff_blocked").affine.block_size = 0
    expect(model, ErrorCode.AFFINE_BLOCK_INVALID)


@pytest.mark.clause("AFF-PAYLOAD-SIZE")
@pytest.mark.parametrize("name,delta", [("aff_tensor", -1), ("aff_tensor", 1), ("aff_axis", 1),
                                        ("aff_blocked", -1)])
def test_affine_payload_exact_size(name, delta):
    model = base_model()
    value = _affine(model, name)
    value.raw_data = bytes(max(len(value.raw_data) + delta, 0))
    expect(model, ErrorCode.AFFINE_PAYLOAD_SIZE)


@pytest.mark.clause("AFF-PAYLOAD-SIZE")
def test_affine_payload_size_for_odd_counts():
    # 4 x 5 INT2 codes = 40 bits -> 5 bytes; 3 x 3 UINT4 = 36 bits -> 5 bytes
    model = base_model()
    assert len(_affine(model, "aff_blocked").raw_data) == 5
    x = np.zeros((3, 3), np.float32)
    model.graph.encoded_initializer.add().CopyFrom(
        affine.make_affine_value(x, dtypes.UINT4, np.float32(1.0), name="odd"))
    assert verify_model(model).encoded["odd"].extent.length == 5


@pytest.mark.clause("AFF-PADDING-ZERO")
def test_unused_high_bits_must_be_zero():
    model = base_model()
    x = np.zeros((3, 3), np.float32)
    value = affine.make_affine_value(x, dtypes.UINT4, np.float32(1.0), name="odd")
    value.raw_data = value.raw_data[:-1] + bytes([value.raw_data[-1] | 0x10])
    model.graph.encoded_initializer.add().CopyFrom(value)
    expect(model, ErrorCode.AFFINE_PADDING_NONZERO)


@pytest.mark.clause("AFF-LOGICAL")
def test_huge_logical_shape_rejected_without_allocation():
    model = base_model()
    dims = _affine(model, "aff_tensor").logical_type.tensor_type.shape.dim
    dims[0].dim_value = 2**50
    expect(model, ErrorCode.AFFINE_PAYLOAD_SIZE)
    dims[1].dim_value = 2**62
    expect(model, ErrorCode.SIZE_OVERFLOW)


# ------------------------------------------------------------------------------------ graph and names
@pytest.mark.clause("INIT-NAMES-UNIQUE")
@pytest.mark.parametrize("clash", ["dense", "sparse", "encoded"])
def test_initializer_names_unique_across_kinds(clash):
    model = base_model()
    if clash == "dense":
        model.graph.initializer.add(name="weight_a", data_type=1, dims=[1], float_data=[1.0])
    elif clash == "sparse":
        sparse = model.graph.sparse_initializer.add()
        sparse.values.name = "weight_a"
    else:
        model.graph.encoded_initializer.add().CopyFrom(_value(model, "weight_b"))
        model.graph.encoded_initializer[-1].name = "weight_a"
    expect(model, ErrorCode.INITIALIZER_NAME_DUPLICATE, "model.graph.")


@pytest.mark.clause("INIT-NAMES-UNIQUE", "INIT-AS-INPUT")
def test_encoded_initializer_needs_a_name_and_may_be_a_graph_input():
    model = base_model()
    model.graph.input.add(name="weight_a")
    verify_model(model)
    _value(model, "weight_a").name = ""
    expect(model, ErrorCode.INITIALIZER_NAME_EMPTY)


@pytest.mark.clause("GRAPH-STRUCT-IO")
def test_struct_typed_graph_inputs_are_validated_like_declarations():
    model = base_model()
    model.graph.input.add(name="cache").type.struct_type.type_ref = 1102
    verify_model(model)
    model.graph.output.add(name="bad").type.struct_type.type_ref = 31337
    expect(model, ErrorCode.TYPE_REF_UNRESOLVED, "model.graph.output[0].type.struct_type")


def test_subgraph_encoded_values_are_verified():
    model = base_model()
    node = model.graph.node.add(op_type="If")
    branch = node.attribute.add(name="then_branch", type=5).g
    branch.encoded_initializer.add(name="inner").struct_type.type_ref = 4242
    expect(model, ErrorCode.TYPE_REF_UNRESOLVED, "model.graph.node[0].attribute[0].g.encoded_initializer[0]")


# ------------------------------------------------------------------------------------- hostile bytes
@pytest.mark.clause("DECL-DEPTH")
@pytest.mark.parametrize("data", [b"\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x82\x3e" * 3, bytes(range(256))])
def test_unparseable_bytes(data):
    with pytest.raises(ContractError) as info:
        verify_model(data)
    assert info.value.code == ErrorCode.MODEL_PARSE_ERROR


def test_deeply_nested_bytes_are_classified():
    nested = b""
    for _ in range(300):  # TypeProto.sequence_type (4) -> Sequence.elem_type (1), by hand
        nested = b"\x0a" + varint(len(nested)) + nested
        nested = b"\x22" + varint(len(nested)) + nested
    value_info = b"\x0a\x01x" + b"\x12" + varint(len(nested)) + nested
    graph = b"\x5a" + varint(len(value_info)) + value_info
    data = b"\x3a" + varint(len(graph)) + graph
    with pytest.raises(ContractError) as info:
        verify_model(data)
    assert info.value.code in (ErrorCode.MODEL_PARSE_ERROR, ErrorCode.NESTING_TOO_DEEP)



@pytest.mark.clause("PAY-EXTERNAL-KEYS", "PAY-EXTERNAL-EXTENT")
@pytest.mark.parametrize("key,code", [("location", ErrorCode.EXTERNAL_PATH_INVALID),
                                      ("length", ErrorCode.EXTERNAL_NUMBER_INVALID),
                                      ("offset", ErrorCode.EXTERNAL_NUMBER_INVALID)])
def test_external_strings_that_are_not_utf8_are_classified(key, code):
    """proto2 does not validate strings, so invalid UTF-8 reaches the verifier as bytes."""
    model = base_model()
    entries = {"location": b"w.bin", "length": b"64", "offset": b"0"}
    entries[key] = b"\xff\xfe"
    value = _value(model, "weight_a")
    value.ClearField("raw_data")
    value.data_location = 1
    for name, text in entries.items():
        entry = schema.StringStringEntryProto()
        entry.ParseFromString(field(1, name.encode()) + field(2, text))
        value.external_data.add().CopyFrom(entry)
    expect(model, code)
