"""Faults in reading the representation: wire field numbers, the catalogue and its identities, struct
declarations, byte-encoding sizes and initializer names."""

from __future__ import annotations

import bisect
import dataclasses
import functools

from conformance.audit.fault import Fault, Patch, enclosing_depth, skip, struct_types, wrap
from conformance.audit.wire_edit import renumber
from reference_impl import decoders, dtypes, records, schema, structs, verifier
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.graph_utils import _has_unknown_fields
from reference_impl.tensors import to_array

_MODEL_STRUCT_TYPES = ()          # ModelProto.struct_types: top-level field 1000
_GRAPH = (7,)                     # ModelProto.graph
_ENCODED = (7, 1000)              # GraphProto.encoded_initializer
_AFFINE = (7, 1000, 1)            # EncodedValueProto.affine


# ------------------------------------------------------------------------------------------ wire
class StructTypesMisnumbered(Fault):
    """Compiled against a schema with ``ModelProto.struct_types`` at 1001 (an off-by-one in the local
    range): a conforming catalogue at field 1000 is an unknown field to it, so no type_ref resolves."""

    fault_id = "WIRE-FIELDS.struct-types-at-1001"
    clauses = ("WIRE-FIELDS",)

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, _MODEL_STRUCT_TYPES, {1000: 1001})


class EncodedInitializersInUpstreamRange(Fault):
    """Puts ``GraphProto.encoded_initializer`` at field 17, the next free upstream number, instead of the
    reserved local range: conforming encoded initializers (field 1000) are invisible to it."""

    fault_id = "WIRE-LOCAL-RANGE.encoded-initializer-at-17"
    clauses = ("WIRE-LOCAL-RANGE", "WIRE-FIELDS")

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, _GRAPH, {1000: 17})


class AffineAxisAndBlockSwapped(Fault):
    """Declares ``AffineLayoutProto.axis = 5`` and ``block_size = 4``, the two optional fields swapped
    against the frozen schema: a per-axis layout reads as a block size without an axis."""

    fault_id = "WIRE-SCHEMA.affine-axis-block-swapped"
    clauses = ("WIRE-SCHEMA",)

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, _AFFINE, {4: 5, 5: 4})


class BindingsMisnumbered(Fault):
    """Reads ``GraphProto.persistent_bindings`` from field 1002: conforming bindings (1001) are unknown
    fields to it, so every stateful model runs stateless."""

    fault_id = "WIRE-BINDINGS-FIELD.bindings-at-1002"
    clauses = ("WIRE-BINDINGS-FIELD",)

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, _GRAPH, {1001: 1002})


class RejectsUnknownFields(Fault):
    """Parses strictly: a model carrying fields its schema does not know (future upstream fields, other
    local extensions) is refused as unparseable instead of being read with them kept as unknown fields."""

    fault_id = "WIRE-LOCAL-EXTENSION.strict-parser"
    clauses = ("WIRE-LOCAL-EXTENSION",)
    prepares_writes = True

    def precheck(self, model, base_dir):
        if _has_unknown_fields(model):
            raise violation(E.MODEL_PARSE_ERROR, "model", "unknown fields are not accepted")


class SavesHeadersWithoutPayload(Fault):
    """Takes inline payloads out of the message at load (as the zero-copy loader should) but saves only
    the headers: an explicit load and save loses every inline encoded payload."""

    fault_id = "WIRE-ROUNDTRIP.save-drops-inline-payloads"
    clauses = ("WIRE-ROUNDTRIP",)

    def on_save(self, model):
        for value in model.graph.encoded_initializer:
            value.ClearField("raw_data")


class MigratesDenseInitializers(Fault):
    """Migrates every dense ``TensorProto`` initializer to an encoded value (an inline one-field struct
    layout) when it saves: existing TensorProto values do not survive unmigrated."""

    fault_id = "REP-TENSORPROTO-COMPAT.migrates-dense-on-save"
    clauses = ("REP-TENSORPROTO-COMPAT",)

    def on_save(self, model):
        graph = model.graph
        for tensor in graph.initializer:
            value = graph.encoded_initializer.add(name=tensor.name)
            field = value.struct_type.structure.field.add(name="value")
            field.type.tensor_type.elem_type = tensor.data_type
            field.type.tensor_type.shape.SetInParent()
            for dim in tensor.dims:
                value.logical_type.tensor_type.shape.dim.add(dim_value=dim)
            value.logical_type.tensor_type.elem_type = tensor.data_type
            value.raw_data = to_array(tensor, "initializer").tobytes()
        graph.ClearField("initializer")


