"""Faults in persistent bindings: whole-value bindings, their types and where they may appear."""

from __future__ import annotations

import importlib
import threading
from types import MappingProxyType

import numpy as np

from conformance.audit.fault import Fault, FaultState, Patch, fault, name_faults, wrap
from reference_impl import bindings, schema
from reference_impl import values as values_module
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels
from reference_impl.values import AnySpec, EncodedValue, MapSpec, SequenceSpec, StructSpec, StructValue, TensorSpec


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


NestedBindingsIgnored = fault("BIND-ROOT-ONLY.nested-bindings-ignored", ("BIND-ROOT-ONLY",),
    """Ignores persistent bindings declared in control-flow subgraphs and function bodies instead of rejecting them
    explicitly.""", patches=lambda: [Patch(bindings, "_reject_nested_declarations", lambda model: None)])


def _element_types_ignored(original):
    def incompatibility(a, b):
        if isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.elem_type != b.elem_type:
            return original(a, TensorSpec(a.elem_type, b.dims))
        return original(a, b)
    return incompatibility


ElementTypesNotCompared = fault("BIND-COMPATIBLE.element-type-unchecked", ("BIND-COMPATIBLE",),
    """Compares bound inputs and outputs by rank and shape but not element type.""",
    patches=lambda: [wrap(bindings, "incompatibility", _element_types_ignored)])

StringsBindable = fault("BIND-NO-STRINGS.strings-unchecked", ("BIND-NO-STRINGS",),
    """Has no string check on bindings: string tensors (and structs holding them) can be declared persistent.""",
    patches=lambda: [Patch(bindings, "string_path", lambda spec, path: None)])


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


class _LastOutputsState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.last: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        self.last = outputs
        return outputs

    def values(self):
        current = super().values()
        return current if self.state.bindings else {**self.last, **current}


StatelessRetainsOutputs = fault("BIND-STATELESS-DEFAULT.outputs-retained", ("BIND-STATELESS-DEFAULT",),
    """Without bindings, keeps the last call's outputs as the state's values instead of running ordinary stateless
    execution with nothing retained.""", state=_LastOutputsState)


class _FeedsRetainedState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.feeds: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        self.feeds = dict(feeds)
        return outputs

    def values(self):
        return {**self.feeds, **super().values()}


FeedsKeptAsHiddenState = fault("BIND-NO-CONTENTS.hidden-feed-state", ("BIND-NO-CONTENTS",),
    """Keeps each call's feeds as hidden kernel state next to the bound values (a second value system besides the
    graph's bindings).""", state=_FeedsRetainedState)


bindings_module = importlib.import_module("reference_impl.bindings")


def _rank_unchecked(original):
    def incompatibility(a, b):
        if isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.elem_type == b.elem_type \
                and a.dims is not None and b.dims is not None and len(a.dims) != len(b.dims):
            n = min(len(a.dims), len(b.dims))  # zip() stops at the shorter shape
            return original(TensorSpec(a.elem_type, a.dims[:n]), TensorSpec(b.elem_type, b.dims[:n]))
        return original(a, b)
    return incompatibility


RankNotCompared = fault("BIND-COMPATIBLE.rank-unchecked", ("BIND-COMPATIBLE",),
    """Compares bound shapes dimension by dimension with ``zip`` and never compares their ranks: an input of rank 3
    bound to an output of rank 4 whose leading dimensions agree is accepted.""", boundary=True,
    patches=lambda: [wrap(values_module, "incompatibility", _rank_unchecked)])


def _nested_unchecked(original):
    def incompatibility(a, b):
        if isinstance(a, StructSpec) and isinstance(b, StructSpec) and a.type_id is None and b.type_id is None:
            if [n for n, _ in a.fields] != [n for n, _ in b.fields] or a.constants != b.constants:
                return "inline structs declare different fields"
            return None  # same field names: taken as the same struct
        if isinstance(a, SequenceSpec) and isinstance(b, SequenceSpec):
            return None  # a sequence is a sequence
        return original(a, b)
    return incompatibility


NestedTypesNotCompared = fault("BIND-COMPATIBLE.nested-types-unchecked", ("BIND-COMPATIBLE",),
    """Compares the top level of bound types only: two inline structs with the same field names are compatible whatever
    their fields' types, and any sequence is compatible with any other.""", boundary=True,
    patches=lambda: [wrap(values_module, "incompatibility", _nested_unchecked)])


