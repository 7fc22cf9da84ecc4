"""Faults in byte encoding of structured values: bit order, sizes, record counts, leaves and layouts."""

from __future__ import annotations

import dataclasses
import weakref

import ml_dtypes
import numpy as np

from conformance.audit.fault import (
    Fault,
    Patch,
    decode_module,
    encoded_values,
    fault,
    name_faults,
    skip,
    struct_types,
    type_refs,
    wrap,
)
from conformance.audit.fault import decode_module as decode
from conformance.audit.faults.shared import _SUB_BYTE, _implicit_operand, _name, _registry_patch
from reference_impl import bits, decoders, dtypes, payload, records, schema, structs, verifier
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels, program
from reference_impl.structs import NotFixedSize, check_struct, struct_kind
from reference_impl.values import EncodedValue


class ConstantsTakePayloadBytes(Fault):
    """Sizes a constant field like a stored one (it keeps the constant in every record), instead of
    ``size(Field(constant)) = 0``."""

    fault_id = "ENC-SIZE-TABLE.constants-stored"
    clauses = ("ENC-SIZE-TABLE",)

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.WhichOneof("kind") != "structure":
                continue
            for field in st.structure.field:
                if field.WhichOneof("content") == "constant":
                    constant = field.constant
                    tensor = field.type.tensor_type  # selecting the type clears the constant
                    tensor.elem_type = constant.data_type
                    tensor.shape.SetInParent()
                    for dim in constant.dims:
                        tensor.shape.dim.add(dim_value=dim)


def _widen_sub_byte(original):
    def type_bit_size(tp, path, catalogue, depth=0):
        size = original(tp, path, catalogue, depth)
        if tp.WhichOneof("value") == "tensor_type" and not isinstance(size, structs.NotFixedSize):
            width = dtypes.BIT_WIDTH.get(tp.tensor_type.elem_type, 8)
            if width < 8:
                return size // width * 8
        return size
    return type_bit_size


SubByteTensorCodesTakeAByte = fault("ENC-SIZE-TABLE.sub-byte-tensor-unpacked", ("ENC-SIZE-TABLE",),
    """Sizes ``tensor(INT4/UINT4/INT2/UINT2, dims)`` fields at one byte per element instead of ``product(dims) *
    bit_width``: the narrowest leaves are not packed tightly.""", boundary=True,
    patches=lambda: [wrap(structs, "type_bit_size", _widen_sub_byte)])


def _wrapping_add(original):
    return lambda a, b, path: (a + b) % 2**64


class WrappingSizeArithmetic(Fault):
    """Computes sizes with plain uint64 arithmetic that wraps around instead of checked arithmetic:
    an overflowing size silently becomes a small (or zero) one."""

    fault_id = "ENC-OVERFLOW.wrapping-arithmetic"
    clauses = ("ENC-OVERFLOW",)

    def patches(self):
        def mul(original):
            return lambda a, b, path: (a * b) % 2**64
        return [wrap(structs, "checked_mul", mul), wrap(structs, "checked_add", _wrapping_add)]


def _dynamic_as_empty(original):
    def type_bit_size(tp, path, catalogue, depth=0):
        size = original(tp, path, catalogue, depth)
        return 0 if isinstance(size, structs.NotFixedSize) else size
    return type_bit_size


DynamicFieldsSizedZero = fault("ENC-FIXED-SIZE.dynamic-fields-zero", ("ENC-FIXED-SIZE",),
    """Sizes fields without a fixed inline size (sequences, maps, symbolic dimensions) at zero bits instead of refusing
    the byte-payload layout for their struct.""", patches=lambda: [wrap(structs, "type_bit_size", _dynamic_as_empty)])


def _strings_as_pointers(original):
    def type_bit_size(tp, path, catalogue, depth=0):
        tensor = tp.tensor_type if tp.WhichOneof("value") == "tensor_type" else None
        if tensor is not None and tensor.elem_type == dtypes.STRING and tensor.HasField("shape"):
            count = 1
            for dim in tensor.shape.dim:
                count *= dim.dim_value
            return 64 * count
        return original(tp, path, catalogue, depth)
    return type_bit_size


StringLeavesAsPointers = fault("ENC-LEAVES.strings-as-pointers", ("ENC-LEAVES",),
    """Lays out a STRING leaf as a 64-bit pointer to its characters, as its in-memory struct does, instead of refusing
    it as a leaf that is not fixed-width physical data.""",
    patches=lambda: [wrap(structs, "type_bit_size", _strings_as_pointers)])

RootSizeNotWholeBytes = fault("ENC-ROOT-SIZE.rounded-up", ("ENC-ROOT-SIZE",),
    """Rounds an encoding root's size up to whole bytes instead of requiring a multiple of eight bits.""",
    patches=lambda: [skip(verifier, "_verify_struct_layout", "ROOT_SIZE_NOT_BYTES")])


def _zero_records(arguments: dict) -> verifier.EncodedInfo:
    return verifier.EncodedInfo(arguments["path"], arguments["extent"], element_bytes=0, record_count=0)


ConstantOnlyRootAccepted = fault("ENC-CONSTANT-ONLY.zero-size-root", ("ENC-CONSTANT-ONLY",),
    """Accepts a constant-only struct (zero bytes per record) as an encoding root, as a value of zero records.""",
    patches=lambda: [skip(verifier, "_verify_struct_layout", "ROOT_SIZE_ZERO", returns=_zero_records)])


class RejectsZeroSizeStructs(Fault):
    """Refuses every constant-only struct, also as a plain type or as a nested group contributing zero
    bytes to its parent's records."""

    fault_id = "ENC-CONSTANT-ONLY.constant-groups-rejected"
    clauses = ("ENC-CONSTANT-ONLY",)
    boundary = True

    def precheck(self, model, base_dir):
        try:
            catalogue = structs.Catalogue(model.struct_types)
        except Exception:  # noqa: BLE001 - an invalid catalogue is the oracle's to report
            return
        for decl, path in catalogue.declarations.values():
            try:
                size = catalogue.bit_size(decl, path)
            except Exception:  # noqa: BLE001
                continue
            if size == 0:
                raise violation(E.ROOT_SIZE_ZERO, path, "a struct needs a positive size")


class FieldsInNameOrder(Fault):
    """Keeps a structure's fields in a map sorted by name, so records are laid out in name order rather
    than declaration order."""

    fault_id = "ENC-TIGHT.fields-sorted-by-name"
    clauses = ("ENC-TIGHT",)

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.WhichOneof("kind") == "structure":
                ordered = []
                for field in sorted(st.structure.field, key=lambda f: f.name):
                    copy = type(field)()
                    copy.CopyFrom(field)
                    ordered.append(copy)
                del st.structure.field[:]
                st.structure.field.extend(ordered)


def _layoutless_as_bytes(original):
    def verify_encoded_value(value, path, catalogue, base_dir=None):
        if value.WhichOneof("layout") is not None:
            return original(value, path, catalogue, base_dir)
        extent = payload.payload_extent(value, path)
        if base_dir is not None:
            payload.check_file(extent, base_dir, path)
        return verifier.EncodedInfo(path, extent, element_bytes=1, record_count=extent.length)
    return verify_encoded_value