# ------------------------------------------------------------------------------------ catalogue
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


class ResolvesReferencesLazily(Fault):
    """Resolves a type_ref only when a value's layout needs it: a declaration (or a graph input type)
    referring to an ID nobody declared is accepted."""

    fault_id = "CAT-REF-RESOLVED.lazy-resolution"
    clauses = ("CAT-REF-RESOLVED",)

    def patches(self):
        return [skip(structs, "check_struct", "TYPE_REF_UNRESOLVED", returns=enclosing_depth)]


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


class NoCycleDetection(Fault):
    """Has no cycle detection in the catalogue: it resolves self-referencing and mutually referencing
    declarations by following the references, until its nesting limit stops it (NESTING_TOO_DEEP, not
    a reference cycle)."""

    fault_id = "CAT-REF-ACYCLIC.no-cycle-check"
    clauses = ("CAT-REF-ACYCLIC",)

    def patches(self):
        return [wrap(structs.Catalogue, "_check_acyclic", _follows_cycles)]


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


class DiamondIsACycle(Fault):
    """Detects cycles with a visited set instead of the current path: a type reached twice through two
    fields (a diamond) is wrongly reported as a reference cycle."""

    fault_id = "CAT-REF-ACYCLIC.diamond-rejected"
    clauses = ("CAT-REF-ACYCLIC",)
    boundary = True

    def patches(self):
        return [wrap(structs.Catalogue, "_check_acyclic", _visited_set_cycle_check)]


def _sorted_lookup(self, type_id: int, path: str):
    """Binary search over the catalogue as written, assuming it is sorted by ID."""
    ids = list(self.declarations)
    index = bisect.bisect_left(ids, type_id)
    if index < len(ids) and ids[index] == type_id:
        return self.declarations[type_id]
    raise violation(E.TYPE_REF_UNRESOLVED, path, f"type_ref {type_id} names no declaration")


class AssumesSortedCatalogue(Fault):
    """Looks type_refs up by binary search, assuming the catalogue is sorted by ID: reordering the
    catalogue changes which references resolve."""

    fault_id = "CAT-REORDER.binary-search-lookup"
    clauses = ("CAT-REORDER",)

    def patches(self):
        return [Patch(structs.Catalogue, "lookup", _sorted_lookup)]


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


class DecoderIgnoresConstants(Fault):
    """Compiles each registered decoder for the declaration it was written for (its constants baked in)
    and checks a model's declaration against the registration's physical layout only: a declaration
    whose constants changed under the same ID still binds, and decodes with the registered constants."""

    fault_id = "CAT-ID-CHANGE.constants-not-checked"
    clauses = ("CAT-ID-CHANGE", "DEC-KEYED")

    def patches(self):
        return [wrap(decoders.DecoderRegistry, "register", _constants_baked_in),
                wrap(decoders.DecoderRegistry, "bind", _bind_by_physical_layout)]


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


# ------------------------------------------------------------------------------------- naming
def _encoded_names_only(original):
    return lambda graph, path: [(where, name) for where, name in original(graph, path)
                                if ".encoded_initializer[" in where]


class NamesUniqueOnlyAmongEncoded(Fault):
    """Checks initializer names for uniqueness among encoded initializers only, not across dense,
    sparse and encoded ones."""

    fault_id = "INIT-NAMES-UNIQUE.encoded-only"
    clauses = ("INIT-NAMES-UNIQUE",)

    def patches(self):
        return [wrap(verifier, "_initializer_names", _encoded_names_only)]


