"""Faults in structured values and their decoders and codecs, and the specification's worked examples."""

from __future__ import annotations

import dataclasses

import numpy as np

from conformance.audit.fault import Fault, Patch, fault, name_faults, wrap
from conformance.audit.fault import decode_module as decode
from conformance.audit.faults.encoding import around, codebook_decoder, linear_decoder, refuse, refuse_values, seam
from conformance.audit.faults.shared import _implicit_operand, _registry_patch
from reference_impl import decoders, dtypes, records, schema, structs
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels, program
from reference_impl.records import compile_layout
from reference_impl.structs import struct_kind
from reference_impl.values import EncodedValue


def _flat_leaves(layout: records.RecordLayout, payload: np.ndarray) -> np.ndarray:
    """Every leaf of every record, in layout order, as float32: a generic 'decoder'."""
    count = len(payload) // layout.record_bytes if layout.record_bytes else 0
    parts = [layout.read(payload, path).reshape(count, -1).astype(np.float32) for path in layout.leaves]
    return np.concatenate(parts, axis=1).reshape(-1) if parts and count else np.zeros(0, np.float32)


def _binds(**hooks) -> list:
    """Patches of ``DecoderRegistry.bind(self, type_id, layout, path, declaration)`` with ``around`` hooks."""
    return [around(decoders.DecoderRegistry, "bind", **hooks)]


_decodes = seam(decode, "decode_value")  # (value, catalogue, base_dir, registry, path, out)


def _type_ref_layout(value) -> bool:
    return value.WhichOneof("layout") == "struct_type" and value.struct_type.WhichOneof("kind") == "type_ref"


def _logical_rank_is_not(rank: int):
    return lambda value: value.WhichOneof("layout") == "struct_type" and value.HasField("logical_type") and \
        value.logical_type.WhichOneof("value") == "tensor_type" and \
        len(value.logical_type.tensor_type.shape.dim) != rank


# ------------------------------------------------------------------------------ decoder bindings
def _names_and_types(signature: tuple) -> tuple:
    """A registration's signature reduced to what a name-and-type check sees: each leaf's path, type and shape, the
    constants, and the declared codecs (no bit positions, widths or record size)."""
    (record_bits, leaves, constants), identity = signature
    return tuple(sorted((path, elem_type, tuple(count for count, _ in dims))
                        for path, elem_type, _, _, dims in leaves)), constants, identity


def _registered_layouts() -> dict[int, records.RecordLayout]:
    """The record layouts the built-in decoders were written for, by type_id."""
    catalogue = structs.Catalogue(decoders.spec_catalogue())
    return {decl.type_id: records.compile_layout(schema.StructTypeProto(type_ref=decl.type_id), catalogue)
            for decl in decoders.spec_catalogue()}


def _bound_on_names_and_types(registered: dict):
    def bind(self, type_id, layout, path, declaration):
        found = self._decoders.get(type_id)
        if found is None:
            return None  # the registry's own refusal
        identity = decoders._codec_identity(declaration) if declaration is not None else found.signature[1]
        if _names_and_types(found.signature) != _names_and_types((layout.signature(), identity)):
            refuse(E.DECODER_MISMATCH, path, f"decoder {found.name} was registered elsewhere")
        if type_id not in registered:
            return found
        # the typed view it creates reads the registered declaration's positions, not the model's
        own = registered[type_id]
        return dataclasses.replace(found, decode=lambda _layout, payload: found.decode(own, payload))
    return bind


def _keyed_by_name(names: dict):
    def bind(self, path, declaration, **_):
        if declaration is not None:
            by_name = names.get(declaration.name)
            if by_name is None or by_name not in self:
                refuse(E.CONSUMER_MISSING, path, f"no decoder for {declaration.name!r}")
            return {"type_id": by_name}
    return bind


BindsWithoutVerifying = fault("DEC-KEYED.declaration-not-verified", ("DEC-KEYED",),
    """Binds a registered decoder by type_id alone, without verifying the model's declaration of that ID against the one
    the decoder was written for.""",
    patches=lambda: _binds(instead=lambda self, type_id, **_: self._decoders.get(type_id)))
