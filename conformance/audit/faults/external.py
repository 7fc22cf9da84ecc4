"""Faults in external payloads: keys, extents, containment and the owner of a mapped file."""

from __future__ import annotations

import contextlib
import mmap
import os
import pathlib
import stat
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from conformance.audit.fault import INSTALLER, Fault, Patch, encoded_values, fault, name_faults, returning, skip, wrap
from conformance.audit.faults.shared import _EXTERNAL
from reference_impl import payload
from reference_impl.dtypes import INT64_MAX, UINT64_MAX
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.values import EncodedValue


# ------------------------------------------------------ mechanisms (the payload ownership faults use them too)
def on_extent(name: str, edit: Callable, aliases: bool = True) -> Patch:
    """A patch replacing ``payload.name`` (open_payload or open_external, whose last three arguments are the extent,
    the base directory and the path) by the function handing the original ``edit(extent, path)`` as the extent."""
    def make(original):
        def replaced(*args):
            *head, extent, base_dir, path = args
            return original(*head, edit(extent, path), base_dir, path)
        return replaced
    return wrap(payload, name, make, aliases)


def refusing(name: str, refused: Callable, why: str, aliases: bool = True) -> Patch:
    """A patch making ``payload.name`` refuse the extents ``refused(extent)`` holds for (``why`` may name the
    ``{offset}``)."""
    def edit(extent, path):
        if refused(extent):
            raise violation(E.EXTERNAL_FILE_INVALID, path, why.format(offset=extent.offset))
        return extent
    return on_extent(name, edit, aliases)


def _file_refusing(refused: Callable, why: str) -> Patch:
    """A patch making ``payload.open_external`` also refuse a backing file ``refused(extent, file_size)`` holds for."""
    def make(original):
        def open_external(extent, base_dir, path):
            fd = original(extent, base_dir, path)
            if refused(extent, os.fstat(fd).st_size):
                os.close(fd)
                raise violation(E.EXTERNAL_FILE_INVALID, path, why.format(offset=extent.offset))
            return fd
        return open_external
    return wrap(payload, "open_external", make)


# ------------------------------------------------------------------------------------------------- the faults
def _mapping_indexed_with_offset(original):
    def open_payload(value, extent, base_dir, path):
        granularity = mmap.ALLOCATIONGRANULARITY
        if not extent.external or not extent.length or extent.offset < granularity:
            return original(value, extent, base_dir, path)
        start = extent.offset - extent.offset % granularity  # the mapping starts at the page below ...
        fd = payload.open_external(extent, base_dir, path)
        try:
            if start + extent.offset + extent.length > os.fstat(fd).st_size:  # ... and is indexed at the whole offset
                raise violation(E.EXTERNAL_FILE_INVALID, path, "read past the end of the mapping")
            return np.frombuffer(os.pread(fd, extent.length, start + extent.offset), np.uint8)
        finally:
            os.close(fd)
    return open_payload


MappingIndexedWithWholeOffset = fault("PAY-EXTERNAL-EXTENT.mapping-offset-twice", ("PAY-EXTERNAL-EXTENT",),
    """Maps an external extent from the allocation-granularity boundary below its offset, as mmap requires, then indexes
    the mapping with the whole offset instead of ``offset - start``: right for offsets below one page (4096 bytes),
    wrong beyond.""", boundary=True, patches=lambda: [wrap(payload, "open_payload", _mapping_indexed_with_offset)])
ExtentAtEndOfFileRefused = fault("PAY-EXTERNAL-EXTENT.end-of-file-exclusive", ("PAY-EXTERNAL-EXTENT",), """Checks
    the backing file's size with ``size <= offset + length`` (off by one): an extent ending exactly at the end of its
    file is refused.""", boundary=True, patches=lambda: [_file_refusing(
        lambda extent, size: size <= extent.offset + extent.length, "backing file does not cover offset + length")])
OffsetAtEndOfFileRefused = fault("PAY-EXTERNAL-EXTENT.offset-at-end-refused", ("PAY-EXTERNAL-EXTENT", "PAY-EMPTY"),
    """Checks ``offset < file_size`` as well as ``offset + length <= file_size``: an empty extent at the very end of its
    backing file is refused.""", boundary=True, patches=lambda: [_file_refusing(
        lambda extent, size: extent.offset >= size, "offset {offset} is not inside the backing file")])
UnalignedOffsetRefused = fault("PAY-EXTERNAL-EXTENT.unaligned-offset-refused", ("PAY-EXTERNAL-EXTENT",), """Refuses
    external offsets that are not a multiple of 4 (it maps payloads as typed views and will not read a FLOAT or INT32
    from an unaligned address) instead of reading the bytes at any offset.""", boundary=True,
    patches=lambda: [refusing("open_external", lambda extent: extent.offset % 4,
                              "offset {offset} is not 4-byte aligned: no typed view of the extent", aliases=False)])
