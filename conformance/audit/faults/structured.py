"""Faults in structured values and their decoders and codecs, and the specification's worked examples."""

from __future__ import annotations

import dataclasses

import numpy as np

from conformance.audit.fault import Fault, Patch, decode_module, encoded_values, fault, name_faults, wrap
from conformance.audit.fault import decode_module as decode
from conformance.audit.faults.shared import _implicit_operand, _registry_patch
from reference_impl import decoders, dtypes, records, schema, structs
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels, program
from reference_impl.records import compile_layout
from reference_impl.structs import struct_kind
from reference_impl.values import EncodedValue


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


NestedDecodersInvoked = fault("DEC-ROOT-ONLY.nested-decoders-invoked", ("DEC-ROOT-ONLY",),
    """Runs the decoders that nested type_refs declare: every field the root's decoder reads first goes through the
    decoders of the subtypes it lies in (their bodies run on the field's values, innermost first), and a subtype naming
    a decoder the runtime cannot run makes the whole value fail with CONSUMER_MISSING.""",
    patches=lambda: [wrap(decode, "decode_value", _nested_decoders_first)])


def _guessing_inline(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value"):
        if value.WhichOneof("layout") == "struct_type" and value.struct_type.WhichOneof("kind") != "type_ref":
            payload = decode.payload_array(value, catalogue, base_dir, path)
            layout = records.compile_layout(value.struct_type, catalogue, f"{path}.struct_type")
            return decode._check_logical(value, _flat_leaves(layout, payload), path)
        return original(value, catalogue, base_dir, registry, path)
    return decode_value


InlineLayoutsGuessed = fault("DEC-INLINE-CODEC.inline-layout-guessed", ("DEC-INLINE-CODEC",),
    """Decodes an inline custom layout by guessing (every field read as floats, concatenated) instead of requiring an
    explicit codec or generic field access.""", patches=lambda: [wrap(decode, "decode_value", _guessing_inline)])


class NoGenericFieldAccess(Fault):
    """Offers no generic field access: an inline layout's fields cannot be read at all."""

    fault_id = "DEC-INLINE-CODEC.no-field-access"
    clauses = ("DEC-INLINE-CODEC",)
    boundary = True

    def read_fields(self, model_bytes, value_name, base_dir):
        raise violation(E.CONSUMER_MISSING, value_name, "no decoder or consumer for this layout")


def _linear_plus_zero_point(layout, payload):
    codes = layout.read(payload, "values").astype(np.float32)
    scale = decoders._field_or_constant(layout, payload, "scale").astype(np.float32)
    zero_point = decoders._field_or_constant(layout, payload, "zero_point").astype(np.float32)
    return ((codes + zero_point[:, None]) * scale[:, None]).reshape(-1)


LinearZeroPointAdded = fault("EX-LINEAR-INT4.zero-point-added", ("EX-LINEAR-INT4",),
    """DecodeLinearInt4 adds the zero point, ``(code + zero_point) * scale``, instead of subtracting it.""",
    patches=lambda: [_registry_patch((1002, _linear_plus_zero_point), (1003, _linear_plus_zero_point))])


def _codebook_msb_first(layout, payload):
    table = layout.constant("quantized.codebook").astype(np.float32).reshape(-1)
    index = layout.read(payload, "quantized.codes.index").astype(np.intp)
    index = index.reshape(*index.shape[:-1], index.shape[-1] // 4, 4)[..., ::-1].reshape(index.shape)
    scale = layout.read(payload, "scale").astype(np.float32)
    return (scale[:, None] * table[index]).reshape(-1)


CodebookIndicesMsbFirst = fault("EX-CODEBOOK.indices-msb-first", ("EX-CODEBOOK",),
    """DecodeScaledCodebookBlocks takes the four 2-bit indices of each byte from the most-significant pair down, so E4
    reads as indices 3, 2, 1, 0.""", patches=lambda: [_registry_patch((1102, _codebook_msb_first))])


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


class StructsFlattenedForTensorOps(Fault):
    """Flattens a struct graph input with no consumer into one tensor (its fields concatenated) when a
    tensor operator reads it, instead of failing explicitly."""

    fault_id = "DEC-MISSING-INPUT.struct-flattened"
    clauses = ("DEC-MISSING-INPUT",)

    def patches(self):
        flatten = lambda s: np.concatenate([np.asarray(v).reshape(-1) for v in s.values()])  # noqa: E731
        return [wrap(program, "_tensor_operand", _implicit_operand(struct_to_tensor=flatten))]


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


def _nested_constants_dropped(original):
    def read_fields(value, catalogue, base_dir=None, path="value"):
        fields = original(value, catalogue, base_dir, path)
        return {name: array for name, array in fields.items() if "." not in name or
                name in records.compile_layout(value.struct_type, catalogue, path).leaves}
    return read_fields


NestedConstantsNotExposed = fault("DEC-INLINE-CODEC.nested-constants-missing", ("DEC-INLINE-CODEC", "DEC-ROOT-ONLY"),
    """Generic field access lists the root declaration's own constants but not those a nested group contributes
    (``quantized.codebook`` of the codebook parent is missing).""",
    patches=lambda: [wrap(decode, "read_fields", _nested_constants_dropped)])


def _bytes_view(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value", **kwargs):
        try:
            return original(value, catalogue, base_dir, registry, path, **kwargs)
        except ContractError as error:
            logical = value.logical_type
            if error.code.value != "CONSUMER_MISSING" or logical.WhichOneof("value") != "tensor_type" \
                    or logical.tensor_type.elem_type != dtypes.UINT8:
                raise
            return np.array(decode_module.payload_array(value, catalogue, base_dir, path), dtype=np.uint8)
    return decode_value


MissingDecoderYieldsBytes = fault("DEC-MISSING.uint8-bytes-view", ("DEC-MISSING",),
    """A struct value nobody registered a decoder for, whose logical type is a UINT8 tensor, decodes to its payload
    bytes (a "bytes view" fallback for byte-typed values) instead of failing explicitly for the missing consumer; other
    logical types still fail.""", patches=lambda: [wrap(decode_module, "decode_value", _bytes_view)])


def _by_layout(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value", **kwargs):
        try:
            return original(value, catalogue, base_dir, registry, path, **kwargs)
        except ContractError as error:
            if error.code.value != "CONSUMER_MISSING" or value.WhichOneof("layout") != "struct_type" \
                    or struct_kind(value.struct_type) == "type_ref":
                raise
            layout = compile_layout(value.struct_type, catalogue, f"{path}.struct_type")
            for decoder in decode_module._registry(registry)._decoders.values():
                if decoder.signature[0] == layout.signature():
                    payload = decode_module.payload_array(value, catalogue, base_dir, path)
                    return decode_module._check_logical(value, decoder.decode(layout, payload), path)
            raise
    return decode_value


InlineLayoutMatchedToRegisteredDecoder = fault("DEC-KEYED.inline-matched-by-layout", ("DEC-KEYED", "DEC-INLINE-CODEC"),
    """Finds a decoder for an inline layout by comparing its compiled layout with every registration's: an inline copy
    of a registered declaration is decoded by that type's decoder, although bindings are keyed by type_id and an inline
    layout has none.""", patches=lambda: [wrap(decode_module, "decode_value", _by_layout)])


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


def _codebook_index_major(layout, data):
    table = layout.constant("quantized.codebook").astype(np.float32).reshape(-1)
    index = layout.read(data, "quantized.codes.index").astype(np.intp)
    scale = layout.read(data, "scale").astype(np.float32)
    return (scale[:, None] * table[index]).T.reshape(-1)  # output[i * blocks + block]


CodebookBlocksInterleaved = fault("EX-CODEBOOK.blocks-interleaved", ("EX-CODEBOOK",),
    """DecodeScaledCodebookBlocks writes element i of block b at ``i * blocks + b`` (index-major) instead of flattening
    the decoded blocks in storage order (``b * 32 + i``).""",
    patches=lambda: [_registry_patch((1102, _codebook_index_major))])


def _linear_unsigned_codes(layout, data):
    codes = layout.read(data, "values").astype(np.int64)
    codes = np.where(codes < 0, codes + 16, codes).astype(np.float32)  # INT4 read as UINT4
    scale = decoders._field_or_constant(layout, data, "scale").astype(np.float32)
    zero = decoders._field_or_constant(layout, data, "zero_point").astype(np.float32)
    return ((codes - zero[:, None]) * scale[:, None]).reshape(-1)


LinearCodesUnsigned = fault("EX-LINEAR-INT4.codes-unsigned", ("EX-LINEAR-INT4",),
    """DecodeLinearInt4 reads the INT4 ``values`` as unsigned nibbles (0..15) instead of signed codes.""",
    patches=lambda: [_registry_patch((1002, _linear_unsigned_codes), (1003, _linear_unsigned_codes))])


def _linear_constant_zero_point_dropped(layout, data):
    codes = layout.read(data, "values").astype(np.float32)
    scale = decoders._field_or_constant(layout, data, "scale").astype(np.float32)
    if "zero_point" in layout.leaves:
        zero = layout.read(data, "zero_point").reshape(-1).astype(np.float32)
    else:
        zero = np.zeros(1, np.float32)  # only a per-value zero point is looked for
    return ((codes - zero[:, None]) * scale[:, None]).reshape(-1)


LinearConstantZeroPointDropped = fault("EX-LINEAR-INT4.constant-zero-point-dropped", ("EX-LINEAR-INT4",),
    """DecodeLinearInt4 looks for the zero point only in the record: a zero point declared as the type's constant (type
    1003's -2) is taken as 0, while a constant scale is applied.""",
    patches=lambda: [_registry_patch((1002, _linear_constant_zero_point_dropped),
                                     (1003, _linear_constant_zero_point_dropped))])


def _sub_layout(layout, prefix: str):
    """The leaves and constants of one field of a record, renamed relative to that field (same record)."""
    from reference_impl.records import RecordLayout

    leaves = {path[len(prefix):]: leaf for path, leaf in layout.leaves.items() if path.startswith(prefix)}
    constants = {path[len(prefix):]: c for path, c in layout.constants.items() if path.startswith(prefix)}
    return RecordLayout(layout.record_bits, leaves, constants)


def _decoder_along_the_chain(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value", **extra):
        if value.WhichOneof("layout") == "struct_type" and value.struct_type.WhichOneof("kind") == "type_ref":
            known = decode_module._registry(registry)
            root, _ = catalogue.lookup(value.struct_type.type_ref, path)
            if value.struct_type.type_ref not in known and root.WhichOneof("kind") == "structure":
                for field in root.structure.field:
                    nested = field.type.struct_type if field.WhichOneof("content") == "type" and \
                        field.type.WhichOneof("value") == "struct_type" else None
                    if nested is None or nested.WhichOneof("kind") != "type_ref" or nested.type_ref not in known:
                        continue
                    payload = decode_module.payload_array(value, catalogue, base_dir, path)
                    layout = compile_layout(value.struct_type, catalogue, f"{path}.struct_type")
                    decoder = known._decoders[nested.type_ref]
                    result = decoder.decode(_sub_layout(layout, field.name + "."), payload)
                    return decode_module._check_logical(value, result, path)
        return original(value, catalogue, base_dir, registry, path, **extra)
    return decode_value


NestedDecoderUsedForRoot = fault("DEC-ROOT-ONLY.nested-decoder-for-root", ("DEC-ROOT-ONLY", "DEC-MISSING"),
    """Looks for a decoder along the resolution chain: a root type nobody registered is decoded by the registered
    decoder of the first type it embeds by reference, instead of failing for the missing root consumer.""",
    patches=lambda: [wrap(decode_module, "decode_value", _decoder_along_the_chain)])


class FlatLogicalShapeRequired(Fault):
    """Assumes every struct-layout decoder produces a flat vector: a logical type of any other rank is
    refused, although the registered decoder defines the block-to-logical-element mapping."""

    fault_id = "DEC-DEFINES-MAPPING.flat-logical-required"
    clauses = ("DEC-DEFINES-MAPPING",)

    def precheck(self, model, base_dir):
        for value in encoded_values(model):
            if value.WhichOneof("layout") == "struct_type" and value.HasField("logical_type") and \
                    value.logical_type.WhichOneof("value") == "tensor_type" and \
                    len(value.logical_type.tensor_type.shape.dim) != 1:
                raise violation(E.LOGICAL_SHAPE_MISMATCH, f"model.graph.encoded_initializer[{value.name!r}]",
                                "a struct layout decodes to a one-dimensional tensor")


class EncodedInitializersDecodedAtLoad(Fault):
    """Decodes every type_ref encoded initializer eagerly when it loads the model (to have the tensors
    ready), so loading runs codec code and fails on a value whose decoder is missing."""

    fault_id = "DEC-NO-LOAD-EXEC.decoded-at-load"
    clauses = ("DEC-NO-LOAD-EXEC",)

    def precheck(self, model, base_dir):
        try:
            catalogue = structs.Catalogue(model.struct_types)
        except ContractError:
            return
        for index, value in enumerate(model.graph.encoded_initializer):
            if value.WhichOneof("layout") != "struct_type" or value.struct_type.WhichOneof("kind") != "type_ref":
                continue
            try:
                decode_module.decode_value(value, catalogue, base_dir, None,
                                           f"model.graph.encoded_initializer[{index}]")
            except ContractError as error:
                if error.code is E.CONSUMER_MISSING or error.code is E.DECODER_MISMATCH:
                    raise
            except Exception:  # noqa: BLE001 - anything else is the oracle's to report later
                return


def _fed_values_fallback(original):
    def make_decode(node, session):
        kernel = original(node, session)

        def decode(inputs, ctx):
            try:
                return kernel(inputs, ctx)
            except ContractError as error:
                value = inputs[0]
                if error.code is not E.CONSUMER_MISSING or not isinstance(value, EncodedValue):
                    raise
                proto = value.to_proto()
                if proto.WhichOneof("layout") != "struct_type":
                    raise
                payload = decode_module.payload_array(proto, session.catalogue, value.base_dir or session.base_dir,
                                                      ctx.path)
                layout = compile_layout(proto.struct_type, session.catalogue, ctx.path)
                count = len(payload) // layout.record_bytes if layout.record_bytes else 0
                parts = [layout.read(payload, path).reshape(count, -1).astype(np.float32) for path in layout.leaves]
                flat = np.concatenate(parts, axis=1).reshape(-1) if parts and count else np.zeros(0, np.float32)
                return [decode_module._check_logical(proto, flat, ctx.path)]
        return decode
    return make_decode


FedValuesDecodedGenerically = fault("DEC-MISSING-INPUT.fed-values-fallback", ("DEC-MISSING-INPUT", "DEC-MISSING"),
    """Checks for a missing decoder when it loads encoded initializers, but a Decode node given a graph input whose type
    nobody registered falls back to reading every field as floats instead of failing.""",
    patches=lambda: [Patch(kernels.LOCAL_KERNELS, "Decode", _fed_values_fallback(kernels.make_decode))])


name_faults(globals())
