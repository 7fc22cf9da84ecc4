"""Faults in persistent bindings: whole-value bindings, their types and where they may appear."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from types import MappingProxyType

import numpy as np

from conformance.audit.fault import Fault, Patch, fault, hooked_state, name_faults, wrap
from conformance.audit.faults.state import after_run, fresh, noting
from reference_impl import bindings, schema
from reference_impl import values as values_module
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels
from reference_impl.values import AnySpec, MapSpec, SequenceSpec, StructSpec, StructValue, TensorSpec

#: the modules (the package re-exports ``validate_bindings``, ``make_state`` and ``adopt`` under other names)
bindings_module = importlib.import_module("reference_impl.bindings")
state_module = importlib.import_module("reference_impl.state")


def _declared(model) -> tuple[dict, dict]:
    return {vi.name: vi for vi in model.graph.input}, {vi.name: vi for vi in model.graph.output}


def _rebinding(edit: Callable) -> Callable:
    """A transform replacing the graph's bindings by the (input, output) pairs ``edit(pairs, inputs, outputs)`` gives
    (``inputs``, ``outputs``: the graph's, by name)."""
    def transform(model, base_dir):
        pairs = edit([(b.input_name, b.output_name) for b in model.graph.persistent_bindings], *_declared(model))
        del model.graph.persistent_bindings[:]
        for input_name, output_name in pairs:
            model.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)
    return transform


def _renaming(rename: Callable) -> Callable:
    """A transform renaming each binding's input and output in place to ``rename(name, declared)``, ``declared``
    being the graph's inputs (outputs) by name."""
    def transform(model, base_dir):
        inputs, outputs = _declared(model)
        for binding in model.graph.persistent_bindings:
            binding.input_name = rename(binding.input_name, inputs)
            binding.output_name = rename(binding.output_name, outputs)
    return transform


def _as_path(name: str, declared: dict) -> str:
    """A dotted (or backslashed) name read as a field path of a declared struct value."""
    normalized = name.replace("\\", ".")
    head = normalized.split(".", 1)[0]
    if "." in normalized and head in declared and declared[head].type.WhichOneof("value") == "struct_type":
        return head
    return normalized


def _whole(name: str, declared: dict) -> str:
    return name if name in declared else _as_path(name, declared)


def _matched_loosely(name: str, declared: dict) -> str:
    def normalized(text):
        return text.strip().casefold()
    return name if name in declared else {normalized(d): d for d in declared}.get(normalized(name), name)


def _unescaped(name: str, declared: dict) -> str:
    """A name read through a C-style escape parser: a backslash escapes the character after it."""
    out, index = [], 0
    while index < len(name):
        if name[index] == "\\" and index + 1 < len(name):
            index += 1
        out.append(name[index])
        index += 1
    return "".join(out)


def _legacy_paths_dropped(model, base_dir):
    for binding in model.graph.persistent_bindings:
        binding.DiscardUnknownFields()


def _inferred_from_names(model, base_dir):
    graph = model.graph
    outputs = {vi.name for vi in graph.output}
    for vi in graph.input if not len(graph.persistent_bindings) else ():
        if vi.name.startswith("past_") and "present_" + vi.name[5:] in outputs:
            graph.persistent_bindings.add(input_name=vi.name, output_name="present_" + vi.name[5:])


UnknownBindingsIgnored = fault("BIND-EXACT-NAMES.unknown-names-ignored", ("BIND-EXACT-NAMES",), """Ignores a binding
    that names no whole input or output of the graph instead of rejecting it.""", transform=_rebinding(
    lambda pairs, inputs, outputs: [(i, o) for i, o in pairs if i in inputs and o in outputs]))
NamesMatchedLoosely = fault("BIND-EXACT-NAMES.names-matched-loosely", ("BIND-EXACT-NAMES",), """Looks binding names
    up after trimming spaces and folding case: ``PAST`` or ``past `` selects the input ``past`` instead of naming no
    whole input.""", transform=_renaming(_matched_loosely))