EmptyExtentOffsetUnchecked = fault("PAY-EXTERNAL-EXTENT.empty-extent-offset-unchecked", ("PAY-EXTERNAL-EXTENT",),
    """Skips the extent check for a zero-length external payload (there is nothing to read): an offset beyond the end of
    the backing file passes.""", boundary=True,  # only the file itself is checked
    patches=lambda: [on_extent("open_external", lambda e, path: replace(e, offset=0) if e.length == 0 else e)])
EmptyExtentFileNotOpened = fault("PAY-EXTERNAL-EXTENT.empty-extent-file-not-opened",
    ("PAY-EXTERNAL-EXTENT", "PAY-EMPTY"), """Skips the backing file entirely for a zero-length extent (nothing to read,
    so nothing is opened): an empty external payload whose location names no file is accepted.""", boundary=True,
    patches=lambda: [wrap(payload, "open_external", lambda original: lambda extent, base_dir, path: original(
        extent, base_dir, path) if extent.length else os.open(os.devnull, os.O_RDONLY), aliases=False)])
ExternalOffsetIgnored = fault("PAY-EXTERNAL-EXTENT.offset-ignored", ("PAY-EXTERNAL-EXTENT",), """Maps an external
    payload from the start of its file, ignoring the offset.""", boundary=True,
    patches=lambda: [on_extent("open_payload", lambda e, path: replace(e, offset=0) if e.external else e)])
ExtentCheckedPartByPart = fault("PAY-EXTERNAL-EXTENT.offset-length-checked-apart", ("PAY-EXTERNAL-EXTENT",),
    """Checks an external extent against its backing file part by part (``offset <= size`` and ``length <= size``)
    instead of ``offset + length <= size``: an extent that starts inside the file and runs past its end is accepted (its
    bytes then read short).""", boundary=True, patches=lambda: [on_extent(
        "open_external", lambda e, path: replace(e, offset=0, length=max(e.offset, e.length)), aliases=False)])
LocationBasenameOnly = fault("PAY-EXTERNAL-EXTENT.location-basename-only", ("PAY-EXTERNAL-EXTENT",), """Opens an
    external payload by the last component of its location, in the model directory itself (``os.path.basename``): a
    backing file in a subdirectory is not found, or a same-named file beside the model is read instead.""",
    patches=lambda: [on_extent("open_external", lambda e, path: replace(
        e, location=e.location.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or e.location), aliases=False)])
ExternalNumbersThirtyTwoBit = fault("PAY-EXTERNAL-EXTENT.numbers-thirty-two-bit",
    ("PAY-EXTERNAL-EXTENT", "PAY-EXTERNAL-KEYS"), """Parses external offset and length into 32-bit integers
    (``(uint32_t)strtoull(...)``): numbers of 2**32 and beyond wrap, so an extent far beyond a small file is read from
    its start.""", boundary=True,
    patches=lambda: [returning(payload, "_decimal", lambda number, *_: number % (1 << 32))])
ExternalOffsetTruncatedTo32Bits = fault("PAY-EXTERNAL-EXTENT.offset-truncated-32-bits", ("PAY-EXTERNAL-EXTENT",),
    """Keeps the external offset in a 32-bit field: an offset of 2**32 or more is read modulo 2**32, so an extent beyond
    the end of a small file reads bytes near its start instead of being refused.""", boundary=True,
    patches=lambda: [returning(payload, "payload_extent", lambda e, *_: replace(e, offset=e.offset & 0xFFFFFFFF)
                               if e.external and e.offset >= 1 << 32 else e)])
BackingFileNotChecked = fault("PAY-EXTERNAL-EXTENT.file-unchecked", ("PAY-EXTERNAL-EXTENT",), """Never checks at load
    that the backing file exists and covers offset + length (reads fail later, or read short).""",
    patches=lambda: [skip(payload, "check_file", "EXTERNAL_FILE_INVALID")])


def _wrapped(extent) -> int | None:
    """offset + length modulo 2**64 when the sum overflows uint64, else None."""
    total = extent.offset + extent.length
    return total % (UINT64_MAX + 1) if extent.external and total > UINT64_MAX else None


def _extent_wrapping(original):
    def payload_extent(value, path):
        try:
            return original(value, path)
        except ContractError as error:
            if error.code != E.EXTERNAL_EXTENT_OVERFLOW:
                raise
            entries = _entries(value)
            offset, length = int(entries.get("offset", "0")), int(entries["length"])
            if (offset + length) % (UINT64_MAX + 1) > INT64_MAX:
                raise
            return payload.Extent(length=length, location=entries["location"], offset=offset)
    return payload_extent


