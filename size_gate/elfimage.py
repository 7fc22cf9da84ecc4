"""Validated access to the headers and tables of one ELF file.

pyelftools' record layouts (``ELFStructs``) parse the ELF header, program headers and section
headers; its ``ELFFile`` is not used, as it imports DWARF and unwinding readers the size gate never
needs (import time counts for a command-line tool).
Before anything is read, every offset and length is checked against the file
size, so a truncated or corrupt file yields a :class:`SizeGateError` naming the
problem instead of a parser traceback, an unbounded read or a huge allocation.
"""

from __future__ import annotations

import io
import struct
from typing import BinaryIO, NamedTuple

from elftools.common.exceptions import ELFError
from elftools.common.utils import struct_parse
from elftools.construct.core import ConstructError
from elftools.elf.constants import SH_FLAGS, SHN_INDICES
from elftools.elf.enums import ENUM_D_TAG
from elftools.elf.structs import ELFStructs

from size_gate.errors import SizeGateError

# ELF constants come from pyelftools, which already defines them.
SHF_ALLOC = SH_FLAGS.SHF_ALLOC
SHN_UNDEF = SHN_INDICES.SHN_UNDEF
SHN_ABS = SHN_INDICES.SHN_ABS
SHN_XINDEX = SHN_INDICES.SHN_XINDEX
PN_XNUM = 0xFFFF  # pyelftools resolves it inside ELFFile but exports no name for it

DT_NULL = ENUM_D_TAG["DT_NULL"]
DT_NEEDED = ENUM_D_TAG["DT_NEEDED"]
DT_HASH = ENUM_D_TAG["DT_HASH"]
DT_STRTAB = ENUM_D_TAG["DT_STRTAB"]
DT_SYMTAB = ENUM_D_TAG["DT_SYMTAB"]
DT_STRSZ = ENUM_D_TAG["DT_STRSZ"]
DT_SYMENT = ENUM_D_TAG["DT_SYMENT"]
DT_SONAME = ENUM_D_TAG["DT_SONAME"]
DT_GNU_HASH = ENUM_D_TAG["DT_GNU_HASH"]
DT_VERSYM = ENUM_D_TAG["DT_VERSYM"]
DT_VERDEF = ENUM_D_TAG["DT_VERDEF"]
DT_VERDEFNUM = ENUM_D_TAG["DT_VERDEFNUM"]

#: More sections than this in a linked library is treated as corruption (bounds parse time).
MAX_SECTIONS = 1 << 17

#: Exceptions that pyelftools, construct and struct raise on malformed data.
PARSE_ERRORS = (ELFError, ConstructError, struct.error, ValueError, IndexError, KeyError,
                OverflowError, EOFError, UnicodeDecodeError, TypeError)

_EHDR_SIZE = {1: 52, 2: 64}
NT_GNU_BUILD_ID = 3
_NOTE_HEADER = 12  # n_namesz, n_descsz, n_type: three 4-byte words in both ELF classes


class Section(NamedTuple):
    """One section header, reduced to the fields the metrics need."""

    index: int
    name: str
    type: str
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int

    @property
    def occupies_file(self) -> bool:
        return self.type not in ("SHT_NOBITS", "SHT_NULL")


class Segment(NamedTuple):
    """One program header, reduced to the fields the metrics need."""

    type: str
    offset: int
    filesz: int
    vaddr: int


