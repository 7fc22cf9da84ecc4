"""More faults in byte-encoded struct records: how sizes and offsets are computed for nested groups,
arrays and bit packings, how sub-byte, unaligned, signed and half-precision leaves are read, and how
catalogue identities and record counts are derived. Each is one bug a runtime written from the size
table and the bit-order sentence could plausibly have."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from conformance.audit.fault import Fault, Patch, struct_types, wrap
from conformance.audit.fault import decode_module as decode
from conformance.audit.wire_edit import renumber
from reference_impl import bits, decoders, dtypes, records, schema, structs, verifier
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E

_SUB_BYTE = (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)


def _round_up(size: int) -> int:
    return -(-size // 8) * 8


# ------------------------------------------------------------------------------ leaf reading
def _zero_extending(values: np.ndarray, elem_type: int) -> np.ndarray:
    if elem_type in dtypes.SIGNED_INTEGERS:
        return values.astype(dtypes.NUMPY_DTYPE[elem_type])
    return bits.unsigned_to_leaf(values, elem_type)


class UnalignedSignedZeroExtended(Fault):
    """Reads signed integer fields that are not on a byte boundary (or not a whole number of bytes)
    with its generic bit-field reader, which returns the raw bits without sign extension: an INT4 at
    bit 4 holding 0xF reads 15, not -1."""

    fault_id = "ENC-BIT-ORDER.bit-fields-not-sign-extended"
    clauses = ("ENC-BIT-ORDER", "ENC-UNALIGNED")

    def patches(self):
        return [Patch(records, "unsigned_to_leaf", _zero_extending, aliases=False)]


def _first_byte_only(buffer, bit_positions, width):
    values = bits.read_bits(buffer, bit_positions, width)
    if width >= 8:
        return values
    shift = np.asarray(bit_positions, dtype=np.uint64) & np.uint64(7)
    within = np.minimum(np.uint64(width), np.uint64(8) - shift)
    return values & ((np.uint64(1) << within) - np.uint64(1))


class SubByteFieldsReadFromOneByte(Fault):
    """Reads a field narrower than a byte from the byte holding its first bit only: the high bits of a
    field that crosses into the next byte (a 3-bit component at bit 6) read as zero."""

    fault_id = "ENC-TIGHT.sub-byte-field-one-byte"
    clauses = ("ENC-TIGHT", "ENC-BIT-ORDER")
    boundary = True

    def patches(self):
        return [Patch(records, "read_bits", _first_byte_only, aliases=False)]


def _eight_byte_window(buffer, bit_positions, width):
    values = bits.read_bits(buffer, bit_positions, width)
    if width + 7 <= 64:
        return values
    shift = np.asarray(bit_positions, dtype=np.uint64) & np.uint64(7)
    kept = np.uint64(64) - shift  # bits available in the 8-byte window starting at the first byte
    mask = np.where(kept >= 64, np.uint64(2**64 - 1), (np.uint64(1) << (kept & np.uint64(63))) - np.uint64(1))
    return values & mask


class WideFieldNinthByteDropped(Fault):
    """Reads every bit field through one 64-bit little-endian load at its first byte: a field of 58 to 64
    bits that starts inside a byte loses the bits spilling into the ninth byte."""

    fault_id = "ENC-LEAVES.wide-field-ninth-byte-dropped"
    clauses = ("ENC-LEAVES", "ENC-BIT-ORDER")
    boundary = True

    def patches(self):
        return [Patch(records, "read_bits", _eight_byte_window, aliases=False)]


def _byte_floored(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.elem_type is not None and leaf.width % 8 == 0 and leaf.offset % 8:
            leaf = leaf._replace(offset=leaf.offset - leaf.offset % 8)
        return original(payload, record_bits, leaf)
    return read_leaf


class WholeByteFieldsAtByteOffset(Fault):
    """Converts a whole-byte field's bit offset to a byte offset by floor division and reads from
    there: a UINT16 after a 4-bit component is read from byte 0 instead of bit 4."""

    fault_id = "ENC-UNALIGNED.bit-offset-floored"
    clauses = ("ENC-UNALIGNED", "ENC-TIGHT")

    def patches(self):
        return [wrap(records, "read_leaf", _byte_floored)]


def _half_big_endian(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type in (dtypes.FLOAT16, dtypes.BFLOAT16):
            return values.byteswap()
        return values
    return read_leaf


class HalfFloatsBigEndian(Fault):
    """Converts FLOAT16 and BFLOAT16 fields with a half-precision helper that takes its two bytes
    high byte first; every other multi-byte field is read little-endian."""

    fault_id = "ENC-BIT-ORDER.half-floats-big-endian"
    clauses = ("ENC-BIT-ORDER",)

    def patches(self):
        return [wrap(records, "read_leaf", _half_big_endian)]


def _bfloat16_as_half(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type == dtypes.BFLOAT16:
            return values.view(np.uint16).view(np.float16).astype(np.float32).astype(ml_dtypes.bfloat16)
        return values
    return read_leaf


class Bfloat16ReadAsFloat16(Fault):
    """Maps every 16-bit floating leaf to IEEE half: a BFLOAT16 field's bits are decoded as FLOAT16
    (5 exponent bits) instead of bfloat16 (8 exponent bits)."""

    fault_id = "ENC-LEAVES.bfloat16-as-float16"
    clauses = ("ENC-LEAVES",)

    def patches(self):
        return [wrap(records, "read_leaf", _bfloat16_as_half)]


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


class TensorFieldsColumnMajor(Fault):
    """Lays out a multi-dimensional tensor field column-major (first index fastest) instead of the
    row-major order of TensorProto.raw_data."""

    fault_id = "ENC-TIGHT.tensor-fields-column-major"
    clauses = ("ENC-TIGHT", "ENC-SIZE-TABLE")

    def patches(self):
        return [wrap(records, "_compile_type", _column_major)]


# ------------------------------------------------------------------------------ sizes, offsets
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


class SubByteArraysPadded(Fault):
    """Stores an array of 4- or 2-bit elements like a TensorProto's raw_data, padded to whole bytes, so
    a nested array of three INT4 takes 16 bits and the next field starts at the next byte, instead of
    packing tightly into ``n * size(T)`` bits."""

    fault_id = "ENC-TIGHT.sub-byte-arrays-padded"
    clauses = ("ENC-TIGHT", "ENC-SIZE-TABLE")
    boundary = True

    def patches(self):
        return [wrap(structs, "type_bit_size", _struct_fields_rounded(("array",), _sub_byte_array))]


class NestedGroupsByteRounded(Fault):
    """Gives a nested structure or bit packing its size rounded up to whole bytes (as a C compiler sizes
    a nested struct), so the field after a 12-bit group starts at bit 16 instead of bit 12."""

    fault_id = "ENC-TIGHT.nested-groups-byte-rounded"
    clauses = ("ENC-TIGHT", "ENC-SIZE-TABLE")
    boundary = True

    def patches(self):
        return [wrap(structs, "type_bit_size", _struct_fields_rounded(("structure", "bit_packing")))]


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


# ------------------------------------------------------------------------ identity and counts
class TypeIdsIn32Bits(Fault):
    """Stores type_ids and type_refs in 32-bit integers: IDs above 2**32 - 1 lose their high bits, so
    IDs differing by a multiple of 2**32 are one identity."""

    fault_id = "CAT-REF-RESOLVED.ids-truncated-to-32-bits"
    clauses = ("CAT-REF-RESOLVED", "CAT-ID-UNIQUE", "CAT-ID-NONZERO")
    boundary = True

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.HasField("type_id"):
                st.type_id &= 0xFFFFFFFF
            if st.WhichOneof("kind") == "type_ref":
                st.type_ref &= 0xFFFFFFFF


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


class ExternalPartialRecordIgnored(Fault):
    """Checks that an inline payload holds whole records but counts the records of an external payload
    with a floor division: a trailing partial record of the declared external length is ignored."""

    fault_id = "ENC-RECORD-COUNT.external-partial-record-ignored"
    clauses = ("ENC-RECORD-COUNT",)

    def patches(self):
        return [wrap(verifier, "_verify_struct_layout", _external_truncated)]


def _empty_refused(original):
    def verify_struct_layout(value, path, extent, catalogue):
        info = original(value, path, extent, catalogue)
        if extent.length == 0:
            raise violation(E.PAYLOAD_PARTIAL_RECORD, path, "payload holds no record")
        return info
    return verify_struct_layout


class EmptyStructPayloadRefused(Fault):
    """Refuses an empty struct payload (it requires at least one record) instead of reading it as zero
    records."""

    fault_id = "ENC-RECORD-COUNT.empty-payload-refused"
    clauses = ("ENC-RECORD-COUNT",)
    boundary = True

    def patches(self):
        return [wrap(verifier, "_verify_struct_layout", _empty_refused)]


# ------------------------------------------------------------------------------ more leaf reading
def _unsigned_sub_byte_sign_extended(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type in (dtypes.UINT4, dtypes.UINT2):
            return bits.sign_extend(values, leaf.width).astype(values.dtype)
        return values
    return read_leaf


class UnsignedSubByteSignExtended(Fault):
    """Unpacks every 4- and 2-bit field with one helper that sign-extends: a UINT4 field holding 0xF
    reads as -1 (255 in its unsigned storage) instead of 15."""

    fault_id = "ENC-LEAVES.unsigned-sub-byte-sign-extended"
    clauses = ("ENC-LEAVES", "ENC-BIT-ORDER")

    def patches(self):
        return [wrap(records, "read_leaf", _unsigned_sub_byte_sign_extended)]


def _wide_component_mask_zero(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type is None and leaf.width == 64:
            return np.zeros_like(values)  # mask (1 << 64) - 1 computed in 64 bits: 1 << 64 wraps to 1
        return values
    return read_leaf


class Component64MaskOverflow(Fault):
    """Masks a bit-packing component with ``(1 << width) - 1`` in 64-bit arithmetic, where a shift by
    64 wraps to a shift by 0: a 64-bit component always reads 0."""

    fault_id = "ENC-LEAVES.component-64-mask-overflow"
    clauses = ("ENC-LEAVES", "ENC-BIT-ORDER")
    boundary = True

    def patches(self):
        return [wrap(records, "read_leaf", _wide_component_mask_zero)]


def _nibble_floor(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.elem_type in _SUB_BYTE and leaf.offset % 8 and records._is_dense_run(leaf):
            leaf = leaf._replace(offset=leaf.offset - leaf.offset % 8)
        return original(payload, record_bits, leaf)
    return read_leaf


class PackedCodesFromByteStart(Fault):
    """Unpacks a run of 4- or 2-bit codes from the byte holding its first code, as if every packed run
    started on a byte boundary: an INT4 field at bit 12 reads the low nibble of byte 1 (bits 8-11)."""

    fault_id = "ENC-TIGHT.packed-codes-from-byte-start"
    clauses = ("ENC-TIGHT", "ENC-BIT-ORDER")

    def patches(self):
        return [wrap(records, "read_leaf", _nibble_floor)]


# ------------------------------------------------------------------------ more sizes, placements
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


class ReferencedTypePlacedOnce(Fault):
    """Caches a referenced declaration's compiled fields with the bit offset of its first use: a second
    field of the same type_ref in one record reads the first field's bits."""

    fault_id = "ENC-TIGHT.referenced-type-offset-cached"
    clauses = ("ENC-TIGHT", "ENC-SIZE-TABLE")

    def patches(self):
        return [wrap(records, "_compile_struct", _first_placement_reused)]



