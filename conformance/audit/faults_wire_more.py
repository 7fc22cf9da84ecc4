"""More faults in the wire format and the model-level rules: binding and encoded-value field numbers,
initializer names, what an explicit save writes, renames, deduplication profiles, standard export of
nested constructs, rewrite checks, graph-level struct I/O and the missing-decoder path."""

from __future__ import annotations

import os

import numpy as np

from conformance.audit.fault import Fault, Patch, decode_module, graphs, wrap
from conformance.audit.wire_edit import renumber
from reference_impl import dtypes, graph_utils, schema, verifier
from reference_impl.bindings import validate_bindings
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.records import compile_layout
from reference_impl.structs import struct_kind
from reference_impl.tensors import to_array

_BINDINGS = (7, 1001)             # GraphProto.persistent_bindings
_ENCODED = (7, 1000)              # GraphProto.encoded_initializer


# ------------------------------------------------------------------------------------------ wire
class BindingNamesSwapped(Fault):
    """Declares ``PersistentBindingProto`` with ``output_name = 1`` and ``input_name = 2`` (the pair
    written in dataflow order, output feeding input): every binding reads back to front."""

    fault_id = "WIRE-BINDINGS-FIELD.binding-names-swapped"
    clauses = ("WIRE-BINDINGS-FIELD", "WIRE-SCHEMA")

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, _BINDINGS, {1: 2, 2: 1})


class EncodedNameAndDocSwapped(Fault):
    """Declares ``EncodedValueProto.doc_string = 7`` and ``name = 8`` against the frozen schema: a value's
    name is read from its (usually absent) documentation field."""

    fault_id = "WIRE-SCHEMA.encoded-name-doc-swapped"
    clauses = ("WIRE-SCHEMA",)

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, _ENCODED, {7: 8, 8: 7})


def _merge_repeated(repeated) -> None:
    """What a parser declaring the field singular does with several occurrences: merges them into one."""
    if len(repeated) < 2:
        return
    merged = type(repeated[0])()
    for item in repeated:
        merged.MergeFrom(item)
    del repeated[:]
    repeated.add().CopyFrom(merged)


class BindingsFieldSingular(Fault):
    """Declares ``persistent_bindings = 1001`` as a singular message instead of a repeated one: several
    bindings on the wire merge into one (the last names win), so only one pair is ever bound."""

    fault_id = "WIRE-BINDINGS-FIELD.singular-field"
    clauses = ("WIRE-BINDINGS-FIELD",)

    def transform(self, model, base_dir):
        _merge_repeated(model.graph.persistent_bindings)


class EncodedInitializerFieldSingular(Fault):
    """Declares ``GraphProto.encoded_initializer = 1000`` as a singular message: a graph's several encoded
    initializers merge into one value (the last name, layout and payload win; external entries
    accumulate)."""

    fault_id = "WIRE-FIELDS.encoded-initializer-singular"
    clauses = ("WIRE-FIELDS",)

    def transform(self, model, base_dir):
        for graph in graphs(model):
            _merge_repeated(graph.encoded_initializer)


# ---------------------------------------------------------------------------------- initializer names
def _names_without_sparse(original):
    return lambda graph, path: [(where, name) for where, name in original(graph, path)
                                if ".sparse_initializer[" not in where]


class SparseNamesNotCounted(Fault):
    """Checks initializer names across dense and encoded initializers but forgets sparse ones (whose
    name lives in ``values.name``): an encoded value reusing a sparse initializer's name is accepted."""

    fault_id = "INIT-NAMES-UNIQUE.sparse-not-counted"
    clauses = ("INIT-NAMES-UNIQUE",)

    def patches(self):
        return [wrap(verifier, "_initializer_names", _names_without_sparse)]


def _sparse_indices_names(original):
    def initializer_names(graph, path):
        indices = iter(sparse.indices.name for sparse in graph.sparse_initializer)
        return [(where, next(indices) if ".sparse_initializer[" in where else name)
                for where, name in original(graph, path)]
    return initializer_names


class SparseNameReadFromIndices(Fault):
    """Takes a sparse initializer's name from its ``indices`` tensor instead of its ``values`` tensor:
    the real name is never compared, and unnamed indices make two sparse initializers collide."""

    fault_id = "INIT-NAMES-UNIQUE.sparse-name-from-indices"
    clauses = ("INIT-NAMES-UNIQUE",)

    def patches(self):
        return [wrap(verifier, "_initializer_names", _sparse_indices_names)]