def _layoutless_as_dense(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value"):
        if value.WhichOneof("layout") is not None:
            return original(value, catalogue, base_dir, registry, path)
        info = verifier.verify_encoded_value(value, path, catalogue, base_dir)
        data = payload.open_payload(value, info.extent, base_dir, path)
        elem_type, shape = verifier.logical_tensor_shape(value, path)
        return np.frombuffer(data.tobytes(), dtypes.NUMPY_DTYPE[elem_type]).reshape(shape)
    return decode_value


NoLayoutReadsAsDense = fault("ENC-LAYOUT.missing-layout-accepted", ("ENC-LAYOUT",),
    """Treats an encoded value that selects no layout as plain bytes (the logical tensor, as a dense TensorProto's
    raw_data would be read) instead of rejecting it.""",
    patches=lambda: [wrap(verifier, "verify_encoded_value", _layoutless_as_bytes),
                     wrap(decode, "decode_value", _layoutless_as_dense)])


class InlineLayoutsUnsupported(Fault):
    """Supports only type_ref layouts: a concrete inline declaration is refused as a payload layout."""

    fault_id = "ENC-STRUCT-LAYOUT.inline-layout-rejected"
    clauses = ("ENC-STRUCT-LAYOUT",)

    def precheck(self, model, base_dir):
        for value in encoded_values(model):
            if value.WhichOneof("layout") == "struct_type" and value.struct_type.WhichOneof("kind") != "type_ref":
                raise violation(E.CONSUMER_MISSING, "model.graph", "only type_ref layouts are supported")


def _truncating(original):
    def verify_struct_layout(value, path, extent, catalogue):
        try:
            return original(value, path, extent, catalogue)
        except ContractError as error:
            if error.code is not E.PAYLOAD_PARTIAL_RECORD:
                raise
            size = catalogue.bit_size(value.struct_type, path) // 8
            whole = dataclasses.replace(extent, length=extent.length - extent.length % size)
            return original(value, path, whole, catalogue)
    return verify_struct_layout


PartialRecordsTruncated = fault("ENC-RECORD-COUNT.partial-record-ignored", ("ENC-RECORD-COUNT",),
    """Counts records with a floor division and silently ignores a trailing partial record.""",
    patches=lambda: [wrap(verifier, "_verify_struct_layout", _truncating)])


def _drop_last_record(original):
    def read_leaf(payload, record_bits, leaf):
        record_bytes = record_bits // 8
        if record_bytes and len(payload) >= 2 * record_bytes:
            payload = payload[: len(payload) - len(payload) % record_bytes - record_bytes]
        return original(payload, record_bits, leaf)
    return read_leaf


LastRecordDropped = fault("ENC-RECORD-COUNT.last-record-dropped", ("ENC-RECORD-COUNT",),
    """Loops over records with an off-by-one bound: the last record of a multi-record payload is never read.""",
    boundary=True, patches=lambda: [wrap(records, "read_leaf", _drop_last_record)])


def _one_record(original):
    def verify_struct_layout(value, path, extent, catalogue):
        info = original(value, path, extent, catalogue)
        if info.record_count != 1:
            raise violation(E.PAYLOAD_PARTIAL_RECORD, path,
                            f"{extent.length} bytes are not one {info.element_bytes}-byte element of the type")
        return info
    return verify_struct_layout


TypeIsOneRecord = fault("ENC-NO-COUNT-IN-TYPE.exactly-one-record", ("ENC-NO-COUNT-IN-TYPE",),
    """Takes the struct type as the layout of the whole value: a payload must hold exactly one record, so the same type
    cannot describe payloads of other lengths.""",
    patches=lambda: [wrap(verifier, "_verify_struct_layout", _one_record)])


def _big_endian(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type is not None and leaf.width in (16, 32, 64) and values.dtype.kind in "iuf":
            return values.byteswap()
        return values
    return read_leaf


BigEndianScalars = fault("ENC-BIT-ORDER.big-endian-scalars", ("ENC-BIT-ORDER",),
    """Reads multi-byte scalar fields big-endian (network order) instead of little-endian.""",
    patches=lambda: [wrap(records, "read_leaf", _big_endian)])


def _msb_first_components(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.elem_type is not None or not len(payload):
            return original(payload, record_bits, leaf)
        # Bit-packing components read as an MSB-first bit stream: bit q of the record is bit 7 - q % 8
        # of byte q // 8, and a field's first bit is its most significant one.
        count = len(payload) // (record_bits // 8)
        positions = records._leaf_positions(count, record_bits, leaf).astype(np.int64)
        value = np.zeros(positions.shape, np.uint64)
        for bit in range(leaf.width):  # one pass per bit of the field width, not per element
            q = positions + bit
            value = (value << np.uint64(1)) | ((payload[q // 8] >> (7 - q % 8)) & 1).astype(np.uint64)
        return value
    return read_leaf


BitPackingMostSignificantFirst = fault("ENC-BIT-ORDER.components-msb-first", ("ENC-BIT-ORDER",),
    """Places the first bit-packing component in the most-significant bits of its byte.""", boundary=True,
    patches=lambda: [wrap(records, "read_leaf", _msb_first_components)])


def _aligned_reads(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.width == 64 and leaf.offset % 64:
            leaf = dataclasses.replace(leaf, offset=leaf.offset - leaf.offset % 64)
        return original(payload, record_bits, leaf)
    return read_leaf


AlignedInt64Reads = fault("ENC-UNALIGNED.aligned-loads", ("ENC-UNALIGNED",),
    """Reads 64-bit fields with an aligned load: the offset is rounded down to a multiple of eight bytes, so an INT64 at
    byte 68 is read from byte 64.""", patches=lambda: [wrap(records, "read_leaf", _aligned_reads)])


def _linear_type_defaults(layout, payload):
    """DecodeLinearInt4 written for type 1003: parameters only from the declaration's constants."""
    codes = layout.read(payload, "values").astype(np.float32)
    scale = np.asarray(layout.constant("scale") if "scale" in layout.constants else 1.0, np.float32).reshape(-1)[:1]
    zero = np.asarray(layout.constant("zero_point") if "zero_point" in layout.constants else 0, np.float32)
    return ((codes - zero.reshape(-1)[:1]) * scale).reshape(-1)


PerValueParametersIgnored = fault("ENC-PER-VALUE-PARAMS.value-parameters-ignored", ("ENC-PER-VALUE-PARAMS",),
    """Uses one decoder for types 1002 and 1003 that looks parameters up in the declaration's constants only: a value's
    own scale and zero point are ignored (scale 1, zero point 0).""",
    patches=lambda: [_registry_patch((1002, _linear_type_defaults))])


class LogicalTypeRequired(Fault):
    """Requires a logical_type on every encoded value, although a custom struct without tensor
    semantics may omit it."""

    fault_id = "ENC-LOGICAL-OPTIONAL.logical-type-required"
    clauses = ("ENC-LOGICAL-OPTIONAL",)

    def precheck(self, model, base_dir):
        for value in encoded_values(model):
            if not value.HasField("logical_type"):
                raise violation(E.LOGICAL_TYPE_INVALID, f"model.graph.encoded_initializer[{value.name!r}]",
                                "logical_type is required")


LogicalTypeNotEnforced = fault("ENC-LOGICAL-EXACT.decoder-output-unchecked", ("ENC-LOGICAL-EXACT",),
    """Returns whatever the decoder produced, without checking or applying the declared logical type and shape.""",
    patches=lambda: [Patch(decode, "_check_logical", lambda value, result, path: result)])

EncodedBytesToTensorOps = fault("ENC-NO-IMPLICIT-TENSOR.payload-as-tensor",
    ("ENC-NO-IMPLICIT-TENSOR", "GRAPH-TENSOR-OPS"), """Lets a tensor-only operator read an encoded value's payload bytes
    as a UINT8 tensor.""",
    patches=lambda: [wrap(program, "_tensor_operand", _implicit_operand(encoded_to_tensor=lambda v: v.payload))])


def _round_up(size: int) -> int:
    return -(-size // 8) * 8


def _zero_extending(values: np.ndarray, elem_type: int) -> np.ndarray:
    if elem_type in dtypes.SIGNED_INTEGERS:
        return values.astype(dtypes.NUMPY_DTYPE[elem_type])
    return bits.unsigned_to_leaf(values, elem_type)


UnalignedSignedZeroExtended = fault("ENC-BIT-ORDER.bit-fields-not-sign-extended", ("ENC-BIT-ORDER", "ENC-UNALIGNED"),
    """Reads signed integer fields that are not on a byte boundary (or not a whole number of bytes) with its generic
    bit-field reader, which returns the raw bits without sign extension: an INT4 at bit 4 holding 0xF reads 15, not
    -1.""", patches=lambda: [Patch(records, "unsigned_to_leaf", _zero_extending, aliases=False)])


def _first_byte_only(buffer, bit_positions, width):
    values = bits.read_bits(buffer, bit_positions, width)
    if width >= 8:
        return values
    shift = np.asarray(bit_positions, dtype=np.uint64) & np.uint64(7)
    within = np.minimum(np.uint64(width), np.uint64(8) - shift)
    return values & ((np.uint64(1) << within) - np.uint64(1))


SubByteFieldsReadFromOneByte = fault("ENC-TIGHT.sub-byte-field-one-byte", ("ENC-TIGHT", "ENC-BIT-ORDER"),
    """Reads a field narrower than a byte from the byte holding its first bit only: the high bits of a field that
    crosses into the next byte (a 3-bit component at bit 6) read as zero.""", boundary=True,
    patches=lambda: [Patch(records, "read_bits", _first_byte_only, aliases=False)])


def _eight_byte_window(buffer, bit_positions, width):
    values = bits.read_bits(buffer, bit_positions, width)
    if width + 7 <= 64:
        return values
    shift = np.asarray(bit_positions, dtype=np.uint64) & np.uint64(7)
    kept = np.uint64(64) - shift  # bits available in the 8-byte window starting at the first byte
    mask = np.where(kept >= 64, np.uint64(2**64 - 1), (np.uint64(1) << (kept & np.uint64(63))) - np.uint64(1))
    return values & mask


WideFieldNinthByteDropped = fault("ENC-LEAVES.wide-field-ninth-byte-dropped", ("ENC-LEAVES", "ENC-BIT-ORDER"),
    """Reads every bit field through one 64-bit little-endian load at its first byte: a field of 58 to 64 bits that
    starts inside a byte loses the bits spilling into the ninth byte.""", boundary=True,
    patches=lambda: [Patch(records, "read_bits", _eight_byte_window, aliases=False)])


def _byte_floored(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.elem_type is not None and leaf.width % 8 == 0 and leaf.offset % 8:
            leaf = leaf._replace(offset=leaf.offset - leaf.offset % 8)
        return original(payload, record_bits, leaf)
    return read_leaf


WholeByteFieldsAtByteOffset = fault("ENC-UNALIGNED.bit-offset-floored", ("ENC-UNALIGNED", "ENC-TIGHT"),
    """Converts a whole-byte field's bit offset to a byte offset by floor division and reads from there: a UINT16 after
    a 4-bit component is read from byte 0 instead of bit 4.""",
    patches=lambda: [wrap(records, "read_leaf", _byte_floored)])


def _half_big_endian(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type in (dtypes.FLOAT16, dtypes.BFLOAT16):
            return values.byteswap()
        return values
    return read_leaf


HalfFloatsBigEndian = fault("ENC-BIT-ORDER.half-floats-big-endian", ("ENC-BIT-ORDER",),
    """Converts FLOAT16 and BFLOAT16 fields with a half-precision helper that takes its two bytes high byte first; every
    other multi-byte field is read little-endian.""", patches=lambda: [wrap(records, "read_leaf", _half_big_endian)])


def _bfloat16_as_half(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type == dtypes.BFLOAT16:
            return values.view(np.uint16).view(np.float16).astype(np.float32).astype(ml_dtypes.bfloat16)
        return values
    return read_leaf


Bfloat16ReadAsFloat16 = fault("ENC-LEAVES.bfloat16-as-float16", ("ENC-LEAVES",),
    """Maps every 16-bit floating leaf to IEEE half: a BFLOAT16 field's bits are decoded as FLOAT16 (5 exponent bits)
    instead of bfloat16 (8 exponent bits).""", patches=lambda: [wrap(records, "read_leaf", _bfloat16_as_half)])


def _column_major(original):
    def compile_type(tp, catalogue, prefix, offset, dims, layout, path, expanded):
        original(tp, catalogue, prefix, offset, dims, layout, path, expanded)
        if tp.WhichOneof("value") != "tensor_type":
            return
        leaf = layout.leaves[prefix]
        shape = [d.dim_value for d in tp.tensor_type.shape.dim]
        strides, stride = [], leaf.width
        for count in shape:  # first index fastest
            strides.append(stride)
            stride *= count
        layout.leaves[prefix] = leaf._replace(dims=dims + tuple(zip(shape, strides)))
    return compile_type


TensorFieldsColumnMajor = fault("ENC-TIGHT.tensor-fields-column-major", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Lays out a multi-dimensional tensor field column-major (first index fastest) instead of the row-major order of
    TensorProto.raw_data.""", patches=lambda: [wrap(records, "_compile_type", _column_major)])


def _resolved_kind(tp, catalogue) -> tuple[str | None, object]:
    st = tp.struct_type
    try:
        decl, _ = catalogue.resolve(st, "field")
    except ContractError:
        return None, st
    return structs.struct_kind(decl), decl


def _struct_fields_rounded(kinds: tuple[str, ...], when=lambda decl, size: True, to=_round_up):
    def make(original):
        def type_bit_size(tp, path, catalogue, depth=0):
            size = original(tp, path, catalogue, depth)
            if tp.WhichOneof("value") != "struct_type" or isinstance(size, structs.NotFixedSize):
                return size
            kind, decl = _resolved_kind(tp, catalogue)
            return to(size) if kind in kinds and when(decl, size) else size
        return type_bit_size
    return make


def _sub_byte_array(decl, size) -> bool:
    element = decl.array.element_type
    return element.WhichOneof("value") == "tensor_type" and \
        dtypes.BIT_WIDTH.get(element.tensor_type.elem_type, 8) < 8


SubByteArraysPadded = fault("ENC-TIGHT.sub-byte-arrays-padded", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Stores an array of 4- or 2-bit elements like a TensorProto's raw_data, padded to whole bytes, so a nested array
    of three INT4 takes 16 bits and the next field starts at the next byte, instead of packing tightly into ``n *
    size(T)`` bits.""", boundary=True,
    patches=lambda: [wrap(structs, "type_bit_size", _struct_fields_rounded(("array",), _sub_byte_array))])

NestedGroupsByteRounded = fault("ENC-TIGHT.nested-groups-byte-rounded", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Gives a nested structure or bit packing its size rounded up to whole bytes (as a C compiler sizes a nested
    struct), so the field after a 12-bit group starts at bit 16 instead of bit 12.""", boundary=True,
    patches=lambda: [wrap(structs, "type_bit_size", _struct_fields_rounded(("structure", "bit_packing")))])


class EmptyGroupsTakeAByte(Fault):
    """Sizes a nested constant-only group at one byte (a C++ empty struct) instead of zero bits."""

    fault_id = "ENC-CONSTANT-ONLY.empty-group-one-byte"
    clauses = ("ENC-CONSTANT-ONLY", "ENC-SIZE-TABLE")
    boundary = True

    def patches(self):
        zero = lambda decl, size: size == 0  # noqa: E731
        return [wrap(structs, "type_bit_size",
                     _struct_fields_rounded(("structure",), zero, to=lambda size: 8))]


def _array_stride_rounded(original_size, original_body):
    def bit_size(catalogue, st, path, depth=0):
        size = original_size(catalogue, st, path, depth)
        if structs.struct_kind(st) != "array" or isinstance(size, structs.NotFixedSize) or \
                st.array.element_type.WhichOneof("value") != "struct_type":
            return size
        element = structs.type_bit_size(st.array.element_type, path, catalogue, depth)
        return structs.checked_mul(st.array.dimension, _round_up(element), path)

    def compile_body(st, catalogue, prefix, offset, dims, layout, path, expanded):
        if structs.struct_kind(st) == "array" and st.array.element_type.WhichOneof("value") == "struct_type":
            element = _round_up(structs.type_bit_size(st.array.element_type, path, catalogue))
            records._compile_type(st.array.element_type, catalogue, prefix, offset,
                                  dims + ((st.array.dimension, element),), layout,
                                  f"{path}.array.element_type", expanded)
            return
        original_body(st, catalogue, prefix, offset, dims, layout, path, expanded)
    return bit_size, compile_body


class ArrayOfStructsByteStride(Fault):
    """Steps through an array of nested structs with a byte stride (the element's size rounded up to
    whole bytes), so elements of a 12-bit struct start every 16 bits instead of every 12."""

    fault_id = "ENC-TIGHT.struct-array-byte-stride"
    clauses = ("ENC-TIGHT", "ENC-SIZE-TABLE")
    boundary = True

    def patches(self):
        bit_size, compile_body = _array_stride_rounded(structs.Catalogue.bit_size, records._compile_body)
        return [Patch(structs.Catalogue, "bit_size", bit_size), Patch(records, "_compile_body", compile_body)]


def _packing_stride_rounded(original_size, original_body):
    def bit_size(catalogue, st, path, depth=0):
        size = original_size(catalogue, st, path, depth)
        if structs.struct_kind(st) != "bit_packing" or isinstance(size, structs.NotFixedSize):
            return size
        element = sum(c.bit_width for c in st.bit_packing.component)
        return structs.checked_mul(st.bit_packing.dimension, _round_up(element), path)

    def compile_body(st, catalogue, prefix, offset, dims, layout, path, expanded):
        if structs.struct_kind(st) != "bit_packing":
            return original_body(st, catalogue, prefix, offset, dims, layout, path, expanded)
        stride = _round_up(sum(c.bit_width for c in st.bit_packing.component))
        running = 0
        for component in st.bit_packing.component:
            records._add_leaf(layout, records.Leaf(records._join(prefix, component.name), None,
                                                   component.bit_width, offset + running,
                                                   dims + ((st.bit_packing.dimension, stride),)), path)
            running += component.bit_width
        return None
    return bit_size, compile_body


class BitPackingElementsByteAligned(Fault):
    """Starts every element of a bit packing on a byte boundary (its components padded to whole bytes)
    instead of packing the elements tightly: three 12-bit elements take 48 bits, not 36."""

    fault_id = "ENC-TIGHT.bit-packing-elements-byte-aligned"
    clauses = ("ENC-TIGHT", "ENC-SIZE-TABLE")
    boundary = True

    def patches(self):
        bit_size, compile_body = _packing_stride_rounded(structs.Catalogue.bit_size, records._compile_body)
        return [Patch(structs.Catalogue, "bit_size", bit_size), Patch(records, "_compile_body", compile_body)]


class BitPackingDimensionIgnored(Fault):
    """Reads a bit packing as one group of its components, ignoring its dimension (the count of
    groups): ``size(BitPacking(c..., n)) = sum(c.bit_width)``."""

    fault_id = "ENC-SIZE-TABLE.bit-packing-dimension-ignored"
    clauses = ("ENC-SIZE-TABLE",)

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.WhichOneof("kind") == "bit_packing" and st.bit_packing.dimension > 1:
                st.bit_packing.dimension = 1


def _external_truncated(original):
    def verify_struct_layout(value, path, extent, catalogue):
        try:
            return original(value, path, extent, catalogue)
        except ContractError as error:
            if error.code is not E.PAYLOAD_PARTIAL_RECORD or extent.location is None:
                raise
            size = catalogue.bit_size(value.struct_type, path) // 8
            whole = dataclasses.replace(extent, length=extent.length - extent.length % size)
            return original(value, path, whole, catalogue)
    return verify_struct_layout


ExternalPartialRecordIgnored = fault("ENC-RECORD-COUNT.external-partial-record-ignored", ("ENC-RECORD-COUNT",),
    """Checks that an inline payload holds whole records but counts the records of an external payload with a floor
    division: a trailing partial record of the declared external length is ignored.""",
    patches=lambda: [wrap(verifier, "_verify_struct_layout", _external_truncated)])


def _empty_refused(original):
    def verify_struct_layout(value, path, extent, catalogue):
        info = original(value, path, extent, catalogue)
        if extent.length == 0:
            raise violation(E.PAYLOAD_PARTIAL_RECORD, path, "payload holds no record")
        return info
    return verify_struct_layout


EmptyStructPayloadRefused = fault("ENC-RECORD-COUNT.empty-payload-refused", ("ENC-RECORD-COUNT",),
    """Refuses an empty struct payload (it requires at least one record) instead of reading it as zero records.""",
    boundary=True, patches=lambda: [wrap(verifier, "_verify_struct_layout", _empty_refused)])


def _unsigned_sub_byte_sign_extended(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type in (dtypes.UINT4, dtypes.UINT2):
            return bits.sign_extend(values, leaf.width).astype(values.dtype)
        return values
    return read_leaf


UnsignedSubByteSignExtended = fault("ENC-LEAVES.unsigned-sub-byte-sign-extended", ("ENC-LEAVES", "ENC-BIT-ORDER"),
    """Unpacks every 4- and 2-bit field with one helper that sign-extends: a UINT4 field holding 0xF reads as -1 (255 in
    its unsigned storage) instead of 15.""",
    patches=lambda: [wrap(records, "read_leaf", _unsigned_sub_byte_sign_extended)])


def _wide_component_mask_zero(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type is None and leaf.width == 64:
            return np.zeros_like(values)  # mask (1 << 64) - 1 computed in 64 bits: 1 << 64 wraps to 1
        return values
    return read_leaf


Component64MaskOverflow = fault("ENC-LEAVES.component-64-mask-overflow", ("ENC-LEAVES", "ENC-BIT-ORDER"),
    """Masks a bit-packing component with ``(1 << width) - 1`` in 64-bit arithmetic, where a shift by 64 wraps to a
    shift by 0: a 64-bit component always reads 0.""", boundary=True,
    patches=lambda: [wrap(records, "read_leaf", _wide_component_mask_zero)])


def _nibble_floor(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.elem_type in _SUB_BYTE and leaf.offset % 8 and records._is_dense_run(leaf):
            leaf = leaf._replace(offset=leaf.offset - leaf.offset % 8)
        return original(payload, record_bits, leaf)
    return read_leaf


PackedCodesFromByteStart = fault("ENC-TIGHT.packed-codes-from-byte-start", ("ENC-TIGHT", "ENC-BIT-ORDER"),
    """Unpacks a run of 4- or 2-bit codes from the byte holding its first code, as if every packed run started on a byte
    boundary: an INT4 field at bit 12 reads the low nibble of byte 1 (bits 8-11).""",
    patches=lambda: [wrap(records, "read_leaf", _nibble_floor)])


def _sub_byte_elements_stride(original_size, original_body):
    def widened(st) -> bool:
        element = st.array.element_type
        return structs.struct_kind(st) == "array" and element.WhichOneof("value") == "tensor_type" and \
            dtypes.BIT_WIDTH.get(element.tensor_type.elem_type, 8) < 8 and \
            len(element.tensor_type.shape.dim) == 0

    def bit_size(catalogue, st, path, depth=0):
        size = original_size(catalogue, st, path, depth)
        if not widened(st) or isinstance(size, structs.NotFixedSize):
            return size
        return structs.checked_mul(st.array.dimension, 8, path)

    def compile_body(st, catalogue, prefix, offset, dims, layout, path, expanded):
        if widened(st):
            element = st.array.element_type
            records._add_leaf(layout, records.Leaf(prefix, element.tensor_type.elem_type,
                                                   dtypes.BIT_WIDTH[element.tensor_type.elem_type], offset,
                                                   dims + ((st.array.dimension, 8),)), path)
            return None
        return original_body(st, catalogue, prefix, offset, dims, layout, path, expanded)
    return bit_size, compile_body


class SubByteArrayElementsTakeAByte(Fault):
    """Gives each element of an Array of a 4- or 2-bit scalar its own byte (low bits), instead of
    packing the elements tightly at ``n * size(T)`` bits."""

    fault_id = "ENC-SIZE-TABLE.sub-byte-array-elements-unpacked"
    clauses = ("ENC-SIZE-TABLE", "ENC-TIGHT")
    boundary = True

    def patches(self):
        bit_size, compile_body = _sub_byte_elements_stride(structs.Catalogue.bit_size, records._compile_body)
        return [Patch(structs.Catalogue, "bit_size", bit_size), Patch(records, "_compile_body", compile_body)]


def _first_placement_reused(original):
    def compile_struct(st, catalogue, prefix, offset, dims, layout, path, expanded):
        if structs.struct_kind(st) == "type_ref":
            placed = expanded.setdefault(("first offset", st.type_ref), offset)
            offset = placed
        return original(st, catalogue, prefix, offset, dims, layout, path, expanded)
    return compile_struct


ReferencedTypePlacedOnce = fault("ENC-TIGHT.referenced-type-offset-cached", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Caches a referenced declaration's compiled fields with the bit offset of its first use: a second field of the
    same type_ref in one record reads the first field's bits.""",
    patches=lambda: [wrap(records, "_compile_struct", _first_placement_reused)])


def _naturally_aligned(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.elem_type is not None and leaf.width in (16, 32) and leaf.offset % leaf.width:
            leaf = leaf._replace(offset=leaf.offset - leaf.offset % leaf.width)
        return original(payload, record_bits, leaf)
    return read_leaf


NaturallyAlignedNarrowLoads = fault("ENC-UNALIGNED.narrow-aligned-loads", ("ENC-UNALIGNED", "ENC-TIGHT"),
    """Reads 16- and 32-bit fields with naturally aligned loads: the offset is rounded down to a multiple of the field's
    width, so a FLOAT at byte 5 is read from byte 4.""",
    patches=lambda: [wrap(records, "read_leaf", _naturally_aligned)])


def _unsigned_char(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type == dtypes.INT8:
            return values.view(np.uint8).astype(np.int16)
        return values
    return read_leaf


Int8ReadAsUnsignedChar = fault("ENC-LEAVES.int8-unsigned-char", ("ENC-LEAVES",),
    """Reads INT8 fields through a plain ``char``, unsigned on its platform: -1 reads as 255.""",
    patches=lambda: [wrap(records, "read_leaf", _unsigned_char)])


def _packed_run_assumed(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.elem_type in _SUB_BYTE and leaf.offset % 8 == 0 and leaf.dims and not records._is_dense_run(leaf):
            # the nibble/crumb unpacker is used for every byte-aligned sub-byte leaf: its elements are
            # taken as consecutive codes, whatever the stride between them
            expected, dense = leaf.width, []
            for count, _ in reversed(leaf.dims):
                dense.append((count, expected))
                expected *= count
            leaf = leaf._replace(dims=tuple(reversed(dense)))
        return original(payload, record_bits, leaf)
    return read_leaf


StridedCodesReadAsPackedRun = fault("ENC-TIGHT.strided-codes-read-packed", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Unpacks every byte-aligned run of 4- or 2-bit leaves as consecutive codes: the INT4 field ``a`` of an array of
    {a: INT4, b: INT4} structs reads a0, b0 instead of a0, a1.""",
    patches=lambda: [wrap(records, "read_leaf", _packed_run_assumed)])


def _packing_dims_dropped(original):
    def compile_body(st, catalogue, prefix, offset, dims, layout, path, expanded):
        if structs.struct_kind(st) == "bit_packing":
            return original(st, catalogue, prefix, offset, (), layout, path, expanded)
        return original(st, catalogue, prefix, offset, dims, layout, path, expanded)
    return compile_body


BitPackingOuterArraysDropped = fault("ENC-SIZE-TABLE.bit-packing-outer-dims-dropped", ("ENC-SIZE-TABLE", "ENC-TIGHT"),
    """Gives bit-packing components only their own dimension: inside an array (of structs holding a bit packing, or of
    bit packings), every element reads the first element's components.""",
    patches=lambda: [wrap(records, "_compile_body", _packing_dims_dropped)])


def _count_cached_per_type(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value", out=None):
        if value.WhichOneof("layout") != "struct_type" or value.struct_type.WhichOneof("kind") != "type_ref" \
                or value.HasField("data_location") and value.data_location == schema.TensorProto.EXTERNAL:
            return original(value, catalogue, base_dir, registry, path, out)
        record_bits = catalogue.bit_size(value.struct_type, path)
        if isinstance(record_bits, structs.NotFixedSize) or record_bits < 8:
            return original(value, catalogue, base_dir, registry, path, out)
        record_bytes = record_bits // 8
        counts = catalogue.memo("typed view record counts")
        count = counts.setdefault(value.struct_type.type_ref, len(value.raw_data) // record_bytes)
        if len(value.raw_data) < count * record_bytes:
            raise violation(E.PAYLOAD_PARTIAL_RECORD, path, f"the view holds {count} records")
        if len(value.raw_data) > count * record_bytes:
            viewed = type(value)()
            viewed.CopyFrom(value)
            viewed.raw_data = value.raw_data[: count * record_bytes]
            value = viewed
        return original(value, catalogue, base_dir, registry, path, out)
    return decode_value


RecordCountCachedPerType = fault("ENC-NO-COUNT-IN-TYPE.count-cached-per-type",
    ("ENC-NO-COUNT-IN-TYPE", "ENC-RECORD-COUNT"), """Builds one typed view per type_id in a session and keeps the record
    count of the first value it viewed: a second value of the same type with another payload length is read with the
    first count.""", patches=lambda: [wrap(decode, "decode_value", _count_cached_per_type)])


def _lenient_fixed_size(optional_as_element=False, shapeless_as_scalar=False, symbolic_as_one=False):
    def make(original):
        def type_bit_size(tp, path, catalogue, depth=0):
            which = tp.WhichOneof("value")
            if optional_as_element and which == "optional_type":
                return type_bit_size(tp.optional_type.elem_type, path, catalogue, depth + 1)
            if which == "tensor_type" and (shapeless_as_scalar or symbolic_as_one):
                tensor = tp.tensor_type
                width = dtypes.BIT_WIDTH.get(tensor.elem_type)
                if width is not None and shapeless_as_scalar and not tensor.HasField("shape"):
                    return width
                if width is not None and symbolic_as_one and tensor.HasField("shape") and \
                        any(dim.WhichOneof("value") != "dim_value" for dim in tensor.shape.dim):
                    size = width
                    for dim in tensor.shape.dim:
                        size *= dim.dim_value if dim.WhichOneof("value") == "dim_value" else 1
                    return size
            return original(tp, path, catalogue, depth)
        return type_bit_size
    return make


OptionalFieldsSizedAsPresent = fault("ENC-FIXED-SIZE.optional-sized-as-element", ("ENC-FIXED-SIZE",),
    """Sizes an ``optional<T>`` field as an always-present T instead of refusing it as a field without a fixed inline
    size.""", patches=lambda: [wrap(structs, "type_bit_size", _lenient_fixed_size(optional_as_element=True))])

ShapelessTensorsSizedAsScalars = fault("ENC-FIXED-SIZE.shapeless-tensor-as-scalar", ("ENC-FIXED-SIZE",),
    """Sizes a tensor field whose type has no shape (unknown rank) as a scalar, instead of refusing it as a field
    without a fixed inline size.""",
    patches=lambda: [wrap(structs, "type_bit_size", _lenient_fixed_size(shapeless_as_scalar=True))])

SymbolicDimsSizedAsOne = fault("ENC-FIXED-SIZE.symbolic-dims-as-one", ("ENC-FIXED-SIZE", "DECL-COUNTS-CONCRETE"),
    """Sizes a symbolic (dim_param) or unset dimension of a tensor field as 1 instead of refusing the field as not
    fixed-size.""", patches=lambda: [wrap(structs, "type_bit_size", _lenient_fixed_size(symbolic_as_one=True))])


def _checked_as_bytes(result: int, path: str) -> int:
    """A size in bits checked against the range of a byte count (8 * UINT64_MAX + 7), not of a bit count."""
    if result > structs.UINT64_MAX * 8 + 7:
        raise violation(E.SIZE_OVERFLOW, path, f"size {result} overflows")
    return result


SizesCheckedInBytes = fault("ENC-OVERFLOW.checked-in-bytes", ("ENC-OVERFLOW", "ENC-SIZE-TABLE"),
    """Checks size arithmetic against the uint64 range of a byte count instead of a bit count: an element of 2**61 bytes
    (2**64 bits) passes instead of overflowing.""", boundary=True,
    patches=lambda: [Patch(structs, "checked_mul", lambda a, b, path: _checked_as_bytes(a * b, path)),
                     Patch(structs, "checked_add", lambda a, b, path: _checked_as_bytes(a + b, path))])


_FNUZ_AS_FN = {dtypes.FLOAT8E4M3FNUZ: dtypes.FLOAT8E4M3FN, dtypes.FLOAT8E5M2FNUZ: dtypes.FLOAT8E5M2}


def _fnuz_as_fn(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type in _FNUZ_AS_FN:
            wrong = dtypes.NUMPY_DTYPE[_FNUZ_AS_FN[leaf.elem_type]]
            return values.view(np.uint8).view(wrong).astype(np.float32).astype(values.dtype)
        return values
    return read_leaf


Float8FnuzReadAsFn = fault("ENC-LEAVES.float8-fnuz-bias", ("ENC-LEAVES",),
    """Decodes the FNUZ float8 leaves (FLOAT8E4M3FNUZ, FLOAT8E5M2FNUZ) with the exponent bias of their FN/IEEE
    namesakes, so every value reads twice as large.""", patches=lambda: [wrap(records, "read_leaf", _fnuz_as_fn)])


_NEWEST_LEAVES = (dtypes.FLOAT4E2M1, dtypes.FLOAT8E8M0)


def _newest_unsupported(original):
    def type_bit_size(tp, path, catalogue, depth=0):
        if tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type in _NEWEST_LEAVES:
            raise violation(E.UNSUPPORTED_LEAF, f"{path}.tensor_type.elem_type",
                            f"{dtypes.type_name(tp.tensor_type.elem_type)} is not a known scalar type")
        return original(tp, path, catalogue, depth)
    return type_bit_size


NewestLeavesUnsupported = fault("ENC-LEAVES.newest-types-refused", ("ENC-LEAVES",),
    """Has a scalar-type table from before FLOAT4E2M1 and FLOAT8E8M0: fields of those fixed-width ONNX types are refused
    as unsupported leaves.""", patches=lambda: [wrap(structs, "type_bit_size", _newest_unsupported)])


def _float4_as_int4(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type == dtypes.FLOAT4E2M1:
            codes = bits.sign_extend(values.view(np.uint8) & 0x0F, 4)
            return codes.astype(np.float32).astype(values.dtype)
        return values
    return read_leaf


Float4ReadAsInt4 = fault("ENC-LEAVES.float4-as-int4", ("ENC-LEAVES",),
    """Unpacks FLOAT4E2M1 fields with its INT4 path: each code becomes its two's complement integer (0x2 reads 2.0, not
    1.0).""", patches=lambda: [wrap(records, "read_leaf", _float4_as_int4)])


def _inline_roots_unchecked(original):
    def verify_struct_layout(value, path, extent, catalogue):
        try:
            return original(value, path, extent, catalogue)
        except ContractError as error:
            inline = value.struct_type.WhichOneof("kind") != "type_ref"
            if not inline or error.code not in (E.ROOT_SIZE_ZERO, E.ROOT_SIZE_NOT_BYTES):
                raise
            bits = catalogue.bit_size(value.struct_type, path)
            record_bytes = -(-bits // 8)
            count = extent.length // record_bytes if record_bytes else 0
            return verifier.EncodedInfo(path, extent, element_bytes=record_bytes, record_count=count)
    return verify_struct_layout


InlineRootSizeUnchecked = fault("ENC-ROOT-SIZE.inline-roots-unchecked", ("ENC-ROOT-SIZE", "ENC-CONSTANT-ONLY"),
    """Checks the root-size rules (positive, whole bytes) when a value's layout is a type_ref, but not for an inline
    layout: an inline constant-only or 12-bit root is read (zero records, or records rounded up to whole bytes) instead
    of refused.""", patches=lambda: [wrap(verifier, "_verify_struct_layout", _inline_roots_unchecked)])


_UINT64 = 1 << 64


class RootRulesCheckedPerRecord(Fault):
    """Checks the encoding root's size (positive, whole bytes) only while counting records: an empty
    payload, zero records, never reaches the check, so a constant-only or 12-bit root passes."""

    fault_id = "ENC-ROOT-SIZE.checked-only-with-records"
    clauses = ("ENC-ROOT-SIZE", "ENC-CONSTANT-ONLY")

    def patches(self):
        def make(original):
            def verify(value, path, extent, catalogue):
                if extent.length:
                    return original(value, path, extent, catalogue)
                layout_path = f"{path}.struct_type"
                st = value.struct_type
                if struct_kind(st) is None:
                    raise violation(E.KINDLESS_MISPLACED, layout_path, "a kind-less struct is never a layout")
                check_struct(st, layout_path, catalogue, role="layout")
                bits = catalogue.bit_size(st, layout_path)
                if isinstance(bits, NotFixedSize):
                    raise violation(E.NOT_FIXED_SIZE, bits.path, f"not byte-encodable: {bits.reason}")
                if value.HasField("logical_type"):
                    structs.check_type(value.logical_type, f"{path}.logical_type", catalogue)
                return verifier.EncodedInfo(path, extent, element_bytes=max(bits // 8, 1), record_count=0)
            return verify
        return [wrap(verifier, "_verify_struct_layout", make)]


FieldSizeSumWraps = fault("ENC-OVERFLOW.field-sum-wraps", ("ENC-OVERFLOW",),
    """Multiplies sizes with overflow checks but adds field and component sizes with plain uint64 arithmetic: a
    structure whose field sizes sum past 2**64 bits wraps to a small size.""", boundary=True,
    patches=lambda: [Patch(structs, "checked_add", lambda a, b, path: (a + b) % _UINT64)])


class RootPackingElementWholeBytes(Fault):
    """Applies the whole-bytes root rule to one bit-packing element (the sum of its component widths)
    instead of to the packing's total size: a root of two 4-bit elements is refused."""

    fault_id = "ENC-ROOT-SIZE.packing-element-whole-bytes"
    clauses = ("ENC-ROOT-SIZE",)

    def patches(self):
        def make(original):
            def verify(value, path, extent, catalogue):
                st, _ = catalogue.resolve(value.struct_type, f"{path}.struct_type")
                if struct_kind(st) == "bit_packing" and sum(c.bit_width for c in st.bit_packing.component) % 8:
                    raise violation(E.ROOT_SIZE_NOT_BYTES, f"{path}.struct_type",
                                    "a bit-packing element is not a whole byte count")
                return original(value, path, extent, catalogue)
            return verify
        return [wrap(verifier, "_verify_struct_layout", make)]


class KindlessSizedZero(Fault):
    """Sizes a kind-less struct nested in a byte layout as an empty structure, zero bits, instead of
    finding it has no fixed size."""

    fault_id = "ENC-FIXED-SIZE.kindless-sized-zero"
    clauses = ("ENC-FIXED-SIZE", "CAT-KINDLESS")

    def patches(self):
        def make(original):
            def bit_size(catalogue, st, path, depth=0):
                if struct_kind(st) is None:
                    return 0
                return original(catalogue, st, path, depth)
            return bit_size
        return [wrap(structs.Catalogue, "bit_size", make)]


class DecodedValuesLeftFlat(Fault):
    """Checks a decoded value's dtype and element count against its logical type but returns the
    decoder's flat run without giving it the logical shape."""

    fault_id = "ENC-LOGICAL-EXACT.logical-shape-not-applied"
    clauses = ("ENC-LOGICAL-EXACT",)

    def patches(self):
        def make(original):
            def check(value, result, path):
                return original(value, result, path).reshape(-1)
            return check
        return [wrap(decode_module, "_check_logical", make)]


def _layoutless_skipped(original):
    def verify_encoded_value(value, path, catalogue, base_dir=None):
        if value.WhichOneof("layout") is None:  # no layout: kept as opaque bytes, never validated
            return verifier.EncodedInfo(path, payload.payload_extent(value, path), element_bytes=1,
                                        record_count=len(value.raw_data))
        return original(value, path, catalogue, base_dir)
    return verify_encoded_value


LayoutlessSkippedAtLoad = fault("ENC-LAYOUT.layoutless-accepted-at-load", ("ENC-LAYOUT",),
    """The loader keeps an encoded value that selects no layout as opaque bytes and validates it no further; only
    decoding it fails. The model itself is accepted.""",
    patches=lambda: [wrap(verifier, "verify_encoded_value", _layoutless_skipped, aliases=False)])


class InlineLayoutRefsRefused(Fault):
    """Resolves type_ref only at a layout's root: a concrete inline layout whose fields refer to a
    catalogue type by ID is refused as unresolved."""

    fault_id = "ENC-STRUCT-LAYOUT.nested-ref-in-inline-refused"
    clauses = ("ENC-STRUCT-LAYOUT",)

    def precheck(self, model, base_dir):
        for value in encoded_values(model):
            st = value.struct_type
            if value.WhichOneof("layout") == "struct_type" and st.WhichOneof("kind") not in (None, "type_ref") \
                    and type_refs(st):
                raise violation(E.TYPE_REF_UNRESOLVED, f"{_name(value)}.struct_type",
                                "type references are resolved only at a layout's root")


class LogicalTypeNeededToDecode(Fault):
    """Loads an encoded value without logical_type but cannot decode it: the decoding path sizes its
    output from logical_type and refuses a value that omits it."""

    fault_id = "ENC-LOGICAL-OPTIONAL.decode-needs-logical-type"
    clauses = ("ENC-LOGICAL-OPTIONAL",)

    def patches(self):
        def make(original):
            def decode_value(value, catalogue, base_dir=None, registry=None, path="value", **kw):
                if not value.HasField("logical_type"):
                    raise violation(E.LOGICAL_TYPE_INVALID, f"{path}.logical_type", "decoding needs a logical_type")
                return original(value, catalogue, base_dir, registry, path, **kw)
            return decode_value
        return [wrap(decode, "decode_value", make)]


def _bytes_as_logical(original):
    def tensor_operand(value, op_type, path):
        if isinstance(value, EncodedValue) and value.header.logical_type.WhichOneof("value") == "tensor_type":
            tensor = value.header.logical_type.tensor_type
            dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in tensor.shape.dim]
            dtype = dtypes.NUMPY_DTYPE.get(tensor.elem_type)
            if tensor.HasField("shape") and None not in dims and dtype is not None \
                    and value.payload.nbytes == int(np.prod(dims)) * dtype.itemsize:
                return np.frombuffer(value.payload.tobytes(), dtype).reshape(dims)  # "already dense"
        return original(value, op_type, path)
    return tensor_operand


DenseSizedPayloadAsTensor = fault("ENC-NO-IMPLICIT-TENSOR.dense-sized-payload-reinterpreted",
    ("ENC-NO-IMPLICIT-TENSOR", "GRAPH-TENSOR-OPS"), """Treats an encoded value whose payload is exactly as long as its
    dense logical tensor as that tensor (the bytes reinterpreted) when a tensor-only operator reads it, instead of
    refusing it.""", patches=lambda: [wrap(program, "_tensor_operand", _bytes_as_logical)])


def _first_record(values: np.ndarray) -> np.ndarray:
    return np.broadcast_to(values.reshape(len(values), -1)[:1], values.reshape(len(values), -1).shape).reshape(-1)


def _int4_block_first_scale(layout, data):
    codes = layout.read(data, "codes").astype(np.float32)
    scale = _first_record(layout.read(data, "scale").astype(np.float32))
    return (codes * scale[:, None]).reshape(-1)


def _linear_first_parameters(layout, data):
    codes = layout.read(data, "values").astype(np.float32)
    scale = decoders._field_or_constant(layout, data, "scale").astype(np.float32)
    zero = decoders._field_or_constant(layout, data, "zero_point").astype(np.float32)
    scale = np.full(len(codes), scale[0], np.float32)
    zero = np.full(len(codes), zero[0], np.float32)
    return ((codes - zero[:, None]) * scale[:, None]).reshape(-1)


def _codebook_first_scale(layout, data):
    table = layout.constant("quantized.codebook").astype(np.float32).reshape(-1)
    index = layout.read(data, "quantized.codes.index").astype(np.intp)
    scale = _first_record(layout.read(data, "scale").astype(np.float32))
    return (scale[:, None] * table[index]).reshape(-1)


FirstRecordParameters = fault("ENC-PER-VALUE-PARAMS.first-record-parameters", ("ENC-PER-VALUE-PARAMS",),
    """Reads a value's parameters once, from its first record, and applies them to every record of the value: per-value
    parameters work, per-block scales and zero points of later records are ignored.""",
    patches=lambda: [_registry_patch((2001, _int4_block_first_scale), (1002, _linear_first_parameters),
                                     (1102, _codebook_first_scale))])


_PARAMETER_LEAVES = ("scale", "zero_point")


class ParametersPreparedPerTypeId(Fault):
    """Prepares one consumer per type_id in a session and keeps the per-value parameters (scale, zero
    point) of the first value it decoded with it: later values of the same type, in the same call or the
    next, decode with their own codes but the first value's parameters."""

    fault_id = "ENC-PER-VALUE-PARAMS.parameters-prepared-per-type-id"
    clauses = ("ENC-PER-VALUE-PARAMS",)

    def __init__(self) -> None:
        super().__init__()
        #: session catalogue -> {type_id: the first value's parameter bytes}
        self._prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def patches(self):
        def make(original):
            def decode_value(value, catalogue, base_dir=None, registry=None, path="value", **kw):
                type_ref = value.struct_type.type_ref if value.WhichOneof("layout") == "struct_type" else 0
                if type_ref and value.raw_data:
                    value = self._with_prepared(value, catalogue, type_ref)
                return original(value, catalogue, base_dir, registry, path, **kw)
            return decode_value
        return [wrap(kernels, "decode_value", make, aliases=False)]

    def _with_prepared(self, value, catalogue, type_ref):
        try:
            layout = records.compile_layout(value.struct_type, catalogue)
        except Exception:  # noqa: BLE001 - an invalid layout goes to the oracle, which refuses it
            return value
        size = layout.record_bytes
        spans = {name: (leaf.offset // 8, leaf.width // 8) for name, leaf in layout.leaves.items()
                 if name in _PARAMETER_LEAVES and leaf.offset % 8 == 0 and leaf.width % 8 == 0 and not leaf.dims}
        if not spans or not size or len(value.raw_data) % size:
            return value
        data = bytearray(value.raw_data)
        first = self._prepared.setdefault(catalogue, {}).setdefault(type_ref, {name: bytes(data[start:start + width])
                                                for name, (start, width) in spans.items()})
        for base in range(0, len(data), size):
            for name, (start, width) in spans.items():
                data[base + start:base + start + width] = first[name]
        prepared = type(value)()
        prepared.CopyFrom(value)
        prepared.raw_data = bytes(data)
        return prepared


def _straddling_first_byte_only(original):
    def read_bits(buffer, bit_positions, width):
        if width > 8:
            return original(buffer, bit_positions, width)
        positions = np.asarray(bit_positions, dtype=np.uint64)
        padded = np.concatenate([np.asarray(buffer, np.uint8), np.zeros(1, np.uint8)])
        first = (positions >> np.uint64(3)).astype(np.intp)
        shift = positions & np.uint64(7)
        return (padded[first].astype(np.uint64) >> shift) & np.uint64((1 << width) - 1)
    return read_bits


StraddlingFieldFirstByteOnly = fault("ENC-BIT-ORDER.straddling-field-first-byte-only", ("ENC-BIT-ORDER", "ENC-TIGHT"),
    """Reads a bit field of at most eight bits from the one byte it starts in (``(b[p >> 3] >> (p & 7)) & mask``): right
    while it fits that byte, its high bits lost when it straddles a byte boundary.""", boundary=True,
    patches=lambda: [wrap(bits, "read_bits", _straddling_first_byte_only)])


def _single_record_squeezed(original):
    def read_leaf(payload_array, record_bits, leaf):
        result = original(payload_array, record_bits, leaf)
        return result[0] if result.ndim and result.shape[0] == 1 else result
    return read_leaf


SingleRecordSqueezed = fault("ENC-RECORD-COUNT.single-record-squeezed", ("ENC-RECORD-COUNT",),
    """Drops the record axis of a field read when the payload holds exactly one record (a NumPy-style squeeze): a
    one-record payload's fields lose their leading dimension.""", boundary=True,
    patches=lambda: [wrap(records, "read_leaf", _single_record_squeezed)])


def _own_width_window(original):
    def read_bits(buffer, bit_positions, width):
        if not 8 < width < 64:
            return original(buffer, bit_positions, width)
        # the window is the field's own byte width (2 bytes for 9..16 bits, ...), loaded from its first
        # byte: right at a byte boundary, the top bits lost when the field starts inside a byte
        window_bits = 8 * -(-width // 8)
        positions = np.asarray(bit_positions, dtype=np.uint64)
        start = positions - (positions & np.uint64(7))
        shift = positions & np.uint64(7)
        raw = original(buffer, start, window_bits)
        return (raw >> shift) & np.uint64((1 << width) - 1)
    return read_bits


UnalignedWindowOfOwnWidth = fault("ENC-UNALIGNED.window-of-own-width", ("ENC-UNALIGNED", "ENC-BIT-ORDER"),
    """Loads an unaligned field wider than a byte through a window of its own byte width (two bytes for an INT16, four
    for a FLOAT), starting at the byte it begins in: a field starting inside a byte loses the top bits that spill into
    one more byte. Byte-aligned fields and 64-bit ones are read right.""", boundary=True,
    patches=lambda: [wrap(bits, "read_bits", _own_width_window)])


def _end_bit_exclusive(original):
    def read_leaf(payload_array, record_bits, leaf):
        record_bytes = record_bits // 8
        count = len(payload_array) // record_bytes if record_bytes else 0
        gathered = leaf.offset % 8 or leaf.width % 8
        if count and gathered:
            last = (count - 1) * record_bits + leaf.offset + sum((c - 1) * s for c, s in leaf.dims) + leaf.width
            if all(c > 0 for c, _ in leaf.dims) and last >= len(payload_array) * 8:  # '>=' for '>'
                raise violation(E.PAYLOAD_PARTIAL_RECORD, leaf.path, "field extends beyond the payload")
        return original(payload_array, record_bits, leaf)
    return read_leaf


BitFieldEndingAtPayloadEndRejected = fault("ENC-RECORD-COUNT.bit-field-at-payload-end-rejected",
    ("ENC-RECORD-COUNT", "ENC-TIGHT"), """The bounds check of the bit-field path (fields not starting on a byte or not
    whole bytes) tests ``end_bit >= 8 * payload_bytes``: a bit field ending exactly at the end of the payload (the last
    field of the last record) is refused as beyond it.""", boundary=True,
    patches=lambda: [wrap(records, "read_leaf", _end_bit_exclusive)])


name_faults(globals())
