"""Faults in persistent binding declarations: exact whole names, duplicates, compatibility, strings,
nested declarations, validation against the final graph, and where persistence is declared."""

from __future__ import annotations

from conformance.adapters.reference import ReferenceState
from conformance.audit.fault import Fault, FaultState, Patch, wrap
from reference_impl import bindings, schema
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.values import TensorSpec


def _declared(model) -> tuple[dict, dict]:
    return {vi.name: vi for vi in model.graph.input}, {vi.name: vi for vi in model.graph.output}


def _replace_bindings(model, pairs: list[tuple[str, str]]) -> None:
    del model.graph.persistent_bindings[:]
    for input_name, output_name in pairs:
        model.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)


def _pairs(model) -> list[tuple[str, str]]:
    return [(b.input_name, b.output_name) for b in model.graph.persistent_bindings]


class UnknownBindingsIgnored(Fault):
    """Ignores a binding that names no whole input or output of the graph instead of rejecting it."""

    fault_id = "BIND-EXACT-NAMES.unknown-names-ignored"
    clauses = ("BIND-EXACT-NAMES",)

    def transform(self, model, base_dir):
        inputs, outputs = _declared(model)
        _replace_bindings(model, [(i, o) for i, o in _pairs(model) if i in inputs and o in outputs])


def _as_path(name: str, declared: dict) -> str:
    """A dotted (or backslashed) name read as a field path of a declared struct value."""
    normalized = name.replace("\\", ".")
    head = normalized.split(".", 1)[0]
    if "." in normalized and head in declared and declared[head].type.WhichOneof("value") == "struct_type":
        return head
    return normalized


class DotsAreFieldPaths(Fault):
    """Reads dots (and backslashes) in binding names as field separators: ``cache.keys`` selects the
    whole struct ``cache`` instead of the input literally named ``cache.keys``."""

    fault_id = "BIND-LITERAL-NAMES.dots-split"
    clauses = ("BIND-LITERAL-NAMES",)

    def transform(self, model, base_dir):
        inputs, outputs = _declared(model)
        _replace_bindings(model, [(_as_path(i, inputs), _as_path(o, outputs)) for i, o in _pairs(model)])


class FieldSelectionWidened(Fault):
    """Accepts a binding that selects a field of a struct input or output by binding the whole struct,
    instead of rejecting partial field selection."""

    fault_id = "BIND-WHOLE.field-selection-widened"
    clauses = ("BIND-WHOLE",)

    def transform(self, model, base_dir):
        inputs, outputs = _declared(model)

        def whole(name, declared):
            return name if name in declared else _as_path(name, declared)
        _replace_bindings(model, [(whole(i, inputs), whole(o, outputs)) for i, o in _pairs(model)])


class NestedBindingsIgnored(Fault):
    """Ignores persistent bindings declared in control-flow subgraphs and function bodies instead of
    rejecting them explicitly."""

    fault_id = "BIND-ROOT-ONLY.nested-bindings-ignored"
    clauses = ("BIND-ROOT-ONLY",)

    def patches(self):
        return [Patch(bindings, "_reject_nested_declarations", lambda model: None)]


def _element_types_ignored(original):
    def incompatibility(a, b):
        if isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.elem_type != b.elem_type:
            return original(a, TensorSpec(a.elem_type, b.dims))
        return original(a, b)
    return incompatibility


class ElementTypesNotCompared(Fault):
    """Compares bound inputs and outputs by rank and shape but not element type."""

    fault_id = "BIND-COMPATIBLE.element-type-unchecked"
    clauses = ("BIND-COMPATIBLE",)

    def patches(self):
        return [wrap(bindings, "incompatibility", _element_types_ignored)]


class StringsBindable(Fault):
    """Has no string check on bindings: string tensors (and structs holding them) can be declared
    persistent."""

    fault_id = "BIND-NO-STRINGS.strings-unchecked"
    clauses = ("BIND-NO-STRINGS",)

    def patches(self):
        return [Patch(bindings, "string_path", lambda spec, path: None)]


