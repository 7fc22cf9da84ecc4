"""More faults in the representation contract: declaration checks done on one path only, size sums
that wrap, root-size rules tied to the records instead of the type."""

from __future__ import annotations

from conformance.audit.fault import Fault, Patch, decode_module, struct_types, wrap
from reference_impl import dtypes, records, structs, verifier
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.structs import NotFixedSize, check_struct, struct_kind
from reference_impl.tensors import element_count

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


class BitWidthUpperBoundUnchecked(Fault):
    """Checks bit-packing widths only for ``bit_width >= 1`` (the field is a uint32): widths above 64
    pass and size the packing by their sum."""

    fault_id = "DECL-WELLFORMED.bit-width-over-64-accepted"
    clauses = ("DECL-WELLFORMED",)
    boundary = True

    def patches(self):
        def make(original):
            def check(st, path, catalogue, role, depth=0, refs=None):
                if struct_kind(st) == "bit_packing" and any(c.bit_width > 64 for c in st.bit_packing.component):
                    clamped = type(st)()
                    clamped.CopyFrom(st)
                    for component in clamped.bit_packing.component:
                        component.bit_width = min(component.bit_width, 64)
                    return original(clamped, path, catalogue, role, depth, refs)
                return original(st, path, catalogue, role, depth, refs)
            return check
        return [wrap(structs, "check_struct", make)]


class FieldSizeSumWraps(Fault):
    """Multiplies sizes with overflow checks but adds field and component sizes with plain uint64
    arithmetic: a structure whose field sizes sum past 2**64 bits wraps to a small size."""

    fault_id = "ENC-OVERFLOW.field-sum-wraps"
    clauses = ("ENC-OVERFLOW",)
    boundary = True

    def patches(self):
        return [Patch(structs, "checked_add", lambda a, b, path: (a + b) % _UINT64)]


class KindlessCategoryOnlyInSequences(Fault):
    """Accepts the kind-less category as a sequence element but refuses it as a map value."""

    fault_id = "CAT-KINDLESS.map-value-category-rejected"
    clauses = ("CAT-KINDLESS",)

    def patches(self):
        def make(original):
            def check(tp, path, catalogue, depth=0, refs=None):
                if tp.WhichOneof("value") == "map_type":
                    value = tp.map_type.value_type
                    if value.WhichOneof("value") == "struct_type" and struct_kind(value.struct_type) is None:
                        raise violation(E.KINDLESS_MISPLACED, f"{path}.map_type.value_type",
                                        "a kind-less struct is only a sequence element category")
                return original(tp, path, catalogue, depth, refs)
            return check
        return [wrap(structs, "check_type", make)]


class ComponentNamesUnchecked(Fault):
    """Checks structure field names but never bit-packing component names: empty and repeated
    component names pass."""

    fault_id = "DECL-WELLFORMED.component-names-unchecked"
    clauses = ("DECL-WELLFORMED",)

    def patches(self):
        def make(original):
            def check(names, path):
                if path.endswith("bit_packing.component"):
                    return None
                return original(names, path)
            return check
        return [wrap(structs, "_check_names", make)]


class SubByteConstantsOneBytePerCode(Fault):
    """Checks a field constant's raw_data as one byte per element for sub-byte types (INT4, UINT4,
    INT2, FLOAT4E2M1...): a correctly packed constant is refused, an unpacked one passes."""

    fault_id = "DECL-CONSTANT.sub-byte-raw-unpacked"
    clauses = ("DECL-CONSTANT",)

    def patches(self):
        def make(original):
            def check(tensor, path):
                if tensor.HasField("raw_data") and dtypes.BIT_WIDTH.get(tensor.data_type, 8) < 8:
                    count = element_count(tensor.dims, f"{path}.dims")
                    if len(tensor.raw_data) != count:
                        raise violation(E.TENSOR_DATA_INVALID, f"{path}.raw_data",
                                        f"{len(tensor.raw_data)} bytes for {count} elements")
                    return None
                return original(tensor, path)
            return check
        return [wrap(structs, "check_constant", make)]