DotsAreFieldPaths = fault("BIND-LITERAL-NAMES.dots-split", ("BIND-LITERAL-NAMES",), """Reads dots (and backslashes)
    in binding names as field separators: ``cache.keys`` selects the whole struct ``cache`` instead of the input
    literally named ``cache.keys``.""", transform=_rebinding(
    lambda pairs, inputs, outputs: [(_as_path(i, inputs), _as_path(o, outputs)) for i, o in pairs]))
BackslashesUnescaped = fault("BIND-LITERAL-NAMES.backslash-escapes", ("BIND-LITERAL-NAMES",), """Parses binding names
    as escaped strings (a backslash escapes the next character and disappears), while graph input and output names stay
    raw: ``a\\b`` in a binding looks for ``ab``.""", transform=_renaming(_unescaped))
FieldSelectionWidened = fault("BIND-WHOLE.field-selection-widened", ("BIND-WHOLE",), """Accepts a binding that selects
    a field of a struct input or output by binding the whole struct, instead of rejecting partial field selection.""",
    transform=_rebinding(lambda pairs, inputs, outputs: [(_whole(i, inputs), _whole(o, outputs)) for i, o in pairs]))
LastBindingWins = fault("BIND-DUPLICATES.last-binding-wins", ("BIND-DUPLICATES",), """Keeps bindings in dicts keyed
    by input and by output name: a repeated selection silently replaces the earlier one instead of being rejected.""",
    transform=_rebinding(lambda pairs, *declared: [(i, o) for o, i in {o: i for i, o in dict(pairs).items()}.items()]))
LegacyFieldPathsDropped = fault("BIND-NO-CONTENTS.legacy-paths-dropped", ("BIND-NO-CONTENTS", "BIND-WHOLE"), """Parses
    bindings with a generated class that discards unknown fields: a binding carrying the legacy field-path tags (3, 4)
    is silently read as a plain whole-value binding.""", transform=_legacy_paths_dropped)
BindingsInferredFromNames = fault("BIND-STATELESS-DEFAULT.bindings-from-names", ("BIND-STATELESS-DEFAULT",),
    """Without declared bindings, pairs inputs and outputs by the common ``past_*`` / ``present_*`` naming convention
    and retains them, instead of running stateless.""", transform=_inferred_from_names)


def _incompatibility(target, special: Callable) -> Callable:
    """Patches answering ``special(original, a, b)`` where ``target.incompatibility(a, b)`` is asked."""
    return lambda: [wrap(target, "incompatibility", lambda original: lambda a, b: special(original, a, b))]


def _both(a, b, kind) -> bool:
    return isinstance(a, kind) and isinstance(b, kind)


def _rank_unchecked(original, a, b):
    if _both(a, b, TensorSpec) and a.elem_type == b.elem_type and a.dims is not None and b.dims is not None \
            and len(a.dims) != len(b.dims):
        n = min(len(a.dims), len(b.dims))  # zip() stops at the shorter shape
        return original(TensorSpec(a.elem_type, a.dims[:n]), TensorSpec(b.elem_type, b.dims[:n]))
    return original(a, b)


def _nested_unchecked(original, a, b):
    if _both(a, b, StructSpec) and a.type_id is None and b.type_id is None:
        if [n for n, _ in a.fields] != [n for n, _ in b.fields] or a.constants != b.constants:
            return "inline structs declare different fields"
        return None  # same field names: taken as the same struct
    return None if _both(a, b, SequenceSpec) else original(a, b)  # a sequence is a sequence


ElementTypesNotCompared = fault("BIND-COMPATIBLE.element-type-unchecked", ("BIND-COMPATIBLE",), """Compares bound
    inputs and outputs by rank and shape but not element type.""", patches=_incompatibility(
        bindings, lambda original, a, b: original(a, TensorSpec(a.elem_type, b.dims))
        if _both(a, b, TensorSpec) and a.elem_type != b.elem_type else original(a, b)))