def _read_wrapping(original):
    def open_payload(value, extent, base_dir, path):
        if _wrapped(extent) is not None:
            os.close(payload.open_external(extent, base_dir, path))
            raise violation(E.EXTERNAL_FILE_INVALID, path, "reading at the extent's offset found no bytes")
        return original(value, extent, base_dir, path)
    return open_payload


ExtentSumWraps = fault("PAY-EXTERNAL-EXTENT.extent-sum-wraps", ("PAY-EXTERNAL-EXTENT",), """Computes an external
    extent's end as ``offset + length`` in wrapping uint64 arithmetic: an extent whose end overflows wraps to a small
    number, passes the file-size check, and is accepted (reading it then fails).""", boundary=True,
    patches=lambda: [wrap(payload, "payload_extent", _extent_wrapping),
                     on_extent("open_external", lambda e, path: e if _wrapped(e) is None else replace(
                         e, offset=0, length=_wrapped(e)), aliases=False),  # the size check: the wrapped end
                     wrap(payload, "open_payload", _read_wrapping)])


def _entries(value) -> dict[str, str]:
    return {entry.key: entry.value for entry in value.external_data}


def _external_entries(model) -> list:
    """Every external encoded value of the model, with its external_data entries."""
    return [(value, _entries(value)) for value in encoded_values(model) if value.data_location == _EXTERNAL]


def _first_extent_per_location(model, base_dir):
    first: dict[str, dict[str, str]] = {}
    for value, entries in _external_entries(model):
        location = entries.get("location")
        if location is None or first.setdefault(location, entries) is entries:
            continue
        value.ClearField("external_data")
        for key, text in first[location].items():
            value.external_data.add(key=key, value=text)


def _overlaps_refused(model, base_dir):
    seen: dict[str, list[tuple[int, int]]] = {}
    for value, entries in _external_entries(model):
        try:
            start = int(entries.get("offset", "0"))
            stop, location = start + int(entries["length"]), entries["location"]
        except (KeyError, ValueError):
            continue
        if any(start < other_stop and other_start < stop for other_start, other_stop in seen.get(location, [])):
            raise violation(E.EXTERNAL_FILE_INVALID, value.name, "extent overlaps another value's")
        seen.setdefault(location, []).append((start, stop))


def _length_to_end_of_file(model, base_dir):
    for value, entries in _external_entries(model):
        if "length" in entries or "location" not in entries or base_dir is None:
            continue
        target = pathlib.Path(base_dir) / entries["location"]
        if target.is_file():
            offset = int(entries["offset"]) if entries.get("offset", "").isdigit() else 0
            value.external_data.add(key="length", value=str(max(target.stat().st_size - offset, 0)))


def _lenient_number(text, path):
    try:
        return int(text, 0)
    except (TypeError, ValueError):
        raise violation(E.EXTERNAL_NUMBER_INVALID, path, f"{text!r} is not a number") from None


ExtentKeyedByLocation = fault("PAY-EXTERNAL-EXTENT.extent-keyed-by-location", ("PAY-EXTERNAL-EXTENT",), """Maps each
    backing file once, keyed by its location, and hands every value in that file the extent of the first one that named
    it: a second value at another offset of the same file reads the first value's bytes.""",
    transform=_first_extent_per_location)
OverlappingExtentsRejected = fault("PAY-EXTERNAL-EXTENT.overlap-rejected", ("PAY-EXTERNAL-EXTENT",), """Refuses two
    external values whose extents in one file overlap (as if each byte range had one owner), although values may share
    payload bytes.""", precheck=_overlaps_refused)
LengthDefaultsToRestOfFile = fault("PAY-EXTERNAL-KEYS.length-optional", ("PAY-EXTERNAL-KEYS",), """Follows the ONNX
    TensorProto convention where ``length`` is optional: a missing length means the rest of the backing file, instead of
    requiring an explicit length.""", transform=_length_to_end_of_file)
LenientExternalNumbers = fault("PAY-EXTERNAL-KEYS.lenient-numbers", ("PAY-EXTERNAL-KEYS",), """Parses offset and
    length with a general integer parser (``strtoll``-like: spaces, signs and ``0x`` prefixes accepted) instead of as
    decimal uint64 strings.""", boundary=True, patches=lambda: [Patch(payload, "_decimal", _lenient_number)])


