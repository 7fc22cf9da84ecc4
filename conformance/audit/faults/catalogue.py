"""Faults in the struct-type catalogue and identity contract: IDs, references and graph struct I/O."""

from __future__ import annotations

import bisect
import dataclasses
import functools

import numpy as np

from conformance.audit.fault import Fault, Patch, enclosing_depth, fault, name_faults, skip, struct_types, wrap
from conformance.audit.faults.shared import _implicit_operand
from reference_impl import decoders, records, schema, structs, verifier
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import program
from reference_impl.structs import struct_kind
from reference_impl.values import is_struct


def _free_ids(used: set[int]):
    candidate = 1
    while True:
        if candidate not in used:
            yield candidate
        candidate += 1


class AcceptsZeroTypeId(Fault):
    """Never checks that a declaration's type_id is present and nonzero: it keys such a declaration like
    any other."""

    fault_id = "CAT-ID-NONZERO.zero-accepted"
    clauses = ("CAT-ID-NONZERO",)

    def transform(self, model, base_dir):
        fresh = _free_ids({decl.type_id for decl in model.struct_types})
        for decl in model.struct_types:
            if not decl.HasField("type_id") or decl.type_id == 0:
                decl.type_id = next(fresh)


class SignedTypeIds(Fault):
    """Stores type IDs in a signed 64-bit integer and checks ``type_id > 0``: the largest uint64 IDs
    (2**63 and above) read as negative and are refused."""

    fault_id = "CAT-ID-NONZERO.signed-type-id"
    clauses = ("CAT-ID-NONZERO",)
    boundary = True

    def precheck(self, model, base_dir):
        for st, _ in struct_types(model):
            ids = [st.type_id] if st.HasField("type_id") else []
            ids += [st.type_ref] if st.WhichOneof("kind") == "type_ref" else []
            if any(i >= 2**63 for i in ids):
                raise violation(E.TYPE_ID_ZERO, "model.struct_types", "type_id must be positive")


class LastDuplicateWins(Fault):
    """Indexes the catalogue in a dict: a second declaration with the same ID silently replaces the
    first instead of being rejected."""

    fault_id = "CAT-ID-UNIQUE.last-declaration-wins"
    clauses = ("CAT-ID-UNIQUE",)

    def transform(self, model, base_dir):
        last = {decl.type_id: index for index, decl in enumerate(model.struct_types)}
        kept = [type(decl)() for decl in model.struct_types]
        for copy, decl in zip(kept, model.struct_types):
            copy.CopyFrom(decl)
        kept = [copy for index, copy in enumerate(kept) if last[copy.type_id] == index]
        del model.struct_types[:]
        model.struct_types.extend(kept)


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


class TypeRefReadsOnlyTheId(Fault):
    """Reads only the ID of a type_ref and ignores everything else in it (a name, codecs, metadata, a
    type_id): references carrying declaration fields are accepted."""

    fault_id = "CAT-REF-ONLY-ID.extras-ignored"
    clauses = ("CAT-REF-ONLY-ID",)

    def transform(self, model, base_dir):
        for st, role in struct_types(model):
            if role != "declaration" and st.WhichOneof("kind") == "type_ref":
                for name in ("decoder", "encoder", "name", "doc_string", "metadata_props", "type_id"):
                    st.ClearField(name)


class InlineTypeIdIgnored(Fault):
    """Ignores the type_id of an inline declaration instead of rejecting it."""

    fault_id = "CAT-INLINE-NO-ID.inline-id-ignored"
    clauses = ("CAT-INLINE-NO-ID",)

    def transform(self, model, base_dir):
        for st, role in struct_types(model):
            if role != "declaration" and st.WhichOneof("kind") not in (None, "type_ref"):
                st.ClearField("type_id")


class SkipsKindlessDeclarations(Fault):
    """Skips catalogue entries that select no kind instead of rejecting them as declarations."""

    fault_id = "CAT-KINDLESS.kindless-declaration-skipped"
    clauses = ("CAT-KINDLESS",)

    def transform(self, model, base_dir):
        kept = [decl for decl in model.struct_types if decl.WhichOneof("kind") is not None]
        if len(kept) != len(model.struct_types):
            copies = []
            for decl in kept:
                copy = type(decl)()
                copy.CopyFrom(decl)
                copies.append(copy)
            del model.struct_types[:]
            model.struct_types.extend(copies)


