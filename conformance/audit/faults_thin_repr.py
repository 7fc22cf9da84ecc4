"""Second faults for representation and payload clauses that had only one: each a bug built differently
from the existing one (one path only, one spelling only, one field read from the wrong place)."""

from __future__ import annotations

import contextlib
import os
import stat
import weakref

import numpy as np

from conformance.audit.fault import INSTALLER, Fault, FaultState, Patch, encoded_values, type_refs, wrap
from conformance.audit.fault import decode_module as decode
from conformance.audit.faults_payload import pad_records
from conformance.audit.faults_structured import _registry_patch
from conformance.values import Struct
from reference_impl import affine, decoders, dtypes, payload, records, verifier
from reference_impl.bits import pack_sub_byte, unpack_sub_byte
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.executor import kernels, program
from reference_impl.values import EncodedValue

_EXTERNAL = payload.EXTERNAL


def _affine_values(model):
    return [value for value in encoded_values(model) if value.WhichOneof("layout") == "affine"]


def _name(value) -> str:
    return f"model.graph.encoded_initializer[{value.name!r}]"


# ------------------------------------------------------------------------------- affine logical type
class OptionalLogicalUnwrapped(Fault):
    """Unwraps an optional or sequence logical type to the tensor type inside it (the way its graph
    inputs are handled) instead of requiring the affine branch's logical_type to be a tensor type."""

    fault_id = "AFF-LOGICAL.wrapped-tensor-unwrapped"
    clauses = ("AFF-LOGICAL",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            logical = value.logical_type
            while logical.WhichOneof("value") in ("optional_type", "sequence_type"):
                inner = logical.optional_type.elem_type if logical.HasField("optional_type") \
                    else logical.sequence_type.elem_type
                copy = type(inner)()
                copy.CopyFrom(inner)
                logical.CopyFrom(copy)


class SymbolicDimsAsOne(Fault):
    """Reads a symbolic or unset logical dimension as 1 (the broadcast default of its shape code) instead
    of refusing an affine logical type that is not concrete."""

    fault_id = "AFF-LOGICAL.symbolic-dims-as-one"
    clauses = ("AFF-LOGICAL",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            if value.logical_type.WhichOneof("value") != "tensor_type":
                continue
            for dim in value.logical_type.tensor_type.shape.dim:
                if dim.WhichOneof("value") != "dim_value":
                    dim.dim_value = 1


# ------------------------------------------------------------------------------- affine row-major codes
def _rows_byte_aligned(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, **kw):
        width = dtypes.BIT_WIDTH[storage_type]
        if width < 8 and len(shape) > 1 and shape[-1] and (shape[-1] * width) % 8:
            rows, cols = int(np.prod(shape[:-1])), shape[-1]
            stride = (cols * width + 7) // 8
            raw = np.frombuffer(bytes(codes), np.uint8)
            padded = np.zeros(rows * stride, np.uint8)  # reads past the tight payload see zeros
            padded[: min(len(raw), len(padded))] = raw[: len(padded)]
            flat = np.concatenate([unpack_sub_byte(row, width, cols, signed=False)
                                   for row in padded.reshape(rows, stride)])
            codes = pack_sub_byte(flat, width)
        return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, **kw)
    return dequantize


class RowsByteAligned(Fault):
    """Unpacks four- and two-bit codes row by row, each row starting on a fresh byte (a row stride of
    ceil(columns * bits / 8)), instead of one tight row-major run over the whole tensor."""

    fault_id = "AFF-ROW-MAJOR.rows-byte-aligned"
    clauses = ("AFF-ROW-MAJOR",)
    boundary = True

    def patches(self):
        return [wrap(affine, "dequantize", _rows_byte_aligned)]


def _blocked_rows_transposed(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, **kw):
        if block_size is not None and axis == 0 and len(shape) == 2:
            width = dtypes.BIT_WIDTH[storage_type]
            count = int(np.prod(shape))
            raw = np.frombuffer(bytes(codes), np.uint8)
            flat = raw[:count] if width == 8 else unpack_sub_byte(raw, width, count, signed=False)
            flat = flat.reshape(shape[1], shape[0]).T.reshape(-1)  # stored as (columns, rows)
            codes = flat.tobytes() if width == 8 else pack_sub_byte(flat, width)
        return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, **kw)
    return dequantize


