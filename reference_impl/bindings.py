"""Validation and one-time resolution of ``GraphProto.persistent_bindings`` against the final graph.

Bindings name exact whole inputs and outputs of the root graph: dots and backslashes are literal, so
``cache.keys`` never selects a field of ``cache``. Every rejection has its own stable code, and all of
it happens before any state exists (clauses BIND-*).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import unknown_fields

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.structs import Catalogue
from reference_impl.values import Spec, compile_type, incompatibility, string_path

_GRAPH, _GRAPHS = 5, 10  # AttributeProto.GRAPH / GRAPHS
#: Field numbers an earlier draft of PersistentBindingProto used for field paths (input_field_path,
#: output_field_path). The frozen message has no such fields; onnx-light refuses them on parse.
_LEGACY_FIELD_PATHS = {3: "input_field_path", 4: "output_field_path"}


@dataclass(frozen=True)
class Binding:
    """One resolved binding: ``input_name <- output_name`` with the input's compiled type."""

    input_name: str
    output_name: str
    spec: Spec
    path: str


def validate_bindings(model, catalogue: Catalogue | None = None) -> tuple[Binding, ...]:
    """Check the model's bindings and resolve them once; raises ContractError (BINDING_*)."""
    if catalogue is None:
        catalogue = Catalogue(model.struct_types)
    graph = model.graph
    _reject_nested_declarations(model)
    inputs = {vi.name: vi for vi in graph.input}
    outputs = {vi.name: vi for vi in graph.output}
    seen_inputs: dict[str, int] = {}
    seen_outputs: dict[str, int] = {}
    resolved = []
    for index, binding in enumerate(graph.persistent_bindings):
        path = f"model.graph.persistent_bindings[{index}]"
        _reject_field_selection(binding, path)
        _check_name(binding.input_name, inputs, f"{path}.input_name", "input")
        _check_name(binding.output_name, outputs, f"{path}.output_name", "output")
        if binding.input_name in seen_inputs:
            raise violation(E.BINDING_INPUT_DUPLICATE, f"{path}.input_name",
                            f"input {binding.input_name!r} is already selected by binding "
                            f"{seen_inputs[binding.input_name]}")
        if binding.output_name in seen_outputs:
            raise violation(E.BINDING_OUTPUT_DUPLICATE, f"{path}.output_name",
                            f"output {binding.output_name!r} is already selected by binding "
                            f"{seen_outputs[binding.output_name]}")
        seen_inputs[binding.input_name] = index
        seen_outputs[binding.output_name] = index
        in_vi, out_vi = inputs[binding.input_name], outputs[binding.output_name]
        if not in_vi.HasField("type") or not out_vi.HasField("type"):
            raise violation(E.BINDING_INCOMPATIBLE, path, "bound inputs and outputs need declared types")
        in_spec = compile_type(in_vi.type, catalogue, f"model.graph.input[{binding.input_name!r}].type")
        out_spec = compile_type(out_vi.type, catalogue, f"model.graph.output[{binding.output_name!r}].type")
        for spec, side, name in ((in_spec, "input", binding.input_name),
                                 (out_spec, "output", binding.output_name)):
            where = string_path(spec, name)
            if where:
                raise violation(E.BINDING_STRING, f"{path}.{side}_name",
                                f"persistent value contains a string tensor at {where}")
        reason = incompatibility(in_spec, out_spec)
        if reason:
            raise violation(E.BINDING_INCOMPATIBLE, path,
                            f"{binding.input_name!r} <- {binding.output_name!r}: {reason}")
        resolved.append(Binding(binding.input_name, binding.output_name, in_spec, path))
    return tuple(resolved)


def _reject_field_selection(binding, path: str) -> None:
    """A binding carrying the legacy field-path tags selects part of a value: partial selection is
    unsupported, and reading it as a whole-value binding would silently retain the wrong thing."""
    for item in unknown_fields.UnknownFieldSet(binding):
        legacy = _LEGACY_FIELD_PATHS.get(item.field_number)
        if legacy is not None:
            raise violation(E.BINDING_NAME_UNKNOWN, f"{path}.{legacy}",
                            f"field {item.field_number} ({legacy}) selects part of a value; partial field "
                            "selection is unsupported, bindings name whole inputs and outputs")


def _check_name(name: str, declared: dict, path: str, side: str) -> None:
    if name in declared:
        return
    message = f"{name!r} is not a whole {side} of the root graph"
    head = _field_prefix(name, declared)
    if head is not None:
        message += (f"; {head!r} is a struct {side} but partial field selection is unsupported "
                    "(dots and backslashes are literal)")
    raise violation(E.BINDING_NAME_UNKNOWN, path, message)


def _field_prefix(name: str, declared: dict) -> str | None:
    """The declared struct value a dotted name seems to reach into, to explain the rejection."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        vi = declared.get(head)
        if vi is not None and vi.type.WhichOneof("value") == "struct_type":
            return head
    return None


def _reject_nested_declarations(model) -> None:
    """Bindings are root-graph only: reject them in any subgraph, function body or codec body."""
    pending = [(node, f"model.graph.node[{i}]") for i, node in enumerate(model.graph.node)]
    for f_index, function in enumerate(model.functions):
        pending += [(node, f"model.functions[{f_index}].node[{i}]") for i, node in enumerate(function.node)]
    for t_index, decl in enumerate(model.struct_types):
        for codec in ("decoder", "encoder"):
            if decl.HasField(codec):
                body = getattr(decl, codec)
                pending += [(node, f"model.struct_types[{t_index}].{codec}.node[{i}]")
                            for i, node in enumerate(body.node)]
    while pending:
        node, path = pending.pop()
        for attr in node.attribute:
            graphs = [attr.g] if attr.type == _GRAPH else list(attr.graphs) if attr.type == _GRAPHS else []
            for g_index, sub in enumerate(graphs):
                suffix = f"[{g_index}]" if attr.type == _GRAPHS else ""
                sub_path = f"{path}.attribute[{attr.name!r}]{suffix}"
                if len(sub.persistent_bindings):
                    raise violation(E.BINDING_IN_SUBGRAPH, f"{sub_path}.persistent_bindings",
                                    "persistent bindings are supported on the root graph only")
                pending += [(inner, f"{sub_path}.node[{i}]") for i, inner in enumerate(sub.node)]
