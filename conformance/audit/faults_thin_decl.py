"""Second faults for declaration, catalogue, binding and consumer rules that had a single fault each: each is
another way a competent runtime author gets the same rule wrong (a check done on one path but not another,
a convention the spec does not make, an off-by-one in a limit), so one case edit no longer hides the rule."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from conformance.audit.fault import Fault, FaultState, Patch, decode_module, encoded_values, wrap
from conformance.audit.faults_representation import checked_catalogue
from conformance.audit.wire_edit import renumber
from reference_impl import bindings, decoders, structs
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels, program
from reference_impl.records import compile_layout
from reference_impl.values import EncodedValue, StructValue, is_struct

_GRAPH_ATTRIBUTES = (5, 10)  # AttributeProto.GRAPH / GRAPHS


# ------------------------------------------------------------------------------------------ bindings
class StructBindingsSavedOnTheType(Fault):
    """Saves the binding of a struct input as a persistence flag on its catalogue declaration
    (``metadata_props`` ``onnx_light.persistent`` = ``input<-output``) instead of in the graph's
    persistent_bindings; tensor bindings are saved normally."""

    fault_id = "BIND-GRAPH-LEVEL.struct-binding-on-type"
    clauses = ("BIND-GRAPH-LEVEL",)

    def on_save(self, model):
        inputs = {vi.name: vi for vi in model.graph.input}
        declarations = {decl.type_id: decl for decl in model.struct_types}
        kept = []
        for binding in model.graph.persistent_bindings:
            vi = inputs.get(binding.input_name)
            tp = vi.type if vi is not None else None
            decl = None
            if tp is not None and tp.WhichOneof("value") == "struct_type" and \
                    tp.struct_type.WhichOneof("kind") == "type_ref":
                decl = declarations.get(tp.struct_type.type_ref)
            if decl is None:
                kept.append((binding.input_name, binding.output_name))
                continue
            decl.metadata_props.add(key="onnx_light.persistent", value=f"{binding.input_name}<-{binding.output_name}")
        del model.graph.persistent_bindings[:]
        for input_name, output_name in kept:
            model.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)


def _unescaped(name: str) -> str:
    """A name read through a C-style escape parser: a backslash escapes the character after it."""
    out, index = [], 0
    while index < len(name):
        if name[index] == "\\" and index + 1 < len(name):
            index += 1
        out.append(name[index])
        index += 1
    return "".join(out)


class BackslashesUnescaped(Fault):
    """Parses binding names as escaped strings (a backslash escapes the next character and disappears),
    while graph input and output names stay raw: ``a\\b`` in a binding looks for ``ab``."""

    fault_id = "BIND-LITERAL-NAMES.backslash-escapes"
    clauses = ("BIND-LITERAL-NAMES",)

    def transform(self, model, base_dir):
        for binding in model.graph.persistent_bindings:
            binding.input_name = _unescaped(binding.input_name)
            binding.output_name = _unescaped(binding.output_name)


class LegacyFieldPathsDropped(Fault):
    """Parses bindings with a generated class that discards unknown fields: a binding carrying the
    legacy field-path tags (3, 4) is silently read as a plain whole-value binding."""

    fault_id = "BIND-NO-CONTENTS.legacy-paths-dropped"
    clauses = ("BIND-NO-CONTENTS", "BIND-WHOLE")

    def transform(self, model, base_dir):
        for binding in model.graph.persistent_bindings:
            binding.DiscardUnknownFields()


def _memoized_decode(original):
    def make_decode(node, session):
        kernel = original(node, session)
        memo: list = []

        def decode(inputs, ctx):
            if not memo:  # the decoded tensor is kept in the kernel for every later call of the session
                memo.append(kernel(inputs, ctx))
            return memo[0]
        return decode
    return make_decode


class DecodedValuesMemoized(Fault):
    """Caches each Decode node's result in the kernel on first use (an optimization for constant
    weights), so later calls of the same state decode the first call's value again: hidden kernel state
    beyond the bound inputs."""

    fault_id = "BIND-NO-CONTENTS.decode-memoized"
    clauses = ("BIND-NO-CONTENTS",)

    def patches(self):
        return [Patch(kernels.LOCAL_KERNELS, "Decode", _memoized_decode(kernels.make_decode))]


def _direct_subgraphs_only(model) -> None:
    """Checks the graphs attached to the root graph's own nodes, not deeper ones nor function bodies."""
    for index, node in enumerate(model.graph.node):
        for attr in node.attribute:
            graphs = [attr.g] if attr.type == _GRAPH_ATTRIBUTES[0] else list(attr.graphs) \
                if attr.type == _GRAPH_ATTRIBUTES[1] else []
            for sub in graphs:
                if len(sub.persistent_bindings):
                    raise violation(E.BINDING_IN_SUBGRAPH, f"model.graph.node[{index}].attribute[{attr.name!r}]",
                                    "persistent bindings are supported on the root graph only")


