"""Shared machinery of the near-valid generators: the registry, a working copy of the model, and
pickers that find (or add) a valid element of the kind a rule talks about.

Each mutator only breaks its own rule: e.g. a wrong scale shape comes with data that matches the
wrong shape, so ``TENSOR_DATA_INVALID`` cannot fire first.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fuzz import dimensions, gen
from fuzz import layouts as L
from fuzz.cases import FuzzCase
from fuzz.source import Source
from reference_impl import dtypes, examples, schema
from reference_impl.errors import ErrorCode as E

REGISTERED_IDS = (2001, 1002, 1003, 1102)

Mutator = Callable[[Source, gen.Generated], FuzzCase]
MUTATORS: dict[E, Mutator] = {}

#: Codes of the state, execution, export and KV layers are produced by operation scripts instead
#: (``fuzz.statescript.STATE_CODES``, ``fuzz.kvscript.KV_CODES``); tests check that together they
#: cover every ErrorCode.


def mutator(*codes: E):
    def register(fn: Mutator) -> Mutator:
        for code in codes:
            MUTATORS[code] = fn
        return fn
    return register



# ------------------------------------------------------------------------------------------ helpers
class Work:
    """A private copy of a generated model plus the case being built."""

    def __init__(self, generated: gen.Generated, code: E):
        self.model = copy.deepcopy(generated.model)
        self.files = dict(generated.files)
        self.catalogue = generated.catalogue
        self.code = code
        self.tags: list[str] = list(generated.tags)

    def case(self, rule: str, op: str = "verify", name: str = "", field: str = "") -> FuzzCase:
        return FuzzCase(self.model, op, name, field, self.files, self.code.value, rule, list(self.tags))

    def placed(self, src: Source, items: list):
        """The item to break among ``items``, first, middle or last (``dimensions.place``), tagged
        ``position:<where>`` when there is more than one to choose from (``position:only`` otherwise)."""
        index, where = dimensions.place(src, len(items))
        self.tags.append(f"position:{where}" if len(items) > 1 else "position:only")
        return items[index]

    def place_index(self, src: Source, count: int) -> int:
        """Where a new item goes among ``count`` (itself included): first, middle or last, tagged."""
        index, where = dimensions.place(src, count)
        self.tags.append(f"position:{where}" if count > 1 else "position:only")
        return index

    @property
    def graph(self):
        return self.model.graph

    def used_ids(self) -> set[int]:
        return {d.type_id for d in self.model.struct_types}

    def fresh_id(self, src: Source) -> int:
        used = self.used_ids() | set(REGISTERED_IDS)
        return src.choice([i for i in gen.ID_POOL + (7777, 9001) if i not in used])

    def fresh_name(self, stem: str = "extra") -> str:
        names = {v.name for v in self.graph.encoded_initializer} | {t.name for t in self.graph.initializer}
        names |= {s.values.name for s in self.graph.sparse_initializer}
        index = 0
        while f"{stem}{index}" in names:
            index += 1
        return f"{stem}{index}"

    def append_value(self, value):
        """Store a value in the graph and return the stored message (append would copy it)."""
        stored = self.graph.encoded_initializer.add()
        stored.CopyFrom(value)
        return stored

    def values(self, predicate=lambda v: True) -> list:
        return [v for v in self.graph.encoded_initializer if predicate(v)]

    def add_affine(self, src: Source, storage: int | None = None, granularity: str | None = None,
                   inline: bool = True):
        value, _, payload = gen.gen_affine_value(src, self.fresh_name("aff"), storage, granularity)
        value.raw_data = payload
        value = self.append_value(value)
        if not inline:
            make_external(value, self.files)
        return value

    def add_struct(self, src: Source, min_bytes: int = 1):
        """A fresh valid struct value (layout from the generated catalogue or inline)."""
        value, expected, payload = gen.gen_struct_value(src, self.catalogue_for_refs(), self.fresh_name("rec"))
        if expected.record_bytes < min_bytes:
            pad = L.Packing([("pad", 8)], min_bytes)
            st = schema.StructTypeProto()
            body = st.structure.field.add(name="body")
            body.type.struct_type.CopyFrom(value.struct_type)
            extra = st.structure.field.add(name="extra")
            extra.type.CopyFrom(L.type_proto(pad))
            value.struct_type.CopyFrom(st)
            payload = b"\0" * ((expected.record_bytes + min_bytes) * expected.records)
        value.raw_data = payload
        return self.append_value(value)

    def catalogue_for_refs(self) -> L.Catalogue:
        """The generated catalogue, if this model still declares it unchanged (else inline layouts)."""
        declared = {d.type_id for d in self.model.struct_types}
        if all(tid in declared for tid in self.catalogue.declarations):
            return self.catalogue
        return L.Catalogue()

    def add_declaration(self, st) -> object:
        decl = self.model.struct_types.add()
        decl.CopyFrom(st)
        return decl

    def ensure_spec_catalogue(self) -> bool:
        """Declare the spec's example types unless some of their IDs are taken by other declarations."""
        declared = {d.type_id: d for d in self.model.struct_types}
        spec = {d.type_id: d for d in examples.spec_struct_types()}
        if all(tid in declared and declared[tid] == spec[tid] for tid in spec):
            return True
        if any(tid in declared for tid in spec):
            return False
        self.model.struct_types.extend(spec.values())
        return True


