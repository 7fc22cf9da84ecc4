"""Faults in byte encoding of structured values: bit order, sizes, record counts, leaves and layouts."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import weakref

import ml_dtypes
import numpy as np

from conformance.audit.fault import (
    Fault,
    Patch,
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

_UINT64 = 1 << 64


# ------------------------------------------------------------- mechanisms (the structured and export faults use them)
def around(target, name: str, *, before=None, instead=None, rescue=None, after=None, aliases: bool = True) -> Patch:
    """The function ``target.name`` with hooks given the call's arguments by name (defaults applied): ``before(**args)``
    returns the arguments it changes (a dict; None: none) or raises, ``instead(**args)`` what the call returns instead
    (None: the function runs), ``rescue(error, **args)`` what it returns when the function raised the ContractError
    ``error`` (or raises), ``after(result, **args)`` what the call returns."""
    def make(original):
        signature = inspect.signature(original)

        def hooked(*args, **kwargs):
            call = signature.bind(*args, **kwargs)
            call.apply_defaults()
            call.arguments.update((before and before(**call.arguments)) or {})
            result = instead(**call.arguments) if instead else None
            if result is None:
                try:
                    result = original(*call.args, **call.kwargs)
                except ContractError as error:
                    if rescue is None:
                        raise
                    result = rescue(error, **call.arguments)
            return after(result, **call.arguments) if after else result
        return hooked
    return wrap(target, name, make, aliases)


def refuse(code: E, path: str, message: str):
    """Raise the violation (for a hook that is an expression)."""
    raise violation(code, path, message)


def refuse_values(when, code: E, message: str, path=_name):
    """A precheck refusing a model with an encoded value ``when(value)`` selects."""
    def precheck(model, base_dir):
        for value in encoded_values(model):
            if when(value):
                refuse(code, path(value), message)
    return precheck


def copied(message):
    """A copy of a protobuf message."""
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def seam(target, name: str):
    """A maker of ``patches`` functions hooking ``target.name`` with the ``around`` hooks it is given."""
    return lambda **hooks: lambda: [around(target, name, **hooks)]


_leaves = seam(records, "read_leaf")  # (payload, record_bits, leaf)
_sizes = seam(structs, "type_bit_size")  # (tp, path, catalogue, depth)
_layouts = seam(verifier, "_verify_struct_layout")  # (value, path, extent, catalogue)


def _typed_leaves(elem_types: tuple, fix):
    """``read_leaf`` applying ``fix(values, leaf)`` to what it reads of a field of one of ``elem_types``."""
    return _leaves(after=lambda values, leaf, **_: fix(values, leaf) if leaf.elem_type in elem_types else values)


def _floored(when, unit=lambda leaf: 8):
    """``read_leaf`` reading a field ``when(leaf)`` selects from its offset rounded down to ``unit(leaf)`` bits."""
    return _leaves(before=lambda leaf, **_: {"leaf": leaf._replace(offset=leaf.offset - leaf.offset % unit(leaf))}
                   if when(leaf) else None)


def _tensor(tp):
    return tp.tensor_type if tp.WhichOneof("value") == "tensor_type" else None


def _round_up(size: int) -> int:
    return -(-size // 8) * 8


# ------------------------------------------------------------------------------------- sizes
def _constants_stored(model, base_dir):
    for st, _ in struct_types(model):
        for field in st.structure.field if st.WhichOneof("kind") == "structure" else ():
            if field.WhichOneof("content") == "constant":
                constant, tensor = field.constant, field.type.tensor_type  # selecting the type clears the constant
                tensor.elem_type = constant.data_type
                tensor.shape.SetInParent()
                for dim in constant.dims:
                    tensor.shape.dim.add(dim_value=dim)


def _sub_byte_widened(size, tp, **_):
    tensor = _tensor(tp)
    width = dtypes.BIT_WIDTH.get(tensor.elem_type, 8) if tensor is not None else 8
    return size // width * 8 if width < 8 and not isinstance(size, NotFixedSize) else size


def _string_pointers(tp, **_):
    tensor = _tensor(tp)
    if tensor is not None and tensor.elem_type == dtypes.STRING and tensor.HasField("shape"):
        return 64 * math.prod(dim.dim_value for dim in tensor.shape.dim)


def _struct_fields_rounded(kinds: tuple[str, ...], when=lambda decl, size: True, to=_round_up):
    """``type_bit_size`` giving struct fields of ``kinds`` (resolved) the size ``to(size)`` where ``when`` holds."""
    def rounded(size, tp, catalogue, **_):
        if tp.WhichOneof("value") != "struct_type" or isinstance(size, NotFixedSize):
            return size
        try:
            decl, _ = catalogue.resolve(tp.struct_type, "field")
        except ContractError:
            return size
        return to(size) if struct_kind(decl) in kinds and when(decl, size) else size
    return _sizes(after=rounded)


def _sub_byte_elements(st) -> bool:
    """Whether an array's elements are of a 4- or 2-bit tensor type."""
    element = st.array.element_type
    return element.WhichOneof("value") == "tensor_type" and dtypes.BIT_WIDTH.get(element.tensor_type.elem_type, 8) < 8


def _strided(selects, stride, place):
    """Patches giving the elements of the arrays or bit packings ``selects(st)`` picks the stride ``stride(st, path,
    catalogue, depth)`` instead of their size: ``Catalogue.bit_size`` sizes them at dimension * stride and
    ``_compile_body`` has ``place(st, catalogue, prefix, offset, dims, layout, path, expanded)`` compile their elements,
    ``dims`` ending with the (dimension, stride) of the elements."""
    def patches():
        bit_size, compile_body = structs.Catalogue.bit_size, records._compile_body

        def sized(catalogue, st, path, depth=0):
            size = bit_size(catalogue, st, path, depth)
            if not selects(st) or isinstance(size, NotFixedSize):
                return size
            return structs.checked_mul(getattr(st, struct_kind(st)).dimension, stride(st, path, catalogue, depth), path)

        def compiled(st, catalogue, prefix, offset, dims, layout, path, expanded):
            if not selects(st):
                return compile_body(st, catalogue, prefix, offset, dims, layout, path, expanded)
            step = (getattr(st, struct_kind(st)).dimension, stride(st, path, catalogue, 0))
            place(st, catalogue, prefix, offset, dims + (step,), layout, path, expanded)
            return None
        return [Patch(structs.Catalogue, "bit_size", sized), Patch(records, "_compile_body", compiled)]
    return patches


def _struct_elements(st, catalogue, prefix, offset, dims, layout, path, expanded):
    records._compile_type(st.array.element_type, catalogue, prefix, offset, dims, layout,
                          f"{path}.array.element_type", expanded)