RankNotCompared = fault("BIND-COMPATIBLE.rank-unchecked", ("BIND-COMPATIBLE",), """Compares bound shapes dimension by
    dimension with ``zip`` and never compares their ranks: an input of rank 3 bound to an output of rank 4 whose
    leading dimensions agree is accepted.""", boundary=True, patches=_incompatibility(values_module, _rank_unchecked))
NestedTypesNotCompared = fault("BIND-COMPATIBLE.nested-types-unchecked", ("BIND-COMPATIBLE",), """Compares the top
    level of bound types only: two inline structs with the same field names are compatible whatever their fields'
    types, and any sequence is compatible with any other.""", boundary=True,
    patches=_incompatibility(values_module, _nested_unchecked))
MapKeyTypesNotCompared = fault("BIND-COMPATIBLE.map-key-types-unchecked", ("BIND-COMPATIBLE",), """Compares bound maps
    by their value types only: map<int64, T> is accepted for map<int32, T>.""", patches=_incompatibility(
        values_module, lambda original, a, b: original(a.value, b.value) if _both(a, b, MapSpec) else original(a, b)))
StructCategoryTakesTensors = fault("BIND-COMPATIBLE.struct-category-takes-tensors", ("BIND-COMPATIBLE",), """Treats an
    unconstrained struct category (a StructTypeProto with no kind) as a wildcard on either side of a binding: a tensor
    output is accepted for a struct-category input.""", patches=_incompatibility(values_module, lambda original, a, b:
        None if isinstance(a, AnySpec) or isinstance(b, AnySpec) else original(a, b)))


def _symbolic_by_name(model):
    """The names of the symbolic dimensions of every root input and output, by value name."""
    names = {}
    for info in list(model.graph.input) + list(model.graph.output):
        if info.type.WhichOneof("value") == "tensor_type" and info.type.tensor_type.HasField("shape"):
            names[info.name] = [d.dim_param if d.WhichOneof("value") == "dim_param" else
                                (d.dim_value if d.WhichOneof("value") == "dim_value" else None)
                                for d in info.type.tensor_type.shape.dim]
    return names


def _symbolic_dims_agree(model, base_dir):
    dims = _symbolic_by_name(model)
    for index, binding in enumerate(model.graph.persistent_bindings):
        a, b = dims.get(binding.input_name), dims.get(binding.output_name)
        for x, y in zip(a, b) if a is not None and b is not None and len(a) == len(b) else ():
            if (isinstance(x, str) or isinstance(y, str)) and x != y and x not in ("", None) and y not in ("", None):
                raise violation(E.BINDING_INCOMPATIBLE, f"model.graph.persistent_bindings[{index}]",
                                f"dimension {x!r} versus {y!r}")


def _outputs_duplicable(original):
    def validate_bindings(model, catalogue=None):
        try:
            return original(model, catalogue)
        except ContractError as error:
            if error.code is not E.BINDING_OUTPUT_DUPLICATE:
                raise
        # every repeated output checked as its own binding, against the same output
        resolved = []
        for binding in model.graph.persistent_bindings:
            single = type(model)()
            single.CopyFrom(model)
            del single.graph.persistent_bindings[:]
            single.graph.persistent_bindings.add(input_name=binding.input_name, output_name=binding.output_name)
            resolved += list(original(single, catalogue))
        if len({b.input_name for b in resolved}) != len(resolved):
            return original(model, catalogue)
        return tuple(resolved)
    return validate_bindings


SymbolicDimsByName = fault("BIND-COMPATIBLE.symbolic-dims-by-name", ("BIND-COMPATIBLE",), """Treats symbolic
    dimensions as names that must agree: ``past_key[1, 2, past, 8] <- present_key[1, 2, total, 8]`` is refused, as is a
    symbolic dimension bound to a concrete one.""", precheck=_symbolic_dims_agree)
