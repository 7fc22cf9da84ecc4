"""The suite's outline: the spec areas every case, builder, fault and test is filed under, defined once.

An area comes from the spec's own section headings and owns the clause prefixes of
``reference_impl/clauses.py`` whose rules it tests. A case ID is ``Level.Area.Topic.Name`` with ``Area``
one of ``AREAS``; its manifest lives in ``corpus/cases/<folder>/`` (fuzz-promoted cases in
``corpus/regressions/cases/<folder>/``), its builders in ``corpus/builders/<folder>*.py`` and its tests in
``tests/test_<folder>_*.py``. A case cites clauses of any prefix; its area names the one it is about.
The size gate (``SIZE``) and the project's process (``PROC``) have no cases, so no area.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Area:
    """One spec area: its case-ID word, where its files live, the spec sections and clause prefixes."""

    name: str
    folder: str
    sections: tuple[str, ...]
    prefixes: tuple[str, ...]
    about: str


_OBJ = "Objective and consolidation"
_STRUCT = "Struct types and byte-encodable layouts"
_REPR = "Representation model: a small quantized core plus generic structs"
_CAT = "Catalogue and identity contract"
_PAY = "Payload and lifetime contract"
_ENC = "Byte-encoding rules and validation"
_MANY = "One element type, many payload lengths"
_QEX = "Quantization examples: constants and per-value parameters"
_CODEBOOK = "Codebook quantization through a shared subtype"
_PERSIST = "Persistent state from model inputs and outputs"
_DECL = "Graph-level persistence declaration"
_WHOLE = "Whole structured inputs"
_MIN = "Minimal rules"
_ZC = "Zero-copy ownership from the first state implementation"
_PAGED = "Quantized and paged caches use the same feedback"
_GB = "GraphBuilder, shape inference and serialization"
_SEQ = "Implementation sequence"
_OWN = "Ownership and acceptance"
_PREP = "Interoperability with prepared execution"

#: The areas, in the order of the spec's sections.
AREAS: tuple[Area, ...] = (
    Area("Wire", "wire", (_STRUCT, _OBJ, _REPR, _PREP, _DECL, _GB, _SEQ), ("WIRE", "REP"),
         "the frozen field numbers, unknown fields and round trips of the wire contract"),
    Area("Affine", "affine", (_STRUCT,), ("AFF",),
         "AffineLayoutProto: storage types, packing, scale, zero point, axis and blocks"),
    Area("Declarations", "declarations", (_STRUCT, _CAT, _PAY, _ENC), ("DECL",),
         "StructTypeProto declarations: field content, dims, counts and constants"),
    Area("Catalogue", "catalogue", (_CAT, _STRUCT), ("CAT", "GRAPH"),
         "the type catalogue: IDs, references, inline types and struct graph I/O"),
    Area("Naming", "naming", (_CAT,), ("INIT",),
         "initializer and input names shared by tensors and encoded values"),
    Area("External", "external", (_PAY, _MANY), ("PAY",),
         "payload ownership: raw bytes or external files, extents, validation before use"),
    Area("Encoding", "encoding", (_ENC, _MANY, _REPR, _STRUCT, _PAY, _QEX), ("ENC",),
         "byte-encoded layouts: sizes, leaves, bit order, record counts"),
    Area("Limits", "limits", (_ENC,), ("RESOURCE",),
         "the implementation limits the suite shares with onnx-light (Recommended)"),
    Area("Structured", "structured", (_REPR, _QEX, _CODEBOOK, _PAY, _ENC, _MANY), ("DEC", "EX"),
         "decoders and consumers of structured values, and the spec's worked examples"),
    Area("Bindings", "bindings", (_DECL, _MIN), ("BIND",),
         "GraphProto.persistent_bindings: names, types and what a declaration may bind"),
    Area("State", "state", (_PERSIST, _DECL, _WHOLE, _MIN), ("STATE",),
         "state across calls: initial values, feeds, reset, close and whole structured inputs"),
    Area("ZeroCopy", "zero_copy", (_ZC,), ("ZC",),
         "retained outputs without payload copies: views, shared storage, failures"),
    Area("KV", "kv", (_PAGED, _SEQ, _OWN), ("KV",),
         "contiguous and paged KV caches and attention over them"),
    Area("Export", "export", (_GB,), ("EXP",),
         "serialization: what export preserves, deduplicates, renames and rewrites"),
)
#: Clause prefixes that no case tests (checked by the size gate and by the project's process).
UNCASED_PREFIXES = ("SIZE", "PROC")

BY_NAME = {area.name: area for area in AREAS}
_BY_PREFIX = {prefix: area for area in AREAS for prefix in area.prefixes}


def area_of_clause(clause_id: str) -> Area | None:
    """The area owning a clause (by its prefix, ``AFF-SCALE`` -> Affine), or None for size/process ones."""
    return _BY_PREFIX.get(clause_id.split("-", 1)[0])


def area_of_case_id(case_id: str) -> Area | None:
    """The area a case ID names (its second component), or None when it names no area."""
    parts = case_id.split(".")
    return BY_NAME.get(parts[1]) if len(parts) > 1 else None


__all__ = ["AREAS", "BY_NAME", "UNCASED_PREFIXES", "Area", "area_of_case_id", "area_of_clause"]
