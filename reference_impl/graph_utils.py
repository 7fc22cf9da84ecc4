"""Graph utilities that must keep persistent bindings intact: save/load, copy, rename, rewrite, and
standard ONNX export with explicit lowering.

A rename updates the bindings it touches; a rewrite that removes or retypes a bound input/output fails
instead of dropping the binding; standard export rejects bindings unless asked to lower them to a
stateless model plus the feedback mapping a caller-managed loop applies (clauses EXP-*).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from reference_impl import schema
from reference_impl.bindings import validate_bindings
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.structs import Catalogue
from reference_impl.values import compile_type
from reference_impl.verifier import contains_struct

_GRAPH, _GRAPHS = 5, 10


# ---------------------------------------------------------------------------------- save, load, copy
def save_model(model, path: str | os.PathLike) -> None:
    """Explicit save: the only place bindings are serialized."""
    with open(path, "wb") as handle:
        handle.write(model.SerializeToString())


def load_model(path: str | os.PathLike):
    """Explicit load into the extended ModelProto (bindings included)."""
    with open(path, "rb") as handle:
        return schema.parse_model(handle.read())


def copy_model(model):
    """An explicit deep copy; bindings travel with the graph."""
    clone = schema.ModelProto()
    clone.CopyFrom(model)
    return clone


# -------------------------------------------------------------------------------------------- rename
def rename_value(model, old: str, new: str):
    """A copy of ``model`` where the root-graph value ``old`` is called ``new`` everywhere it is
    referenced (nodes, nested subgraphs that see it, initializers, value_info, bindings)."""
    graph = model.graph
    names = _defined_names(graph)
    if old not in names:
        raise violation(E.REWRITE_NAME_CONFLICT, f"model.graph[{old!r}]",
                        f"{old!r} is not a value of the root graph")
    if new in names:
        raise violation(E.REWRITE_NAME_CONFLICT, f"model.graph[{new!r}]",
                        f"renaming {old!r} to {new!r} would merge two values")
    clone = copy_model(model)
    graph = clone.graph
    for group in (graph.input, graph.output, graph.value_info, graph.initializer, graph.encoded_initializer):
        for item in group:
            if item.name == old:
                item.name = new
    for sparse in graph.sparse_initializer:
        if sparse.values.name == old:
            sparse.values.name = new
    _rename_in_nodes(graph.node, old, new)
    for binding in graph.persistent_bindings:
        if binding.input_name == old:
            binding.input_name = new
        if binding.output_name == old:
            binding.output_name = new
    validate_bindings(clone)
    return clone


def _defined_names(graph) -> set[str]:
    names = {vi.name for vi in graph.input} | {vi.name for vi in graph.output}
    names |= {t.name for t in graph.initializer} | {t.name for t in graph.encoded_initializer}
    for node in graph.node:
        names.update(node.output)
    return names


def _rename_in_nodes(nodes, old: str, new: str) -> None:
    for node in nodes:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new
        for index, name in enumerate(node.output):
            if name == old:
                node.output[index] = new
        for sub in _subgraphs(node):
            local = {vi.name for vi in sub.input} | {t.name for t in sub.initializer}
            local |= {out for inner in sub.node for out in inner.output}
            if old in local:
                continue  # shadowed: the subgraph's own value, not the outer one
            _rename_in_nodes(sub.node, old, new)
            for out in sub.output:
                if out.name == old:
                    out.name = new


def _subgraphs(node) -> Iterator[Any]:
    for attr in node.attribute:
        if attr.type == _GRAPH:
            yield attr.g
        elif attr.type == _GRAPHS:
            yield from attr.graphs


# --------------------------------------------------------------------------------------- deduplicate
def deduplicate_initializers(model):
    """A copy where encoded initializers equal in every semantic respect (layout and its parameters,
    logical type, payload bytes or external extent) are merged into the first; node inputs naming the
    others are renamed to it (clause EXP-DEDUP). Equal payload bytes alone never merge two values, and a
    value that is also a graph input or output keeps its own name."""
    clone = copy_model(model)
    graph = clone.graph
    interface = {vi.name for vi in graph.input} | {vi.name for vi in graph.output}
    first_by_profile: dict[bytes, str] = {}
    survivors, merged = [], {}
    for value in graph.encoded_initializer:
        first = first_by_profile.setdefault(_semantic_profile(value), value.name)
        if first == value.name or value.name in interface:
            survivors.append(value)
        else:
            merged[value.name] = first
    if merged:
        del graph.encoded_initializer[:]
        graph.encoded_initializer.extend(survivors)
        for old, new in merged.items():
            _rename_in_nodes(graph.node, old, new)
        check_rewrite(model, clone)
    return clone


def _semantic_profile(value) -> bytes:
    """Everything that gives an encoded value its meaning, without its name and documentation."""
    profile = schema.EncodedValueProto()
    profile.CopyFrom(value)
    profile.ClearField("name")
    profile.ClearField("doc_string")
    return profile.SerializeToString(deterministic=True)


# ------------------------------------------------------------------------------------------- rewrite
def apply_rewrite(model, rewrite: Callable[[Any], Any]):
    """Run ``rewrite`` on a copy (it may mutate the copy or return a new model), then check that every
    binding survived with its bound input/output present and unchanged."""
    clone = copy_model(model)
    result = rewrite(clone)
    result = result if isinstance(result, schema.ModelProto) else clone
    check_rewrite(model, result)
    return result


def unbind(model, input_name: str):
    """Remove the binding of ``input_name`` on purpose: an explicit unbinding (authoring the declaration),
    not a silent drop. Every other binding must survive unchanged, as in any rewrite."""
    edited = copy_model(model)
    keep = [b for b in edited.graph.persistent_bindings if b.input_name != input_name]
    if len(keep) == len(edited.graph.persistent_bindings):
        raise violation(E.BINDING_NAME_UNKNOWN, "model.graph.persistent_bindings", f"no binding selects {input_name!r}")
    del edited.graph.persistent_bindings[:]
    edited.graph.persistent_bindings.extend(keep)
    return apply_rewrite(edited, lambda m: None)


def check_rewrite(before, after) -> None:
    """Fail with REWRITE_DROPS_BINDING when a rewrite removed, retyped or unbound a bound value."""
    before_types = _bound_types(before)
    after_bindings = {(b.input_name, b.output_name) for b in after.graph.persistent_bindings}
    after_inputs = {vi.name: vi for vi in after.graph.input}
    after_outputs = {vi.name: vi for vi in after.graph.output}
    catalogue = Catalogue(after.struct_types)
    for index, binding in enumerate(before.graph.persistent_bindings):
        path = f"model.graph.persistent_bindings[{index}]"
        for side, name, declared in (("input", binding.input_name, after_inputs),
                                     ("output", binding.output_name, after_outputs)):
            if name not in declared:
                raise violation(E.REWRITE_DROPS_BINDING, path, f"the rewrite removed bound {side} {name!r}")
            was = before_types[(side, name)]
            now = compile_type(declared[name].type if declared[name].HasField("type") else None,
                               catalogue, f"{side} {name!r}")
            if was != now:
                raise violation(E.REWRITE_DROPS_BINDING, path,
                                f"the rewrite changed the type of bound {side} {name!r}")
        if (binding.input_name, binding.output_name) not in after_bindings:
            raise violation(E.REWRITE_DROPS_BINDING, path,
                            f"the rewrite dropped binding {binding.input_name!r} <- {binding.output_name!r}")
    validate_bindings(after, catalogue)


def _bound_types(model) -> dict[tuple[str, str], Any]:
    catalogue = Catalogue(model.struct_types)
    inputs = {vi.name: vi for vi in model.graph.input}
    outputs = {vi.name: vi for vi in model.graph.output}
    found = {}
    for binding in model.graph.persistent_bindings:
        for side, name, declared in (("input", binding.input_name, inputs),
                                     ("output", binding.output_name, outputs)):
            vi = declared.get(name)
            found[(side, name)] = compile_type(vi.type if vi is not None and vi.HasField("type") else None,
                                               catalogue, f"{side} {name!r}")
    return found


# -------------------------------------------------------------------------------- standard export
@dataclass(frozen=True)
class StandardExport:
    """A plain onnx model plus the feedback a caller-managed loop must apply (``input <- output``)."""

    model: Any
    feedback: tuple[tuple[str, str], ...]


def export_standard(model, *, lower: bool = False) -> StandardExport:
    """Export to standard ONNX. Bindings are rejected unless ``lower``; structured values are always
    rejected, since standard ONNX cannot carry them and dropping them would lose data."""
    bindings = tuple((b.input_name, b.output_name) for b in model.graph.persistent_bindings)
    if bindings and not lower:
        raise violation(E.EXPORT_PERSISTENCE, "model.graph.persistent_bindings",
                        "standard ONNX has no persistent bindings; export with lower=True to get a stateless "
                        "model and its caller-managed feedback mapping")
    _reject_structured(model)
    if bindings:
        validate_bindings(model)
    clone = copy_model(model)
    clone.graph.ClearField("persistent_bindings")
    plain = schema.to_onnx(clone)
    if _has_unknown_fields(plain):
        raise violation(E.EXPORT_UNSUPPORTED, "model",
                        "the model carries extension fields standard ONNX would drop")
    return StandardExport(plain, bindings)


def _reject_structured(model) -> None:
    if len(model.struct_types):
        raise violation(E.EXPORT_UNSUPPORTED, "model.struct_types", "struct declarations have no standard form")
    pending = [(model.graph, "model.graph")]
    pending += [(f, f"model.functions[{i}]") for i, f in enumerate(model.functions)]
    while pending:
        graph, path = pending.pop()
        if isinstance(graph, schema.GraphProto):
            if len(graph.encoded_initializer):
                raise violation(E.EXPORT_UNSUPPORTED, f"{path}.encoded_initializer",
                                "encoded values have no standard form")
            if path != "model.graph" and len(graph.persistent_bindings):
                raise violation(E.EXPORT_PERSISTENCE, f"{path}.persistent_bindings",
                                "nested persistent bindings cannot be exported")
            for group in ("input", "output", "value_info"):
                for index, vi in enumerate(getattr(graph, group)):
                    if vi.HasField("type") and contains_struct(vi.type):
                        raise violation(E.EXPORT_UNSUPPORTED, f"{path}.{group}[{index}]",
                                        "struct-typed values have no standard form")
        for n_index, node in enumerate(graph.node):
            for s_index, sub in enumerate(_subgraphs(node)):
                pending.append((sub, f"{path}.node[{n_index}].graph[{s_index}]"))


def _has_unknown_fields(message) -> bool:
    from google.protobuf import unknown_fields

    if len(unknown_fields.UnknownFieldSet(message)):
        return True
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        if descriptor.message_type.GetOptions().map_entry:
            continue
        items = value if _repeated(descriptor) else [value]
        if any(_has_unknown_fields(item) for item in items):
            return True
    return False


def _repeated(descriptor) -> bool:
    flag = getattr(descriptor, "is_repeated", None)  # protobuf >= 6; older versions expose label
    return bool(flag) if flag is not None else descriptor.label == descriptor.LABEL_REPEATED


def feedback_loop(run: Callable[[Mapping[str, Any]], Mapping[str, Any]], feedback: Iterable[tuple[str, str]],
                  initial: Mapping[str, Any], feeds_sequence: Iterable[Mapping[str, Any]]) -> Iterator[dict]:
    """The spec's caller-managed loop over a lowered model: outputs of each call feed the bound inputs
    of the next. ``run`` maps feeds to outputs by name (any stateless runtime)."""
    feedback = tuple(feedback)
    values = dict(initial)
    for feeds in feeds_sequence:
        outputs = dict(run({**feeds, **values}))
        values = {input_name: outputs[output_name] for input_name, output_name in feedback}
        yield outputs