# ------------------------------------------------------------------------------------------ wire
_CATALOGUE_FIELDS = (1000, 2, 1)          # ModelProto.struct_types[].structure.field[]
_INLINE_LAYOUT_FIELDS = (7, 1000, 2, 2, 1)  # graph.encoded_initializer[].struct_type.structure.field[]


class FieldContentNumberedInOrder(Fault):
    """Numbers ``StructTypeProto.Structure.Field`` in declaration order (name 1, type 2, constant 3,
    doc_string 4) instead of the frozen ``constant = 4``, ``doc_string = 3``: a conforming constant
    reads as a doc string and the field is left without content."""

    fault_id = "WIRE-SCHEMA.field-constant-at-3"
    clauses = ("WIRE-SCHEMA", "DECL-FIELD-CONTENT")

    def prepare(self, model_bytes, base_dir):
        swapped = renumber(model_bytes, _CATALOGUE_FIELDS, {3: 4, 4: 3})
        return renumber(swapped, _INLINE_LAYOUT_FIELDS, {3: 4, 4: 3})


class MaximumTypeIdIsASentinel(Fault):
    """Uses UINT64_MAX as its "no type_id" sentinel: a declaration whose type_id is 2**64 - 1 counts as
    one without a type_id."""

    fault_id = "CAT-ID-NONZERO.max-id-sentinel"
    clauses = ("CAT-ID-NONZERO",)
    boundary = True

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.HasField("type_id") and st.type_id == 2**64 - 1:
                st.ClearField("type_id")


