"""Faults in struct declarations: constants, fields, layouts a declaration may state."""

from __future__ import annotations

from conformance.audit.fault import Patch, enclosing_depth, fault, name_faults, skip, struct_types, wrap
from conformance.audit.faults.wire import refusing
from reference_impl import dtypes, structs, values
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import session
from reference_impl.structs import struct_kind
from reference_impl.tensors import check_tensor_data, element_count

FieldWithoutContentAccepted = fault("DECL-FIELD-CONTENT.empty-field-accepted", ("DECL-FIELD-CONTENT",),
    """Accepts a structure field that selects neither a type nor a constant.""",
    patches=lambda: [skip(structs, "check_struct", "FIELD_CONTENT_MISSING", returns=enclosing_depth)])
FieldTypesNotValidated = fault("DECL-TYPE-RULES.field-types-unchecked", ("DECL-TYPE-RULES",),
    """Does not apply TypeProto's validation rules to struct field and array element types (undefined element types,
    negative dimensions, maps with float keys, sequences without elements pass).""",
    patches=lambda: [skip(structs, "check_type", "TYPE_INVALID", returns=enclosing_depth)])


def _member_dims(model) -> list:
    """The dimensions of every tensor-typed struct field and array element of a model."""
    found = []
    for st, _ in struct_types(model):
        kind = struct_kind(st)
        types = ([f.type for f in st.structure.field if f.WhichOneof("content") == "type"]
                 if kind == "structure" else [st.array.element_type] if kind == "array" else [])
        found += [d for tp in types if tp.WhichOneof("value") == "tensor_type" for d in tp.tensor_type.shape.dim]
    return found


RejectsDynamicFieldDims = fault("DECL-DYNAMIC-DIMS.dynamic-dims-rejected", ("DECL-DYNAMIC-DIMS",),
    """Requires concrete dimensions on every tensor field of a struct, refusing the dynamic dimensions TypeProto permits
    for types that are not byte-encoded.""", precheck=refusing(
        E.TYPE_INVALID, "model.struct_types", "struct fields need concrete dimensions",
        lambda model: any(d.WhichOneof("value") != "dim_value" for d in _member_dims(model))))
ZeroCountsAccepted = fault("DECL-COUNTS-CONCRETE.zero-count-accepted", ("DECL-COUNTS-CONCRETE",),
    """Accepts arrays and bit packings whose count is missing (zero).""",
    patches=lambda: [skip(structs, "check_struct", "DIMENSION_INVALID", returns=enclosing_depth)])
ConstantsNotChecked = fault("DECL-CONSTANT.constants-unchecked", ("DECL-CONSTANT",),
    """Stores field constants as given, without checking their dimensions or that their data matches.""",
    patches=lambda: [Patch(structs, "check_constant", lambda tensor, path: None)])
FieldNamesNotChecked = fault("DECL-WELLFORMED.names-unchecked", ("DECL-WELLFORMED",),
    """Never checks field and component names: empty and repeated names pass.""",
    patches=lambda: [Patch(structs, "_check_names", lambda names, path: None)])
BitWidth64Rejected = fault("DECL-WELLFORMED.bit-width-64-rejected", ("DECL-WELLFORMED",),
    """Checks bit-packing widths with ``1 <= width < 64``: the widest component, 64 bits, is refused.""", boundary=True,
    precheck=refusing(E.BIT_WIDTH_INVALID, "model", "bit width 64 is outside 1..63", lambda model: any(
        c.bit_width == 64 for st, _ in struct_types(model) if struct_kind(st) == "bit_packing"
        for c in st.bit_packing.component)))
NoNestingLimit = fault("DECL-DEPTH.no-limit", ("DECL-DEPTH",), """Has no limit on type nesting: arbitrarily deep
    reference chains are resolved recursively.""", patches=lambda: [Patch(structs, "MAX_DEPTH", 10**9)])