def _symbolic_by_name(model):
    """The names of the symbolic dimensions of every root input and output, by value name."""
    names = {}
    for info in list(model.graph.input) + list(model.graph.output):
        if info.type.WhichOneof("value") == "tensor_type" and info.type.tensor_type.HasField("shape"):
            names[info.name] = [d.dim_param if d.WhichOneof("value") == "dim_param" else
                                (d.dim_value if d.WhichOneof("value") == "dim_value" else None)
                                for d in info.type.tensor_type.shape.dim]
    return names


class SymbolicDimsByName(Fault):
    """Treats symbolic dimensions as names that must agree: ``past_key[1, 2, past, 8] <- present_key[1,
    2, total, 8]`` is refused, as is a symbolic dimension bound to a concrete one."""

    fault_id = "BIND-COMPATIBLE.symbolic-dims-by-name"
    clauses = ("BIND-COMPATIBLE",)

    def precheck(self, model, base_dir):
        dims = _symbolic_by_name(model)
        for index, binding in enumerate(model.graph.persistent_bindings):
            a, b = dims.get(binding.input_name), dims.get(binding.output_name)
            if a is None or b is None or len(a) != len(b):
                continue
            for x, y in zip(a, b):
                if (isinstance(x, str) or isinstance(y, str)) and x != y and x not in ("", None) \
                        and y not in ("", None):
                    raise violation(E.BINDING_INCOMPATIBLE, f"model.graph.persistent_bindings[{index}]",
                                    f"dimension {x!r} versus {y!r}")


class DuplicateOutputsAccepted(Fault):
    """Checks that no input is selected twice but not outputs: one output feeding two inputs is
    accepted, and both inputs receive it."""

    fault_id = "BIND-DUPLICATES.output-duplicates-accepted"
    clauses = ("BIND-DUPLICATES",)

    def patches(self):
        def make(original):
            def validate_bindings(model, catalogue=None):
                try:
                    return original(model, catalogue)
                except ContractError as error:
                    if error.code is not E.BINDING_OUTPUT_DUPLICATE:
                        raise
                pairs = [(b.input_name, b.output_name) for b in model.graph.persistent_bindings]
                # every repeated output checked as its own binding, against the same output
                resolved = []
                for i, o in pairs:
                    single = type(model)()
                    single.CopyFrom(model)
                    del single.graph.persistent_bindings[:]
                    single.graph.persistent_bindings.add(input_name=i, output_name=o)
                    resolved += list(original(single, catalogue))
                if len({b.input_name for b in resolved}) != len(resolved):
                    return original(model, catalogue)
                return tuple(resolved)
            return validate_bindings
        return [wrap(bindings_module, "validate_bindings", make)]


def _map_keys_unchecked(original):
    def incompatibility(a, b):
        if isinstance(a, MapSpec) and isinstance(b, MapSpec):
            return original(a.value, b.value)
        return original(a, b)
    return incompatibility


MapKeyTypesNotCompared = fault("BIND-COMPATIBLE.map-key-types-unchecked", ("BIND-COMPATIBLE",),
    """Compares bound maps by their value types only: map<int64, T> is accepted for map<int32, T>.""",
    patches=lambda: [wrap(values_module, "incompatibility", _map_keys_unchecked)])


def _category_takes_anything(original):
    def incompatibility(a, b):
        if isinstance(a, AnySpec) or isinstance(b, AnySpec):
            return None
        return original(a, b)
    return incompatibility


StructCategoryTakesTensors = fault("BIND-COMPATIBLE.struct-category-takes-tensors", ("BIND-COMPATIBLE",),
    """Treats an unconstrained struct category (a StructTypeProto with no kind) as a wildcard on either side of a
    binding: a tensor output is accepted for a struct-category input.""",
    patches=lambda: [wrap(values_module, "incompatibility", _category_takes_anything)])


_SIDES = threading.local()


def _counting_validation(original):
    def validate_bindings(model, catalogue=None):
        _SIDES.calls = 0
        return original(model, catalogue)
    return validate_bindings


def _input_side_only(original):
    def string_path(spec, path, *args, **kwargs):
        # validate_bindings checks each binding's input, then its output: every second call is an output
        calls = getattr(_SIDES, "calls", 0)
        _SIDES.calls = calls + 1
        return original(spec, path, *args, **kwargs) if calls % 2 == 0 else None
    return string_path


