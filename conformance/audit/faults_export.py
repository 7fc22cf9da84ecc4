"""Faults in export and rewrites: what an explicit save, a graph copy, a rename, a deduplication, a
rewrite and a standard ONNX export must keep or refuse."""

from __future__ import annotations

from conformance.audit.fault import Fault, Patch, wrap
from reference_impl import graph_utils, schema, verifier
from reference_impl.errors import ContractError


def _copy_without_bindings(model):
    clone = schema.ModelProto()
    clone.CopyFrom(model)
    clone.graph.ClearField("persistent_bindings")
    return clone


class GraphCopyDropsBindings(Fault):
    """Copies graphs field by field and forgets the local persistent_bindings field, so every copy-based
    rewrite (and the copying save) loses the bindings."""

    fault_id = "EXP-PRESERVE.copy-drops-bindings"
    clauses = ("EXP-PRESERVE",)
    boundary = True

    def patches(self):
        return [Patch(graph_utils, "copy_model", _copy_without_bindings)]


class ExternalOffsetsDropped(Fault):
    """Saves external payload entries without their offset (an optional key it treats as zero), so a
    structured value stored at an offset no longer points at its bytes."""

    fault_id = "EXP-PRESERVE-STRUCT.external-offset-dropped"
    clauses = ("EXP-PRESERVE-STRUCT",)

    def on_save(self, model):
        for value in model.graph.encoded_initializer:
            kept = [(e.key, e.value) for e in value.external_data if e.key != "offset"]
            del value.external_data[:]
            for key, item in kept:
                value.external_data.add(key=key, value=item)


def _payload_only(value) -> bytes:
    return bytes(value.raw_data) + b"".join(e.value.encode() if isinstance(e.value, str) else e.value
                                            for e in value.external_data)


class DeduplicatesByPayload(Fault):
    """Deduplicates encoded initializers by their payload bytes alone, merging values whose layouts or
    parameters differ."""

    fault_id = "EXP-DEDUP.payload-bytes-only"
    clauses = ("EXP-DEDUP",)

    def patches(self):
        return [Patch(graph_utils, "_semantic_profile", _payload_only)]


def _stale_bindings(original):
    def rename_value(model, old, new):
        bare = schema.ModelProto()
        bare.CopyFrom(model)
        bare.graph.ClearField("persistent_bindings")
        renamed = original(bare, old, new)
        renamed.graph.persistent_bindings.extend(model.graph.persistent_bindings)
        return renamed
    return rename_value


class RenameLeavesBindingsStale(Fault):
    """Renames a value everywhere in the graph except in the persistent bindings."""

    fault_id = "EXP-RENAME.bindings-not-renamed"
    clauses = ("EXP-RENAME",)

    def patches(self):
        return [wrap(graph_utils, "rename_value", _stale_bindings)]


def _drops_dangling(original):
    def check_rewrite(before, after):
        try:
            original(before, after)
        except ContractError as error:
            if error.code.value != "REWRITE_DROPS_BINDING":
                raise
            inputs = {vi.name for vi in after.graph.input}
            outputs = {vi.name for vi in after.graph.output}
            kept = [(b.input_name, b.output_name) for b in after.graph.persistent_bindings
                    if b.input_name in inputs and b.output_name in outputs]
            del after.graph.persistent_bindings[:]
            for input_name, output_name in kept:
                after.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)
    return check_rewrite


class RewriteDropsBindingsSilently(Fault):
    """Cleans up after a rewrite by silently dropping bindings whose input or output was removed or
    changed, instead of updating them consistently or failing."""

    fault_id = "EXP-REWRITE.dangling-bindings-dropped"
    clauses = ("EXP-REWRITE",)

    def patches(self):
        return [wrap(graph_utils, "check_rewrite", _drops_dangling)]


def _strip_structured(model) -> None:
    model.ClearField("struct_types")
    for graph in [model.graph]:
        graph.ClearField("encoded_initializer")
        for group in (graph.input, graph.output, graph.value_info):
            for info in group:
                if info.HasField("type") and verifier.contains_struct(info.type):
                    info.ClearField("type")


class StandardExportDropsStructures(Fault):
    """Standard ONNX export strips struct declarations, encoded initializers and struct-typed values
    instead of refusing to lose them."""

    fault_id = "EXP-STRUCT.structured-values-stripped"
    clauses = ("EXP-STRUCT",)

    def patches(self):
        return [Patch(graph_utils, "_reject_structured", _strip_structured)]


def _strips_bindings(original):
    def export_standard(model, *, lower=False):
        exported = original(model, lower=True)
        return exported if lower else graph_utils.StandardExport(exported.model, ())
    return export_standard


class StandardExportStripsBindings(Fault):
    """Standard ONNX export silently strips the persistent bindings instead of rejecting them (unless an
    explicit lowering is requested)."""

    fault_id = "EXP-STANDARD.bindings-stripped"
    clauses = ("EXP-STANDARD",)

    def patches(self):
        return [wrap(graph_utils, "export_standard", _strips_bindings)]