class NestedBindingsOneLevelDeep(Fault):
    """Rejects bindings in the subgraphs of the root graph's nodes only: a declaration in a subgraph
    nested inside another subgraph, or in a function body, is ignored."""

    fault_id = "BIND-ROOT-ONLY.one-level-deep"
    clauses = ("BIND-ROOT-ONLY",)
    boundary = True

    def patches(self):
        return [Patch(bindings, "_reject_nested_declarations", _direct_subgraphs_only)]


class _SlotPerTypeState(FaultState):
    def __init__(self, state, fault, slots: dict[str, str], like=None):
        super().__init__(state, fault, like)
        self.slots = slots  # input -> the input whose slot it shares (the last bound one of its type)

    def run(self, feeds):
        outputs = super().run(feeds)
        current = dict(self.state._values)
        self.state._values = MappingProxyType({name: current[self.slots.get(name, name)] for name in current})
        return outputs


class OneStateSlotPerType(Fault):
    """Keeps retained state in one slot per struct type: two bound inputs of the same type share it, so
    after a call both receive the output of the last binding of that type."""

    fault_id = "BIND-SHARED-TYPE.one-slot-per-type"
    clauses = ("BIND-SHARED-TYPE",)

    def make_state(self, handle):
        model_types = getattr(self, "_types", {})
        last: dict[int, str] = {}
        for binding in handle.state.bindings:
            type_id = model_types.get(binding.input_name)
            if type_id is not None:
                last[type_id] = binding.input_name
        slots = {name: last[type_id] for name, type_id in model_types.items() if type_id in last}
        return _SlotPerTypeState(handle.state, self, slots)

    def open_state(self, model_bytes, initial, base_dir=None):
        from reference_impl import schema

        model = schema.parse_model(model_bytes)
        self._types = {vi.name: vi.type.struct_type.type_ref for vi in model.graph.input
                       if vi.type.WhichOneof("value") == "struct_type"
                       and vi.type.struct_type.WhichOneof("kind") == "type_ref"}
        return super().open_state(model_bytes, initial, base_dir)


class BindingsInferredFromNames(Fault):
    """Without declared bindings, pairs inputs and outputs by the common ``past_*`` / ``present_*``
    naming convention and retains them, instead of running stateless."""

    fault_id = "BIND-STATELESS-DEFAULT.bindings-from-names"
    clauses = ("BIND-STATELESS-DEFAULT",)

    def transform(self, model, base_dir):
        graph = model.graph
        if len(graph.persistent_bindings):
            return
        outputs = {vi.name for vi in graph.output}
        for vi in graph.input:
            if vi.name.startswith("past_") and "present_" + vi.name[5:] in outputs:
                graph.persistent_bindings.add(input_name=vi.name, output_name="present_" + vi.name[5:])


# ------------------------------------------------------------------------------------------ catalogue
class TypeRefDeclarationsSkipped(Fault):
    """Skips catalogue entries that select type_ref (as forward declarations) instead of rejecting them:
    the model loads, and a reference to such an ID is reported unresolved."""

    fault_id = "CAT-DECL-CONCRETE.type-ref-declarations-skipped"
    clauses = ("CAT-DECL-CONCRETE",)

    def transform(self, model, base_dir):
        kept = []
        for decl in model.struct_types:
            if decl.WhichOneof("kind") != "type_ref":
                copy = type(decl)()
                copy.CopyFrom(decl)
                kept.append(copy)
        if len(kept) != len(model.struct_types):
            del model.struct_types[:]
            model.struct_types.extend(kept)


class IdenticalDuplicatesMerged(Fault):
    """Treats a repeated type_id whose declaration is byte-for-byte identical as a harmless
    redeclaration (merged, as a linker merges identical definitions); only differing duplicates are
    rejected."""

    fault_id = "CAT-ID-UNIQUE.identical-duplicates-merged"
    clauses = ("CAT-ID-UNIQUE",)

    def transform(self, model, base_dir):
        seen: dict[int, bytes] = {}
        kept = []
        for decl in model.struct_types:
            data = decl.SerializeToString(deterministic=True)
            if seen.get(decl.type_id) == data:
                continue
            seen.setdefault(decl.type_id, data)
            copy = type(decl)()
            copy.CopyFrom(decl)
            kept.append(copy)
        if len(kept) != len(model.struct_types):
            del model.struct_types[:]
            model.struct_types.extend(kept)