StringsCheckedOnInputSideOnly = fault("BIND-NO-STRINGS.output-side-unchecked", ("BIND-NO-STRINGS",),
    """Checks bound types for string tensors on the input side only: an output whose (nested) type holds a string tensor
    is accepted when the input's type is one that admits it (an unconstrained struct category).""", boundary=True,
    patches=lambda: [wrap(bindings_module, "validate_bindings", _counting_validation),
                     wrap(bindings_module, "string_path", _input_side_only, aliases=False)])


def _normalized(name: str) -> str:
    return name.strip().casefold()


class NamesMatchedLoosely(Fault):
    """Looks binding names up after trimming spaces and folding case: ``PAST`` or ``past `` selects the
    input ``past`` instead of naming no whole input."""

    fault_id = "BIND-EXACT-NAMES.names-matched-loosely"
    clauses = ("BIND-EXACT-NAMES",)

    def transform(self, model, base_dir):
        inputs = {_normalized(vi.name): vi.name for vi in model.graph.input}
        outputs = {_normalized(vi.name): vi.name for vi in model.graph.output}
        declared_in = {vi.name for vi in model.graph.input}
        declared_out = {vi.name for vi in model.graph.output}
        for binding in model.graph.persistent_bindings:
            if binding.input_name not in declared_in:
                binding.input_name = inputs.get(_normalized(binding.input_name), binding.input_name)
            if binding.output_name not in declared_out:
                binding.output_name = outputs.get(_normalized(binding.output_name), binding.output_name)


_GRAPH_ATTRIBUTES = (5, 10)  # AttributeProto.GRAPH / GRAPHS


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


DecodedValuesMemoized = fault("BIND-NO-CONTENTS.decode-memoized", ("BIND-NO-CONTENTS",),
    """Caches each Decode node's result in the kernel on first use (an optimization for constant weights), so later
    calls of the same state decode the first call's value again: hidden kernel state beyond the bound inputs.""",
    patches=lambda: [Patch(kernels.LOCAL_KERNELS, "Decode", _memoized_decode(kernels.make_decode))])


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


NestedBindingsOneLevelDeep = fault("BIND-ROOT-ONLY.one-level-deep", ("BIND-ROOT-ONLY",),
    """Rejects bindings in the subgraphs of the root graph's nodes only: a declaration in a subgraph nested inside
    another subgraph, or in a function body, is ignored.""", boundary=True,
    patches=lambda: [Patch(bindings, "_reject_nested_declarations", _direct_subgraphs_only)])


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


ScalarFieldsNotRetained = fault("BIND-WHOLE.scalar-fields-kept", ("BIND-WHOLE", "STATE-WHOLE-STRUCT"),
    """Retains the tensor fields of a bound struct output but keeps the previous value's scalar fields (lengths,
    positions), as if only part of the struct were persistent.""", state=_TensorFieldsRetainedState)


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


CodecBodiesNotScanned = fault("BIND-ROOT-ONLY.codec-bodies-unscanned", ("BIND-ROOT-ONLY",),
    """Never looks inside decoder and encoder bodies (it does not run them at load): persistent bindings declared in a
    subgraph of a codec body are not rejected.""", boundary=True,
    patches=lambda: [Patch(bindings, "_reject_nested_declarations", _nested_check_without(True, None))])

OnlyIfBranchesScanned = fault("BIND-ROOT-ONLY.loop-bodies-unscanned", ("BIND-ROOT-ONLY",),
    """Looks for nested bindings in If branches only (then_branch, else_branch): a Loop or Scan body declaring bindings
    is not rejected.""", boundary=True,
    patches=lambda: [Patch(bindings, "_reject_nested_declarations",
                           _nested_check_without(False, ("then_branch", "else_branch")))])


#: the module (the package re-exports ``make_state`` and ``adopt`` under other names)
state_module = importlib.import_module("reference_impl.state")


class EncodedStringLogicalRetained(Fault):
    """Looks for string tensors in the bound types and in the arrays it retains, but takes an encoded value
    for its payload bytes: one whose logical type is a STRING tensor is retained through a binding whose type
    admits it (a kind-less struct_type, or its layout's type_ref)."""

    fault_id = "BIND-NO-STRINGS.encoded-string-logical-retained"
    clauses = ("BIND-NO-STRINGS",)

    def patches(self):
        def make(original):
            def adopt_encoded(value: EncodedValue, path, counters, persistent):
                return original(value, path, counters, False)  # the payload is bytes, never strings
            return adopt_encoded
        return [wrap(state_module, "_adopt_encoded", make)]


name_faults(globals())