class RejectsKindlessCategory(Fault):
    """Requires every StructTypeProto to select a kind, even inside TypeProto where an unset kind is the
    unconstrained category of heterogeneous sequences and maps."""

    fault_id = "CAT-KINDLESS.category-rejected"
    clauses = ("CAT-KINDLESS",)
    boundary = True

    def precheck(self, model, base_dir):
        for st, role in struct_types(model):
            if role == "type" and st.WhichOneof("kind") is None:
                raise violation(E.KINDLESS_MISPLACED, "model", "a struct type must select a kind")


class AcceptsAliasDeclarations(Fault):
    """Accepts a catalogue declaration that is itself a type_ref, treating it as an alias of the
    referenced declaration."""

    fault_id = "CAT-DECL-CONCRETE.alias-declaration"
    clauses = ("CAT-DECL-CONCRETE",)

    def transform(self, model, base_dir):
        concrete = {d.type_id: d for d in model.struct_types if d.WhichOneof("kind") not in (None, "type_ref")}
        for decl in model.struct_types:
            target = concrete.get(decl.type_ref) if decl.WhichOneof("kind") == "type_ref" else None
            if target is not None:
                type_id = decl.type_id
                decl.CopyFrom(target)
                decl.type_id = type_id


GraphStructTypesNotValidated = fault("GRAPH-STRUCT-IO.io-types-unchecked", ("GRAPH-STRUCT-IO",),
    """Never validates the struct types of graph inputs, outputs and value_info (only catalogue declarations and encoded
    layouts).""", patches=lambda: [Patch(verifier, "contains_struct", lambda tp: False, aliases=False)])


class StructFirstFieldToTensorOps(Fault):
    """Hands a struct reaching a tensor-only operator its first field, instead of refusing it without an
    explicit decoder or registered consumer."""

    fault_id = "GRAPH-TENSOR-OPS.first-field-passed"
    clauses = ("GRAPH-TENSOR-OPS",)

    def patches(self):
        return [wrap(program, "_tensor_operand", _implicit_operand(struct_to_tensor=lambda s: next(iter(s.values()))))]


class TypeIdsIn32Bits(Fault):
    """Stores type_ids and type_refs in 32-bit integers: IDs above 2**32 - 1 lose their high bits, so
    IDs differing by a multiple of 2**32 are one identity."""

    fault_id = "CAT-REF-RESOLVED.ids-truncated-to-32-bits"
    clauses = ("CAT-REF-RESOLVED", "CAT-ID-UNIQUE", "CAT-ID-NONZERO")
    boundary = True

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.HasField("type_id"):
                st.type_id &= 0xFFFFFFFF
            if st.WhichOneof("kind") == "type_ref":
                st.type_ref &= 0xFFFFFFFF


class MaximumTypeIdIsASentinel(Fault):
    """Uses UINT64_MAX as its "no type_id" sentinel: a declaration whose type_id is 2**64 - 1 counts as
    one without a type_id."""

    fault_id = "CAT-ID-NONZERO.max-id-sentinel"
    clauses = ("CAT-ID-NONZERO",)
    boundary = True

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.HasField("type_id") and st.type_id == 2**64 - 1:
                st.ClearField("type_id")


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


class DuplicateIdsCheckedPairwise(Fault):
    """Looks for duplicate type_ids by comparing each declaration with the one before it only (as if the
    catalogue were sorted): two declarations of one ID with another between them pass, and the later
    one wins in its ID map."""

    fault_id = "CAT-REORDER.adjacent-duplicates-only"
    clauses = ("CAT-REORDER", "CAT-ID-UNIQUE")

    def transform(self, model, base_dir):
        ids = [decl.type_id if decl.HasField("type_id") else None for decl in model.struct_types]
        if any(a is not None and a == b for a, b in zip(ids, ids[1:])):
            return  # an adjacent pair: its check reports the duplicate
        last = {type_id: index for index, type_id in enumerate(ids) if type_id is not None}
        kept = []
        for index, decl in enumerate(model.struct_types):
            if ids[index] is None or last[ids[index]] == index:
                copy = type(decl)()
                copy.CopyFrom(decl)
                kept.append(copy)
        del model.struct_types[:]
        model.struct_types.extend(kept)


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


