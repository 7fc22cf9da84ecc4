"""Faults in the struct-type catalogue and identity contract: IDs, references and graph struct I/O."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools

import numpy as np

from conformance.audit.fault import Patch, enclosing_depth, fault, name_faults, skip, struct_types, wrap
from conformance.audit.faults.shared import _implicit_operand
from conformance.audit.faults.wire import cleared, refusing, replace_all
from reference_impl import decoders, records, schema, structs, verifier
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import program
from reference_impl.structs import struct_kind
from reference_impl.values import is_struct


def _zero_ids_keyed(model, base_dir):
    used = {decl.type_id for decl in model.struct_types}
    fresh = (candidate for candidate in itertools.count(1) if candidate not in used)
    for decl in model.struct_types:
        if not decl.HasField("type_id") or decl.type_id == 0:
            decl.type_id = next(fresh)


AcceptsZeroTypeId = fault("CAT-ID-NONZERO.zero-accepted", ("CAT-ID-NONZERO",),
    """Never checks that a declaration's type_id is present and nonzero: it keys such a declaration like any other.""",
    transform=_zero_ids_keyed)


def _ids(st) -> list[int]:
    """The type_id and type_ref a StructTypeProto carries."""
    return ([st.type_id] if st.HasField("type_id") else []) + ([st.type_ref] if struct_kind(st) == "type_ref" else [])


SignedTypeIds = fault("CAT-ID-NONZERO.signed-type-id", ("CAT-ID-NONZERO",),
    """Stores type IDs in a signed 64-bit integer and checks ``type_id > 0``: the largest uint64 IDs (2**63 and above)
    read as negative and are refused.""", boundary=True,
    precheck=refusing(E.TYPE_ID_ZERO, "model.struct_types", "type_id must be positive",
                      lambda model: any(i >= 2**63 for st, _ in struct_types(model) for i in _ids(st))))


def _dropping(dropped):
    """A transform reading the catalogue without the declarations ``dropped(index, decl, decls)`` selects (a
    runtime that never sees them)."""
    def transform(model, base_dir):
        decls = list(model.struct_types)
        kept = [decl for index, decl in enumerate(decls) if not dropped(index, decl, decls)]
        if len(kept) != len(decls):
            replace_all(model.struct_types, kept)
    return transform


def _repeated_later(index, decl, decls) -> bool:
    return any(later.type_id == decl.type_id for later in decls[index + 1:])


LastDuplicateWins = fault("CAT-ID-UNIQUE.last-declaration-wins", ("CAT-ID-UNIQUE",),
    """Indexes the catalogue in a dict: a second declaration with the same ID silently replaces the first instead of
    being rejected.""", transform=_dropping(_repeated_later))
ResolvesReferencesLazily = fault("CAT-REF-RESOLVED.lazy-resolution", ("CAT-REF-RESOLVED",),
    """Resolves a type_ref only when a value's layout needs it: a declaration (or a graph input type) referring to an ID
    nobody declared is accepted.""",
    patches=lambda: [skip(structs, "check_struct", "TYPE_REF_UNRESOLVED", returns=enclosing_depth)])


def _follows_cycles(original):
    def check_acyclic(self, edges):
        try:
            return original(self, edges)
        except ContractError as error:
            if error.code.value != "TYPE_REF_CYCLE":
                raise
            # without the check, resolving the cycle recurses until the nesting limit stops it
            raise structs._too_deep(error.path) from None
    return check_acyclic


NoCycleDetection = fault("CAT-REF-ACYCLIC.no-cycle-check", ("CAT-REF-ACYCLIC",),
    """Has no cycle detection in the catalogue: it resolves self-referencing and mutually referencing declarations by
    following the references, until its nesting limit stops it (NESTING_TOO_DEEP, not a reference cycle).""",
    patches=lambda: [wrap(structs.Catalogue, "_check_acyclic", _follows_cycles)])


def _visited_set_cycle_check(original):
    def check_acyclic(self, edges):
        """Depth-first search that remembers every node it has seen, not only those on its stack."""
        for root in edges:
            seen, stack = set(), [root]
            while stack:
                node = stack.pop()
                if node in seen:
                    raise violation(E.TYPE_REF_CYCLE, self.declarations[node][1], f"type {node} is reached twice")
                seen.add(node)
                stack.extend(child for child in edges[node] if child in edges)
        return original(self, edges)
    return check_acyclic