DuplicateOutputsAccepted = fault("BIND-DUPLICATES.output-duplicates-accepted", ("BIND-DUPLICATES",), """Checks that
    no input is selected twice but not outputs: one output feeding two inputs is accepted, and both inputs receive
    it.""", patches=lambda: [wrap(bindings_module, "validate_bindings", _outputs_duplicable)])


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


StringsBindable = fault("BIND-NO-STRINGS.strings-unchecked", ("BIND-NO-STRINGS",), """Has no string check on
    bindings: string tensors (and structs holding them) can be declared persistent.""",
    patches=lambda: [Patch(bindings, "string_path", lambda spec, path: None)])
NestedStringsMissed = fault("BIND-NO-STRINGS.nested-strings-missed", ("BIND-NO-STRINGS",), """Checks that a bound
    value is not a string tensor, but does not follow struct fields and constants (or catalogue references) to the
    strings nested inside.""", boundary=True, patches=lambda: [wrap(bindings, "string_path", lambda original:
        lambda spec, path: original(spec, path) if isinstance(spec, TensorSpec) else None)])
StringsCheckedOnInputSideOnly = fault("BIND-NO-STRINGS.output-side-unchecked", ("BIND-NO-STRINGS",), """Checks bound
    types for string tensors on the input side only: an output whose (nested) type holds a string tensor is accepted
    when the input's type is one that admits it (an unconstrained struct category).""", boundary=True,
    patches=lambda: [wrap(bindings_module, "validate_bindings", _counting_validation),
                     wrap(bindings_module, "string_path", _input_side_only, aliases=False)])
EncodedStringLogicalRetained = fault("BIND-NO-STRINGS.encoded-string-logical-retained", ("BIND-NO-STRINGS",),
    """Looks for string tensors in the bound types and in the arrays it retains, but takes an encoded value for its
    payload bytes: one whose logical type is a STRING tensor is retained through a binding whose type admits it (a
    kind-less struct_type, or its layout's type_ref).""", patches=lambda: [wrap(
        state_module, "_adopt_encoded", lambda original: lambda value, path, counters, persistent:
        original(value, path, counters, False))])  # the payload is bytes, never strings


_GRAPH_ATTRIBUTES = (5, 10)  # AttributeProto.GRAPH / GRAPHS


def _attribute_graphs(attr) -> list:
    return [attr.g] if attr.type == _GRAPH_ATTRIBUTES[0] else list(attr.graphs) \
        if attr.type == _GRAPH_ATTRIBUTES[1] else []


def _direct_subgraphs_only(model) -> None:
    """Checks the graphs attached to the root graph's own nodes, not deeper ones nor function bodies."""
    for index, node in enumerate(model.graph.node):
        for attr in node.attribute:
            if any(len(sub.persistent_bindings) for sub in _attribute_graphs(attr)):
                raise violation(E.BINDING_IN_SUBGRAPH, f"model.graph.node[{index}].attribute[{attr.name!r}]",
                                "persistent bindings are supported on the root graph only")


def _nested_check_without(skip_codecs: bool, branch_names: tuple[str, ...] | None):
    """The oracle's nested-declaration check as a runtime that skips codec bodies, or looks only at the
    named branch attributes (If's), would write it."""
    original = bindings._reject_nested_declarations

    def reject(model):
        probe = type(model)()
        probe.CopyFrom(model)
        for decl in probe.struct_types if skip_codecs else ():
            decl.ClearField("decoder")
            decl.ClearField("encoder")
        pending = list(probe.graph.node) + [n for f in probe.functions for n in f.node] if branch_names else []
        while pending:
            for attr in pending.pop().attribute:
                for sub in _attribute_graphs(attr):
                    if attr.name not in branch_names:
                        del sub.persistent_bindings[:]
                    pending.extend(sub.node)
        return original(probe)
    return reject