class NamesUniqueInRootGraphOnly(Fault):
    """Checks initializer names in the root graph only, not in control-flow subgraphs."""

    fault_id = "INIT-NAMES-UNIQUE.root-graph-only"
    clauses = ("INIT-NAMES-UNIQUE",)
    boundary = True

    def patches(self):
        def make(original):
            return lambda graph, path: original(graph, path) if path == "model.graph" else None
        return [wrap(verifier, "_check_initializer_names", make)]


class InitializerNameClashesWithInput(Fault):
    """Treats an encoded initializer that is also named as a graph input (a default the caller may
    override) as a duplicate name."""

    fault_id = "INIT-AS-INPUT.input-name-rejected"
    clauses = ("INIT-AS-INPUT",)

    def precheck(self, model, base_dir):
        inputs = {vi.name for vi in model.graph.input}
        for value in model.graph.encoded_initializer:
            if value.name in inputs:
                raise violation(E.INITIALIZER_NAME_DUPLICATE, "model.graph", f"{value.name!r} is also a graph input")


class GraphStructTypesNotValidated(Fault):
    """Never validates the struct types of graph inputs, outputs and value_info (only catalogue
    declarations and encoded layouts)."""

    fault_id = "GRAPH-STRUCT-IO.io-types-unchecked"
    clauses = ("GRAPH-STRUCT-IO",)

    def patches(self):
        return [Patch(verifier, "contains_struct", lambda tp: False, aliases=False)]


# -------------------------------------------------------------------------------- declarations
class FieldWithoutContentAccepted(Fault):
    """Accepts a structure field that selects neither a type nor a constant."""

    fault_id = "DECL-FIELD-CONTENT.empty-field-accepted"
    clauses = ("DECL-FIELD-CONTENT",)

    def patches(self):
        return [skip(structs, "check_struct", "FIELD_CONTENT_MISSING", returns=enclosing_depth)]


class FieldTypesNotValidated(Fault):
    """Does not apply TypeProto's validation rules to struct field and array element types (undefined
    element types, negative dimensions, maps with float keys, sequences without elements pass)."""

    fault_id = "DECL-TYPE-RULES.field-types-unchecked"
    clauses = ("DECL-TYPE-RULES",)

    def patches(self):
        return [skip(structs, "check_type", "TYPE_INVALID", returns=enclosing_depth)]


class RejectsDynamicFieldDims(Fault):
    """Requires concrete dimensions on every tensor field of a struct, refusing the dynamic dimensions
    TypeProto permits for types that are not byte-encoded."""

    fault_id = "DECL-DYNAMIC-DIMS.dynamic-dims-rejected"
    clauses = ("DECL-DYNAMIC-DIMS",)

    def precheck(self, model, base_dir):
        for st, _ in struct_types(model):
            types = []
            if st.WhichOneof("kind") == "structure":
                types = [f.type for f in st.structure.field if f.WhichOneof("content") == "type"]
            elif st.WhichOneof("kind") == "array":
                types = [st.array.element_type]
            for tp in types:
                if tp.WhichOneof("value") == "tensor_type" and any(
                        d.WhichOneof("value") != "dim_value" for d in tp.tensor_type.shape.dim):
                    raise violation(E.TYPE_INVALID, "model.struct_types", "struct fields need concrete dimensions")


def checked_catalogue(model) -> structs.Catalogue | None:
    """The model's catalogue once every declaration checks out, or None: an invalid catalogue is the
    oracle's to report, not the fault's."""
    try:
        catalogue = structs.Catalogue(model.struct_types)
        catalogue.check_all()
    except Exception:  # noqa: BLE001
        return None
    return catalogue


class RequiresFixedSizeStructs(Fault):
    """Computes the byte size of every declaration up front and refuses those without a fixed physical
    size, although only byte-encoded layouts need one."""

    fault_id = "REP-STATIC-SUBSET.fixed-size-required"
    clauses = ("REP-STATIC-SUBSET",)

    def precheck(self, model, base_dir):
        catalogue = checked_catalogue(model)
        if catalogue is None:
            return
        for decl, path in catalogue.declarations.values():
            size = catalogue.bit_size(decl, path)
            if isinstance(size, structs.NotFixedSize):
                raise violation(E.NOT_FIXED_SIZE, size.path, "every struct type must have a fixed size")


