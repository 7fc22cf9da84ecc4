"""Faults in export to onnx-light and standard ONNX: what a writer preserves, strips or lowers."""

from __future__ import annotations

import os

from conformance.adapters.reference import ReferenceState
from conformance.audit.fault import Fault, Patch, fault, graphs, name_faults, wrap
from conformance.audit.faults.encoding import around, copied, refuse
from reference_impl import graph_utils, schema, verifier
from reference_impl.bindings import validate_bindings
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E


class DeferredErrorState(ReferenceState):
    """A state whose binding error is reported at the first call instead of when it was made."""

    def __init__(self, state, error: ContractError):
        super().__init__(state)
        self.error = error

    def run(self, feeds):
        raise self.error

    def values(self):
        raise self.error


def _opened_with_late_error(late):
    """An ``open_state`` that opens a model whose bindings fail with an error ``late(error)`` defers (the error the
    first call raises; None: not deferred) without its bindings."""
    def open_state(self, model_bytes, initial, base_dir=None):
        try:
            return Fault.open_state(self, model_bytes, initial, base_dir)
        except ContractError as error:
            deferred = late(error)
            if deferred is None:
                raise
            bare = _without_bindings(schema.parse_model(model_bytes))
            return DeferredErrorState(Fault.open_state(self, bare.SerializeToString(), {}, base_dir).state, deferred)
    return open_state


def _lowered(edit):
    """An ``export`` whose onnx-lowered result (model bytes, feedback mapping) is ``edit(data, feedback)``."""
    def export(self, model_bytes, target, base_dir=None):
        exported = Fault.export(self, model_bytes, target, base_dir)
        return edit(*exported) if target == "onnx-lowered" else exported
    return export


def _without_bindings(model):
    clone = copied(model)
    clone.graph.ClearField("persistent_bindings")
    return clone


def _strip_struct_typed(graph) -> None:
    for group in (graph.input, graph.output, graph.value_info):
        for info in group:
            if info.HasField("type") and verifier.contains_struct(info.type):
                info.ClearField("type")


def _strip_structured(model) -> None:
    model.ClearField("struct_types")
    model.graph.ClearField("encoded_initializer")
    _strip_struct_typed(model.graph)


def _strip_subgraphs(model) -> None:
    for graph in list(graphs(model))[1:]:
        graph.ClearField("encoded_initializer")
        graph.ClearField("persistent_bindings")
        _strip_struct_typed(graph)


def _payload_only(value) -> bytes:
    return bytes(value.raw_data) + b"".join(e.value.encode() if isinstance(e.value, str) else e.value
                                            for e in value.external_data)


def _profile_without(*fields):
    def semantic_profile(value) -> bytes:
        profile = copied(value)
        for field in ("name", "doc_string", *fields):
            profile.ClearField(field)
        return profile.SerializeToString(deterministic=True)
    return semantic_profile


def _stale_bindings(original):
    def rename_value(model, old, new):
        renamed = original(_without_bindings(model), old, new)
        renamed.graph.persistent_bindings.extend(model.graph.persistent_bindings)
        return renamed
    return rename_value


def _input_side_only(original):
    def rename_value(model, old, new):
        renamed = original(_without_bindings(model), old, new)
        for binding in model.graph.persistent_bindings:
            input_name = new if binding.input_name == old else binding.input_name
            renamed.graph.persistent_bindings.add(input_name=input_name, output_name=binding.output_name)
        validate_bindings(renamed)
        return renamed
    return rename_value


def _top_level_nodes_only(nodes, old, new):
    for node in nodes:
        for names in (node.input, node.output):
            for index, name in enumerate(names):
                if name == old:
                    names[index] = new


def _drops_dangling(error, after, **_):
    if error.code.value != "REWRITE_DROPS_BINDING":
        raise error
    inputs, outputs = {vi.name for vi in after.graph.input}, {vi.name for vi in after.graph.output}
    kept = [(b.input_name, b.output_name) for b in after.graph.persistent_bindings
            if b.input_name in inputs and b.output_name in outputs]
    del after.graph.persistent_bindings[:]
    for input_name, output_name in kept:
        after.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)


def _names_only(before, after):
    after_bindings = {(b.input_name, b.output_name) for b in after.graph.persistent_bindings}
    inputs, outputs = {vi.name for vi in after.graph.input}, {vi.name for vi in after.graph.output}
    for index, binding in enumerate(before.graph.persistent_bindings):
        if binding.input_name not in inputs or binding.output_name not in outputs \
                or (binding.input_name, binding.output_name) not in after_bindings:
            refuse(E.REWRITE_DROPS_BINDING, f"model.graph.persistent_bindings[{index}]",
                   "the rewrite removed a bound value")