DiamondIsACycle = fault("CAT-REF-ACYCLIC.diamond-rejected", ("CAT-REF-ACYCLIC",),
    """Detects cycles with a visited set instead of the current path: a type reached twice through two fields (a
    diamond) is wrongly reported as a reference cycle.""", boundary=True,
    patches=lambda: [wrap(structs.Catalogue, "_check_acyclic", _visited_set_cycle_check)])


def _sorted_lookup(self, type_id: int, path: str):
    """Binary search over the catalogue as written, assuming it is sorted by ID."""
    ids = list(self.declarations)
    index = bisect.bisect_left(ids, type_id)
    if index < len(ids) and ids[index] == type_id:
        return self.declarations[type_id]
    raise violation(E.TYPE_REF_UNRESOLVED, path, f"type_ref {type_id} names no declaration")


AssumesSortedCatalogue = fault("CAT-REORDER.binary-search-lookup", ("CAT-REORDER",),
    """Looks type_refs up by binary search, assuming the catalogue is sorted by ID: reordering the catalogue changes
    which references resolve.""", patches=lambda: [Patch(structs.Catalogue, "lookup", _sorted_lookup)])


def _constants_baked_in(original):
    def register(self, type_id, name, declaration_catalogue, decode_fn):
        original(self, type_id, name, declaration_catalogue, decode_fn)
        catalogue = structs.Catalogue(declaration_catalogue)
        catalogue.check_all()
        compiled = records.compile_layout(schema.StructTypeProto(type_ref=type_id), catalogue)
        baked = functools.partial(_decode_compiled, compiled, decode_fn)
        self._decoders[type_id] = dataclasses.replace(self._decoders[type_id], decode=baked)
    return register


def _decode_compiled(compiled, decode_fn, layout, payload):
    """The decoder as compiled for its registration: leaves read where the registration put them (the
    model's are the same), constants those of the registration."""
    return decode_fn(compiled, payload)


def _bind_by_physical_layout(original):
    def bind(self, type_id, layout, path, declaration=None):
        decoder = self._decoders.get(type_id)
        if decoder is not None:
            (record_bits, leaves, _), identity = decoder.signature
            same_codecs = declaration is None or decoders._codec_identity(declaration) == identity
            if layout.signature()[:2] == (record_bits, leaves) and same_codecs:
                return decoder
        return original(self, type_id, layout, path, declaration)
    return bind


DecoderIgnoresConstants = fault("CAT-ID-CHANGE.constants-not-checked", ("CAT-ID-CHANGE", "DEC-KEYED"),
    """Compiles each registered decoder for the declaration it was written for (its constants baked in) and checks a
    model's declaration against the registration's physical layout only: a declaration whose constants changed under the
    same ID still binds, and decodes with the registered constants.""",
    patches=lambda: [wrap(decoders.DecoderRegistry, "register", _constants_baked_in),
                     wrap(decoders.DecoderRegistry, "bind", _bind_by_physical_layout)])


def _struct_types(where):
    """The model's StructTypeProtos (beside their roles) for which ``where(st, role)`` holds."""
    return lambda model: [st for st, role in struct_types(model) if where(st, role)]


_INLINE = (None, "type_ref")  # the kinds of a StructTypeProto that is not an inline declaration

TypeRefReadsOnlyTheId = fault("CAT-REF-ONLY-ID.extras-ignored", ("CAT-REF-ONLY-ID",),
    """Reads only the ID of a type_ref and ignores everything else in it (a name, codecs, metadata, a type_id):
    references carrying declaration fields are accepted.""",
    transform=cleared(_struct_types(lambda st, role: role != "declaration" and struct_kind(st) == "type_ref"),
                      "decoder", "encoder", "name", "doc_string", "metadata_props", "type_id"))
InlineTypeIdIgnored = fault("CAT-INLINE-NO-ID.inline-id-ignored", ("CAT-INLINE-NO-ID",),
    """Ignores the type_id of an inline declaration instead of rejecting it.""", transform=cleared(
        _struct_types(lambda st, role: role != "declaration" and struct_kind(st) not in _INLINE), "type_id"))
SkipsKindlessDeclarations = fault("CAT-KINDLESS.kindless-declaration-skipped", ("CAT-KINDLESS",),
    """Skips catalogue entries that select no kind instead of rejecting them as declarations.""",
    transform=_dropping(lambda index, decl, decls: struct_kind(decl) is None))