def make_external(value, files: dict[str, bytes]) -> None:
    """Move an inline payload into the shared external file (a valid transformation)."""
    payload = value.raw_data
    value.ClearField("raw_data")
    blob = files.get(gen.EXTERNAL_FILE, b"")
    offset = len(blob)
    files[gen.EXTERNAL_FILE] = blob + payload
    value.data_location = 1
    del value.external_data[:]
    value.external_data.add(key="location", value=gen.EXTERNAL_FILE)
    value.external_data.add(key="offset", value=str(offset))
    value.external_data.add(key="length", value=str(len(payload)))


def is_external(value) -> bool:
    return value.data_location == 1


def entries(value) -> dict[str, str]:
    return {e.key: e.value for e in value.external_data}


def set_entry(value, key: str, text: str | None) -> None:
    kept = [(e.key, e.value) for e in value.external_data if e.key != key]
    if text is not None:
        kept.append((key, text))
    del value.external_data[:]
    for k, v in kept:
        value.external_data.add(key=k, value=v)


def payload_length(value, files) -> int:
    if is_external(value):
        return int(entries(value)["length"])
    return len(value.raw_data)


# ----------------------------------------------------------------------------------- struct sites
@dataclass
class Site:
    st: object  # StructTypeProto
    role: str  # "declaration" | "layout" | "type"


def sites_in_type(tp, out: list) -> None:
    which = tp.WhichOneof("value")
    if which == "struct_type":
        out.append(Site(tp.struct_type, "type"))
        struct_children(tp.struct_type, out)
    elif which == "sequence_type":
        sites_in_type(tp.sequence_type.elem_type, out)
    elif which == "map_type":
        sites_in_type(tp.map_type.value_type, out)
    elif which == "optional_type":
        sites_in_type(tp.optional_type.elem_type, out)


def struct_children(st, out: list) -> None:
    kind = st.WhichOneof("kind")
    if kind == "array":
        sites_in_type(st.array.element_type, out)
    elif kind == "structure":
        for fld in st.structure.field:
            if fld.WhichOneof("content") == "type":
                sites_in_type(fld.type, out)


def struct_sites(model) -> list[Site]:
    """Every StructTypeProto the verifier checks: declarations, encoded layouts, types inside them,
    structured graph input/output types."""
    out: list[Site] = []
    for decl in model.struct_types:
        out.append(Site(decl, "declaration"))
        struct_children(decl, out)
    for value in model.graph.encoded_initializer:
        if value.WhichOneof("layout") == "struct_type":
            out.append(Site(value.struct_type, "layout"))
            struct_children(value.struct_type, out)
    for group in (model.graph.input, model.graph.output):
        for info in group:
            sites_in_type(info.type, out)
    return out


def type_sites(model) -> list:
    """TypeProtos the verifier checks with the ONNX rules: struct field types and array elements."""
    out = []
    for site in struct_sites(model):
        kind = site.st.WhichOneof("kind")
        if kind == "array":
            out.append(site.st.array.element_type)
        elif kind == "structure":
            out += [f.type for f in site.st.structure.field if f.WhichOneof("content") == "type"]
    return out


def kind_of(site: Site) -> str | None:
    return site.st.WhichOneof("kind")


def pick_site(src: Source, work: Work, predicate, fallback) -> Site:
    sites = [s for s in struct_sites(work.model) if predicate(s)]
    if sites and src.chance(7, 8):
        return work.placed(src, sites)
    return fallback()


