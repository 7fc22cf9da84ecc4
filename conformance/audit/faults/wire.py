"""Faults in the wire format: field numbers, proto fields a reader must keep or refuse, round trips."""

from __future__ import annotations

import numpy as np

from conformance.audit.fault import Fault, fault, graphs, name_faults
from conformance.audit.wire_edit import renumber
from reference_impl import schema, structs
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.graph_utils import _has_unknown_fields
from reference_impl.structs import struct_kind
from reference_impl.tensors import to_array

_MODEL_STRUCT_TYPES = ()          # ModelProto.struct_types: top-level field 1000


_GRAPH = (7,)                     # ModelProto.graph


_ENCODED = (7, 1000)              # GraphProto.encoded_initializer


_AFFINE = (7, 1000, 1)            # EncodedValueProto.affine


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


_CATALOGUE_FIELDS = (1000, 2, 1)          # ModelProto.struct_types[].structure.field[]


_INLINE_LAYOUT_FIELDS = (7, 1000, 2, 2, 1)  # graph.encoded_initializer[].struct_type.structure.field[]


class FieldContentNumberedInOrder(Fault):
    """Numbers ``StructTypeProto.Structure.Field`` in declaration order (name 1, type 2, constant 3,
    doc_string 4) instead of the frozen ``constant = 4``, ``doc_string = 3``: a conforming constant
    reads as a doc string and the field is left without content."""

    fault_id = "WIRE-SCHEMA.field-constant-at-3"
    clauses = ("WIRE-SCHEMA", "DECL-FIELD-CONTENT")

    def prepare(self, model_bytes, base_dir):
        swapped = renumber(model_bytes, _CATALOGUE_FIELDS, {3: 4, 4: 3})
        return renumber(swapped, _INLINE_LAYOUT_FIELDS, {3: 4, 4: 3})


#: TypeProtos a model commonly holds: graph inputs, outputs and value_info, struct fields of the
#: catalogue, and encoded values' logical types
_TYPE_PROTOS = ((7, 11, 2), (7, 12, 2), (7, 13, 2), (1000, 2, 1, 2), (7, 1000, 3))


class TypeStructTypeMisnumbered(Fault):
    """Reads ``TypeProto.struct_type`` from field 1001 (an off-by-one in the local range): a conforming
    struct-typed input, output or field (field 1000) is an unknown field, leaving its type unset."""

    fault_id = "WIRE-FIELDS.type-struct-at-1001"
    clauses = ("WIRE-FIELDS", "WIRE-LOCAL-RANGE")

    def prepare(self, model_bytes, base_dir):
        for path in _TYPE_PROTOS:
            model_bytes = renumber(model_bytes, path, {1000: 1001})
        return model_bytes


class SaveDropsDeclarationMetadata(Fault):
    """Writes catalogue declarations without their doc strings and metadata_props (it keeps only what
    its own layouts use) when it saves a model."""

    fault_id = "WIRE-ROUNDTRIP.declaration-metadata-dropped"
    clauses = ("WIRE-ROUNDTRIP", "WIRE-SCHEMA")

    def on_save(self, model):
        for decl in model.struct_types:
            decl.ClearField("doc_string")
            del decl.metadata_props[:]


class SaveDropsCodecs(Fault):
    """Writes catalogue declarations without their decoder and encoder FunctionProtos when it saves a
    model (it binds codecs natively by type_id and never reads them)."""

    fault_id = "WIRE-ROUNDTRIP.codecs-dropped"
    clauses = ("WIRE-ROUNDTRIP", "CAT-ID-CHANGE")

    def on_save(self, model):
        for decl in model.struct_types:
            decl.ClearField("decoder")
            decl.ClearField("encoder")


_BINDINGS = (7, 1001)             # GraphProto.persistent_bindings


class BindingNamesSwapped(Fault):
    """Declares ``PersistentBindingProto`` with ``output_name = 1`` and ``input_name = 2`` (the pair
    written in dataflow order, output feeding input): every binding reads back to front."""

    fault_id = "WIRE-BINDINGS-FIELD.binding-names-swapped"
    clauses = ("WIRE-BINDINGS-FIELD", "WIRE-SCHEMA")

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, _BINDINGS, {1: 2, 2: 1})