class BlockedAlongRowsTransposed(Fault):
    """For blocks along axis 0 of a matrix, reads the codes in a weight-kernel layout where each column's
    blocks are contiguous (column-major), as a MatMulNBits-style packer stores them; other paths stay
    row-major."""

    fault_id = "AFF-ROW-MAJOR.blocked-axis0-column-major"
    clauses = ("AFF-ROW-MAJOR",)

    def patches(self):
        return [wrap(affine, "dequantize", _blocked_rows_transposed)]


# ------------------------------------------------------------------------------- affine storage types
class E8M0StorageAccepted(Fault):
    """Checks the storage type as 'an 8-bit or narrower type that is not floating' against a list of
    floating types that predates FLOAT8E8M0: E8M0 storage passes and its codes are read as UINT8."""

    fault_id = "AFF-STORAGE.e8m0-accepted"
    clauses = ("AFF-STORAGE",)

    def transform(self, model, base_dir):
        for value in _affine_values(model):
            if value.affine.storage_type == dtypes.FLOAT8E8M0:
                value.affine.storage_type = dtypes.UINT8
                if value.affine.HasField("zero_point") and value.affine.zero_point.data_type == dtypes.FLOAT8E8M0:
                    value.affine.zero_point.data_type = dtypes.UINT8


class TwoBitStorageRefused(Fault):
    """Supports only the storage types of the ONNX release it was built against: INT2 and UINT2 are
    refused as storage types."""

    fault_id = "AFF-STORAGE.two-bit-refused"
    clauses = ("AFF-STORAGE",)

    def precheck(self, model, base_dir):
        for value in _affine_values(model):
            if value.affine.storage_type in (dtypes.INT2, dtypes.UINT2):
                raise violation(E.AFFINE_STORAGE_INVALID, f"{_name(value)}.affine.storage_type",
                                "INT2/UINT2 storage is not supported")


# ------------------------------------------------------------------------------- layouts
def _layoutless_skipped(original):
    def verify_encoded_value(value, path, catalogue, base_dir=None):
        if value.WhichOneof("layout") is None:  # no layout: kept as opaque bytes, never validated
            return verifier.EncodedInfo(path, payload.payload_extent(value, path), element_bytes=1,
                                        record_count=len(value.raw_data))
        return original(value, path, catalogue, base_dir)
    return verify_encoded_value


class LayoutlessSkippedAtLoad(Fault):
    """The loader keeps an encoded value that selects no layout as opaque bytes and validates it no
    further; only decoding it fails. The model itself is accepted."""

    fault_id = "ENC-LAYOUT.layoutless-accepted-at-load"
    clauses = ("ENC-LAYOUT",)

    def patches(self):
        return [wrap(verifier, "verify_encoded_value", _layoutless_skipped, aliases=False)]


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


class DenseSizedPayloadAsTensor(Fault):
    """Treats an encoded value whose payload is exactly as long as its dense logical tensor as that tensor
    (the bytes reinterpreted) when a tensor-only operator reads it, instead of refusing it."""

    fault_id = "ENC-NO-IMPLICIT-TENSOR.dense-sized-payload-reinterpreted"
    clauses = ("ENC-NO-IMPLICIT-TENSOR", "GRAPH-TENSOR-OPS")

    def patches(self):
        return [wrap(program, "_tensor_operand", _bytes_as_logical)]


# ------------------------------------------------------------------------------- decoders
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


class FirstRecordParameters(Fault):
    """Reads a value's parameters once, from its first record, and applies them to every record of the
    value: per-value parameters work, per-block scales and zero points of later records are ignored."""

    fault_id = "ENC-PER-VALUE-PARAMS.first-record-parameters"
    clauses = ("ENC-PER-VALUE-PARAMS",)

    def patches(self):
        return [_registry_patch((2001, _int4_block_first_scale), (1002, _linear_first_parameters),
                                (1102, _codebook_first_scale))]