def _packed_components(st, catalogue, prefix, offset, dims, layout, path, expanded):
    running = 0
    for component in st.bit_packing.component:
        records._add_leaf(layout, records.Leaf(records._join(prefix, component.name), None, component.bit_width,
                                               offset + running, dims), path)
        running += component.bit_width


def _byte_per_element(st, catalogue, prefix, offset, dims, layout, path, expanded):
    elem_type = st.array.element_type.tensor_type.elem_type
    records._add_leaf(layout, records.Leaf(prefix, elem_type, dtypes.BIT_WIDTH[elem_type], offset, dims), path)


def _lenient_optional(tp, path, catalogue, depth):
    if tp.WhichOneof("value") == "optional_type":
        return structs.type_bit_size(tp.optional_type.elem_type, path, catalogue, depth + 1)


def _lenient_shapeless(tp, **_):
    tensor = _tensor(tp)
    if tensor is not None and not tensor.HasField("shape"):
        return dtypes.BIT_WIDTH.get(tensor.elem_type)


def _lenient_symbolic(tp, **_):
    tensor = _tensor(tp)
    width = dtypes.BIT_WIDTH.get(tensor.elem_type) if tensor is not None else None
    if width is not None and tensor.HasField("shape") and \
            any(dim.WhichOneof("value") != "dim_value" for dim in tensor.shape.dim):
        return width * math.prod(dim.dim_value if dim.WhichOneof("value") == "dim_value" else 1
                                 for dim in tensor.shape.dim)


def _checked_as_bytes(result: int, path: str) -> int:
    """A size in bits checked against the range of a byte count (8 * UINT64_MAX + 7), not of a bit count."""
    return result if result <= structs.UINT64_MAX * 8 + 7 else refuse(E.SIZE_OVERFLOW, path, f"size {result} overflows")


def _wrapping_add(a, b, path):
    return (a + b) % _UINT64


def _zero_size_structs(model, base_dir):
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
            refuse(E.ROOT_SIZE_ZERO, path, "a struct needs a positive size")


def _packing_dimension_ignored(model, base_dir):
    for st, _ in struct_types(model):
        if st.WhichOneof("kind") == "bit_packing" and st.bit_packing.dimension > 1:
            st.bit_packing.dimension = 1


ConstantsTakePayloadBytes = fault("ENC-SIZE-TABLE.constants-stored", ("ENC-SIZE-TABLE",),
    """Sizes a constant field like a stored one (it keeps the constant in every record), instead of
    ``size(Field(constant)) = 0``.""", transform=_constants_stored)
SubByteTensorCodesTakeAByte = fault("ENC-SIZE-TABLE.sub-byte-tensor-unpacked", ("ENC-SIZE-TABLE",),
    """Sizes ``tensor(INT4/UINT4/INT2/UINT2, dims)`` fields at one byte per element instead of ``product(dims) *
    bit_width``: the narrowest leaves are not packed tightly.""", boundary=True,
    patches=_sizes(after=_sub_byte_widened))
WrappingSizeArithmetic = fault("ENC-OVERFLOW.wrapping-arithmetic", ("ENC-OVERFLOW",),
    """Computes sizes with plain uint64 arithmetic that wraps around instead of checked arithmetic: an overflowing size
    silently becomes a small (or zero) one.""",
    patches=lambda: [Patch(structs, "checked_mul", lambda a, b, path: (a * b) % _UINT64),
                     Patch(structs, "checked_add", _wrapping_add)])
FieldSizeSumWraps = fault("ENC-OVERFLOW.field-sum-wraps", ("ENC-OVERFLOW",),
    """Multiplies sizes with overflow checks but adds field and component sizes with plain uint64 arithmetic: a
    structure whose field sizes sum past 2**64 bits wraps to a small size.""", boundary=True,
    patches=lambda: [Patch(structs, "checked_add", _wrapping_add)])
SizesCheckedInBytes = fault("ENC-OVERFLOW.checked-in-bytes", ("ENC-OVERFLOW", "ENC-SIZE-TABLE"),
    """Checks size arithmetic against the uint64 range of a byte count instead of a bit count: an element of 2**61 bytes
    (2**64 bits) passes instead of overflowing.""", boundary=True,
    patches=lambda: [Patch(structs, "checked_mul", lambda a, b, path: _checked_as_bytes(a * b, path)),
                     Patch(structs, "checked_add", lambda a, b, path: _checked_as_bytes(a + b, path))])
DynamicFieldsSizedZero = fault("ENC-FIXED-SIZE.dynamic-fields-zero", ("ENC-FIXED-SIZE",),
    """Sizes fields without a fixed inline size (sequences, maps, symbolic dimensions) at zero bits instead of refusing
    the byte-payload layout for their struct.""",
    patches=_sizes(after=lambda size, **_: 0 if isinstance(size, NotFixedSize) else size))
KindlessSizedZero = fault("ENC-FIXED-SIZE.kindless-sized-zero", ("ENC-FIXED-SIZE", "CAT-KINDLESS"),
    """Sizes a kind-less struct nested in a byte layout as an empty structure, zero bits, instead of finding it has no
    fixed size.""",
    patches=lambda: [around(structs.Catalogue, "bit_size", instead=lambda st, **_: 0 if struct_kind(st) is None
                            else None)])
OptionalFieldsSizedAsPresent = fault("ENC-FIXED-SIZE.optional-sized-as-element", ("ENC-FIXED-SIZE",),
    """Sizes an ``optional<T>`` field as an always-present T instead of refusing it as a field without a fixed inline
    size.""", patches=_sizes(instead=_lenient_optional))
ShapelessTensorsSizedAsScalars = fault("ENC-FIXED-SIZE.shapeless-tensor-as-scalar", ("ENC-FIXED-SIZE",),
    """Sizes a tensor field whose type has no shape (unknown rank) as a scalar, instead of refusing it as a field
    without a fixed inline size.""", patches=_sizes(instead=_lenient_shapeless))
SymbolicDimsSizedAsOne = fault("ENC-FIXED-SIZE.symbolic-dims-as-one", ("ENC-FIXED-SIZE", "DECL-COUNTS-CONCRETE"),
    """Sizes a symbolic (dim_param) or unset dimension of a tensor field as 1 instead of refusing the field as not
    fixed-size.""", patches=_sizes(instead=_lenient_symbolic))
StringLeavesAsPointers = fault("ENC-LEAVES.strings-as-pointers", ("ENC-LEAVES",),
    """Lays out a STRING leaf as a 64-bit pointer to its characters, as its in-memory struct does, instead of refusing
    it as a leaf that is not fixed-width physical data.""", patches=_sizes(instead=_string_pointers))