BindsOnNamesAndTypes = fault("DEC-KEYED.positions-not-compared", ("DEC-KEYED", "CAT-ID-CHANGE"),
    """Verifies a declaration against a registered decoder by its field names, types, shapes and constants only: a
    declaration of the same ID with the same fields in another order (other bit positions) is bound to the decoder
    instead of being refused as a different declaration.""",
    patches=lambda: _binds(instead=_bound_on_names_and_types(_registered_layouts())))
CodecNamesNotCompared = fault("DEC-KEYED.codecs-not-compared", ("DEC-KEYED", "CAT-ID-CHANGE"),
    """Verifies a declaration's layout and constants against the registered decoder but not the decoder and encoder
    functions it declares: a declaration naming another decoder is bound all the same.""",
    patches=lambda: _binds(before=lambda **_: {"declaration": None}))
DecodersKeyedByName = fault("DEC-KEYED.keyed-by-name", ("DEC-KEYED", "DEC-MISSING"),
    """Looks decoders up by the declaration's name instead of its type_id: a renamed declaration of a registered ID
    finds no decoder, and another ID declared under a registered name gets that decoder.""",
    patches=lambda: _binds(before=_keyed_by_name({d.name: d.type_id for d in decoders.spec_catalogue()})))
BindingIgnoresLeafTypes = fault("DEC-KEYED.leaf-types-not-compared", ("DEC-KEYED",),
    """Verifies a binding's declaration by each leaf's path, width and bit position but not its element type: an INT8
    field redeclared UINT8 (or FLOAT16 as BFLOAT16) under the same ID still binds.""",
    patches=lambda: [around(records.RecordLayout, "signature", after=lambda signature, **_: (
        signature[0], tuple((p, w, o, d) for p, _, w, o, d in signature[1]), signature[2]))])
FallbackDecoder = fault("DEC-MISSING.generic-fallback", ("DEC-MISSING",),
    """Decodes a type_id nobody registered with a generic fallback (every field read as floats) instead of failing
    explicitly for the missing consumer.""", patches=lambda: _binds(instead=lambda self, type_id, **_: decoders.Decoder(
        "fallback", (), _flat_leaves) if type_id not in self else None))


# -------------------------------------------------------------------- nested, inline and missing decoders
#: type nodes the nested-codec walk visits at most (a diamond-shaped catalogue expands once per path)
_NESTED_WALK_LIMIT = 4096


def _nested_codecs(catalogue, st, prefix: str, path: str, found: list, budget: list) -> None:
    """The decoders that nested type_refs of ``st`` declare, as (field path prefix, type_id, decoder) in preorder (an
    enclosing type before the types inside it)."""
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
    """A record layout whose leaf reads go through the decoders of the nested types the leaf lies in, innermost first:
    what the root's decoder reads is the subtypes' decoded output."""

    codecs: tuple = ()

    def read(self, payload, path):
        values = super().read(payload, path)
        for prefix, type_id, function in reversed(self.codecs):
            if path == prefix or path.startswith(prefix + "."):
                values = _run_codec(function, values, f"{path} (type {type_id})")
        return values


def _nested_decoders_first(value, catalogue, base_dir, registry, path, out):
    if not _type_ref_layout(value):
        return None
    st, codecs = value.struct_type, []
    _nested_codecs(catalogue, st, "", path, codecs, [_NESTED_WALK_LIMIT])
    codecs = [codec for codec in codecs if codec[0]]  # the root's own decoder is not nested
    if not codecs:
        return None
    for _, type_id, function in codecs:
        if not _runnable(function):
            refuse(E.CONSUMER_MISSING, path, f"no decoder for nested type {type_id}")
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


def _guessing_inline(value, catalogue, base_dir, path, **_):
    if value.WhichOneof("layout") == "struct_type" and value.struct_type.WhichOneof("kind") != "type_ref":
        payload = decode.payload_array(value, catalogue, base_dir, path)
        layout = records.compile_layout(value.struct_type, catalogue, f"{path}.struct_type")
        return decode._check_logical(value, _flat_leaves(layout, payload), path)