class ZeroCountsAccepted(Fault):
    """Accepts arrays and bit packings whose count is missing (zero)."""

    fault_id = "DECL-COUNTS-CONCRETE.zero-count-accepted"
    clauses = ("DECL-COUNTS-CONCRETE",)

    def patches(self):
        return [skip(structs, "check_struct", "DIMENSION_INVALID", returns=enclosing_depth)]


class ConstantsNotChecked(Fault):
    """Stores field constants as given, without checking their dimensions or that their data matches."""

    fault_id = "DECL-CONSTANT.constants-unchecked"
    clauses = ("DECL-CONSTANT",)

    def patches(self):
        return [Patch(structs, "check_constant", lambda tensor, path: None)]


class FieldNamesNotChecked(Fault):
    """Never checks field and component names: empty and repeated names pass."""

    fault_id = "DECL-WELLFORMED.names-unchecked"
    clauses = ("DECL-WELLFORMED",)

    def patches(self):
        return [Patch(structs, "_check_names", lambda names, path: None)]


class BitWidth64Rejected(Fault):
    """Checks bit-packing widths with ``1 <= width < 64``: the widest component, 64 bits, is refused."""

    fault_id = "DECL-WELLFORMED.bit-width-64-rejected"
    clauses = ("DECL-WELLFORMED",)
    boundary = True

    def precheck(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.WhichOneof("kind") == "bit_packing" and any(c.bit_width == 64 for c in st.bit_packing.component):
                raise violation(E.BIT_WIDTH_INVALID, "model", "bit width 64 is outside 1..63")


class NoNestingLimit(Fault):
    """Has no limit on type nesting: arbitrarily deep reference chains are resolved recursively."""

    fault_id = "DECL-DEPTH.no-limit"
    clauses = ("DECL-DEPTH",)

    def patches(self):
        return [Patch(structs, "MAX_DEPTH", 10**9)]


# ------------------------------------------------------------------------------ byte encoding
class ConstantsTakePayloadBytes(Fault):
    """Sizes a constant field like a stored one (it keeps the constant in every record), instead of
    ``size(Field(constant)) = 0``."""

    fault_id = "ENC-SIZE-TABLE.constants-stored"
    clauses = ("ENC-SIZE-TABLE",)

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.WhichOneof("kind") != "structure":
                continue
            for field in st.structure.field:
                if field.WhichOneof("content") == "constant":
                    constant = field.constant
                    tensor = field.type.tensor_type  # selecting the type clears the constant
                    tensor.elem_type = constant.data_type
                    tensor.shape.SetInParent()
                    for dim in constant.dims:
                        tensor.shape.dim.add(dim_value=dim)


def _widen_sub_byte(original):
    def type_bit_size(tp, path, catalogue, depth=0):
        size = original(tp, path, catalogue, depth)
        if tp.WhichOneof("value") == "tensor_type" and not isinstance(size, structs.NotFixedSize):
            width = dtypes.BIT_WIDTH.get(tp.tensor_type.elem_type, 8)
            if width < 8:
                return size // width * 8
        return size
    return type_bit_size


class SubByteTensorCodesTakeAByte(Fault):
    """Sizes ``tensor(INT4/UINT4/INT2/UINT2, dims)`` fields at one byte per element instead of
    ``product(dims) * bit_width``: the narrowest leaves are not packed tightly."""

    fault_id = "ENC-SIZE-TABLE.sub-byte-tensor-unpacked"
    clauses = ("ENC-SIZE-TABLE",)
    boundary = True

    def patches(self):
        return [wrap(structs, "type_bit_size", _widen_sub_byte)]


def _wrapping_add(original):
    return lambda a, b, path: (a + b) % 2**64


class WrappingSizeArithmetic(Fault):
    """Computes sizes with plain uint64 arithmetic that wraps around instead of checked arithmetic:
    an overflowing size silently becomes a small (or zero) one."""

    fault_id = "ENC-OVERFLOW.wrapping-arithmetic"
    clauses = ("ENC-OVERFLOW",)

    def patches(self):
        def mul(original):
            return lambda a, b, path: (a * b) % 2**64
        return [wrap(structs, "checked_mul", mul), wrap(structs, "checked_add", _wrapping_add)]


def _dynamic_as_empty(original):
    def type_bit_size(tp, path, catalogue, depth=0):
        size = original(tp, path, catalogue, depth)
        return 0 if isinstance(size, structs.NotFixedSize) else size
    return type_bit_size


class DynamicFieldsSizedZero(Fault):
    """Sizes fields without a fixed inline size (sequences, maps, symbolic dimensions) at zero bits
    instead of refusing the byte-payload layout for their struct."""

    fault_id = "ENC-FIXED-SIZE.dynamic-fields-zero"
    clauses = ("ENC-FIXED-SIZE",)

    def patches(self):
        return [wrap(structs, "type_bit_size", _dynamic_as_empty)]


def _strings_as_pointers(original):
    def type_bit_size(tp, path, catalogue, depth=0):
        tensor = tp.tensor_type if tp.WhichOneof("value") == "tensor_type" else None
        if tensor is not None and tensor.elem_type == dtypes.STRING and tensor.HasField("shape"):
            count = 1
            for dim in tensor.shape.dim:
                count *= dim.dim_value
            return 64 * count
        return original(tp, path, catalogue, depth)
    return type_bit_size


class StringLeavesAsPointers(Fault):
    """Lays out a STRING leaf as a 64-bit pointer to its characters, as its in-memory struct does,
    instead of refusing it as a leaf that is not fixed-width physical data."""

    fault_id = "ENC-LEAVES.strings-as-pointers"
    clauses = ("ENC-LEAVES",)

    def patches(self):
        return [wrap(structs, "type_bit_size", _strings_as_pointers)]


class RootSizeNotWholeBytes(Fault):
    """Rounds an encoding root's size up to whole bytes instead of requiring a multiple of eight bits."""

    fault_id = "ENC-ROOT-SIZE.rounded-up"
    clauses = ("ENC-ROOT-SIZE",)

    def patches(self):
        return [skip(verifier, "_verify_struct_layout", "ROOT_SIZE_NOT_BYTES")]


def _zero_records(arguments: dict) -> verifier.EncodedInfo:
    return verifier.EncodedInfo(arguments["path"], arguments["extent"], element_bytes=0, record_count=0)


class ConstantOnlyRootAccepted(Fault):
    """Accepts a constant-only struct (zero bytes per record) as an encoding root, as a value of zero
    records."""

    fault_id = "ENC-CONSTANT-ONLY.zero-size-root"
    clauses = ("ENC-CONSTANT-ONLY",)

    def patches(self):
        return [skip(verifier, "_verify_struct_layout", "ROOT_SIZE_ZERO", returns=_zero_records)]


class RejectsZeroSizeStructs(Fault):
    """Refuses every constant-only struct, also as a plain type or as a nested group contributing zero
    bytes to its parent's records."""

    fault_id = "ENC-CONSTANT-ONLY.constant-groups-rejected"
    clauses = ("ENC-CONSTANT-ONLY",)
    boundary = True

    def precheck(self, model, base_dir):
        try:
            catalogue = structs.Catalogue(model.struct_types)
        except Exception:  # noqa: BLE001 - an invalid catalogue is the oracle's to report
            return
        for decl, path in catalogue.declarations.values():
            try:
                size = catalogue.bit_size(decl, path)
            except Exception:  # noqa: BLE001
                continue
            if size == 0:
                raise violation(E.ROOT_SIZE_ZERO, path, "a struct needs a positive size")


class FieldsInNameOrder(Fault):
    """Keeps a structure's fields in a map sorted by name, so records are laid out in name order rather
    than declaration order."""

    fault_id = "ENC-TIGHT.fields-sorted-by-name"
    clauses = ("ENC-TIGHT",)

    def transform(self, model, base_dir):
        for st, _ in struct_types(model):
            if st.WhichOneof("kind") == "structure":
                ordered = []
                for field in sorted(st.structure.field, key=lambda f: f.name):
                    copy = type(field)()
                    copy.CopyFrom(field)
                    ordered.append(copy)
                del st.structure.field[:]
                st.structure.field.extend(ordered)