def _codebook_index_major(layout, data):
    table = layout.constant("quantized.codebook").astype(np.float32).reshape(-1)
    index = layout.read(data, "quantized.codes.index").astype(np.intp)
    scale = layout.read(data, "scale").astype(np.float32)
    return (scale[:, None] * table[index]).T.reshape(-1)  # output[i * blocks + block]


class CodebookBlocksInterleaved(Fault):
    """DecodeScaledCodebookBlocks writes element i of block b at ``i * blocks + b`` (index-major) instead
    of flattening the decoded blocks in storage order (``b * 32 + i``)."""

    fault_id = "EX-CODEBOOK.blocks-interleaved"
    clauses = ("EX-CODEBOOK",)

    def patches(self):
        return [_registry_patch((1102, _codebook_index_major))]


def _linear_unsigned_codes(layout, data):
    codes = layout.read(data, "values").astype(np.int64)
    codes = np.where(codes < 0, codes + 16, codes).astype(np.float32)  # INT4 read as UINT4
    scale = decoders._field_or_constant(layout, data, "scale").astype(np.float32)
    zero = decoders._field_or_constant(layout, data, "zero_point").astype(np.float32)
    return ((codes - zero[:, None]) * scale[:, None]).reshape(-1)


class LinearCodesUnsigned(Fault):
    """DecodeLinearInt4 reads the INT4 ``values`` as unsigned nibbles (0..15) instead of signed codes."""

    fault_id = "EX-LINEAR-INT4.codes-unsigned"
    clauses = ("EX-LINEAR-INT4",)

    def patches(self):
        return [_registry_patch((1002, _linear_unsigned_codes), (1003, _linear_unsigned_codes))]


def _linear_constant_zero_point_dropped(layout, data):
    codes = layout.read(data, "values").astype(np.float32)
    scale = decoders._field_or_constant(layout, data, "scale").astype(np.float32)
    if "zero_point" in layout.leaves:
        zero = layout.read(data, "zero_point").reshape(-1).astype(np.float32)
    else:
        zero = np.zeros(1, np.float32)  # only a per-value zero point is looked for
    return ((codes - zero[:, None]) * scale[:, None]).reshape(-1)


class LinearConstantZeroPointDropped(Fault):
    """DecodeLinearInt4 looks for the zero point only in the record: a zero point declared as the type's
    constant (type 1003's -2) is taken as 0, while a constant scale is applied."""

    fault_id = "EX-LINEAR-INT4.constant-zero-point-dropped"
    clauses = ("EX-LINEAR-INT4",)

    def patches(self):
        return [_registry_patch((1002, _linear_constant_zero_point_dropped),
                                (1003, _linear_constant_zero_point_dropped))]


# ------------------------------------------------------------------------------- payload fields
class RawDataWinsOverExternal(Fault):
    """Reads raw_data whenever it is non-empty and ignores external_data and the location flag, instead of
    rejecting a value that carries both."""

    fault_id = "PAY-EXCLUSIVE.raw-data-wins"
    clauses = ("PAY-EXCLUSIVE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if value.raw_data and len(value.external_data):
                value.ClearField("external_data")
                value.ClearField("data_location")


class ExclusiveOnlyWhenExternal(Fault):
    """Checks raw_data against external_data only on the EXTERNAL branch: a value left at the default
    location reads its raw_data and ignores the external_data entries next to it."""

    fault_id = "PAY-EXCLUSIVE.checked-on-external-branch-only"
    clauses = ("PAY-EXCLUSIVE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if value.data_location != _EXTERNAL and value.HasField("raw_data") and len(value.external_data):
                value.ClearField("external_data")


class ExplicitDefaultReadAsExternal(Fault):
    """Decides the payload location by whether data_location is present, not by its value: a value that
    spells out ``data_location: DEFAULT`` is read as external (and, having no external_data, refused)."""

    fault_id = "PAY-DEFAULT-INLINE.explicit-default-read-as-external"
    clauses = ("PAY-DEFAULT-INLINE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if value.HasField("data_location") and value.data_location != _EXTERNAL:
                value.data_location = _EXTERNAL


# ------------------------------------------------------------------------------- external containment
def _leading_parent_only(location, path):
    normalized = location.replace("\\", "/")
    if normalized.startswith("/") or normalized.startswith("../") or normalized == "..":
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} escapes the model directory")
    if "\x00" in location or normalized[1:2] == ":":
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} is not a relative path")
    if normalized.rstrip("/") in ("", "."):
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} names no file")


