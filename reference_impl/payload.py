"""Payload extents of encoded values: inline bytes or validated external files.

The extent (byte length) is known from the message alone, so layouts are validated before any file is
opened; the bytes themselves are reached only through ``open_payload``.

External files are opened race-free (``open_external``): each component of the location is opened
relative to the directory opened before it, never following a symbolic link, and the checks (regular
file, size covers the extent) apply to the opened descriptor, which is then the only way the bytes
are reached; nothing is reopened by name. Two ways to reach them (``set_external_access``):

* ``"map"`` (default, the zero-copy runtime): the extent is memory-mapped read-only and the array keeps
  the mapping alive. If the file shrinks later, touching the lost pages raises SIGBUS; that is the
  price of zero-copy mapping, documented in docs/security.md.
* ``"read"`` (the conformance runner, the fuzz harness, the reference CLI): the extent is read once
  into memory the process owns, so a file changed later cannot kill the process; a file that shrank
  before the read is EXTERNAL_FILE_INVALID.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import stat
from dataclasses import dataclass, field, replace

import numpy as np

from reference_impl.dtypes import INT64_MAX, UINT64_MAX
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

EXTERNAL = 1
_KEYS = {"location", "offset", "length", "checksum"}
_DECIMAL = re.compile(r"[0-9]+")
_UINT64_DIGITS = len(str(UINT64_MAX))
#: In "read" mode, extents longer than this are refused (RESOURCE_LIMIT) rather than read into memory.
MAX_READ_EXTENT = 1 << 31
ACCESS_MODES = ("map", "read")
_access = "map"


def set_external_access(mode: str) -> str:
    """Choose how external payload bytes are reached process-wide ("map" or "read"); returns the
    previous mode. Tools that must survive files changing under them select "read" at startup."""
    global _access
    if mode not in ACCESS_MODES:
        raise ValueError(f"external access is one of {ACCESS_MODES}, not {mode!r}")
    previous, _access = _access, mode
    return previous


def external_access() -> str:
    return _access


@dataclass(frozen=True)
class Extent:
    """Where a payload's bytes are: inline, or ``length`` bytes at ``offset`` of ``location``.

    An inline extent carries the bytes it was measured on (``inline``): reading ``raw_data`` copies the
    whole payload out of the message, so the bytes whose length was validated are the ones decoded,
    copied once. Extents kept beyond one value's decoding drop them (``detached``)."""

    length: int
    location: str | None = None
    offset: int = 0
    inline: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def external(self) -> bool:
        return self.location is not None

    def detached(self) -> Extent:
        return replace(self, inline=None) if self.inline is not None else self


def _decimal(text: str, path: str) -> int:
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise violation(E.EXTERNAL_NUMBER_INVALID, path, f"{shown!r} is not a decimal integer")
    digits = text.lstrip("0")
    if len(digits) > _UINT64_DIGITS:  # before int(): Python refuses to convert very long digit strings
        raise violation(E.EXTERNAL_NUMBER_INVALID, path, f"a {len(digits)}-digit number exceeds uint64")
    value = int(digits or "0")
    if value > UINT64_MAX:
        raise violation(E.EXTERNAL_NUMBER_INVALID, path, f"{text} exceeds uint64")
    return value


def check_location(location: str, path: str) -> None:
    """Relative, inside the model directory, no drive, no NUL, no '..' component."""
    if not isinstance(location, str):
        raise violation(E.EXTERNAL_PATH_INVALID, path, "location is not valid UTF-8 text")
    if "\x00" in location:
        raise violation(E.EXTERNAL_PATH_INVALID, path, "location contains a NUL character")
    normalized = location.replace("\\", "/")
    if normalized.startswith("/") or re.match(r"^[A-Za-z]:", normalized):
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} is absolute")
    if any(part == ".." for part in normalized.split("/")):
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} escapes the model directory")
    if normalized.rstrip("/") in ("", "."):
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} names no file")


def payload_extent(value, path: str) -> Extent:
    """Validate the payload fields of an EncodedValueProto and return its byte extent."""
    has_raw = value.HasField("raw_data")
    if has_raw and len(value.external_data):
        raise violation(E.PAYLOAD_BOTH, path, "raw_data and external_data are mutually exclusive")
    if value.data_location != EXTERNAL:
        if len(value.external_data):
            raise violation(E.PAYLOAD_LOCATION_MISMATCH, f"{path}.external_data",
                            "external_data requires data_location EXTERNAL")
        raw = value.raw_data
        return Extent(length=len(raw), inline=raw)
    if has_raw:
        raise violation(E.PAYLOAD_BOTH, f"{path}.raw_data", "an EXTERNAL payload cannot also carry raw_data")
    entries: dict[str, str] = {}
    for index, entry in enumerate(value.external_data):
        entry_path = f"{path}.external_data[{index}]"
        # proto2 does not validate strings: invalid UTF-8 reaches Python as bytes (an unknown key here,
        # and a rejected number or location below).
        if entry.key not in _KEYS:
            raise violation(E.EXTERNAL_KEY_INVALID, entry_path, f"unknown external_data key {entry.key!r}")
        if entry.key in entries:
            raise violation(E.EXTERNAL_KEY_INVALID, entry_path, f"external_data key {entry.key!r} repeats")
        entries[entry.key] = entry.value
    if not entries.get("location"):
        raise violation(E.EXTERNAL_LOCATION_MISSING, f"{path}.external_data", "EXTERNAL requires a location")
    if "length" not in entries:
        raise violation(E.EXTERNAL_LENGTH_MISSING, f"{path}.external_data",
                        "EXTERNAL requires an explicit length")
    check_location(entries["location"], f"{path}.external_data.location")
    length = _decimal(entries["length"], f"{path}.external_data.length")
    offset = _decimal(entries.get("offset", "0"), f"{path}.external_data.offset")
    if offset + length > UINT64_MAX:
        raise violation(E.EXTERNAL_EXTENT_OVERFLOW, f"{path}.external_data",
                        f"offset {offset} + length {length} overflows uint64")
    if offset + length > INT64_MAX:  # implementation limit, as onnx-light: file offsets are signed
        raise violation(E.EXTERNAL_EXTENT_OVERFLOW, f"{path}.external_data",
                        f"offset {offset} + length {length} exceeds the addressable file range (INT64_MAX)")
    return Extent(length=length, location=entries["location"], offset=offset)