def _leading_parent_only(location, path):
    if not isinstance(location, str):
        raise violation(E.EXTERNAL_PATH_INVALID, path, "location is not valid UTF-8 text")
    normalized = location.replace("\\", "/")
    if normalized.startswith("/") or normalized.startswith("../") or normalized == "..":
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} escapes the model directory")
    if "\x00" in location or normalized[1:2] == ":":
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} is not a relative path")
    if normalized.rstrip("/") in ("", "."):
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} names no file")


def _joined_open(extent, base_dir, path):
    """The backing file opened at base_dir joined with the location, as written (the OS resolves absolute locations,
    '..' components and links wherever they point)."""
    if base_dir is None:
        raise violation(E.EXTERNAL_FILE_INVALID, path, "external payload needs a base directory to resolve")
    target = os.path.join(os.fspath(base_dir), extent.location.replace("\\", "/"))
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as err:
        raise violation(E.EXTERNAL_FILE_INVALID, path, f"backing file {extent.location!r} cannot be opened: {err}") \
            from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size < extent.offset + extent.length:
        os.close(fd)
        raise violation(E.EXTERNAL_FILE_INVALID, path, "backing file is not a regular file covering offset + length")
    return fd


def _decoded_from_file(original):
    def to_proto(self):
        if self.source is not None and len(self.source.external_data):
            return self.source  # the message as loaded: decoding opens the backing file by name again
        return original(self)
    return to_proto


LocationNotContained = fault("PAY-EXTERNAL-CONTAINED.no-containment", ("PAY-EXTERNAL-CONTAINED",), """Joins the
    location to the model directory without checking that the result stays inside it (absolute paths, '..', drive
    letters and NUL characters pass).""", patches=lambda: [Patch(payload, "check_location", lambda *args: None),
                                                          Patch(payload, "open_external", _joined_open)])
OnlyLeadingParentRefused = fault("PAY-EXTERNAL-CONTAINED.only-leading-parent-refused", ("PAY-EXTERNAL-CONTAINED",),
    """Refuses a location that starts with '..' or '/', but lets the operating system resolve a '..' further in
    ('weights/../../secret.bin' escapes).""", patches=lambda: [Patch(payload, "check_location", _leading_parent_only),
                                                               Patch(payload, "open_external", _joined_open)])
SymlinksFollowed = fault("PAY-EXTERNAL-CONTAINED.symlinks-followed", ("PAY-EXTERNAL-CONTAINED",), """Checks the
    location's spelling (relative, no '..') but opens it by joining it to the model directory, so a symbolic link inside
    the directory leads wherever it points.""", patches=lambda: [Patch(payload, "open_external", _joined_open)])
ExternalValuesReopenedByName = fault("PAY-EXTERNAL-OWNER.reopened-by-name", ("PAY-EXTERNAL-OWNER",), """Keeps an
    external encoded value as its message and opens the backing file by name whenever the value is decoded, instead of
    retaining the mapping it validated at load: a file removed or replaced after loading breaks (or changes) values the
    runtime still holds.""", patches=lambda: [wrap(EncodedValue, "to_proto", _decoded_from_file)])


class ReusedAfterCall(Fault):
    """A fault whose memory handed out during a call (``scratch``) is reused, and reads zeros, once none of the
    fault's calls is active any more."""

    @property
    def scratch(self) -> list[bytearray]:
        return vars(self).setdefault("_scratch", [])

    @contextlib.contextmanager
    def injected(self):
        with super().injected():
            yield
        if INSTALLER.idle:  # the call that took the memory returned: it is reused
            for pages in self.scratch:
                pages[:] = bytes(len(pages))
            self.scratch.clear()


class MappingReleasedEarly(ReusedAfterCall):
    """Maps the backing file in a scoped block and unmaps it when the load returns, although the
    payload views still point into the mapping (the mapping's owner is not retained).

    Touching unmapped pages would crash the process; the fault shows what a runtime whose pages were
    reused reads instead: the views it handed out (decoded values, a state's initial values) read zeros
    once the call that loaded them has returned."""

    fault_id = "PAY-EXTERNAL-OWNER.mapping-released"
    clauses = ("PAY-EXTERNAL-OWNER",)

    def patches(self):
        def make(original):
            def open_payload(value, extent, base_dir, path):
                if not extent.external or extent.length == 0:
                    return original(value, extent, base_dir, path)
                fd = payload.open_external(extent, base_dir, path)
                try:
                    pages = bytearray(os.pread(fd, extent.length, extent.offset))
                finally:
                    os.close(fd)
                self.scratch.append(pages)
                view = np.frombuffer(pages, dtype=np.uint8)
                view.flags.writeable = False
                return view
            return open_payload
        return [wrap(payload, "open_payload", make)]


name_faults(globals())
