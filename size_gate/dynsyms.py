"""The defined dynamic symbols of a shared library, with their versions.

The symbol table is located through the section headers (``.dynsym`` and its
``.gnu.version``/``.gnu.version_d`` companions) when they exist, as ``nm -D``
and ``readelf --dyn-syms`` do. A library stripped of its section headers is
read through its dynamic segment instead: ``DT_SYMTAB`` gives the table and the
``DT_GNU_HASH`` or ``DT_HASH`` hash table gives its length. The table itself is
unpacked by ``struct`` in C (large libraries export tens of thousands of symbols), with no NumPy to import.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import NamedTuple

from elftools.common.utils import struct_parse

from size_gate.elfimage import (
    DT_GNU_HASH,
    DT_HASH,
    DT_STRSZ,
    DT_STRTAB,
    DT_SYMENT,
    DT_SYMTAB,
    DT_VERDEF,
    DT_VERDEFNUM,
    DT_VERSYM,
    SHN_ABS,
    SHN_UNDEF,
    ElfImage,
    cstring,
)

VERSYM_HIDDEN = 0x8000
VERSYM_INDEX = 0x7FFF


class SymbolTables(NamedTuple):
    """Where the dynamic symbol table and its version tables live in the file."""

    source: str
    symtab_offset: int
    count: int
    entsize: int
    strtab: bytes
    versym_offset: int | None
    verdef_offset: int | None
    verdef_count: int


class DefinedSymbols(NamedTuple):
    """Sorted symbol keys (``name``, ``name@@VERSION`` or ``name@VERSION``) and how many are version definitions."""

    keys: tuple[str, ...]
    version_definitions: int
    source: str


def symbol_layout(image: ElfImage, entsize: int) -> str:
    """The ``struct`` layout of an Elf32_Sym / Elf64_Sym record padded to ``entsize`` bytes, keeping
    st_name and st_shndx (the only fields the metrics read)."""
    minimum = 24 if image.elfclass == 64 else 16
    if entsize < minimum:
        raise image.corrupt(f"dynamic symbol entry size is {entsize}, expected at least {minimum}")
    if image.elfclass == 64:  # name u4, info u1, other u1, shndx u2, value u8, size u8
        return f"I2xH{entsize - 8}x"
    return f"I10xH{entsize - 16}x"  # name u4, value u4, size u4, info u1, other u1, shndx u2


def locate_tables(image: ElfImage, dynamic: Mapping[int, int]) -> SymbolTables | None:
    """Find the dynamic symbol table: from section headers if present, else from the dynamic segment."""
    if image.sections:
        return _from_sections(image)
    if DT_SYMTAB not in dynamic:
        return None
    return _from_dynamic(image, dynamic)


def _from_sections(image: ElfImage) -> SymbolTables | None:
    dynsyms = image.sections_of_type("SHT_DYNSYM")
    if not dynsyms:
        return None
    dynsym = dynsyms[0]
    if dynsym.entsize == 0:
        raise image.corrupt(f"section [{dynsym.index}] {dynsym.name} has entry size 0")
    strsec = image.linked_section(dynsym, "its string table")
    strtab = image.read(strsec.offset, strsec.size, f"section [{strsec.index}] {strsec.name}")
    versym = next((s for s in image.sections_of_type("SHT_GNU_versym") if s.link == dynsym.index), None)
    count = dynsym.size // dynsym.entsize
    if versym is not None and versym.size < 2 * count:
        raise image.corrupt(f"section [{versym.index}] {versym.name} has {versym.size // 2} entries "
                            f"for {count} dynamic symbols")
    verdefs = image.sections_of_type("SHT_GNU_verdef")
    return SymbolTables(
        source="section " + (dynsym.name or f"[{dynsym.index}]"), symtab_offset=dynsym.offset,
        count=count, entsize=dynsym.entsize, strtab=strtab,
        versym_offset=versym.offset if versym is not None else None,
        verdef_offset=verdefs[0].offset if verdefs else None,
        verdef_count=verdefs[0].info if verdefs else 0)


def _from_dynamic(image: ElfImage, dynamic: Mapping[int, int]) -> SymbolTables:
    entsize = dynamic.get(DT_SYMENT, 24 if image.elfclass == 64 else 16)
    strsz = dynamic.get(DT_STRSZ)
    if DT_STRTAB not in dynamic or strsz is None:
        raise image.corrupt("the dynamic segment has DT_SYMTAB but no DT_STRTAB/DT_STRSZ")
    stroff = image.vaddr_to_offset(dynamic[DT_STRTAB], strsz, "DT_STRTAB")
    strtab = image.read(stroff, strsz, "dynamic string table (DT_STRTAB)")
    if DT_GNU_HASH in dynamic:
        source, count = "DT_GNU_HASH", _gnu_hash_count(image, dynamic[DT_GNU_HASH])
    elif DT_HASH in dynamic:
        source, count = "DT_HASH", _sysv_hash_count(image, dynamic[DT_HASH])
    else:
        raise image.corrupt("no section headers and no DT_GNU_HASH or DT_HASH: "
                            "the number of dynamic symbols cannot be determined")
    symoff = image.vaddr_to_offset(dynamic[DT_SYMTAB], count * entsize, "DT_SYMTAB")
    versym = None
    if DT_VERSYM in dynamic:
        versym = image.vaddr_to_offset(dynamic[DT_VERSYM], 2 * count, "DT_VERSYM")
    verdef = None
    if DT_VERDEF in dynamic:
        verdef = image.vaddr_to_offset(dynamic[DT_VERDEF], 1, "DT_VERDEF")
    return SymbolTables(source=source, symtab_offset=symoff, count=count, entsize=entsize,
                        strtab=strtab, versym_offset=versym, verdef_offset=verdef,
                        verdef_count=dynamic.get(DT_VERDEFNUM, 0))


def _sysv_hash_count(image: ElfImage, addr: int) -> int:
    """DT_HASH: the chain array has exactly one entry per symbol, so nchain is the symbol count."""
    offset = image.vaddr_to_offset(addr, 8, "DT_HASH")
    _nbucket, nchain = image.read_words(offset, 2, "I", "DT_HASH header")
    return nchain


def _gnu_hash_count(image: ElfImage, addr: int) -> int:
    """DT_GNU_HASH: the symbol count is pyelftools' (one past the highest symbol index reachable from a
    bucket through its chain). pyelftools parses the bloom filter and buckets as a whole, so their extent
    is checked against the file first; a chain that never ends runs into the end of the file."""
    offset = image.vaddr_to_offset(addr, 16, "DT_GNU_HASH")
    nbuckets, symoffset, bloom_size, _shift = image.read_words(offset, 4, "I", "DT_GNU_HASH header")
    image.check_extent(offset + 16, bloom_size * (image.elfclass // 8) + 4 * nbuckets,
                       "DT_GNU_HASH bloom filter and buckets")
    if nbuckets == 0:  # no bucket reaches a symbol (pyelftools would take the maximum of nothing)
        return symoffset
    from elftools.elf.hash import GNUHashTable  # only libraries without section headers need it (import time)

    try:
        # the image stands in for pyelftools' ELFFile: the table reads its structs, stream and byte order
        return GNUHashTable(image, offset, None).get_number_of_symbols()
    except struct.error:  # the chain reached the end of the file
        raise image.corrupt("a DT_GNU_HASH chain runs past the end of the file without terminating") from None


def _version_names(image: ElfImage, tables: SymbolTables) -> dict[int, str]:
    """Map version index -> name from the version definitions (Elf_Verdef chain)."""
    names: dict[int, str] = {}
    if tables.verdef_offset is None:
        return names
    verdef, verdaux = image.structs.Elf_Verdef, image.structs.Elf_Verdaux
    position = tables.verdef_offset
    for _ in range(min(tables.verdef_count, VERSYM_INDEX)):
        image.check_extent(position, verdef.sizeof(), "version definition")
        entry = struct_parse(verdef, image.stream, position)
        aux_at = position + entry["vd_aux"]
        image.check_extent(aux_at, verdaux.sizeof(), "version definition auxiliary entry")
        name = cstring(tables.strtab, struct_parse(verdaux, image.stream, aux_at)["vda_name"])
        if name is None:
            raise image.corrupt(f"version definition {entry['vd_ndx']} has a name outside the string table")
        names[entry["vd_ndx"] & VERSYM_INDEX] = name
        if entry["vd_next"] == 0:
            break
        position += entry["vd_next"]
    return names


def defined_symbols(image: ElfImage, tables: SymbolTables | None) -> DefinedSymbols:
    """The ``.dynsym`` entries whose section index is not SHN_UNDEF, the null entry excluded.

    A version-definition symbol (an SHN_ABS entry named after the version it
    defines, e.g. ``GLIBCXX_3.4``) is counted like any other defined symbol, as
    ``nm -D --defined-only`` lists it; it is keyed by its bare name and also
    tallied in ``version_definitions``.
    """
    if tables is None or tables.count == 0:
        return DefinedSymbols((), 0, tables.source if tables else "none")
    table = image.read_records(tables.symtab_offset, tables.count, symbol_layout(image, tables.entsize),
                               "dynamic symbol table")
    rows = [row for row in range(1, tables.count) if table[row][1] != SHN_UNDEF]
    if rows and max(table[row][0] for row in rows) >= len(tables.strtab):
        raise image.corrupt("a dynamic symbol's name lies outside its string table")
    if tables.versym_offset is not None:
        versym = image.read_words(tables.versym_offset, tables.count, "H", "symbol version table")
    else:
        versym = (0,) * tables.count
    versions = _version_names(image, tables)
    keys, vdefs = [], 0
    for row in rows:
        offset, shndx = table[row]
        ver, absolute = versym[row], shndx == SHN_ABS
        name = cstring(tables.strtab, offset)
        if name is None:
            raise image.corrupt(f"a dynamic symbol name at string offset {offset} is not NUL-terminated")
        version = versions.get(ver & VERSYM_INDEX) if (ver & VERSYM_INDEX) > 1 else None
        if version is None:
            keys.append(name)
        elif absolute and name == version:
            keys.append(name)
            vdefs += 1
        else:
            keys.append(f"{name}{'@' if ver & VERSYM_HIDDEN else '@@'}{version}")
    keys.sort()
    return DefinedSymbols(tuple(keys), vdefs, tables.source)