def _joined_open(extent, base_dir, path):
    """The backing file opened at base_dir joined with the location (the OS resolves '..' and links)."""
    if base_dir is None:
        raise violation(E.EXTERNAL_FILE_INVALID, path, "external payload needs a base directory to resolve")
    target = os.path.join(os.fspath(base_dir), extent.location.replace("\\", "/"))
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as err:
        raise violation(E.EXTERNAL_FILE_INVALID, path, f"backing file {extent.location!r} cannot be opened: {err}") \
            from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size < extent.offset + extent.length:
        os.close(fd)
        raise violation(E.EXTERNAL_FILE_INVALID, path, "backing file is not a regular file covering offset + length")
    return fd


class OnlyLeadingParentRefused(Fault):
    """Refuses a location that starts with '..' or '/', but lets the operating system resolve a '..'
    further in ('weights/../../secret.bin' escapes)."""

    fault_id = "PAY-EXTERNAL-CONTAINED.only-leading-parent-refused"
    clauses = ("PAY-EXTERNAL-CONTAINED",)

    def patches(self):
        return [Patch(payload, "check_location", _leading_parent_only), Patch(payload, "open_external", _joined_open)]


class SymlinksFollowed(Fault):
    """Checks the location's spelling (relative, no '..') but opens it by joining it to the model
    directory, so a symbolic link inside the directory leads wherever it points."""

    fault_id = "PAY-EXTERNAL-CONTAINED.symlinks-followed"
    clauses = ("PAY-EXTERNAL-CONTAINED",)
    pending = ("a case whose model directory holds a symbolic link to a file outside it (the case format "
               "writes regular files only)")

    def patches(self):
        return [Patch(payload, "open_external", _joined_open)]


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