SubgraphIoStructTypesUnchecked = fault("GRAPH-STRUCT-IO.subgraph-io-unchecked", ("GRAPH-STRUCT-IO",),
    """Validates the struct types of the root graph's inputs, outputs and value_info, but walks control-flow subgraphs
    only for their initializers and nodes: a branch or loop body typed by an undeclared or malformed struct is
    accepted.""", boundary=True, patches=lambda: [wrap(verifier, "_verify_graph", _root_io_only)])

StructOutputTypesUnchecked = fault("GRAPH-STRUCT-IO.outputs-unchecked", ("GRAPH-STRUCT-IO",),
    """Validates the struct types of graph inputs (which it must bind to feeds) but not of graph outputs and value_info:
    an output or intermediate typed by an undeclared or malformed struct is accepted.""",
    patches=lambda: [wrap(verifier, "_verify_graph", _inputs_only)])


def _top_level_struct(tp) -> bool:
    return tp.WhichOneof("value") == "struct_type"


NestedIoStructTypesUnchecked = fault("GRAPH-STRUCT-IO.nested-io-unchecked", ("GRAPH-STRUCT-IO",),
    """Validates a graph value's struct type only when the value itself is a struct: a struct nested as the element of a
    sequence, an optional or a map value on a graph input or output is never checked.""", boundary=True,
    patches=lambda: [Patch(verifier, "contains_struct", _top_level_struct, aliases=False)])


class KindlessCategoryOnlyInSequences(Fault):
    """Accepts the kind-less category as a sequence element but refuses it as a map value."""

    fault_id = "CAT-KINDLESS.map-value-category-rejected"
    clauses = ("CAT-KINDLESS",)

    def patches(self):
        def make(original):
            def check(tp, path, catalogue, depth=0, refs=None):
                if tp.WhichOneof("value") == "map_type":
                    value = tp.map_type.value_type
                    if value.WhichOneof("value") == "struct_type" and struct_kind(value.struct_type) is None:
                        raise violation(E.KINDLESS_MISPLACED, f"{path}.map_type.value_type",
                                        "a kind-less struct is only a sequence element category")
                return original(tp, path, catalogue, depth, refs)
            return check
        return [wrap(structs, "check_type", make)]


class NestedInlineTypeIdIgnored(Fault):
    """Rejects a type_id on an encoded value's inline layout but not on inline declarations inside a
    TypeProto (graph inputs and outputs, field and element types), which it reads as anonymous."""

    fault_id = "CAT-INLINE-NO-ID.nested-inline-id-ignored"
    clauses = ("CAT-INLINE-NO-ID",)

    def transform(self, model, base_dir):
        for st, role in struct_types(model):
            if role == "type" and st.WhichOneof("kind") not in (None, "type_ref"):
                st.ClearField("type_id")


class TypeRefMetadataUnchecked(Fault):
    """Checks that a type_ref carries no other singular field (HasField on each) but forgets the
    repeated metadata_props, which it ignores."""

    fault_id = "CAT-REF-ONLY-ID.metadata-props-ignored"
    clauses = ("CAT-REF-ONLY-ID",)

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.WhichOneof("kind") == "type_ref":
                st.ClearField("metadata_props")


class StructLogicalTypeUnvalidated(Fault):
    """Validates a struct-layout value's optional logical_type only when a decoder checks its output
    against it: on load, an unresolved type_ref or a malformed type there passes."""

    fault_id = "CAT-REF-RESOLVED.logical-type-unvalidated"
    clauses = ("CAT-REF-RESOLVED", "ENC-LOGICAL-OPTIONAL")

    def patches(self):
        def make(original):
            def check(tp, path, catalogue, depth=0, refs=None):
                if path.endswith(".logical_type"):
                    return depth
                return original(tp, path, catalogue, depth, refs)
            return check
        return [wrap(verifier, "check_type", make, aliases=False)]


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


name_faults(globals())