def _registered_leaves_only(original):
    def bind(self, type_id, layout, path, declaration=None):
        decoder = self._decoders.get(type_id)
        if decoder is None:
            return original(self, type_id, layout, path, declaration)
        (_, leaves, consts), identity = decoder.signature
        _, model_leaves, model_consts = layout.signature()
        same_codecs = declaration is None or decoders._codec_identity(declaration) == identity
        # every field the decoder reads is where it expects it; fields it does not read are not compared
        if set(leaves) <= set(model_leaves) and set(consts) <= set(model_consts) and same_codecs:
            return decoder
        return original(self, type_id, layout, path, declaration)
    return bind


class AddedFieldsNotCompared(Fault):
    """Verifies a model's declaration against a registered decoder by the fields the decoder reads only:
    a field (or constant) added under the same ID, which changes the record size, still binds. Since a
    decoder may read the model's own declaration by field (type_id is model-scoped), only Recommended
    cases catch it."""

    fault_id = "CAT-ID-CHANGE.added-fields-not-compared"
    clauses = ("CAT-ID-CHANGE", "DEC-KEYED")

    def patches(self):
        return [wrap(decoders.DecoderRegistry, "bind", _registered_leaves_only)]


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


class NestedDecoderUsedForRoot(Fault):
    """Looks for a decoder along the resolution chain: a root type nobody registered is decoded by the
    registered decoder of the first type it embeds by reference, instead of failing for the missing
    root consumer."""

    fault_id = "DEC-ROOT-ONLY.nested-decoder-for-root"
    clauses = ("DEC-ROOT-ONLY", "DEC-MISSING")

    def patches(self):
        return [wrap(decode_module, "decode_value", _decoder_along_the_chain)]


# ------------------------------------------------------------------------------------------ consumers
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


def _single_field_unwrapped(original):
    def tensor_operand(value, op_type, path):
        if is_struct(value) and len(value) == 1:
            (field,) = value.values()
            if isinstance(field, np.ndarray):
                return field
        return original(value, op_type, path)
    return tensor_operand


class SingleFieldStructUnwrapped(Fault):
    """Treats a struct of one tensor field as that tensor when it reaches a tensor-only operator (a
    'newtype' unwrapped implicitly), instead of requiring an explicit decoder or consumer."""

    fault_id = "GRAPH-TENSOR-OPS.single-field-unwrapped"
    clauses = ("GRAPH-TENSOR-OPS", "DEC-MISSING-INPUT")

    def patches(self):
        return [wrap(program, "_tensor_operand", _single_field_unwrapped)]


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


# ------------------------------------------------------------------------------------------ declarations
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


class BitPackingCountUnchecked(Fault):
    """Checks that an array's length is an explicit positive integer but not a bit packing's count: a
    bit packing without a dimension is accepted as zero elements."""

    fault_id = "DECL-COUNTS-CONCRETE.bit-packing-count-unchecked"
    clauses = ("DECL-COUNTS-CONCRETE",)

    def patches(self):
        wanted = lambda role, depth, error, path: error.path.endswith("bit_packing.dimension")  # noqa: E731
        return [wrap(structs, "check_struct", _skip_where(("DIMENSION_INVALID",), wanted))]


def _outside_declarations(role, depth, error, path) -> bool:
    """A struct checked anywhere but as a catalogue declaration (a field type, graph type or layout)."""
    return role != "declaration"


class NestedCountsUnchecked(Fault):
    """Checks array lengths and bit-packing counts on catalogue declarations only: an inline array or bit
    packing inside a field type, graph type or layout may leave its count unset."""

    fault_id = "DECL-COUNTS-CONCRETE.nested-counts-unchecked"
    clauses = ("DECL-COUNTS-CONCRETE",)
    boundary = True

    def patches(self):
        return [wrap(structs, "check_struct", _skip_where(("DIMENSION_INVALID",), _outside_declarations))]


class FieldContentCheckedInCatalogueOnly(Fault):
    """Checks that every structure field selects a type or a constant in catalogue declarations only: an
    inline struct (in a field type, a graph type or an encoded layout) may hold an empty field."""

    fault_id = "DECL-FIELD-CONTENT.catalogue-only"
    clauses = ("DECL-FIELD-CONTENT",)
    boundary = True

    def patches(self):
        return [wrap(structs, "check_struct", _skip_where(("FIELD_CONTENT_MISSING",), _outside_declarations))]