NewestLeavesUnsupported = fault("ENC-LEAVES.newest-types-refused", ("ENC-LEAVES",),
    """Has a scalar-type table from before FLOAT4E2M1 and FLOAT8E8M0: fields of those fixed-width ONNX types are refused
    as unsupported leaves.""",
    patches=_sizes(before=lambda tp, path, **_: refuse(
        E.UNSUPPORTED_LEAF, f"{path}.tensor_type.elem_type",
        f"{dtypes.type_name(tp.tensor_type.elem_type)} is not a known scalar type")
        if _tensor(tp) is not None and tp.tensor_type.elem_type in (dtypes.FLOAT4E2M1, dtypes.FLOAT8E8M0) else None))
RejectsZeroSizeStructs = fault("ENC-CONSTANT-ONLY.constant-groups-rejected", ("ENC-CONSTANT-ONLY",),
    """Refuses every constant-only struct, also as a plain type or as a nested group contributing zero bytes to its
    parent's records.""", boundary=True, precheck=_zero_size_structs)
EmptyGroupsTakeAByte = fault("ENC-CONSTANT-ONLY.empty-group-one-byte", ("ENC-CONSTANT-ONLY", "ENC-SIZE-TABLE"),
    """Sizes a nested constant-only group at one byte (a C++ empty struct) instead of zero bits.""", boundary=True,
    patches=_struct_fields_rounded(("structure",), lambda decl, size: size == 0, to=lambda size: 8))
SubByteArraysPadded = fault("ENC-TIGHT.sub-byte-arrays-padded", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Stores an array of 4- or 2-bit elements like a TensorProto's raw_data, padded to whole bytes, so a nested array
    of three INT4 takes 16 bits and the next field starts at the next byte, instead of packing tightly into ``n *
    size(T)`` bits.""", boundary=True,
    patches=_struct_fields_rounded(("array",), lambda decl, size: _sub_byte_elements(decl)))
NestedGroupsByteRounded = fault("ENC-TIGHT.nested-groups-byte-rounded", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Gives a nested structure or bit packing its size rounded up to whole bytes (as a C compiler sizes a nested
    struct), so the field after a 12-bit group starts at bit 16 instead of bit 12.""", boundary=True,
    patches=_struct_fields_rounded(("structure", "bit_packing")))