class EncodedNameAndDocSwapped(Fault):
    """Declares ``EncodedValueProto.doc_string = 7`` and ``name = 8`` against the frozen schema: a value's
    name is read from its (usually absent) documentation field."""

    fault_id = "WIRE-SCHEMA.encoded-name-doc-swapped"
    clauses = ("WIRE-SCHEMA",)

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, _ENCODED, {7: 8, 8: 7})


def _merge_repeated(repeated) -> None:
    """What a parser declaring the field singular does with several occurrences: merges them into one."""
    if len(repeated) < 2:
        return
    merged = type(repeated[0])()
    for item in repeated:
        merged.MergeFrom(item)
    del repeated[:]
    repeated.add().CopyFrom(merged)


BindingsFieldSingular = fault("WIRE-BINDINGS-FIELD.singular-field", ("WIRE-BINDINGS-FIELD",),
    """Declares ``persistent_bindings = 1001`` as a singular message instead of a repeated one: several bindings on the
    wire merge into one (the last names win), so only one pair is ever bound.""",
    transform=lambda model, base_dir: _merge_repeated(model.graph.persistent_bindings))


class EncodedInitializerFieldSingular(Fault):
    """Declares ``GraphProto.encoded_initializer = 1000`` as a singular message: a graph's several encoded
    initializers merge into one value (the last name, layout and payload win; external entries
    accumulate)."""

    fault_id = "WIRE-FIELDS.encoded-initializer-singular"
    clauses = ("WIRE-FIELDS",)

    def transform(self, model, base_dir):
        for graph in graphs(model):
            _merge_repeated(graph.encoded_initializer)


class SubgraphEncodedValuesDropped(Fault):
    """Serializes ``encoded_initializer`` only for the root graph: the encoded constants of control-flow
    subgraphs are lost by an explicit save."""

    fault_id = "WIRE-ROUNDTRIP.subgraph-encoded-dropped"
    clauses = ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT")
    boundary = True

    def on_save(self, model):
        for graph in list(graphs(model))[1:]:
            graph.ClearField("encoded_initializer")


class DeclarationFieldsSortedOnSave(Fault):
    """Writes each catalogue declaration's structure fields from a name-keyed map, so a saved model lists
    them in name order: records laid out in declaration order read differently after a round trip."""

    fault_id = "WIRE-ROUNDTRIP.declaration-fields-sorted"
    clauses = ("WIRE-ROUNDTRIP", "EXP-STRUCT")

    def on_save(self, model):
        for decl in model.struct_types:
            if decl.WhichOneof("kind") != "structure":
                continue
            ordered = []
            for field in sorted(decl.structure.field, key=lambda f: f.name):
                copy = type(field)()
                copy.CopyFrom(field)
                ordered.append(copy)
            del decl.structure.field[:]
            decl.structure.field.extend(ordered)


class ExternalDataLocationDropped(Fault):
    """Writes ``data_location`` only when it differs from what it assumes is the default, comparing with
    EXTERNAL instead of DEFAULT: an external value is saved with external entries but no EXTERNAL
    marker."""

    fault_id = "WIRE-ROUNDTRIP.external-location-marker-dropped"
    clauses = ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT")

    def on_save(self, model):
        for graph in graphs(model):
            for value in graph.encoded_initializer:
                if value.data_location == schema.TensorProto.EXTERNAL:
                    value.ClearField("data_location")


class StructLogicalTypesDroppedOnSave(Fault):
    """Writes ``logical_type`` only for affine values (where it is required to decode), so a struct-layout
    value saved explicitly loses the logical type its decoder's output is checked against."""

    fault_id = "WIRE-ROUNDTRIP.struct-logical-type-dropped"
    clauses = ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT")

    def on_save(self, model):
        for graph in graphs(model):
            for value in graph.encoded_initializer:
                if value.WhichOneof("layout") == "struct_type":
                    value.ClearField("logical_type")


class SparseInitializersDensifiedOnSave(Fault):
    """Writes every sparse initializer as the dense TensorProto it stands for (zeros filled in) when it
    saves: existing sparse values do not survive unmigrated."""

    fault_id = "REP-TENSORPROTO-COMPAT.sparse-densified-on-save"
    clauses = ("REP-TENSORPROTO-COMPAT", "WIRE-ROUNDTRIP")

    def on_save(self, model):
        for graph in graphs(model):
            for sparse in graph.sparse_initializer:
                values = to_array(sparse.values, "sparse.values").reshape(-1)
                indices = to_array(sparse.indices, "sparse.indices")
                dense = np.zeros(int(np.prod(list(sparse.dims))), dtype=values.dtype)
                if indices.ndim == 2:  # coordinate form: one row per value
                    indices = np.ravel_multi_index(tuple(indices.T), tuple(sparse.dims))
                dense[indices.reshape(-1)] = values
                tensor = graph.initializer.add(name=sparse.values.name, data_type=sparse.values.data_type)
                tensor.dims.extend(sparse.dims)
                tensor.raw_data = dense.tobytes()
            graph.ClearField("sparse_initializer")


