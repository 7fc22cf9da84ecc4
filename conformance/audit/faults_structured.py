"""Faults in decoding struct layouts: record counts and bit positions, registered decoders keyed by
type_id, logical types, and the consumers that must stand between encoded or struct values and
tensor-only operators."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from conformance.audit.fault import Fault, Patch, encoded_values, wrap
from conformance.audit.fault import decode_module as decode
from reference_impl import decoders, dtypes, payload, records, verifier
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import program
from reference_impl.values import EncodedValue, StructValue


@functools.cache
def _with_decoders(replacements: tuple) -> decoders.DecoderRegistry:
    """The default registry with the decode functions of some type IDs replaced (same registrations).
    Built once per replacement set, while no fault is installed."""
    registry = decoders.default_registry()
    for type_id, decode_fn in replacements:
        registry._decoders[type_id] = dataclasses.replace(registry._decoders[type_id], decode=decode_fn)
    return registry


def _registry_patch(*replacements: tuple[int, object]) -> Patch:
    """The default decoder registry, with some decoders replaced, as the one ``decode`` uses."""
    registry = _with_decoders(tuple(replacements))
    return Patch(decode, "_registry", lambda given=None: given if given is not None else registry)


# ------------------------------------------------------------------------------- layouts, records
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


class NoLayoutReadsAsDense(Fault):
    """Treats an encoded value that selects no layout as plain bytes (the logical tensor, as a dense
    TensorProto's raw_data would be read) instead of rejecting it."""

    fault_id = "ENC-LAYOUT.missing-layout-accepted"
    clauses = ("ENC-LAYOUT",)

    def patches(self):
        return [wrap(verifier, "verify_encoded_value", _layoutless_as_bytes),
                wrap(decode, "decode_value", _layoutless_as_dense)]


def _expands_every_path(original):
    def compile_layout(st, catalogue, path="layout"):
        try:
            return original(st, catalogue, path)
        except ContractError as error:
            if error.code is not E.RESOURCE_LIMIT or "leaves" in error.message:
                raise
            # Bounding leaves only, the runtime goes on expanding every path to the constants (4**15 of
            # them in the suite's diamond) until memory runs out: what it shows, without the wait.
            raise MemoryError(f"{path}: layout expansion exhausted memory") from None
    return compile_layout


class LayoutPathsUnbounded(Fault):
    """Bounds a layout's leaves but neither its constants nor the type nodes it visits: a constant-only
    group reached through exponentially many reference paths (a diamond) is expanded path by path until
    memory runs out, instead of being refused with RESOURCE_LIMIT before anything is allocated."""

    fault_id = "RESOURCE-LIMITS.layout-paths-unbounded"
    clauses = ("RESOURCE-LIMITS",)

    def patches(self):
        return [wrap(records, "compile_layout", _expands_every_path)]


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


class PartialRecordsTruncated(Fault):
    """Counts records with a floor division and silently ignores a trailing partial record."""

    fault_id = "ENC-RECORD-COUNT.partial-record-ignored"
    clauses = ("ENC-RECORD-COUNT",)

    def patches(self):
        return [wrap(verifier, "_verify_struct_layout", _truncating)]


def _drop_last_record(original):
    def read_leaf(payload, record_bits, leaf):
        record_bytes = record_bits // 8
        if record_bytes and len(payload) >= 2 * record_bytes:
            payload = payload[: len(payload) - len(payload) % record_bytes - record_bytes]
        return original(payload, record_bits, leaf)
    return read_leaf


class LastRecordDropped(Fault):
    """Loops over records with an off-by-one bound: the last record of a multi-record payload is never
    read."""

    fault_id = "ENC-RECORD-COUNT.last-record-dropped"
    clauses = ("ENC-RECORD-COUNT",)
    boundary = True

    def patches(self):
        return [wrap(records, "read_leaf", _drop_last_record)]


def _one_record(original):
    def verify_struct_layout(value, path, extent, catalogue):
        info = original(value, path, extent, catalogue)
        if info.record_count != 1:
            raise violation(E.PAYLOAD_PARTIAL_RECORD, path,
                            f"{extent.length} bytes are not one {info.element_bytes}-byte element of the type")
        return info
    return verify_struct_layout


class TypeIsOneRecord(Fault):
    """Takes the struct type as the layout of the whole value: a payload must hold exactly one record,
    so the same type cannot describe payloads of other lengths."""

    fault_id = "ENC-NO-COUNT-IN-TYPE.exactly-one-record"
    clauses = ("ENC-NO-COUNT-IN-TYPE",)

    def patches(self):
        return [wrap(verifier, "_verify_struct_layout", _one_record)]


def _big_endian(original):
    def read_leaf(payload, record_bits, leaf):
        values = original(payload, record_bits, leaf)
        if leaf.elem_type is not None and leaf.width in (16, 32, 64) and values.dtype.kind in "iuf":
            return values.byteswap()
        return values
    return read_leaf


class BigEndianScalars(Fault):
    """Reads multi-byte scalar fields big-endian (network order) instead of little-endian."""

    fault_id = "ENC-BIT-ORDER.big-endian-scalars"
    clauses = ("ENC-BIT-ORDER",)

    def patches(self):
        return [wrap(records, "read_leaf", _big_endian)]


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


class BitPackingMostSignificantFirst(Fault):
    """Places the first bit-packing component in the most-significant bits of its byte."""

    fault_id = "ENC-BIT-ORDER.components-msb-first"
    clauses = ("ENC-BIT-ORDER",)
    boundary = True

    def patches(self):
        return [wrap(records, "read_leaf", _msb_first_components)]


def _aligned_reads(original):
    def read_leaf(payload, record_bits, leaf):
        if leaf.width == 64 and leaf.offset % 64:
            leaf = dataclasses.replace(leaf, offset=leaf.offset - leaf.offset % 64)
        return original(payload, record_bits, leaf)
    return read_leaf


class AlignedInt64Reads(Fault):
    """Reads 64-bit fields with an aligned load: the offset is rounded down to a multiple of eight
    bytes, so an INT64 at byte 68 is read from byte 64."""

    fault_id = "ENC-UNALIGNED.aligned-loads"
    clauses = ("ENC-UNALIGNED",)

    def patches(self):
        return [wrap(records, "read_leaf", _aligned_reads)]


# ------------------------------------------------------------------------------------ decoders
class BindsWithoutVerifying(Fault):
    """Binds a registered decoder by type_id alone, without verifying the model's declaration of that
    ID against the one the decoder was written for."""

    fault_id = "DEC-KEYED.declaration-not-verified"
    clauses = ("DEC-KEYED",)

    def patches(self):
        def bind(registry, type_id, layout, path, declaration=None):
            found = registry._decoders.get(type_id)
            if found is None:
                raise violation(E.CONSUMER_MISSING, path, f"no decoder or registered consumer for type_id {type_id}")
            return found
        return [Patch(decoders.DecoderRegistry, "bind", bind)]


def _flat_leaves(layout: records.RecordLayout, payload: np.ndarray) -> np.ndarray:
    """Every leaf of every record, in layout order, as float32: a generic 'decoder'."""
    count = len(payload) // layout.record_bytes if layout.record_bytes else 0
    parts = [layout.read(payload, path).reshape(count, -1).astype(np.float32) for path in layout.leaves]
    return np.concatenate(parts, axis=1).reshape(-1) if parts and count else np.zeros(0, np.float32)


class FallbackDecoder(Fault):
    """Decodes a type_id nobody registered with a generic fallback (every field read as floats)
    instead of failing explicitly for the missing consumer."""

    fault_id = "DEC-MISSING.generic-fallback"
    clauses = ("DEC-MISSING",)

    def patches(self):
        def make(original):
            def bind(registry, type_id, layout, path, declaration=None):
                if type_id not in registry:
                    return decoders.Decoder("fallback", (), _flat_leaves)
                return original(registry, type_id, layout, path, declaration)
            return bind
        return [wrap(decoders.DecoderRegistry, "bind", make)]


class CodecBodiesLoaded(Fault):
    """Compiles the decoder and encoder bodies of every declaration when it loads the model, so a codec
    using an operator it does not have makes loading fail."""

    fault_id = "DEC-NO-LOAD-EXEC.codecs-compiled-at-load"
    clauses = ("DEC-NO-LOAD-EXEC",)

    def precheck(self, model, base_dir):
        for decl in model.struct_types:
            for codec in ("decoder", "encoder"):
                body = getattr(decl, codec)
                for node in body.node if decl.HasField(codec) else ():
                    if node.domain not in ("", "ai.onnx", "onnx_light"):
                        raise violation(E.OPERATOR_UNSUPPORTED, f"model.struct_types.{codec}",
                                        f"{node.domain}.{node.op_type} is not available")


#: type nodes the nested-codec walk visits at most (a diamond-shaped catalogue expands once per path)
_NESTED_WALK_LIMIT = 4096


def _nested_codecs(catalogue, st, prefix: str, path: str, found: list, budget: list) -> None:
    """The decoders that nested type_refs of ``st`` declare, as (field path prefix, type_id, decoder) in
    preorder (an enclosing type before the types inside it)."""
    budget[0] -= 1
    if budget[0] < 0:
        return
    kind = st.WhichOneof("kind")
    if kind == "type_ref":
        nested, _ = catalogue.lookup(st.type_ref, path)
        if nested.HasField("decoder"):
            found.append((prefix, st.type_ref, nested.decoder))
        _nested_codecs(catalogue, nested, prefix, path, found, budget)
    elif kind == "array" and st.array.element_type.WhichOneof("value") == "struct_type":
        _nested_codecs(catalogue, st.array.element_type.struct_type, prefix, path, found, budget)
    elif kind == "structure":
        for fld in st.structure.field:
            if fld.WhichOneof("content") == "type" and fld.type.WhichOneof("value") == "struct_type":
                name = f"{prefix}.{fld.name}" if prefix else fld.name
                _nested_codecs(catalogue, fld.type.struct_type, name, path, found, budget)


def _runnable(function) -> bool:
    """A codec body this runtime can execute: nodes of the standard domain only."""
    return len(function.node) > 0 and all(node.domain in ("", "ai.onnx") for node in function.node)


def _run_codec(function, values: np.ndarray, path: str) -> np.ndarray:
    """A subtype's decoder body run by onnx's reference evaluator on one leaf of every record."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    proto = onnx.FunctionProto.FromString(function.SerializeToString())
    try:
        return np.asarray(ReferenceEvaluator(proto).run(None, {proto.input[0]: values}, attributes={})[0])
    except Exception as error:  # noqa: BLE001 - a codec that fails to run fails the decode
        raise violation(E.EXECUTION_FAILED, path, f"decoder {function.name}: {error}") from None


class _ThroughSubtypeCodecs(records.RecordLayout):
    """A record layout whose leaf reads go through the decoders of the nested types the leaf lies in,
    innermost first: what the root's decoder reads is the subtypes' decoded output."""

    codecs: tuple = ()

    def read(self, payload, path):
        values = super().read(payload, path)
        for prefix, type_id, function in reversed(self.codecs):
            if path == prefix or path.startswith(prefix + "."):
                values = _run_codec(function, values, f"{path} (type {type_id})")
        return values


def _nested_decoders_first(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value", out=None):
        extra = {} if out is None else {"out": out}
        st = value.struct_type
        if value.WhichOneof("layout") != "struct_type" or st.WhichOneof("kind") != "type_ref":
            return original(value, catalogue, base_dir, registry, path, **extra)
        codecs: list = []
        _nested_codecs(catalogue, st, "", path, codecs, [_NESTED_WALK_LIMIT])
        codecs = [codec for codec in codecs if codec[0]]  # the root's own decoder is not nested
        if not codecs:
            return original(value, catalogue, base_dir, registry, path, **extra)
        for _, type_id, function in codecs:
            if not _runnable(function):
                raise violation(E.CONSUMER_MISSING, path, f"no decoder for nested type {type_id}")
        data = decode.payload_array(value, catalogue, base_dir, path)
        layout = records.compile_layout(st, catalogue, f"{path}.struct_type")
        declaration, _ = catalogue.lookup(st.type_ref, f"{path}.struct_type.type_ref")
        decoder = decode._registry(registry).bind(st.type_ref, layout, f"{path}.struct_type", declaration)
        through = _ThroughSubtypeCodecs(layout.record_bits, layout.leaves, layout.constants, layout.nodes_visited)
        through.codecs = tuple(codecs)
        result = decode._check_logical(value, decoder.decode(through, data), path)
        if out is None:
            return result
        np.copyto(out, result)
        return out
    return decode_value


class NestedDecodersInvoked(Fault):
    """Runs the decoders that nested type_refs declare: every field the root's decoder reads first goes
    through the decoders of the subtypes it lies in (their bodies run on the field's values, innermost
    first), and a subtype naming a decoder the runtime cannot run makes the whole value fail with
    CONSUMER_MISSING."""

    fault_id = "DEC-ROOT-ONLY.nested-decoders-invoked"
    clauses = ("DEC-ROOT-ONLY",)

    def patches(self):
        return [wrap(decode, "decode_value", _nested_decoders_first)]


def _guessing_inline(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value"):
        if value.WhichOneof("layout") == "struct_type" and value.struct_type.WhichOneof("kind") != "type_ref":
            payload = decode.payload_array(value, catalogue, base_dir, path)
            layout = records.compile_layout(value.struct_type, catalogue, f"{path}.struct_type")
            return decode._check_logical(value, _flat_leaves(layout, payload), path)
        return original(value, catalogue, base_dir, registry, path)
    return decode_value


class InlineLayoutsGuessed(Fault):
    """Decodes an inline custom layout by guessing (every field read as floats, concatenated) instead
    of requiring an explicit codec or generic field access."""

    fault_id = "DEC-INLINE-CODEC.inline-layout-guessed"
    clauses = ("DEC-INLINE-CODEC",)

    def patches(self):
        return [wrap(decode, "decode_value", _guessing_inline)]


class NoGenericFieldAccess(Fault):
    """Offers no generic field access: an inline layout's fields cannot be read at all."""

    fault_id = "DEC-INLINE-CODEC.no-field-access"
    clauses = ("DEC-INLINE-CODEC",)
    boundary = True

    def read_fields(self, model_bytes, value_name, base_dir):
        raise violation(E.CONSUMER_MISSING, value_name, "no decoder or consumer for this layout")


def _linear_type_defaults(layout, payload):
    """DecodeLinearInt4 written for type 1003: parameters only from the declaration's constants."""
    codes = layout.read(payload, "values").astype(np.float32)
    scale = np.asarray(layout.constant("scale") if "scale" in layout.constants else 1.0, np.float32).reshape(-1)[:1]
    zero = np.asarray(layout.constant("zero_point") if "zero_point" in layout.constants else 0, np.float32)
    return ((codes - zero.reshape(-1)[:1]) * scale).reshape(-1)


class PerValueParametersIgnored(Fault):
    """Uses one decoder for types 1002 and 1003 that looks parameters up in the declaration's constants
    only: a value's own scale and zero point are ignored (scale 1, zero point 0)."""

    fault_id = "ENC-PER-VALUE-PARAMS.value-parameters-ignored"
    clauses = ("ENC-PER-VALUE-PARAMS",)

    def patches(self):
        return [_registry_patch((1002, _linear_type_defaults))]


def _linear_plus_zero_point(layout, payload):
    codes = layout.read(payload, "values").astype(np.float32)
    scale = decoders._field_or_constant(layout, payload, "scale").astype(np.float32)
    zero_point = decoders._field_or_constant(layout, payload, "zero_point").astype(np.float32)
    return ((codes + zero_point[:, None]) * scale[:, None]).reshape(-1)


class LinearZeroPointAdded(Fault):
    """DecodeLinearInt4 adds the zero point, ``(code + zero_point) * scale``, instead of subtracting it."""

    fault_id = "EX-LINEAR-INT4.zero-point-added"
    clauses = ("EX-LINEAR-INT4",)

    def patches(self):
        return [_registry_patch((1002, _linear_plus_zero_point), (1003, _linear_plus_zero_point))]


def _codebook_msb_first(layout, payload):
    table = layout.constant("quantized.codebook").astype(np.float32).reshape(-1)
    index = layout.read(payload, "quantized.codes.index").astype(np.intp)
    index = index.reshape(*index.shape[:-1], index.shape[-1] // 4, 4)[..., ::-1].reshape(index.shape)
    scale = layout.read(payload, "scale").astype(np.float32)
    return (scale[:, None] * table[index]).reshape(-1)


class CodebookIndicesMsbFirst(Fault):
    """DecodeScaledCodebookBlocks takes the four 2-bit indices of each byte from the most-significant
    pair down, so E4 reads as indices 3, 2, 1, 0."""

    fault_id = "EX-CODEBOOK.indices-msb-first"
    clauses = ("EX-CODEBOOK",)

    def patches(self):
        return [_registry_patch((1102, _codebook_msb_first))]


class BlockRowsImposed(Fault):
    """Imposes its own block mapping instead of the registered decoder's: a struct-layout value must
    declare a two-dimensional logical shape of one row per record."""

    fault_id = "DEC-DEFINES-MAPPING.row-per-record-required"
    clauses = ("DEC-DEFINES-MAPPING",)

    def precheck(self, model, base_dir):
        for value in encoded_values(model):
            if value.WhichOneof("layout") == "struct_type" and value.HasField("logical_type") and \
                    value.logical_type.WhichOneof("value") == "tensor_type" and \
                    len(value.logical_type.tensor_type.shape.dim) != 2:
                raise violation(E.LOGICAL_SHAPE_MISMATCH, f"model.graph.encoded_initializer[{value.name!r}]",
                                "a block layout's logical shape is (records, elements per record)")


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


class LogicalTypeNotEnforced(Fault):
    """Returns whatever the decoder produced, without checking or applying the declared logical type
    and shape."""

    fault_id = "ENC-LOGICAL-EXACT.decoder-output-unchecked"
    clauses = ("ENC-LOGICAL-EXACT",)

    def patches(self):
        return [Patch(decode, "_check_logical", lambda value, result, path: result)]


# ------------------------------------------------------------------------ consumers of values
def _implicit_operand(struct_to_tensor=None, encoded_to_tensor=None):
    def make(original):
        def tensor_operand(value, op_type, path):
            if isinstance(value, StructValue) and struct_to_tensor is not None:
                return struct_to_tensor(value)
            if isinstance(value, EncodedValue) and encoded_to_tensor is not None:
                return encoded_to_tensor(value)
            return original(value, op_type, path)
        return tensor_operand
    return make


class StructFirstFieldToTensorOps(Fault):
    """Hands a struct reaching a tensor-only operator its first field, instead of refusing it without an
    explicit decoder or registered consumer."""

    fault_id = "GRAPH-TENSOR-OPS.first-field-passed"
    clauses = ("GRAPH-TENSOR-OPS",)

    def patches(self):
        return [wrap(program, "_tensor_operand", _implicit_operand(struct_to_tensor=lambda s: next(iter(s.values()))))]


class StructsFlattenedForTensorOps(Fault):
    """Flattens a struct graph input with no consumer into one tensor (its fields concatenated) when a
    tensor operator reads it, instead of failing explicitly."""

    fault_id = "DEC-MISSING-INPUT.struct-flattened"
    clauses = ("DEC-MISSING-INPUT",)

    def patches(self):
        flatten = lambda s: np.concatenate([np.asarray(v).reshape(-1) for v in s.values()])  # noqa: E731
        return [wrap(program, "_tensor_operand", _implicit_operand(struct_to_tensor=flatten))]


class EncodedBytesToTensorOps(Fault):
    """Lets a tensor-only operator read an encoded value's payload bytes as a UINT8 tensor."""

    fault_id = "ENC-NO-IMPLICIT-TENSOR.payload-as-tensor"
    clauses = ("ENC-NO-IMPLICIT-TENSOR", "GRAPH-TENSOR-OPS")

    def patches(self):
        return [wrap(program, "_tensor_operand", _implicit_operand(encoded_to_tensor=lambda v: v.payload))]
