"""Decoding: the spec's worked examples with their figures, the registry, external payloads."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from reference_impl import (
    ContractError,
    DecoderRegistry,
    ErrorCode,
    decode,
    default_registry,
    examples,
    read_fields,
    schema,
    verify_model,
)
from reference_impl.bits import pack_sub_byte
from reference_impl.records import compile_layout
from reference_impl.structs import Catalogue


def _model_with(*values):
    model = schema.ModelProto(ir_version=10)
    model.struct_types.extend(examples.spec_struct_types())
    model.graph.encoded_initializer.extend(values)
    return model


@pytest.mark.clause("ENC-RECORD-COUNT", "ENC-NO-COUNT-IN-TYPE", "DEC-KEYED", "ENC-TIGHT")
def test_int4_block_2001_records_and_values():
    rng = np.random.default_rng(1)
    codes = rng.integers(-8, 8, size=(128, 32))
    scales = (rng.random(128) + 0.5).astype(np.float32)
    payload = examples.int4_block_payload(codes, scales)
    assert len(payload) == 2560  # 128 * 20
    model = _model_with(examples.encoded("w", 2001, payload, [4096]))
    assert verify_model(model).encoded["w"].record_count == 128
    expected = (codes.astype(np.float32) * scales[:, None]).reshape(-1)
    np.testing.assert_array_equal(decode(model, "w"), expected)


@pytest.mark.clause("DEC-KEYED", "ENC-BIT-ORDER", "EX-LINEAR-INT4")
def test_type_1003_constants_decode_code_plus_two_times_quarter():
    codes = np.arange(128) % 16 - 8
    payload = pack_sub_byte(codes, 4)
    assert len(payload) == 64  # 128 * 4 / 8
    model = _model_with(examples.encoded("a", 1003, payload, [128]))
    np.testing.assert_array_equal(decode(model, "a"), ((codes + 2) * 0.25).astype(np.float32))


@pytest.mark.clause("ENC-UNALIGNED", "ENC-BIT-ORDER", "PAY-NO-POINTERS", "ENC-TIGHT", "EX-LINEAR-INT4",
                    "ENC-PER-VALUE-PARAMS")
def test_type_1002_parameters_in_payload_with_unaligned_int64():
    codes = (np.arange(128) * 5) % 16 - 8
    payload = examples.linear_int4_with_parameters_payload(codes, 0.25, -2)
    assert len(payload) == 76  # 64 + 4 + 8
    assert int.from_bytes(payload[68:76], "little", signed=True) == -2
    model = _model_with(examples.encoded("d", 1002, payload, [128]))
    fields = read_fields(model.graph.encoded_initializer[0], Catalogue(model.struct_types))
    assert fields["zero_point"].tolist() == [-2] and fields["scale"].tolist() == [0.25]
    np.testing.assert_array_equal(decode(model, "d"), ((codes + 2) * 0.25).astype(np.float32))
    big_zero_point = examples.linear_int4_with_parameters_payload(codes, 1.0, -(2**62) - 3)
    model = _model_with(examples.encoded("e", 1002, big_zero_point, [128]))
    assert read_fields(model.graph.encoded_initializer[0], Catalogue(model.struct_types))["zero_point"][0] \
        == -(2**62) - 3


@pytest.mark.clause("ENC-BIT-ORDER", "DEC-ROOT-ONLY", "EX-CODEBOOK")
def test_codebook_example_bytes():
    value = examples.encoded("c", 1102, bytes([0xE4] * 8 + [0x00, 0x00, 0x00, 0x40]), [32])
    model = _model_with(value)
    info = verify_model(model).encoded["c"]
    assert (info.element_bytes, info.record_count) == (12, 1)
    np.testing.assert_array_equal(decode(model, "c"), np.tile(np.float32([-2, -0.5, 0.5, 2]), 8))


@pytest.mark.clause("ENC-RECORD-COUNT", "ENC-BIT-ORDER", "EX-CODEBOOK")
def test_codebook_128_records():
    rng = np.random.default_rng(3)
    indices = rng.integers(0, 4, size=(128, 32))
    scales = (rng.random(128) + 0.5).astype(np.float32)
    packed = np.frombuffer(pack_sub_byte(indices, 2), np.uint8).reshape(128, 8)
    payload = np.hstack([packed, scales.reshape(-1, 1).view(np.uint8)]).tobytes()
    assert len(payload) == 1536
    model = _model_with(examples.encoded("c", 1102, payload, [4096]))
    assert verify_model(model).encoded["c"].record_count == 128
    table = np.float32([-1.0, -0.25, 0.25, 1.0])
    np.testing.assert_array_equal(decode(model, "c"), (scales[:, None] * table[indices]).reshape(-1))


@pytest.mark.clause("CAT-REORDER")
def test_reordering_the_catalogue_keeps_decoded_values():
    model = examples.spec_example_model()
    before = {v.name: decode(model, v.name) for v in model.graph.encoded_initializer}
    reordered = list(model.struct_types)[::-1]
    del model.struct_types[:]
    model.struct_types.extend(reordered)
    for name, values in before.items():
        np.testing.assert_array_equal(decode(model, name), values)


@pytest.mark.clause("DEC-KEYED")
def test_registered_decoder_refuses_a_different_declaration_of_its_id():
    model = examples.spec_example_model()
    decl = next(d for d in model.struct_types if d.type_id == 1003)
    decl.structure.field[0].type.struct_type.array.dimension = 64  # same ID, different fields
    for value in model.graph.encoded_initializer:
        if value.name == "weight_a":
            value.raw_data = value.raw_data[:32]
            value.logical_type.tensor_type.shape.dim[0].dim_value = 64
    with pytest.raises(ContractError) as info:
        decode(model, "weight_a")
    assert info.value.code == ErrorCode.DECODER_MISMATCH


@pytest.mark.clause("DEC-MISSING", "DEC-NO-LOAD-EXEC")
def test_missing_decoder_fails_explicitly_and_verify_runs_no_codec():
    calls = []
    registry = DecoderRegistry()
    registry.register(2001, "spy", examples.spec_struct_types(), lambda layout, payload: calls.append(1))
    model = examples.spec_example_model()
    verify_model(model)
    assert calls == []
    with pytest.raises(ContractError) as info:
        decode(model, "weight_a", registry=registry)
    assert info.value.code == ErrorCode.CONSUMER_MISSING
    with pytest.raises(ContractError) as info:
        decode(model, "no_such_value")
    assert info.value.code == ErrorCode.VALUE_NOT_FOUND


@pytest.mark.clause("DEC-INLINE-CODEC", "ENC-STRUCT-LAYOUT")
def test_inline_layout_needs_generic_access_or_codec():
    decl = examples.spec_struct_types()[0]
    decl.ClearField("type_id")
    value = schema.EncodedValueProto(name="inline", raw_data=examples.int4_block_payload(np.ones((2, 32)), [1, 2]))
    value.struct_type.CopyFrom(decl)
    model = _model_with(value)
    with pytest.raises(ContractError) as info:
        decode(model, "inline")
    assert info.value.code == ErrorCode.CONSUMER_MISSING
    fields = read_fields(value, Catalogue(model.struct_types))
    assert fields["codes"].shape == (2, 32) and fields["scale"].tolist() == [1.0, 2.0]
    with pytest.raises(ContractError) as info:
        compile_layout(value.struct_type, Catalogue(model.struct_types)).read(np.zeros(20, np.uint8), "nope")
    assert info.value.code == ErrorCode.FIELD_NOT_FOUND


@pytest.mark.clause("ENC-LOGICAL-EXACT")
def test_logical_shape_must_match_decoded_values():
    payload = pack_sub_byte(np.zeros(128), 4)
    model = _model_with(examples.encoded("a", 1003, payload, [64]))
    with pytest.raises(ContractError) as info:
        decode(model, "a")
    assert info.value.code == ErrorCode.LOGICAL_SHAPE_MISMATCH
    model = _model_with(examples.encoded("b", 1003, payload, [8, 16]))
    assert decode(model, "b").shape == (8, 16)


@pytest.mark.clause("PAY-EXTERNAL-OWNER", "PAY-EXTERNAL-EXTENT", "PAY-VALIDATE-FIRST", "PAY-READ-ONLY")
def test_external_payload_is_memory_mapped_and_outlives_the_model(tmp_path):
    rng = np.random.default_rng(5)
    codes = rng.integers(-8, 8, size=(256, 32))
    scales = (rng.random(256) + 0.5).astype(np.float32)
    payload = examples.int4_block_payload(codes, scales)
    (tmp_path / "weights.bin").write_bytes(b"\x00" * 4097 + payload)
    value = examples.encoded("w", 2001, b"", [8192])
    value.ClearField("raw_data")
    value.data_location = 1
    for key, text in (("location", "weights.bin"), ("offset", "4097"), ("length", str(len(payload)))):
        value.external_data.add(key=key, value=text)
    model = _model_with(value)
    np.testing.assert_array_equal(decode(model, "w", base_dir=tmp_path),
                                  (codes * scales[:, None]).reshape(-1).astype(np.float32))
    fields = read_fields(model.graph.encoded_initializer[0], Catalogue(model.struct_types), tmp_path)
    from reference_impl.decode import payload_array

    raw = payload_array(model.graph.encoded_initializer[0], Catalogue(model.struct_types), tmp_path)
    assert not raw.flags.writeable
    del model, value
    gc.collect()
    assert raw.tobytes() == payload  # the mapping stays alive with the array
    assert fields["scale"].tolist() == scales.tolist()


@pytest.mark.clause("PAY-EXTERNAL-EXTENT", "PAY-VALIDATE-FIRST")
def test_short_backing_file_is_rejected_before_decoding(tmp_path):
    calls = []
    registry = default_registry()
    registry.register(2001, "spy", examples.spec_struct_types(), lambda layout, payload: calls.append(1))
    (tmp_path / "w.bin").write_bytes(bytes(39))
    value = examples.encoded("w", 2001, b"", [64])
    value.ClearField("raw_data")
    value.data_location = 1
    value.external_data.add(key="location", value="w.bin")
    value.external_data.add(key="length", value="40")
    model = _model_with(value)
    with pytest.raises(ContractError) as info:
        decode(model, "w", base_dir=tmp_path, registry=registry)
    assert info.value.code == ErrorCode.EXTERNAL_FILE_INVALID and calls == []


@pytest.mark.clause("AFF-PADDING-ZERO")
def test_external_affine_padding_is_checked_at_decode(tmp_path):
    from reference_impl import affine, dtypes

    value = affine.make_affine_value(np.zeros(3, np.float32), dtypes.UINT4, np.float32(1), name="a")
    (tmp_path / "a.bin").write_bytes(value.raw_data[:1] + bytes([0xF0 | value.raw_data[1]]))
    value.ClearField("raw_data")
    value.data_location = 1
    value.external_data.add(key="location", value="a.bin")
    value.external_data.add(key="length", value="2")
    model = _model_with(value)
    with pytest.raises(ContractError) as info:
        decode(model, "a", base_dir=tmp_path)
    assert info.value.code == ErrorCode.AFFINE_PADDING_NONZERO


@pytest.mark.clause("AFF-DQ")
def test_affine_values_decode_through_decode():
    from reference_impl import affine, dtypes

    x = np.linspace(-1, 1, 35, dtype=np.float32).reshape(5, 7)
    scale = np.full((5, 3), 0.25, np.float32)
    value = affine.make_affine_value(x, dtypes.INT4, scale, np.zeros((5, 3), np.int64), axis=1, block_size=3,
                                     name="q")
    model = _model_with(value)
    decoded = decode(model, "q")
    assert decoded.shape == (5, 7) and np.max(np.abs(decoded - x)) <= 0.125 + 1e-7


def test_bit_fields_of_every_width_round_trip():
    """Generic bit reader vs. a per-record Python reference on a small payload (widths 1..64)."""
    rng = np.random.default_rng(9)
    for width in (1, 3, 7, 13, 31, 33, 57, 63, 64):
        decl = schema.StructTypeProto(type_id=9)
        decl.bit_packing.component.add(name="pad", bit_width=5)
        decl.bit_packing.component.add(name="x", bit_width=width)
        decl.bit_packing.dimension = 8
        record_bits = 8 * (5 + width)
        records = 3
        payload = rng.integers(0, 256, size=records * record_bits // 8, dtype=np.uint8)
        layout = compile_layout(schema.StructTypeProto(type_ref=9), Catalogue([decl]))
        values = layout.read(payload, "x")
        number = int.from_bytes(payload.tobytes(), "little")
        for r in range(records):
            for i in range(8):
                start = r * record_bits + i * (5 + width) + 5
                assert int(values[r, i]) == (number >> start) & ((1 << width) - 1)


@pytest.mark.clause("PAY-READ-ONLY")
def test_inline_payload_views_are_read_only():
    from reference_impl.decode import payload_array

    model = examples.spec_example_model()
    raw = payload_array(model.graph.encoded_initializer[0], Catalogue(model.struct_types))
    assert not raw.flags.writeable
    with pytest.raises(ValueError):
        raw[0] = 1


@pytest.mark.clause("DEC-KEYED", "CAT-ID-CHANGE")
def test_registered_decoder_refuses_changed_constants_or_codec():
    model = examples.spec_example_model()
    decl = next(d for d in model.struct_types if d.type_id == 1003)
    decl.structure.field[1].constant.float_data[0] = 0.5  # same fields, another format constant
    with pytest.raises(ContractError) as info:
        decode(model, "weight_a")
    assert info.value.code == ErrorCode.DECODER_MISMATCH
    model = examples.spec_example_model()
    next(d for d in model.struct_types if d.type_id == 1003).decoder.name = "SomeOtherDecoder"
    with pytest.raises(ContractError) as info:
        decode(model, "weight_a")
    assert info.value.code == ErrorCode.DECODER_MISMATCH


@pytest.mark.clause("DECL-DEPTH", "ENC-LEAVES")
def test_diamond_of_constant_only_groups_is_bounded():
    """Each level references the next twice; expanding every path would take 2**depth work."""
    from reference_impl import dtypes

    declarations = []
    constant = schema.TensorProto(data_type=dtypes.FLOAT, dims=[1], float_data=[1.0])
    for level in range(20):
        decl = schema.StructTypeProto(type_id=100 + level)
        for name in ("a", "b"):
            field = decl.structure.field.add(name=name)
            if level == 19:
                field.constant.CopyFrom(constant)
            else:
                field.type.struct_type.type_ref = 101 + level
        declarations.append(decl)
    root = schema.StructTypeProto(type_id=99)
    root.structure.field.add(name="groups").type.struct_type.type_ref = 100
    byte = root.structure.field.add(name="v").type.tensor_type
    byte.elem_type = dtypes.UINT8
    byte.shape.SetInParent()
    declarations.append(root)
    value = examples.encoded("v", 99, b"\x07\x08", None)
    model = schema.ModelProto(ir_version=10)
    model.struct_types.extend(declarations)
    model.graph.encoded_initializer.append(value)
    assert verify_model(model).encoded["v"].record_count == 2  # sizes are memoized, never expanded
    with pytest.raises(ContractError) as info:
        read_fields(model.graph.encoded_initializer[0], Catalogue(model.struct_types))
    assert info.value.code == ErrorCode.RESOURCE_LIMIT


@pytest.mark.clause("ENC-LEAVES", "ENC-BIT-ORDER")
@pytest.mark.parametrize("elem_type,width", [(14, 64), (15, 128)])
def test_complex_leaves_at_any_bit_offset(elem_type, width):
    decl = schema.StructTypeProto(type_id=9)
    pad = decl.structure.field.add(name="pad").type.struct_type.bit_packing
    pad.component.add(name="p", bit_width=4)
    pad.dimension = 1
    tensor = decl.structure.field.add(name="z").type.tensor_type
    tensor.elem_type = elem_type
    tensor.shape.SetInParent()
    tail = decl.structure.field.add(name="tail").type.struct_type.bit_packing
    tail.component.add(name="t", bit_width=4)
    tail.dimension = 1
    part = np.float32 if width == 64 else np.float64
    z = np.array([1.5 - 2.25j, -0.125 + 8j], dtype=np.complex64 if width == 64 else np.complex128)
    parts = np.stack([z.real.astype(part), z.imag.astype(part)], axis=1).view(np.uint8).reshape(2, -1)
    records = []
    for row in parts:  # shift each record's value left by four bits, low nibble = pad
        number = int.from_bytes(row.tobytes(), "little") << 4 | 0x5
        records.append(number.to_bytes(width // 8 + 1, "little"))
    model = schema.ModelProto(ir_version=10)
    model.struct_types.append(decl)
    model.graph.encoded_initializer.append(examples.encoded("z", 9, b"".join(records), None))
    fields = read_fields(model.graph.encoded_initializer[0], Catalogue(model.struct_types))
    np.testing.assert_array_equal(fields["z"], z)
    assert fields["pad.p"].tolist() == [[5], [5]]  # (records, bit-packing dimension)


@pytest.mark.clause("ENC-LEAVES", "ENC-BIT-ORDER")
def test_unaligned_complex_leaves_keep_their_exact_bits():
    """Infinite and NaN parts, and signaling NaNs, come back bit for bit (no arithmetic on the parts)."""
    decl = schema.StructTypeProto(type_id=9)
    pad = decl.structure.field.add(name="pad").type.struct_type.bit_packing
    pad.component.add(name="p", bit_width=4)
    pad.dimension = 1
    tensor = decl.structure.field.add(name="z").type.tensor_type
    tensor.elem_type = 14
    tensor.shape.dim.add(dim_value=3)
    tail = decl.structure.field.add(name="tail").type.struct_type.bit_packing
    tail.component.add(name="t", bit_width=4)
    tail.dimension = 1
    bits = np.array([0x3F800000, 0x7FC00000,   # 1 + NaN j
                     0x7F800000, 0xFF800000,   # inf - inf j
                     0x7FA00001, 0x00000001],  # signaling NaN + denormal j
                    dtype="<u4")
    number = int.from_bytes(bits.tobytes(), "little") << 4
    model = schema.ModelProto(ir_version=10)
    model.struct_types.append(decl)
    model.graph.encoded_initializer.append(examples.encoded("z", 9, number.to_bytes(25, "little"), None))
    z = read_fields(model.graph.encoded_initializer[0], Catalogue(model.struct_types))["z"]
    assert z.dtype == np.complex64
    np.testing.assert_array_equal(np.ascontiguousarray(z).view("<u4").reshape(-1), bits)