def _case_folded(original):
    def check_initializer_names(graph, path):
        original(graph, path)
        seen: set[str] = set()
        groups = [t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer]
        for name in groups + [v.name for v in graph.encoded_initializer]:
            if name.casefold() in seen:
                raise violation(E.INITIALIZER_NAME_DUPLICATE, path, f"name {name!r} is already used")
            seen.add(name.casefold())
    return check_initializer_names


class NamesComparedCaseInsensitively(Fault):
    """Keeps initializer names in a case-insensitive table (as a file-system-backed store would): two
    distinct names that differ only in case are refused as duplicates."""

    fault_id = "INIT-NAMES-UNIQUE.case-insensitive"
    clauses = ("INIT-NAMES-UNIQUE", "INIT-AS-INPUT")

    def patches(self):
        return [wrap(verifier, "_check_initializer_names", _case_folded)]


class DenseInitializerInputRejected(Fault):
    """Allows an initializer to double as a graph input only for encoded initializers: a dense or sparse
    initializer also listed among the graph inputs is refused as a duplicate name."""

    fault_id = "INIT-AS-INPUT.dense-input-rejected"
    clauses = ("INIT-AS-INPUT",)

    def precheck(self, model, base_dir):
        for graph in graphs(model):
            inputs = {vi.name for vi in graph.input}
            names = [t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer]
            for name in names:
                if name in inputs:
                    raise violation(E.INITIALIZER_NAME_DUPLICATE, "model.graph", f"{name!r} is also a graph input")


class NamesUncheckedInFunctionBodies(Fault):
    """Checks initializer names in the root graph and the subgraphs of its nodes, but not in the
    control-flow subgraphs of function bodies (walked by a second loop that only validates values)."""

    fault_id = "INIT-NAMES-UNIQUE.function-subgraphs-skipped"
    clauses = ("INIT-NAMES-UNIQUE",)
    boundary = True

    def patches(self):
        def make(original):
            return lambda graph, path: None if path.startswith("model.functions") else original(graph, path)
        return [wrap(verifier, "_check_initializer_names", make)]


# --------------------------------------------------------------------------------------------- save
class SubgraphEncodedValuesDropped(Fault):
    """Serializes ``encoded_initializer`` only for the root graph: the encoded constants of control-flow
    subgraphs are lost by an explicit save."""

    fault_id = "WIRE-ROUNDTRIP.subgraph-encoded-dropped"
    clauses = ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT")
    boundary = True

    def on_save(self, model):
        for graph in list(graphs(model))[1:]:
            graph.ClearField("encoded_initializer")


class DeclarationFieldsSortedOnSave(Fault):
    """Writes each catalogue declaration's structure fields from a name-keyed map, so a saved model lists
    them in name order: records laid out in declaration order read differently after a round trip."""

    fault_id = "WIRE-ROUNDTRIP.declaration-fields-sorted"
    clauses = ("WIRE-ROUNDTRIP", "EXP-STRUCT")

    def on_save(self, model):
        for decl in model.struct_types:
            if decl.WhichOneof("kind") != "structure":
                continue
            ordered = []
            for field in sorted(decl.structure.field, key=lambda f: f.name):
                copy = type(field)()
                copy.CopyFrom(field)
                ordered.append(copy)
            del decl.structure.field[:]
            decl.structure.field.extend(ordered)


class ExternalLocationFlattened(Fault):
    """Saves an external payload's ``location`` as the file's base name (as if every payload file sat
    next to the model), so a value stored in a subdirectory no longer points at its file."""

    fault_id = "EXP-PRESERVE-STRUCT.external-location-flattened"
    clauses = ("EXP-PRESERVE-STRUCT",)

    def on_save(self, model):
        for graph in graphs(model):
            for value in graph.encoded_initializer:
                for entry in value.external_data:
                    if entry.key == "location":
                        entry.value = os.path.basename(entry.value.replace("\\", "/"))


class ExternalDataLocationDropped(Fault):
    """Writes ``data_location`` only when it differs from what it assumes is the default, comparing with
    EXTERNAL instead of DEFAULT: an external value is saved with external entries but no EXTERNAL
    marker."""

    fault_id = "WIRE-ROUNDTRIP.external-location-marker-dropped"
    clauses = ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT")

    def on_save(self, model):
        for graph in graphs(model):
            for value in graph.encoded_initializer:
                if value.data_location == schema.TensorProto.EXTERNAL:
                    value.ClearField("data_location")