def _sub_layout(layout, prefix: str):
    """The leaves and constants of one field of a record, renamed relative to that field (same record)."""
    leaves = {path[len(prefix):]: leaf for path, leaf in layout.leaves.items() if path.startswith(prefix)}
    constants = {path[len(prefix):]: c for path, c in layout.constants.items() if path.startswith(prefix)}
    return records.RecordLayout(layout.record_bits, leaves, constants)


def _decoder_along_the_chain(value, catalogue, base_dir, registry, path, **_):
    if not _type_ref_layout(value):
        return None
    known = decode._registry(registry)
    root, _ = catalogue.lookup(value.struct_type.type_ref, path)
    if value.struct_type.type_ref in known:
        return None
    for field in root.structure.field if root.WhichOneof("kind") == "structure" else ():
        nested = field.type.struct_type if field.WhichOneof("content") == "type" and \
            field.type.WhichOneof("value") == "struct_type" else None
        if nested is not None and nested.WhichOneof("kind") == "type_ref" and nested.type_ref in known:
            payload = decode.payload_array(value, catalogue, base_dir, path)
            layout = compile_layout(value.struct_type, catalogue, f"{path}.struct_type")
            result = known._decoders[nested.type_ref].decode(_sub_layout(layout, field.name + "."), payload)
            return decode._check_logical(value, result, path)


def _bytes_view(error, value, catalogue, base_dir, path, **_):
    logical = value.logical_type
    if error.code.value != "CONSUMER_MISSING" or logical.WhichOneof("value") != "tensor_type" \
            or logical.tensor_type.elem_type != dtypes.UINT8:
        raise error
    return np.array(decode.payload_array(value, catalogue, base_dir, path), dtype=np.uint8)


def _by_layout(error, value, catalogue, base_dir, registry, path, **_):
    if error.code.value != "CONSUMER_MISSING" or value.WhichOneof("layout") != "struct_type" \
            or struct_kind(value.struct_type) == "type_ref":
        raise error
    layout = compile_layout(value.struct_type, catalogue, f"{path}.struct_type")
    for decoder in decode._registry(registry)._decoders.values():
        if decoder.signature[0] == layout.signature():
            payload = decode.payload_array(value, catalogue, base_dir, path)
            return decode._check_logical(value, decoder.decode(layout, payload), path)
    raise error


def _fed_values_fallback(original):
    def make_decode(node, session):
        kernel = original(node, session)

        def decode_(inputs, ctx):
            try:
                return kernel(inputs, ctx)
            except ContractError as error:
                value = inputs[0]
                if error.code is not E.CONSUMER_MISSING or not isinstance(value, EncodedValue):
                    raise
                proto = value.to_proto()
                if proto.WhichOneof("layout") != "struct_type":
                    raise
                payload = decode.payload_array(proto, session.catalogue, value.base_dir or session.base_dir, ctx.path)
                layout = compile_layout(proto.struct_type, session.catalogue, ctx.path)
                return [decode._check_logical(proto, _flat_leaves(layout, payload), ctx.path)]
        return decode_
    return make_decode


def _codecs_compiled(model, base_dir):
    for decl in model.struct_types:
        for codec in ("decoder", "encoder"):
            for node in getattr(decl, codec).node if decl.HasField(codec) else ():
                if node.domain not in ("", "ai.onnx", "onnx_light"):
                    refuse(E.OPERATOR_UNSUPPORTED, f"model.struct_types.{codec}",
                           f"{node.domain}.{node.op_type} is not available")


def _decoded_at_load(model, base_dir):
    try:
        catalogue = structs.Catalogue(model.struct_types)
    except ContractError:
        return
    for index, value in enumerate(model.graph.encoded_initializer):
        if not _type_ref_layout(value):
            continue
        try:
            decode.decode_value(value, catalogue, base_dir, None, f"model.graph.encoded_initializer[{index}]")
        except ContractError as error:
            if error.code is E.CONSUMER_MISSING or error.code is E.DECODER_MISMATCH:
                raise
        except Exception:  # noqa: BLE001 - anything else is the oracle's to report later
            return