def fresh_declaration(src: Source, work: Work, kind: str) -> Site:
    """Append a valid, unreferenced declaration of the given kind and return it as a site."""
    st = schema.StructTypeProto(type_id=work.fresh_id(src))
    if kind == "structure":
        a = st.structure.field.add(name="a")
        a.type.CopyFrom(L.tensor_type(dtypes.UINT8, ()))
        b = st.structure.field.add(name="b")
        b.constant.CopyFrom(schema.TensorProto(data_type=dtypes.FLOAT, float_data=[0.5]))
    elif kind == "packing":
        st.bit_packing.component.add(name="x", bit_width=3)
        st.bit_packing.component.add(name="y", bit_width=5)
        st.bit_packing.dimension = 2
    elif kind == "array":
        st.array.element_type.CopyFrom(L.tensor_type(dtypes.INT4, ()))
        st.array.dimension = 4
    else:  # a structure holding a reference to another fresh declaration (declared first)
        target = fresh_declaration(src, work, "structure").st.type_id
        st.type_id = work.fresh_id(src)
        st.structure.field.add(name="inner").type.struct_type.type_ref = target
    return Site(work.add_declaration(st), "declaration")


def ref_sites(work: Work) -> list[Site]:
    return [s for s in struct_sites(work.model) if kind_of(s) == "type_ref"]


def ref_site(src: Source, work: Work) -> Site:
    sites = ref_sites(work)
    if sites and src.chance(7, 8):
        return work.placed(src, sites)
    decl = fresh_declaration(src, work, "ref")
    return Site(decl.st.structure.field[0].type.struct_type, "type")


# ----------------------------------------------------------------------------- shared pickers
def move_last_to(repeated, index: int) -> None:
    items = [copy.deepcopy(x) for x in repeated]
    items.insert(index, items.pop())
    del repeated[:]
    repeated.extend(items)


def wrap_layout(value, extra_name: str, extra_type) -> None:
    st = schema.StructTypeProto()
    body = st.structure.field.add(name="body")
    body.type.struct_type.CopyFrom(value.struct_type)
    extra = st.structure.field.add(name=extra_name)
    extra.type.CopyFrom(extra_type)
    value.struct_type.CopyFrom(st)


def struct_value(src, work, min_bytes: int = 1):
    candidates = work.values(lambda v: v.WhichOneof("layout") == "struct_type")
    if candidates and src.chance(3, 4):
        return src.choice(candidates)
    return work.add_struct(src, min_bytes)


def any_value(src, work, external: bool | None = None):
    values = work.values(lambda v: external is None or is_external(v) == external)
    if values and src.chance(3, 4):
        return src.choice(values)
    if src.boolean():
        value = work.add_affine(src)
    else:
        value = work.add_struct(src)
    if external:
        make_external(value, work.files)
    return value


def explicit_affine(work, storage: int, count: int):
    """A per-tensor value of ``count`` zero codes (a deterministic fallback)."""
    value = schema.EncodedValueProto(name=work.fresh_name("aff"))
    value.affine.storage_type = storage
    value.affine.scale.CopyFrom(schema.TensorProto(data_type=dtypes.FLOAT, float_data=[1.0]))
    value.logical_type.CopyFrom(L.tensor_type(dtypes.FLOAT, (count,)))
    value.raw_data = gen.pack_codes(np.zeros(count, np.int64), storage)
    return work.append_value(value)


def pick_affine(src, work, predicate=lambda v: True, **fresh):
    values = work.values(lambda v: v.WhichOneof("layout") == "affine" and predicate(v))
    if values and src.chance(3, 4):
        return work.placed(src, values)
    return work.add_affine(src, **fresh)


def rank_of(value) -> int:
    return len(value.logical_type.tensor_type.shape.dim)


def logical_shape(value) -> list:
    return [d.dim_value for d in value.logical_type.tensor_type.shape.dim]


def spec_value(src, work):
    """A value decodable by a registered decoder (adding the spec's catalogue when needed)."""
    values = work.values(lambda v: v.WhichOneof("layout") == "struct_type"
                         and v.struct_type.WhichOneof("kind") == "type_ref"
                         and v.struct_type.type_ref in REGISTERED_IDS
                         and v.logical_type.WhichOneof("value") == "tensor_type")
    if values and src.chance(3, 4):
        return src.choice(values)
    if not work.ensure_spec_catalogue():
        return None
    value, _, payload = gen.gen_spec_value(src, work.fresh_name("spec"))
    value.raw_data = payload
    return work.append_value(value)


def spec_decl(type_id: int):
    return {d.type_id: d for d in examples.spec_struct_types()}[type_id]