GetFieldIgnoresConstants = fault("DECL-CONSTANT.get-field-constants-missing", ("DECL-CONSTANT", "ENC-PER-VALUE-PARAMS"),
    """Its GetField reads a struct value's stored fields only: a constant field of the struct's declared type is not
    found.""", patches=lambda: [Patch(session.Executor, "struct_constant", lambda self, type_id, name: None)])


def _widths_clamped(original):
    def check(st, path, catalogue, role, depth=0, refs=None):
        if struct_kind(st) == "bit_packing" and any(c.bit_width > 64 for c in st.bit_packing.component):
            clamped = type(st)()
            clamped.CopyFrom(st)
            for component in clamped.bit_packing.component:
                component.bit_width = min(component.bit_width, 64)
            return original(clamped, path, catalogue, role, depth, refs)
        return original(st, path, catalogue, role, depth, refs)
    return check


BitWidthUpperBoundUnchecked = fault("DECL-WELLFORMED.bit-width-over-64-accepted", ("DECL-WELLFORMED",),
    """Checks bit-packing widths only for ``bit_width >= 1`` (the field is a uint32): widths above 64 pass and size the
    packing by their sum.""", boundary=True, patches=lambda: [wrap(structs, "check_struct", _widths_clamped)])


def _component_names_skipped(original):
    return lambda names, path: None if path.endswith("bit_packing.component") else original(names, path)


ComponentNamesUnchecked = fault("DECL-WELLFORMED.component-names-unchecked", ("DECL-WELLFORMED",),
    """Checks structure field names but never bit-packing component names: empty and repeated component names
    pass.""", patches=lambda: [wrap(structs, "_check_names", _component_names_skipped)])


def _constant_check(check):
    """A patch of the field-constant check by ``check(original, tensor, path)``."""
    return wrap(structs, "check_constant", lambda original: lambda tensor, path: check(original, tensor, path))


def _one_byte_per_code(original, tensor, path):
    if tensor.HasField("raw_data") and dtypes.BIT_WIDTH.get(tensor.data_type, 8) < 8:
        count = element_count(tensor.dims, f"{path}.dims")
        if len(tensor.raw_data) != count:
            raise violation(E.TENSOR_DATA_INVALID, f"{path}.raw_data",
                            f"{len(tensor.raw_data)} bytes for {count} elements")
        return None
    return original(tensor, path)


SubByteConstantsOneBytePerCode = fault("DECL-CONSTANT.sub-byte-raw-unpacked", ("DECL-CONSTANT",),
    """Checks a field constant's raw_data as one byte per element for sub-byte types (INT4, UINT4, INT2,
    FLOAT4E2M1...): a correctly packed constant is refused, an unpacked one passes.""",
    patches=lambda: [_constant_check(_one_byte_per_code)])


def _typed_data_uncounted(original, tensor, path):
    if tensor.HasField("raw_data"):
        return original(tensor, path)
    for index, dim in enumerate(tensor.dims):
        if dim < 0:
            raise violation(E.CONSTANT_DIMS_INVALID, f"{path}.dims[{index}]", "not concrete")
    return None


ConstantTypedDataUncounted = fault("DECL-CONSTANT.typed-data-uncounted", ("DECL-CONSTANT",),
    """Matches a field constant's data to its dims only when it uses raw_data: typed fields (float_data, int64_data...)
    are taken without counting their values.""", patches=lambda: [_constant_check(_typed_data_uncounted)])
ZeroTensorDimRejected = fault("DECL-TYPE-RULES.zero-tensor-dim-rejected", ("DECL-TYPE-RULES", "ENC-SIZE-TABLE"),
    """Applies the array rule (explicit count > 0) to tensor field dimensions as well: a field or array element tensor
    with a zero dimension is refused.""", precheck=refusing(
        E.DIMENSION_INVALID, "model", "tensor field dimensions must be > 0",
        lambda model: any(d.WhichOneof("value") == "dim_value" and d.dim_value == 0 for d in _member_dims(model))))