RejectsKindlessCategory = fault("CAT-KINDLESS.category-rejected", ("CAT-KINDLESS",),
    """Requires every StructTypeProto to select a kind, even inside TypeProto where an unset kind is the unconstrained
    category of heterogeneous sequences and maps.""", boundary=True,
    precheck=refusing(E.KINDLESS_MISPLACED, "model", "a struct type must select a kind",
                      _struct_types(lambda st, role: role == "type" and struct_kind(st) is None)))


def _aliases_resolved(model, base_dir):
    concrete = {d.type_id: d for d in model.struct_types if struct_kind(d) not in _INLINE}
    for decl in model.struct_types:
        target = concrete.get(decl.type_ref) if struct_kind(decl) == "type_ref" else None
        if target is not None:
            type_id = decl.type_id
            decl.CopyFrom(target)
            decl.type_id = type_id


AcceptsAliasDeclarations = fault("CAT-DECL-CONCRETE.alias-declaration", ("CAT-DECL-CONCRETE",),
    """Accepts a catalogue declaration that is itself a type_ref, treating it as an alias of the referenced
    declaration.""", transform=_aliases_resolved)
GraphStructTypesNotValidated = fault("GRAPH-STRUCT-IO.io-types-unchecked", ("GRAPH-STRUCT-IO",),
    """Never validates the struct types of graph inputs, outputs and value_info (only catalogue declarations and encoded
    layouts).""", patches=lambda: [Patch(verifier, "contains_struct", lambda tp: False, aliases=False)])
StructFirstFieldToTensorOps = fault("GRAPH-TENSOR-OPS.first-field-passed", ("GRAPH-TENSOR-OPS",),
    """Hands a struct reaching a tensor-only operator its first field, instead of refusing it without an explicit
    decoder or registered consumer.""", patches=lambda: [
        wrap(program, "_tensor_operand", _implicit_operand(struct_to_tensor=lambda s: next(iter(s.values()))))])


def _ids_in_32_bits(model, base_dir):
    for st, _ in struct_types(model):
        if st.HasField("type_id"):
            st.type_id &= 0xFFFFFFFF
        if struct_kind(st) == "type_ref":
            st.type_ref &= 0xFFFFFFFF


TypeIdsIn32Bits = fault("CAT-REF-RESOLVED.ids-truncated-to-32-bits",
    ("CAT-REF-RESOLVED", "CAT-ID-UNIQUE", "CAT-ID-NONZERO"), """Stores type_ids and type_refs in 32-bit integers: IDs
    above 2**32 - 1 lose their high bits, so IDs differing by a multiple of 2**32 are one identity.""", boundary=True,
    transform=_ids_in_32_bits)
MaximumTypeIdIsASentinel = fault("CAT-ID-NONZERO.max-id-sentinel", ("CAT-ID-NONZERO",),
    """Uses UINT64_MAX as its "no type_id" sentinel: a declaration whose type_id is 2**64 - 1 counts as one without a
    type_id.""", boundary=True, transform=cleared(
        _struct_types(lambda st, role: st.HasField("type_id") and st.type_id == 2**64 - 1), "type_id"))


_CONTAINERS = (".sequence_type", ".map_type", ".optional_type")


def _fixed_path_cycles_only(self) -> None:
    """``Catalogue.check_all`` whose cycle check follows only the references a record's layout expands
    (fields, arrays, nested structs), not those inside sequences, maps and optionals."""
    inline: dict[int, int] = {}
    refs: dict[int, list] = {}
    for type_id, (decl, decl_path) in self.declarations.items():
        refs[type_id] = []
        inline[type_id] = structs.check_struct(decl, decl_path, self, role="declaration", depth=0,
                                               refs=refs[type_id])
    edges = {tid: sorted({ref for ref, _, ref_path in found if not any(c in ref_path for c in _CONTAINERS)})
             for tid, found in refs.items()}
    order = self._check_acyclic(edges)
    depths: dict[int, int] = {}
    for type_id in order:
        deepest = inline[type_id]
        for ref, depth, ref_path in refs[type_id]:
            reached = depth + 1 + depths.get(ref, 0)
            if reached > structs.MAX_DEPTH:
                raise structs._too_deep(ref_path, reached)
            deepest = max(deepest, reached)
        depths[type_id] = deepest
    self.depths = depths