class PayloadLengthCachedPerType(Fault):
    """Sizes each saved struct payload from a per-type_ref cache filled by the first value of that type:
    a later value sharing the type ID but holding more or fewer records is saved truncated or
    zero-padded to the first value's length."""

    fault_id = "WIRE-ROUNDTRIP.payload-length-per-type"
    clauses = ("WIRE-ROUNDTRIP",)

    def on_save(self, model):
        lengths: dict[int, int] = {}
        for graph in graphs(model):
            for value in graph.encoded_initializer:
                if value.WhichOneof("layout") != "struct_type" or struct_kind(value.struct_type) != "type_ref" \
                        or value.external_data:
                    continue
                size = lengths.setdefault(value.struct_type.type_ref, len(value.raw_data))
                value.raw_data = bytes(value.raw_data[:size]).ljust(size, b"\0")


class FixedSizeRequiredForGraphValues(Fault):
    """Allocates struct graph inputs and outputs as flat byte records, so it refuses a struct type
    without a fixed physical size as a graph input or output type (only byte-encoded layouts need one)."""

    fault_id = "REP-STATIC-SUBSET.graph-values-fixed-size"
    clauses = ("REP-STATIC-SUBSET",)

    def precheck(self, model, base_dir):
        catalogue = checked_catalogue(model)
        if catalogue is None:
            return
        for group, name in ((model.graph.input, "input"), (model.graph.output, "output")):
            for vi in group:
                if vi.type.WhichOneof("value") != "struct_type":
                    continue
                path = f"model.graph.{name}[{vi.name!r}].type.struct_type"
                try:
                    size = catalogue.bit_size(vi.type.struct_type, path)
                except ContractError:
                    return
                if isinstance(size, structs.NotFixedSize):
                    raise violation(E.NOT_FIXED_SIZE, size.path, "struct graph values need a fixed size")


class StructTypesInUpstreamRange(Fault):
    """Puts ``ModelProto.struct_types`` at field 27, the next free upstream number, instead of the reserved
    local range: a conforming catalogue (field 1000) is invisible to it."""

    fault_id = "WIRE-LOCAL-RANGE.struct-types-at-27"
    clauses = ("WIRE-LOCAL-RANGE", "WIRE-FIELDS")

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, (), {1000: 27})


class LocalRangeParsedStrictly(Fault):
    """Parses the reserved local range strictly: an unknown field numbered 1000-1099 (another local
    extension) makes the model unparseable, although unknown upstream fields are kept."""

    fault_id = "WIRE-LOCAL-EXTENSION.local-range-strict"
    clauses = ("WIRE-LOCAL-EXTENSION",)
    prepares_writes = True

    def precheck(self, model, base_dir):
        from google.protobuf import unknown_fields

        pending = [model]
        while pending:
            message = pending.pop()
            for item in unknown_fields.UnknownFieldSet(message):
                if 1000 <= item.field_number <= 1099:
                    raise violation(E.MODEL_PARSE_ERROR, "model",
                                    f"unknown local extension field {item.field_number}")
            for descriptor, value in message.ListFields():
                if descriptor.message_type is None:
                    continue
                if isinstance(value, (list, tuple)) or hasattr(value, "extend"):
                    pending.extend(value)
                else:
                    pending.append(value)


class BindingsInUpstreamRange(Fault):
    """Puts ``GraphProto.persistent_bindings`` at field 18, in the upstream range, instead of the reserved
    local range: conforming bindings (1001) are unknown to it, so stateful models run stateless."""

    fault_id = "WIRE-LOCAL-RANGE.bindings-at-18"
    clauses = ("WIRE-LOCAL-RANGE", "WIRE-BINDINGS-FIELD")

    def prepare(self, model_bytes, base_dir):
        return renumber(model_bytes, (7,), {1001: 18})


name_faults(globals())