class NestingLimitOneTooMany(Fault):
    """Compares the nesting depth with ``>`` one level late: 65 levels pass where the limit is 64."""

    fault_id = "DECL-DEPTH.one-level-over"
    clauses = ("DECL-DEPTH",)
    boundary = True

    def patches(self):
        return [Patch(structs, "MAX_DEPTH", structs.MAX_DEPTH + 1)]


class NestingLimitOneShort(Fault):
    """Counts the root as a level of its own: a type exactly 64 levels deep is refused."""

    fault_id = "DECL-DEPTH.one-level-short"
    clauses = ("DECL-DEPTH",)
    boundary = True

    def patches(self):
        return [Patch(structs, "MAX_DEPTH", structs.MAX_DEPTH - 1)]


def _unset_dims_as_zero(original):
    def dim(d):
        found = original(d)
        return 0 if found is None else found
    return dim


class UnsetDimsReadAsZero(Fault):
    """Reads a dimension that has neither a value nor a name as the protobuf default 0, so a struct
    field declared with an unknown dimension only accepts empty tensors."""

    fault_id = "DECL-DYNAMIC-DIMS.unset-dim-zero"
    clauses = ("DECL-DYNAMIC-DIMS",)
    boundary = True

    def patches(self):
        from reference_impl import values

        return [wrap(values, "_dim", _unset_dims_as_zero)]


class FixedSizeRequiredForGraphValues(Fault):
    """Allocates struct graph inputs and outputs as flat byte records, so it refuses a struct type
    without a fixed physical size as a graph input or output type (only byte-encoded layouts need one)."""

    fault_id = "REP-STATIC-SUBSET.graph-values-fixed-size"
    clauses = ("REP-STATIC-SUBSET",)

    def precheck(self, model, base_dir):
        catalogue = checked_catalogue(model)
        if catalogue is None:
            return
        for group, name in ((model.graph.input, "input"), (model.graph.output, "output")):
            for vi in group:
                if vi.type.WhichOneof("value") != "struct_type":
                    continue
                path = f"model.graph.{name}[{vi.name!r}].type.struct_type"
                try:
                    size = catalogue.bit_size(vi.type.struct_type, path)
                except ContractError:
                    return
                if isinstance(size, structs.NotFixedSize):
                    raise violation(E.NOT_FIXED_SIZE, size.path, "struct graph values need a fixed size")


# ------------------------------------------------------------------------------------------ wire
class StructTypesInUpstreamRange(Fault):
    """Puts ``ModelProto.struct_types`` at field 27, the next free upstream number, instead of the reserved
    local range: a conforming catalogue (field 1000) is invisible to it."""

    fault_id = "WIRE-LOCAL-RANGE.struct-types-at-27"
    clauses = ("WIRE-LOCAL-RANGE", "WIRE-FIELDS")

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, (), {1000: 27})


class LocalRangeParsedStrictly(Fault):
    """Parses the reserved local range strictly: an unknown field numbered 1000-1099 (another local
    extension) makes the model unparseable, although unknown upstream fields are kept."""

    fault_id = "WIRE-LOCAL-EXTENSION.local-range-strict"
    clauses = ("WIRE-LOCAL-EXTENSION",)
    prepares_writes = True

    def precheck(self, model, base_dir):
        from google.protobuf import unknown_fields

        pending = [model]
        while pending:
            message = pending.pop()
            for item in unknown_fields.UnknownFieldSet(message):
                if 1000 <= item.field_number <= 1099:
                    raise violation(E.MODEL_PARSE_ERROR, "model",
                                    f"unknown local extension field {item.field_number}")
            for descriptor, value in message.ListFields():
                if descriptor.message_type is None:
                    continue
                if isinstance(value, (list, tuple)) or hasattr(value, "extend"):
                    pending.extend(value)
                else:
                    pending.append(value)



# ------------------------------------------------------------------------------- whole values, fed values
class _TensorFieldsRetainedState(FaultState):
    def run(self, feeds):
        previous = dict(self.state._values)
        outputs = super().run(feeds)
        current = dict(self.state._values)
        for name, value in current.items():
            old = previous.get(name)
            if isinstance(value, StructValue) and isinstance(old, StructValue):
                # scalar fields (lengths, positions) are configuration to it: only tensors carry over
                fields = {field: old[field] if np.ndim(item) == 0 and field in old else item
                          for field, item in value.items()}
                current[name] = StructValue(fields, value.type_id)
        self.state._values = MappingProxyType(current)
        return outputs