def _skip_where(codes: tuple[str, ...], wanted):
    """check_struct without the checks raising ``codes`` where ``wanted(role, depth, error)`` holds."""
    def make(original):
        def check_struct(st, path, catalogue, role, depth=0, refs=None):
            try:
                return original(st, path, catalogue, role, depth, refs)
            except ContractError as error:
                if error.code.value not in codes or not wanted(role, depth, error, path):
                    raise
                return depth
        return check_struct
    return make


BitPackingCountUnchecked = fault("DECL-COUNTS-CONCRETE.bit-packing-count-unchecked", ("DECL-COUNTS-CONCRETE",),
    """Checks that an array's length is an explicit positive integer but not a bit packing's count: a bit packing
    without a dimension is accepted as zero elements.""", patches=lambda: [wrap(structs, "check_struct", _skip_where(
        ("DIMENSION_INVALID",), lambda role, depth, error, path: error.path.endswith("bit_packing.dimension")))])


def _outside_declarations(role, depth, error, path) -> bool:
    """A struct checked anywhere but as a catalogue declaration (a field type, graph type or layout)."""
    return role != "declaration"


NestedCountsUnchecked = fault("DECL-COUNTS-CONCRETE.nested-counts-unchecked", ("DECL-COUNTS-CONCRETE",),
    """Checks array lengths and bit-packing counts on catalogue declarations only: an inline array or bit packing inside
    a field type, graph type or layout may leave its count unset.""", boundary=True,
    patches=lambda: [wrap(structs, "check_struct", _skip_where(("DIMENSION_INVALID",), _outside_declarations))])
FieldContentCheckedInCatalogueOnly = fault("DECL-FIELD-CONTENT.catalogue-only", ("DECL-FIELD-CONTENT",),
    """Checks that every structure field selects a type or a constant in catalogue declarations only: an inline struct
    (in a field type, a graph type or an encoded layout) may hold an empty field.""", boundary=True,
    patches=lambda: [wrap(structs, "check_struct", _skip_where(("FIELD_CONTENT_MISSING",), _outside_declarations))])
NestingLimitOneTooMany = fault("DECL-DEPTH.one-level-over", ("DECL-DEPTH",),
    """Compares the nesting depth with ``>`` one level late: 65 levels pass where the limit is 64.""", boundary=True,
    patches=lambda: [Patch(structs, "MAX_DEPTH", structs.MAX_DEPTH + 1)])
NestingLimitOneShort = fault("DECL-DEPTH.one-level-short", ("DECL-DEPTH",),
    """Counts the root as a level of its own: a type exactly 64 levels deep is refused.""", boundary=True,
    patches=lambda: [Patch(structs, "MAX_DEPTH", structs.MAX_DEPTH - 1)])


def _counted_by_product(original, tensor, path) -> None:
    check_tensor_data(tensor, path)


def _unset_dims_as_zero(original):
    def dim(d):
        found = original(d)
        return 0 if found is None else found
    return dim


UnsetDimsReadAsZero = fault("DECL-DYNAMIC-DIMS.unset-dim-zero", ("DECL-DYNAMIC-DIMS",),
    """Reads a dimension that has neither a value nor a name as the protobuf default 0, so a struct field declared with
    an unknown dimension only accepts empty tensors.""", boundary=True,
    patches=lambda: [wrap(values, "_dim", _unset_dims_as_zero)])
NegativeConstantDimsCounted = fault("DECL-CONSTANT.negative-dims-counted", ("DECL-CONSTANT",),
    """Validates a field constant by counting its elements as the product of its dims and matching the data to that
    count, without rejecting negative dims: two negative dims multiply to a positive count (dims [-1, -2] hold two
    FLOATs) and a negative dim beside a zero counts no elements.""",
    patches=lambda: [_constant_check(_counted_by_product)])


name_faults(globals())