# ------------------------------------------------------------------------------------ decoders
def _names_and_types(signature: tuple) -> tuple:
    """A registration's signature reduced to what a name-and-type check sees: each leaf's path, type
    and shape, the constants, and the declared codecs (no bit positions, widths or record size)."""
    (record_bits, leaves, constants), identity = signature
    return tuple(sorted((path, elem_type, tuple(count for count, _ in dims))
                        for path, elem_type, _, _, dims in leaves)), constants, identity


class BindsOnNamesAndTypes(Fault):
    """Verifies a declaration against a registered decoder by its field names, types, shapes and
    constants only: a declaration of the same ID with the same fields in another order (other bit
    positions) is bound to the decoder instead of being refused as a different declaration."""

    fault_id = "DEC-KEYED.positions-not-compared"
    clauses = ("DEC-KEYED", "CAT-ID-CHANGE")

    def patches(self):
        def bind(registry, type_id, layout, path, declaration=None):
            found = registry._decoders.get(type_id)
            if found is None:
                raise violation(E.CONSUMER_MISSING, path, f"no decoder or registered consumer for type_id {type_id}")
            identity = decoders._codec_identity(declaration) if declaration is not None else found.signature[1]
            if _names_and_types(found.signature) != _names_and_types((layout.signature(), identity)):
                raise violation(E.DECODER_MISMATCH, path, f"decoder {found.name} was registered elsewhere")
            if type_id not in registered:
                return found
            # the typed view it creates reads the registered declaration's positions, not the model's
            own = registered[type_id]
            return dataclasses.replace(found, decode=lambda _layout, payload: found.decode(own, payload))

        registered = _registered_layouts()
        return [Patch(decoders.DecoderRegistry, "bind", bind)]