class NoGenericFieldAccess(Fault):
    """Offers no generic field access: an inline layout's fields cannot be read at all."""

    fault_id = "DEC-INLINE-CODEC.no-field-access"
    clauses = ("DEC-INLINE-CODEC",)
    boundary = True

    def read_fields(self, model_bytes, value_name, base_dir):
        raise violation(E.CONSUMER_MISSING, value_name, "no decoder or consumer for this layout")


NestedDecodersInvoked = fault("DEC-ROOT-ONLY.nested-decoders-invoked", ("DEC-ROOT-ONLY",),
    """Runs the decoders that nested type_refs declare: every field the root's decoder reads first goes through the
    decoders of the subtypes it lies in (their bodies run on the field's values, innermost first), and a subtype naming
    a decoder the runtime cannot run makes the whole value fail with CONSUMER_MISSING.""",
    patches=_decodes(instead=_nested_decoders_first))
NestedDecoderUsedForRoot = fault("DEC-ROOT-ONLY.nested-decoder-for-root", ("DEC-ROOT-ONLY", "DEC-MISSING"),
    """Looks for a decoder along the resolution chain: a root type nobody registered is decoded by the registered
    decoder of the first type it embeds by reference, instead of failing for the missing root consumer.""",
    patches=_decodes(instead=_decoder_along_the_chain))
InlineLayoutsGuessed = fault("DEC-INLINE-CODEC.inline-layout-guessed", ("DEC-INLINE-CODEC",),
    """Decodes an inline custom layout by guessing (every field read as floats, concatenated) instead of requiring an
    explicit codec or generic field access.""", patches=_decodes(instead=_guessing_inline))
NestedConstantsNotExposed = fault("DEC-INLINE-CODEC.nested-constants-missing", ("DEC-INLINE-CODEC", "DEC-ROOT-ONLY"),
    """Generic field access lists the root declaration's own constants but not those a nested group contributes
    (``quantized.codebook`` of the codebook parent is missing).""",
    patches=lambda: [around(decode, "read_fields", after=lambda fields, value, catalogue, path, **_: {
        name: array for name, array in fields.items() if "." not in name or
        name in records.compile_layout(value.struct_type, catalogue, path).leaves})])
MissingDecoderYieldsBytes = fault("DEC-MISSING.uint8-bytes-view", ("DEC-MISSING",),
    """A struct value nobody registered a decoder for, whose logical type is a UINT8 tensor, decodes to its payload
    bytes (a "bytes view" fallback for byte-typed values) instead of failing explicitly for the missing consumer; other
    logical types still fail.""", patches=_decodes(rescue=_bytes_view))
InlineLayoutMatchedToRegisteredDecoder = fault("DEC-KEYED.inline-matched-by-layout", ("DEC-KEYED", "DEC-INLINE-CODEC"),
    """Finds a decoder for an inline layout by comparing its compiled layout with every registration's: an inline copy
    of a registered declaration is decoded by that type's decoder, although bindings are keyed by type_id and an inline
    layout has none.""", patches=_decodes(rescue=_by_layout))
StructsFlattenedForTensorOps = fault("DEC-MISSING-INPUT.struct-flattened", ("DEC-MISSING-INPUT",),
    """Flattens a struct graph input with no consumer into one tensor (its fields concatenated) when a tensor operator
    reads it, instead of failing explicitly.""",
    patches=lambda: [wrap(program, "_tensor_operand", _implicit_operand(struct_to_tensor=lambda s: np.concatenate(
        [np.asarray(v).reshape(-1) for v in s.values()])))])
FedValuesDecodedGenerically = fault("DEC-MISSING-INPUT.fed-values-fallback", ("DEC-MISSING-INPUT", "DEC-MISSING"),
    """Checks for a missing decoder when it loads encoded initializers, but a Decode node given a graph input whose type
    nobody registered falls back to reading every field as floats instead of failing.""",
    patches=lambda: [Patch(kernels.LOCAL_KERNELS, "Decode", _fed_values_fallback(kernels.make_decode))])
CodecBodiesLoaded = fault("DEC-NO-LOAD-EXEC.codecs-compiled-at-load", ("DEC-NO-LOAD-EXEC",),
    """Compiles the decoder and encoder bodies of every declaration when it loads the model, so a codec using an
    operator it does not have makes loading fail.""", precheck=_codecs_compiled)