class NestedStringsMissed(Fault):
    """Checks that a bound value is not a string tensor, but does not follow struct fields and
    constants (or catalogue references) to the strings nested inside."""

    fault_id = "BIND-NO-STRINGS.nested-strings-missed"
    clauses = ("BIND-NO-STRINGS",)
    boundary = True

    def patches(self):
        def make(original):
            return lambda spec, path: original(spec, path) if isinstance(spec, TensorSpec) else None
        return [wrap(bindings, "string_path", make)]


class LastBindingWins(Fault):
    """Keeps bindings in dicts keyed by input and by output name: a repeated selection silently
    replaces the earlier one instead of being rejected."""

    fault_id = "BIND-DUPLICATES.last-binding-wins"
    clauses = ("BIND-DUPLICATES",)

    def transform(self, model, base_dir):
        by_input = dict(_pairs(model))
        by_output = {o: i for i, o in by_input.items()}
        _replace_bindings(model, [(i, o) for o, i in by_output.items()])


class BindingsFlaggedOnSave(Fault):
    """Saves persistence as a flag in the model's metadata (``onnx_light.persistent:<input>`` =
    output) instead of the graph's persistent_bindings."""

    fault_id = "BIND-GRAPH-LEVEL.saved-as-metadata-flag"
    clauses = ("BIND-GRAPH-LEVEL",)

    def on_save(self, model):
        for binding in model.graph.persistent_bindings:
            model.metadata_props.add(key=f"onnx_light.persistent:{binding.input_name}", value=binding.output_name)
        model.graph.ClearField("persistent_bindings")


class PersistentTypesState(FaultState):
    def __init__(self, state, fault, persistent_types: set[int], bound: set[str], types: dict[str, int], like=None):
        super().__init__(state, fault, like)
        self.persistent_types, self.bound, self.types = persistent_types, bound, types

    def run(self, feeds):
        for name in feeds:
            if name not in self.bound and self.types.get(name) in self.persistent_types:
                raise violation(E.STATE_FEED_OVERRIDES, f"feeds[{name!r}]",
                                f"struct type {self.types[name]} is persistent in this model")
        return super().run(feeds)


class PersistenceFollowsTheType(Fault):
    """Marks a struct *type* persistent when one input of that type is bound, so every other input
    of the same type is treated as retained state and cannot be fed."""

    fault_id = "BIND-SHARED-TYPE.persistence-per-type"
    clauses = ("BIND-SHARED-TYPE",)

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, initial, base_dir)
        model = schema.parse_model(model_bytes)
        types = {vi.name: vi.type.struct_type.type_ref for vi in model.graph.input
                 if vi.type.WhichOneof("value") == "struct_type"
                 and vi.type.struct_type.WhichOneof("kind") == "type_ref"}
        bound = {b.input_name for b in model.graph.persistent_bindings}
        return PersistentTypesState(handle.state, self, {types[n] for n in bound if n in types}, bound, types, handle)


class DeferredErrorState(ReferenceState):
    """A state whose binding error is reported at the first call instead of when it was made."""

    def __init__(self, state, error: ContractError):
        super().__init__(state)
        self.error = error

    def run(self, feeds):
        raise self.error

    def values(self):
        raise self.error


class BindingsValidatedAtFirstRun(Fault):
    """Validates the bindings lazily, at the first run, instead of against the final graph before the
    state (session) is constructed."""

    fault_id = "EXP-VALIDATE-FINAL.validated-at-first-run"
    clauses = ("EXP-VALIDATE-FINAL",)

    def open_state(self, model_bytes, initial, base_dir=None):
        try:
            return super().open_state(model_bytes, initial, base_dir)
        except ContractError as error:
            if not error.code.value.startswith("BINDING_"):
                raise
            model = schema.parse_model(model_bytes)
            model.graph.ClearField("persistent_bindings")
            handle = super().open_state(model.SerializeToString(), {}, base_dir)
            return DeferredErrorState(handle.state, error)