class ScalarFieldsNotRetained(Fault):
    """Retains the tensor fields of a bound struct output but keeps the previous value's scalar fields
    (lengths, positions), as if only part of the struct were persistent."""

    fault_id = "BIND-WHOLE.scalar-fields-kept"
    clauses = ("BIND-WHOLE", "STATE-WHOLE-STRUCT")

    def make_state(self, handle):
        return _TensorFieldsRetainedState(handle.state, self)


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


class FedValuesDecodedGenerically(Fault):
    """Checks for a missing decoder when it loads encoded initializers, but a Decode node given a graph
    input whose type nobody registered falls back to reading every field as floats instead of failing."""

    fault_id = "DEC-MISSING-INPUT.fed-values-fallback"
    clauses = ("DEC-MISSING-INPUT", "DEC-MISSING")

    def patches(self):
        return [Patch(kernels.LOCAL_KERNELS, "Decode", _fed_values_fallback(kernels.make_decode))]


# ------------------------------------------------------------------------------------ more of the same
class DuplicatesFoundOnLookupOnly(Fault):
    """Keeps the catalogue as a multimap and reports a duplicate ID only when a reference looks it up:
    a repeated ID that no type_ref names is never noticed."""

    fault_id = "CAT-ID-UNIQUE.found-on-lookup-only"
    clauses = ("CAT-ID-UNIQUE",)

    def transform(self, model, base_dir):
        from conformance.audit.fault import struct_types

        referenced = {st.type_ref for st, _ in struct_types(model) if st.WhichOneof("kind") == "type_ref"}
        seen: set[int] = set()
        kept = []
        for decl in model.struct_types:
            if decl.type_id in seen and decl.type_id not in referenced:
                continue
            seen.add(decl.type_id)
            copy = type(decl)()
            copy.CopyFrom(decl)
            kept.append(copy)
        if len(kept) != len(model.struct_types):
            del model.struct_types[:]
            model.struct_types.extend(kept)


def _nested_check_without(skip_codecs: bool, branch_names: tuple[str, ...] | None):
    """The oracle's nested-declaration check as a runtime that skips codec bodies, or looks only at the
    named branch attributes (If's), would write it."""
    original = bindings._reject_nested_declarations

    def reject(model):
        probe = type(model)()
        probe.CopyFrom(model)
        if skip_codecs:
            for decl in probe.struct_types:
                decl.ClearField("decoder")
                decl.ClearField("encoder")
        if branch_names is not None:
            pending = list(probe.graph.node) + [n for f in probe.functions for n in f.node]
            while pending:
                node = pending.pop()
                for attr in node.attribute:
                    graphs = [attr.g] if attr.type == _GRAPH_ATTRIBUTES[0] else list(attr.graphs) \
                        if attr.type == _GRAPH_ATTRIBUTES[1] else []
                    for sub in graphs:
                        if attr.name not in branch_names:
                            del sub.persistent_bindings[:]
                        pending.extend(sub.node)
        return original(probe)
    return reject


class CodecBodiesNotScanned(Fault):
    """Never looks inside decoder and encoder bodies (it does not run them at load): persistent bindings
    declared in a subgraph of a codec body are not rejected."""

    fault_id = "BIND-ROOT-ONLY.codec-bodies-unscanned"
    clauses = ("BIND-ROOT-ONLY",)
    boundary = True

    def patches(self):
        return [Patch(bindings, "_reject_nested_declarations", _nested_check_without(True, None))]


class OnlyIfBranchesScanned(Fault):
    """Looks for nested bindings in If branches only (then_branch, else_branch): a Loop or Scan body
    declaring bindings is not rejected."""

    fault_id = "BIND-ROOT-ONLY.loop-bodies-unscanned"
    clauses = ("BIND-ROOT-ONLY",)
    boundary = True

    def patches(self):
        return [Patch(bindings, "_reject_nested_declarations",
                      _nested_check_without(False, ("then_branch", "else_branch")))]


class BindingsInUpstreamRange(Fault):
    """Puts ``GraphProto.persistent_bindings`` at field 18, in the upstream range, instead of the reserved
    local range: conforming bindings (1001) are unknown to it, so stateful models run stateless."""

    fault_id = "WIRE-LOCAL-RANGE.bindings-at-18"
    clauses = ("WIRE-LOCAL-RANGE", "WIRE-BINDINGS-FIELD")

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, (7,), {1001: 18})