class CodecNamesNotCompared(Fault):
    """Verifies a declaration's layout and constants against the registered decoder but not the decoder
    and encoder functions it declares: a declaration naming another decoder is bound all the same."""

    fault_id = "DEC-KEYED.codecs-not-compared"
    clauses = ("DEC-KEYED", "CAT-ID-CHANGE")

    def patches(self):
        def make(original):
            def bind(registry, type_id, layout, path, declaration=None):
                return original(registry, type_id, layout, path, None)
            return bind
        return [wrap(decoders.DecoderRegistry, "bind", make)]


def _registered_layouts() -> dict[int, records.RecordLayout]:
    """The record layouts the built-in decoders were written for, by type_id."""
    catalogue = structs.Catalogue(decoders.spec_catalogue())
    return {decl.type_id: records.compile_layout(schema.StructTypeProto(type_ref=decl.type_id), catalogue)
            for decl in decoders.spec_catalogue()}


def _registered_names() -> dict[str, int]:
    return {decl.name: decl.type_id for decl in decoders.spec_catalogue()}


class DecodersKeyedByName(Fault):
    """Looks decoders up by the declaration's name instead of its type_id: a renamed declaration of a
    registered ID finds no decoder, and another ID declared under a registered name gets that decoder."""

    fault_id = "DEC-KEYED.keyed-by-name"
    clauses = ("DEC-KEYED", "DEC-MISSING")

    def patches(self):
        names = _registered_names()

        def make(original):
            def bind(registry, type_id, layout, path, declaration=None):
                if declaration is None:
                    return original(registry, type_id, layout, path, declaration)
                by_name = names.get(declaration.name)
                if by_name is None or by_name not in registry:
                    raise violation(E.CONSUMER_MISSING, path, f"no decoder for {declaration.name!r}")
                return original(registry, by_name, layout, path, declaration)
            return bind
        return [wrap(decoders.DecoderRegistry, "bind", make)]