class StructLogicalTypesDroppedOnSave(Fault):
    """Writes ``logical_type`` only for affine values (where it is required to decode), so a struct-layout
    value saved explicitly loses the logical type its decoder's output is checked against."""

    fault_id = "WIRE-ROUNDTRIP.struct-logical-type-dropped"
    clauses = ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT")

    def on_save(self, model):
        for graph in graphs(model):
            for value in graph.encoded_initializer:
                if value.WhichOneof("layout") == "struct_type":
                    value.ClearField("logical_type")


class SparseInitializersDensifiedOnSave(Fault):
    """Writes every sparse initializer as the dense TensorProto it stands for (zeros filled in) when it
    saves: existing sparse values do not survive unmigrated."""

    fault_id = "REP-TENSORPROTO-COMPAT.sparse-densified-on-save"
    clauses = ("REP-TENSORPROTO-COMPAT", "WIRE-ROUNDTRIP")

    def on_save(self, model):
        for graph in graphs(model):
            for sparse in graph.sparse_initializer:
                values = to_array(sparse.values, "sparse.values").reshape(-1)
                indices = to_array(sparse.indices, "sparse.indices")
                dense = np.zeros(int(np.prod(list(sparse.dims))), dtype=values.dtype)
                if indices.ndim == 2:  # coordinate form: one row per value
                    indices = np.ravel_multi_index(tuple(indices.T), tuple(sparse.dims))
                dense[indices.reshape(-1)] = values
                tensor = graph.initializer.add(name=sparse.values.name, data_type=sparse.values.data_type)
                tensor.dims.extend(sparse.dims)
                tensor.raw_data = dense.tobytes()
            graph.ClearField("sparse_initializer")


# ------------------------------------------------------------------------------------- rename, dedup
def _input_side_only(original):
    def rename_value(model, old, new):
        bare = schema.ModelProto()
        bare.CopyFrom(model)
        bare.graph.ClearField("persistent_bindings")
        renamed = original(bare, old, new)
        for binding in model.graph.persistent_bindings:
            input_name = new if binding.input_name == old else binding.input_name
            renamed.graph.persistent_bindings.add(input_name=input_name, output_name=binding.output_name)
        validate_bindings(renamed)
        return renamed
    return rename_value


class RenameUpdatesInputSideOnly(Fault):
    """Renaming updates a binding's ``input_name`` but not its ``output_name``: renaming a bound output
    leaves the binding naming an output that no longer exists (and the rename fails validation)."""

    fault_id = "EXP-RENAME.output-side-not-renamed"
    clauses = ("EXP-RENAME", "EXP-PRESERVE")

    def patches(self):
        return [wrap(graph_utils, "rename_value", _input_side_only)]


def _profile_without(*fields):
    def semantic_profile(value) -> bytes:
        profile = schema.EncodedValueProto()
        profile.CopyFrom(value)
        for field in ("name", "doc_string", *fields):
            profile.ClearField(field)
        return profile.SerializeToString(deterministic=True)
    return semantic_profile


class DedupIgnoresLogicalType(Fault):
    """Deduplicates encoded values by layout and payload but not logical type: two values with equal
    bytes and layout but different logical shapes (or element types) are merged."""

    fault_id = "EXP-DEDUP.logical-type-ignored"
    clauses = ("EXP-DEDUP",)

    def patches(self):
        return [Patch(graph_utils, "_semantic_profile", _profile_without("logical_type"))]


class DedupIgnoresExternalExtent(Fault):
    """Deduplicates encoded values by layout, logical type and inline bytes, forgetting the external
    entries: two external values of one layout stored at different extents (both with empty raw_data)
    are merged."""

    fault_id = "EXP-DEDUP.external-extent-ignored"
    clauses = ("EXP-DEDUP", "EXP-PRESERVE-STRUCT")

    def patches(self):
        return [Patch(graph_utils, "_semantic_profile", _profile_without("external_data"))]


def _top_level_subgraphs_only(original):
    def rename_in_nodes(nodes, old, new):
        for node in nodes:
            for index, name in enumerate(node.input):
                if name == old:
                    node.input[index] = new
            for index, name in enumerate(node.output):
                if name == old:
                    node.output[index] = new
    return rename_in_nodes