CyclesThroughContainersMissed = fault("CAT-REF-ACYCLIC.container-cycles-missed", ("CAT-REF-ACYCLIC",),
    """Detects reference cycles along the fields, arrays and nested structs a record expands, but not through sequences,
    maps or optionals: a type containing an optional or a map of itself is accepted as a recursive type instead of
    refused as a reference cycle.""", patches=lambda: [Patch(structs.Catalogue, "check_all", _fixed_path_cycles_only)])


def _id(decl) -> int | None:
    return decl.type_id if decl.HasField("type_id") else None


def _separated_duplicate(index, decl, decls) -> bool:
    """A declaration whose ID a later one repeats, in a catalogue with no adjacent pair (which its check reports)."""
    if any(_id(a) is not None and _id(a) == _id(b) for a, b in zip(decls, decls[1:])):
        return False
    return _id(decl) is not None and any(_id(later) == _id(decl) for later in decls[index + 1:])


DuplicateIdsCheckedPairwise = fault("CAT-REORDER.adjacent-duplicates-only", ("CAT-REORDER", "CAT-ID-UNIQUE"),
    """Looks for duplicate type_ids by comparing each declaration with the one before it only (as if the catalogue were
    sorted): two declarations of one ID with another between them pass, and the later one wins in its ID map.""",
    transform=_dropping(_separated_duplicate))


def _io_unchecked(groups: tuple[str, ...], root_too: bool):
    """A patch of the graph walk skipping the struct types of the graph value ``groups`` (in subgraphs only unless
    ``root_too``): the reference's own walk over a copy whose values there carry no struct type to check."""
    def make(original):
        def verify_graph(graph, path, verified):
            if path == "model.graph" and not root_too:
                return original(graph, path, verified)
            probe = type(graph)()
            probe.CopyFrom(graph)
            for info in (info for group in groups for info in getattr(probe, group)):
                if info.HasField("type") and verifier.contains_struct(info.type):
                    info.ClearField("type")
            return original(probe, path, verified)
        return verify_graph
    return wrap(verifier, "_verify_graph", make)


SubgraphIoStructTypesUnchecked = fault("GRAPH-STRUCT-IO.subgraph-io-unchecked", ("GRAPH-STRUCT-IO",),
    """Validates the struct types of the root graph's inputs, outputs and value_info, but walks control-flow subgraphs
    only for their initializers and nodes: a branch or loop body typed by an undeclared or malformed struct is
    accepted.""", boundary=True, patches=lambda: [_io_unchecked(("input", "output", "value_info"), root_too=False)])
StructOutputTypesUnchecked = fault("GRAPH-STRUCT-IO.outputs-unchecked", ("GRAPH-STRUCT-IO",),
    """Validates the struct types of graph inputs (which it must bind to feeds) but not of graph outputs and value_info:
    an output or intermediate typed by an undeclared or malformed struct is accepted.""",
    patches=lambda: [_io_unchecked(("output", "value_info"), root_too=True)])


def _top_level_struct(tp) -> bool:
    return tp.WhichOneof("value") == "struct_type"


NestedIoStructTypesUnchecked = fault("GRAPH-STRUCT-IO.nested-io-unchecked", ("GRAPH-STRUCT-IO",),
    """Validates a graph value's struct type only when the value itself is a struct: a struct nested as the element of a
    sequence, an optional or a map value on a graph input or output is never checked.""", boundary=True,
    patches=lambda: [Patch(verifier, "contains_struct", _top_level_struct, aliases=False)])


def _map_value_category_refused(original):
    def check(tp, path, catalogue, depth=0, refs=None):
        if tp.WhichOneof("value") == "map_type":
            value = tp.map_type.value_type
            if value.WhichOneof("value") == "struct_type" and struct_kind(value.struct_type) is None:
                raise violation(E.KINDLESS_MISPLACED, f"{path}.map_type.value_type",
                                "a kind-less struct is only a sequence element category")
        return original(tp, path, catalogue, depth, refs)
    return check


KindlessCategoryOnlyInSequences = fault("CAT-KINDLESS.map-value-category-rejected", ("CAT-KINDLESS",),
    """Accepts the kind-less category as a sequence element but refuses it as a map value.""",
    patches=lambda: [wrap(structs, "check_type", _map_value_category_refused)])
