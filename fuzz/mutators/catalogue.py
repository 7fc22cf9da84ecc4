"""Catalogue and identity rules: type IDs, concrete declarations, references, inline declarations."""

from __future__ import annotations

from fuzz import gen
from fuzz.cases import FuzzCase
from fuzz.mutators.base import (
    MUTATORS,
    Site,
    Work,
    fresh_declaration,
    kind_of,
    move_last_to,
    mutator,
    pick_site,
    ref_site,
)
from fuzz.source import Source
from reference_impl import schema
from reference_impl.dtypes import UINT64_MAX
from reference_impl.errors import ErrorCode as E


# ----------------------------------------------------------------------------------- catalogue rules
def _type_id_for(src, generated, code):
    work = Work(generated, code)
    decls = list(work.model.struct_types)
    decl = src.choice(decls) if decls and src.chance(7, 8) else fresh_declaration(src, work, "structure").st
    if code == E.TYPE_ID_MISSING:
        decl.ClearField("type_id")
        return work.case("catalogue declaration without type_id")
    decl.type_id = 0
    return work.case("catalogue declaration with type_id 0")


MUTATORS[E.TYPE_ID_MISSING] = lambda src, g: _type_id_for(src, g, E.TYPE_ID_MISSING)
MUTATORS[E.TYPE_ID_ZERO] = lambda src, g: _type_id_for(src, g, E.TYPE_ID_ZERO)


@mutator(E.TYPE_ID_DUPLICATE)
def _duplicate_id(src: Source, generated: gen.Generated) -> FuzzCase:
    work = Work(generated, E.TYPE_ID_DUPLICATE)
    if not len(work.model.struct_types):
        fresh_declaration(src, work, "packing")
    existing = src.choice(list(work.model.struct_types))
    twin = fresh_declaration(src, work, src.choice(("structure", "packing", "array"))).st
    twin.type_id = existing.type_id
    return work.case(f"second declaration of type_id {existing.type_id}")


@mutator(E.DECLARATION_NOT_CONCRETE)
def _declaration_ref(src: Source, generated: gen.Generated) -> FuzzCase:
    work = Work(generated, E.DECLARATION_NOT_CONCRETE)
    ids = [d.type_id for d in work.model.struct_types] or [12345]
    decl = work.model.struct_types.add(type_id=work.fresh_id(src), type_ref=src.choice(ids))
    if src.boolean():
        decl.name = "Alias"
    move_last_to(work.model.struct_types, work.place_index(src, len(work.model.struct_types)))
    return work.case("catalogue declaration that is a type_ref")


@mutator(E.KINDLESS_MISPLACED)
def _kindless(src: Source, generated: gen.Generated) -> FuzzCase:
    work = Work(generated, E.KINDLESS_MISPLACED)
    layouts = work.values(lambda v: v.WhichOneof("layout") == "struct_type")
    if layouts and src.boolean():
        value = src.choice(layouts)
        value.struct_type.Clear()
        if src.boolean():
            value.struct_type.doc_string = "no kind"
        return work.case("kind-less StructTypeProto as an encoded layout")
    decl = work.model.struct_types.add(type_id=work.fresh_id(src))
    if src.boolean():
        decl.name = "Category"
    return work.case("kind-less StructTypeProto as a catalogue declaration")


@mutator(E.TYPE_REF_UNRESOLVED)
def _unresolved(src: Source, generated: gen.Generated) -> FuzzCase:
    work = Work(generated, E.TYPE_REF_UNRESOLVED)
    site = ref_site(src, work)
    site.st.type_ref = work.fresh_id(src) if src.boolean() else src.choice((0, UINT64_MAX, 31337))
    if site.st.type_ref in work.used_ids():
        site.st.type_ref = 31337
    return work.case(f"type_ref {site.st.type_ref} names no declaration ({site.role})")


@mutator(E.TYPE_REF_CYCLE)
def _cycle(src: Source, generated: gen.Generated) -> FuzzCase:
    work = Work(generated, E.TYPE_REF_CYCLE)
    structures = [d for d in work.model.struct_types if d.WhichOneof("kind") == "structure"]
    if structures and src.boolean():
        target = src.choice(structures)
        names = {f.name for f in target.structure.field}
        fld = target.structure.field.add(name=next(n for n in ("loop", "loop1", "loop2", "loop3")
                                                   if n not in names))
        # A reference to itself, or through a fresh declaration back to itself.
        if src.boolean():
            fld.type.struct_type.type_ref = target.type_id
            return work.case("declaration references itself")
        middle = work.add_declaration(schema.StructTypeProto(type_id=work.fresh_id(src)))
        middle.array.element_type.struct_type.type_ref = target.type_id
        middle.array.dimension = 2
        fld.type.struct_type.type_ref = middle.type_id
        return work.case("two declarations reference each other")
    first = work.add_declaration(schema.StructTypeProto(type_id=work.fresh_id(src)))
    second = work.add_declaration(schema.StructTypeProto(type_id=work.fresh_id(src)))
    first.structure.field.add(name="next").type.struct_type.type_ref = second.type_id
    second.array.element_type.struct_type.type_ref = first.type_id
    second.array.dimension = 1
    return work.case("fresh declarations form a cycle")


@mutator(E.TYPE_REF_EXTRA_FIELDS)
def _ref_extra(src: Source, generated: gen.Generated) -> FuzzCase:
    work = Work(generated, E.TYPE_REF_EXTRA_FIELDS)
    site = ref_site(src, work)
    extra = src.choice(("name", "doc_string", "metadata_props", "decoder", "encoder", "type_id"))
    if extra == "name":
        site.st.name = "Named"
    elif extra == "doc_string":
        site.st.doc_string = "doc"
    elif extra == "metadata_props":
        site.st.metadata_props.add(key="k", value="v")
    elif extra in ("decoder", "encoder"):
        getattr(site.st, extra).name = "Codec"
    else:
        site.st.type_id = site.st.type_ref
    return work.case(f"type_ref carries {extra}")


@mutator(E.INLINE_TYPE_ID)
def _inline_id(src: Source, generated: gen.Generated) -> FuzzCase:
    work = Work(generated, E.INLINE_TYPE_ID)

    def fallback() -> Site:
        decl = fresh_declaration(src, work, "structure").st
        fld = decl.structure.field.add(name="inline")
        fld.type.struct_type.bit_packing.component.add(name="c", bit_width=4)
        fld.type.struct_type.bit_packing.dimension = 2
        return Site(fld.type.struct_type, "type")

    site = pick_site(src, work, lambda s: s.role != "declaration" and kind_of(s) not in (None, "type_ref")
                      or (s.role == "type" and kind_of(s) is None), fallback)
    site.st.type_id = src.choice((1, 2001, work.fresh_id(src)))
    return work.case(f"inline declaration ({site.role}) carries a type_id")
