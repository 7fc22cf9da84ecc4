"""Size metrics of one ELF shared library, each with a written definition.

The definitions in :data:`METRICS` are the contract: docs/size_gate.md repeats
them and the tests check every one against binutils on real libraries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from size_gate.dynsyms import defined_symbols, locate_tables
from size_gate.elfimage import DT_NEEDED, DT_SONAME, DT_STRSZ, DT_STRTAB, PARSE_ERRORS, SHF_ALLOC, ElfImage, cstring
from size_gate.errors import SizeGateError

JSON_SCHEMA = "size_gate.metrics/1"

#: key -> (label, definition). Numeric metrics first, in display order.
METRICS: dict[str, tuple[str, str]] = {
    "installed_bytes": ("Installed bytes",
                        "size of the installed (already stripped) library file in bytes"),
    "alloc_bytes": ("Allocated section bytes",
                    "sum of sh_size over sections with SHF_ALLOC, SHT_NOBITS (.bss, .tbss) included"),
    "text_bytes": (".text bytes", "sh_size of the section named exactly .text"),
    "defined_symbols": ("Defined dynamic symbols",
                        (".dynsym entries whose st_shndx is not SHN_UNDEF, the null entry excluded; "
                         "version-definition symbols count")),
    "version_definition_symbols": ("Version-definition symbols",
                                   "defined symbols that name a version they define (included above)"),
    "section_bytes_total": ("All section bytes", "sum of sh_size over every section header except index 0"),
    "wheel_bytes": ("Wheel bytes", "size of the wheel file (wheel input only)"),
    "compressed_bytes": ("Compressed bytes in wheel", "compressed size of the library's wheel member"),
}

NUMERIC_METRICS = tuple(METRICS)


@dataclass(frozen=True)
class LibraryMetrics:
    """Everything the gate measures about one library; None means not measurable on this file."""

    path: str
    installed_bytes: int
    alloc_bytes: int | None
    text_bytes: int | None
    section_bytes_total: int | None
    defined_symbols: int
    version_definition_symbols: int
    needed: tuple[str, ...]
    soname: str | None
    build_id: str | None
    symbol_source: str
    section_headers: bool
    symbols: tuple[str, ...] = field(repr=False)
    wheel_bytes: int | None = None
    compressed_bytes: int | None = None
    wheel_member: str | None = None

    def value(self, key: str) -> int | None:
        return getattr(self, key)

    def to_json(self, with_symbols: bool = True) -> dict[str, Any]:
        data = asdict(self)
        data["needed"] = list(self.needed)
        data["symbols"] = list(self.symbols) if with_symbols else None
        return {"schema": JSON_SCHEMA, **data}


def measure_elf(stream: BinaryIO, path: str) -> LibraryMetrics:
    """Measure the shared library in ``stream``; any malformation becomes a :class:`SizeGateError`."""
    try:
        return _measure(ElfImage(stream, path))
    except SizeGateError:
        raise
    except PARSE_ERRORS as exc:
        raise SizeGateError("corrupt", path, f"malformed ELF data ({type(exc).__name__}: {exc})") from None


def _measure(image: ElfImage) -> LibraryMetrics:
    sections = image.sections[1:]
    has_sections = bool(image.sections)
    tags, vals = image.dynamic_entries()
    dynamic: dict[int, int] = {}
    for tag, val in zip(tags, vals):
        dynamic.setdefault(tag, val)
    needed, soname = _dynamic_strings(image, tags, vals, dynamic)
    symbols = defined_symbols(image, locate_tables(image, dynamic))
    return LibraryMetrics(
        path=image.path,
        installed_bytes=image.size,
        alloc_bytes=sum(s.size for s in sections if s.flags & SHF_ALLOC) if has_sections else None,
        text_bytes=sum(s.size for s in sections if s.name == ".text") if has_sections else None,
        section_bytes_total=sum(s.size for s in sections) if has_sections else None,
        defined_symbols=len(symbols.keys),
        version_definition_symbols=symbols.version_definitions,
        needed=tuple(needed),
        soname=soname,
        build_id=image.build_id(),
        symbol_source=symbols.source,
        section_headers=has_sections,
        symbols=symbols.keys,
    )


def _dynamic_strings(image: ElfImage, tags: list[int], vals: list[int],
                     dynamic: dict[int, int]) -> tuple[list[str], str | None]:
    """DT_NEEDED sonames in dynamic-array order, and DT_SONAME, read from DT_STRTAB."""
    if DT_NEEDED not in dynamic and DT_SONAME not in dynamic:
        return [], None
    if DT_STRTAB not in dynamic or DT_STRSZ not in dynamic:
        raise image.corrupt("the dynamic array names libraries but has no DT_STRTAB/DT_STRSZ")
    size = dynamic[DT_STRSZ]
    strtab = image.read(image.vaddr_to_offset(dynamic[DT_STRTAB], size, "DT_STRTAB"), size,
                        "dynamic string table (DT_STRTAB)")

    def string(tag_name: str, offset: int) -> str:
        value = cstring(strtab, offset)
        if value is None:
            raise image.corrupt(f"{tag_name} string offset {offset} lies outside the dynamic string table")
        return value

    needed = [string("DT_NEEDED", v) for t, v in zip(tags, vals) if t == DT_NEEDED]
    soname = string("DT_SONAME", dynamic[DT_SONAME]) if DT_SONAME in dynamic else None
    return needed, soname