class RenameSkipsSubgraphReferences(Fault):
    """Renames a value in the root graph's nodes, initializers, interface and bindings, but not where a
    control-flow subgraph reads it from the enclosing scope: the renamed model's branch refers to a value
    that no longer exists."""

    fault_id = "EXP-RENAME.subgraph-references-stale"
    clauses = ("EXP-RENAME", "EXP-PRESERVE")
    boundary = True

    def patches(self):
        return [wrap(graph_utils, "_rename_in_nodes", _top_level_subgraphs_only)]


# ----------------------------------------------------------------------------------- standard export
def _root_only(original):
    def reject_structured(model):
        for graph in list(graphs(model))[1:]:
            graph.ClearField("encoded_initializer")
            graph.ClearField("persistent_bindings")
            for group in (graph.input, graph.output, graph.value_info):
                for info in group:
                    if info.HasField("type") and verifier.contains_struct(info.type):
                        info.ClearField("type")
        return original(model)
    return reject_structured


class StandardExportChecksRootGraphOnly(Fault):
    """Standard ONNX export looks for structured constructs and bindings in the root graph only; what
    control-flow subgraphs carry (encoded constants, struct-typed values, nested bindings) is dropped by
    its plain-ONNX converter instead of being refused."""

    fault_id = "EXP-STRUCT.subgraph-constructs-dropped"
    clauses = ("EXP-STRUCT", "EXP-STANDARD")
    boundary = True

    def patches(self):
        return [wrap(graph_utils, "_reject_structured", _root_only)]


class LoweringKeepsBindings(Fault):
    """An explicit lowering returns the feedback mapping but serializes the lowered graph with its
    persistent_bindings still in place (field 1001): the "standard" model carries a local extension."""

    fault_id = "EXP-STANDARD.lowered-bindings-kept"
    clauses = ("EXP-STANDARD", "WIRE-LOCAL-EXTENSION")

    def export(self, model_bytes, target, base_dir=None):
        exported = super().export(model_bytes, target, base_dir)
        if target != "onnx-lowered":
            return exported
        data, feedback = exported
        lowered = schema.parse_model(data)
        for input_name, output_name in feedback:
            lowered.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)
        return lowered.SerializeToString(), feedback


class LoweredFeedbackReversed(Fault):
    """Returns the lowered export's feedback mapping as (output, input) pairs, the order of the
    dataflow, instead of the binding's (input, output): a caller-managed loop feeds the wrong way."""

    fault_id = "EXP-STANDARD.lowered-feedback-reversed"
    clauses = ("EXP-STANDARD", "STATE-EQUIV-LOOP")

    def export(self, model_bytes, target, base_dir=None):
        exported = super().export(model_bytes, target, base_dir)
        if target != "onnx-lowered":
            return exported
        data, feedback = exported
        return data, [[output, input_] for input_, output in feedback]


# -------------------------------------------------------------------------------------------- rewrite
def _names_only(original):
    def check_rewrite(before, after):
        after_bindings = {(b.input_name, b.output_name) for b in after.graph.persistent_bindings}
        inputs = {vi.name for vi in after.graph.input}
        outputs = {vi.name for vi in after.graph.output}
        for index, binding in enumerate(before.graph.persistent_bindings):
            path = f"model.graph.persistent_bindings[{index}]"
            if binding.input_name not in inputs or binding.output_name not in outputs \
                    or (binding.input_name, binding.output_name) not in after_bindings:
                raise violation(E.REWRITE_DROPS_BINDING, path, "the rewrite removed a bound value")
    return check_rewrite


class RewriteChecksNamesOnly(Fault):
    """After a rewrite, checks that every bound input and output is still there by name, and never
    revalidates the bindings: a rewrite that retypes a bound value keeps a binding whose two sides no
    longer agree."""

    fault_id = "EXP-REWRITE.retype-unnoticed"
    clauses = ("EXP-REWRITE", "EXP-VALIDATE-FINAL")

    def patches(self):
        return [wrap(graph_utils, "check_rewrite", _names_only)]


# ------------------------------------------------------------------------------------ graph struct I/O
def _inputs_only(original):
    def verify_graph(graph, path, verified):
        # the reference's own walk over a copy whose outputs and value_info carry no struct type to check
        probe = type(graph)()
        probe.CopyFrom(graph)
        for group in (probe.output, probe.value_info):
            for info in group:
                if info.HasField("type") and verifier.contains_struct(info.type):
                    info.ClearField("type")
        return original(probe, path, verified)
    return verify_graph


