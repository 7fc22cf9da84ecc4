"""Faults in the wire format: field numbers, proto fields a reader must keep or refuse, round trips."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from google.protobuf import unknown_fields

from conformance.audit.fault import fault, graphs, name_faults
from conformance.audit.wire_edit import renumber
from reference_impl import schema, structs
from reference_impl.errors import ContractError, ErrorCode, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.graph_utils import _has_unknown_fields
from reference_impl.structs import struct_kind
from reference_impl.tensors import to_array


# ------------------------------------------------------------ model edits the faults of several areas share
def cleared(items: Callable[[Any], Iterable], *fields: str) -> Callable[..., None]:
    """A model edit (transform or on_save) clearing ``fields`` of every message ``items(model)`` yields."""
    def edit(model, *_):
        for item in items(model):
            for name in fields:
                item.ClearField(name)
    return edit


def replace_all(repeated, items: Iterable) -> None:
    """Make ``items`` (often some of the field's own messages) the elements of a repeated message field."""
    copies = []
    for item in items:
        copies.append(type(item)())
        copies[-1].CopyFrom(item)
    del repeated[:]
    repeated.extend(copies)


def refusing(code: ErrorCode, path: str, message: str, offends: Callable[[Any], bool]) -> Callable[..., None]:
    """A precheck refusing a model in which ``offends(model)`` holds: a rule the runtime wrongly adds."""
    def precheck(model, base_dir):
        if offends(model):
            raise violation(code, path, message)
    return precheck


def _renumbered(fault_id: str, clauses: tuple[str, ...], doc: str, paths: tuple, numbers: dict[int, int]) -> type:
    """A fault compiled against a misnumbered schema: it reads the fields of the messages at ``paths`` with
    their numbers changed by ``numbers`` (wire number -> the one it expects)."""
    cls = fault(fault_id, clauses, doc)

    def prepare(self, model_bytes, base_dir):
        for path in paths:
            model_bytes = renumber(model_bytes, path, numbers)
        return model_bytes
    cls.prepare = prepare
    return cls


_MODEL = ()                       # ModelProto (struct_types: top-level field 1000)
_GRAPH = (7,)                     # ModelProto.graph
_ENCODED = (7, 1000)              # GraphProto.encoded_initializer
_AFFINE = (7, 1000, 1)            # EncodedValueProto.affine
_BINDINGS = (7, 1001)             # GraphProto.persistent_bindings
#: ModelProto.struct_types[].structure.field[], graph.encoded_initializer[].struct_type.structure.field[]
_STRUCTURE_FIELDS = ((1000, 2, 1), (7, 1000, 2, 2, 1))
#: TypeProtos a model commonly holds: graph inputs, outputs and value_info, struct fields of the
#: catalogue, and encoded values' logical types
_TYPE_PROTOS = ((7, 11, 2), (7, 12, 2), (7, 13, 2), (1000, 2, 1, 2), (7, 1000, 3))

StructTypesMisnumbered = _renumbered("WIRE-FIELDS.struct-types-at-1001", ("WIRE-FIELDS",),
    """Compiled against a schema with ``ModelProto.struct_types`` at 1001 (an off-by-one in the local range): a
    conforming catalogue at field 1000 is an unknown field to it, so no type_ref resolves.""", (_MODEL,), {1000: 1001})
EncodedInitializersInUpstreamRange = _renumbered("WIRE-LOCAL-RANGE.encoded-initializer-at-17",
    ("WIRE-LOCAL-RANGE", "WIRE-FIELDS"), """Puts ``GraphProto.encoded_initializer`` at field 17, the next free upstream
    number, instead of the reserved local range: conforming encoded initializers (field 1000) are invisible to it.""",
    (_GRAPH,), {1000: 17})
AffineAxisAndBlockSwapped = _renumbered("WIRE-SCHEMA.affine-axis-block-swapped", ("WIRE-SCHEMA",),
    """Declares ``AffineLayoutProto.axis = 5`` and ``block_size = 4``, the two optional fields swapped against the
    frozen schema: a per-axis layout reads as a block size without an axis.""", (_AFFINE,), {4: 5, 5: 4})
BindingsMisnumbered = _renumbered("WIRE-BINDINGS-FIELD.bindings-at-1002", ("WIRE-BINDINGS-FIELD",),
    """Reads ``GraphProto.persistent_bindings`` from field 1002: conforming bindings (1001) are unknown fields to it, so
    every stateful model runs stateless.""", (_GRAPH,), {1001: 1002})
FieldContentNumberedInOrder = _renumbered("WIRE-SCHEMA.field-constant-at-3", ("WIRE-SCHEMA", "DECL-FIELD-CONTENT"),
    """Numbers ``StructTypeProto.Structure.Field`` in declaration order (name 1, type 2, constant 3, doc_string 4)
    instead of the frozen ``constant = 4``, ``doc_string = 3``: a conforming constant reads as a doc string and the
    field is left without content.""", _STRUCTURE_FIELDS, {3: 4, 4: 3})
TypeStructTypeMisnumbered = _renumbered("WIRE-FIELDS.type-struct-at-1001", ("WIRE-FIELDS", "WIRE-LOCAL-RANGE"),
    """Reads ``TypeProto.struct_type`` from field 1001 (an off-by-one in the local range): a conforming struct-typed
    input, output or field (field 1000) is an unknown field, leaving its type unset.""", _TYPE_PROTOS, {1000: 1001})
BindingNamesSwapped = _renumbered("WIRE-BINDINGS-FIELD.binding-names-swapped", ("WIRE-BINDINGS-FIELD", "WIRE-SCHEMA"),
    """Declares ``PersistentBindingProto`` with ``output_name = 1`` and ``input_name = 2`` (the pair written in dataflow
    order, output feeding input): every binding reads back to front.""", (_BINDINGS,), {1: 2, 2: 1})
EncodedNameAndDocSwapped = _renumbered("WIRE-SCHEMA.encoded-name-doc-swapped", ("WIRE-SCHEMA",),
    """Declares ``EncodedValueProto.doc_string = 7`` and ``name = 8`` against the frozen schema: a value's name is read
    from its (usually absent) documentation field.""", (_ENCODED,), {7: 8, 8: 7})
StructTypesInUpstreamRange = _renumbered("WIRE-LOCAL-RANGE.struct-types-at-27", ("WIRE-LOCAL-RANGE", "WIRE-FIELDS"),
    """Puts ``ModelProto.struct_types`` at field 27, the next free upstream number, instead of the reserved local range:
    a conforming catalogue (field 1000) is invisible to it.""", (_MODEL,), {1000: 27})
BindingsInUpstreamRange = _renumbered("WIRE-LOCAL-RANGE.bindings-at-18", ("WIRE-LOCAL-RANGE", "WIRE-BINDINGS-FIELD"),
    """Puts ``GraphProto.persistent_bindings`` at field 18, in the upstream range, instead of the reserved local range:
    conforming bindings (1001) are unknown to it, so stateful models run stateless.""", (_GRAPH,), {1001: 18})
RejectsUnknownFields = fault("WIRE-LOCAL-EXTENSION.strict-parser", ("WIRE-LOCAL-EXTENSION",),
    """Parses strictly: a model carrying fields its schema does not know (future upstream fields, other local
    extensions) is refused as unparseable instead of being read with them kept as unknown fields.""",
    prepares_writes=True,
    precheck=refusing(E.MODEL_PARSE_ERROR, "model", "unknown fields are not accepted", _has_unknown_fields))


def _local_range_strict(model, base_dir):
    pending = [model]
    while pending:
        message = pending.pop()
        for item in unknown_fields.UnknownFieldSet(message):
            if 1000 <= item.field_number <= 1099:
                raise violation(E.MODEL_PARSE_ERROR, "model", f"unknown local extension field {item.field_number}")
        for descriptor, value in message.ListFields():
            if descriptor.message_type is not None:
                pending.extend(value if isinstance(value, (list, tuple)) or hasattr(value, "extend") else [value])


LocalRangeParsedStrictly = fault("WIRE-LOCAL-EXTENSION.local-range-strict", ("WIRE-LOCAL-EXTENSION",),
    """Parses the reserved local range strictly: an unknown field numbered 1000-1099 (another local extension) makes the
    model unparseable, although unknown upstream fields are kept.""", prepares_writes=True,
    precheck=_local_range_strict)


def _encoded(model, where=lambda value: True) -> list:
    """The encoded values of every graph for which ``where`` holds."""
    return [value for graph in graphs(model) for value in graph.encoded_initializer if where(value)]


SavesHeadersWithoutPayload = fault("WIRE-ROUNDTRIP.save-drops-inline-payloads", ("WIRE-ROUNDTRIP",),
    """Takes inline payloads out of the message at load (as the zero-copy loader should) but saves only the headers: an
    explicit load and save loses every inline encoded payload.""",
    on_save=cleared(lambda model: model.graph.encoded_initializer, "raw_data"))
SaveDropsDeclarationMetadata = fault("WIRE-ROUNDTRIP.declaration-metadata-dropped", ("WIRE-ROUNDTRIP", "WIRE-SCHEMA"),
    """Writes catalogue declarations without their doc strings and metadata_props (it keeps only what its own layouts
    use) when it saves a model.""", on_save=cleared(lambda model: model.struct_types, "doc_string", "metadata_props"))
SaveDropsCodecs = fault("WIRE-ROUNDTRIP.codecs-dropped", ("WIRE-ROUNDTRIP", "CAT-ID-CHANGE"),
    """Writes catalogue declarations without their decoder and encoder FunctionProtos when it saves a model (it binds
    codecs natively by type_id and never reads them).""",
    on_save=cleared(lambda model: model.struct_types, "decoder", "encoder"))
SubgraphEncodedValuesDropped = fault("WIRE-ROUNDTRIP.subgraph-encoded-dropped",
    ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT"), """Serializes ``encoded_initializer`` only for the root graph: the
    encoded constants of control-flow subgraphs are lost by an explicit save.""", boundary=True,
    on_save=cleared(lambda model: list(graphs(model))[1:], "encoded_initializer"))
ExternalDataLocationDropped = fault("WIRE-ROUNDTRIP.external-location-marker-dropped",
    ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT"), """Writes ``data_location`` only when it differs from what it assumes is
    the default, comparing with EXTERNAL instead of DEFAULT: an external value is saved with external entries but no
    EXTERNAL marker.""", on_save=cleared(
        lambda model: _encoded(model, lambda value: value.data_location == schema.TensorProto.EXTERNAL),
        "data_location"))
StructLogicalTypesDroppedOnSave = fault("WIRE-ROUNDTRIP.struct-logical-type-dropped",
    ("WIRE-ROUNDTRIP", "EXP-PRESERVE-STRUCT"), """Writes ``logical_type`` only for affine values (where it is required
    to decode), so a struct-layout value saved explicitly loses the logical type its decoder's output is checked
    against.""", on_save=cleared(
        lambda model: _encoded(model, lambda value: value.WhichOneof("layout") == "struct_type"), "logical_type"))


def _migrate_dense(model) -> None:
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


MigratesDenseInitializers = fault("REP-TENSORPROTO-COMPAT.migrates-dense-on-save", ("REP-TENSORPROTO-COMPAT",),
    """Migrates every dense ``TensorProto`` initializer to an encoded value (an inline one-field struct layout) when it
    saves: existing TensorProto values do not survive unmigrated.""", on_save=_migrate_dense)


def _densify_sparse(model) -> None:
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


SparseInitializersDensifiedOnSave = fault("REP-TENSORPROTO-COMPAT.sparse-densified-on-save",
    ("REP-TENSORPROTO-COMPAT", "WIRE-ROUNDTRIP"), """Writes every sparse initializer as the dense TensorProto it stands
    for (zeros filled in) when it saves: existing sparse values do not survive unmigrated.""", on_save=_densify_sparse)


def _sort_fields(model) -> None:
    for decl in model.struct_types:
        if decl.WhichOneof("kind") == "structure":
            replace_all(decl.structure.field, sorted(decl.structure.field, key=lambda f: f.name))


DeclarationFieldsSortedOnSave = fault("WIRE-ROUNDTRIP.declaration-fields-sorted", ("WIRE-ROUNDTRIP", "EXP-STRUCT"),
    """Writes each catalogue declaration's structure fields from a name-keyed map, so a saved model lists them in name
    order: records laid out in declaration order read differently after a round trip.""", on_save=_sort_fields)


def _length_per_type(model) -> None:
    lengths: dict[int, int] = {}
    for value in _encoded(model, lambda value: value.WhichOneof("layout") == "struct_type"):
        if struct_kind(value.struct_type) == "type_ref" and not value.external_data:
            size = lengths.setdefault(value.struct_type.type_ref, len(value.raw_data))
            value.raw_data = bytes(value.raw_data[:size]).ljust(size, b"\0")


PayloadLengthCachedPerType = fault("WIRE-ROUNDTRIP.payload-length-per-type", ("WIRE-ROUNDTRIP",),
    """Sizes each saved struct payload from a per-type_ref cache filled by the first value of that type: a later value
    sharing the type ID but holding more or fewer records is saved truncated or zero-padded to the first value's
    length.""", on_save=_length_per_type)


def _singular(fields: Callable[[Any], Iterable]) -> Callable[..., None]:
    """A transform reading repeated message fields as a parser declaring them singular does: several occurrences
    of each of ``fields(model)`` merge into one."""
    def transform(model, base_dir):
        for repeated in fields(model):
            if len(repeated) > 1:
                merged = type(repeated[0])()
                for item in repeated:
                    merged.MergeFrom(item)
                del repeated[:]
                repeated.add().CopyFrom(merged)
    return transform


BindingsFieldSingular = fault("WIRE-BINDINGS-FIELD.singular-field", ("WIRE-BINDINGS-FIELD",),
    """Declares ``persistent_bindings = 1001`` as a singular message instead of a repeated one: several bindings on the
    wire merge into one (the last names win), so only one pair is ever bound.""",
    transform=_singular(lambda model: [model.graph.persistent_bindings]))
EncodedInitializerFieldSingular = fault("WIRE-FIELDS.encoded-initializer-singular", ("WIRE-FIELDS",),
    """Declares ``GraphProto.encoded_initializer = 1000`` as a singular message: a graph's several encoded initializers
    merge into one value (the last name, layout and payload win; external entries accumulate).""",
    transform=_singular(lambda model: [graph.encoded_initializer for graph in graphs(model)]))


def checked_catalogue(model) -> structs.Catalogue | None:
    """The model's catalogue once every declaration checks out, or None: an invalid catalogue is the
    oracle's to report, not the fault's."""
    try:
        catalogue = structs.Catalogue(model.struct_types)
        catalogue.check_all()
    except Exception:  # noqa: BLE001
        return None
    return catalogue


def _fixed_size_required(model, base_dir):
    catalogue = checked_catalogue(model)
    if catalogue is None:
        return
    for decl, path in catalogue.declarations.values():
        size = catalogue.bit_size(decl, path)
        if isinstance(size, structs.NotFixedSize):
            raise violation(E.NOT_FIXED_SIZE, size.path, "every struct type must have a fixed size")


RequiresFixedSizeStructs = fault("REP-STATIC-SUBSET.fixed-size-required", ("REP-STATIC-SUBSET",),
    """Computes the byte size of every declaration up front and refuses those without a fixed physical size, although
    only byte-encoded layouts need one.""", precheck=_fixed_size_required)


def _graph_values_fixed_size(model, base_dir):
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


FixedSizeRequiredForGraphValues = fault("REP-STATIC-SUBSET.graph-values-fixed-size", ("REP-STATIC-SUBSET",),
    """Allocates struct graph inputs and outputs as flat byte records, so it refuses a struct type without a fixed
    physical size as a graph input or output type (only byte-encoded layouts need one).""",
    precheck=_graph_values_fixed_size)


name_faults(globals())