# ------------------------------------------------------------------------------- validation order
def _whole_records_only(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value", **kw):
        if value.WhichOneof("layout") == "struct_type" and value.raw_data:
            try:
                size = catalogue.bit_size(value.struct_type, path)
            except Exception:  # noqa: BLE001 - a layout that cannot be sized goes to the full check
                size = None
            if isinstance(size, int) and size and size % 8 == 0 and len(value.raw_data) % (size // 8):
                whole = type(value)()
                whole.CopyFrom(value)
                whole.raw_data = value.raw_data[: len(value.raw_data) - len(value.raw_data) % (size // 8)]
                value = whole  # the kernel trusts the load to have checked bounds, and reads whole records
        return original(value, catalogue, base_dir, registry, path, **kw)
    return decode_value


class DecodeKernelTrustsFeeds(Fault):
    """Checks payload bounds when a model's encoded initializers are loaded, but the Decode kernel assumes
    every value reaching it was checked there: a fed or retained encoded value with a partial trailing
    record is handed to the decoder, which reads the whole records and drops the rest."""

    fault_id = "PAY-VALIDATE-FIRST.decode-kernel-trusts-feeds"
    clauses = ("PAY-VALIDATE-FIRST",)

    def patches(self):
        return [wrap(kernels, "decode_value", _whole_records_only, aliases=False)]


# ------------------------------------------------------------------------------- saved records
class TailAlignedRecordsSaved(Fault):
    """Saves each struct record as its native struct would be laid out in memory: tail-padded to the
    alignment of its widest scalar leaf (a record holding an INT64 grows to a multiple of eight bytes),
    instead of the tight serialized record."""

    fault_id = "PAY-NO-POINTERS.tail-aligned-records-saved"
    clauses = ("PAY-NO-POINTERS",)

    def on_save(self, model):
        try:
            verified = verifier.verify_model(model)
        except Exception:  # noqa: BLE001 - a model the oracle refuses is saved as it is
            return
        for value in model.graph.encoded_initializer:
            info = verified.encoded.get(value.name)
            if info is None or not info.element_bytes or not value.raw_data or \
                    value.WhichOneof("layout") != "struct_type":
                continue
            layout = records.compile_layout(value.struct_type, verified.catalogue)
            align = max([1] + [leaf.width // 8 for leaf in layout.leaves.values() if leaf.elem_type is not None])
            size = info.element_bytes
            padded = -(-size // align) * align
            if padded != size:
                value.raw_data = pad_records(value.raw_data, size, padded)


# ------------------------------------------------------------------------------- resource limits
def _per_structure_leaf_bound(original):
    def add_leaf(layout, leaf, path):
        parent = leaf.path.rpartition(".")[0]
        counts = layout.__dict__.setdefault("_leaves_per_parent", {})
        counts[parent] = counts.get(parent, 0) + 1
        if counts[parent] > records.MAX_LEAVES:
            raise violation(E.RESOURCE_LIMIT, path, f"a structure has more than {records.MAX_LEAVES} fields")
        layout.leaves[leaf.path] = leaf
    return add_leaf


class LeafBoundPerStructure(Fault):
    """Bounds the number of fields of each structure it expands, not the leaves of the whole layout: two
    references to a structure at the bound give a layout of twice as many leaves, expanded in full."""

    fault_id = "RESOURCE-LIMITS.leaf-bound-per-structure"
    clauses = ("RESOURCE-LIMITS",)

    def patches(self):
        return [wrap(records, "_add_leaf", _per_structure_leaf_bound)]


# ------------------------------------------------------------------------------- owners
def _decoded_from_file(original):
    def to_proto(self):
        if self.source is not None and len(self.source.external_data):
            return self.source  # the message as loaded: decoding opens the backing file by name again
        return original(self)
    return to_proto


class ExternalValuesReopenedByName(Fault):
    """Keeps an external encoded value as its message and opens the backing file by name whenever the
    value is decoded, instead of retaining the mapping it validated at load: a file removed or replaced
    after loading breaks (or changes) values the runtime still holds."""

    fault_id = "PAY-EXTERNAL-OWNER.reopened-by-name"
    clauses = ("PAY-EXTERNAL-OWNER",)

    def patches(self):
        return [wrap(EncodedValue, "to_proto", _decoded_from_file)]


class _BorrowingResetState(FaultState):
    """A state whose reset takes the new initial structs the way FirstFieldOwnerOnly takes them at open."""

    def reset(self, initial):
        return super().reset({name: self.fault._borrowed(value) for name, value in initial.items()})


class FirstFieldOwnerOnly(Fault):
    """Retains one owner per struct, its first field's: the other fields of an initial struct are held as
    views into the call's scratch memory, which is reused (reads zeros) once the call that took them
    returns, instead of each field keeping its own owner."""

    fault_id = "PAY-FIELD-OWNERS.first-field-owner-only"
    clauses = ("PAY-FIELD-OWNERS",)

    def __init__(self) -> None:
        super().__init__()
        self._scratch: list[bytearray] = []

    def _borrowed(self, value):
        if not isinstance(value, Struct):
            return value
        fields = dict(value)
        for name in list(fields)[1:]:
            item = fields[name]
            if isinstance(item, np.ndarray) and item.dtype.kind not in "OUS" and item.size:
                scratch = bytearray(np.ascontiguousarray(item).tobytes())
                self._scratch.append(scratch)
                fields[name] = np.frombuffer(scratch, item.dtype).reshape(item.shape)
        return Struct(fields, value.type_id)

    def open_state(self, model_bytes, initial, base_dir=None):
        initial = {name: self._borrowed(value) for name, value in initial.items()}
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _BorrowingResetState(handle.state, self)

    @contextlib.contextmanager
    def injected(self):
        with super().injected():
            yield
        if INSTALLER.idle:  # the call that took the fields returned: its scratch is reused
            for scratch in self._scratch:
                scratch[:] = bytes(len(scratch))
            self._scratch.clear()


__all__ = [name for name, obj in globals().items() if isinstance(obj, type) and issubclass(obj, Fault)
           and obj is not Fault]