def open_external(extent: Extent, base_dir: str | os.PathLike | None, path: str) -> int:
    """A read-only descriptor of the extent's backing file, opened race-free inside ``base_dir``.

    Every component is opened relative to the directory before it without following symbolic links
    (a symlink anywhere in the location is EXTERNAL_PATH_INVALID), then the descriptor itself is
    checked: a regular file whose size covers offset + length. The caller owns (and closes) it."""
    if base_dir is None:
        raise violation(E.EXTERNAL_FILE_INVALID, path, "external payload needs a base directory to resolve")
    parts = [part for part in extent.location.replace("\\", "/").split("/") if part not in ("", ".")]
    if not parts or ".." in parts:  # check_location has refused these; never open them
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"{extent.location!r} names no file inside the directory")
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        current = os.open(base_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as err:
        raise violation(E.EXTERNAL_FILE_INVALID, path, f"base directory cannot be opened: {_reason(err)}") from None
    part = parts[0]
    try:
        for part in parts[:-1]:
            step = os.open(part, flags | getattr(os, "O_DIRECTORY", 0), dir_fd=current)
            os.close(current)
            current = step
        part = parts[-1]
        # O_NONBLOCK: opening a FIFO planted in the directory must not wait for a writer.
        fd = os.open(part, flags | getattr(os, "O_NONBLOCK", 0), dir_fd=current)
    except OSError as err:
        # With O_NOFOLLOW a final link fails with ELOOP; a linked directory fails with ENOTDIR.
        if err.errno == errno.ELOOP or _is_symlink(part, current):
            raise violation(E.EXTERNAL_PATH_INVALID, path, f"{extent.location!r} passes through the symbolic link "
                            f"{part!r}; links are not followed out of (or within) the model directory") from None
        raise violation(E.EXTERNAL_FILE_INVALID, path, f"{extent.location!r} cannot be opened inside the model "
                        f"directory: {_reason(err)}") from None
    except ValueError as err:  # a name the operating system cannot represent
        raise violation(E.EXTERNAL_PATH_INVALID, path, f"{extent.location!r}: {err}") from None
    finally:
        os.close(current)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise violation(E.EXTERNAL_FILE_INVALID, path, f"backing file {extent.location!r} is not a regular file")
        if info.st_size < extent.offset + extent.length:
            raise violation(E.EXTERNAL_FILE_INVALID, path, f"backing file has {info.st_size} bytes; offset + length "
                            f"is {extent.offset + extent.length}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_symlink(name: str, directory: int) -> bool:
    """Whether ``name`` in the open ``directory`` is a symbolic link (only to explain a failed open)."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except (OSError, ValueError):
        return False


def _reason(err: BaseException) -> str:
    return getattr(err, "strerror", None) or str(err)


def check_file(extent: Extent, base_dir, path: str) -> None:
    """Validate that an external extent lies within its backing file (no bytes are read)."""
    if extent.external:
        os.close(open_external(extent, base_dir, path))


def open_payload(value, extent: Extent, base_dir, path: str) -> np.ndarray:
    """The payload as a read-only uint8 array: inline bytes, or the external extent mapped (the array
    keeps the mapping alive) or read, per ``set_external_access``."""
    if not extent.external:
        return np.frombuffer(extent.inline if extent.inline is not None else value.raw_data, dtype=np.uint8)
    fd = open_external(extent, base_dir, path)
    try:
        if extent.length == 0:
            return np.zeros(0, dtype=np.uint8)
        if _access == "read":
            return _read_extent(fd, extent, path)
        start = extent.offset - extent.offset % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(fd, extent.offset + extent.length - start, access=mmap.ACCESS_READ, offset=start)
    except OSError as err:
        raise violation(E.EXTERNAL_FILE_INVALID, path,
                        f"backing file cannot be mapped or read: {_reason(err)}") from None
    finally:
        os.close(fd)
    return np.frombuffer(mapping, dtype=np.uint8, count=extent.length, offset=extent.offset - start)


def _read_extent(fd: int, extent: Extent, path: str) -> np.ndarray:
    """Read the extent into process-owned memory; a file that shrank since it was checked is refused."""
    if extent.length > MAX_READ_EXTENT:
        raise violation(E.RESOURCE_LIMIT, path, f"reading {extent.length} external bytes exceeds the read limit "
                        f"of {MAX_READ_EXTENT}")
    buffer = bytearray(extent.length)
    view = memoryview(buffer)
    done = 0
    while done < extent.length:
        count = os.preadv(fd, [view[done:]], extent.offset + done)
        if count == 0:
            raise violation(E.EXTERNAL_FILE_INVALID, path, f"backing file {extent.location!r} ended after "
                            f"{extent.offset + done} bytes while its extent was read (it shrank)")
        done += count
    array = np.frombuffer(buffer, dtype=np.uint8)
    array.flags.writeable = False
    return array