class ElfImage:
    """One ELF shared library whose header tables have been read and bounds-checked."""

    def __init__(self, stream: BinaryIO, path: str) -> None:
        self.path = path
        self.stream = stream
        stream.seek(0, io.SEEK_END)
        self.size = stream.tell()
        ident = self._check_ident()
        self.elfclass = 32 if ident[4] == 1 else 64
        self.little_endian = ident[5] == 1
        try:  # as pyelftools' ELFFile sets itself up
            self.structs = ELFStructs(little_endian=self.little_endian, elfclass=self.elfclass)
            self.structs.create_basic_structs()
            self.header = struct_parse(self.structs.Elf_Ehdr, stream, 0)
            self.structs.create_advanced_structs(self.header["e_type"], self.header["e_machine"],
                                                 self.header["e_ident"]["EI_OSABI"])
        except PARSE_ERRORS as exc:
            raise self.corrupt(f"the ELF header cannot be parsed ({exc})") from None
        if self.header["e_type"] != "ET_DYN":
            raise SizeGateError("not-shared-library", path,
                                f"ELF type is {self.header['e_type']}, a shared library has ET_DYN")
        self.sections = self._read_sections()
        self.segments = self._read_segments()

    # -- errors --------------------------------------------------------------------------------
    def corrupt(self, message: str) -> SizeGateError:
        return SizeGateError("corrupt", self.path, message)

    def check_extent(self, offset: int, length: int, what: str) -> None:
        """Raise ``truncated`` unless ``[offset, offset + length)`` lies inside the file."""
        if offset < 0 or length < 0:
            raise self.corrupt(f"{what} has a negative offset or length")
        if offset + length > self.size:
            raise SizeGateError(
                "truncated", self.path,
                f"{what} (offset {offset:#x}, {length:,} bytes) extends past the end of the file "
                f"({self.size:,} bytes): the file is truncated or its headers are corrupt")

    # -- raw reads -----------------------------------------------------------------------------
    def read(self, offset: int, length: int, what: str) -> bytes:
        self.check_extent(offset, length, what)
        self.stream.seek(offset)
        data = self.stream.read(length)
        if len(data) != length:
            raise SizeGateError("truncated", self.path, f"{what}: short read at offset {offset:#x}")
        return data

    def read_records(self, offset: int, count: int, layout: str, what: str) -> list[tuple]:
        """``count`` records of the ``struct`` layout (in the file's byte order) at ``offset``,
        bounds-checked; unpacked in C, without NumPy (which the size gate does not need to import)."""
        record = struct.Struct(self.byte_order + layout)
        return list(record.iter_unpack(self.read(offset, count * record.size, what)))

    def read_words(self, offset: int, count: int, code: str, what: str) -> tuple[int, ...]:
        """``count`` integers of the ``struct`` format ``code`` (e.g. ``H``, ``I``) at ``offset``."""
        word = struct.Struct(f"{self.byte_order}{count}{code}")
        return word.unpack(self.read(offset, word.size, what))

    @property
    def byte_order(self) -> str:
        return "<" if self.little_endian else ">"

    # -- header tables -------------------------------------------------------------------------
    def _check_ident(self) -> bytes:
        self.stream.seek(0)
        ident = self.stream.read(16)
        if not ident:
            raise SizeGateError("not-elf", self.path, "the file is empty")
        if len(ident) < 4 and b"\x7fELF".startswith(ident):
            raise SizeGateError("truncated", self.path,
                                f"the file ends after {len(ident)} bytes, inside the ELF magic")
        if ident[:4] != b"\x7fELF":
            raise SizeGateError("not-elf", self.path,
                                f"the file does not start with the ELF magic 7f 45 4c 46 "
                                f"(found {ident[:4].hex(' ')})")
        if len(ident) < 6:
            raise SizeGateError("truncated", self.path,
                                f"the file ends after {len(ident)} bytes, inside the ELF identification")
        if ident[4] not in _EHDR_SIZE:
            raise self.corrupt(f"EI_CLASS is {ident[4]}, expected 1 (32-bit) or 2 (64-bit)")
        if ident[5] not in (1, 2):
            raise self.corrupt(f"EI_DATA is {ident[5]}, expected 1 (little-endian) or 2 (big-endian)")
        need = _EHDR_SIZE[ident[4]]
        if self.size < need:
            raise SizeGateError("truncated", self.path,
                                f"the file ends after {self.size:,} bytes, but its ELF header needs {need}")
        return ident

    def _table(self, offset: int, count: int, entsize: int, struct_def, what: str) -> list:
        if count == 0:
            return []
        if entsize < struct_def.sizeof():
            raise self.corrupt(f"{what} entry size is {entsize}, expected at least {struct_def.sizeof()}")
        self.check_extent(offset, count * entsize, f"{what} ({count:,} entries of {entsize} bytes)")
        return [struct_parse(struct_def, self.stream, offset + i * entsize) for i in range(count)]

    def _read_sections(self) -> tuple[Section, ...]:
        hdr = self.header
        shoff, count, entsize = hdr["e_shoff"], hdr["e_shnum"], hdr["e_shentsize"]
        if shoff == 0:
            return ()
        shdr = self.structs.Elf_Shdr
        first = self._table(shoff, 1, entsize, shdr, "section header table")[0]
        if count == 0:  # extended numbering: the real count is in section 0
            count = first["sh_size"]
        if count > MAX_SECTIONS:
            raise self.corrupt(f"the section header table claims {count:,} sections")
        headers = self._table(shoff, count, entsize, shdr, "section header table")
        strndx = hdr["e_shstrndx"]
        if strndx == SHN_XINDEX:
            strndx = first["sh_link"]
        names = b""
        if strndx != SHN_UNDEF:
            if strndx >= count:
                raise self.corrupt(f"e_shstrndx {strndx} is not a section index (there are {count})")
            sh = headers[strndx]
            names = self.read(sh["sh_offset"], sh["sh_size"], "section name string table")
        sections = []
        for index, sh in enumerate(headers):
            name = cstring(names, sh["sh_name"]) if names else ""
            if name is None:
                raise self.corrupt(f"section [{index}] has a name offset {sh['sh_name']} outside "
                                   f"the section name string table")
            sec = Section(index, name, str(sh["sh_type"]), sh["sh_flags"], sh["sh_offset"],
                          sh["sh_size"], sh["sh_link"], sh["sh_info"], sh["sh_entsize"])
            if sec.occupies_file and index:
                self.check_extent(sec.offset, sec.size, f"section [{index}] {name}")
            sections.append(sec)
        return tuple(sections)

    def _read_segments(self) -> tuple[Segment, ...]:
        hdr = self.header
        count = hdr["e_phnum"]
        if count == PN_XNUM and self.sections:
            count = self.sections[0].info
        if hdr["e_phoff"] == 0:
            count = 0
        phdrs = self._table(hdr["e_phoff"], count, hdr["e_phentsize"], self.structs.Elf_Phdr,
                            "program header table")
        segments = []
        for index, ph in enumerate(phdrs):
            seg = Segment(str(ph["p_type"]), ph["p_offset"], ph["p_filesz"], ph["p_vaddr"])
            if seg.type in ("PT_LOAD", "PT_DYNAMIC", "PT_NOTE"):
                self.check_extent(seg.offset, seg.filesz, f"program header [{index}] {seg.type}")
            segments.append(seg)
        return tuple(segments)

    # -- lookups -------------------------------------------------------------------------------
    def sections_of_type(self, sh_type: str) -> list[Section]:
        return [s for s in self.sections if s.type == sh_type]

    def linked_section(self, section: Section, what: str) -> Section:
        if not 0 < section.link < len(self.sections):
            raise self.corrupt(f"section [{section.index}] {section.name} links to section "
                               f"{section.link}, which does not exist ({what})")
        return self.sections[section.link]

    def vaddr_to_offset(self, addr: int, length: int, what: str) -> int:
        """The file offset of ``length`` bytes at virtual address ``addr`` inside one PT_LOAD."""
        for seg in self.segments:
            if seg.type == "PT_LOAD" and seg.vaddr <= addr and addr + length <= seg.vaddr + seg.filesz:
                return seg.offset + (addr - seg.vaddr)
        raise self.corrupt(f"{what} at address {addr:#x} ({length:,} bytes) is not inside the file "
                           f"data of any loadable segment")

    def dynamic_entries(self) -> tuple[list[int], list[int]]:
        """The dynamic array as (tags, values), up to but excluding the first DT_NULL."""
        dyn = [s for s in self.segments if s.type == "PT_DYNAMIC"]
        if dyn:
            offset, size = dyn[0].offset, dyn[0].filesz
        else:
            secs = self.sections_of_type("SHT_DYNAMIC")
            if not secs:
                return [], []
            offset, size = secs[0].offset, secs[0].size
        layout = "qQ" if self.elfclass == 64 else "iI"  # d_tag is signed, d_val/d_ptr unsigned
        table = self.read_records(offset, size // struct.calcsize(layout), layout, "dynamic array")
        tags = [tag for tag, _ in table]
        stop = tags.index(DT_NULL) if DT_NULL in tags else len(tags)
        return tags[:stop], [val for _, val in table[:stop]]

    def build_id(self) -> str | None:
        """The GNU build ID from the PT_NOTE segments, else from SHT_NOTE sections.

        Notes are parsed here rather than by pyelftools, whose reader trusts each note's name and
        descriptor sizes: every note must lie inside its region, which lies inside the file."""
        regions = [(s.offset, s.filesz, "PT_NOTE segment") for s in self.segments if s.type == "PT_NOTE"]
        if not regions:
            regions = [(s.offset, s.size, f"note section [{s.index}] {s.name}")
                       for s in self.sections_of_type("SHT_NOTE")]
        for offset, size, what in regions:
            found = self._build_id_in(self.read(offset, size, what), offset, what)
            if found is not None:
                return found
        return None

    def _build_id_in(self, notes: bytes, base: int, what: str) -> str | None:
        """The NT_GNU_BUILD_ID descriptor among the notes of one region (4-byte aligned, as pyelftools)."""
        word = "<I" if self.little_endian else ">I"
        position = 0
        while position + _NOTE_HEADER <= len(notes):
            namesz, descsz, kind = (struct.unpack_from(word, notes, position + 4 * i)[0] for i in range(3))
            name_at = position + _NOTE_HEADER
            desc_at = name_at + _align4(namesz)
            end = desc_at + descsz
            if desc_at > len(notes) or end > len(notes):
                raise self.corrupt(f"the note at offset {base + position:#x} in the {what} claims a "
                                   f"{namesz:,}-byte name and a {descsz:,}-byte descriptor, past the end of "
                                   f"its {len(notes):,}-byte region")
            name = notes[name_at:name_at + namesz].split(b"\0", 1)[0]
            if kind == NT_GNU_BUILD_ID and name == b"GNU":
                return notes[desc_at:end].hex()
            position = desc_at + _align4(descsz)
        return None


def _align4(size: int) -> int:
    return (size + 3) & ~3


def cstring(table: bytes, offset: int) -> str | None:
    """The NUL-terminated string at ``offset`` in ``table``, or None if it is out of range or unterminated."""
    if offset >= len(table):
        return None
    end = table.find(b"\0", offset)
    if end < 0:
        return None
    return table[offset:end].decode("utf-8", "backslashreplace")