EncodedInitializersDecodedAtLoad = fault("DEC-NO-LOAD-EXEC.decoded-at-load", ("DEC-NO-LOAD-EXEC",),
    """Decodes every type_ref encoded initializer eagerly when it loads the model (to have the tensors ready), so
    loading runs codec code and fails on a value whose decoder is missing.""", precheck=_decoded_at_load)
BlockRowsImposed = fault("DEC-DEFINES-MAPPING.row-per-record-required", ("DEC-DEFINES-MAPPING",),
    """Imposes its own block mapping instead of the registered decoder's: a struct-layout value must declare a
    two-dimensional logical shape of one row per record.""", precheck=refuse_values(_logical_rank_is_not(2),
        E.LOGICAL_SHAPE_MISMATCH, "a block layout's logical shape is (records, elements per record)"))
FlatLogicalShapeRequired = fault("DEC-DEFINES-MAPPING.flat-logical-required", ("DEC-DEFINES-MAPPING",),
    """Assumes every struct-layout decoder produces a flat vector: a logical type of any other rank is refused, although
    the registered decoder defines the block-to-logical-element mapping.""", precheck=refuse_values(
        _logical_rank_is_not(1), E.LOGICAL_SHAPE_MISMATCH, "a struct layout decodes to a one-dimensional tensor"))


# --------------------------------------------------------------------------- the worked examples' decoders
def _linear_types(**wrong):
    """Patches giving types 1002 and 1003 the DecodeLinearInt4 ``linear_decoder(**wrong)``."""
    return lambda: [_registry_patch((1002, linear_decoder(**wrong)), (1003, linear_decoder(**wrong)))]


def _unsigned_nibbles(codes: np.ndarray) -> np.ndarray:
    codes = codes.astype(np.int64)
    return np.where(codes < 0, codes + 16, codes)  # INT4 read as UINT4


def _record_zero_point(layout, data) -> np.ndarray:
    if "zero_point" in layout.leaves:
        return layout.read(data, "zero_point").reshape(-1)
    return np.zeros(1, np.float32)  # only a per-value zero point is looked for


def _msb_first_pairs(index: np.ndarray) -> np.ndarray:
    return index.reshape(*index.shape[:-1], index.shape[-1] // 4, 4)[..., ::-1].reshape(index.shape)


LinearZeroPointAdded = fault("EX-LINEAR-INT4.zero-point-added", ("EX-LINEAR-INT4",),
    """DecodeLinearInt4 adds the zero point, ``(code + zero_point) * scale``, instead of subtracting it.""",
    patches=_linear_types(combine=np.add))
LinearCodesUnsigned = fault("EX-LINEAR-INT4.codes-unsigned", ("EX-LINEAR-INT4",),
    """DecodeLinearInt4 reads the INT4 ``values`` as unsigned nibbles (0..15) instead of signed codes.""",
    patches=_linear_types(codes=_unsigned_nibbles))
LinearConstantZeroPointDropped = fault("EX-LINEAR-INT4.constant-zero-point-dropped", ("EX-LINEAR-INT4",),
    """DecodeLinearInt4 looks for the zero point only in the record: a zero point declared as the type's constant (type
    1003's -2) is taken as 0, while a constant scale is applied.""",
    patches=_linear_types(zero_point=_record_zero_point))
CodebookIndicesMsbFirst = fault("EX-CODEBOOK.indices-msb-first", ("EX-CODEBOOK",),
    """DecodeScaledCodebookBlocks takes the four 2-bit indices of each byte from the most-significant pair down, so E4
    reads as indices 3, 2, 1, 0.""",
    patches=lambda: [_registry_patch((1102, codebook_decoder(index=_msb_first_pairs)))])
CodebookBlocksInterleaved = fault("EX-CODEBOOK.blocks-interleaved", ("EX-CODEBOOK",),
    """DecodeScaledCodebookBlocks writes element i of block b at ``i * blocks + b`` (index-major) instead of flattening
    the decoded blocks in storage order (``b * 32 + i``).""",  # output[i * blocks + block]
    patches=lambda: [_registry_patch((1102, codebook_decoder(order=np.transpose)))])


name_faults(globals())