class ConstantTypedDataUncounted(Fault):
    """Matches a field constant's data to its dims only when it uses raw_data: typed fields
    (float_data, int64_data...) are taken without counting their values."""

    fault_id = "DECL-CONSTANT.typed-data-uncounted"
    clauses = ("DECL-CONSTANT",)

    def patches(self):
        def make(original):
            def check(tensor, path):
                if tensor.HasField("raw_data"):
                    return original(tensor, path)
                for index, dim in enumerate(tensor.dims):
                    if dim < 0:
                        raise violation(E.CONSTANT_DIMS_INVALID, f"{path}.dims[{index}]", "not concrete")
                return None
            return check
        return [wrap(structs, "check_constant", make)]


class NestedInlineTypeIdIgnored(Fault):
    """Rejects a type_id on an encoded value's inline layout but not on inline declarations inside a
    TypeProto (graph inputs and outputs, field and element types), which it reads as anonymous."""

    fault_id = "CAT-INLINE-NO-ID.nested-inline-id-ignored"
    clauses = ("CAT-INLINE-NO-ID",)

    def transform(self, model, base_dir):
        for st, role in struct_types(model):
            if role == "type" and st.WhichOneof("kind") not in (None, "type_ref"):
                st.ClearField("type_id")


class TypeRefMetadataUnchecked(Fault):
    """Checks that a type_ref carries no other singular field (HasField on each) but forgets the
    repeated metadata_props, which it ignores."""

    fault_id = "CAT-REF-ONLY-ID.metadata-props-ignored"
    clauses = ("CAT-REF-ONLY-ID",)

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.WhichOneof("kind") == "type_ref":
                st.ClearField("metadata_props")


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


class ZeroTensorDimRejected(Fault):
    """Applies the array rule (explicit count > 0) to tensor field dimensions as well: a field or array
    element tensor with a zero dimension is refused."""

    fault_id = "DECL-TYPE-RULES.zero-tensor-dim-rejected"
    clauses = ("DECL-TYPE-RULES", "ENC-SIZE-TABLE")

    def precheck(self, model, base_dir):
        for st, _ in struct_types(model):
            kind = st.WhichOneof("kind")
            types = ([f.type for f in st.structure.field if f.WhichOneof("content") == "type"]
                     if kind == "structure" else [st.array.element_type] if kind == "array" else [])
            for tp in types:
                if tp.WhichOneof("value") == "tensor_type" and any(
                        d.WhichOneof("value") == "dim_value" and d.dim_value == 0 for d in tp.tensor_type.shape.dim):
                    raise violation(E.DIMENSION_INVALID, "model", "tensor field dimensions must be > 0")


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


class BindingIgnoresLeafTypes(Fault):
    """Verifies a binding's declaration by each leaf's path, width and bit position but not its element
    type: an INT8 field redeclared UINT8 (or FLOAT16 as BFLOAT16) under the same ID still binds."""

    fault_id = "DEC-KEYED.leaf-types-not-compared"
    clauses = ("DEC-KEYED",)

    def patches(self):
        def make(original):
            def signature(layout):
                bits, leaves, consts = original(layout)
                return bits, tuple((p, w, o, d) for p, _, w, o, d in leaves), consts
            return signature
        return [wrap(records.RecordLayout, "signature", make)]


class StructLogicalTypeUnvalidated(Fault):
    """Validates a struct-layout value's optional logical_type only when a decoder checks its output
    against it: on load, an unresolved type_ref or a malformed type there passes."""

    fault_id = "CAT-REF-RESOLVED.logical-type-unvalidated"
    clauses = ("CAT-REF-RESOLVED", "ENC-LOGICAL-OPTIONAL")

    def patches(self):
        def make(original):
            def check(tp, path, catalogue, depth=0, refs=None):
                if path.endswith(".logical_type"):
                    return depth
                return original(tp, path, catalogue, depth, refs)
            return check
        return [wrap(verifier, "check_type", make, aliases=False)]