NestedBindingsIgnored = fault("BIND-ROOT-ONLY.nested-bindings-ignored", ("BIND-ROOT-ONLY",), """Ignores persistent
    bindings declared in control-flow subgraphs and function bodies instead of rejecting them explicitly.""",
    patches=lambda: [Patch(bindings, "_reject_nested_declarations", lambda model: None)])
NestedBindingsOneLevelDeep = fault("BIND-ROOT-ONLY.one-level-deep", ("BIND-ROOT-ONLY",), """Rejects bindings in the
    subgraphs of the root graph's nodes only: a declaration in a subgraph nested inside another subgraph, or in a
    function body, is ignored.""", boundary=True,
    patches=lambda: [Patch(bindings, "_reject_nested_declarations", _direct_subgraphs_only)])
CodecBodiesNotScanned = fault("BIND-ROOT-ONLY.codec-bodies-unscanned", ("BIND-ROOT-ONLY",), """Never looks inside
    decoder and encoder bodies (it does not run them at load): persistent bindings declared in a subgraph of a codec
    body are not rejected.""", boundary=True,
    patches=lambda: [Patch(bindings, "_reject_nested_declarations", _nested_check_without(True, None))])
OnlyIfBranchesScanned = fault("BIND-ROOT-ONLY.loop-bodies-unscanned", ("BIND-ROOT-ONLY",), """Looks for nested
    bindings in If branches only (then_branch, else_branch): a Loop or Scan body declaring bindings is not
    rejected.""", boundary=True,
    patches=lambda: [Patch(bindings, "_reject_nested_declarations",
                           _nested_check_without(False, ("then_branch", "else_branch")))])


def _flagged_on_save(model):
    for binding in model.graph.persistent_bindings:
        model.metadata_props.add(key=f"onnx_light.persistent:{binding.input_name}", value=binding.output_name)
    model.graph.ClearField("persistent_bindings")


def _struct_types_of_inputs(model) -> dict[str, int]:
    """The catalogue type ID of each root input whose type refers to one."""
    return {vi.name: vi.type.struct_type.type_ref for vi in model.graph.input
            if vi.type.WhichOneof("value") == "struct_type" and vi.type.struct_type.WhichOneof("kind") == "type_ref"}


def _struct_bindings_on_type(model):
    types, declarations = _struct_types_of_inputs(model), {decl.type_id: decl for decl in model.struct_types}
    kept = []
    for binding in model.graph.persistent_bindings:
        decl = declarations.get(types.get(binding.input_name))
        if decl is None:
            kept.append((binding.input_name, binding.output_name))
        else:
            decl.metadata_props.add(key="onnx_light.persistent", value=f"{binding.input_name}<-{binding.output_name}")
    _rebinding(lambda *args: kept)(model, None)


BindingsFlaggedOnSave = fault("BIND-GRAPH-LEVEL.saved-as-metadata-flag", ("BIND-GRAPH-LEVEL",), """Saves persistence
    as a flag in the model's metadata (``onnx_light.persistent:<input>`` = output) instead of the graph's
    persistent_bindings.""", on_save=_flagged_on_save)
StructBindingsSavedOnTheType = fault("BIND-GRAPH-LEVEL.struct-binding-on-type", ("BIND-GRAPH-LEVEL",), """Saves the
    binding of a struct input as a persistence flag on its catalogue declaration (``metadata_props``
    ``onnx_light.persistent`` = ``input<-output``) instead of in the graph's persistent_bindings; tensor bindings are
    saved normally.""", on_save=_struct_bindings_on_type)


def _persistent_types_fed(handle, feeds):
    for name in feeds:
        if name not in handle.bound and handle.types.get(name) in handle.persistent:
            raise violation(E.STATE_FEED_OVERRIDES, f"feeds[{name!r}]",
                            f"struct type {handle.types[name]} is persistent in this model")
    return feeds


_PersistentTypesState = hooked_state(run=lambda handle, run, feeds: run(_persistent_types_fed(handle, feeds)))