def _root_io_only(original):
    def verify_graph(graph, path, verified):
        if path == "model.graph":
            return original(graph, path, verified)
        probe = type(graph)()
        probe.CopyFrom(graph)
        for group in (probe.input, probe.output, probe.value_info):
            for info in group:
                if info.HasField("type") and verifier.contains_struct(info.type):
                    info.ClearField("type")
        return original(probe, path, verified)
    return verify_graph


class SubgraphIoStructTypesUnchecked(Fault):
    """Validates the struct types of the root graph's inputs, outputs and value_info, but walks
    control-flow subgraphs only for their initializers and nodes: a branch or loop body typed by an
    undeclared or malformed struct is accepted."""

    fault_id = "GRAPH-STRUCT-IO.subgraph-io-unchecked"
    clauses = ("GRAPH-STRUCT-IO",)
    boundary = True

    def patches(self):
        return [wrap(verifier, "_verify_graph", _root_io_only)]


class StructOutputTypesUnchecked(Fault):
    """Validates the struct types of graph inputs (which it must bind to feeds) but not of graph outputs
    and value_info: an output or intermediate typed by an undeclared or malformed struct is accepted."""

    fault_id = "GRAPH-STRUCT-IO.outputs-unchecked"
    clauses = ("GRAPH-STRUCT-IO",)

    def patches(self):
        return [wrap(verifier, "_verify_graph", _inputs_only)]


def _top_level_struct(tp) -> bool:
    return tp.WhichOneof("value") == "struct_type"


class NestedIoStructTypesUnchecked(Fault):
    """Validates a graph value's struct type only when the value itself is a struct: a struct nested as
    the element of a sequence, an optional or a map value on a graph input or output is never checked."""

    fault_id = "GRAPH-STRUCT-IO.nested-io-unchecked"
    clauses = ("GRAPH-STRUCT-IO",)
    boundary = True

    def patches(self):
        return [Patch(verifier, "contains_struct", _top_level_struct, aliases=False)]


# ---------------------------------------------------------------------------------------- decoders
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


class MissingDecoderYieldsBytes(Fault):
    """A struct value nobody registered a decoder for, whose logical type is a UINT8 tensor, decodes to
    its payload bytes (a "bytes view" fallback for byte-typed values) instead of failing explicitly for
    the missing consumer; other logical types still fail."""

    fault_id = "DEC-MISSING.uint8-bytes-view"
    clauses = ("DEC-MISSING",)

    def patches(self):
        return [wrap(decode_module, "decode_value", _bytes_view)]


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


class InlineLayoutMatchedToRegisteredDecoder(Fault):
    """Finds a decoder for an inline layout by comparing its compiled layout with every registration's:
    an inline copy of a registered declaration is decoded by that type's decoder, although bindings are
    keyed by type_id and an inline layout has none."""

    fault_id = "DEC-KEYED.inline-matched-by-layout"
    clauses = ("DEC-KEYED", "DEC-INLINE-CODEC")

    def patches(self):
        return [wrap(decode_module, "decode_value", _by_layout)]


class PayloadLengthCachedPerType(Fault):
    """Sizes each saved struct payload from a per-type_ref cache filled by the first value of that type:
    a later value sharing the type ID but holding more or fewer records is saved truncated or
    zero-padded to the first value's length."""

    fault_id = "WIRE-ROUNDTRIP.payload-length-per-type"
    clauses = ("WIRE-ROUNDTRIP",)

    def on_save(self, model):
        lengths: dict[int, int] = {}
        for graph in graphs(model):
            for value in graph.encoded_initializer:
                if value.WhichOneof("layout") != "struct_type" or struct_kind(value.struct_type) != "type_ref" \
                        or value.external_data:
                    continue
                size = lengths.setdefault(value.struct_type.type_ref, len(value.raw_data))
                value.raw_data = bytes(value.raw_data[:size]).ljust(size, b"\0")


class StandardExportDropsUnknownFields(Fault):
    """Converts to standard ONNX by reparsing with the upstream schema and never looks at what it could
    not represent: extension fields nested where the explicit checks do not look are silently dropped."""

    fault_id = "EXP-STRUCT.unknown-fields-dropped"
    clauses = ("EXP-STRUCT", "WIRE-LOCAL-EXTENSION")

    def patches(self):
        return [Patch(graph_utils, "_has_unknown_fields", lambda message: False, aliases=False)]