# ------------------------------------------------------------------------ loads and field access
def _naturally_aligned(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.elem_type is not None and leaf.width in (16, 32) and leaf.offset % leaf.width:
            leaf = leaf._replace(offset=leaf.offset - leaf.offset % leaf.width)
        return original(payload, record_bits, leaf)
    return read_leaf


class NaturallyAlignedNarrowLoads(Fault):
    """Reads 16- and 32-bit fields with naturally aligned loads: the offset is rounded down to a
    multiple of the field's width, so a FLOAT at byte 5 is read from byte 4."""

    fault_id = "ENC-UNALIGNED.narrow-aligned-loads"
    clauses = ("ENC-UNALIGNED", "ENC-TIGHT")

    def patches(self):
        return [wrap(records, "read_leaf", _naturally_aligned)]


def _unsigned_char(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type == dtypes.INT8:
            return values.view(np.uint8).astype(np.int16)
        return values
    return read_leaf


class Int8ReadAsUnsignedChar(Fault):
    """Reads INT8 fields through a plain ``char``, unsigned on its platform: -1 reads as 255."""

    fault_id = "ENC-LEAVES.int8-unsigned-char"
    clauses = ("ENC-LEAVES",)

    def patches(self):
        return [wrap(records, "read_leaf", _unsigned_char)]


def _nested_constants_dropped(original):
    def read_fields(value, catalogue, base_dir=None, path="value"):
        fields = original(value, catalogue, base_dir, path)
        return {name: array for name, array in fields.items() if "." not in name or
                name in records.compile_layout(value.struct_type, catalogue, path).leaves}
    return read_fields


class NestedConstantsNotExposed(Fault):
    """Generic field access lists the root declaration's own constants but not those a nested group
    contributes (``quantized.codebook`` of the codebook parent is missing)."""

    fault_id = "DEC-INLINE-CODEC.nested-constants-missing"
    clauses = ("DEC-INLINE-CODEC", "DEC-ROOT-ONLY")

    def patches(self):
        return [wrap(decode, "read_fields", _nested_constants_dropped)]


# ------------------------------------------------------------------------------------ catalogue
_CONTAINERS = (".sequence_type", ".map_type", ".optional_type")


def _fixed_path_cycles_only(self) -> None:
    """``Catalogue.check_all`` whose cycle check follows only the references a record's layout expands
    (fields, arrays, nested structs), not those inside sequences, maps and optionals."""
    inline: dict[int, int] = {}
    refs: dict[int, list] = {}
    for type_id, (decl, decl_path) in self.declarations.items():
        refs[type_id] = []
        inline[type_id] = structs.check_struct(decl, decl_path, self, role="declaration", depth=0,
                                               refs=refs[type_id])
    edges = {tid: sorted({ref for ref, _, ref_path in found if not any(c in ref_path for c in _CONTAINERS)})
             for tid, found in refs.items()}
    order = self._check_acyclic(edges)
    depths: dict[int, int] = {}
    for type_id in order:
        deepest = inline[type_id]
        for ref, depth, ref_path in refs[type_id]:
            reached = depth + 1 + depths.get(ref, 0)
            if reached > structs.MAX_DEPTH:
                raise structs._too_deep(ref_path, reached)
            deepest = max(deepest, reached)
        depths[type_id] = deepest
    self.depths = depths


class CyclesThroughContainersMissed(Fault):
    """Detects reference cycles along the fields, arrays and nested structs a record expands, but not
    through sequences, maps or optionals: a type containing an optional or a map of itself is
    accepted as a recursive type instead of refused as a reference cycle."""

    fault_id = "CAT-REF-ACYCLIC.container-cycles-missed"
    clauses = ("CAT-REF-ACYCLIC",)

    def patches(self):
        return [Patch(structs.Catalogue, "check_all", _fixed_path_cycles_only)]


#: TypeProtos a model commonly holds: graph inputs, outputs and value_info, struct fields of the
#: catalogue, and encoded values' logical types
_TYPE_PROTOS = ((7, 11, 2), (7, 12, 2), (7, 13, 2), (1000, 2, 1, 2), (7, 1000, 3))


class TypeStructTypeMisnumbered(Fault):
    """Reads ``TypeProto.struct_type`` from field 1001 (an off-by-one in the local range): a conforming
    struct-typed input, output or field (field 1000) is an unknown field, leaving its type unset."""

    fault_id = "WIRE-FIELDS.type-struct-at-1001"
    clauses = ("WIRE-FIELDS", "WIRE-LOCAL-RANGE")

    def prepare(self, model_bytes, base_dir):
        for path in _TYPE_PROTOS:
            model_bytes = renumber(model_bytes, path, {1000: 1001})
        return model_bytes


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


class StridedCodesReadAsPackedRun(Fault):
    """Unpacks every byte-aligned run of 4- or 2-bit leaves as consecutive codes: the INT4 field ``a`` of
    an array of {a: INT4, b: INT4} structs reads a0, b0 instead of a0, a1."""

    fault_id = "ENC-TIGHT.strided-codes-read-packed"
    clauses = ("ENC-TIGHT", "ENC-SIZE-TABLE")

    def patches(self):
        return [wrap(records, "read_leaf", _packed_run_assumed)]


def _packing_dims_dropped(original):
    def compile_body(st, catalogue, prefix, offset, dims, layout, path, expanded):
        if structs.struct_kind(st) == "bit_packing":
            return original(st, catalogue, prefix, offset, (), layout, path, expanded)
        return original(st, catalogue, prefix, offset, dims, layout, path, expanded)
    return compile_body


class BitPackingOuterArraysDropped(Fault):
    """Gives bit-packing components only their own dimension: inside an array (of structs holding a bit
    packing, or of bit packings), every element reads the first element's components."""

    fault_id = "ENC-SIZE-TABLE.bit-packing-outer-dims-dropped"
    clauses = ("ENC-SIZE-TABLE", "ENC-TIGHT")

    def patches(self):
        return [wrap(records, "_compile_body", _packing_dims_dropped)]


# ------------------------------------------------------------------------------------ consumers
class GetFieldIgnoresConstants(Fault):
    """Its GetField reads a struct value's stored fields only: a constant field of the struct's declared
    type is not found."""

    fault_id = "DECL-CONSTANT.get-field-constants-missing"
    clauses = ("DECL-CONSTANT", "ENC-PER-VALUE-PARAMS")

    def patches(self):
        from reference_impl.executor import session
        return [Patch(session.Executor, "struct_constant", lambda self, type_id, name: None)]



# ------------------------------------------------------------------------------- record counts
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


class RecordCountCachedPerType(Fault):
    """Builds one typed view per type_id in a session and keeps the record count of the first value it
    viewed: a second value of the same type with another payload length is read with the first count."""

    fault_id = "ENC-NO-COUNT-IN-TYPE.count-cached-per-type"
    clauses = ("ENC-NO-COUNT-IN-TYPE", "ENC-RECORD-COUNT")

    def patches(self):
        return [wrap(decode, "decode_value", _count_cached_per_type)]


# ---------------------------------------------------------------------------- fixed-size fields
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


class OptionalFieldsSizedAsPresent(Fault):
    """Sizes an ``optional<T>`` field as an always-present T instead of refusing it as a field without a
    fixed inline size."""

    fault_id = "ENC-FIXED-SIZE.optional-sized-as-element"
    clauses = ("ENC-FIXED-SIZE",)

    def patches(self):
        return [wrap(structs, "type_bit_size", _lenient_fixed_size(optional_as_element=True))]


class ShapelessTensorsSizedAsScalars(Fault):
    """Sizes a tensor field whose type has no shape (unknown rank) as a scalar, instead of refusing it as
    a field without a fixed inline size."""

    fault_id = "ENC-FIXED-SIZE.shapeless-tensor-as-scalar"
    clauses = ("ENC-FIXED-SIZE",)

    def patches(self):
        return [wrap(structs, "type_bit_size", _lenient_fixed_size(shapeless_as_scalar=True))]


class SymbolicDimsSizedAsOne(Fault):
    """Sizes a symbolic (dim_param) or unset dimension of a tensor field as 1 instead of refusing the
    field as not fixed-size."""

    fault_id = "ENC-FIXED-SIZE.symbolic-dims-as-one"
    clauses = ("ENC-FIXED-SIZE", "DECL-COUNTS-CONCRETE")

    def patches(self):
        return [wrap(structs, "type_bit_size", _lenient_fixed_size(symbolic_as_one=True))]


def _checked_as_bytes(result: int, path: str) -> int:
    """A size in bits checked against the range of a byte count (8 * UINT64_MAX + 7), not of a bit count."""
    if result > structs.UINT64_MAX * 8 + 7:
        raise violation(E.SIZE_OVERFLOW, path, f"size {result} overflows")
    return result


class SizesCheckedInBytes(Fault):
    """Checks size arithmetic against the uint64 range of a byte count instead of a bit count: an element
    of 2**61 bytes (2**64 bits) passes instead of overflowing."""

    fault_id = "ENC-OVERFLOW.checked-in-bytes"
    clauses = ("ENC-OVERFLOW", "ENC-SIZE-TABLE")
    boundary = True

    def patches(self):
        return [Patch(structs, "checked_mul", lambda a, b, path: _checked_as_bytes(a * b, path)),
                Patch(structs, "checked_add", lambda a, b, path: _checked_as_bytes(a + b, path))]


# --------------------------------------------------------------------------------------- saving
class SaveDropsDeclarationMetadata(Fault):
    """Writes catalogue declarations without their doc strings and metadata_props (it keeps only what
    its own layouts use) when it saves a model."""

    fault_id = "WIRE-ROUNDTRIP.declaration-metadata-dropped"
    clauses = ("WIRE-ROUNDTRIP", "WIRE-SCHEMA")

    def on_save(self, model):
        for decl in model.struct_types:
            decl.ClearField("doc_string")
            del decl.metadata_props[:]


class SaveDropsCodecs(Fault):
    """Writes catalogue declarations without their decoder and encoder FunctionProtos when it saves a
    model (it binds codecs natively by type_id and never reads them)."""

    fault_id = "WIRE-ROUNDTRIP.codecs-dropped"
    clauses = ("WIRE-ROUNDTRIP", "CAT-ID-CHANGE")

    def on_save(self, model):
        for decl in model.struct_types:
            decl.ClearField("decoder")
            decl.ClearField("encoder")


_FNUZ_AS_FN = {dtypes.FLOAT8E4M3FNUZ: dtypes.FLOAT8E4M3FN, dtypes.FLOAT8E5M2FNUZ: dtypes.FLOAT8E5M2}


def _fnuz_as_fn(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type in _FNUZ_AS_FN:
            wrong = dtypes.NUMPY_DTYPE[_FNUZ_AS_FN[leaf.elem_type]]
            return values.view(np.uint8).view(wrong).astype(np.float32).astype(values.dtype)
        return values
    return read_leaf


class Float8FnuzReadAsFn(Fault):
    """Decodes the FNUZ float8 leaves (FLOAT8E4M3FNUZ, FLOAT8E5M2FNUZ) with the exponent bias of their
    FN/IEEE namesakes, so every value reads twice as large."""

    fault_id = "ENC-LEAVES.float8-fnuz-bias"
    clauses = ("ENC-LEAVES",)

    def patches(self):
        return [wrap(records, "read_leaf", _fnuz_as_fn)]


class DuplicateIdsCheckedPairwise(Fault):
    """Looks for duplicate type_ids by comparing each declaration with the one before it only (as if the
    catalogue were sorted): two declarations of one ID with another between them pass, and the later
    one wins in its ID map."""

    fault_id = "CAT-REORDER.adjacent-duplicates-only"
    clauses = ("CAT-REORDER", "CAT-ID-UNIQUE")

    def transform(self, model, base_dir):
        ids = [decl.type_id if decl.HasField("type_id") else None for decl in model.struct_types]
        if any(a is not None and a == b for a, b in zip(ids, ids[1:])):
            return  # an adjacent pair: its check reports the duplicate
        last = {type_id: index for index, type_id in enumerate(ids) if type_id is not None}
        kept = []
        for index, decl in enumerate(model.struct_types):
            if ids[index] is None or last[ids[index]] == index:
                copy = type(decl)()
                copy.CopyFrom(decl)
                kept.append(copy)
        del model.struct_types[:]
        model.struct_types.extend(kept)


_NEWEST_LEAVES = (dtypes.FLOAT4E2M1, dtypes.FLOAT8E8M0)


def _newest_unsupported(original):
    def type_bit_size(tp, path, catalogue, depth=0):
        if tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type in _NEWEST_LEAVES:
            raise violation(E.UNSUPPORTED_LEAF, f"{path}.tensor_type.elem_type",
                            f"{dtypes.type_name(tp.tensor_type.elem_type)} is not a known scalar type")
        return original(tp, path, catalogue, depth)
    return type_bit_size


class NewestLeavesUnsupported(Fault):
    """Has a scalar-type table from before FLOAT4E2M1 and FLOAT8E8M0: fields of those fixed-width ONNX
    types are refused as unsupported leaves."""

    fault_id = "ENC-LEAVES.newest-types-refused"
    clauses = ("ENC-LEAVES",)

    def patches(self):
        return [wrap(structs, "type_bit_size", _newest_unsupported)]


def _float4_as_int4(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type == dtypes.FLOAT4E2M1:
            codes = bits.sign_extend(values.view(np.uint8) & 0x0F, 4)
            return codes.astype(np.float32).astype(values.dtype)
        return values
    return read_leaf


class Float4ReadAsInt4(Fault):
    """Unpacks FLOAT4E2M1 fields with its INT4 path: each code becomes its two's complement integer
    (0x2 reads 2.0, not 1.0)."""

    fault_id = "ENC-LEAVES.float4-as-int4"
    clauses = ("ENC-LEAVES",)

    def patches(self):
        return [wrap(records, "read_leaf", _float4_as_int4)]


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


class InlineRootSizeUnchecked(Fault):
    """Checks the root-size rules (positive, whole bytes) when a value's layout is a type_ref, but not
    for an inline layout: an inline constant-only or 12-bit root is read (zero records, or records
    rounded up to whole bytes) instead of refused."""

    fault_id = "ENC-ROOT-SIZE.inline-roots-unchecked"
    clauses = ("ENC-ROOT-SIZE", "ENC-CONSTANT-ONLY")

    def patches(self):
        return [wrap(verifier, "_verify_struct_layout", _inline_roots_unchecked)]