def _strips_bindings(original):
    def export_standard(model, *, lower=False):
        exported = original(model, lower=True)
        return exported if lower else graph_utils.StandardExport(exported.model, ())
    return export_standard


def _lowered_with_bindings(data, feedback):
    lowered = schema.parse_model(data)
    for input_name, output_name in feedback:
        lowered.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)
    return lowered.SerializeToString(), feedback


def _offsets_dropped(model):
    for value in model.graph.encoded_initializer:
        kept = [(e.key, e.value) for e in value.external_data if e.key != "offset"]
        del value.external_data[:]
        for key, item in kept:
            value.external_data.add(key=key, value=item)


def _locations_flattened(model):
    for graph in graphs(model):
        for entry in (e for value in graph.encoded_initializer for e in value.external_data if e.key == "location"):
            entry.value = os.path.basename(entry.value.replace("\\", "/"))


def _last_binding_kept(model):
    bindings = list(model.graph.persistent_bindings)
    if len(bindings) > 1:
        del model.graph.persistent_bindings[:]
        model.graph.persistent_bindings.add().CopyFrom(bindings[-1])


class BindingsValidatedAtFirstRun(Fault):
    """Validates the bindings lazily, at the first run, instead of against the final graph before the state (session)
    is constructed."""

    fault_id = "EXP-VALIDATE-FINAL.validated-at-first-run"
    clauses = ("EXP-VALIDATE-FINAL",)
    open_state = _opened_with_late_error(lambda error: error if error.code.value.startswith("BINDING_") else None)


class BindingTypesCheckedAtFirstRun(Fault):
    """Checks only the binding names when the session is constructed; type and shape compatibility is found out when
    the first call publishes the output, which then fails."""

    fault_id = "EXP-VALIDATE-FINAL.types-checked-at-first-run"
    clauses = ("EXP-VALIDATE-FINAL", "BIND-COMPATIBLE")
    open_state = _opened_with_late_error(lambda error: violation(
        E.STATE_RUN_FAILED, error.path, f"{error.code.value}: {error.message}", causes=(error.code,))
        if error.code is E.BINDING_INCOMPATIBLE else None)


class LoweringKeepsBindings(Fault):
    """An explicit lowering returns the feedback mapping but serializes the lowered graph with its persistent_bindings
    still in place (field 1001): the "standard" model carries a local extension."""

    fault_id = "EXP-STANDARD.lowered-bindings-kept"
    clauses = ("EXP-STANDARD", "WIRE-LOCAL-EXTENSION")
    export = _lowered(_lowered_with_bindings)


class LoweredFeedbackReversed(Fault):
    """Returns the lowered export's feedback mapping as (output, input) pairs, the order of the dataflow, instead of the
    binding's (input, output): a caller-managed loop feeds the wrong way."""

    fault_id = "EXP-STANDARD.lowered-feedback-reversed"
    clauses = ("EXP-STANDARD", "STATE-EQUIV-LOOP")
    export = _lowered(lambda data, feedback: (data, [[output, input_] for input_, output in feedback]))


GraphCopyDropsBindings = fault("EXP-PRESERVE.copy-drops-bindings", ("EXP-PRESERVE",),
    """Copies graphs field by field and forgets the local persistent_bindings field, so every copy-based rewrite (and
    the copying save) loses the bindings.""", boundary=True,
    patches=lambda: [Patch(graph_utils, "copy_model", _without_bindings)])
SaveKeepsOneBinding = fault("EXP-PRESERVE.save-keeps-last-binding", ("EXP-PRESERVE",),
    """Writes persistent_bindings as a singular field when it saves a model (explicit save, round trip, onnx-light
    export): only the last binding survives.""", boundary=True, on_save=_last_binding_kept)
ExternalOffsetsDropped = fault("EXP-PRESERVE-STRUCT.external-offset-dropped", ("EXP-PRESERVE-STRUCT",),
    """Saves external payload entries without their offset (an optional key it treats as zero), so a structured value
    stored at an offset no longer points at its bytes.""", on_save=_offsets_dropped)
ExternalLocationFlattened = fault("EXP-PRESERVE-STRUCT.external-location-flattened", ("EXP-PRESERVE-STRUCT",),
    """Saves an external payload's ``location`` as the file's base name (as if every payload file sat next to the
    model), so a value stored in a subdirectory no longer points at its file.""", on_save=_locations_flattened)