class PersistenceFollowsTheType(Fault):
    """Marks a struct *type* persistent when one input of that type is bound, so every other input
    of the same type is treated as retained state and cannot be fed."""

    fault_id = "BIND-SHARED-TYPE.persistence-per-type"
    clauses = ("BIND-SHARED-TYPE",)

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, initial, base_dir)
        model, typed = schema.parse_model(model_bytes), _PersistentTypesState(handle.state, self, handle)
        typed.types = _struct_types_of_inputs(model)
        typed.bound = {b.input_name for b in model.graph.persistent_bindings}
        typed.persistent = {typed.types[name] for name in typed.bound if name in typed.types}
        return typed


def _slots_per_type(handle):
    last = {handle.note[b.input_name]: b.input_name for b in handle.state.bindings if b.input_name in handle.note}
    # input -> the input whose slot it shares (the last bound one of its type)
    handle.slots = {name: last[type_id] for name, type_id in handle.note.items() if type_id in last}


def _slot_shared(handle, before, outputs):
    current = dict(handle.state._values)
    handle.state._values = MappingProxyType({name: current[handle.slots.get(name, name)] for name in current})
    return outputs


def _last_outputs(handle, run, feeds):
    handle.last = run(feeds)
    return handle.last


def _scalar_fields_kept(handle, previous, outputs):
    current = dict(handle.state._values)
    for name, value in current.items():
        old = previous.get(name)
        if isinstance(value, StructValue) and isinstance(old, StructValue):
            # scalar fields (lengths, positions) are configuration to it: only tensors carry over
            fields = {field: old[field] if np.ndim(item) == 0 and field in old else item
                      for field, item in value.items()}
            current[name] = StructValue(fields, value.type_id)
    handle.state._values = MappingProxyType(current)
    return outputs


def _feeds_kept(handle, run, feeds):
    outputs = run(feeds)
    handle.feeds = dict(feeds)
    return outputs


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


OneStateSlotPerType = fault("BIND-SHARED-TYPE.one-slot-per-type", ("BIND-SHARED-TYPE",), """Keeps retained state in
    one slot per struct type: two bound inputs of the same type share it, so after a call both receive the output of the
    last binding of that type.""", open_state=noting(
        lambda model_bytes, initial: _struct_types_of_inputs(schema.parse_model(model_bytes))),
    state=after_run(_slot_shared, init=_slots_per_type))
StatelessRetainsOutputs = fault("BIND-STATELESS-DEFAULT.outputs-retained", ("BIND-STATELESS-DEFAULT",), """Without
    bindings, keeps the last call's outputs as the state's values instead of running ordinary stateless execution with
    nothing retained.""", state=hooked_state(init=fresh(last=dict), run=_last_outputs, values=lambda handle, values: (
        values() if handle.state.bindings else {**handle.last, **values()})))
ScalarFieldsNotRetained = fault("BIND-WHOLE.scalar-fields-kept", ("BIND-WHOLE", "STATE-WHOLE-STRUCT"), """Retains the
    tensor fields of a bound struct output but keeps the previous value's scalar fields (lengths, positions), as if only
    part of the struct were persistent.""", state=after_run(_scalar_fields_kept))
FeedsKeptAsHiddenState = fault("BIND-NO-CONTENTS.hidden-feed-state", ("BIND-NO-CONTENTS",), """Keeps each call's feeds
    as hidden kernel state next to the bound values (a second value system besides the graph's bindings).""",
    state=hooked_state(init=fresh(feeds=dict), run=_feeds_kept,
                       values=lambda handle, values: {**handle.feeds, **values()}))
DecodedValuesMemoized = fault("BIND-NO-CONTENTS.decode-memoized", ("BIND-NO-CONTENTS",), """Caches each Decode node's
    result in the kernel on first use (an optimization for constant weights), so later calls of the same state decode
    the first call's value again: hidden kernel state beyond the bound inputs.""",
    patches=lambda: [Patch(kernels.LOCAL_KERNELS, "Decode", _memoized_decode(kernels.make_decode))])


name_faults(globals())
