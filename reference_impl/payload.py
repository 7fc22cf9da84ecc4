"""Payload extents of encoded values: inline bytes or validated external files.

The extent (byte length) is known from the message alone, so layouts are validated before any file is
opened; the bytes themselves are reached only through ``open_payload``, which maps external files
read-only and returns arrays that keep their mapping alive.
"""

from __future__ import annotations

import mmap
import os
import pathlib
import re
from dataclasses import dataclass

import numpy as np

from reference_impl.dtypes import UINT64_MAX
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import fail

EXTERNAL = 1
_KEYS = {"location", "offset", "length", "checksum"}
_DECIMAL = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Extent:
    """Where a payload's bytes are: inline, or ``length`` bytes at ``offset`` of ``location``."""

    length: int
    location: str | None = None
    offset: int = 0

    @property
    def external(self) -> bool:
        return self.location is not None


def _decimal(text: str, path: str) -> int:
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        raise fail(E.EXTERNAL_NUMBER_INVALID, path, f"{text!r} is not a decimal integer")
    value = int(text)
    if value > UINT64_MAX:
        raise fail(E.EXTERNAL_NUMBER_INVALID, path, f"{text} exceeds uint64")
    return value


def check_location(location: str, path: str) -> None:
    """Relative, inside the model directory, no drive, no NUL, no '..' component."""
    if not isinstance(location, str):
        raise fail(E.EXTERNAL_PATH_INVALID, path, "location is not valid UTF-8 text")
    if "\x00" in location:
        raise fail(E.EXTERNAL_PATH_INVALID, path, "location contains a NUL character")
    normalized = location.replace("\\", "/")
    if normalized.startswith("/") or re.match(r"^[A-Za-z]:", normalized):
        raise fail(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} is absolute")
    if any(part == ".." for part in normalized.split("/")):
        raise fail(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} escapes the model directory")
    if normalized.rstrip("/") in ("", "."):
        raise fail(E.EXTERNAL_PATH_INVALID, path, f"location {location!r} names no file")


def payload_extent(value, path: str) -> Extent:
    """Validate the payload fields of an EncodedValueProto and return its byte extent."""
    has_raw = value.HasField("raw_data")
    if has_raw and len(value.external_data):
        raise fail(E.PAYLOAD_BOTH, path, "raw_data and external_data are mutually exclusive")
    if value.data_location != EXTERNAL:
        if len(value.external_data):
            raise fail(E.PAYLOAD_LOCATION_MISMATCH, f"{path}.external_data",
                       "external_data requires data_location EXTERNAL")
        return Extent(length=len(value.raw_data))
    if has_raw:
        raise fail(E.PAYLOAD_BOTH, f"{path}.raw_data", "an EXTERNAL payload cannot also carry raw_data")
    entries: dict[str, str] = {}
    for index, entry in enumerate(value.external_data):
        entry_path = f"{path}.external_data[{index}]"
        # proto2 does not validate strings: invalid UTF-8 reaches Python as bytes (an unknown key here,
        # and a rejected number or location below).
        if entry.key not in _KEYS:
            raise fail(E.EXTERNAL_KEY_INVALID, entry_path, f"unknown external_data key {entry.key!r}")
        if entry.key in entries:
            raise fail(E.EXTERNAL_KEY_INVALID, entry_path, f"external_data key {entry.key!r} repeats")
        entries[entry.key] = entry.value
    if not entries.get("location"):
        raise fail(E.EXTERNAL_LOCATION_MISSING, f"{path}.external_data", "EXTERNAL requires a location")
    if "length" not in entries:
        raise fail(E.EXTERNAL_LENGTH_MISSING, f"{path}.external_data",
                   "EXTERNAL requires an explicit length")
    check_location(entries["location"], f"{path}.external_data.location")
    length = _decimal(entries["length"], f"{path}.external_data.length")
    offset = _decimal(entries.get("offset", "0"), f"{path}.external_data.offset")
    if offset + length > UINT64_MAX:
        raise fail(E.EXTERNAL_EXTENT_OVERFLOW, f"{path}.external_data",
                   f"offset {offset} + length {length} overflows uint64")
    return Extent(length=length, location=entries["location"], offset=offset)


def _resolve_file(extent: Extent, base_dir: str | os.PathLike | None, path: str) -> pathlib.Path:
    if base_dir is None:
        raise fail(E.EXTERNAL_FILE_INVALID, path, "external payload needs a base directory to resolve")
    base = pathlib.Path(base_dir).resolve()
    target = (base / extent.location.replace("\\", "/")).resolve()
    if target != base and base not in target.parents:
        raise fail(E.EXTERNAL_PATH_INVALID, path, f"{extent.location!r} resolves outside {base}")
    if not target.is_file():
        raise fail(E.EXTERNAL_FILE_INVALID, path, f"backing file {extent.location!r} does not exist")
    size = target.stat().st_size
    if size < extent.offset + extent.length:
        raise fail(E.EXTERNAL_FILE_INVALID, path,
                   f"backing file has {size} bytes; offset + length is {extent.offset + extent.length}")
    return target


def check_file(extent: Extent, base_dir, path: str) -> None:
    """Validate that an external extent lies within its backing file (no bytes are read)."""
    if extent.external:
        _resolve_file(extent, base_dir, path)


def open_payload(value, extent: Extent, base_dir, path: str) -> np.ndarray:
    """The payload as a read-only uint8 array. External files are memory-mapped; the array keeps the
    mapping alive for as long as it (or any view of it) is referenced."""
    if not extent.external:
        data = np.frombuffer(value.raw_data, dtype=np.uint8)
        return data
    target = _resolve_file(extent, base_dir, path)
    if extent.length == 0:
        return np.zeros(0, dtype=np.uint8)
    with open(target, "rb") as handle:
        start = extent.offset - extent.offset % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(handle.fileno(), extent.offset + extent.length - start, access=mmap.ACCESS_READ,
                            offset=start)
    array = np.frombuffer(mapping, dtype=np.uint8, count=extent.length, offset=extent.offset - start)
    return array