DeduplicatesByPayload = fault("EXP-DEDUP.payload-bytes-only", ("EXP-DEDUP",),
    """Deduplicates encoded initializers by their payload bytes alone, merging values whose layouts or parameters
    differ.""", patches=lambda: [Patch(graph_utils, "_semantic_profile", _payload_only)])
DedupIgnoresLogicalType = fault("EXP-DEDUP.logical-type-ignored", ("EXP-DEDUP",),
    """Deduplicates encoded values by layout and payload but not logical type: two values with equal bytes and layout
    but different logical shapes (or element types) are merged.""",
    patches=lambda: [Patch(graph_utils, "_semantic_profile", _profile_without("logical_type"))])
DedupIgnoresExternalExtent = fault("EXP-DEDUP.external-extent-ignored", ("EXP-DEDUP", "EXP-PRESERVE-STRUCT"),
    """Deduplicates encoded values by layout, logical type and inline bytes, forgetting the external entries: two
    external values of one layout stored at different extents (both with empty raw_data) are merged.""",
    patches=lambda: [Patch(graph_utils, "_semantic_profile", _profile_without("external_data"))])
RenameLeavesBindingsStale = fault("EXP-RENAME.bindings-not-renamed", ("EXP-RENAME",),
    """Renames a value everywhere in the graph except in the persistent bindings.""",
    patches=lambda: [wrap(graph_utils, "rename_value", _stale_bindings)])
RenameUpdatesInputSideOnly = fault("EXP-RENAME.output-side-not-renamed", ("EXP-RENAME", "EXP-PRESERVE"),
    """Renaming updates a binding's ``input_name`` but not its ``output_name``: renaming a bound output leaves the
    binding naming an output that no longer exists (and the rename fails validation).""",
    patches=lambda: [wrap(graph_utils, "rename_value", _input_side_only)])
RenameSkipsSubgraphReferences = fault("EXP-RENAME.subgraph-references-stale", ("EXP-RENAME", "EXP-PRESERVE"),
    """Renames a value in the root graph's nodes, initializers, interface and bindings, but not where a control-flow
    subgraph reads it from the enclosing scope: the renamed model's branch refers to a value that no longer exists.""",
    boundary=True, patches=lambda: [Patch(graph_utils, "_rename_in_nodes", _top_level_nodes_only)])
RewriteDropsBindingsSilently = fault("EXP-REWRITE.dangling-bindings-dropped", ("EXP-REWRITE",),
    """Cleans up after a rewrite by silently dropping bindings whose input or output was removed or changed, instead of
    updating them consistently or failing.""",
    patches=lambda: [around(graph_utils, "check_rewrite", rescue=_drops_dangling)])
RewriteChecksNamesOnly = fault("EXP-REWRITE.retype-unnoticed", ("EXP-REWRITE", "EXP-VALIDATE-FINAL"),
    """After a rewrite, checks that every bound input and output is still there by name, and never revalidates the
    bindings: a rewrite that retypes a bound value keeps a binding whose two sides no longer agree.""",
    patches=lambda: [Patch(graph_utils, "check_rewrite", _names_only)])
StandardExportDropsStructures = fault("EXP-STRUCT.structured-values-stripped", ("EXP-STRUCT",),
    """Standard ONNX export strips struct declarations, encoded initializers and struct-typed values instead of refusing
    to lose them.""", patches=lambda: [Patch(graph_utils, "_reject_structured", _strip_structured)])
StandardExportChecksRootGraphOnly = fault("EXP-STRUCT.subgraph-constructs-dropped", ("EXP-STRUCT", "EXP-STANDARD"),
    """Standard ONNX export looks for structured constructs and bindings in the root graph only; what control-flow
    subgraphs carry (encoded constants, struct-typed values, nested bindings) is dropped by its plain-ONNX converter
    instead of being refused.""", boundary=True,
    patches=lambda: [around(graph_utils, "_reject_structured", before=lambda model: _strip_subgraphs(model))])
StandardExportDropsUnknownFields = fault("EXP-STRUCT.unknown-fields-dropped", ("EXP-STRUCT", "WIRE-LOCAL-EXTENSION"),
    """Converts to standard ONNX by reparsing with the upstream schema and never looks at what it could not represent:
    extension fields nested where the explicit checks do not look are silently dropped.""",
    patches=lambda: [Patch(graph_utils, "_has_unknown_fields", lambda message: False, aliases=False)])
StandardExportStripsBindings = fault("EXP-STANDARD.bindings-stripped", ("EXP-STANDARD",),
    """Standard ONNX export silently strips the persistent bindings instead of rejecting them (unless an explicit
    lowering is requested).""", patches=lambda: [wrap(graph_utils, "export_standard", _strips_bindings)])


name_faults(globals())