NestedInlineTypeIdIgnored = fault("CAT-INLINE-NO-ID.nested-inline-id-ignored", ("CAT-INLINE-NO-ID",),
    """Rejects a type_id on an encoded value's inline layout but not on inline declarations inside a TypeProto (graph
    inputs and outputs, field and element types), which it reads as anonymous.""", transform=cleared(
        _struct_types(lambda st, role: role == "type" and struct_kind(st) not in _INLINE), "type_id"))
TypeRefMetadataUnchecked = fault("CAT-REF-ONLY-ID.metadata-props-ignored", ("CAT-REF-ONLY-ID",),
    """Checks that a type_ref carries no other singular field (HasField on each) but forgets the repeated
    metadata_props, which it ignores.""",
    transform=cleared(_struct_types(lambda st, role: struct_kind(st) == "type_ref"), "metadata_props"))


def _logical_type_unchecked(original):
    def check(tp, path, catalogue, depth=0, refs=None):
        return depth if path.endswith(".logical_type") else original(tp, path, catalogue, depth, refs)
    return check


StructLogicalTypeUnvalidated = fault("CAT-REF-RESOLVED.logical-type-unvalidated",
    ("CAT-REF-RESOLVED", "ENC-LOGICAL-OPTIONAL"), """Validates a struct-layout value's optional logical_type only when a
    decoder checks its output against it: on load, an unresolved type_ref or a malformed type there passes.""",
    patches=lambda: [wrap(verifier, "check_type", _logical_type_unchecked, aliases=False)])
TypeRefDeclarationsSkipped = fault("CAT-DECL-CONCRETE.type-ref-declarations-skipped", ("CAT-DECL-CONCRETE",),
    """Skips catalogue entries that select type_ref (as forward declarations) instead of rejecting them: the model
    loads, and a reference to such an ID is reported unresolved.""",
    transform=_dropping(lambda index, decl, decls: struct_kind(decl) == "type_ref"))


def _identical_to_first(index, decl, decls) -> bool:
    first = next((earlier for earlier in decls[:index] if earlier.type_id == decl.type_id), None)
    data = decl.SerializeToString(deterministic=True)
    return first is not None and first.SerializeToString(deterministic=True) == data


IdenticalDuplicatesMerged = fault("CAT-ID-UNIQUE.identical-duplicates-merged", ("CAT-ID-UNIQUE",),
    """Treats a repeated type_id whose declaration is byte-for-byte identical as a harmless redeclaration (merged, as a
    linker merges identical definitions); only differing duplicates are rejected.""",
    transform=_dropping(_identical_to_first))


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


AddedFieldsNotCompared = fault("CAT-ID-CHANGE.added-fields-not-compared", ("CAT-ID-CHANGE", "DEC-KEYED"),
    """Verifies a model's declaration against a registered decoder by the fields the decoder reads only: a field (or
    constant) added under the same ID, which changes the record size, still binds. Since a decoder may read the model's
    own declaration by field (type_id is model-scoped), only Recommended cases catch it.""",
    patches=lambda: [wrap(decoders.DecoderRegistry, "bind", _registered_leaves_only)])


def _single_field_unwrapped(original):
    def tensor_operand(value, op_type, path):
        if is_struct(value) and len(value) == 1:
            (field,) = value.values()
            if isinstance(field, np.ndarray):
                return field
        return original(value, op_type, path)
    return tensor_operand


SingleFieldStructUnwrapped = fault("GRAPH-TENSOR-OPS.single-field-unwrapped",
    ("GRAPH-TENSOR-OPS", "DEC-MISSING-INPUT"), """Treats a struct of one tensor field as that tensor when it reaches a
    tensor-only operator (a 'newtype' unwrapped implicitly), instead of requiring an explicit decoder or consumer.""",
    patches=lambda: [wrap(program, "_tensor_operand", _single_field_unwrapped)])


def _unreferenced_duplicates(model, base_dir):
    referenced = {st.type_ref for st, _ in struct_types(model) if struct_kind(st) == "type_ref"}
    _dropping(lambda index, decl, decls: decl.type_id not in referenced
              and any(earlier.type_id == decl.type_id for earlier in decls[:index]))(model, base_dir)


DuplicatesFoundOnLookupOnly = fault("CAT-ID-UNIQUE.found-on-lookup-only", ("CAT-ID-UNIQUE",),
    """Keeps the catalogue as a multimap and reports a duplicate ID only when a reference looks it up: a repeated ID
    that no type_ref names is never noticed.""", transform=_unreferenced_duplicates)


name_faults(globals())