ArrayOfStructsByteStride = fault("ENC-TIGHT.struct-array-byte-stride", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Steps through an array of nested structs with a byte stride (the element's size rounded up to whole bytes), so
    elements of a 12-bit struct start every 16 bits instead of every 12.""", boundary=True,
    patches=_strided(lambda st: struct_kind(st) == "array" and st.array.element_type.WhichOneof("value") ==
                     "struct_type", lambda st, path, catalogue, depth: _round_up(
                         structs.type_bit_size(st.array.element_type, path, catalogue, depth)), _struct_elements))
BitPackingElementsByteAligned = fault("ENC-TIGHT.bit-packing-elements-byte-aligned", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Starts every element of a bit packing on a byte boundary (its components padded to whole bytes) instead of
    packing the elements tightly: three 12-bit elements take 48 bits, not 36.""", boundary=True,
    patches=_strided(lambda st: struct_kind(st) == "bit_packing", lambda st, *_: _round_up(
        sum(c.bit_width for c in st.bit_packing.component)), _packed_components))
SubByteArrayElementsTakeAByte = fault("ENC-SIZE-TABLE.sub-byte-array-elements-unpacked",
    ("ENC-SIZE-TABLE", "ENC-TIGHT"), """Gives each element of an Array of a 4- or 2-bit scalar its own byte (low bits),
    instead of packing the elements tightly at ``n * size(T)`` bits.""", boundary=True,
    patches=_strided(lambda st: struct_kind(st) == "array" and _sub_byte_elements(st) and
                     len(st.array.element_type.tensor_type.shape.dim) == 0, lambda *_: 8, _byte_per_element))
BitPackingDimensionIgnored = fault("ENC-SIZE-TABLE.bit-packing-dimension-ignored", ("ENC-SIZE-TABLE",),
    """Reads a bit packing as one group of its components, ignoring its dimension (the count of groups):
    ``size(BitPacking(c..., n)) = sum(c.bit_width)``.""", transform=_packing_dimension_ignored)


# ---------------------------------------------------------------------------------- record layouts
def _fields_in_name_order(model, base_dir):
    for st, _ in struct_types(model):
        if st.WhichOneof("kind") == "structure":
            ordered = [copied(field) for field in sorted(st.structure.field, key=lambda f: f.name)]
            del st.structure.field[:]
            st.structure.field.extend(ordered)


def _column_major(result, tp, prefix, dims, layout, **_):
    if tp.WhichOneof("value") == "tensor_type":
        leaf, strides, stride = layout.leaves[prefix], [], layout.leaves[prefix].width
        for count in (d.dim_value for d in tp.tensor_type.shape.dim):  # first index fastest
            strides.append((count, stride))
            stride *= count
        layout.leaves[prefix] = leaf._replace(dims=dims + tuple(strides))


def _first_placement(st, offset, expanded, **_):
    if struct_kind(st) == "type_ref":
        return {"offset": expanded.setdefault(("first offset", st.type_ref), offset)}


FieldsInNameOrder = fault("ENC-TIGHT.fields-sorted-by-name", ("ENC-TIGHT",),
    """Keeps a structure's fields in a map sorted by name, so records are laid out in name order rather than
    declaration order.""", transform=_fields_in_name_order)
TensorFieldsColumnMajor = fault("ENC-TIGHT.tensor-fields-column-major", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Lays out a multi-dimensional tensor field column-major (first index fastest) instead of the row-major order of
    TensorProto.raw_data.""", patches=lambda: [around(records, "_compile_type", after=_column_major)])
ReferencedTypePlacedOnce = fault("ENC-TIGHT.referenced-type-offset-cached", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Caches a referenced declaration's compiled fields with the bit offset of its first use: a second field of the
    same type_ref in one record reads the first field's bits.""",
    patches=lambda: [around(records, "_compile_struct", before=_first_placement)])
BitPackingOuterArraysDropped = fault("ENC-SIZE-TABLE.bit-packing-outer-dims-dropped", ("ENC-SIZE-TABLE", "ENC-TIGHT"),
    """Gives bit-packing components only their own dimension: inside an array (of structs holding a bit packing, or of
    bit packings), every element reads the first element's components.""",
    patches=lambda: [around(records, "_compile_body", before=lambda st, **_: {"dims": ()}
                            if struct_kind(st) == "bit_packing" else None)])


# ------------------------------------------------------------------------ roots and record counts
def _partial_ignored(external_only: bool):
    """``_verify_struct_layout`` counting records with a floor division (of external payloads only)."""
    def make(original):
        def verify_struct_layout(value, path, extent, catalogue):
            try:
                return original(value, path, extent, catalogue)
            except ContractError as error:
                if error.code is not E.PAYLOAD_PARTIAL_RECORD or external_only and extent.location is None:
                    raise
                size = catalogue.bit_size(value.struct_type, path) // 8
                whole = dataclasses.replace(extent, length=extent.length - extent.length % size)
                return original(value, path, whole, catalogue)
        return verify_struct_layout
    return lambda: [wrap(verifier, "_verify_struct_layout", make)]


def _inline_roots_unchecked(error, value, path, extent, catalogue):
    inline = value.struct_type.WhichOneof("kind") != "type_ref"
    if not inline or error.code not in (E.ROOT_SIZE_ZERO, E.ROOT_SIZE_NOT_BYTES):
        raise error
    record_bytes = -(-catalogue.bit_size(value.struct_type, path) // 8)
    count = extent.length // record_bytes if record_bytes else 0
    return verifier.EncodedInfo(path, extent, element_bytes=record_bytes, record_count=count)


def _root_checked_with_records(value, path, extent, catalogue):
    if extent.length:
        return None
    layout_path, st = f"{path}.struct_type", value.struct_type
    if struct_kind(st) is None:
        refuse(E.KINDLESS_MISPLACED, layout_path, "a kind-less struct is never a layout")
    check_struct(st, layout_path, catalogue, role="layout")
    size = catalogue.bit_size(st, layout_path)
    if isinstance(size, NotFixedSize):
        refuse(E.NOT_FIXED_SIZE, size.path, f"not byte-encodable: {size.reason}")
    if value.HasField("logical_type"):
        structs.check_type(value.logical_type, f"{path}.logical_type", catalogue)
    return verifier.EncodedInfo(path, extent, element_bytes=max(size // 8, 1), record_count=0)


def _packing_element_whole_bytes(value, path, catalogue, **_):
    st, _ = catalogue.resolve(value.struct_type, f"{path}.struct_type")
    if struct_kind(st) == "bit_packing" and sum(c.bit_width for c in st.bit_packing.component) % 8:
        refuse(E.ROOT_SIZE_NOT_BYTES, f"{path}.struct_type", "a bit-packing element is not a whole byte count")


RootSizeNotWholeBytes = fault("ENC-ROOT-SIZE.rounded-up", ("ENC-ROOT-SIZE",),
    """Rounds an encoding root's size up to whole bytes instead of requiring a multiple of eight bits.""",
    patches=lambda: [skip(verifier, "_verify_struct_layout", "ROOT_SIZE_NOT_BYTES")])
ConstantOnlyRootAccepted = fault("ENC-CONSTANT-ONLY.zero-size-root", ("ENC-CONSTANT-ONLY",),
    """Accepts a constant-only struct (zero bytes per record) as an encoding root, as a value of zero records.""",
    patches=lambda: [skip(verifier, "_verify_struct_layout", "ROOT_SIZE_ZERO", returns=lambda a: verifier.EncodedInfo(
        a["path"], a["extent"], element_bytes=0, record_count=0))])
InlineRootSizeUnchecked = fault("ENC-ROOT-SIZE.inline-roots-unchecked", ("ENC-ROOT-SIZE", "ENC-CONSTANT-ONLY"),
    """Checks the root-size rules (positive, whole bytes) when a value's layout is a type_ref, but not for an inline
    layout: an inline constant-only or 12-bit root is read (zero records, or records rounded up to whole bytes) instead
    of refused.""", patches=_layouts(rescue=_inline_roots_unchecked))
RootRulesCheckedPerRecord = fault("ENC-ROOT-SIZE.checked-only-with-records", ("ENC-ROOT-SIZE", "ENC-CONSTANT-ONLY"),
    """Checks the encoding root's size (positive, whole bytes) only while counting records: an empty payload, zero
    records, never reaches the check, so a constant-only or 12-bit root passes.""",
    patches=_layouts(instead=_root_checked_with_records))
RootPackingElementWholeBytes = fault("ENC-ROOT-SIZE.packing-element-whole-bytes", ("ENC-ROOT-SIZE",),
    """Applies the whole-bytes root rule to one bit-packing element (the sum of its component widths) instead of to the
    packing's total size: a root of two 4-bit elements is refused.""",
    patches=_layouts(before=_packing_element_whole_bytes))
PartialRecordsTruncated = fault("ENC-RECORD-COUNT.partial-record-ignored", ("ENC-RECORD-COUNT",),
    """Counts records with a floor division and silently ignores a trailing partial record.""",
    patches=_partial_ignored(external_only=False))
ExternalPartialRecordIgnored = fault("ENC-RECORD-COUNT.external-partial-record-ignored", ("ENC-RECORD-COUNT",),
    """Checks that an inline payload holds whole records but counts the records of an external payload with a floor
    division: a trailing partial record of the declared external length is ignored.""",
    patches=_partial_ignored(external_only=True))
TypeIsOneRecord = fault("ENC-NO-COUNT-IN-TYPE.exactly-one-record", ("ENC-NO-COUNT-IN-TYPE",),
    """Takes the struct type as the layout of the whole value: a payload must hold exactly one record, so the same type
    cannot describe payloads of other lengths.""",
    patches=_layouts(after=lambda info, path, extent, **_: info if info.record_count == 1 else refuse(
        E.PAYLOAD_PARTIAL_RECORD, path, f"{extent.length} bytes are not one {info.element_bytes}-byte element of the "
        "type")))
EmptyStructPayloadRefused = fault("ENC-RECORD-COUNT.empty-payload-refused", ("ENC-RECORD-COUNT",),
    """Refuses an empty struct payload (it requires at least one record) instead of reading it as zero records.""",
    boundary=True, patches=_layouts(after=lambda info, path, extent, **_: info if extent.length else refuse(
        E.PAYLOAD_PARTIAL_RECORD, path, "payload holds no record")))


# ---------------------------------------------------------------------------------------- leaves
def _last_record_dropped(payload, record_bits, **_):
    record_bytes = record_bits // 8
    if record_bytes and len(payload) >= 2 * record_bytes:
        return {"payload": payload[: len(payload) - len(payload) % record_bytes - record_bytes]}


def _msb_first_components(payload, record_bits, leaf):
    if leaf.elem_type is not None or not len(payload):
        return None
    # Bit-packing components read as an MSB-first bit stream: bit q of the record is bit 7 - q % 8
    # of byte q // 8, and a field's first bit is its most significant one.
    count = len(payload) // (record_bits // 8)
    positions = records._leaf_positions(count, record_bits, leaf).astype(np.int64)
    value = np.zeros(positions.shape, np.uint64)
    for bit in range(leaf.width):  # one pass per bit of the field width, not per element
        q = positions + bit
        value = (value << np.uint64(1)) | ((payload[q // 8] >> (7 - q % 8)) & 1).astype(np.uint64)
    return value


def _packed_run_assumed(leaf, **_):
    if leaf.elem_type in _SUB_BYTE and leaf.offset % 8 == 0 and leaf.dims and not records._is_dense_run(leaf):
        # the nibble/crumb unpacker is used for every byte-aligned sub-byte leaf: its elements are
        # taken as consecutive codes, whatever the stride between them
        expected, dense = leaf.width, []
        for count, _ in reversed(leaf.dims):
            dense.append((count, expected))
            expected *= count
        return {"leaf": leaf._replace(dims=tuple(reversed(dense)))}


def _end_bit_exclusive(payload, record_bits, leaf):
    record_bytes = record_bits // 8
    count = len(payload) // record_bytes if record_bytes else 0
    if count and (leaf.offset % 8 or leaf.width % 8):
        last = (count - 1) * record_bits + leaf.offset + sum((c - 1) * s for c, s in leaf.dims) + leaf.width
        if all(c > 0 for c, _ in leaf.dims) and last >= len(payload) * 8:  # '>=' for '>'
            refuse(E.PAYLOAD_PARTIAL_RECORD, leaf.path, "field extends beyond the payload")


def _zero_extending(values: np.ndarray, elem_type: int) -> np.ndarray:
    if elem_type in dtypes.SIGNED_INTEGERS:
        return values.astype(dtypes.NUMPY_DTYPE[elem_type])
    return bits.unsigned_to_leaf(values, elem_type)


def _first_byte_only(values, bit_positions, width, **_):
    if width >= 8:
        return values
    shift = np.asarray(bit_positions, dtype=np.uint64) & np.uint64(7)
    within = np.minimum(np.uint64(width), np.uint64(8) - shift)
    return values & ((np.uint64(1) << within) - np.uint64(1))


def _eight_byte_window(values, bit_positions, width, **_):
    if width + 7 <= 64:
        return values
    shift = np.asarray(bit_positions, dtype=np.uint64) & np.uint64(7)
    kept = np.uint64(64) - shift  # bits available in the 8-byte window starting at the first byte
    return values & np.where(kept >= 64, np.uint64(2**64 - 1), (np.uint64(1) << (kept & np.uint64(63))) - np.uint64(1))


def _straddling_first_byte_only(buffer, bit_positions, width):
    if width <= 8:
        positions = np.asarray(bit_positions, dtype=np.uint64)
        padded = np.concatenate([np.asarray(buffer, np.uint8), np.zeros(1, np.uint8)])
        first = (positions >> np.uint64(3)).astype(np.intp)
        return (padded[first].astype(np.uint64) >> (positions & np.uint64(7))) & np.uint64((1 << width) - 1)


def _own_width_window(original):
    def read_bits(buffer, bit_positions, width):
        if not 8 < width < 64:
            return original(buffer, bit_positions, width)
        # the window is the field's own byte width (2 bytes for 9..16 bits, ...), loaded from its first
        # byte: right at a byte boundary, the top bits lost when the field starts inside a byte
        positions = np.asarray(bit_positions, dtype=np.uint64)
        raw = original(buffer, positions - (positions & np.uint64(7)), 8 * -(-width // 8))
        return (raw >> (positions & np.uint64(7))) & np.uint64((1 << width) - 1)
    return read_bits


_FNUZ_AS_FN = {dtypes.FLOAT8E4M3FNUZ: dtypes.FLOAT8E4M3FN, dtypes.FLOAT8E5M2FNUZ: dtypes.FLOAT8E5M2}


def _fnuz_as_fn(values, leaf):
    wrong = dtypes.NUMPY_DTYPE[_FNUZ_AS_FN[leaf.elem_type]]
    return values.view(np.uint8).view(wrong).astype(np.float32).astype(values.dtype)


LastRecordDropped = fault("ENC-RECORD-COUNT.last-record-dropped", ("ENC-RECORD-COUNT",),
    """Loops over records with an off-by-one bound: the last record of a multi-record payload is never read.""",
    boundary=True, patches=_leaves(before=_last_record_dropped))
SingleRecordSqueezed = fault("ENC-RECORD-COUNT.single-record-squeezed", ("ENC-RECORD-COUNT",),
    """Drops the record axis of a field read when the payload holds exactly one record (a NumPy-style squeeze): a
    one-record payload's fields lose their leading dimension.""", boundary=True,
    patches=_leaves(after=lambda values, **_: values[0] if values.ndim and values.shape[0] == 1 else values))
BitFieldEndingAtPayloadEndRejected = fault("ENC-RECORD-COUNT.bit-field-at-payload-end-rejected",
    ("ENC-RECORD-COUNT", "ENC-TIGHT"), """The bounds check of the bit-field path (fields not starting on a byte or not
    whole bytes) tests ``end_bit >= 8 * payload_bytes``: a bit field ending exactly at the end of the payload (the last
    field of the last record) is refused as beyond it.""", boundary=True, patches=_leaves(before=_end_bit_exclusive))
BigEndianScalars = fault("ENC-BIT-ORDER.big-endian-scalars", ("ENC-BIT-ORDER",),
    """Reads multi-byte scalar fields big-endian (network order) instead of little-endian.""",
    patches=_leaves(after=lambda values, leaf, **_: values.byteswap() if leaf.elem_type is not None
                    and leaf.width in (16, 32, 64) and values.dtype.kind in "iuf" else values))
HalfFloatsBigEndian = fault("ENC-BIT-ORDER.half-floats-big-endian", ("ENC-BIT-ORDER",),
    """Converts FLOAT16 and BFLOAT16 fields with a half-precision helper that takes its two bytes high byte first; every
    other multi-byte field is read little-endian.""",
    patches=_typed_leaves((dtypes.FLOAT16, dtypes.BFLOAT16), lambda values, leaf: values.byteswap()))
BitPackingMostSignificantFirst = fault("ENC-BIT-ORDER.components-msb-first", ("ENC-BIT-ORDER",),
    """Places the first bit-packing component in the most-significant bits of its byte.""", boundary=True,
    patches=_leaves(instead=_msb_first_components))
UnalignedSignedZeroExtended = fault("ENC-BIT-ORDER.bit-fields-not-sign-extended", ("ENC-BIT-ORDER", "ENC-UNALIGNED"),
    """Reads signed integer fields that are not on a byte boundary (or not a whole number of bytes) with its generic
    bit-field reader, which returns the raw bits without sign extension: an INT4 at bit 4 holding 0xF reads 15, not
    -1.""", patches=lambda: [Patch(records, "unsigned_to_leaf", _zero_extending, aliases=False)])
StraddlingFieldFirstByteOnly = fault("ENC-BIT-ORDER.straddling-field-first-byte-only", ("ENC-BIT-ORDER", "ENC-TIGHT"),
    """Reads a bit field of at most eight bits from the one byte it starts in (``(b[p >> 3] >> (p & 7)) & mask``): right
    while it fits that byte, its high bits lost when it straddles a byte boundary.""", boundary=True,
    patches=lambda: [around(bits, "read_bits", instead=_straddling_first_byte_only)])
SubByteFieldsReadFromOneByte = fault("ENC-TIGHT.sub-byte-field-one-byte", ("ENC-TIGHT", "ENC-BIT-ORDER"),
    """Reads a field narrower than a byte from the byte holding its first bit only: the high bits of a field that
    crosses into the next byte (a 3-bit component at bit 6) read as zero.""", boundary=True,
    patches=lambda: [around(records, "read_bits", after=_first_byte_only, aliases=False)])
PackedCodesFromByteStart = fault("ENC-TIGHT.packed-codes-from-byte-start", ("ENC-TIGHT", "ENC-BIT-ORDER"),
    """Unpacks a run of 4- or 2-bit codes from the byte holding its first code, as if every packed run started on a byte
    boundary: an INT4 field at bit 12 reads the low nibble of byte 1 (bits 8-11).""",
    patches=_floored(lambda leaf: leaf.elem_type in _SUB_BYTE and leaf.offset % 8 and records._is_dense_run(leaf)))
StridedCodesReadAsPackedRun = fault("ENC-TIGHT.strided-codes-read-packed", ("ENC-TIGHT", "ENC-SIZE-TABLE"),
    """Unpacks every byte-aligned run of 4- or 2-bit leaves as consecutive codes: the INT4 field ``a`` of an array of
    {a: INT4, b: INT4} structs reads a0, b0 instead of a0, a1.""", patches=_leaves(before=_packed_run_assumed))
AlignedInt64Reads = fault("ENC-UNALIGNED.aligned-loads", ("ENC-UNALIGNED",),
    """Reads 64-bit fields with an aligned load: the offset is rounded down to a multiple of eight bytes, so an INT64 at
    byte 68 is read from byte 64.""",
    patches=_leaves(before=lambda leaf, **_: {"leaf": leaf._replace(offset=leaf.offset - leaf.offset % 64)}
                    if leaf.width == 64 and leaf.offset % 64 else None))
WholeByteFieldsAtByteOffset = fault("ENC-UNALIGNED.bit-offset-floored", ("ENC-UNALIGNED", "ENC-TIGHT"),
    """Converts a whole-byte field's bit offset to a byte offset by floor division and reads from there: a UINT16 after
    a 4-bit component is read from byte 0 instead of bit 4.""",
    patches=_floored(lambda leaf: leaf.elem_type is not None and leaf.width % 8 == 0 and leaf.offset % 8))
NaturallyAlignedNarrowLoads = fault("ENC-UNALIGNED.narrow-aligned-loads", ("ENC-UNALIGNED", "ENC-TIGHT"),
    """Reads 16- and 32-bit fields with naturally aligned loads: the offset is rounded down to a multiple of the field's
    width, so a FLOAT at byte 5 is read from byte 4.""",
    patches=_floored(lambda leaf: leaf.elem_type is not None and leaf.width in (16, 32) and leaf.offset % leaf.width,
                     unit=lambda leaf: leaf.width))
UnalignedWindowOfOwnWidth = fault("ENC-UNALIGNED.window-of-own-width", ("ENC-UNALIGNED", "ENC-BIT-ORDER"),
    """Loads an unaligned field wider than a byte through a window of its own byte width (two bytes for an INT16, four
    for a FLOAT), starting at the byte it begins in: a field starting inside a byte loses the top bits that spill into
    one more byte. Byte-aligned fields and 64-bit ones are read right.""", boundary=True,
    patches=lambda: [wrap(bits, "read_bits", _own_width_window)])
WideFieldNinthByteDropped = fault("ENC-LEAVES.wide-field-ninth-byte-dropped", ("ENC-LEAVES", "ENC-BIT-ORDER"),
    """Reads every bit field through one 64-bit little-endian load at its first byte: a field of 58 to 64 bits that
    starts inside a byte loses the bits spilling into the ninth byte.""", boundary=True,
    patches=lambda: [around(records, "read_bits", after=_eight_byte_window, aliases=False)])
Bfloat16ReadAsFloat16 = fault("ENC-LEAVES.bfloat16-as-float16", ("ENC-LEAVES",),
    """Maps every 16-bit floating leaf to IEEE half: a BFLOAT16 field's bits are decoded as FLOAT16 (5 exponent bits)
    instead of bfloat16 (8 exponent bits).""", patches=_typed_leaves((dtypes.BFLOAT16,), lambda values, leaf:
        values.view(np.uint16).view(np.float16).astype(np.float32).astype(ml_dtypes.bfloat16)))
UnsignedSubByteSignExtended = fault("ENC-LEAVES.unsigned-sub-byte-sign-extended", ("ENC-LEAVES", "ENC-BIT-ORDER"),
    """Unpacks every 4- and 2-bit field with one helper that sign-extends: a UINT4 field holding 0xF reads as -1 (255 in
    its unsigned storage) instead of 15.""", patches=_typed_leaves(
        (dtypes.UINT4, dtypes.UINT2), lambda values, leaf: bits.sign_extend(values, leaf.width).astype(values.dtype)))
Component64MaskOverflow = fault("ENC-LEAVES.component-64-mask-overflow", ("ENC-LEAVES", "ENC-BIT-ORDER"),
    """Masks a bit-packing component with ``(1 << width) - 1`` in 64-bit arithmetic, where a shift by 64 wraps to a
    shift by 0: a 64-bit component always reads 0.""", boundary=True,  # 1 << 64 computed in 64 bits wraps to 1
    patches=_leaves(after=lambda values, leaf, **_: np.zeros_like(values) if leaf.elem_type is None
                    and leaf.width == 64 else values))
Int8ReadAsUnsignedChar = fault("ENC-LEAVES.int8-unsigned-char", ("ENC-LEAVES",),
    """Reads INT8 fields through a plain ``char``, unsigned on its platform: -1 reads as 255.""",
    patches=_typed_leaves((dtypes.INT8,), lambda values, leaf: values.view(np.uint8).astype(np.int16)))
Float8FnuzReadAsFn = fault("ENC-LEAVES.float8-fnuz-bias", ("ENC-LEAVES",),
    """Decodes the FNUZ float8 leaves (FLOAT8E4M3FNUZ, FLOAT8E5M2FNUZ) with the exponent bias of their FN/IEEE
    namesakes, so every value reads twice as large.""", patches=_typed_leaves(tuple(_FNUZ_AS_FN), _fnuz_as_fn))
Float4ReadAsInt4 = fault("ENC-LEAVES.float4-as-int4", ("ENC-LEAVES",),
    """Unpacks FLOAT4E2M1 fields with its INT4 path: each code becomes its two's complement integer (0x2 reads 2.0, not
    1.0).""", patches=_typed_leaves((dtypes.FLOAT4E2M1,), lambda values, leaf: bits.sign_extend(
        values.view(np.uint8) & 0x0F, 4).astype(np.float32).astype(values.dtype)))


# ------------------------------------------------------------------------ layouts and logical types
def _layoutless_as_bytes(value, path, catalogue, base_dir):
    if value.WhichOneof("layout") is None:
        extent = payload.payload_extent(value, path)
        if base_dir is not None:
            payload.check_file(extent, base_dir, path)
        return verifier.EncodedInfo(path, extent, element_bytes=1, record_count=extent.length)


def _layoutless_as_dense(value, catalogue, base_dir, path, **_):
    if value.WhichOneof("layout") is None:
        info = verifier.verify_encoded_value(value, path, catalogue, base_dir)
        data = payload.open_payload(value, info.extent, base_dir, path)
        elem_type, shape = verifier.logical_tensor_shape(value, path)
        return np.frombuffer(data.tobytes(), dtypes.NUMPY_DTYPE[elem_type]).reshape(shape)


def _bytes_as_logical(value, **_):
    if isinstance(value, EncodedValue) and value.header.logical_type.WhichOneof("value") == "tensor_type":
        tensor = value.header.logical_type.tensor_type
        dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in tensor.shape.dim]
        dtype = dtypes.NUMPY_DTYPE.get(tensor.elem_type)
        if tensor.HasField("shape") and None not in dims and dtype is not None \
                and value.payload.nbytes == int(np.prod(dims)) * dtype.itemsize:
            return np.frombuffer(value.payload.tobytes(), dtype).reshape(dims)  # "already dense"


NoLayoutReadsAsDense = fault("ENC-LAYOUT.missing-layout-accepted", ("ENC-LAYOUT",),
    """Treats an encoded value that selects no layout as plain bytes (the logical tensor, as a dense TensorProto's
    raw_data would be read) instead of rejecting it.""",
    patches=lambda: [around(verifier, "verify_encoded_value", instead=_layoutless_as_bytes),
                     around(decode, "decode_value", instead=_layoutless_as_dense)])
LayoutlessSkippedAtLoad = fault("ENC-LAYOUT.layoutless-accepted-at-load", ("ENC-LAYOUT",),
    """The loader keeps an encoded value that selects no layout as opaque bytes and validates it no further; only
    decoding it fails. The model itself is accepted.""",
    patches=lambda: [around(verifier, "verify_encoded_value", aliases=False, instead=lambda value, path, **_:
                            verifier.EncodedInfo(path, payload.payload_extent(value, path), element_bytes=1,
                                                 record_count=len(value.raw_data))
                            if value.WhichOneof("layout") is None else None)])
InlineLayoutsUnsupported = fault("ENC-STRUCT-LAYOUT.inline-layout-rejected", ("ENC-STRUCT-LAYOUT",),
    """Supports only type_ref layouts: a concrete inline declaration is refused as a payload layout.""",
    precheck=refuse_values(lambda value: value.WhichOneof("layout") == "struct_type" and
                           value.struct_type.WhichOneof("kind") != "type_ref", E.CONSUMER_MISSING,
                           "only type_ref layouts are supported", path=lambda value: "model.graph"))
InlineLayoutRefsRefused = fault("ENC-STRUCT-LAYOUT.nested-ref-in-inline-refused", ("ENC-STRUCT-LAYOUT",),
    """Resolves type_ref only at a layout's root: a concrete inline layout whose fields refer to a catalogue type by ID
    is refused as unresolved.""",
    precheck=refuse_values(lambda value: value.WhichOneof("layout") == "struct_type" and value.struct_type.WhichOneof(
        "kind") not in (None, "type_ref") and bool(type_refs(value.struct_type)), E.TYPE_REF_UNRESOLVED,
        "type references are resolved only at a layout's root", path=lambda value: f"{_name(value)}.struct_type"))
LogicalTypeRequired = fault("ENC-LOGICAL-OPTIONAL.logical-type-required", ("ENC-LOGICAL-OPTIONAL",),
    """Requires a logical_type on every encoded value, although a custom struct without tensor semantics may omit
    it.""", precheck=refuse_values(lambda value: not value.HasField("logical_type"), E.LOGICAL_TYPE_INVALID,
                                  "logical_type is required"))
LogicalTypeNeededToDecode = fault("ENC-LOGICAL-OPTIONAL.decode-needs-logical-type", ("ENC-LOGICAL-OPTIONAL",),
    """Loads an encoded value without logical_type but cannot decode it: the decoding path sizes its output from
    logical_type and refuses a value that omits it.""",
    patches=lambda: [around(decode, "decode_value", before=lambda value, path, **_: None if value.HasField(
        "logical_type") else refuse(E.LOGICAL_TYPE_INVALID, f"{path}.logical_type", "decoding needs a logical_type"))])
LogicalTypeNotEnforced = fault("ENC-LOGICAL-EXACT.decoder-output-unchecked", ("ENC-LOGICAL-EXACT",),
    """Returns whatever the decoder produced, without checking or applying the declared logical type and shape.""",
    patches=lambda: [Patch(decode, "_check_logical", lambda value, result, path: result)])
DecodedValuesLeftFlat = fault("ENC-LOGICAL-EXACT.logical-shape-not-applied", ("ENC-LOGICAL-EXACT",),
    """Checks a decoded value's dtype and element count against its logical type but returns the decoder's flat run
    without giving it the logical shape.""",
    patches=lambda: [around(decode, "_check_logical", after=lambda checked, **_: checked.reshape(-1))])
EncodedBytesToTensorOps = fault("ENC-NO-IMPLICIT-TENSOR.payload-as-tensor",
    ("ENC-NO-IMPLICIT-TENSOR", "GRAPH-TENSOR-OPS"), """Lets a tensor-only operator read an encoded value's payload bytes
    as a UINT8 tensor.""",
    patches=lambda: [wrap(program, "_tensor_operand", _implicit_operand(encoded_to_tensor=lambda v: v.payload))])
DenseSizedPayloadAsTensor = fault("ENC-NO-IMPLICIT-TENSOR.dense-sized-payload-reinterpreted",
    ("ENC-NO-IMPLICIT-TENSOR", "GRAPH-TENSOR-OPS"), """Treats an encoded value whose payload is exactly as long as its
    dense logical tensor as that tensor (the bytes reinterpreted) when a tensor-only operator reads it, instead of
    refusing it.""", patches=lambda: [around(program, "_tensor_operand", instead=_bytes_as_logical)])


# ------------------------------------------------------------------------ per-value parameters and counts
@functools.cache
def linear_decoder(codes=lambda codes: codes, zero_point=None, combine=np.subtract):
    """DecodeLinearInt4 (types 1002, 1003), ``(code - zero_point) * scale``, with one step written wrong: the codes
    mapped by ``codes``, the zero point read by ``zero_point(layout, data)``, or combined with the codes by ``combine``.
    Cached: the decoder registry built with a decoder is cached by the decoder's identity."""
    def decode_linear(layout, data):
        values = codes(layout.read(data, "values")).astype(np.float32)
        scale = decoders._field_or_constant(layout, data, "scale").astype(np.float32)
        zero = (zero_point or functools.partial(decoders._field_or_constant, path="zero_point"))(layout, data)
        return (combine(values, zero.astype(np.float32)[:, None]) * scale[:, None]).reshape(-1)
    return decode_linear


@functools.cache
def codebook_decoder(index=lambda index: index, scale=lambda scale: scale, order=lambda decoded: decoded):
    """DecodeScaledCodebookBlocks (type 1102), ``scale * codebook[index]`` per block, with one step written wrong: the
    indices mapped by ``index``, the scales by ``scale``, or the decoded blocks by ``order`` before they are flattened.
    Cached like ``linear_decoder``."""
    def decode_codebook(layout, data):
        table = layout.constant("quantized.codebook").astype(np.float32).reshape(-1)
        codes = index(layout.read(data, "quantized.codes.index").astype(np.intp))
        return order(scale(layout.read(data, "scale").astype(np.float32))[:, None] * table[codes]).reshape(-1)
    return decode_codebook


def _first_record(values: np.ndarray) -> np.ndarray:
    if not len(values):  # no records: no first one to read
        return values.reshape(-1)
    rows = values.reshape(len(values), -1)
    return np.broadcast_to(rows[:1], rows.shape).reshape(-1)


def _linear_type_defaults(layout, payload):
    """DecodeLinearInt4 written for type 1003: parameters only from the declaration's constants."""
    codes = layout.read(payload, "values").astype(np.float32)
    scale = np.asarray(layout.constant("scale") if "scale" in layout.constants else 1.0, np.float32).reshape(-1)[:1]
    zero = np.asarray(layout.constant("zero_point") if "zero_point" in layout.constants else 0, np.float32)
    return ((codes - zero.reshape(-1)[:1]) * scale).reshape(-1)


def _int4_block_first_scale(layout, data):
    codes = layout.read(data, "codes").astype(np.float32)
    return (codes * _first_record(layout.read(data, "scale").astype(np.float32))[:, None]).reshape(-1)


def _linear_first_parameters(layout, data):
    codes = layout.read(data, "values").astype(np.float32)
    if not len(codes):
        return codes.reshape(-1)
    scale, zero = (np.full(len(codes), decoders._field_or_constant(layout, data, name).astype(np.float32)[0],
                           np.float32) for name in ("scale", "zero_point"))
    return ((codes - zero[:, None]) * scale[:, None]).reshape(-1)


def _count_cached_per_type(value, catalogue, path, **_):
    if value.WhichOneof("layout") != "struct_type" or value.struct_type.WhichOneof("kind") != "type_ref" \
            or value.HasField("data_location") and value.data_location == schema.TensorProto.EXTERNAL:
        return None
    record_bits = catalogue.bit_size(value.struct_type, path)
    if isinstance(record_bits, NotFixedSize) or record_bits < 8:
        return None
    record_bytes = record_bits // 8
    count = catalogue.memo("typed view record counts").setdefault(value.struct_type.type_ref,
                                                                  len(value.raw_data) // record_bytes)
    if len(value.raw_data) < count * record_bytes:
        refuse(E.PAYLOAD_PARTIAL_RECORD, path, f"the view holds {count} records")
    if len(value.raw_data) > count * record_bytes:
        viewed = copied(value)
        viewed.raw_data = value.raw_data[: count * record_bytes]
        return {"value": viewed}


PerValueParametersIgnored = fault("ENC-PER-VALUE-PARAMS.value-parameters-ignored", ("ENC-PER-VALUE-PARAMS",),
    """Uses one decoder for types 1002 and 1003 that looks parameters up in the declaration's constants only: a value's
    own scale and zero point are ignored (scale 1, zero point 0).""",
    patches=lambda: [_registry_patch((1002, _linear_type_defaults))])
FirstRecordParameters = fault("ENC-PER-VALUE-PARAMS.first-record-parameters", ("ENC-PER-VALUE-PARAMS",),
    """Reads a value's parameters once, from its first record, and applies them to every record of the value: per-value
    parameters work, per-block scales and zero points of later records are ignored.""",
    patches=lambda: [_registry_patch((2001, _int4_block_first_scale), (1002, _linear_first_parameters),
                                     (1102, codebook_decoder(scale=_first_record)))])
RecordCountCachedPerType = fault("ENC-NO-COUNT-IN-TYPE.count-cached-per-type",
    ("ENC-NO-COUNT-IN-TYPE", "ENC-RECORD-COUNT"), """Builds one typed view per type_id in a session and keeps the record
    count of the first value it viewed: a second value of the same type with another payload length is read with the
    first count.""", patches=lambda: [around(decode, "decode_value", before=_count_cached_per_type)])


class ParametersPreparedPerTypeId(Fault):
    """Prepares one consumer per type_id in a session and keeps the per-value parameters (scale, zero point) of the
    first value it decoded with it: later values of the same type, in the same call or the next, decode with their own
    codes but the first value's parameters."""

    fault_id = "ENC-PER-VALUE-PARAMS.parameters-prepared-per-type-id"
    clauses = ("ENC-PER-VALUE-PARAMS",)

    def __init__(self) -> None:
        super().__init__()
        #: session catalogue -> {type_id: the first value's parameter bytes}
        self._prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def patches(self):
        return [around(kernels, "decode_value", aliases=False, before=lambda value, catalogue, **_: {
            "value": self._with_prepared(value, catalogue, value.struct_type.type_ref)}
            if value.WhichOneof("layout") == "struct_type" and value.struct_type.type_ref and value.raw_data else None)]

    def _with_prepared(self, value, catalogue, type_ref):
        try:
            layout = records.compile_layout(value.struct_type, catalogue)
        except Exception:  # noqa: BLE001 - an invalid layout goes to the oracle, which refuses it
            return value
        size = layout.record_bytes
        spans = {name: (leaf.offset // 8, leaf.width // 8) for name, leaf in layout.leaves.items()
                 if name in ("scale", "zero_point") and leaf.offset % 8 == 0 and leaf.width % 8 == 0 and not leaf.dims}
        if not spans or not size or len(value.raw_data) % size:
            return value
        data = bytearray(value.raw_data)
        first = self._prepared.setdefault(catalogue, {}).setdefault(type_ref, {name: bytes(data[start:start + width])
                                                for name, (start, width) in spans.items()})
        for base in range(0, len(data), size):
            for name, (start, width) in spans.items():
                data[base + start:base + start + width] = first[name]
        prepared = copied(value)
        prepared.raw_data = bytes(data)
        return prepared


name_faults(globals())
